//! What a benchmark measures: going direct to the engines, or a gateway started from a named
//! command template, so any gateway (sluice, SMG, one of the user's) is measured the same way.

use std::path::Path;

/// Where the load goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// Straight to the engines: the baseline every added latency is measured against.
    Direct,
    /// A gateway process started from a template.
    Gateway(Template),
}

impl Target {
    pub fn name(&self) -> &str {
        match self {
            Target::Direct => "direct",
            Target::Gateway(t) => &t.name,
        }
    }
}

/// A named command line in which `{port}` is replaced by the gateway's listening port and an
/// argument that is exactly `{workers}` by the engines' URLs, one argument each.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub name: String,
    pub argv: Vec<String>,
}

/// Why a `--gateway NAME=COMMAND` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("--gateway {0:?}: expected NAME=COMMAND")]
    Shape(String),
    #[error("--gateway {0:?}: the command must contain {{port}} and {{workers}}")]
    Placeholders(String),
    #[error("unknown target {0:?}: built in are direct, sluice, sluice-cache-aware and smg, or define it with --gateway NAME=COMMAND")]
    Unknown(String),
    #[error("target smg needs `smg` on the PATH (pip install smg==1.13.0)")]
    SmgMissing,
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
        })
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

/// sluice with the given policy (none: its default), logging as it would in production.
pub fn sluice(name: &str, exe: &Path, policy: Option<&str>) -> Template {
    let mut argv: Vec<String> = vec![
        exe.display().to_string(),
        "serve".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "{port}".into(),
    ];
    if let Some(policy) = policy {
        argv.extend(["--policy".into(), policy.into()]);
    }
    argv.extend(["--worker-urls".into(), "{workers}".into()]);
    Template {
        name: name.into(),
        argv,
    }
}

/// SMG 1.13 as its users start it.
pub fn smg() -> Template {
    let argv =
        "smg launch --host 127.0.0.1 --port {port} --policy round_robin --worker-urls {workers}";
    Template {
        name: "smg".into(),
        argv: argv.split_whitespace().map(String::from).collect(),
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
    if names.is_empty() {
        let mut all = vec![
            Target::Direct,
            Target::Gateway(sluice("sluice", exe, Some("round_robin"))),
            Target::Gateway(sluice("sluice-cache-aware", exe, None)),
        ];
        if smg_here {
            all.push(Target::Gateway(smg()));
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
                "sluice" => Ok(Target::Gateway(sluice("sluice", exe, Some("round_robin")))),
                "sluice-cache-aware" => {
                    Ok(Target::Gateway(sluice("sluice-cache-aware", exe, None)))
                }
                "smg" if smg_here => Ok(Target::Gateway(smg())),
                "smg" => Err(TemplateError::SmgMissing),
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
    fn names_resolve_to_built_ins_and_definitions() {
        let exe = Path::new("/bin/sluice");
        let custom = [Template::parse("mine=gw {port} {workers}").unwrap()];
        let names = ["direct", "mine", "sluice"].map(String::from);
        let targets = resolve(&names, &custom, exe).unwrap();
        let got: Vec<&str> = targets.iter().map(Target::name).collect();
        assert_eq!(got, ["direct", "mine", "sluice"]);
        assert!(matches!(
            resolve(&["nginx".into()], &custom, exe),
            Err(TemplateError::Unknown(_))
        ));
        let Target::Gateway(rr) = &targets[2] else {
            panic!("sluice is a gateway");
        };
        assert!(rr.argv.windows(2).any(|w| w == ["--policy", "round_robin"]));
    }
}
