//! Two Kubernetes clusters linked both ways, each its own etcd, kube-apiserver, controllers and
//! kwok nodes, two operator replicas per cluster on their own loopback addresses: freshness while
//! Deployments scale and roll (with a real Spring client in A), StatefulSet pod names that collide
//! across clusters, ownership under deletions, a Java peer that never receives the other
//! cluster's pods, a partition of one replica behind a TCP proxy (warning, withdrawal by policy,
//! the last copy shown again when the local instance goes, the heal after churn), and the other
//! cluster's apiserver down (against the Java-peer path, which loses them).

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use serde_json::json;

use crate::{
    common::{
        clients::assert_no_mismatch,
        cluster::Cluster,
        eureka::{JavaServer, Native, Server, SpringClient, app_instances},
        operator::{Launch, Operator, eureka_app, namespace, prepare},
        process::{replica_addresses, scratch_dir, wait_equal, wait_for},
        proxy::Proxy,
    },
    lifecycle::{apply, deployment, lifecycle_cluster, rolled_out},
    links::readyz,
};

const NS: &str = "mc-links";

/// Addresses planned for two replicas: IPs, (Eureka, admin) ports, Eureka URLs.
type Planned = (Vec<Ipv4Addr>, Vec<(u16, u16)>, Vec<String>);

/// One cluster's two replicas at their planned addresses, replica `i` with the links in
/// `links[i]`.
async fn replicas(
    cluster: &Cluster,
    name: &str,
    (ips, ports, urls): &Planned,
    links: &[PathBuf],
    extra: &[&str],
) -> Vec<Operator> {
    let mut ops = Vec::new();
    for i in 0..2 {
        let mut launch = Launch::new(ips[i], NS, &format!("{name}-lease"));
        launch.ports = Some(ports[i]);
        launch.replica = format!("{name}-{i}");
        launch.cluster_id = Some(format!("cluster-{name}"));
        launch = launch.args(&[
            "--cluster-name",
            name,
            "--peer-urls",
            &urls[1 - i],
            "--replication-max-batching-delay-ms",
            "20",
            "--remote-clusters-file",
            &links[i].display().to_string(),
            "--remote-clusters-reload-interval-ms",
            "200",
            "--remote-initial-sync-timeout-ms",
            "3000",
        ]);
        launch = launch.args(extra);
        ops.push(Operator::spawn_with(cluster, launch));
    }
    for op in &ops {
        op.server.wait_ready().await;
    }
    ops
}

/// A TCP proxy to each of `to`'s replicas (its Eureka port) for each of the linking cluster's
/// replicas, and a links file per linking replica naming its own proxies: every cross-cluster
/// connection goes through a proxy a test can cut.
async fn proxied_links(dir: &Path, name: &str, to: &Planned) -> (Vec<PathBuf>, Vec<Vec<Proxy>>) {
    let (mut files, mut proxies) = (Vec::new(), Vec::new());
    for i in 0..2 {
        let mut mine = Vec::new();
        for j in 0..2 {
            mine.push(Proxy::start(Ipv4Addr::new(127, 0, 0, 128), (to.0[j], to.1[j].0).into()).await);
        }
        let urls: Vec<String> = mine.iter().map(Proxy::url).collect();
        let file = dir.join(format!("links-to-{name}-{i}.yaml"));
        // The first replica withdraws after 4 s of silence (the partition below); the other
        // keeps a silent link's copy for 10 minutes.
        let withdraw = if i == 0 { 4 } else { 600 };
        let text = format!(
            "- name: {name}\n  urls: [{}]\n  pollIntervalMs: 500\n  staleAfterSeconds: 2\n  withdrawAfterSeconds: {withdraw}\n",
            urls.join(", ")
        );
        std::fs::write(&file, text).unwrap();
        files.push(file);
        proxies.push(mine);
    }
    (files, proxies)
}

fn statefulset(app: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {app}, namespace: {NS}}}
spec:
  replicas: 1
  serviceName: {app}
  selector: {{matchLabels: {{app: {app}}}}}
  template:
    metadata:
      labels: {{app: {app}}}
      annotations: {{kwok.eureka-operator.dev/ready-after: \"200ms\"}}
    spec:
      containers:
      - name: app
        image: example/{app}:1
        ports: [{{name: http, containerPort: 8080}}]
"
    )
}

async fn ids(server: &Server, app: &str) -> BTreeSet<String> {
    app_instances(&server.url(), app)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Waits until every server lists exactly `expected` ids of `app`.
async fn wait_ids(servers: &[&Server], app: &str, expected: &BTreeSet<String>, what: &str) {
    for s in servers {
        let what = format!("{what} on {}", s.url());
        wait_equal(&what, Duration::from_secs(60), expected, || ids(s, app)).await;
    }
}

/// Waits until `server` lists `n` UP instances of `app`; their ids.
async fn wait_up(server: &Server, app: &str, n: usize) -> BTreeSet<String> {
    wait_for(
        &format!("{n} UP {app} instances on {}", server.url()),
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async {
            let all = app_instances(&server.url(), app).await;
            let up: BTreeSet<String> = all.iter().filter(|(_, s)| s == "UP").map(|(i, _)| i.clone()).collect();
            (up.len() == n && all.len() == n).then_some(up)
        },
    )
    .await
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test]
async fn two_kubernetes_clusters_link_both_ways_and_each_owns_only_its_own() {
    let Some(west) = lifecycle_cluster() else { return };
    let Some(east) = tokio::task::spawn_blocking(|| Cluster::start_with_controllers(1))
        .await
        .unwrap()
    else {
        return;
    };
    prepare(&east);
    let (west_client, east_client) = (west.admin().await, east.admin().await);
    namespace(&west_client, NS).await;
    namespace(&east_client, NS).await;
    let dir = scratch_dir("multicluster");
    // Each side's addresses are known before either starts: plan them, then put a proxy on
    // every cross-cluster connection and write each replica's links file.
    let (west_plan, east_plan) = (replica_addresses(121, 2), replica_addresses(123, 2));
    let (west_files, west_proxies) = proxied_links(dir.path(), "east", &east_plan).await;
    let (east_files, _east_proxies) = proxied_links(dir.path(), "west", &west_plan).await;
    let Some(java) = JavaServer::start(Ipv4Addr::new(127, 0, 0, 125), &[]).await else {
        return;
    };
    let java_url = java.url();
    // The old way for comparison: a server that gets east's pods as east's Java peer.
    let contrast = Server::start(
        Ipv4Addr::new(127, 0, 0, 126),
        &[
            "--enable-self-preservation",
            "false",
            "--eviction-interval-timer-in-ms",
            "1000",
        ],
    )
    .await;
    let contrast_url = contrast.url();
    let west_extra = ["--java-peer-urls", java_url.as_str()];
    let east_extra = [
        "--java-peer-urls",
        contrast_url.as_str(),
        "--java-peer-heartbeat-interval-ms",
        "1000",
    ];
    let (w, e) = tokio::join!(
        replicas(west, "west", &west_plan, &west_files, &west_extra),
        replicas(&east, "east", &east_plan, &east_files, &east_extra)
    );
    let all: Vec<&Server> = w.iter().chain(e.iter()).map(|o| &o.server).collect();
    let w_servers: Vec<&Server> = w.iter().map(|o| &o.server).collect();

    // ORDERS runs in both clusters, BILLING only in west. East's pods carry a short lease, so
    // the contrast server (a Java peer of east) expires them soon after east stops renewing.
    let spec = "  selector:\n    matchLabels: {app: orders}\n  port: http\n";
    eureka_app(
        &east,
        NS,
        "orders",
        &format!("{spec}  lease: {{renewalIntervalSeconds: 2, durationSeconds: 6}}\n"),
    );
    eureka_app(west, NS, "orders", spec);
    eureka_app(west, NS, "billing", &spec.replace("orders", "billing"));
    apply(&east, &deployment(NS, "orders", 3, "example/orders:1", "200ms", 1));
    apply(west, &deployment(NS, "orders", 1, "example/orders:1", "200ms", 1));
    apply(west, &deployment(NS, "billing", 2, "example/billing:1", "200ms", 1));
    let east_orders = wait_up(&e[0].server, "ORDERS", 3 + 1).await;
    let billing = wait_up(&w[0].server, "BILLING", 2).await;
    let both_orders = east_orders.clone();
    wait_ids(&all, "ORDERS", &both_orders, "ORDERS from both clusters").await;
    wait_ids(&all, "BILLING", &billing, "west's BILLING everywhere").await;
    let east_own: BTreeSet<String> = crate::links::export(&e[0].server)
        .await
        .into_iter()
        .filter(|(app, _)| app == "ORDERS")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        east_own.len(),
        3,
        "east exports its own three ORDERS pods: {east_own:?}"
    );
    let west_own: BTreeSet<String> = both_orders.difference(&east_own).cloned().collect();
    assert_eq!(west_own.len(), 1);

    // Freshness: east scales up; every west replica lists each new pod within the poll (500 ms)
    // and a second of east listing it UP.
    let east_deployments: Api<Deployment> = Api::namespaced(east_client.clone(), NS);
    east_deployments
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 6}})),
        )
        .await
        .unwrap();
    let mut seen_east: std::collections::BTreeMap<String, Instant> = Default::default();
    let mut seen_west: std::collections::BTreeMap<(usize, String), Instant> = Default::default();
    let started = Instant::now();
    loop {
        for (id, status) in app_instances(&e[0].server.url(), "ORDERS").await {
            if status == "UP" && !both_orders.contains(&id) {
                seen_east.entry(id).or_insert_with(Instant::now);
            }
        }
        for (i, op) in w.iter().enumerate() {
            for (id, status) in app_instances(&op.server.url(), "ORDERS").await {
                if status == "UP" && !both_orders.contains(&id) {
                    seen_west.entry((i, id)).or_insert_with(Instant::now);
                }
            }
        }
        if seen_east.len() == 3 && seen_west.len() == 6 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "east's new pods: {seen_east:?} / {seen_west:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut lags: Vec<u128> = seen_west
        .iter()
        .map(|((_, id), at)| at.saturating_duration_since(seen_east[id]).as_millis())
        .collect();
    lags.sort();
    let (p50, p99) = (percentile(&lags, 0.5), percentile(&lags, 0.99));
    println!(
        "MULTICLUSTER freshness: west lists east's new pods p50 {p50} ms, p99 {p99} ms after east does (poll 500 ms)"
    );
    assert!(p99 <= 1_500, "within the poll and a second: p99 {p99} ms");
    let east_orders: BTreeSet<String> = wait_up(&e[0].server, "ORDERS", 7).await;

    // A real Spring client in west sees both clusters' pods while east rolls its Deployment,
    // with no hash-code mismatch.
    let Some(spring) = SpringClient::start(&w[0].server.url(), "mc-watcher", "mc-watcher-1", &[]).await else {
        return;
    };
    wait_for(
        "the Spring client to see every ORDERS pod",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (spring.seen_all("ORDERS").await.len() == east_orders.len()).then_some(()) },
    )
    .await;
    east_deployments
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Strategic(&json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "example/orders:2"}]}}}})),
        )
        .await
        .unwrap();
    wait_for(
        "east's rollout",
        Duration::from_secs(180),
        Duration::from_millis(200),
        || async { rolled_out(&east_deployments.get("orders").await.ok()?, 6).then_some(()) },
    )
    .await;
    let rolled = wait_up(&e[0].server, "ORDERS", 7).await;
    assert_eq!(
        rolled.intersection(&east_orders).count(),
        1,
        "only west's pod is the same"
    );
    wait_ids(&all, "ORDERS", &rolled, "the rolled ORDERS everywhere").await;
    let stats = wait_for(
        "the Spring client to see the rolled pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let seen: BTreeSet<String> = spring.seen_all("ORDERS").await.into_iter().map(|(i, _)| i).collect();
            (seen == rolled).then_some(())?;
            Some(spring.stats().await)
        },
    )
    .await;
    assert_no_mismatch("the Spring client in west", "west's operator", &stats, true);
    println!("MULTICLUSTER spring client: {stats}");

    // The Java peer of west has west's pods, never east's.
    let java_orders: BTreeSet<String> = app_instances(&java.url(), "ORDERS")
        .await
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(java_orders, west_own, "the Java peer holds west's own ORDERS pod only");
    assert_eq!(
        app_instances(&java.url(), "BILLING").await.len(),
        2,
        "and west's BILLING"
    );

    // StatefulSets named alike: web-0 in both clusters gives the same default id; each side
    // shows its own and counts the other's as hidden. {clusterName} keeps them apart.
    let web = "  selector:\n    matchLabels: {app: web}\n  port: http\n";
    eureka_app(west, NS, "web", web);
    eureka_app(&east, NS, "web", web);
    apply(west, &statefulset("web"));
    apply(&east, &statefulset("web"));
    let west_web = wait_up(&w[0].server, "WEB", 1).await;
    let east_web = wait_up(&e[0].server, "WEB", 1).await;
    assert_eq!(west_web, east_web, "the same id on both sides");
    for op in w.iter().chain(e.iter()) {
        wait_for(
            "the other side's web-0 counted as hidden",
            Duration::from_secs(20),
            Duration::from_millis(100),
            || async {
                let hidden = op
                    .server
                    .metric(r#"eureka_link_hidden_instances{link="east"}"#)
                    .await
                    .unwrap_or(0.0)
                    + op.server
                        .metric(r#"eureka_link_hidden_instances{link="west"}"#)
                        .await
                        .unwrap_or(0.0);
                (hidden == 1.0).then_some(())
            },
        )
        .await;
    }
    let named = format!("{web}  instanceId: \"{{clusterName}}-{{pod.name}}\"\n");
    eureka_app(west, NS, "web", &named);
    eureka_app(&east, NS, "web", &named);
    let web_ids: BTreeSet<String> = ["west-web-0", "east-web-0"].into_iter().map(String::from).collect();
    wait_ids(&all, "WEB", &web_ids, "both web-0 pods, told apart by {clusterName}").await;

    // Deleting west's EurekaApps, then its namespace, never touches east's entries on either
    // side: they stay, unchanged, in east and in west's imports.
    let east_now: BTreeSet<String> = rolled.difference(&west_own).cloned().collect();
    west.kubectl_ok(&["delete", "eurekaapp", "orders", "-n", NS, "--wait=false"]);
    wait_ids(&all, "ORDERS", &east_now, "ORDERS without west's EurekaApp").await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(west_client.clone());
    namespaces.delete(NS, &DeleteParams::default()).await.unwrap();
    wait_ids(&all, "BILLING", &BTreeSet::new(), "BILLING gone with west's namespace").await;
    let east_web: BTreeSet<String> = ["east-web-0".to_string()].into();
    wait_ids(&all, "WEB", &east_web, "only east's web-0").await;
    wait_ids(&all, "ORDERS", &east_now, "east's ORDERS untouched").await;

    // A partition of one replica: west-0's connections to east are refused. Only west-0 warns;
    // after its withdraw time (4 s) it withdraws east's ORDERS, since west has an UP ORDERS of
    // its own (a native client's), and shows them again, from the last copy, once that one
    // goes. West-1 still polls. East scales down meanwhile, and after the heal west-0 equals
    // east within a poll; the heal clears the warning.
    let native = Native::new(&w[0].server.url(), "ORDERS", "west-native-1");
    assert_eq!(native.register().await, 204);
    let with_native: BTreeSet<String> = east_now.iter().cloned().chain(["west-native-1".to_string()]).collect();
    wait_ids(
        &w_servers,
        "ORDERS",
        &with_native,
        "east's ORDERS and west's native one",
    )
    .await;
    for p in &west_proxies[0] {
        p.cut();
    }
    let cut = Instant::now();
    wait_for(
        "west-0's stale warning",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async { readyz(&w[0].server).await.contains("has not answered").then_some(()) },
    )
    .await;
    assert!(
        !readyz(&w[1].server).await.contains("link east"),
        "west-1, not cut, does not warn"
    );
    let only_native: BTreeSet<String> = ["west-native-1".to_string()].into();
    wait_ids(
        &[&w[0].server],
        "ORDERS",
        &only_native,
        "east's ORDERS withdrawn on west-0",
    )
    .await;
    let withdrawn_after = cut.elapsed().as_millis();
    assert_eq!(
        ids(&w[1].server, "ORDERS").await,
        with_native,
        "west-1, not cut, withdraws nothing"
    );
    assert_eq!(native.cancel().await, 200);
    wait_ids(
        &[&w[0].server],
        "ORDERS",
        &east_now,
        "east's last copy shown again on west-0 once west's own ORDERS is gone",
    )
    .await;
    println!(
        "MULTICLUSTER partition of west-0: withdrawn {withdrawn_after} ms after the cut (withdrawAfter 4 s), \
         the last copy shown again when west's own instance went"
    );
    east_deployments
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    let churned = wait_up(&e[0].server, "ORDERS", 4).await;
    wait_ids(
        &[&w[1].server],
        "ORDERS",
        &churned,
        "west-1 following east's scale-down",
    )
    .await;
    assert_eq!(
        ids(&w[0].server, "ORDERS").await,
        east_now,
        "west-0, cut off, keeps east's last copy"
    );
    let east_now = churned;
    for p in &west_proxies[0] {
        p.heal();
    }
    let healed = Instant::now();
    while ids(&w[0].server, "ORDERS").await != east_now {
        assert!(
            healed.elapsed() < Duration::from_secs(30),
            "west-0 never caught up with east after the heal"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let caught_up = healed.elapsed().as_millis();
    println!(
        "MULTICLUSTER after the heal west-0 equalled east (scaled down meanwhile) in {caught_up} ms (poll 500 ms)"
    );
    assert!(
        caught_up <= 1_500,
        "within a poll and a second of the heal: {caught_up} ms"
    );
    wait_for(
        "west-0's warning to clear",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async { (!readyz(&w[0].server).await.contains("link east")).then_some(()) },
    )
    .await;
    println!("MULTICLUSTER a partition of west-0 alone: only it warned, and the heal cleared the warning");

    // East's apiserver down for 20 s: east keeps serving its last view, so west keeps east's
    // instances. The server that gets them the old way, as a Java peer of east, loses them once
    // east's Lease holder stops renewing them there.
    wait_ids(&[&contrast], "ORDERS", &east_now, "east's pods on its Java peer").await;
    let before = ids(&w[0].server, "ORDERS").await;
    assert_eq!(before, east_now);
    east.freeze_apiserver();
    let frozen = Instant::now();
    let mut contrast_lost_at = None;
    while frozen.elapsed() < Duration::from_secs(20) {
        for op in &w {
            assert_eq!(ids(&op.server, "ORDERS").await, before, "west keeps east's instances");
        }
        if contrast_lost_at.is_none() && ids(&contrast, "ORDERS").await.is_empty() {
            contrast_lost_at = Some(frozen.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    east.resume_apiserver();
    let left = ids(&contrast, "ORDERS").await.len();
    println!(
        "MULTICLUSTER east's apiserver down 20 s: west kept all {} of east's ORDERS over the link; \
         the Java-peer path kept {left} (emptied after {contrast_lost_at:?})",
        before.len()
    );
    assert!(
        contrast_lost_at.is_some(),
        "the Java-peer path evicts east's pods without a Lease holder"
    );
    drop(spring);
}
