//! A lease: when an instance registered, was last renewed, went UP and was cancelled, and when it
//! expires, with Java's arithmetic available as an option.

/// How a renewed lease expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpiryMode {
    /// A lease expires `duration` after its last renewal, as Eureka documents it.
    #[default]
    Exact,
    /// Java's `Lease.renew()` stores `now + duration` as the last update and `isExpired` adds the
    /// duration again, so a renewed lease expires `2 × duration` after its last renewal
    /// (Netflix/eureka#531, "will not be fixed"). `leaseInfo.lastRenewalTimestamp` then shows the
    /// shifted time.
    Java,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// When the instance registered (ms).
    pub registration_ts: i64,
    /// When the lease was last renewed (its registration time until the first renewal).
    pub renewed_at: i64,
    /// Whether it has been renewed at all: in Java's expiry mode only a renewed lease gets the
    /// duration added twice (its `Lease.renew` quirk).
    renewed: bool,
    /// When it was cancelled or evicted (ms), 0 while it lives.
    pub eviction_ts: i64,
    /// When the instance first went UP (ms), 0 until then.
    pub service_up_ts: i64,
    /// The lease duration the registrant asked for, in ms.
    pub duration_ms: i64,
}

impl Lease {
    pub fn new(now: i64, duration_secs: i32) -> Lease {
        Lease {
            registration_ts: now,
            renewed_at: now,
            renewed: false,
            eviction_ts: 0,
            service_up_ts: 0,
            duration_ms: i64::from(duration_secs.max(1)) * 1000,
        }
    }

    pub fn renew(&mut self, now: i64) {
        self.renewed_at = now;
        self.renewed = true;
    }

    /// Marks the lease cancelled (once).
    pub fn cancel(&mut self, now: i64) {
        if self.eviction_ts == 0 {
            self.eviction_ts = now;
        }
    }

    /// Records the first time the instance was seen UP.
    pub fn service_up(&mut self, now: i64) {
        if self.service_up_ts == 0 {
            self.service_up_ts = now;
        }
    }

    /// Java's `lastUpdateTimestamp`, which is also what `leaseInfo.lastRenewalTimestamp` shows.
    pub fn last_update(&self, mode: ExpiryMode) -> i64 {
        match mode {
            ExpiryMode::Java if self.renewed => self.renewed_at + self.duration_ms,
            _ => self.renewed_at,
        }
    }

    /// `Lease.isExpired(additionalLeaseMs)`.
    pub fn is_expired(&self, now: i64, additional_ms: i64, mode: ExpiryMode) -> bool {
        self.eviction_ts > 0 || now > self.last_update(mode) + self.duration_ms + additional_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_mode_expires_one_duration_after_the_last_renewal() {
        let mut lease = Lease::new(1_000, 90);
        assert!(!lease.is_expired(91_000, 0, ExpiryMode::Exact));
        assert!(lease.is_expired(91_001, 0, ExpiryMode::Exact));
        lease.renew(50_000);
        assert_eq!(lease.last_update(ExpiryMode::Exact), 50_000);
        assert!(!lease.is_expired(140_000, 0, ExpiryMode::Exact));
        assert!(lease.is_expired(140_001, 0, ExpiryMode::Exact));
    }

    #[test]
    fn java_mode_expires_two_durations_after_a_renewal_but_one_after_registration() {
        let mut lease = Lease::new(1_000, 90);
        // Never renewed: one duration after registration, as in Java.
        assert!(lease.is_expired(91_001, 0, ExpiryMode::Java));
        lease.renew(50_000);
        assert_eq!(lease.last_update(ExpiryMode::Java), 140_000);
        assert!(!lease.is_expired(230_000, 0, ExpiryMode::Java));
        assert!(lease.is_expired(230_001, 0, ExpiryMode::Java));
    }

    #[test]
    fn compensation_extends_the_lease_and_cancel_expires_it_at_once() {
        let mut lease = Lease::new(0, 10);
        assert!(!lease.is_expired(10_500, 1_000, ExpiryMode::Exact));
        lease.cancel(5);
        lease.cancel(7);
        assert_eq!(lease.eviction_ts, 5);
        assert!(lease.is_expired(6, 0, ExpiryMode::Exact));
    }
}
