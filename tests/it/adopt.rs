//! `registration: Adopt` against a real kube-apiserver, with the real Spring Cloud client as a
//! pod's own process: each fake pod gets a loopback address as its pod IP, and its client is bound
//! to that address and registers with it. The operator adopts the registration (by IP and port,
//! and by Spring's instance id), the pod's readiness and termination decide its status and its end
//! (not the client's 90 s lease), and adopted instances never count toward self-preservation, so
//! a scale-down of adopted pods whose clients die without cancelling never trips it. A readiness
//! gate on an adopting EurekaApp waits for the adopted registration on every replica.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use crate::{
    common::{
        eureka::{Heartbeats, Native, SpringClient, http},
        operator::{
            Operator, app_status, delete_pod, eureka_app, instance, instances, namespace, pod, prepared, set_ready,
            wait_instances,
        },
        process::{free_port, wait_for},
    },
    faults::{leader_of, two_replicas},
};

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// Waits until the EurekaApp's status satisfies `check`; returns it.
async fn wait_status(
    cluster: &crate::common::cluster::Cluster,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = app_status(cluster, ns, name).await;
        if check(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{ns}/{name}: status never showed {what}: {last}");
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spring_clients_registration_is_adopted_and_follows_its_pod() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "adopt-spring";
    namespace(&client, ns).await;
    let (op_ip, pod_ip) = (ip(201), ip(202));
    let op = Operator::start(
        cluster,
        op_ip,
        ns,
        "adopt-spring",
        &["--eviction-interval-timer-in-ms", "500"],
    )
    .await;
    let port = free_port(pod_ip);
    eureka_app(
        cluster,
        ns,
        "orders",
        "  selector:\n    matchLabels: {app: orders}\n  port: http\n  registration: Adopt\n  preset: Spring\n  \
         adoption: {matchInstanceId: true}\n  notReady: DOWN\n  drainSeconds: 3\n",
    );
    pod(
        &client,
        ns,
        "orders-0",
        &[("app", "orders")],
        &[("http", i32::from(port))],
        "node-1",
    )
    .await;
    set_ready(&client, ns, "orders-0", &pod_ip.to_string(), false).await;
    // The pod runs; its client has not registered yet.
    let s = wait_status(cluster, ns, "orders", "a pod awaiting registration", |s| {
        s["awaitingRegistration"] == 1
    })
    .await;
    assert_eq!(condition(&s, "Ready")["reason"], "AwaitingRegistration", "{s}");
    assert!(
        instances(&op.server, "ORDERS").await.is_empty(),
        "adopt mode registers nothing itself"
    );

    // The pod's own Spring client: Spring's default id in a pod named orders-0, the pod's address,
    // Spring's default 90 s lease.
    let id = format!("orders-0:orders:{port}");
    let Some(mut spring) = SpringClient::start_on(
        pod_ip,
        port,
        &op.server.url(),
        "orders",
        &id,
        &["--eureka.instance.lease-expiration-duration-in-seconds=90".to_string()],
    )
    .await
    else {
        return;
    };
    // Not Ready: DOWN, as the EurekaApp says, although the client says UP.
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "DOWN")]).await;
    let i = instance(&op.server, "ORDERS", &id).await.unwrap();
    assert_eq!(i["ipAddr"], pod_ip.to_string());
    assert_eq!(
        i["leaseInfo"]["durationInSecs"], 90,
        "the client's own lease terms: {i}"
    );
    assert!(i["metadata"]["k8s.owner"].is_null(), "the client's own metadata: {i}");
    assert_eq!(
        op.server.metric("eureka_instances{origin=\"adopted\"}").await,
        Some(1.0)
    );
    let expected_clients = op.server.metric("eureka_expected_clients").await.unwrap();

    set_ready(&client, ns, "orders-0", &pod_ip.to_string(), true).await;
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "UP")]).await;
    let s = wait_status(cluster, ns, "orders", "the adopted instance", |s| {
        s["instances"]["adopted"] == 1
            && s["instances"]["up"] == 1
            && s["awaitingRegistration"].is_null()
            && condition(s, "Ready")["status"] == "True"
    })
    .await;
    assert_eq!(condition(&s, "Ready")["reason"], "InstancesAdopted", "{s}");
    let describe = wait_for(
        "the Adopted Event",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl_ok(&["describe", "ea", "orders", "-n", ns]);
            out.contains("Adopted").then_some(out)
        },
    )
    .await;
    assert!(describe.contains(&id), "{describe}");

    // The pod Ready, the client's own status shows: it reports DOWN, then UP again.
    let local = |status: &'static str| {
        let url = format!("{}/local-status/{status}", spring.base());
        async move {
            let r = http().post(url).send().await.unwrap();
            assert!(r.status().is_success(), "{}", r.text().await.unwrap_or_default());
        }
    };
    local("DOWN").await;
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "DOWN")]).await;
    local("UP").await;
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "UP")]).await;
    // Readiness lost and back.
    set_ready(&client, ns, "orders-0", &pod_ip.to_string(), false).await;
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "DOWN")]).await;
    set_ready(&client, ns, "orders-0", &pod_ip.to_string(), true).await;
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "UP")]).await;

    // kill -9: the client never cancels. The pod goes (its workload replaces it): OUT_OF_SERVICE
    // at once, cancelled when the 3 s drain ends, not 90 s later.
    spring.proc.kill();
    let t = Instant::now();
    delete_pod(&client, ns, "orders-0").await;
    wait_instances(&op.server, "ORDERS", &[(id.as_str(), "OUT_OF_SERVICE")]).await;
    let out_of_service = t.elapsed();
    wait_instances(&op.server, "ORDERS", &[]).await;
    let cancelled = t.elapsed();
    println!(
        "ADOPTED_KILL9 out_of_service_after={out_of_service:?} cancelled_after={cancelled:?} \
         (drainSeconds 3, client lease 90 s)"
    );
    assert!(out_of_service < Duration::from_secs(3), "{out_of_service:?}");
    // (deletionTimestamp has one-second precision: the drain may end up to 1 s early.)
    assert!(
        cancelled >= Duration::from_secs(2) && cancelled < Duration::from_secs(20),
        "{cancelled:?}"
    );
    assert_eq!(
        op.server.metric("eureka_expected_clients").await.unwrap(),
        expected_clients,
        "an adopted instance never moves the self-preservation expectation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_twenty_adopted_pods_never_trips_self_preservation() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "adopt-scale";
    namespace(&client, ns).await;
    let op = Operator::start(
        cluster,
        ip(203),
        ns,
        "adopt-scale",
        &[
            "--renews-window-ms",
            "2000",
            "--expected-client-renewal-interval-seconds",
            "1",
            "--eviction-interval-timer-in-ms",
            "300",
            "--wait-time-in-ms-when-sync-empty",
            "0",
        ],
    )
    .await;
    let url = op.server.url();
    // Services outside the cluster: three that keep renewing, and one that dies later on. With a
    // 2 s renewals window and 1 s expected intervals, the threshold is 0.85 × 2 renewals per
    // window and expected client; each of them renews about 6 times per window.
    let keepers: Vec<Native> = (0..3)
        .map(|n| Native::new(&url, "OUTSIDE", &format!("keeper-{n}")).lease(2, 1))
        .collect();
    let victim = Native::new(&url, "OUTSIDE", "victim").lease(2, 1);
    for n in keepers.iter().chain([&victim]) {
        assert_eq!(n.register().await, 204);
    }
    let _keeping = Heartbeats::start(keepers.clone(), Duration::from_millis(300));
    let victim_beats = Heartbeats::start(vec![victim.clone()], Duration::from_millis(300));

    eureka_app(
        cluster,
        ns,
        "orders",
        "  selector:\n    matchLabels: {app: orders}\n  port: http\n  registration: Adopt\n  drainSeconds: 2\n",
    );
    // Twenty pods, not Ready yet. Pod 0 runs the real Spring client; the others' clients are
    // played by the test (the same registration body, from each pod's address).
    const N: u8 = 20;
    let pod_ip = |n: u8| ip(211 + n);
    let spring_port = free_port(pod_ip(0));
    for n in 0..N {
        let port = if n == 0 { i32::from(spring_port) } else { 8080 };
        let name = format!("orders-{n}");
        pod(&client, ns, &name, &[("app", "orders")], &[("http", port)], "node-1").await;
        set_ready(&client, ns, &name, &pod_ip(n).to_string(), false).await;
    }
    let played: Vec<Native> = (1..N)
        .map(|n| {
            Native::new(&url, "ORDERS", &format!("orders-{n}:orders:8080"))
                .lease(2, 1)
                .at(&pod_ip(n).to_string(), 8080)
        })
        .collect();
    for c in &played {
        assert_eq!(c.register().await, 204);
    }
    let played_beats = Heartbeats::start(played.clone(), Duration::from_millis(300));
    let spring_id = format!("orders-0:orders:{spring_port}");
    let Some(mut spring) = SpringClient::start_on(pod_ip(0), spring_port, &url, "orders", &spring_id, &[]).await else {
        return;
    };
    let mut ids: Vec<String> = played.iter().map(|c| c.id.clone()).collect();
    ids.push(spring_id.clone());
    // Not Ready: STARTING, the default.
    let starting: Vec<(&str, &str)> = ids.iter().map(|i| (i.as_str(), "STARTING")).collect();
    wait_instances(&op.server, "ORDERS", &starting).await;
    for n in 0..N {
        set_ready(&client, ns, &format!("orders-{n}"), &pod_ip(n).to_string(), true).await;
    }
    let up: Vec<(&str, &str)> = ids.iter().map(|i| (i.as_str(), "UP")).collect();
    wait_instances(&op.server, "ORDERS", &up).await;
    assert_eq!(
        op.server.metric("eureka_instances{origin=\"adopted\"}").await,
        Some(f64::from(N))
    );
    wait_for(
        "renewals above the threshold",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async { (op.server.metric("eureka_self_preservation_active").await == Some(0.0)).then_some(()) },
    )
    .await;
    let expected = op.server.metric("eureka_expected_clients").await.unwrap();
    let threshold = op.server.metric("eureka_renewals_per_minute_threshold").await.unwrap();
    let held = op.server.metric("eureka_eviction_runs_held_total").await.unwrap();
    println!("ADOPT_SCALE before: expected_clients={expected} renews_threshold={threshold} adopted={N}");
    assert!(
        expected < 10.0,
        "only the four services outside count, not the {N} adopted pods: {expected}"
    );
    let s = wait_status(cluster, ns, "orders", "20 adopted instances", |s| {
        s["instances"]["adopted"] == i64::from(N)
    })
    .await;
    assert_eq!(s["selectedPods"], i64::from(N));

    // Scale to zero the hard way: every client dies at once without cancelling (kill -9, the
    // played heartbeats stop), and the ReplicaSet deletes the pods.
    spring.proc.kill();
    played_beats.stop();
    let t = Instant::now();
    for n in 0..N {
        delete_pod(&client, ns, &format!("orders-{n}")).await;
    }
    wait_instances(&op.server, "ORDERS", &[]).await;
    let gone = t.elapsed();
    // Self-preservation stays off, so a service outside that really dies is still evicted.
    victim_beats.stop();
    let t_victim = Instant::now();
    let keeper_ids: Vec<(&str, &str)> = keepers.iter().map(|k| (k.id.as_str(), "UP")).collect();
    wait_for(
        "the dead service outside to be evicted",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let mut want: Vec<(String, String)> =
                keeper_ids.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            want.sort();
            (instances(&op.server, "OUTSIDE").await == want).then_some(())
        },
    )
    .await;
    println!(
        "ADOPT_SCALE {N} adopted pods gone {gone:?} after their deletion (drainSeconds 2); \
         a dead native evicted {:?} after its last heartbeat",
        t_victim.elapsed()
    );
    assert_eq!(op.server.metric("eureka_self_preservation_active").await, Some(0.0));
    assert_eq!(op.server.metric("eureka_expected_clients").await, Some(expected - 1.0));
    // Had the adopted pods counted (25 expected, threshold 42 per window), the keepers' ~20
    // renewals per window would have held every eviction run from the scale-down on, and the
    // dead service would never have gone.
    println!(
        "ADOPT_SCALE eviction runs held since the scale-down: {}",
        op.server.metric("eureka_eviction_runs_held_total").await.unwrap() - held
    );
}

const GATE: &str = "eureka-operator.dev/registered";

/// Whether the pod's readiness-gate condition is True.
async fn gate_open(pods: &Api<Pod>, name: &str) -> bool {
    let p = pods.get(name).await.unwrap();
    p.status
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == GATE && c.status == "True"))
}

/// The readiness gate in adopt mode: the leader opens a gated pod's gate once the registration
/// its own client made (adopted) is UP on every ready replica, not an instance of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readiness_gate_waits_for_the_adopted_registration_on_every_replica() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "adopt-gate";
    namespace(&client, ns).await;
    let replicas = two_replicas(cluster, ns, "adopt-gate", 204, &[]).await;
    eureka_app(
        cluster,
        ns,
        "billing",
        &format!(
            "  selector: {{matchLabels: {{app: billing}}}}\n  port: http\n  registration: Adopt\n  \
             readinessGate: {{conditionType: {GATE}, delaySeconds: 1}}\n"
        ),
    );
    // A pod that lists the gate; its containers are ready, so only the gate holds it back (there
    // is no kubelet here: the test writes the status a kubelet would).
    let pod_ip = ip(206);
    let port = free_port(pod_ip);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": {"name": "billing-0", "labels": {"app": "billing"}},
        "spec": {
            "nodeName": "node-1",
            "readinessGates": [{"conditionType": GATE}],
            "containers": [{"name": "app", "image": "example/billing:1",
                            "ports": [{"name": "http", "containerPort": port}]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &manifest).await.unwrap();
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "192.168.7.1",
        "podIP": pod_ip.to_string(),
        "podIPs": [{"ip": pod_ip.to_string()}],
        "conditions": [
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "False"}
        ]
    }});
    pods.patch_status("billing-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    wait_status(cluster, ns, "billing", "the pod awaiting its client", |s| {
        s["awaitingRegistration"] == 1
    })
    .await;
    assert!(
        !gate_open(&pods, "billing-0").await,
        "the gate opened with no registration to wait for"
    );

    // The follower frozen, the pod's own Spring client registers with the leader: UP there (its
    // containers are ready; only the gate is missing), but the follower cannot confirm it.
    let leader = leader_of(&replicas).await;
    let follower = &replicas[1 - leader];
    follower.server.proc.freeze();
    let id = format!("billing-0:billing:{port}");
    let Some(_spring) = SpringClient::start_on(pod_ip, port, &replicas[leader].server.url(), "billing", &id, &[]).await
    else {
        follower.server.proc.resume();
        return;
    };
    wait_instances(&replicas[leader].server, "BILLING", &[(id.as_str(), "UP")]).await;
    assert_eq!(
        replicas[leader]
            .server
            .metric("eureka_instances{origin=\"adopted\"}")
            .await,
        Some(1.0)
    );
    let held = Duration::from_secs(4);
    let t = Instant::now();
    while t.elapsed() < held {
        assert!(
            !gate_open(&pods, "billing-0").await,
            "the gate opened while a replica could not confirm the adopted instance"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    follower.server.proc.resume();
    let resumed = Instant::now();
    wait_for(
        "the gate to open",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { gate_open(&pods, "billing-0").await.then_some(()) },
    )
    .await;
    let opened = resumed.elapsed();
    for r in &replicas {
        assert_eq!(
            instances(&r.server, "BILLING").await,
            vec![(id.clone(), "UP".to_string())]
        );
        assert_eq!(
            r.server.metric("eureka_instances{origin=\"adopted\"}").await,
            Some(1.0),
            "adopted on every replica, nothing registered by the operator"
        );
    }
    println!(
        "ADOPT_GATE the gate held {held:?} with a replica frozen and opened {opened:?} after it resumed (delaySeconds 1)"
    );
    assert!(
        opened >= Duration::from_secs(1),
        "opened before the gate's delay: {opened:?}"
    );
}
