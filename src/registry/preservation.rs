//! Self-preservation arithmetic: the expected number of renewing clients, the renewal threshold,
//! the renews counted per minute, and the decisions derived from them (Java's
//! `PeerAwareInstanceRegistryImpl` and `MeasuredRate`).

/// Knobs, named after Spring's `eureka.server.*` properties.
#[derive(Clone, Debug, PartialEq)]
pub struct PreservationConfig {
    /// Whether eviction stops when renewals fall below the threshold.
    pub enable_self_preservation: bool,
    /// The fraction of expected renewals below which eviction stops (0.85).
    pub renewal_percent_threshold: f64,
    /// The renewal interval assumed for every client when computing expected renewals (30 s).
    pub expected_client_renewal_interval_seconds: i64,
    /// The 403 window after an empty start, and the grace before the EMERGENCY banner.
    pub wait_time_in_ms_when_sync_empty: i64,
    /// Length of a renews-per-minute bucket; 60 s in Java (tests shorten it).
    pub renews_window_ms: i64,
}

impl Default for PreservationConfig {
    fn default() -> Self {
        PreservationConfig {
            enable_self_preservation: true,
            renewal_percent_threshold: 0.85,
            expected_client_renewal_interval_seconds: 30,
            wait_time_in_ms_when_sync_empty: 300_000,
            renews_window_ms: 60_000,
        }
    }
}

/// Java's `MeasuredRate`: a count per fixed window, reporting the previous complete window. Windows
/// are aligned to the moment the registry opened for traffic, not to the wall clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeasuredRate {
    /// Length of one bucket.
    window_ms: i64,
    /// When the current bucket started.
    window_start: i64,
    /// Events counted in the current bucket.
    current: u64,
    /// Events of the last complete bucket: the figure reported.
    last: u64,
}

impl MeasuredRate {
    pub fn new(window_ms: i64, now: i64) -> MeasuredRate {
        MeasuredRate {
            window_ms: window_ms.max(1),
            window_start: now,
            current: 0,
            last: 0,
        }
    }

    fn roll(&mut self, now: i64) {
        let elapsed = now - self.window_start;
        if elapsed < self.window_ms {
            return;
        }
        let windows = elapsed / self.window_ms;
        // After one window the count moves to `last`; after more, the window before `now` saw nothing.
        self.last = if windows == 1 { self.current } else { 0 };
        self.current = 0;
        self.window_start += windows * self.window_ms;
    }

    pub fn increment(&mut self, now: i64) {
        self.roll(now);
        self.current += 1;
    }

    /// The count of the previous complete window.
    pub fn count(&mut self, now: i64) -> u64 {
        self.roll(now);
        self.last
    }

    /// The count so far in the current window (not what Java reports; for metrics).
    pub fn current(&mut self, now: i64) -> u64 {
        self.roll(now);
        self.current
    }
}

/// The self-preservation state of one registry.
#[derive(Clone, Debug)]
pub struct Preservation {
    /// The settings.
    pub config: PreservationConfig,
    /// `expectedNumberOfClientsSendingRenews`.
    pub expected_clients: i64,
    /// `numberOfRenewsPerMinThreshold`.
    pub threshold: i64,
    /// Renewals per minute, as Java's `renewsLastMin` measures them.
    pub renews: MeasuredRate,
    /// When the registry opened for traffic (0 until then).
    pub startup_time: i64,
    /// `peerInstancesTransferEmptyOnStartup`.
    pub transfer_empty_on_startup: bool,
}

impl Preservation {
    pub fn new(config: PreservationConfig, expected_clients: i64, now: i64) -> Preservation {
        let renews = MeasuredRate::new(config.renews_window_ms, now);
        let mut p = Preservation {
            config,
            expected_clients,
            threshold: 0,
            renews,
            startup_time: 0,
            transfer_empty_on_startup: true,
        };
        p.update_threshold();
        p
    }

    /// `updateRenewsPerMinThreshold`: `(int)(expected × 60 / interval × percent)`.
    ///
    /// With a renews window other than a minute (tests), the expectation scales with it: renews
    /// expected per window are `window / interval` per client.
    pub fn update_threshold(&mut self) {
        let interval = self.config.expected_client_renewal_interval_seconds.max(1) as f64;
        let per_window = if self.config.renews_window_ms == 60_000 {
            60.0 / interval
        } else {
            self.config.renews_window_ms as f64 / (interval * 1000.0)
        };
        let threshold = self.expected_clients as f64 * per_window * self.config.renewal_percent_threshold;
        self.threshold = threshold as i64;
    }

    /// `openForTraffic(count)`: the count of instances found at start becomes the expectation.
    pub fn open_for_traffic(&mut self, count: i64, now: i64) {
        self.expected_clients = count;
        self.update_threshold();
        self.startup_time = now;
        self.transfer_empty_on_startup = count == 0;
        self.renews = MeasuredRate::new(self.config.renews_window_ms, now);
    }

    /// A new lease: one more client expected, unless none were (Java never grows from zero).
    pub fn client_registered(&mut self) {
        if self.expected_clients > 0 {
            self.expected_clients += 1;
            self.update_threshold();
        }
    }

    /// A lease went away by cancel or eviction.
    pub fn client_cancelled(&mut self) {
        if self.expected_clients > 0 {
            self.expected_clients -= 1;
            self.update_threshold();
        }
    }

    pub fn renewed(&mut self, now: i64) {
        self.renews.increment(now);
    }

    pub fn renews_last_min(&mut self, now: i64) -> u64 {
        self.renews.count(now)
    }

    /// `isLeaseExpirationEnabled`: eviction runs unless self-preservation holds it back.
    pub fn lease_expiration_enabled(&mut self, now: i64) -> bool {
        if !self.config.enable_self_preservation {
            return true;
        }
        self.threshold > 0 && self.renews_last_min(now) as i64 > self.threshold
    }

    /// `isBelowRenewThresold() == 1`: what the dashboard's EMERGENCY banner shows.
    pub fn below_renew_threshold(&mut self, now: i64) -> bool {
        self.renews_last_min(now) as i64 <= self.threshold
            && self.startup_time > 0
            && now > self.startup_time + self.config.wait_time_in_ms_when_sync_empty
    }

    /// Whether self-preservation is currently holding back expiry.
    pub fn active(&mut self, now: i64) -> bool {
        self.config.enable_self_preservation && !self.lease_expiration_enabled(now)
    }

    /// `shouldAllowAccess(false)`: after an empty start, fetches are refused for a while.
    pub fn allow_access(&self, now: i64) -> bool {
        self.reads_refused_until().is_none_or(|until| now > until)
    }

    /// The end of the wait after an empty start, if the registry started empty.
    pub fn reads_refused_until(&self) -> Option<i64> {
        self.transfer_empty_on_startup.then(|| {
            self.startup_time
                .saturating_add(self.config.wait_time_in_ms_when_sync_empty)
        })
    }

    /// The periodic `updateRenewalThreshold` task: adopt `count` (the number of instances that
    /// renew) unless that would drop the expectation by more than the percent threshold while
    /// self-preservation is on.
    pub fn adopt_count(&mut self, count: i64) -> bool {
        if count as f64 > self.config.renewal_percent_threshold * self.expected_clients as f64
            || !self.config.enable_self_preservation
        {
            self.expected_clients = count;
            self.update_threshold();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_rate_reports_the_previous_complete_window() {
        let mut rate = MeasuredRate::new(60_000, 1_000);
        rate.increment(2_000);
        rate.increment(60_999);
        assert_eq!(rate.count(60_999), 0, "first window still open");
        assert_eq!(rate.count(61_000), 2);
        rate.increment(61_500);
        assert_eq!(rate.count(120_999), 2);
        assert_eq!(rate.count(121_000), 1);
        // Two silent windows later, the previous window saw nothing.
        assert_eq!(rate.count(241_000), 0);
        assert_eq!(rate.current(241_000), 0);
    }

    #[test]
    fn threshold_is_the_truncated_product() {
        let mut p = Preservation::new(PreservationConfig::default(), 1, 0);
        assert_eq!(p.threshold, 1); // (int)(1 × 2 × 0.85)
        for _ in 0..9 {
            p.client_registered();
        }
        assert_eq!(p.expected_clients, 10);
        assert_eq!(p.threshold, 17);
        p.client_cancelled();
        assert_eq!(p.threshold, 15); // (int)(9 × 2 × 0.85) = (int)15.3
        let mut p = Preservation::new(
            PreservationConfig {
                expected_client_renewal_interval_seconds: 5,
                ..Default::default()
            },
            4,
            0,
        );
        assert_eq!(p.threshold, 40); // 4 × 12 × 0.85 = 40.8
        p.open_for_traffic(0, 0);
        assert_eq!(p.threshold, 0);
        p.client_registered();
        assert_eq!(p.expected_clients, 0, "Java never grows the expectation from zero");
    }

    #[test]
    fn expiration_needs_strictly_more_renews_than_the_threshold() {
        let mut p = Preservation::new(PreservationConfig::default(), 10, 0);
        p.open_for_traffic(10, 0); // threshold 17
        for t in 0..17 {
            p.renewed(t);
        }
        assert!(!p.lease_expiration_enabled(60_000), "17 renews is not more than 17");
        assert!(p.active(60_000));
        for t in 0..18 {
            p.renewed(60_000 + t);
        }
        assert!(p.lease_expiration_enabled(120_000));
        assert!(!p.active(120_000));
        // With self-preservation off, expiry is always on, even with no renews at all.
        p.config.enable_self_preservation = false;
        assert!(p.lease_expiration_enabled(600_000));
    }

    #[test]
    fn a_shorter_window_scales_the_threshold() {
        let config = PreservationConfig {
            renews_window_ms: 1_000,
            expected_client_renewal_interval_seconds: 1,
            ..Default::default()
        };
        let p = Preservation::new(config, 5, 0);
        assert_eq!(p.threshold, 4); // 5 clients × 1 renew per window × 0.85
    }

    #[test]
    fn zero_threshold_disables_expiration() {
        let mut p = Preservation::new(PreservationConfig::default(), 0, 0);
        p.open_for_traffic(0, 0);
        for t in 0..100 {
            p.renewed(t);
        }
        assert!(!p.lease_expiration_enabled(60_000));
    }

    #[test]
    fn emergency_banner_waits_for_the_grace_period_and_uses_at_most() {
        let mut p = Preservation::new(PreservationConfig::default(), 1, 0);
        p.open_for_traffic(1, 1_000); // threshold 1
        assert!(!p.below_renew_threshold(2_000), "within the 5-minute grace");
        assert!(p.below_renew_threshold(301_001));
        // 1 renew in the last window: 1 <= 1 is still below (the banner uses <=, eviction >).
        p.renewed(301_001);
        assert!(p.below_renew_threshold(361_001));
        assert!(!p.lease_expiration_enabled(361_001));
    }

    #[test]
    fn empty_start_refuses_access_during_the_wait_time() {
        let mut p = Preservation::new(PreservationConfig::default(), 1, 0);
        p.open_for_traffic(0, 10_000);
        assert!(!p.allow_access(10_000 + 300_000));
        assert!(p.allow_access(10_000 + 300_001));
        p.open_for_traffic(3, 10_000);
        assert!(p.allow_access(10_000));
    }

    #[test]
    fn threshold_update_drops_at_most_by_the_percent_while_preserving() {
        let mut p = Preservation::new(PreservationConfig::default(), 100, 0);
        assert!(!p.adopt_count(85), "85 is not more than 0.85 × 100");
        assert_eq!(p.expected_clients, 100);
        assert!(p.adopt_count(86));
        assert_eq!(p.expected_clients, 86);
        assert_eq!(p.threshold, 146); // (int)(86 × 2 × 0.85) = (int)146.2
        assert!(p.adopt_count(500), "growth is always adopted");
        p.config.enable_self_preservation = false;
        assert!(p.adopt_count(1));
        assert_eq!(p.expected_clients, 1);
    }
}
