//! Read-only snapshots of the registry handed to encoders: instances with their lease numbers,
//! grouped into applications, with the reconcile hash code. Built under the registry lock (cheap
//! `Arc` clones), encoded outside it.

use std::sync::Arc;

use super::instance::{ActionType, InstanceInfo, Status};

/// The `leaseInfo` block of a stored instance, as Java's `decorateInstanceInfo` fills it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LeaseView {
    /// `renewalIntervalInSecs` as registered.
    pub renewal_interval_secs: i32,
    /// `durationInSecs` as registered.
    pub duration_secs: i32,
    /// `registrationTimestamp` (ms).
    pub registration_ts: i64,
    /// `lastRenewalTimestamp` (ms).
    pub last_renewal_ts: i64,
    /// `evictionTimestamp` (ms), 0 while the lease lives.
    pub eviction_ts: i64,
    /// `serviceUpTimestamp` (ms).
    pub service_up_ts: i64,
}

/// Where an instance came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Registered by a Eureka client over HTTP.
    Native,
    /// Registered through a peer's replication.
    Replicated,
    /// Derived from a Kubernetes Pod by the controller.
    Pod,
    /// Registered by a pod's own client (natively or through a peer) and adopted by its
    /// EurekaApp: the pod's lifetime and readiness decide about it.
    Adopted,
    /// Imported over a link from another cluster's registry ([`super::imports`]).
    Imported,
}

impl Origin {
    /// Every origin, in the order of [`super::Stats::by_origin`].
    pub const ALL: [Origin; 5] = [
        Origin::Native,
        Origin::Replicated,
        Origin::Pod,
        Origin::Adopted,
        Origin::Imported,
    ];
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Native => "native",
            Origin::Replicated => "replicated",
            Origin::Pod => "pod",
            Origin::Adopted => "adopted",
            Origin::Imported => "imported",
        }
    }
}

/// One instance as a reader sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceView {
    /// The stored instance, shared with the registry (never copied for a read).
    pub info: Arc<InstanceInfo>,
    /// Its lease figures as the encoders write them.
    pub lease: LeaseView,
    /// Where it came from (a client, a peer, a pod).
    pub origin: Origin,
}

impl InstanceView {
    pub fn id(&self) -> &str {
        self.info.id()
    }

    pub fn status(&self) -> Status {
        self.info.status
    }

    pub fn action_type(&self) -> Option<ActionType> {
        self.info.action_type
    }
}

/// `application`: a name and its instances (sorted by id).
#[derive(Clone, Debug, PartialEq)]
pub struct AppView {
    /// The upper-case application name.
    pub name: String,
    /// Its instances, in the registry's order.
    pub instances: Vec<InstanceView>,
}

/// `applications`: a full registry, a delta, or a VIP selection.
#[derive(Clone, Debug, PartialEq)]
pub struct AppsView {
    /// `versions__delta`: "1" for full fetches, the registry version for deltas, -1 for VIPs.
    pub versions_delta: i64,
    /// `apps__hashcode`.
    pub apps_hashcode: String,
    /// The applications, in the registry's order.
    pub apps: Vec<AppView>,
}

/// Instances per status, in the order of the reconcile hash code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts([u64; 5]);

impl StatusCounts {
    pub fn add(&mut self, status: Status) {
        self.0[status.name_rank()] += 1;
    }

    pub fn remove(&mut self, status: Status) {
        let slot = &mut self.0[status.name_rank()];
        *slot = slot.saturating_sub(1);
    }

    pub fn get(&self, status: Status) -> u64 {
        self.0[status.name_rank()]
    }

    /// These counts less `other`'s (never below zero).
    pub fn less(&self, other: &StatusCounts) -> StatusCounts {
        let mut out = *self;
        for (slot, n) in out.0.iter_mut().zip(other.0) {
            *slot = slot.saturating_sub(n);
        }
        out
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Java's `Applications.getReconcileHashCode`: `STATUS_count_` for each status with a non-zero
    /// count, ordered by status name. Empty for an empty registry.
    pub fn hashcode(&self) -> String {
        let mut out = String::new();
        for status in Status::BY_NAME {
            let n = self.get(status);
            if n > 0 {
                out.push_str(status.as_str());
                out.push('_');
                out.push_str(&n.to_string());
                out.push('_');
            }
        }
        out
    }

    pub fn of<'a>(instances: impl IntoIterator<Item = &'a InstanceView>) -> StatusCounts {
        let mut c = StatusCounts::default();
        for i in instances {
            c.add(i.status());
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashcode_orders_by_status_name_and_skips_zeros() {
        let mut c = StatusCounts::default();
        assert_eq!(c.hashcode(), "");
        for _ in 0..10 {
            c.add(Status::Up);
        }
        c.add(Status::OutOfService);
        c.add(Status::OutOfService);
        c.add(Status::Down);
        assert_eq!(c.hashcode(), "DOWN_1_OUT_OF_SERVICE_2_UP_10_");
        c.remove(Status::Down);
        c.remove(Status::Down);
        assert_eq!(c.hashcode(), "OUT_OF_SERVICE_2_UP_10_");
        assert_eq!(c.total(), 12);
    }
}
