//! Peer replication in Eureka's own protocol: every write's replication records are routed to
//! this operator's other replicas and to Java Eureka peers, queued per peer (coalescing,
//! bounded, aged), sent in batches, and the answers acted on as Java does (a 404 to a heartbeat
//! sends a `Register`; a 409 carries the peer's newer copy, which is registered here).
//!
//! Routing, so that nothing echoes:
//! * a client's write goes to every replica and every Java peer (pod instances: to Java only
//!   from the Lease holder);
//! * a write a replica replicated to us goes nowhere, except pod changes, which the leader
//!   passes on to Java peers;
//! * a write a Java peer replicated to us goes to our replicas only (Java peers replicate to
//!   one of us; the others learn it from that one);
//! * the controller's pod instances go to Java peers, from the leader only (every replica
//!   derives them from its own watch);
//! * the leader's evictions go to the replicas (followers do not evict).
//!
//! The leader also keeps Java peers' copies of pod instances alive with heartbeats, and
//! periodically compares registries with peers to repair what a partition lost.

pub mod batcher;
pub mod client;
pub mod sync;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

use batcher::{Backoff, Batcher, Failure, Limits};
use client::{PeerClient, PeerUrl};

use crate::{
    registry::{
        Action, Command, Replication, Source,
        instance::{InstanceInfo, Status},
        view::{InstanceView, OriginKind},
    },
    state::{AppState, OutcomeListener, Writer},
};

/// What kind of server a peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKind {
    /// Another replica of this operator.
    Replica,
    /// A Java (or any other) Eureka server.
    Java,
}

impl PeerKind {
    fn as_str(self) -> &'static str {
        match self {
            PeerKind::Replica => "replica",
            PeerKind::Java => "java",
        }
    }
}

/// Where one record goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Targets {
    pub replicas: bool,
    pub java: bool,
}

/// Pure: the peers a record is for, given who wrote it and whether we lead.
pub fn route(record: &Replication, writer: &Writer, leader: bool) -> Targets {
    let pod = record.origin == OriginKind::Pod;
    match (record.source, writer) {
        (Source::Expiry, _) => Targets {
            replicas: true,
            java: false,
        },
        (Source::Peer, Writer::ForeignPeer) => Targets {
            replicas: true,
            java: false,
        },
        (Source::Peer, _) => Targets {
            replicas: false,
            java: pod && leader,
        },
        (Source::Client, Writer::Controller) => Targets {
            replicas: false,
            java: leader,
        },
        (Source::Client, _) if pod => Targets {
            replicas: true,
            java: leader,
        },
        (Source::Client, _) => Targets {
            replicas: true,
            java: true,
        },
    }
}

/// Replication settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub limits: Limits,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub replica_id: String,
    /// How often the leader heartbeats pod instances to Java peers.
    pub java_heartbeat_interval: Duration,
    /// How often the leader compares registries with peers.
    pub anti_entropy_interval: Duration,
    /// Identifies this cluster's pod instances in Java peers' registries.
    pub cluster_id: String,
    /// How `https://` peers are verified (the system roots when `None`).
    pub tls: Option<crate::tls::PeerTls>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    peer: String,
    class: &'static str,
}

/// Replication metrics, labelled by peer.
#[derive(Clone, Default)]
pub struct Metrics {
    queued: Family<PeerLabels, Gauge>,
    sent: Family<PeerLabels, Counter>,
    batches: Family<PeerLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    dropped: Family<PeerLabels, Counter>,
    pub forwarded_conflicts: Counter,
}

impl Metrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let r = registry.sub_registry_with_prefix("replication");
        r.register("queued", "Replication tasks waiting per peer", self.queued.clone());
        r.register("sent_items", "Replication tasks delivered per peer", self.sent.clone());
        r.register("batches", "Batches delivered per peer", self.batches.clone());
        r.register("failures", "Failed batches per peer and class", self.failures.clone());
        r.register(
            "dropped",
            "Tasks dropped (queue full, too old, or refused)",
            self.dropped.clone(),
        );
        r.register(
            "conflicts_resolved",
            "Newer copies taken from peers' 409 answers",
            self.forwarded_conflicts.clone(),
        );
    }
}

struct PeerQueue {
    url: PeerUrl,
    kind: PeerKind,
    batcher: Mutex<Batcher>,
    notify: Notify,
    stopped: std::sync::atomic::AtomicBool,
    /// This peer's `queued` gauge, looked up once (it is set on every enqueue).
    queued: Gauge,
}

impl PeerQueue {
    fn labels(&self) -> PeerLabels {
        PeerLabels {
            peer: self.url.display().to_string(),
            kind: self.kind.as_str(),
        }
    }
}

/// The replicator. Add it as an [`OutcomeListener`] of the state.
pub struct Replicator {
    state: AppState,
    client: PeerClient,
    leader: watch::Receiver<bool>,
    peers: Mutex<HashMap<String, Arc<PeerQueue>>>,
    settings: Settings,
    metrics: Metrics,
}

impl OutcomeListener for Replicator {
    fn on_outcome(&self, outcome: &crate::registry::Outcome, writer: &Writer) {
        if outcome.replicate.is_empty() {
            return;
        }
        let leader = *self.leader.borrow();
        let queues = self.peers.lock();
        let now = Instant::now();
        for record in &outcome.replicate {
            let targets = route(record, writer, leader);
            for q in queues.values() {
                let wanted = match q.kind {
                    PeerKind::Replica => targets.replicas,
                    PeerKind::Java => targets.java,
                };
                if wanted {
                    self.enqueue(q, record.clone(), now);
                }
            }
        }
    }
}

impl Replicator {
    pub fn new(
        state: AppState,
        leader: watch::Receiver<bool>,
        settings: Settings,
        metrics: Metrics,
    ) -> Arc<Replicator> {
        Arc::new(Replicator {
            client: PeerClient::new(
                settings.connect_timeout,
                settings.read_timeout,
                &settings.replica_id,
                settings.tls.as_ref(),
            ),
            state,
            leader,
            peers: Mutex::new(HashMap::new()),
            settings,
            metrics,
        })
    }

    pub fn client(&self) -> &PeerClient {
        &self.client
    }

    fn enqueue(&self, q: &PeerQueue, record: Replication, now: Instant) {
        let len = {
            let mut b = q.batcher.lock();
            b.push(record, now);
            b.len()
        };
        q.queued.set(len as i64);
        q.notify.notify_one();
    }

    /// Applies a new peer list: starts senders for new peers, stops those of removed ones.
    pub fn set_peers(self: &Arc<Self>, peers: Vec<(PeerUrl, PeerKind)>) {
        let mut current = self.peers.lock();
        let wanted: HashSet<String> = peers.iter().map(|(u, _)| u.base.clone()).collect();
        current.retain(|url, q| {
            let keep = wanted.contains(url);
            if !keep {
                q.stopped.store(true, std::sync::atomic::Ordering::Release);
                q.notify.notify_one();
                tracing::info!(peer = %url, "peer removed");
            }
            keep
        });
        for (url, kind) in peers {
            if current.contains_key(&url.base) {
                continue;
            }
            tracing::info!(peer = %url.display(), kind = kind.as_str(), "peer added");
            let q = Arc::new(PeerQueue {
                url: url.clone(),
                kind,
                batcher: Mutex::new(Batcher::new(self.settings.limits)),
                notify: Notify::new(),
                stopped: std::sync::atomic::AtomicBool::new(false),
                queued: self
                    .metrics
                    .queued
                    .get_or_create(&PeerLabels {
                        peer: url.display().to_string(),
                        kind: kind.as_str(),
                    })
                    .clone(),
            });
            current.insert(url.base.clone(), q.clone());
            tokio::spawn(self.clone().sender(q));
        }
    }

    /// Sends one peer's batches until the peer is removed.
    async fn sender(self: Arc<Self>, q: Arc<PeerQueue>) {
        let mut backoff = Backoff::default();
        let labels = q.labels();
        loop {
            if q.stopped.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            let due = q.batcher.lock().due_at();
            let notified = q.notify.notified();
            match due {
                None => {
                    notified.await;
                    continue;
                }
                Some(at) if at > Instant::now() => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = notified => continue,
                    }
                }
                Some(_) => {}
            }
            let (batch, dropped) = {
                let mut b = q.batcher.lock();
                let before = b.dropped;
                let batch = b.take(Instant::now());
                let after = b.dropped;
                q.queued.set(b.len() as i64);
                (
                    batch,
                    (after.expired - before.expired) + (after.overflow - before.overflow),
                )
            };
            if dropped > 0 {
                self.metrics.dropped.get_or_create(&labels).inc_by(dropped);
            }
            if batch.is_empty() {
                continue;
            }
            let refs: Vec<&Replication> = batch.iter().collect();
            match self.client.send(&q.url, &refs, q.kind == PeerKind::Replica).await {
                Ok(responses) => {
                    backoff.success();
                    self.metrics.batches.get_or_create(&labels).inc();
                    self.metrics.sent.get_or_create(&labels).inc_by(batch.len() as u64);
                    if responses.len() == batch.len() {
                        for (record, response) in batch.iter().zip(responses) {
                            self.handle_answer(&q, record, response.status_code, response.entity);
                        }
                    } else {
                        tracing::warn!(peer = %q.url.display(), "a peer answered a batch with the wrong number of items");
                    }
                }
                Err(e) => {
                    let class = e.class();
                    self.metrics
                        .failures
                        .get_or_create(&FailureLabels {
                            peer: labels.peer.clone(),
                            class: failure_label(class),
                        })
                        .inc();
                    let delay = backoff.failure(class);
                    if class == Failure::Permanent {
                        tracing::warn!(error = %e, items = batch.len(), "dropped a replication batch");
                        self.metrics.dropped.get_or_create(&labels).inc_by(batch.len() as u64);
                    } else {
                        tracing::debug!(error = %e, retry_in = ?delay, "replication batch failed; will retry");
                        q.batcher.lock().requeue(batch, Instant::now());
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
    }

    /// Acts on one item's answer, as Java's `PeerEurekaNode` does.
    fn handle_answer(&self, q: &PeerQueue, record: &Replication, status: u16, entity: Option<InstanceInfo>) {
        match (record.action, status) {
            (_, 200..=299) => {}
            (Action::Heartbeat, 404) => {
                // The peer does not know the instance (or ours is newer): send our copy.
                let copy = self
                    .state
                    .with_registry(|r, now| r.instance(&record.app, &record.id, now));
                if let Some(view) = copy {
                    self.enqueue(q, register_record(&view, record.source), Instant::now());
                }
            }
            (Action::Heartbeat, _) if entity.is_some() => {
                // The peer's copy is newer: take it (as replication: it goes no further).
                // Its overriddenStatus, if any, becomes ours through the registration.
                let Some(info) = entity else { return };
                let outcome = self.state.apply(
                    Command::Register {
                        info,
                        source: Source::Peer,
                    },
                    Writer::Replica,
                );
                tracing::debug!(id = %record.id, reply = ?outcome.reply, "took a peer's newer copy");
                self.metrics.forwarded_conflicts.inc();
            }
            (Action::Cancel, 404) => {}
            (action, code) => {
                tracing::debug!(peer = %q.url.display(), ?action, id = %record.id, code, "a peer refused a replicated write");
            }
        }
    }

    /// The leader's periodic work toward peers: heartbeats for pod instances to Java peers, and
    /// the registry comparison that repairs what partitions lost.
    pub async fn run_leader_jobs(self: Arc<Self>, kubernetes_synced: Arc<std::sync::atomic::AtomicBool>) {
        let mut leader = self.leader.clone();
        let mut heartbeat = tokio::time::interval(self.settings.java_heartbeat_interval);
        let mut compare = tokio::time::interval(self.settings.anti_entropy_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        compare.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        compare.tick().await;
        loop {
            tokio::select! {
                changed = leader.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if *leader.borrow_and_update() {
                        // Newly leading: Java peers get every pod instance now.
                        self.push_pods_to_java(Action::Register);
                    }
                }
                _ = heartbeat.tick() => {
                    if *leader.borrow() {
                        self.push_pods_to_java(Action::Heartbeat);
                    }
                }
                _ = compare.tick() => {
                    if *leader.borrow() {
                        let synced = kubernetes_synced.load(std::sync::atomic::Ordering::Acquire);
                        self.compare_with_peers(synced).await;
                    }
                }
            }
        }
    }

    fn java_queues(&self) -> Vec<Arc<PeerQueue>> {
        self.peers
            .lock()
            .values()
            .filter(|q| q.kind == PeerKind::Java)
            .cloned()
            .collect()
    }

    fn push_pods_to_java(&self, action: Action) {
        let queues = self.java_queues();
        if queues.is_empty() {
            return;
        }
        let pods = self.state.with_registry(|r, _| r.pod_instances());
        let now = Instant::now();
        for (_, view) in pods {
            let record = match action {
                Action::Register => register_record(&view, Source::Client),
                _ => Replication {
                    action: Action::Heartbeat,
                    app: view.info.app.clone(),
                    id: view.id().to_string(),
                    last_dirty_timestamp: Some(view.info.last_dirty_timestamp),
                    status: Some(view.info.status),
                    overridden_status: (view.info.overridden_status != Status::Unknown)
                        .then_some(view.info.overridden_status),
                    instance: None,
                    origin: OriginKind::Pod,
                    source: Source::Client,
                },
            };
            for q in &queues {
                self.enqueue(q, record.clone(), now);
            }
        }
    }

    /// Anti-entropy: replicas get what they lack and lose what we no longer have; Java peers lose
    /// pod instances of this cluster that we no longer have (only once the Kubernetes caches have
    /// synced, so a restart can never remove what the watch has not listed yet).
    async fn compare_with_peers(&self, kubernetes_synced: bool) {
        let queues: Vec<Arc<PeerQueue>> = self.peers.lock().values().cloned().collect();
        let horizon_ms = 2 * self.settings.limits.max_age.as_millis() as i64;
        for q in queues {
            let theirs = match self.client.fetch(&q.url, q.kind == PeerKind::Replica).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(peer = %q.url.display(), error = %e, "could not compare registries");
                    continue;
                }
            };
            let (ours, now) = self.state.with_registry(|r, now| (r.full_view(), now));
            let ours: HashMap<(String, String), &InstanceView> = ours
                .apps
                .iter()
                .flat_map(|a| a.instances.iter())
                .map(|i| ((i.info.app.clone(), i.id().to_string()), i))
                .collect();
            let theirs_keys: HashSet<(String, String)> =
                theirs.iter().map(|i| (i.app.clone(), i.id().to_string())).collect();
            let at = Instant::now();
            match q.kind {
                PeerKind::Replica => {
                    for (key, view) in &ours {
                        if view.origin != OriginKind::Pod && !theirs_keys.contains(key) {
                            self.enqueue(&q, register_record(view, Source::Client), at);
                        }
                    }
                    for info in &theirs {
                        let key = (info.app.clone(), info.id().to_string());
                        let stale = now - info.last_updated_timestamp > horizon_ms;
                        if !ours.contains_key(&key) && stale && !self.owned(info) {
                            tracing::info!(peer = %q.url.display(), id = %key.1, "removing an entry a replica kept after a partition");
                            self.enqueue(&q, cancel_record(info, Source::Expiry, OriginKind::Native), at);
                        }
                    }
                }
                PeerKind::Java if kubernetes_synced => {
                    for info in theirs.iter().filter(|i| self.owned(i)) {
                        let key = (info.app.clone(), info.id().to_string());
                        if !ours.get(&key).is_some_and(|v| v.origin == OriginKind::Pod) {
                            tracing::info!(peer = %q.url.display(), id = %key.1, "removing a pod instance this cluster no longer has");
                            self.enqueue(&q, cancel_record(info, Source::Client, OriginKind::Pod), at);
                        }
                    }
                }
                PeerKind::Java => {}
            }
        }
    }

    /// Whether an instance is a pod instance written by this cluster's operator.
    pub fn owned(&self, info: &InstanceInfo) -> bool {
        owned_by(info, &self.settings.cluster_id)
    }
}

/// Whether `info` carries this cluster's ownership metadata.
pub fn owned_by(info: &InstanceInfo, cluster_id: &str) -> bool {
    use crate::k8s::plan::keys;
    info.metadata.get(keys::OWNER) == Some(keys::OWNER_VALUE) && info.metadata.get(keys::CLUSTER) == Some(cluster_id)
}

fn failure_label(class: Failure) -> &'static str {
    match class {
        Failure::Congestion => "congestion",
        Failure::Network => "network",
        Failure::Permanent => "permanent",
    }
}

fn register_record(view: &InstanceView, source: Source) -> Replication {
    Replication {
        action: Action::Register,
        app: view.info.app.clone(),
        id: view.id().to_string(),
        last_dirty_timestamp: Some(view.info.last_dirty_timestamp),
        status: Some(view.info.status),
        overridden_status: None,
        instance: Some(view.clone()),
        origin: view.origin,
        source,
    }
}

fn cancel_record(info: &InstanceInfo, source: Source, origin: OriginKind) -> Replication {
    Replication {
        action: Action::Cancel,
        app: info.app.clone(),
        id: info.id().to_string(),
        last_dirty_timestamp: None,
        status: None,
        overridden_status: None,
        instance: None,
        origin,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(source: Source, origin: OriginKind) -> Replication {
        Replication {
            action: Action::Register,
            app: "A".into(),
            id: "i".into(),
            last_dirty_timestamp: None,
            status: None,
            overridden_status: None,
            instance: None,
            origin,
            source,
        }
    }

    #[test]
    fn routing_never_echoes() {
        use OriginKind::*;
        let t = |replicas, java| Targets { replicas, java };
        // A client's write: everyone.
        assert_eq!(
            route(&rec(Source::Client, Native), &Writer::Client, false),
            t(true, true)
        );
        // Replicated by one of our replicas: nobody (it already told everyone).
        assert_eq!(
            route(&rec(Source::Peer, Native), &Writer::Replica, true),
            t(false, false)
        );
        // Replicated by a Java peer: our replicas only, never back to Java.
        assert_eq!(
            route(&rec(Source::Peer, Replicated), &Writer::ForeignPeer, true),
            t(true, false)
        );
        // Pod instances: Java hears of them from the leader only.
        assert_eq!(
            route(&rec(Source::Client, Pod), &Writer::Controller, false),
            t(false, false)
        );
        assert_eq!(
            route(&rec(Source::Client, Pod), &Writer::Controller, true),
            t(false, true)
        );
        // A REST override on a pod instance: the replicas apply it; Java via the leader.
        assert_eq!(route(&rec(Source::Client, Pod), &Writer::Client, false), t(true, false));
        assert_eq!(route(&rec(Source::Peer, Pod), &Writer::Replica, true), t(false, true));
        // Evictions (leader only) reach the followers.
        assert_eq!(
            route(&rec(Source::Expiry, Native), &Writer::Timer, true),
            t(true, false)
        );
    }
}
