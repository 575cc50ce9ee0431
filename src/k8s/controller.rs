//! The EurekaApp controller, on kube-runtime's `Controller`: its reflector holds the EurekaApps,
//! its scheduler de-duplicates and delays reconciles, and its error policy retries failed
//! Kubernetes writes with backoff. Pods and Nodes are followed by [`watch`](super::watch) into the
//! compact [`Index`] (never whole objects), and each change is mapped to the EurekaApps that select
//! it and handed to the controller with `reconcile_on`. What is written by hand is only what
//! kube-runtime does not offer: that mapping, and the projection index.
//!
//! A reconcile reads as: plan (pure) → registry commands (every replica) → status (pure) → the
//! leader's writes (finalizer through kube-runtime's `finalizer` helper, status by server-side
//! apply, Events). Every replica reconciles, since each derives the pod instances of its own
//! registry; only the Lease holder writes to Kubernetes, and it reconciles every EurekaApp again
//! when it takes the Lease so the current state is written at once.
//!
//! Guarantees:
//! * nothing is removed before every watch has listed once; the registry is *complete* (fetches
//!   answered, `/readyz` green) only once every EurekaApp has been reconciled after that;
//! * an invalid spec, or a pod that cannot be planned (a renamed port), keeps the instances the
//!   last valid plan produced, with `Degraded` saying why;
//! * pod instances of an EurekaApp that is gone are removed by a periodic sweep too, so a deletion
//!   missed during a watch gap (or without the finalizer) cannot leave them behind.
//!
//! With `registration: Adopt` the registry part states a claim per selected pod instead of an
//! instance (see [`crate::registry::adoption`]): the pods' own registrations are adopted as they
//! arrive. A claim whose pod is gone cancels its registrations; one withdrawn otherwise (the pod
//! stopped matching, the EurekaApp was deleted, suspended or switched to `Operator`) releases
//! them, native again. An adoption that happens between reconciles (a client registering, or
//! cancelling) asks for one, so the status counts follow.
//!
//! With `--watch-namespaces`, each namespace gets its own `Controller` (a kube reflector watches
//! one namespace or all of them); their triggers are routed by namespace.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, StreamExt, TryStreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, Resource,
    api::{ObjectMeta, PartialObjectMeta, Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event as KubeEvent, EventType, Recorder},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};
use tokio::sync::{mpsc, watch};

use super::{
    crd::{EurekaApp, EurekaAppStatus, InstanceCounts, LEGACY_FINALIZER, ReadinessGate, Registration},
    index::{AppKey, Index, Scope, Snapshot, Touched},
    plan::{self, Context as PlanContext, Plan, Problem, Target, selector_matches},
    pods::{Interner, PodInfo, WatchedPod},
    status::{self, Note, NoteLimiter},
    watch::{Backoff, Follower, follow},
};
use crate::{
    health::{Condition, Health},
    registry::{
        ClaimKey, ClaimState, Command, Outcome, PeerKind, PodOwner, Reply,
        view::{InstanceView, Origin},
    },
    replication::{Peer, client::PeerClient},
    state::{AppState, OutcomeListener},
    supervisor::Shutdown,
};

/// The node label that gives instances their `zone`.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The field manager of this operator's server-side-applied status.
pub const FIELD_MANAGER: &str = "eureka-operator";

/// Settings of the controller (validated by `config`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Names this cluster's pod instances (`k8s.cluster` metadata).
    pub cluster_id: String,
    /// For `hostName: PodFQDN`.
    pub cluster_domain: String,
    /// Namespaces to watch; all when empty.
    pub namespaces: Vec<String>,
    /// Longest wait between retries of a failed Kubernetes write.
    pub max_backoff: Duration,
    /// Longest wait between retries of a failing watch.
    pub watch_max_backoff: Duration,
    /// How long the apiserver keeps one watch request open.
    pub watch_timeout_seconds: u32,
    /// Pods per page of the pod watch's lists.
    pub pod_watch_page_size: u32,
    /// How often pod instances of gone EurekaApps are looked for.
    pub sweep_interval: Duration,
}

/// Why a reconcile failed (its Kubernetes writes; the registry part cannot fail).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to reconcile an EurekaApp without a name or namespace")]
    Unnamed,
    #[error("failed to write the status of {key}: {source}")]
    Status {
        key: AppKey,
        #[source]
        source: kube::Error,
    },
    #[error("failed to remove the finalizer of an earlier version from {key}: {source}")]
    Finalizer {
        key: AppKey,
        #[source]
        source: kube::Error,
    },
}

/// Controller metrics.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_seconds: Histogram,
    pub indexed_pods: Gauge,
    pub watch_errors: Counter,
    pub status_writes: Counter,
    pub event_writes: Counter,
    pub events_dropped: Counter,
    pub write_errors: Counter,
    pub swept: Counter,
    pub gates_opened: Counter,
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
            status_writes: Counter::default(),
            event_writes: Counter::default(),
            events_dropped: Counter::default(),
            write_errors: Counter::default(),
            swept: Counter::default(),
            gates_opened: Counter::default(),
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
        r.register("status_writes", "EurekaApp status patches", self.status_writes.clone());
        r.register("event_writes", "Kubernetes Events recorded", self.event_writes.clone());
        r.register(
            "events_dropped",
            "Events dropped by the rate limit",
            self.events_dropped.clone(),
        );
        r.register(
            "write_errors",
            "Failed Kubernetes writes (retried with backoff)",
            self.write_errors.clone(),
        );
        r.register(
            "readiness_gates_opened",
            "Pod readiness gates set True once every replica had the instance",
            self.gates_opened.clone(),
        );
        r.register(
            "swept_instances",
            "Pod instances removed because their EurekaApp is gone",
            self.swept.clone(),
        );
    }
}

/// The EurekaApp stores, one per watch scope.
#[derive(Clone, Default)]
struct Stores(Vec<(Scope, Store<EurekaApp>)>);

impl Stores {
    /// The EurekaApps of `namespace`.
    fn apps_in(&self, namespace: &str) -> Vec<Arc<EurekaApp>> {
        self.0
            .iter()
            .filter(|(scope, _)| scope.contains(namespace))
            .flat_map(|(_, store)| store.state())
            .filter(|a| a.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    fn all(&self) -> Vec<Arc<EurekaApp>> {
        self.0.iter().flat_map(|(_, s)| s.state()).collect()
    }

    fn ready(&self) -> bool {
        use futures::FutureExt;
        self.0
            .iter()
            .all(|(_, s)| s.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok()))
    }

    fn contains(&self, key: &AppKey) -> bool {
        let r = ObjectRef::<EurekaApp>::new(&key.name).within(&key.namespace);
        self.0.iter().any(|(_, s)| s.get(&r).is_some())
    }
}

/// Sends reconcile requests to the controller of the right scope.
#[derive(Default)]
struct Triggers(Vec<(Scope, mpsc::UnboundedSender<ObjectRef<EurekaApp>>)>);

impl Triggers {
    fn send(&self, key: &AppKey) {
        for (scope, tx) in &self.0 {
            if scope.contains(&key.namespace) {
                let _ = tx.send(ObjectRef::new(&key.name).within(&key.namespace));
            }
        }
    }
}

/// Per EurekaApp, the (app, instance id) pairs its pods could not take (held by someone else).
type BlockedIds = HashMap<AppKey, HashSet<(String, String)>>;

/// What every reconcile shares.
pub struct Context {
    client: Client,
    state: AppState,
    settings: Settings,
    /// Pods and node zones.
    index: RwLock<Index>,
    /// The strings the pod projections share.
    interner: Mutex<Interner>,
    /// The EurekaApps (the controllers' reflectors).
    stores: Stores,
    /// Reconcile requests by scope.
    triggers: Triggers,
    /// Asks every controller to reconcile all its EurekaApps (after the first sync; on taking the Lease).
    reconcile_all: Vec<mpsc::UnboundedSender<()>>,
    /// Whether this replica holds the Lease.
    leader: crate::leadership::Leader,
    recorder: Recorder,
    metrics: Metrics,
    health: Arc<Health>,
    /// Met once every EurekaApp has been reconciled after every watch listed.
    complete: Condition,
    /// EurekaApps reconciled since the watches listed (until complete).
    reconciled: Mutex<HashSet<AppKey>>,
    /// Problems reported last time per app, so Events go out for new ones only.
    reported: Mutex<HashMap<AppKey, BTreeSet<Problem>>>,
    limiter: Mutex<NoteLimiter>,
    blocked: Mutex<BlockedIds>,
    /// Consecutive failed reconciles per app (the error policy's backoff).
    failures: Mutex<HashMap<AppKey, u32>>,
    /// The endpoints adopting EurekaApps claim, and the adopted ids seen, by app: a client's
    /// registration or cancel there between reconciles asks for one ([`AdoptionWaker`]).
    claimed: Mutex<Claimed>,
    /// The peers; the readiness gate opens once every ready replica has the instance.
    peers: watch::Receiver<Vec<Peer>>,
    peer_client: PeerClient,
    /// When every replica was first seen holding a gated pod's instance UP, by (namespace, pod).
    gates_confirmed: Mutex<HashMap<(String, String), std::time::Instant>>,
}

/// The adopting EurekaApps' endpoints and adopted ids (see [`AdoptionWaker`]).
#[derive(Default)]
struct Claimed {
    endpoints: HashMap<ClaimKey, AppKey>,
    ids: HashMap<(String, String), AppKey>,
    /// The adopted ids each EurekaApp's last reconcile saw (for the `Adopted` Events).
    reported: HashMap<AppKey, HashSet<String>>,
    /// What each EurekaApp put in `endpoints` and `ids` last time (so a reconcile replaces its
    /// own entries without scanning everyone's).
    of_app: HashMap<AppKey, AppClaims>,
}

/// The endpoints and `(app, instance id)`s one EurekaApp put in [`Claimed`].
type AppClaims = (Vec<ClaimKey>, Vec<(String, String)>);

/// What the registry part of a reconcile decided, for the leader to write.
struct Applied {
    /// The status to write (`None` while the EurekaApp is being deleted).
    status: Option<EurekaAppStatus>,
    notes: Vec<Note>,
    /// When to look again (a drain deadline).
    action: Action,
    /// Pods whose readiness gate this operator may open once every replica has their instance.
    gated: Option<Gated>,
}

/// The pods of one EurekaApp waiting for its readiness gate.
struct Gated {
    gate: ReadinessGate,
    /// (pod, app, instance id) of each pod whose instance is UP here and whose gate is closed.
    waiting: Vec<(String, String, String)>,
}

/// Looks at an EurekaApp again when an instance id one of its pods could not take (a conflict) is
/// cancelled or evicted, so the pod registers as soon as the id is free.
pub struct ConflictWaker(Arc<Context>);

impl OutcomeListener for ConflictWaker {
    fn on_outcome(&self, outcome: &Outcome) {
        let mut freed = outcome
            .replicate
            .iter()
            .filter(|r| r.action == crate::registry::Action::Cancel)
            .peekable();
        if freed.peek().is_none() {
            return;
        }
        let blocked = self.0.blocked.lock();
        for r in freed {
            let id = (r.app.clone(), r.id.clone());
            for (key, ids) in blocked.iter() {
                if ids.contains(&id) {
                    self.0.triggers.send(key);
                }
            }
        }
    }
}

/// Looks at an adopting EurekaApp again when one of its pods' clients registers or cancels, so its
/// status (adopted counts, pods awaiting registration) follows without waiting for a pod change.
pub struct AdoptionWaker(Arc<Context>);

impl OutcomeListener for AdoptionWaker {
    fn on_outcome(&self, outcome: &Outcome) {
        let mut claimed = None;
        for r in &outcome.replicate {
            // The controller's own changes come from a reconcile.
            if r.writer == crate::registry::Writer::Controller {
                continue;
            }
            let claimed = claimed.get_or_insert_with(|| self.0.claimed.lock());
            let id = (r.app.clone(), r.id.clone());
            let key = match (r.action, &r.instance) {
                (crate::registry::Action::Register, Some(view)) if view.origin == Origin::Adopted => {
                    let key = claimed.endpoints.get(&ClaimKey::of(&view.info)).cloned();
                    if let Some(k) = &key {
                        claimed.ids.insert(id.clone(), k.clone());
                        claimed.of_app.entry(k.clone()).or_default().1.push(id);
                    }
                    key
                }
                (crate::registry::Action::Cancel, _) => claimed.ids.remove(&id),
                _ => None,
            };
            if let Some(key) = key {
                self.0.triggers.send(&key);
            }
        }
    }
}

/// What the controller works with.
pub struct Parts {
    pub client: Client,
    pub state: AppState,
    /// Whether this replica holds the Lease.
    pub leader: crate::leadership::Leader,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub health: Arc<Health>,
    /// Met once every watch listed and every EurekaApp was reconciled.
    pub complete: Condition,
    /// The peers (the readiness gate asks every ready replica for the instance).
    pub peers: watch::Receiver<Vec<Peer>>,
    pub peer_client: PeerClient,
}

/// Builds the controllers and runs them, the pod and node watches, and the sweep, until shutdown.
pub async fn run(settings: Settings, parts: Parts, shutdown: Shutdown) -> anyhow::Result<()> {
    let Parts {
        client,
        state,
        leader,
        recorder,
        metrics,
        health,
        complete,
        peers,
        peer_client,
    } = parts;
    let scopes = Scope::of(&settings.namespaces);
    let Controllers {
        controllers,
        stores,
        triggers,
        reconcile_all,
        mut deleted,
    } = Controllers::new(
        &client,
        &scopes,
        (settings.watch_max_backoff, settings.watch_timeout_seconds),
        &shutdown,
    );
    complete.waiting("waiting for the Pod, Node and EurekaApp watches to list");
    let ctx = Arc::new(Context {
        index: RwLock::new(Index::new(scopes.clone())),
        interner: Mutex::default(),
        client: client.clone(),
        state: state.clone(),
        settings,
        stores,
        triggers,
        reconcile_all,
        leader: leader.clone(),
        recorder,
        metrics,
        health,
        complete,
        reconciled: Mutex::default(),
        reported: Mutex::default(),
        limiter: Mutex::default(),
        blocked: Mutex::default(),
        failures: Mutex::default(),
        claimed: Mutex::default(),
        peers,
        peer_client,
        gates_confirmed: Mutex::default(),
    });
    state.add_listener(Arc::new(ConflictWaker(ctx.clone())));
    state.add_listener(Arc::new(AdoptionWaker(ctx.clone())));

    let runs = futures::future::join_all(controllers.into_iter().map(|c| {
        let ctx = ctx.clone();
        c.run(reconcile, error_policy, ctx.clone()).for_each(move |result| {
            ctx.controller_result(result);
            futures::future::ready(())
        })
    }));
    let watches = watch_pods_and_nodes(ctx.clone(), scopes);
    let forget = {
        let ctx = ctx.clone();
        async move {
            while let Some(app) = deleted.recv().await {
                ctx.forget(&app);
            }
            std::future::pending::<anyhow::Result<()>>().await
        }
    };
    tokio::select! {
        _ = runs => {
            // The controllers end only on shutdown.
            if !shutdown.is_set() {
                anyhow::bail!("failed to keep the EurekaApp controllers running: they stopped");
            }
            Ok(())
        }
        ended = watches => ended,
        ended = ctx.clone().background(leader) => ended,
        ended = forget => ended,
    }
}

/// The counts of an adopting EurekaApp's registrations, and its live pods that have none yet.
fn adopted_counts(plan: &Plan, adopted: &[(PodOwner, InstanceView)]) -> (InstanceCounts, Vec<String>) {
    let with_registration: HashSet<&str> = adopted.iter().map(|(o, _)| o.pod.as_str()).collect();
    let mut awaiting: Vec<String> = plan
        .claims
        .iter()
        .filter(|c| matches!(c.state, ClaimState::Live { .. }))
        .filter(|c| !with_registration.contains(c.owner.pod.as_str()))
        .map(|c| c.owner.pod.clone())
        .collect();
    awaiting.sort();
    (
        status::counts(adopted.iter().map(|(_, v)| v.info.status), true),
        awaiting,
    )
}

/// Events for the instances a reconcile registered and removed.
fn change_notes(app_name: &str, registered: &[String], removed: usize) -> Vec<Note> {
    let mut notes = Vec::new();
    if !registered.is_empty() {
        let message = format!(
            "registered {} instance(s) of {app_name}: {}",
            registered.len(),
            registered.join(", ")
        );
        notes.push(Note::normal("Registered", "Register", message));
    }
    if removed > 0 {
        let message = format!("deregistered {removed} instance(s) of {app_name}");
        notes.push(Note::normal("Deregistered", "Deregister", message));
    }
    notes
}

/// One kube-runtime `Controller` of EurekaApps per scope, with the handles that reach into them.
/// Each is fed by a watch stream of our own (`Controller::for_stream`) so that deletions, which
/// kube-runtime does not reconcile, reach [`Context::forget`] at once.
struct Controllers {
    controllers: Vec<Controller<EurekaApp>>,
    /// Each controller's cache of EurekaApps.
    stores: Stores,
    /// Each controller's queue, for reconciles the index asks for.
    triggers: Triggers,
    /// Asks each controller to reconcile every EurekaApp.
    reconcile_all: Vec<mpsc::UnboundedSender<()>>,
    /// EurekaApps the watches saw deleted.
    deleted: mpsc::UnboundedReceiver<EurekaApp>,
}

impl Controllers {
    fn new(
        client: &Client,
        scopes: &[Scope],
        (max_backoff, watch_timeout): (Duration, u32),
        shutdown: &Shutdown,
    ) -> Self {
        let (deleted_tx, deleted) = mpsc::unbounded_channel();
        let mut this = Controllers {
            controllers: Vec::new(),
            stores: Stores::default(),
            triggers: Triggers::default(),
            reconcile_all: Vec::new(),
            deleted,
        };
        for scope in scopes {
            let api: Api<EurekaApp> = match scope {
                Scope::All => Api::all(client.clone()),
                Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let (all_tx, all_rx) = mpsc::unbounded_channel();
            let (reader, writer) = reflector::store();
            let deleted_tx = deleted_tx.clone();
            let apps = watcher(api, super::watch::config(watch_timeout))
                .backoff(Backoff::new(max_backoff))
                .reflect(writer)
                .inspect_ok(move |event| {
                    if let watcher::Event::Delete(app) = event {
                        let _ = deleted_tx.send(app.clone());
                    }
                })
                .applied_objects();
            let c = Controller::for_stream(apps, reader)
                .reconcile_on(receiver_stream(rx))
                .reconcile_all_on(receiver_stream(all_rx))
                .graceful_shutdown_on(shutdown.clone().wait());
            this.stores.0.push((scope.clone(), c.store()));
            this.triggers.0.push((scope.clone(), tx));
            this.reconcile_all.push(all_tx);
            this.controllers.push(c);
        }
        this
    }
}

/// A channel's receiver as a stream.
fn receiver_stream<T: Send + 'static>(rx: mpsc::UnboundedReceiver<T>) -> BoxStream<'static, T> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }).boxed()
}

/// The Pod watches (one per scope) and the Node watch, into the index.
async fn watch_pods_and_nodes(ctx: Arc<Context>, scopes: Vec<Scope>) -> anyhow::Result<()> {
    let pods = scopes.into_iter().map(|scope| {
        let api: Api<WatchedPod> = match &scope {
            Scope::All => Api::all(ctx.client.clone()),
            Scope::Namespace(ns) => Api::namespaced(ctx.client.clone(), ns),
        };
        let stream = watcher(
            api,
            super::watch::config(ctx.settings.watch_timeout_seconds).page_size(ctx.settings.pod_watch_page_size),
        )
        .backoff(Backoff::new(ctx.settings.watch_max_backoff));
        let follower = PodFollower {
            ctx: ctx.clone(),
            scope: scope.clone(),
        };
        async move {
            follow(
                format!("Pods in {scope}"),
                stream,
                &follower,
                &follower.ctx.metrics.watch_errors,
                &follower.ctx.health,
            )
            .await
        }
        .boxed()
    });
    let nodes = {
        let api: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
        let stream: BoxStream<'static, _> = watcher(api, super::watch::config(ctx.settings.watch_timeout_seconds))
            .backoff(Backoff::new(ctx.settings.watch_max_backoff))
            .boxed();
        let follower = NodeFollower(ctx.clone());
        async move {
            follow(
                "Nodes".to_string(),
                stream,
                &follower,
                &follower.0.metrics.watch_errors,
                &follower.0.health,
            )
            .await
        }
        .boxed()
    };
    let (ended, _, _) = futures::future::select_all(pods.chain(std::iter::once(nodes))).await;
    ended
}

struct PodFollower {
    ctx: Arc<Context>,
    scope: Scope,
}

impl Follower<WatchedPod> for PodFollower {
    type Item = PodInfo;

    fn project(&self, pod: &WatchedPod) -> Option<PodInfo> {
        PodInfo::from_watched(pod, &mut self.ctx.interner.lock())
    }

    fn applied(&self, pod: PodInfo) {
        let touched = self.ctx.index.write().apply_pod(pod);
        self.ctx.touched(touched.into_iter());
    }

    fn deleted(&self, pod: &WatchedPod) {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
            return;
        };
        let touched = self.ctx.index.write().delete_pod(ns, name);
        self.ctx.touched(touched.into_iter());
    }

    fn relisted(&self, pods: Vec<PodInfo>) {
        let namespaces = self.ctx.index.write().replace_pods(&self.scope, pods);
        tracing::info!(scope = %self.scope, pods = self.ctx.index.read().pod_count(), "pods listed");
        self.ctx.relisted(&namespaces);
    }
}

struct NodeFollower(Arc<Context>);

impl Follower<PartialObjectMeta<Node>> for NodeFollower {
    type Item = (String, Option<String>);

    fn project(&self, node: &PartialObjectMeta<Node>) -> Option<(String, Option<String>)> {
        let zone = |m: &ObjectMeta| m.labels.as_ref().and_then(|l| l.get(ZONE_LABEL).cloned());
        Some((node.metadata.name.clone()?, zone(&node.metadata)))
    }

    fn applied(&self, (name, zone): (String, Option<String>)) {
        let touched = self.0.index.write().set_zone(&name, zone);
        self.0.touched(touched.into_iter());
    }

    fn deleted(&self, node: &PartialObjectMeta<Node>) {
        if let Some(name) = &node.metadata.name {
            let touched = self.0.index.write().set_zone(name, None);
            self.0.touched(touched.into_iter());
        }
    }

    fn relisted(&self, nodes: Vec<(String, Option<String>)>) {
        let zones = nodes.into_iter().filter_map(|(n, z)| Some((n, z?))).collect();
        let namespaces = self.0.index.write().replace_zones(zones);
        self.0.relisted(&namespaces);
    }
}

type RunResult = Result<(ObjectRef<EurekaApp>, Action), kube::runtime::controller::Error<Error, watcher::Error>>;

impl Context {
    /// Reports what a controller's run stream says: its EurekaApp watch failing shows in the log,
    /// the metrics and `/readyz` (failed reconciles are reported by the error policy).
    fn controller_result(&self, result: RunResult) {
        use kube::runtime::controller::Error as RunError;
        const SOURCE: &str = "watch of EurekaApps";
        match result {
            Ok(_) => self.health.clear(SOURCE),
            Err(RunError::QueueError(e)) => {
                self.metrics.watch_errors.inc();
                tracing::warn!(error = %e, "the EurekaApp watch failed (is the CRD installed?); retrying");
                self.health
                    .warn(SOURCE, format!("failing ({e}); retrying with backoff"));
            }
            Err(e) => tracing::debug!(error = %e, "reconcile request not run"),
        }
    }

    /// Queues the EurekaApps that select any of the touched label sets (or whose status-override
    /// selectors do).
    fn touched(&self, touched: impl Iterator<Item = Touched>) {
        self.metrics.indexed_pods.set(self.index.read().pod_count() as i64);
        if !self.index.read().synced() {
            return;
        }
        for t in touched {
            for app in self.stores.apps_in(&t.namespace) {
                let spec = &app.spec;
                let selects = t.labels.iter().any(|labels| {
                    selector_matches(&spec.selector, labels).unwrap_or(true)
                        || spec
                            .status_overrides
                            .iter()
                            .any(|o| selector_matches(&o.selector, labels).unwrap_or(false))
                });
                if selects && let Some(key) = AppKey::of(&app) {
                    self.triggers.send(&key);
                }
            }
        }
    }

    /// A watch re-listed: its namespaces need a look; the first time everything has listed,
    /// every EurekaApp does.
    fn relisted(&self, namespaces: &[String]) {
        self.metrics.indexed_pods.set(self.index.read().pod_count() as i64);
        if !self.index.read().synced() {
            return;
        }
        if !self.complete.is_met() {
            tracing::info!(
                pods = self.index.read().pod_count(),
                "every watch has listed: reconciling"
            );
            for tx in &self.reconcile_all {
                let _ = tx.send(());
            }
            self.check_complete();
            return;
        }
        for ns in namespaces {
            for app in self.stores.apps_in(ns) {
                if let Some(key) = AppKey::of(&app) {
                    self.triggers.send(&key);
                }
            }
        }
    }

    /// Marks the registry complete once every EurekaApp in the stores has been reconciled since
    /// every watch listed.
    fn check_complete(&self) {
        if self.complete.is_met() || !self.index.read().synced() || !self.stores.ready() {
            return;
        }
        let apps = self.stores.all();
        let reconciled = self.reconciled.lock();
        let pending = apps
            .iter()
            .filter_map(|a| AppKey::of(a))
            .filter(|k| !reconciled.contains(k))
            .count();
        if pending == 0 {
            drop(reconciled);
            self.complete.met();
            self.reconciled.lock().clear();
        } else {
            self.complete.waiting(format!(
                "{} of {} EurekaApps reconciled",
                apps.len() - pending,
                apps.len()
            ));
        }
    }

    /// Background work: completeness checks until complete, reconciling everything on taking the
    /// Lease, and the sweep of pod instances whose EurekaApp is gone.
    async fn background(self: Arc<Self>, mut leader: crate::leadership::Leader) -> anyhow::Result<()> {
        let mut sweep = tokio::time::interval(self.settings.sweep_interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                changed = leader.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if leader.borrow_and_update().holds() && self.index.read().synced() {
                        tracing::info!("leading: reconciling every EurekaApp to write its status");
                        for tx in &self.reconcile_all {
                            let _ = tx.send(());
                        }
                    }
                }
                _ = sweep.tick() => self.sweep(),
                _ = check.tick(), if !self.complete.is_met() => self.check_complete(),
            }
        }
    }

    /// Removes the pod instances of EurekaApps that are gone.
    fn sweep(&self) {
        if !self.index.read().synced() || !self.stores.ready() {
            return;
        }
        let orphans: Vec<(PodOwner, InstanceView)> = self.state.with_registry(|r, _| {
            r.pod_instances()
                .into_iter()
                .filter(|(o, _)| {
                    !self.stores.contains(&AppKey {
                        namespace: o.namespace.clone(),
                        name: o.eureka_app.clone(),
                    })
                })
                .collect()
        });
        let n = self.remove(&orphans);
        if n > 0 {
            self.metrics.swept.inc_by(n as u64);
            tracing::info!(removed = n, "removed pod instances whose EurekaApp is gone");
        }
        let orphan_claims: Vec<PodOwner> = self.state.with_registry(|r, _| {
            r.claim_owners()
                .into_iter()
                .filter(|o| {
                    !self.stores.contains(&AppKey {
                        namespace: o.namespace.clone(),
                        name: o.eureka_app.clone(),
                    })
                })
                .collect()
        });
        for owner in &orphan_claims {
            self.state.apply(Command::Unclaim {
                owner: owner.clone(),
                pod_gone: false,
            });
        }
        if !orphan_claims.is_empty() {
            tracing::info!(
                released = orphan_claims.len(),
                "released the registrations adopted for EurekaApps that are gone"
            );
        }
    }

    /// Deregisters the given pod instances; returns how many went.
    fn remove(&self, instances: &[(PodOwner, InstanceView)]) -> usize {
        instances
            .iter()
            .filter(|(owner, view)| {
                let outcome = self.state.apply(Command::RemovePod {
                    app: view.info.app.clone(),
                    id: view.id().to_string(),
                    owner: owner.clone(),
                });
                outcome.reply == Reply::Ok
            })
            .count()
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
            self.triggers.send(key);
        }
    }

    /// The registry part of a reconcile, on every replica. See the module docs.
    fn apply(&self, key: &AppKey, app: &EurekaApp) -> Applied {
        let now = self.state.now();
        let current = self
            .state
            .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name));
        let deleting = app.metadata.deletion_timestamp.is_some();
        if deleting || app.spec.suspend {
            return self.deregister_all(key, app, &current, now);
        }
        let snapshot = self.index.read().snapshot(&key.namespace);
        let plan = self.plan(key, app, &snapshot, now);
        let mut problems = plan.problems.clone();
        problems.extend(plan.invalid.clone().map(Problem::InvalidSpec));
        let (registered, conflicts) = self.upsert(key, &plan);
        problems.extend(conflicts);
        problems.extend(self.state_claims(key, &plan, &snapshot.pods));
        // An invalid spec plans nothing: keep what the last valid spec produced.
        let removed = if plan.invalid.is_some() {
            0
        } else {
            self.remove_stale(&plan, &current)
        };
        let action = match plan.wake_at {
            Some(at) => Action::requeue(Duration::from_millis((at - now).max(0) as u64 + 5)),
            None => Action::await_change(),
        };
        let adopt = app.spec.registration == Registration::Adopt;
        let adopted = self.state.with_registry(|r, _| r.adopted_of(&key.namespace, &key.name));
        if plan.invalid.is_none() {
            self.remember_claims(key, plan.claims.iter().map(|c| c.key.clone()), &adopted);
        }
        let instances = if adopt {
            Vec::new()
        } else {
            self.state
                .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name))
        };
        let (counts, awaiting) = if adopt {
            adopted_counts(&plan, &adopted)
        } else {
            (
                status::counts(instances.iter().map(|(_, v)| v.info.status), false),
                Vec::new(),
            )
        };
        let mut notes: Vec<Note> = self.newly_adopted(key, &plan.app_name, &adopted).into_iter().collect();
        notes.extend(change_notes(&plan.app_name, &registered, removed));
        notes.extend(self.new_problems(key, &problems));
        let gated = app.spec.readiness_gate.clone().map(|gate| Gated {
            waiting: if adopt {
                adopted_gate_waiting(&gate, &snapshot.pods, &adopted)
            } else {
                gate_waiting(&gate, &plan, &snapshot.pods, &instances)
            },
            gate,
        });
        Applied {
            status: Some(status::status(app, &plan, &problems, counts, &awaiting, now)),
            notes,
            action,
            gated,
        }
    }

    /// The plan for this EurekaApp's pods as the index holds them now.
    fn plan(&self, key: &AppKey, app: &EurekaApp, snapshot: &Snapshot, now: i64) -> Plan {
        let target = Target {
            namespace: &key.namespace,
            name: &key.name,
            spec: &app.spec,
        };
        let ctx = PlanContext {
            cluster_id: &self.settings.cluster_id,
            cluster_domain: &self.settings.cluster_domain,
            node_zones: &snapshot.zones,
            now,
        };
        plan::plan(&target, snapshot.pods.iter().map(|p| p.as_ref()), &ctx)
    }

    /// An Event for the registrations adopted since the last reconcile (here, or as they
    /// arrived), if there are any.
    fn newly_adopted(&self, key: &AppKey, app_name: &str, adopted: &[(PodOwner, InstanceView)]) -> Option<Note> {
        let adopted_now: HashSet<String> = adopted.iter().map(|(_, v)| v.id().to_string()).collect();
        let mut newly: Vec<String> = {
            let mut claimed = self.claimed.lock();
            let seen = claimed.reported.entry(key.clone()).or_default();
            let newly = adopted_now.difference(seen).cloned().collect();
            *seen = adopted_now;
            newly
        };
        if newly.is_empty() {
            return None;
        }
        newly.sort();
        let message = format!(
            "adopted {} registration(s) of {app_name} made by the pods' own clients: {}",
            newly.len(),
            newly.join(", ")
        );
        Some(Note::normal("Adopted", "Adopt", message))
    }

    /// States the plan's claims (none unless the EurekaApp adopts) and withdraws the others of
    /// this EurekaApp, except those of pods it could not plan: a pod that is gone (or finished)
    /// has its registrations cancelled, one that stopped matching has them released. Returns the
    /// claims refused because another pod's claim holds the endpoint.
    fn state_claims(&self, key: &AppKey, plan: &Plan, pods: &[Arc<PodInfo>]) -> Vec<Problem> {
        let mut problems = Vec::new();
        if plan.invalid.is_some() {
            // Nothing is planned: the last valid spec's claims stay.
            return problems;
        }
        for c in &plan.claims {
            let outcome = self.state.apply(Command::Claim { claim: c.clone() });
            if let Reply::Refused(message) = outcome.reply {
                problems.push(Problem::InstanceIdConflict(message));
            }
        }
        let wanted: HashSet<&str> = plan.claims.iter().map(|c| c.owner.pod.as_str()).collect();
        let held: HashSet<&str> = plan.held.iter().map(String::as_str).collect();
        let stale: Vec<PodOwner> = self
            .state
            .with_registry(|r, _| r.claims_of(&key.namespace, &key.name))
            .into_iter()
            .map(|(o, _)| o)
            .filter(|o| !wanted.contains(o.pod.as_str()) && !held.contains(o.pod.as_str()))
            .collect();
        for owner in stale {
            let running = pods.iter().any(|p| *p.name == *owner.pod && !p.finished());
            self.state.apply(Command::Unclaim {
                owner,
                pod_gone: !running,
            });
        }
        problems
    }

    /// Records the endpoints `key` claims now and the registrations adopted for it, for the
    /// [`AdoptionWaker`].
    fn remember_claims(
        &self,
        key: &AppKey,
        endpoints: impl Iterator<Item = ClaimKey>,
        adopted: &[(PodOwner, InstanceView)],
    ) {
        let endpoints: Vec<ClaimKey> = endpoints.collect();
        let ids: Vec<(String, String)> = adopted
            .iter()
            .map(|(_, v)| (v.info.app.clone(), v.id().to_string()))
            .collect();
        let mut guard = self.claimed.lock();
        let claimed = &mut *guard;
        if let Some((old_endpoints, old_ids)) = claimed.of_app.remove(key) {
            for e in old_endpoints {
                if claimed.endpoints.get(&e) == Some(key) {
                    claimed.endpoints.remove(&e);
                }
            }
            for id in old_ids {
                if claimed.ids.get(&id) == Some(key) {
                    claimed.ids.remove(&id);
                }
            }
        }
        if endpoints.is_empty() && ids.is_empty() {
            return;
        }
        for e in &endpoints {
            claimed.endpoints.insert(e.clone(), key.clone());
        }
        for id in &ids {
            claimed.ids.insert(id.clone(), key.clone());
        }
        claimed.of_app.insert(key.clone(), (endpoints, ids));
    }

    /// Registers or updates the planned instances; returns the ids registered anew and the
    /// instance-id conflicts.
    fn upsert(&self, key: &AppKey, plan: &Plan) -> (Vec<String>, Vec<Problem>) {
        let mut registered = Vec::new();
        let mut conflicts = Vec::new();
        let mut blocked = HashSet::new();
        for d in &plan.desired {
            let id = d.info.id().to_string();
            let outcome = self.state.apply(Command::UpsertPod {
                info: d.info.clone(),
                owner: d.owner.clone(),
                overrides: d.overrides,
            });
            match outcome.reply {
                Reply::Registered => registered.push(id),
                Reply::Refused(message) => {
                    conflicts.push(Problem::InstanceIdConflict(message));
                    blocked.insert((d.info.app.clone(), id));
                }
                _ => {}
            }
        }
        self.set_blocked(key, blocked);
        (registered, conflicts)
    }

    /// Removes the instances the plan no longer wants, except those of pods it could not plan.
    fn remove_stale(&self, plan: &Plan, current: &[(PodOwner, InstanceView)]) -> usize {
        let wanted: HashSet<(&str, &str)> = plan
            .desired
            .iter()
            .map(|d| (d.info.app.as_str(), d.info.id()))
            .collect();
        let held: HashSet<&str> = plan.held.iter().map(String::as_str).collect();
        let stale: Vec<(PodOwner, InstanceView)> = current
            .iter()
            .filter(|(o, v)| !wanted.contains(&(v.info.app.as_str(), v.id())) && !held.contains(o.pod.as_str()))
            .cloned()
            .collect();
        self.remove(&stale)
    }

    /// A deleted or suspended EurekaApp: every instance goes.
    fn deregister_all(&self, key: &AppKey, app: &EurekaApp, current: &[(PodOwner, InstanceView)], now: i64) -> Applied {
        let n = self.remove(current);
        // Adopted registrations belong to their clients: released, native again.
        let claims = self.state.with_registry(|r, _| r.claims_of(&key.namespace, &key.name));
        for (owner, _) in claims {
            self.state.apply(Command::Unclaim { owner, pod_gone: false });
        }
        self.remember_claims(key, std::iter::empty(), &[]);
        self.claimed.lock().reported.remove(key);
        self.set_blocked(key, HashSet::new());
        self.reported.lock().remove(key);
        let deleting = app.metadata.deletion_timestamp.is_some();
        let mut notes = Vec::new();
        if n > 0 {
            let why = if deleting { "deleted" } else { "suspended" };
            notes.push(Note::normal(
                "Deregistered",
                "Deregister",
                format!("deregistered {n} instances ({why})"),
            ));
        }
        let app_name = plan::app_name(&Target {
            namespace: &key.namespace,
            name: &key.name,
            spec: &app.spec,
        });
        Applied {
            status: (!deleting).then(|| status::suspended(app, app_name, now)),
            notes,
            action: Action::await_change(),
            gated: None,
        }
    }

    /// Warning notes for the problems that were not there last time.
    fn new_problems(&self, key: &AppKey, problems: &[Problem]) -> Vec<Note> {
        let mut reported = self.reported.lock();
        let before = reported.entry(key.clone()).or_default();
        let notes = status::new_problems(before, problems)
            .into_iter()
            .map(Note::problem)
            .collect();
        *before = problems.iter().cloned().collect();
        notes
    }

    /// The leader's writes: the status, the Events, the readiness gates of pods whose instance
    /// every replica has, and the removal of the finalizer an earlier version added.
    async fn write(&self, app: Arc<EurekaApp>, key: &AppKey, applied: Applied) -> Result<Action, Error> {
        let api: Api<EurekaApp> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut action = applied.action;
        if let Some(gated) = &applied.gated
            && let Some(again) = self.open_gates(key, gated).await
        {
            action = Action::requeue(again);
        }
        let result = async {
            remove_legacy_finalizer(&api, key, &app).await?;
            match &applied.status {
                Some(status) if app.metadata.deletion_timestamp.is_none() => {
                    self.write_status(&api, key, &app, status).await
                }
                _ => Ok(()),
            }
        }
        .await;
        self.record(key, &applied.notes).await;
        result.map(|()| action)
    }

    /// An EurekaApp that is gone: its instances go, on every replica, at once (the periodic sweep
    /// catches a deletion this replica's watch missed).
    fn forget(&self, app: &EurekaApp) {
        let Some(key) = AppKey::of(app) else { return };
        if !self.index.read().synced() || self.stores.contains(&key) {
            // Nothing was registered yet; or it exists again and its reconcile decides.
            return;
        }
        let mut gone = app.clone();
        gone.metadata.deletion_timestamp.get_or_insert_with(|| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
        });
        let current = self
            .state
            .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name));
        let applied = self.deregister_all(&key, &gone, &current, self.state.now());
        self.failures.lock().remove(&key);
        self.reconciled.lock().remove(&key);
        for note in &applied.notes {
            tracing::info!(app = %key, "{}", note.message);
        }
    }

    /// Opens the gate of every waiting pod whose instance every ready replica holds UP, once the
    /// gate's delay has passed; returns when to look again while some still wait.
    async fn open_gates(&self, key: &AppKey, gated: &Gated) -> Option<Duration> {
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
    async fn set_gate(&self, namespace: &str, pod: &str, condition: &str, replicas: usize) -> Result<(), kube::Error> {
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

    /// Server-side applies the status unless only its sync time changed.
    async fn write_status(
        &self,
        api: &Api<EurekaApp>,
        key: &AppKey,
        app: &EurekaApp,
        status: &EurekaAppStatus,
    ) -> Result<(), Error> {
        if app.status.as_ref().is_some_and(|s| !status::differs(s, status)) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": EurekaApp::api_version(&()),
            "kind": EurekaApp::kind(&()),
            "status": status,
        });
        api.patch_status(
            &key.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| Error::Status {
            key: key.clone(),
            source,
        })?;
        self.metrics.status_writes.inc();
        Ok(())
    }

    /// Records Events, at most [`status::NOTES_PER_WINDOW`] per app and reason a minute.
    async fn record(&self, key: &AppKey, notes: &[Note]) {
        if notes.is_empty() {
            return;
        }
        let reference = ObjectRef::<EurekaApp>::new(&key.name).within(&key.namespace);
        let Some(app) = self.stores.0.iter().find_map(|(_, s)| s.get(&reference)) else {
            return;
        };
        let reference = app.object_ref(&());
        for note in notes {
            let admitted = self.limiter.lock().admit(key, note.reason, tokio::time::Instant::now());
            if !admitted {
                self.metrics.events_dropped.inc();
                continue;
            }
            let event = KubeEvent {
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
}

/// The pods whose `gate` is closed while their instance is UP here (the leader then asks the
/// other replicas).
fn gate_waiting(
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
fn adopted_gate_waiting(
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

/// Brings the registry's pod instances of one EurekaApp in line with its pods; the leader then
/// writes its status. See the module docs.
#[tracing::instrument(name = "reconcile", skip_all, fields(app = %app.metadata.name.as_deref().unwrap_or("")))]
async fn reconcile(app: Arc<EurekaApp>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = AppKey::of(&app).ok_or(Error::Unnamed)?;
    if !ctx.index.read().synced() {
        // Nothing is decided before every watch has listed; then every EurekaApp is reconciled.
        return Ok(Action::await_change());
    }
    let started = std::time::Instant::now();
    let applied = ctx.apply(&key, &app);
    ctx.metrics.reconciles.inc();
    ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
    if !ctx.complete.is_met() {
        ctx.reconciled.lock().insert(key.clone());
        ctx.check_complete();
    }
    if !ctx.leader.borrow().holds() {
        ctx.failures.lock().remove(&key);
        return Ok(applied.action);
    }
    let action = ctx.write(app, &key, applied).await?;
    ctx.failures.lock().remove(&key);
    Ok(action)
}

/// A failed reconcile (a Kubernetes write) is retried with exponential backoff per EurekaApp,
/// from 500 ms up to `--kubernetes-write-max-backoff-ms`.
fn error_policy(app: Arc<EurekaApp>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.write_errors.inc();
    let Some(key) = AppKey::of(&app) else {
        return Action::await_change();
    };
    let failures = {
        let mut f = ctx.failures.lock();
        let n = f.entry(key.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(failures, ctx.settings.max_backoff);
    tracing::warn!(app = %key, error = %error, retry_in = ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// Removes the finalizer that versions before 0.2 added (they deregistered through it), so that
/// nothing is left that only a running operator could lift: deleting an EurekaApp, or its
/// namespace, never waits on the operator. A merge patch of the list without it, guarded by the
/// resource version (a concurrent change answers 409 and the reconcile is retried).
async fn remove_legacy_finalizer(api: &Api<EurekaApp>, key: &AppKey, app: &EurekaApp) -> Result<(), Error> {
    let finalizers = app.metadata.finalizers.as_deref().unwrap_or_default();
    if !finalizers.iter().any(|f| f == LEGACY_FINALIZER) {
        return Ok(());
    }
    let rest: Vec<&String> = finalizers.iter().filter(|f| *f != LEGACY_FINALIZER).collect();
    let patch = serde_json::json!({"metadata": {
        "finalizers": rest,
        "resourceVersion": app.metadata.resource_version,
    }});
    api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Finalizer {
            key: key.clone(),
            source,
        })?;
    tracing::info!(app = %key, finalizer = LEGACY_FINALIZER, "removed the finalizer of an earlier version");
    Ok(())
}

/// The wait after `failures` consecutive failures: 500 ms doubling, at most `cap`.
fn backoff(failures: u32, cap: Duration) -> Duration {
    Duration::from_millis(500)
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let cap = Duration::from_secs(60);
        assert_eq!(backoff(1, cap), Duration::from_millis(500));
        assert_eq!(backoff(3, cap), Duration::from_secs(2));
        assert_eq!(backoff(8, cap), Duration::from_secs(60));
        assert_eq!(backoff(30, cap), cap);
    }
}
