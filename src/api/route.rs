//! Path and query parameters of the Eureka endpoints: path segments as axum decodes them
//! (percent-decoded, application names upper-cased; an empty or non-UTF-8 segment names no
//! endpoint, 404), query pairs decoded in order with the first value of a repeated key winning.
//! The routes themselves are declared on axum's `Router` in [`super::router`].

use axum::{
    extract::{FromRequestParts, Path},
    http::request::Parts,
};
use percent_encoding::percent_decode_str;

use super::negotiate::ApiError;

/// The path parameters of a matched route, in order; 404 when one is empty or not UTF-8.
async fn segments(parts: &mut Parts) -> Result<Vec<(String, String)>, ApiError> {
    let no_route = |parts: &Parts| ApiError::NoRoute(parts.uri.path().to_string());
    match Path::<Vec<(String, String)>>::from_request_parts(parts, &()).await {
        Ok(Path(params)) if params.iter().all(|(_, v)| !v.is_empty()) => Ok(params),
        _ => Err(no_route(parts)),
    }
}

fn named(params: &[(String, String)], name: &str) -> Option<String> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
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
        let app = named(&params, "app").ok_or_else(|| ApiError::NoRoute(parts.uri.path().to_string()))?;
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
                id,
            }),
            _ => Err(ApiError::NoRoute(parts.uri.path().to_string())),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let mut params = segments(parts).await?;
        match params.pop() {
            Some((_, v)) => Ok(Segment(v)),
            None => Err(ApiError::NoRoute(parts.uri.path().to_string())),
        }
    }
}

/// Query parameters (`a=b&c=d`), decoded, in order; `+` is a space.
pub fn query(q: Option<&str>) -> Vec<(String, String)> {
    let Some(q) = q else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

/// The first value of `name`.
pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
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
