//! Wires the process from its configuration: the registry and its state, then the subsystems —
//! cluster (Lease, controller, override persistence, replica discovery; only when a cluster is
//! found), peers, replication (with the start-up sync), the API listeners and the timers — each
//! started as tasks owned by one [`Supervisor`]. A task that ends unexpectedly stops the process
//! with a non-zero exit (Kubernetes restarts it); SIGTERM drains every task within the grace
//! period: the Lease is released, in-flight requests finish, replication queues are flushed.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use tokio::sync::watch;

use crate::supervisor::{Expect, Supervisor};
use crate::{
    api::{self, Api},
    config::{Args, KubernetesArgs, KubernetesMode, identity::Identity},
    health::Health,
    k8s,
    leadership::Lead,
    links,
    metrics::{Metrics, RegistryCollector},
    registry::{Registry, RegistryConfig},
    replication::{self, client::PeerUrl, peers as peer_list},
    state::{AppState, Clock, SystemClock},
    timers,
    tls::{self, ServerTls},
};

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

/// Resolves when the tasks should drain: on the first signal `/readyz` starts failing and every
/// response says `Connection: close`, while everything keeps running for `delay` (endpoints and
/// kube-proxy learn that the replica is going and send new connections elsewhere); a second
/// signal ends the delay early.
async fn stop_requested(delay: Duration, health: Arc<Health>) {
    shutdown_signal().await;
    health.stop();
    if delay.is_zero() {
        return;
    }
    tracing::info!(
        delay_ms = delay.as_millis() as u64,
        "asked to stop: not ready from now on; serving until the shutdown delay ends, then draining"
    );
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown_signal() => tracing::info!("asked again: draining now"),
    }
}

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The cluster configuration, or `None` to run standalone.
async fn cluster_config(args: &KubernetesArgs) -> anyhow::Result<Option<kube::Config>> {
    let mut config = found_cluster(args).await?;
    if let Some(config) = &mut config {
        args.tune_client(config).map_err(anyhow::Error::msg)?;
    }
    Ok(config)
}

async fn found_cluster(args: &KubernetesArgs) -> anyhow::Result<Option<kube::Config>> {
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

/// What every subsystem shares: the registry's state, metrics and health.
struct Shared {
    state: AppState,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// When the process started (ms).
    started_at: i64,
}

/// Runs the operator until it is asked to stop (`Ok`) or one of its tasks fails (`Err`).
pub async fn run(args: Args) -> anyhow::Result<()> {
    crate::mutants::check()?;
    let mut supervisor = Supervisor::new(Duration::from_millis(args.shutdown_grace_ms));
    tls::install_default_provider();
    let guard = Guard {
        tls: args
            .serving
            .server_tls()
            .map(ServerTls::load)
            .transpose()
            .context("failed to set up TLS for the Eureka API")?,
        access: args.auth.access()?,
    };
    // Listening first: replicas started together then find each other starting, not down.
    let bound = (
        api::Bound::bind("Eureka", args.bind).await?,
        api::Bound::bind("admin", args.admin_bind).await?,
    );
    let shared = shared(&args.server, &args.limits, Health::new(supervisor.liveness()));
    let me = Identity::read(args.peers.replica_id.as_deref(), args.bind);
    // Completeness conditions are registered before anything serves.
    let synced = shared.health.condition("registry synced from peers");
    let links_synced = shared
        .health
        .condition("links to other clusters answered (or the start-up timeout passed)");

    // The peer list is filled by the peers subsystem; the cluster subsystem reads it too.
    let (peers_tx, peers_rx) = watch::channel(Vec::new());
    let replication_settings = replication_settings(&args.peers, &args.serving, &me, guard.access.as_ref())?;
    let peer_client = replication::client::PeerClient::from_config(&replication_settings);
    let cluster_local = links::ClusterLocal::new(args.links.cluster_local());
    let cluster = start_cluster(
        &args.kubernetes,
        &args.peers,
        &me,
        (&shared, &cluster_local),
        peers_rx.clone(),
        peer_client,
        &mut supervisor,
    )
    .await?;
    let own = peer_list::OwnAddress {
        url: args.peers.my_url.as_deref().and_then(PeerUrl::parse),
        bind: args.bind,
        host: me.host.clone(),
    };
    let https = guard.tls.is_some();
    let listed = start_peer_list(&args.peers, own, https, &cluster, peers_tx, &mut supervisor)?;
    let retries = args.server.sync_retries();
    start_replication(
        replication_settings,
        retries,
        &shared,
        &cluster,
        (peers_rx.clone(), listed),
        synced,
        &mut supervisor,
    );
    let link_identity = links::Identity {
        flag: args.kubernetes.cluster_id.clone(),
        discovered: cluster.cluster_id.clone(),
        name: args.kubernetes.cluster_name.clone(),
    };
    let board = links::Board::default();
    start_links(
        &args.links,
        &shared,
        (link_identity.clone(), board.clone()),
        links_synced,
        &mut supervisor,
    )?;
    let serving = links::Serving {
        identity: link_identity,
        cluster_local: cluster_local.clone(),
        epoch: format!("{}@{}:{}-{}", me.replica, me.host, args.bind.port(), shared.started_at),
        max_changed_apps: args.links.link_max_changed_apps as usize,
        board,
    };
    // Serve before the sync ends, so replicas that start together can reach each other.
    start_api(
        &args,
        bound,
        guard,
        (&shared, &cluster, &me),
        (peers_rx, serving),
        &mut supervisor,
    )
    .await?;
    let (state, stop) = (shared.state.clone(), supervisor.shutdown());
    let ahead = async move {
        tokio::select! {
            () = state.build_payloads_ahead() => anyhow::bail!("failed to keep building payloads ahead: the builders ended"),
            () = stop.wait() => Ok(()),
        }
    };
    supervisor.spawn("payloads built ahead", Expect::RunsForever, ahead);
    let timers = timers::run(
        shared.state,
        args.server.intervals(),
        cluster.leader.clone(),
        supervisor.shutdown(),
    );
    supervisor.spawn("timers", Expect::RunsForever, timers);
    if crate::memory::TRIMMABLE && args.memory_trim_interval_ms > 0 {
        let metrics = crate::memory::TrimMetrics::default();
        shared.metrics.with_prometheus(|r| metrics.register(r));
        let interval = Duration::from_millis(args.memory_trim_interval_ms);
        let trims = crate::memory::run(interval, metrics, supervisor.shutdown());
        supervisor.spawn("memory trim", Expect::RunsForever, trims);
    }
    let delay = Duration::from_millis(args.shutdown_delay_ms);
    supervisor.run(stop_requested(delay, shared.health.clone())).await?;
    drop(cluster);
    Ok(())
}

/// What guards the Eureka listener: its TLS and the credentials it asks for.
struct Guard {
    tls: Option<Arc<ServerTls>>,
    access: Option<api::auth::Access>,
}

/// The Eureka listener (API and dashboard) and the admin listener, bound earlier.
#[allow(clippy::too_many_arguments)]
async fn start_api(
    args: &Args,
    (eureka, admin): (api::Bound, api::Bound),
    guard: Guard,
    (shared, cluster, me): (&Shared, &Cluster, &Identity),
    (peers, links): (watch::Receiver<Vec<replication::Peer>>, links::Serving),
    supervisor: &mut Supervisor,
) -> anyhow::Result<()> {
    let environment = args
        .kubernetes
        .cluster_id
        .clone()
        .unwrap_or_else(|| if cluster.in_cluster { "kubernetes" } else { "standalone" }.into());
    let api = Api {
        state: shared.state.clone(),
        metrics: shared.metrics.clone(),
        health: shared.health.clone(),
        max_body: args.max_request_body_bytes,
        input: api::negotiate::Decoding::new(args.limits.input_limits()),
        started_at: shared.started_at,
        environment,
        peers,
        leadership: cluster.in_cluster.then(|| cluster.leader.clone()),
        identity: Arc::new(api::identity(
            &me.replica,
            &me.host,
            args.bind.port(),
            shared.started_at,
        )),
        links: Some(Arc::new(links)),
    };
    let listeners = api::Listeners {
        eureka,
        admin,
        http: args.serving.http(),
        tls: guard.tls,
    };
    api::start(listeners, api, guard.access, supervisor).await?;
    Ok(())
}

/// The links to other clusters (nothing runs without `--remote-clusters-file`).
fn start_links(
    args: &crate::config::LinkArgs,
    shared: &Shared,
    (identity, board): (links::Identity, links::Board),
    synced: crate::health::Condition,
    supervisor: &mut Supervisor,
) -> anyhow::Result<()> {
    let metrics = links::LinkMetrics::default();
    shared.metrics.with_prometheus(|r| metrics.register(r));
    let wiring = links::LinksWiring {
        state: shared.state.clone(),
        health: shared.health.clone(),
        identity,
        metrics,
        board,
        synced,
    };
    links::start(args.links_config(), wiring, supervisor).context("failed to start the links to other clusters")?;
    Ok(())
}

/// How this replica replicates, TLS toward peers included.
fn replication_settings(
    peers: &crate::config::PeerArgs,
    serving: &crate::config::serving::ServingArgs,
    me: &Identity,
    access: Option<&api::auth::Access>,
) -> anyhow::Result<replication::ReplicationConfig> {
    let mut settings = peers.replication_settings(&me.replica, access);
    settings.tls = serving
        .peer_tls()
        .map(|tls| tls::peer_tls(&tls))
        .transpose()
        .context("failed to set up TLS toward peers")?;
    Ok(settings)
}

/// The registry, its state and the metrics that read it.
fn shared(
    server: &crate::config::ServerArgs,
    limits: &crate::config::limits::LimitArgs,
    health: Arc<Health>,
) -> Shared {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let started_at = clock.now_ms();
    let registry_config = RegistryConfig {
        limits: limits.registry_limits(),
        ..server.registry_config()
    };
    let state = AppState::new(
        Registry::new(registry_config, started_at),
        clock,
        server.disable_delta,
        server.cache_tuning(),
    );
    let metrics = Metrics::new();
    metrics.with_prometheus(|r| {
        r.register_collector(Box::new(RegistryCollector(state.clone())));
        r.register_collector(Box::new(crate::health::ReadyGauge(health.clone())));
    });
    Shared {
        state,
        metrics,
        health,
        started_at,
    }
}

/// What the cluster subsystem gives the others (inert values when standalone).
struct Cluster {
    /// Whether a cluster was found (false: standalone).
    in_cluster: bool,
    /// Whether this replica holds the Lease (always true standalone).
    leader: crate::leadership::Leader,
    /// Standalone, leadership never changes: the sender lives as long as `run`.
    _standalone_leader: Option<watch::Sender<crate::leadership::Lead>>,
    /// Replicas found through the headless Service (`None` until the first list).
    discovered: watch::Receiver<Option<Vec<replication::peers::ReplicaEndpoint>>>,
    /// The cluster's id (the kube-system namespace's UID).
    cluster_id: watch::Receiver<Option<String>>,
}

/// The cluster subsystem, when a cluster is found: the Lease decides who runs the background
/// jobs and writes to Kubernetes. Also the `leader` gauge.
async fn start_cluster(
    kubernetes: &KubernetesArgs,
    peers: &crate::config::PeerArgs,
    me: &Identity,
    (shared, cluster_local): (&Shared, &links::ClusterLocal),
    peers_rx: watch::Receiver<Vec<replication::Peer>>,
    peer_client: replication::client::PeerClient,
    supervisor: &mut Supervisor,
) -> anyhow::Result<Cluster> {
    let config = cluster_config(kubernetes).await?;
    let (leader_tx, leader) = watch::channel(if config.is_none() { Lead::Always } else { Lead::Follower });
    let cluster = match config {
        None => Cluster {
            in_cluster: false,
            leader,
            _standalone_leader: Some(leader_tx),
            discovered: watch::channel(Some(Vec::new())).1,
            cluster_id: watch::channel(None).1,
        },
        Some(config) => {
            let namespace = operator_namespace(kubernetes, &config);
            let settings = kubernetes.cluster_settings(&namespace, peers, me);
            let wiring = k8s::ClusterWiring {
                state: shared.state.clone(),
                health: shared.health.clone(),
                leader: leader_tx,
                metrics: shared.metrics.clone(),
                reconciled: shared
                    .health
                    .condition("Kubernetes watches listed and EurekaApps reconciled"),
                peers: peers_rx,
                peer_client,
                cluster_local: cluster_local.clone(),
            };
            let started = k8s::start(config, settings, wiring, supervisor)?;
            Cluster {
                discovered: started.discovered,
                cluster_id: started.cluster_id,
                in_cluster: true,
                leader,
                _standalone_leader: None,
            }
        }
    };
    let gauge = crate::leadership::LeaderGauge(cluster.leader.clone());
    shared
        .metrics
        .with_prometheus(|r| r.register_collector(Box::new(gauge)));
    Ok(cluster)
}

/// Replication, with the start-up sync that opens the registry for traffic.
fn start_replication(
    settings: replication::ReplicationConfig,
    retries: replication::sync::Retries,
    shared: &Shared,
    cluster: &Cluster,
    (peers, listed): (watch::Receiver<Vec<replication::Peer>>, watch::Receiver<bool>),
    synced: crate::health::Condition,
    supervisor: &mut Supervisor,
) {
    let wiring = replication::ReplicationWiring {
        state: shared.state.clone(),
        leader: cluster.leader.clone(),
        health: shared.health.clone(),
        peers,
        listed,
        cluster_id: cluster.cluster_id.clone(),
        in_cluster: cluster.in_cluster,
        synced,
    };
    let metrics = replication::ReplicationMetrics::default();
    shared.metrics.with_prometheus(|r| metrics.register(r));
    replication::start(settings, retries, wiring, metrics, supervisor);
}

/// The peers subsystem: static replicas, discovered replicas and Java peers, never this
/// replica. Replicas found through the headless Service are reached the way this one serves.
/// Returns a flag that turns true once the list holds discovery's first answer.
fn start_peer_list(
    peers: &crate::config::PeerArgs,
    own: peer_list::OwnAddress,
    https: bool,
    cluster: &Cluster,
    peers_tx: watch::Sender<Vec<replication::Peer>>,
    supervisor: &mut Supervisor,
) -> anyhow::Result<watch::Receiver<bool>> {
    let discovery = peer_list::Discovery { own, https };
    let static_replicas = peer_list::parse_urls(&peers.peer_urls, "peer")?;
    let java = peer_list::parse_urls(&peers.java_peer_urls, "Java peer")?;
    peers_tx.send_replace(peer_list::merge(&static_replicas, &[], &java, &discovery));
    let (listed_tx, listed) = watch::channel(false);
    let run = peer_list::run(
        static_replicas,
        java,
        discovery,
        cluster.discovered.clone(),
        (peers_tx, listed_tx),
        supervisor.shutdown(),
    );
    supervisor.spawn("peer list", Expect::RunsForever, run);
    Ok(listed)
}

/// Every metric the process exports, registered as `run` registers them but with nothing behind
/// them (no cluster, peer or listener), for `docgen metrics` to document. A labelled family shows
/// in the exposition only once a series has a value, so the registry's `Debug` form names the rest.
pub fn metrics_catalogue() -> Arc<Metrics> {
    let registry = Registry::new(RegistryConfig::default(), 0);
    let state = AppState::new(registry, Arc::new(SystemClock), false, Default::default());
    let metrics = Metrics::new();
    let (_lead, leader) = watch::channel(Lead::Always);
    metrics.with_prometheus(|r| {
        r.register_collector(Box::new(RegistryCollector(state)));
        r.register_collector(Box::new(crate::health::ReadyGauge(Health::new(Default::default()))));
    });
    k8s::SubsystemMetrics::registered(&metrics);
    metrics.with_prometheus(|r| {
        r.register_collector(Box::new(crate::leadership::LeaderGauge(leader)));
        replication::ReplicationMetrics::default().register(r);
        links::LinkMetrics::default().register(r);
        api::server::ServerMetrics::default().register(r);
        crate::tls::ReloadMetrics::default().register(r);
        crate::memory::TrimMetrics::default().register(r);
    });
    metrics
}
