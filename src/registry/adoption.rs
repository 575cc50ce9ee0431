//! Adoption: the native registrations of pods whose EurekaApp says `registration: Adopt` (services
//! that keep their own Eureka client). The controller states, per selected pod, a [`Claim`]: the
//! application, the pod's IP and port (optionally the instance id) its client registers with,
//! and what the pod's state asks for. A registration that matches a live claim is *adopted*: it
//! keeps the client's id, metadata, lease and heartbeats, but like a pod instance it never
//! expires, is not evicted and does not count toward self-preservation, and its status follows
//! the pod (STARTING/DOWN while not Ready, OUT_OF_SERVICE while terminating). A drained claim (the
//! pod terminating past its drain) cancels the registration and refuses new ones; so does a
//! claim whose pod is gone, for the drain once more (a force-deleted pod's client may still try).
//!
//! The rules, whatever the order things arrive in:
//! * a registration that arrives before its pod is seen is a plain native one (it counts and
//!   expires) until the claim comes, then it is adopted in place;
//! * a claim that comes first waits; the registration is adopted as it arrives, never counted;
//! * re-registrations keep the adoption (the client's new description, the pod's status);
//! * one endpoint (application, IP, port) has one process: of several registrations matching a
//!   claim, the newest (by the client's `lastDirtyTimestamp`) is adopted and the others are
//!   cancelled, so a container restarted with a random instance id leaves no duplicate behind;
//! * when the claim goes because the pod stopped matching, or its EurekaApp was deleted,
//!   suspended or switched to `registration: Operator`, the registration is released: native
//!   again, counted, expiring by its lease as Java's would.
//!
//! Every replica derives its claims from its own watch, so every replica decides the same. What
//! the native rules say the status is (`raw`: the client's status with REST overrides applied)
//! is kept apart from the status shown, so a replica that learns the registration from another
//! learns the client's word, not the pod's; the status shown reaches Java peers from the leader.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    Outcome, PodOwner, Registry, Replication, ReplicationAction, Reply, Writer,
    instance::{CompactString, InstanceInfo, Status},
    rules,
    store::{Entry, Holding},
    view::{InstanceView, Origin},
};

/// Where a pod's own client registers: its Eureka application, the pod's IP and the port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    /// Upper case, as stored.
    pub app: String,
    pub ip: String,
    pub port: i32,
}

impl ClaimKey {
    pub fn of(info: &InstanceInfo) -> ClaimKey {
        ClaimKey {
            app: info.app.to_string(),
            ip: info.ip_addr.to_string(),
            port: info.port.port,
        }
    }
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}:{}", self.app, self.ip, self.port)
    }
}

/// What the pod's state asks of its adopted registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// The pod runs. `status` is what its state maps to: `UP` when Ready (then the client's own
    /// status shows), the EurekaApp's `notReady` or `terminating` status otherwise. `spec` is the
    /// EurekaApp's (or the pod annotation's) status override, `UNKNOWN` for none.
    Live { status: Status, spec: Status },
    /// The pod is terminating and its drain is over (or `terminating: Deregister`): its
    /// registrations are cancelled and new ones refused.
    Drained,
}

/// The controller's statement about one selected pod of an adopting EurekaApp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub owner: PodOwner,
    pub key: ClaimKey,
    /// When set, only a registration with this instance id is adopted.
    pub instance_id: Option<String>,
    pub state: ClaimState,
    /// How long, after the pod is gone, registrations from its endpoint are still refused (its
    /// EurekaApp's drain).
    pub linger_ms: i64,
}

impl Claim {
    fn accepts(&self, id: &str) -> bool {
        self.instance_id.as_deref().is_none_or(|want| want == id)
    }
}

/// How the registry holds an adopted registration (inside [`Holding::Adopted`]).
#[derive(Clone, Debug)]
pub(super) struct Adoption {
    pub owner: PodOwner,
    /// `Native` or `Replicated`: what the entry is again when the adoption ends.
    pub base: Origin,
    /// What the native rules make of the client's status (REST overrides applied).
    pub raw: Status,
    /// False when `raw` came from a copy of a peer's registry, which shows the status the pod
    /// imposes there: the next heartbeat is then answered 404 so that the client (or the replica
    /// it talks to) sends its own copy again.
    pub raw_known: bool,
}

#[derive(Clone, Debug)]
struct Stored {
    claim: Claim,
    /// Set once the pod is gone: the claim refuses registrations until then.
    gone_until: Option<i64>,
}

impl Stored {
    fn active(&self, now: i64) -> bool {
        self.gone_until.is_none_or(|until| now < until)
    }

    fn live(&self) -> bool {
        self.gone_until.is_none() && matches!(self.claim.state, ClaimState::Live { .. })
    }
}

/// The claims, by pod and by endpoint.
#[derive(Debug, Default)]
pub(super) struct Claims {
    /// Sorted, so that one EurekaApp's claims are a range.
    by_owner: BTreeMap<PodOwner, Stored>,
    by_key: HashMap<ClaimKey, BTreeSet<PodOwner>>,
}

/// What a registration's endpoint says about it.
pub(super) enum Decision {
    /// No claim: a plain native registration.
    None,
    Adopt(PodOwner),
    Refuse(String),
}

impl Claims {
    fn insert(&mut self, stored: Stored) -> Option<Stored> {
        let owner = stored.claim.owner.clone();
        let key = stored.claim.key.clone();
        let old = self.by_owner.insert(owner.clone(), stored);
        if let Some(old) = &old
            && old.claim.key != key
        {
            self.unindex(&old.claim.key, &owner);
        }
        self.by_key.entry(key).or_default().insert(owner);
        old
    }

    fn remove(&mut self, owner: &PodOwner) -> Option<Stored> {
        let old = self.by_owner.remove(owner)?;
        self.unindex(&old.claim.key, owner);
        Some(old)
    }

    fn unindex(&mut self, key: &ClaimKey, owner: &PodOwner) {
        if let Some(set) = self.by_key.get_mut(key) {
            set.remove(owner);
            if set.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// The claim that decides about registration `id` on `key`: a live claim first, else a
    /// drained one or one whose pod is gone (within its linger); ties go to the first pod by name.
    fn winner(&self, key: &ClaimKey, id: &str, now: i64) -> Option<&Stored> {
        let candidates = self
            .by_key
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|o| self.by_owner.get(o))
            .filter(|s| s.active(now) && s.claim.accepts(id));
        let mut best: Option<&Stored> = None;
        for s in candidates {
            if best.is_none_or(|b| s.live() && !b.live()) {
                best = Some(s);
            }
        }
        best
    }

    pub(super) fn decide(&self, info: &InstanceInfo, now: i64) -> Decision {
        let key = ClaimKey::of(info);
        match self.winner(&key, info.id(), now) {
            None => Decision::None,
            Some(s) if s.live() => Decision::Adopt(s.claim.owner.clone()),
            Some(s) => Decision::Refuse(format!(
                "{} comes from pod {}/{}, which is gone or terminating past its drain ({}); not registered",
                info.id(),
                s.claim.owner.namespace,
                s.claim.owner.pod,
                s.claim.key
            )),
        }
    }

    pub(super) fn state_of(&self, owner: &PodOwner) -> Option<ClaimState> {
        self.by_owner
            .get(owner)
            .filter(|s| s.gone_until.is_none())
            .map(|s| s.claim.state)
    }

    /// Forgets the claims of gone pods whose linger is over.
    pub(super) fn purge(&mut self, now: i64) {
        let over: Vec<PodOwner> = self
            .by_owner
            .iter()
            .filter(|(_, s)| !s.active(now))
            .map(|(o, _)| o.clone())
            .collect();
        for o in over {
            self.remove(&o);
        }
    }
}

/// The status an adopted registration shows: the pod's state first (not Ready, terminating),
/// then a REST override (already in `raw`), then the EurekaApp's override, then the client's own.
pub(super) fn shown_status(raw: Status, state: Option<ClaimState>, rest_override: bool) -> Status {
    match state {
        Some(ClaimState::Live {
            status: Status::Up,
            spec,
        }) if !rest_override && spec != Status::Unknown => rules::resolve(raw, Some(spec), None, true),
        Some(ClaimState::Live { status: Status::Up, .. }) | None => raw,
        Some(ClaimState::Live { status, .. }) => status,
        // About to be cancelled.
        Some(ClaimState::Drained) => Status::OutOfService,
    }
}

/// A record of a change the controller's view of the pod made: replicas derive it themselves,
/// Java peers hear of it from the leader.
pub(super) fn controller_record(action: ReplicationAction, view: &InstanceView) -> Replication {
    Replication {
        action,
        app: view.info.app.to_string(),
        id: view.id().to_string(),
        last_dirty_timestamp: (action != ReplicationAction::Cancel).then_some(view.info.last_dirty_timestamp),
        status: (action != ReplicationAction::Cancel).then_some(view.info.status),
        overridden_status: None,
        instance: (action == ReplicationAction::Register).then(|| view.clone()),
        origin: view.origin,
        writer: Writer::Controller,
    }
}

impl Registry {
    /// The status the native rules gave an entry: for an adopted one its `raw` status.
    pub(super) fn native_status(e: &Entry) -> Status {
        match &e.holding {
            Holding::Adopted(a) => a.raw,
            _ => e.info.status,
        }
    }

    /// An entry's description as its client registered it (the native status for an adopted
    /// one): what other replicas are told, and what a client's edit starts from.
    pub(super) fn native_info(e: &Entry) -> InstanceInfo {
        let mut info = (*e.info).clone();
        info.status = Self::native_status(e);
        info
    }

    /// An instance as our own replicas should learn it (`None` when absent): for an adopted one
    /// the client's status, not the one the pod imposes here (each replica imposes it itself).
    pub fn replica_view(&self, app: &str, id: &str) -> Option<InstanceView> {
        let e = self.store.get(app, id)?;
        let mut view = self.store.view(e);
        if matches!(e.holding, Holding::Adopted(_)) {
            view.info = std::sync::Arc::new(Self::native_info(e));
        }
        Some(view)
    }

    /// The status an adopted entry should show now (its stored one otherwise).
    pub(super) fn shown_status_of(&self, e: &Entry) -> Status {
        match &e.holding {
            Holding::Adopted(a) => shown_status(
                a.raw,
                self.claims.state_of(&a.owner),
                self.overrides.contains_key(e.info.id()),
            ),
            _ => e.info.status,
        }
    }

    /// Brings an adopted entry's shown status in line with its raw status and its claim; returns
    /// whether it changed (a MODIFIED change then).
    pub(super) fn refresh_adopted(&mut self, app: &str, id: &str, now: i64) -> bool {
        let Some(entry) = self.store.get(app, id) else {
            return false;
        };
        let shown = self.shown_status_of(entry);
        if shown == entry.info.status {
            return false;
        }
        self.store.modify(app, id, now, |info| info.status = shown);
        if shown == Status::Up {
            self.store.update(app, id, |e| e.lease.service_up(now));
        }
        true
    }

    /// Sets the native status of an entry (for an adopted one its raw status) along with `edit`,
    /// and shows what follows from it.
    pub(super) fn modify_native(
        &mut self,
        app: &str,
        id: &str,
        status: Status,
        now: i64,
        edit: impl FnOnce(&mut InstanceInfo),
    ) {
        let known = self.store.update(app, id, |entry| {
            if let Holding::Adopted(a) = &mut entry.holding {
                a.raw = status;
                a.raw_known = true;
            }
        });
        if known.is_none() {
            return;
        }
        let entry = self.store.get(app, id).expect("present");
        let shown = match &entry.holding {
            Holding::Adopted(_) => self.shown_status_of(entry),
            _ => status,
        };
        self.store.modify(app, id, now, |info| {
            edit(info);
            info.status = shown;
        });
    }

    /// Which claim a registration falls under.
    pub(super) fn decide_adoption(&self, info: &InstanceInfo, now: i64) -> Decision {
        self.claims.decide(info, now)
    }

    /// Other registrations adopted for `owner` in `app` (not `id`), with their dirty timestamps.
    pub(super) fn adopted_siblings(&self, owner: &PodOwner, app: &str, id: &str) -> Vec<(String, i64)> {
        self.store
            .app(app)
            .into_iter()
            .flat_map(|a| a.iter())
            .filter(|(other, e)| other.as_ref() != id && matches!(&e.holding, Holding::Adopted(a) if a.owner == *owner))
            .map(|(other, e)| (other.to_string(), e.info.last_dirty_timestamp))
            .collect()
    }

    // === the controller's commands ===

    /// States (or restates) a claim. Refused when another pod's live claim holds the endpoint.
    pub(super) fn claim(&mut self, claim: Claim, now: i64) -> Outcome {
        let key = claim.key.clone();
        if matches!(claim.state, ClaimState::Live { .. }) {
            let rival = self
                .claims
                .by_key
                .get(&key)
                .into_iter()
                .flatten()
                .filter(|o| **o != claim.owner)
                .filter_map(|o| self.claims.by_owner.get(o))
                .find(|s| s.live());
            if let Some(rival) = rival {
                return Outcome::reply(Reply::Refused(format!(
                    "the registration of pod {} ({key}) is already adopted by {}",
                    claim.owner.pod, rival.claim.owner
                )));
            }
        }
        let stored = Stored {
            claim: claim.clone(),
            gone_until: None,
        };
        let old = self.claims.insert(stored);
        if old.as_ref().is_some_and(|o| o.gone_until.is_none() && o.claim == claim) {
            return Outcome::reply(Reply::Unchanged);
        }
        let mut out = Vec::new();
        if let Some(old) = old
            && old.claim.key != key
        {
            self.reconcile_key(&old.claim.key, now, &mut out);
        }
        self.reconcile_key(&key, now, &mut out);
        Outcome {
            reply: Reply::Ok,
            replicate: out,
            pod_override: None,
        }
    }

    /// Withdraws a claim. With `pod_gone` its registrations are cancelled (and registrations from
    /// its endpoint refused for its linger); otherwise they are released, native again.
    pub(super) fn unclaim(&mut self, owner: &PodOwner, pod_gone: bool, now: i64) -> Outcome {
        let Some(old) = self.claims.remove(owner) else {
            return Outcome::reply(Reply::NotFound);
        };
        let mut out = Vec::new();
        if pod_gone {
            let adopted: Vec<(String, String)> = self.adopted_by(owner).into_iter().collect();
            for (app, id) in adopted {
                self.cancel_for_claim(&app, &id, now, &mut out);
            }
            if old.claim.linger_ms > 0 {
                let mut claim = old.claim.clone();
                claim.state = ClaimState::Drained;
                self.claims.insert(Stored {
                    claim,
                    gone_until: Some(now.saturating_add(old.claim.linger_ms)),
                });
            }
        }
        self.reconcile_key(&old.claim.key, now, &mut out);
        Outcome {
            reply: Reply::Ok,
            replicate: out,
            pod_override: None,
        }
    }

    fn adopted_by(&self, owner: &PodOwner) -> Vec<(String, String)> {
        self.store
            .apps()
            .flat_map(|(app, entries)| entries.iter().map(move |(id, e)| (app, id, e)))
            .filter(|(_, _, e)| matches!(&e.holding, Holding::Adopted(a) if a.owner == *owner))
            .map(|(app, id, _)| (app.to_string(), id.to_string()))
            .collect()
    }

    /// Makes every registration on `key` what its claims say: adopted by the live claim that
    /// accepts it (the newest one; older duplicates cancelled), cancelled under a drained claim,
    /// released when no claim wants it.
    fn reconcile_key(&mut self, key: &ClaimKey, now: i64, out: &mut Vec<Replication>) {
        let mut matching: Vec<(String, i64, i64)> = self
            .store
            .app(&key.app)
            .into_iter()
            .flat_map(|a| a.iter())
            .filter(|(_, e)| {
                e.holding.is_client_registration() && e.info.ip_addr == key.ip && e.info.port.port == key.port
            })
            .map(|(id, e)| (id.to_string(), e.info.last_dirty_timestamp, e.lease.registration_ts))
            .collect();
        // Newest first: the one a live claim keeps.
        matching.sort_by(|a, b| (b.1, b.2, &b.0).cmp(&(a.1, a.2, &a.0)));
        let mut kept: BTreeSet<PodOwner> = BTreeSet::new();
        for (id, _, _) in matching {
            let winner = self
                .claims
                .winner(key, &id, now)
                .map(|s| (s.claim.owner.clone(), s.live()));
            match winner {
                Some((owner, true)) if kept.insert(owner.clone()) => self.adopt(&key.app, &id, owner, now, out),
                Some(_) => self.cancel_for_claim(&key.app, &id, now, out),
                None => self.release(&key.app, &id, now, out),
            }
        }
    }

    /// Adopts an entry for `owner` (or moves it to `owner`), and shows the pod's status.
    fn adopt(&mut self, app: &str, id: &str, owner: PodOwner, now: i64, out: &mut Vec<Replication>) {
        let Some(base) = self.store.get(app, id).map(|e| e.holding.kind()) else {
            return;
        };
        let mut changed = match base {
            Origin::Adopted => self
                .store
                .update(app, id, |entry| match &mut entry.holding {
                    Holding::Adopted(a) if a.owner != owner => {
                        a.owner = owner;
                        true
                    }
                    _ => false,
                })
                .unwrap_or(false),
            Origin::Native | Origin::Replicated => {
                self.store.update(app, id, |entry| {
                    entry.holding = Holding::Adopted(Adoption {
                        owner,
                        base,
                        raw: entry.info.status,
                        raw_known: !entry.copied,
                    });
                });
                self.preservation.client_cancelled();
                true
            }
            Origin::Pod | Origin::Imported => return,
        };
        changed |= self.refresh_adopted(app, id, now);
        if changed && let Some(view) = self.store.view_of(app, id) {
            out.push(controller_record(ReplicationAction::Register, &view));
        }
    }

    /// Ends an adoption: the entry is native (or replicated) again, counted, with its own status.
    fn release(&mut self, app: &str, id: &str, now: i64, out: &mut Vec<Replication>) {
        let Some(Holding::Adopted(a)) = self.store.get(app, id).map(|e| &e.holding) else {
            return;
        };
        let (base, raw) = (a.base, a.raw);
        let shown = self
            .store
            .update(app, id, |entry| {
                entry.holding = match base {
                    Origin::Replicated => Holding::Replicated,
                    _ => Holding::Native,
                };
                entry.info.status
            })
            .expect("present");
        self.preservation.client_registered();
        if shown != raw {
            self.store.modify(app, id, now, |info| info.status = raw);
        }
        if let Some(view) = self.store.view_of(app, id) {
            out.push(controller_record(ReplicationAction::Register, &view));
        }
    }

    /// Cancels a registration because its pod is gone or drained.
    pub(super) fn cancel_for_claim(&mut self, app: &str, id: &str, now: i64, out: &mut Vec<Replication>) {
        let counted = self.store.get(app, id).is_some_and(|e| e.holding.expires());
        self.overrides.remove(id);
        if let Some(removed) = self.remove(app, id, now) {
            if counted {
                self.preservation.client_cancelled();
            }
            self.totals.cancellations += 1;
            out.push(controller_record(ReplicationAction::Cancel, &removed));
        }
    }

    // === reads ===

    /// The claims of one EurekaApp (pods that are gone excluded).
    pub fn claims_of(&self, namespace: &str, eureka_app: &str) -> Vec<(PodOwner, ClaimState)> {
        let from = PodOwner {
            namespace: namespace.into(),
            eureka_app: eureka_app.into(),
            pod: CompactString::default(),
        };
        self.claims
            .by_owner
            .range(from..)
            .take_while(|(o, _)| o.namespace == namespace && o.eureka_app == eureka_app)
            .filter(|(_, s)| s.gone_until.is_none())
            .map(|(o, s)| (o.clone(), s.claim.state))
            .collect()
    }

    /// Every claim's pod (pods that are gone excluded), for the sweep of gone EurekaApps.
    pub fn claim_owners(&self) -> Vec<PodOwner> {
        self.claims
            .by_owner
            .iter()
            .filter(|(_, s)| s.gone_until.is_none())
            .map(|(o, _)| o.clone())
            .collect()
    }

    /// The adopted registrations of one EurekaApp.
    pub fn adopted_of(&self, namespace: &str, eureka_app: &str) -> Vec<(PodOwner, InstanceView)> {
        self.store
            .owned_by(namespace, eureka_app)
            .filter_map(|e| match &e.holding {
                Holding::Adopted(a) if a.owner.namespace == namespace && a.owner.eureka_app == eureka_app => {
                    Some((a.owner.clone(), self.store.view(e)))
                }
                _ => None,
            })
            .collect()
    }

    /// Every adopted registration as shown (the leader keeps Java peers' copies alive).
    pub fn adopted_instances(&self) -> Vec<InstanceView> {
        self.store
            .entries()
            .filter(|e| matches!(e.holding, Holding::Adopted(_)))
            .map(|e| self.store.view(e))
            .collect()
    }

    /// Whether a live claim here would adopt `info` (anti-entropy keeps such registrations).
    pub fn claimed(&self, info: &InstanceInfo, now: i64) -> bool {
        matches!(self.claims.decide(info, now), Decision::Adopt(_))
    }
}

#[cfg(test)]
mod tests;
