//! Optional HTTP basic auth on the Eureka API and the dashboard (what Spring Security's
//! `httpBasic()` gives a Eureka server, without its CSRF check that breaks Eureka clients).
//! Credentials never appear in logs: `Credentials` has no `Debug` output of its secret.

use std::path::Path;

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine;

use super::negotiate::ApiError;

/// A username and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the basic auth file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("failed to use the basic auth file {0}: expected one line `username:password`")]
    Format(String),
    #[error("failed to configure basic auth: a username needs a password and a password a username")]
    Incomplete,
}

impl Credentials {
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            password: password.into(),
        }
    }

    /// From flags/env, or a `username:password` file; `None` when auth is off.
    pub fn configure(
        username: Option<&str>,
        password: Option<&str>,
        file: Option<&Path>,
    ) -> Result<Option<Credentials>, Error> {
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.display().to_string(),
                source,
            })?;
            let line = text.lines().next().unwrap_or("").trim_end();
            let (u, p) = line
                .split_once(':')
                .ok_or_else(|| Error::Format(path.display().to_string()))?;
            if u.is_empty() || p.is_empty() {
                return Err(Error::Format(path.display().to_string()));
            }
            return Ok(Some(Credentials::new(u, p)));
        }
        match (username, password) {
            (None, None) => Ok(None),
            (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => Ok(Some(Credentials::new(u, p))),
            _ => Err(Error::Incomplete),
        }
    }

    /// Whether an `Authorization` header value carries these credentials.
    pub fn admits(&self, authorization: Option<&str>) -> bool {
        let Some(encoded) = authorization.and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("basic").then_some(rest.trim())
        }) else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
            return false;
        };
        let expected = format!("{}:{}", self.username, self.password);
        constant_time_eq(&decoded, expected.as_bytes())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// Middleware: 401 unless the request carries the credentials.
pub async fn require(State(credentials): State<Credentials>, request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if credentials.admits(header) {
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_header_is_checked_exactly() {
        let c = Credentials::new("eureka", "s3cret:x");
        let ok = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("eureka:s3cret:x")
        );
        assert!(c.admits(Some(&ok)));
        assert!(c.admits(Some(&ok.replace("Basic", "basic"))));
        let wrong = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("eureka:s3cret")
        );
        assert!(!c.admits(Some(&wrong)));
        assert!(!c.admits(Some("Bearer x")));
        assert!(!c.admits(Some("Basic !!!")));
        assert!(!c.admits(None));
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn configuration_sources() {
        assert_eq!(Credentials::configure(None, None, None).unwrap(), None);
        assert!(Credentials::configure(Some("u"), None, None).is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("auth");
        std::fs::write(&f, "admin:pw\n").unwrap();
        assert_eq!(
            Credentials::configure(None, None, Some(&f)).unwrap(),
            Some(Credentials::new("admin", "pw"))
        );
        std::fs::write(&f, "nocolon").unwrap();
        assert!(Credentials::configure(None, None, Some(&f)).is_err());
    }
}
