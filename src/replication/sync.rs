//! Start-up sync (Java's `syncUp`): before a replica reports ready, it fills its registry from
//! its ready peers' full registries, registering every instance as a replicated write. Pod
//! instances of this cluster are skipped: the controller derives those from its own watch (and
//! the replica is not complete until it has).

use std::time::Duration;

use super::{Peer, client::PeerClient, owned_by};
use crate::{
    registry::{Command, PeerKind, Reply},
    state::AppState,
};

/// How hard to try.
#[derive(Clone, Copy, Debug)]
pub struct Retries {
    /// Attempts while nothing was found and a replica did not answer.
    pub attempts: u32,
    /// Wait between attempts.
    pub wait: Duration,
}

/// Fills the registry from the ready `peers`; returns how many instances were registered.
/// Retries (up to `retries`) only while nothing was found and one of our replicas did not answer
/// (Java peers are asked once: a migration must not hold a replica back; a replica that answers
/// that it is not complete yet is starting too and is not waited for); with no peer it returns
/// at once. `cluster_id` names this cluster's pod instances, which are skipped.
#[tracing::instrument(name = "startup_sync", skip_all, fields(peers = peers.len()))]
pub async fn sync(
    state: &AppState,
    client: &PeerClient,
    peers: &[Peer],
    cluster_id: Option<&str>,
    retries: Retries,
) -> i64 {
    if peers.is_empty() {
        return 0;
    }
    let mut count = 0;
    for attempt in 0..retries.attempts {
        if attempt > 0 {
            tokio::time::sleep(retries.wait).await;
        }
        let mut unreachable = 0;
        for peer in peers {
            let own = peer.kind == PeerKind::Replica;
            match client.fetch(&peer.url, own).await {
                Ok(mut instances) => {
                    if crate::mutants::on("partial-sync") {
                        let first = instances.first().map(|i| i.app.clone());
                        instances.retain(|i| Some(&i.app) == first.as_ref());
                    }
                    let n = instances.len();
                    let theirs = instances
                        .into_iter()
                        .filter(|i| !cluster_id.is_some_and(|c| owned_by(i, c)));
                    for info in theirs {
                        // As if one of our replicas sent it: it goes no further (every replica
                        // syncs itself). A copy: an adopted instance's status in it may be what
                        // the pod imposes on that peer.
                        let outcome = state.apply(Command::RegisterCopy { info });
                        if outcome.reply == Reply::Registered {
                            count += 1;
                        }
                    }
                    tracing::info!(peer = %peer.url.display(), instances = n, "synced the registry from a peer");
                }
                // Starting too: it holds nothing this replica's own watches and replication will
                // not bring, so it is not a source and not worth waiting for (replicas started
                // together would otherwise wait on each other).
                Err(e @ super::client::Error::Incomplete { .. }) => {
                    tracing::info!(peer = %peer.url.display(), reason = %e, "not syncing from a peer that is starting");
                }
                Err(e) => {
                    if own {
                        unreachable += 1;
                    }
                    tracing::warn!(peer = %peer.url.display(), error = %e, attempt, "could not sync from a peer");
                }
            }
        }
        if count > 0 || unreachable == 0 {
            break;
        }
    }
    count
}
