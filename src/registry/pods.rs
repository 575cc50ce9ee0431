//! Pod instances: what the controller derives from a pod, stored with the pod as its owner,
//! taking over its own client's registration, and the REST overrides on them that wait to be
//! recorded on the pod.

use std::sync::Arc;

use super::{
    Outcome, PodOverrides, PodOwner, Registry, Replication, ReplicationAction, Reply, Writer,
    instance::{ActionType, InstanceInfo, Status},
    lease::Lease,
    rules,
    store::{Entry, Holding, RestOverride},
    view::{InstanceView, Origin},
};

impl Registry {
    pub(super) fn upsert_pod(
        &mut self,
        mut info: InstanceInfo,
        owner: PodOwner,
        overrides: PodOverrides,
        now: i64,
    ) -> Outcome {
        let app = info.app.clone();
        let id = info.id().to_string();
        let existing = self.store.get(&app, &id).map(|e| (e.holding.clone(), e.info.clone()));
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
    pub(super) fn claim_for_pod(
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
                if held.expires() {
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
    pub(super) fn update_pod(
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
        self.store
            .update(&app, &id, |entry| {
                entry.holding = holding;
                if taken_over {
                    entry.copied = false;
                }
            })
            .expect("present");
        if !taken_over && existing.same_description(&candidate) {
            return Outcome::reply(Reply::Unchanged);
        }
        let (duration_ms, up) = (
            i64::from(info.lease.normalised().duration_secs) * 1000,
            info.status == Status::Up,
        );
        self.store.update(&app, &id, |entry| {
            entry.lease.duration_ms = duration_ms;
            if up {
                entry.lease.service_up(now);
            }
        });
        let mut replaced = info;
        replaced.last_dirty_timestamp = now.max(existing.last_dirty_timestamp.saturating_add(1));
        self.store.modify(&app, &id, now, move |info| {
            let action_type = info.action_type;
            *info = replaced;
            info.action_type = action_type;
        });
        let view = self.store.view_of(&app, &id).expect("present");
        let mut replicate = vec![pod_replication(ReplicationAction::Register, &view)];
        if existing.overridden_status != Status::Unknown && view.info.overridden_status == Status::Unknown {
            // Java peers keep an override until it is deleted explicitly.
            replicate.push(pod_replication(ReplicationAction::DeleteStatusOverride, &view));
        }
        Outcome {
            reply: Reply::Ok,
            replicate,
            pod_override: None,
        }
    }

    /// A new pod instance.
    pub(super) fn insert_pod(&mut self, mut info: InstanceInfo, holding: Holding, now: i64) -> Outcome {
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
        self.store.put(Entry::new(Arc::new(info), lease, holding, false), now);
        self.totals.registrations += 1;
        let view = self.store.view_of(&app, &id).expect("present");
        Outcome {
            reply: Reply::Registered,
            replicate: vec![pod_replication(ReplicationAction::Register, &view)],
            pod_override: None,
        }
    }

    pub(super) fn remove_pod(&mut self, app: &str, id: &str, owner: &PodOwner, now: i64) -> Outcome {
        match self.store.get(app, id).map(|e| &e.holding) {
            Some(Holding::Pod { owner: held_by, .. }) if held_by == owner => {}
            Some(_) => return Outcome::reply(Reply::Refused(format!("instance {id} is not held by {owner}"))),
            None => return Outcome::reply(Reply::NotFound),
        }
        let removed = self.remove(app, id, now).expect("present");
        self.totals.cancellations += 1;
        let mut replication = pod_replication(ReplicationAction::Cancel, &removed);
        replication.instance = None;
        Outcome {
            reply: Reply::Ok,
            replicate: vec![replication],
            pod_override: None,
        }
    }

    /// Recomputes a pod instance's status after its REST override changed.
    pub(super) fn refresh_pod_status(&mut self, app: &str, id: &str, dirty: Option<i64>, now: i64) {
        let entry = self.store.get(app, id).expect("present");
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
            self.store.modify(app, id, now, |info| {
                info.status = status;
                info.overridden_status = effective;
                info.last_dirty_timestamp = dirty.unwrap_or(now).max(info.last_dirty_timestamp.saturating_add(1));
            });
        }
    }
}

/// The override in force on a pod instance: a pending REST one, else the annotation, else the
/// EurekaApp's (`UNKNOWN` for none).
pub(super) fn effective_override(overrides: PodOverrides, rest: Option<RestOverride>) -> Status {
    match rest {
        Some(RestOverride::Set(s)) => s,
        Some(RestOverride::Deleted) => overrides.spec,
        None => overrides.annotation.unwrap_or(overrides.spec),
    }
}

/// A pod instance's status: what the pod maps to, unless it is UP or OUT_OF_SERVICE and an
/// override applies (the same first rules as Java's chain).
fn pod_status(reported: Status, override_status: Status) -> Status {
    let o = (override_status != Status::Unknown).then_some(override_status);
    rules::resolve(reported, o, None, true)
}

fn pod_replication(action: ReplicationAction, view: &InstanceView) -> Replication {
    Replication {
        action,
        app: view.info.app.to_string(),
        id: view.id().to_string(),
        last_dirty_timestamp: Some(view.info.last_dirty_timestamp),
        status: Some(view.info.status),
        overridden_status: None,
        instance: (action == ReplicationAction::Register).then(|| view.clone()),
        origin: Origin::Pod,
        writer: Writer::Controller,
    }
}
