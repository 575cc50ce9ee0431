//! The EurekaApp controller: watches Pods, EurekaApps and Nodes into the [`Index`], and reconciles
//! each affected EurekaApp as soon as something changes: plan (pure) → registry commands → a
//! status wish for the leader-gated writer. There is no periodic re-registration; the only timers
//! are the drain deadlines of terminating pods, and an instance id held by someone else is tried
//! again when its holder's instance is cancelled or evicted ([`ConflictWaker`]).
//!
//! Every replica runs it (each derives the pod instances of its own registry); nothing is removed
//! before every watch has listed once.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PartialObjectMeta},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event, watcher},
    },
};
use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};
use tokio::sync::Notify;

use super::{
    crd::{EurekaApp, EurekaAppStatus},
    index::{AppKey, Index},
    plan::{self, Context, Target},
    pods::PodInfo,
    status::{self, Cond, Finalizer, Note, Wish},
};
use crate::{
    registry::{Command, PodOwner, Reply},
    state::{AppState, OutcomeListener, Writer as WriteSource},
};

/// The node label that gives instances their `zone`.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Settings of the controller.
#[derive(Clone, Debug)]
pub struct Settings {
    pub cluster_id: String,
    pub cluster_domain: String,
    /// Namespaces to watch; all when empty.
    pub namespaces: Vec<String>,
}

/// A de-duplicating work queue of EurekaApps, with delayed re-checks.
#[derive(Default)]
pub struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    order: VecDeque<AppKey>,
    queued: HashSet<AppKey>,
    /// The earliest pending delayed look per app.
    delayed: HashMap<AppKey, tokio::time::Instant>,
}

impl Queue {
    pub fn push(&self, key: AppKey) {
        let mut s = self.state.lock();
        if s.queued.insert(key.clone()) {
            s.order.push_back(key);
            self.notify.notify_one();
        }
    }

    pub fn push_all(&self, keys: impl IntoIterator<Item = AppKey>) {
        for k in keys {
            self.push(k);
        }
    }

    /// Looks at `key` again at `at` (the earliest of several requests wins).
    pub fn push_at(self: &Arc<Self>, key: AppKey, at: tokio::time::Instant) {
        {
            let mut s = self.state.lock();
            if s.delayed.get(&key).is_some_and(|t| *t <= at) {
                return;
            }
            s.delayed.insert(key.clone(), at);
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let due = {
                let mut s = queue.state.lock();
                if s.delayed.get(&key) == Some(&at) {
                    s.delayed.remove(&key);
                    true
                } else {
                    false
                }
            };
            if due {
                queue.push(key);
            }
        });
    }

    pub async fn pop(&self) -> AppKey {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.state.lock();
                if let Some(k) = s.order.pop_front() {
                    s.queued.remove(&k);
                    return k;
                }
            }
            notified.await;
        }
    }
}

/// Controller metrics.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_seconds: Histogram,
    pub indexed_pods: Gauge,
    pub watch_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Counter::default(),
            reconcile_seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.000_05, 2.0, 16,
            )),
            indexed_pods: Gauge::default(),
            watch_errors: Counter::default(),
        }
    }
}

impl Metrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let r = registry.sub_registry_with_prefix("controller");
        r.register("reconciles", "EurekaApp reconciles", self.reconciles.clone());
        r.register(
            "reconcile_duration_seconds",
            "Time per reconcile",
            self.reconcile_seconds.clone(),
        );
        r.register(
            "indexed_pods",
            "Pods held as compact projections",
            self.indexed_pods.clone(),
        );
        r.register(
            "watch_errors",
            "Watch errors (retried with backoff)",
            self.watch_errors.clone(),
        );
    }
}

/// The running controller's shared parts.
pub struct Controller {
    pub state: AppState,
    pub index: Arc<RwLock<Index>>,
    pub queue: Arc<Queue>,
    pub writer: status::Writer,
    pub settings: Settings,
    pub metrics: Metrics,
    /// Problems reported last time per app, so Events are sent for new ones only.
    reported: Mutex<HashMap<AppKey, BTreeSet<String>>>,
    /// Set once every watch has listed (readiness).
    synced: Arc<std::sync::atomic::AtomicBool>,
    /// Per EurekaApp, the (app, instance id) pairs its pods could not take.
    blocked: Arc<Mutex<BlockedIds>>,
}

/// Per EurekaApp, the (app, instance id) pairs its pods could not take.
type BlockedIds = HashMap<AppKey, HashSet<(String, String)>>;

/// Looks at a EurekaApp again when an instance id one of its pods could not take (a conflict) is
/// cancelled or evicted, so the pod registers as soon as the id is free.
pub struct ConflictWaker {
    blocked: Arc<Mutex<BlockedIds>>,
    queue: Arc<Queue>,
}

impl OutcomeListener for ConflictWaker {
    fn on_outcome(&self, outcome: &crate::registry::Outcome, _: &WriteSource) {
        let mut freed = outcome
            .replicate
            .iter()
            .filter(|r| r.action == crate::registry::Action::Cancel)
            .peekable();
        if freed.peek().is_none() {
            return;
        }
        let blocked = self.blocked.lock();
        if blocked.is_empty() {
            return;
        }
        for r in freed {
            let id = (r.app.clone(), r.id.clone());
            for (key, ids) in blocked.iter() {
                if ids.contains(&id) {
                    self.queue.push(key.clone());
                }
            }
        }
    }
}

/// Hands REST status overrides on pod instances to the writer, which records them on the pod.
pub struct OverridePersister(pub status::Writer);

impl OutcomeListener for OverridePersister {
    fn on_outcome(&self, outcome: &crate::registry::Outcome, _: &WriteSource) {
        if let Some(o) = &outcome.pod_override {
            self.0.persist_override(o.clone());
        }
    }
}

fn api_for<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    }
}

/// Merges one watch per namespace into one stream of events.
fn watch_all<K>(apis: Vec<Api<K>>) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    futures::stream::select_all(
        apis.into_iter()
            .map(|api| watcher(api, watcher::Config::default()).default_backoff().boxed()),
    )
    .boxed()
}

impl Controller {
    pub fn new(
        state: AppState,
        writer: status::Writer,
        settings: Settings,
        metrics: Metrics,
        index: Arc<RwLock<Index>>,
        synced: Arc<std::sync::atomic::AtomicBool>,
    ) -> Arc<Controller> {
        Arc::new(Controller {
            synced,
            state,
            index,
            queue: Arc::new(Queue::default()),
            writer,
            settings,
            metrics,
            reported: Mutex::new(HashMap::new()),
            blocked: Arc::default(),
        })
    }

    /// The listener that retries conflicts; register it with [`AppState::add_listener`].
    pub fn conflict_waker(&self) -> Arc<ConflictWaker> {
        Arc::new(ConflictWaker {
            blocked: self.blocked.clone(),
            queue: self.queue.clone(),
        })
    }

    /// Remembers the ids `key`'s pods could not take; if one was freed meanwhile (between the
    /// refusal and now), looks again at once.
    fn set_blocked(&self, key: &AppKey, ids: HashSet<(String, String)>) {
        if ids.is_empty() {
            self.blocked.lock().remove(key);
            return;
        }
        self.blocked.lock().insert(key.clone(), ids.clone());
        let freed = self
            .state
            .with_registry(|r, _| ids.iter().any(|(app, id)| !r.contains(app, id)));
        if freed {
            self.queue.push(key.clone());
        }
    }

    /// Runs the watches and the reconciler until the process ends.
    pub async fn run(self: Arc<Self>, client: Client) {
        let pods = self
            .clone()
            .watch_pods(watch_all(api_for::<Pod>(&client, &self.settings.namespaces)));
        let apps = self
            .clone()
            .watch_apps(watch_all(api_for::<EurekaApp>(&client, &self.settings.namespaces)));
        let nodes = self.clone().watch_nodes(
            watcher(
                Api::<PartialObjectMeta<Node>>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .boxed(),
        );
        let reconciler = self.clone().reconcile_loop();
        tokio::join!(pods, apps, nodes, reconciler);
    }

    async fn watch_pods(self: Arc<Self>, stream: impl Stream<Item = Result<Event<Pod>, watcher::Error>>) {
        let mut buffer: Vec<PodInfo> = Vec::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let keys = match event {
                Ok(Event::Apply(pod)) => PodInfo::from_pod(&pod).map(|p| self.index.write().apply_pod(p)),
                Ok(Event::Delete(pod)) => match (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) {
                    (Some(ns), Some(name)) => Some(self.index.write().delete_pod(ns, name)),
                    _ => None,
                },
                Ok(Event::Init) => {
                    buffer.clear();
                    None
                }
                Ok(Event::InitApply(pod)) => {
                    buffer.extend(PodInfo::from_pod(&pod));
                    None
                }
                Ok(Event::InitDone) => Some(self.index.write().reset_pods(std::mem::take(&mut buffer))),
                Err(e) => {
                    self.metrics.watch_errors.inc();
                    tracing::warn!(error = %e, "pod watch failed; retrying");
                    None
                }
            };
            self.metrics.indexed_pods.set(self.index.read().pod_count() as i64);
            self.enqueue(keys.into_iter().flatten());
        }
    }

    async fn watch_apps(self: Arc<Self>, stream: impl Stream<Item = Result<Event<EurekaApp>, watcher::Error>>) {
        let mut buffer: Vec<EurekaApp> = Vec::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let keys = match event {
                Ok(Event::Apply(app)) => self.index.write().apply_app(app),
                Ok(Event::Delete(app)) => self.index.write().delete_app(&app),
                Ok(Event::Init) => {
                    buffer.clear();
                    Vec::new()
                }
                Ok(Event::InitApply(app)) => {
                    buffer.push(app);
                    Vec::new()
                }
                Ok(Event::InitDone) => self.index.write().reset_apps(std::mem::take(&mut buffer)),
                Err(e) => {
                    self.metrics.watch_errors.inc();
                    tracing::warn!(error = %e, "EurekaApp watch failed (is the CRD installed?); retrying");
                    Vec::new()
                }
            };
            self.enqueue(keys);
        }
    }

    async fn watch_nodes(
        self: Arc<Self>,
        stream: impl Stream<Item = Result<Event<PartialObjectMeta<Node>>, watcher::Error>>,
    ) {
        let zone = |m: &ObjectMeta| m.labels.as_ref().and_then(|l| l.get(ZONE_LABEL).cloned());
        let mut buffer: BTreeMap<String, String> = BTreeMap::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let keys = match event {
                Ok(Event::Apply(n)) => match &n.metadata.name {
                    Some(name) => self.index.write().set_zone(name, zone(&n.metadata)),
                    None => Vec::new(),
                },
                Ok(Event::Delete(n)) => match &n.metadata.name {
                    Some(name) => self.index.write().set_zone(name, None),
                    None => Vec::new(),
                },
                Ok(Event::Init) => {
                    buffer.clear();
                    Vec::new()
                }
                Ok(Event::InitApply(n)) => {
                    if let (Some(name), Some(z)) = (n.metadata.name.clone(), zone(&n.metadata)) {
                        buffer.insert(name, z);
                    }
                    Vec::new()
                }
                Ok(Event::InitDone) => self.index.write().reset_zones(std::mem::take(&mut buffer)),
                Err(e) => {
                    self.metrics.watch_errors.inc();
                    tracing::warn!(error = %e, "node watch failed; retrying");
                    Vec::new()
                }
            };
            self.enqueue(keys);
        }
    }

    /// Queues the affected apps, and notes when every watch has listed once.
    fn enqueue(&self, keys: impl IntoIterator<Item = AppKey>) {
        if !self.synced.load(std::sync::atomic::Ordering::Acquire) && self.index.read().synced() {
            tracing::info!(
                pods = self.index.read().pod_count(),
                "every watch has listed: reconciling"
            );
            self.synced.store(true, std::sync::atomic::Ordering::Release);
        }
        self.queue.push_all(keys);
    }

    async fn reconcile_loop(self: Arc<Self>) {
        loop {
            let key = self.queue.pop().await;
            if !self.index.read().synced() {
                // Nothing is decided before every watch has listed once; InitDone re-queues all.
                continue;
            }
            let started = Instant::now();
            self.reconcile(&key);
            self.metrics.reconciles.inc();
            self.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        }
    }

    /// Brings the registry's pod instances of one EurekaApp in line with its pods.
    pub fn reconcile(&self, key: &AppKey) {
        let snapshot = self.index.read().snapshot(key);
        let now = self.state.now();
        let current: Vec<(PodOwner, _)> = self
            .state
            .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name));
        let Some(app) = snapshot.app else {
            // The EurekaApp is gone: so are its instances.
            let n = self.remove(&current);
            if n > 0 {
                tracing::info!(app = %key, removed = n, "deregistered the instances of a deleted EurekaApp");
            }
            self.reported.lock().remove(key);
            self.set_blocked(key, HashSet::new());
            return;
        };
        if app.metadata.deletion_timestamp.is_some() || app.spec.suspend {
            let n = self.remove(&current);
            self.set_blocked(key, HashSet::new());
            let deleting = app.metadata.deletion_timestamp.is_some();
            let mut notes = Vec::new();
            if n > 0 {
                notes.push(Note {
                    warning: false,
                    reason: "Deregistered",
                    action: "Deregister",
                    message: format!(
                        "deregistered {n} instances ({})",
                        if deleting { "deleted" } else { "suspended" }
                    ),
                });
            }
            let status = (!deleting).then(|| self.suspended_status(&app, now));
            self.writer.wish(Wish {
                key: key.clone(),
                status,
                finalizer: if deleting { Finalizer::Remove } else { Finalizer::Ensure },
                notes,
            });
            return;
        }

        let target = Target {
            namespace: &key.namespace,
            name: &key.name,
            spec: &app.spec,
        };
        let ctx = Context {
            cluster_id: &self.settings.cluster_id,
            cluster_domain: &self.settings.cluster_domain,
            node_zones: &snapshot.zones,
            now,
        };
        let plan = plan::plan(&target, snapshot.pods.iter().map(|p| p.as_ref()), &ctx);

        let mut registered = Vec::new();
        let mut conflicts = Vec::new();
        let mut blocked = HashSet::new();
        let wanted: HashSet<(String, String)> = plan
            .desired
            .iter()
            .map(|d| (d.info.app.clone(), d.info.id().to_string()))
            .collect();
        for d in &plan.desired {
            let id = d.info.id().to_string();
            let outcome = self.state.apply(
                Command::UpsertPod {
                    info: d.info.clone(),
                    owner: d.owner.clone(),
                    overrides: d.overrides,
                },
                WriteSource::Controller,
            );
            match outcome.reply {
                Reply::Registered => registered.push(id),
                Reply::Refused(message) => {
                    conflicts.push(message);
                    blocked.insert((d.info.app.clone(), id));
                }
                _ => {}
            }
        }
        let stale: Vec<_> = current
            .iter()
            .filter(|(_, v)| !wanted.contains(&(v.info.app.clone(), v.id().to_string())))
            .map(|(o, v)| (o.clone(), v.clone()))
            .collect();
        let removed = self.remove(&stale);
        self.set_blocked(key, blocked);
        if let Some(at) = plan.wake_at {
            let delay = Duration::from_millis((at - now).max(0) as u64 + 5);
            self.queue.push_at(key.clone(), tokio::time::Instant::now() + delay);
        }

        // Status and Events.
        let instances: Vec<_> = self
            .state
            .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name));
        let mut notes = Vec::new();
        if !registered.is_empty() {
            notes.push(Note {
                warning: false,
                reason: "Registered",
                action: "Register",
                message: format!(
                    "registered {} instance(s) of {}: {}",
                    registered.len(),
                    plan.app_name,
                    registered.join(", ")
                ),
            });
        }
        if removed > 0 {
            notes.push(Note {
                warning: false,
                reason: "Deregistered",
                action: "Deregister",
                message: format!("deregistered {removed} instance(s) of {}", plan.app_name),
            });
        }
        let problems: BTreeSet<String> = plan
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.reason(), p.message()))
            .chain(conflicts.iter().map(|c| format!("InstanceIdConflict: {c}")))
            .chain(plan.invalid.iter().map(|i| format!("InvalidSpec: {i}")))
            .collect();
        {
            let mut reported = self.reported.lock();
            let before = reported.entry(key.clone()).or_default();
            for p in problems.difference(before) {
                let (reason, message) = p.split_once(": ").unwrap_or(("Problem", p));
                let reason: &'static str = match reason {
                    "PortNotFound" => "PortNotFound",
                    "NoAddress" => "NoAddress",
                    "BadOverrideAnnotation" => "BadOverrideAnnotation",
                    "InstanceIdConflict" => "InstanceIdConflict",
                    _ => "InvalidSpec",
                };
                notes.push(Note {
                    warning: true,
                    reason,
                    action: "Reconcile",
                    message: message.to_string(),
                });
            }
            *before = problems;
        }
        let status = self.status(&app, &plan, &conflicts, &instances, now);
        self.writer.wish(Wish {
            key: key.clone(),
            status: Some(status),
            finalizer: Finalizer::Ensure,
            notes,
        });
    }

    /// Deregisters the given pod instances; returns how many went.
    fn remove(&self, instances: &[(PodOwner, crate::registry::view::InstanceView)]) -> usize {
        let mut n = 0;
        for (owner, view) in instances {
            let outcome = self.state.apply(
                Command::RemovePod {
                    app: view.info.app.clone(),
                    id: view.id().to_string(),
                    owner: owner.clone(),
                },
                WriteSource::Controller,
            );
            if outcome.reply == Reply::Ok {
                n += 1;
            }
        }
        n
    }

    fn status(
        &self,
        app: &EurekaApp,
        plan: &plan::Plan,
        conflicts: &[String],
        instances: &[(PodOwner, crate::registry::view::InstanceView)],
        now: i64,
    ) -> EurekaAppStatus {
        let previous = app.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
        let counts = status::counts(instances.iter().map(|(_, v)| v.info.status));
        let degraded_reasons: Vec<String> = plan
            .problems
            .iter()
            .map(|p| p.message())
            .chain(plan.invalid.iter().cloned())
            .collect();
        let wanted = plan.desired.len();
        let ready = plan.invalid.is_none() && degraded_reasons.is_empty() && conflicts.is_empty();
        let ready_message = format!(
            "{} of {} selected pods registered as {} ({} UP)",
            counts.registered, plan.selected, plan.app_name, counts.up
        );
        let conds = vec![
            Cond {
                type_: "Ready",
                ok: ready && counts.registered as usize >= wanted,
                reason: if plan.invalid.is_some() {
                    "InvalidSpec".into()
                } else if !conflicts.is_empty() {
                    "Conflict".into()
                } else if !degraded_reasons.is_empty() {
                    "Degraded".into()
                } else {
                    "InstancesRegistered".into()
                },
                message: ready_message,
            },
            Cond {
                type_: "Degraded",
                ok: !degraded_reasons.is_empty(),
                reason: plan
                    .invalid
                    .as_ref()
                    .map(|_| "InvalidSpec".to_string())
                    .or_else(|| plan.problems.first().map(|p| p.reason().to_string()))
                    .unwrap_or_else(|| "AsExpected".into()),
                message: if degraded_reasons.is_empty() {
                    "no problems".into()
                } else {
                    degraded_reasons.join("; ")
                },
            },
            Cond {
                type_: "Conflict",
                ok: !conflicts.is_empty(),
                reason: if conflicts.is_empty() {
                    "NoConflict".into()
                } else {
                    "InstanceIdConflict".into()
                },
                message: if conflicts.is_empty() {
                    "no instance id conflicts".into()
                } else {
                    conflicts.join("; ")
                },
            },
        ];
        let ts = Timestamp::from_millisecond(now).unwrap_or_else(|_| Timestamp::now());
        EurekaAppStatus {
            observed_generation: app.metadata.generation,
            conditions: status::conditions(previous, conds, app.metadata.generation, ts),
            app_name: Some(plan.app_name.clone()),
            selected_pods: plan.selected as i64,
            instances: counts,
            last_sync_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts)),
        }
    }

    fn suspended_status(&self, app: &EurekaApp, now: i64) -> EurekaAppStatus {
        let previous = app.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
        let ts = Timestamp::from_millisecond(now).unwrap_or_else(|_| Timestamp::now());
        let conds = vec![
            Cond {
                type_: "Ready",
                ok: false,
                reason: "Suspended".into(),
                message: "spec.suspend is true: no instances are registered".into(),
            },
            Cond {
                type_: "Degraded",
                ok: false,
                reason: "Suspended".into(),
                message: "suspended".into(),
            },
            Cond {
                type_: "Conflict",
                ok: false,
                reason: "Suspended".into(),
                message: "suspended".into(),
            },
        ];
        EurekaAppStatus {
            observed_generation: app.metadata.generation,
            conditions: status::conditions(previous, conds, app.metadata.generation, ts),
            app_name: Some(plan::app_name(&Target {
                namespace: "",
                name: app.metadata.name.as_deref().unwrap_or(""),
                spec: &app.spec,
            })),
            selected_pods: 0,
            instances: Default::default(),
            last_sync_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts)),
        }
    }
}
