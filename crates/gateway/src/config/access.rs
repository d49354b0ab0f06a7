//! Who may call the gateway: the keys clients and the admin send, and the origins a browser may
//! call from. They build `http::Access`, which the assembly hands to the front stage, the admin
//! API and the CORS layer (tenants' keys join the keys from admission there).

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{invalid, non_empty_keys};
use super::ConfigError;
use crate::http::{Access, ControlPlaneKey, ControlPlaneKeyError, CorsOrigins, Keys};

/// The access flags (`sluice serve --help`, "Authentication").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct AccessSettings {
    /// Data-plane API keys clients must send as `Authorization: Bearer <key>` (repeatable). None:
    /// the OpenAI routes are open. As in SMG, a single one is also the key sent to workers that
    /// have none of their own, unless --worker-api-key is given.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "SLUICE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Authentication")]
    pub api_keys: Vec<String>,

    /// Key for the admin API: its changes (`POST/PUT/PATCH/DELETE /workers`, `POST
    /// /busy_threshold`) and, unless --admin-reads-open, its reads (`GET /workers`, `/loads`,
    /// `/busy_threshold`), which show worker addresses and probe errors. None: changes are refused
    /// with 403 and reads are open. `/metrics` and the probes are always open.
    #[arg(
        long,
        value_name = "KEY",
        env = "SLUICE_ADMIN_API_KEY",
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Authentication")]
    pub(crate) admin_api_key: Option<String>,

    /// Serve the admin API's reads (`GET /workers`, `/loads`, `/busy_threshold`) without the admin
    /// key, as before it was set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Authentication")]
    pub(crate) admin_reads_open: bool,

    /// More admin API keys, as SMG writes them: `id:name:role:key`, role `admin` (changes and
    /// reads, like --admin-api-key) or `user` (reads only). Repeatable.
    #[arg(long, num_args = 1.., value_name = "ID:NAME:ROLE:KEY", hide_env_values = true)]
    #[arg(help_heading = "Authentication")]
    #[serde(default)]
    pub(crate) control_plane_api_keys: Vec<String>,

    /// Origins a browser may call the gateway from (e.g. http://localhost:3000), or `*` alone for
    /// any origin (SMG's flag). Unset: no cross-origin allowance.
    #[arg(long, num_args = 1.., value_delimiter = ',', value_name = "ORIGIN")]
    #[arg(help_heading = "Authentication")]
    #[serde(default)]
    pub(crate) cors_allowed_origins: Vec<String>,
}

impl AccessSettings {
    /// The keys the flags give (tenants' keys are admission's) and the allowed origins.
    pub(super) fn validate(&self) -> Result<Access, ConfigError> {
        Ok(Access {
            keys: Keys {
                client: non_empty_keys("api-key", &self.api_keys)?,
                admin: self.admin_key()?,
                control_plane: self.control_plane_keys()?,
                tenants: Vec::new(),
                reads_open: self.admin_reads_open,
            },
            cors: self.cors()?,
        })
    }

    fn admin_key(&self) -> Result<Option<String>, ConfigError> {
        Ok(match &self.admin_api_key {
            Some(k) => non_empty_keys("admin-api-key", std::slice::from_ref(k))?.pop(),
            None => None,
        })
    }

    fn control_plane_keys(&self) -> Result<Vec<ControlPlaneKey>, ConfigError> {
        self.control_plane_api_keys
            .iter()
            .map(|k| {
                k.parse().map_err(|e: ControlPlaneKeyError| {
                    invalid("control-plane-api-keys", e.to_string())
                })
            })
            .collect()
    }

    /// `--cors-allowed-origins`, checked: `*` alone, or origins that are header values.
    fn cors(&self) -> Result<Option<CorsOrigins>, ConfigError> {
        let origins = &self.cors_allowed_origins;
        if origins.is_empty() {
            return Ok(None);
        }
        if origins.iter().any(|o| o == "*") {
            if origins.len() > 1 {
                return Err(invalid("cors-allowed-origins", "'*' stands alone"));
            }
            return Ok(Some(CorsOrigins::Any));
        }
        origins
            .iter()
            .map(|o| {
                axum::http::HeaderValue::try_from(o.trim())
                    .map_err(|_| invalid("cors-allowed-origins", format!("'{o}' is not an origin")))
            })
            .collect::<Result<_, _>>()
            .map(|list| Some(CorsOrigins::List(list)))
    }
}
