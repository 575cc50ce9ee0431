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
//!   derives them from its own watch); so does the status an adopted instance shows, while a
//!   client's own registration of an adopted instance goes to the replicas only, as the
//!   client's (each replica imposes its pod's status itself);
//! * the leader's evictions go to the replicas (followers do not evict).
//!
//! The leader also keeps Java peers' copies of pod instances alive with heartbeats, and
//! periodically compares registries with peers to repair what a partition lost.
//!
//! The senders. Each peer has a queue ([`batcher::Batcher`] behind a short mutex, shared with the
//! writes that fill it) and a sender: a task [`Replicator::run`] owns in a `JoinSet` (a sender
//! that panics fails the replicator, which the supervisor owns). The sender owns its side of
//! the peer: the receiving end of a one-slot wake channel, its backoff, and two
//! `CancellationToken`s, which are how it is told what to do:
//! * *wake*: a write enqueued a task (`try_send`, so an enqueue never waits and wakes merge); the
//!   sender looks again at when the next batch is due (when the queue holds [`batcher::MAX_BATCH`]
//!   tasks, else when its oldest has waited `--replication-max-batching-delay-ms`);
//! * *stop*, one token per peer: the peer left the list; its sender ends at its next wait (a
//!   batch already on its way is finished and answered first) and its queue goes with it;
//! * *flush*, one token for all: the process is stopping; every sender sends what is queued at
//!   once, without retries, and ends when its queue is empty. `run` waits for them up to
//!   `--replication-flush-timeout-ms`, then aborts those still at it.
//!
//! Why the queue is not itself a channel (of tasks, batched by a stream combinator such as
//! `chunks_timeout`), and the sender's loop is written by hand: tasks are enqueued under the
//! registry lock, so an enqueue must never wait; a newer task replaces a pending one with the
//! same key; a full queue drops its oldest tasks, not the newest; and a failed batch goes back in
//! front with its tasks' first enqueue times, so they age out during an outage however often they
//! are retried. A channel keeps what it was given, in order, until it is read; all of that would
//! have to be redone behind it. So the queue stays a pure state machine under a synchronous
//! lock, and only the signals are a channel and tokens.

pub mod batcher;
pub mod client;
pub mod peers;
pub mod repair;
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
    sync::{mpsc, watch},
    task::JoinSet,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use batcher::{Batcher, Failure, Limits, PeerBackoff, Taken};
use client::{PeerClient, PeerUrl};
use sync::Retries;

use crate::{
    health::{Condition, Health},
    registry::{
        Command, PeerKind, Replication, ReplicationAction, Writer,
        instance::InstanceInfo,
        view::{InstanceView, Origin},
    },
    state::{AppState, OutcomeListener},
    supervisor::{Expect, Shutdown, Supervisor},
};

/// What the replication subsystem needs from the rest of the process.
pub struct ReplicationWiring {
    pub state: AppState,
    pub leader: crate::leadership::Leader,
    pub health: Arc<Health>,
    /// The peer list (from the peers subsystem).
    pub peers: watch::Receiver<Vec<Peer>>,
    /// True once the peer list holds the first list of discovered replicas; the start-up sync
    /// waits for it.
    pub listed: watch::Receiver<bool>,
    /// This cluster's id (`None` until known; stays `None` without Kubernetes).
    pub cluster_id: watch::Receiver<Option<String>>,
    /// Whether a cluster is configured (then the sync waits for the cluster id).
    pub in_cluster: bool,
    /// Met when the start-up sync is done.
    pub synced: Condition,
}

/// Starts replication: the replicator and its senders, the leader's jobs, and the start-up sync
/// (which opens the registry for traffic).
pub fn start(
    settings: ReplicationConfig,
    retries: Retries,
    wiring: ReplicationWiring,
    metrics: ReplicationMetrics,
    supervisor: &mut Supervisor,
) -> Arc<Replicator> {
    let replicator = Replicator::new(
        wiring.state.clone(),
        wiring.leader,
        settings,
        metrics,
        wiring.health.clone(),
        wiring.cluster_id.clone(),
    );
    wiring.state.add_listener(replicator.clone());
    supervisor.spawn(
        "replication",
        Expect::RunsForever,
        replicator.clone().run(wiring.peers.clone(), supervisor.shutdown()),
    );
    supervisor.spawn(
        "replication leader jobs",
        Expect::RunsForever,
        replicator
            .clone()
            .run_leader_jobs(wiring.health.clone(), supervisor.shutdown()),
    );
    let r = replicator.clone();
    let shutdown = supervisor.shutdown();
    supervisor.spawn("start-up sync", Expect::Finishes, async move {
        tokio::select! {
            _ = shutdown.wait() => Ok(()),
            count = startup_sync(&r, retries, wiring.peers, wiring.listed, wiring.cluster_id, wiring.in_cluster, &wiring.synced) => {
                r.state.open_for_traffic(count);
                wiring.synced.met();
                tracing::info!(instances = count, "registry open for traffic");
                Ok(())
            }
        }
    });
    replicator
}

/// Waits for the replica list and the cluster id, then syncs from the ready peers.
async fn startup_sync(
    r: &Replicator,
    retries: Retries,
    peers: watch::Receiver<Vec<Peer>>,
    mut listed: watch::Receiver<bool>,
    mut cluster_id: watch::Receiver<Option<String>>,
    in_cluster: bool,
    synced: &Condition,
) -> i64 {
    synced.waiting("waiting for the replica list");
    let listed = tokio::time::timeout(Duration::from_secs(30), async {
        listed.wait_for(|done| *done).await.map(|_| ())
    })
    .await;
    if listed.is_err() {
        tracing::warn!("the replica list did not arrive in 30 s; syncing from the static peers only");
    }
    if in_cluster {
        synced.waiting("waiting for the cluster id");
        let _ = cluster_id.wait_for(Option::is_some).await.map(|_| ());
    }
    let sources: Vec<Peer> = peers.borrow().iter().filter(|p| p.ready).cloned().collect();
    synced.waiting(format!("syncing from {} peers", sources.len()));
    let id = cluster_id.borrow().clone();
    sync::sync(&r.state, &r.client, &sources, id.as_deref(), retries).await
}

/// Where one record goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Targets {
    pub replicas: bool,
    pub java: bool,
}

/// Pure: the peers a record is for, given who wrote it, the instance's origin, and whether we lead.
pub fn route(record: &Replication, leader: bool) -> Targets {
    let pod = record.origin == Origin::Pod;
    let adopted_registration = record.origin == Origin::Adopted && record.action == ReplicationAction::Register;
    let (replicas, java) = match record.writer {
        // The leader's evictions: followers do not evict themselves.
        Writer::Expiry => (true, false),
        // Java peers replicate to one of us; the others learn it from that one.
        Writer::Peer(PeerKind::Java) => (true, false),
        // Our replica already told everyone; pod changes reach Java through the leader.
        Writer::Peer(PeerKind::Replica) => (false, pod && leader),
        // Every replica derives pod instances itself; Java hears of them from the leader.
        Writer::Controller => (false, leader),
        // A REST override on a pod instance: the replicas apply it; Java via the leader.
        Writer::Client if pod => (true, leader),
        // The client's word: Java gets the status shown, from the leader (a controller record).
        Writer::Client if adopted_registration => (true, false),
        Writer::Client => (true, true),
    };
    Targets { replicas, java }
}

/// Replication settings (validated by `config`).
#[derive(Clone, Debug)]
pub struct ReplicationConfig {
    /// Each peer queue's bounds.
    pub limits: Limits,
    /// Connect timeout toward peers.
    pub connect_timeout: Duration,
    /// Read timeout toward peers (a timeout counts as congestion).
    pub read_timeout: Duration,
    /// This replica's name, sent to our replicas in [`client::REPLICA_HEADER`].
    pub replica_id: String,
    /// What our replicas authenticate with (`--peer-auth-*`, else `--basic-auth-*`).
    pub credentials: Option<(String, String)>,
    /// How often the leader heartbeats pod instances to Java peers.
    pub java_heartbeat_interval: Duration,
    /// How often the leader compares registries with peers.
    pub anti_entropy_interval: Duration,
    /// On shutdown, how long to keep sending what is queued.
    pub flush_timeout: Duration,
    /// How `https://` peers are verified (the system roots when `None`).
    pub tls: Option<crate::tls::PeerTls>,
}

/// A server to replicate to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its Eureka base URL (and credentials from the URL, if any).
    pub url: PeerUrl,
    /// One of our replicas, or a Java Eureka server.
    pub kind: PeerKind,
    /// Whether it reports ready (only ready peers are sources for the start-up sync).
    pub ready: bool,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    peer: String,
    reason: &'static str,
}

/// Replication metrics, labelled by peer.
#[derive(Clone, Default)]
pub struct ReplicationMetrics {
    /// Tasks waiting per peer.
    queued: Family<PeerLabels, Gauge>,
    /// Tasks delivered per peer.
    sent: Family<PeerLabels, Counter>,
    /// Batches delivered per peer.
    batches: Family<PeerLabels, Counter>,
    /// Failed batches per peer and failure class.
    failures: Family<FailureLabels, Counter>,
    /// Tasks dropped per peer and reason (`overflow`, `expired`, `refused`, `peer_removed`).
    dropped: Family<DropLabels, Counter>,
    /// 1 once the peer answered, 0 once it could not be reached (refused, reset, connect
    /// timeout); no series before the first attempt.
    reachable: Family<PeerLabels, Gauge>,
    /// Newer copies taken from peers' 409 answers.
    pub conflicts_resolved: Counter,
    /// Entries repaired by the anti-entropy comparison, by what was done.
    pub repairs: Family<RepairLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    pub action: &'static str,
}

impl ReplicationMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        drop(self.dropped.get_or_create(&DropLabels {
            peer: String::new(),
            reason: "peer_removed",
        }));
        for action in repair::REPAIR_ACTIONS {
            drop(self.repairs.get_or_create(&RepairLabels { action }));
        }
        let r = registry.sub_registry_with_prefix("replication");
        r.register("queued", "Replication tasks waiting per peer", self.queued.clone());
        r.register("sent_items", "Replication tasks delivered per peer", self.sent.clone());
        r.register("batches", "Batches delivered per peer", self.batches.clone());
        r.register("failures", "Failed batches per peer and class", self.failures.clone());
        r.register(
            "peer_up",
            "1 once the peer answered (any answer), 0 once it could not be reached (refused, reset, connect timeout)",
            self.reachable.clone(),
        );
        r.register(
            "dropped",
            "Tasks dropped per peer: queue full (overflow), older than --max-time-for-replication (expired), refused by the peer; and, without a peer label, left by peers that left the list (peer_removed: their series go with them)",
            self.dropped.clone(),
        );
        r.register(
            "conflicts_resolved",
            "Newer copies taken from peers' 409 answers",
            self.conflicts_resolved.clone(),
        );
        r.register(
            "repairs",
            "Entries repaired by the leader's registry comparison",
            self.repairs.clone(),
        );
    }

    /// Every failure class and drop reason of a new peer starts at 0, so that a query or an
    /// alert on them has a series to read (and `increase` sees the first failure).
    fn peer_added(&self, labels: &PeerLabels) {
        drop(self.sent.get_or_create(labels));
        drop(self.batches.get_or_create(labels));
        let peer = labels.peer.as_str();
        for class in FAILURE_CLASSES {
            drop(self.failures.get_or_create(&FailureLabels {
                peer: peer.to_string(),
                class: failure_label(class),
            }));
        }
        for reason in PEER_DROP_REASONS {
            drop(self.dropped.get_or_create(&DropLabels {
                peer: peer.to_string(),
                reason,
            }));
        }
    }

    /// A peer left the list: every series labelled with it goes (peers come and go with pod IPs;
    /// their series must not pile up), and what it left unsent is counted under `peer_removed`
    /// without a peer label.
    fn peer_removed(&self, labels: &PeerLabels, unsent: u64) {
        self.dropped("", "peer_removed", unsent);
        self.queued.remove(labels);
        self.reachable.remove(labels);
        self.sent.remove(labels);
        self.batches.remove(labels);
        for class in FAILURE_CLASSES {
            self.failures.remove(&FailureLabels {
                peer: labels.peer.clone(),
                class: failure_label(class),
            });
        }
        for reason in PEER_DROP_REASONS {
            self.dropped.remove(&DropLabels {
                peer: labels.peer.clone(),
                reason,
            });
        }
    }

    fn dropped(&self, peer: &str, reason: &'static str, n: u64) {
        if n > 0 {
            self.dropped
                .get_or_create(&DropLabels {
                    peer: peer.to_string(),
                    reason,
                })
                .inc_by(n);
        }
    }
}

/// One peer's queue: filled by writes (under the registry lock), emptied by the peer's sender.
struct PeerQueue {
    url: PeerUrl,
    kind: PeerKind,
    /// The pending tasks (a short synchronous lock: enqueues happen under the registry lock).
    batcher: Mutex<Batcher>,
    /// Wakes the sender when a task arrives. One slot: an enqueue never waits, and a wake sent
    /// while another is pending merges into it.
    wake: mpsc::Sender<()>,
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

    /// The source name of this peer's warnings in `/readyz`.
    fn health_source(&self) -> String {
        format!("replication to {}", self.url.display())
    }
}

/// The replicator. Add it as an [`OutcomeListener`] of the state, and run [`Replicator::run`].
pub struct Replicator {
    state: AppState,
    client: PeerClient,
    /// Whether this replica holds the Lease (pod instances go to Java from the leader only).
    leader: crate::leadership::Leader,
    /// One queue per peer, by base URL.
    queues: Mutex<HashMap<String, Arc<PeerQueue>>>,
    settings: ReplicationConfig,
    metrics: ReplicationMetrics,
    /// Where peer problems (refused credentials) are reported.
    health: Arc<Health>,
    /// This cluster's id, once known (names this cluster's pod instances on peers).
    cluster_id: watch::Receiver<Option<String>>,
}

impl OutcomeListener for Replicator {
    fn on_outcome(&self, outcome: &crate::registry::Outcome) {
        if outcome.replicate.is_empty() {
            return;
        }
        let queues = self.queues.lock();
        if queues.is_empty() {
            // No peers (a single replica, the standalone server), and every heartbeat comes here.
            return;
        }
        let leader = self.leader.borrow().holds();
        let now = Instant::now();
        for record in &outcome.replicate {
            let targets = route(record, leader);
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
        leader: crate::leadership::Leader,
        settings: ReplicationConfig,
        metrics: ReplicationMetrics,
        health: Arc<Health>,
        cluster_id: watch::Receiver<Option<String>>,
    ) -> Arc<Replicator> {
        Arc::new(Replicator {
            client: PeerClient::from_config(&settings),
            state,
            leader,
            queues: Mutex::new(HashMap::new()),
            settings,
            metrics,
            health,
            cluster_id,
        })
    }

    pub fn client(&self) -> &PeerClient {
        &self.client
    }

    /// Whether an instance is a pod instance written by this cluster's operator.
    pub fn owned(&self, info: &InstanceInfo) -> bool {
        self.cluster_id.borrow().as_deref().is_some_and(|c| owned_by(info, c))
    }

    fn enqueue(&self, q: &PeerQueue, record: Replication, now: Instant) {
        let len = {
            let mut b = q.batcher.lock();
            b.push(record, now);
            b.len()
        };
        q.queued.set(len as i64);
        // Full: a wake is already pending. Closed: the sender has ended (the peer left the list,
        // or the process is stopping), and the task goes with the queue.
        let _ = q.wake.try_send(());
    }

    /// Keeps one sender per peer in line with `peers` until shutdown; then flushes the queues
    /// (at most `flush_timeout`). A sender that panics fails the replicator (and the process).
    #[tracing::instrument(name = "replicator", skip_all)]
    pub async fn run(self: Arc<Self>, mut peers: watch::Receiver<Vec<Peer>>, shutdown: Shutdown) -> anyhow::Result<()> {
        let mut senders = Senders::default();
        let stop = shutdown.clone().wait();
        tokio::pin!(stop);
        loop {
            let list = peers.borrow_and_update().clone();
            self.set_peers(&list, &mut senders);
            tokio::select! {
                changed = peers.changed() => {
                    if changed.is_err() {
                        // The peer list's owner stopped: only happens at shutdown.
                        stop.as_mut().await;
                        break;
                    }
                }
                Some(joined) = senders.tasks.join_next() => {
                    if let Err(e) = joined && e.is_panic() {
                        anyhow::bail!("failed to keep replicating: a peer sender panicked: {e}");
                    }
                }
                _ = &mut stop => break,
            }
        }
        self.flush(senders).await;
        Ok(())
    }

    /// Applies a peer list: starts senders for new peers, stops those of removed ones (whose
    /// queues go with them).
    fn set_peers(self: &Arc<Self>, peers: &[Peer], senders: &mut Senders) {
        let mut current = self.queues.lock();
        let wanted: HashSet<&str> = peers.iter().map(|p| p.url.base.as_str()).collect();
        current.retain(|url, q| {
            let keep = wanted.contains(url.as_str());
            if !keep {
                if let Some(stop) = senders.stops.remove(url) {
                    stop.cancel();
                }
                self.health.clear(&q.health_source());
                // What it still held will not be sent: counted, and its queue gauge goes.
                let left = q.batcher.lock().len() as u64;
                self.metrics.peer_removed(&q.labels(), left);
                tracing::info!(peer = %url, unsent = left, "peer removed");
            }
            keep
        });
        for peer in peers {
            if current.contains_key(&peer.url.base) {
                continue;
            }
            tracing::info!(peer = %peer.url.display(), kind = peer.kind.as_str(), "peer added");
            self.metrics.peer_added(&PeerLabels {
                peer: peer.url.display().to_string(),
                kind: peer.kind.as_str(),
            });
            let (wake, woken) = mpsc::channel(1);
            let q = Arc::new(PeerQueue {
                url: peer.url.clone(),
                kind: peer.kind,
                batcher: Mutex::new(Batcher::new(self.settings.limits)),
                wake,
                queued: self
                    .metrics
                    .queued
                    .get_or_create(&PeerLabels {
                        peer: peer.url.display().to_string(),
                        kind: peer.kind.as_str(),
                    })
                    .clone(),
            });
            let stop = CancellationToken::new();
            current.insert(peer.url.base.clone(), q.clone());
            senders.stops.insert(peer.url.base.clone(), stop.clone());
            let sender = PeerSender {
                replicator: self.clone(),
                labels: q.labels(),
                q,
                woken,
                stop,
                flush: senders.flush.clone(),
                backoff: PeerBackoff::default(),
                unauthorized: false,
            };
            senders.tasks.spawn(sender.run());
        }
    }

    /// On shutdown: every sender sends what is queued without waiting to batch more and ends
    /// once its queue is empty; those still at it when the flush timeout passes are aborted.
    async fn flush(&self, mut senders: Senders) {
        let queued = || {
            self.queues_of(None)
                .iter()
                .map(|q| q.batcher.lock().len())
                .sum::<usize>()
        };
        let before = queued();
        senders.flush.cancel();
        let deadline = Instant::now() + self.settings.flush_timeout;
        let _ = tokio::time::timeout_at(deadline, async { while senders.tasks.join_next().await.is_some() {} }).await;
        // What is still queued, and one for each sender still at it (a batch on its way).
        let left = queued() + senders.tasks.len();
        senders.tasks.abort_all();
        while senders.tasks.join_next().await.is_some() {}
        if left > 0 {
            tracing::warn!(
                left,
                flushed = before.saturating_sub(left),
                "shutting down with replication tasks unsent"
            );
        } else if before > 0 {
            tracing::info!(flushed = before, "replication queues flushed");
        }
    }

    /// Counts a delivered batch and handles the peer's answer to each of its items.
    fn delivered(
        &self,
        q: &PeerQueue,
        labels: &PeerLabels,
        batch: &[Taken],
        responses: Vec<crate::codec::batch::PeerResponse>,
    ) {
        self.metrics.batches.get_or_create(labels).inc();
        self.metrics.sent.get_or_create(labels).inc_by(batch.len() as u64);
        if responses.len() != batch.len() {
            tracing::warn!(peer = %q.url.display(), "a peer answered a batch with the wrong number of items");
            return;
        }
        for (task, response) in batch.iter().zip(responses) {
            self.handle_answer(q, &task.record, response.status_code, response.entity);
        }
    }

    /// Takes the next batch; counts and logs what aged out or overflowed meanwhile.
    fn take(&self, q: &PeerQueue) -> Vec<Taken> {
        let (batch, before, after, len) = {
            let mut b = q.batcher.lock();
            let before = b.dropped;
            let batch = b.take(Instant::now());
            (batch, before, b.dropped, b.len())
        };
        q.queued.set(len as i64);
        let peer = q.url.display();
        let expired = after.expired - before.expired;
        let overflow = after.overflow - before.overflow;
        if expired > 0 {
            tracing::warn!(peer, dropped = expired, max_age = ?self.settings.limits.max_age,
                "dropped replication tasks older than --max-time-for-replication");
        }
        if overflow > 0 {
            tracing::warn!(
                peer,
                dropped = overflow,
                "dropped replication tasks: the peer's queue was full"
            );
        }
        self.metrics.dropped(peer, "expired", expired);
        self.metrics.dropped(peer, "overflow", overflow);
        batch
    }

    /// Acts on one item's answer, as Java's `PeerEurekaNode` does.
    fn handle_answer(&self, q: &PeerQueue, record: &Replication, status: u16, entity: Option<InstanceInfo>) {
        match (record.action, status) {
            (_, 200..=299) => {}
            (ReplicationAction::Heartbeat, 404) => {
                // The peer does not know the instance (or ours is newer): send our copy (to a
                // replica, an adopted instance as its client registered it).
                let copy = self.state.with_registry(|r, now| match q.kind {
                    PeerKind::Replica => r.replica_view(&record.app, &record.id),
                    PeerKind::Java => r.instance(&record.app, &record.id, now),
                });
                if let Some(view) = copy {
                    self.enqueue(q, register_record(&view, record.writer), Instant::now());
                }
            }
            (ReplicationAction::Heartbeat, _) if entity.is_some() => {
                // The peer's copy is newer: take it, as a replicated write from that peer.
                // Its overriddenStatus, if any, becomes ours through the registration.
                let Some(info) = entity else { return };
                if record.origin == Origin::Pod || self.owned(&info) {
                    // Our pod instances come from our watch, never from a peer: a Java peer's copy
                    // stamped by a former leader, answered after the pod went, would otherwise
                    // come back as a replicated instance of a deleted pod.
                    tracing::debug!(id = %record.id, "ignored a peer's copy of one of our pod instances");
                    return;
                }
                let outcome = self.state.apply(Command::Register {
                    info,
                    writer: Writer::Peer(q.kind),
                });
                tracing::debug!(id = %record.id, reply = ?outcome.reply, "took a peer's newer copy");
                self.metrics.conflicts_resolved.inc();
            }
            (ReplicationAction::Cancel, 404) => {}
            (action, code) => {
                tracing::debug!(peer = %q.url.display(), ?action, id = %record.id, code, "a peer refused a replicated write");
            }
        }
    }

    fn queues_of(&self, kind: Option<PeerKind>) -> Vec<Arc<PeerQueue>> {
        self.queues
            .lock()
            .values()
            .filter(|q| kind.is_none_or(|k| q.kind == k))
            .cloned()
            .collect()
    }
}

/// What [`Replicator::run`] holds of the senders: their tasks, the token that stops each, and
/// the one that flushes them all.
#[derive(Default)]
struct Senders {
    tasks: JoinSet<()>,
    /// By peer base URL: cancelled when the peer leaves the list.
    stops: HashMap<String, CancellationToken>,
    /// Cancelled on shutdown: every sender sends what is queued, then ends.
    flush: CancellationToken,
}

/// One peer's sender, run as a task of [`Senders`]: waits for the next batch to be due, sends
/// it, acts on the answers, backs off after a failure.
struct PeerSender {
    replicator: Arc<Replicator>,
    q: Arc<PeerQueue>,
    labels: PeerLabels,
    /// A task arrived.
    woken: mpsc::Receiver<()>,
    /// The peer left the list: end at the next wait (a batch on its way is finished first).
    stop: CancellationToken,
    /// The process is stopping: send what is queued at once and without retries, then end.
    flush: CancellationToken,
    backoff: PeerBackoff,
    /// Whether the last failure was about credentials (to log transitions, not every retry).
    unauthorized: bool,
}

impl PeerSender {
    /// Sends this peer's batches until the peer is removed, or its queue is flushed.
    async fn run(mut self) {
        while let Some(batch) = self.next_batch().await {
            self.send(batch).await;
        }
    }

    /// Waits until the next batch is due (at once while flushing) and takes it; `None` when the
    /// sender is to end: the peer was removed, or the queue is flushed.
    async fn next_batch(&mut self) -> Option<Vec<Taken>> {
        loop {
            if self.stop.is_cancelled() {
                return None;
            }
            let flushing = self.flush.is_cancelled();
            let due = self.q.batcher.lock().due_at();
            match due {
                None if flushing => return None,
                None => tokio::select! {
                    biased;
                    _ = self.stop.cancelled() => return None,
                    _ = self.flush.cancelled() => continue,
                    Some(()) = self.woken.recv() => continue,
                },
                Some(at) if !flushing && at > Instant::now() => tokio::select! {
                    biased;
                    _ = self.stop.cancelled() => return None,
                    _ = self.flush.cancelled() => {}
                    // A new task may make a full batch: look again.
                    Some(()) = self.woken.recv() => continue,
                    _ = tokio::time::sleep_until(at) => {}
                },
                Some(_) => {}
            }
            let batch = self.replicator.take(&self.q);
            if !batch.is_empty() {
                return Some(batch);
            }
        }
    }

    /// Sends one batch and acts on the peer's answer.
    async fn send(&mut self, batch: Vec<Taken>) {
        let (r, q) = (&self.replicator, &self.q);
        let refs: Vec<&Replication> = batch.iter().map(|t| &t.record).collect();
        let span = tracing::debug_span!("replication_batch", peer = %q.url.display(), items = batch.len());
        let sent = r
            .client
            .send(&q.url, &refs, q.kind == PeerKind::Replica)
            .instrument(span)
            .await;
        match sent {
            Ok(responses) => {
                self.backoff.success();
                r.metrics.reachable.get_or_create(&self.labels).set(1);
                if std::mem::take(&mut self.unauthorized) {
                    tracing::info!(peer = %q.url.display(), "the peer accepts our credentials again");
                    r.health.clear(&q.health_source());
                }
                r.delivered(q, &self.labels, &batch, responses);
            }
            Err(e) => self.failed(batch, e).await,
        }
    }

    /// A batch failed: retried (with its tasks' original ages) after the backoff, unless the
    /// peer refused it for good or the process is stopping.
    async fn failed(&mut self, batch: Vec<Taken>, e: client::Error) {
        let (r, q) = (&self.replicator, &self.q);
        let class = e.class();
        let peer = q.url.display();
        r.metrics
            .failures
            .get_or_create(&FailureLabels {
                peer: peer.to_string(),
                class: failure_label(class),
            })
            .inc();
        let delay = self.backoff.failure(class);
        match class {
            Failure::Network => {
                r.metrics.reachable.get_or_create(&self.labels).set(0);
            }
            // A read timeout is congestion too: reached, but not answering in time.
            Failure::Congestion => {}
            Failure::Unauthorized | Failure::Permanent => {
                r.metrics.reachable.get_or_create(&self.labels).set(1);
            }
        }
        match class {
            Failure::Permanent => {
                tracing::warn!(peer, error = %e, items = batch.len(), "dropped a replication batch the peer refused");
                r.metrics.dropped(peer, "refused", batch.len() as u64);
                return;
            }
            Failure::Unauthorized => {
                if !std::mem::replace(&mut self.unauthorized, true) {
                    tracing::error!(peer, error = %e, "a peer refuses our credentials: replication to it is failing");
                }
                r.health.warn(q.health_source(), e.to_string());
            }
            Failure::Congestion | Failure::Network => {
                tracing::debug!(peer, error = %e, retry_in = ?delay, "replication batch failed; will retry");
            }
        }
        if self.flush.is_cancelled() {
            // Shutting down: no retries (the peer will hear of it through its own sync).
            return;
        }
        q.batcher.lock().requeue(batch);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            // A removed peer's sender ends at once; a flush tries once more at once.
            _ = self.stop.cancelled() => {}
            _ = self.flush.cancelled() => {}
        }
    }
}

/// Whether `info` carries this cluster's ownership metadata.
pub fn owned_by(info: &InstanceInfo, cluster_id: &str) -> bool {
    use crate::registry::instance::keys;
    info.metadata.get(keys::OWNER) == Some(keys::OWNER_VALUE) && info.metadata.get(keys::CLUSTER) == Some(cluster_id)
}

/// Every failure class (each peer's series start at 0).
const FAILURE_CLASSES: [Failure; 4] = [
    Failure::Congestion,
    Failure::Network,
    Failure::Unauthorized,
    Failure::Permanent,
];

/// The drop reasons counted per peer.
const PEER_DROP_REASONS: [&str; 3] = ["overflow", "expired", "refused"];

fn failure_label(class: Failure) -> &'static str {
    match class {
        Failure::Congestion => "congestion",
        Failure::Network => "network",
        Failure::Unauthorized => "unauthorized",
        Failure::Permanent => "permanent",
    }
}

fn register_record(view: &InstanceView, writer: Writer) -> Replication {
    Replication {
        action: ReplicationAction::Register,
        app: view.info.app.to_string(),
        id: view.id().to_string(),
        last_dirty_timestamp: Some(view.info.last_dirty_timestamp),
        status: Some(view.info.status),
        overridden_status: None,
        instance: Some(view.clone()),
        origin: view.origin,
        writer,
    }
}

fn cancel_record(info: &InstanceInfo, writer: Writer, origin: Origin) -> Replication {
    Replication {
        action: ReplicationAction::Cancel,
        app: info.app.to_string(),
        id: info.id().to_string(),
        last_dirty_timestamp: None,
        status: None,
        overridden_status: None,
        instance: None,
        origin,
        writer,
    }
}

#[cfg(test)]
mod tests;
