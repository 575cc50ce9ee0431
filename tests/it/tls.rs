//! TLS with real clients, with certificates made at test time: curl and py-eureka-client use the
//! API over HTTPS; a renewed certificate (files rewritten in place, as when cert-manager renews a
//! mounted Secret) is what the next connection sees, without a restart; and two standalone
//! replicas replicate to each other over HTTPS, checking each other's certificate against a CA
//! bundle and the Service name the certificate carries (they reach each other by IP).

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::Value;

use crate::common::{
    eureka::{ScriptPeer, Server, spring_instance},
    process::{free_port, scratch_dir, wait_for},
};

/// A test CA that issues server certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "eureka-operator test CA");
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// Writes a certificate for `names` (IPs or DNS names) and its key to `dir`, replacing the
    /// files in place (new contents, same paths) as the kubelet does for a renewed Secret.
    /// Returns the certificate's DER.
    fn issue(&self, dir: &Path, names: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        // Not the CA's name: OpenSSL (curl) takes a certificate named like its issuer for self-signed.
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        write_replacing(&dir.join("tls.key"), &key.serialize_pem());
        write_replacing(&dir.join("tls.crt"), &cert.pem());
        cert.der().to_vec()
    }

    fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.crt");
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

/// Writes through a temporary file and a rename, so a reader never sees half a file.
fn write_replacing(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn tls_args(dir: &Path) -> Vec<String> {
    vec![
        "--tls-cert-file".into(),
        dir.join("tls.crt").display().to_string(),
        "--tls-key-file".into(),
        dir.join("tls.key").display().to_string(),
        "--tls-reload-interval-ms".into(),
        "200".into(),
    ]
}

/// An HTTPS client that trusts only `ca`, reaching `name` at `addr` when given.
fn https(ca: &str, resolve: Option<(&str, SocketAddr)>) -> reqwest::Client {
    eureka_operator::tls::install_default_provider();
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .tls_info(true);
    if let Some((name, addr)) = resolve {
        b = b.resolve(name, addr);
    }
    b.build().unwrap()
}

/// The certificate a new connection to `url` is served.
async fn served_certificate(ca: &str, url: &str) -> Option<Vec<u8>> {
    let r = https(ca, None).get(url).send().await.ok()?;
    let info = r.extensions().get::<reqwest::tls::TlsInfo>()?;
    info.peer_certificate().map(<[u8]>::to_vec)
}

fn curl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("failed to run curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_https_serves_curl_and_py_eureka_client_and_picks_up_a_renewed_certificate() {
    let ip = Ipv4Addr::new(127, 0, 0, 74);
    let dir = scratch_dir("tls-api");
    let ca = Ca::new();
    let ca_file = ca.write(dir.path());
    let first = ca.issue(dir.path(), &[&ip.to_string()]);
    let args = tls_args(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(ip, &args).await;
    let base = format!("https://{ip}:{}/eureka/", server.port);

    // curl, trusting the CA (it offers h2 and http/1.1 by ALPN; it gets http/1.1).
    let (ok, body, err) = curl(&[
        "--cacert",
        &ca_file.display().to_string(),
        "-H",
        "Accept: application/json",
        &format!("{base}apps"),
    ]);
    assert!(ok, "curl over https failed: {err}");
    let apps: Value = serde_json::from_str(&body).expect("a JSON registry");
    assert!(apps["applications"].is_object(), "{body}");
    // Not trusting the CA, curl refuses the certificate; plain http gets no answer.
    let (ok, _, err) = curl(&[&format!("{base}apps")]);
    assert!(!ok, "curl accepted a certificate from an unknown CA");
    println!("CURL without the CA: {}", err.lines().next().unwrap_or(""));
    let (ok, _, _) = curl(&[&format!("http://{ip}:{}/eureka/apps", server.port)]);
    assert!(!ok, "plain http was answered on the TLS listener");

    // py-eureka-client (httpx) registers, heartbeats and fetches over https.
    let py = ScriptPeer::python_with_env(
        base.trim_end_matches('/'),
        "py-tls",
        "py-tls-1",
        &[("SSL_CERT_FILE", &ca_file.display().to_string())],
    );
    if let Some(py) = &py {
        py.wait_tick(
            "py-eureka-client to see itself over https",
            Duration::from_secs(60),
            |t| {
                t["seen"]["PY-TLS"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|p| p[0] == "py-tls-1" && p[1] == "UP"))
            },
        )
        .await;
    }

    // Renewal: new files in place; the next connection gets the new certificate.
    let renewals = || async { server.metric("eureka_renewals_total").await.unwrap_or(0.0) };
    let before = renewals().await;
    assert_eq!(served_certificate(&ca.pem, &base).await.as_deref(), Some(&first[..]));
    let renewed = ca.issue(dir.path(), &[&ip.to_string(), "localhost"]);
    let started = std::time::Instant::now();
    wait_for(
        "the renewed certificate on a new connection",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { (served_certificate(&ca.pem, &base).await.as_deref() == Some(&renewed[..])).then_some(()) },
    )
    .await;
    println!(
        "RENEWED certificate served {:?} after the files changed (check interval 200 ms)",
        started.elapsed()
    );
    assert!(server.proc.log().contains("reloaded the TLS certificate"));
    assert_eq!(server.metric("eureka_tls_reload_failing").await, Some(0.0));

    // A certificate whose key does not match: the previous one is still served, and
    // eureka_tls_reload_failing (what the EurekaCertificateReloadFailing alert reads) says so
    // until good files are back.
    let good_key = std::fs::read_to_string(dir.path().join("tls.key")).unwrap();
    write_replacing(
        &dir.path().join("tls.key"),
        &KeyPair::generate().unwrap().serialize_pem(),
    );
    wait_for(
        "eureka_tls_reload_failing to be 1",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { (server.metric("eureka_tls_reload_failing").await == Some(1.0)).then_some(()) },
    )
    .await;
    assert!(server.metric("eureka_tls_reload_failures_total").await.unwrap() >= 1.0);
    assert_eq!(served_certificate(&ca.pem, &base).await.as_deref(), Some(&renewed[..]));
    write_replacing(&dir.path().join("tls.key"), &good_key);
    wait_for(
        "eureka_tls_reload_failing back to 0",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { (server.metric("eureka_tls_reload_failing").await == Some(0.0)).then_some(()) },
    )
    .await;

    // py-eureka-client opens a connection per request (`Connection: close`): its heartbeats go
    // on over the renewed certificate.
    if py.is_some() {
        let after = renewals().await;
        let later = wait_for(
            "py-eureka-client heartbeats over the renewed certificate",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                let n = renewals().await;
                (n >= after + 2.0).then_some(n)
            },
        )
        .await;
        println!(
            "PY-EUREKA-CLIENT renewals over https: {before} before the renewal check, {after} at the renewal, {later} after it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_replicate_over_https_verified_against_the_service_name() {
    const NAME: &str = "eureka-operator.eureka-system.svc";
    let ips = [Ipv4Addr::new(127, 0, 0, 75), Ipv4Addr::new(127, 0, 0, 76)];
    let ports: Vec<(u16, u16)> = ips.iter().map(|ip| (free_port(*ip), free_port(*ip))).collect();
    let dir = scratch_dir("tls-replicas");
    let ca = Ca::new();
    let ca_file = ca.write(dir.path());
    // One certificate for the Service name, as the chart mounts it in every replica.
    ca.issue(dir.path(), &[NAME]);
    let urls: Vec<String> = ips
        .iter()
        .zip(&ports)
        .map(|(ip, (p, _))| format!("https://{ip}:{p}/eureka/"))
        .collect();
    let args_for = |other: usize| {
        let mut a = tls_args(dir.path());
        a.extend(
            [
                "--peer-urls",
                urls[other].as_str(),
                "--peer-tls-ca-file",
                ca_file.to_str().unwrap(),
                "--peer-tls-system-roots",
                "false",
                "--peer-tls-server-name",
                NAME,
                "--replication-max-batching-delay-ms",
                "20",
                "--registry-sync-retry-wait-ms",
                "200",
            ]
            .map(String::from),
        );
        a
    };
    let (a_args, b_args) = (args_for(1), args_for(0));
    let a_args: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let (a, b) = tokio::join!(
        Server::start_on(ips[0], ports[0].0, ports[0].1, &a_args, &[]),
        Server::start_on(ips[1], ports[1].0, ports[1].1, &b_args, &[]),
    );
    // The test reaches the replicas the way they reach each other: by IP, checked for NAME.
    let client_of = |s: &Server| {
        let url = format!("https://{NAME}:{}/eureka/", s.port);
        (https(&ca.pem, Some((NAME, SocketAddr::from((s.ip, s.port))))), url)
    };
    let (ca_client, a_url) = client_of(&a);
    let (cb_client, b_url) = client_of(&b);

    let body = serde_json::json!({
        "instance": spring_instance("TLS-APP", "tls-1", "10.0.0.9", "10.0.0.9", 8080, "tls-app", 1)
    });
    let started = std::time::Instant::now();
    let r = ca_client
        .post(format!("{a_url}apps/TLS-APP"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let seen = |client: reqwest::Client, url: String| async move {
        let r = client
            .get(format!("{url}apps/TLS-APP"))
            .header("Accept", "application/json")
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())
    };
    wait_for(
        "the registration replicated to B over https",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || seen(cb_client.clone(), b_url.clone()),
    )
    .await;
    let lag = started.elapsed();

    // And back: a cancel on B reaches A.
    let r = cb_client
        .delete(format!("{b_url}apps/TLS-APP/tls-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for(
        "the cancel replicated to A over https",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            let (client, url) = (ca_client.clone(), a_url.clone());
            async move { seen(client, url).await.is_none().then_some(()) }
        },
    )
    .await;
    println!("REPLICATED over https A→B in {lag:?}, and a cancel B→A");
}

/// `helm template` of the chart with `sets`, as objects; `Err` with helm's message if it fails.
fn render(helm: &Path, sets: &[&str]) -> Result<Vec<Value>, String> {
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
    crate::chart::try_render(helm, &args)
}

#[test]
fn the_chart_mounts_the_certificate_and_keeps_probes_on_the_plain_admin_port() {
    let Some(assets) = crate::common::peers::require("KUBEBUILDER_ASSETS", "chart TLS test") else {
        return;
    };
    let helm = Path::new(&assets).join("helm");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/eureka-operator");
    let cert_manager = [
        "tls.enabled=true",
        "tls.certManager.enabled=true",
        "tls.certManager.issuerRef.name=cluster-ca",
        "tls.certManager.issuerRef.kind=ClusterIssuer",
    ];
    let mut lint = Command::new(&helm);
    lint.args(["lint", "--strict"])
        .arg(&chart)
        .args(["--kube-version", "1.36.3"]);
    for s in cert_manager {
        lint.args(["--set", s]);
    }
    let out = lint.output().unwrap();
    assert!(
        out.status.success(),
        "helm lint: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    let objects = render(&helm, &cert_manager).unwrap();
    let certificate = objects
        .iter()
        .find(|o| o["kind"] == "Certificate")
        .expect("a Certificate");
    let server_name = "eo-eureka-operator.eureka-system.svc";
    assert_eq!(certificate["spec"]["secretName"], "eo-eureka-operator-tls");
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == server_name)
    );
    assert_eq!(certificate["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(env("EUREKA_TLS_CERT_FILE").unwrap(), "/etc/eureka-operator/tls/tls.crt");
    assert_eq!(env("EUREKA_TLS_KEY_FILE").unwrap(), "/etc/eureka-operator/tls/tls.key");
    assert_eq!(
        env("EUREKA_PEER_TLS_CA_FILE").unwrap(),
        "/etc/eureka-operator/tls/ca.crt"
    );
    assert_eq!(env("EUREKA_PEER_TLS_SERVER_NAME").unwrap(), server_name);
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "eo-eureka-operator-tls");
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/eureka-operator/tls");
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "admin", "{probe}");
        assert!(
            container[probe]["httpGet"]["scheme"].is_null(),
            "{probe} is not plain HTTP"
        );
    }

    // An existing Secret, without its ca.crt: no Certificate, system roots only for peers.
    let objects = render(&helm, &["tls.enabled=true", "tls.secretName=mine", "tls.trustCa=false"]).unwrap();
    assert!(!objects.iter().any(|o| o["kind"] == "Certificate"));
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains("EUREKA_TLS_CERT_FILE") && !env.contains("EUREKA_PEER_TLS_CA_FILE"),
        "{env}"
    );
    // Off by default.
    let objects = render(&helm, &[]).unwrap();
    assert!(!objects.iter().any(|o| o["kind"] == "Certificate"));
    assert!(
        !serde_json::to_string(&objects)
            .unwrap()
            .contains("EUREKA_TLS_CERT_FILE")
    );

    // Refused: TLS without a certificate source, a cert-manager request without an issuer, and
    // values outside the schema.
    for (sets, expected) in [
        (&["tls.enabled=true"][..], "tls.secretName or tls.certManager.enabled"),
        (
            &["tls.enabled=true", "tls.certManager.enabled=true"][..],
            "issuerRef.name",
        ),
        (&["tls.reloadIntervalMs=5"][..], "reloadIntervalMs"),
        (&["tls.certManager.duration=90 days"][..], "duration"),
    ] {
        let err = render(&helm, sets).expect_err(&format!("{sets:?} was accepted"));
        assert!(err.contains(expected), "{sets:?}: {err}");
    }
}
