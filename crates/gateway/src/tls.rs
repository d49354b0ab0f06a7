//! TLS, both ways, with rustls (ring): the listener's certificate (`--tls-cert-path`,
//! `--tls-key-path`) and what an https worker is trusted by and shown (`--ca-cert-paths`,
//! `--client-cert-path`, `--client-key-path`).
//!
//! Files are read once, when the settings are validated, so a bad path or PEM stops startup
//! with the flag's name instead of failing the first connection. Like `upstream`, this module
//! sits at the bottom of the crate and imports nothing of the gateway.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tracing::{debug, warn};

/// Why a TLS setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path}: no certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: not a usable CA certificate: {source}")]
    BadCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("the certificate and key do not make a usable identity: {0}")]
    Identity(rustls::Error),
}

/// The one crypto provider, passed explicitly so nothing depends on a process-wide default.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        path: path.to_path_buf(),
        source,
    })
}

/// A certificate chain and its key, as PEM files.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Identity {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// The listener's TLS: HTTP/2 and HTTP/1.1 offered by ALPN, as on the cleartext port.
pub(crate) fn server_config(identity: &Identity) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Identity)?
        .with_no_client_auth()
        .with_single_cert(certificates(&identity.cert)?, private_key(&identity.key)?)
        .map_err(TlsError::Identity)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What https workers are trusted by and shown, read and checked at startup. The system's CA
/// certificates are added only when the first https worker is reached (`client_config`): a
/// gateway without one never reads them, nor holds them in memory.
#[derive(Clone)]
pub(crate) struct ClientTls {
    cas: Vec<CertificateDer<'static>>,
    identity: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    /// The given CAs and identity alone: proof at startup that they make a configuration, and
    /// what is used should the system's certificates not combine with them.
    checked: Arc<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("cas", &self.cas.len())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// Reads `cas` and `identity` and checks they make a client configuration.
    pub(crate) fn read(cas: &[PathBuf], identity: Option<&Identity>) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        let mut ca_certs = Vec::new();
        for path in cas {
            for cert in certificates(path)? {
                roots.add(cert.clone()).map_err(|source| TlsError::BadCa {
                    path: path.clone(),
                    source,
                })?;
                ca_certs.push(cert);
            }
        }
        let identity = match identity {
            Some(identity) => Some((
                certificates(&identity.cert)?,
                Arc::new(private_key(&identity.key)?),
            )),
            None => None,
        };
        let checked = Self::config(roots, identity.as_ref())?;
        Ok(Self {
            cas: ca_certs,
            identity,
            checked,
        })
    }

    fn config(
        roots: RootCertStore,
        identity: Option<&(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    ) -> Result<Arc<ClientConfig>, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Identity)?
            .with_root_certificates(roots);
        let config = match identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(TlsError::Identity)?,
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// The configuration for https workers: the system's CA certificates, the given ones, and
    /// the client certificate.
    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        let system = rustls_native_certs::load_native_certs();
        if !system.errors.is_empty() {
            debug!(errors = ?system.errors, "some of the system's CA certificates could not be read");
        }
        let (added, ignored) = roots.add_parsable_certificates(system.certs);
        debug!(added, ignored, "system CA certificates");
        roots.add_parsable_certificates(self.cas.iter().cloned());
        Self::config(roots, self.identity.as_ref()).unwrap_or_else(|e| {
            warn!(error = %e, "https workers: the system's CA certificates are left out");
            self.checked.clone()
        })
    }
}
