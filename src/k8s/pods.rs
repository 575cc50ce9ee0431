//! The compact projection of a Pod that the operator keeps: identity, labels, the annotations
//! worth keeping, addresses, readiness, termination, container ports and owner. Whole Pod objects
//! (specs, managedFields, statuses) are never stored.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// Annotations never kept (large and useless as metadata).
const DROPPED_ANNOTATIONS: [&str; 1] = ["kubectl.kubernetes.io/last-applied-configuration"];
/// Annotation values longer than this are not kept.
const MAX_ANNOTATION_LEN: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub port: i32,
    pub protocol: String,
}

/// What the operator knows of a Pod.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `status.podIPs` (or `status.podIP`).
    pub ips: Vec<String>,
    pub host_ip: Option<String>,
    pub node_name: Option<String>,
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
    pub phase: Option<String>,
    /// When deletion was requested, in milliseconds: `deletionTimestamp` (the moment the pod may
    /// be killed) minus `deletionGracePeriodSeconds`.
    pub deleting_since: Option<i64>,
    pub ports: Vec<ContainerPort>,
    pub service_account: Option<String>,
    /// `Kind/name` of the controlling owner.
    pub workload: Option<String>,
}

impl PodInfo {
    /// Projects a Pod; `None` without a name or namespace.
    pub fn from_pod(pod: &Pod) -> Option<PodInfo> {
        let meta = &pod.metadata;
        let name = meta.name.clone()?;
        let namespace = meta.namespace.clone()?;
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
        let annotations = meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, v)| !DROPPED_ANNOTATIONS.contains(&k.as_str()) && v.len() <= MAX_ANNOTATION_LEN)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let ports = spec
            .map(|s| {
                s.containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .map(|p| ContainerPort {
                        name: p.name.clone(),
                        port: p.container_port,
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
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
            .map(|o| format!("{}/{}", o.kind, o.name));
        Some(PodInfo {
            namespace,
            name,
            uid: meta.uid.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations,
            ips,
            host_ip: status.and_then(|s| s.host_ip.clone()),
            node_name: spec.and_then(|s| s.node_name.clone()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            hostname: spec.and_then(|s| s.hostname.clone()),
            subdomain: spec.and_then(|s| s.subdomain.clone()),
            ready,
            containers_ready: condition("ContainersReady"),
            gates,
            phase: status.and_then(|s| s.phase.clone()),
            deleting_since: meta.deletion_timestamp.as_ref().map(|t| {
                let grace_ms = meta
                    .deletion_grace_period_seconds
                    .unwrap_or(0)
                    .max(0)
                    .saturating_mul(1000);
                t.0.as_millisecond().saturating_sub(grace_ms)
            }),
            ports,
            service_account: spec.and_then(|s| s.service_account_name.clone()),
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
        assert_eq!(p.ports[1].protocol, "UDP");
        assert_eq!(p.workload.as_deref(), Some("ReplicaSet/web-5d9"));
        assert_eq!(p.deleting_since, Some(1_796_032_800_000));
        assert_eq!(p.node_name.as_deref(), Some("node-a"));
        assert!(!p.finished());
    }
}
