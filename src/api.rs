//! The HTTP adapters: the Eureka API and dashboard on one listener, the admin endpoints on
//! another. Handlers decode, call the registry through [`AppState`], and encode; Eureka's rules
//! stay in the registry and the codec.

pub mod admin;
pub mod auth;
pub mod dashboard;
pub mod eureka;
pub mod heartbeat;
pub mod link;
pub mod negotiate;
pub mod peer;
pub mod route;
pub mod server;

use std::{sync::Arc, time::Instant};

use axum::{
    Router,
    extract::{Request, State},
    http::{Method, Uri},
    middleware,
    response::{IntoResponse, Response},
    routing::{MethodRouter, get, post, put},
};
use tokio::sync::watch;
use tower::Layer;
use tower_http::{
    normalize_path::NormalizePathLayer,
    trace::{DefaultMakeSpan, DefaultOnEos, DefaultOnFailure, DefaultOnResponse, TraceLayer},
};
use tracing::Level;

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
    pub leadership: Option<crate::leadership::Leader>,
    /// How this server describes itself (the status document's `instanceInfo`).
    pub identity: Arc<InstanceInfo>,
    /// What links from other clusters are served (`None`: the link endpoint is off).
    pub links: Option<Arc<crate::links::Serving>>,
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
    i.instance_id = Some(replica.into());
    i.port = crate::registry::instance::PortInfo {
        port: i32::from(port),
        enabled: true,
    };
    i.vip_address = Some("eureka-operator".into());
    i.secure_vip_address = Some("eureka-operator".into());
    i.home_page_url = Some(format!("http://{host}:{port}/").into());
    i.status_page_url = Some(format!("http://{host}:{port}/eureka/status").into());
    i.action_type = Some(crate::registry::instance::ActionType::Added);
    i
}

/// The Eureka listener's service: [`heartbeat::Heartbeats`] in front of the router (and, when
/// served, of the listener's tower stack: see [`server::serve`]).
pub type Service = server::Shortcuts<heartbeat::Heartbeats, Router>;

/// The Eureka listener: dashboard at `/`, the API under `/eureka/v2/` (Netflix's prefix) and
/// `/eureka/` (Spring's); routing ignores a trailing slash, as Jersey does.
pub fn router(api: Api, access: Option<auth::Access>) -> Service {
    // Both prefixes are spelled out rather than nested: a nested router rewrites every request's
    // URI to strip its prefix, and routes a second time.
    let api = Arc::new(api);
    // Shared: the service and the middleware's state are cloned for every request.
    let access = access.map(Arc::new);
    let router = Router::new()
        .route("/", get(dashboard::page))
        .route("/lastn", get(dashboard::lastn))
        .merge(eureka_routes(&api, "/eureka/v2"))
        .merge(eureka_routes(&api, "/eureka"))
        .fallback(no_route)
        .with_state(api.clone());
    let router = match &access {
        Some(a) => router.layer(middleware::from_fn_with_state(a.clone(), auth::require)),
        None => router,
    };
    // A debug span per request (method and URI) around every log line it causes; the response
    // and its end are logged at trace, a 5xx at debug (load shedding is not an error of ours).
    let trace = TraceLayer::new_for_http()
        .make_span_with(DefaultMakeSpan::new().level(Level::DEBUG))
        .on_request(())
        .on_response(DefaultOnResponse::new().level(Level::TRACE))
        .on_eos(DefaultOnEos::new().level(Level::TRACE))
        .on_failure(DefaultOnFailure::new().level(Level::DEBUG));
    // Plain heartbeats are answered before routing (see `heartbeat`).
    server::Shortcuts {
        shortcut: heartbeat::Heartbeats { api, access },
        inner: Router::new()
            .fallback_service(NormalizePathLayer::trim_trailing_slash().layer(router))
            .layer(trace),
    }
}

/// Every Eureka endpoint, each observed under a bounded metrics label; a method an endpoint does
/// not serve is answered 405 with `Allow`.
fn eureka_routes(api: &Api, prefix: &str) -> Router<Arc<Api>> {
    let observed = |endpoint: &'static str, methods: MethodRouter<Arc<Api>>| {
        methods.fallback(method_not_allowed).layer(ObserveLayer {
            metrics: api.metrics.clone(),
            endpoint,
        })
    };
    use eureka::*;
    let routes: [(&str, MethodRouter<Arc<Api>>); 13] = [
        ("/apps", observed("apps", get(apps))),
        ("/apps/delta", observed("apps_delta", get(delta))),
        ("/apps/{app}", observed("app", get(app).post(register))),
        (
            "/apps/{app}/{id}",
            observed("instance", get(instance).put(renew).delete(cancel)),
        ),
        (
            "/apps/{app}/{id}/status",
            observed("instance_status", put(status_override).delete(status_override)),
        ),
        (
            "/apps/{app}/{id}/metadata",
            observed("instance_metadata", put(metadata)),
        ),
        ("/instances/{id}", observed("instances", get(instance_by_id))),
        ("/vips/{vip}", observed("vips", get(vip))),
        ("/svips/{vip}", observed("svips", get(svip))),
        ("/peerreplication/batch", observed("peer_batch", post(batch))),
        ("/asg/{asg}/status", observed("asg_status", put(asg_status))),
        ("/status", observed("status", get(status))),
        ("/link/apps", observed("link_apps", get(link::apps))),
    ];
    routes.into_iter().fold(Router::new(), |router, (path, methods)| {
        router.route(&format!("{prefix}{path}"), methods)
    })
}

async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method)
}

/// A path that names no endpoint.
async fn no_route(State(api): State<Arc<Api>>, method: Method, uri: Uri) -> Response {
    let started = Instant::now();
    let response = ApiError::NoRoute(uri.path().to_string()).into_response();
    record(&api.metrics, "unknown", &method, &uri, &response, started);
    response
}

/// Middleware: the request's duration and status in the metrics; a refusal logged (at debug)
/// and, when a cap refused it, counted.
#[derive(Clone)]
struct ObserveLayer {
    metrics: Arc<Metrics>,
    endpoint: &'static str,
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.metrics.clone(),
            endpoint: self.endpoint,
        }
    }
}

/// Times a route's requests and records them under its endpoint's name. A hand-written service
/// rather than `middleware::from_fn`, which boxes a clone of the inner service per request.
#[derive(Clone)]
struct Observe<S> {
    inner: S,
    metrics: Arc<Metrics>,
    endpoint: &'static str,
}

impl<S> tower::Service<Request> for Observe<S>
where
    S: tower::Service<Request, Response = Response, Error = std::convert::Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let started = Instant::now();
        let (method, uri) = (request.method().clone(), request.uri().clone());
        let (metrics, endpoint) = (self.metrics.clone(), self.endpoint);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            record(&metrics, endpoint, &method, &uri, &response, started);
            Ok(response)
        })
    }
}

/// A method as a metric label: the standard ones by name, any other as `OTHER`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "OTHER",
    }
}

fn record(
    metrics: &Metrics,
    endpoint: &'static str,
    method: &Method,
    uri: &Uri,
    response: &Response,
    started: Instant,
) {
    if let Some(refusal) = response.extensions().get::<negotiate::Refusal>() {
        tracing::debug!(error = %refusal.message, category = refusal.category, path = %uri.path(), "refused a request");
        if let Some(limit) = refusal.limit {
            metrics.limit_refused(limit);
        }
    }
    metrics.observe_request(
        endpoint,
        method_label(method),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
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
    pub eureka: Bound,
    /// `/metrics`, `/livez`, `/readyz`.
    pub admin: Bound,
    /// Timeouts and limits of both listeners.
    pub http: server::HttpConfig,
    /// TLS for the Eureka listener (the admin listener stays plain: probes and scrapes).
    pub tls: Option<Arc<crate::tls::ServerTls>>,
}

/// A listening socket, bound before anything else starts: a replica started together with this
/// one then finds it listening (its connection waits in the backlog and is answered, 503 until
/// this one is complete) instead of refused, which it would take for a peer that is down.
pub struct Bound {
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
}

impl Bound {
    /// Binds `addr`, failing fast if the port is taken.
    pub async fn bind(what: &'static str, addr: std::net::SocketAddr) -> Result<Bound, Error> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { what, addr, source })?;
        Ok(Bound { listener, addr })
    }
}

/// Serves both bound listeners as supervised tasks (with the certificate reloader when TLS is
/// on); on shutdown they finish in-flight requests.
pub async fn start(
    listeners: Listeners,
    api: Api,
    access: Option<auth::Access>,
    supervisor: &mut crate::supervisor::Supervisor,
) -> Result<(), Error> {
    use crate::supervisor::Expect;
    let (eureka, admin) = (listeners.eureka.listener, listeners.admin.listener);
    let (eureka_addr, admin_addr) = (listeners.eureka.addr, listeners.admin.addr);
    let tls = listeners.tls;
    tracing::info!(eureka = %eureka_addr, admin = %admin_addr, auth = access.is_some(), tls = tls.is_some(), "serving");
    let http_metrics = server::ServerMetrics::default();
    let reload_metrics = crate::tls::ReloadMetrics::default();
    api.metrics.with_prometheus(|r| {
        http_metrics.register(r);
        reload_metrics.register(r);
    });
    let admin_app = server::Shortcuts {
        shortcut: server::NoShortcut,
        inner: admin::router(admin::Admin {
            metrics: api.metrics.clone(),
            health: api.health.clone(),
        }),
    };
    let draining = api.health.stopping();
    let eureka_app = router(api, access);
    let acceptor = tls.as_ref().map(|t| t.acceptor());
    if let Some(t) = tls {
        let shutdown = supervisor.shutdown();
        supervisor.spawn("TLS certificate reload", Expect::RunsForever, async move {
            t.watch(reload_metrics, shutdown.wait()).await;
            Ok(())
        });
    }
    let (http, metrics, shutdown) = (listeners.http.clone(), http_metrics.clone(), supervisor.shutdown());
    let stopping = draining.clone();
    supervisor.spawn("Eureka API", Expect::RunsForever, async move {
        let wait = shutdown.wait();
        server::serve("eureka", eureka, eureka_app, &http, acceptor, metrics, stopping, wait).await?;
        Ok(())
    });
    let (http, shutdown) = (listeners.http, supervisor.shutdown());
    supervisor.spawn("admin API", Expect::RunsForever, async move {
        let wait = shutdown.wait();
        server::serve("admin", admin, admin_app, &http, None, http_metrics, draining, wait).await?;
        Ok(())
    });
    Ok(())
}
