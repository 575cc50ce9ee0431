//! Wires the process from its configuration: the registry and its state, then the subsystems —
//! cluster (Lease, controller, override persistence, replica discovery; only when a cluster is
//! found), peers, replication (with the start-up sync), the API listeners and the timers — each
//! started as tasks owned by one [`Supervisor`]. A task that ends unexpectedly stops the process
//! with a non-zero exit (Kubernetes restarts it); SIGTERM drains every task within the grace
//! period: the Lease is released, in-flight requests finish, replication queues are flushed.

pub mod supervisor;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use tokio::sync::watch;

use crate::{
    api::{self, Api},
    config::{Args, KubernetesArgs, KubernetesMode},
    health::Health,
    k8s,
    metrics::{Metrics, RegistryCollector},
    registry::{Registry, RegistryConfig},
    replication::{self, client::PeerUrl, peers as peer_list},
    state::{AppState, Clock, SystemClock},
    timers,
    tls::{self, ServerTls},
};
use supervisor::{Expect, Supervisor};

/// Resolves when the process is asked to stop (SIGTERM or Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Who this replica is, read once from the flags and the pod's environment.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `--replica-id`, else the pod name, else the host name.
    pub replica: String,
    /// The host peers reach the Eureka listener at.
    pub host: String,
    /// `POD_IP` (the downward API), if set.
    pub pod_ip: Option<String>,
    /// `POD_NAME`, if set.
    pub pod_name: Option<String>,
}

impl Identity {
    pub fn read(flag: Option<&str>, bind: std::net::SocketAddr) -> Identity {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let hostname = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty());
        let pod_name = env("POD_NAME");
        let pod_ip = env("POD_IP");
        let replica = flag
            .map(str::to_string)
            .or_else(|| pod_name.clone())
            .or_else(|| hostname.clone())
            .unwrap_or_else(|| format!("eureka-operator-{}", std::process::id()));
        let host = if bind.ip().is_unspecified() {
            pod_ip.clone().or(hostname).unwrap_or_else(|| "localhost".into())
        } else {
            bind.ip().to_string()
        };
        Identity {
            replica,
            host,
            pod_ip,
            pod_name,
        }
    }
}

/// The cluster configuration, or `None` to run standalone.
async fn cluster_config(args: &KubernetesArgs) -> anyhow::Result<Option<kube::Config>> {
    match args.kubernetes {
        KubernetesMode::Off => Ok(None),
        KubernetesMode::On => {
            Ok(Some(kube::Config::infer().await.context(
                "failed to find a Kubernetes configuration (--kubernetes on)",
            )?))
        }
        KubernetesMode::Auto => match kube::Config::infer().await {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                tracing::info!(reason = %e, "no Kubernetes cluster found: running as a standalone Eureka server");
                Ok(None)
            }
        },
    }
}

/// The namespace of the operator itself (for its Lease and its headless Service).
fn operator_namespace(args: &KubernetesArgs, config: &kube::Config) -> String {
    args.operator_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| config.default_namespace.clone())
}

/// Runs the operator until it is asked to stop (`Ok`) or one of its tasks fails (`Err`).
pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        bind,
        admin_bind,
        log: _,
        log_format: _,
        max_request_body_bytes,
        shutdown_grace_ms,
        serving,
        server,
        auth,
        peers,
        kubernetes,
        limits,
    } = args;
    let mut supervisor = Supervisor::new(Duration::from_millis(shutdown_grace_ms));
    let health = Health::new(supervisor.liveness());
    tls::install_default_provider();
    let server_tls = serving
        .server_tls()
        .map(ServerTls::load)
        .transpose()
        .context("failed to set up TLS for the Eureka API")?;
    let peer_tls = serving
        .peer_tls()
        .map(|settings| tls::peer_tls(&settings))
        .transpose()
        .context("failed to set up TLS toward peers")?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let started_at = clock.now_ms();
    let registry_config = RegistryConfig {
        limits: limits.registry_limits(),
        ..server.registry_config()
    };
    let state = AppState::new(Registry::new(registry_config, started_at), clock, server.disable_delta);
    let metrics = Metrics::new();
    metrics.with_prometheus(|r| r.register_collector(Box::new(RegistryCollector(state.clone()))));
    let access = auth.access()?;
    let me = Identity::read(peers.replica_id.as_deref(), bind);
    // Completeness conditions are registered before anything serves.
    let synced = health.condition("registry synced from peers");

    // The peer list is filled by the peers subsystem below; the cluster subsystem reads it too.
    let (peers_tx, peers_rx) = watch::channel(Vec::new());
    let mut replication_settings = peers.replication_settings(&me.replica, access.as_ref());
    replication_settings.tls = peer_tls;
    let peer_client = replication::client::PeerClient::from_settings(&replication_settings);

    // Cluster: the Lease decides who runs the background jobs and writes to Kubernetes.
    let config = cluster_config(&kubernetes).await?;
    let (leader_tx, leader_rx) = watch::channel(config.is_none());
    // Standalone, leadership never changes: the sender lives as long as `run`.
    let mut _standalone_leader = None;
    let cluster = match config {
        None => {
            _standalone_leader = Some(leader_tx);
            None
        }
        Some(config) => {
            let namespace = operator_namespace(&kubernetes, &config);
            let settings = kubernetes.cluster_settings(&namespace, &peers, &me);
            let wiring = k8s::Wiring {
                state: state.clone(),
                health: health.clone(),
                leader: leader_tx,
                metrics: metrics.clone(),
                reconciled: health.condition("Kubernetes watches listed and EurekaApps reconciled"),
                peers: peers_rx.clone(),
                peer_client,
            };
            Some(k8s::start(config, settings, wiring, &mut supervisor)?)
        }
    };
    let leader_gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    metrics.with_prometheus(|r| {
        r.register(
            "leader",
            "1 while this replica holds the Lease (always without Kubernetes)",
            leader_gauge.clone(),
        )
    });
    supervisor.spawn(
        "leader gauge",
        Expect::RunsForever,
        follow_leader(leader_rx.clone(), leader_gauge, supervisor.shutdown()),
    );

    // Peers: static replicas, discovered replicas and Java peers, never this replica.
    // Replicas found through the headless Service are reached like this one serves.
    let discovery = peer_list::Discovery {
        own: peer_list::OwnAddress {
            url: peers.my_url.as_deref().and_then(PeerUrl::parse),
            bind,
            host: me.host.clone(),
        },
        https: server_tls.is_some(),
    };
    let static_replicas = peer_list::parse_urls(&peers.peer_urls, "peer")?;
    let java = peer_list::parse_urls(&peers.java_peer_urls, "Java peer")?;
    let (discovered, cluster_id) = match &cluster {
        Some(c) => (c.discovered.clone(), c.cluster_id.clone()),
        None => (watch::channel(Some(Vec::new())).1, watch::channel(None).1),
    };
    peers_tx.send_replace(peer_list::merge(&static_replicas, &[], &java, &discovery));
    supervisor.spawn(
        "peer list",
        Expect::RunsForever,
        peer_list::run(
            static_replicas,
            java,
            discovery,
            discovered.clone(),
            peers_tx,
            supervisor.shutdown(),
        ),
    );

    // Replication, with the start-up sync that opens the registry for traffic.
    let replication_metrics = replication::Metrics::default();
    metrics.with_prometheus(|r| replication_metrics.register(r));
    let wiring = replication::Wiring {
        state: state.clone(),
        leader: leader_rx.clone(),
        health: health.clone(),
        peers: peers_rx.clone(),
        discovered,
        cluster_id,
        in_cluster: cluster.is_some(),
        synced,
    };
    replication::start(
        replication_settings,
        server.sync_retries(),
        wiring,
        replication_metrics,
        &mut supervisor,
    );

    // Serve (before the sync ends, so replicas that start together can reach each other).
    let api = Api {
        state: state.clone(),
        metrics,
        health,
        max_body: max_request_body_bytes,
        input: api::negotiate::Decoding::new(limits.input_limits()),
        started_at,
        environment: kubernetes
            .cluster_id
            .clone()
            .unwrap_or_else(|| if cluster.is_some() { "kubernetes" } else { "standalone" }.into()),
        peers: peers_rx,
        leadership: cluster.as_ref().map(|_| leader_rx.clone()),
        identity: Arc::new(api::identity(&me.replica, &me.host, bind.port(), started_at)),
    };
    let listeners = api::Listeners {
        eureka: bind,
        admin: admin_bind,
        http: serving.http(),
        tls: server_tls,
    };
    api::start(listeners, api, access, &mut supervisor).await?;
    supervisor.spawn(
        "timers",
        Expect::RunsForever,
        timers::run(state, server.intervals(), leader_rx, supervisor.shutdown()),
    );
    supervisor.run(shutdown_signal()).await?;
    Ok(())
}

/// Mirrors leadership into the `leader` gauge.
async fn follow_leader(
    mut rx: watch::Receiver<bool>,
    gauge: prometheus_client::metrics::gauge::Gauge<i64>,
    shutdown: supervisor::Shutdown,
) -> anyhow::Result<()> {
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        gauge.set(i64::from(*rx.borrow_and_update()));
        tokio::select! {
            _ = &mut stop => return Ok(()),
            changed = rx.changed() => {
                if changed.is_err() {
                    // The Lease task stopped: only at shutdown.
                    stop.as_mut().await;
                    return Ok(());
                }
            }
        }
    }
}
