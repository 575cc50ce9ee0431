//! The operator against the real apiserver: the CRD from `crds/` and the RBAC rendered from the
//! Helm chart are applied once per test binary; each test runs its own operator process, as the
//! chart's ServiceAccount (impersonation), watching its own namespace with its own Lease.

use std::{
    collections::BTreeMap,
    io::Write,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::{
    cluster::Cluster,
    eureka::{Server, http},
    process::{free_port, scratch_dir, wait_for},
};

/// Where the chart installs the operator in these tests.
pub const OPERATOR_NAMESPACE: &str = "eureka-system";
/// The chart's ServiceAccount for release `eo`.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:eureka-system:eo-eureka-operator";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Pipes `input` into a command; panics with its output on failure.
pub fn pipe(mut cmd: Command, input: &str) -> String {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("failed to run a command");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template` of the chart with `args`.
pub fn helm_template(cluster: &Cluster, args: &[&str]) -> String {
    let out = Command::new(cluster.assets.join("helm"))
        .args(["template", "eo"])
        .arg(root().join("charts/eureka-operator"))
        .args(["-n", OPERATOR_NAMESPACE, "--kube-version", "1.36.3"])
        .args(args)
        .output()
        .expect("failed to run helm");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The shared cluster with the CRD and the chart's RBAC applied.
pub fn prepared() -> Option<&'static Cluster> {
    static READY: OnceLock<bool> = OnceLock::new();
    let cluster = Cluster::shared()?;
    READY.get_or_init(|| {
        prepare(cluster);
        true
    });
    Some(cluster)
}

/// Applies the CRD from `crds/` and the chart's ServiceAccount and RBAC (release `eo`) to `cluster`.
pub fn prepare(cluster: &Cluster) {
    cluster.kubectl_ok(&["create", "namespace", OPERATOR_NAMESPACE]);
    let crds = root().join("crds");
    cluster.kubectl_ok(&["apply", "-f", crds.to_str().unwrap()]);
    let rbac = helm_template(
        cluster,
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
    );
    let mut apply = cluster.kubectl();
    apply.args(["apply", "-f", "-"]);
    pipe(apply, &rbac);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/eurekaapps.eureka-operator.dev",
    ]);
}

/// How to launch an operator process (see [`Operator::launch_with`]).
#[derive(Clone, Debug)]
pub struct Launch {
    pub ip: Ipv4Addr,
    /// Eureka and admin ports (free ones when `None`).
    pub ports: Option<(u16, u16)>,
    /// Watched namespace (`--watch-namespaces`).
    pub namespace: String,
    pub lease: String,
    pub replica: String,
    pub extra: Vec<String>,
    /// `--cluster-id` (`None`: the operator derives it).
    pub cluster_id: Option<String>,
    /// Who the operator acts as (impersonation).
    pub user: String,
    /// Reach the apiserver at this URL instead (e.g. a fault-injecting proxy).
    pub apiserver: Option<String>,
    /// `--lease-duration-seconds`.
    pub lease_seconds: u32,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

impl Launch {
    pub fn new(ip: Ipv4Addr, namespace: &str, lease: &str) -> Launch {
        Launch {
            ip,
            ports: None,
            namespace: namespace.into(),
            lease: lease.into(),
            replica: lease.into(),
            extra: Vec::new(),
            cluster_id: Some("test".into()),
            user: SERVICE_ACCOUNT.into(),
            apiserver: None,
            lease_seconds: 3,
            env: Vec::new(),
        }
    }

    pub fn args(mut self, extra: &[&str]) -> Launch {
        self.extra.extend(extra.iter().map(|s| s.to_string()));
        self
    }
}

/// One operator process.
pub struct Operator {
    pub server: Server,
    _dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub replica: String,
    launch: Launch,
}

impl Operator {
    /// Starts the operator as the chart's ServiceAccount, watching `namespace`, leading through the
    /// Lease `lease` (3 s), with `extra` flags.
    pub async fn start(cluster: &Cluster, ip: Ipv4Addr, namespace: &str, lease: &str, extra: &[&str]) -> Operator {
        Operator::launch_with(cluster, Launch::new(ip, namespace, lease).args(extra)).await
    }

    /// One of several replicas sharing `lease`, on given ports.
    pub async fn start_on(
        cluster: &Cluster,
        ip: Ipv4Addr,
        ports: (u16, u16),
        namespace: &str,
        lease: &str,
        replica: &str,
        extra: &[&str],
    ) -> Operator {
        let mut launch = Launch::new(ip, namespace, lease).args(extra);
        launch.ports = Some(ports);
        launch.replica = replica.into();
        Operator::launch_with(cluster, launch).await
    }

    /// Starts an operator as `launch` says.
    pub async fn launch_with(cluster: &Cluster, launch: Launch) -> Operator {
        let op = Operator::spawn_with(cluster, launch);
        op.server.wait_ready().await;
        op
    }

    /// Starts an operator as `launch` says, without waiting for it to be ready.
    pub fn spawn_with(cluster: &Cluster, mut launch: Launch) -> Operator {
        let dir = scratch_dir("operator");
        let kubeconfig = dir.path().join("kubeconfig");
        cluster.kubeconfig_as(&launch.user, &kubeconfig);
        if let Some(server) = &launch.apiserver {
            let text = std::fs::read_to_string(&kubeconfig)
                .unwrap()
                .replace(&cluster.url, server);
            std::fs::write(&kubeconfig, text).unwrap();
        }
        let ports = *launch
            .ports
            .get_or_insert_with(|| (free_port(launch.ip), free_port(launch.ip)));
        let server = Operator::spawn(&launch, &kubeconfig, ports);
        Operator {
            server,
            _dir: dir,
            kubeconfig,
            replica: launch.replica.clone(),
            launch,
        }
    }

    fn spawn(launch: &Launch, kubeconfig: &Path, (port, admin): (u16, u16)) -> Server {
        let mut args: Vec<String> = [
            "--kubernetes",
            "on",
            "--operator-namespace",
            OPERATOR_NAMESPACE,
            "--lease-name",
            &launch.lease,
            "--lease-duration-seconds",
            &launch.lease_seconds.to_string(),
            "--watch-namespaces",
            &launch.namespace,
            "--replica-id",
            &launch.replica,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(id) = &launch.cluster_id {
            args.extend(["--cluster-id".to_string(), id.clone()]);
        }
        args.extend(launch.extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env = vec![("KUBECONFIG", kubeconfig.to_str().unwrap())];
        env.extend(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Server::spawn_on(launch.ip, port, admin, &args, &env)
    }

    /// Stops the process and starts a new one on the same ports with the same flags.
    pub async fn restart(&mut self, _namespace: &str, _lease: &str) {
        self.server.proc.terminate(Duration::from_secs(10));
        self.start_again(_namespace, _lease).await;
    }

    /// Starts the process again after it stopped (same ports, same flags).
    pub async fn start_again(&mut self, _namespace: &str, _lease: &str) {
        self.spawn_again();
        self.server.wait_ready().await;
    }

    /// Starts the process again (same ports, same flags) without waiting for it to be ready.
    pub fn spawn_again(&mut self) {
        let ports = self.launch.ports.expect("ports are fixed at the first start");
        self.server = Operator::spawn(&self.launch, &self.kubeconfig, ports);
    }
}

// === Kubernetes objects ===

pub async fn namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// A pod on `node` (so deleting it is graceful), with container ports.
pub async fn pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    ports: &[(&str, i32)],
    node: &str,
) {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, p)| {
            if n.is_empty() {
                json!({"containerPort": p})
            } else {
                json!({"name": n, "containerPort": p})
            }
        })
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "example/app:1", "ports": ports}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Writes the pod's status as a kubelet would: running with `ip`, Ready or not.
pub async fn set_ready(client: &kube::Client, ns: &str, name: &str, ip: &str, ready: bool) {
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "192.168.7.1",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
    }});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

pub async fn label(client: &kube::Client, ns: &str, name: &str, key: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {key: value}}});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Deletes gracefully: the pod keeps running (there is no kubelet) with a deletionTimestamp.
pub async fn delete_pod(client: &kube::Client, ns: &str, name: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// The kubelet's last step once a terminating pod's containers have stopped: the pod object
/// goes (a delete with no grace period). There is no kubelet here, so without this a deleted
/// pod stays terminating for good.
pub async fn finish_pod_deletion(client: &kube::Client, ns: &str, name: &str) {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    match api.delete(name, &DeleteParams::default().grace_period(0)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("failed to finish deleting pod {ns}/{name}: {e}"),
    }
}

/// `kubectl apply -f -` of a manifest; the result (stdout+stderr) and whether it succeeded.
pub fn kubectl_apply(cluster: &Cluster, manifest: &str) -> (bool, String) {
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(manifest.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Applies an EurekaApp with the given spec (YAML, indented by four spaces under `spec:`).
pub fn eureka_app(cluster: &Cluster, ns: &str, name: &str, spec: &str) {
    let manifest = format!(
        "apiVersion: eureka-operator.dev/v1alpha1\nkind: EurekaApp\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n{spec}"
    );
    let (ok, out) = kubectl_apply(cluster, &manifest);
    assert!(ok, "applying EurekaApp {ns}/{name} failed: {out}");
}

// === the registry as clients see it ===

/// `(instanceId, status)` of `app` in the operator's registry.
pub async fn instances(server: &Server, app: &str) -> Vec<(String, String)> {
    super::eureka::app_instances(&server.url(), app).await
}

/// One instance document, if registered.
pub async fn instance(server: &Server, app: &str, id: &str) -> Option<Value> {
    let r = http()
        .get(format!("{}apps/{app}/{id}", server.url()))
        .header("Accept", "application/json")
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    Some(r.json::<Value>().await.ok()?["instance"].clone())
}

/// Waits until `app`'s instances are exactly `expected` (`(id, status)`, any order).
pub async fn wait_instances(server: &Server, app: &str, expected: &[(&str, &str)]) {
    let waited = super::eureka::wait_app_instances(&server.url(), app, expected, Duration::from_secs(30)).await;
    if let Err(last) = waited {
        panic!(
            "{app}: expected {expected:?}, have {last:?}\n{}",
            server.proc.log_tail(30)
        );
    }
}

/// The EurekaApp's status as `kubectl` shows it.
pub async fn app_status(cluster: &Cluster, ns: &str, name: &str) -> Value {
    let out = cluster.kubectl_ok(&["get", "ea", name, "-n", ns, "-o", "json"]);
    serde_json::from_str::<Value>(&out).unwrap()["status"].clone()
}

/// Waits until a condition of the EurekaApp has `status`, returning the whole status.
pub async fn wait_condition(cluster: &Cluster, ns: &str, name: &str, type_: &str, status: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = app_status(cluster, ns, name).await;
        let found = last["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == type_ && c["status"] == status));
        if found {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{ns}/{name}: condition {type_} never became {status}; status: {last}");
}

// === replicas found through EndpointSlices ===

/// The machine's own non-loopback IPv4 address: the apiserver refuses loopback addresses in
/// EndpointSlices, so replicas a test lists in one listen on this address.
pub fn host_ip() -> Ipv4Addr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("udp socket");
    // No packet is sent: connecting a UDP socket only picks the outgoing interface.
    socket
        .connect("192.0.2.1:9")
        .or_else(|_| socket.connect("10.255.255.1:9"))
        .expect("a route off this machine");
    match socket.local_addr().unwrap().ip() {
        std::net::IpAddr::V4(ip) if !ip.is_loopback() => ip,
        other => panic!("this machine needs a non-loopback IPv4 address for EndpointSlices, found {other}"),
    }
}

/// Applies the EndpointSlice `{service}-{replica}` (in the operator's namespace) with one
/// endpoint: replica `replica` (its pod name, which is also its `--replica-id`) at `ip:port`, as
/// the EndpointSlice controller writes it for the chart's headless Service (which publishes
/// not-ready addresses): `ready` always true, `serving` the pod's readiness. One slice per replica,
/// since a slice has one port list and test replicas listen on ports of their own.
pub fn replica_slice(cluster: &Cluster, service: &str, replica: &str, ip: Ipv4Addr, port: u16, serving: bool) {
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-{replica}"), "namespace": OPERATOR_NAMESPACE,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "eureka", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip.to_string()],
                       "conditions": {"ready": true, "serving": serving, "terminating": false},
                       "targetRef": {"kind": "Pod", "name": replica, "namespace": OPERATOR_NAMESPACE}}]
    });
    let (ok, out) = kubectl_apply(cluster, &slice.to_string());
    assert!(ok, "applying the EndpointSlice of {replica}: {out}");
}
