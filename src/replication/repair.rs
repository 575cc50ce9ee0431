//! The leader's periodic work toward peers: it keeps Java peers' copies of pod instances and of
//! adopted instances alive (a `Register` for each on taking the Lease, heartbeats on an
//! interval, whether or not the client still heartbeats: the pod decides), and it compares
//! registries with every peer to repair what a partition lost (anti-entropy).
//!
//! The comparison runs only while this replica leads **and** its own registry is complete (synced
//! from peers, every watch listed and reconciled), so a restarted leader never judges others by a
//! half-filled registry. It judges liveness by lease renewals, never by `lastUpdatedTimestamp`
//! (heartbeats do not move that), and it never removes an instance that renewed within its lease
//! plus [`FRESHNESS_MARGIN`] on any replica it could reach:
//!
//! * a non-pod instance that is live here and missing on a replica is registered there;
//! * one that is live on a replica and missing here is taken here (and reaches the other
//!   replicas through the next comparison);
//! * one that a replica holds, that is not here, and that no reachable replica saw renew recently,
//!   is cancelled there (a leftover of a partition);
//! * toward Java peers: pod instances of this cluster that we no longer have are cancelled there.
//!
//! Pod instances are never compared between replicas: each replica derives them from its watch.
//! Adopted instances are compared as live whatever their lease says (their pod decides), and
//! travel as their client registered them; one taken from a replica is a copy
//! ([`Command::RegisterCopy`]).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

/// Every `action` label of `eureka_replication_repairs_total` (each series starts at 0).
pub const REPAIR_ACTIONS: [&str; 4] = [
    "registered_on_peer",
    "cancelled_on_peer",
    "taken_from_peer",
    "renewed_from_peer",
];

use tokio::time::Instant;

use super::{
    PeerQueue, RepairLabels, Replicator, cancel_record,
    client::{Fetched, Renewal},
    register_record,
};
use crate::{
    health::Health,
    registry::{
        Command, PeerKind, Replication, ReplicationAction, Writer,
        instance::{InstanceInfo, Status},
        view::{InstanceView, Origin},
    },
    supervisor::Shutdown,
};

/// Slack added to a lease's duration before an instance counts as dead: payloads of full fetches
/// may show lease timestamps up to 30 s old (ours and Java's caches), and clocks differ a little.
pub const FRESHNESS_MARGIN: Duration = Duration::from_secs(60);

type InstanceKey = (String, String);

/// Whether a lease renewed at `last_renewal` (lasting `duration_ms`) is live at `now`.
pub fn is_fresh(renewal: Renewal, now: i64) -> bool {
    now - renewal.last_renewal <= renewal.duration_ms + FRESHNESS_MARGIN.as_millis() as i64
}

/// What one comparison decided, per peer (pure; see [`plan`]).
#[derive(Debug, Default, PartialEq)]
pub struct Repairs {
    /// Instances to register on a replica (peer index → our copies).
    pub push: HashMap<usize, Vec<InstanceKey>>,
    /// Instances to take here from a replica (key → peer index that has it live).
    pub take: HashMap<InstanceKey, usize>,
    /// Instances to cancel on a replica (peer index → keys).
    pub cancel: HashMap<usize, Vec<InstanceKey>>,
    /// Our instances that a replica saw renew more recently than we did (its clients' heartbeats
    /// could not reach us): renewed here, so this replica does not evict them while they live.
    pub refresh: Vec<InstanceKey>,
}

/// Pure: the repairs between our registry (`ours`: non-pod key → our renewal) and the fetched
/// registries of the replicas we could reach (`theirs`: key → their renewal).
pub fn plan(ours: &HashMap<InstanceKey, Renewal>, theirs: &[HashMap<InstanceKey, Renewal>], now: i64) -> Repairs {
    let mut repairs = Repairs::default();
    let live_anywhere = |key: &InstanceKey| {
        ours.get(key).is_some_and(|r| is_fresh(*r, now))
            || theirs.iter().any(|t| t.get(key).is_some_and(|r| is_fresh(*r, now)))
    };
    for (n, their) in theirs.iter().enumerate() {
        let push: Vec<InstanceKey> = ours
            .iter()
            .filter(|(k, r)| is_fresh(**r, now) && !their.contains_key(*k))
            .map(|(k, _)| k.clone())
            .collect();
        if !push.is_empty() {
            repairs.push.insert(n, push);
        }
        let mut cancel = Vec::new();
        for (key, renewal) in their {
            if ours.contains_key(key) {
                continue;
            }
            if is_fresh(*renewal, now) {
                repairs.take.entry(key.clone()).or_insert(n);
            } else if !live_anywhere(key) {
                cancel.push(key.clone());
            }
        }
        if !cancel.is_empty() {
            repairs.cancel.insert(n, cancel);
        }
    }
    for (key, ours) in ours {
        // Half a lease without a renewal here while a replica saw a later one: renew ours, so a
        // comparison every half lease keeps it alive as long as it lives anywhere.
        let lagging = now - ours.last_renewal > ours.duration_ms / 2;
        let behind = lagging
            && theirs.iter().any(|t| {
                t.get(key)
                    .is_some_and(|r| is_fresh(*r, now) && r.last_renewal > ours.last_renewal)
            });
        if behind {
            repairs.refresh.push(key.clone());
        }
    }
    repairs.refresh.sort();
    repairs
}

/// Our renewals of the instances that are not pods of a cluster. An adopted instance lives as
/// long as its pod, whatever its lease says, so it counts as renewed now.
fn our_renewals(ours: &HashMap<InstanceKey, &InstanceView>, now: i64) -> HashMap<InstanceKey, Renewal> {
    ours.iter()
        .map(|(k, v)| {
            let last_renewal = if v.origin == Origin::Adopted {
                now
            } else {
                v.lease.last_renewal_ts
            };
            let renewal = Renewal {
                last_renewal,
                duration_ms: i64::from(v.lease.duration_secs) * 1000,
            };
            (k.clone(), renewal)
        })
        .collect()
}

/// Fetched instances whose claims one registry lock covers while a comparison looks them up.
const CLAIM_CHECK_BATCH: usize = 1024;

/// A fetched registry's instances by `(app, id)`, so that finding each one to take or cancel is
/// a lookup, not a scan of the whole fetch.
struct Indexed<'a>(HashMap<(&'a str, &'a str), &'a InstanceInfo>);

impl<'a> Indexed<'a> {
    fn of(fetched: &'a Fetched) -> Indexed<'a> {
        Indexed(fetched.instances.iter().map(|i| ((&*i.app, i.id()), i)).collect())
    }

    /// The instance `key`, if the fetch had it.
    fn get(&self, key: &InstanceKey) -> Option<&'a InstanceInfo> {
        self.0.get(&(key.0.as_str(), key.1.as_str())).copied()
    }
}

impl Replicator {
    /// Runs the leader's jobs until shutdown.
    pub async fn run_leader_jobs(self: Arc<Self>, health: Arc<Health>, shutdown: Shutdown) -> anyhow::Result<()> {
        let mut leader = self.leader.clone();
        let mut heartbeat = tokio::time::interval(self.settings.java_heartbeat_interval);
        let mut compare = tokio::time::interval(self.settings.anti_entropy_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        compare.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        compare.tick().await;
        let stop = shutdown.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                changed = leader.changed() => {
                    if changed.is_err() {
                        // The Lease task stopped: only at shutdown.
                        stop.as_mut().await;
                        return Ok(());
                    }
                    if leader.borrow_and_update().holds() {
                        // Newly leading: Java peers get every pod instance now.
                        self.push_pods_to_java(ReplicationAction::Register);
                    }
                }
                _ = heartbeat.tick() => {
                    if leader.borrow().holds() {
                        self.push_pods_to_java(ReplicationAction::Heartbeat);
                    }
                }
                _ = compare.tick() => {
                    if leader.borrow().holds() && health.is_complete() && !crate::mutants::on("anti-entropy-off") {
                        self.compare_with_peers().await;
                    }
                }
            }
        }
    }

    fn push_pods_to_java(&self, action: ReplicationAction) {
        let queues = self.queues_of(Some(PeerKind::Java));
        if queues.is_empty() {
            return;
        }
        let pods = self.state.with_registry(|r, _| {
            let mut v: Vec<InstanceView> = r.pod_instances().into_iter().map(|(_, v)| v).collect();
            v.extend(r.adopted_instances());
            v
        });
        let now = Instant::now();
        for view in pods {
            let record = match action {
                ReplicationAction::Register => register_record(&view, Writer::Controller),
                _ => Replication {
                    action: ReplicationAction::Heartbeat,
                    app: view.info.app.to_string(),
                    id: view.id().to_string(),
                    last_dirty_timestamp: Some(view.info.last_dirty_timestamp),
                    status: Some(view.info.status),
                    overridden_status: (view.info.overridden_status != Status::Unknown)
                        .then_some(view.info.overridden_status),
                    instance: None,
                    origin: view.origin,
                    writer: Writer::Controller,
                },
            };
            for q in &queues {
                self.enqueue(q, record.clone(), now);
            }
        }
    }

    /// One anti-entropy round. See the module docs.
    #[tracing::instrument(name = "anti_entropy", skip_all)]
    async fn compare_with_peers(&self) {
        let queues = self.queues_of(None);
        let mut fetched: Vec<(&Arc<PeerQueue>, Fetched)> = Vec::new();
        for q in queues.iter().filter(|q| q.kind == PeerKind::Replica) {
            match self.client.fetch_with_renewals(&q.url, true).await {
                Ok(f) => fetched.push((q, f)),
                Err(e) => tracing::debug!(peer = %q.url.display(), error = %e, "could not compare registries"),
            }
        }
        // With no replica to compare with there is nothing to plan: our side is not taken at all
        // (a walk of the whole registry every interval, for nothing, on a lone server).
        if !fetched.is_empty() {
            let (views, now) = self.our_side().await;
            let ours: HashMap<InstanceKey, &InstanceView> = views
                .iter()
                .map(|i| ((i.info.app.to_string(), i.id().to_string()), i))
                .collect();
            let theirs = self.their_renewals(&fetched, now);
            let repairs = plan(&our_renewals(&ours, now), &theirs, now);
            let indexed: Vec<(&Arc<PeerQueue>, Indexed<'_>)> =
                fetched.iter().map(|(q, f)| (*q, Indexed::of(f))).collect();
            self.repair_peers(&repairs, &indexed, &ours);
            self.repair_here(&repairs, &indexed);
        }
        self.cancel_gone_pods_on_java(&queues).await;
    }

    /// Our instances that are compared (neither pods nor imports), with the time they were
    /// taken: a batch of applications per registry lock ([`crate::state::AppState::app_views_batched`]; a
    /// single snapshot held the lock for 83 ms at 100,000 instances). The comparison needs no
    /// single moment: it judges leases with a margin of [`FRESHNESS_MARGIN`].
    async fn our_side(&self) -> (Vec<InstanceView>, i64) {
        let apps = self.state.app_views_batched().await;
        let views = apps
            .into_iter()
            .flat_map(|a| a.instances)
            .filter(|i| i.origin != Origin::Pod && i.origin != Origin::Imported)
            .collect();
        (views, self.state.now())
    }

    /// Each fetched replica's renewals of the instances that are not pods of a cluster; one
    /// that a claim here adopts counts as renewed now.
    fn their_renewals(&self, fetched: &[(&Arc<PeerQueue>, Fetched)], now: i64) -> Vec<HashMap<InstanceKey, Renewal>> {
        // A claim lookup per fetched instance: a batch of them per registry lock, not a whole
        // replica's registry under one.
        let claimed: Vec<HashSet<InstanceKey>> = fetched
            .iter()
            .map(|(_, f)| {
                let mut claimed = HashSet::new();
                for batch in f.instances.chunks(CLAIM_CHECK_BATCH) {
                    self.state.with_registry(|r, now| {
                        claimed.extend(
                            batch
                                .iter()
                                .filter(|i| r.claimed(i, now))
                                .map(|i| (i.app.to_string(), i.id().to_string())),
                        )
                    });
                }
                claimed
            })
            .collect();
        fetched
            .iter()
            .zip(&claimed)
            .map(|((_, f), claimed)| {
                let pods: HashSet<InstanceKey> = f
                    .instances
                    .iter()
                    .filter(|i| self.owned(i))
                    .map(|i| (i.app.to_string(), i.id().to_string()))
                    .collect();
                f.renewals
                    .iter()
                    .filter(|(k, _)| !pods.contains(*k))
                    .map(|(k, r)| {
                        let last_renewal = if claimed.contains(k) { now } else { r.last_renewal };
                        (k.clone(), Renewal { last_renewal, ..*r })
                    })
                    .collect()
            })
            .collect()
    }

    fn count(&self, action: &'static str, n: usize) {
        debug_assert!(REPAIR_ACTIONS.contains(&action), "{action} is not in REPAIR_ACTIONS");
        self.metrics
            .repairs
            .get_or_create(&RepairLabels { action })
            .inc_by(n as u64);
    }

    /// Sends replicas the live instances they lack and cancels there those nobody renewed.
    fn repair_peers(
        &self,
        repairs: &Repairs,
        fetched: &[(&Arc<PeerQueue>, Indexed<'_>)],
        ours: &HashMap<InstanceKey, &InstanceView>,
    ) {
        let at = Instant::now();
        for (n, keys) in &repairs.push {
            let q = fetched[*n].0;
            for key in keys.iter().filter(|k| ours.contains_key(*k)) {
                // As the client registered it (an adopted instance's status is the pod's here).
                if let Some(view) = self.state.with_registry(|r, _| r.replica_view(&key.0, &key.1)) {
                    self.enqueue(q, register_record(&view, Writer::Client), at);
                }
            }
            tracing::info!(peer = %q.url.display(), instances = keys.len(), "sent a replica the live instances it lacked");
            self.count("registered_on_peer", keys.len());
        }
        for (n, keys) in &repairs.cancel {
            let q = fetched[*n].0;
            for key in keys {
                let Some(info) = fetched[*n].1.get(key) else {
                    continue;
                };
                tracing::info!(peer = %q.url.display(), id = %key.1, "cancelled an instance a replica kept after a partition; no replica saw it renew");
                self.enqueue(q, cancel_record(info, Writer::Expiry, Origin::Native), at);
            }
            self.count("cancelled_on_peer", keys.len());
        }
    }

    /// Takes the live instances only replicas have and renews those only they saw renew.
    fn repair_here(&self, repairs: &Repairs, fetched: &[(&Arc<PeerQueue>, Indexed<'_>)]) {
        for (key, n) in &repairs.take {
            let Some(info) = fetched[*n].1.get(key) else {
                continue;
            };
            let q = fetched[*n].0;
            tracing::info!(peer = %q.url.display(), id = %key.1, "took a live instance a replica had and this one lacked");
            self.state.apply(Command::RegisterCopy { info: info.clone() });
            self.count("taken_from_peer", 1);
        }
        for key in &repairs.refresh {
            self.state.apply(Command::Renew {
                app: key.0.clone(),
                id: key.1.clone(),
                writer: Writer::REPLICA,
                overridden_status: None,
                last_dirty_timestamp: None,
            });
        }
        if !repairs.refresh.is_empty() {
            tracing::info!(
                instances = repairs.refresh.len(),
                "renewed instances whose heartbeats reached only other replicas"
            );
            self.count("renewed_from_peer", repairs.refresh.len());
        }
    }

    /// Java peers lose the pod instances of this cluster that we no longer have.
    async fn cancel_gone_pods_on_java(&self, queues: &[Arc<PeerQueue>]) {
        if !queues.iter().any(|q| q.kind == PeerKind::Java) {
            return;
        }
        let pods: HashSet<InstanceKey> = self
            .state
            .with_registry(|r, _| r.pod_instances())
            .into_iter()
            .map(|(_, v)| (v.info.app.to_string(), v.id().to_string()))
            .collect();
        for q in queues.iter().filter(|q| q.kind == PeerKind::Java) {
            let theirs: Vec<InstanceInfo> = match self.client.fetch(&q.url, false).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(peer = %q.url.display(), error = %e, "could not compare registries");
                    continue;
                }
            };
            let at = Instant::now();
            for info in theirs.iter().filter(|i| self.owned(i)) {
                if !pods.contains(&(info.app.to_string(), info.id().to_string())) {
                    tracing::info!(peer = %q.url.display(), id = %info.id(), "removing a pod instance this cluster no longer has");
                    self.enqueue(q, cancel_record(info, Writer::Controller, Origin::Pod), at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 10_000_000;

    fn key(id: &str) -> InstanceKey {
        ("APP".into(), id.into())
    }

    fn renewed(ago_ms: i64) -> Renewal {
        Renewal {
            last_renewal: NOW - ago_ms,
            duration_ms: 90_000,
        }
    }

    #[test]
    fn an_instance_renewing_on_a_cut_off_replica_is_taken_not_cancelled() {
        // The leader cannot hear from follower F (one-way cut) and never got the registration;
        // the client keeps renewing on F. Its `lastUpdatedTimestamp` is old, its lease is fresh.
        let ours = HashMap::new();
        let f: HashMap<InstanceKey, Renewal> = [(key("live"), renewed(5_000))].into();
        let r = plan(&ours, &[f], NOW);
        assert_eq!(r.take.get(&key("live")), Some(&0));
        assert!(r.cancel.is_empty(), "{r:?}");
    }

    #[test]
    fn a_leftover_is_cancelled_only_when_no_replica_saw_it_renew() {
        let dead = renewed(90_000 + FRESHNESS_MARGIN.as_millis() as i64 + 1);
        let ours = HashMap::new();
        let a: HashMap<InstanceKey, Renewal> = [(key("x"), dead)].into();
        // Another replica still sees it renew: nobody cancels it.
        let b: HashMap<InstanceKey, Renewal> = [(key("x"), renewed(1_000))].into();
        let r = plan(&ours, &[a.clone(), b], NOW);
        assert!(r.cancel.is_empty(), "{r:?}");
        assert_eq!(r.take.get(&key("x")), Some(&1));
        // Dead everywhere: cancelled on the replica that kept it.
        let r = plan(&ours, &[a], NOW);
        assert_eq!(r.cancel.get(&0), Some(&vec![key("x")]));
    }

    #[test]
    fn only_live_instances_are_pushed() {
        let ours: HashMap<InstanceKey, Renewal> =
            [(key("live"), renewed(1_000)), (key("expired"), renewed(10_000_000))].into();
        let r = plan(&ours, &[HashMap::new()], NOW);
        assert_eq!(r.push.get(&0), Some(&vec![key("live")]));
    }

    #[test]
    fn a_copy_that_lags_a_fresher_replica_is_renewed() {
        let ours: HashMap<InstanceKey, Renewal> = [(key("x"), renewed(50_000)), (key("y"), renewed(1_000))].into();
        let f: HashMap<InstanceKey, Renewal> = [(key("x"), renewed(2_000)), (key("y"), renewed(2_000))].into();
        let r = plan(&ours, &[f], NOW);
        assert_eq!(r.refresh, vec![key("x")]);
    }

    #[test]
    fn freshness_includes_the_margin() {
        let d = 90_000 + FRESHNESS_MARGIN.as_millis() as i64;
        assert!(is_fresh(renewed(d), NOW));
        assert!(!is_fresh(renewed(d + 1), NOW));
    }
}
