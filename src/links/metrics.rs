//! The links' metrics, one series set per link (gone with the link).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LinkLabel {
    pub link: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub link: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub link: String,
    pub class: &'static str,
}

/// The classes of failed polls.
pub const FAILURE_CLASSES: [&str; 7] = [
    "unreachable",
    "timeout",
    "unauthorized",
    "loop",
    "http",
    "invalid",
    "over_limit",
];

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct LinkMetrics {
    /// 1 while the last poll succeeded.
    up: Family<LinkLabel, Gauge>,
    /// Seconds since the last successful poll (since the puller started, before the first).
    age: Family<LinkLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// 1 while the link's instances are withdrawn after a partition.
    withdrawn: Family<LinkLabel, Gauge>,
    /// Instances in the link's copy.
    instances: Family<LinkLabel, Gauge>,
    /// Of those, hidden because a local instance has the same id.
    hidden: Family<LinkLabel, Gauge>,
    /// Successful polls by kind (`full`, `changes`).
    polls: Family<KindLabels, Counter>,
    /// Failed polls by class.
    failures: Family<ClassLabels, Counter>,
    /// Copies whose hash code differed from the source's after a poll (a full fetch follows).
    mismatches: Family<LinkLabel, Counter>,
    /// Pullers that ended unexpectedly and were started again.
    restarts: Family<LinkLabel, Counter>,
}

impl LinkMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register("link_up", "1 while the link's last poll succeeded", self.up.clone());
        r.register(
            "link_last_success_age_seconds",
            "Seconds since the link last answered",
            self.age.clone(),
        );
        r.register(
            "link_withdrawn",
            "1 while the link's instances are withdrawn after a partition",
            self.withdrawn.clone(),
        );
        r.register("link_instances", "Instances in the link's copy", self.instances.clone());
        r.register(
            "link_hidden_instances",
            "Imported instances hidden by a local instance with the same id",
            self.hidden.clone(),
        );
        r.register("link_polls", "Successful polls of the link by kind", self.polls.clone());
        r.register(
            "link_failures",
            "Failed polls of the link by class",
            self.failures.clone(),
        );
        r.register(
            "link_hash_mismatches",
            "Polls after which the copy's hash code differed from the source's",
            self.mismatches.clone(),
        );
        r.register(
            "link_puller_restarts",
            "Link pullers that ended unexpectedly and were started again",
            self.restarts.clone(),
        );
    }

    fn label(link: &str) -> LinkLabel {
        LinkLabel { link: link.to_string() }
    }

    /// Creates a link's series at zero.
    pub fn started(&self, link: &str) {
        let l = Self::label(link);
        self.up.get_or_create(&l).set(0);
        self.withdrawn.get_or_create(&l).set(0);
        self.age.get_or_create(&l).set(0.0);
        drop(self.mismatches.get_or_create(&l));
        drop(self.restarts.get_or_create(&l));
        for kind in ["full", "changes"] {
            drop(self.polls.get_or_create(&KindLabels {
                link: link.to_string(),
                kind,
            }));
        }
        for class in FAILURE_CLASSES {
            drop(self.failures.get_or_create(&ClassLabels {
                link: link.to_string(),
                class,
            }));
        }
    }

    /// Removes a link's series.
    pub fn forget(&self, link: &str) {
        let l = Self::label(link);
        for g in [&self.up, &self.withdrawn, &self.instances, &self.hidden] {
            g.remove(&l);
        }
        self.age.remove(&l);
        self.mismatches.remove(&l);
        self.restarts.remove(&l);
        for kind in ["full", "changes"] {
            self.polls.remove(&KindLabels {
                link: link.to_string(),
                kind,
            });
        }
        for class in FAILURE_CLASSES {
            self.failures.remove(&ClassLabels {
                link: link.to_string(),
                class,
            });
        }
    }

    pub fn polled(&self, link: &str, full: bool) {
        self.up.get_or_create(&Self::label(link)).set(1);
        self.polls
            .get_or_create(&KindLabels {
                link: link.to_string(),
                kind: if full { "full" } else { "changes" },
            })
            .inc();
    }

    pub fn failed(&self, link: &str, class: &'static str) {
        self.up.get_or_create(&Self::label(link)).set(0);
        self.failures
            .get_or_create(&ClassLabels {
                link: link.to_string(),
                class,
            })
            .inc();
    }

    pub fn age(&self, link: &str, seconds: f64) {
        self.age.get_or_create(&Self::label(link)).set(seconds);
    }

    pub fn withdrawn(&self, link: &str, withdrawn: bool) {
        self.withdrawn
            .get_or_create(&Self::label(link))
            .set(i64::from(withdrawn));
    }

    pub fn figures(&self, link: &str, instances: u64, hidden: u64) {
        self.instances.get_or_create(&Self::label(link)).set(instances as i64);
        self.hidden.get_or_create(&Self::label(link)).set(hidden as i64);
    }

    pub fn mismatch(&self, link: &str) {
        self.mismatches.get_or_create(&Self::label(link)).inc();
    }

    pub fn restarted(&self, link: &str) {
        self.restarts.get_or_create(&Self::label(link)).inc();
    }
}
