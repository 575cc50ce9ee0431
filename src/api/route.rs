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

/// Query parameters (`a=b&c=d`), read in place: decoded pair by pair as they are asked for, in
/// order, `+` as a space, the first value of a repeated key winning. Nothing is allocated unless a
/// key or value has something to decode (a heartbeat reads two parameters and keeps neither).
#[derive(Clone, Copy, Debug)]
pub struct Query<'q>(&'q str);

impl<'q> Query<'q> {
    /// Every pair in order; a pair without `=` has an empty value.
    pub fn pairs(self) -> impl Iterator<Item = (Cow<'q, str>, Cow<'q, str>)> {
        raw_pairs(self.0).map(|(k, v)| (decode(k), decode(v)))
    }

    /// The first value of `name` (only its value is decoded; a key only when it has something to
    /// decode and is not `name` as sent).
    pub fn get(self, name: &str) -> Option<Cow<'q, str>> {
        raw_pairs(self.0).find_map(|(k, v)| (k == name || (encoded(k) && decode(k) == name)).then(|| decode(v)))
    }
}

/// The pairs of a query as sent, split at `&` and at each pair's first `=` (both are ASCII, so
/// every split falls between characters); empty pairs are skipped. With `memchr` rather than
/// `split` and `split_once`, whose character searchers cost a heartbeat more than its registry
/// update did (by callgrind's count of instructions).
fn raw_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = query;
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let end = memchr::memchr(b'&', rest.as_bytes()).unwrap_or(rest.len());
            let pair = &rest[..end];
            rest = rest.get(end + 1..).unwrap_or("");
            if !pair.is_empty() {
                return Some(match memchr::memchr(b'=', pair.as_bytes()) {
                    Some(i) => (&pair[..i], &pair[i + 1..]),
                    None => (pair, ""),
                });
            }
        }
        None
    })
}

/// The query of a request (none reads as empty).
pub fn query(q: Option<&str>) -> Query<'_> {
    Query(q.unwrap_or(""))
}

/// Whether `s` has anything to decode (a `+` or a `%` escape).
fn encoded(s: &str) -> bool {
    memchr::memchr2(b'+', b'%', s.as_bytes()).is_some()
}

fn decode(s: &str) -> Cow<'_, str> {
    if !encoded(s) {
        return Cow::Borrowed(s);
    }
    let spaced = s.replace('+', " ");
    Cow::Owned(percent_decode_str(&spaced).decode_utf8_lossy().into_owned())
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn decodes_pairs_in_order() {
        let q = query(Some(
            "status=UP&lastDirtyTimestamp=12&x=a%20b+c&flag&x=2&&a%3Db=%2B&e=1=2&=v&",
        ));
        assert_eq!(q.get("status").as_deref(), Some("UP"));
        assert_eq!(q.get("lastDirtyTimestamp").as_deref(), Some("12"));
        assert_eq!(q.get("x").as_deref(), Some("a b c"), "first value wins");
        assert_eq!(q.get("flag").as_deref(), Some(""));
        assert_eq!(q.get("a=b").as_deref(), Some("+"), "keys are decoded too");
        assert_eq!(q.get("missing"), None);
        let keys: Vec<_> = q.pairs().map(|(k, _)| k).collect();
        assert_eq!(keys, ["status", "lastDirtyTimestamp", "x", "flag", "x", "a=b", "e", ""]);
        assert_eq!(q.get("e").as_deref(), Some("1=2"), "split at the first `=`");
        assert_eq!(q.get("").as_deref(), Some("v"));
        assert_eq!(query(Some("&&")).pairs().count(), 0);
        assert_eq!(
            query(Some("é=ü&k"))
                .pairs()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>(),
            ["é:ü", "k:"]
        );
        assert_eq!(query(None).pairs().count(), 0);
        // Nothing to decode: borrowed from the query, not copied.
        assert!(matches!(q.get("status"), Some(Cow::Borrowed(_))));
    }
}
