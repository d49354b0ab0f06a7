//! The settings of each subsystem — policy, health checks, load monitoring and overload
//! protection, shedding, liveness, TLS — built from `Settings` and checked as a whole (retries and
//! breakers: `resilience`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::health::Thresholds;
use sluice_core::liveness::LivenessConfig;
use sluice_core::overload::Ceilings;
use sluice_core::policy::{CacheAware, Policy};

use super::checks::{at_least, fraction, invalid, positive_count, positive_seconds, seconds};
use super::{header_names, ConfigError, Settings};
use crate::control::{busy_thresholds, ControlSettings, HealthConfig, LoadConfig};
use axum::http::StatusCode;

use crate::front::Answers;
use crate::route::{RouteConfig, Shedding};
use crate::tls::{self, Identity};

impl Settings {
    pub(super) fn load(&self) -> Result<LoadConfig, ConfigError> {
        let interval = positive_seconds("load-monitor-interval", self.load_monitor_interval)?;
        if self.worker_overload_waiting_requests == 0 {
            return Err(invalid(
                "worker-overload-waiting-requests",
                "must be at least 1 (the comparison is inclusive: 0 would veto every worker)",
            ));
        }
        let usage = self.worker_overload_token_usage;
        if !(usage > 0.0 && usage <= 1.0) {
            return Err(invalid(
                "worker-overload-token-usage",
                format!("{usage} is not a fraction of the KV cache in (0, 1]"),
            ));
        }
        let ceilings = if self.disable_worker_overload_protection {
            Ceilings::default()
        } else {
            Ceilings {
                waiting_requests: Some(self.worker_overload_waiting_requests),
                token_usage: Some(usage),
            }
        };
        Ok(LoadConfig {
            interval,
            ceilings,
            busy: busy_thresholds(
                self.active_decode_blocks_threshold,
                self.active_prefill_tokens_threshold,
                self.active_prefill_tokens_threshold_frac,
            )
            .map_err(|(setting, message)| invalid(setting, message))?,
            ..LoadConfig::default()
        })
    }

    pub(super) fn shedding(&self) -> Shedding {
        Shedding {
            enabled: self.worker_overload_shed,
            // A vetoed worker's load is not looked at again before the next poll.
            retry_after: Duration::from_secs(self.load_monitor_interval.ceil().max(1.0) as u64),
        }
    }

    /// `--overload-status-code`: how the edge answers an overload refusal.
    pub(super) fn answers(&self) -> Result<Answers, ConfigError> {
        StatusCode::from_u16(self.overload_status_code)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .map(|overload| Answers { overload })
            .ok_or_else(|| {
                invalid(
                    "overload-status-code",
                    format!(
                        "{} is not an error status (503, or 529 for Dynamo-style clients)",
                        self.overload_status_code
                    ),
                )
            })
    }

    pub(super) fn health(&self) -> Result<HealthConfig, ConfigError> {
        let endpoint = &self.health_check_endpoint;
        if !endpoint.starts_with('/') || endpoint.parse::<axum::http::uri::PathAndQuery>().is_err()
        {
            return Err(invalid(
                "health-check-endpoint",
                format!("'{endpoint}' is not a path such as /health"),
            ));
        }
        Ok(HealthConfig {
            interval: positive_seconds(
                "health-check-interval-secs",
                self.health_check_interval_secs,
            )?,
            timeout: positive_seconds("health-check-timeout-secs", self.health_check_timeout_secs)?,
            thresholds: Thresholds {
                failure: positive_count("health-failure-threshold", self.health_failure_threshold)?,
                success: positive_count("health-success-threshold", self.health_success_threshold)?,
            },
            endpoint: endpoint.clone(),
            disabled: self.disable_health_check,
            // Seed 004: the default follows discovery. Without a source to register a removed
            // worker again, removal would shrink a static fleet for good.
            remove_unhealthy: self
                .remove_unhealthy_workers
                .unwrap_or(self.discovery.any()),
        })
    }

    /// The route stage's config: the policies, the routing key, shedding.
    pub(super) fn route(&self) -> Result<RouteConfig, ConfigError> {
        let (prefill_policy, decode_policy) = self.pd_policies()?;
        Ok(RouteConfig {
            policy: self.policy()?,
            prefill_policy,
            decode_policy,
            routing_key_headers: header_names("routing-key-headers", &self.routing_key_headers)?,
            shedding: self.shedding(),
        })
    }

    pub(super) fn policy(&self) -> Result<Policy, ConfigError> {
        self.policy_named("policy", &self.policy)
    }

    /// `--prefill-policy` and `--decode-policy`, each `--policy` when not given.
    pub(super) fn pd_policies(&self) -> Result<(Policy, Policy), ConfigError> {
        let side = |flag, name: &Option<String>| match name {
            Some(name) => self.policy_named(flag, name),
            None => self.policy(),
        };
        Ok((
            side("prefill-policy", &self.pd.prefill_policy)?,
            side("decode-policy", &self.pd.decode_policy)?,
        ))
    }

    /// The policy called `name`, with the cache_aware thresholds; `flag` names it in errors.
    fn policy_named(&self, flag: &'static str, name: &str) -> Result<Policy, ConfigError> {
        Ok(match name {
            "round_robin" => Policy::RoundRobin,
            "random" => Policy::Random,
            "least_load" => Policy::LeastLoad,
            "power_of_two" => Policy::PowerOfTwo,
            // SMG's name for the same rule.
            "consistent_hash" | "consistent_hashing" => Policy::ConsistentHash,
            "prefix_hash" => {
                return Err(invalid(
                    flag,
                    "prefix_hash (SMG) is not supported: use cache_aware, which sends a prompt \
                     where its prefix was sent and balances load",
                ))
            }
            "passthrough" | "manual" => {
                return Err(invalid(
                    flag,
                    format!(
                        "{} (SMG) is not supported: use consistent_hash with \
                         --routing-key-header to pin a client's requests to one worker",
                        name
                    ),
                ))
            }
            "cache_aware" => Policy::CacheAware(CacheAware {
                cache_threshold: fraction("cache-threshold", self.cache_threshold)?,
                balance_abs_threshold: self.balance_abs_threshold,
                balance_rel_threshold: at_least(
                    "balance-rel-threshold",
                    self.balance_rel_threshold,
                    1.0,
                )?,
            }),
            other => {
                return Err(invalid(
                    flag,
                    format!(
                        "unknown policy '{other}' (round_robin, random, least_load, power_of_two, \
                         cache_aware, consistent_hash)"
                    ),
                ))
            }
        })
    }

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
            health: self.health()?,
            load: self.load()?,
            liveness: self.liveness()?,
            startup_check_interval: positive_seconds(
                "worker-startup-check-interval-secs",
                self.worker_startup_check_interval_secs,
            )?,
            startup_delay: seconds("worker-startup-delay", self.worker_startup_delay)?,
            startup_timeout: self.startup_timeout()?,
            adaptive: self.adaptive.limiter()?,
            kv_events: self.kv_events()?,
        })
    }

    /// The liveness thresholds, or none with `--disable-liveness-checks`.
    pub(super) fn liveness(&self) -> Result<Option<LivenessConfig>, ConfigError> {
        let cfg = LivenessConfig {
            stall: seconds("worker-stall-secs", self.worker_stall_secs)?,
            wedge: seconds("worker-wedge-secs", self.worker_wedge_secs)?,
            stale: seconds("worker-stale-secs", self.worker_stale_secs)?,
            unresponsive: seconds("worker-unresponsive-secs", self.worker_unresponsive_secs)?,
            trials: !self.disable_liveness_trials,
        };
        Ok((!self.disable_liveness_checks).then_some(cfg))
    }
}
