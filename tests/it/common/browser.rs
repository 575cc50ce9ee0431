//! Headless Chromium driven through chromedriver's WebDriver API, to check pages as a person
//! sees them (`document.body.innerText` reflects rendering: hidden elements are left out).

use std::{net::Ipv4Addr, process::Command, time::Duration};

use serde_json::{Value, json};

use super::{
    eureka::http,
    peers,
    process::{Proc, free_port, scratch_dir, wait_for},
};

pub struct Browser {
    _driver: Proc,
    base: String,
    session: String,
    _dir: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (`None` outside CI without peers).
    pub async fn start() -> Option<Browser> {
        let chromium = peers::require("EUREKA_PEER_CHROMIUM", "dashboard tests")?;
        let driver = peers::require("EUREKA_PEER_CHROMEDRIVER", "dashboard tests")?;
        let dir = scratch_dir("browser");
        let port = free_port(Ipv4Addr::LOCALHOST);
        let mut cmd = Command::new(driver);
        cmd.arg(format!("--port={port}"));
        let proc = Proc::spawn("chromedriver", cmd, &dir.path().join("chromedriver.log"));
        let base = format!("http://127.0.0.1:{port}");
        let client = http();
        wait_for(
            "chromedriver",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let (client, base) = (client.clone(), base.clone());
                async move {
                    let v: Value = client
                        .get(format!("{base}/status"))
                        .send()
                        .await
                        .ok()?
                        .json()
                        .await
                        .ok()?;
                    (v["value"]["ready"] == true).then_some(())
                }
            },
        )
        .await;
        let profile = dir.path().join("profile");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                format!("--user-data-dir={}", profile.display()),
            ]}
        }}});
        let v: Value = client
            .post(format!("{base}/session"))
            .json(&caps)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("failed to create a WebDriver session")
            .json()
            .await
            .expect("WebDriver session reply");
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {v}\n{}", proc.log_tail(20)))
            .to_string();
        Some(Browser {
            _driver: proc,
            base,
            session,
            _dir: dir,
        })
    }

    pub async fn open(&self, url: &str) {
        let r = http()
            .post(format!("{}/session/{}/url", self.base, self.session))
            .json(&json!({"url": url}))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("WebDriver navigation");
        assert!(
            r.status().is_success(),
            "navigation to {url} failed: {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        let v: Value = http()
            .post(format!("{}/session/{}/execute/sync", self.base, self.session))
            .json(&json!({"script": script, "args": []}))
            .send()
            .await
            .expect("WebDriver script")
            .json()
            .await
            .expect("WebDriver script reply");
        v["value"].clone()
    }

    /// The text a person sees on the page.
    pub async fn visible_text(&self) -> String {
        self.eval("return document.body.innerText")
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The session ends with chromedriver, which the process guard stops.
    }
}
