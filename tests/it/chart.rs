//! The Helm chart: lint, render with default and non-default values, apply the result with
//! `--dry-run=server` to the real apiserver, check the hardening and that the chart's CRD is the
//! one in `crds/`.

use std::process::Command;

use crate::common::operator::{helm_template, pipe, prepared};
use serde_json::Value;

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
    "eureka.watchNamespaces={shop,billing}",
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

    cluster.kubectl_ok(&["create", "namespace", "chart-test"]);
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
    assert_eq!(var("EUREKA_WATCH_NAMESPACES")["value"], "shop,billing");
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
