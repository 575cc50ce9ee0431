//! Scale on fake nodes: Deployments across many namespaces, half of them selected by an EurekaApp,
//! on a control plane of the test's own (kube-controller-manager, kube-scheduler, kwok). Prints the
//! time to the first complete registry after the operator starts, Ready→visible latencies during a
//! rollout of a tenth of the pods, the operator's CPU (from /proc) and its resident memory per
//! watched pod, unselected and registered (all of it and its anonymous part, each read after the
//! operator trimmed its heap), and what a further quarter of the namespaces registered adds.
//!
//! `EO_SCALE_PODS` sets the size: 300 by default (CI), `EO_SCALE_PODS=5000` for the full run
//! (100 namespaces of 50 pods, 50 EurekaApps, a 500-pod rollout).

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
    runtime::watcher::{self, Event},
};
use serde_json::{Value, json};

use crate::{
    common::{
        cluster::Cluster,
        eureka::{Server, http},
        operator::{OPERATOR_NAMESPACE, SERVICE_ACCOUNT, eureka_app, namespace, prepare},
        process::{scratch_dir, wait_for},
    },
    lifecycle::{apply, deployment, rolled_out},
};

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 90);
const PER_NAMESPACE: usize = 50;

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/pid/stat");
    // The command name may hold spaces; fields after its closing parenthesis are fixed.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Resident memory of a process, in bytes: all of it (VmRSS), and its anonymous part (RssAnon:
/// the heap, stacks, everything but pages of mapped files; those are mostly the binary's code,
/// which grows with the code paths run, not with the pods).
#[derive(Clone, Copy, Debug)]
struct Rss {
    total: f64,
    anon: f64,
}

impl Rss {
    fn of(pid: i32) -> Rss {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/pid/status");
        let kib = |field: &str| -> f64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
        };
        Rss {
            total: kib("VmRSS:") * 1024.0,
            anon: kib("RssAnon:") * 1024.0,
        }
    }
}

/// Figure by figure, so that a per-pod share reads as arithmetic.
impl std::ops::Sub for Rss {
    type Output = Rss;
    fn sub(self, o: Rss) -> Rss {
        Rss {
            total: self.total - o.total,
            anon: self.anon - o.anon,
        }
    }
}

impl std::ops::Mul<f64> for Rss {
    type Output = Rss;
    fn mul(self, n: f64) -> Rss {
        Rss {
            total: self.total * n,
            anon: self.anon * n,
        }
    }
}

impl std::ops::Div<f64> for Rss {
    type Output = Rss;
    fn div(self, n: f64) -> Rss {
        self * (1.0 / n)
    }
}

/// RSS once the operator has given its heap's free pages back since this call (a build that does
/// not trim, through `EO_OPERATOR_BIN`, is read at once) and the reading has settled (two readings
/// 1 s apart within 1 %, or the last reading after 10 s).
async fn settled_rss(server: &Server) -> Rss {
    const TRIMS: &str = "eureka_memory_trim_duration_seconds_count";
    if let Some(before) = server.metric(TRIMS).await {
        wait_for(
            "a heap trim",
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async { (server.metric(TRIMS).await? > before).then_some(()) },
        )
        .await;
    }
    let pid = server.proc.pid();
    let mut last = Rss::of(pid);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = Rss::of(pid);
        if (now.total - last.total).abs() * 100.0 <= last.total {
            return now;
        }
        last = now;
    }
    last
}

/// The operator as the chart's ServiceAccount, watching every namespace (the chart's default).
async fn operator(cluster: &Cluster, lease: &str, watch: Option<&str>) -> (Server, tempfile::TempDir) {
    let dir = scratch_dir("scale-operator");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.kubeconfig_as(SERVICE_ACCOUNT, &kubeconfig);
    let mut args = vec![
        "--kubernetes",
        "on",
        "--operator-namespace",
        OPERATOR_NAMESPACE,
        "--lease-name",
        lease,
        "--lease-duration-seconds",
        "3",
        "--cluster-id",
        "scale",
    ];
    if let Some(ns) = watch {
        args.extend(["--watch-namespaces", ns]);
    }
    let server = Server::start_with_env(
        IP,
        &args,
        &[("KUBECONFIG", kubeconfig.to_str().unwrap()), ("EUREKA_LOG", "info")],
    )
    .await;
    (server, dir)
}

/// The spec of the `i`th namespace's EurekaApp, selecting its Deployment's pods.
fn svc_app(i: usize) -> String {
    format!("  appName: svc-{i:03}\n  selector:\n    matchLabels: {{app: svc}}\n  port: http\n  drainSeconds: 1\n")
}

/// The number of UP instances in a full fetch.
async fn up_instances(server: &Server) -> usize {
    let Ok(r) = http()
        .get(format!("{}apps", server.url()))
        .header("Accept", "application/json")
        .send()
        .await
    else {
        return 0;
    };
    let v: Value = r.json().await.unwrap_or_default();
    v["applications"]["application"]
        .as_array()
        .map(|apps| {
            apps.iter()
                .flat_map(|a| a["instance"].as_array().cloned().unwrap_or_default())
                .filter(|i| i["status"] == "UP")
                .count()
        })
        .unwrap_or(0)
}

/// `(instanceId, status)` of `app`, fetched with `client`.
async fn app_ups(client: &reqwest::Client, base: &str, app: &str) -> Vec<(String, String)> {
    let Ok(r) = client
        .get(format!("{base}apps/{app}"))
        .header("Accept", "application/json")
        .send()
        .await
    else {
        return Vec::new();
    };
    let v: Value = r.json().await.unwrap_or_default();
    v["application"]["instance"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    (
                        i["instanceId"].as_str().unwrap_or("").to_string(),
                        i["status"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[((sorted.len() * p).div_ceil(100)).max(1) - 1]
}

#[tokio::test]
async fn scale_thousands_of_pods_on_fake_nodes() {
    let pods: usize = std::env::var("EO_SCALE_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let namespaces = (pods / PER_NAMESPACE).max(2);
    let per = pods / namespaces;
    let pods = per * namespaces;
    let registered_ns = namespaces / 2;
    let nodes = pods.div_ceil(1500) + 1;
    let Some(cluster) = Cluster::start_with_controllers(nodes) else {
        return;
    };
    prepare(&cluster);
    let client = cluster.admin().await;

    // Fill the cluster: every namespace a Deployment (the EurekaApps come later).
    let filled = Instant::now();
    let names: Vec<String> = (0..namespaces).map(|i| format!("scale-{i:03}")).collect();
    for ns in &names {
        namespace(&client, ns).await;
        apply(&cluster, &deployment(ns, "svc", per as u32, "example/svc:1", "0s", 2));
    }
    namespace(&client, "scale-empty").await;
    let all_pods: Api<Pod> = Api::all(client.clone());
    let ready_count = || async {
        let list = all_pods.list(&ListParams::default().labels("app=svc")).await.ok()?;
        Some(
            list.items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count(),
        )
    };
    wait_for(
        &format!("{pods} pods Ready on {nodes} fake nodes"),
        Duration::from_secs(120 + pods as u64 / 10),
        Duration::from_secs(1),
        || async { (ready_count().await? == pods).then_some(()) },
    )
    .await;
    let filled = filled.elapsed();
    let registered = registered_ns * per;

    // Memory: an operator watching an empty namespace (the base), then one watching every
    // namespace while no pod is selected yet.
    let (base, _base_dir) = operator(&cluster, "scale-base", Some("scale-empty")).await;
    let rss_base = settled_rss(&base).await;
    drop(base);
    let (uns, _uns_dir) = operator(&cluster, "scale-unselected", None).await;
    wait_for(
        "every pod indexed",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let v = uns.metric("eureka_controller_indexed_pods").await?;
            (v as usize >= pods).then_some(())
        },
    )
    .await;
    let rss_unselected = settled_rss(&uns).await;
    drop(uns);
    let per_unselected = (rss_unselected - rss_base) / pods as f64;

    // Half the namespaces get an EurekaApp; then a fresh operator is timed to its first
    // complete registry.
    for (i, ns) in names[..registered_ns].iter().enumerate() {
        eureka_app(&cluster, ns, "svc", &svc_app(i));
    }
    let started = Instant::now();
    let (op, _op_dir) = operator(&cluster, "scale-all", None).await;
    let cpu_at_start = cpu_seconds(op.proc.pid());
    let first_complete = wait_for(
        "the first complete registry",
        Duration::from_secs(60 + pods as u64 / 20),
        Duration::from_millis(50),
        || async { (up_instances(&op).await == registered).then(|| started.elapsed()) },
    )
    .await;
    let cpu_start = cpu_seconds(op.proc.pid());
    let rss_all = settled_rss(&op).await;
    let cpu_idle_from = (Instant::now(), cpu_seconds(op.proc.pid()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cpu_idle = (cpu_seconds(op.proc.pid()) - cpu_idle_from.1) / cpu_idle_from.0.elapsed().as_secs_f64();

    let unselected_pods = pods - registered;
    let per_registered = (rss_all - rss_base - per_unselected * unselected_pods as f64) / registered as f64;

    // A further share of the namespaces registered, pods the operator already watched: what each
    // further registered pod costs (the slope), apart from what a loaded operator holds at any
    // size (connection buffers, task and channel blocks, code paths run once).
    let further_ns = (namespaces / 4).clamp(1, namespaces - registered_ns);
    for (i, ns) in names[registered_ns..registered_ns + further_ns].iter().enumerate() {
        eureka_app(&cluster, ns, "svc", &svc_app(registered_ns + i));
    }
    let further = further_ns * per;
    wait_for(
        "the further registrations",
        Duration::from_secs(60 + further as u64 / 20),
        Duration::from_millis(200),
        || async { (up_instances(&op).await == registered + further).then_some(()) },
    )
    .await;
    let rss_further = settled_rss(&op).await;
    let per_further = (rss_further - rss_all) / further as f64;

    // A rollout of a tenth of the pods (whole Deployments of registered namespaces).
    let roll_ns: Vec<String> = names[..(pods / 10).div_ceil(per).clamp(1, registered_ns)].to_vec();
    let rolled = roll_ns.len() * per;
    let seen_ready: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let seen_ready = seen_ready.clone();
        let api = all_pods.clone();
        tokio::spawn(async move {
            let config = watcher::Config::default().labels("app=svc");
            let mut stream = std::pin::pin!(watcher::watcher(api, config));
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let (Ok(Event::Apply(p)) | Ok(Event::InitApply(p))) = event else {
                    continue;
                };
                let v2 = p
                    .spec
                    .as_ref()
                    .is_some_and(|s| s.containers[0].image.as_deref() == Some("example/svc:2"));
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if v2 && ready {
                    let key = format!("{}.{}", p.metadata.name.unwrap(), p.metadata.namespace.unwrap());
                    seen_ready.lock().unwrap().entry(key).or_insert(now);
                }
            }
        })
    };
    let seen_up: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    // The rolled apps as a client fetches them (`GET apps/{APP}`, all at once, every 100 ms),
    // without gzip: the measuring must not be what loads the operator.
    let rolled_apps: Vec<String> = (0..roll_ns.len()).map(|i| format!("SVC-{i:03}")).collect();
    let poll = {
        let (seen_up, url, apps) = (seen_up.clone(), op.url(), rolled_apps.clone());
        tokio::spawn(async move {
            let plain = reqwest::Client::builder()
                .no_gzip()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            loop {
                let at = Instant::now();
                let fetched = futures::future::join_all(apps.iter().map(|a| app_ups(&plain, &url, a))).await;
                {
                    let mut seen = seen_up.lock().unwrap();
                    for (id, status) in fetched.iter().flatten() {
                        if status == "UP" {
                            // `{pod}.{namespace}:{app}:{port}` -> `{pod}.{namespace}`
                            let key = id.split(':').next().unwrap_or(id).to_string();
                            seen.entry(key).or_insert(at);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Let the poller see what is UP already, so only new instances are timed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: HashSet<String> = seen_up.lock().unwrap().keys().cloned().collect();
    let roll_started = Instant::now();
    let cpu_roll_from = cpu_seconds(op.proc.pid());
    let counters = [
        "eureka_controller_reconciles_total",
        "eureka_controller_reconcile_duration_seconds_sum",
        "eureka_kubernetes_status_writes_total",
        "eureka_kubernetes_event_writes_total",
    ];
    let mut counters_from = Vec::new();
    for c in counters {
        counters_from.push(op.metric(c).await.unwrap_or(f64::NAN));
    }
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "example/svc:2"}]}}}});
    for ns in &roll_ns {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .patch("svc", &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .unwrap();
    }
    let visible = wait_for(
        "every rolled pod visible UP",
        Duration::from_secs(120 + rolled as u64 / 5),
        Duration::from_millis(200),
        || {
            let (seen_ready, seen_up) = (seen_ready.clone(), seen_up.clone());
            let before = before.clone();
            async move {
                let ready = seen_ready.lock().unwrap().clone();
                let up = seen_up.lock().unwrap();
                (ready.len() == rolled && ready.keys().all(|k| up.contains_key(k) && !before.contains(k)))
                    .then(|| (ready, up.clone()))
            }
        },
    )
    .await;
    for ns in &roll_ns {
        let api = Api::<Deployment>::namespaced(client.clone(), ns);
        wait_for(
            "the rollout complete",
            Duration::from_secs(120),
            Duration::from_millis(200),
            || async { rolled_out(&api.get("svc").await.ok()?, per as i32).then_some(()) },
        )
        .await;
    }
    let roll_time = roll_started.elapsed();
    let cpu_roll = cpu_seconds(op.proc.pid()) - cpu_roll_from;
    let mut during_roll = Vec::new();
    for (c, from) in counters.iter().zip(&counters_from) {
        during_roll.push(format!(
            "{}={:.2}",
            c.trim_start_matches("eureka_"),
            op.metric(c).await.unwrap_or(f64::NAN) - from
        ));
    }
    poll.abort();
    watch.abort();
    let (ready, up) = visible;
    let mut lat: Vec<Duration> = ready.iter().map(|(k, r)| up[k].saturating_duration_since(*r)).collect();
    lat.sort();
    let log = op.proc.log();
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "SCALE pods={pods} namespaces={namespaces} eurekaapps={registered_ns} registered={registered} unselected={unselected_pods} \
         nodes={nodes} cluster_filled_in={:.1}s first_complete_registry={} ms (operator start to {registered} UP in a full fetch) \
         operator_cpu_to_first_complete={:.2}s (of which before /readyz {cpu_at_start:.2}s) operator_cpu_idle={:.3} cores \
         rollout pods={rolled} deployments={} complete_in={:.1}s operator_cpu_during_rollout={cpu_roll:.2}s \
         ready_to_visible n={} p50={} ms p99={} ms max={} ms (every rolled app fetched every 100 ms) operator={} \
         rss_base={:.1} MiB rss_all={:.1} MiB rss_all_unselected={:.1} MiB per_unselected_pod={:.0} B per_registered_pod={:.0} B \
         anonymous: rss_base={:.1} MiB rss_all={:.1} MiB rss_all_unselected={:.1} MiB per_unselected_pod={:.0} B per_registered_pod={:.0} B \
         further: registered={further} rss={:.1} MiB anonymous_rss={:.1} MiB per_registered_pod={:.0} B anonymous={:.0} B (its watch not included)",
        filled.as_secs_f64(),
        first_complete.as_millis(),
        cpu_start,
        cpu_idle,
        roll_ns.len(),
        roll_time.as_secs_f64(),
        lat.len(),
        percentile(&lat, 50).as_millis(),
        percentile(&lat, 99).as_millis(),
        lat.last().unwrap().as_millis(),
        std::env::var("EO_OPERATOR_BIN").unwrap_or_else(|_| "this build (debug)".into()),
        mib(rss_base.total),
        mib(rss_all.total),
        mib(rss_unselected.total),
        per_unselected.total,
        per_registered.total,
        mib(rss_base.anon),
        mib(rss_all.anon),
        mib(rss_unselected.anon),
        per_unselected.anon,
        per_registered.anon,
        mib(rss_further.total),
        mib(rss_further.anon),
        per_further.total,
        per_further.anon,
    );
    println!("SCALE_ROLLOUT_COUNTERS {}", during_roll.join(" "));
    assert!(!log.contains("panicked"), "{}", op.proc.log_tail(30));
    assert_eq!(lat.len(), rolled);
    assert!(
        percentile(&lat, 99) < Duration::from_secs(5),
        "Ready to visible p99 {:?} during the rollout",
        percentile(&lat, 99)
    );
}
