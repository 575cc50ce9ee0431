//! The Eureka registry as a pure state machine: leases, status overrides, the delta change log,
//! the reconcile hash code, eviction and self-preservation.
//!
//! Writes go through [`Registry::apply`] with the current time; each returns one [`Outcome`]: the
//! reply for the caller and what to replicate to peers. Background work (eviction, the renewal
//! threshold update, delta pruning) are methods that take `now` (and, for eviction, a random
//! seed). Reads return [`view`] snapshots. Nothing here does I/O, reads a clock or spawns tasks;
//! callers keep it behind one short-held lock.
//!
//! Instances have an origin. Native and replicated instances follow Java's rules exactly. Pod
//! instances belong to the Kubernetes controller: they never expire, are not evicted and do not
//! count toward self-preservation (their lifetime is Kubernetes' truth), and clients cannot
//! overwrite or cancel them. Adopted instances are native registrations of pods whose
//! EurekaApp adopts them ([`adoption`]): the client's own description, held like pod instances.

pub mod adoption;
pub mod changes;
pub mod eviction;
pub mod instance;
pub mod lease;
pub mod limits;
mod owners;
pub mod preservation;
pub mod rules;
pub mod view;

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use adoption::{Adoption, Decision, controller_record};
pub use adoption::{Claim, ClaimKey, ClaimState};
use changes::ChangeLog;
use instance::{ActionType, InstanceInfo, Metadata, Status};
use lease::{ExpiryMode, Lease};
use limits::{LimitExceeded, Limits};
use preservation::{Preservation, PreservationConfig};
use view::{AppView, AppsView, InstanceView, LeaseView, Origin, StatusCounts};

/// Registry behaviour, named after Spring's `eureka.server.*` properties.
#[derive(Clone, Debug, PartialEq)]
pub struct RegistryConfig {
    /// Self-preservation: when eviction stops because too few renewals arrive.
    pub preservation: PreservationConfig,
    /// `eureka.instance.registry.expected-number-of-clients-sending-renews` (Spring default 1).
    pub expected_number_of_clients_sending_renews: i64,
    /// Used instead of 0 when the registry opens with no instances (Spring default 1).
    pub default_open_for_traffic_count: i64,
    /// How often eviction runs (Spring default 60 s); a run later than this adds its lateness
    /// to every lease's expiry, as Java's compensation does.
    pub eviction_interval_timer_in_ms: i64,
    /// How long a change stays in the delta (Java: 3 minutes).
    pub retention_time_in_ms_in_delta_queue: i64,
    /// Whether a heartbeat whose `lastDirtyTimestamp` differs from ours is answered 404/409 so
    /// the newer copy wins (Java's `syncWhenTimestampDiffers`, on by default).
    pub sync_when_timestamp_differs: bool,
    /// When a lease expires: after one duration (the fix), or Java's double duration.
    pub lease_expiry: ExpiryMode,
    /// How long an unused status override is remembered (Java: 1 hour after last access).
    pub override_expiry_ms: i64,
    /// Entries kept for the dashboard's "last registered / cancelled" lists.
    pub recent_queue_len: usize,
    /// How long a cancel is remembered, so that replication cannot undo it (see
    /// [`Registry::refuse_cancelled`]).
    pub cancel_memory_ms: i64,
    /// Caps on what clients and peers may store (pods are never refused).
    pub limits: Limits,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            preservation: PreservationConfig::default(),
            expected_number_of_clients_sending_renews: 1,
            default_open_for_traffic_count: 1,
            eviction_interval_timer_in_ms: 60_000,
            retention_time_in_ms_in_delta_queue: 180_000,
            sync_when_timestamp_differs: true,
            lease_expiry: ExpiryMode::Exact,
            override_expiry_ms: 3_600_000,
            recent_queue_len: 1000,
            cancel_memory_ms: 180_000,
            limits: Limits::default(),
        }
    }
}

/// Who wrote a change: the one vocabulary the registry, the replicator and the controller share.
/// The registry's rules only ask whether a write is replication ([`Writer::is_replication`]);
/// where a change goes next is the replicator's decision from the writer and the instance's
/// [`Origin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Writer {
    /// A Eureka client (or an admin with curl) over HTTP.
    Client,
    /// A peer server replicating (the batch endpoint or `x-netflix-discovery-replication: true`).
    Peer(PeerKind),
    /// The Kubernetes controller, for pod instances.
    Controller,
    /// This registry's own eviction of an expired lease.
    Expiry,
}

/// What kind of server a peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKind {
    /// Another replica of this operator.
    Replica,
    /// A Java Eureka server (or any Eureka server that is not one of our replicas).
    Java,
}

impl PeerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PeerKind::Replica => "replica",
            PeerKind::Java => "java",
        }
    }
}

impl Writer {
    /// One of this operator's replicas.
    pub const REPLICA: Writer = Writer::Peer(PeerKind::Replica);
    /// A Java Eureka peer.
    pub const JAVA: Writer = Writer::Peer(PeerKind::Java);

    /// Whether the write arrived by replication (Java's `isReplication`).
    pub fn is_replication(self) -> bool {
        matches!(self, Writer::Peer(_))
    }
}

/// The Kubernetes object a pod instance stands for. Plain strings: no Kubernetes types here.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodOwner {
    /// The namespace of the pod and of its EurekaApp.
    pub namespace: String,
    /// The EurekaApp that selects the pod.
    pub eureka_app: String,
    /// The pod's name.
    pub pod: String,
}

impl std::fmt::Display for PodOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EurekaApp {}/{} (pod {})", self.namespace, self.eureka_app, self.pod)
    }
}

/// A write.
#[derive(Clone, Debug)]
pub enum Command {
    Register {
        info: InstanceInfo,
        writer: Writer,
    },
    /// A registration copied from a peer's registry (the start-up sync, the anti-entropy
    /// comparison): registered as a replicated write, but its status is what that peer shows,
    /// which for an adopted instance may be what the pod imposes there, not the client's word.
    RegisterCopy {
        info: InstanceInfo,
    },
    Renew {
        app: String,
        id: String,
        writer: Writer,
        overridden_status: Option<Status>,
        last_dirty_timestamp: Option<i64>,
    },
    Cancel {
        app: String,
        id: String,
        writer: Writer,
    },
    SetStatus {
        app: String,
        id: String,
        status: Status,
        last_dirty_timestamp: Option<i64>,
        writer: Writer,
    },
    DeleteStatusOverride {
        app: String,
        id: String,
        /// The status the instance gets (`value`, default `UNKNOWN`).
        status: Status,
        last_dirty_timestamp: Option<i64>,
        writer: Writer,
    },
    UpdateMetadata {
        app: String,
        id: String,
        entries: Metadata,
    },
    /// [`Command::UpdateMetadata`] prepared by the caller without the lock: `merged` is `base` (as
    /// read from [`Registry::stored`]) with `entries` set. It is stored as is when the instance is
    /// still `base`, so the write costs O(1) per key under the lock, not a copy of the instance;
    /// otherwise `entries` are applied to what is stored now. A caller that keeps `base` until the
    /// write returns also frees the replaced copy without the lock.
    MergeMetadata {
        app: String,
        id: String,
        entries: Metadata,
        base: Arc<InstanceInfo>,
        merged: Box<InstanceInfo>,
    },
    /// The leader's eviction of an expired lease, replicated to a replica that does not evict on
    /// its own: applied only if the lease has expired here too, so an instance that renews on
    /// this replica (a partition kept its renewals from the leader) is never removed.
    Evict {
        app: String,
        id: String,
    },
    /// A peer's `Cancel` that names the `lastDirtyTimestamp` of the copy it removed (this
    /// operator's replicas send it; Java peers do not): a copy here that is newer registered again
    /// after that cancel (the cancel was held behind a partition) and is kept.
    CancelCopy {
        app: String,
        id: String,
        writer: Writer,
        last_dirty_timestamp: i64,
    },
    /// Creates or updates the instance of a pod. `info.status` is what the pod's state maps to.
    UpsertPod {
        info: InstanceInfo,
        owner: PodOwner,
        overrides: PodOverrides,
    },
    /// Deregisters a pod's instance (the pod went, stopped matching, or its drain ended).
    RemovePod {
        app: String,
        id: String,
        owner: PodOwner,
    },
    /// States what a selected pod of an adopting EurekaApp asks of its own client's registration
    /// (see [`adoption`]).
    Claim {
        claim: Claim,
    },
    /// Withdraws a pod's claim: its registrations are cancelled when the pod is gone, released
    /// (native again) otherwise.
    Unclaim {
        owner: PodOwner,
        pod_gone: bool,
    },
}

/// The answer to a write, in Eureka's terms.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// Registered (HTTP 204).
    Registered,
    /// Done (HTTP 200).
    Ok,
    /// No such lease, or the caller must re-register (HTTP 404).
    NotFound,
    /// The stored copy is newer than a peer's (HTTP 409 with the stored instance).
    Conflict(Box<InstanceView>),
    /// The write is not allowed (HTTP 409 with a message): e.g. a client writing a pod instance.
    Refused(String),
    /// A pod instance was left as it was because nothing changed.
    Unchanged,
    /// A cap refuses the write (an instance too large, or the registry full).
    OverLimit(LimitExceeded),
}

/// The replication actions of the batch protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Register,
    Heartbeat,
    Cancel,
    StatusUpdate,
    DeleteStatusOverride,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Register => "Register",
            Action::Heartbeat => "Heartbeat",
            Action::Cancel => "Cancel",
            Action::StatusUpdate => "StatusUpdate",
            Action::DeleteStatusOverride => "DeleteStatusOverride",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        [
            Action::Register,
            Action::Heartbeat,
            Action::Cancel,
            Action::StatusUpdate,
            Action::DeleteStatusOverride,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// One change to tell peers about, in the shape of a `ReplicationInstance`. Every write emits its
/// records, whatever its writer.
#[derive(Clone, Debug, PartialEq)]
pub struct Replication {
    /// Register, Heartbeat, Cancel, StatusUpdate or DeleteStatusOverride.
    pub action: Action,
    /// The application of the instance.
    pub app: String,
    /// The instance id.
    pub id: String,
    /// The version of the copy the write applied to (peers compare it with theirs).
    pub last_dirty_timestamp: Option<i64>,
    /// The new status of a StatusUpdate (or the fallback of a DeleteStatusOverride).
    pub status: Option<Status>,
    /// The override a Heartbeat carries, so a peer converges on it.
    pub overridden_status: Option<Status>,
    /// The instance as stored, for Register (and for a Heartbeat a peer answers with 404).
    pub instance: Option<InstanceView>,
    /// Pod instances are derived by every replica from its own watch; only Java peers need them.
    pub origin: Origin,
    /// Who asked for the write: Java never replicates what a peer replicated to it; where a
    /// record goes is the replicator's decision.
    pub writer: Writer,
}

/// The status overrides Kubernetes holds for a pod: the pod's annotation, where REST overrides are
/// persisted, and its EurekaApp's (the first matching selector's, else the app-wide one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodOverrides {
    pub annotation: Option<Status>,
    /// `UNKNOWN` for none.
    pub spec: Status,
}

impl PodOverrides {
    pub const NONE: PodOverrides = PodOverrides {
        annotation: None,
        spec: Status::Unknown,
    };
}

/// A REST override on a pod instance that the pod's annotation does not show yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RestOverride {
    Set(Status),
    Deleted,
}

impl RestOverride {
    /// Whether the annotation now records it (from then on the annotation is the truth, so a
    /// `kubectl` edit of the annotation takes effect).
    fn persisted(self, annotation: Option<Status>) -> bool {
        match self {
            RestOverride::Set(s) => annotation == Some(s),
            RestOverride::Deleted => annotation.is_none(),
        }
    }
}

/// The override in force on a pod instance: a pending REST one, else the annotation, else the
/// EurekaApp's (`UNKNOWN` for none).
fn effective_override(overrides: PodOverrides, rest: Option<RestOverride>) -> Status {
    match rest {
        Some(RestOverride::Set(s)) => s,
        Some(RestOverride::Deleted) => overrides.spec,
        None => overrides.annotation.unwrap_or(overrides.spec),
    }
}

/// A request from the registry to the controller: remember (or forget) a REST status override on
/// a pod instance, so it survives restarts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodOverride {
    /// The pod whose annotation to write.
    pub owner: PodOwner,
    /// The override to remember, `None` to forget it.
    pub status: Option<Status>,
}

/// The result of one write.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// What the writer is answered.
    pub reply: Reply,
    /// What to tell peers (routed by writer and origin in `replication`).
    pub replicate: Vec<Replication>,
    /// An override the controller should persist on a pod.
    pub pod_override: Option<PodOverride>,
}

impl Outcome {
    fn reply(reply: Reply) -> Outcome {
        Outcome {
            reply,
            replicate: Vec::new(),
            pod_override: None,
        }
    }
}

/// An expired lease an eviction run may remove.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Evicted {
    pub app: String,
    pub id: String,
}

/// `(time, "APP(id)")` entries, newest first.
pub type Recent = Vec<(i64, String)>;

/// Figures for the dashboard and the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub renews_last_min: u64,
    pub renews_threshold: i64,
    pub expected_clients: i64,
    pub self_preservation_enabled: bool,
    pub lease_expiration_enabled: bool,
    pub below_renew_threshold: bool,
    pub self_preservation_active: bool,
    pub allow_access: bool,
    pub startup_time: i64,
    pub instances: u64,
    /// Native and replicated leases that have expired but are still registered.
    pub expired: u64,
    pub by_origin: [(Origin, u64); 4],
    pub by_status: StatusCounts,
    pub applications: usize,
    pub version: u64,
    pub totals: Totals,
}

/// Monotonic counters of registry events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub registrations: u64,
    pub renewals: u64,
    pub cancellations: u64,
    pub evictions: u64,
    pub status_updates: u64,
    /// Eviction runs held back by self-preservation.
    pub eviction_runs_held: u64,
}

/// How the registry holds an instance: what its [`Origin`] is, plus what a pod instance needs.
#[derive(Clone, Debug)]
enum Holding {
    Native,
    Replicated,
    Pod {
        owner: PodOwner,
        /// What the pod's state maps to (before overrides).
        reported: Status,
        /// The overrides Kubernetes holds for the pod.
        overrides: PodOverrides,
        /// A REST override, until the pod's annotation shows it.
        rest: Option<RestOverride>,
    },
    /// A native or replicated registration adopted for a pod.
    Adopted(Adoption),
}

impl Holding {
    fn kind(&self) -> Origin {
        match self {
            Holding::Native => Origin::Native,
            Holding::Replicated => Origin::Replicated,
            Holding::Pod { .. } => Origin::Pod,
            Holding::Adopted(_) => Origin::Adopted,
        }
    }

    fn is_pod(&self) -> bool {
        matches!(self, Holding::Pod { .. })
    }

    /// The EurekaApp's pod the instance is held for: pod instances and adopted registrations.
    fn owner(&self) -> Option<&PodOwner> {
        match self {
            Holding::Pod { owner, .. } => Some(owner),
            Holding::Adopted(a) => Some(&a.owner),
            Holding::Native | Holding::Replicated => None,
        }
    }

    /// Whether the lease counts toward self-preservation (and expires): native and replicated.
    fn counted(&self) -> bool {
        matches!(self, Holding::Native | Holding::Replicated)
    }
}

/// One stored instance.
#[derive(Clone, Debug)]
struct Entry {
    /// The instance as shown (status after the override rules), shared with readers.
    info: Arc<InstanceInfo>,
    /// Its lease.
    lease: Lease,
    /// Who holds it, which decides expiry, eviction and self-preservation.
    holding: Holding,
    /// Registered from a copy of a peer's registry ([`Command::RegisterCopy`]).
    copied: bool,
}

/// A REST status override, kept by instance id like Java's `overriddenInstanceStatusMap`.
#[derive(Clone, Copy, Debug)]
struct OverrideEntry {
    /// The forced status.
    status: Status,
    /// When it was last read or set; unused overrides are forgotten after an hour.
    accessed: i64,
}

/// The registry. See the module docs.
#[derive(Debug)]
pub struct Registry {
    /// Behaviour settings.
    config: RegistryConfig,
    /// Application name → instance id → stored instance.
    /// The names are shared with the change log and the owner index.
    apps: HashMap<Arc<str>, HashMap<Arc<str>, Entry>>,
    /// REST status overrides by instance id.
    overrides: HashMap<String, OverrideEntry>,
    /// The delta's change log, by application, pruned after the retention time.
    changes: ChangeLog,
    /// The dashboard's last registrations (time, `APP(id)`).
    recent_registered: VecDeque<(i64, String)>,
    /// The dashboard's last cancellations.
    recent_cancelled: VecDeque<(i64, String)>,
    /// Instances per status, for the hash code, kept as writes happen.
    counts: StatusCounts,
    /// Instances per origin, for metrics.
    by_origin: HashMap<Origin, u64>,
    /// Bumped by every write that changes what a fetch shows (heartbeats do not).
    version: u64,
    /// The registry version of each application's last change (for per-application caches).
    app_versions: HashMap<Arc<str>, u64>,
    /// Self-preservation's expected clients, threshold and renewal rate.
    preservation: Preservation,
    /// When eviction last ran (its lateness is compensated, as Java does).
    last_eviction: Option<i64>,
    /// Counters since start, for metrics.
    totals: Totals,
    /// What the controller says about the pods of adopting EurekaApps.
    claims: adoption::Claims,
    /// Bytes of text of every stored instance (what `limits.max_registry_bytes` caps).
    text_bytes: usize,
    /// The instances each EurekaApp holds (pod and adopted), kept in step by the writes here.
    owners: owners::Owners,
    /// Recent cancels: `(app, id)` → (the cancelled copy's `lastDirtyTimestamp`, when).
    cancelled: HashMap<(String, String), (i64, i64)>,
}

impl Registry {
    pub fn new(config: RegistryConfig, now: i64) -> Registry {
        let preservation = Preservation::new(
            config.preservation.clone(),
            config.expected_number_of_clients_sending_renews,
            now,
        );
        Registry {
            config,
            apps: HashMap::new(),
            overrides: HashMap::new(),
            changes: ChangeLog::default(),
            recent_registered: VecDeque::new(),
            recent_cancelled: VecDeque::new(),
            counts: StatusCounts::default(),
            by_origin: HashMap::new(),
            version: 1,
            app_versions: HashMap::new(),
            preservation,
            last_eviction: None,
            totals: Totals::default(),
            claims: adoption::Claims::default(),
            text_bytes: 0,
            owners: owners::Owners::default(),
            cancelled: HashMap::new(),
        }
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// Changes whenever anything a reader can see changes (not on plain renewals).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// `openForTraffic`: `count` instances were found at start (from peers); Spring's
    /// `defaultOpenForTrafficCount` stands in for zero.
    pub fn open_for_traffic(&mut self, count: i64, now: i64) {
        let count = if count == 0 {
            self.config.default_open_for_traffic_count
        } else {
            count
        };
        self.preservation.open_for_traffic(count, now);
        self.last_eviction = None;
    }

    /// Applies one write.
    pub fn apply(&mut self, command: Command, now: i64) -> Outcome {
        let outcome = self.write(command, now);
        #[cfg(test)]
        self.assert_owner_index();
        outcome
    }

    fn write(&mut self, command: Command, now: i64) -> Outcome {
        match command {
            Command::Register { info, writer } => self.register(info, writer, false, now),
            Command::RegisterCopy { info } => self.register(info, Writer::REPLICA, true, now),
            Command::Renew {
                app,
                id,
                writer,
                overridden_status,
                last_dirty_timestamp,
            } => self.renew(app, id, writer, overridden_status, last_dirty_timestamp, now),
            Command::Cancel { app, id, writer } => self.cancel(&app, &id, writer, now),
            Command::SetStatus {
                app,
                id,
                status,
                last_dirty_timestamp,
                writer,
            } => self.set_status(&app, &id, status, last_dirty_timestamp, writer, now),
            Command::DeleteStatusOverride {
                app,
                id,
                status,
                last_dirty_timestamp,
                writer,
            } => self.delete_status_override(&app, &id, status, last_dirty_timestamp, writer, now),
            Command::UpdateMetadata { app, id, entries } => self.update_metadata(&app, &id, entries, None, now),
            Command::MergeMetadata {
                app,
                id,
                entries,
                base,
                merged,
            } => self.update_metadata(&app, &id, entries, Some((base, merged)), now),
            Command::Evict { app, id } => self.evict_replicated(&app, &id, now),
            Command::CancelCopy {
                app,
                id,
                writer,
                last_dirty_timestamp,
            } => self.cancel_copy(&app, &id, writer, last_dirty_timestamp, now),
            Command::UpsertPod { info, owner, overrides } => self.upsert_pod(info, owner, overrides, now),
            Command::RemovePod { app, id, owner } => self.remove_pod(&app, &id, &owner, now),
            Command::Claim { claim } => self.claim(claim, now),
            Command::Unclaim { owner, pod_gone } => self.unclaim(&owner, pod_gone, now),
        }
    }

    // === writes ===

    fn register(&mut self, incoming: InstanceInfo, writer: Writer, copy: bool, now: i64) -> Outcome {
        let app = incoming.app.clone();
        let id = incoming.id().to_string();
        let replication = writer.is_replication();
        // A Java peer's registration is taken as Java takes it: Java's cancels carry no
        // timestamp, so a cancel it sent may be the stale one (held by a paused replica and
        // applied after the client registered again), and its Register after a 404 heartbeat is
        // then the repair.
        let from_java = writer == Writer::Peer(PeerKind::Java);
        if replication
            && !from_java
            && let Some(reply) = self.refuse_cancelled(&incoming, now)
        {
            return Outcome::reply(reply);
        }
        let existing = self.apps.get(&*app).and_then(|a| a.get(&*id)).cloned();
        let (adopter, superseded) = match self.admit_registration(&incoming, existing.as_ref(), now) {
            Ok(admitted) => admitted,
            Err(reply) => return Outcome::reply(reply),
        };
        let counted_before = existing.as_ref().map(|e| e.holding.counted());
        match (counted_before, adopter.is_none()) {
            (None, true) | (Some(false), true) => self.preservation.client_registered(),
            (Some(true), false) => self.preservation.client_cancelled(),
            _ => {}
        }
        let incoming_status = incoming.status;
        let duration_secs = incoming.lease.normalised().duration_secs;
        let (mut registrant, stale_incoming) = Self::registrant(incoming, existing.as_ref(), writer);
        let mut lease = Lease::new(now, duration_secs);
        if let Some(e) = &existing {
            lease.service_up_ts = e.lease.service_up_ts;
        }
        self.push_recent_registered(now, &app, &id);
        let override_status = self.take_override(&mut registrant, &id, now);
        let status = rules::resolve(
            registrant.status,
            override_status,
            existing.as_ref().map(Self::native_status),
            replication,
        );
        registrant.status = status;
        let base = if replication {
            Origin::Replicated
        } else {
            Origin::Native
        };
        let holding = match adopter.clone() {
            Some(owner) => {
                registrant.status =
                    adoption::shown_status(status, self.claims.state_of(&owner), override_status.is_some());
                Holding::Adopted(Adoption {
                    owner,
                    base,
                    raw: status,
                    raw_known: !copy,
                })
            }
            None if replication => Holding::Replicated,
            None => Holding::Native,
        };
        if registrant.status == Status::Up {
            lease.service_up(now);
        }
        registrant.action_type = Some(ActionType::Added);
        registrant.last_updated_timestamp = now;
        registrant.shrink_to_fit();
        let entry = Entry {
            info: Arc::new(registrant),
            lease,
            holding,
            copied: copy,
        };
        self.put(entry, now);
        self.totals.registrations += 1;

        let mut outcome = Outcome::reply(Reply::Registered);
        outcome
            .replicate
            .push(self.registration_record(&app, &id, stale_incoming, writer));
        if adopter.is_some() {
            let shown = self.view_of(&app, &id).expect("just registered");
            // Java peers get the status shown here from the leader (not back to a Java peer
            // that sent exactly that).
            if !(writer == Writer::JAVA && shown.info.status == incoming_status) {
                outcome.replicate.push(controller_record(Action::Register, &shown));
            }
            for (older, _) in superseded {
                self.cancel_for_claim(&app, &older, now, &mut outcome.replicate);
            }
        }
        outcome
    }

    /// Whether a registration may be stored: not over a pod instance, within the caps, and, for
    /// a pod of an adopting EurekaApp, adopted (with the older registrations of the same pod it
    /// supersedes) or refused once the pod is gone or a newer one came from it.
    #[allow(clippy::type_complexity)]
    fn admit_registration(
        &self,
        incoming: &InstanceInfo,
        existing: Option<&Entry>,
        now: i64,
    ) -> Result<(Option<PodOwner>, Vec<(String, i64)>), Reply> {
        let (app, id) = (&incoming.app, incoming.id());
        if let Some(Entry {
            holding: Holding::Pod { owner, .. },
            ..
        }) = existing
        {
            return Err(Reply::Refused(format!(
                "instance {id} of {app} is managed by {owner}; change it there"
            )));
        }
        self.admit(incoming, existing.map(|e| &*e.info))
            .map_err(Reply::OverLimit)?;
        let owner = match self.decide_adoption(incoming, now) {
            Decision::None => return Ok((None, Vec::new())),
            Decision::Adopt(owner) => owner,
            Decision::Refuse(message) => return Err(Reply::Refused(message)),
        };
        // One endpoint has one process: a newer registration from it supersedes older ones.
        let siblings = self.adopted_siblings(&owner, app, id);
        if let Some((newer, _)) = siblings.iter().find(|(_, d)| *d > incoming.last_dirty_timestamp) {
            return Err(Reply::Refused(format!(
                "instance {id} of {app} is older than {newer}, registered since from the same pod ({owner})"
            )));
        }
        Ok((Some(owner), siblings))
    }

    /// What is stored for a registration, and the incoming one when a strictly newer stored copy
    /// wins over it (the incoming one is still what peers are told about).
    fn registrant(
        incoming: InstanceInfo,
        existing: Option<&Entry>,
        writer: Writer,
    ) -> (InstanceInfo, Option<InstanceInfo>) {
        match existing {
            Some(e) if e.info.last_dirty_timestamp > incoming.last_dirty_timestamp => {
                (Self::native_info(e), Some(incoming))
            }
            Some(e)
                if writer == Writer::JAVA
                    && matches!(&e.holding, Holding::Adopted(a) if a.raw_known && a.raw != e.info.status)
                    && incoming.status == e.info.status =>
            {
                // A Java peer hands back the status the pod imposes here (Java keeps a lease's
                // UP/OUT_OF_SERVICE against its client's registrations): the client's stays.
                let mut registrant = incoming;
                registrant.status = Self::native_status(e);
                (registrant, None)
            }
            _ => (incoming, None),
        }
    }

    /// The override a registration is subject to: one it carries (an initial state transfer
    /// from a peer or client) is remembered unless one is already known; the known one wins.
    fn take_override(&mut self, registrant: &mut InstanceInfo, id: &str, now: i64) -> Option<Status> {
        if registrant.overridden_status != Status::Unknown && !self.overrides.contains_key(id) {
            self.overrides.insert(
                id.to_string(),
                OverrideEntry {
                    status: registrant.overridden_status,
                    accessed: now,
                },
            );
        }
        let override_status = Self::access_override(&mut self.overrides, id, now);
        if let Some(o) = override_status {
            registrant.overridden_status = o;
        }
        override_status
    }

    /// The record peers get for a registration. Java replicates the registration as received:
    /// when the stored copy was newer and kept, peers still get the incoming (stale) one and
    /// resolve it by its timestamp. An adopted registration goes out as the client's (the
    /// replicas impose the pod's status themselves).
    fn registration_record(
        &self,
        app: &str,
        id: &str,
        stale_incoming: Option<InstanceInfo>,
        writer: Writer,
    ) -> Replication {
        let stored = self.replica_view(app, id).expect("just registered");
        let mut instance = stored.clone();
        if let Some(incoming) = stale_incoming {
            instance.info = Arc::new(incoming);
        }
        Replication {
            action: Action::Register,
            app: app.to_string(),
            id: id.to_string(),
            last_dirty_timestamp: Some(instance.info.last_dirty_timestamp),
            status: Some(instance.info.status),
            overridden_status: None,
            instance: Some(instance),
            origin: stored.origin,
            writer,
        }
    }

    /// Whether the caps let a client or peer store `info` in place of `replaced` (the instance
    /// with its id, if there is one: then the counts do not grow).
    fn admit(&self, info: &InstanceInfo, replaced: Option<&InstanceInfo>) -> Result<(), LimitExceeded> {
        let limits = &self.config.limits;
        limits.instance.check(info)?;
        let freed = replaced.map_or(0, InstanceInfo::text_bytes);
        if (self.text_bytes - freed.min(self.text_bytes)).saturating_add(info.text_bytes()) > limits.max_registry_bytes
        {
            return Err(LimitExceeded::RegistryBytes {
                limit: limits.max_registry_bytes,
            });
        }
        if replaced.is_some() {
            return Ok(());
        }
        if self.counts.total() >= limits.max_instances as u64 {
            return Err(LimitExceeded::Instances {
                limit: limits.max_instances,
            });
        }
        match self.apps.get(info.app.as_str()) {
            Some(app) if app.len() >= limits.max_instances_per_application => {
                Err(LimitExceeded::InstancesPerApplication {
                    app: info.app.clone(),
                    limit: limits.max_instances_per_application,
                })
            }
            Some(_) => Ok(()),
            None if self.apps.len() >= limits.max_applications => Err(LimitExceeded::Applications {
                limit: limits.max_applications,
            }),
            None => Ok(()),
        }
    }

    /// A heartbeat. The hot path: one lookup of the instance and one of its override, and the
    /// command's own strings move into the replication record.
    fn renew(
        &mut self,
        app: String,
        id: String,
        writer: Writer,
        overridden_param: Option<Status>,
        dirty_param: Option<i64>,
        now: i64,
    ) -> Outcome {
        let replication = writer.is_replication();
        let Some(entry) = self.apps.get_mut(&*app).and_then(|a| a.get_mut(&*id)) else {
            return Outcome::reply(Reply::NotFound);
        };
        if entry.holding.is_pod() {
            // Kept alive by the controller; a client heartbeat is acknowledged and ignored.
            return Outcome::reply(Reply::Ok);
        }
        if matches!(&entry.holding, Holding::Adopted(a) if !a.raw_known) {
            // Only a peer's copy is known here: whoever holds the client's own sends it again.
            return Outcome::reply(Reply::NotFound);
        }
        let counted = entry.holding.counted();
        let current = Self::native_status(entry);
        let override_status = Self::access_override(&mut self.overrides, &id, now);
        let status = rules::resolve(current, override_status, Some(current), replication);
        if status == Status::Unknown {
            // Possibly a deleted override: the client must re-register.
            return Outcome::reply(Reply::NotFound);
        }
        let entry = if status != current {
            // Java corrects the status silently; a delta entry keeps clients' hash codes right.
            self.modify_native(&app, &id, status, now, |_| {});
            self.apps.get_mut(&*app).and_then(|a| a.get_mut(&*id)).expect("present")
        } else {
            entry
        };
        if counted {
            // Adopted instances do not count toward self-preservation: nor do their renewals.
            self.preservation.renewed(now);
        }
        self.totals.renewals += 1;
        entry.lease.renew(now);
        let stored_dirty = entry.info.last_dirty_timestamp;
        let (stored_status, origin) = (entry.info.status, entry.holding.kind());
        let mut outcome = Outcome::reply(Reply::Ok);
        if let Some(incoming) = dirty_param.filter(|_| self.config.sync_when_timestamp_differs) {
            if incoming > stored_dirty {
                if replication && let Some(o) = overridden_param.filter(|s| *s != Status::Unknown) {
                    self.overrides.insert(
                        id.clone(),
                        OverrideEntry {
                            status: o,
                            accessed: now,
                        },
                    );
                    let entry = self.apps.get_mut(&*app).and_then(|a| a.get_mut(&*id)).expect("present");
                    Arc::make_mut(&mut entry.info).overridden_status = o;
                }
                outcome.reply = Reply::NotFound;
            } else if stored_dirty > incoming && replication {
                let view = self.view_of(&app, &id).expect("present");
                outcome.reply = Reply::Conflict(Box::new(view));
            }
        }
        outcome.replicate.push(Replication {
            action: Action::Heartbeat,
            app,
            id,
            last_dirty_timestamp: Some(stored_dirty),
            status: Some(stored_status),
            // As it was before this heartbeat's own `overriddenstatus` was taken in.
            overridden_status: override_status,
            instance: None,
            origin,
            writer,
        });
        outcome
    }

    fn cancel(&mut self, app: &str, id: &str, writer: Writer, now: i64) -> Outcome {
        if let Some(Entry {
            holding: Holding::Pod { owner, .. },
            ..
        }) = self.apps.get(app).and_then(|a| a.get(id))
        {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} is managed by {owner}; it goes when its pod goes"
            )));
        }
        let dirty = self
            .apps
            .get(app)
            .and_then(|a| a.get(id))
            .map(|e| e.info.last_dirty_timestamp);
        let outcome = self.cancelled(app, id, writer, now);
        // A cancel, not an eviction: an evicted instance that still renews somewhere must be
        // able to come back through replication.
        if let (Reply::Ok, Some(dirty)) = (&outcome.reply, dirty) {
            self.remember_cancel(app, id, dirty, now);
        }
        outcome
    }

    fn cancel_copy(&mut self, app: &str, id: &str, writer: Writer, cancelled_dirty: i64, now: i64) -> Outcome {
        if let Some(entry) = self.apps.get(app).and_then(|a| a.get(id))
            && !entry.holding.is_pod()
            && entry.info.last_dirty_timestamp > cancelled_dirty
        {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} registered again after the cancelled copy; kept"
            )));
        }
        self.cancel(app, id, writer, now)
    }

    /// A replicated registration of a copy this replica saw cancelled (or an older one), within
    /// `cancel_memory_ms`: refused, so that replication cannot undo a cancel. Such a copy arrives
    /// when a renewal queued behind a slow or cut link reaches a replica after the cancel (answered
    /// 404, its sender then sends the Register, as Eureka's protocol does), or from a peer's stale
    /// registry (the start-up sync, anti-entropy). A registration with a newer
    /// `lastDirtyTimestamp` is the client registering again, and is taken; so is a client's own,
    /// and a Java peer's (see `register`).
    fn refuse_cancelled(&mut self, incoming: &InstanceInfo, now: i64) -> Option<Reply> {
        let key = (incoming.app.to_string(), incoming.id().to_string());
        let (dirty, at) = *self.cancelled.get(&key)?;
        if at + self.config.cancel_memory_ms <= now {
            self.cancelled.remove(&key);
            return None;
        }
        (incoming.last_dirty_timestamp <= dirty).then(|| {
            Reply::Refused(format!(
                "instance {} of {} was cancelled after this copy was written; not registered again",
                key.1, key.0
            ))
        })
    }

    /// Remembers a cancel (see [`Registry::refuse_cancelled`]), forgetting those older than
    /// `cancel_memory_ms` now and then, so the memory holds at most the cancels of that window.
    fn remember_cancel(&mut self, app: &str, id: &str, dirty: i64, now: i64) {
        if self.cancelled.len() >= 64 && self.cancelled.len().is_power_of_two() {
            let keep = self.config.cancel_memory_ms;
            self.cancelled.retain(|_, (_, at)| *at + keep > now);
        }
        self.cancelled.insert((app.to_string(), id.to_string()), (dirty, now));
    }

    /// Removes a native or replicated instance as cancelled (Java forgets its override whether or
    /// not the lease exists) and says so to peers as written by `writer`.
    fn cancelled(&mut self, app: &str, id: &str, writer: Writer, now: i64) -> Outcome {
        self.overrides.remove(id);
        let Some(removed) = self.remove(app, id, now) else {
            return Outcome::reply(Reply::NotFound);
        };
        // An adopted instance's client cancels as it shuts down: honoured, as Java does.
        if removed.origin != Origin::Adopted {
            self.preservation.client_cancelled();
        }
        self.totals.cancellations += 1;
        Outcome {
            reply: Reply::Ok,
            replicate: vec![Replication {
                action: Action::Cancel,
                app: app.to_string(),
                id: id.to_string(),
                // What was cancelled, so that a peer that holds a newer registration keeps it.
                last_dirty_timestamp: Some(removed.info.last_dirty_timestamp),
                status: None,
                overridden_status: None,
                instance: None,
                origin: removed.origin,
                writer,
            }],
            pod_override: None,
        }
    }

    /// Whether an instance is visible to instance lookups and status calls: Java hides expired
    /// leases while lease expiration is enabled.
    fn visible(&mut self, app: &str, id: &str, now: i64) -> bool {
        let mode = self.config.lease_expiry;
        let Some(entry) = self.apps.get(app).and_then(|a| a.get(id)) else {
            return false;
        };
        if !entry.holding.counted() || !entry.lease.is_expired(now, 0, mode) {
            return true;
        }
        !self.preservation.lease_expiration_enabled(now)
    }

    fn set_status(
        &mut self,
        app: &str,
        id: &str,
        status: Status,
        dirty: Option<i64>,
        writer: Writer,
        now: i64,
    ) -> Outcome {
        if !self.visible(app, id, now) {
            return Outcome::reply(Reply::NotFound);
        }
        self.totals.status_updates += 1;
        let entry = self.apps.get_mut(app).and_then(|a| a.get_mut(id)).expect("visible");
        entry.lease.renew(now);
        let pod_override = match &mut entry.holding {
            Holding::Pod { owner, rest, .. } => {
                *rest = Some(RestOverride::Set(status));
                Some(PodOverride {
                    owner: owner.clone(),
                    status: Some(status),
                })
            }
            _ => None,
        };
        if pod_override.is_some() {
            self.refresh_pod_status(app, id, dirty, now);
        } else if entry.info.status != status {
            // (For an adopted instance: what is shown, which a pod's state or the EurekaApp's
            // override may make differ from what the client said.)
            if status == Status::Up {
                entry.lease.service_up(now);
            }
            self.overrides
                .insert(id.to_string(), OverrideEntry { status, accessed: now });
            self.modify_native(app, id, status, now, |info| {
                info.overridden_status = status;
                if let Some(d) = dirty.filter(|d| *d > info.last_dirty_timestamp) {
                    info.last_dirty_timestamp = d;
                }
            });
        }
        let entry = self.apps.get(app).and_then(|a| a.get(id)).expect("present");
        let mut outcome = Outcome::reply(Reply::Ok);
        outcome.pod_override = pod_override;
        if matches!(entry.holding, Holding::Adopted(_)) {
            // Java peers take the override as any; then the status shown here, from the leader.
            let shown = self.view(entry);
            outcome.replicate.push(controller_record(Action::Register, &shown));
        }
        {
            outcome.replicate.push(Replication {
                action: Action::StatusUpdate,
                app: app.to_string(),
                id: id.to_string(),
                last_dirty_timestamp: Some(entry.info.last_dirty_timestamp),
                status: Some(status),
                overridden_status: None,
                instance: None,
                origin: entry.holding.kind(),
                writer,
            });
        }
        outcome
    }

    fn delete_status_override(
        &mut self,
        app: &str,
        id: &str,
        status: Status,
        dirty: Option<i64>,
        writer: Writer,
        now: i64,
    ) -> Outcome {
        if !self.visible(app, id, now) {
            return Outcome::reply(Reply::NotFound);
        }
        let entry = self.apps.get_mut(app).and_then(|a| a.get_mut(id)).expect("visible");
        entry.lease.renew(now);
        let pod_override = match &mut entry.holding {
            Holding::Pod { owner, rest, .. } => {
                *rest = Some(RestOverride::Deleted);
                Some(PodOverride {
                    owner: owner.clone(),
                    status: None,
                })
            }
            _ => None,
        };
        if pod_override.is_some() {
            self.refresh_pod_status(app, id, dirty, now);
        } else if self.overrides.remove(id).is_some() {
            self.modify_native(app, id, status, now, |info| {
                info.overridden_status = Status::Unknown;
                if let Some(d) = dirty.filter(|d| *d > info.last_dirty_timestamp) {
                    info.last_dirty_timestamp = d;
                }
            });
        }
        let entry = self.apps.get(app).and_then(|a| a.get(id)).expect("present");
        let mut outcome = Outcome::reply(Reply::Ok);
        outcome.pod_override = pod_override;
        let adopted = matches!(entry.holding, Holding::Adopted(_));
        {
            outcome.replicate.push(Replication {
                action: Action::DeleteStatusOverride,
                app: app.to_string(),
                id: id.to_string(),
                last_dirty_timestamp: Some(entry.info.last_dirty_timestamp),
                status: Some(Self::native_status(entry)),
                overridden_status: None,
                instance: None,
                origin: entry.holding.kind(),
                writer,
            });
        }
        if adopted {
            let shown = self.view(entry);
            outcome.replicate.push(controller_record(Action::Register, &shown));
        }
        outcome
    }

    fn update_metadata(
        &mut self,
        app: &str,
        id: &str,
        entries: Metadata,
        prepared: Option<(Arc<InstanceInfo>, Box<InstanceInfo>)>,
        now: i64,
    ) -> Outcome {
        let Some(entry) = self.apps.get(app).and_then(|a| a.get(id)) else {
            return Outcome::reply(Reply::NotFound);
        };
        if let Holding::Pod { owner, .. } = &entry.holding {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} is managed by {owner}; set its metadata in the EurekaApp"
            )));
        }
        // Java edits the stored instance and registers it again (a new lease, an ADDED delta);
        // the caps are checked on registering. An adopted one starts from the client's own
        // status, not the one the pod imposes here.
        let info = match prepared {
            Some((base, merged))
                if Arc::ptr_eq(&base, &entry.info) && !matches!(entry.holding, Holding::Adopted(_)) =>
            {
                *merged
            }
            _ => {
                let mut info = Self::native_info(entry);
                info.metadata.merge(&entries);
                info
            }
        };
        let mut outcome = self.register(info, Writer::Client, false, now);
        if outcome.reply == Reply::Registered {
            outcome.reply = Reply::Ok;
        }
        outcome
    }

    fn upsert_pod(&mut self, mut info: InstanceInfo, owner: PodOwner, overrides: PodOverrides, now: i64) -> Outcome {
        let app = info.app.clone();
        let id = info.id().to_string();
        let existing = self
            .apps
            .get(&*app)
            .and_then(|a| a.get(&*id))
            .map(|e| (e.holding.clone(), e.info.clone()));
        let rest = match self.claim_for_pod(&info, &owner, overrides, existing.as_ref()) {
            Ok(rest) => rest,
            Err(reply) => return Outcome::reply(reply),
        };
        let taken_over = existing.as_ref().is_some_and(|(h, _)| !h.is_pod());
        let reported = info.status;
        let effective_override = effective_override(overrides, rest);
        info.overridden_status = effective_override;
        info.status = pod_status(reported, effective_override);
        let holding = Holding::Pod {
            owner,
            reported,
            overrides,
            rest,
        };
        match existing {
            Some((_, existing)) => self.update_pod(info, holding, &existing, taken_over, now),
            None => self.insert_pod(info, holding, now),
        }
    }

    /// Whether a pod instance may take its id, and the pending REST override it keeps. Refused
    /// when another pod or a foreign native client holds the id; the pod's own client (same IP
    /// and port) is taken over.
    fn claim_for_pod(
        &mut self,
        info: &InstanceInfo,
        owner: &PodOwner,
        overrides: PodOverrides,
        existing: Option<&(Holding, Arc<InstanceInfo>)>,
    ) -> Result<Option<RestOverride>, Reply> {
        let id = info.id();
        match existing {
            // A pending REST override lasts until the annotation changes: to record it, or to
            // anything else (a `kubectl annotate` after the REST call wins; the annotation is the
            // truth, and a new leader never writes an older REST value over it).
            Some((
                Holding::Pod {
                    owner: held_by,
                    rest,
                    overrides: seen,
                    ..
                },
                _,
            )) if held_by == owner => {
                Ok(rest.filter(|r| !r.persisted(overrides.annotation) && seen.annotation == overrides.annotation))
            }
            Some((Holding::Pod { owner: held_by, .. }, _)) => {
                Err(Reply::Refused(format!("instance id {id} is already held by {held_by}")))
            }
            // The pod's own client registered under the id the operator gives it (the same IP
            // and port: the same process): the pod instance takes the registration over, with
            // no gap and no duplicate (a service moving from its own client to the operator).
            Some((held, e)) if e.ip_addr == info.ip_addr && e.port.port == info.port.port => {
                if held.counted() {
                    self.preservation.client_cancelled();
                }
                self.overrides.remove(id);
                Ok(None)
            }
            Some(_) => Err(Reply::Refused(format!(
                "instance id {id} is already held by a natively registered Eureka client"
            ))),
            None => Ok(None),
        }
    }

    /// A pod instance whose id is stored: the holding always takes the latest intent; the
    /// description changes (with a newer dirty timestamp) only when it differs.
    fn update_pod(
        &mut self,
        info: InstanceInfo,
        holding: Holding,
        existing: &InstanceInfo,
        taken_over: bool,
        now: i64,
    ) -> Outcome {
        let (app, id) = (info.app.clone(), info.id().to_string());
        let mut candidate = info.clone();
        candidate.last_dirty_timestamp = existing.last_dirty_timestamp;
        let (app_key, id_key) = self.keys(&app, &id).expect("present");
        let entry = self
            .apps
            .get_mut(&app_key)
            .and_then(|a| a.get_mut(&id_key))
            .expect("present");
        let before = std::mem::replace(&mut entry.holding, holding);
        self.owners
            .moved(&app_key, &id_key, before.owner(), entry.holding.owner());
        let before = before.kind();
        if taken_over {
            entry.copied = false;
            if let Some(n) = self.by_origin.get_mut(&before) {
                *n = n.saturating_sub(1);
            }
            *self.by_origin.entry(Origin::Pod).or_default() += 1;
        } else if existing.same_description(&candidate) {
            return Outcome::reply(Reply::Unchanged);
        }
        entry.lease.duration_ms = i64::from(info.lease.normalised().duration_secs) * 1000;
        if info.status == Status::Up {
            entry.lease.service_up(now);
        }
        let mut replaced = info;
        replaced.last_dirty_timestamp = now.max(existing.last_dirty_timestamp.saturating_add(1));
        self.modify(&app, &id, now, move |info| {
            *info = InstanceInfo {
                action_type: info.action_type,
                ..replaced
            };
        });
        let view = self.view_of(&app, &id).expect("present");
        let mut replicate = vec![pod_replication(Action::Register, &view)];
        if existing.overridden_status != Status::Unknown && view.info.overridden_status == Status::Unknown {
            // Java peers keep an override until it is deleted explicitly.
            replicate.push(pod_replication(Action::DeleteStatusOverride, &view));
        }
        Outcome {
            reply: Reply::Ok,
            replicate,
            pod_override: None,
        }
    }

    /// A new pod instance.
    fn insert_pod(&mut self, mut info: InstanceInfo, holding: Holding, now: i64) -> Outcome {
        let (app, id) = (info.app.clone(), info.id().to_string());
        let mut lease = Lease::new(now, info.lease.normalised().duration_secs);
        if info.status == Status::Up {
            lease.service_up(now);
        }
        info.action_type = Some(ActionType::Added);
        info.last_updated_timestamp = now;
        info.last_dirty_timestamp = now;
        info.shrink_to_fit();
        self.push_recent_registered(now, &app, &id);
        self.put(
            Entry {
                info: Arc::new(info),
                lease,
                holding,
                copied: false,
            },
            now,
        );
        self.totals.registrations += 1;
        let view = self.view_of(&app, &id).expect("present");
        Outcome {
            reply: Reply::Registered,
            replicate: vec![pod_replication(Action::Register, &view)],
            pod_override: None,
        }
    }

    fn remove_pod(&mut self, app: &str, id: &str, owner: &PodOwner, now: i64) -> Outcome {
        match self.apps.get(app).and_then(|a| a.get(id)).map(|e| &e.holding) {
            Some(Holding::Pod { owner: held_by, .. }) if held_by == owner => {}
            Some(_) => return Outcome::reply(Reply::Refused(format!("instance {id} is not held by {owner}"))),
            None => return Outcome::reply(Reply::NotFound),
        }
        let removed = self.remove(app, id, now).expect("present");
        self.totals.cancellations += 1;
        let mut replication = pod_replication(Action::Cancel, &removed);
        replication.instance = None;
        Outcome {
            reply: Reply::Ok,
            replicate: vec![replication],
            pod_override: None,
        }
    }

    /// Recomputes a pod instance's status after its REST override changed.
    fn refresh_pod_status(&mut self, app: &str, id: &str, dirty: Option<i64>, now: i64) {
        let entry = self.apps.get(app).and_then(|a| a.get(id)).expect("present");
        let Holding::Pod {
            reported,
            overrides,
            rest,
            ..
        } = &entry.holding
        else {
            return;
        };
        let effective = effective_override(*overrides, *rest);
        let status = pod_status(*reported, effective);
        if entry.info.status != status || entry.info.overridden_status != effective {
            self.modify(app, id, now, |info| {
                info.status = status;
                info.overridden_status = effective;
                info.last_dirty_timestamp = dirty.unwrap_or(now).max(info.last_dirty_timestamp.saturating_add(1));
            });
        }
    }

    fn evict_replicated(&mut self, app: &str, id: &str, now: i64) -> Outcome {
        let mode = self.config.lease_expiry;
        let Some(entry) = self.apps.get(app).and_then(|a| a.get(id)) else {
            return Outcome::reply(Reply::NotFound);
        };
        if !entry.holding.counted() {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} is a pod instance or adopted; it does not expire"
            )));
        }
        if !entry.lease.is_expired(now, 0, mode) {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} renewed here within its lease; not evicted"
            )));
        }
        // Counted as a cancellation (`evictions` counts what this replica decided to evict) and
        // replicated no further.
        self.cancelled(app, id, Writer::REPLICA, now)
    }

    // === background work ===

    /// One eviction run: removes (at most the eviction limit of) expired native and replicated
    /// leases, chosen with `seed`, unless self-preservation holds expiry back. Returns a `Cancel`
    /// record per victim written by [`Writer::Expiry`] (Java does not replicate evictions; a
    /// replicator may tell its own replicas, which do not evict themselves).
    pub fn evict(&mut self, now: i64, seed: u64) -> Vec<Replication> {
        let compensation =
            eviction::compensation_ms(self.last_eviction, now, self.config.eviction_interval_timer_in_ms);
        self.last_eviction = Some(now);
        if !self.preservation.lease_expiration_enabled(now) {
            self.totals.eviction_runs_held += 1;
            return Vec::new();
        }
        let mode = self.config.lease_expiry;
        let mut expired: Vec<Evicted> = self
            .apps
            .iter()
            .flat_map(|(app, entries)| {
                entries
                    .iter()
                    .filter(|(_, e)| e.holding.counted() && e.lease.is_expired(now, compensation, mode))
                    .map(|(id, _)| Evicted {
                        app: app.to_string(),
                        id: id.to_string(),
                    })
            })
            .collect();
        expired.sort_by(|a, b| (&a.app, &a.id).cmp(&(&b.app, &b.id)));
        let size = self.non_pod_instances() as usize;
        let limit = eviction::eviction_limit(size, self.config.preservation.renewal_percent_threshold);
        let victims = eviction::choose(expired, limit, seed);
        let mut records = Vec::with_capacity(victims.len());
        for v in victims {
            self.overrides.remove(&v.id);
            if let Some(removed) = self.remove(&v.app, &v.id, now) {
                self.preservation.client_cancelled();
                self.totals.evictions += 1;
                records.push(Replication {
                    action: Action::Cancel,
                    app: v.app,
                    id: v.id,
                    last_dirty_timestamp: None,
                    status: None,
                    overridden_status: None,
                    instance: None,
                    origin: removed.origin,
                    writer: Writer::Expiry,
                });
            }
        }
        records
    }

    /// The periodic renewal-threshold update: the number of native and replicated instances in
    /// this registry becomes the expectation (Java uses its embedded client's view of the peers).
    pub fn update_renewal_threshold(&mut self) -> bool {
        let count = self.non_pod_instances() as i64;
        self.preservation.adopt_count(count)
    }

    /// Drops delta entries older than the retention time and overrides unused for an hour.
    pub fn purge(&mut self, now: i64) {
        let horizon = now - self.config.retention_time_in_ms_in_delta_queue;
        if let Some(touched) = self.changes.prune(horizon) {
            self.version += 1;
            self.changes.pruned_at(now, horizon, self.version, touched);
        }
        let expiry = self.config.override_expiry_ms;
        self.overrides.retain(|_, o| now - o.accessed <= expiry);
        self.claims.purge(now);
    }

    // === reads ===

    /// The whole registry (`GET apps`), including expired leases not yet evicted, as Java.
    pub fn full_view(&self) -> AppsView {
        let mut apps: Vec<AppView> = self
            .apps
            .iter()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(name, entries)| AppView {
                name: name.to_string(),
                instances: self.views(entries.values()),
            })
            .collect();
        apps.sort_by(|a, b| a.name.cmp(&b.name));
        AppsView {
            versions_delta: 1,
            apps_hashcode: self.counts.hashcode(),
            apps,
        }
    }

    /// The applications with instances, sorted, with the version of each one's last change:
    /// what a per-application cache needs to know which of its encodings are still current.
    pub fn app_versions(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .apps
            .iter()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(name, _)| (name.to_string(), self.app_versions.get(&**name).copied().unwrap_or(0)))
            .collect();
        v.sort();
        v
    }

    /// `apps__hashcode` of the whole registry.
    pub fn apps_hashcode(&self) -> String {
        self.counts.hashcode()
    }

    /// The recent changes (`GET apps/delta`), each with the instance's current state, and the hash
    /// code of the full registry at the same moment.
    pub fn delta_view(&self) -> AppsView {
        let apps: Vec<AppView> = self
            .changes
            .delta_apps()
            .filter_map(|app| self.delta_group(app))
            .collect();
        AppsView {
            versions_delta: self.version as i64,
            apps_hashcode: self.counts.hashcode(),
            apps,
        }
    }

    /// One application's part of the delta (`None` if it has none), with the version of its
    /// last change: what a per-application cache of the delta needs.
    pub fn delta_app_view(&self, app: &str) -> Option<(AppView, u64)> {
        let version = self.changes.delta_app_version(app)?;
        self.delta_group(app).map(|view| (view, version))
    }

    /// The applications the delta lists, sorted, with the version of each one's part.
    pub fn delta_app_versions(&self) -> Vec<(Arc<str>, u64)> {
        self.changes.delta_app_versions()
    }

    /// The applications changed after registry version `version` (sorted), or `None` if the
    /// change log no longer reaches back that far.
    pub fn apps_changed_since(&self, version: u64) -> Option<Vec<Arc<str>>> {
        self.changes.apps_changed_since(version)
    }

    /// The applications whose part of the delta changed after `version` (sorted), or `None`.
    pub fn delta_apps_changed_since(&self, version: u64) -> Option<Vec<Arc<str>>> {
        self.changes.delta_apps_changed_since(version)
    }

    /// The registry version of `app`'s last change, if it has instances.
    pub fn app_version(&self, app: &str) -> Option<u64> {
        self.app_versions.get(app).copied()
    }

    /// The delta's entries for `app`: each changed instance in its current state, or its last
    /// state if it was removed.
    fn delta_group(&self, app: &str) -> Option<AppView> {
        let mut instances: Vec<InstanceView> = self
            .changes
            .delta_entries(app)
            .filter_map(|(id, removed)| match removed {
                Some(removed) => Some(removed.clone()),
                None => self.view_of(app, id),
            })
            .collect();
        if instances.is_empty() {
            return None;
        }
        // Removed instances last: Netflix's client (1.x and 2.x, `updateDelta`) adopts the
        // delta's whole application object at its first ADDED or MODIFIED entry when the
        // application is new to it, and skips DELETED entries seen before that, so a
        // removed instance listed first would stay in its copy and break the hash code.
        instances.sort_by(|a, b| {
            let removed = |i: &InstanceView| i.action_type() == Some(ActionType::Deleted);
            (removed(a), a.id()).cmp(&(removed(b), b.id()))
        });
        Some(AppView {
            name: app.to_string(),
            instances,
        })
    }

    /// One application (`GET apps/{app}`); `None` when it has no instances.
    pub fn app_view(&self, app: &str) -> Option<AppView> {
        let entries = self.apps.get(app).filter(|e| !e.is_empty())?;
        Some(AppView {
            name: app.to_string(),
            instances: self.views(entries.values()),
        })
    }

    /// Instances with `vip` among their (secure) VIP addresses (`GET vips/{vip}`, `svips/{vip}`).
    pub fn vip_view(&self, vip: &str, secure: bool) -> AppsView {
        let mut apps: Vec<AppView> = self
            .apps
            .iter()
            .filter_map(|(name, entries)| {
                let instances = self.views(entries.values().filter(|e| e.info.has_vip(vip, secure)));
                (!instances.is_empty()).then(|| AppView {
                    name: name.to_string(),
                    instances,
                })
            })
            .collect();
        apps.sort_by(|a, b| a.name.cmp(&b.name));
        let hash = StatusCounts::of(apps.iter().flat_map(|a| &a.instances)).hashcode();
        AppsView {
            versions_delta: -1,
            apps_hashcode: hash,
            apps,
        }
    }

    /// `GET apps/{app}/{id}`: hidden once expired while expiration is enabled.
    pub fn instance(&mut self, app: &str, id: &str, now: i64) -> Option<InstanceView> {
        if !self.visible(app, id, now) {
            return None;
        }
        self.view_of(app, id)
    }

    /// `GET instances/{id}`: the first application holding `id`.
    pub fn find_instance(&mut self, id: &str, now: i64) -> Option<InstanceView> {
        let mut names: Vec<String> = self
            .apps
            .iter()
            .filter(|(_, e)| e.contains_key(id))
            .map(|(n, _)| n.to_string())
            .collect();
        names.sort();
        names.into_iter().find_map(|app| self.instance(&app, id, now))
    }

    /// Pod instances, for the controller to diff against what it wants.
    pub fn pod_instances(&self) -> Vec<(PodOwner, InstanceView)> {
        self.apps
            .values()
            .flat_map(|entries| entries.values())
            .filter_map(|e| match &e.holding {
                Holding::Pod { owner, .. } => Some((owner.clone(), self.view(e))),
                _ => None,
            })
            .collect()
    }

    /// The REST overrides on pod instances that their pods' annotations do not show yet (for
    /// the leader to record on the pods).
    pub fn pending_pod_overrides(&self) -> Vec<PodOverride> {
        self.apps
            .values()
            .flat_map(|entries| entries.values())
            .filter_map(|e| match &e.holding {
                Holding::Pod {
                    owner, rest: Some(r), ..
                } => Some(PodOverride {
                    owner: owner.clone(),
                    status: match r {
                        RestOverride::Set(s) => Some(*s),
                        RestOverride::Deleted => None,
                    },
                }),
                _ => None,
            })
            .collect()
    }

    /// The stored description of `app`/`id` (expired or not), shared.
    pub fn stored(&self, app: &str, id: &str) -> Option<Arc<InstanceInfo>> {
        self.apps.get(app).and_then(|a| a.get(id)).map(|e| e.info.clone())
    }

    /// Whether a lease exists for `app`/`id` (expired or not).
    pub fn contains(&self, app: &str, id: &str) -> bool {
        self.apps.get(app).is_some_and(|a| a.contains_key(id))
    }

    /// The pod instances of one EurekaApp.
    pub fn pod_instances_of(&self, namespace: &str, eureka_app: &str) -> Vec<(PodOwner, InstanceView)> {
        self.owned_by(namespace, eureka_app)
            .filter_map(|e| match &e.holding {
                Holding::Pod { owner, .. } if owner.namespace == namespace && owner.eureka_app == eureka_app => {
                    Some((owner.clone(), self.view(e)))
                }
                _ => None,
            })
            .collect()
    }

    /// The entries held for one EurekaApp (pod instances and adopted registrations), from the
    /// owner index: what that EurekaApp holds, not the whole registry.
    fn owned_by<'a>(&'a self, namespace: &str, eureka_app: &str) -> impl Iterator<Item = &'a Entry> {
        self.owners
            .of(namespace, eureka_app)
            .filter_map(|(app, id)| self.apps.get(app).and_then(|a| a.get(id)))
    }

    /// Checks the owner index against a scan of every entry.
    #[cfg(test)]
    fn assert_owner_index(&self) {
        let mut scanned: Vec<(String, String, String, String)> = self
            .apps
            .iter()
            .flat_map(|(app, entries)| entries.iter().map(move |(id, e)| (app, id, e)))
            .filter_map(|(app, id, e)| {
                let o = e.holding.owner()?;
                Some((
                    o.namespace.clone(),
                    o.eureka_app.clone(),
                    app.to_string(),
                    id.to_string(),
                ))
            })
            .collect();
        scanned.sort();
        assert_eq!(self.owners.all(), scanned, "the owner index is out of step");
    }

    /// Until when fetches are refused after an empty start, if they are.
    pub fn reads_refused_until(&self) -> Option<i64> {
        self.preservation.reads_refused_until()
    }

    pub fn stats(&mut self, now: i64) -> Stats {
        let lease_expiration_enabled = self.preservation.lease_expiration_enabled(now);
        Stats {
            renews_last_min: self.preservation.renews_last_min(now),
            renews_threshold: self.preservation.threshold,
            expected_clients: self.preservation.expected_clients,
            self_preservation_enabled: self.config.preservation.enable_self_preservation,
            lease_expiration_enabled,
            below_renew_threshold: self.preservation.below_renew_threshold(now),
            self_preservation_active: self.preservation.active(now),
            allow_access: self.preservation.allow_access(now),
            startup_time: self.preservation.startup_time,
            instances: self.counts.total(),
            expired: self.expired_count(now),
            by_origin: [Origin::Native, Origin::Replicated, Origin::Pod, Origin::Adopted]
                .map(|k| (k, self.by_origin.get(&k).copied().unwrap_or(0))),
            by_status: self.counts,
            applications: self.apps.values().filter(|a| !a.is_empty()).count(),
            version: self.version,
            totals: self.totals,
        }
    }

    /// The last registrations and cancellations, newest first, as `(time, "APP(id)")`.
    pub fn recent(&self) -> (Recent, Recent) {
        (
            self.recent_registered.iter().rev().cloned().collect(),
            self.recent_cancelled.iter().rev().cloned().collect(),
        )
    }

    // === internals ===

    fn expired_count(&self, now: i64) -> u64 {
        let mode = self.config.lease_expiry;
        self.apps
            .values()
            .flat_map(|a| a.values())
            .filter(|e| e.holding.counted() && e.lease.is_expired(now, 0, mode))
            .count() as u64
    }

    /// The native and replicated instances: those that count toward self-preservation.
    fn non_pod_instances(&self) -> u64 {
        let held = |o| self.by_origin.get(&o).copied().unwrap_or(0);
        self.counts
            .total()
            .saturating_sub(held(Origin::Pod) + held(Origin::Adopted))
    }

    /// The override of `id`, marked as read now (a field borrow, so the heartbeat can hold its
    /// entry meanwhile).
    fn access_override(overrides: &mut HashMap<String, OverrideEntry>, id: &str, now: i64) -> Option<Status> {
        let o = overrides.get_mut(id)?;
        o.accessed = now;
        Some(o.status)
    }

    fn lease_view(&self, e: &Entry) -> LeaseView {
        LeaseView {
            renewal_interval_secs: e.info.lease.normalised().renewal_interval_secs,
            duration_secs: (e.lease.duration_ms / 1000) as i32,
            registration_ts: e.lease.registration_ts,
            last_renewal_ts: e.lease.last_update(self.config.lease_expiry),
            eviction_ts: e.lease.eviction_ts,
            service_up_ts: e.lease.service_up_ts,
        }
    }

    fn view(&self, e: &Entry) -> InstanceView {
        InstanceView {
            info: e.info.clone(),
            lease: self.lease_view(e),
            origin: e.holding.kind(),
        }
    }

    fn views<'a>(&self, entries: impl Iterator<Item = &'a Entry>) -> Vec<InstanceView> {
        let mut v: Vec<InstanceView> = entries.map(|e| self.view(e)).collect();
        v.sort_by(|a, b| a.id().cmp(b.id()));
        v
    }

    fn view_of(&self, app: &str, id: &str) -> Option<InstanceView> {
        self.apps.get(app).and_then(|a| a.get(id)).map(|e| self.view(e))
    }

    fn push_recent_registered(&mut self, now: i64, app: &str, id: &str) {
        self.recent_registered.push_back((now, format!("{app}({id})")));
        while self.recent_registered.len() > self.config.recent_queue_len {
            self.recent_registered.pop_front();
        }
    }

    fn record_change(&mut self, now: i64, app: &Arc<str>, id: &Arc<str>, removed: Option<InstanceView>) {
        self.version += 1;
        self.changes.record(now, self.version, app, id, removed);
        self.app_versions.insert(app.clone(), self.version);
    }

    /// Inserts or replaces an entry, keeping the counters right, and logs an ADDED change.
    fn put(&mut self, entry: Entry, now: i64) {
        self.counts.add(entry.info.status);
        *self.by_origin.entry(entry.holding.kind()).or_default() += 1;
        self.text_bytes += entry.info.text_bytes();
        let owner = entry.holding.owner().cloned();
        let app_key = shared_name(&self.apps, &entry.info.app);
        let instances = self.apps.entry(app_key.clone()).or_default();
        let id_key = shared_name(instances, entry.info.id());
        let old = instances.insert(id_key.clone(), entry);
        self.owners.moved(
            &app_key,
            &id_key,
            old.as_ref().and_then(|o| o.holding.owner()),
            owner.as_ref(),
        );
        if let Some(old) = old {
            self.text_bytes -= old.info.text_bytes();
            self.counts.remove(old.info.status);
            if let Some(n) = self.by_origin.get_mut(&old.holding.kind()) {
                *n = n.saturating_sub(1);
            }
        }
        self.record_change(now, &app_key, &id_key, None);
    }

    /// The names `app` and `id` are stored under, shared (none when not stored).
    fn keys(&self, app: &str, id: &str) -> Option<(Arc<str>, Arc<str>)> {
        let (app_key, instances) = self.apps.get_key_value(app)?;
        let (id_key, _) = instances.get_key_value(id)?;
        Some((app_key.clone(), id_key.clone()))
    }

    /// Edits a stored instance (copy-on-write), marks it MODIFIED and logs the change.
    fn modify(&mut self, app: &str, id: &str, now: i64, edit: impl FnOnce(&mut InstanceInfo)) {
        let Some(entry) = self.apps.get_mut(app).and_then(|a| a.get_mut(id)) else {
            return;
        };
        let old = entry.info.status;
        let bytes = entry.info.text_bytes();
        let info = Arc::make_mut(&mut entry.info);
        edit(info);
        self.text_bytes = self.text_bytes - bytes + info.text_bytes();
        info.action_type = Some(ActionType::Modified);
        info.last_updated_timestamp = now;
        let new = info.status;
        self.counts.remove(old);
        self.counts.add(new);
        let (app, id) = self.keys(app, id).expect("present");
        self.record_change(now, &app, &id, None);
    }

    /// Removes an entry, cancels its lease and logs a DELETED change with its last state.
    fn remove(&mut self, app: &str, id: &str, now: i64) -> Option<InstanceView> {
        let (app_key, id_key) = self.keys(app, id)?;
        let mut entry = self.apps.get_mut(app)?.remove(id)?;
        self.owners.moved(&app_key, &id_key, entry.holding.owner(), None);
        self.text_bytes -= entry.info.text_bytes();
        entry.lease.cancel(now);
        let info = Arc::make_mut(&mut entry.info);
        info.action_type = Some(ActionType::Deleted);
        info.last_updated_timestamp = now;
        self.counts.remove(entry.info.status);
        if let Some(n) = self.by_origin.get_mut(&entry.holding.kind()) {
            *n = n.saturating_sub(1);
        }
        self.recent_cancelled.push_back((now, format!("{app}({id})")));
        while self.recent_cancelled.len() > self.config.recent_queue_len {
            self.recent_cancelled.pop_front();
        }
        let view = self.view(&entry);
        self.record_change(now, &app_key, &id_key, Some(view.clone()));
        if self.apps.get(app).is_some_and(|a| a.is_empty()) {
            // Names of gone applications are not kept (clients may invent any number of them).
            self.apps.remove(app);
            self.app_versions.remove(app);
        }
        Some(view)
    }
}

/// A pod instance's status: what the pod maps to, unless it is UP or OUT_OF_SERVICE and an
/// override applies (the same first rules as Java's chain).
fn pod_status(reported: Status, override_status: Status) -> Status {
    let o = (override_status != Status::Unknown).then_some(override_status);
    rules::resolve(reported, o, None, true)
}

fn pod_replication(action: Action, view: &InstanceView) -> Replication {
    Replication {
        action,
        app: view.info.app.clone(),
        id: view.id().to_string(),
        last_dirty_timestamp: Some(view.info.last_dirty_timestamp),
        status: Some(view.info.status),
        overridden_status: None,
        instance: (action == Action::Register).then(|| view.clone()),
        origin: Origin::Pod,
        writer: Writer::Controller,
    }
}

/// The key `map` already holds for `name`, shared, or a new one.
fn shared_name<V>(map: &HashMap<Arc<str>, V>, name: &str) -> Arc<str> {
    match map.get_key_value(name) {
        Some((k, _)) => k.clone(),
        None => Arc::from(name),
    }
}

#[cfg(test)]
mod tests;
