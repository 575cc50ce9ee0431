//! Links between clusters' registries (`--remote-clusters-file`), between standalone servers of
//! this operator, each cluster two replicas on their own loopback addresses: freshness, exact
//! copies without transit or echo, a mesh of three, a link to itself, client writes on imports,
//! colliding ids, partitions through a TCP proxy (refused, black-holed, one-way), a restart
//! while the source is down, and credentials.

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::common::{
    clients::assert_no_mismatch,
    eureka::{Native, Server, SpringClient, app_instances, http},
    process::{replica_addresses, scratch_dir, wait_equal, wait_for},
    proxy::{Direction, Mode, Proxy},
};

/// One cluster's replicas, planned before any starts (links name each other's URLs).
struct Plan {
    name: &'static str,
    ips: Vec<Ipv4Addr>,
    ports: Vec<(u16, u16)>,
    urls: Vec<String>,
}

fn plan(name: &'static str, first: u8, replicas: usize) -> Plan {
    let (ips, ports, urls) = replica_addresses(first, replicas);
    Plan { name, ips, ports, urls }
}

/// A link in the file's YAML.
fn link(name: &str, urls: &[String], extra: &str) -> String {
    let urls = urls.join(", ");
    let mut s = format!("- name: {name}\n  urls: [{urls}]\n");
    for line in extra.lines().filter(|l| !l.trim().is_empty()) {
        s.push_str(&format!("  {}\n", line.trim()));
    }
    s
}

/// A link to `east` that reads its credentials from files, withdrawn 4 s after a silence.
fn link_with_credentials(urls: &[String], user_file: &Path, password_file: &Path) -> String {
    link(
        "east",
        urls,
        &format!(
            "pollIntervalMs: 200\nstaleAfterSeconds: 2\nwithdrawAfterSeconds: 4\nonWithdraw: Always\nusernameFile: {}\npasswordFile: {}",
            user_file.display(),
            password_file.display()
        ),
    )
}

fn write(path: &Path, text: &str) {
    // Written aside and renamed, as a kubelet swaps a mounted file: never read half-written.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Starts every replica of `plan` (peered with each other) and waits until all are ready.
async fn start(plan: &Plan, links: Option<&Path>, extra: &[&str]) -> Vec<Server> {
    let mut servers = Vec::new();
    for i in 0..plan.ips.len() {
        let peers: Vec<String> = plan
            .urls
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, u)| u.clone())
            .collect();
        let peers = peers.join(",");
        let file = links.map(|p| p.display().to_string());
        let mut args: Vec<&str> = vec![
            "--cluster-name",
            plan.name,
            "--replica-id",
            ["r0", "r1", "r2"][i],
            "--replication-max-batching-delay-ms",
            "20",
            "--remote-clusters-reload-interval-ms",
            "200",
        ];
        if !peers.is_empty() {
            args.extend(["--peer-urls", peers.as_str()]);
        }
        if let Some(f) = &file {
            args.extend(["--remote-clusters-file", f.as_str()]);
        }
        args.extend_from_slice(extra);
        let (port, admin) = plan.ports[i];
        servers.push(Server::spawn_on(plan.ips[i], port, admin, &args, &[]));
    }
    for s in &servers {
        s.wait_ready().await;
    }
    servers
}

/// `GET {path}` as JSON on a server.
async fn get_json(server: &Server, path: &str) -> Value {
    http()
        .get(format!("{}{path}", server.url()))
        .header("Accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `(app, id)` of every instance a server shows.
async fn shown(server: &Server) -> BTreeSet<(String, String)> {
    pairs(&get_json(server, "apps/").await)
}

pub(crate) fn pairs(v: &Value) -> BTreeSet<(String, String)> {
    let one_or_many = |v: &Value| match v {
        Value::Array(a) => a.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    };
    let mut out = BTreeSet::new();
    for app in one_or_many(&v["applications"]["application"]) {
        for i in one_or_many(&app["instance"]) {
            out.insert((
                i["app"].as_str().unwrap_or_default().to_string(),
                i["instanceId"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    out
}

/// What a server exports over links (`GET link/apps`, everything).
pub(crate) async fn export(server: &Server) -> BTreeSet<(String, String)> {
    let v: Value = http()
        .get(format!("{}link/apps", server.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    pairs(&v)
}

async fn metric(server: &Server, sample: &str) -> f64 {
    server.metric(sample).await.unwrap_or(-1.0)
}

pub(crate) async fn readyz(server: &Server) -> String {
    http()
        .get(format!("{}/readyz", server.admin()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn register(base: &str, app: &str, id: &str) {
    assert_eq!(Native::new(base, app, id).register().await, 204, "register {app}/{id}");
}

fn set<const N: usize>(items: [(&str, &str); N]) -> BTreeSet<(String, String)> {
    items.iter().map(|(a, i)| (a.to_string(), i.to_string())).collect()
}

/// Waits until every server shows exactly `expected`.
async fn wait_shown(servers: &[&Server], expected: &BTreeSet<(String, String)>, what: &str) {
    for s in servers {
        let what = format!("{what} on {}", s.url());
        wait_equal(&what, Duration::from_secs(20), expected, || shown(s)).await;
    }
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test]
async fn linked_clusters_are_fresh_exact_loop_free_and_a_mesh_of_three_holds() {
    let dir = scratch_dir("links");
    let (east, west, north) = (plan("east", 101, 2), plan("west", 103, 2), plan("north", 105, 2));
    let (east_file, west_file, north_file) = (
        dir.path().join("east.yaml"),
        dir.path().join("west.yaml"),
        dir.path().join("north.yaml"),
    );
    write(&east_file, &link("west", &west.urls, ""));
    // West also names itself: refused by the source as a loop, never imported.
    write(
        &west_file,
        &(link("east", &east.urls, "") + &link("itself", &west.urls[..1], "")),
    );
    let timeout = ["--remote-initial-sync-timeout-ms", "3000"];
    let (e, w) = tokio::join!(
        start(&east, Some(&east_file), &timeout),
        start(&west, Some(&west_file), &timeout)
    );
    register(&e[0].url(), "ORDERS", "b-1").await;
    register(&e[0].url(), "ORDERS", "b-2").await;
    register(&w[0].url(), "BILLING", "a-1").await;
    let both = set([("ORDERS", "b-1"), ("ORDERS", "b-2"), ("BILLING", "a-1")]);
    wait_shown(&[&e[0], &e[1], &w[0], &w[1]], &both, "both clusters' instances").await;

    // Freshness: each of east's registrations is listed by every replica of west within the
    // poll interval (1 s) and a second.
    let mut latencies: Vec<u128> = Vec::new();
    for n in 0..12 {
        let id = format!("f-{n}");
        // Registrations at spread phases of the poll, not right after the last answer.
        tokio::time::sleep(Duration::from_millis((n * 379 % 1000) as u64)).await;
        let started = Instant::now();
        register(&e[0].url(), "ORDERS", &id).await;
        let mut pending: Vec<&Server> = w.iter().collect();
        while !pending.is_empty() {
            assert!(started.elapsed() < Duration::from_secs(10), "{id} never reached west");
            let mut still = Vec::new();
            for s in pending {
                if app_instances(&s.url(), "ORDERS").await.iter().any(|(i, _)| *i == id) {
                    latencies.push(started.elapsed().as_millis());
                } else {
                    still.push(s);
                }
            }
            pending = still;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    latencies.sort();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "link freshness over {} samples (poll 1000 ms): p50 {p50} ms, p99 {p99} ms",
        latencies.len()
    );
    assert!(
        p99 <= 2_000,
        "west lists east's instances within poll + 1 s: p99 {p99} ms"
    );

    // Exact copies: every replica imports exactly what the other side exports, nothing of its
    // own comes back (no echo), and what it imported is not exported again (no transit).
    let east_export = export(&e[0]).await;
    let west_export = export(&w[0]).await;
    assert_eq!(west_export, set([("BILLING", "a-1")]), "west exports only its own");
    assert!(east_export.iter().all(|(app, _)| app == "ORDERS"));
    assert_eq!(
        east_export,
        export(&e[1]).await,
        "both replicas of east export the same"
    );
    for s in &w {
        let imported = metric(s, r#"eureka_instances{origin="imported"}"#).await;
        assert_eq!(imported, east_export.len() as f64, "{} imports east's export", s.url());
        assert_eq!(metric(s, r#"eureka_link_instances{link="east"}"#).await, imported);
    }
    for s in &e {
        assert_eq!(metric(s, r#"eureka_instances{origin="imported"}"#).await, 1.0);
    }
    // No import was ever replicated: each second replica holds as replicated only what its
    // own first replica registered.
    assert_eq!(
        metric(&w[1], r#"eureka_instances{origin="replicated"}"#).await,
        1.0,
        "west's second replica got only BILLING by replication"
    );
    assert_eq!(
        metric(&e[1], r#"eureka_instances{origin="replicated"}"#).await,
        east_export.len() as f64
    );

    // The link to itself is refused as a loop and warned about; nothing came through it.
    for s in &w {
        assert!(metric(s, r#"eureka_link_failures_total{link="itself",class="loop"}"#).await > 0.0);
        assert!(readyz(s).await.contains("link itself"), "{}", readyz(s).await);
        assert_eq!(metric(s, r#"eureka_link_up{link="itself"}"#).await, 0.0);
    }

    // A mesh of three: north links to both, both link to north (their files change in place,
    // dropping west's link to itself).
    write(
        &north_file,
        &(link("east", &east.urls, "") + &link("west", &west.urls, "")),
    );
    let n = start(&north, Some(&north_file), &[]).await;
    write(
        &east_file,
        &(link("west", &west.urls, "") + &link("north", &north.urls, "")),
    );
    write(
        &west_file,
        &(link("east", &east.urls, "") + &link("north", &north.urls, "")),
    );
    register(&n[1].url(), "PAYMENTS", "c-1").await;
    let mut all = shown(&e[0]).await;
    all.retain(|(app, _)| app != "PAYMENTS");
    all.insert(("PAYMENTS".into(), "c-1".into()));
    wait_shown(
        &[&e[0], &e[1], &w[0], &w[1], &n[0], &n[1]],
        &all,
        "every cluster's instances",
    )
    .await;
    for (cluster, servers) in [("east", &e), ("west", &w), ("north", &n)] {
        let own = export(&servers[0]).await;
        for s in servers.iter() {
            let imported = metric(s, r#"eureka_instances{origin="imported"}"#).await;
            assert_eq!(
                imported,
                (all.len() - own.len()) as f64,
                "{cluster} imports every other cluster's own instances once"
            );
            assert_eq!(export(s).await, own, "{cluster} exports only its own");
        }
    }
    for s in &w {
        wait_for(
            "the link to itself to be gone with its series",
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async {
                s.metric(r#"eureka_link_up{link="itself"}"#)
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
}

#[tokio::test]
async fn writes_on_imports_follow_the_rules_and_a_local_id_wins() {
    let dir = scratch_dir("links");
    let (east, west) = (plan("east", 107, 1), plan("west", 108, 1));
    let west_file = dir.path().join("west.yaml");
    write(&west_file, &link("east", &east.urls, "pollIntervalMs: 200"));
    let e = start(&east, None, &["--cluster-local-apps", "secret"]).await;
    register(&e[0].url(), "ORDERS", "o-1").await;
    register(&e[0].url(), "SECRET", "s-1").await;
    let w = start(&west, Some(&west_file), &[]).await;
    let w0 = &w[0];
    assert_eq!(
        shown(w0).await,
        set([("ORDERS", "o-1")]),
        "a replica started with the source reachable answers with its instances at once, \
         and never with a cluster-local application"
    );
    assert_eq!(export(&e[0]).await, set([("ORDERS", "o-1")]));
    let page = http()
        .get(format!("{}/", w0.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Links to other clusters") && page.contains("<b>east</b>"),
        "the dashboard shows the link: {page}"
    );

    // Heartbeat and cancel find no lease of west's; a status override is east's to make.
    let import = Native::new(&w0.url(), "ORDERS", "o-1");
    assert_eq!(import.heartbeat().await, 404);
    assert_eq!(import.cancel().await, 404);
    let put = http()
        .put(format!("{}apps/ORDERS/o-1/status?value=OUT_OF_SERVICE", w0.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 409);
    let message = put.text().await.unwrap();
    assert!(message.contains("\"east\""), "the refusal names the link: {message}");
    assert_eq!(
        app_instances(&e[0].url(), "ORDERS").await,
        vec![("o-1".to_string(), "UP".to_string())],
        "east's instance is untouched"
    );

    // A registration with the same id is west's own: it wins and hides the import (counted).
    let local = Native::new(&w0.url(), "ORDERS", "o-1").at("10.99.0.1", 9000);
    assert_eq!(local.register().await, 204);
    let ip_of = |v: Option<Value>| v.map(|v| v["instance"]["ipAddr"].as_str().unwrap_or_default().to_string());
    let instance = |s: &Server| {
        let url = format!("{}apps/ORDERS/o-1", s.url());
        async move {
            http()
                .get(url)
                .header("Accept", "application/json")
                .send()
                .await
                .ok()?
                .json::<Value>()
                .await
                .ok()
        }
    };
    assert_eq!(ip_of(instance(w0).await).as_deref(), Some("10.99.0.1"));
    wait_for(
        "the hidden import to be counted",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (metric(w0, r#"eureka_link_hidden_instances{link="east"}"#).await == 1.0).then_some(()) },
    )
    .await;
    assert_eq!(metric(w0, r#"eureka_instances{origin="imported"}"#).await, 0.0);
    assert_eq!(metric(w0, r#"eureka_instances{origin="native"}"#).await, 1.0);
    assert_eq!(
        ip_of(instance(&e[0]).await).as_deref(),
        Some("10.30.0.1"),
        "east keeps its own"
    );
    // West's own goes: east's shows again.
    assert_eq!(local.cancel().await, 200);
    assert_eq!(ip_of(instance(w0).await).as_deref(), Some("10.30.0.1"));
    assert_eq!(metric(w0, r#"eureka_instances{origin="imported"}"#).await, 1.0);
    // Deleting the link from the file removes what it imported, and only that.
    register(&w0.url(), "BILLING", "a-1").await;
    write(&west_file, "[]\n");
    wait_shown(&[w0], &set([("BILLING", "a-1")]), "west without the link").await;
    assert_eq!(
        shown(&e[0]).await,
        set([("ORDERS", "o-1"), ("SECRET", "s-1")]),
        "east unchanged"
    );
}

#[tokio::test]
async fn partitions_warn_withdraw_by_policy_and_heal_exactly() {
    let dir = scratch_dir("links");
    let east = plan("east", 109, 1);
    let west = plan("west", 110, 2);
    let e = start(&east, None, &[]).await;
    let e0 = &e[0];
    // Replica 0 of west reaches east through the proxy, replica 1 directly: only 0 is cut.
    let proxy = Proxy::start(
        Ipv4Addr::new(127, 0, 0, 112),
        format!("{}:{}", east.ips[0], east.ports[0].0).parse().unwrap(),
    )
    .await;
    let timings = "pollIntervalMs: 200\nstaleAfterSeconds: 2\nwithdrawAfterSeconds: 4";
    let through_proxy = dir.path().join("proxied.yaml");
    let direct = dir.path().join("direct.yaml");
    write(&through_proxy, &link("east", &[proxy.url()], timings));
    write(&direct, &link("east", &east.urls, timings));
    for (app, id) in [("SHARED", "e-1"), ("SHARED", "e-2"), ("ONLY-EAST", "x-1")] {
        register(&e0.url(), app, id).await;
    }
    let mut started = Vec::new();
    for (i, file) in [(0, &through_proxy), (1, &direct)] {
        let file = file.display().to_string();
        let args = [
            "--cluster-name",
            "west",
            "--peer-urls",
            &west.urls[1 - i],
            "--remote-clusters-file",
            &file,
            "--remote-read-timeout-ms",
            "1000",
            "--remote-connect-timeout-ms",
            "500",
        ];
        let (port, admin) = west.ports[i];
        started.push(Server::start_on(west.ips[i], port, admin, &args, &[]).await);
    }
    let (w0, w1) = (started.remove(0), started.remove(0));
    register(&w0.url(), "SHARED", "w-1").await;
    let everything = set([
        ("SHARED", "e-1"),
        ("SHARED", "e-2"),
        ("ONLY-EAST", "x-1"),
        ("SHARED", "w-1"),
    ]);
    wait_shown(&[&w0, &w1], &everything, "both sources").await;

    for (fault, mode) in [
        ("refused", Mode::Refuse),
        ("black-holed", Mode::Blackhole),
        ("one-way", Mode::Drop(Direction::Down)),
    ] {
        let cut = Instant::now();
        proxy.set(mode);
        // Stale: a warning on the cut replica only, and the age in the metrics.
        wait_for(
            &format!("the {fault} link's stale warning"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async { readyz(&w0).await.contains("has not answered").then_some(()) },
        )
        .await;
        let body = readyz(&w0).await;
        assert!(
            body.contains("ready"),
            "a stale link is a warning, not a failure: {body}"
        );
        assert!(
            !readyz(&w1).await.contains("link east"),
            "the replica that was not cut does not warn"
        );
        assert!(metric(&w0, r#"eureka_link_last_success_age_seconds{link="east"}"#).await >= 2.0);
        // Withdrawn: east's SHARED instances go (west has its own UP one), ONLY-EAST stays.
        let kept = set([("ONLY-EAST", "x-1"), ("SHARED", "w-1")]);
        wait_shown(&[&w0], &kept, &format!("the {fault} link's withdrawal")).await;
        println!("{fault}: withdrawn after {:?}", cut.elapsed());
        assert_eq!(metric(&w0, r#"eureka_link_withdrawn{link="east"}"#).await, 1.0);
        assert_eq!(
            shown(&w1).await,
            everything,
            "the replica that was not cut keeps everything"
        );
        // West's own SHARED instance goes: east's last copy of SHARED is the only source again.
        assert_eq!(Native::new(&w0.url(), "SHARED", "w-1").cancel().await, 200);
        wait_shown(
            &[&w0],
            &set([("ONLY-EAST", "x-1"), ("SHARED", "e-1"), ("SHARED", "e-2")]),
            "east's SHARED restored as the only source",
        )
        .await;
        // East churns meanwhile.
        let gone = Native::new(&e0.url(), "SHARED", "e-1");
        assert_eq!(gone.cancel().await, 200);
        register(&e0.url(), "SHARED", &format!("e-{fault}")).await;
        register(&w0.url(), "SHARED", "w-1").await;
        // Healed: one poll later west equals east again.
        proxy.set(Mode::Pass);
        let healed = Instant::now();
        let mut expected = export(e0).await;
        expected.insert(("SHARED".into(), "w-1".into()));
        wait_shown(&[&w0, &w1], &expected, &format!("west after the {fault} link healed")).await;
        println!("{fault}: equal to east {:?} after the heal", healed.elapsed());
        assert!(
            healed.elapsed() < Duration::from_secs(3),
            "restored within a poll or two"
        );
        assert_eq!(metric(&w0, r#"eureka_link_withdrawn{link="east"}"#).await, 0.0);
        wait_for(
            "the stale warning to clear",
            Duration::from_secs(5),
            Duration::from_millis(100),
            || async { (!readyz(&w0).await.contains("link east")).then_some(()) },
        )
        .await;
        // Back to the starting point for the next fault.
        assert_eq!(
            Native::new(&e0.url(), "SHARED", &format!("e-{fault}")).cancel().await,
            200
        );
        register(&e0.url(), "SHARED", "e-1").await;
        wait_shown(&[&w0, &w1], &everything, "both sources again").await;
    }
    let stats = proxy.stats();
    assert!(
        stats.refused > 0 && stats.bytes_dropped > 0 && stats.forwarded > 0,
        "the proxy's faults bit: {stats:?}"
    );
}

#[tokio::test]
async fn a_replica_starts_ready_without_an_unreachable_source_and_survives_a_wrong_password() {
    let dir = scratch_dir("links");
    let east = plan("east", 113, 1);
    let west = plan("west", 114, 1);
    let creds = dir.path().join("creds");
    std::fs::create_dir_all(&creds).unwrap();
    let (user_file, password_file) = (creds.join("username"), creds.join("password"));
    write(&user_file, "reader\n");
    write(&password_file, "s3cret\n");
    let file = dir.path().join("west.yaml");
    write(&file, &link_with_credentials(&east.urls, &user_file, &password_file));
    // East is down: west is ready after the start-up timeout, with a warning.
    let started = Instant::now();
    let w = start(&west, Some(&file), &["--remote-initial-sync-timeout-ms", "2000"]).await;
    let took = started.elapsed();
    println!("ready without the source after {took:?}");
    assert!(
        took >= Duration::from_millis(2000),
        "it waited for the source: {took:?}"
    );
    // The start-up warning, or the stale one that follows it at the same moment here.
    let body = readyz(&w[0]).await;
    assert!(body.contains("link east") && body.contains("ready"), "{body}");

    // East comes up with credentials; west imports through them.
    let auth = ["--basic-auth-username", "reader", "--basic-auth-password", "s3cret"];
    let e = start(&east, None, &auth).await;
    assert_eq!(
        Native::new(&e[0].url(), "ORDERS", "o-1")
            .auth("reader", "s3cret")
            .register()
            .await,
        204
    );
    wait_shown(
        &[&w[0]],
        &set([("ORDERS", "o-1")]),
        "east's instance through the credentials",
    )
    .await;

    // A wrong password: a 401 warning at once, the copy kept until the withdraw time.
    write(&password_file, "wrong\n");
    let wrong = Instant::now();
    wait_for(
        "the 401 warning",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async { readyz(&w[0]).await.contains("HTTP 401").then_some(()) },
    )
    .await;
    assert_eq!(shown(&w[0]).await, set([("ORDERS", "o-1")]), "the copy is kept");
    assert!(metric(&w[0], r#"eureka_link_failures_total{link="east",class="unauthorized"}"#).await > 0.0);
    wait_shown(&[&w[0]], &BTreeSet::new(), "the withdrawal (onWithdraw: Always)").await;
    // Counted from the last answer, up to one poll (200 ms) before the password changed.
    assert!(
        wrong.elapsed() >= Duration::from_millis(3_700),
        "not before the withdraw time: {:?}",
        wrong.elapsed()
    );
    // The right password again: restored.
    write(&password_file, "s3cret\n");
    wait_shown(&[&w[0]], &set([("ORDERS", "o-1")]), "east's instance after the fix").await;

    // Restarted while east is reachable: its first answer already holds east's instances.
    let mut w = w;
    let mut first = w.remove(0);
    first.proc.kill();
    let again = start(&west, Some(&file), &[]).await;
    assert_eq!(shown(&again[0]).await, set([("ORDERS", "o-1")]));
    drop(first);
}

/// The status of `GET {base}{path}` with basic credentials.
async fn status_as(base: &str, path: &str, user: &str, password: &str) -> u16 {
    http()
        .get(format!("{base}{path}"))
        .basic_auth(user, Some(password))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test]
async fn link_credentials_read_only_and_rotate_on_both_sides_without_the_copy_shrinking() {
    let dir = scratch_dir("links");
    let east = plan("east", 116, 1);
    let west = plan("west", 117, 1);
    let (east_creds, user_file, password_file) = (
        dir.path().join("east-link-auth"),
        dir.path().join("username"),
        dir.path().join("password"),
    );
    write(&east_creds, "reader:old\n");
    write(&user_file, "reader\n");
    write(&password_file, "old\n");
    let east_creds_arg = east_creds.display().to_string();
    let e = start(
        &east,
        None,
        &[
            "--basic-auth-username",
            "app",
            "--basic-auth-password",
            "a",
            "--link-auth-file",
            &east_creds_arg,
            // Read again soon after a change, so each step below shows within a poll or two.
            "--link-auth-recheck-ms",
            "300",
        ],
    )
    .await;
    let base = e[0].url();
    for id in ["o-1", "o-2", "o-3"] {
        assert_eq!(Native::new(&base, "ORDERS", id).auth("app", "a").register().await, 204);
    }
    // Link credentials read the export, and nothing else.
    assert_eq!(status_as(&base, "link/apps", "reader", "old").await, 200);
    assert_eq!(status_as(&base, "apps/", "reader", "old").await, 403);
    assert_eq!(
        Native::new(&base, "ORDERS", "x-1")
            .auth("reader", "old")
            .register()
            .await,
        403
    );
    let file = dir.path().join("west.yaml");
    write(&file, &link_with_credentials(&east.urls, &user_file, &password_file));
    let w = start(&west, Some(&file), &[]).await;
    let all = set([("ORDERS", "o-1"), ("ORDERS", "o-2"), ("ORDERS", "o-3")]);
    wait_shown(&[&w[0]], &all, "east's instances through the link credentials").await;

    // West's count, sampled all through the rotation.
    let sampling = {
        let url = w[0].url();
        tokio::spawn(async move {
            let mut min = usize::MAX;
            for _ in 0..400 {
                min = min.min(app_instances(&url, "ORDERS").await.len());
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            min
        })
    };
    // 1. East accepts the new pair beside the old one.
    write(&east_creds, "reader:old\nreader:new\n");
    wait_for(
        "east to accept the new pair",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (status_as(&base, "link/apps", "reader", "new").await == 200).then_some(()) },
    )
    .await;
    // 2. West's Secret turns to the new pair.
    write(&password_file, "new\n");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // 3. East drops the old pair.
    write(&east_creds, "reader:new\n");
    wait_for(
        "east to refuse the old pair",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (status_as(&base, "link/apps", "reader", "old").await == 401).then_some(()) },
    )
    .await;
    let min = sampling.await.unwrap();
    assert_eq!(min, 3, "west's copy never shrank during the rotation");
    assert_eq!(
        metric(&w[0], r#"eureka_link_failures_total{link="east",class="unauthorized"}"#).await,
        0.0,
        "no poll was refused"
    );
    assert_eq!(shown(&w[0]).await, all);
}

#[tokio::test]
async fn an_on_request_link_serves_only_regions_fetches_and_a_spring_client_asking_for_it() {
    let dir = scratch_dir("links");
    let (east, west) = (plan("east", 131, 1), plan("west", 132, 1));
    let west_file = dir.path().join("west.yaml");
    write(
        &west_file,
        &link("east", &east.urls, "pollIntervalMs: 200\nvisibility: OnRequest"),
    );
    let e = start(&east, None, &[]).await;
    register(&e[0].url(), "ORDERS", "e-1").await;
    register(&e[0].url(), "ORDERS", "e-2").await;
    let w = start(&west, Some(&west_file), &[]).await;
    let w0 = &w[0];
    register(&w0.url(), "ORDERS", "w-1").await;

    // Plain fetches never see the link; `?regions=` naming it does, with the view's hash code;
    // an unknown region adds nothing, as in Java.
    assert_eq!(shown(w0).await, set([("ORDERS", "w-1")]));
    let plain = get_json(w0, "apps/").await;
    assert_eq!(plain["applications"]["apps__hashcode"], "UP_1_");
    let full = get_json(w0, "apps/?regions=east").await;
    assert_eq!(
        pairs(&full),
        set([("ORDERS", "e-1"), ("ORDERS", "e-2"), ("ORDERS", "w-1")])
    );
    assert_eq!(full["applications"]["apps__hashcode"], "UP_3_");
    let delta = get_json(w0, "apps/delta?regions=east,nowhere").await;
    assert_eq!(delta["applications"]["apps__hashcode"], "UP_3_");
    assert!(
        pairs(&delta).contains(&("ORDERS".to_string(), "e-2".to_string())),
        "the delta lists the offered instances: {delta}"
    );
    assert_eq!(
        pairs(&get_json(w0, "apps/?regions=nowhere").await),
        set([("ORDERS", "w-1")])
    );
    let gz = http()
        .get(format!("{}apps/?regions=east", w0.url()))
        .header("Accept", "application/xml")
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(gz.status().as_u16(), 200);
    let body = gz.text().await.unwrap();
    assert!(
        body.contains("<instanceId>e-1</instanceId>") && body.contains("UP_3_"),
        "XML, gzipped on the wire: {body}"
    );

    // A Spring client that names the link (`fetch-remote-regions-registry`) sees both clusters,
    // follows east's changes by deltas, and never counts a hash-code mismatch.
    let Some(spring) = SpringClient::start(
        &w0.url(),
        "regions-watcher",
        "regions-watcher-1",
        // Netflix's client refuses to start without a zone for each region it fetches.
        &[
            "--eureka.client.fetch-remote-regions-registry=east".to_string(),
            "--eureka.client.availability-zones.east=east-1".to_string(),
        ],
    )
    .await
    else {
        return;
    };
    let seen = |expected: Vec<(&str, &str)>| {
        let expected: Vec<(String, String)> = expected.into_iter().map(|(i, s)| (i.into(), s.into())).collect();
        let spring = &spring;
        async move {
            wait_equal("the Spring client's ORDERS", Duration::from_secs(30), &expected, || {
                spring.seen_all("ORDERS")
            })
            .await;
        }
    };
    seen(vec![("e-1", "UP"), ("e-2", "UP"), ("w-1", "UP")]).await;
    register(&e[0].url(), "ORDERS", "e-3").await;
    assert_eq!(Native::new(&e[0].url(), "ORDERS", "e-1").cancel().await, 200);
    seen(vec![("e-2", "UP"), ("e-3", "UP"), ("w-1", "UP")]).await;
    // West's own instance with east's id hides east's, and east's shows again when it goes.
    let local = Native::new(&w0.url(), "ORDERS", "e-2").at("10.99.0.2", 9000);
    assert_eq!(local.register().await, 204);
    let put = http()
        .put(format!("{}apps/ORDERS/e-2/status?value=OUT_OF_SERVICE", w0.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        put.status().as_u16(),
        200,
        "west's own instance takes a status override"
    );
    seen(vec![("e-2", "OUT_OF_SERVICE"), ("e-3", "UP"), ("w-1", "UP")]).await;
    assert_eq!(local.cancel().await, 200);
    seen(vec![("e-2", "UP"), ("e-3", "UP"), ("w-1", "UP")]).await;
    // A few more deltas compare hash codes after the last change.
    let deltas = |v: &Value| v["deltaFetches"].as_u64().unwrap_or(0);
    let before = deltas(&spring.stats().await);
    wait_for(
        "two more delta fetches",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (deltas(&spring.stats().await) >= before + 2).then_some(()) },
    )
    .await;
    let stats = spring.stats().await;
    assert_no_mismatch("the Spring client asking for east", "west", &stats, true);
    let wire: Value = spring.get("/wire").await;
    let fetches: Vec<&str> = wire
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "deltaFetch" || r["kind"] == "fullFetch")
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert!(
        !fetches.is_empty() && fetches.iter().all(|u| u.contains("regions=east")),
        "every fetch names the link: {fetches:?}"
    );
    assert_eq!(
        shown(w0).await,
        set([("ORDERS", "w-1"), ("REGIONS-WATCHER", "regions-watcher-1")]),
        "the main view never holds the link's instances"
    );
}
