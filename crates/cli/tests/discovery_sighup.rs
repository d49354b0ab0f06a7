//! `sluice serve --discovery-file` rereads its file on SIGHUP, even when nothing about the file
//! (size, modification time) says it changed — the way an operator forces a reread.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[path = "common/launched.rs"]
mod launched;
use launched::Launched;
use sluice_sim::testkit::instant;
use sluice_sim::{Flavor, FleetConfig, SimFleet};

/// `sluice serve` on a free loopback port reading `listing`, its periodic reread far off.
fn serve(listing: &str) -> Launched {
    let args: Vec<String> = [
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--discovery-file",
        listing,
        "--discovery-check-interval-secs",
        "600",
    ]
    .map(String::from)
    .to_vec();
    Launched::start(&args, &[])
}

/// Waits (bounded) for a line holding every one of `needles`.
fn until(gateway: &mut Launched, needles: &[&str]) {
    gateway.until(&format!("a line with {needles:?}"), |line| {
        needles.iter().all(|n| line.contains(n)).then_some(())
    });
}

/// A listing of `url`, padded to a fixed length so two listings are the same size.
fn listing(url: &str) -> String {
    format!("{:<64}", format!("[\"{url}\"]"))
}

#[test]
fn sighup_rereads_an_unchanged_looking_file() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fleet = runtime
        .block_on(SimFleet::start(FleetConfig::local(
            2,
            instant(Flavor::Vllm),
        )))
        .unwrap();
    let urls = fleet.urls();
    let path = std::env::temp_dir().join(format!("sluice-sighup-{}.json", std::process::id()));
    std::fs::write(&path, listing(&urls[0])).unwrap();
    let mut gateway = serve(path.to_str().unwrap());
    until(&mut gateway, &["worker registered", &urls[0]]);
    until(&mut gateway, &["worker health changed", "to=\"ready\""]);

    // The same size and modification time: only a SIGHUP makes it read again. Written aside
    // and dated before the rename, so the gateway never sees a newer time.
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    let aside = path.with_extension("next");
    std::fs::write(&aside, listing(&urls[1])).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&aside)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    std::fs::rename(&aside, &path).unwrap();
    let pid = gateway.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    until(&mut gateway, &["no longer listed: draining"]);
    until(&mut gateway, &["worker registered", &urls[1]]);
    assert!(
        gateway.child.try_wait().unwrap().is_none(),
        "SIGHUP does not end the gateway"
    );
    let _ = std::fs::remove_file(&path);
}
