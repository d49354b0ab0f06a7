//! The status page in a real browser (headless Chromium over WebDriver; `scripts/test` installs
//! Debian's `chromium` and `chromium-driver`), on a running `sluice demo`: every worker has a
//! card, a frozen engine's card turns vetoed within the liveness bound plus one update, the
//! charts receive points, and the demo stops every process it started, at the story's end or on
//! Ctrl-C.
//!
//! `scripts/screenshots` runs the ignored `screenshots` test: the demo's page at each act of the
//! story, with `--compare`, into docs/screenshots/.
#![allow(clippy::unwrap_used)]

#[path = "common/browser.rs"]
mod browser;
#[path = "common/launched.rs"]
#[allow(dead_code)]
mod launched;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use browser::Browser;
use launched::Lines;

/// The gateway's default wedge bound (`--worker-wedge-secs`), and its page's update interval.
const WEDGE: Duration = Duration::from_secs(3);
const UPDATE: Duration = Duration::from_millis(250);
/// What the browser and the liveness checker's own tick may add on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);

/// `sluice demo` as a process, its stdout read line by line.
struct Demo {
    /// `None` once waited for.
    child: Option<Child>,
    lines: Lines,
    out: PathBuf,
}

impl Demo {
    fn start(args: &[&str], out: &Path) -> Self {
        let _ = std::fs::remove_dir_all(out);
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("demo")
            .args(["--port", "0", "--out"])
            .arg(out)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Lines::of(child.stdout.take().unwrap());
        Self {
            child: Some(child),
            lines,
            out: out.to_path_buf(),
        }
    }

    /// The first line `pick` takes something from (bounded).
    fn until<T>(&mut self, what: &str, within: Duration, pick: impl Fn(&str) -> Option<T>) -> T {
        self.lines.until(what, within, pick)
    }

    /// The demo's page, and the protected gateway's status page.
    fn pages(&mut self) -> (String, String) {
        let page = self.until("the page's address", Duration::from_secs(120), |l| {
            l.strip_prefix("sluice demo: open ")?
                .strip_suffix(" to watch")
                .map(String::from)
        });
        let ui = self.until("the gateway's page", Duration::from_secs(5), |l| {
            l.strip_prefix("  sluice, protections on: ")
                .map(String::from)
        });
        (page, ui)
    }

    /// The PIDs the demo wrote down.
    fn pids(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.out.join("pids")).unwrap();
        text.lines()
            .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect()
    }

    /// Waits for the demo to exit (bounded), and checks that none of its processes is left.
    async fn exited_clean(&mut self, pids: &[u32], within: Duration) {
        let mut child = self.child.take().expect("not yet waited for");
        let pid = child.id();
        let exit = tokio::task::spawn_blocking(move || child.wait());
        let status = tokio::time::timeout(within, exit)
            .await
            .unwrap_or_else(|_| {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!("the demo did not end within {within:?}")
            })
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status}");
        // The demo stops its processes and waits for each before it exits.
        let left: Vec<u32> = pids.iter().copied().filter(|pid| alive(*pid)).collect();
        assert_eq!(left, Vec::<u32>::new(), "processes left behind");
    }
}

/// Whether `pid` is a running process (a zombie is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(')')
                .next()
                .map(|rest| rest.trim().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

impl Drop for Demo {
    /// A test that failed midway: the demo, then every process it wrote down that still runs
    /// `sluice`, by their PIDs (killed itself, the demo cannot stop them).
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        let Ok(text) = std::fs::read_to_string(self.out.join("pids")) else {
            return;
        };
        let ours = |pid: &&str| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("sluice"))
        };
        let pids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(ours)
            .collect();
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&pids).status();
        }
    }
}

fn out_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()))
}

/// How many cards the page shows in `state` (any state: `null` selector).
fn cards(state: Option<&str>) -> String {
    match state {
        Some(s) => format!("document.querySelectorAll('.card[data-state=\"{s}\"]').length"),
        None => "document.querySelectorAll('.card').length".into(),
    }
}

#[tokio::test]
async fn the_demos_page_shows_every_worker_and_a_frozen_one_turns_vetoed_in_time() {
    let mut demo = Demo::start(
        &["--scenario", "freeze", "--duration", "45", "--exit"],
        &out_dir("demo-freeze"),
    );
    let (page, ui) = demo.pages();
    let pids = demo.pids();
    assert_eq!(pids.len(), 7, "six engines and a gateway");
    let browser = Browser::start().await;

    browser.client.goto(&ui).await.unwrap();
    // Every worker has a card, in service (a full one may be vetoed for overload a moment).
    let all = "const cards = [...document.querySelectorAll('.card')]; \
               return cards.length === 6 && cards.every(c => \
                 ['ready', 'vetoed'].includes(c.dataset.state)) ? true : null";
    browser
        .until("six cards in service", all, Duration::from_secs(20))
        .await;
    let points = "const n = +document.getElementById('chart-rates').dataset.points; \
                  const lines = document.querySelectorAll('#chart-rates polyline').length; \
                  return n > 2 && lines > 0 ? n : null";
    browser
        .until("chart points", points, Duration::from_secs(20))
        .await;

    demo.until("the freeze", Duration::from_secs(60), |l| {
        l.contains("an engine freezes").then_some(())
    });
    // Within the wedge bound plus an update (the engine's own token counter, read with its
    // load reports, may tell sooner).
    let wedged = ".card[data-state=\"vetoed\"] li[data-kind=\"wedged\"]";
    let vetoed = format!("return document.querySelectorAll('{wedged}').length === 1 ? true : null");
    browser
        .until(
            "the frozen engine's card vetoed",
            &vetoed,
            WEDGE + UPDATE + SLACK,
        )
        .await;
    let cause = browser.find_text(wedged).await;
    assert!(cause.starts_with("wedged: "), "{cause}");
    assert_eq!(
        browser
            .client
            .execute(&format!("return {}", cards(None)), vec![])
            .await
            .unwrap(),
        6,
        "every worker still has its card"
    );

    browser.client.goto(&page).await.unwrap();
    browser
        .until(
            "the narration",
            "const t = document.getElementById('narration').textContent; \
             return t.includes('freezes') ? t : null",
            Duration::from_secs(10),
        )
        .await;
    let frames = browser
        .client
        .execute("return document.querySelectorAll('iframe').length", vec![])
        .await
        .unwrap();
    assert_eq!(frames, 1, "one gateway without --compare");
    browser.stop().await;

    demo.until("the report", Duration::from_secs(90), |l| {
        l.starts_with("sluice, protections on: ").then_some(())
    });
    demo.exited_clean(&pids, Duration::from_secs(60)).await;
}

#[tokio::test]
async fn ctrl_c_stops_every_process_the_demo_started() {
    let mut demo = Demo::start(&["--duration", "600"], &out_dir("demo-interrupted"));
    demo.pages();
    let pids = demo.pids();
    assert!(pids.iter().all(|&pid| alive(pid)), "{pids:?}");
    let pid = demo.child.as_ref().unwrap().id();
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    demo.exited_clean(&pids, Duration::from_secs(30)).await;
}

/// The demo's page at each act of the story, both gateways side by side, for docs/screenshots
/// (`scripts/screenshots`).
#[tokio::test]
#[ignore = "writes docs/screenshots; run by scripts/screenshots"]
async fn screenshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let secs_per_act = 30;
    let duration = (5 * secs_per_act).to_string();
    let mut demo = Demo::start(
        &["--compare", "--duration", &duration, "--exit"],
        &out_dir("demo-screenshots"),
    );
    let (page, _) = demo.pages();
    let browser = Browser::start().await;
    browser.client.set_window_size(1800, 1150).await.unwrap();
    browser.client.goto(&page).await.unwrap();
    for act in 1..=5u32 {
        let name = demo.until("an act", Duration::from_secs(60), |l| {
            let rest = l.split_once(&format!("act {act}/5: "))?.1;
            Some(rest.split([':', ',']).next().unwrap_or(rest).to_string())
        });
        // Two thirds into the act (the page's story clock says), what it does has shown.
        let at = (u64::from(act) - 1) * secs_per_act + secs_per_act * 2 / 3;
        let clock = format!(
            "const [m, s] = document.getElementById('clock').textContent.split(':'); \
             return (+m) * 60 + (+s) >= {at} ? true : null"
        );
        browser
            .until(
                "two thirds into the act",
                &clock,
                Duration::from_secs(secs_per_act * 2),
            )
            .await;
        let slug: String = name
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join("-")
            .to_lowercase();
        browser
            .screenshot(&dir.join(format!("act-{act}-{slug}.png")))
            .await;
    }
    browser.stop().await;
    demo.until("the report", Duration::from_secs(120), |l| {
        l.starts_with("unprotected").then_some(())
    });
    let pids = demo.pids();
    demo.exited_clean(&pids, Duration::from_secs(60)).await;
}

#[tokio::test]
async fn with_an_admin_key_the_page_asks_for_it_once_and_no_script_can_read_it() {
    use sluice_sim::testkit::instant;
    use sluice_sim::{FleetConfig, SimFleet};
    let sims = SimFleet::start(FleetConfig::local(1, instant(sluice_sim::Flavor::Vllm)))
        .await
        .unwrap();
    let mut config = sluice_gateway::Config::local(&sims.urls());
    config.access.keys.admin = Some("page-secret".into());
    let gateway = sluice_gateway::Gateway::start(config).await.unwrap();
    let browser = Browser::start().await;
    browser
        .client
        .goto(&format!("{}/ui", gateway.url()))
        .await
        .unwrap();
    let form_shown = "return document.getElementById('login').hidden ? null : true";
    browser
        .until("the login form", form_shown, Duration::from_secs(10))
        .await;

    let submit = |key: &'static str| {
        let client = browser.client.clone();
        async move {
            let input = client.find(fantoccini::Locator::Id("key")).await.unwrap();
            input.send_keys(key).await.unwrap();
            client
                .find(fantoccini::Locator::Css("#login button"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
    };
    submit("wrong").await;
    let refused = "const e = document.getElementById('login-error'); \
                   return e.hidden ? null : e.textContent";
    let said = browser
        .until("the refusal", refused, Duration::from_secs(10))
        .await;
    assert_eq!(said, "That key was refused.");

    submit("page-secret").await;
    let one = format!("return {} === 1 ? true : null", cards(Some("ready")));
    browser
        .until("the worker's card", &one, Duration::from_secs(20))
        .await;
    let cookies = browser
        .client
        .execute("return document.cookie", vec![])
        .await
        .unwrap();
    assert_eq!(cookies, "", "the key's cookie is HttpOnly");

    // A reload needs no key: the cookie is sent.
    browser.client.refresh().await.unwrap();
    browser
        .until("the card after a reload", &one, Duration::from_secs(20))
        .await;
    browser.stop().await;
    gateway.shutdown().await;
}
