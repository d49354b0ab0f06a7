//! The parts of the settings that join sections: TLS identities (the listener's and the
//! workers'), and the control loops' settings, one part from each of their sections.

use std::path::PathBuf;
use std::sync::Arc;

use super::checks::invalid;
use super::{ConfigError, Settings};
use crate::control::ControlSettings;
use crate::tls::{self, Identity};

impl Settings {
    /// A certificate and its key, given together or not at all.
    fn identity(
        (cert_setting, cert): (&'static str, &Option<PathBuf>),
        (key_setting, key): (&'static str, &Option<PathBuf>),
    ) -> Result<Option<Identity>, ConfigError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(Identity {
                cert: cert.clone(),
                key: key.clone(),
            })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(invalid(cert_setting, format!("needs --{key_setting}"))),
            (None, Some(_)) => Err(invalid(key_setting, format!("needs --{cert_setting}"))),
        }
    }

    pub(super) fn listen_tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, ConfigError> {
        let identity = Self::identity(
            ("tls-cert-path", &self.tls.tls_cert_path),
            ("tls-key-path", &self.tls.tls_key_path),
        )?;
        identity
            .map(|identity| {
                tls::server_config(&identity).map_err(|source| ConfigError::Tls {
                    setting: "tls-cert-path",
                    source,
                })
            })
            .transpose()
    }

    pub(super) fn upstream_tls(&self) -> Result<tls::ClientTls, ConfigError> {
        let identity = Self::identity(
            ("client-cert-path", &self.tls.client_cert_path),
            ("client-key-path", &self.tls.client_key_path),
        )?;
        tls::ClientTls::read(&self.tls.ca_cert_paths, identity.as_ref()).map_err(|source| {
            ConfigError::Tls {
                setting: match source {
                    tls::TlsError::BadCa { .. } => "ca-cert-paths",
                    tls::TlsError::Pem { ref path, .. }
                    | tls::TlsError::NoCertificate { ref path }
                        if self.tls.ca_cert_paths.contains(path) =>
                    {
                        "ca-cert-paths"
                    }
                    _ => "client-cert-path",
                },
                source,
            }
        })
    }

    /// The control loops' settings, each part from its section's flags.
    pub(super) fn control(&self) -> Result<ControlSettings, ConfigError> {
        Ok(ControlSettings {
            health: self.health.validate(self.discovery.any())?,
            load: self.overload.load()?,
            liveness: self.liveness.validate()?,
            startup_check_interval: self.registration.check_interval()?,
            startup_delay: self.registration.delay()?,
            startup_timeout: self.registration.timeout()?,
            models_refresh: self.registration.models_refresh()?,
            adapter_load_timeout: self.registration.adapter_load_timeout()?,
            adaptive: self.adaptive.limiter()?,
            kv_events: self.kv_events()?,
        })
    }
}
