//! docs/flags.md is `sluice flags`' output, and every flag `--help` shows for `sluice serve` and
//! `sluice epp` is on it: the reference cannot drift from the binary.

#![allow(clippy::unwrap_used)]

use std::process::Command;

const PAGE: &str = include_str!("../../../docs/flags.md");

fn sluice(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_flags_page_is_what_the_binary_prints() {
    let printed = sluice(&["flags"]);
    assert!(
        printed == PAGE,
        "docs/flags.md differs from `sluice flags`: run `cargo run -- flags > docs/flags.md`"
    );
}

#[test]
fn every_flag_help_shows_is_on_the_page() {
    for command in ["serve", "epp"] {
        let help = sluice(&[command, "--help"]);
        let flags: Vec<&str> = help
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2 && *w != "--help")
            .collect();
        assert!(
            flags.len() > 50,
            "{command}: {} flags in --help",
            flags.len()
        );
        for flag in flags {
            assert!(
                PAGE.contains(&format!("`{flag}`")),
                "{command} --help shows {flag}, which docs/flags.md does not have"
            );
        }
    }
}
