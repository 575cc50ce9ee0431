//! Start-up sync (Java's `syncUp`): before a replica reports ready, it fills its registry from
//! its peers' full registries, registering every instance as a replicated write. Pod instances
//! of this cluster are skipped: the controller derives those from its own watch.

use std::time::Duration;

use super::{PeerKind, client::PeerClient, client::PeerUrl, owned_by};
use crate::{
    registry::{Command, Reply, Source},
    state::{AppState, Writer},
};

/// How hard to try.
#[derive(Clone, Copy, Debug)]
pub struct Retries {
    pub attempts: u32,
    pub wait: Duration,
}

/// Fills the registry from `peers`; returns how many instances were registered. Retries (up to
/// `retries`) only while nothing was found and one of our replicas did not answer (Java peers
/// are asked once: a migration must not hold a replica back); with no peer it returns at once.
pub async fn sync(
    state: &AppState,
    client: &PeerClient,
    peers: &[(PeerUrl, PeerKind)],
    cluster_id: &str,
    retries: Retries,
) -> i64 {
    if peers.is_empty() {
        return 0;
    }
    let mut count = 0;
    for attempt in 0..retries.attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(retries.wait).await;
        }
        let mut unreachable = 0;
        for (url, kind) in peers {
            match client.fetch(url, *kind == PeerKind::Replica).await {
                Ok(instances) => {
                    let n = instances.len();
                    for info in instances.into_iter().filter(|i| !owned_by(i, cluster_id)) {
                        let outcome = state.apply(
                            Command::Register {
                                info,
                                source: Source::Peer,
                            },
                            Writer::Replica,
                        );
                        if outcome.reply == Reply::Registered {
                            count += 1;
                        }
                    }
                    tracing::info!(peer = %url.display(), instances = n, "synced the registry from a peer");
                }
                Err(e) => {
                    if *kind == PeerKind::Replica {
                        unreachable += 1;
                    }
                    tracing::info!(peer = %url.display(), error = %e, attempt, "could not sync from a peer");
                }
            }
        }
        if count > 0 || unreachable == 0 {
            break;
        }
    }
    count
}
