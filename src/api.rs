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

use crate::{
    metrics::Metrics,
    registry::{
        instance::InstanceInfo,
        view::{InstanceView, LeaseView, OriginKind},
    },
    state::AppState,
};
use negotiate::ApiError;

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    pub state: AppState,
    pub metrics: Arc<Metrics>,
    /// Largest request body, after decompression.
    pub max_body: usize,
    /// Where bodies are decoded, and the per-instance caps applied while decoding them.
    pub input: negotiate::Decoding,
    pub started_at: i64,
    pub environment: String,
    /// The peer URLs this replica replicates to, as currently known.
    pub peers: watch::Receiver<Vec<String>>,
    /// Whether this replica holds the leader Lease (`None` without Kubernetes).
    pub leadership: Option<watch::Receiver<bool>>,
    /// How this server describes itself (the status document's `instanceInfo`).
    pub identity: Arc<InstanceInfo>,
}

impl Api {
    pub fn peer_urls(&self) -> Vec<String> {
        self.peers.borrow().clone()
    }

    /// This server as an instance, with a lease that started when it did.
    pub fn self_instance(&self) -> InstanceView {
        InstanceView {
            info: self.identity.clone(),
            lease: LeaseView {
                renewal_interval_secs: 30,
                duration_secs: 90,
                registration_ts: self.started_at,
                last_renewal_ts: self.started_at,
                eviction_ts: 0,
                service_up_ts: self.started_at,
            },
            origin: OriginKind::Native,
        }
    }
}

/// How a server on `host:port` named `replica` describes itself.
pub fn identity(replica: &str, host: &str, port: u16, now: i64) -> InstanceInfo {
    let mut i = InstanceInfo::new("EUREKA-OPERATOR", host, host, now);
    i.instance_id = Some(replica.to_string());
    i.port = crate::registry::instance::PortInfo {
        port: i32::from(port),
        enabled: true,
    };
    i.vip_address = Some("eureka-operator".into());
    i.secure_vip_address = Some("eureka-operator".into());
    i.home_page_url = Some(format!("http://{host}:{port}/"));
    i.status_page_url = Some(format!("http://{host}:{port}/eureka/status"));
    i.action_type = Some(crate::registry::instance::ActionType::Added);
    i
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
