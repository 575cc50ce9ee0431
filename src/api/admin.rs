//! The admin listener: `/livez` (no supervised task has failed), `/readyz` (the registry is
//! complete: synced from peers, every watch listed and every EurekaApp reconciled; warnings such as
//! a peer refusing our credentials are listed but do not fail it) and `/metrics` in Prometheus text
//! format.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use crate::{health::Health, metrics::Metrics};

#[derive(Clone)]
pub struct Admin {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(admin)
}

async fn livez(State(admin): State<Admin>) -> Response {
    if admin.health.is_alive() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "a supervised task failed; the process is stopping\n",
        )
            .into_response()
    }
}

async fn readyz(State(admin): State<Admin>) -> Response {
    let (ready, report) = admin.health.report();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, report).into_response()
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
