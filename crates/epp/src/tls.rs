//! The certificate of the ext_proc listener. Data planes in a cluster reach the picker over TLS
//! without checking its certificate (the Inference Extension's reference configuration leaves
//! the validation context empty), so when none is given one is made at start, as its reference
//! picker does.

use std::path::Path;

use tonic::transport::Identity;

/// No certificate to serve with.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--cert-path: cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
}

/// `dir`'s `tls.crt` and `tls.key`, or a self-signed certificate for `localhost`.
pub fn identity(dir: Option<&Path>) -> Result<Identity, TlsError> {
    let Some(dir) = dir else {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
        return Ok(Identity::from_pem(
            made.cert.pem(),
            made.key_pair.serialize_pem(),
        ));
    };
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    Ok(Identity::from_pem(read("tls.crt")?, read("tls.key")?))
}
