//! The compact projection of a Pod that the operator keeps: identity, labels, the annotations
//! worth keeping, addresses, readiness, termination, container ports and owner. Whole Pod objects
//! (specs, managedFields, statuses) are never stored, nor even built: the watch reads pods as
//! [`WatchedPod`], which deserializes only the fields the projection reads and skips the rest of
//! the JSON (managedFields, most of spec and status) without allocating for it.
//!
//! The strings pods repeat (namespaces, label keys and values, node names, owners, ports) are
//! shared through an [`Interner`], and labels are one key-sorted allocation ([`Labels`]): a
//! watched pod costs about 800 bytes of heap (`cargo bench --bench controller_memory`).

mod memory;
mod wire;

pub use memory::{Interner, Labels, Text, Uid};
pub use wire::{
    WatchedCondition, WatchedContainer, WatchedGate, WatchedIp, WatchedPod, WatchedPort, WatchedSpec, WatchedStatus,
};

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use compact_str::CompactString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

/// Annotations never kept (large and useless as metadata).
const DROPPED_ANNOTATIONS: [&str; 1] = ["kubectl.kubernetes.io/last-applied-configuration"];
/// Annotation values longer than this are not kept.
const MAX_ANNOTATION_LEN: usize = 1024;

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
    pub ips: Vec<CompactString>,
    pub host_ip: Option<Text>,
    pub node_name: Option<Text>,
    pub host_network: bool,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// The `ContainersReady` condition is `True`.
    pub containers_ready: bool,
    /// When the pod became ready, in milliseconds (whole seconds, as the apiserver stores it):
    /// the `lastTransitionTime` of `Ready` if it is True, else of `ContainersReady` if that is
    /// (a pod held back by a readiness gate). What `eureka_controller_pod_ready_to_up_seconds`
    /// measures from.
    pub ready_since: Option<i64>,
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
        let mut ips: Vec<CompactString> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|v| v.iter().map(|ip| ip.ip.as_str().into()).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref())
        {
            ips.push(ip.into());
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
        let since = |type_: &str| {
            status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == type_ && c.status == "True"))
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.as_millisecond())
        };
        let ready_since = since("Ready").or_else(|| since("ContainersReady"));
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
            ready_since,
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
    use super::{memory::PRUNE_FLOOR, *};

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
        assert_eq!(p.ready_since, Some(1_796_032_800_000), "2026-11-30T10:00:00Z");
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
