//! The alerts, the dashboard and the documentation's queries, proven against a real Prometheus
//! (built from the Go module proxy by `tests/peers/setup`): `promtool` checks the rules file and
//! runs its unit tests; then Prometheus scrapes two operator replicas on the real apiserver, with
//! an EurekaApp Degraded, another awaiting adoption, a replication link cut and self-preservation
//! tripped, and every expression of the rules, every dashboard panel and every ```promql block of
//! the docs is parsed and evaluated through Prometheus's HTTP API. A query naming a metric (or a
//! label) that nothing scraped fails the test, and the alerts the scenario causes must fire while
//! the others stay silent.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::common::{
    eureka::{Native, http},
    operator::{Operator, eureka_app, namespace, pod, prepared, wait_condition},
    process::{Proc, free_port, scratch_dir, wait_for},
    proxy::Proxy,
};

const RULES: &str = "charts/eureka-operator/files/prometheus-rules.yaml";
const RULE_TESTS: &str = "tests/prometheus/alerts.test.yaml";
/// What the rules file's runbook URLs start with (the chart replaces it).
const RUNBOOK_BASE: &str = "https://eureka-operator.dev/docs/";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rules() -> Value {
    let text = std::fs::read_to_string(repo().join(RULES)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// Every alerting rule of the file: (name, rule).
fn alerts() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for group in rules()["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            out.push((rule["alert"].as_str().unwrap().to_string(), rule.clone()));
        }
    }
    out
}

/// `promtool check rules` and `promtool test rules` pass, every alert has unit tests that fire it
/// and a runbook page the docs list, and its annotations say what an on-call needs.
#[test]
fn promtool_checks_the_rules_and_their_unit_tests_cover_every_alert() {
    let promtool = crate::require_peer!("EUREKA_PEER_PROMTOOL");
    let run = |args: &[&str]| {
        let out = Command::new(&promtool).args(args).current_dir(repo()).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
        text
    };
    let checked = run(&["check", "rules", RULES]);
    println!("PROMTOOL check rules: {}", checked.trim());
    let tested = run(&["test", "rules", RULE_TESTS]);
    println!("PROMTOOL test rules: {}", tested.trim());

    let tests: Value = serde_saphyr::from_str(&std::fs::read_to_string(repo().join(RULE_TESTS)).unwrap()).unwrap();
    let mut fired: BTreeSet<String> = BTreeSet::new();
    let mut silent: BTreeSet<String> = BTreeSet::new();
    for case in tests["tests"].as_array().unwrap() {
        for t in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = t["alertname"].as_str().unwrap().to_string();
            if t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fired.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let summary = std::fs::read_to_string(repo().join("docs/src/SUMMARY.md")).unwrap();
    let alerts = alerts();
    assert!(alerts.len() >= 17, "{} alerts", alerts.len());
    for (name, rule) in &alerts {
        assert!(fired.contains(name), "no promtool test fires {name}");
        assert!(silent.contains(name), "no promtool test shows {name} silent");
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                rule["annotations"][key].as_str().is_some_and(|s| !s.trim().is_empty()),
                "{name} has no {key}"
            );
        }
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        assert_eq!(url, format!("{RUNBOOK_BASE}operations/runbooks/{name}.html"));
        let page = format!("operations/runbooks/{name}.md");
        assert!(repo().join("docs/src").join(&page).exists(), "no runbook page {page}");
        assert!(
            summary.contains(&format!("({page})")),
            "SUMMARY.md does not list {page}"
        );
    }
}

/// The rules with every `for:` at 0 s, so the scenario's alerts fire within seconds (the `for:`
/// durations themselves are what the promtool unit tests check).
fn without_for(text: &str) -> String {
    text.lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 0s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every PromQL expression users are given: (where, expression).
fn every_query() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, rule) in alerts() {
        out.push((format!("alert {name}"), rule["expr"].as_str().unwrap().to_string()));
    }
    let dashboard = Command::new(env!("CARGO_BIN_EXE_docgen"))
        .arg("--dashboard-queries")
        .output()
        .unwrap();
    assert!(dashboard.status.success(), "docgen --dashboard-queries failed");
    let panels: Vec<String> = String::from_utf8(dashboard.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert!(panels.len() >= 25, "only {} dashboard queries", panels.len());
    for q in panels {
        out.push(("dashboard".into(), q));
    }
    let mut pages = vec![
        repo().join("README.md"),
        repo().join("charts/eureka-operator/README.md"),
    ];
    let mut dirs = vec![repo().join("docs/src"), repo().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages.dedup();
    let mut in_docs = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let rel = page.strip_prefix(repo()).unwrap().display().to_string();
        // Inline selectors in prose (`eureka_x_total{class="network"}`) are queries too; the
        // `{a,b}` notation that lists a metric's labels is not.
        for span in text.split('`').skip(1).step_by(2) {
            let metric = span.starts_with("eureka_") || span.starts_with("process_");
            if metric && span.contains('{') && span.contains('=') && !span.contains(' ') {
                out.push((format!("{rel} (inline)"), span.to_string()));
                in_docs += 1;
            }
        }
        let mut block: Option<Vec<&str>> = None;
        for line in text.lines() {
            let fence = line.trim_start();
            match &mut block {
                None if fence == "```promql" => block = Some(Vec::new()),
                Some(lines) if fence.starts_with("```") => {
                    let q = lines.join("\n");
                    out.push((rel.clone(), q));
                    in_docs += 1;
                    block = None;
                }
                Some(lines) => lines.push(line),
                None => {}
            }
        }
    }
    assert!(in_docs >= 10, "only {in_docs} ```promql blocks in the docs");
    out
}

/// A label matcher of a selector: (label, `=`/`!=`/`=~`/`!~`, value).
type Matcher = (String, String, String);

/// The selectors of a parsed query (`/api/v1/parse_query`): (metric name, label matchers).
fn selectors(ast: &Value, out: &mut Vec<(String, Vec<Matcher>)>) {
    match ast {
        Value::Object(map) => {
            let kind = map.get("type").and_then(Value::as_str).unwrap_or_default();
            if kind == "vectorSelector" || kind == "matrixSelector" {
                let matchers: Vec<Matcher> = map["matchers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| {
                        let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                        (s("name"), s("type"), s("value"))
                    })
                    .collect();
                let name = matchers
                    .iter()
                    .find(|(n, t, _)| n == "__name__" && t == "=")
                    .map(|(_, _, v)| v.clone())
                    .unwrap_or_else(|| map["name"].as_str().unwrap_or_default().to_string());
                out.push((name, matchers));
            }
            for v in map.values() {
                selectors(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| selectors(v, out)),
        _ => {}
    }
}

struct Prometheus {
    _proc: Proc,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(bin: &str, targets: &[String], rules: &str) -> Prometheus {
        let dir = scratch_dir("prometheus");
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{
                "job_name": "eureka-operator",
                "static_configs": [{"targets": targets}],
            }],
        });
        // JSON is YAML.
        std::fs::write(dir.path().join("prometheus.yml"), config.to_string()).unwrap();
        let ip = Ipv4Addr::new(127, 0, 0, 63);
        let addr = format!("{ip}:{}", free_port(ip));
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--scrape.discovery-reload-interval=1s")
            .current_dir(dir.path());
        let proc = Proc::spawn("prometheus", cmd, &dir.path().join("prometheus.log"));
        let p = Prometheus {
            _proc: proc,
            url: format!("http://{addr}"),
            _dir: dir,
        };
        wait_for(
            "Prometheus to be ready",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                let r = http().get(format!("{}/-/ready", p.url)).send().await.ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
        p
    }

    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let body: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        // The read endpoints take POST with a form, except `alerts` and the label values (GET).
        let url = format!("{}/api/v1/{path}", self.url);
        let request = if params.is_empty() {
            http().get(url)
        } else {
            http()
                .post(url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body.join("&"))
        };
        let r = request.send().await.map_err(|e| e.to_string())?;
        let body: Value = r.json().await.map_err(|e| e.to_string())?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(format!("{}: {}", body["errorType"], body["error"]))
        }
    }

    /// Alerts in state `firing`: (name, labels).
    async fn firing(&self) -> Vec<(String, Value)> {
        let data = self.api("alerts", &[]).await.unwrap_or_default();
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or_default().to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }
}

/// Form encoding (`application/x-www-form-urlencoded`) of one key or value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A pod made Ready now, with the transition time a kubelet writes (what Ready → UP measures from).
async fn ready_now(client: &kube::Client, ns: &str, name: &str, ip: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "192.168.7.1",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ]
    }});
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_evaluates_every_rule_panel_and_documented_query() {
    let prometheus_bin = crate::require_peer!("EUREKA_PEER_PROMETHEUS");
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    let ns = "prom";
    namespace(&client, ns).await;

    // Two replicas; each replicates to the other through its own proxy (cut below).
    let ips = [Ipv4Addr::new(127, 0, 0, 61), Ipv4Addr::new(127, 0, 0, 62)];
    let ports: Vec<(u16, u16)> = ips.iter().map(|ip| (free_port(*ip), free_port(*ip))).collect();
    let links = [
        Proxy::start(ips[0], (ips[1], ports[1].0).into()).await,
        Proxy::start(ips[1], (ips[0], ports[0].0).into()).await,
    ];
    // Replica 0 has a link to a cluster that refuses every connection.
    let dir = crate::common::process::scratch_dir("prometheus-links");
    let links_file = dir.path().join("remote-clusters.yaml");
    std::fs::write(&links_file, "- name: gone\n  urls: [http://127.0.0.61:1/eureka/]\n").unwrap();
    let flags = |i: usize| -> Vec<String> {
        let mut f: Vec<String> = [
            "--peer-urls",
            &links[i].url(),
            "--renews-window-ms",
            "1000",
            "--expected-client-renewal-interval-seconds",
            "1",
            "--eviction-interval-timer-in-ms",
            "300",
            "--replication-max-batching-delay-ms",
            "20",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if i == 0 {
            f.extend([
                "--remote-clusters-file".to_string(),
                links_file.display().to_string(),
                "--remote-initial-sync-timeout-ms".to_string(),
                "500".to_string(),
            ]);
        }
        f
    };
    let mut replicas = Vec::new();
    for i in 0..2 {
        let f = flags(i);
        let args: Vec<&str> = f.iter().map(String::as_str).collect();
        let op = Operator::start_on(cluster, ips[i], ports[i], ns, "prom", &format!("replica-{i}"), &args).await;
        if i == 0 {
            wait_for(
                "replica 0 to lead",
                Duration::from_secs(20),
                Duration::from_millis(50),
                || async { (op.server.metric("eureka_leader").await == Some(1.0)).then_some(()) },
            )
            .await;
        }
        replicas.push(op);
    }

    // A healthy EurekaApp, one whose named port no container declares (Degraded), and an
    // adopting one whose pod's own client never registers (awaiting adoption).
    pod(&client, ns, "web-0", &[("app", "web")], &[("http", 8080)], "node-a").await;
    ready_now(&client, ns, "web-0", "10.31.0.1").await;
    eureka_app(
        cluster,
        ns,
        "web",
        "  selector:\n    matchLabels: {app: web}\n  port: http\n",
    );
    eureka_app(
        cluster,
        ns,
        "web-grpc",
        "  selector:\n    matchLabels: {app: web}\n  port: grpc\n",
    );
    eureka_app(
        cluster,
        ns,
        "web-adopted",
        "  selector:\n    matchLabels: {app: web}\n  appName: web-native\n  port: http\n  registration: Adopt\n",
    );
    wait_condition(cluster, ns, "web", "Ready", "True").await;
    wait_condition(cluster, ns, "web-grpc", "Degraded", "True").await;

    // Replica 0 can no longer reach replica 1; four clients register with replica 0 and never
    // renew: their leases expire and self-preservation holds them.
    links[0].cut();
    let a = replicas[0].server.url();
    for n in 0..4 {
        assert_eq!(
            Native::new(&a, "SILENT", &format!("s-{n}"))
                .lease(2, 1)
                .register()
                .await,
            204
        );
    }

    let targets: Vec<String> = replicas
        .iter()
        .map(|r| r.server.admin().trim_start_matches("http://").to_string())
        .collect();
    let rules_text = std::fs::read_to_string(repo().join(RULES)).unwrap();
    let prom = Prometheus::start(&prometheus_bin, &targets, &without_for(&rules_text)).await;
    wait_for(
        "both replicas scraped",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async {
            let up = prom.api("query", &[("query", "sum(up)")]).await.ok()?;
            (up["result"][0]["value"][1] == "2").then_some(())
        },
    )
    .await;

    // The alerts the scenario causes fire, naming what they are about.
    let expected: &[(&str, &[(&str, &str)])] = &[
        ("EurekaSelfPreservationActive", &[("instance", &targets[0])]),
        ("EurekaEvictionHeld", &[("instance", &targets[0])]),
        (
            "EurekaAppDegraded",
            &[("eurekaapp", "web-grpc"), ("eurekaapp_namespace", ns)],
        ),
        ("EurekaAppAwaitingAdoption", &[("eurekaapp", "web-adopted")]),
        (
            "EurekaReplicationFailing",
            &[("instance", &targets[0]), ("class", "network")],
        ),
        (
            "EurekaPeerUnreachable",
            &[("instance", &targets[0]), ("kind", "replica")],
        ),
        ("EurekaLinkDown", &[("instance", &targets[0]), ("link", "gone")]),
    ];
    let started = std::time::Instant::now();
    let missing = |firing: &[(String, Value)]| -> Vec<String> {
        expected
            .iter()
            .filter(|(name, labels)| {
                !firing
                    .iter()
                    .any(|(n, l)| n == name && labels.iter().all(|(k, v)| l[*k] == *v))
            })
            .map(|(name, labels)| format!("{name} {labels:?}"))
            .collect()
    };
    let firing = loop {
        let firing = prom.firing().await;
        let absent = missing(&firing);
        if absent.is_empty() {
            break firing;
        }
        if started.elapsed() > Duration::from_secs(90) {
            panic!(
                "after {:?} these alerts do not fire: {absent:?}\nfiring: {firing:?}\nalerts API: {}",
                started.elapsed(),
                prom.api("alerts", &[]).await.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let names: BTreeSet<&str> = firing.iter().map(|(n, _)| n.as_str()).collect();
    println!(
        "PROMETHEUS firing after {:?}: {}",
        started.elapsed(),
        names.iter().copied().collect::<Vec<_>>().join(", ")
    );
    for (name, labels) in &firing {
        println!("  {name} {labels}");
    }
    // And what nothing in the scenario causes stays silent.
    for quiet in [
        "EurekaNoLeaseHolder",
        "EurekaSeveralLeaseHolders",
        "EurekaReplicaNotReady",
        "EurekaReplicationUnauthorized",
        "EurekaWatchFailing",
        "EurekaKubernetesWritesFailing",
        "EurekaLimitRefusingRegistrations",
        "EurekaHTTPShedding",
        "EurekaAppConflict",
        "EurekaCertificateReloadFailing",
        "EurekaLinkUnauthorized",
    ] {
        assert!(!names.contains(quiet), "{quiet} fires: {firing:?}");
    }

    // Every query: it parses, every metric it selects was scraped, every label it matches on is
    // one that metric has, and it evaluates.
    let scraped: BTreeSet<String> = prom
        .api("label/__name__/values", &[])
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let mut labels_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let queries = every_query();
    let mut selected = BTreeSet::new();
    for (source, query) in &queries {
        let q = query
            .replace("$__rate_interval", "1m")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        let ast = match prom.api("parse_query", &[("query", &q)]).await {
            Ok(ast) => ast,
            Err(e) => {
                problems.push(format!("{source}: does not parse: {e}\n    {q}"));
                continue;
            }
        };
        let mut found = Vec::new();
        selectors(&ast, &mut found);
        if found.is_empty() {
            problems.push(format!("{source}: selects no metric\n    {q}"));
        }
        for (name, matchers) in found {
            if !scraped.contains(&name) {
                problems.push(format!("{source}: names {name:?}, which no replica exports\n    {q}"));
                continue;
            }
            selected.insert(name.clone());
            if !labels_of.contains_key(&name) {
                let series = prom
                    .api("series", &[("match[]", &format!("{{__name__=\"{name}\"}}"))])
                    .await
                    .unwrap();
                let keys = series
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|s| s.as_object().unwrap().keys().cloned())
                    .collect();
                labels_of.insert(name.clone(), keys);
            }
            for (label, _, value) in &matchers {
                let empty_ok = value.is_empty();
                if label != "__name__" && !empty_ok && !labels_of[&name].contains(label) {
                    problems.push(format!(
                        "{source}: matches label {label:?} of {name}, which has only {:?}\n    {q}",
                        labels_of[&name]
                    ));
                }
            }
        }
        if let Err(e) = prom.api("query", &[("query", &q)]).await {
            problems.push(format!("{source}: does not evaluate: {e}\n    {q}"));
        }
    }
    println!(
        "PROMETHEUS evaluated {} queries ({} rules, {} dashboard, {} docs) naming {} metrics",
        queries.len(),
        queries.iter().filter(|(s, _)| s.starts_with("alert ")).count(),
        queries.iter().filter(|(s, _)| s == "dashboard").count(),
        queries
            .iter()
            .filter(|(s, _)| !s.starts_with("alert ") && s != "dashboard")
            .count(),
        selected.len()
    );
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );

    // The running version, as scraped, is what the binary's --version prints.
    let info = prom.api("query", &[("query", "eureka_build_info")]).await.unwrap();
    let scraped_versions: BTreeSet<&str> = info["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["metric"]["version"].as_str())
        .collect();
    let printed = Command::new(env!("CARGO_BIN_EXE_eureka-operator"))
        .arg("--version")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&printed.stdout).trim().to_string();
    assert_eq!(scraped_versions.len(), 1, "{info}");
    let version = *scraped_versions.iter().next().unwrap();
    assert!(
        printed.ends_with(&format!(" {version}")),
        "--version says {printed:?}, the scrape {version}"
    );

    // Ready → UP was timed for the pod made Ready after the replicas started.
    let count = prom
        .api(
            "query",
            &[("query", "sum(eureka_controller_pod_ready_to_up_seconds_count)")],
        )
        .await
        .unwrap();
    let n: f64 = count["result"][0]["value"][1].as_str().unwrap_or("0").parse().unwrap();
    assert!(n >= 1.0, "no Ready → UP observation: {count}");
    drop(prom);
    drop(replicas);
}

/// The chart's PrometheusRule is the rules file with the runbook base replaced, and its
/// dashboard ConfigMap holds the dashboard file, byte for byte.
#[test]
fn the_chart_ships_the_rules_and_the_dashboard_files() {
    let Some(cluster) = crate::common::cluster::Cluster::shared() else {
        return;
    };
    let out = crate::common::operator::helm_template(
        cluster,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "prometheusRule.runbookBaseUrl=https://docs.example.org/eo/",
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "grafanaDashboard.namespace=monitoring",
        ],
    );
    let docs: Vec<Value> = out
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|v| v.is_object())
        .collect();
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let file = std::fs::read_to_string(repo().join(RULES))
        .unwrap()
        .replace(RUNBOOK_BASE, "https://docs.example.org/eo/");
    let expected: Value = serde_saphyr::from_str(&file).unwrap();
    assert_eq!(rule["spec"], expected);
    let cm = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-dashboard"))
        })
        .expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = std::fs::read_to_string(repo().join("charts/eureka-operator/files/grafana-dashboard.json")).unwrap();
    assert_eq!(
        cm["data"]["eureka-operator.json"].as_str().unwrap().trim_end(),
        json.trim_end()
    );
    let off = crate::common::operator::helm_template(cluster, &[]);
    assert!(
        !off.contains("PrometheusRule") && !off.contains("grafana_dashboard"),
        "on by default"
    );
}
