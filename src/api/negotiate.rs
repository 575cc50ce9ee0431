//! Content negotiation and replies: which format a client gets (XML unless `Accept` mentions
//! JSON), which format a body is in, gzip, request-body limits, and the one place where API
//! errors become HTTP responses.

use std::io::Read;

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::{cache::Payload, codec::Format};

/// A request the API refuses, and why.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Java's decode failure: 400 with `cannot parse request body` in the request's format.
    #[error("failed to parse the request body: {detail}")]
    Unparseable { detail: String, json: bool },
    /// A registration Java refuses: 400 with its plain-text message, labelled (as Java does) with
    /// the negotiated reply type.
    #[error("{message}")]
    Validation { message: String, format: Format },
    /// A request we refuse: 400 with a plain-text message.
    #[error("{0}")]
    Invalid(String),
    #[error("unsupported media type {0}")]
    UnsupportedMediaType(String),
    #[error("none of the accepted media types can be produced; ask for application/json or application/xml")]
    NotAcceptable,
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// The body did not arrive within `--http-body-read-timeout-ms`.
    #[error("request body not received in time")]
    BodyTimeout,
    #[error("no Eureka endpoint at {0}")]
    NoRoute(String),
    #[error("method {0} not allowed here")]
    MethodNotAllowed(Method, &'static [Method]),
    #[error("{0}")]
    Conflict(String),
    /// Reads refused while the registry is not ready (Java's `shouldAllowAccess`), or deltas disabled.
    #[error("forbidden")]
    Forbidden,
    #[error("authentication required")]
    Unauthorized,
    /// A replicated write (a batch, or a replication marker) from a caller that did not present
    /// the peer credentials.
    #[error("replication requires the peer credentials (--peer-auth-*); this request authenticated as a client")]
    NotAPeer,
    /// A fetch before the registry is complete: 503, so Eureka clients try their next server.
    #[error(
        "this replica's registry is not complete yet (start-up sync from peers, Kubernetes watches); try another server"
    )]
    Incomplete,
}

impl ApiError {
    /// A bounded label for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ApiError::Unparseable { .. } => "unparseable",
            ApiError::Validation { .. } => "validation",
            ApiError::Invalid(_) => "invalid",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::NotAcceptable => "not_acceptable",
            ApiError::TooLarge(_) => "too_large",
            ApiError::BodyTimeout => "body_timeout",
            ApiError::NoRoute(_) => "no_route",
            ApiError::MethodNotAllowed(..) => "method_not_allowed",
            ApiError::Conflict(_) => "conflict",
            ApiError::Forbidden => "forbidden",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotAPeer => "not_a_peer",
            ApiError::Incomplete => "incomplete",
        }
    }
}

fn text(status: StatusCode, message: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match self {
            ApiError::Unparseable { detail, json: true } => {
                let body = serde_json::json!({"error": "cannot parse request body", "detail": detail});
                (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response()
            }
            ApiError::Unparseable { detail, json: false } => {
                let mut body = b"<error><message>cannot parse request body</message><detail>".to_vec();
                for b in detail.bytes() {
                    match b {
                        b'<' => body.extend_from_slice(b"&lt;"),
                        b'>' => body.extend_from_slice(b"&gt;"),
                        b'&' => body.extend_from_slice(b"&amp;"),
                        _ => body.push(b),
                    }
                }
                body.extend_from_slice(b"</detail></error>");
                (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "application/xml")],
                    body,
                )
                    .into_response()
            }
            ApiError::Validation { message, format } => (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, format.content_type())],
                message,
            )
                .into_response(),
            ApiError::Invalid(m) => text(StatusCode::BAD_REQUEST, m),
            ApiError::UnsupportedMediaType(_) => text(StatusCode::UNSUPPORTED_MEDIA_TYPE, message),
            ApiError::NotAcceptable => text(StatusCode::NOT_ACCEPTABLE, message),
            ApiError::TooLarge(_) => text(StatusCode::PAYLOAD_TOO_LARGE, message),
            ApiError::BodyTimeout => text(StatusCode::REQUEST_TIMEOUT, message),
            ApiError::NoRoute(_) => text(StatusCode::NOT_FOUND, message),
            ApiError::MethodNotAllowed(_, allowed) => {
                let allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
                let mut r = text(StatusCode::METHOD_NOT_ALLOWED, message);
                if let Ok(v) = HeaderValue::from_str(&allow) {
                    r.headers_mut().insert(header::ALLOW, v);
                }
                r
            }
            ApiError::Conflict(m) => text(StatusCode::CONFLICT, m),
            ApiError::Forbidden => empty(StatusCode::FORBIDDEN),
            ApiError::NotAPeer => text(StatusCode::FORBIDDEN, message),
            ApiError::Incomplete => {
                let mut r = text(StatusCode::SERVICE_UNAVAILABLE, message);
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            ApiError::Unauthorized => {
                let mut r = text(StatusCode::UNAUTHORIZED, message);
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"eureka\""),
                );
                r
            }
        }
    }
}

/// A reply with no body and no `Content-Type` (heartbeat and cancel answers must look like this:
/// Jersey clients read any heartbeat body as an instance).
pub fn empty(status: StatusCode) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    r
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The format of a reply: JSON when `Accept` mentions JSON, XML otherwise (also with no
/// `Accept`). An `Accept` that allows neither is refused.
pub fn reply_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(accept) = header_str(headers, header::ACCEPT).map(str::to_ascii_lowercase) else {
        return Ok(Format::Xml);
    };
    if accept.trim().is_empty() {
        return Ok(Format::Xml);
    }
    if accept.contains("json") {
        return Ok(Format::Json);
    }
    if accept.contains("xml") || accept.contains("*/*") || accept.contains("application/*") {
        return Ok(Format::Xml);
    }
    Err(ApiError::NotAcceptable)
}

/// Whether the client takes gzip.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    header_str(headers, header::ACCEPT_ENCODING).is_some_and(|v| v.to_ascii_lowercase().contains("gzip"))
}

/// A cached payload as a reply, gzipped when `gzip` (for `apps` and `apps/delta`, as Java).
/// A form the payload was not built with is made once, on a blocking thread, so request workers
/// never stall behind compression. The identity form of an assembled payload is sent as its
/// shared pieces, never joined into one copy.
pub async fn payload_reply(payload: std::sync::Arc<Payload>, format: Format, gzip: bool) -> Response {
    let builder = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, format.content_type())
        .header(header::VARY, "Accept, Accept-Encoding");
    let reply = if gzip {
        let body = match payload.gzip_ready() {
            Some(b) => b,
            None => {
                let p = payload.clone();
                tokio::task::spawn_blocking(move || p.gzip())
                    .await
                    .unwrap_or_else(|_| payload.gzip())
            }
        };
        builder.header(header::CONTENT_ENCODING, "gzip").body(Body::from(body))
    } else {
        let pieces = match payload.identity_ready() {
            Some(p) => p,
            None => {
                let p = payload.clone();
                tokio::task::spawn_blocking(move || p.identity())
                    .await
                    .unwrap_or_else(|_| payload.identity())
            }
        };
        builder.body(Body::new(pieces.body()))
    };
    reply.unwrap_or_else(|_| empty(StatusCode::INTERNAL_SERVER_ERROR))
}

/// An encoded document as a reply.
pub fn document(status: StatusCode, body: Vec<u8>, format: Format) -> Response {
    (status, [(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

/// The format of a request body, from `Content-Type` (or the first byte when there is none),
/// with the charsets Java accepts (UTF-8 and ISO-8859-1, which is converted).
pub fn body_format(headers: &HeaderMap, body: &[u8]) -> Result<(Format, Option<Vec<u8>>), ApiError> {
    let ct = header_str(headers, header::CONTENT_TYPE).map(str::to_ascii_lowercase);
    let format = match ct.as_deref() {
        Some(ct) if ct.contains("json") => Format::Json,
        Some(ct) if ct.contains("xml") => Format::Xml,
        Some(ct) if !ct.trim().is_empty() => return Err(ApiError::UnsupportedMediaType(ct.to_string())),
        _ => match body.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'<') => Format::Xml,
            _ => Format::Json,
        },
    };
    let charset = ct
        .as_deref()
        .and_then(|ct| ct.split(';').find_map(|p| p.trim().strip_prefix("charset=")))
        .map(|c| c.trim_matches('"').to_string());
    let converted = match charset.as_deref() {
        None | Some("utf-8") | Some("utf8") => None,
        Some("iso-8859-1") | Some("latin1") => Some(body.iter().map(|&b| b as char).collect::<String>().into_bytes()),
        Some(other) => return Err(ApiError::UnsupportedMediaType(format!("charset {other}"))),
    };
    Ok((format, converted))
}

/// Whether a decode failure should be answered in JSON (Java: request type exactly JSON).
pub fn json_request(headers: &HeaderMap) -> bool {
    header_str(headers, header::CONTENT_TYPE).is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Reads the whole body, inflating `Content-Encoding: gzip`, refusing more than `limit` bytes.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let raw = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let timed_out = std::iter::successors(std::error::Error::source(&e), |e| e.source())
            .any(|e| e.is::<tower_http::timeout::TimeoutError>());
        if timed_out {
            ApiError::BodyTimeout
        } else {
            ApiError::TooLarge(limit)
        }
    })?;
    let gzipped = header_str(headers, header::CONTENT_ENCODING).is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    if !gzipped {
        return Ok(raw);
    }
    let mut out = Vec::new();
    let mut decoder = flate2::read::GzDecoder::new(&raw[..]).take(limit as u64 + 1);
    decoder.read_to_end(&mut out).map_err(|e| ApiError::Unparseable {
        detail: format!("invalid gzip body: {e}"),
        json: json_request(headers),
    })?;
    if out.len() > limit {
        return Err(ApiError::TooLarge(limit));
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn xml_unless_json_is_asked_for() {
        assert_eq!(reply_format(&headers(&[])).unwrap(), Format::Xml);
        assert_eq!(reply_format(&headers(&[("accept", "*/*")])).unwrap(), Format::Xml);
        assert_eq!(
            reply_format(&headers(&[("accept", "application/json")])).unwrap(),
            Format::Json
        );
        assert_eq!(
            reply_format(&headers(&[("accept", "application/xml, application/json")])).unwrap(),
            Format::Json
        );
        assert_eq!(
            reply_format(&headers(&[("accept", "text/html,application/xhtml+xml,*/*;q=0.8")])).unwrap(),
            Format::Xml
        );
        assert!(matches!(
            reply_format(&headers(&[("accept", "text/html")])),
            Err(ApiError::NotAcceptable)
        ));
    }

    #[test]
    fn body_formats_and_charsets() {
        let (f, c) = body_format(&headers(&[("content-type", "application/json")]), b"{}").unwrap();
        assert_eq!((f, c), (Format::Json, None));
        let (f, _) = body_format(&headers(&[("content-type", "application/xml; charset=UTF-8")]), b"<a/>").unwrap();
        assert_eq!(f, Format::Xml);
        let (f, _) = body_format(&headers(&[]), b"  <instance/>").unwrap();
        assert_eq!(f, Format::Xml);
        let (_, c) = body_format(
            &headers(&[("content-type", "application/json; charset=ISO-8859-1")]),
            &[0xE9],
        )
        .unwrap();
        assert_eq!(c.unwrap(), "é".as_bytes());
        assert!(matches!(
            body_format(&headers(&[("content-type", "text/plain")]), b"x"),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        assert!(body_format(&headers(&[("content-type", "application/json; charset=utf-16")]), b"x").is_err());
    }
}
