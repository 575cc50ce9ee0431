//! Faults injected for real, each a regression test for a defect of an earlier version: restarts
//! with hundreds of pods, basic auth between replicas, one-way cuts, peers away for longer than
//! the replication age limit, failovers, bad edits, an apiserver outage, RBAC taking a write away,
//! a dead subsystem, SIGTERM, and the cluster identity. Every replica has its own loopback address;
//! links are cut with [`Proxy`].
//!
//! Sizes (`EO_FAULT_PODS`, `EO_FAULT_RESTARTS`, `EO_FAULT_OUTAGE_SECS`) are small in CI and can be
//! raised on demand.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use serde_json::Value;

use crate::common::{
    cluster::Cluster,
    eureka::{JavaServer, Native, Server, http},
    operator::{
        Launch, Operator, eureka_app, helm_template, instances, namespace, pod, prepared, set_ready, wait_condition,
    },
    process::{free_port, wait_for},
    proxy::Proxy,
};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub(crate) fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// How many instances a full fetch of `server` holds, or `None` unless it answers 200.
async fn fetch_count(server: &Server) -> Option<usize> {
    let r = http()
        .get(format!("{}apps", server.url()))
        .header("Accept", "application/json")
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    let apps = v["applications"]["application"].as_array().cloned().unwrap_or_default();
    Some(apps.iter().map(|a| a["instance"].as_array().map_or(0, Vec::len)).sum())
}

async fn readyz(server: &Server) -> Option<u16> {
    let r = http().get(format!("{}/readyz", server.admin())).send().await.ok()?;
    Some(r.status().as_u16())
}

/// Creates `n` ready pods `p-<i>` labelled `app=a<i % apps>` with IPs 10.9.x.y, 16 at a time.
async fn ready_pods(client: &kube::Client, ns: &str, n: usize, apps: usize) {
    futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            async move {
                let name = format!("p-{i}");
                let app = format!("a{}", i % apps);
                pod(&client, ns, &name, &[("app", &app)], &[("http", 8080)], "node-a").await;
                let ip = format!("10.9.{}.{}", i / 250, i % 250 + 1);
                set_ready(&client, ns, &name, &ip, true).await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// The registry a complete replica serves, as the fetches of [`probe`] check it: the ids of each
/// application, the `(app, id)` of each VIP, and the apps hash code.
struct Complete {
    apps: BTreeMap<String, BTreeSet<String>>,
    vips: BTreeMap<String, BTreeSet<(String, String)>>,
    hashcode: String,
}

/// The `instance` list of an application document (an array, or one object).
fn instances_of(app: &Value) -> Vec<Value> {
    match &app["instance"] {
        Value::Array(a) => a.clone(),
        Value::Object(_) => vec![app["instance"].clone()],
        _ => Vec::new(),
    }
}

/// The `application` list of an `applications` document (an array, or one object).
fn applications_of(apps: &Value) -> Vec<Value> {
    match &apps["application"] {
        Value::Array(a) => a.clone(),
        Value::Object(_) => vec![apps["application"].clone()],
        _ => Vec::new(),
    }
}

/// `app -> ids` of an `applications` document.
fn ids_by_app(apps: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for app in applications_of(apps) {
        let name = app["name"].as_str().unwrap_or("").to_string();
        for i in instances_of(&app) {
            out.entry(name.clone())
                .or_default()
                .insert(i["instanceId"].as_str().unwrap_or("").to_string());
        }
    }
    out
}

/// `(app, id)` of an `applications` document.
fn app_ids(apps: &Value) -> BTreeSet<(String, String)> {
    ids_by_app(apps)
        .into_iter()
        .flat_map(|(app, ids)| ids.into_iter().map(move |id| (app.clone(), id)))
        .collect()
}

impl Complete {
    /// What a full fetch (`GET apps/`, JSON) of a complete replica shows.
    fn from_full(full: &Value) -> Complete {
        let apps = &full["applications"];
        let mut vips: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
        for app in applications_of(apps) {
            for i in instances_of(&app) {
                let vip = i["vipAddress"].as_str().unwrap_or("").to_string();
                let id = i["instanceId"].as_str().unwrap_or("").to_string();
                vips.entry(vip)
                    .or_default()
                    .insert((app["name"].as_str().unwrap_or("").to_string(), id));
            }
        }
        Complete {
            apps: ids_by_app(apps),
            vips,
            hashcode: apps["apps__hashcode"].as_str().unwrap_or("").to_string(),
        }
    }

    fn instances(&self) -> usize {
        self.apps.values().map(BTreeSet::len).sum()
    }

    /// What differs between `want` and `have` (ids), for a failure message.
    fn diff<T: Ord + std::fmt::Debug + Clone>(want: &BTreeSet<T>, have: &BTreeSet<T>) -> String {
        let missing: Vec<&T> = want.difference(have).take(5).collect();
        let extra: Vec<&T> = have.difference(want).take(5).collect();
        format!(
            "{} of {} ({} missing, e.g. {missing:?}; {} unexpected, e.g. {extra:?})",
            have.len(),
            want.len(),
            want.difference(have).count(),
            have.difference(want).count()
        )
    }
}

/// The kinds of fetch a Eureka client makes, each gated by completeness.
const KINDS: [&str; 5] = ["full", "delta", "app", "vip", "instance"];

/// How the restarting replica answered one fetch.
#[derive(Debug)]
enum Answer {
    /// No HTTP answer (not listening yet, a connection that broke): no refusal, and nothing served.
    Down,
    /// `503` with `Retry-After`: refused, as a replica that is not complete must answer.
    Refused,
    /// `200` with everything a complete replica holds.
    Complete,
    /// Anything else: a `200` that misses something, a `404` of an instance that exists, a `503`
    /// without `Retry-After`...
    Wrong(String),
}

/// One fetch of `path` (under the Eureka base `base`); `check` judges a 200's JSON body.
async fn fetch_one(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    check: impl FnOnce(&Value) -> Option<String>,
) -> Answer {
    let Ok(r) = http
        .get(format!("{base}{path}"))
        .header("Accept", "application/json")
        .send()
        .await
    else {
        return Answer::Down;
    };
    let status = r.status().as_u16();
    let retry_after = r.headers().contains_key(reqwest::header::RETRY_AFTER);
    match status {
        503 if retry_after => Answer::Refused,
        200 => match r.json::<Value>().await {
            // The body broke off (the process went away): nothing was served.
            Err(_) => Answer::Down,
            Ok(v) => match check(&v) {
                None => Answer::Complete,
                Some(why) => Answer::Wrong(format!("GET {path} answered 200 {why}")),
            },
        },
        503 => Answer::Wrong(format!("GET {path} answered 503 without Retry-After")),
        s => Answer::Wrong(format!("GET {path} answered {s}")),
    }
}

/// Every kind of fetch once, at once: the full registry, the delta (whose `apps__hashcode` is the
/// full registry's), each application, each VIP, and one instance of each application (by
/// `apps/{APP}/{id}` and by `instances/{id}`, alternately). `(kind, answer)` of each.
async fn probe(http: &reqwest::Client, base: &str, want: &Complete) -> Vec<(&'static str, Answer)> {
    let hash = |v: &Value, which: &str| {
        let have = v["applications"]["apps__hashcode"].as_str().unwrap_or("");
        (have != want.hashcode)
            .then(|| format!("with apps__hashcode {have:?} ({which}); complete: {:?}", want.hashcode))
    };
    let mut fetches: Vec<futures::future::BoxFuture<'_, (&'static str, Answer)>> = Vec::new();
    fetches.push(Box::pin(async move {
        let a = fetch_one(http, base, "apps/", |v| {
            let have = app_ids(&v["applications"]);
            let all: BTreeSet<(String, String)> = want
                .apps
                .iter()
                .flat_map(|(a, ids)| ids.iter().map(move |id| (a.clone(), id.clone())))
                .collect();
            if have != all {
                return Some(format!("with {} instances", Complete::diff(&all, &have)));
            }
            hash(v, "full")
        })
        .await;
        ("full", a)
    }));
    fetches.push(Box::pin(async move {
        ("delta", fetch_one(http, base, "apps/delta", |v| hash(v, "delta")).await)
    }));
    for (n, (app, ids)) in want.apps.iter().enumerate() {
        fetches.push(Box::pin(async move {
            let path = format!("apps/{app}");
            let a = fetch_one(http, base, &path, |v| {
                let have: BTreeSet<String> = instances_of(&v["application"])
                    .iter()
                    .map(|i| i["instanceId"].as_str().unwrap_or("").to_string())
                    .collect();
                (have != *ids).then(|| format!("with {} instances of {app}", Complete::diff(ids, &have)))
            })
            .await;
            ("app", a)
        }));
        let id = ids.last().expect("an application has instances").clone();
        let path = if n % 2 == 0 {
            format!("apps/{app}/{id}")
        } else {
            format!("instances/{id}")
        };
        fetches.push(Box::pin(async move {
            let a = fetch_one(http, base, &path, |v| {
                let have = v["instance"]["instanceId"].as_str().unwrap_or("");
                (have != id).then(|| format!("with instance {have:?}"))
            })
            .await;
            ("instance", a)
        }));
    }
    for (vip, members) in &want.vips {
        fetches.push(Box::pin(async move {
            let path = format!("vips/{vip}");
            let a = fetch_one(http, base, &path, |v| {
                let have = app_ids(&v["applications"]);
                (have != *members).then(|| format!("with {} instances of VIP {vip}", Complete::diff(members, &have)))
            })
            .await;
            ("vip", a)
        }));
    }
    futures::future::join_all(fetches).await
}

/// #9.1: a replica is ready, and answers fetches with 200, only once it holds everything: every
/// pod instance (its own watches) and every native instance its peer holds (the start-up sync).
/// Replica B restarts again and again (SIGTERM and kill -9 in turn) next to replica A, which holds
/// 300 pod instances of 3 EurekaApps and native instances of 4 applications; from each restart
/// on, every fetch a Eureka client makes (full, delta, app, VIP, instance) is probed on B at once,
/// over and over (10 ms apart): each must be refused (`503` with `Retry-After`; no answer at all,
/// as before the process listens, is not a refusal) or complete, B must have refused each kind
/// before it was ready, and once `/readyz` says ready every kind must be answered 200 and complete.
///
/// B reaches A through a proxy that adds 250 ms each way, so its start-up sync takes a known
/// while (the window in which it must refuse): with a fast sync the window can be shorter than
/// one probe (a lone replica was often ready at the first answer), and a test that never sees a
/// refusal proves nothing. This adds about half a second to each restart; with the second replica
/// and the probes the test takes 17-20 s on the shared 2-core machine (10 s with a lone replica
/// polled for full fetches only).
///
/// Killed by the `ready-before-complete` mutant (answers before the sync and the first reconcile)
/// and by the `partial-sync` mutant (B keeps the natives of one application only) (tests/mutants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_means_complete_across_restarts() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-ready";
    namespace(&client, ns).await;
    let (pods, apps) = (env_usize("EO_FAULT_PODS", 300), 3);
    let restarts = env_usize("EO_FAULT_RESTARTS", 4);
    ready_pods(&client, ns, pods, apps).await;
    apps_a0_to(cluster, ns, apps);
    let (a_ip, b_ip) = (ip(101), ip(102));
    let (a_ports, b_ports) = ((free_port(a_ip), free_port(a_ip)), (free_port(b_ip), free_port(b_ip)));
    let b_url = format!("http://{b_ip}:{}/eureka/", b_ports.0);
    let b_to_a = Proxy::start(b_ip, std::net::SocketAddr::from((a_ip, a_ports.0))).await;
    let fast = ["--replication-max-batching-delay-ms", "20"];
    // A starts alone (B is not up yet): one sync attempt, not five 5 s apart.
    let a_args = [
        &["--peer-urls", b_url.as_str(), "--registry-sync-retries", "1"][..],
        &fast,
    ]
    .concat();
    let a = Operator::start_on(cluster, a_ip, a_ports, ns, "fault-ready", "fault-ready-a", &a_args).await;
    let b_peer = b_to_a.url();
    let b_args = [&["--peer-urls", b_peer.as_str()][..], &fast].concat();
    let mut b = Operator::start_on(cluster, b_ip, b_ports, ns, "fault-ready", "fault-ready-b", &b_args).await;
    // Native instances of four applications, registered on A; B has them by replication now, and
    // after each restart only through its start-up sync from A.
    let mut natives = 0;
    for (n, app) in ["BILLING", "CATALOG", "PAYMENTS", "SHIPPING"].iter().enumerate() {
        for i in 0..3 {
            let id = format!("{}-{i}", app.to_lowercase());
            let c = Native::new(&a.server.url(), app, &id)
                .lease(3600, 30)
                .at(&format!("10.31.{n}.{}", i + 1), 8080);
            assert_eq!(c.register().await, 204, "registering {id} on A");
            natives += 1;
        }
    }
    let full = |server: &Server| {
        let url = format!("{}apps/", server.url());
        async move {
            let r = http().get(url).header("Accept", "application/json").send().await.ok()?;
            r.status().is_success().then_some(())?;
            r.json::<Value>().await.ok()
        }
    };
    let want = wait_for(
        "A to hold every pod and native instance",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async {
            let w = Complete::from_full(&full(&a.server).await?);
            (w.instances() == pods + natives).then_some(w)
        },
    )
    .await;
    assert_eq!(want.apps.len(), apps + 4, "{:?}", want.apps.keys());
    wait_for(
        "B to hold what A holds",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let have = Complete::from_full(&full(&b.server).await?);
            (have.apps == want.apps && have.hashcode == want.hashcode).then_some(())
        },
    )
    .await;
    b_to_a.delay(Duration::from_millis(250), Duration::from_millis(250));

    let http = http();
    let base = b.server.url();
    let mut to_ready = Vec::new();
    let mut refused_total = 0;
    for r in 0..restarts {
        if r % 2 == 0 {
            b.server.proc.terminate(Duration::from_secs(10));
        } else {
            b.server.proc.kill();
        }
        b.spawn_again();
        let started = Instant::now();
        let mut refused: BTreeMap<&str, usize> = KINDS.iter().map(|k| (*k, 0)).collect();
        let mut probes = 0;
        loop {
            let ready = readyz(&b.server).await;
            let answers = probe(&http, &base, &want).await;
            probes += 1;
            for (kind, answer) in &answers {
                match answer {
                    Answer::Refused => *refused.get_mut(kind).unwrap() += 1,
                    Answer::Wrong(why) => panic!(
                        "restart {r}, {:?} after the start, {} fetches refused so far: a {kind} fetch was not refused \
                         and not complete: {why}\n{}",
                        started.elapsed(),
                        refused.values().sum::<usize>(),
                        b.server.proc.log_tail(20)
                    ),
                    Answer::Down | Answer::Complete => {}
                }
            }
            if ready == Some(200) {
                // Ready: every fetch is answered, and complete.
                for (kind, answer) in probe(&http, &base, &want).await {
                    assert!(
                        matches!(answer, Answer::Complete),
                        "restart {r}: ready, but a {kind} fetch was answered {answer:?}"
                    );
                }
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "restart {r}: not ready after 120 s\n{}",
                b.server.proc.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        to_ready.push(started.elapsed());
        let total: usize = refused.values().sum();
        eprintln!(
            "restart {r}: ready with all {pods} pod instances and {natives} synced natives after {:?} \
             ({total} fetches refused before, by kind {refused:?}, in {probes} probes)",
            started.elapsed()
        );
        for (kind, n) in &refused {
            assert!(
                *n > 0,
                "restart {r}: no {kind} fetch was refused (503 with Retry-After) before B was ready: \
                 it never showed it was incomplete (refused by kind: {refused:?})"
            );
        }
        refused_total += total;
    }
    eprintln!(
        "FIGURES ready_means_complete: pods={pods} natives={natives} restarts={restarts} time_to_ready={to_ready:?} \
         refused_before_ready={refused_total}"
    );
    drop(a);
}

/// The environment the chart gives the operator for basic auth (`basicAuth.*` values), with the
/// Secret's values resolved: what a replica runs with in a cluster.
fn chart_auth_env(cluster: &Cluster, peer_password: &str) -> Vec<(String, String)> {
    let rendered = helm_template(
        cluster,
        &[
            "--set",
            "basicAuth.enabled=true",
            "--set",
            "basicAuth.password=s3cret",
            "--set",
            "basicAuth.peerCredentials=true",
            "--set",
            &format!("basicAuth.peerPassword={peer_password}"),
        ],
    );
    let docs: Vec<Value> = rendered
        .split("\n---")
        .filter_map(|d| serde_saphyr::from_str::<Value>(d).ok())
        .filter(|d| d.is_object())
        .collect();
    let secret = docs
        .iter()
        .find(|d| d["kind"] == "Secret")
        .expect("the chart renders the basic-auth Secret");
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    env.iter()
        .filter_map(|e| {
            let key = e["valueFrom"]["secretKeyRef"]["key"].as_str()?;
            let value = secret["stringData"][key].as_str()?;
            Some((e["name"].as_str()?.to_string(), value.to_string()))
        })
        .collect()
}

/// #9.2 and #9.3: with the chart's basic auth (and separate peer credentials), replicas
/// replicate to each other; a replica with the wrong peer password is refused, and says so in its
/// log, its metrics and its `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_authenticate_with_the_charts_basic_auth() {
    let Some(cluster) = prepared() else { return };
    let good = chart_auth_env(cluster, "p33r");
    assert_eq!(good.len(), 4, "client and peer credentials from the chart: {good:?}");
    let env = |vars: &[(String, String)]| vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
    let (a_ip, b_ip, c_ip) = (ip(111), ip(112), ip(113));
    let (a_port, b_port) = (free_port(a_ip), free_port(b_ip));
    let url = |ip: Ipv4Addr, port: u16| format!("http://{ip}:{port}/eureka/");
    let start = |ip: Ipv4Addr, port: u16, peer: String, vars: Vec<(String, String)>| async move {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let args = [
            "--peer-urls",
            peer.as_str(),
            "--replication-max-batching-delay-ms",
            "20",
        ];
        Server::start_on(ip, port, free_port(ip), &args, &vars).await
    };
    let a = start(a_ip, a_port, url(b_ip, b_port), env(&good)).await;
    let b = start(b_ip, b_port, url(a_ip, a_port), env(&good)).await;
    let client = Native::new(&a.url(), "ORDERS", "o-1").auth("eureka", "s3cret");
    assert_eq!(client.register().await, 204);
    wait_for(
        "the registration to reach B",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { client.is_on(&b.url()).await.then_some(()) },
    )
    .await;

    // C knows the client password but has a wrong peer password.
    let bad = chart_auth_env(cluster, "wrong");
    let c = start(c_ip, free_port(c_ip), url(a_ip, a_port), env(&bad)).await;
    let on_c = Native::new(&c.url(), "ORDERS", "c-1").auth("eureka", "s3cret");
    assert_eq!(on_c.register().await, 204);
    let report = wait_for(
        "C to report the refusal in /readyz",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            let text = http()
                .get(format!("{}/readyz", c.admin()))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.contains("refused our credentials").then_some(text)
        },
    )
    .await;
    assert!(report.contains("401"), "{report}");
    let failures = c
        .metric(&format!(
            "eureka_replication_failures_total{{peer=\"{}\",class=\"unauthorized\"}}",
            url(a_ip, a_port)
        ))
        .await;
    assert!(
        failures.is_some_and(|n| n >= 1.0),
        "unauthorized failures counted: {failures:?}"
    );
    assert!(c.proc.log().contains("refuses our credentials"), "logged as an error");
    assert!(!on_c.is_on(&a.url()).await, "nothing from C was accepted");
    // A forged replication from a client is refused outright.
    let forged = http()
        .post(format!("{}apps/ORDERS", a.url()))
        .basic_auth("eureka", Some("s3cret"))
        .header("x-netflix-discovery-replication", "true")
        .header("Content-Type", "application/json")
        .body(Native::new(&a.url(), "ORDERS", "forged").body().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
}

/// Heartbeats `client` every `every` until `stop`; counts answers that are not 200.
fn heartbeat_until(
    client: Native,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let refused = Arc::new(AtomicUsize::new(0));
    let r = refused.clone();
    let task = tokio::spawn(async move {
        while !stop.load(Ordering::Acquire) {
            let code = client.heartbeat().await;
            if code != 200 {
                r.fetch_add(1, Ordering::AcqRel);
                eprintln!("heartbeat of {} answered {code}", client.id);
                if code == 404 {
                    client.register().await;
                }
            }
            tokio::time::sleep(every).await;
        }
    });
    (refused, task)
}

/// #9.4: B cannot reach A (a one-way cut); a client renews on B. A's anti-entropy (A can reach B)
/// must never cancel it: it judges by lease renewals, takes the live instance, keeps it renewed,
/// and B refuses A's eviction of a lease that renews on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_entropy_never_cancels_an_instance_renewing_behind_a_one_way_cut() {
    let (a_ip, b_ip) = (ip(121), ip(122));
    let (a_port, b_port) = (free_port(a_ip), free_port(b_ip));
    let a_url = format!("http://{a_ip}:{a_port}/eureka/");
    let b_url = format!("http://{b_ip}:{b_port}/eureka/");
    let b_to_a = Proxy::start(b_ip, format!("{a_ip}:{a_port}").parse().unwrap()).await;
    b_to_a.cut();
    let fast = [
        "--anti-entropy-interval-ms",
        "500",
        "--max-time-for-replication",
        "1000",
        "--eviction-interval-timer-in-ms",
        "500",
        "--enable-self-preservation",
        "false",
        "--replication-max-batching-delay-ms",
        "20",
        "--registry-sync-retries",
        "1",
    ];
    let args = |peer: &str| {
        let mut v = vec!["--peer-urls".to_string(), peer.to_string()];
        v.extend(fast.iter().map(|s| s.to_string()));
        v
    };
    let a_args = args(&b_url);
    let b_args = args(&b_to_a.url());
    let a = Server::start_on(
        a_ip,
        a_port,
        free_port(a_ip),
        &a_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
    .await;
    let b = Server::start_on(
        b_ip,
        b_port,
        free_port(b_ip),
        &b_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
    .await;
    let client = Native::new(&b_url, "ORDERS", "behind-the-cut").lease(4, 1);
    assert_eq!(client.register().await, 204);
    let stop = Arc::new(AtomicBool::new(false));
    let (refused, task) = heartbeat_until(client.clone(), Duration::from_millis(500), stop.clone());
    let watch_for = Duration::from_secs(env_usize("EO_FAULT_CUT_SECS", 12) as u64);
    let started = Instant::now();
    let mut gone = 0;
    while started.elapsed() < watch_for {
        if !client.is_on(&b_url).await {
            gone += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Release);
    task.await.unwrap();
    assert_eq!(
        gone,
        0,
        "the live instance went missing on B {gone} times\n{}",
        a.proc.log_tail(30)
    );
    assert_eq!(refused.load(Ordering::Acquire), 0, "heartbeats on B were refused");
    assert!(client.is_on(&a_url).await, "A took the live instance from B");
    drop(b);
}

/// #9.5: while B is away, A's tasks for B age from their first enqueue: after
/// `--max-time-for-replication` they are dropped (and counted), however often the batch was
/// retried, so a stale Cancel never removes an instance that re-registered on B meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_tasks_expire_during_an_outage_and_a_stale_cancel_never_lands() {
    let (a_ip, b_ip) = (ip(131), ip(132));
    let b = Server::start(b_ip, &["--registry-sync-retries", "1"]).await;
    let a_to_b = Proxy::start(a_ip, format!("{b_ip}:{}", b.port).parse().unwrap()).await;
    a_to_b.cut();
    let a = Server::start(
        a_ip,
        &[
            "--peer-urls",
            &a_to_b.url(),
            "--max-time-for-replication",
            "1500",
            "--replication-max-batching-delay-ms",
            "20",
            "--registry-sync-retries",
            "1",
        ],
    )
    .await;
    let on_a = Native::new(&a.url(), "ORDERS", "moved");
    assert_eq!(on_a.register().await, 204);
    assert_eq!(on_a.cancel().await, 200);
    // The instance moved: it registers on B directly.
    let on_b = on_a.on(&b.url());
    assert_eq!(on_b.register().await, 204);
    let dropped = format!(
        "eureka_replication_dropped_total{{peer=\"{}\",reason=\"expired\"}}",
        a_to_b.url()
    );
    wait_for(
        "A to drop the expired tasks",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { a.metric(&dropped).await.filter(|n| *n >= 2.0) },
    )
    .await;
    a_to_b.heal();
    let queued = format!(
        "eureka_replication_queued{{peer=\"{}\",kind=\"replica\"}}",
        a_to_b.url()
    );
    wait_for(
        "A's queue for B to empty",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { (a.metric(&queued).await == Some(0.0)).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(on_b.is_on(&b.url()).await, "a stale Cancel removed the instance from B");
    assert!(
        a.proc.log().contains("older than --max-time-for-replication"),
        "the drop is logged"
    );
}

/// The status of `app`/`id` on `server`, if registered.
async fn status_on(server: &Server, app: &str, id: &str) -> Option<String> {
    crate::common::operator::instance(server, app, id)
        .await
        .and_then(|i| i["status"].as_str().map(str::to_string))
}

fn annotation(cluster: &Cluster, ns: &str, pod: &str) -> Option<String> {
    let out = cluster.kubectl_ok(&["get", "pod", pod, "-n", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v["metadata"]["annotations"]["eureka-operator.dev/status-override"]
        .as_str()
        .map(str::to_string)
}

/// Two replicas sharing a Lease, each the other's static peer.
pub(crate) async fn two_replicas(cluster: &Cluster, ns: &str, lease: &str, first: u8, extra: &[&str]) -> Vec<Operator> {
    let (ips, ports, urls) = crate::common::process::replica_addresses(first, 2);
    let mut out = Vec::new();
    for i in 0..2 {
        let mut args = vec![
            "--peer-urls",
            urls[1 - i].as_str(),
            "--replication-max-batching-delay-ms",
            "20",
        ];
        args.extend_from_slice(extra);
        out.push(Operator::start_on(cluster, ips[i], ports[i], ns, lease, &format!("{lease}-{i}"), &args).await);
    }
    out
}

/// Which of `replicas` holds the Lease, once exactly one does.
pub(crate) async fn leader_of(replicas: &[Operator]) -> usize {
    wait_for(
        "one leader",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let mut leaders = Vec::new();
            for (i, r) in replicas.iter().enumerate() {
                if r.server.metric("eureka_leader").await == Some(1.0) {
                    leaders.push(i);
                }
            }
            (leaders.len() == 1).then(|| leaders[0])
        },
    )
    .await
}

/// #9.6: a REST override taken by a follower is recorded by the leader; a later `kubectl
/// annotate` wins, and stays the truth when the follower becomes leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_annotation_stays_the_truth_across_a_failover() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-override";
    namespace(&client, ns).await;
    pod(&client, ns, "web-0", &[("app", "web")], &[("http", 8080)], "node-a").await;
    set_ready(&client, ns, "web-0", "10.8.0.1", true).await;
    eureka_app(
        cluster,
        ns,
        "web",
        "  selector: {matchLabels: {app: web}}\n  port: http\n",
    );
    let mut replicas = two_replicas(cluster, ns, "fault-override", 141, &[]).await;
    let id = "web-0.fault-override:web:8080";
    for r in &replicas {
        wait_for(
            "the pod instance",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async { (status_on(&r.server, "WEB", id).await.as_deref() == Some("UP")).then_some(()) },
        )
        .await;
    }
    let leader = leader_of(&replicas).await;
    let follower = 1 - leader;
    let r = http()
        .put(format!(
            "{}apps/WEB/{id}/status?value=OUT_OF_SERVICE",
            replicas[follower].server.url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    wait_for(
        "the leader to record the override",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { (annotation(cluster, ns, "web-0").as_deref() == Some("OUT_OF_SERVICE")).then_some(()) },
    )
    .await;
    cluster.kubectl_ok(&[
        "annotate",
        "pod",
        "web-0",
        "-n",
        ns,
        "--overwrite",
        "eureka-operator.dev/status-override=UP",
    ]);
    for r in &replicas {
        wait_for(
            "the annotation to apply",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || async { (status_on(&r.server, "WEB", id).await.as_deref() == Some("UP")).then_some(()) },
        )
        .await;
    }
    replicas[leader].server.proc.kill();
    wait_for(
        "the follower to lead",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { (replicas[follower].server.metric("eureka_leader").await == Some(1.0)).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        annotation(cluster, ns, "web-0").as_deref(),
        Some("UP"),
        "a new leader undid kubectl annotate"
    );
    assert_eq!(
        status_on(&replicas[follower].server, "WEB", id).await.as_deref(),
        Some("UP")
    );
    drop(replicas.remove(leader));
}

/// #9.7: a renamed port or an invalid selector never takes a service out of the registry: the
/// last good instances stay (Degraded says why) until the spec is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_edit_keeps_the_last_good_instances() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-edit";
    namespace(&client, ns).await;
    for i in 0..3 {
        let name = format!("api-{i}");
        pod(&client, ns, &name, &[("app", "api")], &[("http", 8080)], "node-a").await;
        set_ready(&client, ns, &name, &format!("10.8.1.{}", i + 1), true).await;
    }
    let op = Operator::start(cluster, ip(151), ns, "fault-edit", &[]).await;
    let good = "  selector: {matchLabels: {app: api}}\n  port: http\n";
    eureka_app(cluster, ns, "api", good);
    let up = |n: usize| {
        let server = &op.server;
        async move {
            let i = instances(server, "API").await;
            (i.len() == n && i.iter().all(|(_, s)| s == "UP")).then_some(())
        }
    };
    wait_for("3 UP", Duration::from_secs(30), Duration::from_millis(50), || up(3)).await;
    for (bad, reason) in [
        ("  selector: {matchLabels: {app: api}}\n  port: grpc\n", "PortNotFound"),
        (
            "  selector:\n    matchExpressions: [{key: app, operator: Near, values: [api]}]\n  port: http\n",
            "InvalidSpec",
        ),
    ] {
        eureka_app(cluster, ns, "api", bad);
        let status = wait_condition(cluster, ns, "api", "Degraded", "True").await;
        let degraded = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Degraded")
            .unwrap()
            .clone();
        assert_eq!(degraded["reason"], reason, "{status}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            up(3).await.is_some(),
            "{reason}: instances went: {:?}",
            instances(&op.server, "API").await
        );
        eureka_app(cluster, ns, "api", good);
        wait_condition(cluster, ns, "api", "Degraded", "False").await;
    }
    assert!(up(3).await.is_some());
}

/// `(id, status)` of every instance of `app` on `server`, with duplicates kept (so a duplicate
/// id would show).
async fn all_instances(server: &Server, app: &str) -> Vec<(String, String)> {
    instances(server, app).await
}

/// #9.8: the apiserver goes away (the operator's link to it is cut) under load: both replicas keep
/// serving reads and native writes, nothing is lost or duplicated, and once it is back the registry
/// and the statuses converge within seconds, including an EurekaApp deleted during the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_outage_loses_nothing_and_converges_after() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-outage";
    namespace(&client, ns).await;
    let pods = 20;
    for i in 0..pods {
        let name = format!("svc-{i}");
        pod(&client, ns, &name, &[("app", "svc")], &[("http", 8080)], "node-a").await;
        set_ready(&client, ns, &name, &format!("10.8.2.{}", i + 1), true).await;
    }
    pod(&client, ns, "old-0", &[("app", "old")], &[("http", 8080)], "node-a").await;
    set_ready(&client, ns, "old-0", "10.8.3.1", true).await;
    eureka_app(
        cluster,
        ns,
        "svc",
        "  selector: {matchLabels: {app: svc}}\n  port: http\n  drainSeconds: 1\n",
    );
    eureka_app(
        cluster,
        ns,
        "old",
        "  selector: {matchLabels: {app: old}}\n  port: http\n",
    );
    let api: std::net::SocketAddr = cluster.url.trim_start_matches("https://").parse().unwrap();
    let link = Proxy::start(Ipv4Addr::LOCALHOST, api).await;
    let via_proxy = format!("https://{}", link.addr);
    let mut replicas = Vec::new();
    let ips = [ip(161), ip(162)];
    let ports: Vec<(u16, u16)> = ips.iter().map(|ip| (free_port(*ip), free_port(*ip))).collect();
    let urls: Vec<String> = ips
        .iter()
        .zip(&ports)
        .map(|(ip, (p, _))| format!("http://{ip}:{p}/eureka/"))
        .collect();
    for i in 0..2 {
        let mut launch = Launch::new(ips[i], ns, "fault-outage").args(&[
            "--peer-urls",
            &urls[1 - i],
            "--replication-max-batching-delay-ms",
            "20",
        ]);
        launch.ports = Some(ports[i]);
        launch.replica = format!("outage-{i}");
        launch.apiserver = Some(via_proxy.clone());
        replicas.push(Operator::launch_with(cluster, launch).await);
    }
    for r in &replicas {
        wait_for(
            "every pod instance",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async { (all_instances(&r.server, "SVC").await.len() == pods).then_some(()) },
        )
        .await;
    }
    // Native clients keep heartbeating on replica 0 through the outage.
    let stop = Arc::new(AtomicBool::new(false));
    let mut beats = Vec::new();
    for n in 0..10 {
        let c = Native::new(&urls[0], "NATIVE", &format!("n-{n}")).lease(10, 1);
        assert_eq!(c.register().await, 204);
        beats.push(heartbeat_until(c, Duration::from_millis(500), stop.clone()));
    }

    let outage = Duration::from_secs(env_usize("EO_FAULT_OUTAGE_SECS", 20) as u64);
    link.cut();
    let cut_at = Instant::now();
    // Meanwhile the cluster changes: a pod goes, one comes, an EurekaApp is deleted.
    crate::common::operator::delete_pod(&client, ns, "svc-0").await;
    pod(&client, ns, "svc-new", &[("app", "svc")], &[("http", 8080)], "node-a").await;
    set_ready(&client, ns, "svc-new", "10.8.2.200", true).await;
    cluster.kubectl_ok(&["delete", "eurekaapp", "old", "-n", ns, "--wait=false"]);
    let during = Native::new(&urls[1], "NATIVE", "registered-during-the-outage").lease(10, 1);
    assert_eq!(during.register().await, 204, "native writes work without the apiserver");
    wait_for(
        "the registration to replicate",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { during.is_on(&urls[0]).await.then_some(()) },
    )
    .await;
    while cut_at.elapsed() < outage {
        for r in &replicas {
            let svc = all_instances(&r.server, "SVC").await;
            assert_eq!(
                svc.len(),
                pods,
                "pod instances lost or duplicated during the outage: {svc:?}"
            );
            assert_eq!(
                all_instances(&r.server, "NATIVE").await.len(),
                11,
                "reads serve native instances"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    link.heal();
    let healed = Instant::now();
    let mut want: Vec<String> = (1..pods).map(|i| format!("svc-{i}.{ns}:svc:8080")).collect();
    want.push(format!("svc-new.{ns}:svc:8080"));
    want.sort();
    for r in &replicas {
        wait_for(
            "the registry to converge",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async {
                let ids: Vec<String> = all_instances(&r.server, "SVC")
                    .await
                    .into_iter()
                    .map(|(i, _)| i)
                    .collect();
                let old = all_instances(&r.server, "OLD").await;
                (ids == want && old.is_empty()).then_some(())
            },
        )
        .await;
    }
    let converged = healed.elapsed();
    wait_for(
        "the deleted EurekaApp to go",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let out = cluster
                .kubectl()
                .args(["get", "eurekaapp", "old", "-n", ns])
                .output()
                .unwrap();
            (!out.status.success()).then_some(())
        },
    )
    .await;
    let status = wait_condition(cluster, ns, "svc", "Ready", "True").await;
    assert_eq!(status["instances"]["registered"], pods as i64, "{status}");
    let finalized = healed.elapsed();
    stop.store(true, Ordering::Release);
    for (refused, task) in beats {
        task.await.unwrap();
        assert_eq!(refused.load(Ordering::Acquire), 0, "a native heartbeat was refused");
    }
    eprintln!(
        "FIGURES apiserver_outage: outage={outage:?} registry_converged_after={converged:?} deleted_app_gone_and_status_written_after={finalized:?}"
    );
}

/// The chart's ClusterRole, renamed for one test's own ServiceAccount, so a test can take a
/// permission away without touching what other tests use.
fn own_rbac(cluster: &Cluster, sa: &str) -> String {
    let rbac = helm_template(
        cluster,
        &[
            "--show-only",
            "templates/rbac.yaml",
            "--set",
            &format!("serviceAccount.name={sa}"),
        ],
    );
    rbac.replace("name: eo-eureka-operator", &format!("name: {sa}"))
}

/// #9.8 and #21.5: an EurekaApp that an earlier version left with its finalizer has it removed by
/// the leader; a removal that fails (here: RBAC takes `patch` away) is retried on a timer with
/// backoff, so a deleted EurekaApp does not stay in Terminating once the write can succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_removal_of_the_old_finalizer_is_retried_until_it_succeeds() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-rbac";
    namespace(&client, ns).await;
    let sa = "fault-rbac-operator";
    let rbac = own_rbac(cluster, sa);
    pod(&client, ns, "w-0", &[("app", "w")], &[("http", 8080)], "node-a").await;
    set_ready(&client, ns, "w-0", "10.8.4.1", true).await;
    // As versions before 0.2 left it.
    let (ok, out) = crate::common::operator::kubectl_apply(
        cluster,
        &format!(
            "apiVersion: eureka-operator.dev/v1alpha1\nkind: EurekaApp\nmetadata:\n  name: w\n  namespace: {ns}\n  \
             finalizers: [eureka-operator.dev/deregister]\nspec:\n  selector: {{matchLabels: {{app: w}}}}\n  port: http\n"
        ),
    );
    assert!(ok, "{out}");
    // Without `patch` on eurekaapps from the start, then delete.
    let without_patch = rbac.replacen(
        "resources: [eurekaapps]\n    verbs: [list, watch, patch]",
        "resources: [eurekaapps]\n    verbs: [list, watch]",
        1,
    );
    assert_ne!(without_patch, rbac, "the rule was found");
    let (ok, out) = crate::common::operator::kubectl_apply(cluster, &without_patch);
    assert!(ok, "{out}");
    let mut launch = Launch::new(ip(171), ns, "fault-rbac");
    launch.user = format!("system:serviceaccount:eureka-system:{sa}");
    let op = Operator::launch_with(cluster, launch).await;
    wait_for(
        "the instance",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { (!instances(&op.server, "W").await.is_empty()).then_some(()) },
    )
    .await;
    cluster.kubectl_ok(&["delete", "ea", "w", "-n", ns, "--wait=false"]);
    wait_for(
        "the failed removal to be logged",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            op.server
                .proc
                .log()
                .contains("failed to remove the finalizer of an earlier version")
                .then_some(())
        },
    )
    .await;
    wait_for(
        "the instances to go while the finalizer stays",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { instances(&op.server, "W").await.is_empty().then_some(()) },
    )
    .await;
    let finalizers = cluster.kubectl_ok(&["get", "ea", "w", "-n", ns, "-o", "jsonpath={.metadata.finalizers}"]);
    assert!(finalizers.contains("eureka-operator.dev/deregister"), "{finalizers}");
    let (ok, out) = crate::common::operator::kubectl_apply(cluster, &rbac);
    assert!(ok, "{out}");
    let restored = Instant::now();
    wait_for(
        "the EurekaApp to go",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl().args(["get", "ea", "w", "-n", ns]).output().unwrap();
            (!out.status.success()).then_some(())
        },
    )
    .await;
    eprintln!(
        "FIGURES finalizer_retry: gone {:?} after the permission came back",
        restored.elapsed()
    );
}

/// #9.9: a supervised task that dies stops the process, non-zero, naming it (test builds inject
/// the fault with `EUREKA_FAULT_INJECT`).
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_subsystem_stops_the_process() {
    for task in ["replication", "timers", "Eureka API"] {
        let ip = ip(181);
        let (port, admin) = (free_port(ip), free_port(ip));
        let fault = format!("{task}:300");
        let mut s = Server::spawn_on(ip, port, admin, &[], &[("EUREKA_FAULT_INJECT", fault.as_str())]);
        let status = wait_for(
            "the process to exit",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || {
                let exited = s.proc.try_exit();
                async move { exited }
            },
        )
        .await;
        assert!(!status.success(), "{task}: exit status {status}");
        let log = s.proc.log();
        assert!(
            log.contains(&format!("the {task} task")) && log.contains("panicked"),
            "{task}: {log}"
        );
    }
}

/// #9.10: on SIGTERM the leader releases its Lease (a follower takes over at once, not after the
/// lease duration) and flushes what it queued for its peers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_lease_over_and_flushes_replication() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-sigterm";
    namespace(&client, ns).await;
    let ips = [ip(191), ip(192)];
    let ports: Vec<(u16, u16)> = ips.iter().map(|ip| (free_port(*ip), free_port(*ip))).collect();
    let urls: Vec<String> = ips
        .iter()
        .zip(&ports)
        .map(|(ip, (p, _))| format!("http://{ip}:{p}/eureka/"))
        .collect();
    let mut replicas = Vec::new();
    for i in 0..2 {
        // Batches wait 30 s: only the flush on SIGTERM can deliver in time.
        let mut launch = Launch::new(ips[i], ns, "fault-sigterm").args(&[
            "--peer-urls",
            &urls[1 - i],
            "--replication-max-batching-delay-ms",
            "30000",
        ]);
        launch.ports = Some(ports[i]);
        launch.replica = format!("sigterm-{i}");
        launch.lease_seconds = 15;
        replicas.push(Operator::launch_with(cluster, launch).await);
    }
    let leader = leader_of(&replicas).await;
    let follower = 1 - leader;
    let c = Native::new(&urls[leader], "LATE", "queued-at-shutdown");
    assert_eq!(c.register().await, 204);
    let stopped = Instant::now();
    let status = replicas[leader].server.proc.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "a clean exit: {status:?}");
    let took_over = wait_for(
        "the follower to lead",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || async { (replicas[follower].server.metric("eureka_leader").await == Some(1.0)).then(|| stopped.elapsed()) },
    )
    .await;
    assert!(
        took_over < Duration::from_secs(3),
        "took over after {took_over:?} (lease 15 s): the Lease was not handed over at once"
    );
    assert!(
        c.is_on(&urls[follower]).await,
        "the queued registration was flushed before exit"
    );
    eprintln!("FIGURES sigterm: follower leads {took_over:?} after SIGTERM (lease 15 s)");
}

/// #21.6: with Kubernetes on, hundreds of pods registered and every watch running (replica
/// discovery included), SIGTERM ends the process within 2 s when nothing is left to flush. Before
/// the fix, the replica-discovery watch never heard the stop: "released the lease", then nothing
/// until the shutdown grace (20 s) ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_replica_with_hundreds_of_pods_within_two_seconds() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-exit";
    namespace(&client, ns).await;
    let (pods, apps) = (env_usize("EO_FAULT_PODS", 300), 3);
    ready_pods(&client, ns, pods, apps).await;
    apps_a0_to(cluster, ns, apps);
    let mut op = Operator::start(cluster, ip(104), ns, "fault-exit", &["--peer-service", "eo-peers"]).await;
    let mut took = Vec::new();
    for round in 0..3 {
        all_registered(&op.server, pods).await;
        let stopped = Instant::now();
        op.server.proc.signal(libc::SIGTERM);
        let status = loop {
            if let Some(status) = op.server.proc.try_exit() {
                break status;
            }
            assert!(
                stopped.elapsed() < Duration::from_secs(25),
                "round {round}: still running 25 s after SIGTERM:\n{}",
                op.server.proc.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let elapsed = stopped.elapsed();
        assert!(status.success(), "round {round}: a clean exit: {status:?}");
        assert!(
            elapsed < Duration::from_secs(2),
            "round {round}: exited {elapsed:?} after SIGTERM (bound 2 s):\n{}",
            op.server.proc.log_tail(20)
        );
        took.push(elapsed);
        op.spawn_again();
        op.server.wait_ready().await;
    }
    eprintln!("FIGURES sigterm_exit: {pods} pods registered, exits after SIGTERM {took:?}");
}

/// Waits until a fetch from `server` holds `pods` instances.
async fn all_registered(server: &Server, pods: usize) {
    wait_for(
        "every pod registered",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { (fetch_count(server).await == Some(pods)).then_some(()) },
    )
    .await;
}

/// EurekaApps `a0`, `a1`, ... selecting the pods of [`ready_pods`] by their `app` label.
fn apps_a0_to(cluster: &crate::common::cluster::Cluster, ns: &str, apps: usize) {
    for a in 0..apps {
        eureka_app(
            cluster,
            ns,
            &format!("a{a}"),
            &format!("  selector: {{matchLabels: {{app: a{a}}}}}\n  port: http\n"),
        );
    }
}

/// #9.11: without `--cluster-id`, the cluster is named by the kube-system namespace's UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_id_defaults_to_the_kube_system_uid() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-identity";
    namespace(&client, ns).await;
    pod(&client, ns, "id-0", &[("app", "id")], &[("http", 8080)], "node-a").await;
    set_ready(&client, ns, "id-0", "10.8.5.1", true).await;
    eureka_app(
        cluster,
        ns,
        "id",
        "  selector: {matchLabels: {app: id}}\n  port: http\n",
    );
    let mut launch = Launch::new(ip(195), ns, "fault-identity");
    launch.cluster_id = None;
    let op = Operator::launch_with(cluster, launch).await;
    let uid = cluster.kubectl_ok(&["get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}"]);
    let id = format!("id-0.{ns}:id:8080");
    let instance = wait_for(
        "the pod instance",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || crate::common::operator::instance(&op.server, "ID", &id),
    )
    .await;
    assert_eq!(instance["metadata"]["k8s.cluster"], uid.trim(), "{instance}");
}

/// Found by the soak test: a Java peer that holds a pod instance with a later
/// `lastDirtyTimestamp` (registered by a former leader, whose clock stamped it) answers the new
/// leader's heartbeats with 409 and its copy. A heartbeat in flight when the pod is deleted must
/// not bring the instance back as a replicated one: the watch, not a peer, is the truth for pod
/// instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_peers_newer_copy_never_brings_a_deleted_pod_back() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "fault-conflict";
    namespace(&client, ns).await;
    pod(&client, ns, "gone-0", &[("app", "gone")], &[("http", 8080)], "node-a").await;
    set_ready(&client, ns, "gone-0", "10.8.6.1", true).await;
    eureka_app(
        cluster,
        ns,
        "gone",
        "  selector: {matchLabels: {app: gone}}\n  port: http\n  terminating: Deregister\n",
    );
    let (op_ip, java_ip) = (ip(197), ip(198));
    let java_port = free_port(java_ip);
    let Some(java) = JavaServer::start_on(java_ip, java_port, &[]).await else {
        return;
    };
    let to_java = Proxy::start(op_ip, std::net::SocketAddr::from((java_ip, java_port))).await;
    let op = Operator::start(
        cluster,
        op_ip,
        ns,
        "fault-conflict",
        &[
            "--java-peer-urls",
            &to_java.url(),
            "--java-peer-heartbeat-interval-ms",
            "300",
            "--replication-max-batching-delay-ms",
            "20",
        ],
    )
    .await;
    let id = "gone-0.fault-conflict:gone:8080";
    wait_for(
        "the pod instance on the Java peer",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            crate::common::eureka::app_instances(&java.url(), "GONE")
                .await
                .len()
                .eq(&1)
                .then_some(())
        },
    )
    .await;
    // A former leader registered it on the Java peer with a later lastDirtyTimestamp.
    let mut copy = crate::common::operator::instance(&op.server, "GONE", id)
        .await
        .expect("registered");
    let dirty = copy["lastDirtyTimestamp"]
        .as_i64()
        .or_else(|| copy["lastDirtyTimestamp"].as_str().and_then(|s| s.parse().ok()))
        .expect("a lastDirtyTimestamp");
    copy["lastDirtyTimestamp"] = (dirty + 600_000).to_string().into();
    let r = http()
        .post(format!("{}apps/GONE", java.url()))
        .header("x-netflix-discovery-replication", "true")
        .header("Content-Type", "application/json")
        .body(serde_json::json!({ "instance": copy }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204, "the Java peer took the newer copy");
    // Heartbeats to the Java peer are now in flight for a while (and answered 409).
    to_java.delay(Duration::from_millis(1500), Duration::from_millis(1500));
    tokio::time::sleep(Duration::from_secs(2)).await;
    crate::common::operator::delete_pod(&client, ns, "gone-0").await;
    wait_for(
        "the deleted pod's instance to go",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { instances(&op.server, "GONE").await.is_empty().then_some(()) },
    )
    .await;
    let gone_at = Instant::now();
    while gone_at.elapsed() < Duration::from_secs(8) {
        let back = instances(&op.server, "GONE").await;
        assert!(
            back.is_empty(),
            "the deleted pod's instance came back {:?} after it went: {back:?}\n{}",
            gone_at.elapsed(),
            op.server.proc.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Found by the soak test: replication to a peer backed off exponentially up to 30 s, so after a
/// partition of half a minute the queued writes reached the peer only up to 30 s after the link
/// was back (anti-entropy's repairs wait in the same queue). Retries are now at most 5 s apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_resumes_within_seconds_after_a_long_partition() {
    let (a_ip, b_ip) = (ip(199), ip(200));
    let b = Server::start(b_ip, &["--registry-sync-retries", "1"]).await;
    let a_to_b = Proxy::start(a_ip, std::net::SocketAddr::from((b_ip, b.port))).await;
    a_to_b.cut();
    let a = Server::start(
        a_ip,
        &[
            "--peer-urls",
            &a_to_b.url(),
            "--max-time-for-replication",
            "120000",
            "--replication-max-batching-delay-ms",
            "20",
            "--registry-sync-retries",
            "1",
        ],
    )
    .await;
    let client = Native::new(&a.url(), "LATE", "written-during-the-partition");
    assert_eq!(client.register().await, 204);
    tokio::time::sleep(Duration::from_secs(28)).await;
    assert!(!client.is_on(&b.url()).await, "the partition held");
    a_to_b.heal();
    let healed = Instant::now();
    wait_for(
        "the write to reach B after the heal",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async { client.is_on(&b.url()).await.then_some(()) },
    )
    .await;
    let took = healed.elapsed();
    eprintln!("FIGURES long_partition: the queued write reached the peer {took:?} after a 28 s partition healed");
    assert!(
        took < Duration::from_secs(8),
        "replication resumed only {took:?} after the heal"
    );
}

/// Found by the soak test: a client cancels on A while A's link to B is cut, then registers again
/// on B. When the link heals, A's queued Cancel reached B and removed the new registration (the
/// client only found out at its next heartbeat, a 404). Our replicas' cancels now name the
/// `lastDirtyTimestamp` of the copy they removed, and a newer copy is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_held_behind_a_cut_link_spares_a_newer_registration() {
    let (a_ip, b_ip) = (ip(193), ip(194));
    let b = Server::start(b_ip, &["--registry-sync-retries", "1"]).await;
    let a_to_b = Proxy::start(a_ip, std::net::SocketAddr::from((b_ip, b.port))).await;
    let a = Server::start(
        a_ip,
        &[
            "--peer-urls",
            &a_to_b.url(),
            "--replication-max-batching-delay-ms",
            "20",
            "--registry-sync-retries",
            "1",
        ],
    )
    .await;
    let client = Native::new(&a.url(), "HELD", "cancelled-then-back");
    assert_eq!(client.register().await, 204);
    wait_for(
        "the registration to reach B",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { client.is_on(&b.url()).await.then_some(()) },
    )
    .await;
    a_to_b.cut();
    assert_eq!(client.cancel().await, 200);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Registered again on B (a new lastDirtyTimestamp) while A still holds the Cancel for B.
    assert_eq!(client.on(&b.url()).register().await, 204);
    a_to_b.heal();
    // A write queued on A after the Cancel: once it is on B, so is the Cancel.
    let marker = Native::new(&a.url(), "HELD", "queued-after-the-cancel");
    assert_eq!(marker.register().await, 204);
    wait_for(
        "A's queue to reach B after the heal",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { marker.is_on(&b.url()).await.then_some(()) },
    )
    .await;
    assert!(
        client.is_on(&b.url()).await,
        "A's held Cancel removed the registration made on B after it\n{}",
        b.proc.log_tail(20)
    );
}
