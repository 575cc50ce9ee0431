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
//! Imported instances come from other clusters over links ([`imports`]): shown, never written
//! by this cluster's clients, never replicated.

pub mod adoption;
pub mod changes;
pub mod eviction;
pub mod imports;
pub mod instance;
pub mod lease;
pub mod limits;
mod native;
mod owners;
mod pods;
pub mod preservation;
mod reads;
pub mod rules;
mod store;
pub mod view;

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

pub use adoption::{Claim, ClaimKey, ClaimState};
use instance::{CompactString, InstanceInfo, Metadata, Status};
use lease::ExpiryMode;
use limits::{LimitExceeded, Limits};
use native::OverrideEntry;
use preservation::{Preservation, PreservationConfig};
use store::Store;
use view::{InstanceView, Origin, StatusCounts};

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

/// The Kubernetes object a pod instance stands for. Plain strings: no Kubernetes types here (kept
/// inline when short, like the instance's: every stored pod instance carries one).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodOwner {
    /// The namespace of the pod and of its EurekaApp.
    pub namespace: CompactString,
    /// The EurekaApp that selects the pod.
    pub eureka_app: CompactString,
    /// The pod's name.
    pub pod: CompactString,
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
    /// What a fetch over a link brought (see [`imports`]).
    Import {
        link: String,
        batch: imports::ImportBatch,
    },
    /// How a link's instances are shown now (its visibility, or its partition state).
    SetLinkRule {
        link: String,
        rule: imports::LinkRule,
    },
    /// Forgets a link and what it imported.
    DropLink {
        link: String,
    },
}

impl Command {
    /// The one instance a client, peer or controller write is about.
    fn target(&self) -> Option<(&str, &str)> {
        match self {
            Command::Register { info, .. } | Command::RegisterCopy { info } | Command::UpsertPod { info, .. } => {
                Some((&info.app, info.id()))
            }
            Command::Renew { app, id, .. }
            | Command::Cancel { app, id, .. }
            | Command::SetStatus { app, id, .. }
            | Command::DeleteStatusOverride { app, id, .. }
            | Command::UpdateMetadata { app, id, .. }
            | Command::MergeMetadata { app, id, .. }
            | Command::Evict { app, id }
            | Command::CancelCopy { app, id, .. }
            | Command::RemovePod { app, id, .. } => Some((app, id)),
            Command::Claim { .. }
            | Command::Unclaim { .. }
            | Command::Import { .. }
            | Command::SetLinkRule { .. }
            | Command::DropLink { .. } => None,
        }
    }
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
pub enum ReplicationAction {
    Register,
    Heartbeat,
    Cancel,
    StatusUpdate,
    DeleteStatusOverride,
}

impl ReplicationAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicationAction::Register => "Register",
            ReplicationAction::Heartbeat => "Heartbeat",
            ReplicationAction::Cancel => "Cancel",
            ReplicationAction::StatusUpdate => "StatusUpdate",
            ReplicationAction::DeleteStatusOverride => "DeleteStatusOverride",
        }
    }

    pub fn parse(s: &str) -> Option<ReplicationAction> {
        [
            ReplicationAction::Register,
            ReplicationAction::Heartbeat,
            ReplicationAction::Cancel,
            ReplicationAction::StatusUpdate,
            ReplicationAction::DeleteStatusOverride,
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
    pub action: ReplicationAction,
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
    pub by_origin: [(Origin, u64); 5],
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

/// The registry. See the module docs.
#[derive(Debug)]
pub struct Registry {
    /// Behaviour settings.
    config: RegistryConfig,
    /// The instances and every index over them.
    store: Store,
    /// REST status overrides by instance id.
    overrides: HashMap<String, OverrideEntry>,
    /// The dashboard's last registrations (time, `APP(id)`).
    recent_registered: VecDeque<(i64, String)>,
    /// The dashboard's last cancellations.
    recent_cancelled: VecDeque<(i64, String)>,
    /// Self-preservation's expected clients, threshold and renewal rate.
    preservation: Preservation,
    /// When eviction last ran (its lateness is compensated, as Java's is).
    last_eviction: Option<i64>,
    /// Counters since start, for metrics.
    totals: Totals,
    /// What the controller says about the pods of adopting EurekaApps.
    claims: adoption::Claims,
    /// Recent cancels: `(app, id)` → (the cancelled copy's `lastDirtyTimestamp`, when).
    cancelled: HashMap<(String, String), (i64, i64)>,
    /// Every link's copy of another cluster's export.
    imports: imports::Imports,
}

impl Registry {
    pub fn new(config: RegistryConfig, now: i64) -> Registry {
        let preservation = Preservation::new(
            config.preservation.clone(),
            config.expected_number_of_clients_sending_renews,
            now,
        );
        Registry {
            store: Store::new(config.lease_expiry),
            config,
            overrides: HashMap::new(),
            recent_registered: VecDeque::new(),
            recent_cancelled: VecDeque::new(),
            preservation,
            last_eviction: None,
            totals: Totals::default(),
            claims: adoption::Claims::default(),
            cancelled: HashMap::new(),
            imports: imports::Imports::default(),
        }
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// Changes whenever anything a reader can see changes (not on plain renewals).
    pub fn version(&self) -> u64 {
        self.store.version()
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
        let outcome = if self.imports.is_empty() {
            self.write(command, now)
        } else {
            self.write_beside_imports(command, now)
        };
        #[cfg(test)]
        self.store.assert_indices();
        outcome
    }

    /// [`Registry::apply`] when links hold imports: a write on an id an import shows follows the
    /// import rules ([`Registry::on_import`]), and a visible change to an application links also
    /// hold settles what shows of it.
    fn write_beside_imports(&mut self, command: Command, now: i64) -> Outcome {
        let (mut settle, mut imported) = (None, None);
        if let Some((app, id)) = command.target() {
            if self.imports.holds_app(app) {
                settle = Some(app.to_string());
            }
            imported = self
                .imported_through(app, id)
                .map(|link| (app.to_string(), id.to_string(), link));
        }
        // Taken before a registration lifts the import, so a refused one shows it again.
        let before = self.store.version();
        if let Some((app, id, link)) = imported
            && let Some(reply) = self.on_import(&command, &app, &id, &link, now)
        {
            return Outcome::reply(reply);
        }
        let claims = matches!(command, Command::Claim { .. } | Command::Unclaim { .. });
        let outcome = self.write(command, now);
        if self.store.version() != before {
            match settle {
                Some(app) => self.settle_imports(&app, now),
                None if claims => self.settle_all_imports(now),
                None => {}
            }
        }
        outcome
    }

    /// A client, peer or controller write on an instance shown as an import: a registration
    /// (or a pod) takes the id as a local instance, which hides the import (`None`: go on with
    /// the write); a heartbeat or cancel finds no lease of this cluster; a status or metadata
    /// change belongs to the source cluster.
    fn on_import(&mut self, command: &Command, app: &str, id: &str, link: &str, now: i64) -> Option<Reply> {
        match command {
            Command::Register { .. } | Command::RegisterCopy { .. } | Command::UpsertPod { .. } => {
                self.store.remove(app, id, now);
                None
            }
            Command::Renew { .. }
            | Command::Cancel { .. }
            | Command::Evict { .. }
            | Command::CancelCopy { .. }
            | Command::RemovePod { .. } => Some(Reply::NotFound),
            Command::SetStatus { .. }
            | Command::DeleteStatusOverride { .. }
            | Command::UpdateMetadata { .. }
            | Command::MergeMetadata { .. } => Some(Reply::Refused(format!(
                "{app}/{id} is imported from the cluster behind link {link:?}; change it in that cluster"
            ))),
            Command::Claim { .. }
            | Command::Unclaim { .. }
            | Command::Import { .. }
            | Command::SetLinkRule { .. }
            | Command::DropLink { .. } => None,
        }
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
            Command::Import { link, batch } => self.import(&link, batch, now),
            Command::SetLinkRule { link, rule } => self.set_link_rule(&link, rule, now),
            Command::DropLink { link } => self.drop_link(&link, now),
        }
    }

    // === background work ===

    /// The periodic renewal-threshold update: the number of native and replicated instances in
    /// this registry becomes the expectation (Java uses its embedded client's view of the peers).
    pub fn update_renewal_threshold(&mut self) -> bool {
        let count = self.expiring_instances() as i64;
        self.preservation.adopt_count(count)
    }

    /// Drops delta entries older than the retention time and overrides unused for an hour.
    pub fn purge(&mut self, now: i64) {
        let horizon = now - self.config.retention_time_in_ms_in_delta_queue;
        self.store.prune_changes(now, horizon);
        self.prune_offers(now, horizon);
        let expiry = self.config.override_expiry_ms;
        self.overrides.retain(|_, o| now - o.accessed <= expiry);
        self.claims.purge(now);
        self.settle_all_imports(now);
    }

    // === reads ===

    /// The native and replicated instances: those that count toward self-preservation.
    fn expiring_instances(&self) -> u64 {
        self.store.held(Origin::Native) + self.store.held(Origin::Replicated)
    }

    fn push_recent_registered(&mut self, now: i64, app: &str, id: &str) {
        self.recent_registered.push_back((now, format!("{app}({id})")));
        while self.recent_registered.len() > self.config.recent_queue_len {
            self.recent_registered.pop_front();
        }
    }

    /// Removes an instance (see [`Store::remove`]) and lists it among the dashboard's last
    /// cancellations.
    fn remove(&mut self, app: &str, id: &str, now: i64) -> Option<InstanceView> {
        let view = self.store.remove(app, id, now)?;
        if self.imports.holds_app(app) {
            // An import this instance hid shows again.
            self.settle_imports(app, now);
        }
        self.recent_cancelled.push_back((now, format!("{app}({id})")));
        while self.recent_cancelled.len() > self.config.recent_queue_len {
            self.recent_cancelled.pop_front();
        }
        Some(view)
    }
}

#[cfg(test)]
mod tests;
