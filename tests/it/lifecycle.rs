//! Real cluster lifecycles on [`Cluster::with_controllers`]: kube-controller-manager rolls
//! Deployments, collects garbage and deletes namespaces, kube-scheduler binds the pods to kwok's
//! fake nodes, and kwok makes them Running and Ready (and gone when their grace period ends). The
//! operator runs as the chart's ServiceAccount, as in the other controller tests.

use std::{
    collections::{BTreeSet, HashMap},
    net::Ipv4Addr,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
    runtime::watcher::{self, Event},
};
use serde_json::json;

use crate::common::{
    clients::assert_no_mismatch,
    cluster::Cluster,
    eureka::SpringClient,
    operator::{Operator, eureka_app, instances, kubectl_apply, namespace, prepare},
    process::wait_for,
};

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 70);

/// The lifecycle cluster with the CRD and the chart's RBAC applied.
pub fn lifecycle_cluster() -> Option<&'static Cluster> {
    static READY: OnceLock<bool> = OnceLock::new();
    let cluster = Cluster::with_controllers()?;
    READY.get_or_init(|| {
        prepare(cluster);
        true
    });
    Some(cluster)
}

/// A Deployment of `replicas` pods labelled `app: <app>` with an `http` port, whose pods kwok
/// makes Ready `ready_after` after they are scheduled and which take their whole `grace` to stop.
pub fn deployment(ns: &str, app: &str, replicas: u32, image: &str, ready_after: &str, grace: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {app}, namespace: {ns}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {app}}}}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 25%, maxUnavailable: 0}}}}
  template:
    metadata:
      labels: {{app: {app}}}
      annotations: {{kwok.eureka-operator.dev/ready-after: \"{ready_after}\"}}
    spec:
      terminationGracePeriodSeconds: {grace}
      containers:
      - name: app
        image: {image}
        ports: [{{name: http, containerPort: 8080}}]
"
    )
}

pub fn apply(cluster: &Cluster, manifest: &str) {
    let (ok, out) = kubectl_apply(cluster, manifest);
    assert!(ok, "kubectl apply failed: {out}\n{manifest}");
}

/// Whether the Deployment's rollout is complete, as `kubectl rollout status` decides it.
pub fn rolled_out(d: &Deployment, replicas: i32) -> bool {
    let (Some(spec), Some(status)) = (&d.spec, &d.status) else {
        return false;
    };
    status.observed_generation >= d.metadata.generation
        && spec.replicas == Some(replicas)
        && status.updated_replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
        && status.replicas == Some(replicas)
}

/// What the test saw of a pod through its own watch.
#[derive(Default, Clone, Debug)]
struct PodSeen {
    ready: Option<Instant>,
    deleting: Option<Instant>,
    gone: Option<Instant>,
    image: String,
}

/// Watches the pods of `ns` and records when each became Ready, started terminating and was gone.
fn watch_pods(client: kube::Client, ns: &str) -> (Arc<Mutex<HashMap<String, PodSeen>>>, tokio::task::JoinHandle<()>) {
    let seen: Arc<Mutex<HashMap<String, PodSeen>>> = Arc::default();
    let out = seen.clone();
    let api: Api<Pod> = Api::namespaced(client, ns);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let (pod, gone) = match event {
                Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => (p, false),
                Ok(Event::Delete(p)) => (p, true),
                _ => continue,
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut seen = out.lock().unwrap();
            let entry = seen.entry(name).or_default();
            entry.image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready && entry.ready.is_none() {
                entry.ready = Some(now);
            }
            if pod.metadata.deletion_timestamp.is_some() && entry.deleting.is_none() {
                entry.deleting = Some(now);
            }
            if gone {
                entry.gone = Some(now);
            }
        }
    });
    (seen, task)
}

/// When the client was asked, and the `(id, status)` pairs it answered.
type Sample = (Instant, Vec<(String, String)>);

/// The pod name in an instance id of the default template (`{pod.name}.{pod.namespace}:...`).
fn pod_of(id: &str, ns: &str) -> String {
    id.split(&format!(".{ns}:")).next().unwrap_or(id).to_string()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// A 50-replica Deployment rolled with maxSurge 25 % and maxUnavailable 0 while the real Spring
/// client resolves the app every second: it never sees fewer than 50 UP instances, never an
/// instance whose pod is gone, sees the end of the rollout within a stated bound, and its delta
/// fetches never show a hash-code mismatch (counted only when its counters could show one).
///
/// Killed by the `wrong-hashcode` mutant (tests/mutants).
#[tokio::test]
async fn a_rolling_update_keeps_a_spring_client_at_full_strength() {
    let Some(cluster) = lifecycle_cluster() else { return };
    let client = cluster.admin().await;
    let ns = "lc-rollout";
    const REPLICAS: usize = 50;
    const DRAIN_S: u64 = 2;
    // Longer than the drain plus the client's staleness (refresh interval and its own lag).
    const GRACE_S: u32 = 10;
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "lc-rollout", &[]).await;
    eureka_app(
        cluster,
        ns,
        "orders",
        &format!("  selector:\n    matchLabels: {{app: orders}}\n  port: http\n  drainSeconds: {DRAIN_S}\n"),
    );
    let (pods, pod_watch) = watch_pods(client.clone(), ns);
    apply(
        cluster,
        &deployment(ns, "orders", REPLICAS as u32, "example/orders:1", "500ms", GRACE_S),
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    wait_for(
        "50 UP instances of the first version",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            let up = instances(&op.server, "ORDERS").await;
            (up.iter().filter(|(_, s)| s == "UP").count() == REPLICAS).then_some(())
        },
    )
    .await;
    let Some(spring) = SpringClient::start(&op.server.url(), "lc-watcher", "lc-watcher-1", &[]).await else {
        return;
    };
    wait_for(
        "the Spring client to see the 50 instances",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let seen = spring.seen_all("ORDERS").await;
            (seen.iter().filter(|(_, s)| s == "UP").count() == REPLICAS).then_some(())
        },
    )
    .await;
    let old: BTreeSet<String> = pods.lock().unwrap().keys().cloned().collect();
    assert_eq!(old.len(), REPLICAS, "{old:?}");

    // What the client resolves, sampled four times per second from here on.
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    // And what the operator itself serves, ten times per second (when each drain really ended).
    let served: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let serving = {
        let (served, url) = (served.clone(), op.server.url());
        tokio::spawn(async move {
            loop {
                let at = Instant::now();
                let now = crate::common::eureka::app_instances(&url, "ORDERS").await;
                served.lock().unwrap().push((at, now));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let sampling = {
        let (samples, base) = (samples.clone(), spring.base());
        tokio::spawn(async move {
            let http = crate::common::eureka::http();
            loop {
                let at = Instant::now();
                if let Ok(r) = http.get(format!("{base}/seen-all/ORDERS")).send().await
                    && let Ok(v) = r.json::<serde_json::Value>().await
                {
                    let seen = crate::common::eureka::id_status_pairs(&v);
                    samples.lock().unwrap().push((at, seen));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let rollout_started = Instant::now();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "example/orders:2"}]}}}});
    deployments
        .patch("orders", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let rollout_done = wait_for(
        "the Deployment to report the rollout complete",
        Duration::from_secs(240),
        Duration::from_millis(100),
        || async {
            let d = deployments.get("orders").await.ok()?;
            rolled_out(&d, REPLICAS as i32).then(Instant::now)
        },
    )
    .await;
    // The client's view of the end: exactly the new pods, all UP.
    let client_done = wait_for(
        "the Spring client to see exactly the new pods, all UP",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let samples = samples.clone();
            let pods = pods.clone();
            async move {
                let samples = samples.lock().unwrap();
                let pods = pods.lock().unwrap();
                samples
                    .iter()
                    .find(|(at, seen)| {
                        *at > rollout_started
                            && seen.len() == REPLICAS
                            && seen.iter().all(|(id, s)| {
                                s == "UP" && pods.get(&pod_of(id, ns)).is_some_and(|p| p.image == "example/orders:2")
                            })
                    })
                    .map(|(at, _)| *at)
            }
        },
    )
    .await;
    // Until the last old pod is gone, so every gone pod is checked against later samples.
    wait_for(
        "the old pods to be gone",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let pods = pods.lock().unwrap();
            old.iter()
                .all(|n| pods.get(n).is_some_and(|p| p.gone.is_some()))
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // a few more samples after the last one
    sampling.abort();
    serving.abort();
    pod_watch.abort();

    let samples = samples.lock().unwrap().clone();
    let pods = pods.lock().unwrap().clone();
    let during: Vec<&Sample> = samples.iter().filter(|(at, _)| *at >= rollout_started).collect();
    let mut min_up = usize::MAX;
    let mut max_seen = 0;
    let mut max_oos = 0;
    let mut dead_seen = Vec::new();
    for (at, seen) in &during {
        let up = seen.iter().filter(|(_, s)| s == "UP").count();
        min_up = min_up.min(up);
        max_seen = max_seen.max(seen.len());
        max_oos = max_oos.max(seen.iter().filter(|(_, s)| s == "OUT_OF_SERVICE").count());
        for (id, status) in seen {
            let pod = pod_of(id, ns);
            if let Some(gone) = pods.get(&pod).and_then(|p| p.gone)
                && gone < *at
            {
                dead_seen.push(format!(
                    "{id} ({status}) seen {} ms after its pod was gone",
                    ms(*at - gone)
                ));
            }
        }
    }
    // Per old pod: from the start of its deletion to the operator no longer serving it.
    let served = served.lock().unwrap().clone();
    let mut deregistered_after: Vec<(Duration, String)> = Vec::new();
    for name in &old {
        let Some(deleting) = pods.get(name).and_then(|p| p.deleting) else {
            continue;
        };
        let gone = served
            .iter()
            .find(|(at, now)| *at > deleting && !now.iter().any(|(id, _)| pod_of(id, ns) == *name));
        if let Some((at, _)) = gone {
            deregistered_after.push((*at - deleting, name.clone()));
        }
    }
    deregistered_after.sort();
    // Per old pod: from the operator no longer serving it to the client no longer showing it.
    let mut client_lag: Vec<Duration> = Vec::new();
    for name in &old {
        let Some(deleting) = pods.get(name).and_then(|p| p.deleting) else {
            continue;
        };
        let Some((removed, _)) = served
            .iter()
            .find(|(at, now)| *at > deleting && !now.iter().any(|(id, _)| pod_of(id, ns) == *name))
        else {
            continue;
        };
        if let Some((at, _)) = samples
            .iter()
            .find(|(at, seen)| at > removed && !seen.iter().any(|(id, _)| pod_of(id, ns) == *name))
        {
            client_lag.push(*at - *removed);
        }
    }
    client_lag.sort();
    let new_pods: Vec<&PodSeen> = pods.values().filter(|p| p.image == "example/orders:2").collect();
    let last_new_ready = new_pods.iter().filter_map(|p| p.ready).max().unwrap();
    let drains: Vec<Duration> = old
        .iter()
        .filter_map(|n| pods.get(n))
        .filter_map(|p| Some(p.gone? - p.deleting?))
        .collect();
    let stats = spring.stats().await;
    let end_lag = client_done.saturating_duration_since(rollout_done);
    let end_early = rollout_done.saturating_duration_since(client_done);
    println!(
        "ROLLOUT replicas={REPLICAS} maxSurge=25% maxUnavailable=0 drainSeconds={DRAIN_S} grace={GRACE_S}s \
         rollout={} ms (patch to Deployment complete) client_samples={} client_min_up={min_up} \
         client_max_instances={max_seen} client_max_out_of_service={max_oos} dead_instances_seen={} \
         client_saw_end={} ms after the Deployment reported complete{} (last new pod Ready to client view: {} ms) \
         pod_drain_min={} ms new_pods={} client_full_fetches={} delta_fetches={} reconcile_mismatches={}",
        ms(rollout_done - rollout_started),
        during.len(),
        dead_seen.len(),
        ms(end_lag),
        if end_early > Duration::ZERO {
            format!(" (it saw it {} ms before)", ms(end_early))
        } else {
            String::new()
        },
        ms(client_done.saturating_duration_since(last_new_ready)),
        drains.iter().min().map(|d| ms(*d)).unwrap_or(0),
        new_pods.len(),
        stats["fullFetches"],
        stats["deltaFetches"],
        stats["reconcileMismatches"],
    );
    // First, as its failure names the defect best: the client's own hash-code check, counted only
    // when its counters were read and could show a mismatch (valid, and delta fetches made).
    assert_no_mismatch("the Spring client", "the operator", &stats, true);
    assert!(during.len() >= 20, "too few client samples: {}", during.len());
    assert!(
        min_up >= REPLICAS,
        "the client saw only {min_up} UP instances during the rollout"
    );
    println!(
        "ROLLOUT_DRAIN operator deregistered old pods {}..{} ms after their deletion started (drainSeconds={DRAIN_S}, \
         deletionTimestamp has whole seconds); the client stopped showing them {}..{} ms later (p50 {} ms)",
        deregistered_after.first().map(|d| ms(d.0)).unwrap_or(0),
        deregistered_after.last().map(|d| ms(d.0)).unwrap_or(0),
        client_lag.first().map(|d| ms(*d)).unwrap_or(0),
        client_lag.last().map(|d| ms(*d)).unwrap_or(0),
        client_lag.get(client_lag.len() / 2).map(|d| ms(*d)).unwrap_or(0),
    );
    assert!(
        dead_seen.is_empty(),
        "instances of gone pods: {dead_seen:#?}\noperator log:\n{}",
        op.server
            .proc
            .log()
            .lines()
            .filter(|l| dead_seen.iter().any(|d| l.contains(d.split('.').next().unwrap_or("-"))))
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        deregistered_after.len(),
        REPLICAS,
        "every old pod's deregistration observed"
    );
    assert!(
        max_oos > 0,
        "the client never saw a draining (OUT_OF_SERVICE) instance; the test did not observe a drain"
    );
    assert_eq!(new_pods.len(), REPLICAS, "a rollout without surplus pods was expected");
    // The bound: the end is visible at most one drain plus 5 s (the client's 1 s refresh, its lag
    // and slack for a loaded machine) after the Deployment reports it.
    let bound = Duration::from_secs(DRAIN_S + 5);
    assert!(
        end_lag <= bound,
        "the client saw the end {end_lag:?} after the Deployment reported it (bound {bound:?})"
    );
}

/// Garbage collection and namespace deletion: a Deployment deleted with the default (background)
/// propagation takes its ReplicaSet, pods and instances with it; a namespace deleted with its
/// EurekaApps and pods leaves no instance behind, and waits on no finalizer.
#[tokio::test]
async fn namespace_deletion_and_garbage_collection_leave_nothing_behind() {
    let Some(cluster) = lifecycle_cluster() else { return };
    let client = cluster.admin().await;
    let ns = "lc-nsdel";
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "lc-nsdel", &[]).await;
    for (app, replicas) in [("orders", 5), ("billing", 3), ("audit", 2)] {
        eureka_app(
            cluster,
            ns,
            app,
            &format!("  selector:\n    matchLabels: {{app: {app}}}\n  port: http\n  drainSeconds: 1\n"),
        );
        apply(cluster, &deployment(ns, app, replicas, "example/app:1", "0s", 3));
    }
    // An EurekaApp that selects nothing is deleted with the namespace too.
    eureka_app(
        cluster,
        ns,
        "idle",
        "  selector:\n    matchLabels: {app: nothing}\n  port: http\n",
    );
    for (app, n) in [("ORDERS", 5), ("BILLING", 3), ("AUDIT", 2)] {
        wait_for(
            &format!("{n} UP instances of {app}"),
            Duration::from_secs(90),
            Duration::from_millis(100),
            || async {
                let i = instances(&op.server, app).await;
                (i.len() == n && i.iter().all(|(_, s)| s == "UP")).then_some(())
            },
        )
        .await;
    }
    // No EurekaApp carries a finalizer: the namespace's deletion never waits on the operator.
    let finalizers = cluster.kubectl_ok(&[
        "get",
        "ea",
        "-n",
        ns,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}:{.metadata.finalizers}{\"\\n\"}{end}",
    ]);
    assert_eq!(finalizers.lines().count(), 4, "{finalizers}");
    assert!(finalizers.lines().all(|l| l.ends_with(':')), "{finalizers}");

    // Garbage collection: the ReplicaSet and its pods follow the Deployment, and so do the instances.
    let started = Instant::now();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .delete("audit", &DeleteParams::background())
        .await
        .unwrap();
    wait_for(
        "AUDIT's instances to go with the Deployment",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { instances(&op.server, "AUDIT").await.is_empty().then_some(()) },
    )
    .await;
    let gc_instances = started.elapsed();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        "AUDIT's pods to be collected",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let list = pods
                .list(&kube::api::ListParams::default().labels("app=audit"))
                .await
                .ok()?;
            list.items.is_empty().then_some(())
        },
    )
    .await;
    let gc_pods = started.elapsed();

    // The namespace, with everything in it.
    let started = Instant::now();
    cluster.kubectl_ok(&["delete", "namespace", ns, "--wait=false"]);
    let mut deregistered = None;
    let result = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if deregistered.is_none()
                && instances(&op.server, "ORDERS").await.is_empty()
                && instances(&op.server, "BILLING").await.is_empty()
            {
                deregistered = Some(started.elapsed());
            }
            let out = cluster.kubectl().args(["get", "namespace", ns]).output().unwrap();
            if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound") {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let Ok(gone) = result else {
        let apps = cluster
            .kubectl()
            .args(["get", "ea", "-n", ns, "-o", "yaml"])
            .output()
            .unwrap();
        let namespace = cluster.kubectl_ok(&["get", "namespace", ns, "-o", "yaml"]);
        panic!(
            "namespace {ns} still there after 120 s\n--- namespace\n{namespace}\n--- EurekaApps\n{}\n--- operator\n{}\n{}",
            String::from_utf8_lossy(&apps.stdout),
            op.server.proc.log_tail(40),
            cluster.controller_logs(10)
        );
    };
    let everything = instances(&op.server, "ORDERS").await.len() + instances(&op.server, "BILLING").await.len();
    assert_eq!(everything, 0, "instances left behind");
    println!(
        "NAMESPACE_DELETION gc: instances gone {} ms, pods gone {} ms after the Deployment was deleted; \
         namespace: instances gone {} ms, namespace gone {} ms after the delete",
        ms(gc_instances),
        ms(gc_pods),
        deregistered.map(ms).unwrap_or(0),
        ms(gone)
    );
}
