//! What a benchmark measures: going direct to the engines, nginx as the plain-proxy floor, or a
//! gateway started from a named command template, so any gateway (sluice, SMG, one of the
//! user's) is measured the same way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::envoy;

/// Where the load goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// Straight to the engines: the baseline every added latency is measured against.
    Direct,
    /// nginx as a plain keep-alive reverse proxy, unbuffered: what proxying alone costs here.
    Nginx,
    /// A gateway process started from a template.
    Gateway(Template),
}

impl Target {
    pub fn name(&self) -> &str {
        match self {
            Target::Direct => "direct",
            Target::Nginx => "nginx",
            Target::Gateway(t) => &t.name,
        }
    }

    /// The command that starts it on `port` in front of `engines` (None when direct), writing
    /// any file it needs into `dir`.
    pub fn command(
        &self,
        port: u16,
        engines: &[SocketAddr],
        dir: &Path,
    ) -> std::io::Result<Option<Vec<String>>> {
        match self {
            Target::Direct => Ok(None),
            Target::Gateway(template) => {
                let workers: Vec<String> = engines.iter().map(|a| format!("http://{a}")).collect();
                template.launch(port, &workers, dir).map(Some)
            }
            Target::Nginx => {
                let config = dir.join("nginx.conf");
                std::fs::write(&config, nginx_config(port, engines, dir))?;
                let argv = [
                    "nginx",
                    "-p",
                    &dir.display().to_string(),
                    "-e",
                    "nginx-error.log",
                    "-c",
                ];
                let mut argv: Vec<String> = argv.map(String::from).into();
                argv.push(config.display().to_string());
                Ok(Some(argv))
            }
        }
    }

    /// `command`, for a run under callgrind. As root, nginx's worker would switch to `nobody`
    /// and then could not answer `callgrind_control`, whose pipes are root's: it keeps root's
    /// user there instead.
    pub fn counted_command(
        &self,
        port: u16,
        engines: &[SocketAddr],
        dir: &Path,
    ) -> std::io::Result<Option<Vec<String>>> {
        use std::os::unix::fs::MetadataExt;
        let mut command = self.command(port, engines, dir)?;
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if let (Target::Nginx, Some(argv), true) = (self, command.as_mut(), root) {
            argv.extend(["-g".into(), "user root;".into()]);
        }
        Ok(command)
    }
}

/// Free loopback ports beside the target's own: `n` in a row, the first returned.
fn spare_ports(n: u16) -> std::io::Result<u16> {
    super::free_ports(n).map_err(|e| std::io::Error::other(e.to_string()))
}

/// `argv` as one line for `sh`, each word quoted.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `sluice` as the overhead benchmark runs it: round robin, like the plain proxies.
const ROUND_ROBIN: [&str; 2] = ["--policy", "round_robin"];

/// One worker process, keep-alive to the engines, no buffering (SSE passes as it comes), no
/// access log: the cheapest honest proxy configuration.
fn nginx_config(port: u16, engines: &[SocketAddr], dir: &Path) -> String {
    let servers: String = engines
        .iter()
        .map(|a| format!("    server {a};\n"))
        .collect();
    format!(
        "worker_processes 1;\n\
         daemon off;\n\
         pid {dir}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20 access_log off;\n\
         \x20 keepalive_requests 1000000;\n\
         \x20 client_body_temp_path {dir};\n\
         \x20 upstream engines {{\n{servers}    keepalive 256;\n    keepalive_requests 1000000;\n  }}\n\
         \x20 server {{\n\
         \x20   listen 127.0.0.1:{port};\n\
         \x20   location / {{\n\
         \x20     proxy_pass http://engines;\n\
         \x20     proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n\
         \x20     proxy_buffering off;\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n",
        dir = dir.display()
    )
}

/// A named command line in which `{port}` is replaced by the gateway's listening port and an
/// argument that is exactly `{workers}` by the engines' URLs, one argument each.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub name: String,
    pub argv: Vec<String>,
    pub launcher: Launcher,
}

/// How a template's command becomes a running gateway.
#[derive(Clone, Debug, PartialEq)]
pub enum Launcher {
    /// The command itself.
    Command,
    /// Envoy as a plain round-robin proxy over the workers (`envoy::plain_config`; no command).
    Envoy { envoy: PathBuf },
    /// The command is a `sluice epp`, started with its gRPC ports, with Envoy in front of it on
    /// the port, as `deploy/envoy-epp.yaml` sets it up. One shell starts the picker and becomes
    /// Envoy, so both are one process tree: stopped together, their CPU and memory counted
    /// together.
    EnvoyPicker { envoy: PathBuf },
}

/// Why a `--gateway NAME=COMMAND` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("--gateway {0:?}: expected NAME=COMMAND")]
    Shape(String),
    #[error("--gateway {0:?}: the command must contain {{port}} and {{workers}}")]
    Placeholders(String),
    #[error("unknown target {0:?}: built in are direct, nginx, envoy, envoy-epp, sluice, sluice-cache-aware and smg, or define it with --gateway NAME=COMMAND")]
    Unknown(String),
    #[error("target {0} needs `{0}` on the PATH ({1})")]
    Missing(&'static str, &'static str),
    #[error(transparent)]
    Envoy(#[from] envoy::EnvoyError),
}

impl Template {
    /// Parses `NAME=COMMAND`, the command split on whitespace.
    pub fn parse(spec: &str) -> Result<Self, TemplateError> {
        let (name, command) = spec
            .split_once('=')
            .filter(|(n, c)| !n.trim().is_empty() && !c.trim().is_empty())
            .ok_or_else(|| TemplateError::Shape(spec.into()))?;
        let argv: Vec<String> = command.split_whitespace().map(String::from).collect();
        let has = |p: &str| argv.iter().any(|a| a.contains(p));
        if !has("{port}") || !has("{workers}") {
            return Err(TemplateError::Placeholders(spec.into()));
        }
        Ok(Self {
            name: name.trim().into(),
            argv,
            launcher: Launcher::Command,
        })
    }

    /// The command line that starts it on `port` before `workers`, writing any file it needs
    /// into `dir`.
    pub fn launch(
        &self,
        port: u16,
        workers: &[String],
        dir: &Path,
    ) -> std::io::Result<Vec<String>> {
        match &self.launcher {
            Launcher::Command => Ok(self.render(port, workers)),
            Launcher::Envoy { envoy } => {
                let engines: Vec<SocketAddr> = workers
                    .iter()
                    .filter_map(|w| w.trim_start_matches("http://").parse().ok())
                    .collect();
                let admin = spare_ports(1)?;
                let config = dir.join(format!("{}.yaml", self.name));
                std::fs::write(&config, envoy::plain_config(port, admin, &engines))?;
                Ok(envoy::argv(envoy, &config))
            }
            Launcher::EnvoyPicker { envoy } => self.picker_behind_envoy(port, workers, dir, envoy),
        }
    }

    /// `sluice epp` (its HTTP, gRPC and health ports in a row) and Envoy in front of it on
    /// `port`: one shell that starts the picker and becomes Envoy.
    fn picker_behind_envoy(
        &self,
        port: u16,
        workers: &[String],
        dir: &Path,
        envoy: &Path,
    ) -> std::io::Result<Vec<String>> {
        let base = spare_ports(4)?;
        let (http, grpc, health, admin) = (base, base + 1, base + 2, base + 3);
        let mut picker = self.render(http, workers);
        picker.extend([
            "--grpc-port".into(),
            grpc.to_string(),
            "--grpc-health-port".into(),
            health.to_string(),
        ]);
        let yaml = sluice_epp::deploy::envoy_yaml(sluice_epp::deploy::EnvoyFront {
            listen: port,
            admin,
            picker: grpc,
            tls: true,
            failure_mode_allow: false,
        })
        .map_err(std::io::Error::other)?;
        let config = dir.join(format!("{}.yaml", self.name));
        std::fs::write(&config, yaml)?;
        let script = format!(
            "{} & exec {}",
            shell_words(&picker),
            shell_words(&envoy::argv(envoy, &config))
        );
        Ok(vec!["sh".into(), "-c".into(), script])
    }

    /// The command line for one run.
    pub fn render(&self, port: u16, workers: &[String]) -> Vec<String> {
        let port = port.to_string();
        let mut argv = Vec::with_capacity(self.argv.len() + workers.len());
        for arg in &self.argv {
            if arg == "{workers}" {
                argv.extend(workers.iter().cloned());
            } else {
                argv.push(arg.replace("{port}", &port));
            }
        }
        argv
    }
}

/// `sluice serve` on loopback with `extra` flags (none: its defaults).
pub fn sluice(name: &str, exe: &Path, extra: &[&str]) -> Template {
    let mut argv: Vec<String> = vec![
        exe.display().to_string(),
        "serve".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "{port}".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv.extend(["--worker-urls".into(), "{workers}".into()]);
    Template {
        name: name.into(),
        argv,
        launcher: Launcher::Command,
    }
}

/// `sluice epp` with `extra` flags behind Envoy, as `deploy/envoy-epp.yaml` sets it up.
pub fn sluice_epp(name: &str, exe: &Path, extra: &[&str], envoy: PathBuf) -> Template {
    let mut template = sluice(name, exe, extra);
    template.argv[1] = "epp".into();
    template.launcher = Launcher::EnvoyPicker { envoy };
    template
}

/// Envoy alone, round robin over the engines: the plain-proxy floor of the `sluice epp` setup.
pub fn envoy_plain(envoy: PathBuf) -> Template {
    Template {
        name: "envoy".into(),
        argv: Vec::new(),
        launcher: Launcher::Envoy { envoy },
    }
}

/// SMG 1.13 as its users start it.
pub fn smg() -> Template {
    let argv =
        "smg launch --host 127.0.0.1 --port {port} --policy round_robin --worker-urls {workers}";
    Template {
        name: "smg".into(),
        argv: argv.split_whitespace().map(String::from).collect(),
        launcher: Launcher::Command,
    }
}

/// Whether `program` can be found on the PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Resolves target names: built-ins first, then `--gateway` definitions. With no names, every
/// built-in that can run here.
pub fn resolve(
    names: &[String],
    custom: &[Template],
    exe: &Path,
) -> Result<Vec<Target>, TemplateError> {
    let smg_here = on_path("smg");
    let nginx_here = on_path("nginx");
    if names.is_empty() {
        let mut all = vec![Target::Direct];
        if nginx_here {
            all.push(Target::Nginx);
        }
        all.extend([
            Target::Gateway(sluice("sluice", exe, &["--policy", "round_robin"])),
            Target::Gateway(sluice("sluice-cache-aware", exe, &[])),
        ]);
        if smg_here {
            all.push(Target::Gateway(smg()));
        }
        if let Some(envoy) = envoy::installed() {
            all.extend([
                Target::Gateway(envoy_plain(envoy.clone())),
                Target::Gateway(sluice_epp("envoy-epp", exe, &ROUND_ROBIN, envoy)),
            ]);
        }
        all.extend(custom.iter().cloned().map(Target::Gateway));
        return Ok(all);
    }
    names
        .iter()
        .map(|name| {
            if let Some(defined) = custom.iter().find(|t| &t.name == name) {
                return Ok(Target::Gateway(defined.clone()));
            }
            match name.as_str() {
                "direct" => Ok(Target::Direct),
                "sluice" => Ok(Target::Gateway(sluice(
                    "sluice",
                    exe,
                    &["--policy", "round_robin"],
                ))),
                "sluice-cache-aware" => Ok(Target::Gateway(sluice("sluice-cache-aware", exe, &[]))),
                "smg" if smg_here => Ok(Target::Gateway(smg())),
                "smg" => Err(TemplateError::Missing("smg", "pip install smg==1.13.0")),
                "envoy" => Ok(Target::Gateway(envoy_plain(envoy::binary()?))),
                "envoy-epp" => Ok(Target::Gateway(sluice_epp(
                    "envoy-epp",
                    exe,
                    &ROUND_ROBIN,
                    envoy::binary()?,
                ))),
                "nginx" if nginx_here => Ok(Target::Nginx),
                "nginx" => Err(TemplateError::Missing(
                    "nginx",
                    "apt-get install nginx-light",
                )),
                _ => Err(TemplateError::Unknown(name.clone())),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_port_and_workers() {
        let t =
            Template::parse("mine=gw --listen 127.0.0.1:{port} --upstreams {workers} -v").unwrap();
        assert_eq!(t.name, "mine");
        let workers = vec!["http://a".to_string(), "http://b".to_string()];
        assert_eq!(
            t.render(9000, &workers),
            [
                "gw",
                "--listen",
                "127.0.0.1:9000",
                "--upstreams",
                "http://a",
                "http://b",
                "-v"
            ]
        );
    }

    #[test]
    fn templates_without_placeholders_or_a_name_are_refused() {
        assert!(matches!(
            Template::parse("gw --port 1"),
            Err(TemplateError::Shape(_))
        ));
        assert!(matches!(
            Template::parse("x=gw --port {port}"),
            Err(TemplateError::Placeholders(_))
        ));
        assert!(matches!(
            Template::parse("=gw {port} {workers}"),
            Err(TemplateError::Shape(_))
        ));
    }

    #[test]
    fn nginx_proxies_to_every_engine_unbuffered() {
        let engines: [SocketAddr; 2] = [
            "127.0.0.1:8001".parse().unwrap(),
            "127.0.0.1:8002".parse().unwrap(),
        ];
        let config = nginx_config(9000, &engines, Path::new("/tmp/run"));
        for line in [
            "listen 127.0.0.1:9000;",
            "server 127.0.0.1:8001;",
            "server 127.0.0.1:8002;",
            "proxy_buffering off;",
            "proxy_set_header Connection \"\";",
            "pid /tmp/run/nginx.pid;",
        ] {
            assert!(config.contains(line), "{line} missing from:\n{config}");
        }
        assert_eq!(config.matches('{').count(), config.matches('}').count());
    }

    #[test]
    fn the_picker_and_envoy_start_as_one_tree_with_envoy_in_front() {
        let dir = std::env::temp_dir().join(format!("sluice-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = sluice_epp(
            "envoy-epp",
            Path::new("/opt/my sluice"),
            &ROUND_ROBIN,
            "envoy".into(),
        );
        let workers = ["http://127.0.0.1:8001".to_string()];
        let argv = t.launch(9000, &workers, &dir).unwrap();
        assert_eq!(argv[..2], ["sh", "-c"]);
        let script = &argv[2];
        assert!(
            script.starts_with("'/opt/my sluice' 'epp' '--host' '127.0.0.1' '--port'"),
            "{script}"
        );
        assert!(
            script.contains("'--worker-urls' 'http://127.0.0.1:8001' '--grpc-port'"),
            "{script}"
        );
        assert!(script.contains(" & exec 'envoy' '-c'"), "{script}");
        let yaml = std::fs::read_to_string(dir.join("envoy-epp.yaml")).unwrap();
        assert!(
            yaml.contains("port_value: 9000 }"),
            "Envoy listens on the target's port"
        );
        let plain = envoy_plain("envoy".into())
            .launch(9000, &workers, &dir)
            .unwrap();
        assert_eq!(plain[0], "envoy");
        let yaml = std::fs::read_to_string(dir.join("envoy.yaml")).unwrap();
        assert!(yaml.contains("port_value: 8001 }"), "{yaml}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_resolve_to_built_ins_and_definitions() {
        let exe = Path::new("/bin/sluice");
        let custom = [Template::parse("mine=gw {port} {workers}").unwrap()];
        let names = ["direct", "mine", "sluice"].map(String::from);
        let targets = resolve(&names, &custom, exe).unwrap();
        let got: Vec<&str> = targets.iter().map(Target::name).collect();
        assert_eq!(got, ["direct", "mine", "sluice"]);
        assert!(matches!(
            resolve(&["haproxy".into()], &custom, exe),
            Err(TemplateError::Unknown(_))
        ));
        let Target::Gateway(rr) = &targets[2] else {
            panic!("sluice is a gateway");
        };
        assert!(rr.argv.windows(2).any(|w| w == ["--policy", "round_robin"]));
    }
}
