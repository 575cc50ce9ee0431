//! Real Eureka clients against our server: the Spring Cloud Netflix client app, py-eureka-client
//! and eureka-js-client register, heartbeat, fetch full then delta registries without hash-code
//! mismatches, discover each other, see status overrides, and cancel on shutdown.

use std::{net::Ipv4Addr, time::Duration};

use crate::common::{
    eureka::{ScriptPeer, Server, SpringClient, app_instances, http},
    process::wait_for,
};
use serde_json::Value;

/// `(instanceId, status)` of `app` in our registry.
async fn registered(server: &Server, app: &str) -> Vec<(String, String)> {
    app_instances(&server.url(), app).await
}

async fn wait_registered(server: &Server, app: &str, id: &str, status: &str) {
    wait_for(
        &format!("{app}/{id} {status} in our registry"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            registered(server, app)
                .await
                .iter()
                .any(|(i, s)| i == id && s == status)
                .then_some(())
        },
    )
    .await;
}

async fn wait_gone(server: &Server, app: &str) {
    wait_for(
        &format!("{app} to be cancelled"),
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { registered(server, app).await.is_empty().then_some(()) },
    )
    .await;
}

async fn set_status(server: &Server, app: &str, id: &str, value: Option<&str>) {
    let mut url = format!("{}apps/{app}/{id}/status", server.url());
    let req = match value {
        Some(v) => {
            url.push_str(&format!("?value={v}"));
            http().put(url)
        }
        None => http().delete(url),
    };
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
}

fn seen_with(tick: &Value, app: &str, id: &str, status: &str) -> bool {
    tick["seen"][app]
        .as_array()
        .is_some_and(|a| a.iter().any(|p| p[0] == id && p[1] == status))
}

#[tokio::test]
async fn python_and_node_clients_register_discover_follow_deltas_and_cancel() {
    let server = Server::start(
        Ipv4Addr::new(127, 0, 0, 3),
        &["--eviction-interval-timer-in-ms", "1000"],
    )
    .await;
    let base = server.url();
    let Some(mut py) = ScriptPeer::python(base.trim_end_matches('/'), "py-peer", "py-peer-1") else {
        return;
    };
    let Some(mut js) = ScriptPeer::node(&format!("{base}apps/"), "JS-PEER", "js-peer-1", &["JS-PEER", "PY-PEER"])
    else {
        return;
    };
    wait_registered(&server, "PY-PEER", "py-peer-1", "UP").await;
    wait_registered(&server, "JS-PEER", "js-peer-1", "UP").await;

    // Each discovers the other through full fetches and then deltas.
    let tick = py
        .wait_tick("py-eureka-client to see the Node peer", Duration::from_secs(30), |t| {
            seen_with(t, "JS-PEER", "js-peer-1", "UP")
        })
        .await;
    let full_before = tick["full"].as_u64().unwrap();
    let delta_before = tick["delta"].as_u64().unwrap();
    js.wait_tick(
        "eureka-js-client to see the Python peer",
        Duration::from_secs(30),
        |t| seen_with(t, "PY-PEER", "py-peer-1", "UP") && t["delta"].as_u64().unwrap_or(0) > 0,
    )
    .await;

    // A status override reaches both clients through deltas.
    set_status(&server, "JS-PEER", "js-peer-1", Some("OUT_OF_SERVICE")).await;
    py.wait_tick("py-eureka-client to see OUT_OF_SERVICE", Duration::from_secs(20), |t| {
        seen_with(t, "JS-PEER", "js-peer-1", "OUT_OF_SERVICE")
    })
    .await;
    js.wait_tick(
        "eureka-js-client to see its own OUT_OF_SERVICE",
        Duration::from_secs(20),
        |t| seen_with(t, "JS-PEER", "js-peer-1", "OUT_OF_SERVICE"),
    )
    .await;
    // Deleting the override without a value: UNKNOWN, the next heartbeat gets 404, the client
    // re-registers UP; both clients follow.
    set_status(&server, "JS-PEER", "js-peer-1", None).await;
    wait_registered(&server, "JS-PEER", "js-peer-1", "UP").await;
    let tick = py
        .wait_tick(
            "py-eureka-client to see the Node peer UP again",
            Duration::from_secs(20),
            |t| seen_with(t, "JS-PEER", "js-peer-1", "UP"),
        )
        .await;
    // Deltas only: py-eureka-client fetches the full registry again only on a hash-code mismatch.
    assert_eq!(
        tick["full"].as_u64().unwrap(),
        full_before,
        "a delta's apps__hashcode did not match: {tick}"
    );
    assert!(
        tick["delta"].as_u64().unwrap() > delta_before,
        "the changes arrived as deltas: {tick}"
    );
    let js_tick = js.last_tick().unwrap();
    assert_eq!(
        js_tick["unknownActions"], 0,
        "every delta entry carries an actionType: {js_tick}"
    );
    assert_eq!(js_tick["full"], 1, "{js_tick}");

    // Both clients keep heartbeating (the step above can finish in a few seconds, so wait for
    // the renewals rather than expect them already counted).
    wait_for(
        "both clients' heartbeats counted",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (server.metric("eureka_renewals_total").await? > 4.0).then_some(()) },
    )
    .await;

    // Shutting down cancels.
    py.stop().await;
    wait_gone(&server, "PY-PEER").await;
    js.stop().await;
    wait_gone(&server, "JS-PEER").await;
}

#[tokio::test]
async fn spring_client_registers_heartbeats_uses_deltas_discovers_and_cancels() {
    let server = Server::start(Ipv4Addr::new(127, 0, 0, 4), &[]).await;
    let base = server.url();
    // Another application for the Spring client to discover.
    let Some(mut py) = ScriptPeer::python(base.trim_end_matches('/'), "py-peer", "py-peer-1") else {
        return;
    };
    let Some(mut spring) = SpringClient::start(&base, "java-peer", "java-peer-1", &[]).await else {
        return;
    };
    wait_registered(&server, "JAVA-PEER", "java-peer-1", "UP").await;
    wait_registered(&server, "PY-PEER", "py-peer-1", "UP").await;

    wait_for(
        "the Spring client to discover the Python peer",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            spring
                .seen_all("PY-PEER")
                .await
                .contains(&("py-peer-1".into(), "UP".into()))
                .then_some(())
        },
    )
    .await;
    // Spring's DiscoveryClient (UP instances by VIP) sees it too.
    let seen = spring.get("/seen/py-peer").await;
    assert_eq!(seen, serde_json::json!(["py-peer-1"]));

    set_status(&server, "PY-PEER", "py-peer-1", Some("OUT_OF_SERVICE")).await;
    wait_for(
        "the Spring client to see OUT_OF_SERVICE",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            spring
                .seen_all("PY-PEER")
                .await
                .contains(&("py-peer-1".into(), "OUT_OF_SERVICE".into()))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        spring.get("/seen/py-peer").await,
        serde_json::json!([]),
        "OUT_OF_SERVICE is filtered out"
    );
    set_status(&server, "PY-PEER", "py-peer-1", Some("UP")).await;
    wait_for(
        "the Spring client to see UP again",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            spring
                .seen_all("PY-PEER")
                .await
                .contains(&("py-peer-1".into(), "UP".into()))
                .then_some(())
        },
    )
    .await;
    // Let a few more deltas go by.
    let before = spring.stats().await["deltaFetches"].as_u64().unwrap_or(0);
    let stats = wait_for(
        "three more delta fetches",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let stats = spring.stats().await;
            (stats["deltaFetches"].as_u64().unwrap_or(0) >= before + 3).then_some(stats)
        },
    )
    .await;
    assert_eq!(stats["countersValid"], true, "{stats}");
    assert!(stats["heartbeatsOk"].as_u64().unwrap_or(0) >= 3, "{stats}");
    assert!(stats["deltaFetches"].as_u64().unwrap_or(0) >= 5, "{stats}");
    assert_eq!(
        stats["reconcileMismatches"], 0,
        "no delta fell back to a full fetch: {stats}"
    );
    assert_eq!(stats["deltaRefused"], 0, "{stats}");
    assert_eq!(stats["http"]["fullFetch"], stats["fullFetches"], "{stats}");

    // SIGTERM: the client deregisters.
    spring.proc.terminate(Duration::from_secs(20));
    wait_gone(&server, "JAVA-PEER").await;
    assert!(
        spring.proc.log().contains("deregister  status: 200"),
        "the Spring client logged its DELETE: {}",
        spring.proc.log_tail(20)
    );
    py.stop().await;
}
