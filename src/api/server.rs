//! Serving a router on a listener, with every timeout and limit of the HTTP layer
//! ([`HttpConfig`]) and optional TLS. Both listeners (the Eureka API and the admin endpoints)
//! go through [`serve`], each with its own connection and request budgets, so a flood on the API
//! never starves `/livez` and `/readyz`.
//!
//! What enforces what:
//!
//! * **Request head size and header count** (431 beyond): hyper's `max_buf_size` and
//!   `max_headers`.
//! * **Header-read timeout**: hyper's HTTP/1 `header_read_timeout`, with hyper-util's Tokio
//!   timer. hyper starts it whenever the connection is ready for a request (after accept, and
//!   after each response), so it closes slowloris connections and idle keep-alive connections
//!   alike. The same limit bounds a TLS handshake (tokio's `timeout`: rustls has none).
//! * **Request timeout** (head received to response ready, body included, 408): tower-http's
//!   `TimeoutLayer`. **Body-read timeout** (first to last byte of the body, 408): tower-http's
//!   `RequestBodyDeadlineLayer`.
//! * **In-flight requests**: tower's `GlobalConcurrencyLimitLayer` behind `LoadShed`, so a
//!   request over the limit is answered 503 with `Retry-After` at once instead of queueing
//!   (Eureka clients then try their next server).
//! * **Shortcuts** ([`Shortcut`]): requests a listener answers from their head alone, at once,
//!   in front of the limits and timeouts above, which have nothing to act on for them: the
//!   Eureka listener's plain heartbeats, nearly all of its requests. They are never shed or
//!   timed out (a heartbeat refused for being behind a slow full fetch would cost a lease).
//! * **Open connections**: the accept loop below. It is written by hand because neither hyper,
//!   hyper-util nor axum offers an accept loop with a connection bound, TLS, and graceful
//!   shutdown together (`axum::serve` runs hyper without a timer and accepts without limit).
//!   A connection over `max_connections` is still served, by a hyper connection whose only
//!   answer is 503 with `Retry-After` and `Connection: close`, so the client learns to go
//!   elsewhere instead of seeing a reset; up to `max_connections` such connections at once,
//!   beyond which new connections are closed as soon as they are accepted. Shutdown uses
//!   hyper-util's `GracefulShutdown`: in-flight requests finish (up to the shutdown grace),
//!   idle connections close.
//!
//! * **Stopping**: once the process is asked to stop (`draining`), every response carries
//!   `Connection: close`, so keep-alive clients reconnect, through their Service, to a replica
//!   that is not stopping; the listener keeps accepting until the shutdown delay ends.
//!
//! Not covered here: a client that stops reading its response holds its connection until TCP
//! gives up (hyper has no write timeout); `max_connections` bounds how many can do so.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    body::Body,
    error_handling::HandleErrorLayer,
    http::{HeaderValue, Request, Response, StatusCode, header},
    response::IntoResponse,
};
use futures::future::Either;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::{GracefulShutdown, Watcher},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::future::{Ready, ready};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tower::{BoxError, ServiceBuilder, ServiceExt, limit::GlobalConcurrencyLimitLayer, util::Oneshot};
use tower_http::timeout::{DeadlineBody, RequestBodyDeadlineLayer, TimeoutLayer};

/// hyper's smallest read buffer (it panics below).
pub const MIN_HEADER_BYTES: usize = 8_192;

/// What the serving code needs: every timeout and limit of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    pub max_in_flight_requests: usize,
    /// Largest request head; hyper's read buffer, so at least 8192.
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub retry_after_seconds: u32,
    pub shutdown_grace: Duration,
}

impl Default for HttpConfig {
    /// The flags' defaults.
    fn default() -> HttpConfig {
        HttpConfig {
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(10),
            max_connections: 8_192,
            max_in_flight_requests: 512,
            max_header_bytes: 65_536,
            max_headers: 100,
            retry_after_seconds: 1,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the address of the {listener} listener: {source}")]
    LocalAddr {
        listener: &'static str,
        source: std::io::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShedLabels {
    listener: String,
    /// `requests` (503 at the in-flight limit), `connections` (503 at the connection limit),
    /// `dropped` (closed at once beyond both).
    reason: String,
}

/// What the listeners count: open connections, and what they refused.
#[derive(Clone, Debug, Default)]
pub struct ServerMetrics {
    open: Family<ListenerLabel, Gauge>,
    shed: Family<ShedLabels, Counter>,
    timeouts: Family<ListenerLabel, Counter>,
}

impl ServerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("http");
        r.register("open_connections", "Open connections per listener", self.open.clone());
        r.register(
            "shed",
            "Requests and connections refused under load (503 with Retry-After, or closed)",
            self.shed.clone(),
        );
        r.register(
            "handshake_timeouts",
            "TLS handshakes not finished within the header-read timeout",
            self.timeouts.clone(),
        );
    }

    fn open(&self, listener: &str) -> Gauge {
        self.open
            .get_or_create(&ListenerLabel {
                listener: listener.to_string(),
            })
            .clone()
    }

    fn shed(&self, listener: &str, reason: &str) -> Counter {
        self.shed
            .get_or_create(&ShedLabels {
                listener: listener.to_string(),
                reason: reason.to_string(),
            })
            .clone()
    }
}

/// The counters of one listener, resolved once.
#[derive(Clone)]
struct Counters {
    open: Gauge,
    shed_requests: Counter,
    shed_connections: Counter,
    dropped: Counter,
    handshake_timeouts: Counter,
}

/// The 503 sent under load; `Retry-After` tells Eureka clients (and proxies) when to come back.
fn busy(retry_after_seconds: u32, close: bool) -> Response<Body> {
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "server busy; retry later or use another server",
    )
        .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds));
    if close {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// Requests a listener answers in front of its tower stack ([`serve`]): at once and from the
/// request's head alone, so the stack's in-flight limit, request timeout and body deadline have
/// nothing to act on. Everything a shortcut leaves goes through the stack.
pub trait Shortcut: Clone + Send + Sync + 'static {
    /// The answer to `request`, or `None` for the stack to handle it.
    fn answer<B>(&self, request: &Request<B>) -> Option<axum::response::Response>;
}

/// No shortcut: every request goes through the stack.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoShortcut;

impl Shortcut for NoShortcut {
    fn answer<B>(&self, _: &Request<B>) -> Option<axum::response::Response> {
        None
    }
}

/// A [`Shortcut`] in front of a service: what [`serve`] is given. [`serve`] asks the shortcut
/// itself (see `Entry`); as a tower service this serves in-process callers (the API's tests).
#[derive(Clone, Debug)]
pub struct Shortcuts<C, S> {
    pub shortcut: C,
    pub inner: S,
}

impl<C, S, B> tower::Service<Request<B>> for Shortcuts<C, S>
where
    C: Shortcut,
    S: tower::Service<Request<B>, Response = axum::response::Response, Error = Infallible> + Clone,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Self::Response, Infallible>>, Oneshot<S, Request<B>>>;

    /// Always ready: the inner service is asked only for the requests it gets, so a shortcut's
    /// answer takes no in-flight permit.
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Some(answer) = self.shortcut.answer(&request) {
            return Either::Left(ready(Ok(answer)));
        }
        // tower's pattern for a service that was not readied: the clone goes, readied on its own.
        let clone = self.inner.clone();
        Either::Right(std::mem::replace(&mut self.inner, clone).oneshot(request))
    }
}

/// What hyper calls for each request of a served connection: the shortcut, asked inside `call`,
/// else the tower stack ([`stack`]).
///
/// Not hyper-util's `TowerToHyperService` around [`Shortcuts`]: that adapter keeps the request
/// in its future until hyper polls it, and hyper, before it does, reads ahead on a keep-alive
/// connection (to see it closed). The request's head still borrowed the connection's read
/// buffer then, so each read had to allocate a fresh buffer (8 KiB) instead of reusing it: three
/// allocations a heartbeat, about a twentieth of its user-space instructions by callgrind's
/// count (`benches/heartbeat-instructions`). Here a shortcut's request is dropped before `call`
/// returns, as a bare hyper `service_fn` drops it.
#[derive(Clone)]
struct Entry<C, S> {
    shortcut: C,
    stack: S,
    draining: Arc<AtomicBool>,
}

impl<C, S> hyper::service::Service<Request<Incoming>> for Entry<C, S>
where
    C: Shortcut,
    S: tower::Service<Request<Incoming>, Response = Response<Body>, Error = Infallible> + Clone,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response<Body>, Infallible>>, Oneshot<S, Request<Incoming>>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        match self.shortcut.answer(&request) {
            Some(answer) => {
                drop(request);
                Either::Left(ready(Ok(closing(answer, &self.draining))))
            }
            None => Either::Right(self.stack.clone().oneshot(request)),
        }
    }
}

/// `response`, with `Connection: close` once the process is stopping.
fn closing(mut response: Response<Body>, draining: &AtomicBool) -> Response<Body> {
    if draining.load(Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Serves `router` (an axum `Router`, or a service around one) on `listener` (over TLS when `tls`
/// is given), with `shortcut` in front of the stack, until `shutdown` resolves, then lets open
/// requests finish for up to the shutdown grace. `name` labels logs and metrics.
#[allow(clippy::too_many_arguments)]
pub async fn serve<R, C>(
    name: &'static str,
    listener: TcpListener,
    Shortcuts {
        shortcut,
        inner: router,
    }: Shortcuts<C, R>,
    settings: &HttpConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: ServerMetrics,
    draining: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error>
where
    R: Routed,
    C: Shortcut,
{
    let addr = listener
        .local_addr()
        .map_err(|source| Error::LocalAddr { listener: name, source })?;
    let settings = settings.clone();
    let counters = Counters::of(&metrics, name);
    let service = Entry {
        shortcut,
        stack: stack(router, &settings, counters.shed_requests.clone(), draining.clone()),
        draining,
    };
    let slots = Slots::new(name, settings.max_connections);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(name, addr, e).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            peer,
            settings: settings.clone(),
            tls: tls.clone(),
            counters: counters.clone(),
            watcher: graceful.watcher(),
        };
        match slots.admit(&counters) {
            Admitted::Serve(permit) => drop(tokio::spawn(conn.serve(stream, permit, service.clone()))),
            Admitted::Refuse(permit) => drop(tokio::spawn(conn.refuse(stream, permit))),
            Admitted::Drop => drop(stream),
        }
    }
    drop(listener);
    tracing::debug!(listener = name, %addr, open = graceful.count(), "stopped accepting; finishing open requests");
    if tokio::time::timeout(settings.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(listener = name, grace = ?settings.shutdown_grace, "connections still open after the shutdown grace");
    }
    Ok(())
}

impl Counters {
    fn of(metrics: &ServerMetrics, listener: &'static str) -> Self {
        Counters {
            open: metrics.open(listener),
            shed_requests: metrics.shed(listener, "requests"),
            shed_connections: metrics.shed(listener, "connections"),
            dropped: metrics.shed(listener, "dropped"),
            handshake_timeouts: metrics
                .timeouts
                .get_or_create(&ListenerLabel {
                    listener: listener.to_string(),
                })
                .clone(),
        }
    }
}

/// The connection slots of one listener: up to `--max-connections` are served, as many again
/// are answered 503 with `Retry-After`, and the rest are closed at once.
struct Slots {
    listener: &'static str,
    max: usize,
    served: Arc<Semaphore>,
    overflow: Arc<Semaphore>,
    /// Whether the limit was reached (so it is logged once per episode).
    saturated: AtomicBool,
}

/// What becomes of an accepted connection.
enum Admitted {
    Serve(OwnedSemaphorePermit),
    Refuse(OwnedSemaphorePermit),
    Drop,
}

impl Slots {
    fn new(listener: &'static str, max: usize) -> Self {
        Slots {
            listener,
            max,
            served: Arc::new(Semaphore::new(max)),
            overflow: Arc::new(Semaphore::new(max)),
            saturated: AtomicBool::new(false),
        }
    }

    fn admit(&self, counters: &Counters) -> Admitted {
        if let Ok(permit) = self.served.clone().try_acquire_owned() {
            // Logged once per episode: "again" only once half the slots are free.
            if self.served.available_permits() >= self.max / 2 && self.saturated.swap(false, Ordering::Relaxed) {
                tracing::info!(listener = self.listener, "accepting connections again");
            }
            return Admitted::Serve(permit);
        }
        if !self.saturated.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                listener = self.listener,
                limit = self.max,
                "connection limit reached; answering new connections 503"
            );
        }
        match self.overflow.clone().try_acquire_owned() {
            Ok(permit) => {
                counters.shed_connections.inc();
                Admitted::Refuse(permit)
            }
            Err(_) => {
                counters.dropped.inc();
                Admitted::Drop
            }
        }
    }
}

/// What [`serve`] serves: an axum `Router` or a service in front of one (the request body comes
/// wrapped in the body-read deadline).
pub trait Routed:
    tower::Service<
        Request<DeadlineBody<Body>>,
        Response = axum::response::Response,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<R> Routed for R where
    R: tower::Service<
            Request<DeadlineBody<Body>>,
            Response = axum::response::Response,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// The tower stack every request a shortcut leaves passes: `Connection: close` on every response
/// once the process is stopping, load shedding (503 with `Retry-After`) above the in-flight limit,
/// then the request timeout (408) and the body-read deadline, then the router.
fn stack<R: Routed>(
    router: R,
    settings: &HttpConfig,
    shed_requests: Counter,
    draining: Arc<AtomicBool>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    let retry_after = settings.retry_after_seconds;
    ServiceBuilder::new()
        .map_response(move |r: Response<Body>| closing(r, &draining))
        .map_request(|r: Request<Incoming>| r.map(Body::new))
        .layer(HandleErrorLayer::new(move |e: BoxError| {
            let shed = shed_requests.clone();
            async move {
                if e.is::<tower::load_shed::error::Overloaded>() {
                    shed.inc();
                    busy(retry_after, false)
                } else {
                    tracing::warn!(error = %e, "request failed in the HTTP layer");
                    StatusCode::INTERNAL_SERVER_ERROR.into_response()
                }
            }
        }))
        .load_shed()
        .layer(GlobalConcurrencyLimitLayer::new(settings.max_in_flight_requests))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            settings.request_timeout,
        ))
        .layer(RequestBodyDeadlineLayer::new(settings.body_read_timeout))
        .service(router)
}

/// Accept errors are about one connection (reset before accept) or about resources (out of file
/// descriptors). The latter would spin: wait a moment, as hyper's and axum's loops do.
async fn accept_failed(name: &str, addr: SocketAddr, e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted
    ) {
        return;
    }
    tracing::warn!(listener = name, %addr, error = %e, "failed to accept a connection");
    // A pause, not a limit: long enough not to spin on EMFILE, short enough not to be noticed.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// One accepted connection.
struct Conn {
    peer: SocketAddr,
    settings: HttpConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    counters: Counters,
    watcher: Watcher,
}

impl Conn {
    fn http1(&self) -> hyper::server::conn::http1::Builder {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(if crate::mutants::on("idle-keepalive") {
                self.settings.header_read_timeout * 30
            } else {
                self.settings.header_read_timeout
            })
            .max_buf_size(self.settings.max_header_bytes.max(MIN_HEADER_BYTES))
            .keep_alive(true);
        // hyper keeps up to 100 headers on the stack; another limit moves them to the heap.
        if self.settings.max_headers != 100 {
            b.max_headers(self.settings.max_headers);
        }
        b
    }

    /// The stream to speak HTTP on: the TCP stream, or its TLS session once the handshake is
    /// done (within the header-read timeout). `None` when the handshake fails.
    async fn handshake(&self, stream: TcpStream) -> Option<Box<dyn Io>> {
        let Some(acceptor) = &self.tls else {
            return Some(Box::new(stream));
        };
        match tokio::time::timeout(self.settings.header_read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => Some(Box::new(tls)),
            Ok(Err(e)) => {
                tracing::debug!(peer = %self.peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.counters.handshake_timeouts.inc();
                tracing::debug!(peer = %self.peer, "TLS handshake timed out");
                None
            }
        }
    }

    async fn serve<S>(self, stream: TcpStream, permit: OwnedSemaphorePermit, service: S)
    where
        S: hyper::service::Service<Request<Incoming>, Response = Response<Body>, Error = Infallible> + Send + 'static,
        S::Future: Send + 'static,
    {
        let open = self.counters.open.clone();
        open.inc();
        if let Some(io) = self.handshake(stream).await {
            let served = self.http1().serve_connection(TokioIo::new(io), service);
            if let Err(e) = self.watcher.watch(served).await {
                tracing::debug!(peer = %self.peer, error = %e, "connection ended with an error");
            }
        }
        open.dec();
        drop(permit);
    }

    /// Answers one request with 503 and closes.
    async fn refuse(self, stream: TcpStream, permit: OwnedSemaphorePermit) {
        if let Some(io) = self.handshake(stream).await {
            let retry_after = self.settings.retry_after_seconds;
            let service = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                Ok::<_, Infallible>(busy(retry_after, true))
            });
            let mut builder = self.http1();
            builder.keep_alive(false);
            let _ = self
                .watcher
                .watch(builder.serve_connection(TokioIo::new(io), service))
                .await;
        }
        drop(permit);
    }
}

/// A plain or TLS stream, boxed so one hyper connection type serves both.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::{Router, routing::get};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        sync::{Notify, mpsc},
    };

    use super::*;

    /// A router whose `/hold` answers only once released, telling the test when it started.
    fn router(entered: mpsc::UnboundedSender<()>, release: Arc<Notify>) -> Router {
        Router::new().route("/", get(|| async { "ok" })).route(
            "/hold",
            get(move || async move {
                let _ = entered.send(());
                release.notified().await;
                "released"
            }),
        )
    }

    async fn start(settings: HttpConfig, router: Router) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        start_draining(settings, router, Arc::default()).await
    }

    async fn start_draining(
        settings: HttpConfig,
        router: Router,
        draining: Arc<AtomicBool>,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        start_with(settings, router, NoShortcut, draining).await
    }

    async fn start_with(
        settings: HttpConfig,
        router: Router,
        shortcut: impl Shortcut,
        draining: Arc<AtomicBool>,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let metrics = ServerMetrics::default();
            let service = Shortcuts {
                shortcut,
                inner: router,
            };
            serve("test", listener, service, &settings, None, metrics, draining, shutdown).await
        });
        (addr, stop)
    }

    #[tokio::test]
    async fn a_stopping_server_still_answers_but_closes_every_connection_after_its_answer() {
        let (entered_tx, _entered) = mpsc::unbounded_channel();
        let draining = Arc::new(AtomicBool::new(false));
        let router = router(entered_tx, Arc::new(Notify::new()));
        let (addr, _stop) = start_draining(HttpConfig::default(), router, draining.clone()).await;
        let mut kept = TcpStream::connect(addr).await.unwrap();
        let (status, head) = request(&mut kept, "/").await;
        assert_eq!(status, 200);
        assert!(!head.contains("connection: close"), "{head}");
        // The kept-alive connection gets its answer, then is closed; new ones are still accepted.
        answered_then_closed(&mut kept, "/", 200, &draining).await;
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        let (status, head) = request(&mut fresh, "/").await;
        assert_eq!(status, 200);
        assert!(head.contains("connection: close"), "{head}");
    }

    /// Sends `GET path` and reads one response head (and its short body): (status, head).
    async fn request(conn: &mut TcpStream, path: &str) -> (u16, String) {
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        let read = async {
            loop {
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0, "connection closed before a response");
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let head = text[..end].to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        let status = head[9..12].parse().unwrap();
                        return (status, head);
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("no response in 10 s")
    }

    /// Once the server is stopping (`draining` set), `path` on the kept-alive `conn` is answered
    /// with `status` and `Connection: close`, and the connection is closed after it.
    async fn answered_then_closed(conn: &mut TcpStream, path: &str, status: u16, draining: &AtomicBool) {
        draining.store(true, Ordering::Relaxed);
        let (answered, head) = request(conn, path).await;
        assert_eq!(answered, status);
        assert!(head.contains("connection: close"), "{head}");
        assert!(closed(conn).await, "closed after the answer");
    }

    async fn closed(conn: &mut TcpStream) -> bool {
        let mut b = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), conn.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    /// Answers `GET /short` itself, with 202.
    #[derive(Clone)]
    struct Short;

    impl Shortcut for Short {
        fn answer<B>(&self, request: &Request<B>) -> Option<axum::response::Response> {
            (request.uri().path() == "/short").then(|| StatusCode::ACCEPTED.into_response())
        }
    }

    #[tokio::test]
    async fn a_shortcut_answers_in_front_of_the_limits_and_closes_like_the_stack_when_stopping() {
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let draining = Arc::new(AtomicBool::new(false));
        let settings = HttpConfig {
            max_in_flight_requests: 1,
            ..HttpConfig::default()
        };
        let (addr, _stop) = start_with(settings, router(entered_tx, release.clone()), Short, draining.clone()).await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        let held = tokio::spawn(async move { request(&mut a, "/hold").await });
        entered.recv().await.unwrap();
        // The only in-flight slot is taken: the stack sheds, the shortcut answers all the same,
        // again and again on the kept-alive connection.
        let mut b = TcpStream::connect(addr).await.unwrap();
        assert_eq!(request(&mut b, "/").await.0, 503);
        for _ in 0..3 {
            let (status, head) = request(&mut b, "/short").await;
            assert_eq!(status, 202);
            assert!(!head.contains("connection: close"), "{head}");
        }
        answered_then_closed(&mut b, "/short", 202, &draining).await;
        release.notify_one();
        assert_eq!(held.await.unwrap().0, 200);
    }

    #[tokio::test]
    async fn requests_over_the_in_flight_limit_are_shed_with_retry_after() {
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let settings = HttpConfig {
            max_in_flight_requests: 1,
            retry_after_seconds: 7,
            ..HttpConfig::default()
        };
        let (addr, _stop) = start(settings, router(entered_tx, release.clone())).await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        let held = tokio::spawn(async move { request(&mut a, "/hold").await });
        entered.recv().await.unwrap();

        let mut b = TcpStream::connect(addr).await.unwrap();
        let (status, head) = request(&mut b, "/").await;
        assert_eq!(status, 503);
        assert!(head.contains("retry-after: 7"), "{head}");
        release.notify_one();
        assert_eq!(held.await.unwrap().0, 200);
        // The slot is free again, on the same (kept-alive) connection.
        assert_eq!(request(&mut b, "/").await.0, 200);
    }

    #[tokio::test]
    async fn connections_over_the_limit_get_503_and_are_closed() {
        let (entered_tx, _entered) = mpsc::unbounded_channel();
        let settings = HttpConfig {
            max_connections: 1,
            ..HttpConfig::default()
        };
        let (addr, _stop) = start(settings, router(entered_tx, Arc::new(Notify::new()))).await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        assert_eq!(request(&mut a, "/").await.0, 200);
        let mut b = TcpStream::connect(addr).await.unwrap();
        let (status, head) = request(&mut b, "/").await;
        assert_eq!(status, 503);
        assert!(
            head.contains("retry-after: 1") && head.contains("connection: close"),
            "{head}"
        );
        assert!(closed(&mut b).await);
        // The connection within the limit still works.
        assert_eq!(request(&mut a, "/").await.0, 200);
        drop(a);
        // Its slot frees when it closes.
        let mut c = wait_accepted(addr).await;
        assert_eq!(request(&mut c, "/").await.0, 200);
    }

    /// A connection that gets a 200 (the previous one's slot may take a moment to free).
    async fn wait_accepted(addr: SocketAddr) -> TcpStream {
        for _ in 0..200 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            if request(&mut c, "/").await.0 == 200 {
                return c;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the freed connection slot was never reused");
    }

    #[tokio::test]
    async fn slow_heads_and_idle_keep_alive_connections_are_closed() {
        let (entered_tx, _entered) = mpsc::unbounded_channel();
        let settings = HttpConfig {
            header_read_timeout: Duration::from_millis(300),
            ..HttpConfig::default()
        };
        let (addr, _stop) = start(settings, router(entered_tx, Arc::new(Notify::new()))).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        assert_eq!(request(&mut idle, "/").await.0, 200);
        let started = std::time::Instant::now();
        assert!(closed(&mut slow).await, "a half-sent head kept its connection");
        assert!(closed(&mut idle).await, "an idle keep-alive connection stayed open");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_request_over_the_request_timeout_is_answered_408_and_frees_its_slot() {
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let settings = HttpConfig {
            request_timeout: Duration::from_millis(200),
            max_in_flight_requests: 1,
            ..HttpConfig::default()
        };
        let (addr, _stop) = start(settings, router(entered_tx, Arc::new(Notify::new()))).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(request(&mut c, "/hold").await.0, 408);
        entered.recv().await.unwrap();
        assert_eq!(request(&mut c, "/").await.0, 200);
    }

    #[tokio::test]
    async fn oversized_heads_are_answered_431() {
        let (entered_tx, _entered) = mpsc::unbounded_channel();
        let settings = HttpConfig {
            max_header_bytes: 16_384,
            max_headers: 10,
            ..HttpConfig::default()
        };
        let (addr, _stop) = start(settings, router(entered_tx, Arc::new(Notify::new()))).await;
        for head in [
            format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000)),
            format!("GET / HTTP/1.1\r\nHost: t\r\n{}\r\n", "X-H: 1\r\n".repeat(11)),
        ] {
            let mut c = TcpStream::connect(addr).await.unwrap();
            // The server may answer (and close) before it has read everything.
            let _ = c.write_all(head.as_bytes()).await;
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
                .await
                .expect("no answer to an oversized head")
                .unwrap();
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(text.starts_with("HTTP/1.1 431"), "{text}");
        }
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(request(&mut c, "/").await.0, 200);
    }

    #[tokio::test]
    async fn a_stalled_body_is_answered_408() {
        let settings = HttpConfig {
            body_read_timeout: Duration::from_millis(300),
            ..HttpConfig::default()
        };
        let router = Router::new().route(
            "/",
            // The API's own body reader, so the test sees what handlers answer.
            axum::routing::post(|headers: axum::http::HeaderMap, body: Body| async move {
                crate::api::negotiate::read_body(&headers, body, 1024)
                    .await
                    .map(|_| StatusCode::OK)
            }),
        );
        let (addr, _stop) = start(settings, router).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("no answer to a stalled body")
            .unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }
}
