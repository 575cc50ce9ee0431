//! Plan tests on YAML fixtures of EurekaApps and Pods.

use super::*;
use crate::k8s::{crd::EurekaApp, pods::PodInfo};
use k8s_openapi::api::core::v1::Pod;

const NOW: i64 = 1_800_000_000_000;

fn app(yaml: &str) -> EurekaApp {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("bad EurekaApp fixture: {e}"))
}

fn pod(name: &str, extra: &str) -> PodInfo {
    let yaml = format!(
        r#"
metadata:
  name: {name}
  namespace: shop
  uid: uid-{name}
  labels: {{app: orders, track: stable}}
spec:
  nodeName: node-a
  containers:
  - name: app
    image: orders:1
    ports: [{{name: http, containerPort: 8080}}, {{name: mgmt, containerPort: 8081}}, {{name: https, containerPort: 8443}}]
status:
  podIP: 10.1.0.{n}
  podIPs: [{{ip: 10.1.0.{n}}}, {{ip: "fd00::{n}"}}]
  hostIP: 192.168.0.1
  conditions: [{{type: Ready, status: "True"}}]
{extra}"#,
        n = name.len()
    );
    let mut p: Pod = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("bad pod fixture: {e}"));
    // Fixtures add to a base pod; merge the extras the simple way.
    p.metadata.namespace = Some("shop".into());
    PodInfo::from_pod(&p).unwrap()
}

/// `app`'s plan in `shop` for `pods` (node-a in zone-1; the controller's tests plan with it too).
pub(crate) fn run(app: &EurekaApp, pods: &[PodInfo]) -> Plan {
    let zones: BTreeMap<String, String> = [("node-a".to_string(), "zone-1".to_string())].into();
    let ctx = Facts {
        cluster_id: "prod",
        cluster_name: "eu-west",
        cluster_domain: "cluster.local",
        node_zones: &zones,
        now: NOW,
    };
    let target = Target {
        namespace: "shop",
        name: app.metadata.name.as_deref().unwrap(),
        spec: &app.spec,
    };
    plan(&target, pods, &ctx)
}

const BASIC: &str = r#"
apiVersion: eureka-operator.dev/v1alpha1
kind: EurekaApp
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  port: http
"#;

#[test]
fn a_ready_pod_becomes_an_up_instance_with_java_like_fields() {
    let p = run(&app(BASIC), &[pod("orders-1", "")]);
    assert_eq!(p.app_name, "ORDERS");
    assert_eq!(p.selected, 1);
    assert!(p.problems.is_empty());
    let d = &p.desired[0];
    let i = &d.info;
    assert_eq!(i.id(), "orders-1.shop:orders:8080");
    assert_eq!(i.host_name, "10.1.0.8");
    assert_eq!(i.ip_addr, "10.1.0.8");
    assert_eq!(i.status, Status::Up);
    assert_eq!(
        i.port,
        PortInfo {
            port: 8080,
            enabled: true
        }
    );
    assert!(!i.secure_port.enabled);
    assert_eq!(i.vip_address.as_deref(), Some("orders"));
    assert_eq!(i.home_page_url.as_deref(), Some("http://10.1.0.8:8080/"));
    assert_eq!(
        i.health_check_url.as_deref(),
        Some("http://10.1.0.8:8080/actuator/health")
    );
    assert_eq!(i.metadata.get("zone"), Some("zone-1"));
    assert_eq!(i.metadata.get(keys::CLUSTER), Some("prod"));
    assert_eq!(i.metadata.get(keys::CLUSTER_NAME), Some("eu-west"));
    assert_eq!(i.metadata.get(keys::EUREKA_APP), Some("orders"));
    assert_eq!(i.metadata.get(keys::POD), Some("orders-1"));
    assert_eq!(i.metadata.get(keys::NAMESPACE), Some("shop"));
    assert_eq!(d.overrides, PodOverrides::NONE);
    assert_eq!(
        d.owner,
        PodOwner {
            namespace: "shop".into(),
            eureka_app: "orders".into(),
            pod: "orders-1".into()
        }
    );
}

#[test]
fn selection_follows_labels_and_expressions() {
    let a = app(r#"
metadata: {name: orders, namespace: shop}
spec:
  selector:
    matchLabels: {app: orders}
    matchExpressions: [{key: track, operator: In, values: [canary]}]
"#);
    assert_eq!(run(&a, &[pod("orders-1", "")]).selected, 0);
    let mut canary = pod("orders-2", "");
    canary.labels.insert("track", "canary");
    assert_eq!(run(&a, &[pod("orders-1", ""), canary]).selected, 1);
    let bad = app(r#"
metadata: {name: orders, namespace: shop}
spec: {selector: {matchExpressions: [{key: track, operator: Near}]}}
"#);
    assert!(run(&bad, &[pod("orders-1", "")]).invalid.unwrap().contains("Near"));
    assert!(run(&bad, &[]).invalid.is_some(), "found without any pod");
    let no_values = app(r#"
metadata: {name: orders, namespace: shop}
spec: {selector: {matchExpressions: [{key: track, operator: In}]}}
"#);
    assert!(run(&no_values, &[]).invalid.unwrap().contains("needs values"));
    let empty = app("metadata: {name: orders, namespace: shop}\nspec: {selector: {}}\n");
    assert!(run(&empty, &[pod("orders-1", "")]).invalid.is_some());
}

#[test]
fn not_ready_and_terminating_pods_map_as_configured() {
    let mut unready = pod("orders-1", "");
    unready.ready = false;
    let p = run(&app(BASIC), std::slice::from_ref(&unready));
    assert_eq!(p.desired[0].info.status, Status::Starting);
    let down = app(&format!("{BASIC}  notReady: DOWN\n"));
    assert_eq!(
        run(&down, std::slice::from_ref(&unready)).desired[0].info.status,
        Status::Down
    );
    let gone = app(&format!("{BASIC}  notReady: Deregister\n"));
    let p = run(&gone, std::slice::from_ref(&unready));
    assert!(p.desired.is_empty());
    assert_eq!(p.selected, 1);

    // Terminating: OUT_OF_SERVICE during the drain, then gone; the plan says when to look again.
    let mut term = pod("orders-1", "");
    term.deleting_since = Some(NOW - 10_000);
    let p = run(&app(BASIC), std::slice::from_ref(&term));
    assert_eq!(p.desired[0].info.status, Status::OutOfService);
    assert_eq!(p.wake_at, Some(NOW + 20_000), "default drain is 30 s");
    term.deleting_since = Some(NOW - 30_000);
    assert!(run(&app(BASIC), std::slice::from_ref(&term)).desired.is_empty());
    let immediate = app(&format!("{BASIC}  terminating: Deregister\n"));
    term.deleting_since = Some(NOW);
    assert!(run(&immediate, std::slice::from_ref(&term)).desired.is_empty());
    // A terminating pod that is not ready any more still drains as OUT_OF_SERVICE.
    term.ready = false;
    term.deleting_since = Some(NOW - 1);
    assert_eq!(run(&app(BASIC), &[term]).desired[0].info.status, Status::OutOfService);

    let mut done = pod("orders-1", "");
    done.phase = Some("Succeeded".into());
    assert_eq!(run(&app(BASIC), &[done]).selected, 0);
}

#[test]
fn ports_by_name_and_number_and_a_missing_name_is_a_problem() {
    let a = app(r#"
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  port: 9000
  securePort: {port: https}
  managementPort: mgmt
  urls: {statusPage: /info, healthCheck: /health}
"#);
    let p = run(&a, &[pod("orders-1", "")]);
    let i = &p.desired[0].info;
    assert_eq!(i.port.port, 9000);
    assert_eq!(
        i.secure_port,
        PortInfo {
            port: 8443,
            enabled: true
        }
    );
    assert_eq!(i.status_page_url.as_deref(), Some("http://10.1.0.8:8081/info"));
    assert_eq!(i.health_check_url.as_deref(), Some("http://10.1.0.8:8081/health"));
    assert_eq!(i.secure_health_check_url(), Some("https://10.1.0.8:8443/health"));
    assert_eq!(i.metadata.get("management.port"), Some("8081"));

    let missing = app(&BASIC.replace("port: http", "port: grpc"));
    let p = run(&missing, &[pod("orders-1", ""), pod("orders-22", "")]);
    assert!(p.desired.is_empty());
    assert_eq!(p.problems.len(), 2);
    assert_eq!(p.problems[0].reason(), "PortNotFound");
    assert!(p.problems[0].message().contains("\"grpc\""));
    // No port given: the first TCP container port.
    let none = app("metadata: {name: orders, namespace: shop}\nspec: {selector: {matchLabels: {app: orders}}}\n");
    assert_eq!(run(&none, &[pod("orders-1", "")]).desired[0].info.port.port, 8080);
}

#[test]
fn host_name_modes_ip_family_and_instance_id_templates() {
    let mode = |m: &str| app(&format!("{BASIC}  hostName: {m}\n"));
    let mut p = pod("orders-1", "");
    assert_eq!(
        run(&mode("PodName"), std::slice::from_ref(&p)).desired[0]
            .info
            .host_name,
        "orders-1"
    );
    assert_eq!(
        run(&mode("NodeIP"), std::slice::from_ref(&p)).desired[0].info.host_name,
        "192.168.0.1"
    );
    assert_eq!(
        run(&mode("PodFQDN"), std::slice::from_ref(&p)).desired[0]
            .info
            .host_name,
        "10-1-0-8.shop.pod.cluster.local"
    );
    p.hostname = Some("orders-1".into());
    p.subdomain = Some("orders".into());
    assert_eq!(
        run(&mode("PodFQDN"), std::slice::from_ref(&p)).desired[0]
            .info
            .host_name,
        "orders-1.orders.shop.svc.cluster.local"
    );

    let v6 = app(&format!("{BASIC}  ipFamily: IPv6\n"));
    let d = &run(&v6, std::slice::from_ref(&p)).desired[0];
    assert_eq!(d.info.ip_addr, "fd00::8");
    assert_eq!(d.info.home_page_url.as_deref(), Some("http://[fd00::8]:8080/"));
    let mut v4only = pod("orders-1", "");
    v4only.ips.truncate(1);
    let p6 = run(&v6, &[v4only]);
    assert!(p6.desired.is_empty());
    assert_eq!(p6.problems[0].reason(), "NoAddress");

    let templ = app(&format!(
        "{BASIC}  instanceId: \"{{cluster}}/{{pod.uid}}/{{node}}:{{port}}\"\n"
    ));
    assert_eq!(
        run(&templ, &[pod("orders-1", "")]).desired[0].info.id(),
        "prod/uid-orders-1/node-a:8080"
    );
    // StatefulSet pod names repeat across clusters; the cluster's name keeps the ids apart.
    let named = app(&format!(
        "{BASIC}  instanceId: \"{{pod.name}}.{{clusterName}}:{{appName}}:{{port}}\"\n"
    ));
    assert_eq!(
        run(&named, &[pod("orders-1", "")]).desired[0].info.id(),
        "orders-1.eu-west:orders:8080"
    );
}

#[test]
fn metadata_from_static_labels_annotations_fields_and_zone() {
    let a = app(r#"
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  metadata:
    static: {team: payments, k8s.pod: spoofed}
    fromLabels: [track, app.kubernetes.io/version, missing]
    fromAnnotations: [owner]
    podFields: [PodName, NodeName, Workload]
  zone: {fromNode: false, value: eu-1}
"#);
    let mut p = pod("orders-1", "");
    p.labels.insert("app.kubernetes.io/version", "1.2.3");
    p.annotations.insert("owner", "alice");
    p.annotations.insert("secret", "no");
    let md = run(&a, &[p]).desired[0].info.metadata.clone();
    assert_eq!(md.get("team"), Some("payments"));
    assert_eq!(md.get("track"), Some("stable"));
    assert_eq!(md.get("app.kubernetes.io.version"), Some("1.2.3"), "XML-safe key");
    assert_eq!(md.get("missing"), None);
    assert_eq!(md.get("owner"), Some("alice"));
    assert_eq!(md.get("secret"), None, "annotations are allow-listed");
    assert_eq!(md.get("k8s.podName"), Some("orders-1"));
    assert_eq!(md.get("k8s.node"), Some("node-a"));
    assert_eq!(md.get("zone"), Some("eu-1"));
    assert_eq!(
        md.get(keys::POD),
        Some("orders-1"),
        "ownership keys cannot be overwritten"
    );
    assert_eq!(metadata_key("9lives/x y"), "_9lives.x_y");
}

#[test]
fn overrides_annotation_then_selector_then_app() {
    let a = app(r#"
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  statusOverride: {status: OUT_OF_SERVICE, reason: maintenance}
  statusOverrides:
  - selector: {matchLabels: {track: canary}}
    status: UP
"#);
    let stable = pod("orders-1", "");
    let mut canary = pod("orders-22", "");
    canary.labels.insert("track", "canary");
    let mut annotated = pod("orders-333", "");
    annotated.annotations.insert(STATUS_OVERRIDE_ANNOTATION, "DOWN");
    let mut bad = pod("orders-4444", "");
    bad.annotations.insert(STATUS_OVERRIDE_ANNOTATION, "down");
    let p = run(&a, &[stable, canary, annotated, bad]);
    let by_pod: BTreeMap<&str, (Option<Status>, Status)> = p
        .desired
        .iter()
        .map(|d| (d.owner.pod.as_str(), (d.overrides.annotation, d.overrides.spec)))
        .collect();
    assert_eq!(by_pod["orders-1"], (None, Status::OutOfService));
    assert_eq!(by_pod["orders-22"], (None, Status::Up));
    assert_eq!(by_pod["orders-333"], (Some(Status::Down), Status::OutOfService));
    assert_eq!(by_pod["orders-4444"], (None, Status::OutOfService));
    assert_eq!(p.problems[0].reason(), "BadOverrideAnnotation");
}

#[test]
fn pods_without_an_address_wait_quietly() {
    let mut p = pod("orders-1", "");
    p.ips.clear();
    let plan = run(&app(BASIC), &[p]);
    assert!(plan.desired.is_empty() && plan.problems.is_empty());
    assert_eq!(plan.selected, 1);
}

#[test]
fn lease_terms_and_vips() {
    let a = app(r#"
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  appName: order-service
  vipAddress: orders.shop
  lease: {renewalIntervalSeconds: 5, durationSeconds: 15}
"#);
    let i = &run(&a, &[pod("orders-1", "")]).desired[0].info;
    assert_eq!(i.app, "ORDER-SERVICE");
    assert_eq!(i.id(), "orders-1.shop:order-service:8080");
    assert_eq!(
        i.lease,
        LeaseTerms {
            renewal_interval_secs: 5,
            duration_secs: 15
        }
    );
    assert_eq!(i.vip_address.as_deref(), Some("orders.shop"));
    assert_eq!(i.secure_vip_address.as_deref(), Some("orders.shop"));
}

#[test]
fn spring_presets_give_springs_instance_ids_and_host_names() {
    let spring = app(&format!("{BASIC}  preset: Spring\n"));
    let mut p = pod("orders-1", "");
    let d = &run(&spring, std::slice::from_ref(&p)).desired[0];
    // `${spring.cloud.client.hostname}:${spring.application.name}:${server.port}`
    assert_eq!(d.info.id(), "orders-1:orders:8080");
    assert_eq!(d.info.host_name, "orders-1");
    let prefer_ip = app(&format!("{BASIC}  preset: SpringPreferIpAddress\n"));
    let d = &run(&prefer_ip, std::slice::from_ref(&p)).desired[0];
    assert_eq!(
        d.info.id(),
        "orders-1:orders:8080",
        "prefer-ip-address does not change the id"
    );
    assert_eq!(d.info.host_name, "10.1.0.8");
    // A pod with a subdomain resolves its own address to its FQDN (the kubelet's /etc/hosts).
    p.hostname = Some("orders-a".into());
    p.subdomain = Some("orders".into());
    let d = &run(&spring, std::slice::from_ref(&p)).desired[0];
    assert_eq!(d.info.id(), "orders-a.orders.shop.svc.cluster.local:orders:8080");
    assert_eq!(d.info.host_name, "orders-a.orders.shop.svc.cluster.local");
    // The placeholder on its own, for an application name in another case.
    let templ = app(&format!(
        "{BASIC}  instanceId: \"{{pod.hostname}}:Orders-Service:{{port}}\"\n"
    ));
    assert_eq!(
        run(&templ, &[pod("orders-1", "")]).desired[0].info.id(),
        "orders-1:Orders-Service:8080"
    );
}

const ADOPT: &str = r#"
apiVersion: eureka-operator.dev/v1alpha1
kind: EurekaApp
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  port: http
  registration: Adopt
  drainSeconds: 5
"#;

#[test]
fn adopt_mode_plans_claims_on_the_pods_endpoints_not_instances() {
    let p = run(&app(ADOPT), &[pod("orders-1", "")]);
    assert!(p.desired.is_empty());
    let c = &p.claims[0];
    assert_eq!(
        c.key,
        ClaimKey {
            app: "ORDERS".into(),
            ip: "10.1.0.8".into(),
            port: 8080
        }
    );
    assert_eq!(c.owner.pod, "orders-1");
    assert_eq!(c.instance_id, None, "any id from the endpoint, unless asked");
    assert_eq!(
        c.state,
        ClaimState::Live {
            status: Status::Up,
            spec: Status::Unknown
        }
    );
    assert_eq!(c.linger_ms, 5_000);
}

/// Not Ready: the configured status; an override from the EurekaApp or the pod's annotation.
#[test]
fn adopt_mode_claims_carry_readiness_and_overrides() {
    let mut unready = pod("orders-1", "");
    unready.ready = false;
    let down = app(&format!("{ADOPT}  notReady: DOWN\n"));
    assert_eq!(
        run(&down, std::slice::from_ref(&unready)).claims[0].state,
        ClaimState::Live {
            status: Status::Down,
            spec: Status::Unknown
        }
    );
    let mut annotated = pod("orders-1", "");
    annotated
        .annotations
        .insert(STATUS_OVERRIDE_ANNOTATION, "OUT_OF_SERVICE");
    let maintenance = app(&format!("{ADOPT}  statusOverride: {{status: UP}}\n"));
    assert_eq!(
        run(&maintenance, &[annotated]).claims[0].state,
        ClaimState::Live {
            status: Status::Up,
            spec: Status::OutOfService
        }
    );
}

/// Terminating: OUT_OF_SERVICE during the drain (look again when it ends), then drained.
#[test]
fn adopt_mode_claims_drain_a_terminating_pod() {
    let mut term = pod("orders-1", "");
    term.deleting_since = Some(NOW - 1_000);
    let p = run(&app(ADOPT), std::slice::from_ref(&term));
    assert_eq!(
        p.claims[0].state,
        ClaimState::Live {
            status: Status::OutOfService,
            spec: Status::Unknown
        }
    );
    assert_eq!(p.wake_at, Some(NOW + 4_000));
    term.deleting_since = Some(NOW - 5_000);
    let p = run(&app(ADOPT), std::slice::from_ref(&term));
    assert_eq!(p.claims[0].state, ClaimState::Drained);
    assert_eq!(p.wake_at, None);
    let at_once = app(&format!("{ADOPT}  terminating: Deregister\n"));
    term.deleting_since = Some(NOW);
    assert_eq!(run(&at_once, &[term]).claims[0].state, ClaimState::Drained);
}

#[test]
fn adopt_mode_holds_pods_it_cannot_claim() {
    // No address yet: nothing to recognize a registration by.
    let mut scheduled = pod("orders-1", "");
    scheduled.ips.clear();
    assert!(run(&app(ADOPT), &[scheduled]).claims.is_empty());
    // A port that is not there: held, with a problem.
    let p = run(&app(&ADOPT.replace("port: http", "port: grpc")), &[pod("orders-1", "")]);
    assert!(p.claims.is_empty());
    assert_eq!(p.held, ["orders-1"]);
    assert_eq!(p.problems[0].reason(), "PortNotFound");
}

#[test]
fn adopt_mode_matches_by_id_and_refuses_not_ready_deregister() {
    // Matching by id too: the preset's (Spring's) id.
    let by_id = app(&format!(
        "{ADOPT}  preset: Spring\n  adoption: {{matchInstanceId: true}}\n"
    ));
    assert_eq!(
        run(&by_id, &[pod("orders-1", "")]).claims[0].instance_id.as_deref(),
        Some("orders-1:orders:8080")
    );
    // `notReady: Deregister` cannot work with a client that registers again: refused.
    let p = run(
        &app(&format!("{ADOPT}  notReady: Deregister\n")),
        &[pod("orders-1", "")],
    );
    assert!(p.invalid.as_deref().is_some_and(|m| m.contains("Adopt")), "{p:?}");
    assert!(p.claims.is_empty());
}
