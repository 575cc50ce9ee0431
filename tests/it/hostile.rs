//! Hostile clients against the built server (issue #10): one test per attack on request content —
//! a metadata PUT of 5k keys on an instance holding 100k, metadata keys that are not XML names,
//! a `javascript:` status page on the dashboard, 20 concurrent gzip bombs, a repeated query key —
//! and a registration flood against the registry's caps. Each runs while a legitimate instance
//! heartbeats every 50 ms and reports the heartbeat latency during the attack against a baseline,
//! and the server's resident memory read from `/proc`.

use std::{
    io::Write,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::common::{
    browser::Browser,
    eureka::{ScriptPeer, Server, http},
    process::rss_kib,
};

const HEARTBEAT_EVERY: Duration = Duration::from_millis(50);

/// Resident memory of `pid`, in KiB.
fn rss(pid: i32) -> u64 {
    rss_kib(pid as u32).unwrap_or(0)
}

/// The largest RSS of a process seen since the sampler started (sampled every 5 ms).
struct RssPeak {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssPeak {
    fn start(pid: i32) -> RssPeak {
        let peak = Arc::new(AtomicU64::new(rss(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        RssPeak {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// Heartbeat latencies in one window.
#[derive(Debug, Clone, Copy)]
struct Latency {
    count: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} heartbeats, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.count,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3
        )
    }
}

/// A legitimate instance renewing its lease every 50 ms, each renewal timed. A renewal that a
/// stalled server holds up is recorded when it returns, with its whole wait.
struct Heartbeats {
    samples: Arc<Mutex<Vec<(Instant, Duration)>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeats {
    async fn start(server: &Server) -> Heartbeats {
        register(server, "PROBE", "probe-1", json!({})).await;
        let url = format!("{}apps/PROBE/probe-1", server.url());
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap();
            while !st.load(Ordering::Relaxed) {
                let started = Instant::now();
                let r = client.put(&url).send().await;
                let took = started.elapsed();
                assert!(r.as_ref().is_ok_and(|r| r.status() == 200), "a heartbeat failed: {r:?}");
                s.lock().push((started, took));
                tokio::time::sleep(HEARTBEAT_EVERY.saturating_sub(took)).await;
            }
        });
        Heartbeats { samples, stop, task }
    }

    /// Latencies of the heartbeats sent in `[from, to]`.
    fn between(&self, from: Instant, to: Instant) -> Latency {
        let mut v: Vec<Duration> = self
            .samples
            .lock()
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, d)| *d)
            .collect();
        v.sort();
        let at = |q: f64| {
            v.get(((v.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        Latency {
            count: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: v.last().copied().unwrap_or_default(),
        }
    }

    /// A baseline window of `d`.
    async fn baseline(&self, d: Duration) -> Latency {
        let from = Instant::now();
        tokio::time::sleep(d).await;
        self.between(from, Instant::now())
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

fn registration(app: &str, id: &str, metadata: Value) -> Value {
    json!({"instance": {
        "instanceId": id, "hostName": "10.0.0.1", "app": app, "ipAddr": "10.0.0.1", "status": "UP",
        "vipAddress": app.to_lowercase(), "port": {"$": 8080, "@enabled": "true"},
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "metadata": metadata,
    }})
}

async fn register(server: &Server, app: &str, id: &str, metadata: Value) {
    let r = http()
        .post(format!("{}apps/{app}", server.url()))
        .json(&registration(app, id, metadata))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap_or_default());
}

async fn instance_json(server: &Server, app: &str, id: &str) -> Value {
    http()
        .get(format!("{}apps/{app}/{id}", server.url()))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn report(attack: &str, baseline: Latency, during: Latency, rss: (u64, u64)) {
    println!(
        "[hostile] {attack}: baseline {baseline}; during the attack {during}; RSS {} MiB before, peak {} MiB (+{} MiB)",
        rss.0 / 1024,
        rss.1 / 1024,
        rss.1.saturating_sub(rss.0) / 1024
    );
}

/// How much slower than in the baseline the slowest heartbeat may be during an attack. Tests run
/// an unoptimised build on a shared machine where, under load, a heartbeat can wait a second for a
/// core at any time (seen: a load average of 16 on 2 cores); what this catches is a stall behind
/// the attack (a held registry lock or busy request workers), which cost 5 s (gzip bombs) and
/// over 60 s (metadata PUT) before the fix in the same build. Release figures are in the README.
const SLOWER_BY_AT_MOST: Duration = Duration::from_secs(2);

fn assert_heartbeats_held(attack: &str, baseline: Latency, during: Latency) {
    assert!(during.count > 0, "{attack}: no heartbeat during the attack");
    assert!(
        during.max <= baseline.max + SLOWER_BY_AT_MOST,
        "{attack}: heartbeats stalled: {during} (baseline {baseline})"
    );
}

/// What is measured around one attack: heartbeats (after a baseline window) and the server's RSS.
struct Watch {
    beats: Heartbeats,
    baseline: Latency,
    before: u64,
    peak: RssPeak,
    from: Instant,
}

impl Watch {
    /// Starts the heartbeats, takes a baseline of `baseline`, and starts measuring.
    async fn start(server: &Server, baseline: Duration) -> Watch {
        let beats = Heartbeats::start(server).await;
        let baseline = beats.baseline(baseline).await;
        let pid = server.proc.pid();
        Watch {
            beats,
            baseline,
            before: rss(pid),
            peak: RssPeak::start(pid),
            from: Instant::now(),
        }
    }

    /// Ends the attack (heartbeats sent in its last moments are waited for), reports, checks that
    /// heartbeats held, and returns the RSS before and at its peak, in KiB.
    async fn finish(self, attack: &str) -> (u64, u64) {
        tokio::time::sleep(HEARTBEAT_EVERY * 4).await;
        let during = self.beats.between(self.from, Instant::now());
        let peak = self.peak.finish();
        self.beats.stop().await;
        report(attack, self.baseline, during, (self.before, peak));
        assert_heartbeats_held(attack, self.baseline, during);
        (self.before, peak)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_put_of_5k_keys_on_an_instance_of_100k_does_not_stall_heartbeats() {
    // Caps raised (through the environment, which older builds ignore) to reach the size of the
    // attack; the default caps refuse it outright (see the flood test).
    let server = Server::start_with_env(
        Ipv4Addr::new(127, 0, 0, 80),
        &[],
        &[
            ("EUREKA_MAX_METADATA_KEYS_PER_INSTANCE", "200000"),
            ("EUREKA_MAX_INSTANCE_BYTES", "100000000"),
        ],
    )
    .await;
    let big: serde_json::Map<String, Value> = (0..100_000).map(|i| (format!("k{i:06}"), json!("v"))).collect();
    register(&server, "BIG", "big-1", Value::Object(big)).await;
    let watch = Watch::start(&server, Duration::from_secs(2)).await;
    let query: Vec<String> = (0..5_000).map(|i| format!("n{i}=")).collect();
    let started = Instant::now();
    let r = http()
        .put(format!("{}apps/BIG/big-1/metadata?{}", server.url(), query.join("&")))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(r.status(), 200);
    let stored = instance_json(&server, "BIG", "big-1").await;
    let metadata = stored["instance"]["metadata"].as_object().unwrap();
    assert_eq!(metadata.len(), 105_000);
    assert_eq!(metadata["n4999"], "");
    watch
        .finish(&format!(
            "metadata PUT of 5k keys on 100k (the PUT took {} ms)",
            took.as_millis()
        ))
        .await;
}

/// Every XML document a client can fetch, parsed by a strict XML 1.0 + namespaces parser.
async fn assert_every_xml_payload_is_well_formed(server: &Server, app: &str, id: &str) {
    let base = server.url();
    let vip = app.to_lowercase();
    let paths = [
        "apps".to_string(),
        "apps/delta".to_string(),
        format!("apps/{app}"),
        format!("apps/{app}/{id}"),
        format!("instances/{id}"),
        format!("vips/{vip}"),
        format!("svips/{vip}"),
        "status".to_string(),
    ];
    for path in &paths {
        for gzip in [false, true] {
            let mut req = http().get(format!("{base}{path}")).header("Accept", "application/xml");
            if gzip {
                req = req.header("Accept-Encoding", "gzip");
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
            let text = r.text().await.unwrap();
            if let Err(e) = roxmltree::Document::parse(&text) {
                panic!("GET {path} (gzip {gzip}) is not well-formed XML ({e}):\n{text}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_keys_that_are_not_xml_names_leave_every_xml_document_well_formed() {
    let server = Server::start(Ipv4Addr::new(127, 0, 0, 81), &[]).await;
    let watch = Watch::start(&server, Duration::from_secs(1)).await;
    // A registration whose keys and values XML cannot hold as they are.
    let hostile = json!({"a b": "1", "x><evil/": "<evil/>", "c:d": "colon", "ctl\u{1}": "v\u{1}v",
                         "1num": "cr\rlf", "\u{1F600}": "emoji", "ok": "]]>"});
    register(&server, "HOSTILE", "hostile-1", hostile).await;
    // The metadata PUT of issue #10.
    let r = http()
        .put(format!(
            "{}apps/HOSTILE/hostile-1/metadata?a%20b=2&x%3E%3Cevil%2F=3&q%3Ab=4",
            server.url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A replicated registration (a Java peer's single call) and a replication batch.
    let mut peer_copy = registration("HOSTILE", "hostile-2", json!({"p q": "r", "<": ">"}));
    peer_copy["instance"]["hostName"] = json!("host\u{0}\u{1f}");
    let r = http()
        .post(format!("{}apps/HOSTILE", server.url()))
        .header("x-netflix-discovery-replication", "true")
        .json(&peer_copy)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let batch = json!({"replicationList": [{
        "appName": "HOSTILE", "id": "hostile-3", "lastDirtyTimestamp": 1, "status": "UP", "action": "Register",
        "instanceInfo": registration("HOSTILE", "hostile-3", json!({"b a t c h": "&", "/": "/"}))["instance"],
    }]});
    let r = http()
        .post(format!("{}peerreplication/batch", server.url()))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["responseList"][0]["statusCode"], 200);

    assert_every_xml_payload_is_well_formed(&server, "HOSTILE", "hostile-1").await;
    // The keys read back as they were sent, in JSON.
    let stored = instance_json(&server, "HOSTILE", "hostile-1").await;
    let m = &stored["instance"]["metadata"];
    assert_eq!((m["a b"].as_str(), m["x><evil/"].as_str()), (Some("2"), Some("3")));
    assert_eq!(m["ctl\u{1}"], "v\u{1}v", "JSON carries what XML cannot");

    // A real XML client: py-eureka-client parses every full fetch with ElementTree.
    if let Some(py) = ScriptPeer::python(&server.url(), "PY-HOSTILE", "py-1") {
        py.wait_tick(
            "py-eureka-client to see the hostile instances",
            Duration::from_secs(60),
            |t| t["seen"]["HOSTILE"].as_array().is_some_and(|a| a.len() == 3),
        )
        .await;
    }
    watch.finish("metadata keys that are not XML names").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_status_page_never_becomes_a_dashboard_link() {
    let server = Server::start(Ipv4Addr::new(127, 0, 0, 82), &[]).await;
    let watch = Watch::start(&server, Duration::from_secs(1)).await;
    let urls = [
        "javascript:alert(1)",
        " JaVaScRiPt:alert(document.domain)",
        "java\tscript:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "http://10.0.0.1:8080/info",
    ];
    for (n, url) in urls.iter().enumerate() {
        let mut body = registration("XSS", &format!("xss-{n}\"><script>alert(1)</script>"), json!({}));
        body["instance"]["statusPageUrl"] = json!(url);
        let r = http()
            .post(format!("{}apps/XSS", server.url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
    let r = http().get(format!("{}/", server.base())).send().await.unwrap();
    let csp = r
        .headers()
        .get("content-security-policy")
        .map(|v| v.to_str().unwrap().to_string())
        .expect("the dashboard sends a Content-Security-Policy");
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    let page = r.text().await.unwrap();
    let hrefs: Vec<&str> = page
        .split("href=\"")
        .skip(1)
        .filter_map(|h| h.split('"').next())
        .collect();
    assert_eq!(hrefs, ["lastn", "http://10.0.0.1:8080/info"], "only web URLs are links");
    assert!(!page.contains("<script>"), "values are escaped");

    // As a browser sees it: every link on the page is http(s), and no script ran.
    if let Some(browser) = Browser::start().await {
        browser.open(&format!("{}/", server.base())).await;
        let protocols = browser
            .eval("return Array.from(document.links).map(a => a.protocol).join(',')")
            .await;
        assert_eq!(protocols, json!("http:,http:"), "links as the browser parses them");
        let scripts = browser.eval("return document.scripts.length").await;
        assert_eq!(scripts, json!(0));
    }
    watch.finish("javascript: status pages").await;
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// The gzip bomb of issue #10 inflates to ~4 MB; decoding that many bytes takes seconds in an
/// unoptimised build, so CI sends 20 concurrent 512 KB bombs and `EO_HOSTILE_FULL=1` the real ones
/// (three rounds of 20).
fn bomb_size() -> (usize, usize) {
    if std::env::var("EO_HOSTILE_FULL").is_ok_and(|v| v == "1") {
        (2_000_000, 3)
    } else {
        (256_000, 1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_gzip_bombs_move_neither_memory_nor_heartbeats() {
    let server = Server::start(Ipv4Addr::new(127, 0, 0, 83), &[]).await;
    // `[0,0,...]` under an unknown key, under the 4 MiB body limit once inflated.
    let (zeros, rounds) = bomb_size();
    let mut json = br#"{"instance":{"hostName":"bomb","app":"BOMB","junk":["#.to_vec();
    json.extend(std::iter::repeat_n(b"0,".as_slice(), zeros).flatten());
    json.extend_from_slice(br#"0]}}"#);
    assert!(json.len() < 4 * 1024 * 1024);
    let bomb = bytes::Bytes::from(gzip(&json));
    let watch = Watch::start(&server, Duration::from_secs(2)).await;
    let started = Instant::now();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let (mut refused, mut timed_out) = (0, 0);
    for _round in 0..rounds {
        let requests: Vec<_> = (0..20)
            .map(|_| {
                let (client, body, url) = (client.clone(), bomb.clone(), format!("{}apps/BOMB", server.url()));
                tokio::spawn(async move {
                    client
                        .post(url)
                        .header("content-type", "application/json")
                        .header("content-encoding", "gzip")
                        .body(body)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                })
            })
            .collect();
        for r in requests {
            // Decoded, then refused for what it lacks (no ipAddr, no dataCenterInfo); or, when
            // it waited for a decoder longer than the request timeout, 408.
            match r.await.unwrap().unwrap() {
                400 => refused += 1,
                408 => timed_out += 1,
                other => panic!("a gzip bomb was answered {other}"),
            }
        }
    }
    let (before, peak) = watch
        .finish(&format!(
            "{} gzip bombs ({} KB inflating to {} KB), 20 at a time, in {} ms ({refused} decoded and refused, {timed_out} timed out waiting)",
            20 * rounds,
            bomb.len() / 1024,
            json.len() / 1024,
            started.elapsed().as_millis()
        ))
        .await;
    let grew_mib = peak.saturating_sub(before) / 1024;
    assert!(grew_mib < 40, "RSS grew by {grew_mib} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_query_key_takes_its_first_value_as_java_does() {
    let server = Server::start(Ipv4Addr::new(127, 0, 0, 84), &[]).await;
    let watch = Watch::start(&server, Duration::from_secs(1)).await;
    register(&server, "REPEAT", "repeat-1", json!({"a": "0"})).await;
    let r = http()
        .put(format!(
            "{}apps/REPEAT/repeat-1/metadata?a=1&a=2&b=x&b=y&=dropped",
            server.url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = instance_json(&server, "REPEAT", "repeat-1").await["instance"]["metadata"].clone();
    assert_eq!(m, json!({"a": "1", "b": "x"}));
    watch.finish("a repeated query key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_flood_stops_at_the_caps_with_a_clear_answer_and_a_metric() {
    // Caps through the environment, which older builds ignore.
    let server = Server::start_with_env(
        Ipv4Addr::new(127, 0, 0, 85),
        &[],
        &[
            ("EUREKA_MAX_INSTANCES", "100"),
            ("EUREKA_MAX_APPLICATIONS", "10"),
            ("EUREKA_MAX_INSTANCES_PER_APPLICATION", "20"),
        ],
    )
    .await;
    let watch = Watch::start(&server, Duration::from_secs(1)).await;
    let client = http();
    let mut refused = Vec::new();
    // 50 into one application (20 fit), then 500 over 25 applications: with the probe's, 10
    // applications fit, and 100 instances in all.
    let apps = (0..50)
        .map(|_| "FLOOD-A".to_string())
        .chain((0..500).map(|n| format!("FLOOD-{}", n % 25)));
    for (n, app) in apps.enumerate() {
        let r = client
            .post(format!("{}apps/{app}", server.url()))
            .json(&registration(&app, &format!("f-{n}"), json!({"n": n})))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            204 => {}
            403 => refused.push(r.text().await.unwrap()),
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(550 - refused.len(), 99, "the probe and 99 more");
    for flag in [
        "--max-instances)",
        "--max-applications)",
        "--max-instances-per-application)",
    ] {
        assert!(refused.iter().any(|m| m.contains(flag)), "no refusal names {flag}");
    }
    let apps: Value = client
        .get(format!("{}apps", server.url()))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let apps = apps["applications"]["application"].as_array().unwrap();
    assert_eq!(apps.len(), 10);
    let held: usize = apps.iter().map(|a| a["instance"].as_array().unwrap().len()).sum();
    assert_eq!(held, 100);

    // Instances over the default per-instance caps: 400, naming the flag that raises them.
    let many: serde_json::Map<String, Value> = (0..1_001).map(|i| (format!("k{i}"), json!("v"))).collect();
    let r = client
        .post(format!("{}apps/FLOOD-A", server.url()))
        .json(&registration("FLOOD-A", "f-0", Value::Object(many)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("--max-metadata-keys-per-instance"));
    let r = client
        .post(format!("{}apps/FLOOD-A", server.url()))
        .json(&registration("FLOOD-A", "f-0", json!({"big": "x".repeat(70_000)})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("--max-instance-bytes"));

    let mut counted = 0.0;
    for limit in ["instances", "applications", "instances_per_application"] {
        counted += server
            .metric(&format!("eureka_limit_refusals_total{{limit=\"{limit}\"}}"))
            .await
            .unwrap_or(0.0);
    }
    assert_eq!(counted as usize, refused.len(), "every refusal is counted");
    for limit in ["metadata_keys", "instance_bytes"] {
        let sample = format!("eureka_limit_refusals_total{{limit=\"{limit}\"}}");
        assert_eq!(server.metric(&sample).await, Some(1.0), "{sample}");
    }
    watch
        .finish(&format!("a flood of 550 registrations ({} refused)", refused.len()))
        .await;
}
