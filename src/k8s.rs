//! Everything that talks to Kubernetes lives under this module: the `EurekaApp` resource, the
//! Pod index fed by watches, the pure plan from (EurekaApp, pods) to instances, the controller that
//! applies plans to the registry and writes statuses, the persistence of REST overrides on pods,
//! the Lease election, and the discovery of the other replicas. [`start`] starts them all as
//! supervised tasks (the cluster subsystem).

pub mod controller;
pub mod crd;
pub mod index;
pub mod lease;
pub mod overrides;
pub mod peers;
pub mod plan;
pub mod pods;
pub mod status;
pub mod watch;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, watch as channel};

use crate::{
    health::{Condition, Health},
    state::AppState,
    supervisor::{Expect, Shutdown, Supervisor},
};

/// The cluster subsystem's configuration (validated by `config`).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// `--cluster-id`; `None` derives it from the `kube-system` namespace's UID.
    pub cluster_id: Option<String>,
    /// `--cluster-name`; `None` reads the `cluster.clusterset.k8s.io` ClusterProperty, else
    /// takes the cluster id.
    pub cluster_name: Option<String>,
    pub cluster_domain: String,
    pub namespaces: Vec<String>,
    /// Where the operator's Lease lives.
    pub lease: lease::LeaseConfig,
    /// The headless Service whose EndpointSlices list the replicas (`namespace`, `name`).
    pub peer_service: Option<(String, String)>,
    /// This replica's pod name and IP, so it is never its own peer.
    pub me: peers::OwnPod,
    pub max_backoff: Duration,
    /// Longest wait between retries of a failing watch.
    pub watch_max_backoff: Duration,
    /// EurekaApps reconciled at once, per controller.
    pub reconcile_concurrency: u16,
    /// How long the apiserver keeps one watch request open (`--watch-timeout-seconds`).
    pub watch_timeout_seconds: u32,
    /// Pods per page of the pod watch's lists.
    pub pod_watch_page_size: u32,
    pub sweep_interval: Duration,
    /// The readiness-gate task's pace.
    pub gates: controller::gates::GateTiming,
}

/// What the rest of the process gets from the cluster subsystem.
pub struct Cluster {
    /// This cluster's id, once known.
    pub cluster_id: channel::Receiver<Option<String>>,
    /// The replicas found through the headless Service (`None` until the first list; always
    /// `Some(empty)` without `--peer-service`).
    pub discovered: channel::Receiver<Option<Vec<crate::replication::peers::ReplicaEndpoint>>>,
}

/// Failures of the cluster subsystem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error(
        "failed to read the kube-system namespace to derive the cluster id (set --cluster-id, or let the operator get namespaces/kube-system): {0}"
    )]
    ClusterId(#[source] kube::Error),
}

/// What the cluster subsystem's tasks share with the rest of the process.
pub struct ClusterWiring {
    pub state: AppState,
    pub health: Arc<Health>,
    pub leader: channel::Sender<crate::leadership::Lead>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Met once every watch listed and every EurekaApp was reconciled.
    pub reconciled: Condition,
    /// The peers (the readiness gate asks every ready replica).
    pub peers: channel::Receiver<Vec<crate::replication::Peer>>,
    /// How replicas are asked.
    pub peer_client: crate::replication::client::PeerClient,
    /// The applications never exported over links (EurekaApps with `clusterLocal`).
    pub cluster_local: crate::links::ClusterLocal,
}

/// Starts the Lease election, the controller, the override persister and replica discovery.
pub fn start(
    config: kube::Config,
    settings: ClusterConfig,
    wiring: ClusterWiring,
    supervisor: &mut Supervisor,
) -> Result<Cluster, Error> {
    let client = Client::try_from(config).map_err(Error::Client)?;
    let leader = wiring.leader.subscribe();
    tracing::info!(lease = %format!("{}/{}", settings.lease.namespace, settings.lease.name), identity = %settings.lease.identity, "running the controller");
    let shutdown = supervisor.shutdown();
    supervisor.spawn(
        "lease election",
        Expect::RunsForever,
        lease_task(client.clone(), settings.lease.clone(), wiring.leader, shutdown),
    );
    let metrics = SubsystemMetrics::registered(&wiring.metrics);
    let watch_failing = metrics.controller.watch_failing.clone();
    start_override_persister(
        &client,
        &settings,
        &wiring.state,
        leader.clone(),
        metrics.overrides,
        supervisor,
    );
    let (id_tx, id_rx) = channel::channel(settings.cluster_id.clone());
    let controller = ControllerTask {
        client: client.clone(),
        leader,
        metrics: metrics.controller,
        cluster_id: id_tx,
        state: wiring.state,
        health: wiring.health.clone(),
        reconciled: wiring.reconciled,
        peers: wiring.peers,
        peer_client: wiring.peer_client,
        cluster_local: wiring.cluster_local,
    };
    start_controller(settings.clone(), controller, supervisor);
    let discovered = start_replica_discovery(
        client,
        settings,
        (metrics.discovery_watch_errors, watch_failing),
        wiring.health,
        supervisor,
    );
    Ok(Cluster {
        cluster_id: id_rx,
        discovered,
    })
}

/// The metrics of the cluster subsystem's tasks, registered once.
pub(crate) struct SubsystemMetrics {
    controller: controller::ControllerMetrics,
    overrides: overrides::OverrideMetrics,
    discovery_watch_errors: Counter,
}

impl SubsystemMetrics {
    pub(crate) fn registered(metrics: &crate::metrics::Metrics) -> Self {
        let this = Self {
            controller: controller::ControllerMetrics::default(),
            overrides: overrides::OverrideMetrics::default(),
            discovery_watch_errors: Counter::default(),
        };
        metrics.with_prometheus(|r| {
            this.controller.register(r);
            this.overrides.register(r);
            watch::register_failing(&this.controller.watch_failing, r);
            r.register(
                "replica_discovery_watch_errors",
                "EndpointSlice watch errors (retried with backoff)",
                this.discovery_watch_errors.clone(),
            );
        });
        this
    }
}

/// Writes REST status overrides of pod instances onto their pods, woken by registry changes.
fn start_override_persister(
    client: &Client,
    settings: &ClusterConfig,
    state: &AppState,
    leader: crate::leadership::Leader,
    metrics: overrides::OverrideMetrics,
    supervisor: &mut Supervisor,
) {
    let wake = Arc::new(Notify::new());
    state.add_listener(Arc::new(overrides::Waker(wake.clone())));
    let task = overrides::run(
        client.clone(),
        state.clone(),
        leader,
        wake,
        settings.max_backoff,
        metrics,
        supervisor.shutdown(),
    );
    supervisor.spawn("status override persister", Expect::RunsForever, task);
}

/// What the controller task takes from the subsystem.
struct ControllerTask {
    client: Client,
    leader: crate::leadership::Leader,
    metrics: controller::ControllerMetrics,
    /// Told the cluster id once it is known.
    cluster_id: channel::Sender<Option<String>>,
    state: AppState,
    health: Arc<Health>,
    reconciled: Condition,
    peers: channel::Receiver<Vec<crate::replication::Peer>>,
    peer_client: crate::replication::client::PeerClient,
    cluster_local: crate::links::ClusterLocal,
}

/// The controller: it learns the cluster id, then reconciles until shutdown.
fn start_controller(settings: ClusterConfig, wiring: ControllerTask, supervisor: &mut Supervisor) {
    let recorder = kube::runtime::events::Recorder::new(
        wiring.client.clone(),
        kube::runtime::events::Reporter {
            controller: "eureka-operator".into(),
            instance: Some(settings.lease.identity.clone()),
        },
    );
    let shutdown = supervisor.shutdown();
    supervisor.spawn("controller", Expect::RunsForever, async move {
        wiring.reconciled.waiting("waiting for the cluster id");
        let Some(cluster_id) = cluster_id(&wiring.client, settings.cluster_id.as_deref(), &shutdown).await? else {
            return Ok(());
        };
        let cluster_name = match settings.cluster_name {
            Some(name) => name,
            None => clusterset_name(&wiring.client)
                .await
                .unwrap_or_else(|| cluster_id.clone()),
        };
        tracing::info!(cluster_id = %cluster_id, cluster_name = %cluster_name, "cluster identity");
        wiring.cluster_id.send_replace(Some(cluster_id.clone()));
        let controller_settings = controller::ControllerConfig {
            cluster_id,
            cluster_name,
            cluster_domain: settings.cluster_domain,
            namespaces: settings.namespaces,
            max_backoff: settings.max_backoff,
            watch_max_backoff: settings.watch_max_backoff,
            watch_timeout_seconds: settings.watch_timeout_seconds,
            reconcile_concurrency: settings.reconcile_concurrency,
            pod_watch_page_size: settings.pod_watch_page_size,
            sweep_interval: settings.sweep_interval,
            gates: settings.gates,
        };
        let parts = controller::ControllerWiring {
            client: wiring.client,
            state: wiring.state,
            leader: wiring.leader,
            recorder,
            metrics: wiring.metrics,
            health: wiring.health,
            complete: wiring.reconciled,
            peers: wiring.peers,
            peer_client: wiring.peer_client,
            cluster_local: wiring.cluster_local,
        };
        controller::run(controller_settings, parts, shutdown).await
    });
}

/// Watches the headless Service's EndpointSlices for the other replicas; without
/// `--peer-service` the list is empty from the start.
fn start_replica_discovery(
    client: Client,
    settings: ClusterConfig,
    watch_errors: (Counter, watch::WatchFailing),
    health: Arc<Health>,
    supervisor: &mut Supervisor,
) -> channel::Receiver<Option<Vec<crate::replication::peers::ReplicaEndpoint>>> {
    let (found_tx, found_rx) = channel::channel(Some(Vec::new()));
    if let Some(service) = settings.peer_service {
        found_tx.send_replace(None);
        let task = peers::watch_replicas(
            client,
            service,
            settings.me,
            found_tx,
            (
                watch::Backoff::new(settings.watch_max_backoff),
                settings.watch_timeout_seconds,
            ),
            watch_errors,
            health,
            supervisor.shutdown(),
        );
        supervisor.spawn("replica discovery", Expect::RunsForever, task);
    } else {
        // Keep the sender alive with the process, so the peer list never sees it close.
        let shutdown = supervisor.shutdown();
        supervisor.spawn("replica discovery", Expect::RunsForever, async move {
            shutdown.wait().await;
            drop(found_tx);
            Ok(())
        });
    }
    found_rx
}

/// The Lease election as a supervised task: it ends only on shutdown (after releasing the Lease).
async fn lease_task(
    client: Client,
    config: lease::LeaseConfig,
    tx: channel::Sender<crate::leadership::Lead>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    lease::run(client, config, tx, shutdown.wait()).await?;
    Ok(())
}

/// A cluster name: what `{clusterName}` puts in instance ids and links will be named by, so
/// DNS-label-like: lowercase letters, digits, `-` and `.`, starting and ending with a letter or
/// digit, at most 63 characters.
pub fn parse_cluster_name(s: &str) -> Result<String, String> {
    let ok_edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && ok_edge(s.chars().next())
        && ok_edge(s.chars().last());
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a cluster name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 63 characters"
        ))
    }
}

/// The name of this cluster in its ClusterSet: the value of the `cluster.clusterset.k8s.io`
/// ClusterProperty (`about.k8s.io`, KEP-2149), read once at start; `None` when the API is not
/// installed, the property is absent, unreadable (RBAC) or not a valid cluster name. A change
/// takes effect at the next start, as the KEP expects the property to live as long as the cluster's
/// membership.
async fn clusterset_name(client: &Client) -> Option<String> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    const PROPERTY: &str = "cluster.clusterset.k8s.io";
    let gvk = GroupVersionKind::gvk("about.k8s.io", "v1alpha1", "ClusterProperty");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let value = match api.get_opt(PROPERTY).await {
        Ok(Some(p)) => p.data["spec"]["value"].as_str().map(str::to_string)?,
        Ok(None) => return None,
        Err(kube::Error::Api(s)) if s.code == 404 => return None,
        Err(e) => {
            tracing::warn!(error = %e, property = PROPERTY, "could not read the ClusterProperty; naming the cluster by its id");
            return None;
        }
    };
    match parse_cluster_name(&value) {
        Ok(name) => Some(name),
        Err(e) => {
            tracing::warn!(error = %e, property = PROPERTY, "ignoring the ClusterProperty's value; naming the cluster by its id");
            None
        }
    }
}

/// The cluster id: the flag, else the UID of `kube-system` (unique per cluster), retried with
/// backoff while the apiserver cannot be reached. `None` when shutdown came first.
async fn cluster_id(client: &Client, flag: Option<&str>, shutdown: &Shutdown) -> Result<Option<String>, Error> {
    if let Some(id) = flag {
        return Ok(Some(id.to_string()));
    }
    let api: Api<Namespace> = Api::all(client.clone());
    let mut delay = Duration::from_millis(200);
    loop {
        match api.get("kube-system").await {
            Ok(ns) => {
                if let Some(uid) = ns.metadata.uid {
                    return Ok(Some(uid));
                }
            }
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                return Err(Error::ClusterId(kube::Error::Api(s)));
            }
            Err(e) => tracing::warn!(error = %e, "could not read kube-system to derive the cluster id; retrying"),
        }
        tokio::select! {
            _ = shutdown.clone().wait() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}
