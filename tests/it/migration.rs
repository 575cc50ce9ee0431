//! The migration guide (`examples/migration/`) walked step by step against real peers: a Spring
//! Cloud Eureka server with self-registered services (the real Spring client as a pod's process,
//! and clients played by the test) → two operator replicas peered both ways with it → the
//! service's EurekaApp in adopt mode (`examples/migration/eurekaapp-adopt.yaml`) → its clients'
//! `defaultZone` moved to the operator by a rolling update → Java retired (the replicas restarted
//! one at a time without `--java-peer-urls`, the server stopped) → the operator registering the
//! pods itself under the same ids (`eurekaapp-operator.yaml`). Every registry is checked at each
//! step: no instance missing, none duplicated; a watcher samples the replicas through the
//! restarts and the last switch and records any moment an instance is missing or doubled.

use std::{
    net::Ipv4Addr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::{
    eureka::{Heartbeats, JavaServer, Native, SpringClient, app_instances, http, wait_app_instances},
    operator::{
        Operator, delete_pod, finish_pod_deletion, instance, kubectl_apply, namespace, pod, prepared, set_ready,
    },
    process::{free_port, wait_for},
};

const APP: &str = "PAYMENTS";
const ADOPTED: &str = "eureka_instances{origin=\"adopted\"}";

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// Waits until `app` on the server at `base` is exactly `want` (ids with statuses, each once).
async fn wait_on(base: &str, app: &str, want: &[(&str, &str)]) {
    if let Err(last) = wait_app_instances(base, app, want, Duration::from_secs(60)).await {
        panic!("{app} at {base}: expected {want:?}, have {last:?}");
    }
}

/// Waits until every server in `bases` shows `want` for `app`.
async fn wait_all(bases: &[&str], app: &str, want: &[(&str, &str)]) {
    for base in bases {
        wait_on(base, app, want).await;
    }
}

/// An example manifest, applied to `ns` with its drain shortened for the test.
fn apply_example(cluster: &crate::common::cluster::Cluster, ns: &str, file: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/migration")
        .join(file);
    let manifest = std::fs::read_to_string(&path)
        .unwrap()
        .replace("drainSeconds: 30", "drainSeconds: 10")
        .replace(
            "metadata:\n  name: payments\n",
            &format!("metadata:\n  name: payments\n  namespace: {ns}\n"),
        );
    let (ok, out) = kubectl_apply(cluster, &manifest);
    assert!(ok, "{file}: {out}");
}

/// `(instanceId, status)` pairs, sorted.
type Instances = Vec<(String, String)>;

/// Samples the replicas that are ready, recording every moment `app` is not exactly `expected`
/// on one of them (the instances of a rolling restart or a switch must never be missing or
/// doubled for a client that asks a ready replica).
struct Watcher {
    expected: Arc<Mutex<Option<Instances>>>,
    violations: Arc<Mutex<Vec<String>>>,
    samples: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    fn start(replicas: Vec<(String, String)>, app: &'static str) -> Watcher {
        let expected: Arc<Mutex<Option<Instances>>> = Arc::default();
        let violations: Arc<Mutex<Vec<String>>> = Arc::default();
        let samples = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (e, v, n) = (expected.clone(), violations.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let http = http();
            loop {
                for (url, admin) in &replicas {
                    let Some(want) = e.lock().unwrap().clone() else { break };
                    let ready = || async {
                        http.get(format!("{admin}/readyz"))
                            .send()
                            .await
                            .is_ok_and(|r| r.status().is_success())
                    };
                    if !ready().await {
                        continue;
                    }
                    let have = app_instances(url, app).await;
                    n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // A replica stopping, or restarted on its address and not ready yet, between
                    // the requests answers nothing: not a gap. Nothing from one still ready is.
                    if have != want && !have.is_empty() {
                        v.lock().unwrap().push(format!("{url}: {have:?}"));
                    } else if have.is_empty() && ready().await {
                        v.lock().unwrap().push(format!("{url}: nothing"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Watcher {
            expected,
            violations,
            samples,
            task,
        }
    }

    fn expect(&self, want: Option<&[(&str, &str)]>) {
        *self.expected.lock().unwrap() = want.map(|w| {
            let mut w: Vec<(String, String)> = w.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            w.sort();
            w
        });
    }

    fn check(&self, phase: &str) {
        let v = self.violations.lock().unwrap().clone();
        let n = self.samples.swap(0, std::sync::atomic::Ordering::Relaxed);
        println!("MIGRATION {phase}: {n} samples of the ready replicas, {} off", v.len());
        assert!(n > 0, "{phase}: no sample taken");
        assert!(v.is_empty(), "{phase}: {v:?}");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_guide_moves_a_spring_service_off_java_eureka_with_no_gap_and_no_duplicate() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "migration";
    namespace(&client, ns).await;
    let (ip0, ip1, java_ip) = (ip(241), ip(242), ip(243));
    let (p0, p1, java_port) = (free_port(ip0), free_port(ip1), free_port(java_ip));
    let url0 = format!("http://{ip0}:{p0}/eureka/");
    let url1 = format!("http://{ip1}:{p1}/eureka/");
    let java_url = format!("http://{java_ip}:{java_port}/eureka/");

    // === 0. Java Eureka, with the service registering itself from its pods ===
    // java-eureka-server.yml: the operator's Service URL among the peers, `my-url` set. (A single
    // Java server here: it knows the operator from the start instead of being restarted.)
    let flags: Vec<String> = [
        "--spring.application.name=eureka-server".to_string(),
        "--eureka.client.register-with-eureka=false".into(),
        "--eureka.client.fetch-registry=true".into(),
        format!("--eureka.client.service-url.defaultZone={url0}"),
        format!("--eureka.server.my-url={java_url}"),
        "--eureka.server.peer-eureka-nodes-update-interval-ms=1000".into(),
        "--eureka.server.registry-sync-retries=1".into(),
        "--eureka.server.registry-sync-retry-wait-ms=500".into(),
        "--eureka.server.enable-self-preservation=false".into(),
    ]
    .into();
    let Some(mut java) = JavaServer::start_on(java_ip, java_port, &flags).await else {
        return;
    };
    let pod_ip = |n: u8| ip(244 + n);
    let spring_port = |n: u8| free_port(pod_ip(n));
    let (port0, port2) = (spring_port(0), spring_port(2));
    for (n, port) in [(0u8, i32::from(port0)), (1, 8080)] {
        let name = format!("payments-{n}");
        pod(&client, ns, &name, &[("app", "payments")], &[("http", port)], "node-1").await;
        set_ready(&client, ns, &name, &pod_ip(n).to_string(), true).await;
    }
    // Spring's default ids in pods named payments-0 and payments-1.
    let id0 = format!("payments-0:payments:{port0}");
    let id1 = "payments-1:payments:8080".to_string();
    let Some(mut spring0) = SpringClient::start_on(pod_ip(0), port0, &java_url, "payments", &id0, &[]).await else {
        return;
    };
    let played1 = Native::new(&java_url, APP, &id1)
        .lease(3, 1)
        .at(&pod_ip(1).to_string(), 8080);
    assert_eq!(played1.register().await, 204);
    let beats1 = Heartbeats::start(vec![played1.clone()], Duration::from_millis(300));
    // A service outside Kubernetes, on Java too.
    let legacy = Native::new(&java_url, "LEGACY", "legacy-1").lease(3, 1);
    assert_eq!(legacy.register().await, 204);
    let legacy_beats = Heartbeats::start(vec![legacy.clone()], Duration::from_millis(300));
    let before = [(id0.as_str(), "UP"), (id1.as_str(), "UP")];
    wait_on(&java_url, APP, &before).await;
    wait_on(&java_url, "LEGACY", &[("legacy-1", "UP")]).await;

    // === 1-3. Two operator replicas, peered both ways with Java (values.yaml: javaPeerUrls,
    // leaseExpiry: java) ===
    let common = |peer: &str| -> Vec<String> {
        [
            "--peer-urls",
            peer,
            "--lease-expiry",
            "java",
            "--java-peer-heartbeat-interval-ms",
            "1000",
            "--replication-max-batching-delay-ms",
            "20",
            "--eviction-interval-timer-in-ms",
            "1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let with_java = |peer: &str| -> Vec<String> {
        let mut f = common(peer);
        f.extend(["--java-peer-urls".to_string(), java_url.clone()]);
        f
    };
    let admin_ports = (free_port(ip0), free_port(ip1));
    let start = |n: usize, flags: Vec<String>| {
        let (ip, port, admin) = if n == 0 {
            (ip0, p0, admin_ports.0)
        } else {
            (ip1, p1, admin_ports.1)
        };
        async move {
            let args: Vec<&str> = flags.iter().map(String::as_str).collect();
            Operator::start_on(cluster, ip, (port, admin), ns, "migration", &format!("ours-{n}"), &args).await
        }
    };
    let ours0 = start(0, with_java(&url1)).await;
    let ours1 = start(1, with_java(&url0)).await;
    let all = [url0.as_str(), url1.as_str(), java_url.as_str()];
    // Copied from Java at start, and kept up by Java's replication: nothing missing or doubled.
    wait_all(&all, APP, &before).await;
    wait_all(&all, "LEGACY", &[("legacy-1", "UP")]).await;

    // === 4. The service's EurekaApp, adopting its pods' registrations ===
    apply_example(cluster, ns, "eurekaapp-adopt.yaml");
    // Both registrations adopted on every replica.
    for op in [&ours0, &ours1] {
        op.server.wait_metric(ADOPTED, 2.0).await;
    }
    wait_all(&all, APP, &before).await;
    // The pod decides, on every replica (each from its own watch) and on Java (from the leader).
    set_ready(&client, ns, "payments-1", &pod_ip(1).to_string(), false).await;
    wait_all(&all, APP, &[(id0.as_str(), "UP"), (id1.as_str(), "STARTING")]).await;
    set_ready(&client, ns, "payments-1", &pod_ip(1).to_string(), true).await;
    wait_all(&all, APP, &before).await;
    // The leader keeps Java's copy alive as it does a pod instance's: with the Spring client
    // frozen (no heartbeats anywhere), a service with the same lease that also went silent at
    // that moment is evicted by Java, and the adopted one is not.
    let control = Native::new(&java_url, "CONTROL", "control-1").lease(3, 1);
    assert_eq!(control.register().await, 204);
    let control_beats = Heartbeats::start(vec![control.clone()], Duration::from_millis(300));
    wait_on(&java_url, "CONTROL", &[("control-1", "UP")]).await;
    spring0.proc.freeze();
    control_beats.stop();
    wait_on(&java_url, "CONTROL", &[]).await;
    wait_all(&all, APP, &before).await;
    spring0.proc.resume();

    // === 5. Clients move to the operator: a rolling update whose new pods' clients use it ===
    for (n, port) in [(2u8, i32::from(port2)), (3, 8080)] {
        let name = format!("payments-{n}");
        pod(&client, ns, &name, &[("app", "payments")], &[("http", port)], "node-1").await;
        set_ready(&client, ns, &name, &pod_ip(n).to_string(), true).await;
    }
    let id2 = format!("payments-2:payments:{port2}");
    let id3 = "payments-3:payments:8080".to_string();
    let zone = format!("{url0},{url1}");
    let Some(spring2) = SpringClient::start_on(pod_ip(2), port2, &zone, "payments", &id2, &[]).await else {
        return;
    };
    let played3 = Native::new(&url0, APP, &id3)
        .lease(3, 1)
        .at(&pod_ip(3).to_string(), 8080);
    assert_eq!(played3.register().await, 204);
    let _beats3 = Heartbeats::start(vec![played3.clone()], Duration::from_millis(300));
    let four = [
        (id0.as_str(), "UP"),
        (id1.as_str(), "UP"),
        (id2.as_str(), "UP"),
        (id3.as_str(), "UP"),
    ];
    wait_all(&all, APP, &four).await;
    // The old pods go: OUT_OF_SERVICE everywhere at once; their clients cancel on Java as they
    // stop, which reaches the operator too.
    delete_pod(&client, ns, "payments-0").await;
    delete_pod(&client, ns, "payments-1").await;
    let draining = [
        (id0.as_str(), "OUT_OF_SERVICE"),
        (id1.as_str(), "OUT_OF_SERVICE"),
        (id2.as_str(), "UP"),
        (id3.as_str(), "UP"),
    ];
    wait_all(&all, APP, &draining).await;
    spring0.proc.terminate(Duration::from_secs(20));
    beats1.stop();
    // (404 if the drain ended first: the operator then cancelled it on Java itself.)
    assert!([200, 404].contains(&played1.cancel().await));
    let after = [(id2.as_str(), "UP"), (id3.as_str(), "UP")];
    wait_all(&all, APP, &after).await;
    // Their processes stopped, the kubelet removes the old pods.
    finish_pod_deletion(&client, ns, "payments-0").await;
    finish_pod_deletion(&client, ns, "payments-1").await;
    // The service outside moves too: its heartbeats go to the operator, which has it already.
    drop(legacy_beats);
    let _legacy_beats = Heartbeats::start(vec![legacy.on(&url0)], Duration::from_millis(300));
    wait_all(&all, "LEGACY", &[("legacy-1", "UP")]).await;

    // === 6. Java retired: `javaPeerUrls` removed (a rolling restart), the Java server stopped ===
    let watcher = Watcher::start(
        vec![
            (url0.clone(), ours0.server.admin()),
            (url1.clone(), ours1.server.admin()),
        ],
        APP,
    );
    watcher.expect(Some(&after));
    drop(ours1);
    let ours1 = start(1, common(&url0)).await;
    wait_on(&url1, APP, &after).await;
    drop(ours0);
    let ours0 = start(0, common(&url1)).await;
    wait_on(&url0, APP, &after).await;
    java.proc.terminate(Duration::from_secs(20));
    let ours = [url0.as_str(), url1.as_str()];
    wait_all(&ours, APP, &after).await;
    wait_all(&ours, "LEGACY", &[("legacy-1", "UP")]).await;
    // The new pods' registrations adopted on the restarted replicas.
    for op in [&ours0, &ours1] {
        op.server.wait_metric(ADOPTED, 2.0).await;
    }
    watcher.check("rolling restart without Java");
    // The Spring client sees the same through the operator.
    let mut seen_want: Vec<(String, String)> = after.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    seen_want.sort();
    wait_for(
        "the Spring client to see the service",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (spring2.seen_all(APP).await == seen_want).then_some(()) },
    )
    .await;

    // === 7. The operator registers the pods itself, under the same ids: no gap, no duplicate ===
    apply_example(cluster, ns, "eurekaapp-operator.yaml");
    // Pod instances in place of the adopted registrations.
    for op in [&ours0, &ours1] {
        op.server.wait_metric("eureka_instances{origin=\"pod\"}", 2.0).await;
        assert_eq!(op.server.metric(ADOPTED).await, Some(0.0));
    }
    watcher.check("switch to registration: Operator");
    let i = instance(&ours0.server, APP, &id2).await.unwrap();
    assert_eq!(i["metadata"]["k8s.owner"], "eureka-operator", "{i}");
    assert_eq!(i["ipAddr"], pod_ip(2).to_string());
    // The clients still running are harmless: their heartbeats are acknowledged.
    wait_all(&ours, APP, &after).await;
    let stats = spring2.stats().await;
    println!("MIGRATION spring client stats at the end: {stats}");
    drop(watcher);
}
