//! Persists REST status overrides on pod instances as the pod annotation
//! `eureka-operator.dev/status-override`, so they survive restarts and reach every replica.
//!
//! Only the Lease holder writes, and what it writes comes from its registry at the moment of
//! writing (the pod instances whose REST override the annotation does not show yet), never from a
//! queue of old requests: a follower that took a REST call replicates it to the leader, which
//! writes it. The registry forgets a pending REST override as soon as the annotation changes for
//! any reason, so a later `kubectl annotate` is never undone by a replica that becomes leader
//! afterwards: the annotation stays the truth across failovers. Failed writes are retried with
//! backoff until they succeed or the override is no longer pending.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;

use super::crd::STATUS_OVERRIDE_ANNOTATION;
use crate::{
    registry::{Outcome, PodOverride},
    state::{AppState, OutcomeListener},
    supervisor::Shutdown,
};

/// Wakes the persister when a write records a REST override on a pod instance.
pub struct Waker(pub Arc<Notify>);

impl OutcomeListener for Waker {
    fn on_outcome(&self, outcome: &Outcome) {
        if outcome.pod_override.is_some() {
            self.0.notify_one();
        }
    }
}

/// Counters of the persister.
#[derive(Clone, Default)]
pub struct OverrideMetrics {
    pub writes: Counter,
    pub errors: Counter,
}

impl OverrideMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let r = registry.sub_registry_with_prefix("status_override_annotations");
        r.register("writes", "REST overrides recorded on pods", self.writes.clone());
        r.register("errors", "Failed writes (retried with backoff)", self.errors.clone());
    }
}

/// Runs until shutdown. See the module docs.
pub async fn run(
    client: Client,
    state: AppState,
    mut leader: crate::leadership::Leader,
    wake: Arc<Notify>,
    max_backoff: Duration,
    metrics: OverrideMetrics,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let stop = shutdown.wait();
    tokio::pin!(stop);
    let mut failures: u32 = 0;
    loop {
        let retry = (failures > 0).then(|| {
            Duration::from_millis(500)
                .saturating_mul(1 << (failures - 1).min(16))
                .min(max_backoff)
        });
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = wake.notified() => {}
            changed = leader.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            _ = tokio::time::sleep(retry.unwrap_or(Duration::MAX)), if retry.is_some() => {}
        }
        if !leader.borrow_and_update().holds() {
            failures = 0;
            continue;
        }
        let pending = state.with_registry(|r, _| r.pending_pod_overrides());
        let mut failed = false;
        for o in &pending {
            if persist(&client, o).await {
                metrics.writes.inc();
            } else {
                metrics.errors.inc();
                failed = true;
            }
        }
        failures = if failed { failures.saturating_add(1) } else { 0 };
    }
}

/// Records (or clears) one REST override on its pod. `false` when it should be tried again.
async fn persist(client: &Client, o: &PodOverride) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), &o.owner.namespace);
    let value = o.status.map(|s| s.as_str());
    let patch = serde_json::json!({"metadata": {"annotations": {STATUS_OVERRIDE_ANNOTATION: value}}});
    match api
        .patch(&o.owner.pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %o.owner.pod, namespace = %o.owner.namespace, status = ?value, "persisted a status override");
            true
        }
        // The pod is gone: nothing to remember it on.
        Err(kube::Error::Api(s)) if s.code == 404 => true,
        Err(e) => {
            tracing::warn!(pod = %o.owner.pod, error = %e, "failed to persist a status override; retrying");
            false
        }
    }
}
