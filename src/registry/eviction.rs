//! Eviction: the run that removes expired leases, and which ones it takes: at most
//! `size - (int)(size × percent)` of the registry, chosen at random (a partial Fisher–Yates
//! shuffle, as Java's `evict`) from a seed the caller passes in, plus the pause compensation of
//! the eviction timer. A replica that does not evict applies the leader's evictions only where
//! the lease has expired here too.

use super::{Outcome, Registry, Replication, ReplicationAction, Reply, Writer};

/// SplitMix64: small, seedable and good enough to pick victims.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`), without modulo bias.
    pub fn below(&mut self, bound: usize) -> usize {
        let bound = bound as u64;
        let zone = u64::MAX - (u64::MAX % bound);
        loop {
            let v = self.next_u64();
            if v < zone {
                return (v % bound) as usize;
            }
        }
    }
}

/// `evictionLimit`: how many leases one run may remove from a registry of `registry_size`.
pub fn eviction_limit(registry_size: usize, renewal_percent_threshold: f64) -> usize {
    let keep = (registry_size as f64 * renewal_percent_threshold) as usize;
    registry_size.saturating_sub(keep)
}

/// Picks `min(expired.len(), limit)` victims at random; the rest wait for the next run.
pub fn choose<T>(mut expired: Vec<T>, limit: usize, seed: u64) -> Vec<T> {
    let to_evict = expired.len().min(limit);
    let mut rng = SplitMix64::new(seed);
    for i in 0..to_evict {
        let j = i + rng.below(expired.len() - i);
        expired.swap(i, j);
    }
    expired.truncate(to_evict);
    expired
}

/// The eviction timer's pause compensation: how much later than `interval_ms` this run is.
pub fn compensation_ms(last_run: Option<i64>, now: i64, interval_ms: i64) -> i64 {
    match last_run {
        Some(last) => (now - last - interval_ms).max(0),
        None => 0,
    }
}

impl Registry {
    pub(super) fn evict_replicated(&mut self, app: &str, id: &str, now: i64) -> Outcome {
        let mode = self.config.lease_expiry;
        let Some(entry) = self.store.get(app, id) else {
            return Outcome::reply(Reply::NotFound);
        };
        if !entry.holding.expires() {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} is a pod instance or adopted; it does not expire"
            )));
        }
        if !entry.lease.is_expired(now, 0, mode) {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} renewed here within its lease; not evicted"
            )));
        }
        // Counted as a cancellation (`evictions` counts what this replica decided to evict) and
        // replicated no further.
        self.cancelled(app, id, Writer::REPLICA, now)
    }

    /// One eviction run: removes (at most the eviction limit of) expired native and replicated
    /// leases, chosen with `seed`, unless self-preservation holds expiry back. Returns a `Cancel`
    /// record per victim written by [`Writer::Expiry`] (Java does not replicate evictions; a
    /// replicator may tell its own replicas, which do not evict themselves).
    pub fn evict(&mut self, now: i64, seed: u64) -> Vec<Replication> {
        let compensation = compensation_ms(self.last_eviction, now, self.config.eviction_interval_timer_in_ms);
        self.last_eviction = Some(now);
        if !self.preservation.lease_expiration_enabled(now) {
            self.totals.eviction_runs_held += 1;
            return Vec::new();
        }
        // Candidates in name order, so that a seed picks the same victims whatever the timing.
        let mut expired: Vec<(String, String)> = self
            .store
            .expired(now, compensation)
            .map(|(app, id)| (app.to_string(), id.to_string()))
            .collect();
        expired.sort();
        let size = self.expiring_instances() as usize;
        let limit = eviction_limit(size, self.config.preservation.renewal_percent_threshold);
        let victims = choose(expired, limit, seed);
        let mut records = Vec::with_capacity(victims.len());
        for (app, id) in victims {
            self.overrides.remove(&id);
            if let Some(removed) = self.remove(&app, &id, now) {
                self.preservation.client_cancelled();
                self.totals.evictions += 1;
                records.push(Replication {
                    action: ReplicationAction::Cancel,
                    app,
                    id,
                    last_dirty_timestamp: None,
                    status: None,
                    overridden_status: None,
                    instance: None,
                    origin: removed.origin,
                    writer: Writer::Expiry,
                });
            }
        }
        records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_matches_java_examples() {
        assert_eq!(eviction_limit(10, 0.85), 2);
        assert_eq!(eviction_limit(1, 0.85), 1);
        assert_eq!(eviction_limit(100, 0.85), 15);
        assert_eq!(eviction_limit(0, 0.85), 0);
        assert_eq!(eviction_limit(7, 1.0), 0);
    }

    #[test]
    fn choice_is_capped_random_and_reproducible() {
        let expired: Vec<u32> = (0..10).collect();
        let a = choose(expired.clone(), 3, 42);
        assert_eq!(a.len(), 3);
        assert_eq!(a, choose(expired.clone(), 3, 42), "same seed, same victims");
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let v = choose(expired.clone(), 3, seed);
            let unique: std::collections::BTreeSet<_> = v.iter().collect();
            assert_eq!(unique.len(), 3, "no lease picked twice");
            seen.extend(v);
        }
        assert_eq!(seen.len(), 10, "every expired lease can be picked");
        assert_eq!(choose(vec![1, 2], 5, 1).len(), 2, "fewer expired than the limit");
    }

    #[test]
    fn compensation_is_the_delay_beyond_the_interval() {
        assert_eq!(compensation_ms(None, 60_000, 60_000), 0);
        assert_eq!(compensation_ms(Some(0), 60_000, 60_000), 0);
        assert_eq!(compensation_ms(Some(0), 60_010, 60_000), 10);
        assert_eq!(compensation_ms(Some(60_010), 110_000, 60_000), 0);
    }
}
