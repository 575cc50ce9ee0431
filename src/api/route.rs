//! Path and query parameters of the Eureka endpoints: path segments as axum decodes them
//! (percent-decoded, application names upper-cased; an empty or non-UTF-8 segment names no
//! endpoint, 404), query pairs decoded in order with the first value of a repeated key winning.
//! The routes themselves are declared on axum's `Router` in [`super::router`].

use std::borrow::Cow;

use axum::{
    extract::{FromRequestParts, RawPathParams},
    http::request::Parts,
};
use percent_encoding::percent_decode_str;

use super::negotiate::ApiError;

/// The path parameters of a matched route (percent-decoded, borrowed from the request's
/// extensions: nothing is copied until a value is kept); 404 when one is empty or not UTF-8.
async fn segments(parts: &mut Parts) -> Result<RawPathParams, ApiError> {
    match RawPathParams::from_request_parts(parts, &()).await {
        Ok(params) if params.iter().all(|(_, v)| !v.is_empty()) => Ok(params),
        _ => Err(no_route(parts)),
    }
}

fn no_route(parts: &Parts) -> ApiError {
    ApiError::NoRoute(parts.uri.path().to_string())
}

fn named<'a>(params: &'a RawPathParams, name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
}

/// `{app}`: an application name, upper-cased (Eureka's names are case-insensitive).
pub struct AppPath(pub String);

/// `{app}/{id}`: an instance of an application.
pub struct InstancePath {
    pub app: String,
    pub id: String,
}

/// The last path parameter, as sent (`{vip}`, `{id}`, `{asg}`).
pub struct Segment(pub String);

impl<S: Send + Sync> FromRequestParts<S> for AppPath {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let params = segments(parts).await?;
        let app = named(&params, "app").ok_or_else(|| no_route(parts))?;
        Ok(AppPath(app.to_ascii_uppercase()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for InstancePath {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let params = segments(parts).await?;
        match (named(&params, "app"), named(&params, "id")) {
            (Some(app), Some(id)) => Ok(InstancePath {
                app: app.to_ascii_uppercase(),
                id: id.to_string(),
            }),
            _ => Err(no_route(parts)),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let params = segments(parts).await?;
        match params.iter().last() {
            Some((_, v)) => Ok(Segment(v.to_string())),
            None => Err(no_route(parts)),
        }
    }
}

/// Query parameters (`a=b&c=d`), decoded, in order; `+` is a space. A key or value with nothing
/// to decode is borrowed from `q`.
pub fn query(q: Option<&str>) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let Some(q) = q else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> Cow<'_, str> {
    if !s.contains(['+', '%']) {
        return Cow::Borrowed(s);
    }
    let spaced = s.replace('+', " ");
    Cow::Owned(percent_decode_str(&spaced).decode_utf8_lossy().into_owned())
}

/// Decoded query parameters, as [`query`] returns them.
pub type Params<'q> = [(Cow<'q, str>, Cow<'q, str>)];

/// The first value of `name`.
pub fn param<'a>(params: &'a Params<'_>, name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_ref())
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn decodes_pairs_in_order() {
        let q = query(Some("status=UP&lastDirtyTimestamp=12&x=a%20b+c&flag&x=2"));
        assert_eq!(param(&q, "status"), Some("UP"));
        assert_eq!(param(&q, "lastDirtyTimestamp"), Some("12"));
        assert_eq!(param(&q, "x"), Some("a b c"), "first value wins");
        assert_eq!(param(&q, "flag"), Some(""));
        assert!(query(None).is_empty());
    }
}
