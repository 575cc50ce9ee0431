//! Eureka processes for tests: our own server (the built binary), the Spring Cloud Netflix
//! Eureka server, the Spring Boot client app, and the Python and Node client peers.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

use super::{
    peers,
    process::{Proc, free_port, scratch_dir, wait_for},
};

/// A plain HTTP client for tests (no TLS, gzip on).
pub fn http() -> reqwest::Client {
    // reqwest has no TLS provider of its own (see Cargo.toml): every client needs the process one.
    eureka_operator::tls::install_default_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}

/// `(instanceId, status)` of `app` on the Eureka server at `base` (ending in `/eureka/`), sorted;
/// empty when the app is unknown or the server does not answer.
pub async fn app_instances(base: &str, app: &str) -> Vec<(String, String)> {
    let Ok(r) = http()
        .get(format!("{base}apps/{app}"))
        .header("Accept", "application/json")
        .send()
        .await
    else {
        return Vec::new();
    };
    if !r.status().is_success() {
        return Vec::new();
    }
    let v: Value = r.json().await.unwrap_or_default();
    let mut out: Vec<(String, String)> = v["application"]["instance"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    (
                        i["instanceId"].as_str().unwrap_or("").into(),
                        i["status"].as_str().unwrap_or("").into(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Waits (up to `timeout`) until `app` on the server at `base` is exactly `expected` (`(id,
/// status)`, any order, each once); on a timeout, what it last had.
pub async fn wait_app_instances(
    base: &str,
    app: &str,
    expected: &[(&str, &str)],
    timeout: Duration,
) -> Result<(), Vec<(String, String)>> {
    let mut want: Vec<(String, String)> = expected.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    want.sort();
    let mut last = Vec::new();
    let found = tokio::time::timeout(timeout, async {
        loop {
            last = app_instances(base, app).await;
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    found.map_err(|_| last)
}

/// JVM flags that halve start-up time on 2 cores.
pub const JVM_FLAGS: [&str; 4] = ["-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k"];

// === our server ===

/// The `eureka-operator` binary, started with `args` on a free port of `ip`.
pub struct Server {
    pub proc: Proc,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub admin_port: u16,
    dir: tempfile::TempDir,
}

impl Server {
    /// The binary under test: this build's, or `EO_OPERATOR_BIN` (to run a regression test
    /// against an older build and see it fail).
    pub fn binary() -> PathBuf {
        std::env::var_os("EO_OPERATOR_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_eureka-operator")))
    }

    /// Starts the server (standalone unless `args` say otherwise) and waits for `/readyz`.
    pub async fn start(ip: Ipv4Addr, args: &[&str]) -> Server {
        Server::start_with_env(ip, args, &[]).await
    }

    pub async fn start_with_env(ip: Ipv4Addr, args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port(ip);
        let admin_port = free_port(ip);
        Server::start_on(ip, port, admin_port, args, env).await
    }

    pub async fn start_on(ip: Ipv4Addr, port: u16, admin_port: u16, args: &[&str], env: &[(&str, &str)]) -> Server {
        let server = Server::spawn_on(ip, port, admin_port, args, env);
        server.wait_ready().await;
        server
    }

    /// Starts the process without waiting for it to be ready.
    pub fn spawn_on(ip: Ipv4Addr, port: u16, admin_port: u16, args: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = scratch_dir("server");
        let mut cmd = Command::new(Server::binary());
        cmd.arg("--bind")
            .arg(format!("{ip}:{port}"))
            .arg("--admin-bind")
            .arg(format!("{ip}:{admin_port}"))
            .args(args)
            // EO_TEST_LOG replaces the filter (say, to add kube_runtime=debug).
            .env(
                "EUREKA_LOG",
                std::env::var("EO_TEST_LOG").unwrap_or_else(|_| "info,eureka_operator=debug".into()),
            )
            .env_remove("KUBECONFIG")
            .env("EUREKA_KUBERNETES", "off");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let proc = Proc::spawn("eureka-operator", cmd, &dir.path().join("server.log"));
        Server {
            proc,
            ip,
            port,
            admin_port,
            dir,
        }
    }

    pub async fn wait_ready(&self) {
        let url = format!("http://{}:{}/readyz", self.ip, self.admin_port);
        let client = http();
        let started = std::time::Instant::now();
        loop {
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return;
            }
            let log = self.proc.log();
            assert!(!log.contains("Error: "), "eureka-operator failed to start:\n{log}");
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "eureka-operator not ready after 60 s:\n{}",
                self.proc.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://ip:port/eureka/`
    pub fn url(&self) -> String {
        format!("http://{}:{}/eureka/", self.ip, self.port)
    }

    pub fn base(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    pub fn admin(&self) -> String {
        format!("http://{}:{}", self.ip, self.admin_port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The value of a Prometheus sample, e.g. `eureka_renewals_total`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let text = http()
            .get(format!("{}/metrics", self.admin()))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(sample))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    /// Waits (up to 30 s) until a Prometheus sample has `value`.
    pub async fn wait_metric(&self, sample: &str, value: f64) {
        wait_for(
            &format!("{sample} = {value} at {}", self.admin()),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async { (self.metric(sample).await == Some(value)).then_some(()) },
        )
        .await;
    }
}

// === the Spring Cloud Netflix Eureka server ===

/// The reference Java Eureka server on `ip`.
pub struct JavaServer {
    pub proc: Proc,
    pub ip: Ipv4Addr,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl JavaServer {
    /// Starts it with fast timers and `extra` Spring properties (`--key=value`); `None` when the
    /// peer is missing outside CI.
    pub async fn start(ip: Ipv4Addr, extra: &[String]) -> Option<JavaServer> {
        JavaServer::start_on(ip, free_port(ip), extra).await
    }

    /// As [`JavaServer::start`], on a given port.
    pub async fn start_on(ip: Ipv4Addr, port: u16, extra: &[String]) -> Option<JavaServer> {
        let jar = peers::require("EUREKA_PEER_JAVA_SERVER_JAR", "Java Eureka server tests")?;
        let dir = scratch_dir("java-server");
        let mut cmd = Command::new("java");
        cmd.args(JVM_FLAGS).arg("-jar").arg(&jar);
        cmd.arg(format!("--server.address={ip}"))
            .arg(format!("--server.port={port}"))
            .arg("--spring.main.banner-mode=off")
            .arg(format!("--eureka.instance.hostname={ip}"))
            .arg(format!("--eureka.instance.ip-address={ip}"))
            .arg("--eureka.server.eviction-interval-timer-in-ms=1000")
            .arg("--eureka.server.use-read-only-response-cache=false")
            .arg("--eureka.server.response-cache-update-interval-ms=1000")
            // Java's response cache (a Guava LoadingCache) keeps a payload whose load was in
            // flight when a registration invalidated it, until the entry expires (180 s by
            // default): a poll of a cold JVM's first `/apps/{app}` overlapping a registration
            // hid that instance from the app's list for minutes. Expiring entries after 5 s
            // bounds that staleness without changing anything else of Java's answers.
            .arg("--eureka.server.response-cache-auto-expiration-in-seconds=5")
            .arg("--eureka.server.wait-time-in-ms-when-sync-empty=0");
        let has = |k: &str| extra.iter().any(|e| e.starts_with(&format!("--{k}=")));
        if !has("eureka.client.register-with-eureka") {
            cmd.arg("--eureka.client.register-with-eureka=false");
        }
        if !has("eureka.client.fetch-registry") {
            cmd.arg("--eureka.client.fetch-registry=false");
        }
        cmd.args(extra);
        let proc = Proc::spawn("java-eureka-server", cmd, &dir.path().join("java-server.log"));
        let server = JavaServer {
            proc,
            ip,
            port,
            _dir: dir,
        };
        server.wait_ready().await;
        Some(server)
    }

    async fn wait_ready(&self) {
        let url = format!("{}apps", self.url());
        let client = http();
        wait_for(
            "the Java Eureka server",
            Duration::from_secs(120),
            Duration::from_millis(250),
            || {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    let r = client
                        .get(&url)
                        .header("Accept", "application/json")
                        .send()
                        .await
                        .ok()?;
                    r.status().is_success().then_some(())
                }
            },
        )
        .await;
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}/eureka/", self.ip, self.port)
    }

    pub fn base(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }
}

// === the Spring Boot Eureka client app ===

/// `java -jar JAR` for a Spring Boot Eureka client app on `127.0.0.1:port`, registered as `app` /
/// `instance_id` at `eureka_url`, with 1 s fetch, replication and renewal intervals and a 3 s lease.
pub fn spring_client_command(jar: &str, port: u16, eureka_url: &str, app: &str, instance_id: &str) -> Command {
    spring_client_command_on(jar, Ipv4Addr::LOCALHOST, port, eureka_url, app, instance_id, &[])
}

/// As [`spring_client_command`], bound to and registered with `ip` (a pod's address in tests),
/// with `extra` Spring properties (`--key=value`) replacing the defaults they name.
pub fn spring_client_command_on(
    jar: &str,
    ip: Ipv4Addr,
    port: u16,
    eureka_url: &str,
    app: &str,
    instance_id: &str,
    extra: &[String],
) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(JVM_FLAGS).arg("-jar").arg(jar);
    let defaults = [
        format!("--server.address={ip}"),
        format!("--server.port={port}"),
        format!("--spring.application.name={app}"),
        format!("--eureka.client.service-url.defaultZone={eureka_url}"),
        "--eureka.client.registry-fetch-interval-seconds=1".into(),
        "--eureka.client.initial-instance-info-replication-interval-seconds=1".into(),
        "--eureka.client.instance-info-replication-interval-seconds=1".into(),
        "--eureka.instance.lease-renewal-interval-in-seconds=1".into(),
        "--eureka.instance.lease-expiration-duration-in-seconds=3".into(),
        format!("--eureka.instance.instance-id={instance_id}"),
        format!("--eureka.instance.hostname={ip}"),
        "--eureka.instance.prefer-ip-address=true".into(),
        format!("--eureka.instance.ip-address={ip}"),
    ];
    // Spring joins repeated command-line properties with commas: a replaced default is left out.
    let key = |a: &str| a.split('=').next().unwrap_or("").to_string();
    let replaced: Vec<String> = extra.iter().map(|e| key(e)).collect();
    cmd.args(defaults.iter().filter(|d| !replaced.contains(&key(d))));
    cmd.args(extra);
    cmd
}

/// The Spring client app (tests/peers/java-client) registered as `app` with `instance_id`.
pub struct SpringClient {
    pub proc: Proc,
    pub ip: Ipv4Addr,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl SpringClient {
    pub async fn start(eureka_url: &str, app: &str, instance_id: &str, extra: &[String]) -> Option<SpringClient> {
        let jar = peers::require("EUREKA_PEER_JAVA_CLIENT_JAR", "Spring client tests")?;
        let port = free_port(Ipv4Addr::LOCALHOST);
        let mut cmd = spring_client_command(&jar, port, eureka_url, app, instance_id);
        cmd.args(extra);
        SpringClient::run(cmd, Ipv4Addr::LOCALHOST, port).await
    }

    /// The app bound to `ip`:`port` and registered with that address (a pod's own client, with
    /// the pod's IP), with `extra` Spring properties replacing the defaults they name.
    pub async fn start_on(
        ip: Ipv4Addr,
        port: u16,
        eureka_url: &str,
        app: &str,
        instance_id: &str,
        extra: &[String],
    ) -> Option<SpringClient> {
        let jar = peers::require("EUREKA_PEER_JAVA_CLIENT_JAR", "Spring client tests")?;
        let cmd = spring_client_command_on(&jar, ip, port, eureka_url, app, instance_id, extra);
        SpringClient::run(cmd, ip, port).await
    }

    async fn run(cmd: Command, ip: Ipv4Addr, port: u16) -> Option<SpringClient> {
        let dir = scratch_dir("spring-client");
        let proc = Proc::spawn("spring-client", cmd, &dir.path().join("spring-client.log"));
        let client = SpringClient {
            proc,
            ip,
            port,
            _dir: dir,
        };
        let base = client.base();
        let http = http();
        wait_for(
            "the Spring client app",
            Duration::from_secs(120),
            Duration::from_millis(250),
            || {
                let (http, base) = (http.clone(), base.clone());
                async move {
                    http.get(format!("{base}/stats"))
                        .send()
                        .await
                        .ok()
                        .filter(|r| r.status().is_success())
                }
            },
        )
        .await;
        Some(client)
    }

    pub fn base(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    pub async fn get(&self, path: &str) -> Value {
        http()
            .get(format!("{}{path}", self.base()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} on the Spring client: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {path} on the Spring client is not JSON: {e}"))
    }

    pub async fn stats(&self) -> Value {
        self.get("/stats").await
    }

    /// `[(id, status)]` of every instance of `app` in the client's registry copy.
    pub async fn seen_all(&self, app: &str) -> Vec<(String, String)> {
        id_status_pairs(&self.get(&format!("/seen-all/{app}")).await)
    }
}

/// `[{"id", "status"}]` as a test client app reports its registry copy: sorted `(id, status)`.
pub fn id_status_pairs(v: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = v
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    (
                        i["id"].as_str().unwrap_or("").to_string(),
                        i["status"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

// === the Python and Node client peers ===

/// A py-eureka-client or eureka-js-client peer (tests/peers/{python,node}) printing ticks.
pub struct ScriptPeer {
    pub proc: Proc,
    _dir: tempfile::TempDir,
}

impl ScriptPeer {
    /// py-eureka-client registered as `app`/`id` against `server` (e.g. `http://ip:port/eureka`).
    pub fn python(server: &str, app: &str, id: &str) -> Option<ScriptPeer> {
        ScriptPeer::python_with_env(server, app, id, &[])
    }

    /// As [`ScriptPeer::python`], with extra environment (e.g. `SSL_CERT_FILE` for https).
    pub fn python_with_env(server: &str, app: &str, id: &str, env: &[(&str, &str)]) -> Option<ScriptPeer> {
        let python = peers::require("EUREKA_PEER_PYTHON", "py-eureka-client tests")?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/python/peer.py");
        let dir = scratch_dir("py-peer");
        let mut cmd = Command::new(python);
        cmd.arg("-u")
            .arg(script)
            .args(["--server", server, "--app", app, "--id", id, "--interval", "1"])
            .envs(env.iter().copied());
        let proc = Proc::spawn("py-peer", cmd, &dir.path().join("py-peer.log"));
        Some(ScriptPeer { proc, _dir: dir })
    }

    /// eureka-js-client registered as `app`/`id`; `service_url` ends in `/apps/`; it reports
    /// what it sees of the apps in `watch`.
    pub fn node(service_url: &str, app: &str, id: &str, watch: &[&str]) -> Option<ScriptPeer> {
        let modules = peers::require("EUREKA_PEER_NODE_MODULES", "eureka-js-client tests")?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/node/peer.js");
        let dir = scratch_dir("js-peer");
        let mut cmd = Command::new("node");
        cmd.env("NODE_PATH", modules).arg(script).args([
            "--server",
            service_url,
            "--app",
            app,
            "--id",
            id,
            "--port",
            "9091",
            "--interval",
            "1000",
            "--watch",
            &watch.join(","),
        ]);
        let proc = Proc::spawn("js-peer", cmd, &dir.path().join("js-peer.log"));
        Some(ScriptPeer { proc, _dir: dir })
    }

    /// Every JSON line printed so far.
    pub fn events(&self) -> Vec<Value> {
        self.proc
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The latest tick.
    pub fn last_tick(&self) -> Option<Value> {
        self.events().into_iter().rev().find(|e| e["event"] == "tick")
    }

    /// `[(id, status)]` of `app` in the latest tick.
    pub fn seen(&self, app: &str) -> Vec<(String, String)> {
        let Some(tick) = self.last_tick() else {
            return Vec::new();
        };
        tick["seen"][app]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p[0].as_str().unwrap_or("").to_string(),
                            p[1].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until the latest tick satisfies `check`.
    pub async fn wait_tick(&self, what: &str, timeout: Duration, check: impl Fn(&Value) -> bool) -> Value {
        wait_for(what, timeout, Duration::from_millis(100), || {
            let tick = self.last_tick().filter(|t| check(t));
            async move { tick }
        })
        .await
    }

    /// SIGTERM, and waits for the peer to exit after deregistering.
    pub async fn stop(&mut self) -> Vec<Value> {
        self.proc.signal(libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = self.proc.try_exit() {
                break Some(s);
            }
            if tokio::time::Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            status.is_some_and(|s| s.success()),
            "peer did not stop cleanly: {}",
            self.proc.log_tail(20)
        );
        self.events()
    }
}

/// An instance as the Spring Cloud client's RestClient sends it (numbers as numbers, explicit
/// nulls): a 90 s lease, no metadata, both dirty timestamps at `ldt`.
pub fn spring_instance(app: &str, id: &str, host: &str, ip: &str, port: u16, vip: &str, ldt: i64) -> Value {
    serde_json::json!({
        "instanceId": id, "app": app, "appGroupName": null, "ipAddr": ip, "sid": "na",
        "homePageUrl": format!("http://{ip}:{port}/"),
        "statusPageUrl": format!("http://{ip}:{port}/actuator/info"),
        "healthCheckUrl": format!("http://{ip}:{port}/actuator/health"),
        "secureHealthCheckUrl": null, "vipAddress": vip, "secureVipAddress": vip, "countryId": 1,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "hostName": host, "status": "UP", "overriddenStatus": "UNKNOWN",
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90, "registrationTimestamp": 0,
                      "lastRenewalTimestamp": 0, "evictionTimestamp": 0, "serviceUpTimestamp": 0},
        "isCoordinatingDiscoveryServer": false, "lastUpdatedTimestamp": ldt, "lastDirtyTimestamp": ldt,
        "actionType": null, "asgName": null,
        "port": {"$": port, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
        "metadata": {}
    })
}

// === a native client played by the test ===

/// One instance registered over HTTP by the test itself, as a Eureka client would: the Spring
/// client's body ([`spring_instance`]) with the given lease, optional basic auth.
#[derive(Clone, Debug)]
pub struct Native {
    /// The server's Eureka base URL (ending in `/eureka/`).
    pub base: String,
    pub app: String,
    pub id: String,
    /// Lease duration and renewal interval in seconds.
    pub lease: (u32, u32),
    pub auth: Option<(String, String)>,
    /// The address and port it registers with.
    pub ip: String,
    pub port: u16,
    /// Instance metadata.
    pub metadata: Vec<(String, String)>,
}

impl Native {
    pub fn new(base: &str, app: &str, id: &str) -> Native {
        Native {
            base: base.to_string(),
            app: app.to_ascii_uppercase(),
            id: id.to_string(),
            lease: (90, 30),
            auth: None,
            ip: "10.30.0.1".into(),
            port: 8080,
            metadata: Vec::new(),
        }
    }

    /// Registers with this address and port (a pod's, for a client played in a fake pod).
    pub fn at(mut self, ip: &str, port: u16) -> Native {
        self.ip = ip.into();
        self.port = port;
        self
    }

    pub fn metadata(mut self, key: &str, value: &str) -> Native {
        self.metadata.push((key.into(), value.into()));
        self
    }

    pub fn lease(mut self, duration: u32, interval: u32) -> Native {
        self.lease = (duration, interval);
        self
    }

    pub fn auth(mut self, user: &str, password: &str) -> Native {
        self.auth = Some((user.into(), password.into()));
        self
    }

    /// The same instance on another server.
    pub fn on(&self, base: &str) -> Native {
        Native {
            base: base.to_string(),
            ..self.clone()
        }
    }

    /// The registration body.
    pub fn body(&self) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let mut v = spring_instance(
            &self.app,
            &self.id,
            &format!("{}.example", self.id),
            &self.ip,
            self.port,
            &self.app.to_lowercase(),
            now,
        );
        v["leaseInfo"]["durationInSecs"] = self.lease.0.into();
        v["leaseInfo"]["renewalIntervalInSecs"] = self.lease.1.into();
        for (k, val) in &self.metadata {
            v["metadata"][k] = val.clone().into();
        }
        serde_json::json!({ "instance": v })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let b = http().request(method, format!("{}{path}", self.base));
        match &self.auth {
            Some((u, p)) => b.basic_auth(u, Some(p)),
            None => b,
        }
    }

    /// `POST apps/{app}`; the HTTP status (0 when the server did not answer).
    pub async fn register(&self) -> u16 {
        let r = self
            .request(reqwest::Method::POST, &format!("apps/{}", self.app))
            .header("Content-Type", "application/json")
            .body(self.body().to_string())
            .send()
            .await;
        r.map(|r| r.status().as_u16()).unwrap_or(0)
    }

    /// `PUT apps/{app}/{id}` (a heartbeat); the HTTP status (0 when the server did not answer).
    pub async fn heartbeat(&self) -> u16 {
        let r = self
            .request(
                reqwest::Method::PUT,
                &format!("apps/{}/{}?status=UP", self.app, self.id),
            )
            .send()
            .await;
        r.map(|r| r.status().as_u16()).unwrap_or(0)
    }

    /// `DELETE apps/{app}/{id}`.
    pub async fn cancel(&self) -> u16 {
        let r = self
            .request(reqwest::Method::DELETE, &format!("apps/{}/{}", self.app, self.id))
            .send()
            .await;
        r.map(|r| r.status().as_u16()).unwrap_or(0)
    }

    /// Whether the server at `base` has this instance.
    pub async fn is_on(&self, base: &str) -> bool {
        let b = http()
            .get(format!("{base}apps/{}/{}", self.app, self.id))
            .header("Accept", "application/json");
        let b = match &self.auth {
            Some((u, p)) => b.basic_auth(u, Some(p)),
            None => b,
        };
        b.send().await.is_ok_and(|r| r.status().is_success())
    }
}

/// Test-played clients heartbeating every `every` in one task, each registering again when a
/// heartbeat is answered 404, as Eureka clients do; they stop (without cancelling, like a killed
/// process) when this is dropped or [`Heartbeats::stop`]ped.
pub struct Heartbeats {
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeats {
    pub fn start(clients: Vec<Native>, every: Duration) -> Heartbeats {
        let task = tokio::spawn(async move {
            // One connection pool for all, as a client process keeps its connection.
            let http = http();
            loop {
                for c in &clients {
                    let put = http.put(format!("{}apps/{}/{}?status=UP", c.base, c.app, c.id));
                    let put = match &c.auth {
                        Some((u, p)) => put.basic_auth(u, Some(p)),
                        None => put,
                    };
                    let code = put.send().await.map(|r| r.status().as_u16()).unwrap_or(0);
                    if code == 404 {
                        c.register().await;
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        Heartbeats { task }
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}
