//! Settings from a `--config` file: the file fills in, a flag wins, what `--print-config` writes
//! loads back, an unknown key is named with its place; and a command's own settings (`sluice
//! epp`'s) come from the same file as the gateway's.

use super::*;

#[test]
fn the_file_fills_in_and_the_command_line_wins() {
    let dir = std::env::temp_dir().join(format!("sluice-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(
        &path,
        "port = 9000\npolicy = \"least_load\"\nworker_urls = [\"http://127.0.0.1:1\"]\n",
    )
    .unwrap();
    let s = load_args(&[
        "sluice",
        "--config",
        path.to_str().unwrap(),
        "--port",
        "9100",
    ])
    .unwrap();
    assert_eq!(s.listen.port, 9100, "the flag wins");
    assert_eq!(s.routing.policy, "least_load", "the file fills in");
    assert_eq!(s.worker_urls, vec!["http://127.0.0.1:1"]);
    assert_eq!(s.resilience.cb_failure_threshold, 10, "defaults stay");

    // What --print-config prints loads back to the same settings.
    let printed = s.to_toml().unwrap();
    std::fs::write(&path, printed).unwrap();
    let again = load_args(&["sluice", "--config", path.to_str().unwrap()]).unwrap();
    assert_eq!(again.listen.port, 9100);
    assert_eq!(again.routing.policy, "least_load");

    std::fs::write(&path, "port = 1\n\n  prot = 1\n").unwrap();
    let err = load_args(&["sluice", "--config", path.to_str().unwrap()]).unwrap_err();
    let said = err.to_string();
    assert!(said.contains(":3:3: unknown setting `prot`"), "{said}");
    assert_eq!(said.matches("prot").count(), 1, "reported once: {said}");

    // A flag no file can set (which file to read, the negative spelling of a switch) is refused
    // there rather than ignored.
    for key in COMMAND_LINE_ONLY {
        std::fs::write(&path, format!("{key} = true\n")).unwrap();
        let err = load_args(&["sluice", "--config", path.to_str().unwrap()]).unwrap_err();
        assert!(err.to_string().contains(&format!("`{key}`")), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A command's own settings beside the gateway's, as `sluice epp` has them.
#[derive(Debug, clap::Args, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Own {
    #[arg(long, default_value_t = 9002)]
    grpc_port: u16,
    #[arg(long, default_value_t = 9003)]
    grpc_health_port: u16,
}

#[derive(Parser)]
struct CliWithOwn {
    #[command(flatten)]
    settings: Settings,
    #[command(flatten)]
    own: Own,
}

fn load_with_own(args: &[&str]) -> Result<(Settings, Own), ConfigError> {
    let matches = CliWithOwn::command().try_get_matches_from(args)?;
    load_with(&matches)
}

#[test]
fn a_commands_own_settings_come_from_the_same_file_as_the_gateways() {
    let dir = std::env::temp_dir().join(format!("sluice-config-own-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("epp.toml");
    let file = path.to_str().unwrap();
    std::fs::write(
        &path,
        "port = 9000\ngrpc_port = 9102\ngrpc_health_port = 9103\n",
    )
    .unwrap();
    let (settings, own) =
        load_with_own(&["sluice", "--config", file, "--grpc-health-port", "9200"]).unwrap();
    assert_eq!(
        settings.listen.port, 9000,
        "the gateway's key from the file"
    );
    assert_eq!(own.grpc_port, 9102, "the command's own key from the file");
    assert_eq!(own.grpc_health_port, 9200, "the flag wins");

    // What --print-config prints loads back to the same settings.
    std::fs::write(&path, settings.to_toml_with(&own).unwrap()).unwrap();
    let (again, own_again) = load_with_own(&["sluice", "--config", file]).unwrap();
    assert_eq!((again.listen.port, own_again), (9000, own));

    // Without a file, the flags and the defaults.
    let (_, own) = load_with_own(&["sluice", "--grpc-port", "1"]).unwrap();
    assert_eq!((own.grpc_port, own.grpc_health_port), (1, 9003));

    std::fs::write(&path, "grpc_prot = 1\n").unwrap();
    let said = load_with_own(&["sluice", "--config", file])
        .unwrap_err()
        .to_string();
    assert!(said.contains(":1:1: unknown setting `grpc_prot`"), "{said}");
    std::fs::write(&path, "grpc_port = \"x\"\n").unwrap();
    let said = load_with_own(&["sluice", "--config", file])
        .unwrap_err()
        .to_string();
    assert!(said.contains("grpc_port"), "{said}");
    std::fs::remove_dir_all(&dir).unwrap();
}
