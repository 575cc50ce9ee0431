//! The EurekaApp controller against a real kube-apiserver: the tests create namespaces, Pods
//! (writing their status as the kubelet would) and EurekaApps, and check the registry through its
//! REST API. The operator runs as the Helm chart's ServiceAccount, with exactly the chart's RBAC.

use std::{net::Ipv4Addr, time::Duration};

use crate::common::{
    eureka::{SpringClient, http},
    operator::{
        Operator, app_status, delete_pod, eureka_app, instance, instances, kubectl_apply, label, namespace, pod,
        prepared, set_ready, wait_condition, wait_instances,
    },
    process::{connections_to, wait_for},
};

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);

const ORDERS: &str = "  selector:\n    matchLabels: {app: orders}\n  port: http\n  drainSeconds: 2\n";

#[tokio::test]
async fn readiness_and_termination_drive_the_status_and_the_drain() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-lifecycle";
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "ctl-lifecycle", &[]).await;
    eureka_app(cluster, ns, "orders", ORDERS);
    pod(
        &client,
        ns,
        "orders-0",
        &[("app", "orders")],
        &[("http", 8080)],
        "node-1",
    )
    .await;
    // No IP yet: nothing to register.
    wait_condition(cluster, ns, "orders", "Ready", "True").await;
    assert!(instances(&op.server, "ORDERS").await.is_empty());

    set_ready(&client, ns, "orders-0", "10.20.0.1", false).await;
    wait_instances(
        &op.server,
        "ORDERS",
        &[("orders-0.ctl-lifecycle:orders:8080", "STARTING")],
    )
    .await;
    set_ready(&client, ns, "orders-0", "10.20.0.1", true).await;
    wait_instances(&op.server, "ORDERS", &[("orders-0.ctl-lifecycle:orders:8080", "UP")]).await;
    let i = instance(&op.server, "ORDERS", "orders-0.ctl-lifecycle:orders:8080")
        .await
        .unwrap();
    assert_eq!(i["ipAddr"], "10.20.0.1");
    assert_eq!(i["port"]["$"], 8080);
    assert_eq!(i["metadata"]["k8s.eurekaApp"], "orders");
    assert_eq!(i["metadata"]["k8s.cluster"], "test");

    // Termination: OUT_OF_SERVICE at once, gone after the 2 s drain.
    delete_pod(&client, ns, "orders-0").await;
    wait_instances(
        &op.server,
        "ORDERS",
        &[("orders-0.ctl-lifecycle:orders:8080", "OUT_OF_SERVICE")],
    )
    .await;
    wait_instances(&op.server, "ORDERS", &[]).await;
}

#[tokio::test]
async fn selector_and_label_changes_follow() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-selector";
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "ctl-selector", &[]).await;
    eureka_app(cluster, ns, "orders", ORDERS);
    for (name, ip) in [("orders-a", "10.21.0.1"), ("orders-b", "10.21.0.2")] {
        pod(&client, ns, name, &[("app", "orders")], &[("http", 8080)], "node-1").await;
        set_ready(&client, ns, name, ip, true).await;
    }
    let a = "orders-a.ctl-selector:orders:8080";
    let b = "orders-b.ctl-selector:orders:8080";
    wait_instances(&op.server, "ORDERS", &[(a, "UP"), (b, "UP")]).await;

    // A pod that stops matching goes; matching again brings it back.
    label(&client, ns, "orders-b", "app", Some("other")).await;
    wait_instances(&op.server, "ORDERS", &[(a, "UP")]).await;
    label(&client, ns, "orders-b", "app", Some("orders")).await;
    wait_instances(&op.server, "ORDERS", &[(a, "UP"), (b, "UP")]).await;

    // A new selector on the EurekaApp.
    label(&client, ns, "orders-a", "track", Some("canary")).await;
    eureka_app(
        cluster,
        ns,
        "orders",
        &ORDERS.replace("{app: orders}", "{app: orders, track: canary}"),
    );
    wait_instances(&op.server, "ORDERS", &[(a, "UP")]).await;
    let s = wait_condition(cluster, ns, "orders", "Ready", "True").await;
    assert_eq!(s["selectedPods"], 1, "{s}");
}

#[tokio::test]
async fn ports_metadata_and_zone_map_onto_the_instance() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-mapping";
    namespace(&client, ns).await;
    let node = serde_json::json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-zoned", "labels": {"topology.kubernetes.io/zone": "zone-b"}}});
    let (ok, out) = kubectl_apply(cluster, &node.to_string());
    assert!(ok, "{out}");
    let op = Operator::start(cluster, IP, ns, "ctl-mapping", &[]).await;
    eureka_app(
        cluster,
        ns,
        "billing",
        "  selector:\n    matchLabels: {app: billing}\n  appName: billing-service\n  port: http\n  managementPort: mgmt\n  \
         urls: {healthCheck: /health}\n  metadata:\n    static: {team: payments}\n    fromLabels: [version]\n    \
         podFields: [PodName, NodeName]\n  lease: {renewalIntervalSeconds: 10, durationSeconds: 30}\n",
    );
    pod(
        &client,
        ns,
        "billing-0",
        &[("app", "billing"), ("version", "1.2")],
        &[("http", 8080), ("mgmt", 8081)],
        "node-zoned",
    )
    .await;
    set_ready(&client, ns, "billing-0", "10.22.0.1", true).await;
    let id = "billing-0.ctl-mapping:billing-service:8080";
    wait_instances(&op.server, "BILLING-SERVICE", &[(id, "UP")]).await;
    let i = instance(&op.server, "BILLING-SERVICE", id).await.unwrap();
    assert_eq!(i["port"]["$"], 8080);
    assert_eq!(i["healthCheckUrl"], "http://10.22.0.1:8081/health");
    assert_eq!(i["vipAddress"], "billing-service");
    assert_eq!(i["leaseInfo"]["durationInSecs"], 30);
    let md = &i["metadata"];
    assert_eq!(md["zone"], "zone-b", "{md}");
    assert_eq!(md["team"], "payments");
    assert_eq!(md["version"], "1.2");
    assert_eq!(md["k8s.podName"], "billing-0");
    assert_eq!(md["k8s.node"], "node-zoned");
    assert_eq!(md["management.port"], "8081");

    // A named port no container declares: Degraded, with an Event.
    eureka_app(
        cluster,
        ns,
        "billing-grpc",
        "  selector:\n    matchLabels: {app: billing}\n  appName: billing-grpc\n  port: grpc\n",
    );
    let s = wait_condition(cluster, ns, "billing-grpc", "Degraded", "True").await;
    let degraded = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()
        .clone();
    assert_eq!(degraded["reason"], "PortNotFound", "{degraded}");
    assert!(degraded["message"].as_str().unwrap().contains("\"grpc\""));
    assert!(instances(&op.server, "BILLING-GRPC").await.is_empty());
    let describe = wait_for(
        "the PortNotFound Event",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&["describe", "ea", "billing-grpc", "-n", ns]);
            out.contains("PortNotFound").then_some(out)
        },
    )
    .await;
    assert!(
        describe.contains("declares no container port named \"grpc\""),
        "{describe}"
    );
}

#[tokio::test]
async fn overrides_from_the_eurekaapp_and_the_rest_api_survive_a_restart() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-overrides";
    namespace(&client, ns).await;
    let mut op = Operator::start(cluster, IP, ns, "ctl-overrides", &[]).await;
    let spec = "  selector:\n    matchLabels: {app: orders}\n  port: http\n  statusOverride: {status: OUT_OF_SERVICE, reason: maintenance}\n  \
                statusOverrides:\n  - selector: {matchLabels: {track: canary}}\n    status: UP\n";
    eureka_app(cluster, ns, "orders", spec);
    pod(
        &client,
        ns,
        "stable-0",
        &[("app", "orders")],
        &[("http", 8080)],
        "node-1",
    )
    .await;
    pod(
        &client,
        ns,
        "canary-0",
        &[("app", "orders"), ("track", "canary")],
        &[("http", 8080)],
        "node-1",
    )
    .await;
    set_ready(&client, ns, "stable-0", "10.23.0.1", true).await;
    set_ready(&client, ns, "canary-0", "10.23.0.2", true).await;
    let stable = "stable-0.ctl-overrides:orders:8080";
    let canary = "canary-0.ctl-overrides:orders:8080";
    wait_instances(&op.server, "ORDERS", &[(stable, "OUT_OF_SERVICE"), (canary, "UP")]).await;
    let i = instance(&op.server, "ORDERS", stable).await.unwrap();
    assert_eq!(i["overriddenStatus"], "OUT_OF_SERVICE");

    // The REST status API on a pod instance: applied at once and recorded on the pod.
    let url = format!("{}apps/ORDERS/{stable}/status", op.server.url());
    assert_eq!(
        http().put(format!("{url}?value=UP")).send().await.unwrap().status(),
        200
    );
    wait_instances(&op.server, "ORDERS", &[(stable, "UP"), (canary, "UP")]).await;
    let annotation = || {
        cluster.kubectl_ok(&[
            "get",
            "pod",
            "stable-0",
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.annotations.eureka-operator\\.dev/status-override}",
        ])
    };
    wait_for(
        "the override annotation",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { (annotation() == "UP").then_some(()) },
    )
    .await;

    // A restart forgets nothing: the EurekaApp and the annotation hold the overrides.
    op.restart(ns, "ctl-overrides").await;
    wait_instances(&op.server, "ORDERS", &[(stable, "UP"), (canary, "UP")]).await;

    // Deleting the REST override falls back to the EurekaApp's, and clears the annotation.
    assert_eq!(http().delete(&url).send().await.unwrap().status(), 200);
    wait_instances(&op.server, "ORDERS", &[(stable, "OUT_OF_SERVICE"), (canary, "UP")]).await;
    wait_for(
        "the annotation to go",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { annotation().is_empty().then_some(()) },
    )
    .await;
    op.restart(ns, "ctl-overrides").await;
    wait_instances(&op.server, "ORDERS", &[(stable, "OUT_OF_SERVICE"), (canary, "UP")]).await;

    // The maintenance ends.
    eureka_app(
        cluster,
        ns,
        "orders",
        &spec.replace("  statusOverride: {status: OUT_OF_SERVICE, reason: maintenance}\n", ""),
    );
    wait_instances(&op.server, "ORDERS", &[(stable, "UP"), (canary, "UP")]).await;

    // Once a REST override is on the pod, the annotation is the truth: kubectl edits apply
    // without a restart.
    assert_eq!(
        http().put(format!("{url}?value=DOWN")).send().await.unwrap().status(),
        200
    );
    wait_instances(&op.server, "ORDERS", &[(stable, "DOWN"), (canary, "UP")]).await;
    wait_for(
        "the override annotation",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { (annotation() == "DOWN").then_some(()) },
    )
    .await;
    let key = "eureka-operator.dev/status-override";
    cluster.kubectl_ok(&["annotate", "pod", "stable-0", "-n", ns, &format!("{key}-")]);
    wait_instances(&op.server, "ORDERS", &[(stable, "UP"), (canary, "UP")]).await;
    cluster.kubectl_ok(&[
        "annotate",
        "pod",
        "stable-0",
        "-n",
        ns,
        &format!("{key}=OUT_OF_SERVICE"),
    ]);
    wait_instances(&op.server, "ORDERS", &[(stable, "OUT_OF_SERVICE"), (canary, "UP")]).await;
}

/// #21.5: an EurekaApp carries no finalizer, so deleting it (or its namespace) never waits on
/// the operator; its instances go at once, through the watch. The sweep is set far out, so only
/// the watch can remove them within the bound.
#[tokio::test]
async fn deleting_an_eurekaapp_deregisters_at_once_and_waits_on_no_finalizer() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-delete";
    namespace(&client, ns).await;
    let op = Operator::start(
        cluster,
        IP,
        ns,
        "ctl-delete",
        &["--pod-instance-sweep-interval-ms", "600000"],
    )
    .await;
    eureka_app(cluster, ns, "orders", ORDERS);
    pod(
        &client,
        ns,
        "orders-0",
        &[("app", "orders")],
        &[("http", 8080)],
        "node-1",
    )
    .await;
    set_ready(&client, ns, "orders-0", "10.24.0.1", true).await;
    wait_instances(&op.server, "ORDERS", &[("orders-0.ctl-delete:orders:8080", "UP")]).await;
    // Reconciled and its status written: still no finalizer.
    wait_for(
        "the status",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let s = cluster.kubectl_ok(&["get", "ea", "orders", "-n", ns, "-o", "jsonpath={.status.instances.up}"]);
            (s.trim() == "1").then_some(())
        },
    )
    .await;
    let finalizers = cluster.kubectl_ok(&["get", "ea", "orders", "-n", ns, "-o", "jsonpath={.metadata.finalizers}"]);
    assert_eq!(finalizers.trim(), "", "no finalizer");
    let deleted = std::time::Instant::now();
    cluster.kubectl_ok(&["delete", "ea", "orders", "-n", ns, "--wait=false"]);
    wait_for(
        "the instances to go",
        Duration::from_secs(3),
        Duration::from_millis(25),
        || async { instances(&op.server, "ORDERS").await.is_empty().then_some(()) },
    )
    .await;
    eprintln!(
        "FIGURES delete: instances gone {:?} after the delete",
        deleted.elapsed()
    );
    assert!(
        op.server.proc.log().contains("deregistered 1 instances (deleted)"),
        "{}",
        op.server.proc.log_tail(30)
    );
}

#[tokio::test]
async fn invalid_specs_are_refused_at_admission_or_reported() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-invalid";
    namespace(&client, ns).await;
    let manifest = |spec: &str| {
        format!(
            "apiVersion: eureka-operator.dev/v1alpha1\nkind: EurekaApp\nmetadata: {{name: bad, namespace: {ns}}}\nspec:\n{spec}"
        )
    };
    for (spec, message) in [
        ("  selector: {}\n", "selector must have matchLabels or matchExpressions"),
        (
            "  selector: {matchLabels: {app: x}}\n  drainSeconds: 99999\n",
            "drainSeconds must be between 0 and 3600",
        ),
        (
            "  selector: {matchLabels: {app: x}}\n  instanceId: \"{appName}:{port}\"\n",
            "unique per pod",
        ),
        (
            "  selector: {matchLabels: {app: x}}\n  lease: {renewalIntervalSeconds: 30, durationSeconds: 10}\n",
            "durationSeconds must be longer",
        ),
        (
            "  selector: {matchLabels: {app: x}}\n  notReady: MAYBE\n",
            "Unsupported value: \"MAYBE\"",
        ),
        (
            "  selector: {matchLabels: {app: x}}\n  appName: \"bad name!\"\n",
            "appName must be letters",
        ),
        (
            "  selector: {matchLabels: {app: x}}\n  port: 70000\n",
            "a port must be a number from 1 to 65535",
        ),
        (
            "  selector: {matchLabels: {app: x}}\n  statusOverride: {status: SIDEWAYS}\n",
            "SIDEWAYS",
        ),
    ] {
        let (ok, out) = kubectl_apply(cluster, &manifest(spec));
        assert!(!ok, "accepted: {spec}");
        assert!(out.contains(message), "{spec}: {out}");
    }

    // What admission cannot see is reported in the conditions.
    let _op = Operator::start(cluster, IP, ns, "ctl-invalid", &[]).await;
    eureka_app(
        cluster,
        ns,
        "odd",
        "  selector:\n    matchExpressions: [{key: app, operator: Near, values: [x]}]\n",
    );
    let s = wait_condition(cluster, ns, "odd", "Degraded", "True").await;
    let ready = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "InvalidSpec", "{s}");
}

#[tokio::test]
async fn status_and_events_show_in_kubectl_and_conflicts_are_reported() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-kubectl";
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "ctl-kubectl", &[]).await;
    // A natively registered client already holds the id pod orders-1 would get.
    let taken = "orders-1.ctl-kubectl:orders:8080";
    let body = format!(
        r#"{{"instance":{{"instanceId":"{taken}","hostName":"h","app":"ORDERS","ipAddr":"10.9.9.9",
        "dataCenterInfo":{{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"}}}}}}"#
    );
    let r = http()
        .post(format!("{}apps/ORDERS", op.server.url()))
        .header("content-type", "application/json")
        .body(body);
    assert_eq!(r.send().await.unwrap().status(), 204);

    eureka_app(cluster, ns, "orders", ORDERS);
    for (name, ip) in [("orders-0", "10.25.0.1"), ("orders-1", "10.25.0.2")] {
        pod(&client, ns, name, &[("app", "orders")], &[("http", 8080)], "node-1").await;
        set_ready(&client, ns, name, ip, true).await;
    }
    let s = wait_condition(cluster, ns, "orders", "Conflict", "True").await;
    let conflict = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Conflict")
        .unwrap()
        .clone();
    assert!(
        conflict["message"].as_str().unwrap().contains("natively registered"),
        "{conflict}"
    );
    // Both ids UP; the address of whoever holds the contested one.
    let holder_of_taken = || async {
        wait_instances(
            &op.server,
            "ORDERS",
            &[("orders-0.ctl-kubectl:orders:8080", "UP"), (taken, "UP")],
        )
        .await;
        instance(&op.server, "ORDERS", taken).await.unwrap()["ipAddr"].clone()
    };
    // The native client keeps its registration.
    assert_eq!(holder_of_taken().await, "10.9.9.9");

    let table = wait_for(
        "kubectl get ea",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&["get", "ea", "-n", ns]);
            out.lines()
                .nth(1)
                .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>()[..5] == ["orders", "ORDERS", "2", "1", "0"])
                .then_some(out)
        },
    )
    .await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "APP",
            "SELECTED",
            "UP",
            "OUT-OF-SERVICE",
            "READY",
            "REASON",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[5], "False", "not Ready while in conflict: {table}");
    assert_eq!(row[6], "Conflict", "the Reason column says why: {table}");
    let describe = wait_for(
        "the Events",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&["describe", "ea", "orders", "-n", ns]);
            (out.contains("Registered") && out.contains("InstanceIdConflict")).then_some(out)
        },
    )
    .await;
    assert!(describe.contains("registered 1 instance(s) of ORDERS"), "{describe}");
    assert!(
        app_status(cluster, ns, "orders").await["observedGeneration"]
            .as_i64()
            .is_some()
    );

    // The native client goes: the pod takes the id at once (nothing else changes in the cluster)
    // and the conflict clears.
    let r = http().delete(format!("{}apps/ORDERS/{taken}", op.server.url()));
    assert_eq!(r.send().await.unwrap().status(), 200);
    assert_eq!(holder_of_taken().await, "10.25.0.2");
    wait_condition(cluster, ns, "orders", "Conflict", "False").await;
}

#[tokio::test]
async fn spring_client_discovers_pods_and_scale_down_never_trips_self_preservation() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-spring";
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "ctl-spring", &[]).await;
    eureka_app(cluster, ns, "orders", &format!("{ORDERS}  terminating: Deregister\n"));
    let mut ids = Vec::new();
    for n in 0..6 {
        let name = format!("orders-{n}");
        pod(&client, ns, &name, &[("app", "orders")], &[("http", 8080)], "node-1").await;
        set_ready(&client, ns, &name, &format!("10.26.0.{}", n + 1), true).await;
        ids.push(format!("{name}.ctl-spring:orders:8080"));
    }
    let expected: Vec<(&str, &str)> = ids.iter().map(|i| (i.as_str(), "UP")).collect();
    wait_instances(&op.server, "ORDERS", &expected).await;

    let Some(spring) = SpringClient::start(&op.server.url(), "spring-app", "spring-app-1", &[]).await else {
        return;
    };
    let want: Vec<(String, String)> = ids.iter().map(|i| (i.clone(), "UP".to_string())).collect();
    wait_for(
        "the Spring client to discover every pod",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (spring.seen_all("ORDERS").await == want).then_some(()) },
    )
    .await;

    let threshold = op.server.metric("eureka_renewals_per_minute_threshold").await.unwrap();
    let expected_clients = op.server.metric("eureka_expected_clients").await.unwrap();
    // Scale to zero: deliberate cancels, not missed heartbeats.
    for n in 0..6 {
        delete_pod(&client, ns, &format!("orders-{n}")).await;
    }
    wait_instances(&op.server, "ORDERS", &[]).await;
    assert_eq!(
        op.server.metric("eureka_renewals_per_minute_threshold").await.unwrap(),
        threshold
    );
    assert_eq!(
        op.server.metric("eureka_expected_clients").await.unwrap(),
        expected_clients
    );
    wait_for(
        "the Spring client to see them gone",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { spring.seen_all("ORDERS").await.is_empty().then_some(()) },
    )
    .await;
    let stats = spring.stats().await;
    crate::common::clients::assert_no_mismatch("the Spring client", "the operator", &stats, true);
}

/// Measures how long a pod's readiness takes to show in `GET /eureka/apps/{app}`.
#[tokio::test]
async fn readiness_reaches_the_registry_in_milliseconds() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-latency";
    namespace(&client, ns).await;
    let op = Operator::start(cluster, IP, ns, "ctl-latency", &[]).await;
    eureka_app(cluster, ns, "orders", ORDERS);
    const N: usize = 30;
    for n in 0..N {
        let name = format!("orders-{n}");
        pod(&client, ns, &name, &[("app", "orders")], &[("http", 8080)], "node-1").await;
        set_ready(&client, ns, &name, &format!("10.27.0.{}", n + 1), false).await;
    }
    wait_for(
        "all pods STARTING",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            (instances(&op.server, "ORDERS")
                .await
                .iter()
                .filter(|(_, s)| s == "STARTING")
                .count()
                == N)
                .then_some(())
        },
    )
    .await;
    let http = http();
    let mut samples = Vec::new();
    for n in 0..N {
        let name = format!("orders-{n}");
        let id = format!("{name}.ctl-latency:orders:8080");
        let started = std::time::Instant::now();
        set_ready(&client, ns, &name, &format!("10.27.0.{}", n + 1), true).await;
        loop {
            let r = http
                .get(format!("{}apps/ORDERS/{id}", op.server.url()))
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            let v: serde_json::Value = r.json().await.unwrap();
            if v["instance"]["status"] == "UP" {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{id} never became UP");
        }
        samples.push(started.elapsed());
    }
    samples.sort();
    let p50 = samples[N / 2];
    let p99 = samples[(N * 99).div_ceil(100) - 1];
    println!(
        "READY_TO_VISIBLE n={N} p50={p50:?} p99={p99:?} max={:?}",
        samples[N - 1]
    );
    assert!(
        p99 < Duration::from_secs(1),
        "Ready to visible must be well under a second: p99 {p99:?}"
    );
}

/// `kubectl explain` describes every field of the EurekaApp, as the real apiserver publishes the
/// CRD's schema: the resource, each field of spec and status, and the fields of objects in lists
/// (an empty description fails, naming the field).
#[tokio::test]
async fn kubectl_explain_describes_every_field() {
    let Some(cluster) = prepared() else { return };
    let crd = eureka_operator::k8s::crd::crd();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    fn fields(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        let object = if schema["type"] == "array" {
            &schema["items"]
        } else {
            schema
        };
        for (name, field) in object["properties"].as_object().into_iter().flatten() {
            let path = format!("{path}.{name}");
            out.push(path.clone());
            // The object's own metadata is Kubernetes' ObjectMeta, described by Kubernetes.
            if path != "eurekaapps.metadata" {
                fields(field, &path, out);
            }
        }
    }
    let mut paths = vec!["eurekaapps".to_string()];
    fields(schema, "eurekaapps", &mut paths);
    assert!(paths.len() > 70, "the walk found the fields: {paths:?}");
    let explain = |path: &str| cluster.kubectl_ok(&["explain", path, "--api-version=eureka-operator.dev/v1alpha1"]);
    let empty: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = paths
            .chunks(paths.len().div_ceil(6))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .filter(|path| {
                            let out = explain(path);
                            let description = out
                                .split("DESCRIPTION:")
                                .nth(1)
                                .map(|rest| rest.split("FIELDS:").next().unwrap_or("").trim().to_string())
                                .unwrap_or_default();
                            description.is_empty() || description == "<empty>"
                        })
                        .cloned()
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(empty.is_empty(), "kubectl explain shows no description for: {empty:?}");
    // The enum values keep their meanings.
    let host_name = explain("eurekaapps.spec.hostName")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(host_name.contains("`PodFQDN` its DNS name"), "{host_name}");
}

/// `k8s.clusterName` and `{clusterName}`: `--cluster-name` when given; else the value of the
/// Multi-Cluster Services API's `cluster.clusterset.k8s.io` ClusterProperty (read with the chart's
/// RBAC); else the cluster id.
#[tokio::test]
async fn the_cluster_name_comes_from_the_flag_the_clusterproperty_or_the_id() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ctl-cluster-name";
    namespace(&client, ns).await;
    // The ClusterProperty API as KEP-2149 defines it (about.k8s.io/v1alpha1, cluster-scoped).
    let crd = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "clusterproperties.about.k8s.io",
        "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/3084"}},
      "spec": {"group": "about.k8s.io", "scope": "Cluster",
        "names": {"kind": "ClusterProperty", "plural": "clusterproperties", "singular": "clusterproperty"},
        "versions": [{"name": "v1alpha1", "served": true, "storage": true,
          "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"value": {"type": "string"}}}}}}}]}}"#;
    let (ok, out) = kubectl_apply(cluster, crd);
    assert!(ok, "{out}");
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/clusterproperties.about.k8s.io",
    ]);
    let property = r#"{"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
      "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": "eu-west-1.shop"}}"#;
    let (ok, out) = kubectl_apply(cluster, property);
    assert!(ok, "{out}");

    eureka_app(
        cluster,
        ns,
        "ledger",
        "  selector:\n    matchLabels: {app: ledger}\n  port: http\n  \
         instanceId: \"{pod.name}.{clusterName}:{appName}:{port}\"\n",
    );
    pod(
        &client,
        ns,
        "ledger-0",
        &[("app", "ledger")],
        &[("http", 8080)],
        "node-a",
    )
    .await;
    set_ready(&client, ns, "ledger-0", "10.23.0.1", true).await;

    let name_seen = |extra: &'static [&'static str], expected: &'static str| async move {
        let op = Operator::start(cluster, IP, ns, "ctl-cluster-name", extra).await;
        let id = format!("ledger-0.{expected}:ledger:8080");
        wait_instances(&op.server, "LEDGER", &[(id.as_str(), "UP")]).await;
        let i = instance(&op.server, "LEDGER", &id).await.unwrap();
        assert_eq!(i["metadata"]["k8s.clusterName"], expected, "{i}");
        assert_eq!(
            i["metadata"]["k8s.cluster"], "test",
            "the identity stays the cluster id"
        );
        let log = op.server.proc.log();
        let line = log.lines().find(|l| l.contains("cluster identity")).unwrap_or_default();
        assert!(line.contains(expected), "the log names the cluster: {line}");
    };
    name_seen(&[], "eu-west-1.shop").await;
    name_seen(&["--cluster-name", "blue"], "blue").await;
    cluster.kubectl_ok(&["delete", "clusterproperty", "cluster.clusterset.k8s.io"]);
    name_seen(&[], "test").await;
}

/// `--reconcile-concurrency` bounds the reconciles that run at once, and so the apiserver
/// connections the Kubernetes client keeps open after a burst (it pools every connection a burst
/// opened for 90 s): 40 EurekaApps reconciled at start, with the bound at 2 and at 1000.
#[tokio::test]
async fn reconciles_at_once_are_bounded_and_so_are_the_apiserver_connections() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let apiserver_port: u16 = cluster
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let client = &client;
    let held = |bound: &'static str| async move {
        let ns = format!("ctl-concurrency-{bound}");
        namespace(client, &ns).await;
        let manifest: String = (0..40)
            .map(|i| {
                format!(
                    "---\napiVersion: eureka-operator.dev/v1alpha1\nkind: EurekaApp\nmetadata:\n  name: idle-{i}\n  namespace: {ns}\nspec:\n  selector:\n    matchLabels: {{app: idle-{i}}}\n  port: http\n"
                )
            })
            .collect();
        let (ok, out) = kubectl_apply(cluster, &manifest);
        assert!(ok, "{out}");
        let op = Operator::start(cluster, IP, &ns, &ns, &["--reconcile-concurrency", bound]).await;
        wait_for(
            "every EurekaApp reconciled",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let list: serde_json::Value =
                    serde_json::from_str(&cluster.kubectl_ok(&["get", "eurekaapps", "-n", &ns, "-o", "json"])).unwrap();
                let ready = list["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|a| {
                        a["status"]["conditions"]
                            .as_array()
                            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                    })
                    .count();
                (ready == 40).then_some(())
            },
        )
        .await;
        connections_to(op.server.proc.pid() as u32, apiserver_port)
    };
    let bounded = held("2").await;
    let unbounded = held("1000").await;
    println!("apiserver connections after 40 reconciles: {bounded} at 2 at once, {unbounded} at 1000");
    // The watches (pods, nodes, EurekaApps, the Lease, replica discovery) hold one each; the bound
    // adds at most 2 for the status writes and Events.
    assert!(
        bounded <= 12,
        "with --reconcile-concurrency 2 the operator held {bound} apiserver connections",
        bound = bounded
    );
    assert!(
        unbounded >= bounded + 10,
        "40 reconciles at once should open many more connections than 2 at once: {unbounded} against {bounded}"
    );
}
