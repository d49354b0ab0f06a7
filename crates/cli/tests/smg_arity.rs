//! SMG launch lines take each flag's values as SMG's own parser does: a flag SMG declares with
//! several values after one use (`--routing-key-headers x-session-id x-user-id`, `nargs='*'`)
//! takes them in sluice too, a switch takes none, and every SMG flag is either taken or refused.
//! The fixture is SMG 1.13.0's parser read by `scripts/smg-flags` (`smg.router_args`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use clap::{Args, FromArgMatches};
use sluice_gateway::config::smg;
use sluice_gateway::Settings;

const FIXTURE: &str = include_str!("../../../fixtures/smg/launch-flags-1.13.0.tsv");

/// `sluice serve`'s flags, as the binary builds them.
fn serve() -> clap::Command {
    let mut command = Settings::augment_args(clap::Command::new("serve"));
    command.build();
    command
}

/// How many values `arg` takes after one use, in the fixture's words. A flag whose value is
/// optional and must follow an `=` (`--remove-unhealthy-workers[=BOOL]`) is a switch on an SMG
/// launch line, which never gives it one.
fn arity(arg: &clap::Arg) -> &'static str {
    let range = arg.get_num_args().unwrap_or_default();
    if range.min_values() == 0 && arg.is_require_equals_set() {
        return "switch";
    }
    match range.max_values() {
        0 => "switch",
        1 => "one",
        _ => "many",
    }
}

#[test]
fn the_fixture_is_smgs_parser_with_its_list_flags() {
    let rows: Vec<Vec<&str>> = FIXTURE
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split('\t').collect())
        .collect();
    assert!(rows.len() > 200, "every flag of SMG 1.13: {}", rows.len());
    for flag in [
        "--routing-key-headers",
        "--request-id-headers",
        "--worker-urls",
    ] {
        assert!(
            rows.iter().any(|r| r[0] == flag && r[1] == "many"),
            "{flag} takes several values in SMG"
        );
    }
}

#[test]
fn every_smg_flag_sluice_takes_takes_as_many_values_as_smgs_parser() {
    let command = serve();
    let refused: BTreeSet<&str> = smg::REFUSED.iter().map(|(flag, _)| *flag).collect();
    let mut wrong = Vec::new();
    for row in FIXTURE.lines().filter(|l| !l.starts_with('#')) {
        let cells: Vec<&str> = row.split('\t').collect();
        let (flag, smg_arity) = (cells[0], cells[1]);
        let name = flag.trim_start_matches("--");
        let ours = command.get_arguments().find(|a| {
            a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|al| al.contains(&name))
        });
        match ours {
            Some(arg) if arity(arg) != smg_arity => wrong.push(format!(
                "{flag}: SMG takes {smg_arity}, sluice {}",
                arity(arg)
            )),
            Some(_) => {}
            None if refused.contains(flag) => {}
            None => wrong.push(format!("{flag}: neither taken nor refused")),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn list_flags_take_several_values_after_one_use_or_repeated_or_comma_separated() {
    let parse = |args: &[&str]| {
        let matches = serve()
            .try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        Settings::from_arg_matches(&matches).unwrap()
    };
    let wanted = ["x-session-id", "x-user-id"];
    for args in [
        &["--routing-key-headers", "x-session-id", "x-user-id"][..],
        &[
            "--routing-key-headers",
            "x-session-id",
            "--routing-key-headers",
            "x-user-id",
        ],
        &["--routing-key-headers", "x-session-id,x-user-id"],
    ] {
        assert_eq!(parse(args).routing.routing_key_headers, wanted, "{args:?}");
    }
    let ids = parse(&[
        "--request-id-headers",
        "x-a",
        "x-b",
        "--policy",
        "round_robin",
    ]);
    assert_eq!(ids.intake.request_id_headers, ["x-a", "x-b"]);
}
