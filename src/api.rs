//! The HTTP adapters: the Eureka API and dashboard on one listener, the admin endpoints on
//! another. Handlers decode, call the registry through [`AppState`], and encode; Eureka's rules
//! stay in the registry and the codec.

pub mod admin;
pub mod auth;
pub mod dashboard;
pub mod eureka;
pub mod negotiate;
pub mod peer;
pub mod route;

use std::{sync::Arc, time::Instant};

use axum::{
    Router,
    extract::{Request, State},
    middleware,
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::sync::watch;

use crate::{metrics::Metrics, state::AppState};
use negotiate::ApiError;

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    pub state: AppState,
    pub metrics: Arc<Metrics>,
    /// Largest request body, after decompression.
    pub max_body: usize,
    pub started_at: i64,
    pub environment: String,
    /// The peer URLs this replica replicates to, as currently known.
    pub peers: watch::Receiver<Vec<String>>,
    /// Whether this replica holds the leader Lease (`None` without Kubernetes).
    pub leadership: Option<watch::Receiver<bool>>,
}

impl Api {
    pub fn peer_urls(&self) -> Vec<String> {
        self.peers.borrow().clone()
    }
}

/// The Eureka listener: dashboard at `/`, the API under `/eureka/` and `/eureka/v2/`.
pub fn router(api: Api, credentials: Option<auth::Credentials>) -> Router {
    let router = Router::new()
        .route("/", get(dashboard::page))
        .route("/lastn", get(dashboard::lastn))
        .fallback(serve)
        .with_state(api);
    match credentials {
        Some(c) => router.layer(middleware::from_fn_with_state(c, auth::require)),
        None => router,
    }
}

async fn serve(State(api): State<Api>, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let route = route::parse(parts.uri.path());
    let endpoint = route.as_ref().map(route::Route::name).unwrap_or("unknown");
    let response = match route {
        None => ApiError::NoRoute(parts.uri.path().to_string()).into_response(),
        Some(route) => eureka::handle(
            &api,
            route,
            parts.method.clone(),
            parts.uri.query(),
            &parts.headers,
            body,
        )
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(error = %e, category = e.category(), path = %parts.uri.path(), "refused a request");
            e.into_response()
        }),
    };
    api.metrics.observe_request(
        endpoint,
        parts.method.as_str(),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}
