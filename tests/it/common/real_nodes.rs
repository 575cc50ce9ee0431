//! A Kubernetes cluster whose nodes run containers: etcd, kube-apiserver, kube-controller-manager
//! (every controller, node lifecycle included) and kube-scheduler, plus two real nodes, each a
//! kubelet, a containerd with runc, and a kube-proxy (iptables), as users run them. Images come
//! from OCI archives built on this machine (`.ci/image` for the operator, `tests/peers/setup` for
//! the test apps) and are imported into each node's containerd: nothing is pulled.
//!
//! The network is this test's own and goes nowhere else:
//!
//! ```text
//!  this process (root netns) ── bridge eoN-br 10.200.0.1/24 (kube-apiserver listens here)
//!        │ routes: 10.244.K.0/24 via node K, the Service range 10.0.0.0/24 via node 1
//!        ├── veth ── netns eoN-n1: eth0 10.200.0.11 · containerd, kubelet, kube-proxy
//!        │                └─ ptp veths ── pods 10.244.1.0/24
//!        └── veth ── netns eoN-n2: eth0 10.200.0.12 · the same, pods 10.244.2.0/24
//! ```
//!
//! A node's network namespace has routes to the bridge's /24, the other node's pods and the
//! Service range, and no default route; pods get routes to the pod, Service and bridge ranges
//! only (CNI `ptp` with `host-local`, no masquerading). So nothing in a pod or a node can reach
//! anything but this machine's test network. The node processes join only the network namespace
//! (`nsenter --net`): they share the mount namespace, so the kubelet's volume mounts are the ones
//! containerd bind-mounts into containers.
//!
//! One such cluster exists per machine at a time (an flock on `/run/eo-real-nodes.lock`): the
//! addresses are fixed. Whatever a killed run left behind (namespaces, the bridge, mounts,
//! container processes) is removed before the next one starts, and at the test process's exit.

use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr},
    os::unix::io::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use super::{
    cluster::{pki, write},
    process::{Proc, scratch_dir},
};

/// The bridge's address in this process's network namespace; kube-apiserver listens on it.
pub const BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
/// The Service range (kube-apiserver's `--service-cluster-ip-range`).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// Every node's pods (kube-proxy's `clusterCIDR`); node K has 10.244.K.0/24.
pub const POD_CIDR: &str = "10.244.0.0/16";
const API_PORT: u16 = 6443;
const NODES: usize = 2;
const LOCK: &str = "/run/eo-real-nodes.lock";
/// Every name this harness gives a network device, namespace or directory starts with this.
const PREFIX: &str = "eorn";

/// A real node: its network namespace and address, and its processes.
pub struct Node {
    pub name: String,
    pub ip: Ipv4Addr,
    /// `/run/netns/<netns>`.
    pub netns: String,
    /// containerd's socket.
    pub containerd: PathBuf,
    /// containerd, kubelet, kube-proxy.
    procs: Mutex<Vec<Proc>>,
}

/// The running cluster. See the module docs.
pub struct RealCluster {
    /// An admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    pub assets: PathBuf,
    /// The OCI archives of the test apps (`pause.tar`, `hello.tar`, `python-client.tar`).
    pub images: PathBuf,
    /// The operator's image archive, and its name as containerd knows it.
    pub operator_image: (PathBuf, String),
    pub nodes: Vec<Node>,
    /// Scratch files: PKI, configs, logs.
    pub dir: PathBuf,
    /// etcd, kube-apiserver, kube-controller-manager, kube-scheduler.
    control: Mutex<Vec<Proc>>,
    _scratch: tempfile::TempDir,
}

/// The OCI archive `.ci/image` writes, and the image name in it.
fn operator_archive() -> (PathBuf, String) {
    let path = std::env::var("EO_IMAGE_ARCHIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/image/eureka-operator.tar"));
    let version = env!("CARGO_PKG_VERSION");
    (path, format!("localhost/eureka-operator:{version}"))
}

/// What a real node needs on this machine, or why it cannot run.
fn missing_prerequisites(assets: &Path, images: &Path, image: &Path) -> Option<String> {
    for bin in [
        "kubelet",
        "kube-proxy",
        "kube-controller-manager",
        "kube-scheduler",
        "etcd",
        "helm",
    ] {
        if !assets.join(bin).exists() {
            return Some(format!(
                "{bin} is missing from {}; run tests/peers/setup",
                assets.display()
            ));
        }
    }
    for tool in ["containerd", "runc", "ctr", "nsenter", "ip", "iptables"] {
        if !which(tool) {
            return Some(format!("{tool} is not installed; run tests/peers/setup"));
        }
    }
    for plugin in ["ptp", "host-local", "loopback"] {
        if !Path::new("/usr/lib/cni").join(plugin).exists() {
            return Some(format!(
                "the CNI plugin {plugin} is missing from /usr/lib/cni; run tests/peers/setup"
            ));
        }
    }
    for archive in ["pause.tar", "hello.tar", "python-client.tar"] {
        if !images.join(archive).exists() {
            return Some(format!(
                "{archive} is missing from {}; run tests/peers/setup",
                images.display()
            ));
        }
    }
    if !image.exists() {
        return Some(format!(
            "the operator image {} is missing; run .ci/image",
            image.display()
        ));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("real nodes need root (network namespaces, mounts, containerd)".into());
    }
    None
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Runs a command to completion; panics with its output when it fails.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("failed to run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command and ignores how it ends (cleanup).
fn run_quiet(cmd: &mut Command) {
    let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
}

fn ip(args: &[&str]) -> String {
    run_ok(Command::new("ip").args(args))
}

/// Runs `program` in a network namespace only (`nsenter --net`): same mounts, other network.
fn in_netns(netns: &str, program: &Path) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{netns}")).arg("--").arg(program);
    cmd
}

impl RealCluster {
    /// The cluster, started on first use and shared by the tests of this binary (`None` when a
    /// prerequisite is missing outside CI, after printing why). Tests take [`RealCluster::exclusive`]
    /// before using it: they install cluster-wide things (a CRD, ClusterRoles).
    pub fn shared() -> Option<&'static RealCluster> {
        static SHARED: OnceLock<Option<RealCluster>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let assets = super::peers::require("KUBEBUILDER_ASSETS", "real-node tests")?;
                let images = super::peers::require("EUREKA_PEER_NODE_IMAGES", "real-node tests")?;
                let (archive, name) = operator_archive();
                if let Some(why) = missing_prerequisites(Path::new(&assets), Path::new(&images), &archive) {
                    assert!(!super::peers::required(), "{why}");
                    eprintln!("SKIPPED real-node tests: {why}");
                    return None;
                }
                let cluster = RealCluster::start(PathBuf::from(assets), PathBuf::from(images), (archive, name));
                // SAFETY: registering a plain `extern "C" fn` to run at exit.
                unsafe { libc::atexit(teardown_at_exit) };
                Some(cluster)
            })
            .as_ref()
    }

    /// Serialises the tests that use the shared cluster.
    pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
        static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        TURN.lock().await
    }

    fn start(assets: PathBuf, images: PathBuf, operator_image: (PathBuf, String)) -> RealCluster {
        let started = Instant::now();
        machine_lock();
        remove_leftovers();
        let scratch = scratch_dir("real-nodes");
        let dir = scratch.path().to_path_buf();
        let kubeconfig = dir.join("kubeconfig");
        ip(&["link", "add", &bridge(), "type", "bridge"]);
        ip(&["addr", "add", &format!("{BRIDGE_IP}/24"), "dev", &bridge()]);
        ip(&["link", "set", &bridge(), "up"]);
        let control = start_control_plane(&assets, &dir, &kubeconfig);
        let mut cluster = RealCluster {
            kubeconfig,
            assets,
            images,
            operator_image,
            nodes: Vec::new(),
            dir,
            control: Mutex::new(control),
            _scratch: scratch,
        };
        cluster.wait_api();
        for k in 1..=NODES {
            let node = cluster.start_node(k);
            cluster.nodes.push(node);
        }
        cluster.wait_nodes_ready(Duration::from_secs(120));
        eprintln!(
            "real nodes ready in {:?}: {}",
            started.elapsed(),
            cluster
                .nodes
                .iter()
                .map(|n| format!("{} {}", n.name, n.ip))
                .collect::<Vec<_>>()
                .join(", ")
        );
        cluster
    }

    /// A node: its namespace and links, containerd (with every image imported), kubelet and
    /// kube-proxy.
    fn start_node(&self, k: usize) -> Node {
        let name = format!("{PREFIX}-n{k}");
        let netns = name.clone();
        let node_ip = Ipv4Addr::new(10, 200, 0, 10 + k as u8);
        let host_end = format!("{PREFIX}-h{k}");
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        ip(&["link", "set", &host_end, "master", &bridge(), "up"]);
        ip(&["-n", &netns, "addr", "add", &format!("{node_ip}/24"), "dev", "eth0"]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        for other in (1..=NODES).filter(|o| *o != k) {
            let via = Ipv4Addr::new(10, 200, 0, 10 + other as u8).to_string();
            ip(&[
                "-n",
                &netns,
                "route",
                "add",
                &format!("10.244.{other}.0/24"),
                "via",
                &via,
            ]);
        }
        // Local processes (hostNetwork pods, a probe) reach ClusterIPs: kube-proxy's OUTPUT rules
        // rewrite them once a route exists.
        ip(&["-n", &netns, "route", "add", SERVICE_CIDR, "dev", "eth0"]);
        ip(&["route", "add", &format!("10.244.{k}.0/24"), "via", &node_ip.to_string()]);
        if k == 1 {
            ip(&["route", "add", SERVICE_CIDR, "via", &node_ip.to_string()]);
        }
        run_ok(Command::new("ip").args(["netns", "exec", &netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"]));

        let paths = NodePaths::of(&name);
        for d in [&paths.lib, &paths.run, &paths.logs, &paths.cni] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("failed to create {}: {e}", d.display()));
        }
        let conf = self.dir.join(&name);
        std::fs::create_dir_all(&conf).expect("node config dir");
        write(&conf.join("containerd.toml"), &containerd_config(&paths));
        write(&paths.cni.join("10-pods.conflist"), &cni_config(k, &paths));
        write(&conf.join("resolv.conf"), "");
        let mut procs = Vec::new();
        let mut containerd = in_netns(&netns, Path::new("/usr/bin/containerd"));
        containerd.arg("--config").arg(conf.join("containerd.toml"));
        procs.push(Proc::spawn(
            &format!("containerd {name}"),
            containerd,
            &conf.join("containerd.log"),
        ));
        let socket = paths.run.join("containerd.sock");
        wait_path(&socket, Duration::from_secs(30), &procs[0]);
        let node = Node {
            name: name.clone(),
            ip: node_ip,
            netns: netns.clone(),
            containerd: socket,
            procs: Mutex::new(Vec::new()),
        };
        for archive in ["pause.tar", "hello.tar", "python-client.tar"] {
            node.import(&self.images.join(archive));
        }
        node.import(&self.operator_image.0);

        write(
            &conf.join("kubelet.yaml"),
            &kubelet_config(&name, node_ip, &paths, &self.dir, &conf),
        );
        let mut kubelet = in_netns(&netns, &self.assets.join("kubelet"));
        kubelet
            .arg(format!("--config={}", conf.join("kubelet.yaml").display()))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--hostname-override={name}"))
            .arg(format!("--node-ip={node_ip}"))
            .arg(format!("--root-dir={}", paths.lib.join("kubelet").display()))
            .arg(format!("--cert-dir={}", paths.lib.join("pki").display()));
        procs.push(Proc::spawn(
            &format!("kubelet {name}"),
            kubelet,
            &conf.join("kubelet.log"),
        ));

        write(
            &conf.join("kube-proxy.yaml"),
            &kube_proxy_config(&name, node_ip, &self.kubeconfig),
        );
        let mut proxy = in_netns(&netns, &self.assets.join("kube-proxy"));
        proxy.arg(format!("--config={}", conf.join("kube-proxy.yaml").display()));
        procs.push(Proc::spawn(
            &format!("kube-proxy {name}"),
            proxy,
            &conf.join("kube-proxy.log"),
        ));
        *node.procs.lock().unwrap() = procs;
        node
    }

    fn wait_api(&self) {
        let started = Instant::now();
        loop {
            let out = self.kubectl().args(["get", "--raw", "/readyz"]).output();
            if out.is_ok_and(|o| o.status.success()) {
                return;
            }
            for p in self.control.lock().unwrap().iter_mut() {
                if let Some(status) = p.try_exit() {
                    panic!("{} exited ({status}):\n{}", p.name(), p.log_tail(40));
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "kube-apiserver not ready in 90 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn wait_nodes_ready(&self, timeout: Duration) {
        let started = Instant::now();
        loop {
            let out = self
                .kubectl()
                .args(["get", "nodes", "-o"])
                .arg("jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status},{.spec.taints}{\"\\n\"}{end}")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let ready = out
                .lines()
                .filter(|l| l.contains("=True,") && !l.contains("not-ready"))
                .count();
            if ready == self.nodes.len() {
                return;
            }
            for node in &self.nodes {
                for p in node.procs.lock().unwrap().iter_mut() {
                    if let Some(status) = p.try_exit() {
                        panic!("{} exited ({status}):\n{}", p.name(), p.log_tail(40));
                    }
                }
            }
            assert!(
                started.elapsed() < timeout,
                "the nodes were not Ready in {timeout:?}: {out}\n{}",
                self.node_logs(20)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The last lines of every node process's log, for assertion messages.
    pub fn node_logs(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            for p in node.procs.lock().unwrap().iter() {
                out.push_str(&format!("--- {}\n{}\n", p.name(), p.log_tail(n)));
            }
        }
        out
    }

    /// `kubectl --kubeconfig <admin>`.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.assets.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        run_ok(self.kubectl().args(args))
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> String {
        let mut cmd = self.kubectl();
        cmd.args(["apply", "-f", "-"]);
        super::operator::pipe(cmd, yaml)
    }

    /// `helm <args>` against this cluster, with Helm's state in the scratch directory.
    pub fn helm(&self, args: &[&str]) -> Output {
        let home = self.dir.join("helm");
        Command::new(self.assets.join("helm"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .expect("failed to run helm")
    }

    pub fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A `kube::Client` acting as the admin.
    pub async fn client(&self) -> kube::Client {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let kc = Kubeconfig::read_from(&self.kubeconfig).expect("failed to read the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("failed to load the kubeconfig");
        kube::Client::try_from(config).expect("failed to build a client")
    }

    /// A container's log through the apiserver (`kubectl logs`, so the kubelet serves it).
    pub fn logs(&self, namespace: &str, pod: &str, container: &str, previous: bool) -> String {
        let mut cmd = self.kubectl();
        cmd.args(["logs", "-n", namespace, pod, "-c", container]);
        if previous {
            cmd.arg("--previous");
        }
        cmd.output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The node a pod runs on.
    pub fn node_of(&self, namespace: &str, pod: &str) -> &Node {
        let name = self.kubectl_ok(&["get", "pod", pod, "-n", namespace, "-o", "jsonpath={.spec.nodeName}"]);
        self.nodes
            .iter()
            .find(|n| n.name == name.trim())
            .unwrap_or_else(|| panic!("pod {namespace}/{pod} is on no node of ours ({name:?})"))
    }

    /// The host PID of a running container's first process (its PID 1).
    pub fn container_pid(&self, namespace: &str, pod: &str, container: &str) -> i32 {
        let id = self.kubectl_ok(&[
            "get",
            "pod",
            pod,
            "-n",
            namespace,
            "-o",
            &format!("jsonpath={{.status.containerStatuses[?(@.name==\"{container}\")].containerID}}"),
        ]);
        let id = id.trim().trim_start_matches("containerd://");
        let node = self.node_of(namespace, pod);
        let tasks = node.ctr(&["tasks", "ls"]);
        tasks
            .lines()
            .find(|l| l.starts_with(id))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no running task {id} on {}: {tasks}", node.name))
    }
}

impl Node {
    /// `ctr -n k8s.io <args>` against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> String {
        run_ok(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.containerd)
                .args(["-n", "k8s.io"])
                .args(args),
        )
    }

    /// Imports an OCI archive into this node's containerd (where the CRI plugin looks).
    pub fn import(&self, archive: &Path) {
        self.ctr(&["images", "import", &archive.display().to_string()]);
    }
}

/// Where a node keeps its state: all under names with the harness's prefix.
struct NodePaths {
    lib: PathBuf,
    run: PathBuf,
    logs: PathBuf,
    cni: PathBuf,
}

impl NodePaths {
    fn of(name: &str) -> NodePaths {
        NodePaths {
            lib: PathBuf::from(format!("/var/lib/{name}")),
            run: PathBuf::from(format!("/run/{name}")),
            logs: PathBuf::from(format!("/var/log/{name}")),
            cni: PathBuf::from(format!("/run/{name}/cni")),
        }
    }
}

fn bridge() -> String {
    format!("{PREFIX}-br")
}

fn containerd_config(p: &NodePaths) -> String {
    let (lib, run, cni) = (p.lib.display(), p.run.display(), p.cni.display());
    format!(
        r#"version = 2
root = "{lib}/containerd"
state = "{run}/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{run}/containerd.sock"
[ttrpc]
  address = "{run}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/eo-pause:1"
  # runc cannot lower a sandbox's OOM score here (the machine refuses it); keep the kubelet's.
  restrict_oom_score_adj = true
  # Pod network namespaces under this node's state, so a cleanup finds them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#
    )
}

/// ptp: one veth per pod into the node's namespace, addresses from host-local, routes to the
/// test network's ranges only.
fn cni_config(k: usize, p: &NodePaths) -> String {
    let ipam = p.lib.join("ipam");
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "pods",
  "plugins": [{{
    "type": "ptp",
    "ipMasq": false,
    "mtu": 1500,
    "ipam": {{
      "type": "host-local",
      "dataDir": "{ipam}",
      "ranges": [[{{"subnet": "10.244.{k}.0/24"}}]],
      "routes": [{{"dst": "{POD_CIDR}"}}, {{"dst": "{SERVICE_CIDR}"}}, {{"dst": "10.200.0.0/24"}}]
    }}
  }}]
}}
"#,
        ipam = ipam.display()
    )
}

fn kubelet_config(name: &str, node_ip: Ipv4Addr, p: &NodePaths, dir: &Path, conf: &Path) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
containerRuntimeEndpoint: unix://{run}/containerd.sock
# cgroup v1 (hybrid) with the cgroupfs driver: no QoS hierarchy, nothing reserved.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
cgroupRoot: /{name}
enforceNodeAllocatable: []
failSwapOn: false
resolvConf: {resolv}
clusterDomain: cluster.local
podLogsDir: {logs}/pods
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
serializeImagePulls: false
maxPods: 60
"#,
        ca = dir.join("ca.crt").display(),
        run = p.run.display(),
        logs = p.logs.display(),
        resolv = conf.join("resolv.conf").display(),
    )
}

fn kube_proxy_config(name: &str, node_ip: Ipv4Addr, kubeconfig: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {name}
bindAddress: {node_ip}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
mode: iptables
clusterCIDR: {POD_CIDR}
nodePortAddresses: [primary]
# The machine's conntrack table size is not ours to change.
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
iptables: {{localhostNodePorts: false}}
"#,
        kubeconfig = kubeconfig.display()
    )
}

/// etcd, kube-apiserver (on the bridge address), kube-controller-manager and kube-scheduler.
fn start_control_plane(assets: &Path, d: &Path, kubeconfig: &Path) -> Vec<Proc> {
    let pki = pki(&[IpAddr::V4(BRIDGE_IP)]);
    write(&d.join("ca.crt"), &pki.ca_pem);
    write(&d.join("apiserver.crt"), &pki.server_cert);
    write(&d.join("apiserver.key"), &pki.server_key);
    write(&d.join("admin.crt"), &pki.admin_cert);
    write(&d.join("admin.key"), &pki.admin_key);
    write(&d.join("sa.key"), &pki.sa_key);
    write(&d.join("sa.pub"), &pki.sa_pub);
    let p = |f: &str| d.join(f).display().to_string();
    let url = format!("https://{BRIDGE_IP}:{API_PORT}");
    write(
        kubeconfig,
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster: {{server: \"{url}\", certificate-authority: \"{ca}\"}}\n\
             users:\n- name: admin\n  user: {{client-certificate: \"{cert}\", client-key: \"{key}\"}}\n\
             contexts:\n- {{name: real, context: {{cluster: real, user: admin, namespace: default}}}}\ncurrent-context: real\n",
            ca = p("ca.crt"),
            cert = p("admin.crt"),
            key = p("admin.key"),
        ),
    );
    let lo = Ipv4Addr::LOCALHOST;
    let (client, peer) = (super::process::free_port(lo), super::process::free_port(lo));
    let etcd_url = format!("http://127.0.0.1:{client}");
    let mut etcd = Command::new(assets.join("etcd"));
    etcd.args(["--data-dir", &p("etcd")])
        .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .args(["--unsafe-no-fsync", "--log-level", "warn"]);
    let mut procs = vec![Proc::spawn("etcd", etcd, &d.join("etcd.log"))];

    let mut api = Command::new(assets.join("kube-apiserver"));
    api.arg(format!("--etcd-servers={etcd_url}"))
        .arg(format!("--bind-address={BRIDGE_IP}"))
        .arg(format!("--advertise-address={BRIDGE_IP}"))
        .arg(format!("--secure-port={API_PORT}"))
        .arg(format!("--cert-dir={}", d.display()))
        .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
        .arg(format!("--client-ca-file={}", p("ca.crt")))
        .arg("--authorization-mode=RBAC")
        .arg(format!("--service-account-issuer={url}"))
        .arg(format!("--service-account-key-file={}", p("sa.pub")))
        .arg(format!("--service-account-signing-key-file={}", p("sa.key")))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        .arg("--allow-privileged=true")
        // `kubectl logs` and `exec` go to the kubelets by their node IP, as the admin.
        .arg("--kubelet-preferred-address-types=InternalIP")
        .arg(format!("--kubelet-client-certificate={}", p("admin.crt")))
        .arg(format!("--kubelet-client-key={}", p("admin.key")));
    procs.push(Proc::spawn("kube-apiserver", api, &d.join("apiserver.log")));

    let kc = kubeconfig.display().to_string();
    let mut kcm = Command::new(assets.join("kube-controller-manager"));
    kcm.arg(format!("--kubeconfig={kc}"))
        .arg("--leader-elect=false")
        .arg("--controllers=*")
        .arg(format!("--service-account-private-key-file={}", p("sa.key")))
        .arg(format!("--root-ca-file={}", p("ca.crt")))
        .arg("--use-service-account-credentials=false")
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={}", super::process::free_port(lo)));
    procs.push(Proc::spawn("kube-controller-manager", kcm, &d.join("kcm.log")));
    let mut sched = Command::new(assets.join("kube-scheduler"));
    sched
        .arg(format!("--kubeconfig={kc}"))
        .arg("--leader-elect=false")
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={}", super::process::free_port(lo)));
    procs.push(Proc::spawn("kube-scheduler", sched, &d.join("scheduler.log")));
    procs
}

fn wait_path(path: &Path, timeout: Duration, owner: &Proc) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < timeout,
            "{} did not appear in {timeout:?}:\n{}",
            path.display(),
            owner.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Holds the machine-wide lock for the life of the process (real nodes use fixed addresses).
fn machine_lock() {
    static HELD: OnceLock<File> = OnceLock::new();
    HELD.get_or_init(|| {
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .unwrap_or_else(|e| panic!("failed to open {LOCK}: {e}"));
        eprintln!("waiting for {LOCK} (one set of real nodes per machine)");
        // SAFETY: flock on a file descriptor we own.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "failed to lock {LOCK}");
        f
    });
}

extern "C" fn teardown_at_exit() {
    remove_leftovers();
}

/// Removes everything a real-node cluster of this harness leaves on the machine: its container
/// and node processes, mounts, network namespaces, bridge and routes, cgroups and directories.
/// Safe to run when there is nothing to remove.
pub fn remove_leftovers() {
    let ours = |path: &str| path.split('/').any(|part| part.starts_with(&format!("{PREFIX}-")));
    // Container processes: their root is a rootfs under a node's state directory. Node processes:
    // they live in a node's network namespace (containerd, its shims, kubelet, kube-proxy).
    let netns_ids: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{PREFIX}-")))
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            format!("net:[{}]", m.ino())
        })
        .collect();
    for _ in 0..3 {
        let mut killed = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if pid == std::process::id() as i32 {
                continue;
            }
            let root = std::fs::read_link(entry.path().join("root"))
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let net = std::fs::read_link(entry.path().join("ns/net"))
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            if ours(&root) || netns_ids.contains(&net) {
                // SAFETY: kill(2) of a process of this harness.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed += 1;
            }
        }
        if killed == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // Mounts under our directories, deepest first.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| ours(p))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        if let Ok(c) = std::ffi::CString::new(p) {
            // SAFETY: umount2 with a valid C string; failures are ignored (already gone).
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    for k in 1..=NODES {
        run_quiet(Command::new("ip").args(["netns", "del", &format!("{PREFIX}-n{k}")]));
        run_quiet(Command::new("ip").args(["link", "del", &format!("{PREFIX}-h{k}")]));
        run_quiet(Command::new("ip").args(["route", "del", &format!("10.244.{k}.0/24")]));
    }
    run_quiet(Command::new("ip").args(["route", "del", SERVICE_CIDR]));
    run_quiet(Command::new("ip").args(["link", "del", &bridge()]));
    for k in 1..=NODES {
        let name = format!("{PREFIX}-n{k}");
        // Containers' cgroups under the node's cgroup root, deepest first.
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let root = hierarchy.path().join(&name);
            let mut dirs = Vec::new();
            collect_dirs(&root, &mut dirs);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in dirs {
                let _ = std::fs::remove_dir(d);
            }
        }
        let paths = NodePaths::of(&name);
        for d in [paths.lib, paths.run, paths.logs] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_path_buf());
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
}
