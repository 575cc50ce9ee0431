//! The admin listener: `/livez`, `/readyz` (the registry is filled and every registered check,
//! such as the controller's cache sync, passes) and `/metrics` in Prometheus text format.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use parking_lot::RwLock;

use crate::{metrics::Metrics, state::AppState};

/// Named readiness conditions that other parts of the process flip.
#[derive(Default)]
pub struct Readiness {
    checks: RwLock<Vec<(String, Arc<AtomicBool>)>>,
}

impl Readiness {
    pub fn new() -> Arc<Readiness> {
        Arc::new(Readiness::default())
    }

    /// Adds a condition, initially not met; set the returned flag when it is.
    pub fn condition(&self, name: &str) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        self.checks.write().push((name.to_string(), flag.clone()));
        flag
    }

    /// The names of the conditions not met yet.
    pub fn pending(&self) -> Vec<String> {
        self.checks
            .read()
            .iter()
            .filter(|(_, f)| !f.load(Ordering::Acquire))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

#[derive(Clone)]
pub struct Admin {
    pub state: AppState,
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
}

pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(admin)
}

async fn readyz(State(admin): State<Admin>) -> Response {
    let mut pending = admin.readiness.pending();
    if !admin.state.registry_ready() {
        pending.insert(0, "registry sync from peers".to_string());
    }
    if pending.is_empty() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: waiting for {}\n", pending.join(", ")),
        )
            .into_response()
    }
}

async fn metrics(State(admin): State<Admin>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        admin.metrics.encode(),
    )
        .into_response()
}
