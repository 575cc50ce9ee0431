//! A real Kubernetes control plane for tests, the way envtest runs one: `etcd` and
//! `kube-apiserver` from `$KUBEBUILDER_ASSETS` on free loopback ports, each with its own scratch
//! directory and PKI, RBAC authorization on, the admin authenticated by a client certificate in
//! `system:masters`. Without a scheduler, kubelet or controller-manager, tests play those parts.
//!
//! [`Cluster::with_controllers`] is a second control plane, for the lifecycle tests only, that also
//! runs `kube-controller-manager` and `kube-scheduler` (the same Kubernetes build) and kwok as the
//! kubelets of fake nodes, so Deployments roll, namespaces are really deleted and garbage is
//! collected. The shared bare one stays bare: its tests bind pods to nodes that do not exist, which
//! the pod garbage collector would delete.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

use super::process::{Proc, free_port, scratch_dir};

/// The running control plane. Its processes stop when it is dropped or the test binary exits.
pub struct Cluster {
    pub url: String,
    /// A kubeconfig file with the admin user and, per context, impersonating users.
    pub kubeconfig: PathBuf,
    pub assets: PathBuf,
    /// The fake nodes (`kwok-node-N`), when started with controllers.
    pub nodes: Vec<String>,
    /// kube-controller-manager, kube-scheduler and kwok, if any (declared first: stopped first).
    controllers: Vec<Proc>,
    apiserver: Proc,
    etcd: Proc,
    _dir: tempfile::TempDir,
}

/// A test cluster's certificates: a CA, the apiserver's serving certificate, an admin client
/// certificate in `system:masters`, and the service-account signing key pair.
pub struct Pki {
    pub ca_pem: String,
    pub server_cert: String,
    pub server_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    pub sa_key: String,
    pub sa_pub: String,
}

/// Generates a [`Pki`]; the serving certificate also names `extra_ips`.
pub fn pki(extra_ips: &[std::net::IpAddr]) -> Pki {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.distinguished_name
        .push(DnType::CommonName, "eureka-operator-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().expect("server key");
    let mut server = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
    ])
    .expect("server params");
    server
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    server
        .subject_alt_names
        .push(SanType::IpAddress("10.0.0.1".parse().unwrap()));
    for ip in extra_ips {
        server.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    server.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &issuer).expect("server cert");

    let admin_key = KeyPair::generate().expect("admin key");
    let mut admin = CertificateParams::new(Vec::<String>::new()).expect("admin params");
    admin.distinguished_name.push(DnType::CommonName, "test-admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &issuer).expect("admin cert");

    let sa_key = KeyPair::generate().expect("service account key");
    Pki {
        ca_pem: ca_cert.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        admin_cert: admin_cert.pem(),
        admin_key: admin_key.serialize_pem(),
        sa_pub: sa_key.public_key_pem(),
        sa_key: sa_key.serialize_pem(),
    }
}

/// Fake nodes of [`Cluster::with_controllers`] (two zones).
pub const LIFECYCLE_NODES: usize = 4;

pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
}

impl Cluster {
    /// One control plane per test binary, started on first use (`None` when the peers are missing
    /// outside CI, after printing why).
    pub fn shared() -> Option<&'static Cluster> {
        static SHARED: OnceLock<Option<Cluster>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let assets = super::peers::require("KUBEBUILDER_ASSETS", "kube-apiserver tests")?;
                Some(Cluster::start(Path::new(&assets)))
            })
            .as_ref()
    }

    /// The control plane with controllers, scheduler and fake nodes, shared by the lifecycle
    /// tests and started on first use (`None` when the peers are missing outside CI).
    pub fn with_controllers() -> Option<&'static Cluster> {
        static SHARED: OnceLock<Option<Cluster>> = OnceLock::new();
        SHARED
            .get_or_init(|| Cluster::start_with_controllers(LIFECYCLE_NODES))
            .as_ref()
    }

    /// A control plane of its own with controllers, scheduler and `nodes` fake nodes (for a test
    /// that must not share one, e.g. to measure); `None` when the peers are missing outside CI.
    pub fn start_with_controllers(nodes: usize) -> Option<Cluster> {
        let assets = super::peers::require("KUBEBUILDER_ASSETS", "lifecycle tests")?;
        let assets = PathBuf::from(assets);
        for bin in ["kube-controller-manager", "kube-scheduler", "kwok"] {
            if !assets.join(bin).exists() {
                let msg = format!("{bin} is missing from {}; run tests/peers/setup", assets.display());
                assert!(!super::peers::required(), "{msg}");
                eprintln!("SKIPPED lifecycle tests: {msg}");
                return None;
            }
        }
        let mut cluster = Cluster::start(&assets);
        cluster.start_controllers(nodes);
        Some(cluster)
    }

    /// Starts kube-controller-manager, kube-scheduler and kwok against this apiserver, creates
    /// `nodes` fake nodes, and waits until a probe pod is scheduled, Running and Ready.
    fn start_controllers(&mut self, nodes: usize) {
        let started = Instant::now();
        let d = self._dir.path().to_path_buf();
        let p = |f: &str| d.join(f).display().to_string();
        let kubeconfig = self.kubeconfig.display().to_string();
        let lo = Ipv4Addr::LOCALHOST;

        let mut kcm = Command::new(self.assets.join("kube-controller-manager"));
        kcm.arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--leader-elect=false")
            // Every default controller but the node lifecycle one: kwok keeps no node leases, so
            // it would mark the fake nodes unreachable and evict their pods.
            .arg("--controllers=*,-node-lifecycle-controller")
            .arg(format!("--service-account-private-key-file={}", p("sa.key")))
            .arg(format!("--root-ca-file={}", p("ca.crt")))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", free_port(lo)))
            // Client-side rate limits sized for thousands of pods on one machine.
            .args(["--kube-api-qps=500", "--kube-api-burst=1000"])
            .args(["--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10"]);
        self.controllers
            .push(Proc::spawn("kube-controller-manager", kcm, &d.join("kcm.log")));

        let mut sched = Command::new(self.assets.join("kube-scheduler"));
        sched
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", free_port(lo)))
            .args(["--kube-api-qps=500", "--kube-api-burst=1000"]);
        self.controllers
            .push(Proc::spawn("kube-scheduler", sched, &d.join("scheduler.log")));

        let stages = d.join("kwok-stages.yaml");
        write(&stages, include_str!("kwok-stages.yaml"));
        let mut kwok = Command::new(self.assets.join("kwok"));
        kwok.arg(format!("--kubeconfig={kubeconfig}"))
            .arg(format!("--config={}", stages.display()))
            .arg("--manage-nodes-with-label-selector=type=kwok")
            // Pod addresses are data in the API only; nothing is ever sent to them.
            .arg("--cidr=10.64.0.0/16")
            .arg("--node-ip=10.63.0.1");
        self.controllers.push(Proc::spawn("kwok", kwok, &d.join("kwok.log")));

        for i in 0..nodes {
            let name = format!("kwok-node-{i}");
            let node = format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  annotations: {{kwok.x-k8s.io/node: fake}}\n  \
                 labels: {{type: kwok, kubernetes.io/hostname: {name}, topology.kubernetes.io/zone: zone-{z}}}\n",
                z = i % 2
            );
            let mut apply = self.kubectl();
            apply.args(["apply", "-f", "-"]);
            super::operator::pipe(apply, &node);
            // Admission (TaintNodesByCondition) taints a new node not-ready; the node lifecycle
            // controller, which is off here, would lift it once the node is Ready.
            self.kubectl_ok(&["taint", "nodes", &name, "node.kubernetes.io/not-ready:NoSchedule-"]);
            self.nodes.push(name);
        }

        // The whole chain answers: the namespace's default ServiceAccount (controller-manager), and
        // a pod that is scheduled (scheduler) and made Running and Ready (kwok).
        self.kubectl_ok(&["create", "namespace", "kwok-probe"]);
        let probe = "apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: kwok-probe}\n\
                     spec: {containers: [{name: app, image: example/probe:1}]}\n";
        let mut apply = self.kubectl();
        apply.args(["apply", "-f", "-"]);
        super::operator::pipe(apply, probe);
        loop {
            let sa = self
                .kubectl()
                .args(["get", "serviceaccount", "default", "-n", "kwok-probe"])
                .output();
            let ready = self
                .kubectl()
                .args(["get", "pod", "probe", "-n", "kwok-probe", "-o"])
                .arg("jsonpath={.status.podIP} {.status.conditions[?(@.type==\"Ready\")].status}")
                .output();
            let sa_ok = sa.is_ok_and(|o| o.status.success());
            let ready = ready
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if sa_ok && ready.ends_with(" True") && !ready.starts_with(' ') {
                break;
            }
            for c in &mut self.controllers {
                if let Some(status) = c.try_exit() {
                    panic!("{} exited ({status}):\n{}", c.name(), c.log_tail(40));
                }
            }
            if started.elapsed() >= Duration::from_secs(120) {
                let pod = self
                    .kubectl()
                    .args(["get", "pod", "probe", "-n", "kwok-probe", "-o", "yaml"])
                    .output();
                let nodes = self.kubectl().args(["get", "nodes", "-o", "yaml"]).output();
                eprintln!(
                    "--- probe pod\n{}\n--- nodes\n{}",
                    pod.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default(),
                    nodes
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the controllers did not make a probe pod Ready in 120 s (pod: {ready:?}, default SA: {sa_ok}):\n\
                 --- kube-scheduler\n{}\n--- kwok\n{}\n--- kube-controller-manager\n{}",
                self.controllers[1].log_tail(15),
                self.controllers[2].log_tail(15),
                self.controllers[0].log_tail(15),
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        self.kubectl_ok(&["delete", "namespace", "kwok-probe", "--wait=false"]);
        eprintln!(
            "controllers, scheduler and kwok ({nodes} fake nodes) ready in {:?}",
            started.elapsed()
        );
    }

    /// Stops kube-apiserver with SIGSTOP (an apiserver that is down as far as its clients tell).
    pub fn freeze_apiserver(&self) {
        self.apiserver.freeze();
    }

    pub fn resume_apiserver(&self) {
        self.apiserver.resume();
    }

    /// The pids of kube-controller-manager, kube-scheduler and kwok (empty for a bare cluster).
    pub fn controller_pids(&self) -> Vec<(String, i32)> {
        self.controllers
            .iter()
            .map(|c| (c.name().to_string(), c.pid()))
            .collect()
    }

    /// The last lines of the controllers' logs, for assertion messages.
    pub fn controller_logs(&self, n: usize) -> String {
        self.controllers
            .iter()
            .map(|c| format!("--- {}\n{}", c.name(), c.log_tail(n)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts etcd and kube-apiserver and waits until `/readyz` answers 200.
    pub fn start(assets: &Path) -> Cluster {
        for bin in ["etcd", "kube-apiserver", "kubectl"] {
            assert!(
                assets.join(bin).exists(),
                "{bin} is missing from {}; run tests/peers/setup",
                assets.display()
            );
        }
        let dir = scratch_dir("cluster");
        let d = dir.path();
        let pki = pki(&[]);
        write(&d.join("ca.crt"), &pki.ca_pem);
        write(&d.join("apiserver.crt"), &pki.server_cert);
        write(&d.join("apiserver.key"), &pki.server_key);
        write(&d.join("admin.crt"), &pki.admin_cert);
        write(&d.join("admin.key"), &pki.admin_key);
        write(&d.join("sa.key"), &pki.sa_key);
        write(&d.join("sa.pub"), &pki.sa_pub);

        let lo = Ipv4Addr::LOCALHOST;
        let (client_port, peer_port, api_port) = (free_port(lo), free_port(lo), free_port(lo));
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let mut etcd = Command::new(assets.join("etcd"));
        etcd.args(["--data-dir", &d.join("etcd").display().to_string()])
            .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer_port}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
            ])
            .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer_port}")])
            .args(["--unsafe-no-fsync", "--log-level", "warn"]);
        let etcd = Proc::spawn("etcd", etcd, &d.join("etcd.log"));

        let url = format!("https://127.0.0.1:{api_port}");
        let mut api = Command::new(assets.join("kube-apiserver"));
        let p = |f: &str| d.join(f).display().to_string();
        api.arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={api_port}"))
            .arg(format!("--cert-dir={}", d.display()))
            .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
            .arg(format!("--client-ca-file={}", p("ca.crt")))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-issuer={url}"))
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!("--service-account-signing-key-file={}", p("sa.key")))
            .args(["--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true"])
            .args(["--disable-admission-plugins=ServiceAccount"]);
        let apiserver = Proc::spawn("kube-apiserver", api, &d.join("apiserver.log"));

        let kubeconfig = d.join("kubeconfig");
        write(
            &kubeconfig,
            &format!(
                "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: \"{url}\", certificate-authority: \"{ca}\"}}
users:
- name: admin
  user: {{client-certificate: \"{cert}\", client-key: \"{key}\"}}
contexts:
- {{name: test, context: {{cluster: test, user: admin, namespace: default}}}}
current-context: test
",
                ca = p("ca.crt"),
                cert = p("admin.crt"),
                key = p("admin.key"),
            ),
        );

        let mut cluster = Cluster {
            url,
            kubeconfig,
            assets: assets.to_path_buf(),
            nodes: Vec::new(),
            controllers: Vec::new(),
            apiserver,
            etcd,
            _dir: dir,
        };
        cluster.wait_ready(Duration::from_secs(90));
        cluster
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let started = Instant::now();
        loop {
            let out = self.kubectl().args(["get", "--raw", "/readyz"]).output();
            if let Ok(out) = &out
                && out.status.success()
            {
                eprintln!("kube-apiserver ready in {:?} at {}", started.elapsed(), self.url);
                return;
            }
            if let Some(status) = self.apiserver.try_exit() {
                panic!("kube-apiserver exited ({status}):\n{}", self.apiserver.log_tail(40));
            }
            if let Some(status) = self.etcd.try_exit() {
                panic!("etcd exited ({status}):\n{}", self.etcd.log_tail(40));
            }
            assert!(
                started.elapsed() < timeout,
                "kube-apiserver not ready after {timeout:?}:\n{}",
                self.apiserver.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `kubectl --kubeconfig <admin>`.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.assets.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// Runs kubectl with `args`, panicking with its output on failure; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl().args(args).output().expect("failed to run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A `kube::Config` for the admin (`system:masters`).
    pub async fn admin_config(&self) -> kube::Config {
        let kc = Kubeconfig::read_from(&self.kubeconfig).expect("failed to read test kubeconfig");
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("failed to load test kubeconfig")
    }

    /// A client acting as the admin (`system:masters`).
    pub async fn admin(&self) -> kube::Client {
        kube::Client::try_from(self.admin_config().await).expect("failed to build admin client")
    }

    /// A config whose every request impersonates `user` (e.g.
    /// `system:serviceaccount:<ns>:<name>`; the apiserver adds the service-account groups itself).
    pub async fn config_as(&self, user: &str) -> kube::Config {
        let mut config = self.admin_config().await;
        config.auth_info.impersonate = Some(user.to_string());
        config
    }

    /// A client that acts as `user` through impersonation, so RBAC applies to it.
    pub async fn client_as(&self, user: &str) -> kube::Client {
        kube::Client::try_from(self.config_as(user).await).expect("failed to build impersonating client")
    }

    /// Writes a kubeconfig that impersonates `user`, for processes such as the operator binary.
    pub fn kubeconfig_as(&self, user: &str, path: &Path) {
        let text = std::fs::read_to_string(&self.kubeconfig).expect("read kubeconfig");
        let text = text.replace("client-key: ", &format!("as: \"{user}\", client-key: "));
        write(path, &text);
    }
}
