//! Kubernetes writes, all gated on leadership: EurekaApp statuses (conditions, counts), the
//! finalizer, Events (rate-bounded), and the pod annotations that persist REST status overrides.
//!
//! Reconciles on every replica compute what should be written and hand it here; only the Lease
//! holder writes. The latest wish per object is kept, so a replica that becomes leader writes the
//! current state at once.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};

use super::{
    crd::{EurekaApp, EurekaAppStatus, FINALIZER, InstanceCounts, STATUS_OVERRIDE_ANNOTATION},
    index::{AppKey, Index},
};
use crate::registry::{PodOverride, instance::Status};

/// Whether the finalizer should be on the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finalizer {
    Ensure,
    Remove,
    Leave,
}

/// An Event to record on an EurekaApp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

/// What one reconcile wants written.
#[derive(Clone, Debug)]
pub struct Wish {
    pub key: AppKey,
    pub status: Option<EurekaAppStatus>,
    pub finalizer: Finalizer,
    pub notes: Vec<Note>,
}

/// A condition value to compute.
pub struct Cond {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

/// Builds conditions, keeping `lastTransitionTime` where the status did not change.
pub fn conditions(
    previous: &[Condition],
    wanted: Vec<Cond>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    wanted
        .into_iter()
        .map(|c| {
            let status = if c.ok { "True" } else { "False" }.to_string();
            let since = previous
                .iter()
                .find(|p| p.type_ == c.type_ && p.status == status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: c.type_.to_string(),
                status,
                reason: c.reason,
                message: c.message,
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// Counts instances by status.
pub fn counts(statuses: impl IntoIterator<Item = Status>) -> InstanceCounts {
    let mut c = InstanceCounts::default();
    for s in statuses {
        c.registered += 1;
        match s {
            Status::Up => c.up += 1,
            Status::Down => c.down += 1,
            Status::Starting => c.starting += 1,
            Status::OutOfService => c.out_of_service += 1,
            Status::Unknown => c.unknown += 1,
        }
    }
    c
}

/// Whether two statuses differ in more than their sync time.
fn differs(a: &EurekaAppStatus, b: &EurekaAppStatus) -> bool {
    let strip = |s: &EurekaAppStatus| EurekaAppStatus {
        last_sync_time: None,
        ..s.clone()
    };
    strip(a) != strip(b)
}

/// At most this many Events per EurekaApp and reason in [`NOTE_WINDOW`]; the rest are dropped
/// (and counted), so a flapping pod cannot flood the apiserver.
const NOTES_PER_WINDOW: usize = 5;
const NOTE_WINDOW: Duration = Duration::from_secs(60);

/// A sliding-window limit per (app, reason).
#[derive(Default)]
pub struct NoteLimiter {
    sent: HashMap<(AppKey, &'static str), VecDeque<tokio::time::Instant>>,
}

impl NoteLimiter {
    pub fn admit(&mut self, key: &AppKey, reason: &'static str, now: tokio::time::Instant) -> bool {
        let q = self.sent.entry((key.clone(), reason)).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= NOTE_WINDOW) {
            q.pop_front();
        }
        if q.len() >= NOTES_PER_WINDOW {
            return false;
        }
        q.push_back(now);
        true
    }
}

/// Counters of the writer.
#[derive(Clone, Default)]
pub struct WriterMetrics {
    pub status_writes: Counter,
    pub event_writes: Counter,
    pub events_dropped: Counter,
    pub writes_skipped_not_leader: Counter,
    pub write_errors: Counter,
}

impl WriterMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let r = registry.sub_registry_with_prefix("kubernetes");
        r.register("status_writes", "EurekaApp status patches", self.status_writes.clone());
        r.register("event_writes", "Kubernetes Events recorded", self.event_writes.clone());
        r.register(
            "events_dropped",
            "Events dropped by the rate limit",
            self.events_dropped.clone(),
        );
        r.register(
            "writes_skipped_not_leader",
            "Writes left to the leader",
            self.writes_skipped_not_leader.clone(),
        );
        r.register("write_errors", "Failed Kubernetes writes", self.write_errors.clone());
    }
}

/// The writer task's handle.
#[derive(Clone)]
pub struct Writer {
    wishes: mpsc::UnboundedSender<Wish>,
    overrides: mpsc::UnboundedSender<PodOverride>,
}

impl Writer {
    pub fn wish(&self, wish: Wish) {
        let _ = self.wishes.send(wish);
    }

    pub fn persist_override(&self, o: PodOverride) {
        let _ = self.overrides.send(o);
    }
}

struct Task {
    client: Client,
    recorder: Recorder,
    index: Arc<parking_lot::RwLock<Index>>,
    leader: watch::Receiver<bool>,
    metrics: WriterMetrics,
    limiter: NoteLimiter,
    /// The latest status wish per app, written when leading.
    pending: BTreeMap<AppKey, Wish>,
    /// What we last wrote, to skip identical patches.
    written: Mutex<HashMap<AppKey, EurekaAppStatus>>,
    /// REST overrides to record on pods, latest per pod, until written.
    overrides: BTreeMap<(String, String), PodOverride>,
}

/// Starts the writer; it runs until the process ends.
pub fn spawn(
    client: Client,
    reporter: Reporter,
    index: Arc<parking_lot::RwLock<Index>>,
    leader: watch::Receiver<bool>,
    metrics: WriterMetrics,
) -> Writer {
    let (wishes_tx, wishes) = mpsc::unbounded_channel();
    let (overrides_tx, overrides) = mpsc::unbounded_channel();
    let task = Task {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        index,
        leader,
        metrics,
        limiter: NoteLimiter::default(),
        pending: BTreeMap::new(),
        written: Mutex::new(HashMap::new()),
        overrides: BTreeMap::new(),
    };
    tokio::spawn(task.run(wishes, overrides));
    Writer {
        wishes: wishes_tx,
        overrides: overrides_tx,
    }
}

impl Task {
    async fn run(
        mut self,
        mut wishes: mpsc::UnboundedReceiver<Wish>,
        mut overrides: mpsc::UnboundedReceiver<PodOverride>,
    ) {
        loop {
            tokio::select! {
                wish = wishes.recv() => {
                    let Some(wish) = wish else { return };
                    self.take(wish).await;
                    // Drain what queued meanwhile, keeping only the latest per app.
                    while let Ok(w) = wishes.try_recv() {
                        self.take(w).await;
                    }
                    self.flush().await;
                }
                o = overrides.recv() => {
                    let Some(o) = o else { return };
                    // Kept until written: a replica that is not leading yet writes it once it is.
                    self.overrides.insert((o.owner.namespace.clone(), o.owner.pod.clone()), o);
                    self.flush_overrides().await;
                }
                changed = self.leader.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if *self.leader.borrow_and_update() {
                        tracing::info!(pending = self.pending.len(), "leading: writing the current statuses");
                        self.written.lock().clear();
                        self.flush().await;
                        self.flush_overrides().await;
                    }
                }
            }
        }
    }

    fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    async fn take(&mut self, wish: Wish) {
        // Events are moments: recorded now (if leading) or never.
        if !wish.notes.is_empty() {
            if self.leading() {
                self.record(&wish.key, &wish.notes).await;
            } else {
                self.metrics.writes_skipped_not_leader.inc_by(wish.notes.len() as u64);
            }
        }
        let mut wish = wish;
        wish.notes.clear();
        self.pending.insert(wish.key.clone(), wish);
    }

    async fn flush(&mut self) {
        if !self.leading() {
            self.metrics.writes_skipped_not_leader.inc_by(self.pending.len() as u64);
            return;
        }
        let pending: Vec<Wish> = self.pending.values().cloned().collect();
        for wish in pending {
            match self.write(&wish).await {
                Ok(()) => {
                    self.pending.remove(&wish.key);
                }
                Err(e) => {
                    self.metrics.write_errors.inc();
                    tracing::warn!(app = %wish.key, error = %e, "failed to write an EurekaApp");
                    // Not found: the object is gone, forget it. Otherwise retry on the next wish.
                    if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                        self.pending.remove(&wish.key);
                    }
                }
            }
        }
    }

    async fn write(&self, wish: &Wish) -> Result<(), kube::Error> {
        let api: Api<EurekaApp> = Api::namespaced(self.client.clone(), &wish.key.namespace);
        let current = self.index.read().snapshot(&wish.key).app;
        let Some(current) = current else { return Ok(()) };
        let finalizers = current.metadata.finalizers.clone().unwrap_or_default();
        let has = finalizers.iter().any(|f| f == FINALIZER);
        match wish.finalizer {
            Finalizer::Ensure if !has && current.metadata.deletion_timestamp.is_none() => {
                let mut next = finalizers.clone();
                next.push(FINALIZER.to_string());
                let patch = serde_json::json!({"metadata": {"finalizers": next, "resourceVersion": current.metadata.resource_version}});
                api.patch(&wish.key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Finalizer::Remove if has => {
                let next: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
                let patch = serde_json::json!({"metadata": {"finalizers": next, "resourceVersion": current.metadata.resource_version}});
                api.patch(&wish.key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                tracing::info!(app = %wish.key, "removed the finalizer");
            }
            _ => {}
        }
        if let Some(status) = &wish.status {
            let unchanged = current.status.as_ref().is_some_and(|s| !differs(s, status))
                || self.written.lock().get(&wish.key).is_some_and(|s| !differs(s, status));
            if !unchanged && wish.finalizer != Finalizer::Remove {
                let patch = serde_json::json!({"status": status});
                api.patch_status(&wish.key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                self.metrics.status_writes.inc();
                self.written.lock().insert(wish.key.clone(), status.clone());
            }
        }
        Ok(())
    }

    async fn record(&mut self, key: &AppKey, notes: &[Note]) {
        let Some(app) = self.index.read().snapshot(key).app else {
            return;
        };
        let reference = app.object_ref(&());
        for note in notes {
            if !self.limiter.admit(key, note.reason, tokio::time::Instant::now()) {
                self.metrics.events_dropped.inc();
                continue;
            }
            let event = Event {
                type_: if note.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: note.reason.to_string(),
                note: Some(note.message.chars().take(1024).collect()),
                action: note.action.to_string(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => {
                    self.metrics.event_writes.inc();
                }
                Err(e) => {
                    self.metrics.write_errors.inc();
                    tracing::warn!(app = %key, error = %e, "failed to record an Event");
                }
            }
        }
    }

    /// Writes the pending pod annotations, when leading.
    async fn flush_overrides(&mut self) {
        if !self.leading() {
            self.metrics.writes_skipped_not_leader.inc();
            return;
        }
        for (key, o) in std::mem::take(&mut self.overrides) {
            if !self.persist_override(&o).await {
                self.overrides.insert(key, o);
            }
        }
    }

    /// Records (or clears) a REST status override on the pod, so every replica and every restart
    /// sees it. `false` when it should be tried again.
    async fn persist_override(&self, o: &PodOverride) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &o.owner.namespace);
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
                self.metrics.write_errors.inc();
                tracing::warn!(pod = %o.owner.pod, error = %e, "failed to persist a status override");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = conditions(
            &[],
            vec![Cond {
                type_: "Ready",
                ok: true,
                reason: "R".into(),
                message: "m".into(),
            }],
            Some(1),
            t0,
        );
        let same = conditions(
            &first,
            vec![Cond {
                type_: "Ready",
                ok: true,
                reason: "R".into(),
                message: "m2".into(),
            }],
            Some(2),
            t1,
        );
        assert_eq!(same[0].last_transition_time, Time(t0));
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = conditions(
            &same,
            vec![Cond {
                type_: "Ready",
                ok: false,
                reason: "R".into(),
                message: "m".into(),
            }],
            Some(2),
            t1,
        );
        assert_eq!(flipped[0].last_transition_time, Time(t1));
        assert_eq!(flipped[0].status, "False");
    }

    #[test]
    fn counts_by_status() {
        let c = counts([Status::Up, Status::Up, Status::OutOfService, Status::Starting]);
        assert_eq!(
            (c.registered, c.up, c.out_of_service, c.starting, c.down),
            (4, 2, 1, 1, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn notes_are_rate_bounded_per_app_and_reason() {
        let mut l = NoteLimiter::default();
        let key = AppKey {
            namespace: "a".into(),
            name: "b".into(),
        };
        let t0 = tokio::time::Instant::now();
        for _ in 0..NOTES_PER_WINDOW {
            assert!(l.admit(&key, "Registered", t0));
        }
        assert!(!l.admit(&key, "Registered", t0));
        assert!(l.admit(&key, "Deregistered", t0), "reasons are limited separately");
        assert!(l.admit(&key, "Registered", t0 + NOTE_WINDOW));
    }
}
