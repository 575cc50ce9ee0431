//! Builds the process from its configuration: the registry and its state, the listeners, the
//! background timers, the Kubernetes controller with its Lease election when a cluster is found;
//! owns graceful shutdown. If the Lease task dies the process exits: without it nobody knows who
//! leads.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, sync::watch};

use crate::{
    api::{self, Api, admin, auth::Credentials},
    config::{Args, KubernetesArgs, KubernetesMode},
    k8s::{controller, index::Index, lease, status},
    metrics::{Metrics, RegistryCollector},
    registry::Registry,
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

/// The host this server is reached at: its bind address, or the host name for a wildcard.
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
    } = args;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let started_at = clock.now_ms();
    let registry = Registry::new(server.registry_config(), started_at);
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

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown = Shutdown(shutdown_rx);
    let (_peers_tx, peers_rx) = watch::channel(peers.peer_urls.clone());

    // Kubernetes: the Lease decides who runs the background jobs and writes to the cluster.
    let kube = cluster(&kubernetes).await?;
    let (leader_rx, lease_task, leadership) = match &kube {
        None => {
            // Alone, this process runs every background job.
            let (_, rx) = watch::channel(true);
            (rx, None, None)
        }
        Some(config) => {
            let client = kube::Client::try_from(config.clone()).context("failed to build a Kubernetes client")?;
            let namespace = kubernetes
                .operator_namespace
                .clone()
                .or_else(|| {
                    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                        .ok()
                        .map(|s| s.trim().to_string())
                })
                .unwrap_or_else(|| config.default_namespace.clone());
            let cfg = lease::LeaseConfig {
                namespace,
                name: kubernetes.lease_name.clone(),
                identity: identity.clone(),
                duration: Duration::from_secs(kubernetes.lease_duration_seconds.max(3)),
            };
            tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %identity, "running the controller");
            let (tx, rx) = watch::channel(false);
            let task = tokio::spawn(lease::run(client.clone(), cfg, tx, shutdown.clone().wait()));

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
            let writer = status::spawn(client.clone(), reporter, index.clone(), rx.clone(), writer_metrics);
            state.add_listener(Arc::new(controller::OverridePersister(writer.clone())));
            let settings = controller::Settings {
                cluster_id: kubernetes.cluster_id.clone(),
                cluster_domain: "cluster.local".into(),
                namespaces: kubernetes.watch_namespaces.clone(),
            };
            let synced = readiness.condition("kubernetes caches synced");
            let ctl = controller::Controller::new(state.clone(), writer, settings, controller_metrics, index, synced);
            tokio::spawn(ctl.run(client));
            (rx.clone(), Some(task), Some(rx))
        }
    };

    state.open_for_traffic(0);

    let intervals = timers::Intervals {
        eviction: server.eviction_interval(),
        renewal_threshold_update: Duration::from_millis(server.renewal_threshold_update_interval_ms.max(1)),
        delta_retention: Duration::from_millis(server.delta_retention_timer_interval_in_ms.max(1)),
    };
    let timers = tokio::spawn(timers::run(state.clone(), intervals, leader_rx));

    let api = Api {
        state: state.clone(),
        metrics: metrics.clone(),
        max_body: max_request_body_bytes,
        started_at,
        environment: kubernetes.cluster_id.clone(),
        peers: peers_rx,
        leadership,
        identity: Arc::new(api::identity(
            &identity,
            &advertised_host(bind),
            bind.port(),
            started_at,
        )),
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
    admin_server.abort();
    Ok(())
}
