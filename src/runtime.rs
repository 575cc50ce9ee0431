//! Builds the process from its configuration and runs it: the registry and its state, the
//! listeners, the Kubernetes controller and Lease election when a cluster is found, peer
//! discovery and replication, the start-up sync from peers (before `/readyz` turns green), the
//! timers; owns graceful shutdown. If the Lease task dies the process exits: without it nobody
//! knows who leads.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use anyhow::Context;
use prometheus_client::metrics::gauge::Gauge;
use tokio::{net::TcpListener, sync::watch};

use crate::{
    api::{self, Api, admin, auth::Credentials},
    config::{Args, KubernetesArgs, KubernetesMode, PeerArgs},
    k8s::{controller, index::Index, lease, peers as k8s_peers, status},
    metrics::{Metrics, RegistryCollector},
    registry::{Registry, RegistryConfig},
    replication::{
        self, PeerKind, Replicator,
        batcher::Limits,
        client::PeerUrl,
        sync::{self, Retries},
    },
    state::{AppState, Clock, SystemClock},
    timers,
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

/// A shutdown flag many tasks can wait on.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The cluster configuration, or `None` to run standalone.
async fn cluster(args: &KubernetesArgs) -> anyhow::Result<Option<kube::Config>> {
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

/// This replica's name: the flag, else the pod name, else the host name.
pub fn replica_identity(flag: Option<&str>) -> String {
    flag.map(str::to_string)
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("eureka-operator-{}", std::process::id()))
}

/// The host this server is reached at: its bind address, or the pod IP / host name for a wildcard.
fn advertised_host(bind: std::net::SocketAddr) -> String {
    if bind.ip().is_unspecified() {
        std::env::var("POD_IP")
            .ok()
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "localhost".into())
    } else {
        bind.ip().to_string()
    }
}

/// Whether a configured peer URL is this server itself (Java's `isThisMyUrl`).
fn is_me(url: &PeerUrl, my_url: Option<&PeerUrl>, bind: std::net::SocketAddr, host: &str) -> bool {
    if my_url.is_some_and(|m| m.base == url.base) {
        return true;
    }
    reqwest::Url::parse(&url.base).ok().is_some_and(|u| {
        let port = u.port_or_known_default().unwrap_or(80);
        let h = u.host_str().unwrap_or("").trim_matches(['[', ']']);
        port == bind.port() && (h == host || h == bind.ip().to_string())
    })
}

fn parse_urls(urls: &[String], what: &str) -> anyhow::Result<Vec<PeerUrl>> {
    urls.iter()
        .filter(|u| !u.trim().is_empty())
        .map(|u| PeerUrl::parse(u).with_context(|| format!("failed to parse the {what} URL {u:?}")))
        .collect()
}

/// Runs the operator until it is asked to stop.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        bind,
        admin_bind,
        log: _,
        log_format: _,
        max_request_body_bytes,
        server,
        auth,
        peers,
        kubernetes,
        limits,
    } = args;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let started_at = clock.now_ms();
    let registry_config = RegistryConfig {
        limits: limits.registry_limits(),
        ..server.registry_config()
    };
    let registry = Registry::new(registry_config, started_at);
    let state = AppState::new(registry, clock, server.disable_delta);

    let metrics = Metrics::new();
    metrics.with_registry(|r| r.register_collector(Box::new(RegistryCollector(state.clone()))));
    let credentials = Credentials::configure(
        auth.basic_auth_username.as_deref(),
        auth.basic_auth_password.as_deref(),
        auth.basic_auth_file.as_deref(),
    )?;
    let readiness = admin::Readiness::new();
    let identity = replica_identity(peers.replica_id.as_deref());
    let host = advertised_host(bind);

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown = Shutdown(shutdown_rx);

    // Kubernetes: the Lease decides who runs the background jobs and writes to the cluster.
    let kube = cluster(&kubernetes).await?;
    let client = match &kube {
        Some(config) => Some(kube::Client::try_from(config.clone()).context("failed to build a Kubernetes client")?),
        None => None,
    };
    let operator_namespace = kubernetes
        .operator_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .map(|s| s.trim().to_string())
        })
        .or_else(|| kube.as_ref().map(|c| c.default_namespace.clone()))
        .unwrap_or_else(|| "default".into());
    let (leader_tx, leader_rx) = watch::channel(client.is_none());
    let leader_gauge = Gauge::<i64>::default();
    metrics.with_registry(|r| {
        r.register(
            "leader",
            "1 while this replica holds the Lease (always without Kubernetes)",
            leader_gauge.clone(),
        )
    });
    let kubernetes_synced = match &client {
        Some(_) => readiness.condition("kubernetes caches synced"),
        None => Arc::new(AtomicBool::new(true)),
    };
    let lease_task = match &client {
        None => None,
        Some(client) => {
            let cfg = lease::LeaseConfig {
                namespace: operator_namespace.clone(),
                name: kubernetes.lease_name.clone(),
                identity: identity.clone(),
                duration: Duration::from_secs(kubernetes.lease_duration_seconds.max(3)),
            };
            tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %identity, "running the controller");
            let task = tokio::spawn(lease::run(client.clone(), cfg, leader_tx, shutdown.clone().wait()));

            let index = Arc::new(parking_lot::RwLock::new(Index::default()));
            let writer_metrics = status::WriterMetrics::default();
            let controller_metrics = controller::Metrics::default();
            metrics.with_registry(|r| {
                writer_metrics.register(r);
                controller_metrics.register(r);
            });
            let reporter = kube::runtime::events::Reporter {
                controller: "eureka-operator".into(),
                instance: Some(identity.clone()),
            };
            let writer = status::spawn(
                client.clone(),
                reporter,
                index.clone(),
                leader_rx.clone(),
                writer_metrics,
            );
            state.add_listener(Arc::new(controller::OverridePersister(writer.clone())));
            let settings = controller::Settings {
                cluster_id: kubernetes.cluster_id.clone(),
                cluster_domain: "cluster.local".into(),
                namespaces: kubernetes.watch_namespaces.clone(),
            };
            let ctl = controller::Controller::new(
                state.clone(),
                writer,
                settings,
                controller_metrics,
                index,
                kubernetes_synced.clone(),
            );
            state.add_listener(ctl.conflict_waker());
            tokio::spawn(ctl.run(client.clone()));
            Some(task)
        }
    };
    {
        let mut rx = leader_rx.clone();
        let gauge = leader_gauge.clone();
        tokio::spawn(async move {
            loop {
                gauge.set(i64::from(*rx.borrow_and_update()));
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    // Replication: our replicas (static and/or from the headless Service) and Java peers.
    let replication_metrics = replication::Metrics::default();
    metrics.with_registry(|r| replication_metrics.register(r));
    let PeerArgs {
        peer_urls,
        peer_service,
        java_peer_urls,
        my_url,
        replica_id: _,
        peer_node_connect_timeout_ms,
        peer_node_read_timeout_ms,
        max_elements_in_peer_replication_pool,
        max_time_for_replication,
        replication_max_batching_delay_ms,
        java_peer_heartbeat_interval_ms,
        anti_entropy_interval_ms,
    } = peers;
    let replicator = Replicator::new(
        state.clone(),
        leader_rx.clone(),
        replication::Settings {
            limits: Limits {
                capacity: max_elements_in_peer_replication_pool.max(1),
                max_age: Duration::from_millis(max_time_for_replication.max(1)),
                max_delay: Duration::from_millis(replication_max_batching_delay_ms),
            },
            connect_timeout: Duration::from_millis(peer_node_connect_timeout_ms.max(1)),
            read_timeout: Duration::from_millis(peer_node_read_timeout_ms.max(1)),
            replica_id: identity.clone(),
            java_heartbeat_interval: Duration::from_millis(java_peer_heartbeat_interval_ms.max(100)),
            anti_entropy_interval: Duration::from_millis(anti_entropy_interval_ms.max(100)),
            cluster_id: kubernetes.cluster_id.clone(),
        },
        replication_metrics,
    );
    state.add_listener(replicator.clone());
    let my_url = my_url.as_deref().and_then(PeerUrl::parse);
    let static_replicas: Vec<PeerUrl> = parse_urls(&peer_urls, "peer")?
        .into_iter()
        .filter(|u| !is_me(u, my_url.as_ref(), bind, &host))
        .collect();
    let java_peers = parse_urls(&java_peer_urls, "Java peer")?;
    let (discovered_tx, discovered_rx) = watch::channel::<Option<Vec<k8s_peers::ReplicaEndpoint>>>(Some(Vec::new()));
    if let (Some(client), Some(service)) = (&client, &peer_service) {
        let (ns, name) = match service.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (operator_namespace.clone(), service.clone()),
        };
        discovered_tx.send_replace(None);
        let me = k8s_peers::Me {
            pod_name: Some(identity.clone()),
            pod_ip: std::env::var("POD_IP").ok(),
        };
        tokio::spawn(k8s_peers::watch_replicas(client.clone(), ns, name, me, discovered_tx));
    }
    let (peers_tx, peers_rx) = watch::channel(Vec::<String>::new());
    {
        // Keeps the replicator's peer set (and the dashboard's list) in line with discovery.
        let replicator = replicator.clone();
        let mut discovered = discovered_rx.clone();
        let static_replicas = static_replicas.clone();
        let java_peers = java_peers.clone();
        tokio::spawn(async move {
            loop {
                let found: Vec<PeerUrl> = discovered
                    .borrow_and_update()
                    .iter()
                    .flatten()
                    .filter_map(|e| PeerUrl::parse(&e.url))
                    .collect();
                let mut all: Vec<(PeerUrl, PeerKind)> = static_replicas
                    .iter()
                    .chain(found.iter())
                    .map(|u| (u.clone(), PeerKind::Replica))
                    .collect();
                all.extend(java_peers.iter().map(|u| (u.clone(), PeerKind::Java)));
                peers_tx.send_replace(all.iter().map(|(u, _)| u.display().to_string()).collect());
                replicator.set_peers(all);
                if discovered.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    // Serve before syncing, so peers that start together can reach each other.
    let api = Api {
        state: state.clone(),
        metrics: metrics.clone(),
        max_body: max_request_body_bytes,
        input: api::negotiate::Decoding::new(limits.input_limits()),
        started_at,
        environment: kubernetes.cluster_id.clone(),
        peers: peers_rx,
        leadership: client.as_ref().map(|_| leader_rx.clone()),
        identity: Arc::new(api::identity(&identity, &host, bind.port(), started_at)),
    };
    let eureka = TcpListener::bind(bind)
        .await
        .with_context(|| format!("failed to bind the Eureka listener on {bind}"))?;
    let admin_listener = TcpListener::bind(admin_bind)
        .await
        .with_context(|| format!("failed to bind the admin listener on {admin_bind}"))?;
    tracing::info!(eureka = %eureka.local_addr()?, admin = %admin_listener.local_addr()?, auth = credentials.is_some(), "serving");
    let admin_app = admin::router(admin::Admin {
        state: state.clone(),
        metrics,
        readiness,
    });
    let admin_server = tokio::spawn(async move { axum::serve(admin_listener, admin_app).await });
    let serve = axum::serve(eureka, api::router(api, credentials)).with_graceful_shutdown(shutdown.clone().wait());
    let serve = tokio::spawn(async move { serve.await });

    // Start-up sync: fill the registry from ready peers, then open for traffic (and /readyz).
    {
        let state = state.clone();
        let replicator = replicator.clone();
        let mut discovered = discovered_rx.clone();
        let cluster_id = kubernetes.cluster_id.clone();
        let retries = Retries {
            attempts: server.registry_sync_retries,
            wait: Duration::from_millis(server.registry_sync_retry_wait_ms),
        };
        tokio::spawn(async move {
            let listed = tokio::time::timeout(Duration::from_secs(30), discovered.wait_for(Option::is_some))
                .await
                .map(|_| ());
            if listed.is_err() {
                tracing::warn!("the replica list did not arrive in 30 s; syncing from the static peers only");
            }
            let ready_found: Vec<PeerUrl> = discovered
                .borrow()
                .iter()
                .flatten()
                .filter(|e| e.ready)
                .filter_map(|e| PeerUrl::parse(&e.url))
                .collect();
            let mut sources: Vec<(PeerUrl, PeerKind)> = static_replicas
                .iter()
                .chain(ready_found.iter())
                .map(|u| (u.clone(), PeerKind::Replica))
                .collect();
            sources.extend(java_peers.iter().map(|u| (u.clone(), PeerKind::Java)));
            let count = sync::sync(&state, replicator.client(), &sources, &cluster_id, retries).await;
            state.open_for_traffic(count);
            tracing::info!(instances = count, peers = sources.len(), "registry open for traffic");
        });
    }

    let intervals = timers::Intervals {
        eviction: server.eviction_interval(),
        renewal_threshold_update: Duration::from_millis(server.renewal_threshold_update_interval_ms.max(1)),
        delta_retention: Duration::from_millis(server.delta_retention_timer_interval_in_ms.max(1)),
    };
    let timers = tokio::spawn(timers::run(state.clone(), intervals, leader_rx.clone()));
    let leader_jobs = tokio::spawn(replicator.clone().run_leader_jobs(kubernetes_synced));

    let lease_died = async {
        match lease_task {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lease_died);
    tokio::select! {
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            let _ = shutdown_tx.send(true);
            // Give the Lease task a moment to release the Lease.
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut lease_died).await;
        }
        result = &mut lease_died => {
            let _ = shutdown_tx.send(true);
            match result {
                Ok(Ok(())) => anyhow::bail!("the Lease election ended unexpectedly"),
                Ok(Err(e)) => return Err(anyhow::Error::new(e).context("the Lease election failed")),
                Err(e) => anyhow::bail!("the Lease election task died: {e}"),
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), serve).await;
    timers.abort();
    leader_jobs.abort();
    admin_server.abort();
    Ok(())
}
