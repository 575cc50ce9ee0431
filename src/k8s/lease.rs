//! Leader election on a `coordination.k8s.io/v1` Lease, published as a [`Lead`] with its deadline.
//!
//! Like client-go, expiry is judged with the local monotonic clock: a follower takes over when the
//! Lease record has not changed for a whole lease duration since it first saw that record, so clock
//! skew between replicas does not matter. Writes use the record's `resourceVersion`, so two
//! candidates can never both win. A leader that fails to renew steps down two thirds of a lease
//! duration after its last renewal, before any follower may take over: that is the deadline readers
//! check, so a leader paused past it stops acting before this task even runs again. If this task ends with an error the
//! caller must exit the process: without it nobody would know who leads.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{PostParams, ResourceExt},
};
use tokio::{sync::watch, time::Instant};

use crate::leadership::{self, Lead};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the Lease {0}: {1}")]
    Read(String, #[source] kube::Error),
    #[error("failed to write the Lease {0}: {1}")]
    Write(String, #[source] kube::Error),
}

/// Where and how long.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    /// How long the apiserver keeps the release watch open (`--watch-timeout-seconds`).
    pub watch_timeout_seconds: u32,
}

impl LeaseConfig {
    /// How often the holder renews, and followers look.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }
}

/// How long after its last renewal a leader that cannot renew stops acting as one.
pub fn step_down_after(cfg: &LeaseConfig) -> Duration {
    cfg.duration * 2 / 3
}

/// What this candidate should do about the Lease it just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire,
    /// Someone else holds it.
    Follow(String),
}

/// The last version of the record seen, and since when (local clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub holder: Option<String>,
    pub version: String,
    pub since: Instant,
}

/// Pure: what to do given what was observed.
pub fn decide(observed: &Observed, me: &str, now: Instant, duration: Duration) -> Decision {
    match observed.holder.as_deref() {
        None | Some("") => Decision::Acquire,
        Some(h) if h == me => Decision::Renew,
        Some(_) if now.duration_since(observed.since) >= duration => Decision::Acquire,
        Some(h) => Decision::Follow(h.to_string()),
    }
}

/// Remembers a record: a changed version restarts the expiry clock.
pub fn observe(previous: Option<&Observed>, holder: Option<String>, version: String, now: Instant) -> Observed {
    match previous {
        Some(p) if p.version == version => p.clone(),
        _ => Observed {
            holder,
            version,
            since: now,
        },
    }
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn leased(cfg: &LeaseConfig, lease: &Lease, acquire: bool) -> Lease {
    let mut next = lease.clone();
    let spec = next.spec.get_or_insert_with(LeaseSpec::default);
    if acquire {
        spec.acquire_time = Some(micro_now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = Some(cfg.identity.clone());
    spec.lease_duration_seconds = Some(cfg.duration.as_secs().max(1) as i32);
    spec.renew_time = Some(micro_now());
    next
}

/// Runs the election until `shutdown` resolves, publishing leadership on `tx`; releases the Lease
/// on the way out if held.
pub async fn run(
    client: Client,
    cfg: LeaseConfig,
    tx: watch::Sender<Lead>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let key = format!("{}/{}", cfg.namespace, cfg.name);
    let mut observed: Option<Observed> = None;
    let mut last_renewal: Option<Instant> = None;
    let mut released = std::pin::pin!(releases(api.clone(), &cfg.name, cfg.watch_timeout_seconds));
    // Looks on a fixed cadence, not a pause after each look: a pause would add every look's
    // apiserver round trip to the cadence, so a follower would take over up to a third of a lease
    // later under load (and a leader renew later).
    let mut looks = tokio::time::interval(cfg.renew_every());
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    looks.tick().await;
    tokio::pin!(shutdown);
    loop {
        let now = Instant::now();
        match tokio::time::timeout(cfg.renew_every(), step(&api, &cfg, &key, &mut observed, now)).await {
            Ok(Ok(true)) => last_renewal = Some(now),
            Ok(Ok(false)) => last_renewal = None,
            Ok(Err(e)) => tracing::warn!(error = %e, "lease election step failed"),
            Err(_) => tracing::warn!(lease = %key, "the lease election step timed out"),
        }
        // Step down when the last renewal is two thirds of a duration old: with a look every
        // third, that is always before any follower may take over (a full duration).
        let lead = match last_renewal.map(|t| t + step_down_after(&cfg)) {
            Some(deadline) if Instant::now() < deadline => Lead::Until(deadline.into_std()),
            _ => Lead::Follower,
        };
        let leading = lead != Lead::Follower;
        if leadership::publish(&tx, lead) {
            tracing::info!(lease = %key, identity = %cfg.identity, leading, "leadership changed");
        }
        tokio::select! {
            _ = looks.tick() => {}
            // The holder gave the Lease up (it is shutting down): look at once, take over now.
            Some(()) = released.next(), if !leading => {
                tracing::debug!(lease = %key, "the lease was released");
            }
            _ = &mut shutdown => break,
        }
    }
    if *tx.borrow() != Lead::Follower {
        leadership::publish(&tx, Lead::Follower);
        release(&api, &cfg, &key).await;
    }
    Ok(())
}

/// Yields whenever the Lease is seen without a holder (a leader released it on shutdown), so a
/// follower takes over at once instead of at its next look. Watch errors are retried with backoff
/// and otherwise ignored: the periodic look still elects a leader without this.
fn releases(api: Api<Lease>, name: &str, watch_timeout: u32) -> impl futures::Stream<Item = ()> + Send + use<> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let config = super::watch::config(watch_timeout).fields(&format!("metadata.name={name}"));
    watcher::watcher(api, config)
        .default_backoff()
        .applied_objects()
        .filter_map(|lease| async move {
            let lease = lease.ok()?;
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            holder.is_empty().then_some(())
        })
}

/// One look at the Lease; `Ok(true)` when we hold it afterwards.
async fn step(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    key: &str,
    observed: &mut Option<Observed>,
    now: Instant,
) -> Result<bool, Error> {
    let lease = match api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| Error::Read(key.to_string(), e))?
    {
        Some(l) => l,
        None => {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            match api.create(&PostParams::default(), &leased(cfg, &fresh, true)).await {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(false),
                Err(e) => return Err(Error::Write(key.to_string(), e)),
            }
        }
    };
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let seen = observe(
        observed.as_ref(),
        holder,
        lease.resource_version().unwrap_or_default(),
        now,
    );
    let decision = decide(&seen, &cfg.identity, now, cfg.duration);
    *observed = Some(seen);
    let acquire = match decision {
        Decision::Follow(_) => return Ok(false),
        Decision::Renew => false,
        Decision::Acquire => true,
    };
    match api
        .replace(&cfg.name, &PostParams::default(), &leased(cfg, &lease, acquire))
        .await
    {
        Ok(_) => Ok(true),
        // Someone else wrote first: re-read next time.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(Error::Write(key.to_string(), e)),
    }
}

/// Gives the Lease up so a follower need not wait for it to expire.
async fn release(api: &Api<Lease>, cfg: &LeaseConfig, key: &str) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = %key, "released the lease"),
        Err(e) => tracing::warn!(lease = %key, error = %e, "failed to release the lease"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn free_or_own_or_stale_leases() {
        let t0 = Instant::now();
        let obs = |holder: Option<&str>, since| Observed {
            holder: holder.map(String::from),
            version: "1".into(),
            since,
        };
        assert_eq!(decide(&obs(None, t0), "a", t0, D), Decision::Acquire);
        assert_eq!(decide(&obs(Some(""), t0), "a", t0, D), Decision::Acquire);
        assert_eq!(decide(&obs(Some("a"), t0), "a", t0 + D * 10, D), Decision::Renew);
        assert_eq!(
            decide(&obs(Some("b"), t0), "a", t0 + D - Duration::from_millis(1), D),
            Decision::Follow("b".into())
        );
        assert_eq!(decide(&obs(Some("b"), t0), "a", t0 + D, D), Decision::Acquire);
    }

    #[test]
    fn a_renewed_record_restarts_the_expiry_clock() {
        let t0 = Instant::now();
        let first = observe(None, Some("b".into()), "1".into(), t0);
        // Same version seen later: still counted from the first sighting.
        let again = observe(Some(&first), Some("b".into()), "1".into(), t0 + D);
        assert_eq!(again.since, t0);
        assert_eq!(decide(&again, "a", t0 + D, D), Decision::Acquire);
        // The holder renewed (new version): it is alive.
        let renewed = observe(Some(&again), Some("b".into()), "2".into(), t0 + D);
        assert_eq!(decide(&renewed, "a", t0 + D, D), Decision::Follow("b".into()));
    }
}
