//! Optional HTTP basic auth on the Eureka API and the dashboard (what Spring Security's
//! `httpBasic()` gives a Eureka server, without its CSRF check that breaks Eureka clients), and
//! who may act as a peer. Credentials never appear in logs: `Credentials` has no `Debug` output
//! of its secret.
//!
//! Threat model: with auth on, every request needs credentials. Requests that present the **peer**
//! credentials (`--peer-auth-*`) are peers: only they may post replication batches or mark a write
//! as replicated (`x-eureka-operator-replica`, `x-netflix-discovery-replication: true`), which
//! bypasses the rules for client writes and is not replicated further. A client that presents the
//! client credentials and a marker is refused with 403, so a leaked client password cannot be used
//! to forge replicated writes — as long as the peer credentials differ. Without `--peer-auth-*` the
//! client credentials are also the peer credentials (one shared secret: every client can replicate).
//! With auth off, anyone can do anything (as an unsecured Java Eureka server): keep the port on a
//! trusted network (the chart's NetworkPolicy).
//!
//! Other clusters' links may read with **link** credentials (`--link-auth-file`, one
//! `username:password` per line, re-read when it changes, so a rotation adds the new pair, rolls
//! the other side's Secret, then removes the old one): they may only `GET link/apps`, and never
//! need this cluster's client or peer credentials.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine;

use super::negotiate::ApiError;

/// Who a request authenticated as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Auth is off: anyone may act as a client or a peer.
    Trusted,
    /// The client credentials: may not act as a peer.
    Client,
    /// The peer credentials: may replicate.
    Peer,
    /// Link credentials: may only read `link/apps`.
    Link,
}

impl Caller {
    /// Whether the caller may replicate (post batches, mark writes as replicated).
    pub fn may_replicate(self) -> bool {
        matches!(self, Caller::Trusted | Caller::Peer)
    }
}

/// The credentials of clients and of peers (the same unless `--peer-auth-*` is set), and of
/// other clusters' links.
#[derive(Clone, Debug)]
pub struct Access {
    pub client: Credentials,
    pub peer: Credentials,
    pub links: Option<LinkCredentials>,
}

impl Access {
    /// Who `authorization` authenticates, if anyone.
    pub fn caller(&self, authorization: Option<&str>) -> Option<Caller> {
        if self.peer.admits(authorization) {
            Some(Caller::Peer)
        } else if self.client.admits(authorization) {
            Some(Caller::Client)
        } else if self.links.as_ref().is_some_and(|l| l.admits(authorization)) {
            Some(Caller::Link)
        } else {
            None
        }
    }
}

/// The link credentials, from a file of `username:password` lines read again when a request
/// needs it and the last read is older than `recheck` (`--link-auth-recheck-ms`). A file that
/// cannot be read or parsed keeps the last good pairs (and says so in the log).
#[derive(Clone, Debug)]
pub struct LinkCredentials {
    path: PathBuf,
    recheck: Duration,
    state: Arc<Mutex<(Instant, Vec<Credentials>)>>,
}

impl LinkCredentials {
    /// Reads the file once; a file that cannot be used at start is an error.
    pub fn load(path: &Path, recheck: Duration) -> Result<LinkCredentials, Error> {
        let pairs = read_pairs(path)?;
        Ok(LinkCredentials {
            path: path.to_path_buf(),
            recheck,
            state: Arc::new(Mutex::new((Instant::now(), pairs))),
        })
    }

    fn admits(&self, authorization: Option<&str>) -> bool {
        // One request reads the (small, mounted) file when it is due, without holding the lock
        // while it does; the others go on with the pairs read before.
        let due = {
            let mut state = self.state.lock();
            let due = state.0.elapsed() >= self.recheck;
            if due {
                state.0 = Instant::now();
            }
            due
        };
        if due {
            match read_pairs(&self.path) {
                Ok(pairs) => self.state.lock().1 = pairs,
                Err(e) => tracing::warn!(error = %e, "keeping the link credentials read before"),
            }
        }
        self.state.lock().1.iter().any(|c| c.admits(authorization))
    }
}

/// Every `username:password` line of a file (blank lines and `#` comments skipped); at least one.
fn read_pairs(path: &Path) -> Result<Vec<Credentials>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut pairs = Vec::new();
    for line in text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        match line.split_once(':') {
            Some((u, p)) if !u.is_empty() && !p.is_empty() => pairs.push(Credentials::new(u, p)),
            _ => return Err(Error::Format(path.display().to_string())),
        }
    }
    if pairs.is_empty() {
        return Err(Error::Format(path.display().to_string()));
    }
    Ok(pairs)
}

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
    #[error("failed to use the credentials file {0}: expected lines `username:password`")]
    Format(String),
    #[error("failed to configure link auth: --link-auth-file needs --basic-auth-* (without auth anyone may read)")]
    LinkWithoutClient,
    #[error("failed to configure basic auth: a username needs a password and a password a username")]
    Incomplete,
    #[error(
        "failed to configure peer auth: --peer-auth-* needs --basic-auth-* (without client auth there is nothing to protect)"
    )]
    PeerWithoutClient,
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

    pub fn username(&self) -> &str {
        &self.username
    }

    /// The pair, for a client that sends them.
    pub fn pair(&self) -> (String, String) {
        (self.username.clone(), self.password.clone())
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

/// Client, peer and link credentials from their flags (or files; the link file with how often it
/// is read again); `None` when auth is off.
pub fn configure(
    client: (Option<&str>, Option<&str>, Option<&Path>),
    peer: (Option<&str>, Option<&str>, Option<&Path>),
    links: Option<(&Path, Duration)>,
) -> Result<Option<Access>, Error> {
    let client = Credentials::configure(client.0, client.1, client.2)?;
    let peer = Credentials::configure(peer.0, peer.1, peer.2)?;
    let links = links
        .map(|(path, recheck)| LinkCredentials::load(path, recheck))
        .transpose()?;
    match (client, peer) {
        (None, None) if links.is_some() => Err(Error::LinkWithoutClient),
        (None, None) => Ok(None),
        (None, Some(_)) => Err(Error::PeerWithoutClient),
        (Some(client), peer) => Ok(Some(Access {
            peer: peer.unwrap_or_else(|| client.clone()),
            client,
            links,
        })),
    }
}

/// Middleware: 401 unless the request carries client or peer credentials; tells the handlers
/// which ([`Caller`]). The state is shared, not copied: axum clones it for every request.
pub async fn require(State(access): State<Arc<Access>>, mut request: Request, next: Next) -> Response {
    match admit(&access, &request) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

/// Who may make `request`: 401 without client or peer credentials, 403 for link credentials
/// anywhere but `GET .../link/apps`.
pub fn admit<B>(access: &Access, request: &axum::http::Request<B>) -> Result<Caller, ApiError> {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match access.caller(header) {
        Some(Caller::Link) if !reads_link_apps(request) => Err(ApiError::Forbidden),
        Some(caller) => Ok(caller),
        None => Err(ApiError::Unauthorized),
    }
}

/// `GET .../link/apps`: all link credentials may do.
fn reads_link_apps<B>(request: &axum::http::Request<B>) -> bool {
    request.method() == axum::http::Method::GET && request.uri().path().trim_end_matches('/').ends_with("/link/apps")
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
    fn peers_are_told_from_clients() {
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        let access = configure((Some("app"), Some("a"), None), (Some("peer"), Some("p"), None), None)
            .unwrap()
            .unwrap();
        assert_eq!(access.caller(Some(&basic("peer", "p"))), Some(Caller::Peer));
        assert_eq!(access.caller(Some(&basic("app", "a"))), Some(Caller::Client));
        assert_eq!(access.caller(Some(&basic("app", "p"))), None);
        assert!(!Caller::Client.may_replicate());
        assert!(Caller::Peer.may_replicate() && Caller::Trusted.may_replicate());
        // One shared secret when no peer credentials are set.
        let shared = configure((Some("app"), Some("a"), None), (None, None, None), None)
            .unwrap()
            .unwrap();
        assert_eq!(shared.caller(Some(&basic("app", "a"))), Some(Caller::Peer));
        assert!(configure((None, None, None), (Some("p"), Some("p"), None), None).is_err());
        assert!(
            configure((None, None, None), (None, None, None), None)
                .unwrap()
                .is_none()
        );
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

    #[test]
    fn link_credentials_read_only_and_follow_their_file() {
        let basic = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("links");
        std::fs::write(&f, "# rotating\nreader:old\nreader:new\n").unwrap();
        let recheck = Duration::from_secs(60);
        let access = configure((Some("app"), Some("a"), None), (None, None, None), Some((&f, recheck)))
            .unwrap()
            .unwrap();
        assert_eq!(access.caller(Some(&basic("reader", "old"))), Some(Caller::Link));
        assert_eq!(access.caller(Some(&basic("reader", "new"))), Some(Caller::Link));
        assert!(!Caller::Link.may_replicate());
        // The old pair removed: refused once the file is read again.
        std::fs::write(&f, "reader:new\n").unwrap();
        // Not read again before `recheck` has passed.
        assert_eq!(access.caller(Some(&basic("reader", "old"))), Some(Caller::Link));
        access.links.as_ref().unwrap().state.lock().0 -= recheck;
        assert_eq!(access.caller(Some(&basic("reader", "old"))), None);
        assert_eq!(access.caller(Some(&basic("reader", "new"))), Some(Caller::Link));
        // A broken file keeps what was read before.
        std::fs::write(&f, "nocolon\n").unwrap();
        access.links.as_ref().unwrap().state.lock().0 -= recheck;
        assert_eq!(access.caller(Some(&basic("reader", "new"))), Some(Caller::Link));
        assert!(configure((None, None, None), (None, None, None), Some((&f, recheck))).is_err());
    }
}
