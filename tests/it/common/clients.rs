//! The other Eureka client generations as test peers (tests/peers/{netflix-client,spring-clients,
//! go-client}): starting them, reading what each client reports (`/stats`, `/seen-all`), churning
//! other instances on a server, and the scenario every generation goes through on a server.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    eureka::{JVM_FLAGS, app_instances, http, spring_client_command, spring_instance},
    peers,
    process::{Proc, free_port, scratch_dir, wait_for},
};

/// One Eureka client's reports: `GET {base}/stats{suffix}` and `GET {base}/seen-all{suffix}/{APP}`.
#[derive(Clone, Debug)]
pub struct ClientView {
    pub label: String,
    base: String,
    suffix: String,
}

impl ClientView {
    pub fn new(label: &str, base: &str, client: Option<&str>) -> ClientView {
        ClientView {
            label: label.to_string(),
            base: base.to_string(),
            suffix: client.map(|c| format!("/{c}")).unwrap_or_default(),
        }
    }

    async fn get(&self, path: &str) -> Option<Value> {
        let r = http().get(format!("{}{path}", self.base)).send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.json().await.ok()
    }

    /// The client's counters (`Null` while it does not answer).
    pub async fn stats(&self) -> Value {
        self.get(&format!("/stats{}", self.suffix)).await.unwrap_or_default()
    }

    /// `(id, status)` of every instance of `app` in the client's registry copy, sorted.
    pub async fn seen_all(&self, app: &str) -> Vec<(String, String)> {
        let v = self
            .get(&format!("/seen-all{}/{app}", self.suffix))
            .await
            .unwrap_or_default();
        super::eureka::id_status_pairs(&v)
    }
}

fn count(stats: &Value, key: &str) -> u64 {
    stats[key].as_u64().unwrap_or(0)
}

/// Why a client's counters could not show a hash-code mismatch, if they could not: they were not
/// read (the client did not answer), they are counted from a log that is off (`countersValid`
/// false, where the client reports it), there is no mismatch counter, the client made no delta
/// fetch (`deltas`: the Eureka clients compare hash codes after a delta only), or (fargo, which
/// makes full fetches only and compares each with the `apps__hashcode` in it) it captured no
/// hash code.
pub fn mismatches_unseen(stats: &Value, deltas: bool) -> Option<String> {
    if !stats.is_object() {
        return Some("its counters were not read".into());
    }
    if let Some(valid) = stats.get("countersValid")
        && *valid != true
    {
        return Some(format!(
            "its counters are not valid (countersValid: {valid}: DiscoveryClient's DEBUG log is off)"
        ));
    }
    if stats["reconcileMismatches"].as_u64().is_none() {
        return Some("it reports no reconcileMismatches counter".into());
    }
    if deltas {
        (count(stats, "deltaFetches") == 0).then(|| "it made no delta fetch, so it never compared hash codes".into())
    } else {
        stats["lastServerHashCode"]
            .as_str()
            .is_none_or(str::is_empty)
            .then(|| "it captured no apps__hashcode from the server, so it never compared hash codes".into())
    }
}

/// Asserts that the client `label` counted no hash-code mismatch on `server`, and first that its
/// counters could have counted one ([`mismatches_unseen`]): a zero that could be nothing else
/// proves nothing.
pub fn assert_no_mismatch(label: &str, server: &str, stats: &Value, deltas: bool) {
    if let Some(why) = mismatches_unseen(stats, deltas) {
        panic!("{label} on {server}: a zero-mismatch check that proves nothing: {why}: {stats}");
    }
    assert_eq!(
        stats["reconcileMismatches"], 0,
        "{label} on {server}: hash-code mismatches: {stats}"
    );
}

async fn wait_http(what: &str, url: &str) {
    let client = http();
    wait_for(what, Duration::from_secs(180), Duration::from_millis(250), || {
        let (client, url) = (client.clone(), url.to_string());
        async move {
            client
                .get(&url)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        }
    })
    .await;
}

// === the plain Netflix client (1.x, Jersey 1, no Spring) ===

/// One JVM of tests/peers/netflix-client running one `DiscoveryClient` per `(name, service URL,
/// codec)`, all registered as `app` with instance ids `{id}-{name}`.
pub struct NetflixClients {
    pub proc: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl NetflixClients {
    /// `None` when the peer is missing outside CI.
    pub async fn start(app: &str, id: &str, clients: &[(&str, &str, &str)]) -> Option<NetflixClients> {
        let jar = peers::require("EUREKA_PEER_NETFLIX_CLIENT_JAR", "Netflix 1.x client tests")?;
        let port = free_port(Ipv4Addr::LOCALHOST);
        let dir = scratch_dir("netflix-client");
        let mut cmd = Command::new("java");
        cmd.args(JVM_FLAGS)
            .arg("-jar")
            .arg(&jar)
            .args(["--port", &port.to_string(), "--app", app, "--id", id]);
        for (name, url, codec) in clients {
            cmd.arg("--client").arg(format!("{name},{url},{codec}"));
        }
        let proc = Proc::spawn("netflix-client", cmd, &dir.path().join("netflix-client.log"));
        let peer = NetflixClients { proc, port, _dir: dir };
        let first = clients.first().map(|c| c.0).unwrap_or("");
        wait_http("the Netflix 1.x client JVM", &format!("{}/stats/{first}", peer.base())).await;
        Some(peer)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn view(&self, name: &str) -> ClientView {
        ClientView::new(&format!("netflix-1.x/{name}"), &self.base(), Some(name))
    }

    /// `DiscoveryClient.shutdown()` of one client: it cancels its lease.
    pub async fn shutdown(&self, name: &str) {
        let r = http()
            .post(format!("{}/shutdown/{name}", self.base()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /shutdown/{name}: {e}"));
        assert!(r.status().is_success(), "POST /shutdown/{name}: {}", r.status());
    }
}

// === Spring client apps of other generations ===

/// A Spring client app built from tests/peers/spring-clients (`jar_var` names its jar), one
/// Eureka client per JVM, with 1 s intervals and a 3 s lease.
pub struct SpringApp {
    pub proc: Proc,
    port: u16,
    label: String,
    _dir: tempfile::TempDir,
}

impl SpringApp {
    pub async fn start(
        jar_var: &str,
        label: &str,
        eureka_url: &str,
        app: &str,
        instance_id: &str,
        extra: &[&str],
    ) -> Option<SpringApp> {
        let jar = peers::require(jar_var, label)?;
        let port = free_port(Ipv4Addr::LOCALHOST);
        let dir = scratch_dir("spring-app");
        let mut cmd = spring_client_command(&jar, port, eureka_url, app, instance_id);
        cmd.args(extra);
        let proc = Proc::spawn(label, cmd, &dir.path().join("spring-app.log"));
        let app = SpringApp {
            proc,
            port,
            label: label.to_string(),
            _dir: dir,
        };
        wait_http(&format!("the {label} app"), &format!("{}/stats", app.base())).await;
        Some(app)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn view(&self) -> ClientView {
        ClientView::new(&self.label, &self.base(), None)
    }

    /// `GET {base}{path}` as JSON.
    pub async fn get(&self, path: &str) -> Value {
        http()
            .get(format!("{}{path}", self.base()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} on {}: {e}", self.label))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {path} on {} is not JSON: {e}", self.label))
    }
}

// === the Go client (fargo) ===

/// tests/peers/go-client: fargo registering `app`/`id` on `127.0.0.1:port`, which it also serves.
pub struct GoClient {
    pub proc: Proc,
    pub port: u16,
    label: String,
    _dir: tempfile::TempDir,
}

impl GoClient {
    /// `server` is the service URL without a trailing slash (`http://ip:port/eureka`).
    pub async fn start(server: &str, app: &str, id: &str, json: bool) -> Option<GoClient> {
        let bin = peers::require("EUREKA_PEER_GO_CLIENT", "fargo client tests")?;
        let port = free_port(Ipv4Addr::LOCALHOST);
        let dir = scratch_dir("go-client");
        let mut cmd = Command::new(bin);
        cmd.args([
            "--server",
            server,
            "--app",
            app,
            "--id",
            id,
            "--port",
            &port.to_string(),
        ]);
        if json {
            cmd.arg("--json");
        }
        let label = format!("fargo/{}", if json { "json" } else { "xml" });
        let proc = Proc::spawn("go-client", cmd, &dir.path().join("go-client.log"));
        let peer = GoClient {
            proc,
            port,
            label,
            _dir: dir,
        };
        wait_http("the fargo client", &format!("{}/stats", peer.base())).await;
        Some(peer)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn view(&self) -> ClientView {
        ClientView::new(&self.label, &self.base(), None)
    }
}

/// SIGTERM, and waits up to `grace` for the process to exit; whether it did.
pub async fn stop(proc: &mut Proc, grace: Duration) -> bool {
    proc.signal(libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if proc.try_exit().is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

// === churn and overrides through the REST API ===

/// Instances of `app` registered, cancelled and put in and out of service on the server at `base`
/// (ending in `/eureka/`) through its REST API, so clients see a registry that keeps changing.
pub struct Churn {
    base: String,
    app: String,
    live: Vec<String>,
    next: usize,
}

impl Churn {
    /// Registers one instance and cancels it at once, then registers `initial` more: a client's
    /// first delta with this application then lists a removed instance before added ones.
    pub async fn start(base: &str, app: &str, initial: usize) -> Churn {
        let mut churn = Churn {
            base: base.to_string(),
            app: app.to_string(),
            live: Vec::new(),
            next: 0,
        };
        churn.register().await;
        churn.step(2).await;
        for _ in 0..initial {
            churn.register().await;
        }
        churn
    }

    async fn register(&mut self) {
        let id = format!("{}-{}", self.app.to_lowercase(), self.next);
        self.next += 1;
        let port = 20000 + self.next as u16;
        let ldt = chrono_ms();
        let body = json!({"instance": spring_instance(&self.app, &id, "127.0.0.1", "127.0.0.1", port, &self.app.to_lowercase(), ldt)});
        let r = http()
            .post(format!("{}apps/{}", self.base, self.app))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("registering {id} at {}: {e}", self.base));
        assert_eq!(r.status(), 204, "registering {id} at {}", self.base);
        self.live.push(id);
    }

    /// One change: step 0 registers, 1 takes the oldest out of service, 2 cancels it, and so on.
    pub async fn step(&mut self, n: usize) {
        match n % 3 {
            0 => self.register().await,
            1 => {
                let id = self.live[0].clone();
                set_status(&self.base, &self.app, &id, Some("OUT_OF_SERVICE")).await;
            }
            _ => {
                let id = self.live.remove(0);
                let r = http()
                    .delete(format!("{}apps/{}/{id}", self.base, self.app))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("cancelling {id}: {e}"));
                assert_eq!(r.status(), 200, "cancelling {id} at {}", self.base);
            }
        }
    }

    /// Cancels what is left.
    pub async fn finish(&mut self) {
        for id in std::mem::take(&mut self.live) {
            let _ = http()
                .delete(format!("{}apps/{}/{id}", self.base, self.app))
                .send()
                .await;
        }
    }
}

fn chrono_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `PUT .../status?value=V` with `Some(V)`, `DELETE .../status` with `None`; asserts 200.
pub async fn set_status(base: &str, app: &str, id: &str, value: Option<&str>) {
    let url = format!("{base}apps/{app}/{id}/status");
    let req = match value {
        Some(v) => http().put(format!("{url}?value={v}")),
        None => http().delete(url),
    };
    let r = req.send().await.unwrap_or_else(|e| panic!("status of {id}: {e}"));
    assert_eq!(r.status(), 200, "status {value:?} of {app}/{id} at {base}");
}

// === the scenario ===

/// A client under test on one server: what it reports and the instance it registered.
pub struct Subject<'a> {
    pub view: &'a ClientView,
    pub app: &'a str,
    pub id: &'a str,
}

/// What a server's clients went through, for the comparison printed at the end of a test.
#[derive(Debug, Default)]
pub struct Outcome {
    pub server: String,
    /// Stats of each client after the churn and the override round trip, by label.
    pub stats: BTreeMap<String, Value>,
}

/// Every client generation goes through this on a server (`base` ends in `/eureka/`):
/// 1. its instance is registered UP and it heartbeats;
/// 2. it fetched the full registry, then deltas (`deltas` false: fargo, full fetches only);
/// 3. while `churn_app` instances are registered, put out of service and cancelled, at least
///    three more refresh cycles pass and its copy of `churn_app` ends equal to the server's; with
///    `strict` (our server), with no further full fetch, no refused delta and no hash-code mismatch,
///    counted only where the client's counters could show one ([`assert_no_mismatch`]; on the Java
///    server these are reported, not asserted: see [`Churn::start`]);
/// 4. an OUT_OF_SERVICE override of its own instance reaches it (and every other subject on the
///    server); deleting the override makes the next heartbeat 404, it registers again, and sees
///    itself UP again (asserted with `strict`; otherwise `backAfterOverrideDeleted` in its stats
///    says whether it did within 15 s).
pub async fn exercise(
    server: &str,
    base: &str,
    subjects: &[Subject<'_>],
    churn_app: &str,
    deltas: bool,
    strict: bool,
) -> Outcome {
    // 1 and 2.
    for s in subjects {
        wait_for(
            &format!("{} to be registered UP on {server}", s.view.label),
            Duration::from_secs(120),
            Duration::from_millis(200),
            || async {
                app_instances(base, s.app)
                    .await
                    .iter()
                    .any(|(i, st)| i == s.id && st == "UP")
                    .then_some(())
            },
        )
        .await;
        wait_for(
            &format!(
                "{} to fetch (full, then delta) and see itself on {server}",
                s.view.label
            ),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let stats = s.view.stats().await;
                let fetched = if deltas {
                    count(&stats, "deltaFetches") > 0
                } else {
                    count(&stats, "fullFetches") > 1
                };
                let seen = s.view.seen_all(s.app).await.contains(&(s.id.into(), "UP".into()));
                (fetched && seen && count(&stats, "heartbeatsOk") > 0 && count(&stats, "fullFetches") > 0).then_some(())
            },
        )
        .await;
    }

    // 3.
    let mut before = Vec::new();
    for s in subjects {
        before.push(s.view.stats().await);
    }
    let mut churn = Churn::start(base, churn_app, 3).await;
    for n in 0..9 {
        churn.step(n).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    for (s, b) in subjects.iter().zip(&before) {
        let key = if deltas { "deltaFetches" } else { "fullFetches" };
        wait_for(
            &format!(
                "{} to follow the churn on {server} over three more refreshes",
                s.view.label
            ),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let stats = s.view.stats().await;
                let mine = s.view.seen_all(churn_app).await;
                let truth = app_instances(base, churn_app).await;
                (count(&stats, key) >= count(b, key) + 3 && mine == truth).then_some(())
            },
        )
        .await;
        let after = s.view.stats().await;
        if !strict {
            continue;
        }
        assert_no_mismatch(&s.view.label, server, &after, deltas);
        if deltas {
            assert_eq!(
                count(&after, "fullFetches"),
                count(b, "fullFetches"),
                "{} on {server}: a full fetch during the churn: before {b}, after {after}",
                s.view.label
            );
            assert_eq!(after["deltaRefused"], 0, "{} on {server}: {after}", s.view.label);
        }
    }
    churn.finish().await;

    // 4.
    let mut back_again = BTreeMap::new();
    for s in subjects {
        set_status(base, s.app, s.id, Some("OUT_OF_SERVICE")).await;
        for o in subjects {
            let seen = poll_until(Duration::from_secs(30), || async {
                o.view
                    .seen_all(s.app)
                    .await
                    .contains(&(s.id.into(), "OUT_OF_SERVICE".into()))
            })
            .await;
            // The reference server's own behaviour is reported, not asserted (its Jersey 1
            // clients can be stuck after its 404 body, see docs/src/reference/differences.md); ours must deliver.
            assert!(
                seen || !strict,
                "{} did not see {} OUT_OF_SERVICE on {server} within 30 s",
                o.view.label,
                s.id
            );
            if !seen {
                eprintln!(
                    "{} did not see {} OUT_OF_SERVICE on {server} within 30 s",
                    o.view.label, s.id
                );
            }
        }
        set_status(base, s.app, s.id, None).await;
        let back = poll_until(Duration::from_secs(if strict { 30 } else { 15 }), || async {
            let back = app_instances(base, s.app).await.contains(&(s.id.into(), "UP".into()));
            back && s.view.seen_all(s.app).await.contains(&(s.id.into(), "UP".into()))
        })
        .await;
        assert!(
            back || !strict,
            "{} did not register again UP after its override was deleted on {server}: {}",
            s.view.label,
            s.view.stats().await
        );
        back_again.insert(s.view.label.clone(), back);
    }

    let mut outcome = Outcome {
        server: server.to_string(),
        ..Outcome::default()
    };
    for s in subjects {
        let mut stats = s.view.stats().await;
        if strict {
            assert_no_mismatch(&s.view.label, server, &stats, deltas);
        }
        stats["backAfterOverrideDeleted"] = back_again[&s.view.label].into();
        outcome.stats.insert(s.view.label.clone(), stats);
    }
    outcome
}

/// Polls `check` every 200 ms until it is true (then true) or `timeout` passes (then false).
pub async fn poll_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `id` of `app` is gone from the server at `base`.
pub async fn wait_cancelled(server: &str, base: &str, app: &str, id: &str) {
    wait_for(
        &format!("{app}/{id} to be cancelled on {server}"),
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { (!app_instances(base, app).await.iter().any(|(i, _)| i == id)).then_some(()) },
    )
    .await;
}

/// Prints each client's counters on each server side by side, so a difference shows in the log.
pub fn print_comparison(title: &str, outcomes: &[&Outcome]) {
    const KEYS: [&str; 9] = [
        "fullFetches",
        "deltaFetches",
        "deltaRefused",
        "reconcileMismatches",
        "registrations",
        "reregistrations",
        "heartbeatsOk",
        "remoteStatus",
        "backAfterOverrideDeleted",
    ];
    println!("== {title}");
    for o in outcomes {
        for (label, stats) in &o.stats {
            let row: Vec<String> = KEYS.iter().map(|k| format!("{k}={}", stats[*k])).collect();
            println!("{:<10} {:<22} {}", o.server, label, row.join(" "));
        }
    }
}
