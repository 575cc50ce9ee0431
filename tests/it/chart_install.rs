//! The chart as installed: `helm install` with default values into a real apiserver, then the
//! operator binary run with exactly the args and env of the installed Deployment and as its
//! ServiceAccount, so a flag the binary does not accept or a permission the chart lacks fails
//! here. Then `helm upgrade` (the binary restarted with the new pod spec) and `helm uninstall`
//! (the CRD and the EurekaApps stay).
//!
//! Only what cannot exist outside a pod is substituted: the in-cluster token becomes a kubeconfig
//! that impersonates the chart's ServiceAccount, the downward API's pod name and IP become a test
//! name and a loopback address, and the pod's own network namespace becomes free ports on that
//! address (the chart binds `0.0.0.0:<containerPort>`). The cluster is a bare control plane of
//! this test's own: no EndpointSlice controller, so the operator's peer discovery finds no peer
//! address to send traffic to.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use serde_json::Value;

use crate::common::{
    cluster::Cluster,
    eureka::http,
    operator::{eureka_app, namespace, pod, set_ready, wait_condition},
    process::{Proc, free_port, scratch_dir, wait_for},
};

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 80);
const RELEASE: &str = "eo";
const NS: &str = "eureka-system";
const POD_NAME: &str = "eo-eureka-operator-5d9c7f-x2x7q";

fn chart() -> String {
    format!("{}/charts/eureka-operator", env!("CARGO_MANIFEST_DIR"))
}

/// `helm <args>` against `cluster`, with Helm's own state in `home`.
fn helm(cluster: &Cluster, home: &Path, args: &[&str]) -> Output {
    Command::new(cluster.assets.join("helm"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("failed to run helm")
}

fn helm_ok(cluster: &Cluster, home: &Path, args: &[&str]) -> String {
    let out = helm(cluster, home, args);
    assert!(
        out.status.success(),
        "helm {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The operator process as the installed Deployment's pod would run it.
struct InstalledOperator {
    proc: Proc,
    port: u16,
    admin_port: u16,
    readiness: String,
    liveness: String,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl InstalledOperator {
    fn url(&self) -> String {
        format!("http://{IP}:{}/eureka/", self.port)
    }
}

/// Expands `$(NAME)` references the way the kubelet does (unknown ones stay as written).
fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find("$(") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) if env.contains_key(&after[..j]) => {
                out.push_str(&env[&after[..j]]);
                rest = &after[j + 1..];
            }
            _ => {
                out.push_str("$(");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Starts the binary from the installed Deployment (read back from the apiserver).
async fn run_installed(cluster: &Cluster) -> InstalledOperator {
    let out = cluster.kubectl_ok(&["get", "deployment", "eo-eureka-operator", "-n", NS, "-o", "json"]);
    let deployment: Value = serde_json::from_str(&out).unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "one container expected: {containers:?}");
    let c = &containers[0];
    assert!(
        c["command"].is_null(),
        "the chart overrides the image's entrypoint: {}",
        c["command"]
    );
    let ports: BTreeMap<String, i64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect();
    let (port, admin_port) = (free_port(IP), free_port(IP));
    // The pod's network namespace: container port -> a free port on this test's address.
    let mapped = |container_port: i64| -> u16 {
        if container_port == ports["eureka"] {
            port
        } else if container_port == ports["admin"] {
            admin_port
        } else {
            panic!("the chart binds port {container_port}, which its container does not declare")
        }
    };

    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            let v = expand(v, &env);
            match name.as_str() {
                "EUREKA_BIND" | "EUREKA_ADMIN_BIND" => {
                    let (host, p) = v.rsplit_once(':').expect("host:port");
                    assert_eq!(host, "0.0.0.0", "{name}={v}: a pod listens on all its addresses");
                    format!("{IP}:{}", mapped(p.parse().unwrap()))
                }
                _ => v,
            }
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            match path {
                "metadata.name" => POD_NAME.to_string(),
                "metadata.namespace" => NS.to_string(),
                "status.podIP" => IP.to_string(),
                other => {
                    panic!("env {name} uses the downward API field {other}, which this test does not stand in for")
                }
            }
        } else if let Some(key) = e["valueFrom"]["secretKeyRef"].as_object() {
            let secret = cluster.kubectl_ok(&[
                "get",
                "secret",
                key["name"].as_str().unwrap(),
                "-n",
                NS,
                "-o",
                &format!("jsonpath={{.data.{}}}", key["key"].as_str().unwrap()),
            ]);
            use base64::Engine;
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(secret.trim()).unwrap()).unwrap()
        } else {
            panic!("env {name} has a source this test does not know: {e}")
        };
        env.insert(name, value);
    }
    let args: Vec<String> = c["args"]
        .as_array()
        .map(|a| a.iter().map(|v| expand(v.as_str().unwrap(), &env)).collect())
        .unwrap_or_default();
    let probe_path = |probe: &str| -> String {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["port"], "admin", "{probe} is not on the admin port: {get}");
        get["path"].as_str().unwrap().to_string()
    };
    let (readiness, liveness) = (probe_path("readinessProbe"), probe_path("livenessProbe"));

    // The identity: the pod's ServiceAccount token, as impersonation.
    let sa = pod["serviceAccountName"].as_str().expect("serviceAccountName");
    assert_eq!(pod["automountServiceAccountToken"], true);
    let dir = scratch_dir("chart-install-operator");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.kubeconfig_as(&format!("system:serviceaccount:{NS}:{sa}"), &kubeconfig);

    let mut cmd = Command::new(crate::common::eureka::Server::binary());
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", &kubeconfig)
        .envs(&env)
        .args(&args);
    let proc = Proc::spawn("eureka-operator (chart)", cmd, &dir.path().join("operator.log"));
    let mut op = InstalledOperator {
        proc,
        port,
        admin_port,
        readiness,
        liveness,
        args,
        _dir: dir,
    };
    // The readiness probe as the kubelet runs it; a flag the binary refuses ends the process.
    let ready = format!("http://{IP}:{}{}", op.admin_port, op.readiness);
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = op.proc.try_exit() {
            panic!(
                "the operator as installed exited ({status}) with args {:?}:\n{}",
                op.args,
                op.proc.log_tail(40)
            );
        }
        if let Ok(r) = http().get(&ready).send().await
            && r.status().is_success()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the chart's readiness probe did not pass in 60 s:\n{}",
            op.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let live = http()
        .get(format!("http://{IP}:{}{}", op.admin_port, op.liveness))
        .send()
        .await
        .unwrap();
    assert!(live.status().is_success(), "liveness probe: {}", live.status());
    op
}

fn no_permission_errors(op: &InstalledOperator) {
    let log = op.proc.log();
    for needle in [
        "forbidden",
        "Forbidden",
        " 403",
        "error: unexpected argument",
        "invalid value",
    ] {
        assert!(
            !log.contains(needle),
            "the operator as installed logged {needle:?}:\n{}",
            op.proc.log_tail(40)
        );
    }
}

/// Waits until the operator holds the chart's Lease (its RBAC for leases works).
async fn wait_leading(cluster: &Cluster) {
    wait_for(
        "the operator to hold the chart's Lease",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let out = cluster
                .kubectl()
                .args(["get", "lease", "eo-eureka-operator", "-n", NS, "-o"])
                .arg("jsonpath={.spec.holderIdentity}")
                .output()
                .ok()?;
            (String::from_utf8_lossy(&out.stdout) == POD_NAME).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn the_chart_as_installed_runs_the_operator_cluster_wide() {
    let Some(assets) = crate::common::peers::require("KUBEBUILDER_ASSETS", "chart install test") else {
        return;
    };
    // A control plane of its own: the release owns the CRD here, and `helm uninstall` must not
    // pull anything from under other tests.
    let cluster = Cluster::start(Path::new(&assets));
    let home = scratch_dir("helm-home");
    let home = home.path();
    let install = helm_ok(
        &cluster,
        home,
        &["install", RELEASE, &chart(), "-n", NS, "--create-namespace"],
    );
    assert!(install.contains("STATUS: deployed"), "{install}");
    let manifest = helm_ok(&cluster, home, &["get", "manifest", RELEASE, "-n", NS]);
    assert!(manifest.contains("kind: Deployment") && manifest.contains("kind: CustomResourceDefinition"));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/eurekaapps.eureka-operator.dev",
    ]);

    let mut op = run_installed(&cluster).await;
    assert!(
        !op.args.iter().any(|a| a.contains("watch-namespaces")),
        "default values watch every namespace: {:?}",
        op.args
    );
    wait_leading(&cluster).await;

    // Cluster-wide: apps in two namespaces created after the start, neither named anywhere.
    let client = cluster.admin().await;
    for (ns, ip) in [("shop", "10.40.0.1"), ("billing", "10.40.0.2")] {
        namespace(&client, ns).await;
        eureka_app(
            &cluster,
            ns,
            "orders",
            "  selector:\n    matchLabels: {app: orders}\n  port: http\n  drainSeconds: 1\n",
        );
        pod(
            &client,
            ns,
            "orders-0",
            &[("app", "orders")],
            &[("http", 8080)],
            "node-1",
        )
        .await;
        set_ready(&client, ns, "orders-0", ip, true).await;
    }
    let shop = "orders-0.shop:orders:8080";
    let billing = "orders-0.billing:orders:8080";
    let server = crate::common::eureka::app_instances;
    wait_for(
        "both namespaces' pods in the registry",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let i = server(&op.url(), "ORDERS").await;
            (i == vec![
                (billing.to_string(), "UP".to_string()),
                (shop.to_string(), "UP".to_string()),
            ])
            .then_some(())
        },
    )
    .await;
    // Status, the removal of an earlier version's finalizer, Events and pod annotations: every
    // write the chart's RBAC must allow.
    let status = wait_condition(&cluster, "shop", "orders", "Ready", "True").await;
    assert_eq!(status["selectedPods"], 1, "{status}");
    cluster.kubectl_ok(&[
        "patch",
        "ea",
        "orders",
        "-n",
        "billing",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["eureka-operator.dev/deregister"]}}"#,
    ]);
    wait_for(
        "the old finalizer to be removed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let f = cluster.kubectl_ok(&[
                "get",
                "ea",
                "orders",
                "-n",
                "billing",
                "-o",
                "jsonpath={.metadata.finalizers}",
            ]);
            f.trim().is_empty().then_some(())
        },
    )
    .await;
    wait_for(
        "a Registered Event",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&["get", "events", "-n", "shop", "-o", "jsonpath={.items[*].reason}"]);
            out.contains("Registered").then_some(())
        },
    )
    .await;
    let url = format!("{}apps/ORDERS/{shop}/status?value=OUT_OF_SERVICE", op.url());
    assert_eq!(http().put(&url).send().await.unwrap().status(), 200);
    wait_for(
        "the override annotation on the pod",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&[
                "get",
                "pod",
                "orders-0",
                "-n",
                "shop",
                "-o",
                "jsonpath={.metadata.annotations.eureka-operator\\.dev/status-override}",
            ]);
            (out == "OUT_OF_SERVICE").then_some(())
        },
    )
    .await;
    no_permission_errors(&op);

    // helm upgrade: new values reach the pod spec; the binary restarted with it accepts them.
    let upgrade = helm_ok(
        &cluster,
        home,
        &[
            "upgrade",
            RELEASE,
            &chart(),
            "-n",
            NS,
            "--set",
            "eureka.logLevel=debug",
            "--set",
            "eureka.extraArgs={--anti-entropy-interval-ms=30000}",
            "--set",
            "leaderElection.leaseDurationSeconds=5",
        ],
    );
    assert!(upgrade.contains("REVISION: 2"), "{upgrade}");
    op.proc.terminate(Duration::from_secs(10));
    op = run_installed(&cluster).await;
    assert!(
        op.args.iter().any(|a| a == "--anti-entropy-interval-ms=30000"),
        "{:?}",
        op.args
    );
    wait_leading(&cluster).await;
    wait_for(
        "the registry rebuilt after the upgrade",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let i = server(&op.url(), "ORDERS").await;
            (i == vec![
                (billing.to_string(), "UP".to_string()),
                (shop.to_string(), "OUT_OF_SERVICE".to_string()),
            ])
            .then_some(())
        },
    )
    .await;
    no_permission_errors(&op);
    op.proc.terminate(Duration::from_secs(10));

    // helm uninstall: the CRD and the EurekaApps stay (crds.keep), the rest goes.
    helm_ok(&cluster, home, &["uninstall", RELEASE, "-n", NS]);
    cluster.kubectl_ok(&["get", "crd", "eurekaapps.eureka-operator.dev"]);
    let apps = cluster.kubectl_ok(&["get", "ea", "-A", "-o", "name"]);
    assert_eq!(apps.lines().count(), 2, "{apps}");
    for kind in ["deployment", "serviceaccount"] {
        let out = cluster.kubectl_ok(&[
            "get",
            kind,
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/instance=eo",
            "-o",
            "name",
        ]);
        assert!(out.trim().is_empty(), "{kind} left after uninstall: {out}");
    }
    let out = cluster.kubectl_ok(&[
        "get",
        "clusterrole",
        "-l",
        "app.kubernetes.io/instance=eo",
        "-o",
        "name",
    ]);
    assert!(out.trim().is_empty(), "ClusterRole left after uninstall: {out}");
}
