//! Our Eureka server against the Spring Cloud Netflix Eureka server, measured in the same run with
//! the same workload, one server at a time: registration, heartbeats, full and delta fetches, a
//! mixed load where writes invalidate caches, memory (VmRSS) and CPU (utime + stime) per phase.
//!
//! `cargo bench --bench registry_vs_java` prints a markdown table; ratios are defined so that a
//! ratio above 1 means ours is better. Absolute figures on a small shared machine are noise; the ratios
//! against the peer measured minutes apart on the same machine are what to quote.
//!
//! Knobs (environment): `EO_BENCH_INSTANCES` (2000; a comma-separated list such as
//! `10000,50000` runs each size in turn, each with fresh servers), `EO_BENCH_WORKERS` (32),
//! `EO_BENCH_SECS` (10, per closed-loop phase), `EO_BENCH_WARMUP_SECS` (8), `EO_BENCH_MIXED_SECS`
//! (30: 300 writes and 600 full fetches at the default rates, so a p99 is not one request),
//! `EO_BENCH_JAVA_NOCACHE` (1: also run Java with `use-read-only-response-cache=false`),
//! `EO_BENCH_JVM_FLAGS` (`-Xmx2g`: the JVM's normal tiered JIT and a production-like heap;
//! `EO_BENCH_JVM=c1` takes the test harness's fast-start, C1-only flags instead),
//! `EO_BENCH_MIXED_RATES` (`heartbeats,registrations,status,full,delta` per second:
//! `1000,5,5,20,50`), and the deploy storm's `EO_BENCH_STORM_SECS` (60: 0 skips it),
//! `EO_BENCH_STORM_SHARE` (0.2 of the instances replaced) and `EO_BENCH_STORM_CLIENTS` (1000
//! clients fetching the delta every 30 s). `EO_BENCH_GENERATOR` (`raw`: the closed-loop heartbeat
//! phase uses the lean HTTP/1.1 client in [`raw`]; `reqwest` uses reqwest as every other phase)
//! `EO_BENCH_JAVA` (1; 0 measures ours alone, for profiling), `EO_BENCH_ROUNDS` (2: each size is
//! measured that many times, the servers' order reversed every other round, and each row quotes
//! the round least favourable to ours, so that one slow run of either server cannot make a row),
//! `EO_BENCH_BASELINE` (1: each round also drives [`baseline`], a bare hyper server that answers
//! every heartbeat with 200 and nothing else, and every fetch with as many bytes as our full
//! payload, with the same generators: the limit of a heartbeat and of a fetch on this machine)
//! and `EO_BENCH_PACED_RATE` (5000: heartbeats per second of the paced heartbeat phase, every
//! server and the baseline at the same fixed rate, open loop; 0 skips it) and `EO_BENCH_ARRIVALS`
//! (`poisson`: the mixed load's and the storm's requests arrive as from independent clients, each
//! stream's offered count at random instants from a fixed seed, the same for every server;
//! `uniform`: evenly spaced, every stream starting at once, as until 2026-12-05).
//!
//! During the mixed load and the deploy storm a [`MachineProbe`] records what the machine itself
//! did (the host's steal time and how late a sleeping thread wakes), printed per round beside
//! each server's heartbeat p99: on a shared virtual machine that is the floor under every tail.
//!
//! Ours runs with its default flags, except `--max-instances` from 100,000 instances up, where the
//! default cap is below what a run registers at once (the report says so); Java has no such cap.

#[path = "../tests/it/common"]
#[allow(dead_code)]
mod common {
    pub mod eureka;
    pub mod peers;
    pub mod process;
    pub mod rng;
}

use std::{
    collections::HashMap,
    io::Read,
    net::Ipv4Addr,
    process::Command,
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use common::{
    eureka::{Server, spring_instance},
    peers,
    process::{Proc, free_port, rss_kib, scratch_dir},
    rng::Rng,
};
use reqwest::header::{ACCEPT, ACCEPT_ENCODING, CONTENT_TYPE};
use serde_json::{Value, json};

/// The JVM flags `JavaServer::start` in tests/common/eureka.rs uses (fast start on 2 cores).
const HARNESS_JVM_FLAGS: &str = "-Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss512k";
/// What users run: the JVM's default (tiered, C2) JIT and garbage collector, a 2 GB heap.
const DEFAULT_JVM_FLAGS: &str = "-Xmx2g";
const IP: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Instances per application (the performance-anchors fixture: apps × 20).
const PER_APP: usize = 20;
const PROBE_APP: &str = "BENCH-PROBE";
const PROBE_ID: &str = "bench-probe.internal:bench-probe:8080";

// === settings ===

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

#[derive(Clone)]
struct Settings {
    /// The sizes to run, one after the other.
    sizes: Vec<usize>,
    instances: usize,
    workers: usize,
    phase: Duration,
    warmup: Duration,
    mixed: Duration,
    java_nocache: bool,
    jvm_flags: Vec<String>,
    /// Per second: heartbeats, registrations, status changes, full fetches, delta fetches.
    rates: [f64; 5],
    probe_timeout: Duration,
    storm: Duration,
    storm_share: f64,
    storm_clients: f64,
    generator: Generator,
    /// Whether to measure the Java server at all (`EO_BENCH_JAVA=0`: ours alone, for profiling).
    java: bool,
    /// Rounds per size, the servers' order alternating; each row quotes its least favourable.
    rounds: usize,
    /// Whether to measure the bare hyper baseline of a heartbeat each round.
    baseline: bool,
    /// Heartbeats per second of the paced heartbeat phase (0 skips it).
    paced: f64,
    /// When the open-loop phases' requests are due.
    arrivals: Arrivals,
}

impl Settings {
    fn from_env() -> Settings {
        let rates_text = std::env::var("EO_BENCH_MIXED_RATES").unwrap_or_else(|_| "1000,5,5,20,50".into());
        let parsed: Vec<f64> = rates_text.split(',').filter_map(|r| r.trim().parse().ok()).collect();
        let rates = <[f64; 5]>::try_from(parsed).unwrap_or([1000.0, 5.0, 5.0, 20.0, 50.0]);
        let sizes: Vec<usize> = std::env::var("EO_BENCH_INSTANCES")
            .unwrap_or_else(|_| "2000".into())
            .split(',')
            .filter_map(|n| n.trim().parse::<usize>().ok())
            .map(|n| n.max(1))
            .collect();
        let sizes = if sizes.is_empty() { vec![2000] } else { sizes };
        let default_flags = if std::env::var("EO_BENCH_JVM").is_ok_and(|v| v.trim().eq_ignore_ascii_case("c1")) {
            HARNESS_JVM_FLAGS
        } else {
            DEFAULT_JVM_FLAGS
        };
        Settings {
            instances: sizes[0],
            sizes,
            workers: env_or("EO_BENCH_WORKERS", 32usize).max(1),
            phase: Duration::from_secs_f64(env_or("EO_BENCH_SECS", 10.0)),
            warmup: Duration::from_secs_f64(env_or("EO_BENCH_WARMUP_SECS", 8.0)),
            mixed: Duration::from_secs_f64(env_or("EO_BENCH_MIXED_SECS", 30.0)),
            java_nocache: env_or("EO_BENCH_JAVA_NOCACHE", 1u8) != 0,
            jvm_flags: std::env::var("EO_BENCH_JVM_FLAGS")
                .unwrap_or_else(|_| default_flags.into())
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            rates: rates.map(|r| r.max(0.0)),
            probe_timeout: Duration::from_secs(35),
            storm: Duration::from_secs_f64(env_or("EO_BENCH_STORM_SECS", 60.0)),
            storm_share: env_or("EO_BENCH_STORM_SHARE", 0.2f64).clamp(0.0, 1.0),
            storm_clients: env_or("EO_BENCH_STORM_CLIENTS", 1000.0f64).max(0.0),
            generator: match std::env::var("EO_BENCH_GENERATOR") {
                Ok(g) if g.trim().eq_ignore_ascii_case("reqwest") => Generator::Reqwest,
                _ => Generator::Raw,
            },
            java: env_or("EO_BENCH_JAVA", 1u8) != 0,
            rounds: env_or("EO_BENCH_ROUNDS", 2usize).max(1),
            baseline: env_or("EO_BENCH_BASELINE", 1u8) != 0,
            paced: env_or("EO_BENCH_PACED_RATE", 5000.0f64).max(0.0),
            arrivals: match std::env::var("EO_BENCH_ARRIVALS") {
                Ok(a) if a.trim().eq_ignore_ascii_case("uniform") => Arrivals::Uniform,
                _ => Arrivals::Poisson,
            },
        }
    }
}

// === the fixture: N instances as a Spring client registers them ===

struct Instance {
    app: String,
    id: String,
    body: Bytes,
}

struct Fixture {
    instances: Vec<Instance>,
    /// The deploy storm's new instances: `(index of the instance replaced, its successor)`.
    successors: Vec<(usize, Instance)>,
    /// The `lastDirtyTimestamp` of every registration, sent back with each heartbeat.
    ldt: i64,
    probe_body: Bytes,
}

/// `{"instance": …}` as Spring's RestClient/RestTemplate transport sends it: numbers as numbers,
/// explicit nulls, three metadata keys, a 600 s lease so nothing expires during the run.
fn spring_body(app: &str, id: &str, host: &str, ip: &str, vip: &str, ldt: i64) -> Bytes {
    let mut v = spring_instance(app, id, host, ip, 8080, vip, ldt);
    v["leaseInfo"]["durationInSecs"] = json!(600);
    v["metadata"] = json!({"management.port": "8080", "zone": "zone-a", "version": "1.4.2"});
    Bytes::from(serde_json::to_vec(&json!({ "instance": v })).expect("json"))
}

impl Fixture {
    fn new(n: usize, storm_share: f64) -> Fixture {
        let ldt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(1_700_000_000_000);
        let instances = (0..n)
            .map(|i| {
                let (a, j) = (i / PER_APP, i % PER_APP);
                let vip = format!("bench-app-{a:04}");
                let app = vip.to_ascii_uppercase();
                let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
                let host = format!("bench-app-{a:04}-{j:02}.pods.internal");
                let id = format!("{host}:{vip}:8080");
                let body = spring_body(&app, &id, &host, &ip, &vip, ldt);
                Instance { app, id, body }
            })
            .collect();
        // Every instance whose index falls on the share's stride is replaced, so the storm touches
        // every application (the hardest case for per-application caches).
        let replaced = ((n as f64) * storm_share).round() as usize;
        let stride = n.checked_div(replaced).map_or(usize::MAX, |s| s.max(1));
        let successors = (0..n)
            .filter(|i| i % stride == 0)
            .take(replaced)
            .map(|i| {
                let (a, j) = (i / PER_APP, i % PER_APP);
                let vip = format!("bench-app-{a:04}");
                let app = vip.to_ascii_uppercase();
                let ip = format!("10.{}.{}.{}", 128 + ((i >> 16) & 127), (i >> 8) & 255, i & 255);
                let host = format!("bench-app-{a:04}-{j:02}-next.pods.internal");
                let id = format!("{host}:{vip}:8080");
                let body = spring_body(&app, &id, &host, &ip, &vip, ldt);
                (i, Instance { app, id, body })
            })
            .collect();
        let probe_body = spring_body(
            PROBE_APP,
            PROBE_ID,
            "bench-probe.internal",
            "10.255.255.254",
            "bench-probe",
            ldt,
        );
        Fixture {
            instances,
            successors,
            ldt,
            probe_body,
        }
    }
}

// === /proc ===

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// User + system CPU seconds of `pid` (all its threads).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The fields after the command name, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    (ticks(11) + ticks(12)) / clk_tck()
}

/// VmRSS of `pid` in MB.
fn rss_mb(pid: u32) -> f64 {
    rss_kib(pid).map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

// === the load generator ===

#[derive(Clone, Copy, Debug)]
enum Op {
    Register(usize),
    Heartbeat(usize),
    Full,
    Delta,
    /// `PUT …/status?value=OUT_OF_SERVICE`
    StatusOos(usize),
    /// `DELETE …/status?value=UP` (removes the override)
    StatusClear(usize),
    /// Registers the `k`th successor of the deploy storm.
    RegisterSuccessor(usize),
    /// `DELETE apps/{app}/{id}` of the instance the `k`th successor replaces.
    CancelReplaced(usize),
    /// `GET /metrics` (ours only: a Prometheus scrape).
    Scrape,
}

/// Everything a request needs, built before any measurement so the generator does the same work
/// per request for every server.
struct Load {
    client: reqwest::Client,
    fx: Arc<Fixture>,
    app_urls: Vec<String>,
    hb_urls: Vec<String>,
    oos_urls: Vec<String>,
    clear_urls: Vec<String>,
    successor_urls: Vec<String>,
    cancel_urls: Vec<String>,
    full_url: String,
    delta_url: String,
    /// The server's Eureka base URL (`http://host:port/eureka/`).
    base: String,
    /// Its Prometheus endpoint, where it has one.
    metrics_url: Option<String>,
}

fn client() -> reqwest::Client {
    // `no_gzip`: we ask for gzip ourselves and keep the compressed bytes (what goes over the wire);
    // decompressing every payload would only add generator CPU.
    eureka_operator::tls::install_default_provider();
    reqwest::Client::builder()
        .no_gzip()
        .pool_max_idle_per_host(512)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

impl Load {
    fn new(base: &str, fx: Arc<Fixture>) -> Load {
        let ldt = fx.ldt;
        let inst = |f: &dyn Fn(&Instance) -> String| fx.instances.iter().map(f).collect::<Vec<_>>();
        Load {
            client: client(),
            app_urls: inst(&|i| format!("{base}apps/{}", i.app)),
            hb_urls: inst(&|i| format!("{base}apps/{}/{}?status=UP&lastDirtyTimestamp={ldt}", i.app, i.id)),
            oos_urls: inst(&|i| {
                format!(
                    "{base}apps/{}/{}/status?value=OUT_OF_SERVICE&lastDirtyTimestamp={ldt}",
                    i.app, i.id
                )
            }),
            clear_urls: inst(&|i| format!("{base}apps/{}/{}/status?value=UP&lastDirtyTimestamp={ldt}", i.app, i.id)),
            successor_urls: fx
                .successors
                .iter()
                .map(|(_, s)| format!("{base}apps/{}", s.app))
                .collect(),
            cancel_urls: fx
                .successors
                .iter()
                .map(|(i, _)| format!("{base}apps/{}/{}", fx.instances[*i].app, fx.instances[*i].id))
                .collect(),
            full_url: format!("{base}apps/"),
            delta_url: format!("{base}apps/delta"),
            base: base.to_string(),
            metrics_url: None,
            fx,
        }
    }

    /// Sends one request; `Ok(body bytes)` on a 2xx.
    async fn exec(&self, op: Op) -> Result<u64, String> {
        let c = &self.client;
        let req = match op {
            Op::Register(i) => c
                .post(&self.app_urls[i])
                .header(CONTENT_TYPE, "application/json")
                .body(self.fx.instances[i].body.clone()),
            Op::Heartbeat(i) => c.put(&self.hb_urls[i]),
            Op::Full => c.get(&self.full_url),
            Op::Delta => c.get(&self.delta_url),
            Op::StatusOos(i) => c.put(&self.oos_urls[i]),
            Op::StatusClear(i) => c.delete(&self.clear_urls[i]),
            Op::RegisterSuccessor(k) => c
                .post(&self.successor_urls[k])
                .header(CONTENT_TYPE, "application/json")
                .body(self.fx.successors[k].1.body.clone()),
            Op::CancelReplaced(k) => c.delete(&self.cancel_urls[k]),
            Op::Scrape => c.get(self.metrics_url.as_deref().ok_or("no /metrics endpoint")?),
        }
        .header(ACCEPT, "application/json")
        .header(ACCEPT_ENCODING, "gzip");
        let resp = req.send().await.map_err(|e| format!("{op:?}: {e}"))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| format!("{op:?}: {e}"))?;
        if status.is_success() {
            Ok(body.len() as u64)
        } else {
            let text = String::from_utf8_lossy(&body[..body.len().min(160)]).into_owned();
            Err(format!("{op:?}: {status} {text}"))
        }
    }
}

/// What one phase (or one stream of a phase) measured.
#[derive(Default)]
struct Run {
    lat_us: Vec<u32>,
    /// Open loop only: how late each request was handed to the client after it was due (the
    /// generator's own timer and scheduling), and its latency counted from then instead.
    send_lag_us: Vec<u32>,
    from_send_us: Vec<u32>,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    bytes: u64,
    wall: Duration,
    server_cpu: f64,
    gen_cpu: f64,
}

impl Run {
    fn record(&mut self, took: Duration, r: Result<u64, String>) {
        self.lat_us.push(took.as_micros().min(u32::MAX as u128) as u32);
        match r {
            Ok(b) => {
                self.ok += 1;
                self.bytes += b;
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }

    /// An open-loop request: `took` counts from when it was due, `lag` of it before it was sent.
    fn record_sent(&mut self, lag: Duration, took: Duration, r: Result<u64, String>) {
        let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
        self.send_lag_us.push(us(lag));
        self.from_send_us.push(us(took.saturating_sub(lag)));
        self.record(took, r);
    }

    fn merge(&mut self, other: Run) {
        self.lat_us.extend(other.lat_us);
        self.send_lag_us.extend(other.send_lag_us);
        self.from_send_us.extend(other.from_send_us);
        self.ok += other.ok;
        self.errors += other.errors;
        self.bytes += other.bytes;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn finish(mut self, wall: Duration, server_cpu: f64, gen_cpu: f64) -> Run {
        self.lat_us.sort_unstable();
        self.send_lag_us.sort_unstable();
        self.from_send_us.sort_unstable();
        self.wall = wall;
        self.server_cpu = server_cpu;
        self.gen_cpu = gen_cpu;
        self
    }

    fn rate(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// The `p`th percentile latency in ms.
    fn pct(&self, p: f64) -> f64 {
        percentile_ms(&self.lat_us, p)
    }

    /// Server CPU milliseconds per 1000 successful requests.
    fn cpu_per_1k(&self) -> f64 {
        self.server_cpu * 1e6 / (self.ok.max(1) as f64)
    }

    fn gen_cpu_per_1k(&self) -> f64 {
        self.gen_cpu * 1e6 / (self.ok.max(1) as f64)
    }
}

/// The `p`th percentile of sorted microseconds, in ms.
fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_us.len() as f64 * p / 100.0) as usize).min(sorted_us.len() - 1);
    f64::from(sorted_us[i]) / 1000.0
}

/// CPU counters of the server and of this process, to diff around a phase.
struct CpuMark(f64, f64, Instant);

impl CpuMark {
    fn now(pid: u32) -> CpuMark {
        CpuMark(cpu_secs(pid), cpu_secs(std::process::id()), Instant::now())
    }

    fn finish(&self, pid: u32, run: Run) -> Run {
        let wall = self.2.elapsed();
        let server = cpu_secs(pid) - self.0;
        let generator = cpu_secs(std::process::id()) - self.1;
        run.finish(wall, server, generator)
    }
}

/// When an open-loop stream's requests are due (`EO_BENCH_ARRIVALS`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Arrivals {
    /// Independent clients: the stream's offered number of requests at instants drawn uniformly
    /// over the phase (a Poisson process given its count), from a fixed seed per stream, so every
    /// server and every round gets the same schedule. The default.
    Poisson,
    /// Evenly spaced, every stream starting at 0 (the bench until 2026-12-05): streams whose
    /// periods divide one another are due at the same instants, so at the mixed load's rates a
    /// quarter of the full fetches are due together with two writes.
    Uniform,
}

impl Arrivals {
    /// The due times (ns after the phase's start) of stream `stream` at `rate` per second.
    fn schedule(self, rate: f64, stream: usize, dur: Duration) -> Vec<u64> {
        let end = dur.as_nanos() as f64;
        if rate <= 0.0 {
            return Vec::new();
        }
        match self {
            // Rounded, so that a stream of n requests per phase sends n, not one more at the end.
            Arrivals::Uniform => (0u64..)
                .map(|k| (1e9 / rate * k as f64).round())
                .take_while(|at| *at < end)
                .map(|at| at as u64)
                .collect(),
            // A Poisson process given its count: rate × duration due times, each uniform over the
            // phase, sorted. Every stream sends exactly its offered number of requests (the storm
            // replaces each instance once), at independent, clustered instants. Seeded by the
            // stream's place: the same draws for every server.
            Arrivals::Poisson => {
                let mut rng = Rng::new(0x5EED_0000 + stream as u64);
                let n = (rate * dur.as_secs_f64()).round() as usize;
                let mut times: Vec<u64> = (0..n).map(|_| (rng.unit() * end) as u64).collect();
                times.sort_unstable();
                times
            }
        }
    }
}

type Pick = Arc<dyn Fn(usize, u64) -> Op + Send + Sync>;
/// An open-loop stream: requests per second, and the `k`th request.
type Stream = (f64, Arc<dyn Fn(u64) -> Op + Send + Sync>);

/// Runs `worker(w)` for each of `workers` workers on its own task and merges what they measured.
async fn join_workers<F, Fut>(workers: usize, worker: F) -> Run
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Run> + Send + 'static,
{
    let tasks: Vec<_> = (0..workers).map(|w| tokio::spawn(worker(w))).collect();
    let mut run = Run::default();
    for t in tasks {
        run.merge(t.await.expect("worker"));
    }
    run
}

/// `workers` workers, each sending its next request as soon as the previous one is answered,
/// for `dur`.
async fn closed_loop(load: &Arc<Load>, pid: u32, workers: usize, dur: Duration, pick: Pick) -> Run {
    let mark = CpuMark::now(pid);
    let deadline = Instant::now() + dur;
    let run = join_workers(workers, |w| {
        let (load, pick) = (load.clone(), pick.clone());
        async move {
            let mut part = Run::default();
            let mut k = 0u64;
            while Instant::now() < deadline {
                let op = pick(w, k);
                let t = Instant::now();
                let r = load.exec(op).await;
                part.record(t.elapsed(), r);
                k += 1;
            }
            part
        }
    })
    .await;
    mark.finish(pid, run)
}

/// Every index in `0..n` sent once, by `workers` workers.
async fn each_once(load: &Arc<Load>, pid: u32, workers: usize, n: usize, op: fn(usize) -> Op) -> Run {
    let mark = CpuMark::now(pid);
    let next = Arc::new(AtomicUsize::new(0));
    let run = join_workers(workers, |_| {
        let (load, next) = (load.clone(), next.clone());
        async move {
            let mut part = Run::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t = Instant::now();
                let r = load.exec(op(i)).await;
                part.record(t.elapsed(), r);
            }
            part
        }
    })
    .await;
    mark.finish(pid, run)
}

/// Open loop: each stream sends at its own fixed rate whatever the answers do, every request on
/// its own task; latency counts from the moment the request was due (no coordinated omission).
///
/// One pacer thread (outside the runtime) sleeps until the next request of any stream is due and
/// spawns it on the runtime. Tokio's timers round every deadline up to the next millisecond, so a
/// `tokio::time::interval` sent each request 0.8 ms late at the median and 1.4 ms at p99 on a
/// quiet host: more than our server's whole answer to a heartbeat, and in every latency row
/// counted from the due time. Paced by a sleeping thread they went 0.1 ms late at the median.
async fn open_loop(load: &Arc<Load>, pid: u32, dur: Duration, arrivals: Arrivals, streams: Vec<Stream>) -> Vec<Run> {
    type Sent = tokio::task::JoinHandle<(Duration, Duration, Result<u64, String>)>;
    let mark = CpuMark::now(pid);
    let runtime = tokio::runtime::Handle::current();
    let pacer_load = load.clone();
    let n_streams = streams.len();
    // Every request of the phase: (its due time as ns after start, stream, its number), in order.
    let mut due_all: Vec<(u64, usize, u64)> = Vec::new();
    for (i, (rate, _)) in streams.iter().enumerate() {
        let times = arrivals.schedule(*rate, i, dur);
        due_all.extend(times.into_iter().enumerate().map(|(k, at)| (at, i, k as u64)));
    }
    due_all.sort_unstable();
    let sent: Vec<Vec<Sent>> = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let mut sent: Vec<Vec<Sent>> = (0..n_streams).map(|_| Vec::new()).collect();
        for (at_ns, i, k) in due_all {
            let due = start + Duration::from_nanos(at_ns);
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            let (load, op) = (pacer_load.clone(), (streams[i].1)(k));
            sent[i].push(runtime.spawn(async move {
                let lag = due.elapsed();
                let r = load.exec(op).await;
                (lag, due.elapsed(), r)
            }));
        }
        sent
    })
    .await
    .expect("pacer");
    let mut runs = Vec::new();
    for stream in sent {
        let mut run = Run::default();
        for s in stream {
            let (lag, took, r) = s.await.expect("request task");
            run.record_sent(lag, took, r);
        }
        runs.push(run);
    }
    let wall = mark.2.elapsed();
    let (server, generator) = (cpu_secs(pid) - mark.0, cpu_secs(std::process::id()) - mark.1);
    runs.into_iter().map(|r| r.finish(wall, server, generator)).collect()
}

// === the machine under the latency phases ===

/// How much the machine itself delayed wake-ups during an open-loop phase, whichever server ran.
///
/// On a shared virtual machine the host may not run a vCPU the moment it has work: the kernel
/// counts that as steal time (`/proc/stat`), and every request that waits on such a wake-up, in
/// the server or in the generator, carries it into its latency. A thread of this process sleeping
/// 1 ms at a time measures the same delay directly: how late it wakes is the floor under any
/// p99 measured on this machine during the phase, for either server.
struct MachineProbe {
    stat: (u64, u64),
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u32>>,
}

/// What [`MachineProbe`] saw over one phase.
struct MachineNoise {
    /// The share of the machine's CPU time the host took away (steal), in %.
    steal_pct: f64,
    /// The 99th percentile of how late a 1 ms sleep woke up, in ms.
    overshoot_p99_ms: f64,
}

/// One open-loop phase of one server: what the machine did, and the heartbeat p99 measured there.
struct PhaseFloor {
    phase: &'static str,
    noise: MachineNoise,
    /// The heartbeat p99 from when each heartbeat was due, and from when it was sent.
    hb_p99: f64,
    hb_p99_from_send: f64,
    /// How late the generator sent the phase's requests (all streams), p50 and p99, in ms.
    send_lag: (f64, f64),
}

impl PhaseFloor {
    fn new(phase: &'static str, noise: MachineNoise, hb: &Run, runs: &[&Run]) -> PhaseFloor {
        let mut lag: Vec<u32> = runs.iter().flat_map(|r| r.send_lag_us.iter().copied()).collect();
        lag.sort_unstable();
        PhaseFloor {
            phase,
            noise,
            hb_p99: hb.pct(99.0),
            hb_p99_from_send: percentile_ms(&hb.from_send_us, 99.0),
            send_lag: (percentile_ms(&lag, 50.0), percentile_ms(&lag, 99.0)),
        }
    }
}

/// `(steal, total)` jiffies of all CPUs, from the first line of `/proc/stat`.
fn cpu_stat() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|f| f.parse().ok())
        .collect();
    (fields.get(7).copied().unwrap_or(0), fields.iter().sum())
}

impl MachineProbe {
    fn start() -> MachineProbe {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut late_us = Vec::new();
            let tick = Duration::from_millis(1);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(tick);
                late_us.push(t.elapsed().saturating_sub(tick).as_micros().min(u32::MAX as u128) as u32);
            }
            late_us
        });
        MachineProbe {
            stat: cpu_stat(),
            stop,
            thread,
        }
    }

    fn finish(self) -> MachineNoise {
        let (steal, total) = cpu_stat();
        self.stop.store(true, Ordering::Relaxed);
        let mut late_us = self.thread.join().unwrap_or_default();
        late_us.sort_unstable();
        let p99 = late_us
            .get((late_us.len() as f64 * 0.99) as usize)
            .map_or(f64::NAN, |&us| f64::from(us) / 1000.0);
        let spent = total.saturating_sub(self.stat.1).max(1) as f64;
        MachineNoise {
            steal_pct: steal.saturating_sub(self.stat.0) as f64 * 100.0 / spent,
            overshoot_p99_ms: p99,
        }
    }
}

/// `rounds` times: a status change, then one full and one delta fetch, one request at a time.
/// A server that encodes per registry version pays the encoding here; a stale cache does not.
async fn fetch_after_write(load: &Arc<Load>, rounds: u64) -> (Run, Run) {
    let (mut full, mut delta) = (Run::default(), Run::default());
    let span = load.fx.instances.len().min(100) as u64;
    for k in 0..rounds {
        let i = ((k / 2) % span) as usize;
        let write = if k % 2 == 0 {
            Op::StatusOos(i)
        } else {
            Op::StatusClear(i)
        };
        if let Err(e) = load.exec(write).await {
            full.errors += 1;
            full.first_error.get_or_insert(e);
            continue;
        }
        for (op, run) in [(Op::Full, &mut full), (Op::Delta, &mut delta)] {
            let t = Instant::now();
            let r = load.exec(op).await;
            run.record(t.elapsed(), r);
        }
    }
    (
        full.finish(Duration::ZERO, 0.0, 0.0),
        delta.finish(Duration::ZERO, 0.0, 0.0),
    )
}

// === a lean HTTP/1.1 client for the closed-loop heartbeat phase ===

/// Which client sends the closed-loop heartbeats (`EO_BENCH_GENERATOR`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Generator {
    /// [`raw::Conn`]: one keep-alive connection per worker, pre-formatted requests.
    Raw,
    /// reqwest, as every other phase.
    Reqwest,
}

/// A minimal HTTP/1.1 keep-alive client: the request bytes are formatted before the phase, the
/// response head is parsed with `httparse` and the body skipped by `Content-Length` or chunks.
/// The load generator shares the machine's 2 cores with the server under test; reqwest spends
/// about as much CPU per heartbeat as our server does, so the closed-loop heartbeat rate would
/// measure the generator as much as the server. Both servers get the same client.
mod raw {
    use std::net::SocketAddr;

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    pub struct Conn {
        addr: SocketAddr,
        stream: Option<TcpStream>,
        buf: Vec<u8>,
        /// Connections opened, the first included (Tomcat closes one after 100 requests).
        pub connects: u64,
    }

    /// What a response's head says about the body and the connection.
    struct Head {
        status: u16,
        len: usize,
        body: Body,
        close: bool,
    }

    enum Body {
        Length(usize),
        Chunked,
    }

    /// `PUT {path}` with the Spring client's `Accept` headers and an empty body.
    pub fn put(host: &str, path: &str) -> Vec<u8> {
        format!(
            "PUT {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: 0\r\n\r\n"
        )
        .into_bytes()
    }

    impl Conn {
        pub fn new(addr: SocketAddr) -> Conn {
            Conn {
                addr,
                stream: None,
                buf: Vec::with_capacity(4096),
                connects: 0,
            }
        }

        /// Sends `request` and reads the whole response: `Ok((status, body bytes))`. A reused
        /// connection the server closed in between is reopened and the request sent again once
        /// (what any keep-alive client does).
        pub async fn send(&mut self, request: &[u8]) -> Result<(u16, u64), String> {
            let reused = self.stream.is_some();
            match self.exchange(request).await {
                Err(_) if reused => {
                    self.stream = None;
                    self.exchange(request).await
                }
                r => r,
            }
            .inspect_err(|_| self.stream = None)
        }

        async fn exchange(&mut self, request: &[u8]) -> Result<(u16, u64), String> {
            if self.stream.is_none() {
                let s = TcpStream::connect(self.addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                self.stream = Some(s);
                self.connects += 1;
            }
            let stream = self.stream.as_mut().expect("connected");
            stream.write_all(request).await.map_err(|e| format!("write: {e}"))?;
            self.buf.clear();
            let head = loop {
                if let Some(h) = parse_head(&self.buf)? {
                    break h;
                }
                read_more(stream, &mut self.buf).await?;
            };
            let body = match head.body {
                Body::Length(n) => {
                    while self.buf.len() < head.len + n {
                        read_more(stream, &mut self.buf).await?;
                    }
                    n
                }
                Body::Chunked => loop {
                    if let Some(n) = chunked_len(&self.buf[head.len..])? {
                        break n;
                    }
                    read_more(stream, &mut self.buf).await?;
                },
            };
            if head.close {
                self.stream = None;
            }
            Ok((head.status, body as u64))
        }
    }

    async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        match stream.read_buf(buf).await {
            Ok(0) => Err("connection closed by the server".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("read: {e}")),
        }
    }

    fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(buf).map_err(|e| format!("bad response: {e}"))? {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => return Ok(None),
        };
        let status = resp.code.unwrap_or(0);
        let mut body = Body::Length(0);
        let mut close = resp.version == Some(0);
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or("bad content-length")?;
                body = Body::Length(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                if h.value.eq_ignore_ascii_case(b"chunked") {
                    body = Body::Chunked;
                }
            } else if h.name.eq_ignore_ascii_case("connection") {
                close = h.value.eq_ignore_ascii_case(b"close");
            }
        }
        Ok(Some(Head {
            status,
            len,
            body,
            close,
        }))
    }

    /// The decoded length of a complete chunked body at the start of `buf`, `None` while it is
    /// incomplete. (Chunk extensions and trailers are not expected from either server.)
    pub fn chunked_len(mut buf: &[u8]) -> Result<Option<usize>, String> {
        let mut total = 0;
        loop {
            let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            let size = std::str::from_utf8(&buf[..eol])
                .ok()
                .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
                .ok_or("bad chunk size")?;
            let end = eol + 2 + size + 2;
            if buf.len() < end {
                return Ok(None);
            }
            if size == 0 {
                return Ok(Some(total));
            }
            total += size;
            buf = &buf[end..];
        }
    }
}

/// `workers` workers, each with its own [`raw::Conn`], sending heartbeats for `dur`: as fast as
/// the answers come (closed loop), or `pace` per second in all (open loop).
async fn raw_heartbeats(load: &Arc<Load>, pid: u32, workers: usize, dur: Duration, pace: Option<f64>) -> Run {
    let base = reqwest::Url::parse(&load.base).expect("base url");
    let host = format!(
        "{}:{}",
        base.host_str().unwrap_or("127.0.0.1"),
        base.port().unwrap_or(80)
    );
    let addr: std::net::SocketAddr = host.parse().expect("a numeric address");
    let ldt = load.fx.ldt;
    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        load.fx
            .instances
            .iter()
            .map(|i| {
                let path = format!(
                    "{}apps/{}/{}?status=UP&lastDirtyTimestamp={ldt}",
                    base.path(),
                    i.app,
                    i.id
                );
                raw::put(&host, &path)
            })
            .collect(),
    );
    let n = requests.len();
    let mark = CpuMark::now(pid);
    let start = tokio::time::Instant::now();
    let deadline = Instant::now() + dur;
    let run = join_workers(workers, |w| {
        let requests = requests.clone();
        async move {
            let mut conn = raw::Conn::new(addr);
            let mut part = Run::default();
            let mut k = 0usize;
            while Instant::now() < deadline {
                // Paced: the `k`th request of worker `w` is due at `(k × workers + w) / rate`,
                // and its latency counts from then (open loop: a slow answer delays no one's
                // schedule but its own connection's).
                let t = match pace {
                    Some(rate) => {
                        let due = start + Duration::from_secs_f64((k * workers + w) as f64 / rate);
                        tokio::time::sleep_until(due).await;
                        due.into_std()
                    }
                    None => Instant::now(),
                };
                let r = match conn.send(&requests[(w + k * workers) % n]).await {
                    Ok((status, bytes)) if (200..300).contains(&status) => Ok(bytes),
                    Ok((status, _)) => Err(format!("Heartbeat: {status}")),
                    Err(e) => Err(format!("Heartbeat: {e}")),
                };
                part.record(t.elapsed(), r);
                k += 1;
            }
            part
        }
    })
    .await;
    mark.finish(pid, run)
}

/// The paced heartbeat phase's name, with its rate.
fn paced_phase(rate: f64) -> String {
    format!("heartbeat at {}/s (paced)", fmt_value(rate, 0))
}

/// The limit of a heartbeat on this machine: a bare hyper HTTP/1.1 server (keep-alive, the
/// runtime's default worker threads, as ours) that answers every request with 200 and an empty
/// body, nothing else: no routing, no parsing, no registry. A `GET` is answered with a fixed body
/// as large as our full payload, so the mixed load run against it shows the limit of a fetch.
/// It is this bench's own binary run with [`baseline::ADDR_VAR`] set, so that its CPU is counted
/// apart from the generator's.
mod baseline {
    use std::{convert::Infallible, net::SocketAddr};

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::{Method, Request, Response, body::Incoming, server::conn::http1, service::service_fn};
    use hyper_util::rt::TokioIo;

    /// The variable that makes the bench binary serve the baseline on the address it holds.
    pub const ADDR_VAR: &str = "EO_BENCH_BASELINE_ADDR";
    /// How many bytes it answers a `GET` with (0 unless set): the size of our full payload, so
    /// that a fetch's floor (the bytes crossing the loopback into the generator) is measured too.
    pub const BODY_VAR: &str = "EO_BENCH_BASELINE_BODY";

    pub fn serve(addr: SocketAddr) {
        let size: usize = std::env::var(BODY_VAR).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        // Bytes that do not compress, as a gzip payload does not; sent as they are.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let body: Bytes = (0..size)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect::<Vec<u8>>()
            .into();
        let ok = move |request: Request<Incoming>| {
            let body = if request.method() == Method::GET {
                body.clone()
            } else {
                Bytes::new()
            };
            async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.expect("the baseline's port");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let ok = ok.clone();
                tokio::spawn(async move {
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service_fn(ok))
                        .await;
                });
            }
        });
    }
}

/// The baseline's closed-loop heartbeats: the same generator, workers and length as ours'; then
/// the mixed load with every `GET` answered by `body` bytes (our full payload's size).
async fn measure_baseline(fx: &Arc<Fixture>, s: &Settings, body: usize) -> Results {
    let target = Target::baseline(body).await;
    let load = Arc::new(Load::new(&target.base, fx.clone()));
    eprintln!("[    baseline] heartbeats for {:?}", s.phase);
    // A short warm-up, so that both sides' first connections are not in the figures.
    let _ = raw_heartbeats(&load, target.pid, s.workers, Duration::from_secs(2), None).await;
    let run = raw_heartbeats(&load, target.pid, s.workers, s.phase, None).await;
    let mut out = Results::default();
    out.closed("heartbeat", "heartbeats", &run);
    if s.paced > 0.0 {
        let run = raw_heartbeats(&load, target.pid, s.workers, s.phase, Some(s.paced)).await;
        out.closed(&paced_phase(s.paced), "heartbeats", &run);
    }
    if !s.mixed.is_zero() && body > 0 {
        eprintln!("[    baseline] mixed load for {:?} ({body} bytes a fetch)", s.mixed);
        let runs = open_loop(
            &load,
            target.pid,
            s.mixed,
            s.arrivals,
            mixed_streams(fx.instances.len(), s.rates),
        )
        .await;
        let [hb, _, _, full, delta] = <[Run; 5]>::try_from(runs).ok().expect("five streams");
        out.mixed_latencies(&hb, &full, &delta);
    }
    target.stop();
    out
}

// === payload inspection ===

struct PayloadInfo {
    wire: usize,
    raw: usize,
    instances: usize,
    gzip: bool,
}

fn decompress(body: &[u8], gzip: bool) -> Vec<u8> {
    if !gzip {
        return body.to_vec();
    }
    let mut out = Vec::new();
    let _ = flate2::read::GzDecoder::new(body).read_to_end(&mut out);
    out
}

/// One `GET` with the Spring client's headers: whether it came gzipped, and the body as sent.
async fn fetch_wire(client: &reqwest::Client, url: &str) -> Result<(bool, Bytes), String> {
    let resp = client
        .get(url)
        .header(ACCEPT, "application/json")
        .header(ACCEPT_ENCODING, "gzip")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let gzip = resp
        .headers()
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{url}: {status}"));
    }
    Ok((gzip, body))
}

/// One `GET` with the Spring client's headers: the wire size, whether it came gzipped, and the
/// decompressed body.
async fn fetch_raw(client: &reqwest::Client, url: &str) -> Result<(usize, bool, Vec<u8>), String> {
    let (gzip, body) = fetch_wire(client, url).await?;
    Ok((body.len(), gzip, decompress(&body, gzip)))
}

/// One `GET` with the Spring client's headers: wire and raw size, and how many instances it holds.
async fn inspect(client: &reqwest::Client, url: &str) -> Result<(PayloadInfo, Vec<u8>), String> {
    let (wire, gzip, raw) = fetch_raw(client, url).await?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|e| format!("{url}: not JSON: {e}"))?;
    let apps = &doc["applications"]["application"];
    let count = |app: &Value| match &app["instance"] {
        Value::Array(a) => a.len(),
        Value::Object(_) => 1,
        _ => 0,
    };
    let instances = match apps {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(_) => count(apps),
        _ => 0,
    };
    Ok((
        PayloadInfo {
            wire,
            raw: raw.len(),
            instances,
            gzip,
        },
        raw,
    ))
}

/// Registers the probe instance and polls the full registry (as a client would) until it shows;
/// the time from the registration's answer to the first fetch that holds it.
///
/// It runs alone, after the mixed load: each poll inflates the whole registry (51 MB of JSON at
/// 50k instances, about 0.2 s of a core), and Java, whose cache shows a write after up to 30 s,
/// was polled for most of its mixed phase while ours was polled once, so the generator's CPU
/// went to the probe in one server's phase and not in the other's. The inflating and the search
/// run on a blocking thread, never on a worker that drives requests.
async fn visibility_probe(load: Arc<Load>, timeout: Duration) -> Option<Duration> {
    let register = load
        .client
        .post(format!("{}{PROBE_APP}", load.full_url))
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json")
        .body(load.fx.probe_body.clone())
        .send()
        .await
        .ok()
        .filter(|r| r.status().is_success());
    register?;
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok((gzip, body)) = fetch_wire(&load.client, &load.full_url).await {
            // Searched as bytes: parsing 51 MB here would time the probe, not the server.
            let holds = tokio::task::spawn_blocking(move || {
                let (raw, id) = (decompress(&body, gzip), PROBE_ID.as_bytes());
                raw.windows(id.len()).any(|w| w == id)
            });
            if holds.await.unwrap_or(false) {
                return Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

// === servers ===

enum Handle {
    Ours(Box<Server>),
    Java(Proc, tempfile::TempDir),
    Baseline(Proc, tempfile::TempDir),
}

struct Target {
    label: &'static str,
    base: String,
    /// Its Prometheus endpoint (ours only).
    metrics: Option<String>,
    pid: u32,
    startup: Duration,
    handle: Handle,
}

/// The `--max-instances` ours needs for `fx` when the default cap is below what the run registers
/// at once (the instances, the storm's successors before their predecessors go, the probe): from
/// 100,000 instances up. Java has no such cap.
fn ours_max_instances(fx: &Fixture) -> Option<usize> {
    let needed = fx.instances.len() + fx.successors.len() + 1;
    (needed > eureka_operator::registry::limits::Limits::DEFAULT_MAX_INSTANCES).then_some(needed * 2)
}

impl Target {
    async fn ours(max_instances: Option<usize>) -> Target {
        let started = Instant::now();
        // Default flags (EUREKA_LOG=info is the default; the harness would turn on debug), but
        // for the cap on instances where the run needs more.
        let cap = max_instances.map(|m| m.to_string());
        let args: Vec<&str> = cap.iter().flat_map(|m| ["--max-instances", m.as_str()]).collect();
        let server = Server::start_with_env(IP, &args, &[("EUREKA_LOG", "info")]).await;
        Target {
            label: "ours",
            base: server.url(),
            metrics: Some(format!("{}/metrics", server.admin())),
            pid: server.proc.pid() as u32,
            startup: started.elapsed(),
            handle: Handle::Ours(Box::new(server)),
        }
    }

    async fn java(ro_cache: bool, flags: &[String]) -> Option<Target> {
        let jar = peers::require("EUREKA_PEER_JAVA_SERVER_JAR", "registry_vs_java")?;
        let port = free_port(IP);
        let dir = scratch_dir("bench-java");
        let mut cmd = Command::new("java");
        cmd.args(flags)
            .arg("-jar")
            .arg(&jar)
            .arg(format!("--server.address={IP}"))
            .arg(format!("--server.port={port}"))
            .arg("--spring.main.banner-mode=off")
            .arg(format!("--eureka.instance.hostname={IP}"))
            .arg(format!("--eureka.instance.ip-address={IP}"))
            .arg("--eureka.client.register-with-eureka=false")
            .arg("--eureka.client.fetch-registry=false")
            .arg("--eureka.server.enable-self-preservation=false");
        if !ro_cache {
            cmd.arg("--eureka.server.use-read-only-response-cache=false");
        }
        let started = Instant::now();
        let mut proc = Proc::spawn("java-eureka-server", cmd, &dir.path().join("java-server.log"));
        let base = format!("http://{IP}:{port}/eureka/");
        let http = client();
        // Ready when `GET apps` answers 200. Asked in XML: a JSON read here would put the empty
        // registry into the read-only cache's JSON entry, which then stays for up to 30 s.
        loop {
            if let Ok(r) = http
                .get(format!("{base}apps"))
                .header(ACCEPT, "application/xml")
                .send()
                .await
                && r.status().is_success()
            {
                break;
            }
            if proc.try_exit().is_some() || started.elapsed() > Duration::from_secs(180) {
                panic!("the Java Eureka server did not start:\n{}", proc.log_tail(40));
            }
            // The same polling period as the harness's readiness wait for ours.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(Target {
            label: if ro_cache { "java" } else { "java-nocache" },
            base,
            metrics: None,
            pid: proc.pid() as u32,
            startup: started.elapsed(),
            handle: Handle::Java(proc, dir),
        })
    }

    /// The bare hyper baseline ([`baseline`]) on a free port.
    async fn baseline(body: usize) -> Target {
        let port = free_port(IP);
        let dir = scratch_dir("bench-baseline");
        let mut cmd = Command::new(std::env::current_exe().expect("the bench binary"));
        cmd.env(baseline::ADDR_VAR, format!("{IP}:{port}"));
        cmd.env(baseline::BODY_VAR, body.to_string());
        let started = Instant::now();
        let mut proc = Proc::spawn("bench-baseline", cmd, &dir.path().join("baseline.log"));
        while tokio::net::TcpStream::connect((IP, port)).await.is_err() {
            if proc.try_exit().is_some() || started.elapsed() > Duration::from_secs(30) {
                panic!("the baseline server did not start:\n{}", proc.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Target {
            label: "baseline",
            base: format!("http://{IP}:{port}/eureka/"),
            metrics: None,
            pid: proc.pid() as u32,
            startup: started.elapsed(),
            handle: Handle::Baseline(proc, dir),
        }
    }

    fn stop(self) {
        match self.handle {
            Handle::Baseline(mut p, _dir) => {
                p.terminate(Duration::from_secs(5));
            }
            Handle::Ours(mut s) => {
                s.proc.terminate(Duration::from_secs(5));
            }
            Handle::Java(mut p, _dir) => {
                p.terminate(Duration::from_secs(10));
            }
        }
    }

    fn log_tail(&self) -> String {
        match &self.handle {
            Handle::Ours(s) => s.proc.log_tail(10),
            Handle::Java(p, _) | Handle::Baseline(p, _) => p.log_tail(10),
        }
    }
}

// === results ===

#[derive(Clone, Copy, PartialEq)]
enum Better {
    Higher,
    Lower,
    /// Informational: the ratio is ours/Java and neither direction is "better".
    Info,
    /// No ratio (counts that should be zero, booleans).
    None,
}

struct Metric {
    name: String,
    value: f64,
    decimals: usize,
    better: Better,
}

#[derive(Default)]
struct Results {
    metrics: Vec<Metric>,
    notes: Vec<String>,
    /// Per open-loop phase: what the machine did meanwhile, and that phase's heartbeat p99.
    machine: Vec<PhaseFloor>,
}

impl Results {
    fn add(&mut self, name: impl Into<String>, value: f64, decimals: usize, better: Better) {
        self.metrics.push(Metric {
            name: name.into(),
            value,
            decimals,
            better,
        });
    }

    /// The value of the row called `name`, if this server has it.
    fn value(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|m| m.name == name).map(|m| m.value)
    }

    /// The mixed load's latency rows: fetches' p50 and p99, heartbeats' p99.
    fn mixed_latencies(&mut self, hb: &Run, full: &Run, delta: &Run) {
        for (name, run) in [("full fetch", full), ("delta fetch", delta)] {
            self.add(format!("mixed: {name} p50 (ms)"), run.pct(50.0), 2, Better::Lower);
            self.add(format!("mixed: {name} p99 (ms)"), run.pct(99.0), 2, Better::Lower);
        }
        self.add("mixed: heartbeat p99 (ms)", hb.pct(99.0), 2, Better::Lower);
    }

    fn errors(&mut self, phase: &str, run: &Run) {
        self.add(
            format!("{phase}: errors (non-2xx or transport)"),
            run.errors as f64,
            0,
            Better::None,
        );
        if let Some(e) = &run.first_error {
            self.notes.push(format!("{phase}: {} errors, first: {e}", run.errors));
        }
    }

    /// Rate, p50, p99, server CPU per 1k, errors.
    fn closed(&mut self, phase: &str, unit: &str, run: &Run) {
        self.add(format!("{phase}: {unit}/s"), run.rate(), 0, Better::Higher);
        self.add(format!("{phase}: p50 latency (ms)"), run.pct(50.0), 2, Better::Lower);
        self.add(format!("{phase}: p99 latency (ms)"), run.pct(99.0), 2, Better::Lower);
        self.add(
            format!("{phase}: server CPU ms per 1k requests"),
            run.cpu_per_1k(),
            1,
            Better::Lower,
        );
        self.errors(phase, run);
    }
}

/// The whole benchmark against one server.
async fn measure(target: &Target, fx: &Arc<Fixture>, s: &Settings) -> Results {
    let mut out = Results::default();
    let pid = target.pid;
    let n = fx.instances.len();
    let load = Arc::new(Load {
        metrics_url: target.metrics.clone(),
        ..Load::new(&target.base, fx.clone())
    });
    let log = |what: &str| eprintln!("[{:>12}] {what}", target.label);
    out.add(
        "start-up until the server answers (ms; polled every 50 ms)",
        target.startup.as_secs_f64() * 1000.0,
        0,
        Better::Lower,
    );
    let rss_idle = rss_mb(pid);
    out.add("RSS idle after start (MB)", rss_idle, 1, Better::Lower);

    log(&format!("registering {n} instances (cold server)"));
    let reg = each_once(&load, pid, s.workers, n, Op::Register).await;
    out.closed("register N, cold server", "registrations", &reg);
    let rss_reg = rss_mb(pid);
    out.add("RSS after registering N (MB)", rss_reg, 1, Better::Lower);
    out.add(
        "RSS growth per instance registered (KB)",
        (rss_reg - rss_idle) * 1024.0 / n as f64,
        2,
        Better::Lower,
    );

    log(&format!("warming up for {:?}", s.warmup));
    let w = s.workers;
    let warm = closed_loop(
        &load,
        pid,
        w,
        s.warmup,
        Arc::new(move |wk, k| match k % 10 {
            0 => Op::Full,
            1 => Op::Delta,
            _ => Op::Heartbeat((wk + k as usize * w) % n),
        }),
    )
    .await;
    if warm.errors > 0 {
        out.notes.push(format!(
            "warm-up: {} errors, first: {}",
            warm.errors,
            warm.first_error.clone().unwrap_or_default()
        ));
    }

    log("re-registering N (warm)");
    let rereg = each_once(&load, pid, s.workers, n, Op::Register).await;
    out.closed("re-register N, warm server", "registrations", &rereg);

    log(&format!("heartbeats for {:?}", s.phase));
    let hb = match s.generator {
        Generator::Raw => raw_heartbeats(&load, pid, w, s.phase, None).await,
        Generator::Reqwest => {
            closed_loop(
                &load,
                pid,
                w,
                s.phase,
                Arc::new(move |wk, k| Op::Heartbeat((wk + k as usize * w) % n)),
            )
            .await
        }
    };
    out.closed("heartbeat", "heartbeats", &hb);
    out.add(
        "heartbeat: load-generator CPU ms per 1k (same code for both)",
        hb.gen_cpu_per_1k(),
        1,
        Better::Info,
    );
    if s.paced > 0.0 {
        log(&format!("heartbeats at {}/s for {:?}", s.paced, s.phase));
        let run = raw_heartbeats(&load, pid, w, s.phase, Some(s.paced)).await;
        out.closed(&paced_phase(s.paced), "heartbeats", &run);
    }

    for (phase, op, url) in [
        ("full fetch", Op::Full, load.full_url.clone()),
        ("delta fetch", Op::Delta, load.delta_url.clone()),
    ] {
        match inspect(&load.client, &url).await {
            Ok((p, _)) => {
                out.add(
                    format!("{phase}: instances in the payload"),
                    p.instances as f64,
                    0,
                    Better::Info,
                );
                out.add(
                    format!("{phase}: bytes on the wire (gzip)"),
                    p.wire as f64,
                    0,
                    Better::Info,
                );
                out.add(
                    format!("{phase}: bytes of JSON (decompressed)"),
                    p.raw as f64,
                    0,
                    Better::Info,
                );
                if !p.gzip {
                    out.notes.push(format!("{phase}: the answer was not gzip-encoded"));
                }
            }
            Err(e) => out.notes.push(format!("{phase}: inspection failed: {e}")),
        }
        log(&format!("{phase} for {:?}", s.phase));
        let run = closed_loop(&load, pid, w, s.phase, Arc::new(move |_, _| op)).await;
        out.closed(phase, "fetches", &run);
        out.add(
            format!("{phase}: MB/s on the wire"),
            run.bytes as f64 / 1e6 / run.wall.as_secs_f64(),
            1,
            Better::Higher,
        );
    }

    log("fetches right after a write");
    let (miss_full, miss_delta) = fetch_after_write(&load, 20).await;
    for (what, run) in [("full", &miss_full), ("delta", &miss_delta)] {
        out.add(
            format!("{what} fetch right after a write (sequential, idle server): p50 (ms)"),
            run.pct(50.0),
            2,
            Better::Lower,
        );
        if run.errors > 0 {
            out.notes.push(format!(
                "{what} fetch after a write: {} errors, first: {}",
                run.errors,
                run.first_error.clone().unwrap_or_default()
            ));
        }
    }

    log(&format!("mixed load for {:?}", s.mixed));
    let streams = mixed_streams(n, s.rates);
    let machine = MachineProbe::start();
    let runs = open_loop(&load, pid, s.mixed, s.arrivals, streams).await;
    let noise = machine.finish();
    let [m_hb, m_reg, m_st, m_full, m_delta] = <[Run; 5]>::try_from(runs).ok().expect("five streams");
    let phase = "mixed";
    out.machine.push(PhaseFloor::new(
        phase,
        noise,
        &m_hb,
        &[&m_hb, &m_reg, &m_st, &m_full, &m_delta],
    ));
    out.notes.push(format!(
        "mixed samples: {} heartbeats, {} writes, {} full and {} delta fetches (a p99 of few samples is a near-worst case)",
        m_hb.lat_us.len(),
        m_reg.lat_us.len() + m_st.lat_us.len(),
        m_full.lat_us.len(),
        m_delta.lat_us.len()
    ));
    out.mixed_latencies(&m_hb, &m_full, &m_delta);
    let mut writes = Run::default();
    writes.merge(m_reg);
    writes.merge(m_st);
    writes.lat_us.sort_unstable();
    out.add(
        format!("{phase}: register/status write p99 (ms)"),
        writes.pct(99.0),
        2,
        Better::Lower,
    );
    let wall = m_hb.wall.as_secs_f64();
    out.add(
        format!("{phase}: server CPU (cores busy, same offered load)"),
        m_hb.server_cpu / wall,
        3,
        Better::Lower,
    );
    let total_ok = m_hb.ok + writes.ok + m_full.ok + m_delta.ok;
    let total_err = m_hb.errors + writes.errors + m_full.errors + m_delta.errors;
    out.add(
        format!(
            "{phase}: requests answered per second (offered {:.0}/s)",
            s.rates.iter().sum::<f64>()
        ),
        total_ok as f64 / wall,
        0,
        Better::Higher,
    );
    let mut errs = Run {
        errors: total_err,
        ..Run::default()
    };
    for r in [&m_hb, &writes, &m_full, &m_delta] {
        if errs.first_error.is_none() {
            errs.first_error = r.first_error.clone();
        }
    }
    out.errors(phase, &errs);
    log("write visibility probe (alone)");
    let visible = visibility_probe(load.clone(), s.probe_timeout).await;
    out.add(
        "write visibility: registration → first full fetch holding it (s)",
        visible.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN),
        2,
        Better::Lower,
    );
    if visible.is_none() {
        out.notes
            .push(format!("visibility probe: not visible after {:?}", s.probe_timeout));
    }
    if load.metrics_url.is_some() {
        scrapes(&load, pid, s, &mut out).await;
    }
    if !s.storm.is_zero() && !fx.successors.is_empty() {
        deploy_storm(&load, pid, s, &mut out).await;
    }
    let rss_end = rss_mb(pid);
    out.add("RSS at the end (MB)", rss_end, 1, Better::Lower);
    if out.notes.iter().any(|n| n.contains("errors")) {
        out.notes
            .push(format!("{} log tail:\n{}", target.label, target.log_tail()));
    }
    out
}

/// What a Prometheus scrape costs the others: heartbeats and writes at the mixed load's rates,
/// once alone and once with `/metrics` scraped every 100 ms (ten times what Prometheus is usually
/// set to), the heartbeat p99 of each (ours only: the Java server has no such endpoint here).
async fn scrapes(load: &Arc<Load>, pid: u32, s: &Settings, out: &mut Results) {
    let n = load.fx.instances.len();
    let [hb_rate, reg_rate, ..] = s.rates;
    let streams = |scrape: bool| -> Vec<Stream> {
        let mut v: Vec<Stream> = vec![
            (hb_rate, Arc::new(move |k| Op::Heartbeat(k as usize % n))),
            (reg_rate, Arc::new(move |k| Op::Register((k as usize * 7919) % n))),
        ];
        if scrape {
            v.push((10.0, Arc::new(|_| Op::Scrape)));
        }
        v
    };
    eprintln!(
        "[        ours] heartbeats and writes for {:?}, then with /metrics every 100 ms",
        s.mixed
    );
    let quiet = open_loop(load, pid, s.mixed, s.arrivals, streams(false)).await;
    let scraped = open_loop(load, pid, s.mixed, s.arrivals, streams(true)).await;
    let phase = "heartbeats and writes";
    out.add(
        format!("{phase}: heartbeat p99 (ms)"),
        quiet[0].pct(99.0),
        2,
        Better::Lower,
    );
    out.add(
        format!("{phase}, /metrics every 100 ms: heartbeat p99 (ms)"),
        scraped[0].pct(99.0),
        2,
        Better::Lower,
    );
    out.add(
        format!("{phase}, /metrics every 100 ms: scrape p99 (ms)"),
        scraped[2].pct(99.0),
        2,
        Better::Lower,
    );
    let mut errs = Run::default();
    for r in quiet.into_iter().chain(scraped) {
        errs.merge(r);
    }
    out.errors(phase, &errs);
}

/// The mixed load's streams over `n` instances at `rates` (heartbeats, registrations, status
/// changes, full and delta fetches per second).
fn mixed_streams(n: usize, rates: [f64; 5]) -> Vec<Stream> {
    let [hb_rate, reg_rate, st_rate, full_rate, delta_rate] = rates;
    // Status changes take the first instances in turn: OUT_OF_SERVICE, then the override removed.
    let status_span = n.min(100);
    vec![
        (hb_rate, Arc::new(move |k| Op::Heartbeat(k as usize % n))),
        (reg_rate, Arc::new(move |k| Op::Register((k as usize * 7919) % n))),
        (
            st_rate,
            Arc::new(move |k| {
                let i = (k as usize / 2) % status_span;
                if k % 2 == 0 {
                    Op::StatusOos(i)
                } else {
                    Op::StatusClear(i)
                }
            }),
        ),
        (full_rate, Arc::new(|_| Op::Full)),
        (delta_rate, Arc::new(|_| Op::Delta)),
    ]
}

/// A deploy storm: a share of the instances re-registered with new ids and the old ones
/// cancelled, spread over the storm's length, while the other instances heartbeat every 30 s and
/// clients fetch the delta every 30 s.
async fn deploy_storm(load: &Arc<Load>, pid: u32, s: &Settings, out: &mut Results) {
    let fx = &load.fx;
    let (n, k) = (fx.instances.len(), fx.successors.len());
    eprintln!(
        "[       storm] replacing {k} of {n} instances over {:?} ({} delta clients)",
        s.storm, s.storm_clients
    );
    let replaced: std::collections::HashSet<usize> = fx.successors.iter().map(|(i, _)| *i).collect();
    let steady: Arc<Vec<usize>> = Arc::new((0..n).filter(|i| !replaced.contains(i)).collect());
    let replace_rate = k as f64 / s.storm.as_secs_f64();
    let hb_rate = if steady.is_empty() { 0.0 } else { n as f64 / 30.0 };
    let streams: Vec<Stream> = vec![
        (replace_rate, Arc::new(move |j| Op::RegisterSuccessor(j as usize % k))),
        (replace_rate, Arc::new(move |j| Op::CancelReplaced(j as usize % k))),
        (
            hb_rate,
            Arc::new(move |j| Op::Heartbeat(steady[j as usize % steady.len().max(1)])),
        ),
        (s.storm_clients / 30.0, Arc::new(|_| Op::Delta)),
    ];
    let machine = MachineProbe::start();
    let runs = open_loop(load, pid, s.storm, s.arrivals, streams).await;
    let noise = machine.finish();
    let [registers, cancels, hb, delta] = <[Run; 4]>::try_from(runs).ok().expect("four streams");
    let phase = "deploy storm";
    out.machine
        .push(PhaseFloor::new(phase, noise, &hb, &[&registers, &cancels, &hb, &delta]));
    out.notes.push(format!(
        "{phase}: {} registrations, {} cancels, {} heartbeats, {} delta fetches",
        registers.lat_us.len(),
        cancels.lat_us.len(),
        hb.lat_us.len(),
        delta.lat_us.len()
    ));
    out.add(
        format!("{phase}: delta fetch p50 (ms)"),
        delta.pct(50.0),
        2,
        Better::Lower,
    );
    out.add(
        format!("{phase}: delta fetch p99 (ms)"),
        delta.pct(99.0),
        2,
        Better::Lower,
    );
    out.add(
        format!("{phase}: delta bytes on the wire per fetch (gzip)"),
        delta.bytes as f64 / delta.ok.max(1) as f64,
        0,
        Better::Info,
    );
    out.add(format!("{phase}: heartbeat p99 (ms)"), hb.pct(99.0), 2, Better::Lower);
    let mut writes = Run::default();
    writes.merge(registers);
    writes.merge(cancels);
    writes.lat_us.sort_unstable();
    out.add(
        format!("{phase}: register/cancel p99 (ms)"),
        writes.pct(99.0),
        2,
        Better::Lower,
    );
    let wall = hb.wall.as_secs_f64();
    out.add(
        format!("{phase}: server CPU (cores busy, same offered load)"),
        hb.server_cpu / wall,
        3,
        Better::Lower,
    );
    let mut errs = Run {
        errors: writes.errors + hb.errors + delta.errors,
        ..Run::default()
    };
    errs.first_error = writes
        .first_error
        .clone()
        .or_else(|| hb.first_error.clone())
        .or_else(|| delta.first_error.clone());
    out.errors(phase, &errs);
}

// === the report ===

fn fmt_value(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        return "–".into();
    }
    if decimals == 0 && v.abs() >= 10_000.0 {
        // Thousands separators for big counts.
        let s = format!("{:.0}", v);
        let (sign, digits) = s.strip_prefix('-').map(|d| ("-", d)).unwrap_or(("", &s));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return format!("{sign}{out}");
    }
    format!("{v:.decimals$}")
}

/// How many times better ours is (`NaN` where no ratio is defined).
fn ratio_value(ours: f64, java: f64, better: Better) -> f64 {
    match better {
        Better::Higher | Better::Info => ours / java,
        Better::Lower => java / ours,
        Better::None => f64::NAN,
    }
}

fn ratio(ours: f64, java: f64, better: Better) -> String {
    let r = ratio_value(ours, java, better);
    if r.is_finite() && r > 0.0 {
        format!("{r:.2}×")
    } else {
        "–".into()
    }
}

/// Ours against the bare hyper baseline, closed-loop heartbeats: per row the round least
/// favourable to ours.
fn print_baseline(rounds: &[Round], paced: f64) {
    let pairs: Vec<(&Results, &Results)> = rounds
        .iter()
        .filter_map(|r| Some((&r.results.first()?.1, r.baseline.as_ref()?)))
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!(
        "The limit of a heartbeat and of a fetch: the same generators (closed loop, paced at a fixed rate, and the mixed load) against a bare hyper server that answers every request with 200 and nothing else, a `GET` with as many bytes as our full payload (`baseline` in the bench), in the same rounds:"
    );
    println!();
    println!("| row | ours | baseline (bare hyper, 200 only) | ours ÷ baseline | by round |");
    println!("|---|---:|---:|---:|---:|");
    let mut rows = vec![
        ("heartbeat: server CPU ms per 1k requests".to_string(), 1, false),
        ("heartbeat: heartbeats/s".to_string(), 0, true),
        ("heartbeat: p99 latency (ms)".to_string(), 2, false),
    ];
    if paced > 0.0 {
        let phase = paced_phase(paced);
        rows.push((format!("{phase}: server CPU ms per 1k requests"), 1, false));
    }
    for row in [
        "full fetch p50",
        "full fetch p99",
        "delta fetch p50",
        "delta fetch p99",
        "heartbeat p99",
    ] {
        rows.push((format!("mixed: {row} (ms)"), 2, false));
    }
    for (name, decimals, higher_is_better) in rows {
        let name = name.as_str();
        let per_round: Vec<(f64, f64, f64)> = pairs
            .iter()
            .filter_map(|(o, b)| {
                let (o, b) = (o.value(name)?, b.value(name)?);
                Some((o, b, o / b))
            })
            .collect();
        // Least favourable to ours: the most CPU or latency, the fewest heartbeats per second.
        let worst = per_round.iter().copied().reduce(|a, c| {
            let worse = if higher_is_better { c.2 < a.2 } else { c.2 > a.2 };
            if worse { c } else { a }
        });
        let Some((o, b, r)) = worst else { continue };
        let by_round: Vec<String> = per_round.iter().map(|x| format!("{:.2}×", x.2)).collect();
        println!(
            "| {name} | {} | {} | {r:.2}× | {} |",
            fmt_value(o, decimals),
            fmt_value(b, decimals),
            by_round.join(" / ")
        );
    }
    println!();
}

/// What the machine did during each round's open-loop phases, beside the heartbeat p99 measured
/// there: a p99 near the probe's is the machine's, not the server's.
fn print_machine(rounds: &[Round]) {
    let rows: Vec<String> = rounds
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.results.iter().flat_map(move |(label, res)| {
                res.machine.iter().map(move |f| {
                    format!(
                        "| {} | {label} | {} | {:.1} | {} | {} / {} | {} | {} |",
                        i + 1,
                        f.phase,
                        f.noise.steal_pct,
                        fmt_value(f.noise.overshoot_p99_ms, 2),
                        fmt_value(f.send_lag.0, 2),
                        fmt_value(f.send_lag.1, 2),
                        fmt_value(f.hb_p99, 2),
                        fmt_value(f.hb_p99_from_send, 2),
                    )
                })
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    println!(
        "The machine during the open-loop phases: the share of CPU time the host took from this virtual machine (steal, /proc/stat), how late a thread of the generator woke from a 1 ms sleep (p99) and how late the generator sent the phase's requests after they were due (its timer and scheduling, p50 / p99), beside the heartbeat p99 each server got in that phase, counted from when each heartbeat was due (as every latency row) and from when it was sent:"
    );
    println!();
    println!(
        "| round | server | phase | steal (% of CPU time) | 1 ms sleep, late by p99 (ms) | sent late by p50 / p99 (ms) | heartbeat p99 (ms) | heartbeat p99 from sending (ms) |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|---:|");
    for row in rows {
        println!("{row}");
    }
    println!();
}

fn ratio_is(better: Better) -> &'static str {
    match better {
        Better::Higher => "ours/Java, >1 = ours better",
        Better::Lower => "Java/ours, >1 = ours better",
        Better::Info => "ours/Java (information)",
        Better::None => "should be 0",
    }
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let text = if o.stdout.is_empty() { o.stderr } else { o.stdout };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

fn machine_note() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpus} cores ({model}), shared with the load generator and other work; kernel {}",
        kernel.trim()
    )
}

/// Which server binary ran, and how old it is. The bench starts the `eureka-operator` binary that
/// cargo built last (or `EO_OPERATOR_BIN`), not code compiled into the bench binary, and the git
/// description reads the working tree: an A/B of two builds shows here whether both ran.
fn server_binary_note() -> String {
    let path = Server::binary();
    let age = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or_else(
            || "age unknown".to_string(),
            |a| format!("built {} min before the report", a.as_secs() / 60),
        );
    format!("`{}`, {age}", path.display())
}

fn print_report(s: &Settings, fx: &Fixture, rounds: &[Round], elapsed: Duration) {
    let n = fx.instances.len();
    let git = first_line(
        "git",
        &["-C", env!("CARGO_MANIFEST_DIR"), "describe", "--always", "--dirty"],
    );
    println!();
    println!("## eureka-operator vs Spring Cloud Netflix Eureka server (same run)");
    println!();
    println!("* Machine: {}.", machine_note());
    println!(
        "  Absolute figures are noise on this machine; quote the ratios, which compare servers measured minutes apart under the same load generator."
    );
    let flags = s.jvm_flags.join(" ");
    let origin = if flags == HARNESS_JVM_FLAGS {
        "the test harness's fast-start set, C1 only (`EO_BENCH_JVM=c1`)"
    } else if flags == DEFAULT_JVM_FLAGS {
        "the default: the JVM's normal tiered JIT, a 2 GB heap; `EO_BENCH_JVM_FLAGS` overrides"
    } else {
        "from `EO_BENCH_JVM_FLAGS`"
    };
    let ours_flags = match ours_max_instances(fx) {
        Some(m) => format!(
            "default flags but `--max-instances {m}`: the default cap is below what this size registers at once"
        ),
        None => "default flags".to_string(),
    };
    println!(
        "* Versions: eureka-operator {git} (release build, {ours_flags}; the server binary {}); {}; JVM flags `{flags}` ({origin}).",
        server_binary_note(),
        first_line("java", &["-version"]),
    );
    println!(
        "* Java server: default `eureka.server.*` settings except `enable-self-preservation=false`; `register-with-eureka=false`, `fetch-registry=false`. The second Java column adds `use-read-only-response-cache=false`."
    );
    println!(
        "* Workload: N = {n} instances ({} apps × {PER_APP}), Spring-client JSON bodies (3 metadata keys, 600 s leases, so nothing expires); {} concurrent workers (closed loop) for {:?} per phase; the servers run one at a time, in the column order.",
        n.div_ceil(PER_APP),
        s.workers,
        s.phase
    );
    println!(
        "* Warm-up: after the cold registration each server gets {:?} of heartbeats + full + delta fetches (JIT) before the measured phases; \"re-register N\" is then measured warm.",
        s.warmup
    );
    println!(
        "* Fetches send the Spring client's headers (`Accept: application/json`, `Accept-Encoding: gzip`); bytes are compressed wire bytes. The delta holds all N instances in every server, since all were registered inside the 180 s delta retention window."
    );
    println!(
        "* Mixed ({:?}, open loop, latency counted from when each request was due): {} heartbeats/s, {} re-registrations/s, {} status changes/s (OUT_OF_SERVICE, then override removed), {} full and {} delta fetches/s. After it, alone, a probe registers an instance and polls the full registry every 100 ms until it shows (the visibility row).",
        s.mixed, s.rates[0], s.rates[1], s.rates[2], s.rates[3], s.rates[4]
    );
    println!(
        "* Arrivals in the mixed load and the storm: {} (`EO_BENCH_ARRIVALS`).",
        match s.arrivals {
            Arrivals::Poisson =>
                "Poisson (each stream's offered count at instants drawn uniformly over the phase from a fixed seed), the same schedule for every server",
            Arrivals::Uniform => "uniform, every stream evenly spaced from the phase's start",
        }
    );
    if !s.storm.is_zero() && !fx.successors.is_empty() {
        println!(
            "* Deploy storm ({:?}, open loop, after the mixed load): {} instances ({:.0} %, spread over every application) registered again under new ids and the instances they replace cancelled, each once, spread over the storm (see arrivals); meanwhile the other instances heartbeat every 30 s ({:.0}/s) and {} clients fetch the delta every 30 s ({:.1}/s).",
            s.storm,
            fx.successors.len(),
            s.storm_share * 100.0,
            n as f64 / 30.0,
            s.storm_clients,
            s.storm_clients / 30.0
        );
    }
    println!(
        "* Caching: ours has no stale cache: payloads are cached per registry version, so a write is visible to the next read. Java's default read-only response cache is refreshed every 30 s, so its reads are cheap but up to 30 s stale (see the visibility row)."
    );
    println!(
        "* Load generator: this process (tokio), on the same 2 cores; the closed-loop heartbeat phase {}, every other phase reqwest. It does the same work per request for every server, but costs more per request against Java (Tomcat closes each keep-alive connection after 100 requests, Spring Boot's default; fewer requests per wake-up), see the load-generator row. Closed-loop throughput is therefore bounded by the whole machine; CPU per 1k requests is the fairer efficiency figure.",
        match s.generator {
            Generator::Raw =>
                "uses a minimal keep-alive HTTP/1.1 client (pre-formatted requests, `EO_BENCH_GENERATOR=reqwest` for reqwest)",
            Generator::Reqwest => "uses reqwest too (`EO_BENCH_GENERATOR=reqwest`)",
        }
    );
    println!(
        "* \"Fetch right after a write\" is the price of freshness: ours (and Java without the read-only cache) encodes the registry again for the first read after each write; Java's default read-only cache answers from its 30 s snapshot."
    );
    println!(
        "* CPU = utime + stime of the server process (/proc/<pid>/stat, all threads) during each phase, counted in {:.0} ms clock ticks (so ±1 tick on a phase: the registration rows of ours are coarse); RSS = VmRSS.",
        1000.0 / clk_tck()
    );
    println!();
    println!(
        "* Rounds: {} at this size, the servers' order reversed every other round. Each row quotes the round least favourable to ours (its values and its ratio; for information rows, the one where ours is largest) and lists every round's ratio; errors are the most seen in any round.",
        rounds.len()
    );
    println!();
    let first = &rounds[0].results;
    let labels: Vec<&str> = first
        .iter()
        .map(|(l, _)| match *l {
            "ours" => "ours",
            "java" => "Java (default, RO cache on)",
            _ => "Java (RO cache off)",
        })
        .collect();
    let mut header = format!("| metric | {} |", labels[0]);
    let mut rule = "|---|---:|".to_string();
    for l in &labels[1..] {
        header.push_str(&format!(" {l} | ratio | by round |"));
        rule.push_str("---:|---:|---:|");
    }
    header.push_str(" ratio is |");
    rule.push_str("---|");
    println!("{header}");
    println!("{rule}");
    // Per round, per server: metric name → metric.
    let by_name: Vec<Vec<HashMap<&str, &Metric>>> = rounds
        .iter()
        .map(|r| {
            r.results
                .iter()
                .map(|(_, res)| res.metrics.iter().map(|m| (m.name.as_str(), m)).collect())
                .collect()
        })
        .collect();
    for m in &first[0].1.metrics {
        let name = m.name.as_str();
        let value = |round: usize, server: usize| by_name[round][server].get(name).map(|x| x.value);
        let mut cells = String::new();
        // Where no Java column has the row (or there is none), the worst of ours' rounds.
        let values: Vec<f64> = (0..rounds.len()).filter_map(|r| value(r, 0)).collect();
        let mut ours_value = match m.better {
            Better::Higher => values.iter().copied().fold(f64::INFINITY, f64::min),
            Better::Lower | Better::None => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Better::Info => m.value,
        };
        for j in 1..first.len() {
            let per_round: Vec<(usize, f64, f64, f64)> = (0..rounds.len())
                .filter_map(|r| {
                    let (o, jv) = (value(r, 0)?, value(r, j)?);
                    Some((r, o, jv, ratio_value(o, jv, m.better)))
                })
                .collect();
            let worst = match m.better {
                Better::None => per_round
                    .iter()
                    .copied()
                    .reduce(|a, b| (a.0, a.1.max(b.1), a.2.max(b.2), f64::NAN)),
                // Information rows are ours ÷ Java of bytes, instances or the generator's CPU:
                // more of ours is the less favourable round.
                Better::Info => per_round
                    .iter()
                    .copied()
                    .filter(|x| x.3.is_finite())
                    .max_by(|a, b| a.3.total_cmp(&b.3))
                    .or_else(|| per_round.first().copied()),
                _ => per_round
                    .iter()
                    .copied()
                    .filter(|x| x.3.is_finite())
                    .min_by(|a, b| a.3.total_cmp(&b.3))
                    .or_else(|| per_round.first().copied()),
            };
            let Some((_, o, jv, _)) = worst else {
                cells.push_str(" – | – | – |");
                continue;
            };
            if j == 1 {
                ours_value = o;
            }
            let by_round: Vec<String> = per_round.iter().map(|x| ratio(x.1, x.2, m.better)).collect();
            cells.push_str(&format!(
                " {} | {} | {} |",
                fmt_value(jv, m.decimals),
                ratio(o, jv, m.better),
                by_round.join(" / ")
            ));
        }
        println!(
            "| {} | {} |{cells} {} |",
            m.name,
            fmt_value(ours_value, m.decimals),
            ratio_is(m.better)
        );
    }
    println!();
    print_machine(rounds);
    print_baseline(rounds, s.paced);
    let notes: Vec<String> = rounds
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.results
                .iter()
                .flat_map(move |(l, res)| res.notes.iter().map(move |n| format!("* round {}, {l}: {n}", i + 1)))
        })
        .collect();
    if !notes.is_empty() {
        println!("Notes:");
        for n in notes {
            println!("{n}");
        }
        println!();
    }
    println!("Total benchmark time: {:.0} s.", elapsed.as_secs_f64());
}

fn main() {
    if let Ok(addr) = std::env::var(baseline::ADDR_VAR) {
        baseline::serve(addr.parse().expect("the baseline's address"));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}

/// One round at one size: each server's results (ours first), and the baseline's.
struct Round {
    results: Vec<(&'static str, Results)>,
    baseline: Option<Results>,
}

async fn run() {
    let run_started = Instant::now();
    let s = Settings::from_env();
    if peers::lookup("EUREKA_PEER_JAVA_SERVER_JAR").is_none() {
        eprintln!(
            "registry_vs_java: the Java Eureka server peer is missing; run tests/peers/setup (nothing to compare against)"
        );
        let _ = peers::require("EUREKA_PEER_JAVA_SERVER_JAR", "registry_vs_java");
        return;
    }
    for &n in &s.sizes {
        let s = Settings {
            instances: n,
            ..s.clone()
        };
        let started = Instant::now();
        let fx = Arc::new(Fixture::new(s.instances, s.storm_share));
        let mut rounds: Vec<Round> = Vec::new();
        for round in 0..s.rounds {
            let mut labels: Vec<Option<bool>> = vec![None];
            if s.java {
                labels.push(Some(true));
            }
            if s.java && s.java_nocache {
                labels.push(Some(false));
            }
            // Every other round the servers go in the reverse order: whatever the machine does
            // over time weighs on each side in turn.
            if round % 2 == 1 {
                labels.reverse();
            }
            let mut results: Vec<(&'static str, Results)> = Vec::new();
            for which in labels {
                eprintln!("round {} of {} at {n} instances: {which:?}", round + 1, s.rounds);
                let target = match which {
                    None => Target::ours(ours_max_instances(&fx)).await,
                    Some(ro_cache) => match Target::java(ro_cache, &s.jvm_flags).await {
                        Some(t) => t,
                        None => return,
                    },
                };
                let label = target.label;
                results.push((label, measure(&target, &fx, &s).await));
                target.stop();
            }
            results.sort_by_key(|(l, _)| match *l {
                "ours" => 0,
                "java" => 1,
                _ => 2,
            });
            let baseline = if s.baseline {
                // A fetch from the baseline carries as many bytes as our full payload did.
                let body = results
                    .iter()
                    .find(|(label, _)| *label == "ours")
                    .and_then(|(_, r)| r.value("full fetch: bytes on the wire (gzip)"))
                    .map_or(0, |bytes| bytes as usize);
                Some(measure_baseline(&fx, &s, body).await)
            } else {
                None
            };
            rounds.push(Round { results, baseline });
        }
        print_report(&s, &fx, &rounds, started.elapsed());
    }
    eprintln!("registry_vs_java: done in {:.0} s", run_started.elapsed().as_secs_f64());
}
