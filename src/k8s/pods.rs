//! The compact projection of a Pod that the operator keeps: identity, labels, the annotations
//! worth keeping, addresses, readiness, termination, container ports and owner. Whole Pod objects
//! (specs, managedFields, statuses) are never stored, nor even built: the watch reads pods as
//! [`WatchedPod`], which deserializes only the fields the projection reads and skips the rest of
//! the JSON (managedFields, most of spec and status) without allocating for it.
//!
//! The strings pods repeat (namespaces, label keys and values, node names, owners, ports) are
//! shared through an [`Interner`], and labels are one key-sorted allocation ([`Labels`]): a
//! watched pod costs about 800 bytes of heap (`cargo bench --bench controller_memory`).

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

/// Annotations never kept (large and useless as metadata).
const DROPPED_ANNOTATIONS: [&str; 1] = ["kubectl.kubernetes.io/last-applied-configuration"];
/// Annotation values longer than this are not kept.
const MAX_ANNOTATION_LEN: usize = 1024;

/// Text that pod projections share (see [`Interner`]).
pub type Text = Arc<str>;

/// The interner never prunes below this many strings.
const PRUNE_FLOOR: usize = 4096;

/// One shared copy of each string the pod projections repeat. Strings no projection holds any
/// more are dropped when the set has doubled since the last pruning, so churn (new
/// `pod-template-hash` values at every rollout) costs amortized constant time and no leak.
#[derive(Debug, Default)]
pub struct Interner {
    set: HashSet<Text>,
    prune_at: usize,
}

impl Interner {
    /// The shared copy of `s`.
    pub fn text(&mut self, s: &str) -> Text {
        if let Some(t) = self.set.get(s) {
            return t.clone();
        }
        if self.set.len() >= self.prune_at.max(PRUNE_FLOOR) {
            self.prune();
        }
        let t: Text = Arc::from(s);
        self.set.insert(t.clone());
        t
    }

    /// Drops the strings only the interner holds.
    pub fn prune(&mut self) {
        self.set.retain(|t| Arc::strong_count(t) > 1);
        self.prune_at = self.set.len().saturating_mul(2);
    }

    /// How many strings it holds.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// A pod's `metadata.uid`: a UUID in its canonical lowercase form is kept as its 16 bytes (the
/// apiserver makes every uid so); anything else is kept as sent. Shown as sent either way.
#[derive(Clone, PartialEq, Eq)]
pub enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    /// Hyphens sit after these many hex digits: 8-4-4-4-12.
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];

    fn parse_uuid(s: &str) -> Option<[u8; 16]> {
        let mut out = [0u8; 16];
        let mut digits = 0;
        let mut groups = s.split('-');
        for len in Self::GROUPS {
            let group = groups.next()?;
            if group.len() != len {
                return None;
            }
            for c in group.bytes() {
                let nibble = match c {
                    b'0'..=b'9' => c - b'0',
                    b'a'..=b'f' => c - b'a' + 10,
                    _ => return None,
                };
                out[digits / 2] |= nibble << (if digits % 2 == 0 { 4 } else { 0 });
                digits += 1;
            }
        }
        groups.next().is_none().then_some(out)
    }
}

impl Default for Uid {
    fn default() -> Self {
        Uid::Other(Box::default())
    }
}

impl From<&str> for Uid {
    fn from(s: &str) -> Uid {
        match Uid::parse_uuid(s) {
            Some(bytes) => Uid::Uuid(bytes),
            None => Uid::Other(s.into()),
        }
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uid::Other(s) => f.write_str(s),
            Uid::Uuid(bytes) => {
                let mut digits = bytes.iter().flat_map(|b| [b >> 4, b & 0xf]);
                for (i, len) in Uid::GROUPS.into_iter().enumerate() {
                    if i > 0 {
                        f.write_str("-")?;
                    }
                    for d in digits.by_ref().take(len) {
                        write!(f, "{d:x}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// A pod's labels (or the annotations kept): pairs sorted by key, in one allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Text, Text)]>);

impl Labels {
    /// Shared copies of `pairs`, which are sorted by key with no key twice (a `BTreeMap`'s).
    fn interned<'a>(pairs: impl Iterator<Item = (&'a String, &'a String)>, interner: &mut Interner) -> Labels {
        Labels(pairs.map(|(k, v)| (interner.text(k), interner.text(v))).collect())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `key` (test fixtures; the watch builds labels whole).
    #[cfg(test)]
    pub fn insert(&mut self, key: &str, value: &str) {
        let mut pairs = self.0.to_vec();
        match pairs.binary_search_by(|(k, _)| (**k).cmp(key)) {
            Ok(i) => pairs[i].1 = value.into(),
            Err(i) => pairs.insert(i, (key.into(), value.into())),
        }
        self.0 = pairs.into();
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Labels {
        let sorted: BTreeMap<String, String> = iter
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
            .collect();
        Labels(sorted.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<Text>,
    pub port: i32,
    pub protocol: Text,
}

/// What the operator knows of a Pod.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub namespace: Text,
    /// Shared with the index's key (not interned: names are unique).
    pub name: Text,
    pub uid: Uid,
    pub labels: Labels,
    pub annotations: Labels,
    /// `status.podIPs` (or `status.podIP`).
    pub ips: Vec<String>,
    pub host_ip: Option<Text>,
    pub node_name: Option<Text>,
    pub host_network: bool,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// The `ContainersReady` condition is `True`.
    pub containers_ready: bool,
    /// The readiness gates the pod declares (`spec.readinessGates`), each with whether its
    /// condition is `True`.
    pub gates: Vec<(String, bool)>,
    pub phase: Option<Text>,
    /// When deletion was requested, in milliseconds: `deletionTimestamp` (the moment the pod may
    /// be killed) minus `deletionGracePeriodSeconds`.
    pub deleting_since: Option<i64>,
    pub ports: Vec<ContainerPort>,
    pub service_account: Option<Text>,
    /// `Kind/name` of the controlling owner.
    pub workload: Option<Text>,
}

/// A Pod as the watch reads it: a kube `Resource` (kind `Pod`) with only what [`PodInfo`]
/// projects. Its metadata is an `ObjectMeta` (kube-runtime reads the resource version from it)
/// holding identity, labels, annotations, deletion and owners; managedFields are never built.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedPod {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<WatchedSpec>,
    #[serde(default)]
    pub status: Option<WatchedStatus>,
}

impl k8s_openapi::Resource for WatchedPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for WatchedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The parts of `metadata` the watch and the projection read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    owner_references: Option<Vec<OwnerReference>>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = SlimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        annotations: m.annotations,
        deletion_timestamp: m.deletion_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        owner_references: m.owner_references,
        ..ObjectMeta::default()
    })
}

/// The parts of a Pod's `spec` the projection reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedSpec {
    pub containers: Option<Vec<WatchedContainer>>,
    pub readiness_gates: Option<Vec<WatchedGate>>,
    pub node_name: Option<String>,
    pub host_network: Option<bool>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    pub service_account_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedContainer {
    pub ports: Option<Vec<WatchedPort>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPort {
    pub name: Option<String>,
    pub container_port: i32,
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedGate {
    pub condition_type: String,
}

/// The parts of a Pod's `status` the projection reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedStatus {
    #[serde(rename = "podIPs")]
    pub pod_ips: Option<Vec<WatchedIp>>,
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(rename = "hostIP")]
    pub host_ip: Option<String>,
    pub conditions: Option<Vec<WatchedCondition>>,
    pub phase: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedIp {
    pub ip: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

impl PodInfo {
    /// Projects a whole Pod (tests and fixtures; the watch reads [`WatchedPod`]).
    #[cfg(test)]
    pub fn from_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Option<PodInfo> {
        let json = serde_json::to_value(pod).ok()?;
        PodInfo::from_watched(&serde_json::from_value(json).ok()?, &mut Interner::default())
    }

    /// Projects a Pod, sharing repeated strings through `interner`; `None` without a name or
    /// namespace.
    pub fn from_watched(pod: &WatchedPod, interner: &mut Interner) -> Option<PodInfo> {
        let meta = &pod.metadata;
        let name: Text = meta.name.as_deref()?.into();
        let namespace = interner.text(meta.namespace.as_deref()?);
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let mut ips: Vec<String> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|v| v.iter().map(|ip| ip.ip.clone()).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.clone())
        {
            ips.push(ip);
        }
        let annotations = Labels::interned(
            meta.annotations
                .iter()
                .flatten()
                .filter(|(k, v)| !DROPPED_ANNOTATIONS.contains(&k.as_str()) && v.len() <= MAX_ANNOTATION_LEN),
            interner,
        );
        let ports = spec
            .map(|s| {
                s.containers
                    .iter()
                    .flatten()
                    .flat_map(|c| c.ports.iter().flatten())
                    .map(|p| ContainerPort {
                        name: p.name.as_deref().map(|n| interner.text(n)),
                        port: p.container_port,
                        protocol: interner.text(p.protocol.as_deref().unwrap_or("TCP")),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let condition = |type_: &str| {
            status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
        };
        let ready = condition("Ready");
        let gates = spec
            .and_then(|s| s.readiness_gates.as_ref())
            .map(|g| {
                g.iter()
                    .map(|g| (g.condition_type.clone(), condition(&g.condition_type)))
                    .collect()
            })
            .unwrap_or_default();
        let workload = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| interner.text(&format!("{}/{}", o.kind, o.name)));
        let labels = Labels::interned(meta.labels.iter().flatten(), interner);
        let mut text = |s: Option<&String>| s.map(|s| interner.text(s));
        Some(PodInfo {
            namespace,
            name,
            uid: meta.uid.as_deref().map(Uid::from).unwrap_or_default(),
            labels,
            annotations,
            ips,
            host_ip: text(status.and_then(|s| s.host_ip.as_ref())),
            node_name: text(spec.and_then(|s| s.node_name.as_ref())),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            hostname: spec.and_then(|s| s.hostname.clone()),
            subdomain: spec.and_then(|s| s.subdomain.clone()),
            ready,
            containers_ready: condition("ContainersReady"),
            gates,
            phase: text(status.and_then(|s| s.phase.as_ref())),
            deleting_since: meta.deletion_timestamp.as_ref().map(|t| {
                let grace_ms = meta
                    .deletion_grace_period_seconds
                    .unwrap_or(0)
                    .max(0)
                    .saturating_mul(1000);
                t.0.as_millisecond().saturating_sub(grace_ms)
            }),
            ports,
            service_account: text(spec.and_then(|s| s.service_account_name.as_ref())),
            workload,
        })
    }

    /// Whether the pod counts as ready for an EurekaApp whose readiness gate is `gate`: Ready,
    /// or held back only by that gate (its containers are ready and every other gate is True),
    /// since the gate waits for the very registration this readiness decides.
    pub fn ready_for(&self, gate: Option<&str>) -> bool {
        match gate {
            Some(gate) if !self.ready && self.declares(gate) => {
                self.containers_ready && self.gates.iter().all(|(t, ok)| *ok || t == gate)
            }
            _ => self.ready,
        }
    }

    /// Whether the pod lists `gate` in its readiness gates.
    pub fn declares(&self, gate: &str) -> bool {
        self.gates.iter().any(|(t, _)| t == gate)
    }

    /// Whether the pod's `gate` condition is already True.
    pub fn gate_open(&self, gate: &str) -> bool {
        self.gates.iter().any(|(t, ok)| t == gate && *ok)
    }

    /// Whether the pod has finished for good (its instance must go).
    pub fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded") | Some("Failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canonical_uuid_is_kept_in_16_bytes_and_shown_as_sent() {
        let uuid = "0b3c9f2e-7d41-4a8b-9c0d-e1f203a4b5c6";
        let uid = Uid::from(uuid);
        assert!(matches!(uid, Uid::Uuid(_)));
        assert_eq!(uid.to_string(), uuid);
        for other in [
            "u-1",
            "",
            "0B3C9F2E-7D41-4A8B-9C0D-E1F203A4B5C6",
            "0b3c9f2e-7d41-4a8b-9c0d-e1f203a4b5c",
            "0b3c9f2e-7d41-4a8b-9c0d-e1f203a4b5c6-",
            "0b3c9f2e7d414a8b9c0de1f203a4b5c6",
            "0b3c9f2e-7d41-4a8b-9c0d-e1f203a4b5cg",
        ] {
            let uid = Uid::from(other);
            assert!(matches!(uid, Uid::Other(_)), "{other:?}");
            assert_eq!(uid.to_string(), other);
        }
        assert_eq!(std::mem::size_of::<Uid>(), 24);
    }
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn the_watched_pod_reads_what_the_projection_needs_and_skips_the_rest() {
        let json = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                "labels": {"app": "web"},
                "annotations": {"team": "blue"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9", "uid": "r", "controller": true}],
            },
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "web", "image": "web:1", "ports": [{"name": "http", "containerPort": 8080}],
                                "env": [{"name": "A", "value": "b"}], "resources": {"limits": {"cpu": "1"}}}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "readinessGates": [{"conditionType": "eureka-operator.dev/registered"}],
            },
            "status": {
                "phase": "Running", "hostIP": "192.168.0.1", "podIP": "10.1.0.7", "podIPs": [{"ip": "10.1.0.7"}],
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"}],
                "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "image": "web:1", "imageID": ""}],
            },
        });
        let watched: WatchedPod = serde_json::from_value(json.clone()).unwrap();
        assert!(watched.metadata.managed_fields.is_none(), "never built");
        assert_eq!(watched.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(<WatchedPod as kube::Resource>::kind(&()), "Pod");
        assert_eq!(
            <WatchedPod as kube::Resource>::url_path(&(), Some("shop")),
            "/api/v1/namespaces/shop/pods"
        );
        let full: Pod = serde_json::from_value(json).unwrap();
        let p = PodInfo::from_watched(&watched, &mut Interner::default()).unwrap();
        assert_eq!(Some(p.clone()), PodInfo::from_pod(&full));
        assert_eq!(p.ips, ["10.1.0.7"]);
        assert_eq!(p.gates, [("eureka-operator.dev/registered".to_string(), false)]);
        assert_eq!(p.ports[0].port, 8080);
        assert_eq!(p.workload.as_deref(), Some("ReplicaSet/web-5d9"));
        assert!(p.ready);
        // Nulls where the apiserver may send them.
        let sparse: WatchedPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "namespace": "y", "labels": null},
            "spec": {"containers": [{"name": "c", "ports": null}]},
            "status": null,
        }))
        .unwrap();
        let p = PodInfo::from_watched(&sparse, &mut Interner::default()).unwrap();
        assert!(p.ports.is_empty() && p.labels.is_empty() && !p.ready);
    }

    #[test]
    fn a_pod_held_back_only_by_our_gate_counts_as_ready() {
        let gate = "eureka-operator.dev/registered";
        let pod: Pod = serde_saphyr::from_str(
            r#"
metadata: {name: web-0, namespace: shop}
spec:
  containers: [{name: web, image: web:1}]
  readinessGates: [{conditionType: eureka-operator.dev/registered}, {conditionType: other/gate}]
status:
  conditions:
  - {type: ContainersReady, status: "True"}
  - {type: Ready, status: "False"}
  - {type: other/gate, status: "True"}
"#,
        )
        .unwrap();
        let mut p = PodInfo::from_pod(&pod).unwrap();
        assert!(!p.ready && p.containers_ready && p.declares(gate) && !p.gate_open(gate));
        assert!(p.ready_for(Some(gate)));
        assert!(!p.ready_for(None), "without the gate option, Ready decides");
        p.gates[1].1 = false;
        assert!(!p.ready_for(Some(gate)), "another gate still holds it back");
        p.containers_ready = false;
        p.gates[1].1 = true;
        assert!(!p.ready_for(Some(gate)));
    }

    #[test]
    fn projects_only_what_is_needed() {
        let pod: Pod = serde_saphyr::from_str(
            r#"
metadata:
  name: web-0
  namespace: shop
  uid: u-1
  labels: {app: web}
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: "{}"
    team: blue
  deletionTimestamp: "2026-11-30T10:00:00Z"
  managedFields: [{manager: kubectl, operation: Apply}]
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d9, uid: r, controller: true}]
spec:
  nodeName: node-a
  serviceAccountName: web
  containers:
  - name: web
    image: web:1
    ports: [{name: http, containerPort: 8080}, {containerPort: 9090, protocol: UDP}]
status:
  phase: Running
  hostIP: 192.168.0.1
  podIP: 10.1.0.7
  podIPs: [{ip: 10.1.0.7}, {ip: "fd00::7"}]
  conditions: [{type: Ready, status: "True"}]
"#,
        )
        .unwrap();
        let p = PodInfo::from_pod(&pod).unwrap();
        assert_eq!(p.ips, vec!["10.1.0.7", "fd00::7"]);
        assert!(p.ready);
        assert!(p.ready_for(Some("eureka-operator.dev/registered")));
        assert_eq!(p.annotations.len(), 1);
        assert_eq!(
            p.ports[0],
            ContainerPort {
                name: Some("http".into()),
                port: 8080,
                protocol: "TCP".into()
            }
        );
        assert_eq!(&*p.ports[1].protocol, "UDP");
        assert_eq!(p.workload.as_deref(), Some("ReplicaSet/web-5d9"));
        assert_eq!(p.deleting_since, Some(1_796_032_800_000));
        assert_eq!(p.node_name.as_deref(), Some("node-a"));
        assert!(!p.finished());
    }

    #[test]
    fn pods_share_their_repeated_strings_and_churn_does_not_leak() {
        let mut interner = Interner::default();
        let pod = |name: &str, hash: &str, interner: &mut Interner| {
            let json = serde_json::json!({
                "metadata": {"name": name, "namespace": "shop", "labels": {"app": "web", "pod-template-hash": hash}},
                "spec": {"nodeName": "node-a", "containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1"},
            });
            PodInfo::from_watched(&serde_json::from_value(json).unwrap(), interner).unwrap()
        };
        let a = pod("web-1", "5d9", &mut interner);
        let b = pod("web-2", "5d9", &mut interner);
        assert!(Arc::ptr_eq(&a.namespace, &b.namespace));
        assert!(Arc::ptr_eq(
            a.node_name.as_ref().unwrap(),
            b.node_name.as_ref().unwrap()
        ));
        assert!(Arc::ptr_eq(&a.ports[0].protocol, &b.ports[0].protocol));
        assert_eq!(a.labels.get("pod-template-hash"), Some("5d9"));
        assert_eq!(a.labels.get("missing"), None);
        let held = interner.len();
        // Rollouts: each brings a new hash; the old ones go with their pods.
        for i in 0..3 * PRUNE_FLOOR {
            drop(pod("web-x", &format!("h{i}"), &mut interner));
        }
        assert!(
            interner.len() <= 2 * PRUNE_FLOOR,
            "{} strings held after churn",
            interner.len()
        );
        interner.prune();
        assert_eq!(interner.len(), held, "only what a live pod holds stays");
        drop((a, b));
        interner.prune();
        assert!(interner.is_empty());
    }

    #[test]
    fn labels_read_like_a_map() {
        let mut l: Labels = [("b", "2"), ("a", "1")].into_iter().collect();
        assert_eq!(l.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "2")]);
        l.insert("c", "3");
        l.insert("a", "0");
        assert_eq!(l.get("a"), Some("0"));
        assert_eq!(l.len(), 3);
    }
}
