//! The peers subsystem: who this replica replicates to. It merges the static replica URLs
//! (`--peer-urls`), the replicas found through the headless Service's EndpointSlices (in a
//! cluster), and the Java Eureka peers (`--java-peer-urls`) into one list, published on a watch
//! channel for the replicator, the start-up sync and the dashboard. This replica itself is never
//! in it (Java's `isThisMyUrl`).

use std::net::SocketAddr;

use tokio::sync::watch;

use super::{Peer, client::PeerUrl};
use crate::registry::PeerKind;
use crate::supervisor::Shutdown;

/// A replica's Eureka URL and whether it is ready (a source for the start-up sync).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReplicaEndpoint {
    pub url: String,
    pub ready: bool,
}

/// Errors of the peer configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to parse the {what} URL {url:?}: expected http(s)://host[:port]/eureka/")]
    Url { what: &'static str, url: String },
}

/// How this replica is reached, to recognise itself in peer lists.
#[derive(Clone, Debug)]
pub struct OwnAddress {
    /// `--my-url`, if given.
    pub url: Option<PeerUrl>,
    /// The Eureka listener's address.
    pub bind: SocketAddr,
    /// The host peers reach it at (bind address, pod IP or host name).
    pub host: String,
}

impl OwnAddress {
    /// Whether a configured peer URL is this server itself.
    pub fn is(&self, url: &PeerUrl) -> bool {
        if self.url.as_ref().is_some_and(|m| m.base == url.base) {
            return true;
        }
        reqwest::Url::parse(&url.base).ok().is_some_and(|u| {
            let port = u.port_or_known_default().unwrap_or(80);
            let h = u.host_str().unwrap_or("").trim_matches(['[', ']']);
            port == self.bind.port() && (h == self.host || h == self.bind.ip().to_string())
        })
    }
}

/// Parses a list of peer URLs (blank entries ignored).
pub fn parse_urls(urls: &[String], what: &'static str) -> Result<Vec<PeerUrl>, Error> {
    urls.iter()
        .filter(|u| !u.trim().is_empty())
        .map(|u| PeerUrl::parse(u).ok_or_else(|| Error::Url { what, url: u.clone() }))
        .collect()
}

/// How discovered replicas are turned into peers.
#[derive(Clone, Debug)]
pub struct Discovery {
    /// This replica, never its own peer.
    pub own: OwnAddress,
    /// Whether replicas serve HTTPS (as this one does): discovered URLs become `https://`.
    pub https: bool,
}

/// Pure: the peer list from the static replicas, the discovered ones and the Java peers.
pub fn merge(
    static_replicas: &[PeerUrl],
    discovered: &[ReplicaEndpoint],
    java: &[PeerUrl],
    d: &Discovery,
) -> Vec<Peer> {
    let me = &d.own;
    let mut peers: Vec<Peer> = static_replicas
        .iter()
        .filter(|u| !me.is(u))
        .map(|u| Peer {
            url: u.clone(),
            kind: PeerKind::Replica,
            ready: true,
        })
        .collect();
    for e in discovered {
        let Some(url) = PeerUrl::parse(&e.url) else { continue };
        let url = if d.https { url.into_https() } else { url };
        if me.is(&url) || peers.iter().any(|p| p.url.base == url.base) {
            continue;
        }
        peers.push(Peer {
            url,
            kind: PeerKind::Replica,
            ready: e.ready,
        });
    }
    peers.extend(java.iter().map(|u| Peer {
        url: u.clone(),
        kind: PeerKind::Java,
        ready: true,
    }));
    peers
}

/// Keeps `tx` in line with discovery until shutdown (without discovery the list never changes).
/// `listed` turns true once the published list holds discovery's first answer: the start-up
/// sync reads its sources from the list, so it waits for that, not for discovery itself (which
/// is a step ahead of this task).
pub async fn run(
    static_replicas: Vec<PeerUrl>,
    java: Vec<PeerUrl>,
    discovery: Discovery,
    mut discovered: watch::Receiver<Option<Vec<ReplicaEndpoint>>>,
    (tx, listed): (watch::Sender<Vec<Peer>>, watch::Sender<bool>),
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    loop {
        let found = discovered.borrow_and_update().clone();
        let list = merge(
            &static_replicas,
            found.as_deref().unwrap_or_default(),
            &java,
            &discovery,
        );
        tx.send_if_modified(|current| {
            let differs = *current != list;
            if differs {
                *current = list;
            }
            differs
        });
        if found.is_some() {
            listed.send_if_modified(|done| !std::mem::replace(done, true));
        }
        if discovered.changed().await.is_err() {
            // No discovery (standalone), or it stopped at shutdown: the list stays as it is.
            shutdown.wait().await;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start-up sync reads its sources from the published list once `listed` is true, so
    /// the list must already hold discovery's answer then (a replica restarted next to a ready
    /// one once synced from nobody and answered without the other's native instances).
    #[tokio::test]
    async fn listed_turns_true_only_with_the_discovered_replicas_in_the_list() {
        let me = OwnAddress {
            url: None,
            bind: "10.0.0.1:8761".parse().unwrap(),
            host: "10.0.0.1".into(),
        };
        let discovery = Discovery { own: me, https: false };
        let (found_tx, found_rx) = watch::channel(None);
        let (tx, mut peers) = watch::channel(Vec::new());
        let (listed_tx, mut listed) = watch::channel(false);
        let supervisor = crate::supervisor::Supervisor::new(std::time::Duration::from_secs(1));
        let task = tokio::spawn(run(
            Vec::new(),
            Vec::new(),
            discovery,
            found_rx,
            (tx, listed_tx),
            supervisor.shutdown(),
        ));
        tokio::task::yield_now().await;
        assert!(!*listed.borrow(), "listed before discovery answered");
        found_tx.send_replace(Some(vec![ReplicaEndpoint {
            url: "http://10.0.0.2:8761/eureka/".into(),
            ready: true,
        }]));
        listed.wait_for(|l| *l).await.unwrap();
        let got: Vec<_> = peers
            .borrow_and_update()
            .iter()
            .map(|p| (p.url.display().to_string(), p.ready))
            .collect();
        assert_eq!(got, vec![("http://10.0.0.2:8761/eureka/".to_string(), true)]);
        task.abort();
    }

    #[test]
    fn merges_without_itself_or_duplicates() {
        let me = OwnAddress {
            url: None,
            bind: "127.0.0.2:8761".parse().unwrap(),
            host: "127.0.0.2".into(),
        };
        let s = parse_urls(
            &[
                "http://127.0.0.2:8761/eureka/".into(),
                "http://127.0.0.3:8761/eureka/".into(),
                " ".into(),
            ],
            "peer",
        )
        .unwrap();
        let found = vec![
            ReplicaEndpoint {
                url: "http://127.0.0.3:8761/eureka/".into(),
                ready: true,
            },
            ReplicaEndpoint {
                url: "http://127.0.0.4:8761/eureka/".into(),
                ready: false,
            },
        ];
        let java = parse_urls(&["http://user:pw@java:8761/eureka/".into()], "Java peer").unwrap();
        let d = Discovery { own: me, https: false };
        let peers = merge(&s, &found, &java, &d);
        let got: Vec<(&str, PeerKind, bool)> = peers.iter().map(|p| (p.url.display(), p.kind, p.ready)).collect();
        assert_eq!(
            got,
            vec![
                ("http://127.0.0.3:8761/eureka/", PeerKind::Replica, true),
                ("http://127.0.0.4:8761/eureka/", PeerKind::Replica, false),
                ("http://java:8761/eureka/", PeerKind::Java, true),
            ]
        );
        assert!(parse_urls(&["ftp://x/".into()], "peer").is_err());
    }
}
