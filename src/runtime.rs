//! Builds the process from its configuration: the registry and its state, the listeners, the
//! background timers, and (in later layers) replication and the Kubernetes controller; owns
//! graceful shutdown.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, sync::watch};

use crate::{
    api::{self, Api, admin, auth::Credentials},
    config::Args,
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
        kubernetes: _,
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

    let (_peers_tx, peers_rx) = watch::channel(peers.peer_urls.clone());
    // Without Kubernetes there is no Lease: this process runs every background job.
    let (_leader_tx, leader_rx) = watch::channel(true);

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
        environment: "default".to_string(),
        peers: peers_rx,
        leadership: None,
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
    axum::serve(eureka, api::router(api, credentials))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("the Eureka listener failed")?;
    tracing::info!("shutting down");
    timers.abort();
    admin_server.abort();
    Ok(())
}
