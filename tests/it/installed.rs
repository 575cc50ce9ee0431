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
    if verb == "install" {
        args.push("--create-namespace".into());
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
fn operator_pods(cluster: &RealCluster) -> Vec<(String, String, bool, u32)> {
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
            let restarts = p["status"]["containerStatuses"][0]["restartCount"].as_u64().unwrap_or(0) as u32;
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
async fn ready_replicas(cluster: &RealCluster, n: usize, timeout: Duration) -> Vec<(String, String, bool, u32)> {
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
fn registry(body: &Value) -> BTreeMap<(String, String), (String, String)> {
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
async fn fetch(base: &str) -> Option<BTreeMap<(String, String), (String, String)>> {
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
/// (its name resolved by `hostAliases`) and calls HELLO every second.
fn run_python_client(cluster: &RealCluster, namespace: &str, server: &str, extra: &str) {
    let service_ip = cluster.kubectl_ok(&["get", "svc", FULLNAME, "-n", NS, "-o", "jsonpath={.spec.clusterIP}"]);
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
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {{drop: [ALL]}}}}
{extra}"#
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

/// #21.3 and #27.2: the chart's defaults on real nodes. Both replicas start from the image, pass
/// the probes, are complete within 2 s of their watches listing (neither waits on the other),
/// find each other through the headless Service, elect one Lease holder; an EurekaApp registers
/// a Deployment's real pod IPs; a py-eureka-client app in a pod fetches through the client
/// Service and reaches those pods. One scenario, in order: each step needs the one before.
#[tokio::test(flavor = "multi_thread")]
async fn helm_install_with_defaults_serves_real_pods_to_a_client_in_a_pod() {
    let Some(cluster) = RealCluster::shared() else { return };
    let _turn = RealCluster::exclusive().await;
    clean(cluster, &[APPS]);

    let took = install(cluster, "install", &[]);
    let pods = ready_replicas(cluster, 2, Duration::from_secs(120)).await;
    eprintln!("FIGURES install: helm install {took:?}, 2 replicas Ready {pods:?}");
    for (name, _, _, restarts) in &pods {
        assert_eq!(*restarts, 0, "{name} restarted");
        let log = cluster.logs(NS, name, "eureka-operator", false);
        let (listed, complete) = listed_and_complete(&log);
        let (listed, complete) = (listed.expect("watches listed"), complete.expect("complete"));
        eprintln!("FIGURES install: {name} complete {} ms after its watches listed", complete - listed);
        assert!(
            complete - listed <= 2_000,
            "{name} was complete {} ms after its watches listed (bound 2 s):\n{log}",
            complete - listed
        );
        assert!(!log.contains("congested"), "{name} waited on a peer:\n{log}");
    }

    // One Lease holder, and the leader gauge agrees.
    let holder = cluster.kubectl_ok(&["get", "lease", FULLNAME, "-n", NS, "-o", "jsonpath={.spec.holderIdentity}"]);
    assert!(pods.iter().any(|p| p.0 == holder), "holder {holder:?} is not a replica");
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
    let hello = wait_for("2 ready hello pods", Duration::from_secs(90), Duration::from_millis(250), || async {
        let p = hello_pods(cluster, APPS);
        (p.len() == 2).then_some(p)
    })
    .await;
    // Every replica registers the real pod IPs, UP.
    for (name, ip, _, _) in &pods {
        let base = format!("http://{ip}:8761/eureka/");
        let want: BTreeMap<String, String> = hello.clone();
        wait_for(&format!("HELLO's pod IPs on {name}"), Duration::from_secs(30), Duration::from_millis(200), || {
            let base = base.clone();
            let want = want.clone();
            async move {
                let reg = fetch(&base).await?;
                let got: BTreeMap<String, String> = reg
                    .iter()
                    .filter(|((app, _), (status, _))| app == "HELLO" && status == "UP")
                    .map(|((_, id), (_, ip))| (id.split('.').next().unwrap_or("").to_string(), ip.clone()))
                    .collect();
                (got == want).then_some(())
            }
        })
        .await;
    }

    // A real client in a pod, through the Service, reaches every hello pod at its registered IP.
    let server = format!("http://{FULLNAME}.{NS}.svc:8761/eureka");
    run_python_client(cluster, APPS, &server, "");
    let reached = client_reaches_every_hello_pod(cluster, APPS).await;
    eprintln!("FIGURES install: the client in a pod reached {reached:?}");
    // Its own registration reached one replica through the Service and was replicated to the
    // other (the replicas found each other through the headless Service).
    for (name, ip, _, _) in &pods {
        let base = format!("http://{ip}:8761/eureka/");
        wait_for(&format!("POD-CLIENT on {name}"), Duration::from_secs(30), Duration::from_millis(200), || {
            let base = base.clone();
            async move {
                let reg = fetch(&base).await?;
                reg.contains_key(&("POD-CLIENT".to_string(), "client".to_string()))
                    .then_some(())
            }
        })
        .await;
    }
    clean(cluster, &[APPS]);
}
