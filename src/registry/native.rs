//! Java's write rules for native and replicated instances: registrations (with the caps and
//! adoption's say), heartbeats, cancels and the remembered cancels, status overrides, metadata.

use std::{collections::HashMap, sync::Arc};

use super::{
    Outcome, PeerKind, PodOverride, PodOwner, Registry, Replication, ReplicationAction, Reply, Writer,
    adoption::{self, Adoption, Decision, controller_record},
    instance::{ActionType, InstanceInfo, Metadata, Status},
    lease::Lease,
    limits::LimitExceeded,
    rules,
    store::{Entry, Holding, RestOverride},
    view::Origin,
};

/// A REST status override, kept by instance id like Java's `overriddenInstanceStatusMap`.
#[derive(Clone, Copy, Debug)]
pub(super) struct OverrideEntry {
    /// The forced status.
    pub(super) status: Status,
    /// When it was last read or set; unused overrides are forgotten after an hour.
    pub(super) accessed: i64,
}

impl Registry {
    pub(super) fn register(&mut self, incoming: InstanceInfo, writer: Writer, copy: bool, now: i64) -> Outcome {
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
        let existing = self.store.get(&app, &id).cloned();
        let (adopter, superseded) = match self.admit_registration(&incoming, existing.as_ref(), now) {
            Ok(admitted) => admitted,
            Err(reply) => return Outcome::reply(reply),
        };
        let counted_before = existing.as_ref().map(|e| e.holding.expires());
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
        let entry = Entry::new(Arc::new(registrant), lease, holding, copy);
        self.store.put(entry, now);
        self.totals.registrations += 1;

        let mut outcome = Outcome::reply(Reply::Registered);
        outcome
            .replicate
            .push(self.registration_record(&app, &id, stale_incoming, writer));
        if adopter.is_some() {
            let shown = self.store.view_of(&app, &id).expect("just registered");
            // Java peers get the status shown here from the leader (not back to a Java peer
            // that sent exactly that).
            if !(writer == Writer::JAVA && shown.info.status == incoming_status) {
                outcome
                    .replicate
                    .push(controller_record(ReplicationAction::Register, &shown));
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
    pub(super) fn admit_registration(
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
    pub(super) fn registrant(
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
    pub(super) fn take_override(&mut self, registrant: &mut InstanceInfo, id: &str, now: i64) -> Option<Status> {
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
    pub(super) fn registration_record(
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
            action: ReplicationAction::Register,
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
    pub(super) fn admit(&self, info: &InstanceInfo, replaced: Option<&InstanceInfo>) -> Result<(), LimitExceeded> {
        let limits = &self.config.limits;
        limits.instance.check(info)?;
        let freed = replaced.map_or(0, InstanceInfo::text_bytes);
        let stored = self.store.text_bytes();
        if (stored - freed.min(stored)).saturating_add(info.text_bytes()) > limits.max_registry_bytes {
            return Err(LimitExceeded::RegistryBytes {
                limit: limits.max_registry_bytes,
            });
        }
        if replaced.is_some() {
            return Ok(());
        }
        let held = self.store.counts().total() - self.store.imported_counts().total();
        if held >= limits.max_instances as u64 {
            return Err(LimitExceeded::Instances {
                limit: limits.max_instances,
            });
        }
        match self.store.app(info.app.as_str()) {
            Some(app) if app.len() >= limits.max_instances_per_application => {
                Err(LimitExceeded::InstancesPerApplication {
                    app: info.app.to_string(),
                    limit: limits.max_instances_per_application,
                })
            }
            Some(_) => Ok(()),
            None if self.store.application_count() >= limits.max_applications => Err(LimitExceeded::Applications {
                limit: limits.max_applications,
            }),
            None => Ok(()),
        }
    }

    /// A heartbeat. The hot path: one lookup of the instance (checked and renewed in it) and one
    /// of its override, and the command's own strings move into the replication record.
    pub(super) fn renew(
        &mut self,
        app: String,
        id: String,
        writer: Writer,
        overridden_param: Option<Status>,
        dirty_param: Option<i64>,
        now: i64,
    ) -> Outcome {
        /// Why a heartbeat's instance was not renewed as it was found.
        enum Stop {
            /// The answer, nothing renewed.
            Reply(Reply),
            /// Its status must be corrected first.
            Correct(Status),
        }
        let replication = writer.is_replication();
        let overrides = &mut self.overrides;
        let (mut expires, mut override_status) = (false, None);
        let admitted = self.store.renew_admitted(&app, &id, now, |entry| {
            if entry.holding.is_pod() {
                // Kept alive by the controller; a client heartbeat is acknowledged and ignored.
                return Err(Stop::Reply(Reply::Ok));
            }
            if matches!(&entry.holding, Holding::Adopted(a) if !a.raw_known) {
                // Only a peer's copy is known here: whoever holds the client's own sends it again.
                return Err(Stop::Reply(Reply::NotFound));
            }
            let current = Self::native_status(entry);
            override_status = Self::access_override(overrides, &id, now);
            let status = rules::resolve(current, override_status, Some(current), replication);
            if status == Status::Unknown {
                // Possibly a deleted override: the client must re-register.
                return Err(Stop::Reply(Reply::NotFound));
            }
            expires = entry.holding.expires();
            if status != current {
                return Err(Stop::Correct(status));
            }
            Ok(())
        });
        let renewed = match admitted {
            None => return Outcome::reply(Reply::NotFound),
            Some(Err(Stop::Reply(reply))) => return Outcome::reply(reply),
            Some(Ok(renewed)) => renewed,
            Some(Err(Stop::Correct(status))) => {
                // Java corrects the status silently; a delta entry keeps clients' hash codes right.
                self.modify_native(&app, &id, status, now, |_| {});
                self.store.renew(&app, &id, now).expect("present")
            }
        };
        if expires {
            // Adopted instances do not count toward self-preservation: nor do their renewals.
            self.preservation.renewed(now);
        }
        self.totals.renewals += 1;
        let (stored_dirty, stored_status, origin) = (renewed.last_dirty_timestamp, renewed.status, renewed.origin);
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
                    self.store
                        .update(&app, &id, |e| Arc::make_mut(&mut e.info).overridden_status = o);
                }
                outcome.reply = Reply::NotFound;
            } else if stored_dirty > incoming && replication {
                let view = self.store.view_of(&app, &id).expect("present");
                outcome.reply = Reply::Conflict(Box::new(view));
            }
        }
        outcome.replicate.push(Replication {
            action: ReplicationAction::Heartbeat,
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

    pub(super) fn cancel(&mut self, app: &str, id: &str, writer: Writer, now: i64) -> Outcome {
        if let Some(Entry {
            holding: Holding::Pod { owner, .. },
            ..
        }) = self.store.get(app, id)
        {
            return Outcome::reply(Reply::Refused(format!(
                "instance {id} of {app} is managed by {owner}; it goes when its pod goes"
            )));
        }
        let dirty = self.store.get(app, id).map(|e| e.info.last_dirty_timestamp);
        let outcome = self.cancelled(app, id, writer, now);
        // A cancel, not an eviction: an evicted instance that still renews somewhere must be
        // able to come back through replication.
        if let (Reply::Ok, Some(dirty)) = (&outcome.reply, dirty) {
            self.remember_cancel(app, id, dirty, now);
        }
        outcome
    }

    pub(super) fn cancel_copy(
        &mut self,
        app: &str,
        id: &str,
        writer: Writer,
        cancelled_dirty: i64,
        now: i64,
    ) -> Outcome {
        if let Some(entry) = self.store.get(app, id)
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
    pub(super) fn refuse_cancelled(&mut self, incoming: &InstanceInfo, now: i64) -> Option<Reply> {
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
    pub(super) fn remember_cancel(&mut self, app: &str, id: &str, dirty: i64, now: i64) {
        if self.cancelled.len() >= 64 && self.cancelled.len().is_power_of_two() {
            let keep = self.config.cancel_memory_ms;
            self.cancelled.retain(|_, (_, at)| *at + keep > now);
        }
        self.cancelled.insert((app.to_string(), id.to_string()), (dirty, now));
    }

    /// Removes a native or replicated instance as cancelled (Java forgets its override whether or
    /// not the lease exists) and says so to peers as written by `writer`.
    pub(super) fn cancelled(&mut self, app: &str, id: &str, writer: Writer, now: i64) -> Outcome {
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
                action: ReplicationAction::Cancel,
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
    pub(super) fn visible(&mut self, app: &str, id: &str, now: i64) -> bool {
        let mode = self.config.lease_expiry;
        let Some(entry) = self.store.get(app, id) else {
            return false;
        };
        if !entry.holding.expires() || !entry.lease.is_expired(now, 0, mode) {
            return true;
        }
        !self.preservation.lease_expiration_enabled(now)
    }

    pub(super) fn set_status(
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
        let (pod_override, shown) = self.status_call(app, id, RestOverride::Set(status), now);
        if pod_override.is_none() && status == Status::Up && shown != status {
            self.store.update(app, id, |e| e.lease.service_up(now));
        }
        if pod_override.is_some() {
            self.refresh_pod_status(app, id, dirty, now);
        } else if shown != status {
            // (For an adopted instance: what is shown, which a pod's state or the EurekaApp's
            // override may make differ from what the client said.)
            self.overrides
                .insert(id.to_string(), OverrideEntry { status, accessed: now });
            self.modify_native(app, id, status, now, |info| {
                info.overridden_status = status;
                if let Some(d) = dirty.filter(|d| *d > info.last_dirty_timestamp) {
                    info.last_dirty_timestamp = d;
                }
            });
        }
        let entry = self.store.get(app, id).expect("present");
        let mut outcome = Outcome::reply(Reply::Ok);
        outcome.pod_override = pod_override;
        if matches!(entry.holding, Holding::Adopted(_)) {
            // Java peers take the override as any; then the status shown here, from the leader.
            let shown = self.store.view(entry);
            outcome
                .replicate
                .push(controller_record(ReplicationAction::Register, &shown));
        }
        {
            outcome.replicate.push(Replication {
                action: ReplicationAction::StatusUpdate,
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

    /// What a status call does to a visible entry before its rules: renews the lease and, on a
    /// pod instance, keeps the REST override until the pod's annotation records it (the returned
    /// request asks the controller to). Also returns the status shown before the call.
    fn status_call(&mut self, app: &str, id: &str, call: RestOverride, now: i64) -> (Option<PodOverride>, Status) {
        self.store
            .update(app, id, |entry| {
                entry.lease.renew(now);
                let pod_override = match &mut entry.holding {
                    Holding::Pod { owner, rest, .. } => {
                        *rest = Some(call);
                        Some(PodOverride {
                            owner: owner.clone(),
                            status: match call {
                                RestOverride::Set(s) => Some(s),
                                RestOverride::Deleted => None,
                            },
                        })
                    }
                    _ => None,
                };
                (pod_override, entry.info.status)
            })
            .expect("visible")
    }

    pub(super) fn delete_status_override(
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
        let (pod_override, _) = self.status_call(app, id, RestOverride::Deleted, now);
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
        let entry = self.store.get(app, id).expect("present");
        let mut outcome = Outcome::reply(Reply::Ok);
        outcome.pod_override = pod_override;
        let adopted = matches!(entry.holding, Holding::Adopted(_));
        {
            outcome.replicate.push(Replication {
                action: ReplicationAction::DeleteStatusOverride,
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
            let shown = self.store.view(entry);
            outcome
                .replicate
                .push(controller_record(ReplicationAction::Register, &shown));
        }
        outcome
    }

    pub(super) fn update_metadata(
        &mut self,
        app: &str,
        id: &str,
        entries: Metadata,
        prepared: Option<(Arc<InstanceInfo>, Box<InstanceInfo>)>,
        now: i64,
    ) -> Outcome {
        let Some(entry) = self.store.get(app, id) else {
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

    /// The override of `id`, marked as read now (a field borrow, so the heartbeat can hold its
    /// entry meanwhile).
    pub(super) fn access_override(
        overrides: &mut HashMap<String, OverrideEntry>,
        id: &str,
        now: i64,
    ) -> Option<Status> {
        let o = overrides.get_mut(id)?;
        o.accessed = now;
        Some(o.status)
    }
}
