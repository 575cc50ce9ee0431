//! Leadership as the rest of the process sees it: whether this replica holds the Lease *now*.
//!
//! The lease task publishes a [`Lead`] on a watch channel: receivers are woken when a replica
//! becomes or stops being leader, while a renewal only moves the deadline, quietly. Readers ask
//! [`Lead::holds`], which turns false at the deadline even when the lease task has not run yet: a
//! process paused past its lease (SIGSTOP, a frozen VM) wakes with every timer due, and an
//! eviction, an anti-entropy round or a scrape may run before the lease task looks and steps
//! down; without the deadline they would act, or report, as a second leader.

use std::time::Instant;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};
use tokio::sync::watch;

/// This replica's leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lead {
    /// Another replica may hold the Lease.
    Follower,
    /// Holds the Lease until this instant unless it renews first.
    Until(Instant),
    /// No cluster: the only replica, always leading.
    Always,
}

impl Lead {
    /// Whether this replica leads now.
    pub fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }

    /// Whether this replica leads at `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        match self {
            Lead::Follower => false,
            Lead::Until(deadline) => now < *deadline,
            Lead::Always => true,
        }
    }

    fn is_follower(&self) -> bool {
        *self == Lead::Follower
    }
}

/// What readers hold.
pub type Leader = watch::Receiver<Lead>;

/// Publishes `next`; receivers are woken only when it turns this replica into a leader or a
/// follower (a renewal that moves the deadline wakes no one). Returns whether it was such a turn.
pub fn publish(tx: &watch::Sender<Lead>, next: Lead) -> bool {
    tx.send_if_modified(|current| {
        let turn = current.is_follower() != next.is_follower();
        *current = next;
        turn
    })
}

/// The `leader` gauge, read at scrape time (so a paused replica past its deadline reports 0).
#[derive(Debug)]
pub struct LeaderGauge(pub Leader);

impl Collector for LeaderGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let held = i64::from(self.0.borrow().holds());
        let metric = encoder.encode_descriptor(
            "leader",
            "1 while this replica holds the Lease (always without Kubernetes)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(held).encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_lead_ends_at_its_deadline_without_anyone_publishing() {
        let now = Instant::now();
        let lead = Lead::Until(now + Duration::from_secs(10));
        assert!(lead.holds_at(now));
        assert!(lead.holds_at(now + Duration::from_secs(9)));
        assert!(!lead.holds_at(now + Duration::from_secs(10)));
        assert!(Lead::Always.holds_at(now + Duration::from_secs(1_000_000)));
        assert!(!Lead::Follower.holds_at(now));
    }

    #[tokio::test]
    async fn receivers_wake_on_turns_not_on_renewals() {
        let (tx, mut rx) = watch::channel(Lead::Follower);
        let now = Instant::now();
        assert!(publish(&tx, Lead::Until(now + Duration::from_secs(5))));
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        // A renewal moves the deadline quietly, yet readers see the new one.
        assert!(!publish(&tx, Lead::Until(now + Duration::from_secs(9))));
        assert!(!rx.has_changed().unwrap());
        assert_eq!(*rx.borrow(), Lead::Until(now + Duration::from_secs(9)));
        // A lead that lapsed quietly still wakes readers when the lease task steps down.
        assert!(!publish(&tx, Lead::Until(now)));
        assert!(publish(&tx, Lead::Follower));
        assert!(rx.has_changed().unwrap());
    }
}
