//! Migration: the operator peers both ways with a real Spring Cloud Eureka server. A Spring
//! client registered on the Java server is discoverable through ours; a pod-backed instance is
//! discoverable through Java's; status overrides made on either side show on both; nothing
//! echoes back and forth.

use std::{net::Ipv4Addr, time::Duration};

use crate::common::{
    eureka::{JavaServer, SpringClient, app_instances, http},
    operator::{Operator, eureka_app, instances, namespace, pod, prepared, set_ready},
    process::{free_port, wait_for},
};
use serde_json::Value;

/// `(instanceId, status)` of `app` on a server at `base` (`.../eureka/`).
async fn on(base: &str, app: &str) -> Vec<(String, String)> {
    app_instances(base, app).await
}

async fn wait_on(base: &str, app: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    wait_for(
        &format!("{app} {want:?} at {base}"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { (on(base, app).await == want).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_and_a_java_eureka_server_peer_both_ways() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "java-peering";
    namespace(&client, ns).await;
    let (ours_ip, java_ip) = (Ipv4Addr::new(127, 0, 0, 51), Ipv4Addr::new(127, 0, 0, 52));
    let (ours_port, java_port) = (free_port(ours_ip), free_port(java_ip));
    let java_url = format!("http://{java_ip}:{java_port}/eureka/");
    let ours_url = format!("http://{ours_ip}:{ours_port}/eureka/");

    let op = Operator::start_on(
        cluster,
        ours_ip,
        (ours_port, free_port(ours_ip)),
        ns,
        "java-peering",
        "ours-0",
        &[
            "--java-peer-urls",
            &java_url,
            "--java-peer-heartbeat-interval-ms",
            "1000",
            "--replication-max-batching-delay-ms",
            "20",
        ],
    )
    .await;
    let flags: Vec<String> = [
        "--spring.application.name=java-eureka".to_string(),
        "--eureka.client.register-with-eureka=true".into(),
        "--eureka.client.fetch-registry=true".into(),
        format!("--eureka.client.service-url.defaultZone={ours_url}"),
        format!("--eureka.server.my-url={java_url}"),
        "--eureka.server.peer-eureka-nodes-update-interval-ms=1000".into(),
        "--eureka.server.registry-sync-retries=1".into(),
        "--eureka.server.registry-sync-retry-wait-ms=500".into(),
        "--eureka.server.enable-self-preservation=false".into(),
        "--eureka.client.registry-fetch-interval-seconds=1".into(),
        "--eureka.client.initial-instance-info-replication-interval-seconds=1".into(),
        "--eureka.client.instance-info-replication-interval-seconds=1".into(),
        "--eureka.instance.lease-renewal-interval-in-seconds=1".into(),
    ]
    .into();
    let Some(_java) = JavaServer::start_on(java_ip, java_port, &flags).await else {
        return;
    };

    // Java -> ours: a Spring service registered on the Java server.
    let Some(_spring) = SpringClient::start(&java_url, "java-peer", "java-peer-1", &[]).await else {
        return;
    };
    wait_on(&java_url, "JAVA-PEER", &[("java-peer-1", "UP")]).await;
    wait_on(&ours_url, "JAVA-PEER", &[("java-peer-1", "UP")]).await;

    // Ours -> Java: a pod-backed instance.
    eureka_app(
        cluster,
        ns,
        "orders",
        "  selector:\n    matchLabels: {app: orders}\n  port: http\n",
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
    set_ready(&client, ns, "orders-0", "10.40.0.1", true).await;
    let pod_id = "orders-0.java-peering:orders:8080";
    wait_on(&ours_url, "ORDERS", &[(pod_id, "UP")]).await;
    wait_on(&java_url, "ORDERS", &[(pod_id, "UP")]).await;
    // Java holds it with its ownership metadata, renewed by our leader.
    let r: Value = http()
        .get(format!("{java_url}apps/ORDERS/{pod_id}"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["instance"]["metadata"]["k8s.owner"], "eureka-operator");

    // An override on the Java side shows on ours...
    let put = |base: &str, app: &str, id: &str, value: &str| {
        http().put(format!("{base}apps/{app}/{id}/status?value={value}")).send()
    };
    assert_eq!(
        put(&java_url, "JAVA-PEER", "java-peer-1", "OUT_OF_SERVICE")
            .await
            .unwrap()
            .status(),
        200
    );
    wait_on(&ours_url, "JAVA-PEER", &[("java-peer-1", "OUT_OF_SERVICE")]).await;
    // ...and one on ours shows on Java's, for a pod instance and for Java's own client.
    assert_eq!(
        put(&ours_url, "ORDERS", pod_id, "OUT_OF_SERVICE")
            .await
            .unwrap()
            .status(),
        200
    );
    wait_on(&java_url, "ORDERS", &[(pod_id, "OUT_OF_SERVICE")]).await;
    assert_eq!(
        put(&ours_url, "JAVA-PEER", "java-peer-1", "UP").await.unwrap().status(),
        200
    );
    wait_on(&java_url, "JAVA-PEER", &[("java-peer-1", "UP")]).await;
    wait_on(&ours_url, "JAVA-PEER", &[("java-peer-1", "UP")]).await;

    // Nothing echoes: with heartbeats flowing, the registrations stop growing (two seconds
    // without a new one).
    let renewals = op.server.metric("eureka_renewals_total").await.unwrap();
    let mut previous = op.server.metric("eureka_registrations_total").await.unwrap();
    let mut stable = 0;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = op.server.metric("eureka_registrations_total").await.unwrap();
        if now == previous {
            stable += 1;
        } else {
            stable = 0;
            previous = now;
        }
        if stable >= 8 {
            break;
        }
    }
    assert!(stable >= 8, "registrations kept growing: an echo");
    assert!(
        op.server.metric("eureka_renewals_total").await.unwrap() > renewals,
        "heartbeats flow"
    );
    assert_eq!(on(&java_url, "ORDERS").await.len(), 1);
    assert_eq!(on(&ours_url, "JAVA-PEER").await.len(), 1);
    assert_eq!(instances(&op.server, "ORDERS").await.len(), 1);
}
