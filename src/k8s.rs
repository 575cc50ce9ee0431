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
    runtime::supervisor::{Expect, Shutdown, Supervisor},
    state::AppState,
};

/// Settings of the cluster subsystem (validated by `config`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--cluster-id`; `None` derives it from the `kube-system` namespace's UID.
    pub cluster_id: Option<String>,
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
    pub sweep_interval: Duration,
}

/// What the rest of the process gets from the cluster subsystem.
pub struct Cluster {
    /// This cluster's id, once known.
    pub cluster_id: channel::Receiver<Option<String>>,
    /// The replicas found through the headless Service (`None` until the first list; always
    /// `Some(empty)` without `--peer-service`).
    pub discovered: channel::Receiver<Option<Vec<peers::ReplicaEndpoint>>>,
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
pub struct Wiring {
    pub state: AppState,
    pub health: Arc<Health>,
    pub leader: channel::Sender<bool>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Met once every watch listed and every EurekaApp was reconciled.
    pub reconciled: Condition,
    /// The peers (the readiness gate asks every ready replica).
    pub peers: channel::Receiver<Vec<crate::replication::Peer>>,
    /// How replicas are asked.
    pub peer_client: crate::replication::client::PeerClient,
}

/// Starts the Lease election, the controller, the override persister and replica discovery.
pub fn start(
    config: kube::Config,
    settings: Settings,
    wiring: Wiring,
    supervisor: &mut Supervisor,
) -> Result<Cluster, Error> {
    let client = Client::try_from(config).map_err(Error::Client)?;
    let leader_rx = wiring.leader.subscribe();
    let identity = settings.lease.identity.clone();
    tracing::info!(lease = %format!("{}/{}", settings.lease.namespace, settings.lease.name), identity = %identity, "running the controller");
    let shutdown = supervisor.shutdown();
    supervisor.spawn(
        "lease election",
        Expect::RunsForever,
        lease_task(client.clone(), settings.lease.clone(), wiring.leader, shutdown),
    );

    let (id_tx, id_rx) = channel::channel(settings.cluster_id.clone());
    let controller_metrics = controller::Metrics::default();
    let override_metrics = overrides::Metrics::default();
    let watch_errors = Counter::default();
    wiring.metrics.with_prometheus(|r| {
        controller_metrics.register(r);
        override_metrics.register(r);
        r.register(
            "replica_discovery_watch_errors",
            "EndpointSlice watch errors (retried with backoff)",
            watch_errors.clone(),
        );
    });

    let wake = Arc::new(Notify::new());
    wiring.state.add_listener(Arc::new(overrides::Waker(wake.clone())));
    supervisor.spawn(
        "status override persister",
        Expect::RunsForever,
        overrides::run(
            client.clone(),
            wiring.state.clone(),
            leader_rx.clone(),
            wake,
            settings.max_backoff,
            override_metrics,
            supervisor.shutdown(),
        ),
    );

    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "eureka-operator".into(),
            instance: Some(identity),
        },
    );
    let shutdown = supervisor.shutdown();
    let ctl_client = client.clone();
    let health = wiring.health.clone();
    let state = wiring.state.clone();
    let reconciled = wiring.reconciled;
    let ctl_settings = settings.clone();
    let (peers, peer_client) = (wiring.peers, wiring.peer_client);
    supervisor.spawn("controller", Expect::RunsForever, async move {
        reconciled.waiting("waiting for the cluster id");
        let cluster_id = cluster_id(&ctl_client, ctl_settings.cluster_id.as_deref(), &shutdown).await?;
        let Some(cluster_id) = cluster_id else { return Ok(()) };
        tracing::info!(cluster_id = %cluster_id, "cluster identity");
        id_tx.send_replace(Some(cluster_id.clone()));
        let controller_settings = controller::Settings {
            cluster_id,
            cluster_domain: ctl_settings.cluster_domain,
            namespaces: ctl_settings.namespaces,
            max_backoff: ctl_settings.max_backoff,
            watch_max_backoff: ctl_settings.watch_max_backoff,
            sweep_interval: ctl_settings.sweep_interval,
        };
        let parts = controller::Parts {
            client: ctl_client,
            state,
            leader: leader_rx,
            recorder,
            metrics: controller_metrics,
            health,
            complete: reconciled,
            peers,
            peer_client,
        };
        controller::run(controller_settings, parts, shutdown).await
    });

    let (found_tx, found_rx) = channel::channel(Some(Vec::new()));
    if let Some((namespace, name)) = settings.peer_service {
        found_tx.send_replace(None);
        supervisor.spawn(
            "replica discovery",
            Expect::RunsForever,
            peers::watch_replicas(
                client,
                (namespace, name),
                settings.me,
                found_tx,
                watch::Backoff::new(settings.watch_max_backoff),
                watch_errors,
                wiring.health,
            ),
        );
    } else {
        // Keep the sender alive with the process, so the peer list never sees it close.
        let shutdown = supervisor.shutdown();
        supervisor.spawn("replica discovery", Expect::RunsForever, async move {
            shutdown.wait().await;
            drop(found_tx);
            Ok(())
        });
    }
    Ok(Cluster {
        cluster_id: id_rx,
        discovered: found_rx,
    })
}

/// The Lease election as a supervised task: it ends only on shutdown (after releasing the Lease).
async fn lease_task(
    client: Client,
    config: lease::LeaseConfig,
    tx: channel::Sender<bool>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    lease::run(client, config, tx, shutdown.wait()).await?;
    Ok(())
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
