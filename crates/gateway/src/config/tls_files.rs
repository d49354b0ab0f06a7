//! The TLS flags: the listener's certificate and key, and what https workers are trusted by
//! and shown (read and checked in `sections`).

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

/// Certificates and keys, as files.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, PartialEq)]
pub struct TlsSettings {
    /// Serve HTTPS on --port with this certificate chain (PEM), with --tls-key-path (SMG's flag).
    /// HTTP/2 and HTTP/1.1 are offered by ALPN; the probe and metrics ports stay plain HTTP.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "TLS")]
    pub tls_cert_path: Option<PathBuf>,

    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert-path.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "TLS")]
    pub tls_key_path: Option<PathBuf>,

    /// CA certificates (PEM) https workers' certificates may chain to, besides the system's.
    /// Repeatable.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "TLS")]
    pub ca_cert_paths: Vec<PathBuf>,

    /// A client certificate (PEM) shown to https workers that ask for one (mTLS), with
    /// --client-key-path.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "TLS")]
    pub client_cert_path: Option<PathBuf>,

    /// The private key (PEM) of --client-cert-path.
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "TLS")]
    pub client_key_path: Option<PathBuf>,
}
