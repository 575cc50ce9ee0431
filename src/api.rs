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
pub mod server;

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
    health::Health,
    metrics::Metrics,
    registry::{
        instance::InstanceInfo,
        view::{InstanceView, LeaseView, Origin},
    },
    replication::Peer,
    state::AppState,
};
use negotiate::ApiError;

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    /// The registry and its response cache.
    pub state: AppState,
    pub metrics: Arc<Metrics>,
    /// Whether the registry is complete (fetches are refused with 503 until it is).
    pub health: Arc<Health>,
    /// Largest request body, after decompression.
    pub max_body: usize,
    /// Where bodies are decoded, and the per-instance caps applied while decoding them.
    pub input: negotiate::Decoding,
    /// When this server started (ms).
    pub started_at: i64,
    /// The environment shown by the dashboard and the status document.
    pub environment: String,
    /// The peers this replica replicates to, as currently known.
    pub peers: watch::Receiver<Vec<Peer>>,
    /// Whether this replica holds the leader Lease (`None` without Kubernetes).
    pub leadership: Option<watch::Receiver<bool>>,
    /// How this server describes itself (the status document's `instanceInfo`).
    pub identity: Arc<InstanceInfo>,
}

impl Api {
    pub fn peer_urls(&self) -> Vec<String> {
        self.peers
            .borrow()
            .iter()
            .map(|p| p.url.display().to_string())
            .collect()
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
            origin: Origin::Native,
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
pub fn router(api: Api, access: Option<auth::Access>) -> Router {
    let router = Router::new()
        .route("/", get(dashboard::page))
        .route("/lastn", get(dashboard::lastn))
        .fallback(serve)
        .with_state(api);
    match access {
        Some(a) => router.layer(middleware::from_fn_with_state(a, auth::require)),
        None => router,
    }
}

/// Failures to start serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to bind the {what} listener on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Where and how to listen.
pub struct Listeners {
    /// The Eureka API and dashboard.
    pub eureka: std::net::SocketAddr,
    /// `/metrics`, `/livez`, `/readyz`.
    pub admin: std::net::SocketAddr,
    /// Timeouts and limits of both listeners.
    pub http: server::HttpSettings,
    /// TLS for the Eureka listener (the admin listener stays plain: probes and scrapes).
    pub tls: Option<Arc<crate::tls::ServerTls>>,
}

/// Binds both listeners (failing fast if a port is taken) and serves them as supervised tasks
/// (with the certificate reloader when TLS is on); on shutdown they finish in-flight requests.
pub async fn start(
    listeners: Listeners,
    api: Api,
    access: Option<auth::Access>,
    supervisor: &mut crate::runtime::supervisor::Supervisor,
) -> Result<(), Error> {
    use crate::runtime::supervisor::Expect;
    let bind = |what, addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { what, addr, source })
    };
    let eureka = bind("Eureka", listeners.eureka).await?;
    let admin = bind("admin", listeners.admin).await?;
    let tls = listeners.tls;
    tracing::info!(eureka = %listeners.eureka, admin = %listeners.admin, auth = access.is_some(), tls = tls.is_some(), "serving");
    let http_metrics = server::Metrics::default();
    api.metrics.with_prometheus(|r| http_metrics.register(r));
    let admin_app = admin::router(admin::Admin {
        metrics: api.metrics.clone(),
        health: api.health.clone(),
    });
    let eureka_app = router(api, access);
    let acceptor = tls.as_ref().map(|t| t.acceptor());
    if let Some(t) = tls {
        let shutdown = supervisor.shutdown();
        supervisor.spawn("TLS certificate reload", Expect::RunsForever, async move {
            t.watch(shutdown.wait()).await;
            Ok(())
        });
    }
    let (http, metrics, shutdown) = (listeners.http.clone(), http_metrics.clone(), supervisor.shutdown());
    supervisor.spawn("Eureka API", Expect::RunsForever, async move {
        server::serve("eureka", eureka, eureka_app, &http, acceptor, metrics, shutdown.wait()).await?;
        Ok(())
    });
    let (http, shutdown) = (listeners.http, supervisor.shutdown());
    supervisor.spawn("admin API", Expect::RunsForever, async move {
        server::serve("admin", admin, admin_app, &http, None, http_metrics, shutdown.wait()).await?;
        Ok(())
    });
    Ok(())
}

async fn serve(State(api): State<Api>, request: Request) -> Response {
    let started = Instant::now();
    let caller = request
        .extensions()
        .get::<auth::Caller>()
        .copied()
        .unwrap_or(auth::Caller::Trusted);
    let (parts, body) = request.into_parts();
    let route = route::parse(parts.uri.path());
    let endpoint = route.as_ref().map(route::Route::name).unwrap_or("unknown");
    let response = match route {
        None => ApiError::NoRoute(parts.uri.path().to_string()).into_response(),
        Some(route) => eureka::handle(
            &api,
            route,
            caller,
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
