//! HTTP to peers: sending replication batches (`POST {url}peerreplication/batch/`) and
//! fetching a peer's registry (`GET {url}apps/`), with timeouts, basic auth, and the
//! classification of failures into retry classes. `https://` peers are verified with the TLS
//! client configuration of [`crate::tls::peer_client_config`] when one is given, else against the
//! system roots.
//!
//! Credentials: those in a peer's URL win; otherwise our replicas get this server's peer
//! credentials (`--peer-auth-*`, else `--basic-auth-*`), so replicas found through the headless
//! Service authenticate without credentials in any URL. Java peers get only what their URL
//! carries: our peer secret is never sent to a server that is not one of our replicas.

use std::time::Duration;

use reqwest::{StatusCode, header};

use super::batcher::Failure;
use crate::codec::{
    self, DecodeError,
    batch::{self, PeerResponse},
};
use crate::health::INCOMPLETE_HEADER;
use crate::registry::{Replication, instance::InstanceInfo};

/// Marks our replication requests, with the sender's replica id.
use crate::codec::batch::REPLICA_HEADER;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to reach peer {url}: {source}")]
    Network { url: String, source: reqwest::Error },
    #[error("peer {url} is congested ({status})")]
    Congested { url: String, status: String },
    #[error("peer {url} is not complete yet (starting: its start-up sync or watches are not done)")]
    Incomplete { url: String },
    #[error("peer {url} refused our credentials ({status}); check --peer-auth-* here and the peer's basic auth")]
    Unauthorized { url: String, status: StatusCode },
    #[error("peer {url} refused the request: {status}")]
    Refused { url: String, status: StatusCode },
    #[error("failed to read the answer of peer {url}: {source}")]
    Decode { url: String, source: DecodeError },
}

impl Error {
    pub fn class(&self) -> Failure {
        match self {
            Error::Network { .. } => Failure::Network,
            Error::Congested { .. } | Error::Incomplete { .. } => Failure::Congestion,
            Error::Unauthorized { .. } => Failure::Unauthorized,
            // An answer we cannot read would fail again: Java loops here; we drop the batch.
            Error::Refused { .. } | Error::Decode { .. } => Failure::Permanent,
        }
    }
}

/// A peer's base URL (ending in `/eureka/` or `/eureka/v2/`) split into a clean URL and its
/// basic-auth credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerUrl {
    pub base: String,
    pub credentials: Option<(String, String)>,
}

impl PeerUrl {
    pub fn parse(url: &str) -> Option<PeerUrl> {
        let parsed = reqwest::Url::parse(url.trim()).ok()?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return None;
        }
        let credentials = (!parsed.username().is_empty()).then(|| {
            let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
            (decode(parsed.username()), decode(parsed.password().unwrap_or("")))
        });
        let mut clean = parsed.clone();
        let _ = clean.set_username("");
        let _ = clean.set_password(None);
        let mut base = clean.to_string();
        if !base.ends_with('/') {
            base.push('/');
        }
        Some(PeerUrl { base, credentials })
    }

    /// The same peer over `https://`: replicas found through the headless Service are listed as
    /// `http://`, and serve HTTPS when this replica does (they share one configuration).
    pub fn into_https(mut self) -> PeerUrl {
        if let Some(rest) = self.base.strip_prefix("http://") {
            self.base = format!("https://{rest}");
        }
        self
    }

    /// The URL without credentials, for logs and labels.
    pub fn display(&self) -> &str {
        &self.base
    }
}

/// Talks to peers.
#[derive(Clone)]
pub struct PeerClient {
    /// Toward our own replicas.
    http: reqwest::Client,
    /// Toward Java peers (the same, unless TLS verifies our replicas for a fixed name).
    others: reqwest::Client,
    /// Sent in [`REPLICA_HEADER`] to our own replicas.
    replica_id: String,
    /// What our replicas authenticate with when their URL carries no credentials.
    credentials: Option<(String, String)>,
}

impl PeerClient {
    /// `tls`: how `https://` peers are verified (the system roots when `None`).
    pub fn new(
        connect_timeout: Duration,
        read_timeout: Duration,
        replica_id: &str,
        credentials: Option<(String, String)>,
        tls: Option<&crate::tls::PeerTls>,
    ) -> PeerClient {
        crate::tls::install_default_provider();
        let build = |tls: Option<&rustls::ClientConfig>| {
            let mut builder = reqwest::Client::builder()
                .connect_timeout(connect_timeout)
                .timeout(connect_timeout + read_timeout)
                .pool_idle_timeout(Duration::from_secs(30))
                .user_agent(concat!("eureka-operator/", env!("CARGO_PKG_VERSION")));
            if let Some(tls) = tls {
                builder = builder.tls_backend_preconfigured(tls.clone());
            }
            builder.build().unwrap_or_else(|e| {
                tracing::error!(error = %e, "failed to build the peer HTTP client; using the defaults");
                reqwest::Client::new()
            })
        };
        PeerClient {
            http: build(tls.map(|t| &t.replicas)),
            others: build(tls.map(|t| &t.others)),
            replica_id: replica_id.to_string(),
            credentials,
        }
    }

    /// A client as the replication settings describe it.
    pub fn from_config(settings: &super::ReplicationConfig) -> PeerClient {
        PeerClient::new(
            settings.connect_timeout,
            settings.read_timeout,
            &settings.replica_id,
            settings.credentials.clone(),
            settings.tls.as_ref(),
        )
    }

    fn client(&self, own_replica: bool) -> &reqwest::Client {
        if own_replica { &self.http } else { &self.others }
    }

    fn request(&self, peer: &PeerUrl, builder: reqwest::RequestBuilder, own_replica: bool) -> reqwest::RequestBuilder {
        let mut b = builder.header(header::ACCEPT, "application/json");
        if own_replica {
            b = b.header(REPLICA_HEADER, &self.replica_id);
        }
        let credentials = peer
            .credentials
            .as_ref()
            .or(self.credentials.as_ref().filter(|_| own_replica));
        if let Some((u, p)) = credentials {
            b = b.basic_auth(u, Some(p));
        }
        b
    }

    /// Sends one batch; the answers are in the batch's order.
    pub async fn send(
        &self,
        peer: &PeerUrl,
        items: &[&Replication],
        own_replica: bool,
    ) -> Result<Vec<PeerResponse>, Error> {
        let url = format!("{}peerreplication/batch/", peer.base);
        let body = batch::encode_list(items);
        let req = self
            .request(peer, self.client(own_replica).post(&url), own_replica)
            .header(header::CONTENT_TYPE, "application/json");
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|source| classify(&peer.base, source))?;
        let status = resp.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return Err(Error::Congested {
                url: peer.base.clone(),
                status: status.to_string(),
            });
        }
        refused(&peer.base, status)?;
        let bytes = resp.bytes().await.map_err(|source| classify(&peer.base, source))?;
        let now = now_ms();
        batch::decode_response(&bytes, now).map_err(|source| Error::Decode {
            url: peer.base.clone(),
            source,
        })
    }

    /// A peer's whole registry (`GET apps/`), as instances with their lease terms.
    pub async fn fetch(&self, peer: &PeerUrl, own_replica: bool) -> Result<Vec<InstanceInfo>, Error> {
        let bytes = self.fetch_bytes(peer, own_replica).await?;
        codec::json::applications_from_slice(&bytes, now_ms()).map_err(|source| Error::Decode {
            url: peer.base.clone(),
            source,
        })
    }

    /// A peer's whole registry with, per instance, when the peer last saw it renew.
    pub async fn fetch_with_renewals(&self, peer: &PeerUrl, own_replica: bool) -> Result<Fetched, Error> {
        let bytes = self.fetch_bytes(peer, own_replica).await?;
        let decode = |source| Error::Decode {
            url: peer.base.clone(),
            source,
        };
        let instances = codec::json::applications_from_slice(&bytes, now_ms()).map_err(decode)?;
        let renewals = renewals(&bytes).map_err(decode)?;
        Ok(Fetched { instances, renewals })
    }

    /// The status of one instance on a replica (`None` when it does not have it).
    pub async fn instance_status(&self, peer: &PeerUrl, app: &str, id: &str) -> Result<Option<String>, Error> {
        let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
        let url = format!("{}apps/{}/{}", peer.base, enc(app), enc(id));
        let resp = self
            .request(peer, self.client(true).get(&url), true)
            .send()
            .await
            .map_err(|source| classify(&peer.base, source))?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        refused(&peer.base, resp.status())?;
        let bytes = resp.bytes().await.map_err(|source| classify(&peer.base, source))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            url: peer.base.clone(),
            source: DecodeError::new(format!("invalid JSON: {e}")),
        })?;
        Ok(v["instance"]["status"].as_str().map(str::to_string))
    }

    async fn fetch_bytes(&self, peer: &PeerUrl, own_replica: bool) -> Result<bytes::Bytes, Error> {
        let url = format!("{}apps/", peer.base);
        let resp = self
            .request(peer, self.client(own_replica).get(&url), own_replica)
            .send()
            .await
            .map_err(|source| classify(&peer.base, source))?;
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE && resp.headers().contains_key(INCOMPLETE_HEADER) {
            return Err(Error::Incomplete { url: peer.base.clone() });
        }
        refused(&peer.base, resp.status())?;
        resp.bytes().await.map_err(|source| classify(&peer.base, source))
    }
}

/// A peer's registry and the lease renewals it has seen.
#[derive(Clone, Debug, Default)]
pub struct Fetched {
    pub instances: Vec<InstanceInfo>,
    /// `(APP, instance id)` → the lease as the peer reports it.
    pub renewals: std::collections::HashMap<(String, String), Renewal>,
}

/// A lease as a peer reports it (`leaseInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// `lastRenewalTimestamp` (ms).
    pub last_renewal: i64,
    /// `durationInSecs`, in ms.
    pub duration_ms: i64,
}

/// Reads only `(app, instanceId, leaseInfo)` of each instance of an `applications` document,
/// skipping everything else without building a tree.
fn renewals(body: &[u8]) -> Result<std::collections::HashMap<(String, String), Renewal>, DecodeError> {
    use renewals_doc::{Doc, OneOrMany};
    let doc: Doc = serde_json::from_slice(body).map_err(|e| DecodeError::new(format!("invalid JSON: {e}")))?;
    let mut out = std::collections::HashMap::new();
    for app in doc
        .applications
        .application
        .map(OneOrMany::into_vec)
        .unwrap_or_default()
    {
        for i in app.instance.map(OneOrMany::into_vec).unwrap_or_default() {
            let Some(lease) = i.lease_info else { continue };
            let id = i.instance_id.filter(|s| !s.is_empty()).unwrap_or(i.host_name);
            out.insert(
                (i.app.to_ascii_uppercase(), id),
                Renewal {
                    last_renewal: lease.last_renewal_timestamp,
                    duration_ms: lease.duration_in_secs.saturating_mul(1000),
                },
            );
        }
    }
    Ok(out)
}

/// The parts of an `applications` document [`renewals`] reads; serde skips the rest.
mod renewals_doc {
    use serde::Deserialize;

    /// Jackson writes a single element without the list around it.
    #[derive(Deserialize)]
    #[serde(untagged)]
    pub enum OneOrMany<T> {
        Many(Vec<T>),
        One(T),
    }
    impl<T> OneOrMany<T> {
        pub fn into_vec(self) -> Vec<T> {
            match self {
                OneOrMany::Many(v) => v,
                OneOrMany::One(t) => vec![t],
            }
        }
    }
    #[derive(Deserialize)]
    pub struct Doc {
        pub applications: Apps,
    }
    #[derive(Deserialize)]
    pub struct Apps {
        #[serde(default)]
        pub application: Option<OneOrMany<App>>,
    }
    #[derive(Deserialize)]
    pub struct App {
        #[serde(default)]
        pub instance: Option<OneOrMany<Instance>>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Instance {
        #[serde(default)]
        pub instance_id: Option<String>,
        #[serde(default)]
        pub host_name: String,
        #[serde(default)]
        pub app: String,
        #[serde(default)]
        pub lease_info: Option<Lease>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Lease {
        #[serde(default)]
        pub last_renewal_timestamp: i64,
        #[serde(default = "default_duration")]
        pub duration_in_secs: i64,
    }
    fn default_duration() -> i64 {
        90
    }
}

/// A non-success answer as an error: 401/403 are about credentials, anything else is a refusal.
fn refused(url: &str, status: StatusCode) -> Result<(), Error> {
    match status {
        s if s.is_success() => Ok(()),
        StatusCode::SERVICE_UNAVAILABLE => Err(Error::Congested {
            url: url.to_string(),
            status: status.to_string(),
        }),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(Error::Unauthorized {
            url: url.to_string(),
            status,
        }),
        status => Err(Error::Refused {
            url: url.to_string(),
            status,
        }),
    }
}

/// A read timeout is congestion (as Java counts it); anything else is a network failure.
fn classify(url: &str, source: reqwest::Error) -> Error {
    if source.is_timeout() && !source.is_connect() {
        Error::Congested {
            url: url.to_string(),
            status: "read timeout".into(),
        }
    } else {
        Error::Network {
            url: url.to_string(),
            source,
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_lose_credentials_and_gain_a_slash() {
        let p = PeerUrl::parse("http://user:p%40ss@eureka-0.eureka:8761/eureka").unwrap();
        assert_eq!(p.base, "http://eureka-0.eureka:8761/eureka/");
        assert_eq!(p.credentials, Some(("user".into(), "p@ss".into())));
        assert_eq!(
            PeerUrl::parse("http://10.0.0.1:8761/eureka/v2/").unwrap().base,
            "http://10.0.0.1:8761/eureka/v2/"
        );
        assert!(PeerUrl::parse("ftp://x/").is_none());
        assert_eq!(
            PeerUrl::parse("http://u:p@10.0.0.1:8761/eureka/").unwrap().into_https(),
            PeerUrl {
                base: "https://10.0.0.1:8761/eureka/".into(),
                credentials: Some(("u".into(), "p".into())),
            }
        );
        assert!(PeerUrl::parse("not a url").is_none());
    }
}
