//! The Helm chart: lint, render with default and non-default values, apply the result with
//! `--dry-run=server` to the real apiserver, check the hardening and that the chart's CRD is the
//! one in `crds/`; then one test per promise the values make (names, Services, RBAC, sizing,
//! rollouts), most of them on `helm template` alone, and the operator run with the namespaced
//! RBAC.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use clap::CommandFactory;
use serde_json::{Value, json};

use crate::common::{
    eureka::http,
    operator::{
        Launch, OPERATOR_NAMESPACE, Operator, eureka_app, helm_template, instances, namespace, pipe, pod, prepared,
        set_ready, wait_condition,
    },
    process::wait_for,
};

fn chart() -> String {
    format!("{}/charts/eureka-operator", env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl apply --dry-run=server -o json` of a manifest; the objects as the apiserver saw them.
fn dry_run(cluster: &crate::common::cluster::Cluster, manifest: &str) -> Vec<Value> {
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "--dry-run=server", "-o", "json", "-f", "-"]);
    let out = pipe(cmd, manifest);
    let v: Value = serde_json::from_str(&out).expect("kubectl printed JSON");
    match v["kind"].as_str() {
        Some("List") => v["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![v],
    }
}

const NON_DEFAULT: &[&str] = &[
    "--set",
    "replicaCount=3",
    "--set",
    "podAntiAffinity=hard",
    "--set",
    "basicAuth.enabled=true",
    "--set",
    "basicAuth.password=s3cret",
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "eureka.watchNamespaces={chart-shop,chart-billing}",
    "--set",
    "eureka.javaPeerUrls={http://eureka-java.legacy:8761/eureka/}",
    "--set",
    "eureka.leaseExpiry=java",
    "--set",
    "crds.install=false",
];

/// A stand-in for the Prometheus Operator's CRD, so a ServiceMonitor can be dry-run.
const SERVICE_MONITOR_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"#;

#[tokio::test]
async fn the_chart_lints_renders_and_applies_to_a_real_apiserver() {
    let Some(cluster) = prepared() else { return };
    let helm = cluster.assets.join("helm");
    let out = Command::new(&helm)
        .args(["lint", "--strict", &chart(), "--kube-version", "1.36.3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm lint: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new(&helm)
        .args(["lint", "--strict", &chart(), "--kube-version", "1.36.3"])
        .args(NON_DEFAULT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm lint (non-default): {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The test namespace, and the watched ones of NON_DEFAULT (their Roles are applied there).
    for ns in ["chart-test", "chart-shop", "chart-billing"] {
        cluster.kubectl_ok(&["create", "namespace", ns]);
    }
    let mut apply = cluster.kubectl();
    apply.args(["apply", "-f", "-"]);
    pipe(apply, SERVICE_MONITOR_CRD);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=established",
        "crd/servicemonitors.monitoring.coreos.com",
    ]);

    // Default values.
    let rendered = helm_template(cluster, &[]).replace("namespace: eureka-system", "namespace: chart-test");
    let objects = dry_run(cluster, &rendered);
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "CustomResourceDefinition",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(container["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert!(container["resources"]["limits"]["memory"].is_string());
    let services: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "Service").collect();
    assert!(
        services
            .iter()
            .any(|s| s["spec"]["clusterIP"] == "None" && s["spec"]["publishNotReadyAddresses"] == true)
    );
    assert!(
        services
            .iter()
            .any(|s| s["spec"]["ports"][0]["port"] == 8761 && s["spec"]["clusterIP"] != "None")
    );

    // The chart's CRD is the one in crds/.
    let crd = objects
        .iter()
        .find(|o| o["kind"] == "CustomResourceDefinition")
        .unwrap();
    assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    let file = format!(
        "{}/crds/eurekaapps.eureka-operator.dev.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let committed = dry_run(cluster, &std::fs::read_to_string(file).unwrap()).remove(0);
    assert!(
        crd["spec"] == committed["spec"],
        "the chart's CRD differs from crds/ (run crdgen -- --helm)"
    );

    // Non-default values.
    let rendered = helm_template(cluster, NON_DEFAULT).replace("namespace: eureka-system", "namespace: chart-test");
    let objects = dry_run(cluster, &rendered);
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in ["ServiceMonitor", "NetworkPolicy", "Secret"] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    assert!(!kinds.contains(&"CustomResourceDefinition"));
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 3);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).cloned().unwrap_or_default();
    assert_eq!(var("EUREKA_WATCH_NAMESPACES")["value"], "chart-shop,chart-billing");
    assert_eq!(var("EUREKA_SERVER_LEASE_EXPIRY")["value"], "java");
    assert!(
        var("EUREKA_BASIC_AUTH_PASSWORD")["valueFrom"]["secretKeyRef"].is_object(),
        "the password comes from the Secret"
    );
    assert!(
        deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );

    // values.schema.json refuses bad values.
    for bad in [
        "replicaCount=two",
        "eureka.leaseExpiry=sometimes",
        "podAntiAffinity=maybe",
        "eureka.port=70000",
    ] {
        let out = Command::new(&helm)
            .args(["template", "eo", &chart(), "--kube-version", "1.36.3", "--set", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} was accepted");
    }

    // helm install --dry-run=server through the real apiserver, and the NOTES it prints.
    let out = Command::new(&helm)
        .args([
            "install",
            "notes",
            &chart(),
            "-n",
            "chart-test",
            "--dry-run=server",
            "--set",
            "crds.install=false",
        ])
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helm install --dry-run=server: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("defaultZone: http://notes-eureka-operator.chart-test.svc:8761/eureka/"),
        "{stdout}"
    );
}

// === What the values promise, on `helm template` ===

/// `helm` from the test peers, or `None` (the test is skipped outside CI).
fn helm(test: &str) -> Option<PathBuf> {
    crate::common::peers::require("KUBEBUILDER_ASSETS", test).map(|assets| Path::new(&assets).join("helm"))
}

/// `helm template eo` of the chart in `eureka-system` with `args`, as objects; `Err` with helm's
/// message when it refuses (a `fail` in a template, or values.schema.json).
pub(crate) fn try_render(helm: &Path, args: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new(helm)
        .args([
            "template",
            "eo",
            &chart(),
            "-n",
            "eureka-system",
            "--kube-version",
            "1.36.3",
        ])
        .args(args)
        .output()
        .expect("failed to run helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|v| v.is_object())
        .collect())
}

fn render(helm: &Path, args: &[&str]) -> Vec<Value> {
    try_render(helm, args).unwrap_or_else(|e| panic!("helm template {args:?}: {e}"))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among {:?}", names(objects)))
}

fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn deployment(objects: &[Value]) -> &Value {
    of_kind(objects, "Deployment").first().copied().expect("a Deployment")
}

/// The operator container's environment: name to the whole EnvVar.
fn env(objects: &[Value]) -> BTreeMap<String, Value> {
    deployment(objects)["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

/// Whether every `matchLabels` entry is among `labels`.
fn selects(match_labels: &Value, labels: &Value) -> bool {
    let wanted = match_labels.as_object().expect("matchLabels");
    !wanted.is_empty() && wanted.iter().all(|(k, v)| &labels[k] == v)
}

/// The binary's own flags: the environment variable each reads, and its default.
fn operator_flags() -> BTreeMap<String, Option<String>> {
    eureka_operator::config::Args::command()
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_string_lossy().into_owned();
            let default = a.get_default_values().first().map(|d| d.to_string_lossy().into_owned());
            Some((env, default))
        })
        .collect()
}

/// A Kubernetes quantity in bytes (`512Mi`, `1G`, `1000`).
fn quantity_bytes(q: &str) -> u64 {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (number, unit) = q.split_at(split);
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => panic!("quantity {q}: unit {other} not handled here"),
    };
    number.parse::<u64>().unwrap() * factor
}

/// Guards: NOTES printed `kubectl apply -f - <<'YAML'` with the YAML terminator indented, so a
/// pasted command waited for a terminator that never came. Every heredoc the NOTES print must end
/// with its marker alone at column 0.
#[tokio::test]
async fn the_notes_print_commands_that_paste_into_a_shell() {
    let Some(cluster) = prepared() else { return };
    let helm = cluster.assets.join("helm");
    let variants: &[&[&str]] = &[
        &[],
        &[
            "--set",
            "fullnameOverride=eureka-server",
            "--set",
            "basicAuth.enabled=true",
            "--set",
            "basicAuth.password=s3cret",
            "--set",
            "tls.enabled=true",
            "--set",
            "tls.secretName=mine",
        ],
    ];
    let mut heredocs = 0;
    for values in variants {
        let out = Command::new(&helm)
            .args(["install", "notes", &chart(), "-n", "chart-notes", "--dry-run=client"])
            .args(["--set", "crds.install=false"])
            .args(*values)
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "helm install --dry-run=client {values:?}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let notes = stdout.split_once("NOTES:\n").expect("NOTES printed").1;
        let lines: Vec<&str> = notes.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(at) = line.find("<<") else { continue };
            let rest = line[at + 2..].trim_start_matches('-').trim_start();
            let marker: String = rest
                .trim_start_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if marker.is_empty() {
                continue;
            }
            heredocs += 1;
            // The shell ends the heredoc only at a line that is exactly the marker.
            let end = lines[i + 1..].iter().find(|l| l.trim() == marker);
            assert_eq!(
                end.copied(),
                Some(marker.as_str()),
                "the heredoc opened by {line:?} never ends when pasted (its terminator must be at column 0):\n{notes}"
            );
        }
        if values.is_empty() {
            assert!(
                notes.contains("defaultZone: http://notes-eureka-operator.chart-notes.svc:8761/eureka/"),
                "{notes}"
            );
        } else {
            assert!(
                notes.contains("defaultZone: https://<username>:<password>@eureka-server.chart-notes.svc:8761/eureka/"),
                "{notes}"
            );
            assert!(notes.contains("port-forward svc/eureka-server 8761"), "{notes}");
        }
    }
    eprintln!("NOTES: {heredocs} heredocs, each ending at column 0");
}

/// Guards: the admin port (/metrics, the probes) was on the client Service, so
/// `service.type=LoadBalancer` published it. Only the ServiceMonitor's own headless Service may
/// carry it, and the ServiceMonitor must select that Service and no other.
#[test]
fn the_admin_port_is_on_no_client_facing_service() {
    let Some(helm) = helm("chart admin port test") else {
        return;
    };
    let admin = |s: &Value| {
        s["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "admin" || p["targetPort"] == "admin" || p["port"] == 8080)
    };
    for monitored in [false, true] {
        let objects = render(
            &helm,
            &[
                "--set",
                "service.type=LoadBalancer",
                "--set",
                &format!("serviceMonitor.enabled={monitored}"),
                "--set",
                "networkPolicy.enabled=true",
            ],
        );
        let services = of_kind(&objects, "Service");
        let client = named(&objects, "Service", "eo-eureka-operator");
        assert_eq!(client["spec"]["type"], "LoadBalancer");
        assert_eq!(
            client["spec"]["ports"],
            json!([{"name": "eureka", "port": 8761, "targetPort": "eureka", "protocol": "TCP"}]),
            "the client Service publishes the Eureka port only"
        );
        let with_admin: Vec<&&Value> = services.iter().filter(|s| admin(s)).collect();
        if !monitored {
            assert!(with_admin.is_empty(), "{with_admin:?}");
            assert!(of_kind(&objects, "ServiceMonitor").is_empty());
            continue;
        }
        assert_eq!(with_admin.len(), 1, "one Service for Prometheus: {with_admin:?}");
        let metrics = with_admin[0];
        assert_eq!(metrics["metadata"]["name"], "eo-eureka-operator-metrics");
        assert_eq!(metrics["spec"]["clusterIP"], "None", "headless: no address to publish");
        assert!(metrics["spec"]["type"].is_null() || metrics["spec"]["type"] == "ClusterIP");
        let monitor = of_kind(&objects, "ServiceMonitor")[0];
        let selector = &monitor["spec"]["selector"]["matchLabels"];
        let selected: Vec<&&Value> = services
            .iter()
            .filter(|s| selects(selector, &s["metadata"]["labels"]))
            .collect();
        assert_eq!(
            selected,
            vec![metrics],
            "the ServiceMonitor selects the metrics Service only"
        );
        let port = &monitor["spec"]["endpoints"][0]["port"];
        assert!(
            metrics["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| &p["name"] == port),
            "the ServiceMonitor scrapes port {port}, which its Service names"
        );
        // The NetworkPolicy's ports are the container's (the admin rule covers the scrapes).
        let container_ports: BTreeSet<&str> =
            deployment(&objects)["spec"]["template"]["spec"]["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap())
                .collect();
        let policy = of_kind(&objects, "NetworkPolicy")[0];
        for rule in policy["spec"]["ingress"].as_array().unwrap() {
            for p in rule["ports"].as_array().unwrap() {
                assert!(container_ports.contains(p["port"].as_str().unwrap()), "{p}");
            }
        }
    }
}

/// Guards: the default memory limit (512Mi) with the binary's default --max-registry-bytes
/// (256 MiB) broke the documented rule (docs/src/operations/hardening.md) that the registry cap be at most a quarter of the memory
/// limit (the response cache keeps a few encodings of it). Without the variable, the binary's
/// default counts.
#[test]
fn the_registry_cap_is_at_most_a_quarter_of_the_memory_limit() {
    let Some(helm) = helm("chart sizing test") else { return };
    let objects = render(&helm, &[]);
    let limit = deployment(&objects)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
        .as_str()
        .expect("a memory limit")
        .to_string();
    let cap: u64 = match env(&objects).get("EUREKA_MAX_REGISTRY_BYTES") {
        Some(e) => e["value"].as_str().unwrap().parse().unwrap(),
        None => operator_flags()["EUREKA_MAX_REGISTRY_BYTES"]
            .as_deref()
            .unwrap()
            .parse()
            .unwrap(),
    };
    assert!(
        cap * 4 <= quantity_bytes(&limit),
        "--max-registry-bytes {cap} is more than a quarter of the memory limit {limit}"
    );
    assert_eq!(cap, 128 << 20);

    // Large numbers from a values file (which Helm reads as floats) render as integers.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "eureka:\n  maxRegistryBytes: 1073741824\nresources:\n  limits:\n    memory: 4Gi\n",
    )
    .unwrap();
    let objects = render(&helm, &["-f", values.to_str().unwrap()]);
    assert_eq!(env(&objects)["EUREKA_MAX_REGISTRY_BYTES"]["value"], "1073741824");
}

/// Guards: there was no fullnameOverride, so a team could not keep its Java server's Service
/// name (`eureka-server` in every app's defaultZone). Every name the chart derives, and every
/// reference to one, must follow it; nameOverride renames the chart part and the name label.
#[test]
fn name_overrides_rename_every_object_and_every_reference() {
    let Some(helm) = helm("chart name override test") else {
        return;
    };
    let objects = render(
        &helm,
        &[
            "--set",
            "fullnameOverride=eureka-server",
            "--set",
            "basicAuth.enabled=true",
            "--set",
            "basicAuth.password=s3cret",
            "--set",
            "tls.enabled=true",
            "--set",
            "tls.certManager.enabled=true",
            "--set",
            "tls.certManager.issuerRef.name=ca",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "eureka.watchNamespaces={shop}",
        ],
    );
    for o in &objects {
        if o["kind"] != "CustomResourceDefinition" {
            let name = o["metadata"]["name"].as_str().unwrap();
            assert!(name.starts_with("eureka-server"), "{} {name}", o["kind"]);
        }
    }
    let client = named(&objects, "Service", "eureka-server");
    assert_ne!(client["spec"]["clusterIP"], "None");
    let peers = of_kind(&objects, "Service")
        .into_iter()
        .find(|s| s["spec"]["publishNotReadyAddresses"] == true)
        .expect("the peers Service");
    let vars = env(&objects);
    let value = |name: &str| vars[name]["value"].as_str().unwrap().to_string();
    assert_eq!(
        value("EUREKA_PEER_SERVICE"),
        peers["metadata"]["name"].as_str().unwrap()
    );
    assert_eq!(value("EUREKA_LEASE_NAME"), "eureka-server");
    assert_eq!(value("EUREKA_PEER_TLS_SERVER_NAME"), "eureka-server.eureka-system.svc");
    let certificate = of_kind(&objects, "Certificate")[0];
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("eureka-server.eureka-system.svc"))
    );
    let pod = &deployment(&objects)["spec"]["template"];
    assert_eq!(
        pod["spec"]["volumes"][0]["secret"]["secretName"],
        certificate["spec"]["secretName"]
    );
    assert_eq!(certificate["spec"]["secretName"], "eureka-server-tls");
    let secret = of_kind(&objects, "Secret")[0]["metadata"]["name"].clone();
    assert_eq!(secret, "eureka-server-basic-auth");
    for (name, e) in &vars {
        if let Some(key) = e["valueFrom"]["secretKeyRef"].as_object() {
            assert_eq!(key["name"], secret, "{name}");
        }
    }
    // RBAC: each binding names a rendered role of its kind (in its namespace) and the rendered
    // ServiceAccount, the one the pods run as.
    let sa = of_kind(&objects, "ServiceAccount")[0];
    assert_eq!(pod["spec"]["serviceAccountName"], sa["metadata"]["name"]);
    let bindings: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(bindings.len(), 3, "{:?}", names(&objects));
    for b in bindings {
        let role = named(
            &objects,
            b["roleRef"]["kind"].as_str().unwrap(),
            b["roleRef"]["name"].as_str().unwrap(),
        );
        assert_eq!(role["metadata"]["namespace"], b["metadata"]["namespace"]);
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}])
        );
    }
    // Selectors still select the pods.
    let labels = &pod["metadata"]["labels"];
    for o in &objects {
        let selector = match o["kind"].as_str().unwrap() {
            "Service" => &o["spec"]["selector"],
            "PodDisruptionBudget" | "Deployment" => &o["spec"]["selector"]["matchLabels"],
            "NetworkPolicy" => &o["spec"]["podSelector"]["matchLabels"],
            _ => continue,
        };
        assert!(selects(selector, labels), "{} {selector}", o["kind"]);
    }

    // nameOverride: the chart part of the full name, and the name label.
    let objects = render(&helm, &["--set", "nameOverride=registry"]);
    named(&objects, "Service", "eo-registry");
    named(&objects, "ClusterRole", "eo-registry");
    for o in &objects {
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/name"], "registry",
            "{}",
            o["kind"]
        );
    }
    let d = deployment(&objects);
    assert_eq!(d["metadata"]["name"], "eo-registry");
    assert_eq!(
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "registry"
    );
    assert!(selects(
        &d["spec"]["selector"]["matchLabels"],
        &d["spec"]["template"]["metadata"]["labels"]
    ));
    assert_eq!(env(&objects)["EUREKA_LEASE_NAME"]["value"], "eo-registry");
}

/// Guards: the replicas read the basic-auth credentials from env at start, and a changed
/// Secret did not change the pod template, so `helm upgrade` with a new password left them on
/// the old one. The chart-created Secret's checksum is a pod annotation.
#[test]
fn a_new_basic_auth_password_rolls_the_pods() {
    let Some(helm) = helm("chart basic-auth checksum test") else {
        return;
    };
    let annotations = |extra: &[&str]| {
        let mut args = vec!["--set", "basicAuth.enabled=true", "--set", "podAnnotations.team=search"];
        args.extend_from_slice(extra);
        deployment(&render(&helm, &args))["spec"]["template"]["metadata"]["annotations"].clone()
    };
    let first = annotations(&["--set", "basicAuth.password=one"]);
    assert!(first["checksum/basic-auth"].is_string(), "{first}");
    assert_eq!(first["team"], "search", "podAnnotations stay");
    assert_eq!(
        annotations(&["--set", "basicAuth.password=one"]),
        first,
        "the same password: no rollout"
    );
    assert_ne!(annotations(&["--set", "basicAuth.password=two"]), first);
    assert_ne!(
        annotations(&["--set", "basicAuth.password=one", "--set", "basicAuth.username=other"]),
        first
    );
    let peers = [
        "--set",
        "basicAuth.peerCredentials=true",
        "--set",
        "basicAuth.password=one",
    ];
    let peer_a = annotations(&[&peers[..], &["--set", "basicAuth.peerPassword=a"]].concat());
    let peer_b = annotations(&[&peers[..], &["--set", "basicAuth.peerPassword=b"]].concat());
    assert_ne!(peer_a, peer_b, "a new peer password rolls them too");
    // A Secret of the user's is not the chart's to hash (values.yaml says to restart by hand).
    let existing = annotations(&["--set", "basicAuth.existingSecret=mine"]);
    assert!(existing["checksum/basic-auth"].is_null(), "{existing}");
}

/// Guards: with only hostname anti-affinity, replicas could share a zone. By default they
/// spread over zones softly (ScheduleAnyway: no zone labels, one zone, or a rollout's surge pod
/// never block scheduling); a list of the user's replaces that default.
#[test]
fn replicas_spread_softly_over_zones_unless_constraints_are_given() {
    let Some(helm) = helm("chart zone spread test") else {
        return;
    };
    let objects = render(&helm, &[]);
    let pod = &deployment(&objects)["spec"]["template"];
    let spread = pod["spec"]["topologySpreadConstraints"]
        .as_array()
        .expect("a default spread");
    assert_eq!(spread.len(), 1, "{spread:?}");
    assert_eq!(spread[0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(spread[0]["whenUnsatisfiable"], "ScheduleAnyway");
    assert!(selects(
        &spread[0]["labelSelector"]["matchLabels"],
        &pod["metadata"]["labels"]
    ));
    let preferred = &pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        preferred[0]["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname",
        "kept"
    );

    let mine = json!([{
        "maxSkew": 2,
        "topologyKey": "example.com/rack",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "eureka"}},
    }]);
    let objects = render(&helm, &["--set-json", &format!("topologySpreadConstraints={mine}")]);
    assert_eq!(
        deployment(&objects)["spec"]["template"]["spec"]["topologySpreadConstraints"],
        mine
    );
    let objects = render(&helm, &["--set", "zoneSpread=none"]);
    assert!(deployment(&objects)["spec"]["template"]["spec"]["topologySpreadConstraints"].is_null());
}

/// Guards: the certificate's long name hard-coded `svc.cluster.local`, and the operator was
/// not told the domain (its PodFQDN host names). Both follow clusterDomain.
#[test]
fn the_cluster_domain_reaches_the_certificate_and_the_operator() {
    let Some(helm) = helm("chart cluster domain test") else {
        return;
    };
    let tls = [
        "--set",
        "tls.enabled=true",
        "--set",
        "tls.certManager.enabled=true",
        "--set",
        "tls.certManager.issuerRef.name=ca",
    ];
    let objects = render(&helm, &tls);
    assert_eq!(env(&objects)["EUREKA_CLUSTER_DOMAIN"]["value"], "cluster.local");
    let objects = render(&helm, &[&tls[..], &["--set", "clusterDomain=corp.internal"]].concat());
    assert_eq!(env(&objects)["EUREKA_CLUSTER_DOMAIN"]["value"], "corp.internal");
    let dns_names = of_kind(&objects, "Certificate")[0]["spec"]["dnsNames"].clone();
    assert!(
        dns_names
            .as_array()
            .unwrap()
            .contains(&json!("eo-eureka-operator.eureka-system.svc.corp.internal")),
        "{dns_names}"
    );
    assert!(!dns_names.to_string().contains("cluster.local"), "{dns_names}");
    assert!(try_render(&helm, &["--set", "clusterDomain=Not A Domain"]).is_err());
}

/// The rules of the operator's (Cluster)Roles on `resources`, as (resource, verbs) pairs.
fn rules_on(role: &Value) -> BTreeSet<(String, Vec<String>)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<String> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        for r in rule["resources"].as_array().unwrap() {
            let name = match rule["resourceNames"].as_array() {
                Some(n) => format!("{}{n:?}", r.as_str().unwrap()),
                None => r.as_str().unwrap().to_string(),
            };
            out.insert((name, verbs.clone()));
        }
    }
    out
}

const WATCHED: &[&str] = &["pods", "pods/status", "eurekaapps", "eurekaapps/status", "events"];

/// Guards: with eureka.watchNamespaces the ClusterRole still let the operator patch every pod
/// and EurekaApp in the cluster. Then those rights are Roles in the watched namespaces only, and
/// cluster-wide stays what cannot be namespaced (nodes, the kube-system namespace).
#[test]
fn watched_namespaces_get_roles_instead_of_cluster_wide_rights() {
    let Some(helm) = helm("chart namespaced RBAC test") else {
        return;
    };
    let everywhere = render(&helm, &[]);
    let cluster_wide = rules_on(named(&everywhere, "ClusterRole", "eo-eureka-operator"));
    let (watched, rest): (BTreeSet<_>, BTreeSet<_>) = cluster_wide
        .into_iter()
        .partition(|(r, _)| WATCHED.contains(&r.as_str()));
    assert_eq!(
        watched.len(),
        WATCHED.len(),
        "the default ClusterRole covers every namespace: {watched:?}"
    );

    let objects = render(&helm, &["--set", "eureka.watchNamespaces={a,b}"]);
    // What the operator's ServiceAccount is bound to, cluster-wide and per namespace.
    let mut bound: BTreeMap<(String, String), &Value> = BTreeMap::new();
    for b in of_kind(&objects, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&objects, "RoleBinding"))
    {
        assert_eq!(b["subjects"][0]["name"], "eo-eureka-operator");
        let role = named(
            &objects,
            b["roleRef"]["kind"].as_str().unwrap(),
            b["roleRef"]["name"].as_str().unwrap(),
        );
        let ns = b["metadata"]["namespace"].as_str().unwrap_or("*").to_string();
        bound.insert((ns, b["roleRef"]["name"].as_str().unwrap().to_string()), role);
    }
    let keys: Vec<&(String, String)> = bound.keys().collect();
    assert_eq!(
        keys,
        [
            &("*".to_string(), "eo-eureka-operator".to_string()),
            &("a".to_string(), "eo-eureka-operator".to_string()),
            &("b".to_string(), "eo-eureka-operator".to_string()),
            &("eureka-system".to_string(), "eo-eureka-operator-local".to_string()),
        ]
    );
    let cluster_role = bound[&("*".to_string(), "eo-eureka-operator".to_string())];
    assert_eq!(
        rules_on(cluster_role),
        rest,
        "only nodes and the kube-system namespace stay cluster-wide"
    );
    for ns in ["a", "b"] {
        let role = bound[&(ns.to_string(), "eo-eureka-operator".to_string())];
        assert_eq!(role["kind"], "Role");
        assert_eq!(rules_on(role), watched, "the Role in {ns}");
    }
    for role in of_kind(&objects, "ClusterRole") {
        if role["metadata"]["name"] == "eo-eureka-operator" {
            continue;
        }
        // The aggregated roles are for people: bound to nobody here.
        assert!(
            role["metadata"]["labels"].to_string().contains("aggregate-to-"),
            "{role}"
        );
    }
}

/// The namespaced RBAC in a cluster: the operator watching two namespaces, as the chart's
/// ServiceAccount with the rendered RBAC and nothing else, registers their pods and writes
/// statuses, Events and pod annotations there, and may not touch pods anywhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_limited_to_namespaces_works_with_their_roles_alone() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let (a, b, other) = ("chart-rbac-a", "chart-rbac-b", "chart-rbac-other");
    for ns in [a, b, other] {
        namespace(&client, ns).await;
    }
    // Names of its own (fullnameOverride), beside the shared release `eo`'s RBAC.
    let name = "chart-rbac";
    let rbac = helm_template(
        cluster,
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
            "--set",
            &format!("fullnameOverride={name}"),
            "--set",
            &format!("eureka.watchNamespaces={{{a},{b}}}"),
        ],
    );
    let mut apply = cluster.kubectl();
    apply.args(["apply", "-f", "-"]);
    pipe(apply, &rbac);
    let user = format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{name}");
    let can = |args: &[&str]| {
        let out = cluster
            .kubectl()
            .args(["auth", "can-i", "--as", &user])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    assert!(can(&["patch", "pods", "-n", a]));
    assert!(can(&["list", "nodes"]));
    assert!(
        !can(&["patch", "pods", "-n", other]),
        "pods outside the watched namespaces"
    );
    assert!(!can(&["list", "pods", "--all-namespaces"]));
    assert!(!can(&["patch", "eurekaapps.eureka-operator.dev", "-n", other]));

    let mut launch = Launch::new(Ipv4Addr::new(127, 0, 0, 88), &format!("{a},{b}"), name);
    launch.user = user.clone();
    // Derived from the kube-system namespace: the ClusterRole's one `get`.
    launch.cluster_id = None;
    let op = Operator::launch_with(cluster, launch).await;
    for (ns, ip) in [(a, "10.41.0.1"), (b, "10.41.0.2")] {
        eureka_app(
            cluster,
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
    wait_for(
        "both namespaces' pods in the registry",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let i = instances(&op.server, "ORDERS").await;
            (i.len() == 2 && i.iter().all(|(_, s)| s == "UP")).then_some(())
        },
    )
    .await;
    for ns in [a, b] {
        let status = wait_condition(cluster, ns, "orders", "Ready", "True").await;
        assert_eq!(status["selectedPods"], 1, "{status}");
    }
    wait_for(
        "a Registered Event",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&["get", "events", "-n", a, "-o", "jsonpath={.items[*].reason}"]);
            out.contains("Registered").then_some(())
        },
    )
    .await;
    let id = instances(&op.server, "ORDERS")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .find(|id| id.contains(a))
        .unwrap();
    let url = format!("{}apps/ORDERS/{id}/status?value=OUT_OF_SERVICE", op.server.url());
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
                a,
                "-o",
                "jsonpath={.metadata.annotations.eureka-operator\\.dev/status-override}",
            ]);
            (out == "OUT_OF_SERVICE").then_some(())
        },
    )
    .await;
    let log = op.server.proc.log();
    for needle in ["forbidden", "Forbidden", " 403"] {
        assert!(
            !log.contains(needle),
            "the operator logged {needle:?}:\n{}",
            op.server.proc.log_tail(40)
        );
    }
}

/// Guards: nothing let a namespace's editors create EurekaApps (the CRD's resources are in
/// no built-in role). <fullname>-edit and -view fold into edit/admin and view by their labels.
#[test]
fn aggregated_roles_let_namespace_editors_manage_eurekaapps() {
    let Some(helm) = helm("chart aggregated roles test") else {
        return;
    };
    let objects = render(&helm, &[]);
    let label =
        |role: &Value, key: &str| role["metadata"]["labels"][format!("rbac.authorization.k8s.io/{key}")].clone();
    let edit = named(&objects, "ClusterRole", "eo-eureka-operator-edit");
    assert_eq!(label(edit, "aggregate-to-edit"), "true");
    assert_eq!(label(edit, "aggregate-to-admin"), "true");
    assert!(label(edit, "aggregate-to-view").is_null());
    let all = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    let read = ["get", "list", "watch"];
    let verbs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules_on(edit),
        BTreeSet::from([
            ("eurekaapps".to_string(), verbs(&all)),
            ("eurekaapps/status".to_string(), verbs(&read)),
        ]),
        "full rights on EurekaApps; their status stays the operator's"
    );
    let view = named(&objects, "ClusterRole", "eo-eureka-operator-view");
    assert_eq!(label(view, "aggregate-to-view"), "true");
    assert!(label(view, "aggregate-to-edit").is_null());
    assert_eq!(
        rules_on(view),
        BTreeSet::from([
            ("eurekaapps".to_string(), verbs(&read)),
            ("eurekaapps/status".to_string(), verbs(&read)),
        ])
    );
    for rule in edit["rules"]
        .as_array()
        .unwrap()
        .iter()
        .chain(view["rules"].as_array().unwrap())
    {
        assert_eq!(rule["apiGroups"], json!(["eureka-operator.dev"]));
    }
    for off in ["rbac.aggregateToDefaultRoles=false", "rbac.create=false"] {
        let objects = render(&helm, &["--set", off]);
        let roles = names(&objects);
        assert!(
            !roles.iter().any(|n| n.ends_with("-edit") || n.ends_with("-view")),
            "{off}: {roles:?}"
        );
    }
}

/// Guards: values without a description. Every key of values.yaml is described in
/// values.schema.json (whose descriptions the chart's README table is generated from) and
/// commented in values.yaml, and the schema describes nothing values.yaml lacks. Objects the
/// schema gives no properties (resources, affinity...) are one value, described as a whole.
#[test]
fn every_value_is_described_in_the_schema_and_commented() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/eureka-operator");
    let text = std::fs::read_to_string(dir.join("values.yaml")).unwrap();
    let values: Value = serde_saphyr::from_str(&text).unwrap();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("values.schema.json")).unwrap()).unwrap();

    fn walk(values: &Value, schema: &Value, path: &str, leaves: &mut Vec<String>, problems: &mut Vec<String>) {
        let props = &schema["properties"];
        for (key, value) in values.as_object().unwrap() {
            let full = format!("{path}{key}");
            let node = &props[key];
            if node.is_null() {
                problems.push(format!("{full}: not in values.schema.json"));
                continue;
            }
            if node["description"].as_str().is_none_or(|d| d.trim().is_empty()) {
                problems.push(format!("{full}: no description in values.schema.json"));
            }
            if node["properties"].is_object() {
                walk(value, node, &format!("{full}."), leaves, problems);
            } else {
                leaves.push(full);
            }
        }
        for key in props.as_object().into_iter().flatten().map(|(k, _)| k) {
            if values.get(key).is_none() {
                problems.push(format!("{path}{key}: in values.schema.json, not in values.yaml"));
            }
        }
    }
    let (mut leaves, mut problems) = (Vec::new(), Vec::new());
    walk(&values, &schema, "", &mut leaves, &mut problems);

    // The comment: the line right above the key (a blank line in between does not count).
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut previous = "";
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some((key, _)) = trimmed.split_once(':')
            && !trimmed.starts_with('#')
            && !trimmed.starts_with('-')
        {
            stack.retain(|(i, _)| *i < indent);
            let full: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
            let full = full.join(".");
            if leaves.contains(&full) && !previous.trim_start().starts_with('#') {
                problems.push(format!("{full}: no comment above it in values.yaml"));
            }
            stack.push((indent, key.to_string()));
        }
        previous = line;
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(leaves.len() > 60, "{leaves:?}");
}

/// Guards: the binary drains at once on SIGTERM unless told to wait (--shutdown-delay-ms),
/// and the pod's grace period must cover that delay plus the binary's own drain
/// (--shutdown-grace-ms), or the kubelet kills it mid-drain; the chart refuses values that break
/// that.
#[test]
fn replicas_leave_the_endpoints_before_they_drain_within_the_grace_period() {
    let Some(helm) = helm("chart shutdown test") else {
        return;
    };
    let objects = render(&helm, &[]);
    assert_eq!(env(&objects)["EUREKA_SHUTDOWN_DELAY_MS"]["value"], "5000");
    let grace = deployment(&objects)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let drain_ms: u64 = operator_flags()["EUREKA_SHUTDOWN_GRACE_MS"]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(grace * 1000 > 5000 + drain_ms, "grace {grace}s, drain {drain_ms}ms");

    let refused = try_render(&helm, &["--set", "eureka.shutdownDelaySeconds=15"]).unwrap_err();
    assert!(refused.contains("terminationGracePeriodSeconds"), "{refused}");
    let objects = render(
        &helm,
        &[
            "--set",
            "eureka.shutdownDelaySeconds=15",
            "--set",
            "terminationGracePeriodSeconds=40",
        ],
    );
    assert_eq!(env(&objects)["EUREKA_SHUTDOWN_DELAY_MS"]["value"], "15000");
    assert_eq!(
        deployment(&objects)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        40
    );
}

/// Every EUREKA_* variable the chart sets, whatever the values, is one the binary reads (a typo
/// would be ignored, the flag left at its default).
#[test]
fn every_variable_the_chart_sets_is_a_flag_of_the_operator() {
    let Some(helm) = helm("chart env test") else { return };
    let flags = operator_flags();
    let objects = render(
        &helm,
        &[
            NON_DEFAULT,
            &[
                "--set",
                "basicAuth.peerCredentials=true",
                "--set",
                "basicAuth.peerPassword=p",
                "--set",
                "tls.enabled=true",
                "--set",
                "tls.secretName=mine",
                "--set",
                "eureka.clusterId=prod",
            ],
        ]
        .concat(),
    );
    let names: Vec<String> = env(&objects).into_keys().filter(|n| n.starts_with("EUREKA_")).collect();
    assert!(names.len() > 20, "{names:?}");
    for name in names {
        assert!(
            flags.contains_key(&name),
            "the chart sets {name}, which no flag of the operator reads"
        );
    }
}

#[test]
fn remote_clusters_render_a_links_file_the_operator_accepts_with_the_secrets_mounted_where_it_says() {
    let Some(helm) = helm("chart remote clusters test") else {
        return;
    };
    let links = r#"[{"name":"us-east-1","urls":["https://eureka.us-east-1.example/eureka/"],"credentialsSecret":"link-east","caSecret":"link-east-ca","visibility":"Fallback","pollIntervalMs":500,"apps":{"exclude":["internal"]}},{"name":"eu-west-1","urls":["http://10.0.0.1:8761/eureka/"]}]"#;
    let objects = render(
        &helm,
        &[
            "--set-json",
            &format!("remoteClusters={links}"),
            "--set",
            "eureka.clusterLocalApps={billing,audit}",
        ],
    );
    let env = env(&objects);
    let file = env["EUREKA_REMOTE_CLUSTERS_FILE"]["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(env["EUREKA_CLUSTER_LOCAL_APPS"]["value"], "billing,audit");
    assert_eq!(env["EUREKA_REMOTE_INITIAL_SYNC_TIMEOUT_MS"]["value"], "10000");
    let config = named(&objects, "ConfigMap", "eo-eureka-operator-remote-clusters");
    let text = config["data"]["remote-clusters.yaml"].as_str().unwrap();
    // The operator's own parser accepts what the chart renders.
    let parsed = eureka_operator::links::spec::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed.len(), 2);
    let east = &parsed[0];
    assert_eq!(east.name, "us-east-1");
    assert_eq!(east.poll_interval_ms, 500);
    assert_eq!(east.apps.exclude, vec!["INTERNAL".to_string()]);
    assert!(parsed[1].username_file.is_none() && parsed[1].ca_file.is_none());

    // Every path the file names is where a volume is mounted, from the Secret it names.
    let pod = &deployment(&objects)["spec"]["template"]["spec"];
    let mounts: Vec<(String, String)> = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let volume = |name: &str| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };
    let mounted = |path: &std::path::Path| {
        let (name, dir) = mounts
            .iter()
            .find(|(_, dir)| path.starts_with(dir))
            .unwrap_or_else(|| panic!("{} is not under a mount: {mounts:?}", path.display()));
        let key = path.strip_prefix(dir).unwrap().display().to_string();
        (volume(name), key)
    };
    let (v, key) = mounted(std::path::Path::new(&file));
    assert_eq!(v["configMap"]["name"], "eo-eureka-operator-remote-clusters");
    assert_eq!(key, "remote-clusters.yaml");
    for (path, secret, key) in [
        (east.username_file.clone().unwrap(), "link-east", "username"),
        (east.password_file.clone().unwrap(), "link-east", "password"),
        (east.ca_file.clone().unwrap(), "link-east-ca", "ca.crt"),
    ] {
        let (v, in_volume) = mounted(&path);
        assert_eq!(v["secret"]["secretName"], secret, "{}", path.display());
        assert_eq!(in_volume, key);
        assert!(
            v["secret"]["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["key"] == key && i["path"] == key),
            "{v}"
        );
    }
    // Nothing of it without links.
    let plain = render(&helm, &[]);
    assert!(
        of_kind(&plain, "ConfigMap")
            .iter()
            .all(|c| !c["metadata"]["name"].as_str().unwrap().ends_with("remote-clusters"))
    );
    assert!(!self::env(&plain).contains_key("EUREKA_REMOTE_CLUSTERS_FILE"));
    // A link the schema refuses.
    let bad = try_render(
        &helm,
        &["--set-json", r#"remoteClusters=[{"name":"East","urls":["x"]}]"#],
    );
    assert!(bad.is_err(), "a bad link renders");
}
