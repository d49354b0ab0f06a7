//! Certificates made in the test: a CA, a server certificate for `localhost` and 127.0.0.1,
//! and a client certificate, written as PEM files into a directory of their own that goes
//! when they do.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

pub struct Certs {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Writes `pem` to `dir/name` and returns the path.
fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("a writable temporary directory");
    path
}

/// A certificate for `names` signed by the CA, and its key.
fn leaf(names: &[&str], ca: &Certificate, ca_key: &KeyPair) -> (String, String) {
    let key = KeyPair::generate().expect("a key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("valid names");
    params
        .distinguished_name
        .push(DnType::CommonName, "sluice test");
    let cert = params.signed_by(&key, ca, ca_key).expect("signed");
    (cert.pem(), key.serialize_pem())
}

impl Certs {
    /// A fresh set under the temporary directory, named after `test`.
    pub fn make(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-certs-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let ca_key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        let ca = params.self_signed(&ca_key).expect("a CA");
        let (server_cert, server_key) = leaf(&["localhost", "127.0.0.1"], &ca, &ca_key);
        let (client_cert, client_key) = leaf(&["gateway.test"], &ca, &ca_key);
        Self {
            ca: write(&dir, "ca.pem", &ca.pem()),
            server_cert: write(&dir, "server.pem", &server_cert),
            server_key: write(&dir, "server.key", &server_key),
            client_cert: write(&dir, "client.pem", &client_cert),
            client_key: write(&dir, "client.key", &client_key),
            dir,
        }
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
