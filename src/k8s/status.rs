//! What an EurekaApp's status says, computed purely from a reconcile's result: conditions
//! (`Ready`, `Degraded`, `Conflict`) with stable transition times, counts by Eureka status, and
//! the Events worth recording (new problems, registrations, deregistrations) with a rate bound per
//! app and reason. The controller writes what this computes, from the leader only.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    time::Duration,
};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};

use super::{
    crd::{EurekaApp, EurekaAppStatus, InstanceCounts, Registration},
    index::AppKey,
    plan::{Plan, Problem},
};
use crate::registry::instance::Status;

/// An Event to record on an EurekaApp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

impl Note {
    pub fn normal(reason: &'static str, action: &'static str, message: String) -> Note {
        Note {
            warning: false,
            reason,
            action,
            message,
        }
    }

    /// The Warning Event for a new problem.
    pub fn problem(p: &Problem) -> Note {
        Note {
            warning: true,
            reason: p.reason(),
            action: "Reconcile",
            message: p.message(),
        }
    }
}

/// A condition value to compute.
pub struct Cond {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

/// Builds conditions, keeping `lastTransitionTime` where the status did not change.
pub fn conditions(
    previous: &[Condition],
    wanted: Vec<Cond>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    wanted
        .into_iter()
        .map(|c| {
            let status = if c.ok { "True" } else { "False" }.to_string();
            let since = previous
                .iter()
                .find(|p| p.type_ == c.type_ && p.status == status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: c.type_.to_string(),
                status,
                reason: c.reason,
                message: c.message,
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// Counts instances by status; `adopted` says whether they are adopted registrations.
pub fn counts(statuses: impl IntoIterator<Item = Status>, adopted: bool) -> InstanceCounts {
    let mut c = InstanceCounts::default();
    for s in statuses {
        c.registered += 1;
        c.adopted += i64::from(adopted);
        match s {
            Status::Up => c.up += 1,
            Status::Down => c.down += 1,
            Status::Starting => c.starting += 1,
            Status::OutOfService => c.out_of_service += 1,
            Status::Unknown => c.unknown += 1,
        }
    }
    c
}

/// Whether two statuses differ in more than their sync time.
pub fn differs(a: &EurekaAppStatus, b: &EurekaAppStatus) -> bool {
    let strip = |s: &EurekaAppStatus| EurekaAppStatus {
        last_sync_time: None,
        ..s.clone()
    };
    strip(a) != strip(b)
}

fn timestamp(now: i64) -> Timestamp {
    Timestamp::from_millisecond(now).unwrap_or_else(|_| Timestamp::now())
}

/// The status of an EurekaApp after a reconcile: `problems` are the plan's and the registry's
/// (instance-id conflicts); `instances` the statuses of its pod instances (or adopted instances)
/// now; `awaiting` the pods of an adopting EurekaApp whose client has not registered yet.
pub fn status(
    app: &EurekaApp,
    plan: &Plan,
    problems: &[Problem],
    instances: InstanceCounts,
    awaiting: &[String],
    now: i64,
) -> EurekaAppStatus {
    let previous = app.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let conflicts: Vec<String> = problems
        .iter()
        .filter(|p| matches!(p, Problem::InstanceIdConflict(_)))
        .map(Problem::message)
        .collect();
    let degraded: Vec<&Problem> = problems
        .iter()
        .filter(|p| !matches!(p, Problem::InstanceIdConflict(_)))
        .collect();
    let seen = Seen {
        adopt: app.spec.registration == Registration::Adopt,
        plan,
        instances: &instances,
        awaiting,
    };
    let conds = vec![
        ready_condition(&seen, &degraded, &conflicts),
        degraded_condition(&degraded),
        conflict_condition(&conflicts),
    ];
    let ts = timestamp(now);
    EurekaAppStatus {
        observed_generation: app.metadata.generation,
        conditions: conditions(previous, conds, app.metadata.generation, ts),
        app_name: Some(plan.app_name.clone()),
        selected_pods: plan.selected as i64,
        instances,
        awaiting_registration: awaiting.len() as i64,
        last_sync_time: Some(Time(ts)),
    }
}

/// What a reconcile saw of an EurekaApp's instances.
struct Seen<'a> {
    adopt: bool,
    plan: &'a Plan,
    instances: &'a InstanceCounts,
    awaiting: &'a [String],
}

/// `Ready`: every selected pod registered (or adopted) and no problem.
fn ready_condition(seen: &Seen<'_>, degraded: &[&Problem], conflicts: &[String]) -> Cond {
    let Seen {
        adopt,
        plan,
        instances,
        awaiting,
    } = *seen;
    let invalid = degraded.iter().any(|p| matches!(p, Problem::InvalidSpec(_)));
    let ready = degraded.is_empty()
        && conflicts.is_empty()
        && awaiting.is_empty()
        && instances.registered as usize >= plan.desired.len();
    let reason = match () {
        _ if invalid => "InvalidSpec",
        _ if !conflicts.is_empty() => "Conflict",
        _ if !degraded.is_empty() => "Degraded",
        _ if !awaiting.is_empty() => "AwaitingRegistration",
        _ if adopt => "InstancesAdopted",
        _ => "InstancesRegistered",
    };
    let mut message = format!(
        "{} of {} selected pods {} as {} ({} UP)",
        instances.registered,
        plan.selected,
        if adopt { "adopted" } else { "registered" },
        plan.app_name,
        instances.up
    );
    if !awaiting.is_empty() {
        const SHOWN: usize = 5;
        let mut names = awaiting[..awaiting.len().min(SHOWN)].join(", ");
        if awaiting.len() > SHOWN {
            names.push_str(&format!(" and {} more", awaiting.len() - SHOWN));
        }
        message.push_str(&format!("; waiting for the Eureka clients of {names} to register"));
    }
    Cond {
        type_: "Ready",
        ok: ready,
        reason: reason.into(),
        message,
    }
}

/// `Degraded`: the problems other than instance-id conflicts.
fn degraded_condition(degraded: &[&Problem]) -> Cond {
    Cond {
        type_: "Degraded",
        ok: !degraded.is_empty(),
        reason: degraded.first().map_or("AsExpected", |p| p.reason()).into(),
        message: if degraded.is_empty() {
            "no problems".into()
        } else {
            degraded.iter().map(|p| p.message()).collect::<Vec<_>>().join("; ")
        },
    }
}

/// `Conflict`: instance ids another owner holds.
fn conflict_condition(conflicts: &[String]) -> Cond {
    let (reason, message) = if conflicts.is_empty() {
        ("NoConflict", "no instance id conflicts".to_string())
    } else {
        ("InstanceIdConflict", conflicts.join("; "))
    };
    Cond {
        type_: "Conflict",
        ok: !conflicts.is_empty(),
        reason: reason.into(),
        message,
    }
}

/// The status of a suspended EurekaApp.
pub fn suspended(app: &EurekaApp, app_name: String, now: i64) -> EurekaAppStatus {
    let previous = app.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let ts = timestamp(now);
    let cond = |type_, message: &str| Cond {
        type_,
        ok: false,
        reason: "Suspended".into(),
        message: message.into(),
    };
    let conds = vec![
        cond("Ready", "spec.suspend is true: no instances are registered"),
        cond("Degraded", "suspended"),
        cond("Conflict", "suspended"),
    ];
    EurekaAppStatus {
        observed_generation: app.metadata.generation,
        conditions: conditions(previous, conds, app.metadata.generation, ts),
        app_name: Some(app_name),
        selected_pods: 0,
        instances: Default::default(),
        awaiting_registration: 0,
        last_sync_time: Some(Time(ts)),
    }
}

/// The problems of one reconcile that were not there at the previous one (those get an Event).
pub fn new_problems<'a>(previous: &BTreeSet<Problem>, now: &'a [Problem]) -> Vec<&'a Problem> {
    now.iter().filter(|p| !previous.contains(p)).collect()
}

/// At most this many Events per EurekaApp and reason in [`NOTE_WINDOW`]; the rest are dropped
/// (and counted), so a flapping pod cannot flood the apiserver.
pub const NOTES_PER_WINDOW: usize = 5;
pub const NOTE_WINDOW: Duration = Duration::from_secs(60);

/// A sliding-window limit per (app, reason).
#[derive(Default)]
pub struct NoteLimiter {
    sent: HashMap<(AppKey, &'static str), VecDeque<tokio::time::Instant>>,
}

impl NoteLimiter {
    pub fn admit(&mut self, key: &AppKey, reason: &'static str, now: tokio::time::Instant) -> bool {
        let q = self.sent.entry((key.clone(), reason)).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= NOTE_WINDOW) {
            q.pop_front();
        }
        if q.len() >= NOTES_PER_WINDOW {
            return false;
        }
        q.push_back(now);
        true
    }

    /// Forgets an app that is gone.
    pub fn forget(&mut self, key: &AppKey) {
        self.sent.retain(|(k, _), _| k != key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = conditions(
            &[],
            vec![Cond {
                type_: "Ready",
                ok: true,
                reason: "R".into(),
                message: "m".into(),
            }],
            Some(1),
            t0,
        );
        let same = conditions(
            &first,
            vec![Cond {
                type_: "Ready",
                ok: true,
                reason: "R".into(),
                message: "m2".into(),
            }],
            Some(2),
            t1,
        );
        assert_eq!(same[0].last_transition_time, Time(t0));
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = conditions(
            &same,
            vec![Cond {
                type_: "Ready",
                ok: false,
                reason: "R".into(),
                message: "m".into(),
            }],
            Some(2),
            t1,
        );
        assert_eq!(flipped[0].last_transition_time, Time(t1));
        assert_eq!(flipped[0].status, "False");
    }

    #[test]
    fn counts_by_status() {
        let c = counts([Status::Up, Status::Up, Status::OutOfService, Status::Starting], false);
        assert_eq!(
            (c.registered, c.up, c.out_of_service, c.starting, c.down, c.adopted),
            (4, 2, 1, 1, 0, 0)
        );
        assert_eq!(counts([Status::Up], true).adopted, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn notes_are_rate_bounded_per_app_and_reason() {
        let mut l = NoteLimiter::default();
        let key = AppKey {
            namespace: "a".into(),
            name: "b".into(),
        };
        let t0 = tokio::time::Instant::now();
        for _ in 0..NOTES_PER_WINDOW {
            assert!(l.admit(&key, "Registered", t0));
        }
        assert!(!l.admit(&key, "Registered", t0));
        assert!(l.admit(&key, "Deregistered", t0), "reasons are limited separately");
        assert!(l.admit(&key, "Registered", t0 + NOTE_WINDOW));
    }
}
