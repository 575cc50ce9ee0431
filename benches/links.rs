//! A link between two of our servers: a source with N instances (10 000 by default) and a puller
//! that imports them over a link. Measures the import (the puller's CPU and resident memory per
//! imported instance), the cost of a poll when nothing changed (CPU on both sides, bytes on the
//! wire), and freshness under a deploy storm in the source (registrations and cancels at a steady
//! rate, with probe instances timed from their registration on the source to the puller showing
//! them).
//!
//! `cargo bench --bench links` prints a markdown table. Knobs (environment): `EO_BENCH_INSTANCES`
//! (10000), `EO_BENCH_POLL_MS` (1000, the link's poll interval), `EO_BENCH_IDLE_SECS` (30),
//! `EO_BENCH_STORM_SECS` (30), `EO_BENCH_STORM_RATE` (200 writes per second).

#[path = "../tests/it/common"]
#[allow(dead_code)]
mod common {
    pub mod eureka;
    pub mod peers;
    pub mod process;
}

use std::{
    net::Ipv4Addr,
    str::FromStr,
    time::{Duration, Instant},
};

use common::{
    eureka::{Server, spring_instance},
    process::{rss_kib, scratch_dir},
};

const SOURCE_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 201);
const PULLER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 202);
/// Instances per application.
const PER_APP: usize = 20;

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// CPU time of every thread of `pid` (seconds), from each thread's schedstat (nanoseconds; the
/// clock ticks of /proc/<pid>/stat are too coarse for a poll).
fn cpu_secs(pid: u32) -> f64 {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    ns as f64 / 1e9
}

async fn register(client: &reqwest::Client, base: &str, app: &str, id: &str) {
    let body = serde_json::json!({
        "instance": spring_instance(app, id, &format!("{id}.example"), "10.40.0.1", 8080, &app.to_lowercase(), 1)
    });
    let r = client
        .post(format!("{base}apps/{app}"))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("register");
    assert_eq!(r.status().as_u16(), 204, "register {app}/{id}");
}

async fn cancel(client: &reqwest::Client, base: &str, app: &str, id: &str) {
    let _ = client.delete(format!("{base}apps/{app}/{id}")).send().await;
}

async fn metric(server: &Server, sample: &str) -> f64 {
    server.metric(sample).await.unwrap_or(0.0)
}

/// Moves the probes the puller shows now from `pending` to `lags` (ms since registration).
async fn seen_probes(
    client: &reqwest::Client,
    puller: &Server,
    pending: &mut Vec<(String, Instant)>,
    lags: &mut Vec<f64>,
) {
    let shown: serde_json::Value = client
        .get(format!("{}apps/PROBE", puller.url()))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or_default();
    let ids: Vec<String> = shown["application"]["instance"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["instanceId"].as_str().map(str::to_string))
        .collect();
    pending.retain(|(id, at)| {
        if ids.contains(id) {
            lags.push(at.elapsed().as_secs_f64() * 1000.0);
            false
        } else {
            true
        }
    });
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p / 100.0).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::main]
async fn main() {
    let n: usize = env_or("EO_BENCH_INSTANCES", 10_000);
    let poll_ms: u64 = env_or("EO_BENCH_POLL_MS", 1000);
    let idle_secs: u64 = env_or("EO_BENCH_IDLE_SECS", 30);
    let storm_secs: u64 = env_or("EO_BENCH_STORM_SECS", 30);
    let storm_rate: u64 = env_or("EO_BENCH_STORM_RATE", 200);
    eureka_operator::tls::install_default_provider();
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let quiet = [("EUREKA_LOG", "warn")];
    let source = Server::start_with_env(SOURCE_IP, &["--cluster-name", "source"], &quiet).await;
    let base = source.url();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..64 {
        let (client, base) = (client.clone(), base.clone());
        workers.spawn(async move {
            for i in (w..n).step_by(64) {
                let app = format!("APP-{}", i / PER_APP);
                register(&client, &base, &app, &format!("i-{i}")).await;
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.expect("a registration worker");
    }
    println!("registered {n} instances on the source in {:?}", started.elapsed());

    // The puller starts with an empty links file; the link is added once its memory is measured.
    let dir = scratch_dir("bench-links");
    let file = dir.path().join("links.yaml");
    std::fs::write(&file, "[]\n").unwrap();
    let file_arg = file.display().to_string();
    let puller = Server::start_with_env(
        PULLER_IP,
        &[
            "--cluster-name",
            "puller",
            "--remote-clusters-file",
            &file_arg,
            "--remote-clusters-reload-interval-ms",
            "100",
        ],
        &quiet,
    )
    .await;
    let (src_pid, pull_pid) = (source.proc.pid() as u32, puller.proc.pid() as u32);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The puller's own idle cost, before it has a link (timers, the runtime).
    let (src_base0, pull_base0) = (cpu_secs(src_pid), cpu_secs(pull_pid));
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let pull_base = (cpu_secs(pull_pid) - pull_base0) / idle_secs as f64;
    let src_base = (cpu_secs(src_pid) - src_base0) / idle_secs as f64;
    let rss_before = rss_kib(pull_pid).unwrap_or(0);
    let cpu_before = cpu_secs(pull_pid);
    let link = format!(
        "- name: source\n  urls: [{base}]\n  pollIntervalMs: {poll_ms}\n  maxInstances: {}\n",
        n * 2
    );
    std::fs::write(&file, link).unwrap();
    let import_started = Instant::now();
    loop {
        if metric(&puller, r#"eureka_instances{origin="imported"}"#).await as usize == n {
            break;
        }
        assert!(
            import_started.elapsed() < Duration::from_secs(120),
            "the import did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let import_time = import_started.elapsed();
    // Let the allocator settle, then read the resident memory.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let import_cpu = cpu_secs(pull_pid) - cpu_before;
    let rss_after = rss_kib(pull_pid).unwrap_or(0);
    let per_instance_bytes = (rss_after.saturating_sub(rss_before)) as f64 * 1024.0 / n as f64;

    // Idle: nothing changes on the source.
    let (src0, pull0) = (cpu_secs(src_pid), cpu_secs(pull_pid));
    let polls0 = metric(&puller, r#"eureka_link_polls_total{link="source",kind="changes"}"#).await;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let polls = metric(&puller, r#"eureka_link_polls_total{link="source",kind="changes"}"#).await - polls0;
    let (src_idle, pull_idle) = (cpu_secs(src_pid) - src0, cpu_secs(pull_pid) - pull0);
    // The bytes of an answer when nothing changed, asked as a puller asks.
    let version: u64 = {
        let v: serde_json::Value = client
            .get(format!("{base}link/apps"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["applications"]["versions__delta"].as_str().unwrap().parse().unwrap()
    };
    let empty = client.get(format!("{base}link/apps")).send().await.unwrap();
    let epoch = empty.headers()["x-eureka-link-epoch"].to_str().unwrap().to_string();
    drop(empty);
    let idle_bytes = client
        .get(format!("{base}link/apps?since={version}&epoch={epoch}"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .len();

    // Deploy storm: registrations and cancels at `storm_rate` per second; every 10th write a
    // probe registration whose arrival on the puller is timed.
    let storm_started = Instant::now();
    let (src1, pull1) = (cpu_secs(src_pid), cpu_secs(pull_pid));
    let mut lags: Vec<f64> = Vec::new();
    let mut pending: Vec<(String, Instant)> = Vec::new();
    let mut writes = 0u64;
    let every = Duration::from_secs_f64(1.0 / storm_rate as f64);
    let mut next = Instant::now();
    while storm_started.elapsed() < Duration::from_secs(storm_secs) {
        let i = writes as usize;
        let app = format!("APP-{}", (i % n) / PER_APP);
        if i.is_multiple_of(10) {
            let id = format!("probe-{i}");
            register(&client, &base, "PROBE", &id).await;
            pending.push((id, Instant::now()));
        } else if i.is_multiple_of(2) {
            cancel(&client, &base, &app, &format!("i-{}", i % n)).await;
        } else {
            register(&client, &base, &app, &format!("i-{}", (i + 1) % n)).await;
        }
        writes += 1;
        // Check the probes in flight.
        if !pending.is_empty() && writes.is_multiple_of(5) {
            seen_probes(&client, &puller, &mut pending, &mut lags).await;
        }
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    let (src_storm, pull_storm) = (cpu_secs(src_pid) - src1, cpu_secs(pull_pid) - pull1);
    let storm_elapsed = storm_started.elapsed().as_secs_f64();
    // The probes still in flight when the storm ended.
    let drain = Instant::now();
    while !pending.is_empty() && drain.elapsed() < Duration::from_secs(10) {
        seen_probes(&client, &puller, &mut pending, &mut lags).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lags.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mismatches = metric(&puller, r#"eureka_link_hash_mismatches_total{link="source"}"#).await;
    let full_polls = metric(&puller, r#"eureka_link_polls_total{link="source",kind="full"}"#).await;

    println!();
    println!("| link phase ({n} instances, poll {poll_ms} ms) | figure |");
    println!("|---|---:|");
    println!(
        "| initial import: time | {:.0} ms |",
        import_time.as_secs_f64() * 1000.0
    );
    println!(
        "| initial import: puller CPU per 1k instances | {:.1} ms |",
        import_cpu * 1000.0 / n as f64 * 1000.0
    );
    println!(
        "| puller resident memory per imported instance | {:.0} bytes |",
        per_instance_bytes
    );
    println!(
        "| idle: puller / source CPU without a link (the process alone) | {:.2} / {:.2} ms per s |",
        pull_base * 1000.0,
        src_base * 1000.0
    );
    println!(
        "| idle poll: puller CPU per poll, beyond that | {:.0} µs |",
        (pull_idle - pull_base * idle_secs as f64).max(0.0) * 1e6 / polls.max(1.0)
    );
    println!(
        "| idle poll: source CPU per poll, beyond that | {:.0} µs |",
        (src_idle - src_base * idle_secs as f64).max(0.0) * 1e6 / polls.max(1.0)
    );
    println!("| idle poll: answer body | {idle_bytes} bytes |");
    println!("| idle: polls in {idle_secs} s | {polls:.0} |");
    println!(
        "| storm: {:.0} writes/s for {storm_secs} s, probe lag p50 / p99 / max | {:.0} / {:.0} / {:.0} ms ({} probes, {} not seen) |",
        writes as f64 / storm_elapsed,
        pct(&lags, 50.0),
        pct(&lags, 99.0),
        lags.last().copied().unwrap_or(f64::NAN),
        lags.len(),
        pending.len()
    );
    println!(
        "| storm: puller / source CPU | {:.0} / {:.0} ms per s |",
        pull_storm * 1000.0 / storm_elapsed,
        src_storm * 1000.0 / storm_elapsed
    );
    println!(
        "| hash-code mismatches / full polls after the first | {mismatches:.0} / {:.0} |",
        full_polls - 1.0
    );
}
