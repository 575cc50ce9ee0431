//! The registry part of a reconcile, on every replica: the plan turned into registry commands
//! (upserts, removals, a gone EurekaApp's deregistration), and what the leader will write about it.

use super::*;
use super::{
    gates::{Gated, adopted_gate_waiting, gate_waiting},
    wakers::adopted_counts,
};
use crate::registry::instance::Status;

/// What the registry part of a reconcile decided, for the leader to write.
pub(super) struct Applied {
    /// The status to write (`None` while the EurekaApp is being deleted).
    pub(super) status: Option<EurekaAppStatus>,
    pub(super) notes: Vec<Note>,
    /// When to look again (a drain deadline).
    pub(super) action: Action,
    /// Pods whose readiness gate this operator may open once every replica has their instance
    /// (the leader hands them to the gate task).
    pub(super) gated: Option<Gated>,
}

/// Events for the instances a reconcile registered and removed.
pub(super) fn change_notes(app_name: &str, registered: &[String], removed: usize) -> Vec<Note> {
    let mut notes = Vec::new();
    if !registered.is_empty() {
        let message = format!(
            "registered {} instance(s) of {app_name}: {}",
            registered.len(),
            registered.join(", ")
        );
        notes.push(Note::normal("Registered", "Register", message));
    }
    if removed > 0 {
        let message = format!("deregistered {removed} instance(s) of {app_name}");
        notes.push(Note::normal("Deregistered", "Deregister", message));
    }
    notes
}

impl Context {
    /// The registry part of a reconcile, on every replica. See the module docs.
    pub(super) fn apply(&self, key: &AppKey, app: &EurekaApp) -> Applied {
        let now = self.state.now();
        let current = self
            .state
            .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name));
        let deleting = app.metadata.deletion_timestamp.is_some();
        let local = (app.spec.cluster_local && !deleting).then(|| {
            crate::k8s::plan::app_name(&Target {
                namespace: &key.namespace,
                name: &key.name,
                spec: &app.spec,
            })
        });
        self.cluster_local.set(&key.to_string(), local);
        if deleting || app.spec.suspend {
            return self.deregister_all(key, app, &current, now);
        }
        let snapshot = self.index.read().snapshot(&key.namespace);
        let plan = self.plan(key, app, &snapshot, now);
        let mut problems = plan.problems.clone();
        problems.extend(plan.invalid.clone().map(Problem::InvalidSpec));
        let (registered, conflicts) = self.upsert(key, &plan);
        problems.extend(conflicts);
        problems.extend(self.state_claims(key, &plan, &snapshot.pods));
        // An invalid spec plans nothing: keep what the last valid spec produced.
        let removed = if plan.invalid.is_some() {
            0
        } else {
            self.remove_stale(&plan, &current)
        };
        let action = match plan.wake_at {
            Some(at) => Action::requeue(Duration::from_millis((at - now).max(0) as u64 + 5)),
            None => Action::await_change(),
        };
        let adopt = app.spec.registration == Registration::Adopt;
        let adopted = self.state.with_registry(|r, _| r.adopted_of(&key.namespace, &key.name));
        if plan.invalid.is_none() {
            self.remember_claims(key, plan.claims.iter().map(|c| c.key.clone()), &adopted);
        }
        let instances = if adopt {
            Vec::new()
        } else {
            self.state
                .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name))
        };
        self.observe_ready_to_up(&current, &instances, &snapshot.pods, now);
        let (counts, awaiting) = if adopt {
            adopted_counts(&plan, &adopted)
        } else {
            (
                status::counts(instances.iter().map(|(_, v)| v.info.status), false),
                Vec::new(),
            )
        };
        let mut notes: Vec<Note> = self.newly_adopted(key, &plan.app_name, &adopted).into_iter().collect();
        notes.extend(change_notes(&plan.app_name, &registered, removed));
        notes.extend(self.new_problems(key, &problems));
        let gated = app.spec.readiness_gate.clone().map(|gate| Gated {
            waiting: if adopt {
                adopted_gate_waiting(&gate, &snapshot.pods, &adopted)
            } else {
                gate_waiting(&gate, &plan, &snapshot.pods, &instances)
            },
            gate,
        });
        Applied {
            status: Some(status::status(app, &plan, &problems, counts, &awaiting, now)),
            notes,
            action,
            gated,
        }
    }

    /// `eureka_controller_pod_ready_to_up_seconds`: for each instance this reconcile turned UP
    /// (new, or another status before), the time since its pod became ready. Pods that were
    /// ready before this replica started watching measure its start-up, not the path from a
    /// Ready pod to clients: they are left out.
    pub(super) fn observe_ready_to_up(
        &self,
        before: &[(PodOwner, InstanceView)],
        after: &[(PodOwner, InstanceView)],
        pods: &[Arc<PodInfo>],
        now: i64,
    ) {
        let was_up: HashSet<&str> = before
            .iter()
            .filter(|(_, v)| v.info.status == Status::Up)
            .map(|(o, _)| o.pod.as_str())
            .collect();
        let newly_up: Vec<&str> = after
            .iter()
            .filter(|(o, v)| v.info.status == Status::Up && !was_up.contains(o.pod.as_str()))
            .map(|(o, _)| o.pod.as_str())
            .collect();
        if newly_up.is_empty() {
            return;
        }
        let ready_since: HashMap<&str, i64> = pods
            .iter()
            .filter_map(|p| {
                let since = p.ready_since.filter(|since| *since >= self.watching_since)?;
                Some((&*p.name, since))
            })
            .collect();
        for pod in newly_up {
            if let Some(since) = ready_since.get(pod) {
                self.metrics.ready_to_up.observe((now - since).max(0) as f64 / 1000.0);
            }
        }
    }

    /// The plan for this EurekaApp's pods as the index holds them now.
    pub(super) fn plan(&self, key: &AppKey, app: &EurekaApp, snapshot: &Snapshot, now: i64) -> Plan {
        let target = Target {
            namespace: &key.namespace,
            name: &key.name,
            spec: &app.spec,
        };
        let ctx = Facts {
            cluster_id: &self.settings.cluster_id,
            cluster_name: &self.settings.cluster_name,
            cluster_domain: &self.settings.cluster_domain,
            node_zones: &snapshot.zones,
            now,
        };
        plan::plan(&target, snapshot.pods.iter().map(|p| p.as_ref()), &ctx)
    }

    /// Registers or updates the planned instances; returns the ids registered anew and the
    /// instance-id conflicts.
    pub(super) fn upsert(&self, key: &AppKey, plan: &Plan) -> (Vec<String>, Vec<Problem>) {
        let mut registered = Vec::new();
        let mut conflicts = Vec::new();
        let mut blocked = HashSet::new();
        for d in &plan.desired {
            let id = d.info.id().to_string();
            let outcome = self.state.apply(Command::UpsertPod {
                info: d.info.clone(),
                owner: d.owner.clone(),
                overrides: d.overrides,
            });
            match outcome.reply {
                Reply::Registered => registered.push(id),
                Reply::Refused(message) => {
                    conflicts.push(Problem::InstanceIdConflict(message));
                    blocked.insert((d.info.app.to_string(), id));
                }
                _ => {}
            }
        }
        self.set_blocked(key, blocked);
        (registered, conflicts)
    }

    /// Removes the instances the plan no longer wants, except those of pods it could not plan.
    pub(super) fn remove_stale(&self, plan: &Plan, current: &[(PodOwner, InstanceView)]) -> usize {
        let wanted: HashSet<(&str, &str)> = plan
            .desired
            .iter()
            .map(|d| (d.info.app.as_str(), d.info.id()))
            .collect();
        let held: HashSet<&str> = plan.held.iter().map(String::as_str).collect();
        let stale: Vec<(PodOwner, InstanceView)> = current
            .iter()
            .filter(|(o, v)| !wanted.contains(&(v.info.app.as_str(), v.id())) && !held.contains(o.pod.as_str()))
            .cloned()
            .collect();
        self.remove(&stale)
    }

    /// A deleted or suspended EurekaApp: every instance goes.
    pub(super) fn deregister_all(
        &self,
        key: &AppKey,
        app: &EurekaApp,
        current: &[(PodOwner, InstanceView)],
        now: i64,
    ) -> Applied {
        let n = self.remove(current);
        // Adopted registrations belong to their clients: released, native again.
        let claims = self.state.with_registry(|r, _| r.claims_of(&key.namespace, &key.name));
        for (owner, _) in claims {
            self.state.apply(Command::Unclaim { owner, pod_gone: false });
        }
        self.remember_claims(key, std::iter::empty(), &[]);
        self.claimed.lock().reported.remove(key);
        self.set_blocked(key, HashSet::new());
        self.reported.lock().remove(key);
        let deleting = app.metadata.deletion_timestamp.is_some();
        let mut notes = Vec::new();
        if n > 0 {
            let why = if deleting { "deleted" } else { "suspended" };
            notes.push(Note::normal(
                "Deregistered",
                "Deregister",
                format!("deregistered {n} instances ({why})"),
            ));
        }
        let app_name = plan::app_name(&Target {
            namespace: &key.namespace,
            name: &key.name,
            spec: &app.spec,
        });
        Applied {
            status: (!deleting).then(|| status::suspended(app, app_name, now)),
            notes,
            action: Action::await_change(),
            gated: None,
        }
    }

    /// Warning notes for the problems that were not there last time.
    pub(super) fn new_problems(&self, key: &AppKey, problems: &[Problem]) -> Vec<Note> {
        let mut reported = self.reported.lock();
        let before = reported.entry(key.clone()).or_default();
        let notes = status::new_problems(before, problems)
            .into_iter()
            .map(Note::problem)
            .collect();
        *before = problems.iter().cloned().collect();
        notes
    }

    /// An EurekaApp that is gone: its instances go, on every replica, at once (the periodic sweep
    /// catches a deletion this replica's watch missed).
    pub(super) fn forget(&self, app: &EurekaApp) {
        let Some(key) = AppKey::of(app) else { return };
        if !self.stores.contains(&key) {
            self.cluster_local.set(&key.to_string(), None);
        }
        if !self.index.read().synced() || self.stores.contains(&key) {
            // Nothing was registered yet; or it exists again and its reconcile decides.
            return;
        }
        let mut gone = app.clone();
        gone.metadata.deletion_timestamp.get_or_insert_with(|| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
        });
        let current = self
            .state
            .with_registry(|r, _| r.pod_instances_of(&key.namespace, &key.name));
        let applied = self.deregister_all(&key, &gone, &current, self.state.now());
        self.metrics.apps.forget(&key);
        self.gates.hand(&key, None);
        self.failures.lock().remove(&key);
        self.reconciled.lock().remove(&key);
        for note in &applied.notes {
            tracing::info!(app = %key, "{}", note.message);
        }
    }
}
