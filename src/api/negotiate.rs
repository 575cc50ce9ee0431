//! Content negotiation and replies: which format a client gets (XML unless `Accept` mentions
//! JSON), which format a body is in, request bodies (size limits, gzip, charsets, decoding off
//! the request workers), and the one place where API errors become HTTP responses.
//!
//! A request body is decoded as it is inflated: a gzip body is never held whole, so a small
//! compressed body that inflates to the size limit costs the decoder's state, not the inflated
//! size. Gzip bodies and bodies above a size threshold are decoded on a blocking thread, so the
//! request workers (and the heartbeats they serve) never wait behind a large decode, and at most
//! a bounded number of such decodes run at once (by default one less than the cores), so a flood
//! of large bodies queues instead of taking every core.

use std::{
    io::{BufReader, Read},
    sync::Arc,
};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::{
    cache::Payload,
    codec::{Format, Input, xml},
    registry::limits::{InstanceLimits, LimitExceeded},
};

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
    /// A method the endpoint does not serve (axum's router adds `Allow`).
    #[error("method {0} not allowed here")]
    MethodNotAllowed(Method),
    #[error("{0}")]
    Conflict(String),
    /// A write a cap refuses: 400 when the instance is too large, 403 when the registry is full.
    #[error(transparent)]
    OverLimit(LimitExceeded),
    /// A failure of this server (a decoder that did not finish).
    #[error("{0}")]
    Internal(String),
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
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Conflict(_) => "conflict",
            ApiError::OverLimit(_) => "over_limit",
            ApiError::Internal(_) => "internal",
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

/// Why a request was refused, carried in the response's extensions for the request log and
/// the metrics.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub category: &'static str,
    pub message: String,
    /// The cap that refused it, if one did.
    pub limit: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let refusal = Refusal {
            category: self.category(),
            message: self.to_string(),
            limit: match &self {
                ApiError::OverLimit(e) => Some(e.kind()),
                _ => None,
            },
        };
        let mut response = self.respond();
        response.extensions_mut().insert(refusal);
        response
    }
}

impl ApiError {
    fn respond(self) -> Response {
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
                body.extend_from_slice(xml::escape(&detail).as_bytes());
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
            ApiError::MethodNotAllowed(_) => text(StatusCode::METHOD_NOT_ALLOWED, message),
            ApiError::Conflict(m) => text(StatusCode::CONFLICT, m),
            ApiError::OverLimit(e) if e.is_instance_fault() => text(StatusCode::BAD_REQUEST, message),
            ApiError::OverLimit(_) => text(StatusCode::FORBIDDEN, message),
            ApiError::Internal(_) => text(StatusCode::INTERNAL_SERVER_ERROR, message),
            ApiError::Forbidden => empty(StatusCode::FORBIDDEN),
            ApiError::NotAPeer => text(StatusCode::FORBIDDEN, message),
            ApiError::Incomplete => {
                let mut r = text(StatusCode::SERVICE_UNAVAILABLE, message);
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r.headers_mut()
                    .insert(crate::health::INCOMPLETE_HEADER, HeaderValue::from_static("true"));
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
/// never stall behind compression. Both forms of an assembled payload are sent as their shared
/// pieces, never joined into one copy.
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
        builder
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Body::new(body.body()))
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

/// The format a request body declares in `Content-Type` (`None`: none declared, sniff the body),
/// and whether it is ISO-8859-1 (converted as it is read); the charsets Java accepts are UTF-8 and
/// ISO-8859-1.
pub fn declared_format(headers: &HeaderMap) -> Result<(Option<Format>, bool), ApiError> {
    let ct = header_str(headers, header::CONTENT_TYPE).map(str::to_ascii_lowercase);
    let format = match ct.as_deref() {
        Some(ct) if ct.contains("json") => Some(Format::Json),
        Some(ct) if ct.contains("xml") => Some(Format::Xml),
        Some(ct) if !ct.trim().is_empty() => return Err(ApiError::UnsupportedMediaType(ct.to_string())),
        _ => None,
    };
    let charset = ct
        .as_deref()
        .and_then(|ct| ct.split(';').find_map(|p| p.trim().strip_prefix("charset=")))
        .map(|c| c.trim_matches('"').to_string());
    let latin1 = match charset.as_deref() {
        None | Some("utf-8") | Some("utf8") => false,
        Some("iso-8859-1") | Some("latin1") => true,
        Some(other) => return Err(ApiError::UnsupportedMediaType(format!("charset {other}"))),
    };
    Ok((format, latin1))
}

/// Whether a decode failure should be answered in JSON (Java: request type exactly JSON).
pub fn json_request(headers: &HeaderMap) -> bool {
    header_str(headers, header::CONTENT_TYPE).is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// What request bodies may be, and where they are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputLimits {
    /// Bodies larger than this (and every gzip body, whose inflated size is unknown until it is
    /// read) are decoded on a blocking thread.
    pub blocking_threshold: usize,
    /// How many of those decodes run at once; 0: one less than the cores, at least one.
    pub max_concurrent_decodes: usize,
    /// Caps on one instance, applied while a registration or a batch is decoded.
    pub instance: InstanceLimits,
}

impl InputLimits {
    pub const DEFAULT_BLOCKING_THRESHOLD: usize = 64 * 1024;

    /// The number of concurrent blocking decodes `max_concurrent_decodes` stands for.
    pub fn decoders(&self) -> usize {
        match self.max_concurrent_decodes {
            0 => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_sub(1)
                .max(1),
            n => n,
        }
    }
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            blocking_threshold: Self::DEFAULT_BLOCKING_THRESHOLD,
            max_concurrent_decodes: 0,
            instance: InstanceLimits::default(),
        }
    }
}

/// How request bodies are read: the limits, and the permits of the blocking decodes.
#[derive(Clone, Debug)]
pub struct Decoding {
    pub limits: InputLimits,
    permits: Arc<tokio::sync::Semaphore>,
}

impl Decoding {
    pub fn new(limits: InputLimits) -> Decoding {
        Decoding {
            limits,
            permits: Arc::new(tokio::sync::Semaphore::new(limits.decoders())),
        }
    }
}

impl Default for Decoding {
    fn default() -> Self {
        Decoding::new(InputLimits::default())
    }
}

/// Why a body stream stopped.
#[derive(Debug)]
enum Failure {
    TooLarge,
    Gzip(String),
}

/// A body as it is inflated (gzip) and converted (ISO-8859-1 to UTF-8), counting the bytes and
/// failing past the limit.
struct BodyReader<'a> {
    source: Source<'a>,
    latin1: bool,
    /// The second byte of a converted character that did not fit.
    pending: Option<u8>,
    read: usize,
    limit: usize,
    failure: Option<Failure>,
}

enum Source<'a> {
    Plain(&'a [u8]),
    Gzip(Box<flate2::read::GzDecoder<&'a [u8]>>),
}

impl BodyReader<'_> {
    fn raw(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match &mut self.source {
            Source::Plain(b) => b.read(buf)?,
            Source::Gzip(d) => d
                .read(buf)
                .inspect_err(|e| self.failure = Some(Failure::Gzip(e.to_string())))?,
        };
        self.read += n;
        if self.read > self.limit {
            self.failure = Some(Failure::TooLarge);
            return Err(std::io::Error::other("request body too large"));
        }
        Ok(n)
    }
}

impl Read for BodyReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.failure.is_some() {
            return Err(std::io::Error::other("request body unreadable"));
        }
        if !self.latin1 {
            return self.raw(out);
        }
        if out.is_empty() {
            return Ok(0);
        }
        let mut n = 0;
        if let Some(b) = self.pending.take() {
            out[0] = b;
            n = 1;
        }
        let mut raw = [0u8; 4096];
        let want = ((out.len() - n) / 2).clamp(1, raw.len());
        if n == out.len() {
            return Ok(n);
        }
        let got = self.raw(&mut raw[..want])?;
        for &b in &raw[..got] {
            if b < 0x80 {
                out[n] = b;
                n += 1;
            } else {
                out[n] = 0xC0 | (b >> 6);
                n += 1;
                let second = 0x80 | (b & 0x3F);
                if n < out.len() {
                    out[n] = second;
                    n += 1;
                } else {
                    self.pending = Some(second);
                }
            }
        }
        Ok(n)
    }
}

/// Decodes a body already read, `raw`, with `decode`: streamed through an inflater (`gzip`) and a
/// converter (`latin1`) when it needs them, failing past `limit` bytes; `json` says how a decode
/// failure is answered.
pub fn decode_bytes<T>(
    raw: &[u8],
    gzip: bool,
    latin1: bool,
    limit: usize,
    json: bool,
    decode: impl FnOnce(Input<'_>) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    if !gzip && raw.len() > limit {
        // Read whole already (the caller's read is capped too): refused the same way.
        return Err(ApiError::TooLarge(limit));
    }
    if !gzip && !latin1 {
        return decode(Input::Bytes(raw));
    }
    if gzip && crate::mutants::on("decode-whole-body") {
        let mut whole = Vec::new();
        let _ = std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(raw), &mut whole);
        if whole.len() > limit {
            return Err(ApiError::TooLarge(limit));
        }
        return decode_bytes(&whole, false, latin1, limit, json, decode);
    }
    let source = if gzip {
        Source::Gzip(Box::new(flate2::read::GzDecoder::new(raw)))
    } else {
        Source::Plain(raw)
    };
    let mut reader = BufReader::with_capacity(
        16 * 1024,
        BodyReader {
            source,
            latin1,
            pending: None,
            read: 0,
            limit,
            failure: None,
        },
    );
    let result = decode(Input::Stream(&mut reader));
    match reader.into_inner().failure {
        Some(Failure::TooLarge) => Err(ApiError::TooLarge(limit)),
        Some(Failure::Gzip(e)) => Err(ApiError::Unparseable {
            detail: format!("invalid gzip body: {e}"),
            json,
        }),
        None => result,
    }
}

/// Reads a request body of at most `limit` bytes (after decompression; `Content-Encoding: gzip`
/// is inflated as it is decoded, and ISO-8859-1 converted when `latin1`) and decodes it with
/// `decode`: on a blocking thread, once a permit is free, when it is gzipped or larger than the
/// blocking threshold.
pub async fn decode_body<T, F>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    decoding: &Decoding,
    latin1: bool,
    decode: F,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(Input<'_>) -> Result<T, ApiError> + Send + 'static,
{
    let raw = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let timed_out = std::iter::successors(std::error::Error::source(&e), |e| e.source())
            .any(|e| e.is::<tower_http::timeout::TimeoutError>());
        if timed_out {
            ApiError::BodyTimeout
        } else {
            ApiError::TooLarge(limit)
        }
    })?;
    let gzip = header_str(headers, header::CONTENT_ENCODING).is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let json = json_request(headers);
    if !gzip && raw.len() <= decoding.limits.blocking_threshold {
        return decode_bytes(&raw, gzip, latin1, limit, json, decode);
    }
    let permit = decoding
        .permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::Internal(format!("failed to decode the request body: {e}")))?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        decode_bytes(&raw, gzip, latin1, limit, json, decode)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("failed to decode the request body: {e}")))?
}

/// Reads a whole body as bytes (inflating gzip) with [`decode_body`]'s limits and errors.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    decode_body(headers, body, limit, &Decoding::default(), false, |input| match input {
        Input::Bytes(b) => Ok(b.to_vec()),
        Input::Stream(r) => {
            let mut out = Vec::new();
            r.read_to_end(&mut out)
                .map_err(|e| ApiError::Invalid(format!("failed to read the request body: {e}")))?;
            Ok(out)
        }
    })
    .await
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
    fn declared_formats_and_charsets() {
        let declared = |pairs| declared_format(&headers(pairs));
        assert_eq!(
            declared(&[("content-type", "application/json")]).unwrap(),
            (Some(Format::Json), false)
        );
        assert_eq!(
            declared(&[("content-type", "application/xml; charset=UTF-8")]).unwrap(),
            (Some(Format::Xml), false)
        );
        assert_eq!(declared(&[]).unwrap(), (None, false));
        assert_eq!(
            declared(&[("content-type", "application/json; charset=ISO-8859-1")]).unwrap(),
            (Some(Format::Json), true)
        );
        assert!(matches!(
            declared(&[("content-type", "text/plain")]),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        assert!(declared(&[("content-type", "application/json; charset=utf-16")]).is_err());
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Reads the whole stream as `decode` would.
    fn read_all(raw: &[u8], gzip: bool, latin1: bool, limit: usize) -> Result<Vec<u8>, ApiError> {
        decode_bytes(raw, gzip, latin1, limit, true, |input| match input {
            Input::Bytes(b) => Ok(b.to_vec()),
            Input::Stream(r) => {
                let mut out = Vec::new();
                r.read_to_end(&mut out).map_err(|e| ApiError::Invalid(e.to_string()))?;
                Ok(out)
            }
        })
    }

    #[test]
    fn bodies_are_inflated_converted_and_bounded_as_they_are_read() {
        assert_eq!(read_all(b"plain", false, false, 10).unwrap(), b"plain");
        assert_eq!(read_all(&gzip(b"inflated"), true, false, 10).unwrap(), b"inflated");
        let latin1: Vec<u8> = (0u8..=255).cycle().take(10_000).collect();
        let expected: String = latin1.iter().map(|&b| b as char).collect();
        assert_eq!(read_all(&latin1, false, true, 20_000).unwrap(), expected.as_bytes());
        assert_eq!(
            read_all(&gzip(&latin1), true, true, 20_000).unwrap(),
            expected.as_bytes()
        );
        assert!(matches!(
            read_all(&gzip(&[b' '; 100_000]), true, false, 1000),
            Err(ApiError::TooLarge(1000))
        ));
        assert!(matches!(
            read_all(b"nope", true, false, 1000),
            Err(ApiError::Unparseable { .. })
        ));
    }
}
