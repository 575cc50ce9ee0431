//! Bookkeeping that asks for a reconcile between pod changes: the instance ids a pod could not
//! take (the conflict waker) and the endpoints and ids adopting EurekaApps claim (the adoption
//! waker), with the claims a reconcile states.

use super::*;

/// Per EurekaApp, the (app, instance id) pairs its pods could not take (held by someone else).
pub(super) type BlockedIds = HashMap<AppKey, HashSet<(String, String)>>;

/// The adopting EurekaApps' endpoints and adopted ids (see [`AdoptionWaker`]).
#[derive(Default)]
pub(super) struct Claimed {
    pub(super) endpoints: HashMap<ClaimKey, AppKey>,
    pub(super) ids: HashMap<(String, String), AppKey>,
    /// The adopted ids each EurekaApp's last reconcile saw (for the `Adopted` Events).
    pub(super) reported: HashMap<AppKey, HashSet<String>>,
    /// What each EurekaApp put in `endpoints` and `ids` last time (so a reconcile replaces its
    /// own entries without scanning everyone's).
    pub(super) of_app: HashMap<AppKey, AppClaims>,
}

/// The endpoints and `(app, instance id)`s one EurekaApp put in [`Claimed`].
pub(super) type AppClaims = (Vec<ClaimKey>, Vec<(String, String)>);

/// Looks at an EurekaApp again when an instance id one of its pods could not take (a conflict) is
/// cancelled or evicted, so the pod registers as soon as the id is free.
pub struct ConflictWaker(pub(super) Arc<Context>);

impl OutcomeListener for ConflictWaker {
    fn on_outcome(&self, outcome: &Outcome) {
        let mut freed = outcome
            .replicate
            .iter()
            .filter(|r| r.action == crate::registry::ReplicationAction::Cancel)
            .peekable();
        if freed.peek().is_none() {
            return;
        }
        let blocked = self.0.blocked.lock();
        for r in freed {
            let id = (r.app.clone(), r.id.clone());
            for (key, ids) in blocked.iter() {
                if ids.contains(&id) {
                    self.0.triggers.send(key);
                }
            }
        }
    }
}

/// Looks at an adopting EurekaApp again when one of its pods' clients registers or cancels, so its
/// status (adopted counts, pods awaiting registration) follows without waiting for a pod change.
pub struct AdoptionWaker(pub(super) Arc<Context>);

impl OutcomeListener for AdoptionWaker {
    fn on_outcome(&self, outcome: &Outcome) {
        let mut claimed = None;
        for r in &outcome.replicate {
            // The controller's own changes come from a reconcile.
            if r.writer == crate::registry::Writer::Controller {
                continue;
            }
            let claimed = claimed.get_or_insert_with(|| self.0.claimed.lock());
            let id = (r.app.clone(), r.id.clone());
            let key = match (r.action, &r.instance) {
                (crate::registry::ReplicationAction::Register, Some(view)) if view.origin == Origin::Adopted => {
                    let key = claimed.endpoints.get(&ClaimKey::of(&view.info)).cloned();
                    if let Some(k) = &key {
                        claimed.ids.insert(id.clone(), k.clone());
                        claimed.of_app.entry(k.clone()).or_default().1.push(id);
                    }
                    key
                }
                (crate::registry::ReplicationAction::Cancel, _) => claimed.ids.remove(&id),
                _ => None,
            };
            if let Some(key) = key {
                self.0.triggers.send(&key);
            }
        }
    }
}

/// The counts of an adopting EurekaApp's registrations, and its live pods that have none yet.
pub(super) fn adopted_counts(plan: &Plan, adopted: &[(PodOwner, InstanceView)]) -> (InstanceCounts, Vec<String>) {
    let with_registration: HashSet<&str> = adopted.iter().map(|(o, _)| o.pod.as_str()).collect();
    let mut awaiting: Vec<String> = plan
        .claims
        .iter()
        .filter(|c| matches!(c.state, ClaimState::Live { .. }))
        .filter(|c| !with_registration.contains(c.owner.pod.as_str()))
        .map(|c| c.owner.pod.to_string())
        .collect();
    awaiting.sort();
    (
        status::counts(adopted.iter().map(|(_, v)| v.info.status), true),
        awaiting,
    )
}

impl Context {
    /// Remembers the ids `key`'s pods could not take; if one was freed meanwhile (between the
    /// refusal and now), looks again at once.
    pub(super) fn set_blocked(&self, key: &AppKey, ids: HashSet<(String, String)>) {
        if ids.is_empty() {
            self.blocked.lock().remove(key);
            return;
        }
        self.blocked.lock().insert(key.clone(), ids.clone());
        let freed = self
            .state
            .with_registry(|r, _| ids.iter().any(|(app, id)| !r.contains(app, id)));
        if freed {
            self.triggers.send(key);
        }
    }

    /// An Event for the registrations adopted since the last reconcile (here, or as they
    /// arrived), if there are any.
    pub(super) fn newly_adopted(
        &self,
        key: &AppKey,
        app_name: &str,
        adopted: &[(PodOwner, InstanceView)],
    ) -> Option<Note> {
        let adopted_now: HashSet<String> = adopted.iter().map(|(_, v)| v.id().to_string()).collect();
        let mut newly: Vec<String> = {
            let mut claimed = self.claimed.lock();
            let seen = claimed.reported.entry(key.clone()).or_default();
            let newly = adopted_now.difference(seen).cloned().collect();
            *seen = adopted_now;
            newly
        };
        if newly.is_empty() {
            return None;
        }
        newly.sort();
        let message = format!(
            "adopted {} registration(s) of {app_name} made by the pods' own clients: {}",
            newly.len(),
            newly.join(", ")
        );
        Some(Note::normal("Adopted", "Adopt", message))
    }

    /// States the plan's claims (none unless the EurekaApp adopts) and withdraws the others of
    /// this EurekaApp, except those of pods it could not plan: a pod that is gone (or finished)
    /// has its registrations cancelled, one that stopped matching has them released. Returns the
    /// claims refused because another pod's claim holds the endpoint.
    pub(super) fn state_claims(&self, key: &AppKey, plan: &Plan, pods: &[Arc<PodInfo>]) -> Vec<Problem> {
        let mut problems = Vec::new();
        if plan.invalid.is_some() {
            // Nothing is planned: the last valid spec's claims stay.
            return problems;
        }
        for c in &plan.claims {
            let outcome = self.state.apply(Command::Claim { claim: c.clone() });
            if let Reply::Refused(message) = outcome.reply {
                problems.push(Problem::InstanceIdConflict(message));
            }
        }
        let wanted: HashSet<&str> = plan.claims.iter().map(|c| c.owner.pod.as_str()).collect();
        let held: HashSet<&str> = plan.held.iter().map(String::as_str).collect();
        let stale: Vec<PodOwner> = self
            .state
            .with_registry(|r, _| r.claims_of(&key.namespace, &key.name))
            .into_iter()
            .map(|(o, _)| o)
            .filter(|o| !wanted.contains(o.pod.as_str()) && !held.contains(o.pod.as_str()))
            .collect();
        for owner in stale {
            let running = pods.iter().any(|p| *p.name == *owner.pod && !p.finished());
            self.state.apply(Command::Unclaim {
                owner,
                pod_gone: !running,
            });
        }
        problems
    }

    /// Records the endpoints `key` claims now and the registrations adopted for it, for the
    /// [`AdoptionWaker`].
    pub(super) fn remember_claims(
        &self,
        key: &AppKey,
        endpoints: impl Iterator<Item = ClaimKey>,
        adopted: &[(PodOwner, InstanceView)],
    ) {
        let endpoints: Vec<ClaimKey> = endpoints.collect();
        let ids: Vec<(String, String)> = adopted
            .iter()
            .map(|(_, v)| (v.info.app.to_string(), v.id().to_string()))
            .collect();
        let mut guard = self.claimed.lock();
        let claimed = &mut *guard;
        if let Some((old_endpoints, old_ids)) = claimed.of_app.remove(key) {
            for e in old_endpoints {
                if claimed.endpoints.get(&e) == Some(key) {
                    claimed.endpoints.remove(&e);
                }
            }
            for id in old_ids {
                if claimed.ids.get(&id) == Some(key) {
                    claimed.ids.remove(&id);
                }
            }
        }
        if endpoints.is_empty() && ids.is_empty() {
            return;
        }
        for e in &endpoints {
            claimed.endpoints.insert(e.clone(), key.clone());
        }
        for id in &ids {
            claimed.ids.insert(id.clone(), key.clone());
        }
        claimed.of_app.insert(key.clone(), (endpoints, ids));
    }
}
