//! The stored instances and every index kept over them, with one owner: [`Store`]'s methods are
//! the only way to add, change or remove an entry, and each keeps the indices in step (the counts
//! by status behind the hash code, the counts by origin, the bytes of text the caps measure, the
//! owner index, the expiry order of the leases that expire, the delta's change log and the
//! versions caches read). The registry's rules decide what to write; this module only stores it.
//!
//! The expiry order lets a scrape count expired leases, and an eviction run find them, in time
//! proportional to what has expired, not to the size of the registry.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{
    PodOverrides, PodOwner,
    adoption::Adoption,
    changes::ChangeLog,
    instance::{ActionType, InstanceInfo, Status},
    lease::{ExpiryMode, Lease},
    owners::Owners,
    view::{InstanceView, LeaseView, Origin, StatusCounts},
};

/// A REST override on a pod instance that the pod's annotation does not show yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RestOverride {
    Set(Status),
    Deleted,
}

impl RestOverride {
    /// Whether the annotation now records it (from then on the annotation is the truth, so a
    /// `kubectl` edit of the annotation takes effect).
    pub(super) fn persisted(self, annotation: Option<Status>) -> bool {
        match self {
            RestOverride::Set(s) => annotation == Some(s),
            RestOverride::Deleted => annotation.is_none(),
        }
    }
}

/// How the registry holds an instance: what its [`Origin`] is, plus what a pod instance needs.
#[derive(Clone, Debug)]
pub(super) enum Holding {
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
    /// Imported over the named link.
    Imported {
        link: Arc<str>,
    },
}

impl Holding {
    pub(super) fn kind(&self) -> Origin {
        match self {
            Holding::Native => Origin::Native,
            Holding::Replicated => Origin::Replicated,
            Holding::Pod { .. } => Origin::Pod,
            Holding::Adopted(_) => Origin::Adopted,
            Holding::Imported { .. } => Origin::Imported,
        }
    }

    /// A registration by a client of this cluster (native, replicated or adopted): what
    /// adoption may take.
    pub(super) fn is_client_registration(&self) -> bool {
        matches!(self, Holding::Native | Holding::Replicated | Holding::Adopted(_))
    }

    pub(super) fn is_pod(&self) -> bool {
        matches!(self, Holding::Pod { .. })
    }

    /// The EurekaApp's pod the instance is held for: pod instances and adopted registrations.
    pub(super) fn owner(&self) -> Option<&PodOwner> {
        match self {
            Holding::Pod { owner, .. } => Some(owner),
            Holding::Adopted(a) => Some(&a.owner),
            Holding::Native | Holding::Replicated | Holding::Imported { .. } => None,
        }
    }

    /// Whether the lease expires (and counts toward self-preservation): native and replicated
    /// instances. Pod instances and adopted registrations live as long as their pods.
    pub(super) fn expires(&self) -> bool {
        matches!(self, Holding::Native | Holding::Replicated)
    }
}

/// One stored instance.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// The instance as shown (status after the override rules), shared with readers.
    pub(super) info: Arc<InstanceInfo>,
    /// Its lease.
    pub(super) lease: Lease,
    /// Who holds it, which decides expiry, eviction and self-preservation.
    pub(super) holding: Holding,
    /// Registered from a copy of a peer's registry (`Command::RegisterCopy`).
    pub(super) copied: bool,
    /// The deadline its lease is filed under in the [`ExpiryOrder`] (while it has one): never
    /// later than the lease's deadline. Set by the store.
    filed: i64,
}

impl Entry {
    pub(super) fn new(info: Arc<InstanceInfo>, lease: Lease, holding: Holding, copied: bool) -> Entry {
        Entry {
            info,
            lease,
            holding,
            copied,
            filed: 0,
        }
    }
}

/// What a heartbeat's renewal leaves for the rules to answer with (see [`Store::renew`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Renewed {
    pub(super) last_dirty_timestamp: i64,
    pub(super) status: Status,
    pub(super) origin: Origin,
}

/// Application name → instance id → entry. The names are shared with the change log and the
/// owner and expiry indices.
type Apps = HashMap<Arc<str>, HashMap<Arc<str>, Entry>>;

/// The instances and their indices. See the module docs.
#[derive(Debug)]
pub(super) struct Store {
    apps: Apps,
    /// When leases expire (Java's double duration or the fix).
    mode: ExpiryMode,
    /// Instances per status, for the hash code.
    counts: StatusCounts,
    /// Instances per origin (indexed by [`slot`]).
    by_origin: [u64; 5],
    /// Imported instances per status (what the export view leaves out of the hash code).
    imported: StatusCounts,
    /// Bytes of text of every stored instance but imports (what `limits.max_registry_bytes` caps).
    text_bytes: usize,
    /// The instances each EurekaApp holds (pod and adopted).
    owners: Owners,
    /// The leases that expire, by the time they do.
    expiring: ExpiryOrder,
    /// The delta's change log, by application, pruned after the retention time.
    changes: ChangeLog,
    /// Bumped by every change a fetch shows (heartbeats do not).
    version: u64,
    /// The registry version of each application's last change (for per-application caches).
    app_versions: HashMap<Arc<str>, u64>,
}

/// The expiring leases by deadline, and how many of them expire before a mark, kept as leases
/// come and go, so that the count of expired leases (every scrape and dashboard view asks) costs
/// only the leases that expired since it was last asked.
///
/// A lease's key is the deadline it is filed under and then the address of its instance's
/// stored id, which is unique among stored instances and lives as long as the lease is here (the
/// value holds it); comparing integers instead of names spares the cache misses of reading two
/// strings per comparison. Ties are in no useful order; the one reader that lists leases
/// (eviction) sorts what it takes.
///
/// Filing is lazy: a heartbeat only moves its lease's deadline later, so the lease stays where
/// it was filed and is refiled under its deadline when a reader reaches it ([`Store::refile`]).
/// A lease renewed every 30 s with a 90 s lease is refiled about once per 90 s instead of
/// moved at every heartbeat, and off the heartbeat's path. Leases filed before the mark are
/// filed exactly (what the count counts): a heartbeat on one of them refiles it at once, as does
/// one whose deadline went back (the clock did).
#[derive(Clone, Debug)]
struct ExpiryOrder {
    leases: BTreeMap<(i64, usize), (Arc<str>, Arc<str>)>,
    /// `(mark, count)`: `count` leases have a deadline before `mark`.
    expired_before: (i64, u64),
}

impl Default for ExpiryOrder {
    fn default() -> ExpiryOrder {
        ExpiryOrder {
            leases: BTreeMap::new(),
            expired_before: (i64::MIN, 0),
        }
    }
}

/// A lease's place in the [`ExpiryOrder`].
fn expiry_key(d: i64, id: &Arc<str>) -> (i64, usize) {
    (d, Arc::as_ptr(id).cast::<u8>().addr())
}

impl ExpiryOrder {
    fn insert(&mut self, d: i64, app: &Arc<str>, id: &Arc<str>) {
        if self
            .leases
            .insert(expiry_key(d, id), (app.clone(), id.clone()))
            .is_none()
            && d < self.expired_before.0
        {
            self.expired_before.1 += 1;
        }
    }

    fn remove(&mut self, d: i64, id: &Arc<str>) {
        if self.leases.remove(&expiry_key(d, id)).is_some() && d < self.expired_before.0 {
            self.expired_before.1 -= 1;
        }
    }

    /// Moves a lease filed under `filed` to `d`.
    fn refile(&mut self, filed: i64, d: i64, app: &Arc<str>, id: &Arc<str>) {
        self.remove(filed, id);
        self.insert(d, app, id);
    }

    /// Costs the leases that expired since the last call, or a scan of the expired ones if the
    /// clock went back.
    fn expired_count(&mut self, now: i64) -> u64 {
        let (mark, count) = self.expired_before;
        // `(t, 0)` is below every key with deadline `t`.
        let count = if now >= mark {
            count + self.leases.range((mark, 0)..(now, 0)).count() as u64
        } else {
            self.leases.range(..(now, 0)).count() as u64
        };
        self.expired_before = (now, count);
        count
    }
}

/// The position of an origin in [`Store::by_origin`].
fn slot(origin: Origin) -> usize {
    match origin {
        Origin::Native => 0,
        Origin::Replicated => 1,
        Origin::Pod => 2,
        Origin::Adopted => 3,
        Origin::Imported => 4,
    }
}

/// When an entry's lease expires in `mode`, if it is one that does.
fn deadline(lease: &Lease, holding: &Holding, mode: ExpiryMode) -> Option<i64> {
    holding.expires().then(|| lease.last_update(mode) + lease.duration_ms)
}

/// The bytes of text an entry counts toward the registry's cap: imports have their links' caps
/// and never take room from this cluster's own clients.
fn counted_bytes(e: &Entry) -> usize {
    match e.holding {
        Holding::Imported { .. } => 0,
        _ => e.info.text_bytes(),
    }
}

/// The key `map` already holds for `name`, shared, or a new one.
fn shared_name<V>(map: &HashMap<Arc<str>, V>, name: &str) -> Arc<str> {
    match map.get_key_value(name) {
        Some((k, _)) => k.clone(),
        None => Arc::from(name),
    }
}

impl Store {
    pub(super) fn new(mode: ExpiryMode) -> Store {
        Store {
            apps: HashMap::new(),
            mode,
            counts: StatusCounts::default(),
            by_origin: [0; 5],
            imported: StatusCounts::default(),
            text_bytes: 0,
            owners: Owners::default(),
            expiring: ExpiryOrder::default(),
            changes: ChangeLog::default(),
            version: 1,
            app_versions: HashMap::new(),
        }
    }

    // === reads ===

    pub(super) fn get(&self, app: &str, id: &str) -> Option<&Entry> {
        self.apps.get(app).and_then(|a| a.get(id))
    }

    /// One application's entries (never empty: an application goes with its last instance).
    pub(super) fn app(&self, app: &str) -> Option<&HashMap<Arc<str>, Entry>> {
        self.apps.get(app)
    }

    pub(super) fn apps(&self) -> impl Iterator<Item = (&Arc<str>, &HashMap<Arc<str>, Entry>)> {
        self.apps.iter()
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.apps.values().flat_map(|a| a.values())
    }

    pub(super) fn application_count(&self) -> usize {
        self.apps.len()
    }

    pub(super) fn counts(&self) -> &StatusCounts {
        &self.counts
    }

    /// Imported instances per status.
    pub(super) fn imported_counts(&self) -> &StatusCounts {
        &self.imported
    }

    /// Instances of one origin.
    pub(super) fn held(&self, origin: Origin) -> u64 {
        self.by_origin[slot(origin)]
    }

    pub(super) fn text_bytes(&self) -> usize {
        self.text_bytes
    }

    pub(super) fn version(&self) -> u64 {
        self.version
    }

    pub(super) fn app_version(&self, app: &str) -> Option<u64> {
        self.app_versions.get(app).copied()
    }

    pub(super) fn changes(&self) -> &ChangeLog {
        &self.changes
    }

    /// The entries held for one EurekaApp (pod instances and adopted registrations), from the
    /// owner index: what that EurekaApp holds, not the whole registry.
    pub(super) fn owned_by<'a>(&'a self, namespace: &str, eureka_app: &str) -> impl Iterator<Item = &'a Entry> {
        self.owners
            .of(namespace, eureka_app)
            .filter_map(|(app, id)| self.get(app, id))
    }

    /// The expiring leases that are expired at `now` with `additional_ms` of grace, as
    /// `(app, id)`, soonest expired first; costs what has expired (and what was renewed since it
    /// was last filed, once).
    pub(super) fn expired(&mut self, now: i64, additional_ms: i64) -> impl Iterator<Item = (&Arc<str>, &Arc<str>)> {
        // `now > deadline + additional` ⇔ `deadline < now - additional`.
        let below = now.saturating_sub(additional_ms);
        self.refile(below);
        self.expiring.leases.range(..(below, 0)).map(|(_, (app, id))| (app, id))
    }

    /// How many expiring leases are expired at `now` (what `expired(now, 0)` would list).
    pub(super) fn expired_count(&mut self, now: i64) -> u64 {
        self.refile(now);
        self.expiring.expired_count(now)
    }

    /// Refiles under their deadlines the leases filed before `below` that were renewed since
    /// they were filed, so that every lease filed before `below` is filed exactly. Those filed
    /// before the mark already are (see [`ExpiryOrder`]).
    fn refile(&mut self, below: i64) {
        let (mark, mode) = (self.expiring.expired_before.0, self.mode);
        if below <= mark {
            return;
        }
        let moved: Vec<(i64, i64, Arc<str>, Arc<str>)> = self
            .expiring
            .leases
            .range((mark, 0)..(below, 0))
            .filter_map(|(&(filed, _), (app, id))| {
                let e = self.apps.get(app)?.get(id)?;
                let d = deadline(&e.lease, &e.holding, mode)?;
                (d != filed).then(|| (filed, d, app.clone(), id.clone()))
            })
            .collect();
        for (filed, d, app, id) in moved {
            self.expiring.refile(filed, d, &app, &id);
            if let Some(e) = self.apps.get_mut(&app).and_then(|a| a.get_mut(&id)) {
                e.filed = d;
            }
        }
    }

    /// The names `app` and `id` are stored under, shared (none when not stored).
    pub(super) fn keys(&self, app: &str, id: &str) -> Option<(Arc<str>, Arc<str>)> {
        let (app_key, instances) = self.apps.get_key_value(app)?;
        let (id_key, _) = instances.get_key_value(id)?;
        Some((app_key.clone(), id_key.clone()))
    }

    pub(super) fn lease_view(&self, e: &Entry) -> LeaseView {
        LeaseView {
            renewal_interval_secs: e.info.lease.normalised().renewal_interval_secs,
            duration_secs: (e.lease.duration_ms / 1000) as i32,
            registration_ts: e.lease.registration_ts,
            last_renewal_ts: e.lease.last_update(self.mode),
            eviction_ts: e.lease.eviction_ts,
            service_up_ts: e.lease.service_up_ts,
        }
    }

    pub(super) fn view(&self, e: &Entry) -> InstanceView {
        InstanceView {
            info: e.info.clone(),
            lease: self.lease_view(e),
            origin: e.holding.kind(),
        }
    }

    pub(super) fn view_of(&self, app: &str, id: &str) -> Option<InstanceView> {
        self.get(app, id).map(|e| self.view(e))
    }

    // === writes ===

    fn deadline(&self, e: &Entry) -> Option<i64> {
        deadline(&e.lease, &e.holding, self.mode)
    }

    /// Takes an entry out of the indices (not out of the map).
    fn unindex(&mut self, id: &Arc<str>, e: &Entry) {
        self.counts.remove(e.info.status);
        if e.holding.kind() == Origin::Imported {
            self.imported.remove(e.info.status);
        }
        self.by_origin[slot(e.holding.kind())] = self.by_origin[slot(e.holding.kind())].saturating_sub(1);
        self.text_bytes -= counted_bytes(e);
        if e.holding.expires() {
            self.expiring.remove(e.filed, id);
        }
    }

    /// Puts an entry into the indices (and files its lease under its deadline).
    fn index(&mut self, app: &Arc<str>, id: &Arc<str>, e: &mut Entry) {
        self.counts.add(e.info.status);
        if e.holding.kind() == Origin::Imported {
            self.imported.add(e.info.status);
        }
        self.by_origin[slot(e.holding.kind())] += 1;
        self.text_bytes += counted_bytes(e);
        if let Some(d) = self.deadline(e) {
            self.expiring.insert(d, app, id);
            e.filed = d;
        }
    }

    fn record_change(&mut self, now: i64, app: &Arc<str>, id: &Arc<str>, removed: Option<InstanceView>) {
        self.version += 1;
        self.changes.record(now, self.version, app, id, removed);
        self.app_versions.insert(app.clone(), self.version);
    }

    /// Inserts or replaces an entry and logs an ADDED change.
    pub(super) fn put(&mut self, mut entry: Entry, now: i64) {
        let app_key = shared_name(&self.apps, &entry.info.app);
        let old = self
            .apps
            .get_mut(&app_key)
            .and_then(|a| a.remove_entry(entry.info.id()));
        let id_key = match &old {
            Some((key, old)) => {
                self.unindex(key, old);
                key.clone()
            }
            None => Arc::from(entry.info.id()),
        };
        self.index(&app_key, &id_key, &mut entry);
        self.owners.moved(
            &app_key,
            &id_key,
            old.as_ref().and_then(|(_, o)| o.holding.owner()),
            entry.holding.owner(),
        );
        self.apps
            .entry(app_key.clone())
            .or_default()
            .insert(id_key.clone(), entry);
        self.record_change(now, &app_key, &id_key, None);
    }

    /// Edits a stored instance (copy-on-write), marks it MODIFIED and logs the change.
    pub(super) fn modify(&mut self, app: &str, id: &str, now: i64, edit: impl FnOnce(&mut InstanceInfo)) {
        let Some((app_key, id_key)) = self.keys(app, id) else {
            return;
        };
        self.update(app, id, |e| {
            let info = Arc::make_mut(&mut e.info);
            edit(info);
            info.action_type = Some(ActionType::Modified);
            info.last_updated_timestamp = now;
        });
        self.record_change(now, &app_key, &id_key, None);
    }

    /// Changes an entry's lease, holding or flags, or its description without a change to the
    /// delta (what a peer's heartbeat corrects quietly), re-indexing what the edit moved.
    /// Returns `None` when `app`/`id` is not stored.
    pub(super) fn update<R>(&mut self, app: &str, id: &str, edit: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let (app_key, id_key) = self.keys(app, id)?;
        let mut entry = self.apps.get_mut(app)?.remove(id)?;
        let owner_before = entry.holding.owner().cloned();
        self.unindex(&id_key, &entry);
        let result = edit(&mut entry);
        self.index(&app_key, &id_key, &mut entry);
        self.owners
            .moved(&app_key, &id_key, owner_before.as_ref(), entry.holding.owner());
        self.apps.get_mut(app)?.insert(id_key, entry);
        Some(result)
    }

    /// A heartbeat's renewal: the lease only (the hot path: one lookup, no owner or text
    /// bookkeeping, and the lease stays where it is filed unless it was counted as expired or its
    /// deadline went back). `None` when not stored.
    pub(super) fn renew(&mut self, app: &str, id: &str, now: i64) -> Option<Renewed> {
        self.renew_admitted(app, id, now, |_| Ok::<_, ()>(()))?.ok()
    }

    /// [`Store::renew`] with the entry seen first, in the same lookup: `admit` lets the renewal go
    /// on (`Ok`) or stops it with its own answer (`Err`; nothing changes). A heartbeat checks
    /// its instance this way without hashing the two keys twice. `None` when not stored.
    pub(super) fn renew_admitted<E>(
        &mut self,
        app: &str,
        id: &str,
        now: i64,
        admit: impl FnOnce(&Entry) -> Result<(), E>,
    ) -> Option<Result<Renewed, E>> {
        let mark = self.expiring.expired_before.0;
        let e = self.apps.get_mut(app)?.get_mut(id)?;
        if let Err(stop) = admit(e) {
            return Some(Err(stop));
        }
        e.lease.renew(now);
        let renewed = Renewed {
            last_dirty_timestamp: e.info.last_dirty_timestamp,
            status: e.info.status,
            origin: e.holding.kind(),
        };
        let refile = match deadline(&e.lease, &e.holding, self.mode) {
            Some(d) if (e.filed < mark && !crate::mutants::on("unfiled-renewals")) || d < e.filed => {
                Some((std::mem::replace(&mut e.filed, d), d))
            }
            _ => None,
        };
        if let Some((filed, d)) = refile {
            let (app_key, id_key) = self.keys(app, id)?;
            self.expiring.refile(filed, d, &app_key, &id_key);
        }
        Some(Ok(renewed))
    }

    /// Removes an entry, cancels its lease and logs a DELETED change with its last state, which
    /// it returns.
    pub(super) fn remove(&mut self, app: &str, id: &str, now: i64) -> Option<InstanceView> {
        let (app_key, id_key) = self.keys(app, id)?;
        let mut entry = self.apps.get_mut(app)?.remove(id)?;
        self.owners.moved(&app_key, &id_key, entry.holding.owner(), None);
        self.unindex(&id_key, &entry);
        entry.lease.cancel(now);
        let info = Arc::make_mut(&mut entry.info);
        info.action_type = Some(ActionType::Deleted);
        info.last_updated_timestamp = now;
        let view = self.view(&entry);
        self.record_change(now, &app_key, &id_key, Some(view.clone()));
        if self.apps.get(app).is_some_and(|a| a.is_empty()) {
            // Names of gone applications are not kept (clients may invent any number of them).
            self.apps.remove(app);
            self.app_versions.remove(app);
        }
        Some(view)
    }

    /// Drops delta entries older than `horizon`; a visible change when any went.
    pub(super) fn prune_changes(&mut self, now: i64, horizon: i64) {
        if let Some(touched) = self.changes.prune(horizon) {
            self.version += 1;
            self.changes.pruned_at(now, horizon, self.version, touched);
        }
    }

    /// Checks every index against a scan of the entries (after each command in tests).
    #[cfg(test)]
    pub(super) fn assert_indices(&self) {
        let mut owners: Vec<(String, String, String, String)> = Vec::new();
        let (mut counts, mut by_origin, mut text_bytes) = (StatusCounts::default(), [0u64; 5], 0usize);
        let mut imported = StatusCounts::default();
        let mut expiring = BTreeMap::new();
        for (app, entries) in &self.apps {
            assert!(!entries.is_empty(), "application {app} is kept empty");
            for (id, e) in entries {
                if let Some(o) = e.holding.owner() {
                    owners.push((
                        o.namespace.to_string(),
                        o.eureka_app.to_string(),
                        app.to_string(),
                        id.to_string(),
                    ));
                }
                counts.add(e.info.status);
                if e.holding.kind() == Origin::Imported {
                    imported.add(e.info.status);
                }
                by_origin[slot(e.holding.kind())] += 1;
                text_bytes += counted_bytes(e);
                if let Some(d) = self.deadline(e) {
                    assert!(e.filed <= d, "{app}/{id} is filed after its deadline");
                    let mark = self.expiring.expired_before.0;
                    assert!(
                        e.filed >= mark || e.filed == d,
                        "{app}/{id} is counted as expired but renewed"
                    );
                    expiring.insert(expiry_key(e.filed, id), (app.clone(), id.clone()));
                }
            }
        }
        owners.sort();
        assert_eq!(self.owners.all(), owners, "the owner index is out of step");
        assert_eq!(self.counts, counts, "the counts by status are out of step");
        assert_eq!(self.by_origin, by_origin, "the counts by origin are out of step");
        assert_eq!(self.imported, imported, "the imported counts are out of step");
        assert_eq!(self.text_bytes, text_bytes, "the bytes of text are out of step");
        assert_eq!(self.expiring.leases, expiring, "the expiry order is out of step");
        let (mark, count) = self.expiring.expired_before;
        let below = self.expiring.leases.keys().filter(|(d, _)| *d < mark).count() as u64;
        assert_eq!(count, below, "the count of leases expired before {mark} is out of step");
    }
}
