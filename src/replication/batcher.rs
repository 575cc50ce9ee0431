//! The per-peer replication queue, as a pure state machine: tasks keyed like Java's
//! (`action#APP/id`), a newer task replacing a pending one with the same key (so repeated
//! heartbeats coalesce), a bound with the oldest dropped first, an age limit, batches of at most
//! 250 sent when full or when the oldest has waited long enough, and retry backoff by failure
//! class. Time is passed in.
//!
//! A task's age counts from when the write was first enqueued: a batch that failed goes back
//! with its tasks' original times, so during an outage tasks expire after the age limit however
//! often they were retried, and a `Cancel` older than the limit never reaches a peer. (One held
//! for less than the limit lands after the link heals; it names the `lastDirtyTimestamp` of the
//! copy it removed, so a peer where the instance registered again meanwhile keeps it.)

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use tokio::time::Instant;

use crate::registry::{Replication, ReplicationAction};

/// Java's batch size.
pub const MAX_BATCH: usize = 250;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TaskKey {
    action: ReplicationAction,
    app: String,
    id: String,
}

#[derive(Clone, Debug)]
struct Task {
    /// What to send.
    record: Replication,
    /// When the write was first enqueued (kept across retries).
    enqueued: Instant,
    /// Its place in `order`; an `order` entry with another seq is stale.
    seq: u64,
}

/// A task taken for sending, with the time it was first enqueued (to requeue it on failure).
#[derive(Clone, Debug)]
pub struct Taken {
    pub record: Replication,
    pub enqueued: Instant,
}

/// Limits of one queue.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Pending tasks before the oldest are dropped (`--max-elements-in-peer-replication-pool`).
    pub capacity: usize,
    /// Tasks older than this are dropped, never sent (`--max-time-for-replication`).
    pub max_age: Duration,
    /// Longest a task waits for others to batch with (`--replication-max-batching-delay-ms`).
    pub max_delay: Duration,
}

/// Counters of what the queue did with tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Dropped because the queue was full.
    pub overflow: u64,
    /// Dropped because they were older than the age limit.
    pub expired: u64,
}

/// One peer's pending tasks.
#[derive(Debug)]
pub struct Batcher {
    limits: Limits,
    /// Keys in send order; an entry is stale when its seq is not the task's current seq.
    order: VecDeque<(u64, TaskKey)>,
    tasks: HashMap<TaskKey, Task>,
    next_seq: u64,
    pub dropped: Dropped,
}

impl Batcher {
    pub fn new(limits: Limits) -> Batcher {
        Batcher {
            limits,
            order: VecDeque::new(),
            tasks: HashMap::new(),
            next_seq: 0,
            dropped: Dropped::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Adds a task; a pending task with the same key is replaced and the new one goes last.
    pub fn push(&mut self, record: Replication, now: Instant) {
        let key = TaskKey {
            action: record.action,
            app: record.app.clone(),
            id: record.id.clone(),
        };
        self.next_seq += 1;
        let seq = self.next_seq;
        let replaced = self
            .tasks
            .insert(
                key.clone(),
                Task {
                    record,
                    enqueued: now,
                    seq,
                },
            )
            .is_some();
        self.order.push_back((seq, key));
        if !replaced {
            while self.tasks.len() > self.limits.capacity {
                if let Some(oldest) = self.pop_live() {
                    self.tasks.remove(&oldest.0);
                    self.dropped.overflow += 1;
                }
            }
        }
        self.compact();
    }

    /// The front live entry (key, task), skipping stale ones; it stays in `tasks`.
    fn pop_live(&mut self) -> Option<(TaskKey, u64)> {
        while let Some((seq, key)) = self.order.pop_front() {
            if self.tasks.get(&key).is_some_and(|t| t.seq == seq) {
                return Some((key, seq));
            }
        }
        None
    }

    /// Keeps the order list from growing without bound through replacements.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.tasks.len() + 64 {
            let tasks = &self.tasks;
            self.order
                .retain(|(seq, key)| tasks.get(key).is_some_and(|t| t.seq == *seq));
        }
    }

    fn oldest(&self) -> Option<Instant> {
        self.order
            .iter()
            .find_map(|(seq, key)| self.tasks.get(key).filter(|t| t.seq == *seq).map(|t| t.enqueued))
    }

    /// When the next batch is due (`None` when empty).
    pub fn due_at(&self) -> Option<Instant> {
        let oldest = self.oldest()?;
        Some(if self.tasks.len() >= MAX_BATCH {
            oldest
        } else {
            oldest + self.limits.max_delay
        })
    }

    /// Whether a batch should go now.
    pub fn ready(&self, now: Instant) -> bool {
        self.tasks.len() >= MAX_BATCH || self.oldest().is_some_and(|t| t + self.limits.max_delay <= now)
    }

    /// Takes up to [`MAX_BATCH`] tasks in order, dropping those older than the age limit.
    pub fn take(&mut self, now: Instant) -> Vec<Taken> {
        let mut batch = Vec::new();
        while batch.len() < MAX_BATCH {
            let Some((key, _)) = self.pop_live() else { break };
            let Some(task) = self.tasks.remove(&key) else { continue };
            if now.duration_since(task.enqueued) > self.limits.max_age {
                self.dropped.expired += 1;
                continue;
            }
            batch.push(Taken {
                record: task.record,
                enqueued: task.enqueued,
            });
        }
        batch
    }

    /// Drops every task older than the age limit (so a peer that stays away does not hold on to
    /// writes that may no longer be sent).
    pub fn expire(&mut self, now: Instant) {
        let max_age = self.limits.max_age;
        let before = self.tasks.len();
        self.tasks.retain(|_, t| now.duration_since(t.enqueued) <= max_age);
        self.dropped.expired += (before - self.tasks.len()) as u64;
        self.compact();
    }

    /// Puts a failed batch back in front, with the times its tasks were first enqueued, unless a
    /// newer task for the same key arrived meanwhile.
    pub fn requeue(&mut self, batch: Vec<Taken>) {
        for Taken { record, enqueued } in batch.into_iter().rev() {
            let key = TaskKey {
                action: record.action,
                app: record.app.clone(),
                id: record.id.clone(),
            };
            if self.tasks.contains_key(&key) {
                continue;
            }
            self.next_seq += 1;
            let seq = self.next_seq;
            self.tasks.insert(key.clone(), Task { record, enqueued, seq });
            self.order.push_front((seq, key));
        }
        while self.tasks.len() > self.limits.capacity {
            // Over capacity after a requeue: drop from the back (the newest are re-sent soonest
            // by their senders anyway).
            if let Some((seq, key)) = self.order.pop_back()
                && self.tasks.get(&key).is_some_and(|t| t.seq == seq)
            {
                self.tasks.remove(&key);
                self.dropped.overflow += 1;
            }
        }
    }
}

/// Why a batch failed, and so how long to wait before the next try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// 503 or a read timeout: the peer is busy.
    Congestion,
    /// Connection refused, reset, DNS: the peer is away.
    Network,
    /// 401 or 403: the peer refuses our credentials. Retried (an operator fixes the Secret),
    /// reported in the log, the metrics and `/readyz`, and the tasks age out meanwhile.
    Unauthorized,
    /// Any other answer: retrying will not help; the batch is dropped (and counted).
    Permanent,
}

/// Exponential backoff per peer, reset by a success.
#[derive(Clone, Debug, Default)]
pub struct PeerBackoff {
    failures: u32,
}

impl PeerBackoff {
    /// The longest wait between attempts: a peer that comes back after a partition, however long,
    /// gets the queued writes (and anti-entropy's repairs, queued behind them) within this.
    pub const MAX: Duration = Duration::from_secs(5);

    pub fn success(&mut self) {
        self.failures = 0;
    }

    /// The delay after a failure of this class (Java: 1 s for congestion, 100 ms for network
    /// errors, fixed), doubling with consecutive failures up to [`PeerBackoff::MAX`].
    pub fn failure(&mut self, class: Failure) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let base = match class {
            Failure::Congestion | Failure::Unauthorized => Duration::from_millis(1000),
            Failure::Network => Duration::from_millis(100),
            Failure::Permanent => return Duration::ZERO,
        };
        let factor = 1u32 << (self.failures - 1).min(16);
        base.saturating_mul(factor).min(Self::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Writer, instance::Status, view::Origin};

    fn rec(action: ReplicationAction, id: &str, status: Status) -> Replication {
        Replication {
            action,
            app: "APP".into(),
            id: id.into(),
            last_dirty_timestamp: Some(1),
            status: Some(status),
            overridden_status: None,
            instance: None,
            origin: Origin::Native,
            writer: Writer::Client,
        }
    }

    fn limits(capacity: usize) -> Limits {
        Limits {
            capacity,
            max_age: Duration::from_secs(30),
            max_delay: Duration::from_millis(100),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_heartbeats_coalesce_and_the_newest_goes_last() {
        let t0 = Instant::now();
        let mut b = Batcher::new(limits(100));
        b.push(rec(ReplicationAction::Register, "a", Status::Up), t0);
        b.push(rec(ReplicationAction::Heartbeat, "a", Status::Up), t0);
        b.push(rec(ReplicationAction::Cancel, "a", Status::Up), t0);
        for _ in 0..50 {
            b.push(rec(ReplicationAction::Heartbeat, "b", Status::Up), t0);
        }
        b.push(rec(ReplicationAction::Register, "a", Status::Down), t0);
        assert_eq!(b.len(), 4);
        assert!(!b.ready(t0));
        assert!(b.ready(t0 + Duration::from_millis(100)));
        let batch = b.take(t0);
        let seen: Vec<(ReplicationAction, &str, Option<Status>)> = batch
            .iter()
            .map(|t| (t.record.action, t.record.id.as_str(), t.record.status))
            .collect();
        assert_eq!(
            seen,
            vec![
                (ReplicationAction::Heartbeat, "a", Some(Status::Up)),
                (ReplicationAction::Cancel, "a", Some(Status::Up)),
                (ReplicationAction::Heartbeat, "b", Some(Status::Up)),
                (ReplicationAction::Register, "a", Some(Status::Down)),
            ],
            "a re-registration after a cancel stays after it"
        );
        assert!(b.is_empty());
        assert!(b.order.len() < 10, "the order list is compacted");
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_with_oldest_dropped_and_aged_tasks_expire() {
        let t0 = Instant::now();
        let mut b = Batcher::new(limits(3));
        for id in ["a", "b", "c", "d"] {
            b.push(rec(ReplicationAction::Heartbeat, id, Status::Up), t0);
        }
        assert_eq!(b.len(), 3);
        assert_eq!(b.dropped.overflow, 1);
        let ids: Vec<String> = b.take(t0).into_iter().map(|t| t.record.id).collect();
        assert_eq!(ids, vec!["b", "c", "d"]);
        b.push(rec(ReplicationAction::Heartbeat, "old", Status::Up), t0);
        b.push(
            rec(ReplicationAction::Heartbeat, "new", Status::Up),
            t0 + Duration::from_secs(31),
        );
        let ids: Vec<String> = b
            .take(t0 + Duration::from_secs(31))
            .into_iter()
            .map(|t| t.record.id)
            .collect();
        assert_eq!(ids, vec!["new"]);
        assert_eq!(b.dropped.expired, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn batches_hold_at_most_250_and_a_full_queue_is_ready_at_once() {
        let t0 = Instant::now();
        let mut b = Batcher::new(limits(10_000));
        for n in 0..600 {
            b.push(rec(ReplicationAction::Heartbeat, &n.to_string(), Status::Up), t0);
        }
        assert!(b.ready(t0));
        assert_eq!(b.take(t0).len(), MAX_BATCH);
        assert_eq!(b.take(t0).len(), MAX_BATCH);
        assert_eq!(b.take(t0).len(), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_goes_back_in_front_unless_superseded() {
        let t0 = Instant::now();
        let mut b = Batcher::new(limits(100));
        b.push(rec(ReplicationAction::Heartbeat, "a", Status::Up), t0);
        b.push(rec(ReplicationAction::Heartbeat, "b", Status::Up), t0);
        let batch = b.take(t0);
        b.push(rec(ReplicationAction::Heartbeat, "c", Status::Up), t0);
        b.push(rec(ReplicationAction::Heartbeat, "b", Status::Down), t0);
        b.requeue(batch);
        let got: Vec<(String, Option<Status>)> =
            b.take(t0).into_iter().map(|t| (t.record.id, t.record.status)).collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), Some(Status::Up)),
                ("c".into(), Some(Status::Up)),
                ("b".into(), Some(Status::Down))
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retried_tasks_age_from_their_first_enqueue() {
        // A peer is away: the same batch fails again and again. After the age limit its tasks
        // are dropped, not sent late (a stale Cancel must never remove a re-registered instance).
        let t0 = Instant::now();
        let mut b = Batcher::new(limits(100));
        b.push(rec(ReplicationAction::Cancel, "a", Status::Up), t0);
        let mut now = t0;
        for _ in 0..10 {
            now += Duration::from_secs(5);
            let batch = b.take(now);
            if batch.is_empty() {
                break;
            }
            b.requeue(batch);
        }
        assert!(b.take(t0 + Duration::from_secs(31)).is_empty());
        assert_eq!(b.dropped.expired, 1);
        // `expire` drops old tasks without sending anything.
        b.push(rec(ReplicationAction::Heartbeat, "b", Status::Up), now);
        b.expire(now + Duration::from_secs(31));
        assert!(b.is_empty());
        assert_eq!(b.dropped.expired, 2);
    }

    #[test]
    fn backoff_doubles_by_class_and_resets() {
        let mut b = PeerBackoff::default();
        assert_eq!(b.failure(Failure::Network), Duration::from_millis(100));
        assert_eq!(b.failure(Failure::Network), Duration::from_millis(200));
        assert_eq!(b.failure(Failure::Congestion), Duration::from_millis(4000));
        for _ in 0..20 {
            b.failure(Failure::Network);
        }
        assert_eq!(b.failure(Failure::Network), PeerBackoff::MAX);
        b.success();
        assert_eq!(b.failure(Failure::Congestion), Duration::from_secs(1));
        assert_eq!(b.failure(Failure::Permanent), Duration::ZERO);
    }
}
