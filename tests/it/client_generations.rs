//! Every Eureka client generation still in production against our server and, in the same test,
//! against the Spring Cloud Netflix Eureka server, so a difference shows: the plain Netflix 1.x
//! client (Jersey 1; JSON and XStream XML; `/eureka/` and `/eureka/v2/`), Spring Cloud Hoxton
//! (eureka-client 1.9 over Jersey 1), Spring Cloud 2022.0 (eureka-client 2.0, RestTemplate) with
//! OpenFeign and Spring Cloud LoadBalancer, and the Go client fargo (XML and JSON). Each registers,
//! heartbeats, fetches full then delta registries with no hash-code mismatch while other instances
//! churn, sees status overrides, and cancels on shutdown ([`exercise`]).
//!
//! One server of each kind serves every test of this module (one JVM instead of four), so each
//! test's clients also see the other tests' instances come and go.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use tokio::sync::OnceCell;

use crate::common::{
    clients::{
        ClientView, GoClient, NetflixClients, SpringApp, Subject, exercise, print_comparison, set_status, stop,
        wait_cancelled,
    },
    eureka::{JavaServer, Server},
    process::wait_for,
};

struct Servers {
    ours: Server,
    java: JavaServer,
}

/// Our server and the Java server, started once for the module; `None` when the Java server is
/// missing outside CI.
async fn servers() -> Option<&'static Servers> {
    static SERVERS: OnceCell<Option<Servers>> = OnceCell::const_new();
    SERVERS
        .get_or_init(|| async {
            let (ours, java) = tokio::join!(
                Server::start(Ipv4Addr::new(127, 0, 0, 31), &[]),
                JavaServer::start(Ipv4Addr::new(127, 0, 0, 32), &[])
            );
            Some(Servers { ours, java: java? })
        })
        .await
        .as_ref()
}

#[tokio::test]
async fn netflix_1x_client_json_and_xml_on_eureka_and_eureka_v2() {
    let Some(s) = servers().await else { return };
    let ours = s.ours.url();
    let ours_v2 = format!("{}/eureka/v2/", s.ours.base());
    let java = s.java.url();
    let Some(mut jvm) = NetflixClients::start(
        "netflix-peer",
        "netflix-1",
        &[
            ("ours", &ours, "json"),
            ("oursv2", &ours_v2, "xml"),
            ("java", &java, "json"),
            ("javaxml", &java, "xml"),
        ],
    )
    .await
    else {
        return;
    };
    let views: Vec<ClientView> = ["ours", "oursv2", "java", "javaxml"]
        .iter()
        .map(|n| jvm.view(n))
        .collect();
    let subject = |i: usize, id: &'static str| Subject {
        view: &views[i],
        app: "NETFLIX-PEER",
        id,
    };
    let on_ours = [subject(0, "netflix-1-ours"), subject(1, "netflix-1-oursv2")];
    let on_java = [subject(2, "netflix-1-java"), subject(3, "netflix-1-javaxml")];
    let (on_ours, on_java) = tokio::join!(
        exercise("ours", &ours, &on_ours, "CHURN-NETFLIX", true, true),
        exercise("java", &java, &on_java, "CHURN-NETFLIX", true, false),
    );
    print_comparison("plain Netflix eureka-client 1.x", &[&on_ours, &on_java]);
    // The XML clients really were answered in XML (through Netflix's XStream codec).
    for (outcome, label) in [(&on_ours, "netflix-1.x/oursv2"), (&on_java, "netflix-1.x/javaxml")] {
        let t = &outcome.stats[label]["lastFetchContentType"];
        assert!(t.as_str().is_some_and(|t| t.contains("xml")), "{label}: {t}");
    }

    // DiscoveryClient.shutdown() cancels.
    for (name, server, base) in [
        ("ours", "ours", &ours),
        ("oursv2", "ours", &ours),
        ("java", "java", &java),
        ("javaxml", "java", &java),
    ] {
        jvm.shutdown(name).await;
        wait_cancelled(server, base, "NETFLIX-PEER", &format!("netflix-1-{name}")).await;
    }
    for id in ["netflix-1-ours", "netflix-1-oursv2"] {
        assert!(
            jvm.proc.log().contains(&format!("{id} - deregister  status: 200")),
            "{id} logged its DELETE: {}",
            jvm.proc.log_tail(30)
        );
    }
    assert!(stop(&mut jvm.proc, Duration::from_secs(10)).await);
}

/// One app of Spring generation `generation` (its jar in `jar_var`) on each server, put through
/// [`exercise`] side by side; `None` when a peer is missing outside CI.
async fn spring_generation(s: &Servers, jar_var: &str, generation: &str, extra: &[&str]) -> Option<[SpringApp; 2]> {
    let (ours, java) = (s.ours.url(), s.java.url());
    let name = format!("{generation}-peer");
    let app = name.to_uppercase();
    let (id_ours, id_java) = (format!("{generation}-ours"), format!("{generation}-java"));
    let (a, b) = tokio::join!(
        SpringApp::start(jar_var, generation, &ours, &name, &id_ours, extra),
        SpringApp::start(jar_var, generation, &java, &name, &id_java, extra),
    );
    let (a, b) = (a?, b?);
    let (va, vb) = (a.view(), b.view());
    let on_ours = [Subject {
        view: &va,
        app: &app,
        id: &id_ours,
    }];
    let on_java = [Subject {
        view: &vb,
        app: &app,
        id: &id_java,
    }];
    let churn = format!("CHURN-{app}");
    let (on_ours, on_java) = tokio::join!(
        exercise("ours", &ours, &on_ours, &churn, true, true),
        exercise("java", &java, &on_java, &churn, true, false),
    );
    print_comparison(generation, &[&on_ours, &on_java]);
    for stats in on_ours.stats.values().chain(on_java.stats.values()) {
        assert_eq!(stats["countersValid"], true, "{stats}");
    }
    Some([a, b])
}

/// SIGTERM: Spring shuts the client down, which cancels (and logs its DELETE, checked on ours).
async fn stop_spring_generation(s: &Servers, generation: &str, apps: &mut [SpringApp; 2]) {
    let app = format!("{generation}-peer").to_uppercase();
    for (peer, (server, base)) in apps.iter_mut().zip([("ours", s.ours.url()), ("java", s.java.url())]) {
        assert!(
            stop(&mut peer.proc, Duration::from_secs(20)).await,
            "{}",
            peer.proc.log_tail(20)
        );
        wait_cancelled(server, &base, &app, &format!("{generation}-{server}")).await;
    }
    assert!(
        apps[0].proc.log().contains("deregister  status: 200"),
        "{}",
        apps[0].proc.log_tail(20)
    );
}

#[tokio::test]
async fn spring_cloud_hoxton_client() {
    let Some(s) = servers().await else { return };
    let Some(mut apps) = spring_generation(s, "EUREKA_PEER_SPRING_HOXTON_JAR", "hoxton", &[]).await else {
        return;
    };
    stop_spring_generation(s, "hoxton", &mut apps).await;
}

/// The callees of the load-balancer test: two fargo instances of GREETER on one server.
async fn greeters(server: &str, tag: &str) -> Option<[GoClient; 2]> {
    let url = server.trim_end_matches('/');
    let (a, b) = (format!("greeter-{tag}-a"), format!("greeter-{tag}-b"));
    let (x, y) = tokio::join!(
        GoClient::start(url, "greeter", &a, false),
        GoClient::start(url, "greeter", &b, true)
    );
    Some([x?, y?])
}

/// Calls GREETER through the app's Feign client `n` times; the callees that answered.
async fn call(app: &SpringApp, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = app.get("/call").await;
        if r["ok"] == true {
            out.push(r["body"].as_str().unwrap_or("").to_string());
        }
    }
    out
}

/// Feign through Spring Cloud LoadBalancer, fed by the Eureka client: both callees answer, the
/// one put OUT_OF_SERVICE stops receiving calls within one refresh of the client, and gets them
/// again once its override is deleted. Returns how long routing took to follow the override.
async fn load_balancing(server: &str, base: &str, app: &SpringApp, tag: &str) -> Duration {
    let (a, b) = (format!("greeter-{tag}-a"), format!("greeter-{tag}-b"));
    wait_for(
        &format!("Feign calls on {server} to reach both greeters"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let got = call(app, 6).await;
            (got.contains(&a) && got.contains(&b)).then_some(())
        },
    )
    .await;
    let deltas = |s: &serde_json::Value| s["deltaFetches"].as_u64().unwrap_or(0);
    let d0 = deltas(&app.get("/stats").await);
    let t0 = Instant::now();
    set_status(base, "GREETER", &a, Some("OUT_OF_SERVICE")).await;
    // The first moment after which 10 calls in a row avoid it.
    let (took, d1) = wait_for(
        &format!("Feign calls on {server} to stop reaching {a}"),
        Duration::from_secs(30),
        Duration::from_millis(20),
        || async {
            let started = t0.elapsed();
            let d = deltas(&app.get("/stats").await);
            let got = call(app, 10).await;
            (got.len() == 10 && !got.contains(&a)).then_some((started, d))
        },
    )
    .await;
    // Ours must follow within one refresh. Java is only reported: a hashcode mismatch on one of
    // its deltas (seen under load) sends the client to a full fetch first, a refresh or more later.
    println!(
        "on {server}, calls stopped reaching {a} {} delta fetches after its override",
        d1 - d0
    );
    assert!(
        server != "ours" || d1 <= d0 + 2,
        "on {server}, calls still reached {a} {} delta fetches after its override (more than one refresh)",
        d1 - d0
    );
    set_status(base, "GREETER", &a, None).await;
    wait_for(
        &format!("Feign calls on {server} to reach {a} again"),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { call(app, 6).await.contains(&a).then_some(()) },
    )
    .await;
    took
}

#[tokio::test]
async fn spring_cloud_2022_client_and_feign_through_loadbalancer() {
    let Some(s) = servers().await else { return };
    let (ours, java) = (s.ours.url(), s.java.url());
    let Some(mut g_ours) = greeters(&ours, "ours").await else {
        return;
    };
    let Some(mut g_java) = greeters(&java, "java").await else {
        return;
    };
    // No LoadBalancer cache (its default keeps instance lists 35 s): routing follows the Eureka
    // client's copy, which it refreshes every second.
    let extra = [
        "--peer.target=greeter",
        "--spring.cloud.loadbalancer.cache.enabled=false",
    ];
    let Some(mut apps) = spring_generation(s, "EUREKA_PEER_SPRING_2022_JAR", "sc2022", &extra).await else {
        return;
    };
    let (lb_ours, lb_java) = tokio::join!(
        load_balancing("ours", &ours, &apps[0], "ours"),
        load_balancing("java", &java, &apps[1], "java")
    );
    println!(
        "Feign + LoadBalancer stopped routing to an OUT_OF_SERVICE instance after {} ms on ours, {} ms on java",
        lb_ours.as_millis(),
        lb_java.as_millis()
    );
    stop_spring_generation(s, "sc2022", &mut apps).await;
    for (gs, server, base, tag) in [
        (&mut g_ours, "ours", &ours, "ours"),
        (&mut g_java, "java", &java, "java"),
    ] {
        for (g, x) in gs.iter_mut().zip(["a", "b"]) {
            assert!(stop(&mut g.proc, Duration::from_secs(10)).await);
            wait_cancelled(server, base, "GREETER", &format!("greeter-{tag}-{x}")).await;
        }
    }
}

/// fargo, XML and JSON, on each server ([`exercise`] with full fetches only): on ours every full
/// fetch's `apps__hashcode` adds up to the instances fargo decoded from it (no mismatch, counted only
/// once fargo captured a hash code).
///
/// Killed by the `wrong-hashcode` mutant (tests/mutants).
#[tokio::test]
async fn fargo_go_client_xml_and_json() {
    let Some(s) = servers().await else { return };
    let (ours, java) = (s.ours.url(), s.java.url());
    let mut peers = Vec::new();
    for (server, base) in [("ours", &ours), ("java", &java)] {
        for (codec, json) in [("xml", false), ("json", true)] {
            let id = format!("go-{server}-{codec}");
            let Some(p) = GoClient::start(base.trim_end_matches('/'), "go-peer", &id, json).await else {
                return;
            };
            peers.push((server, base, id, p));
        }
    }
    let views: Vec<ClientView> = peers.iter().map(|p| p.3.view()).collect();
    let subject = |i: usize| Subject {
        view: &views[i],
        app: "GO-PEER",
        id: &peers[i].2,
    };
    // fargo has no delta support: every refresh is a full fetch.
    let on_ours = [subject(0), subject(1)];
    let on_java = [subject(2), subject(3)];
    let (on_ours, on_java) = tokio::join!(
        exercise("ours", &ours, &on_ours, "CHURN-GO", false, true),
        exercise("java", &java, &on_java, "CHURN-GO", false, false),
    );
    print_comparison("fargo", &[&on_ours, &on_java]);
    for (server, base, id, p) in &mut peers {
        assert!(
            stop(&mut p.proc, Duration::from_secs(10)).await,
            "{}",
            p.proc.log_tail(10)
        );
        assert!(
            p.proc.try_exit().is_some_and(|s| s.success()),
            "{}",
            p.proc.log_tail(10)
        );
        wait_cancelled(server, base, "GO-PEER", id).await;
    }
}
