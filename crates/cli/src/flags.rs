//! `sluice flags`: the reference of every flag of `sluice serve` and `sluice epp`, made from the
//! flags themselves — their help, defaults, environment variables and config-file keys — so it
//! cannot drift from them (docs/flags.md is its output; a test holds the two together, and each
//! flag `--help` shows to the page). What SMG 1.13 means by the same flag comes from SMG's own
//! parser (`fixtures/smg/launch-defaults-1.13.0.tsv`, written by `scripts/smg-flags`) and
//! sluice's table of the defaults that differ (`--smg-defaults`).

use std::collections::HashMap;
use std::fmt::Write;

use clap::{Arg, ArgAction, Command};
use sluice_gateway::config::{smg_default_values, COMMAND_LINE_ONLY, SMG_QUEUE};

const SMG_DEFAULTS: &str = include_str!("../../../fixtures/smg/launch-defaults-1.13.0.tsv");

/// The page, for the commands under `root`.
pub fn reference(root: &Command) -> String {
    let mut page = String::from(
        "# Flags\n\n\
         Every flag of `sluice serve` and `sluice epp`, as the binary has them: printed by \
         `sluice flags` (this page is its output, and a test fails when the two differ). A flag \
         given on the command line (or through its environment variable) wins over the same key \
         in the `--config` TOML file, which wins over the default. The SMG column says what SMG \
         1.13's `smg launch` does with the same setting: the same default, its own default where \
         it differs (what `--smg-defaults` puts back), or nothing of the kind (sluice only); \
         docs/migrating-from-smg.md says why each default differs and what becomes of SMG's \
         other flags.\n",
    );
    let serve = root.find_subcommand("serve");
    let serve_ids: Vec<&str> = serve
        .map(|c| c.get_arguments().map(|a| a.get_id().as_str()).collect())
        .unwrap_or_default();
    let smg = Smg::new();
    if let Some(serve) = serve {
        section(&mut page, "sluice serve", serve, &smg, |_| true);
    }
    if let Some(epp) = root.find_subcommand("epp") {
        page.push_str(
            "\n`sluice epp` takes every flag of `sluice serve` above, and these of its own.\n",
        );
        section(&mut page, "sluice epp", epp, &smg, |arg| {
            !serve_ids.contains(&arg.get_id().as_str())
        });
    }
    page
}

/// One command's flags that `keep` keeps, a table per help heading, in the order `--help`
/// shows them.
fn section(
    page: &mut String,
    title: &str,
    command: &Command,
    smg: &Smg,
    keep: impl Fn(&Arg) -> bool,
) {
    let _ = write!(page, "\n## `{title}`\n");
    let mut headings: Vec<&str> = Vec::new();
    let args: Vec<&Arg> = command
        .get_arguments()
        .filter(|a| a.get_long().is_some() && !a.is_hide_set() && keep(a))
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    for arg in &args {
        let heading = arg.get_help_heading().unwrap_or("Other");
        if !headings.contains(&heading) {
            headings.push(heading);
        }
    }
    for heading in headings {
        let _ = write!(
            page,
            "\n### {heading}\n\n| flag | default | config key | meaning | SMG 1.13 |\n| --- | --- | --- | --- | --- |\n"
        );
        for arg in args
            .iter()
            .filter(|a| a.get_help_heading().unwrap_or("Other") == heading)
        {
            let _ = writeln!(
                page,
                "| {} | {} | {} | {} | {} |",
                flag(arg),
                default(arg),
                key(arg),
                cell(&meaning(arg)),
                smg.about(arg.get_id().as_str()),
            );
        }
    }
}

/// `--name <VALUE>`, its visible aliases, and its environment variable.
fn flag(arg: &Arg) -> String {
    let mut names = vec![format!("`--{}`", arg.get_long().unwrap_or_default())];
    names.extend(
        arg.get_visible_aliases()
            .unwrap_or_default()
            .into_iter()
            .map(|a| format!("`--{a}`")),
    );
    let mut text = names.join(", ");
    if takes_value(arg) {
        let value = arg
            .get_value_names()
            .and_then(|v| v.first())
            .map_or_else(|| arg.get_id().as_str().to_uppercase(), |v| v.to_string());
        let _ = write!(text, " `<{value}>`");
    }
    if let Some(env) = arg.get_env() {
        let _ = write!(text, " (env `{}`)", env.to_string_lossy());
    }
    text
}

fn takes_value(arg: &Arg) -> bool {
    !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    )
}

fn default(arg: &Arg) -> String {
    if !takes_value(arg) {
        return "off".into();
    }
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() {
        "–".into()
    } else {
        format!("`{}`", values.join(" "))
    }
}

fn key(arg: &Arg) -> String {
    let id = arg.get_id().as_str();
    if COMMAND_LINE_ONLY.contains(&id) {
        "command line only".into()
    } else {
        format!("`{id}`")
    }
}

fn meaning(arg: &Arg) -> String {
    arg.get_long_help()
        .or_else(|| arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default()
}

/// A table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// What SMG 1.13 has of each setting.
struct Smg {
    /// Every setting of SMG's launch parser.
    settings: Vec<String>,
    /// SMG's value where sluice's default differs.
    differs: HashMap<&'static str, toml::Value>,
}

impl Smg {
    fn new() -> Self {
        let settings = SMG_DEFAULTS
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split('\t').next())
            .map(str::to_string)
            .collect();
        Self {
            settings,
            differs: smg_default_values().into_iter().collect(),
        }
    }

    fn about(&self, key: &str) -> String {
        if key == "queue_size" {
            return SMG_QUEUE.into();
        }
        match self.differs.get(key) {
            Some(value) => format!("default `{value}`"),
            None if self.settings.iter().any(|s| s == key) => "same".into(),
            None => "sluice only".into(),
        }
    }
}
