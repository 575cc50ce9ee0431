//! Hostile clients against the built server (issue #10): one test per attack on request content —
//! a metadata PUT of 5k keys on an instance holding 100k, metadata keys that are not XML names,
//! a `javascript:` status page on the dashboard, 20 concurrent gzip bombs, a repeated query key —
//! and a registration flood against the registry's caps. Each runs while a legitimate instance
//! heartbeats every 50 ms and reports the heartbeat latency during the attack against a baseline,
//! and the server's resident memory read from `/proc`. Each fails when a heartbeat fails or gets no
//! answer within 2 s, when one sent during the attack is slower than allowed (500 ms on a quiet
//! machine, see [`allowed`]), or when heartbeats stop being sent.

use std::{
    io::Write,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
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

/// One wake-up of the [`Sampler`]: it asked to sleep 5 ms at `from` and woke at `to`, `late`
/// after it asked to.
#[derive(Debug, Clone, Copy)]
struct Wake {
    from: Instant,
    to: Instant,
    late: Duration,
}

/// What the [`Sampler`] saw: the server's largest RSS, in KiB, and every wake-up.
struct Sampled {
    peak: u64,
    wakes: Vec<Wake>,
}

impl Sampled {
    /// The latest the sampler woke up during `[from, to]`: how long a thread of this test that
    /// was ready to run waited for a core then, whatever the server was doing.
    fn lateness(&self, from: Instant, to: Instant) -> Duration {
        self.wakes
            .iter()
            .filter(|w| w.to >= from && w.from <= to)
            .map(|w| w.late)
            .max()
            .unwrap_or_default()
    }
}

/// A thread that samples every 5 ms during an attack: the server's RSS (its peak is what the
/// attack cost in memory), and how late the thread itself wakes up (the load on the machine at
/// each moment, which the server's stalls do not move: a stall leaves the cores free).
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Sampled>,
}

impl Sampler {
    fn start(pid: i32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut sampled = Sampled {
                peak: rss(pid),
                wakes: Vec::new(),
            };
            while !s.load(Ordering::Relaxed) {
                sampled.peak = sampled.peak.max(rss(pid));
                let from = Instant::now();
                std::thread::sleep(SAMPLE_EVERY);
                let to = Instant::now();
                let late = (to - from).saturating_sub(SAMPLE_EVERY);
                sampled.wakes.push(Wake { from, to, late });
            }
            sampled
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Sampled {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler panicked")
    }
}

/// How often the [`Sampler`] samples.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// One heartbeat: when it was sent, how long its answer took, and the answer (a status, or why
/// there was none).
#[derive(Debug, Clone)]
struct Beat {
    at: Instant,
    took: Duration,
    answer: Result<u16, String>,
}

/// Heartbeat latencies in one window.
#[derive(Debug, Clone, Copy)]
struct Latency {
    count: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl Latency {
    fn of<'a>(beats: impl IntoIterator<Item = &'a Beat>) -> Latency {
        let mut v: Vec<Duration> = beats.into_iter().map(|b| b.took).collect();
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

/// A heartbeat's own client timeout: a renewal that a stalled server holds up is recorded as a
/// failure after this long, instead of waiting out the stall (with the Java client's 60 s, a
/// stall that long recorded nothing). Under the heaviest load seen, with the fix, the slowest
/// heartbeat took 0.9 s.
const BEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// A legitimate instance renewing its lease every 50 ms, each renewal timed and its answer kept.
/// The monitor itself never asserts: [`Heartbeats::stop`] returns every beat for the caller to
/// check, and a panic of the monitor's task (which would mean no beats) is raised there.
struct Heartbeats {
    beats: Arc<Mutex<Vec<Beat>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeats {
    async fn start(server: &Server) -> Heartbeats {
        register(server, "PROBE", "probe-1", json!({})).await;
        let url = format!("{}apps/PROBE/probe-1", server.url());
        let beats = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, st) = (beats.clone(), stop.clone());
        let client = reqwest::Client::builder()
            .timeout(BEAT_TIMEOUT)
            .build()
            .expect("the heartbeat client");
        let task = tokio::spawn(async move {
            while !st.load(Ordering::Relaxed) {
                let at = Instant::now();
                let answer = match client.put(&url).send().await {
                    Ok(r) => Ok(r.status().as_u16()),
                    Err(e) if e.is_timeout() => Err(format!("no answer within {BEAT_TIMEOUT:?}")),
                    Err(e) => Err(format!("{e:?}")),
                };
                let took = at.elapsed();
                b.lock().push(Beat { at, took, answer });
                tokio::time::sleep(HEARTBEAT_EVERY.saturating_sub(took)).await;
            }
        });
        Heartbeats { beats, stop, task }
    }

    /// A baseline window of `d`.
    async fn baseline(&self, d: Duration) -> Latency {
        let from = Instant::now();
        tokio::time::sleep(d).await;
        let to = Instant::now();
        Latency::of(self.beats.lock().iter().filter(|b| b.at >= from && b.at <= to))
    }

    /// Stops sending, waits for the beat in flight (its answer or its timeout), and returns every
    /// beat; a panic of the monitor is raised here.
    async fn stop(self) -> Vec<Beat> {
        self.stop.store(true, Ordering::Relaxed);
        match self.task.await {
            Ok(()) => {}
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("the heartbeat monitor did not finish: {e}"),
        }
        std::mem::take(&mut *self.beats.lock())
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

/// The slowest a heartbeat may be during an attack on a quiet machine. What this catches is a
/// stall behind the attack (a held registry lock, busy request workers), which cost 5 s (gzip
/// bombs) and over 60 s (metadata PUT) in this build before the fix, and 30 s with the
/// `stall-heartbeats` mutant. Issue #23 suggests 250 ms; with the fix, in this debug build, the
/// slowest heartbeat of an attack was 3-110 ms in most runs (two of these tests at a time, load
/// averages 2-13), but one sent during the metadata PUT waits behind the PUT's own work, which CPU
/// load stretches: 232 ms at a load average of 5 and 287 ms at 10, with the baseline's p99 at
/// 35 ms and the sampler on time (12 ms late), so that neither multiple below covers it. 250 ms
/// would fail the fix under ordinary load; 500 ms is still a tenth of the smallest stall above.
const SLOWEST_BEAT: Duration = Duration::from_millis(500);

/// How many times the baseline's p99 a heartbeat may take, when that is more than
/// [`SLOWEST_BEAT`]: a machine (or build) where heartbeats are slow without any attack.
const BASELINE_P99_TIMES: u32 = 4;

/// How many times the sampler's lateness at the same moment a heartbeat may take, when that is
/// more than the above. Tests run an unoptimised build on a shared 2-core machine where other
/// builds and tests come and go: at load averages of 15-19, with the fix, heartbeats took up to
/// 900 ms, and a thread of this test asking to sleep 5 ms woke up as late. A heartbeat passes
/// through a few such wake-ups (this test's threads and the server's). A stall of the server
/// leaves the cores free: the sampler is on time then, and the bound is 500 ms.
const LATENESS_TIMES: u32 = 4;

/// How slow a heartbeat in flight over `[from, to]` may be.
fn allowed(baseline: Latency, sampled: &Sampled, from: Instant, to: Instant) -> Duration {
    SLOWEST_BEAT
        .max(baseline.p99 * BASELINE_P99_TIMES)
        .max(sampled.lateness(from, to) * LATENESS_TIMES)
}

/// Where `at` is, from the start of the attack.
fn offset(at: Instant, from: Instant) -> String {
    match at.checked_duration_since(from) {
        Some(d) => format!("+{:.3} s", d.as_secs_f64()),
        None => format!("-{:.3} s", (from - at).as_secs_f64()),
    }
}

/// Up to five beats, each with where it was sent and what came of it.
fn listed(beats: &[&Beat], from: Instant) -> String {
    let mut s: Vec<String> = beats
        .iter()
        .take(5)
        .map(|b| {
            format!(
                "at {}: {:?} after {:.1} ms",
                offset(b.at, from),
                b.answer,
                b.took.as_secs_f64() * 1e3
            )
        })
        .collect();
    if beats.len() > 5 {
        s.push(format!("and {} more", beats.len() - 5));
    }
    s.join("; ")
}

/// Heartbeats held through an attack (`[from, to]`): every one answered 200 (none timed out,
/// baseline included), none sent during the attack slower than [`allowed`], and none missing: some
/// sent during the attack, and no silence between one heartbeat's answer and the next longer than
/// a heartbeat's timeout.
fn assert_heartbeats_held(
    attack: &str,
    baseline: Latency,
    all: &[Beat],
    sampled: &Sampled,
    from: Instant,
    to: Instant,
) {
    let during: Vec<&Beat> = all.iter().filter(|b| b.at >= from && b.at <= to).collect();
    let latency = Latency::of(during.iter().copied());
    let failed: Vec<&Beat> = all.iter().filter(|b| b.answer != Ok(200)).collect();
    assert!(
        failed.is_empty(),
        "{attack}: {} of {} heartbeats failed (no answer within {BEAT_TIMEOUT:?} is a stall): {}; during the attack \
         {latency} (baseline {baseline})",
        failed.len(),
        all.len(),
        listed(&failed, from)
    );
    let slow: Vec<&Beat> = during
        .iter()
        .copied()
        .filter(|b| b.took > allowed(baseline, sampled, b.at, b.at + b.took))
        .collect();
    assert!(
        slow.is_empty(),
        "{attack}: heartbeats stalled: {} slower than allowed (the largest of {SLOWEST_BEAT:?}, \
         {BASELINE_P99_TIMES} times the baseline's p99 and {LATENESS_TIMES} times the sampler's lateness \
         meanwhile, up to {:?}): {}; during the attack {latency} (baseline {baseline})",
        slow.len(),
        slow.iter()
            .map(|b| sampled.lateness(b.at, b.at + b.took))
            .max()
            .unwrap_or_default(),
        listed(&slow, from)
    );
    // Silences, from one answer to the next heartbeat (and from the last answer to the end): the
    // server plays no part in them (a beat it holds up is in flight, then slow or timed out), so
    // they measure how closely this monitor watched. With none longer than a heartbeat's
    // timeout, any stall of the server longer than that and [`allowed`] has a beat behind it.
    let ends = all.iter().map(|b| b.at + b.took);
    let starts = all.iter().skip(1).map(|b| b.at).chain([to]);
    let missing: Vec<(Instant, Duration)> = ends
        .zip(starts)
        .filter(|(quiet, next)| *quiet < to && *next > from && *next > *quiet + BEAT_TIMEOUT)
        .map(|(quiet, next)| (quiet, next - quiet))
        .collect();
    let expected = ((to - from).as_nanos() / HEARTBEAT_EVERY.as_nanos()) as usize;
    assert!(
        latency.count > 0 && missing.is_empty(),
        "{attack}: heartbeats missing: {} in {:?} where about {expected} were due; none sent for {}",
        latency.count,
        to - from,
        missing
            .iter()
            .map(|(at, gap)| format!("{gap:?} from {}", offset(*at, from)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(slowest) = during.iter().max_by_key(|b| b.took) {
        println!(
            "heartbeats during {attack}: {} sent where about {expected} were due; the slowest took {:.1} ms where \
             {:.1} ms was allowed; the sampler woke up to {:.1} ms late",
            latency.count,
            slowest.took.as_secs_f64() * 1e3,
            allowed(baseline, sampled, slowest.at, slowest.at + slowest.took).as_secs_f64() * 1e3,
            sampled.lateness(from, to).as_secs_f64() * 1e3
        );
    }
}

/// What is measured around one attack: heartbeats (after a baseline window), the server's RSS
/// and the load on the machine.
struct Watch {
    beats: Heartbeats,
    baseline: Latency,
    before: u64,
    sampler: Sampler,
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
            sampler: Sampler::start(pid),
            from: Instant::now(),
        }
    }

    /// Ends the attack (the heartbeat in flight is waited for, up to its timeout), reports, checks
    /// that heartbeats held, and returns the RSS before and at its peak, in KiB.
    async fn finish(self, attack: &str) -> (u64, u64) {
        tokio::time::sleep(HEARTBEAT_EVERY * 4).await;
        let to = Instant::now();
        let all = self.beats.stop().await;
        let sampled = self.sampler.finish();
        let during = Latency::of(all.iter().filter(|b| b.at >= self.from && b.at <= to));
        report(attack, self.baseline, during, (self.before, sampled.peak));
        assert_heartbeats_held(attack, self.baseline, &all, &sampled, self.from, to);
        (self.before, sampled.peak)
    }
}

/// How long the metadata PUT of 5k keys on 100k may take. The build before the fix took 92 s (a
/// merge under the registry lock, O(registry)). With the fix, in this debug build, it took
/// 0.1-0.3 s alone, 0.3-1.4 s with other tests at load averages up to 13, and 2.3 s at 16: 10 s
/// leaves room for load, and is far under the old behaviour (and the mutant's 30 s stall).
const PUT_WITHIN: Duration = Duration::from_secs(10);

/// A metadata PUT of 5k new keys on an instance holding 100k neither stalls heartbeats nor takes
/// long: the merge runs outside the registry lock (issue #10). Killed by the `stall-heartbeats`
/// mutant (tests/mutants): its PUT holds the lock for 30 s, and the heartbeats behind it time out.
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
    let put = http()
        .put(format!("{}apps/BIG/big-1/metadata?{}", server.url(), query.join("&")))
        .timeout(PUT_WITHIN)
        .send()
        .await;
    let took = started.elapsed();
    // Heartbeats first: a stall is what this test is for, and it shows there (each heartbeat times
    // out after 2 s) before the PUT's own timeout.
    let outcome = if put.is_ok() { "took" } else { "got no answer in" };
    watch
        .finish(&format!(
            "metadata PUT of 5k keys on 100k (the PUT {outcome} {} ms)",
            took.as_millis()
        ))
        .await;
    let r = put.unwrap_or_else(|e| panic!("the metadata PUT got no answer within {PUT_WITHIN:?}: {e:?}"));
    assert_eq!(r.status(), 200);
    // Read back after the heartbeats' window: the read is not the attack, and encoding 105k keys
    // (inline, on a server worker) and parsing them here take 0.4-2 s in this debug build, behind
    // which one heartbeat waited 75-110 ms with this test alone and up to 480 ms under load
    // (without the read, the slowest heartbeat of this test alone took 31 ms).
    let stored = instance_json(&server, "BIG", "big-1").await;
    let metadata = stored["instance"]["metadata"].as_object().unwrap();
    assert_eq!(metadata.len(), 105_000);
    assert_eq!(metadata["n4999"], "");
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

/// The server's default request body limit (`--max-request-body-bytes`), which applies to a
/// body once inflated.
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Zeros in one bomb, and rounds of 20. The gzip bomb of issue #10 inflates to ~4 MB, under the
/// body limit; `EO_HOSTILE_FULL=1` sends those (three rounds of 20). CI sends one round of bombs
/// that inflate to 32 MB, eight times the limit, so that the server must stop inflating at the
/// limit: a server that inflates a body whole before checking its size (the `decode-whole-body`
/// mutant) holds 32 MB per decoder. Either way each
/// bomb costs the server 4 MB of decoding, a few seconds of CPU in this unoptimised build.
fn bomb_size() -> (usize, usize) {
    if std::env::var("EO_HOSTILE_FULL").is_ok_and(|v| v == "1") {
        (2_000_000, 3)
    } else {
        (16_000_000, 1)
    }
}

/// How much the server's RSS may grow while it decodes the CI bombs. With the fix it streams each
/// body through the inflater and the decoder: +1 MiB in 4 runs alone, +1-2 MiB in 16 runs with
/// other tests (load averages up to 19). Inflating a bomb whole holds its 31 MiB: +33 MiB in each
/// of 4 runs with the `decode-whole-body` mutant.
const BOMBS_GROW_RSS_BY_LESS_THAN_MIB: u64 = 12;

/// Twenty concurrent gzip bombs (a small body that inflates to many MB of `[0,0,…]`) leave the
/// server's memory where it was, and heartbeats on time: bodies are inflated as they are decoded,
/// stopping at the body limit, on a bounded number of blocking threads. Killed by the
/// `decode-whole-body` mutant (tests/mutants), on memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_gzip_bombs_move_neither_memory_nor_heartbeats() {
    let server = Server::start(Ipv4Addr::new(127, 0, 0, 83), &[]).await;
    // `[0,0,...]` under an unknown key.
    let (zeros, rounds) = bomb_size();
    let mut json = br#"{"instance":{"hostName":"bomb","app":"BOMB","junk":["#.to_vec();
    json.extend(std::iter::repeat_n(b"0,".as_slice(), zeros).flatten());
    json.extend_from_slice(br#"0]}}"#);
    // Over the limit once inflated, a bomb is refused as too large (413); under it, decoded and
    // refused for what it lacks (400: no ipAddr, no dataCenterInfo).
    let refusal = if json.len() > BODY_LIMIT { 413 } else { 400 };
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
            // Refused; or, when it waited for a decoder longer than the request timeout, 408.
            match r.await.unwrap().unwrap() {
                s if s == refusal => refused += 1,
                408 => timed_out += 1,
                other => panic!("a gzip bomb was answered {other}, not {refusal}"),
            }
        }
    }
    let (before, peak) = watch
        .finish(&format!(
            "{} gzip bombs ({} KB inflating to {} KB), 20 at a time, in {} ms ({refused} refused {refusal}, {timed_out} timed out waiting)",
            20 * rounds,
            bomb.len() / 1024,
            json.len() / 1024,
            started.elapsed().as_millis()
        ))
        .await;
    let grew_mib = peak.saturating_sub(before) / 1024;
    assert!(
        grew_mib < BOMBS_GROW_RSS_BY_LESS_THAN_MIB,
        "RSS grew by {grew_mib} MiB (at most {BOMBS_GROW_RSS_BY_LESS_THAN_MIB} MiB): a bomb was inflated past the body limit"
    );
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
