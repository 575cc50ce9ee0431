//! Smoke tests proving the Eureka test peers are real and working against the real Spring Cloud
//! Eureka server: py-eureka-client and eureka-js-client register, fetch and deregister; the Spring
//! Boot client registers and discovers itself.

use std::{net::Ipv4Addr, time::Duration};

use crate::common::{
    eureka::{JavaServer, ScriptPeer, SpringClient, app_instances},
    process::wait_for,
};

async fn registered(java: &JavaServer, app: &str) -> Vec<String> {
    app_instances(&java.url(), app)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[tokio::test]
async fn python_node_and_spring_clients_work_against_the_java_server() {
    let ip = Ipv4Addr::new(127, 0, 0, 2);
    let Some(java) = JavaServer::start(ip, &[]).await else {
        return;
    };

    let Some(mut py) = ScriptPeer::python(java.url().trim_end_matches('/'), "py-peer", "py-peer-1") else {
        return;
    };
    let Some(mut js) = ScriptPeer::node(
        &format!("{}apps/", java.url()),
        "JS-PEER",
        "js-peer-1",
        &["JS-PEER", "PY-PEER"],
    ) else {
        return;
    };
    let Some(spring) = SpringClient::start(&java.url(), "java-peer", "java-peer-1", &[]).await else {
        return;
    };

    // Each registers with the real server...
    for (app, id) in [
        ("PY-PEER", "py-peer-1"),
        ("JS-PEER", "js-peer-1"),
        ("JAVA-PEER", "java-peer-1"),
    ] {
        wait_for(
            &format!("{id} on the Java server"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async { registered(&java, app).await.contains(&id.to_string()).then_some(()) },
        )
        .await;
    }
    // ...and fetches the registry back from it.
    py.wait_tick("py-eureka-client to see itself", Duration::from_secs(30), |t| {
        t["seen"]["PY-PEER"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p[0] == "py-peer-1"))
    })
    .await;
    js.wait_tick(
        "eureka-js-client to see itself and the Python peer",
        Duration::from_secs(30),
        |t| {
            t["seen"]["JS-PEER"].as_array().is_some_and(|a| !a.is_empty())
                && t["seen"]["PY-PEER"].as_array().is_some_and(|a| !a.is_empty())
        },
    )
    .await;
    wait_for(
        "the Spring client to discover itself",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            spring
                .seen_all("JAVA-PEER")
                .await
                .iter()
                .any(|(id, s)| id == "java-peer-1" && s == "UP")
                .then_some(())
        },
    )
    .await;
    let stats = spring.stats().await;
    assert!(stats["registrationsOk"].as_u64().unwrap_or(0) >= 1, "{stats}");

    // Stopping deregisters.
    let events = py.stop().await;
    assert!(events.iter().any(|e| e["event"] == "stopped"));
    let events = js.stop().await;
    assert!(
        events.iter().any(|e| e["event"] == "stopped" && e["error"].is_null()),
        "{events:?}"
    );
    for app in ["PY-PEER", "JS-PEER"] {
        wait_for(
            &format!("{app} to be cancelled"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async { registered(&java, app).await.is_empty().then_some(()) },
        )
        .await;
    }
}
