//! The operator as users install it: the image `.ci/image` builds, run by real kubelets (two real
//! nodes, see [`RealCluster`]) from the chart with its defaults, only the image reference pointed
//! at the local image. `helm install`, `helm upgrade` under load, a killed container, SIGTERM,
//! `helm uninstall`, basic auth with TLS, and replicas started together.
//!
//! The cluster has no DNS server; a pod that needs the client Service's name gets it through
//! `hostAliases` (its ClusterIP), which is what a cluster's DNS would answer. Everything else
//! (probes, the Service's kube-proxy rules, EndpointSlice discovery between replicas, the Lease,
//! pod IPs) is Kubernetes' own. The tests run one at a time ([`RealCluster::exclusive`]): each
//! installs the chart's cluster-wide parts under the same release.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::common::{eureka::http, process::wait_for, real_nodes::RealCluster};

const NS: &str = "eureka-system";
const RELEASE: &str = "eo";
const FULLNAME: &str = "eo-eureka-operator";
const APPS: &str = "shop";

/// An operator pod: name, IP, Ready, restarts.
type Replica = (String, String, bool, u32);
/// A full registry: `(APP, instance id) → (status, IP)`.
type Registry = BTreeMap<(String, String), (String, String)>;

fn image_args(cluster: &RealCluster) -> Vec<String> {
    let (repo, tag) = cluster
        .operator_image
        .1
        .rsplit_once(':')
        .expect("an image name with a tag");
    vec![
        "--set".into(),
        format!("image.repository={repo}"),
        "--set".into(),
        format!("image.tag={tag}"),
    ]
}

/// `helm install` (or `upgrade --install`) of the chart with `values` on top of the image.
fn install(cluster: &RealCluster, verb: &str, values: &[&str]) -> Duration {
    let chart = format!("{}/charts/eureka-operator", env!("CARGO_MANIFEST_DIR"));
    let mut args: Vec<String> = vec![verb.into(), RELEASE.into(), chart, "-n".into(), NS.into()];
    match verb {
        "install" => args.push("--create-namespace".into()),
        "upgrade" => args.push("--install".into()),
        _ => {}
    }
    args.extend(image_args(cluster));
    for v in values {
        args.push("--set".into());
        args.push((*v).into());
    }
    let started = Instant::now();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    cluster.helm_ok(&refs);
    started.elapsed()
}

/// Removes what an earlier test left: the release, the test namespaces.
fn clean(cluster: &RealCluster, namespaces: &[&str]) {
    let _ = cluster.helm(&["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "60s"]);
    for ns in namespaces {
        let _ = cluster
            .kubectl()
            .args(["delete", "namespace", ns, "--ignore-not-found", "--timeout=60s"])
            .output();
    }
}

/// The operator's pods: `(name, ip, ready, restarts)`.
fn operator_pods(cluster: &RealCluster) -> Vec<Replica> {
    let out = cluster.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/name=eureka-operator",
        "-o",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).expect("pods as JSON");
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let restarts = p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .unwrap_or(0) as u32;
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                p["status"]["podIP"].as_str().unwrap_or("").to_string(),
                ready,
                restarts,
            )
        })
        .collect()
}

/// Waits until `n` operator pods are Ready; returns them.
async fn ready_replicas(cluster: &RealCluster, n: usize, timeout: Duration) -> Vec<Replica> {
    let started = Instant::now();
    loop {
        let pods = operator_pods(cluster);
        if pods.len() == n && pods.iter().all(|p| p.2) {
            return pods;
        }
        assert!(
            started.elapsed() < timeout,
            "{n} ready operator replicas not seen in {timeout:?}: {pods:?}\n{}\n{}",
            cluster.kubectl_ok(&["get", "pods", "-A", "-o", "wide"]),
            cluster.kubectl_ok(&["get", "events", "-n", NS, "--sort-by=.lastTimestamp"])
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A namespace with a Deployment of the hello app (real containers) and an EurekaApp for it.
fn deploy_hello(cluster: &RealCluster, namespace: &str, replicas: u32) {
    cluster.apply(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: hello, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: hello}}}}
  template:
    metadata: {{labels: {{app: hello}}}}
    spec:
      containers:
      - name: hello
        image: localhost/eo-hello:1
        imagePullPolicy: Never
        ports: [{{name: http, containerPort: 8080}}]
        env:
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
        readinessProbe: {{httpGet: {{path: /healthz, port: http}}, periodSeconds: 1}}
        securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {{drop: [ALL]}}}}
---
apiVersion: eureka-operator.dev/v1alpha1
kind: EurekaApp
metadata: {{name: hello, namespace: {namespace}}}
spec:
  selector: {{matchLabels: {{app: hello}}}}
  port: http
"#
    ));
}

/// The running, ready pods of the hello app: `name → IP`.
fn hello_pods(cluster: &RealCluster, namespace: &str) -> BTreeMap<String, String> {
    let out = cluster.kubectl_ok(&["get", "pods", "-n", namespace, "-l", "app=hello", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).expect("pods as JSON");
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                p["status"]["podIP"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Every instance of every application in a full registry answer: `(APP, id) → (status, ip)`.
fn registry(body: &Value) -> Registry {
    let mut out = BTreeMap::new();
    let apps = &body["applications"]["application"];
    let apps: Vec<&Value> = match apps {
        Value::Array(a) => a.iter().collect(),
        Value::Object(_) => vec![apps],
        _ => Vec::new(),
    };
    for app in apps {
        let instances: Vec<&Value> = match &app["instance"] {
            Value::Array(a) => a.iter().collect(),
            v @ Value::Object(_) => vec![v],
            _ => Vec::new(),
        };
        for i in instances {
            out.insert(
                (
                    app["name"].as_str().unwrap_or("").to_string(),
                    i["instanceId"].as_str().unwrap_or("").to_string(),
                ),
                (
                    i["status"].as_str().unwrap_or("").to_string(),
                    i["ipAddr"].as_str().unwrap_or("").to_string(),
                ),
            );
        }
    }
    out
}

/// A full fetch from one replica, straight to its pod IP.
async fn fetch(base: &str) -> Option<Registry> {
    let r = http()
        .get(format!("{base}apps/"))
        .header("Accept", "application/json")
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    Some(registry(&r.json().await.ok()?))
}

/// The python-client app in a pod: registers as POD-CLIENT through the chart's client Service
/// (its name resolved by `hostAliases`) and calls HELLO every second. With `ca_config_map`, it
/// trusts the CA in that ConfigMap's `ca.crt` (`SSL_CERT_FILE`).
fn run_python_client(cluster: &RealCluster, namespace: &str, server: &str, ca_config_map: Option<&str>) {
    let service_ip = cluster.kubectl_ok(&["get", "svc", FULLNAME, "-n", NS, "-o", "jsonpath={.spec.clusterIP}"]);
    let (ca_env, ca_mount, ca_volume) = match ca_config_map {
        Some(cm) => (
            "    - {name: SSL_CERT_FILE, value: /ca/ca.crt}\n".to_string(),
            "    volumeMounts: [{name: ca, mountPath: /ca, readOnly: true}]\n".to_string(),
            format!("  volumes: [{{name: ca, configMap: {{name: {cm}}}}}]\n"),
        ),
        None => Default::default(),
    };
    cluster.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {namespace}}}
spec:
  hostAliases: [{{ip: "{service_ip}", hostnames: [{FULLNAME}.{NS}.svc]}}]
  containers:
  - name: client
    image: localhost/eo-python-client:1
    imagePullPolicy: Never
    args: ["--server", "{server}", "--call", "HELLO"]
    env:
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
{ca_env}    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {{drop: [ALL]}}}}
{ca_mount}{ca_volume}"#
    ));
}

/// The python client's JSON lines so far.
fn client_events(cluster: &RealCluster, namespace: &str) -> Vec<Value> {
    cluster
        .logs(namespace, "client", "client", false)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the client in a pod has called every hello pod by the address Eureka gave it;
/// returns the pod names it reached.
async fn client_reaches_every_hello_pod(cluster: &RealCluster, namespace: &str) -> BTreeSet<String> {
    let want: BTreeSet<String> = hello_pods(cluster, namespace).into_keys().collect();
    let started = Instant::now();
    loop {
        let events = client_events(cluster, namespace);
        let reached: BTreeSet<String> = events
            .iter()
            .filter(|e| e["event"] == "call" && e["ok"] == true)
            .filter_map(|e| e["body"]["pod"].as_str().map(str::to_string))
            .collect();
        if reached.is_superset(&want) {
            return reached;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the client in a pod did not reach every hello pod {want:?} in 90 s (reached {reached:?}); last lines:\n{}",
            events
                .iter()
                .rev()
                .take(6)
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When a replica's log says its watches listed and when it says it is complete (ms since the
/// epoch, from the JSON logs' timestamps).
fn listed_and_complete(log: &str) -> (Option<i64>, Option<i64>) {
    let at = |needle: &str| {
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["fields"]["message"].as_str() == Some(needle))
            .and_then(|v| v["timestamp"].as_str().map(str::to_string))
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_millisecond())
    };
    (
        at("every watch has listed: reconciling"),
        at("the registry is complete: answering fetches and reporting ready"),
    )
}

/// #27.2: replicas started together, each complete within 2 s of its watches listing and none
/// waiting on a peer (from their logs); prints the figures under `what`.
fn assert_started_together(cluster: &RealCluster, pods: &[Replica], what: &str) {
    for (name, _, _, restarts) in pods {
        assert_eq!(*restarts, 0, "{name} restarted");
        let log = cluster.logs(NS, name, "eureka-operator", false);
        let (listed, complete) = listed_and_complete(&log);
        let (listed, complete) = (listed.expect("watches listed"), complete.expect("complete"));
        eprintln!(
            "FIGURES {what}: {name} complete {} ms after its watches listed",
            complete - listed
        );
        assert!(
            complete - listed <= 2_000,
            "{name} was complete {} ms after its watches listed (bound 2 s):\n{log}",
            complete - listed
        );
        assert!(!log.contains("congested"), "{name} waited on a peer:\n{log}");
    }
}

/// Waits until `n` hello pods are Ready in `namespace`; returns them (name → IP).
async fn hello_ready(cluster: &RealCluster, namespace: &str, n: usize) -> BTreeMap<String, String> {
    wait_for(
        &format!("{n} ready hello pods"),
        Duration::from_secs(90),
        Duration::from_millis(250),
        || async {
            let p = hello_pods(cluster, namespace);
            (p.len() == n).then_some(p)
        },
    )
    .await
}

/// Waits until `holds` is true of the registry of every replica in `pods` (fetched at its IP).
async fn on_every_replica(pods: &[Replica], what: &str, holds: impl Fn(&Registry) -> bool) {
    for (name, ip, _, _) in pods {
        let base = format!("http://{ip}:8761/eureka/");
        wait_for(
            &format!("{what} on {name}"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                let base = base.clone();
                let holds = &holds;
                async move { fetch(&base).await.filter(|reg| holds(reg)).map(|_| ()) }
            },
        )
        .await;
    }
}

/// #21.3 and #27.2: the chart's defaults on real nodes. Both replicas start from the image, pass
/// the probes, are complete within 2 s of their watches listing (neither waits on the other),
/// find each other through the headless Service, elect one Lease holder; an EurekaApp registers
/// a Deployment's real pod IPs; a py-eureka-client app in a pod fetches through the client
/// Service and reaches those pods. One scenario, in order: each step needs the one before.
async fn helm_install_with_defaults_serves_real_pods_to_a_client_in_a_pod() {
    let Some(cluster) = RealCluster::shared() else { return };
    let _turn = RealCluster::exclusive().await;
    clean(cluster, &[APPS]);

    let took = install(cluster, "install", &[]);
    let pods = ready_replicas(cluster, 2, Duration::from_secs(120)).await;
    eprintln!("FIGURES install: helm install {took:?}, 2 replicas Ready {pods:?}");
    assert_started_together(cluster, &pods, "install");

    // One Lease holder, and the leader gauge agrees. An earlier install's Lease outlives
    // `helm uninstall` (nothing owns it, and its holder loses its RBAC before it stops, so it
    // cannot release it): a new replica takes it within the lease's 15 s.
    let asked = Instant::now();
    let holder = loop {
        let holder = cluster.kubectl_ok(&[
            "get",
            "lease",
            FULLNAME,
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.holderIdentity}",
            "--ignore-not-found",
        ]);
        if pods.iter().any(|p| p.0 == holder) {
            break holder;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(25),
            "holder {holder:?} is not a replica 25 s after both were Ready"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!(
        "FIGURES install: {holder} held the Lease {:?} after both replicas were Ready",
        asked.elapsed()
    );
    let mut leaders = 0;
    for (_, ip, _, _) in &pods {
        let metrics = http()
            .get(format!("http://{ip}:8080/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .unwrap();
        leaders += metrics.lines().filter(|l| l.trim() == "eureka_leader 1").count();
    }
    assert_eq!(leaders, 1, "exactly one replica leads");

    deploy_hello(cluster, APPS, 2);
    let hello = hello_ready(cluster, APPS, 2).await;
    // Every replica registers the real pod IPs, UP.
    on_every_replica(&pods, "HELLO's pod IPs", |reg| {
        let got: BTreeMap<String, String> = reg
            .iter()
            .filter(|((app, _), (status, _))| app == "HELLO" && status == "UP")
            .map(|((_, id), (_, ip))| (id.split('.').next().unwrap_or("").to_string(), ip.clone()))
            .collect();
        got == hello
    })
    .await;

    // A real client in a pod, through the Service, reaches every hello pod at its registered IP.
    let server = format!("http://{FULLNAME}.{NS}.svc:8761/eureka");
    run_python_client(cluster, APPS, &server, None);
    let reached = client_reaches_every_hello_pod(cluster, APPS).await;
    eprintln!("FIGURES install: the client in a pod reached {reached:?}");
    // Its own registration reached one replica through the Service and was replicated to the
    // other (the replicas found each other through the headless Service).
    let client = ("POD-CLIENT".to_string(), "client".to_string());
    on_every_replica(&pods, "POD-CLIENT", |reg| reg.contains_key(&client)).await;
    clean(cluster, &[APPS]);
}

/// What a client polling the client Service saw.
#[derive(Debug, Default)]
struct Polled {
    /// Full registries (200, parsed, holding every instance that was UP before).
    full: usize,
    /// 503 with `Retry-After`: a replica that is not complete yet (clients try another).
    retry_later: usize,
    /// Connections refused (or not accepted in time).
    refused: usize,
    /// Anything else: other statuses, unreadable bodies, broken connections.
    bad: Vec<String>,
    /// Full registries missing an instance that was UP before (or showing it not UP).
    misses: Vec<String>,
}

/// Polls `GET apps/` on the client Service every 100 ms (keep-alive, as Eureka clients do) until
/// `stop` is set; `expected` were UP before it started.
async fn poll_service(
    url: String,
    expected: BTreeSet<(String, String)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Polled {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let mut seen = Polled::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tick.tick().await;
        let at = clock();
        let answer = client
            .get(format!("{url}apps/"))
            .header("Accept", "application/json")
            .send()
            .await;
        let r = match answer {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                seen.refused += 1;
                seen.bad.push(format!("{at}: refused: {e}"));
                continue;
            }
            Err(e) => {
                seen.bad.push(format!("{at}: {e:?}"));
                continue;
            }
        };
        let status = r.status();
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE && r.headers().contains_key("retry-after") {
            seen.retry_later += 1;
            continue;
        }
        if !status.is_success() {
            seen.bad.push(format!("{at}: status {status}"));
            continue;
        }
        match r.json::<Value>().await {
            Ok(body) => {
                let reg = registry(&body);
                for key in &expected {
                    match reg.get(key) {
                        Some((s, _)) if s == "UP" => {}
                        other => seen.misses.push(format!("{at}: {key:?} {other:?}")),
                    }
                }
                seen.full += 1;
            }
            Err(e) => seen.bad.push(format!("{at}: unreadable body: {e}")),
        }
    }
    seen
}

/// Wall-clock time for the poller's notes (seconds.millis of the minute).
fn clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{}.{:03}", (ms / 1000) % 3600, ms % 1000)
}

/// The chart's rollout parameters as Kubernetes sees them: non-terminating operator pods, and
/// how many of them are Ready.
fn rollout_sample(cluster: &RealCluster) -> (usize, usize) {
    let pods = operator_pods(cluster);
    (pods.len(), pods.iter().filter(|p| p.2).count())
}

/// What every replica must hold before a disruption: the hello pods and the client's own
/// registration, UP.
async fn up_everywhere(cluster: &RealCluster) -> BTreeSet<(String, String)> {
    let hello = hello_pods(cluster, APPS);
    let mut want: BTreeSet<(String, String)> = hello
        .keys()
        .map(|pod| ("HELLO".to_string(), format!("{pod}.{APPS}:hello:8080")))
        .collect();
    want.insert(("POD-CLIENT".into(), "client".into()));
    on_every_replica(&operator_pods(cluster), "every instance UP", |reg| {
        want.iter().all(|k| reg.get(k).is_some_and(|(s, _)| s == "UP"))
    })
    .await;
    want
}

/// #21.4 and #27.1: `helm upgrade` with a value that rolls the operator's pods, while a client
/// polls the client Service every 100 ms: the replicas roll one at a time (never more than one
/// extra pod, never fewer Ready than replicas), and the client sees no refused connection, no
/// answer that is neither a full registry nor a 503 with `Retry-After`, and no registry missing
/// an instance that was UP before. Then a killed container (kill -9 of its process): the kubelet
/// restarts it, and every fetch it answers before and after Ready is complete; and a deleted pod
/// exits within its shutdown delay plus 2 s.
async fn helm_upgrade_and_container_faults_lose_nothing_and_refuse_no_client() {
    let Some(cluster) = RealCluster::shared() else { return };
    let _turn = RealCluster::exclusive().await;
    clean(cluster, &[APPS]);
    install(cluster, "install", &[]);
    ready_replicas(cluster, 2, Duration::from_secs(120)).await;
    deploy_hello(cluster, APPS, 2);
    hello_ready(cluster, APPS, 2).await;
    run_python_client(cluster, APPS, &format!("http://{FULLNAME}.{NS}.svc:8761/eureka"), None);
    let expected = up_everywhere(cluster).await;

    // The client Service by its ClusterIP, through kube-proxy on node 1.
    let service_ip = cluster.kubectl_ok(&["get", "svc", FULLNAME, "-n", NS, "-o", "jsonpath={.spec.clusterIP}"]);
    let url = format!("http://{}:8761/eureka/", service_ip.trim());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = tokio::spawn(poll_service(url, expected.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = Instant::now();
    install(cluster, "upgrade", &["eureka.logLevel=debug"]);
    let mut watch_rollout = cluster.kubectl();
    watch_rollout.args(["rollout", "status", "deployment", FULLNAME, "-n", NS, "--timeout=240s"]);
    let mut rollout = tokio::task::spawn_blocking(move || watch_rollout.output().expect("kubectl rollout status"));
    let (mut most, mut fewest_ready) = (0, usize::MAX);
    let status = loop {
        tokio::select! {
            done = &mut rollout => break done.expect("rollout status"),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let (pods, ready) = rollout_sample(cluster);
                most = most.max(pods);
                fewest_ready = fewest_ready.min(ready);
            }
        }
    };
    let rolled = started.elapsed();
    assert!(
        status.status.success(),
        "rollout: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    // The old pods drain after the rollout is reported done: keep polling through it.
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let polled = poller.await.expect("the poller");
    eprintln!(
        "FIGURES upgrade: rollout of 2 replicas {rolled:?}; at most {most} pods, at least {fewest_ready} Ready; \
         polled every 100 ms: {} full registries, {} 503 with Retry-After, {} refused, {} other, {} misses",
        polled.full,
        polled.retry_later,
        polled.refused,
        polled.bad.len(),
        polled.misses.len()
    );
    assert!(
        most <= 3 && fewest_ready >= 2,
        "not one at a time: {most} pods, {fewest_ready} Ready"
    );
    assert_eq!(polled.refused, 0, "refused connections: {:?}", polled.bad);
    assert!(polled.bad.is_empty(), "answers that are neither: {:?}", polled.bad);
    assert!(
        polled.misses.is_empty(),
        "registries missing an instance that was UP: {:?}",
        polled.misses
    );
    assert!(polled.full > 50, "the poller saw too few answers: {polled:?}");

    // kill -9 of one replica's process: restarted by the kubelet, complete before it is Ready.
    let pods = ready_replicas(cluster, 2, Duration::from_secs(60)).await;
    let (victim, ip, _, _) = pods[0].clone();
    let pid = cluster.container_pid(NS, &victim, "eureka-operator");
    // SAFETY: kill(2) of a process of this test's own container.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed = Instant::now();
    let base = format!("http://{ip}:8761/eureka/");
    let (mut early, mut complete_answers) = (0, 0);
    let back = loop {
        match http()
            .get(format!("{base}apps/"))
            .header("Accept", "application/json")
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => {
                let reg = registry(&r.json().await.expect("a registry"));
                let missing: Vec<_> = expected.iter().filter(|k| !reg.contains_key(*k)).collect();
                assert!(missing.is_empty(), "a 200 fetch after the restart lacked {missing:?}");
                complete_answers += 1;
            }
            Ok(r) => {
                assert_eq!(r.status(), 503, "while starting");
                early += 1;
            }
            Err(_) => early += 1,
        }
        let pods = operator_pods(cluster);
        if let Some(p) = pods.iter().find(|p| p.0 == victim)
            && p.2
            && p.3 == 1
        {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(90),
            "not restarted and Ready in 90 s: {pods:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let previous = cluster.logs(NS, &victim, "eureka-operator", true);
    assert!(!previous.is_empty(), "the killed container's log is kept");
    eprintln!(
        "FIGURES kill -9: {victim} restarted and Ready {back:?} after the kill; {early} fetches refused or 503 \
         while starting, {complete_answers} complete answers"
    );

    // A deleted pod (SIGTERM from the kubelet): not Ready at once, gone within its shutdown
    // delay (5 s by default) plus 2 s.
    let deleted = Instant::now();
    cluster.kubectl_ok(&["delete", "pod", &victim, "-n", NS, "--wait=true", "--timeout=60s"]);
    let gone = deleted.elapsed();
    eprintln!("FIGURES delete pod: {victim} gone {gone:?} after the delete (shutdown delay 5 s)");
    assert!(gone < Duration::from_secs(9), "{victim} took {gone:?} to stop");
    ready_replicas(cluster, 2, Duration::from_secs(90)).await;
    clean(cluster, &[APPS]);
}

/// Whether a namespace is gone.
fn namespace_gone(cluster: &RealCluster, ns: &str) -> bool {
    let out = cluster
        .kubectl()
        .args(["get", "namespace", ns])
        .output()
        .expect("kubectl");
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound")
}

/// The UP HELLO instances of namespace `ns` in a registry.
fn hello_instances_in(reg: &Registry, ns: &str) -> usize {
    reg.iter()
        .filter(|((app, id), (status, _))| app == "HELLO" && id.contains(&format!(".{ns}:")) && status == "UP")
        .count()
}

/// #21.5: `helm uninstall` leaves nothing stuck. EurekaApps carry no finalizer (the one an
/// earlier version added is removed by the leader), so once the operator is gone, deleting
/// namespaces that hold EurekaApps and pods finishes within 30 s; the CRD and the other
/// EurekaApps stay, and installing again registers their pods again.
async fn helm_uninstall_leaves_nothing_stuck_and_a_new_install_takes_everything_back() {
    let Some(cluster) = RealCluster::shared() else { return };
    let _turn = RealCluster::exclusive().await;
    let (a, b, kept) = ("uninst-a", "uninst-b", "uninst-kept");
    clean(cluster, &[APPS, a, b, kept]);
    install(cluster, "install", &[]);
    let pods = ready_replicas(cluster, 2, Duration::from_secs(120)).await;
    for ns in [a, b, kept] {
        deploy_hello(cluster, ns, 1);
    }
    // As a version before 0.2 left it: its finalizer on.
    cluster.kubectl_ok(&[
        "patch",
        "ea",
        "hello",
        "-n",
        a,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["eureka-operator.dev/deregister"]}}"#,
    ]);
    on_every_replica(&pods, "a pod of each namespace", |reg| {
        [a, b, kept].iter().all(|ns| hello_instances_in(reg, ns) == 1)
    })
    .await;
    wait_for(
        "the old finalizer removed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let f = cluster.kubectl_ok(&["get", "ea", "hello", "-n", a, "-o", "jsonpath={.metadata.finalizers}"]);
            f.trim().is_empty().then_some(())
        },
    )
    .await;

    cluster.helm_ok(&["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "60s"]);
    assert!(operator_pods(cluster).is_empty(), "operator pods left");
    let crd = cluster.kubectl_ok(&["get", "crd", "eurekaapps.eureka-operator.dev", "-o", "name"]);
    assert!(!crd.trim().is_empty(), "the CRD is kept");
    let deleted = Instant::now();
    for ns in [a, b] {
        cluster.kubectl_ok(&["delete", "namespace", ns, "--wait=false"]);
    }
    let gone = wait_for(
        "the namespaces to go",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async {
            [a, b]
                .iter()
                .all(|ns| namespace_gone(cluster, ns))
                .then(|| deleted.elapsed())
        },
    )
    .await;
    let left = cluster.kubectl_ok(&[
        "get",
        "ea",
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}",
    ]);
    assert_eq!(left.trim(), format!("{kept}/hello"), "EurekaApps left");

    install(cluster, "install", &[]);
    let pods = ready_replicas(cluster, 2, Duration::from_secs(120)).await;
    on_every_replica(&pods, &format!("{kept}'s pod again"), |reg| {
        hello_instances_in(reg, kept) == 1
    })
    .await;
    eprintln!("FIGURES uninstall: namespaces with EurekaApps gone {gone:?} after the delete, the operator uninstalled");
    clean(cluster, &[kept]);
}

/// A CA and a certificate for the client Service's name, as a `kubernetes.io/tls` Secret with
/// `ca.crt` (what cert-manager writes); returns the CA's PEM.
fn tls_secret(cluster: &RealCluster, name: &str) -> String {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "eureka-operator real-node CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let service = format!("{FULLNAME}.{NS}.svc");
    let mut server = CertificateParams::new(vec![service.clone(), format!("{service}.cluster.local")]).unwrap();
    server.distinguished_name.push(DnType::CommonName, &service);
    let key = KeyPair::generate().unwrap();
    let cert = server.signed_by(&key, &issuer).unwrap();
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\n\
         metadata: {{name: {name}, namespace: {NS}}}\ndata:\n  tls.crt: {}\n  tls.key: {}\n  ca.crt: {}\n",
        b64(&cert.pem()),
        b64(&key.serialize_pem()),
        b64(&ca_pem)
    ));
    ca_pem
}

/// #21.3 with `basicAuth` and `tls` on, and #27.2 with three replicas: three replicas started
/// together are complete within 2 s of their watches listing, replicate to each other over HTTPS
/// with the peer credentials, refuse a client without credentials, and a py-eureka-client app in a
/// pod (the CA through `SSL_CERT_FILE`, the password in its URL) reaches the hello pods.
async fn three_replicas_with_basic_auth_and_tls_start_together_and_serve_a_client_in_a_pod() {
    let Some(cluster) = RealCluster::shared() else { return };
    let _turn = RealCluster::exclusive().await;
    clean(cluster, &[APPS]);
    let ca = tls_secret(cluster, "eo-tls");
    install(
        cluster,
        "install",
        &[
            "replicaCount=3",
            "basicAuth.enabled=true",
            "basicAuth.password=client-secret",
            "basicAuth.peerCredentials=true",
            "basicAuth.peerPassword=peer-secret",
            "tls.enabled=true",
            "tls.secretName=eo-tls",
        ],
    );
    let pods = ready_replicas(cluster, 3, Duration::from_secs(120)).await;
    assert_started_together(cluster, &pods, "three replicas");
    let service = format!("{FULLNAME}.{NS}.svc");
    let https_to = |ip: &str| {
        eureka_operator::tls::install_default_provider();
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
            .resolve(&service, format!("{ip}:8761").parse().unwrap())
            .build()
            .unwrap()
    };
    let url = format!("https://{service}:8761/eureka/");
    // No credentials: refused.
    let anonymous = https_to(&pods[0].1)
        .get(format!("{url}apps/"))
        .send()
        .await
        .expect("an answer over TLS");
    assert_eq!(anonymous.status(), 401);
    // A registration on one replica reaches the others (HTTPS, peer credentials).
    let body = crate::common::eureka::Native::new(&url, "NATIVE-APP", "native-1")
        .at("10.244.9.9", 8080)
        .body();
    let registered = https_to(&pods[0].1)
        .post(format!("{url}apps/NATIVE-APP"))
        .basic_auth("eureka", Some("client-secret"))
        .json(&body)
        .send()
        .await
        .expect("a registration");
    assert_eq!(registered.status(), 204);
    for (name, ip, _, _) in &pods[1..] {
        let client = https_to(ip);
        let url = url.clone();
        wait_for(
            &format!("NATIVE-APP replicated to {name}"),
            Duration::from_secs(20),
            Duration::from_millis(200),
            || {
                let client = client.clone();
                let url = url.clone();
                async move {
                    let r = client
                        .get(format!("{url}apps/NATIVE-APP/native-1"))
                        .basic_auth("eureka", Some("client-secret"))
                        .header("Accept", "application/json")
                        .send()
                        .await
                        .ok()?;
                    r.status().is_success().then_some(())
                }
            },
        )
        .await;
    }

    deploy_hello(cluster, APPS, 2);
    hello_ready(cluster, APPS, 2).await;
    cluster.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: eureka-ca, namespace: {APPS}}}\ndata:\n  ca.crt: |\n{}",
        ca.lines().map(|l| format!("    {l}\n")).collect::<String>()
    ));
    run_python_client(
        cluster,
        APPS,
        &format!("https://eureka:client-secret@{service}:8761/eureka"),
        Some("eureka-ca"),
    );
    let reached = client_reaches_every_hello_pod(cluster, APPS).await;
    eprintln!("FIGURES tls and basic auth: the client in a pod reached {reached:?} over HTTPS with credentials");
    clean(cluster, &[APPS]);
    let _ = cluster
        .kubectl()
        .args(["delete", "secret", "eo-tls", "-n", NS])
        .output();
}

/// The scenarios above on the shared real nodes, one after another. They take turns on the nodes
/// anyway ([`RealCluster::exclusive`]); as one test, the turn never holds a second test thread
/// idle while the rest of the suite waits for it (the suite runs on two). Each scenario names
/// itself before it starts, so a failure says which one.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_on_real_nodes() {
    println!("[installed] helm install with the defaults");
    helm_install_with_defaults_serves_real_pods_to_a_client_in_a_pod().await;
    println!("[installed] helm uninstall, then install again");
    helm_uninstall_leaves_nothing_stuck_and_a_new_install_takes_everything_back().await;
    println!("[installed] helm upgrade and container faults");
    helm_upgrade_and_container_faults_lose_nothing_and_refuse_no_client().await;
    println!("[installed] three replicas with basic auth and TLS");
    three_replicas_with_basic_auth_and_tls_start_together_and_serve_a_client_in_a_pod().await;
}
