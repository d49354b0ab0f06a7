//! Headless Chromium driven over WebDriver: Debian's `chromium` and `chromium-driver`
//! (`scripts/test` installs them), a chromedriver started on a free loopback port and stopped by
//! its PID when dropped, and a fresh profile per browser. Waits happen in the page, on its own
//! changes (a `MutationObserver`), not by polling from here.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::wd::TimeoutConfiguration;
use fantoccini::{Client, ClientBuilder, Locator};

use super::launched::Lines;

/// Chromium's flags for a closed network: without the background-networking ones it keeps
/// trying to reach Google's hosts.
const FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
];

pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: std::path::PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Browser {
    pub async fn start() -> Self {
        let port = free_port();
        let mut driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("chromedriver is needed ({e}): run scripts/test, or apt-get install chromium chromium-driver")
            });
        // It says so once it listens.
        let mut said = Lines::of(driver.stdout.take().expect("piped"));
        said.until("chromedriver listening", Duration::from_secs(30), |l| {
            l.contains("started successfully").then_some(())
        });
        let profile =
            std::env::temp_dir().join(format!("sluice-chromium-{}-{port}", std::process::id()));
        let mut args: Vec<String> = FLAGS.iter().map(ToString::to_string).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({"args": args, "binary": "/usr/bin/chromium"}),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a browser session");
        Self {
            client,
            driver,
            profile,
        }
    }

    /// Waits, in the page, until `check` (a script body returning a value, `null` for "not
    /// yet") gives one: it is run now and on every change to the document, and the value comes
    /// back once it is there. Fails after `within`.
    pub async fn until(&self, what: &str, check: &str, within: Duration) -> serde_json::Value {
        self.client
            .update_timeouts(TimeoutConfiguration::new(Some(within), None, None))
            .await
            .expect("the script timeout set");
        let script = format!(
            "const done = arguments[arguments.length - 1];\n\
             const check = () => {{ {check} }};\n\
             let observer;\n\
             const test = () => {{\n\
               let got = null;\n\
               try {{ got = check(); }} catch (e) {{ got = null; }}\n\
               if (got === null || got === undefined) return false;\n\
               if (observer) observer.disconnect();\n\
               done(got);\n\
               return true;\n\
             }};\n\
             if (!test()) {{\n\
               observer = new MutationObserver(test);\n\
               observer.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});\n\
             }}"
        );
        self.client
            .execute_async(&script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("no {what} within {within:?}: {e}"))
    }

    pub async fn screenshot(&self, path: &std::path::Path) {
        let png = self.client.screenshot().await.expect("a screenshot");
        std::fs::write(path, png).expect("the screenshot written");
    }

    pub async fn find_text(&self, css: &str) -> String {
        let e = self.client.find(Locator::Css(css)).await.expect(css);
        e.text().await.expect("its text")
    }
}

/// The PIDs of the processes whose command line holds `needle` (the browser's own profile
/// directory names every process of it).
fn pids_with(needle: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().into_string().ok()?;
            pid.chars().all(|c| c.is_ascii_digit()).then_some(())?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

impl Browser {
    /// Ends the session (chromedriver closes the browser), then the driver.
    pub async fn stop(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    /// chromedriver and, should the session not have closed them, the browser's processes, by
    /// their PIDs.
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let left = pids_with(&format!("--user-data-dir={}", self.profile.display()));
        if !left.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&left).status();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
