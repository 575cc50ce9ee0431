//! Readiness gates: which pods wait for their instance, and the leader's check that every ready
//! replica holds it UP before the gate's condition is set on the pod.

use super::*;

/// The pods of one EurekaApp waiting for its readiness gate.
pub(super) struct Gated {
    pub(super) gate: ReadinessGate,
    /// (pod, app, instance id) of each pod whose instance is UP here and whose gate is closed.
    pub(super) waiting: Vec<(String, String, String)>,
}

/// The pods whose `gate` is closed while their instance is UP here (the leader then asks the
/// other replicas).
pub(super) fn gate_waiting(
    gate: &ReadinessGate,
    plan: &Plan,
    pods: &[Arc<PodInfo>],
    instances: &[(PodOwner, InstanceView)],
) -> Vec<(String, String, String)> {
    let up: HashSet<&str> = instances
        .iter()
        .filter(|(_, v)| v.info.status == crate::registry::instance::Status::Up)
        .map(|(_, v)| v.id())
        .collect();
    plan.desired
        .iter()
        .filter(|d| up.contains(d.info.id()))
        .filter(|d| {
            pods.iter().any(|p| {
                *p.name == *d.owner.pod && p.declares(&gate.condition_type) && !p.gate_open(&gate.condition_type)
            })
        })
        .map(|d| (d.owner.pod.clone(), d.info.app.clone(), d.info.id().to_string()))
        .collect()
}

/// As [`gate_waiting`] for an adopting EurekaApp: the gated pods whose adopted registration is
/// UP here (a pod's claim shows the client's status once its containers are ready and only the
/// gate is missing).
pub(super) fn adopted_gate_waiting(
    gate: &ReadinessGate,
    pods: &[Arc<PodInfo>],
    adopted: &[(PodOwner, InstanceView)],
) -> Vec<(String, String, String)> {
    adopted
        .iter()
        .filter(|(_, v)| v.info.status == crate::registry::instance::Status::Up)
        .filter(|(o, _)| {
            pods.iter()
                .any(|p| *p.name == *o.pod && p.declares(&gate.condition_type) && !p.gate_open(&gate.condition_type))
        })
        .map(|(o, v)| (o.pod.clone(), v.info.app.clone(), v.id().to_string()))
        .collect()
}

impl Context {
    /// Opens the gate of every waiting pod whose instance every ready replica holds UP, once the
    /// gate's delay has passed; returns when to look again while some still wait.
    pub(super) async fn open_gates(&self, key: &AppKey, gated: &Gated) -> Option<Duration> {
        const RECHECK: Duration = Duration::from_millis(500);
        let replicas: Vec<Peer> = self
            .peers
            .borrow()
            .iter()
            .filter(|p| p.kind == PeerKind::Replica && p.ready)
            .cloned()
            .collect();
        let delay = if crate::mutants::on("gate-opens-early") {
            Duration::ZERO
        } else {
            Duration::from_secs(gated.gate.delay_seconds.max(0) as u64)
        };
        let mut again: Option<Duration> = None;
        let mut soonest = |d: Duration| again = Some(again.map_or(d, |a| a.min(d)));
        for (pod, app, id) in &gated.waiting {
            let mut everywhere = true;
            for peer in &replicas {
                let status = self.peer_client.instance_status(&peer.url, app, id).await;
                if !matches!(status.as_ref().map(|s| s.as_deref()), Ok(Some("UP"))) {
                    everywhere = false;
                    break;
                }
            }
            if !everywhere {
                soonest(RECHECK);
                continue;
            }
            let since = *self
                .gates_confirmed
                .lock()
                .entry((key.namespace.clone(), pod.clone()))
                .or_insert_with(std::time::Instant::now);
            let waited = since.elapsed();
            if waited < delay {
                soonest(delay - waited);
                continue;
            }
            match self
                .set_gate(&key.namespace, pod, &gated.gate.condition_type, replicas.len())
                .await
            {
                Ok(()) => {
                    self.gates_confirmed
                        .lock()
                        .remove(&(key.namespace.clone(), pod.clone()));
                    self.metrics.gates_opened.inc();
                }
                Err(e) => {
                    self.metrics.write_errors.inc();
                    tracing::warn!(pod = %pod, error = %e, "failed to open a readiness gate; retrying");
                    soonest(RECHECK);
                }
            }
        }
        again
    }

    /// Sets the pod's readiness-gate condition True (the status subresource, merged by type).
    pub(super) async fn set_gate(
        &self,
        namespace: &str,
        pod: &str,
        condition: &str,
        replicas: usize,
    ) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": condition,
            "status": "True",
            "reason": "InstanceRegistered",
            "message": format!("the instance is UP on this replica and {replicas} other ready replica(s)"),
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        }]}});
        api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        tracing::info!(pod, namespace, condition, "opened the readiness gate");
        Ok(())
    }
}
