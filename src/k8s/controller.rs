//! The EurekaApp controller, on kube-runtime's `Controller`: its reflector holds the EurekaApps,
//! its scheduler de-duplicates and delays reconciles, and its error policy retries failed
//! Kubernetes writes with backoff. Pods and Nodes are followed by [`watch`](super::watch) into the
//! compact [`Index`] (never whole objects), and each change is mapped to the EurekaApps that select
//! it and handed to the controller with `reconcile_on`. What is written by hand is only what
//! kube-runtime does not offer: that mapping, and the projection index.
//!
//! A reconcile reads as: plan (pure) → registry commands (every replica) → status (pure) → the
//! leader's writes (the removal of an earlier version's finalizer, status by server-side apply,
//! Events). Every replica reconciles, since each derives the pod instances of its own registry;
//! only the Lease holder writes to Kubernetes, and it reconciles every EurekaApp again when it
//! takes the Lease so the current state is written at once. A reconcile never waits on the other
//! replicas: the pods waiting for their readiness gate are handed to the gate task, which asks
//! the replicas and opens the gates on its own timer; the only requeue is a drain's deadline.
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
//! Its parts: [`routing`] (stores and triggers by scope, the pod and node watches), [`apply`] (the
//! registry part of a reconcile), [`wakers`] (conflicts and adoption between reconciles),
//! [`completeness`] (readiness of the registry and the sweep), [`gates`] (readiness gates: which
//! pods wait, and the gate task) and [`writes`] (the leader's writes and their retries). The
//! controllers, the watches, the background checks and sweep, the gate task and the handling of
//! deletions run together in [`run`], which the supervisor owns as the `controller` task: one of
//! them ending ends it. Scenario tests of the pure parts are in `tests.rs`.
//!
//! With `--watch-namespaces`, each namespace gets its own `Controller` (a kube reflector watches
//! one namespace or all of them); their triggers are routed by namespace.

mod apply;
mod completeness;
mod figures;
pub mod gates;
mod routing;
mod wakers;
mod writes;

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
    plan::{self, Facts, Plan, Problem, Target, selector_matches},
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

pub use wakers::{AdoptionWaker, ConflictWaker};
use {
    routing::{Stores, Triggers, watch_pods_and_nodes},
    wakers::{BlockedIds, Claimed},
    writes::error_policy,
};

/// The node label that gives instances their `zone`.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The field manager of this operator's server-side-applied status.
pub const FIELD_MANAGER: &str = "eureka-operator";

/// The controller's configuration (validated by `config`).
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Names this cluster's pod instances (`k8s.cluster` metadata).
    pub cluster_id: String,
    /// The name people read (`k8s.clusterName` metadata, `{clusterName}` in instance ids).
    pub cluster_name: String,
    /// For `hostName: PodFQDN`.
    pub cluster_domain: String,
    /// Namespaces to watch; all when empty.
    pub namespaces: Vec<String>,
    /// Longest wait between retries of a failed Kubernetes write.
    pub max_backoff: Duration,
    /// Longest wait between retries of a failing watch.
    pub watch_max_backoff: Duration,
    /// EurekaApps reconciled at once, per controller (one per watched scope).
    pub reconcile_concurrency: u16,
    /// How long the apiserver keeps one watch request open.
    pub watch_timeout_seconds: u32,
    /// Pods per page of the pod watch's lists.
    pub pod_watch_page_size: u32,
    /// How often pod instances of gone EurekaApps are looked for.
    pub sweep_interval: Duration,
    /// The readiness-gate task's pace (`--readiness-gate-*`).
    pub gates: gates::GateTiming,
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
pub struct ControllerMetrics {
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
    /// Shared with every watch of the process; registered by `k8s::SubsystemMetrics`.
    pub watch_failing: crate::k8s::watch::WatchFailing,
    /// Per-EurekaApp figures (`eureka_eurekaapp_*`).
    pub apps: figures::AppFigures,
    /// From a pod's Ready transition to its instance UP in this replica's registry.
    pub ready_to_up: Histogram,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        ControllerMetrics {
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
            watch_failing: Default::default(),
            apps: Default::default(),
            // 0.25 s to ~17 min; the Ready time has whole seconds.
            ready_to_up: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.25, 2.0, 13,
            )),
        }
    }
}

impl ControllerMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(self.apps.clone()));
        let r = registry.sub_registry_with_prefix("controller");
        r.register(
            "pod_ready_to_up_seconds",
            "From a pod's Ready transition (lastTransitionTime, whole seconds) to its instance UP in this replica's registry",
            self.ready_to_up.clone(),
        );
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

/// What every reconcile shares.
pub struct Context {
    client: Client,
    state: AppState,
    settings: ControllerConfig,
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
    metrics: ControllerMetrics,
    /// When this replica started watching (ms): pods ready before are not timed Ready → UP.
    watching_since: i64,
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
    /// The pods waiting for their readiness gate, which the leader's reconciles hand the gate
    /// task ([`gates`]).
    gates: gates::Gates,
    /// The applications EurekaApps mark `clusterLocal` (never exported over links).
    cluster_local: crate::links::ClusterLocal,
}

/// What the controller works with.
pub struct ControllerWiring {
    pub client: Client,
    pub state: AppState,
    /// Whether this replica holds the Lease.
    pub leader: crate::leadership::Leader,
    pub recorder: Recorder,
    pub metrics: ControllerMetrics,
    pub health: Arc<Health>,
    /// Met once every watch listed and every EurekaApp was reconciled.
    pub complete: Condition,
    /// The peers (the readiness gate asks every ready replica for the instance).
    pub peers: watch::Receiver<Vec<Peer>>,
    pub peer_client: PeerClient,
    /// Told which applications EurekaApps mark `clusterLocal`.
    pub cluster_local: crate::links::ClusterLocal,
}

/// Builds the controllers and runs them, the pod and node watches, the sweep and the gate task,
/// until shutdown.
pub async fn run(settings: ControllerConfig, parts: ControllerWiring, shutdown: Shutdown) -> anyhow::Result<()> {
    let ControllerWiring {
        client,
        state,
        leader,
        recorder,
        metrics,
        health,
        complete,
        peers,
        peer_client,
        cluster_local,
    } = parts;
    let scopes = Scope::of(&settings.namespaces);
    let settings_gates = settings.gates;
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
        settings.reconcile_concurrency,
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
        cluster_local,
        gates: gates::Gates::new(settings_gates),
        // Whole seconds, as the pods' Ready times are.
        watching_since: state.now() / 1000 * 1000,
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
        ended = ctx.clone().background(leader.clone()) => ended,
        ended = ctx.clone().open_gates(leader) => ended,
        ended = forget => ended,
    }
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
        concurrency: u16,
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
                // 0 is kube-runtime's "no bound".
                .with_config(kube::runtime::controller::Config::default().concurrency(
                    if crate::mutants::on("unbounded-reconciles") {
                        0
                    } else {
                        concurrency
                    },
                ))
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

type RunResult = Result<(ObjectRef<EurekaApp>, Action), kube::runtime::controller::Error<Error, watcher::Error>>;

impl Context {
    /// Reports what a controller's run stream says: its EurekaApp watch failing shows in the log,
    /// the metrics and `/readyz` (failed reconciles are reported by the error policy).
    fn controller_result(&self, result: RunResult) {
        use kube::runtime::controller::Error as RunError;
        const SOURCE: &str = "watch of EurekaApps";
        let failing = self
            .metrics
            .watch_failing
            .get_or_create(&crate::k8s::watch::WatchLabel {
                watch: "EurekaApps".to_string(),
            });
        match result {
            Ok(_) => {
                failing.set(0);
                self.health.clear(SOURCE)
            }
            Err(RunError::QueueError(e)) => {
                failing.set(1);
                self.metrics.watch_errors.inc();
                tracing::warn!(error = %e, "the EurekaApp watch failed (is the CRD installed?); retrying");
                self.health
                    .warn(SOURCE, format!("failing ({e}); retrying with backoff"));
            }
            Err(e) => tracing::debug!(error = %e, "reconcile request not run"),
        }
    }
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
    ctx.metrics.apps.set(&key, applied.status.as_ref());
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

#[cfg(test)]
mod tests;
