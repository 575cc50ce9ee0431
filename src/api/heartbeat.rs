//! The heartbeat's own path: `PUT {prefix}/apps/{app}/{id}` answered in front of axum's router
//! and of the listener's tower stack (a [`Shortcut`]).
//!
//! Heartbeats are nearly all of a Eureka server's requests (every client, every 30 s), and each
//! one through the router paid for what it does not use: a clone of each boxed route service and
//! a boxed future per layer, the path parameters percent-decoded into `Arc<str>`s in the request's
//! extensions, and a copy of the header map for the handler (about 20 allocations a heartbeat,
//! most of the server's CPU above the kernel's; see docs/src/performance/registry.md). This
//! service recognises a plain heartbeat path itself and calls the same function the routed
//! handler calls ([`eureka::renew_instance`]), with the same auth check ([`auth::admit`]), the
//! same metrics record and the same debug span the router's trace layer opens. Everything else,
//! and any heartbeat path that needs decoding (a `%` escape, an empty segment, a trailing slash),
//! goes through the router as before, so what a client sees does not depend on which path
//! answered it.
//!
//! It answers in front of the stack's in-flight limit, request timeout and body deadline too:
//! a heartbeat is answered synchronously from its head, so none of them has anything to act on,
//! and each cost a timer or a semaphore per heartbeat. Heartbeats are therefore never shed
//! with 503 while slow requests fill the in-flight limit.

use std::{sync::Arc, time::Instant};

use axum::{
    http::{Method, Request},
    response::{IntoResponse, Response},
};

use super::{
    Api,
    auth::{self, Access, Caller},
    eureka, record,
    server::Shortcut,
};

/// Answers plain heartbeats; the rest is left to the router.
#[derive(Clone)]
pub struct Heartbeats {
    pub api: Arc<Api>,
    pub access: Option<Arc<Access>>,
}

/// `(app, id)` when `path` is a heartbeat's path under `/eureka/` or `/eureka/v2/` with two
/// non-empty segments that need no decoding, found in one pass over the segments' bytes.
fn heartbeat_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/eureka/")?;
    let rest = rest.strip_prefix("v2/").unwrap_or(rest).strip_prefix("apps/")?;
    let mut slash = None;
    for (i, b) in rest.bytes().enumerate() {
        match b {
            b'%' => return None,
            b'/' if slash.is_none() => slash = Some(i),
            b'/' => return None,
            _ => {}
        }
    }
    let slash = slash?;
    let (app, id) = (&rest[..slash], &rest[slash + 1..]);
    (!app.is_empty() && !id.is_empty()).then_some((app, id))
}

impl Heartbeats {
    fn renew<B>(&self, request: &Request<B>, app: &str, id: &str) -> Response {
        let started = Instant::now();
        // What the router's `TraceLayer` makes of every request (see `super::router`).
        let span = tracing::debug_span!(
            "request",
            method = %request.method(),
            uri = %request.uri(),
            version = ?request.version(),
        );
        let _entered = span.enter();
        let caller = match &self.access {
            None => Caller::Trusted,
            Some(access) => match auth::admit(access, request) {
                Ok(caller) => caller,
                // As the auth middleware answers: before the endpoint, so not recorded by it.
                Err(e) => return e.into_response(),
            },
        };
        let response = eureka::renew_instance(
            &self.api,
            app.to_ascii_uppercase(),
            id.to_string(),
            caller,
            request.uri().query(),
            request.headers(),
        )
        .unwrap_or_else(IntoResponse::into_response);
        record(
            &self.api.metrics,
            "instance",
            &Method::PUT,
            request.uri(),
            &response,
            started,
        );
        tracing::trace!(latency = ?started.elapsed(), status = response.status().as_u16(), "finished processing request");
        response
    }
}

impl Shortcut for Heartbeats {
    fn answer<B>(&self, request: &Request<B>) -> Option<Response> {
        if request.method() != Method::PUT || crate::mutants::on("heartbeats-behind-the-limit") {
            return None;
        }
        let (app, id) = heartbeat_path(request.uri().path())?;
        Some(self.renew(request, app, id))
    }
}

#[cfg(test)]
mod tests {
    use super::heartbeat_path;

    #[test]
    fn only_plain_heartbeat_paths_are_taken() {
        assert_eq!(heartbeat_path("/eureka/apps/A/i-1"), Some(("A", "i-1")));
        assert_eq!(heartbeat_path("/eureka/v2/apps/a/h:a:8080"), Some(("a", "h:a:8080")));
        // Named by Eureka's other endpoints, or left to the router to decode and normalise.
        for path in [
            "/eureka/apps/A",
            "/eureka/apps/A/i-1/status",
            "/eureka/apps/A/i-1/",
            "/eureka/apps//i-1",
            "/eureka/apps/A/",
            "/eureka/apps/A/i%2D1",
            "/eureka/v3/apps/A/i-1",
            "/eureka/instances/i-1",
            "/apps/A/i-1",
            "/eureka/v2/v2/apps/A/i-1",
        ] {
            assert_eq!(heartbeat_path(path), None, "{path}");
        }
    }
}
