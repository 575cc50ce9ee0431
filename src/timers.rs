//! Periodic drivers of the registry's background work: delta pruning on every replica; eviction
//! and the renewal-threshold update only while this replica leads (always, without Kubernetes).
//! They pass the current time (and a seed) into pure registry methods.

use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::{state::AppState, supervisor::Shutdown};

/// The timer periods (validated positive by `config`).
#[derive(Clone, Debug)]
pub struct Intervals {
    /// `--eviction-interval-timer-in-ms`.
    pub eviction: Duration,
    /// `--renewal-threshold-update-interval-ms`.
    pub renewal_threshold_update: Duration,
    /// `--delta-retention-timer-interval-in-ms`.
    pub delta_retention: Duration,
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

/// Runs until shutdown.
pub async fn run(
    state: AppState,
    intervals: Intervals,
    leader: crate::leadership::Leader,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let mut evict = ticker(intervals.eviction);
    let mut threshold = ticker(intervals.renewal_threshold_update);
    let mut purge = ticker(intervals.delta_retention);
    let mut runs: u64 = 0;
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = evict.tick() => {
                if leader.borrow().holds() || crate::mutants::on("two-leaders") {
                    runs += 1;
                    // Java seeds its choice with the current time; so do we, plus a run counter.
                    let seed = (state.now() as u64).wrapping_mul(0x9E37_79B9).wrapping_add(runs);
                    let n = state.evict(seed);
                    if n > 0 {
                        tracing::info!(evicted = n, "evicted expired leases");
                    }
                }
            }
            _ = threshold.tick() => {
                if leader.borrow().holds() && state.with_registry(|r, _| r.update_renewal_threshold()) {
                    tracing::info!("updated the renewal threshold");
                }
            }
            _ = purge.tick() => state.with_registry(|r, now| r.purge(now)),
        }
    }
}
