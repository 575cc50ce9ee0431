//! High availability: three replicas on loopback share a Lease on the real apiserver and
//! replicate to each other with Eureka's batch protocol. The leader fails over, a restarted
//! replica syncs before it is ready, and a partitioned replica keeps its view (self-preservation)
//! and converges once reconnected.

use std::{net::Ipv4Addr, sync::Arc, time::Duration};

use crate::common::{
    cluster::Cluster,
    eureka::{Native, http},
    operator::{Launch, OPERATOR_NAMESPACE, Operator, host_ip, instances, namespace, prepared},
    process::{free_port, replica_addresses, wait_for},
    proxy::Proxy,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

async fn leaders(replicas: &[&Operator]) -> Vec<Option<bool>> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(r.server.metric("eureka_leader").await.map(|v| v == 1.0));
    }
    out
}

fn count(xs: &[Option<bool>]) -> usize {
    xs.iter().filter(|x| **x == Some(true)).count()
}

/// The `--peer-urls` value of replica `me`: every other replica's URL.
fn peer_args(urls: &[String], me: usize) -> String {
    urls.iter()
        .enumerate()
        .filter(|(j, _)| *j != me)
        .map(|(_, u)| u.clone())
        .collect::<Vec<_>>()
        .join(",")
}

/// Three replicas on 127.0.0.(first+i) sharing the Lease `lease`, each with the others as
/// `--peer-urls`, replication batches after 20 ms, and `extra` flags; with their Eureka URLs.
async fn start_three(
    cluster: &Cluster,
    ns: &str,
    lease: &str,
    first: u8,
    extra: &[&str],
) -> (Vec<Operator>, Vec<String>) {
    let (ips, ports, urls) = replica_addresses(first, 3);
    let mut replicas = Vec::new();
    for i in 0..3 {
        let peers = peer_args(&urls, i);
        let mut args = vec![
            "--peer-urls",
            peers.as_str(),
            "--replication-max-batching-delay-ms",
            "20",
        ];
        args.extend_from_slice(extra);
        let name = format!("replica-{i}");
        replicas.push(Operator::start_on(cluster, ips[i], ports[i], ns, lease, &name, &args).await);
    }
    (replicas, urls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_fails_over_and_eviction_continues_on_one_replica_only() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ha-failover";
    namespace(&client, ns).await;
    let (mut replicas, urls) = start_three(
        cluster,
        ns,
        "ha-failover",
        21,
        &[
            "--enable-self-preservation",
            "false",
            "--eviction-interval-timer-in-ms",
            "300",
        ],
    )
    .await;
    let all: Vec<&Operator> = replicas.iter().collect();
    let now = wait_for(
        "one leader",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let l = leaders(&all).await;
            (count(&l) == 1).then_some(l)
        },
    )
    .await;
    let leader = now.iter().position(|l| *l == Some(true)).unwrap();
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;

    // A write to any replica reaches the others within a second.
    let started = std::time::Instant::now();
    assert_eq!(
        Native::new(&urls[follower], "KEEPER", "keeper-1")
            .lease(300, 30)
            .register()
            .await,
        204
    );
    for r in &replicas {
        wait_for(
            "replication of keeper-1",
            Duration::from_secs(5),
            Duration::from_millis(10),
            || async { (!instances(&r.server, "KEEPER").await.is_empty()).then_some(()) },
        )
        .await;
    }
    let lag = started.elapsed();
    println!("REPLICATED_TO_ALL in {lag:?}");
    assert!(lag < Duration::from_secs(1), "replication took {lag:?}");

    // Watch for two leaders at once while the leader is killed.
    let watchers: Vec<(String, u16)> = replicas
        .iter()
        .map(|r| (r.server.ip.to_string(), r.server.admin_port))
        .collect();
    let max_leaders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (max_leaders, stop) = (max_leaders.clone(), stop.clone());
        tokio::spawn(async move {
            let http = http();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut n = 0;
                for (ip, port) in &watchers {
                    if let Ok(r) = http
                        .get(format!("http://{ip}:{port}/metrics"))
                        .timeout(Duration::from_millis(300))
                        .send()
                        .await
                        && let Ok(text) = r.text().await
                        && text.lines().any(|l| l == "eureka_leader 1")
                    {
                        n += 1;
                    }
                }
                max_leaders.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    let killed_at = std::time::Instant::now();
    replicas[leader].server.proc.kill();
    // The dead leader's last renewal, as the Lease records it (nobody writes it until a takeover).
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let before = leases.get("ha-failover").await.unwrap().spec.unwrap();
    assert_eq!(
        before.holder_identity.as_deref(),
        Some(replicas[leader].replica.as_str())
    );
    let last_renewal = before.renew_time.unwrap().0;
    let survivors: Vec<&Operator> = [follower, other].iter().map(|i| &replicas[*i]).collect();
    let l = wait_for(
        "a new leader",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let l = leaders(&survivors).await;
            (count(&l) == 1).then_some(l)
        },
    )
    .await;
    let takeover = killed_at.elapsed();
    let new_leader = survivors[l.iter().position(|x| *x == Some(true)).unwrap()];
    // Judged on the Lease's own record (one clock: every process runs on this host): the new
    // holder acquired it no sooner than a lease after the dead one's last renewal (a follower
    // counts the lease from when it first saw that renewal), and no later than one more look
    // (a third of the lease) plus the apiserver round trips of a loaded machine.
    let after = leases.get("ha-failover").await.unwrap().spec.unwrap();
    assert_eq!(after.holder_identity.as_deref(), Some(new_leader.replica.as_str()));
    let acquired = after.acquire_time.unwrap().0;
    let gap = Duration::try_from(acquired.duration_since(last_renewal)).unwrap_or_default();
    println!("LEADER_TAKEOVER in {takeover:?} after the kill, {gap:?} after the last renewal (lease 3 s)");
    assert!(
        gap >= Duration::from_secs(3),
        "taken over {gap:?} after the last renewal, before the lease ran out"
    );
    assert!(
        gap <= Duration::from_secs(3) + Duration::from_secs(1) + Duration::from_millis(1000),
        "taken over {gap:?} after the last renewal"
    );

    // Eviction continues, on the new leader, and reaches the other replica.
    assert_eq!(
        Native::new(&urls[follower], "DOOMED", "doomed-1")
            .lease(1, 1)
            .register()
            .await,
        204
    );
    for r in &survivors {
        wait_for(
            "doomed-1 to be evicted everywhere",
            Duration::from_secs(15),
            Duration::from_millis(50),
            || async { instances(&r.server, "DOOMED").await.is_empty().then_some(()) },
        )
        .await;
    }
    assert!(new_leader.server.metric("eureka_evictions_total").await.unwrap() >= 1.0);
    let follower_now = survivors
        .iter()
        .find(|r| r.server.port != new_leader.server.port)
        .unwrap();
    assert_eq!(
        follower_now.server.metric("eureka_evictions_total").await.unwrap(),
        0.0,
        "followers never evict"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    assert!(
        max_leaders.load(std::sync::atomic::Ordering::Relaxed) <= 1,
        "two replicas led at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_has_the_whole_registry_before_it_is_ready() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ha-restart";
    namespace(&client, ns).await;
    let (mut replicas, urls) = start_three(cluster, ns, "ha-restart", 31, &[]).await;
    for n in 0..20 {
        assert_eq!(
            Native::new(&urls[0], "ROLLING", &format!("r-{n}"))
                .lease(300, 30)
                .register()
                .await,
            204
        );
    }
    wait_for(
        "20 instances on replica 2",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { (instances(&replicas[2].server, "ROLLING").await.len() == 20).then_some(()) },
    )
    .await;

    // Replica 2 goes away; the cluster takes more registrations meanwhile.
    replicas[2].server.proc.terminate(Duration::from_secs(10));
    for n in 20..25 {
        assert_eq!(
            Native::new(&urls[0], "ROLLING", &format!("r-{n}"))
                .lease(300, 30)
                .register()
                .await,
            204
        );
    }
    // Back: the moment /readyz turns green, it must already hold all 25.
    replicas[2].start_again(ns, "ha-restart").await;
    let have = instances(&replicas[2].server, "ROLLING").await.len();
    assert_eq!(have, 25, "ready before the registry was synced");
    let log = replicas[2].server.proc.log();
    assert!(log.contains("synced the registry from a peer"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_replica_keeps_its_view_and_converges() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ha-partition";
    namespace(&client, ns).await;
    let ips: Vec<Ipv4Addr> = (0..3).map(|i| Ipv4Addr::new(127, 0, 0, 41 + i)).collect();
    let ports: Vec<(u16, u16)> = ips.iter().map(|ip| (free_port(*ip), free_port(*ip))).collect();
    // Every directed link between replicas goes through its own proxy.
    let mut links = std::collections::BTreeMap::new();
    for from in 0..3 {
        for to in 0..3 {
            if from != to {
                let target = std::net::SocketAddr::from((ips[to], ports[to].0));
                links.insert((from, to), Proxy::start(ips[from], target).await);
            }
        }
    }
    let flags = |i: usize| -> Vec<String> {
        let peers: Vec<String> = (0..3).filter(|j| *j != i).map(|j| links[&(i, j)].url()).collect();
        vec![
            "--peer-urls".into(),
            peers.join(","),
            "--renews-window-ms".into(),
            "1000".into(),
            "--expected-client-renewal-interval-seconds".into(),
            "1".into(),
            "--eviction-interval-timer-in-ms".into(),
            "300".into(),
            "--replication-max-batching-delay-ms".into(),
            "20".into(),
        ]
    };
    // Replica 2 starts first and leads; it is the one cut off below.
    let mut replicas: Vec<Option<Operator>> = vec![None, None, None];
    for i in [2usize, 0, 1] {
        let f = flags(i);
        let args: Vec<&str> = f.iter().map(String::as_str).collect();
        replicas[i] = Some(
            Operator::start_on(
                cluster,
                ips[i],
                ports[i],
                ns,
                "ha-partition",
                &format!("replica-{i}"),
                &args,
            )
            .await,
        );
        if i == 2 {
            let r = replicas[2].as_ref().unwrap();
            wait_for(
                "replica 2 to lead",
                Duration::from_secs(20),
                Duration::from_millis(50),
                || async { (r.server.metric("eureka_leader").await == Some(1.0)).then_some(()) },
            )
            .await;
        }
    }
    let replicas: Vec<Operator> = replicas.into_iter().map(Option::unwrap).collect();
    let a = replicas[0].server.url();
    let cut_off = &replicas[2];

    // Four clients renew every 300 ms at replica 0 (lease 2 s); replica 0 replicates the renewals.
    let ids: Vec<String> = (0..4).map(|n| format!("p-{n}")).collect();
    for id in &ids {
        assert_eq!(Native::new(&a, "PART", id).lease(2, 1).register().await, 204);
    }
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beats = {
        let (a, ids, beating) = (a.clone(), ids.clone(), beating.clone());
        tokio::spawn(async move {
            let http = http();
            while beating.load(std::sync::atomic::Ordering::Relaxed) {
                for id in &ids {
                    let _ = http.put(format!("{a}apps/PART/{id}?status=UP")).send().await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    wait_for(
        "replica 2 to see renewals above the threshold",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            (cut_off.server.metric("eureka_self_preservation_active").await == Some(0.0)
                && instances(&cut_off.server, "PART").await.len() == 4)
                .then_some(())
        },
    )
    .await;

    // Cut replica 2 off from the other replicas, both ways.
    for ((from, to), p) in &links {
        if *from == 2 || *to == 2 {
            p.cut();
        }
    }
    // Its renewals stop; self-preservation holds its view although every lease runs out.
    wait_for(
        "self-preservation on the cut-off replica",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (cut_off.server.metric("eureka_self_preservation_active").await == Some(1.0)).then_some(()) },
    )
    .await;
    // Every lease runs out (2 s), and an eviction run after that is held back.
    wait_for(
        "the leases to expire",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (cut_off.server.metric("eureka_expired_leases").await == Some(4.0)).then_some(()) },
    )
    .await;
    let held = cut_off.server.metric("eureka_eviction_runs_held_total").await.unwrap();
    wait_for(
        "an eviction run after expiry",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { (cut_off.server.metric("eureka_eviction_runs_held_total").await.unwrap() > held).then_some(()) },
    )
    .await;
    assert_eq!(
        instances(&cut_off.server, "PART").await.len(),
        4,
        "self-preservation kept the view"
    );
    assert_eq!(cut_off.server.metric("eureka_evictions_total").await, Some(0.0));
    // The others keep serving, and take writes.
    assert_eq!(Native::new(&a, "PART", "p-late").lease(2, 1).register().await, 204);
    let late_ok = |v: &Vec<(String, String)>| v.iter().any(|(i, _)| i == "p-late");
    wait_for(
        "p-late on replica 1",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async { late_ok(&instances(&replicas[1].server, "PART").await).then_some(()) },
    )
    .await;
    assert!(!late_ok(&instances(&cut_off.server, "PART").await));

    // Reconnected: replica 2 converges (the late registration arrives; renewals resume).
    let mut ids_all = ids.clone();
    ids_all.push("p-late".into());
    {
        let (a, beating) = (a.clone(), beating.clone());
        tokio::spawn(async move {
            let http = http();
            while beating.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = http.put(format!("{a}apps/PART/p-late?status=UP")).send().await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
    }
    for p in links.values() {
        p.heal();
    }
    wait_for(
        "replica 2 to converge",
        Duration::from_secs(40),
        Duration::from_millis(100),
        || async {
            let have: Vec<String> = instances(&cut_off.server, "PART")
                .await
                .into_iter()
                .map(|(i, _)| i)
                .collect();
            (have == ids_all && cut_off.server.metric("eureka_self_preservation_active").await == Some(0.0))
                .then_some(())
        },
    )
    .await;
    beating.store(false, std::sync::atomic::Ordering::Relaxed);
    beats.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_find_each_other_through_the_headless_service() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ha-discovery";
    namespace(&client, ns).await;
    let ip = host_ip();
    let ports = [free_port(ip), free_port(ip)];
    // One EndpointSlice per replica (a slice has one port list), as the EndpointSlice controller
    // would write them for the chart's headless Service.
    for (n, (name, port)) in [("disc-a", ports[0]), ("disc-b", ports[1])].into_iter().enumerate() {
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("disc-peers-{n}"), "namespace": "eureka-system",
                         "labels": {"kubernetes.io/service-name": "disc-peers"}},
            "addressType": "IPv4",
            "ports": [{"name": "eureka", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": name, "namespace": "eureka-system"}}]
        });
        let (ok, out) = crate::common::operator::kubectl_apply(cluster, &slice.to_string());
        assert!(ok, "{out}");
    }
    // The slices say both are ready before either runs: one sync attempt is enough here.
    let extra = [
        "--peer-service",
        "disc-peers",
        "--replication-max-batching-delay-ms",
        "20",
        "--registry-sync-retries",
        "1",
    ];
    let a = Operator::start_on(
        cluster,
        ip,
        (ports[0], free_port(ip)),
        ns,
        "ha-discovery",
        "disc-a",
        &extra,
    )
    .await;
    let b = Operator::start_on(
        cluster,
        ip,
        (ports[1], free_port(ip)),
        ns,
        "ha-discovery",
        "disc-b",
        &extra,
    )
    .await;
    assert_eq!(
        Native::new(&a.server.url(), "FOUND", "via-a")
            .lease(300, 30)
            .register()
            .await,
        204
    );
    assert_eq!(
        Native::new(&b.server.url(), "FOUND", "via-b")
            .lease(300, 30)
            .register()
            .await,
        204
    );
    for r in [&a, &b] {
        wait_for(
            "both registrations on both replicas",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async { (instances(&r.server, "FOUND").await.len() == 2).then_some(()) },
        )
        .await;
    }
    // Each lists the other, never itself.
    let status: serde_json::Value = http()
        .get(format!("{}status", a.server.url()))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let replicas = status["applicationStats"]["registered-replicas"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(replicas, format!("http://{ip}:{}/eureka/", ports[1]));
}

/// #27.2: replicas started together do not wait on each other. Each lists the others as peers,
/// and each answers the others' start-up fetch with 503 while it is not complete itself; such a
/// peer is starting too, not a source, so a replica is complete with what its watches give and
/// learns the rest through replication. Before, each retried its sync from the others (5 s
/// apart) and was ready only after about 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_started_together_are_ready_without_waiting_on_each_other() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "ha-together";
    namespace(&client, ns).await;
    let (ips, ports, urls) = replica_addresses(160, 3);
    let started = std::time::Instant::now();
    let replicas: Vec<Operator> = (0..3)
        .map(|i| {
            let mut launch = Launch::new(ips[i], ns, "ha-together").args(&["--peer-urls", &peer_args(&urls, i)]);
            launch.ports = Some(ports[i]);
            launch.replica = format!("together-{i}");
            Operator::spawn_with(cluster, launch)
        })
        .collect();
    let mut ready_after = Vec::new();
    for r in &replicas {
        r.server.wait_ready().await;
        ready_after.push(started.elapsed());
    }
    eprintln!("FIGURES started together: ready after {ready_after:?}");
    for (i, r) in replicas.iter().enumerate() {
        let log = r.server.proc.log();
        assert!(
            !log.contains("could not sync from a peer"),
            "replica {i} waited on a peer:\n{log}"
        );
    }
    let slowest = ready_after.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_secs(5),
        "ready after {ready_after:?}: a replica waited on the others"
    );
    // Replication still joins them: a registration on one reaches the others.
    let c = Native::new(&urls[0], "TOGETHER", "t-1");
    assert_eq!(c.register().await, 204);
    for url in &urls[1..] {
        wait_for(
            "the registration replicated",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async { c.is_on(url).await.then_some(()) },
        )
        .await;
    }
}
