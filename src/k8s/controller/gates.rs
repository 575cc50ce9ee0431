//! Readiness gates: which pods wait for their instance (each reconcile decides), and the
//! leader's gate task, which sets a waiting pod's gate condition once every ready replica holds
//! its instance UP and the gate's delay has passed.
//!
//! A reconcile never waits on the replicas. On the leader it hands the task its EurekaApp's
//! waiting pods ([`Gates::hand`]): they replace what it handed before, an EurekaApp with none
//! clears its entry, and a deleted EurekaApp's entry goes ([`Context::forget`]). The task runs
//! beside the controllers and the watches in [`super::run`], asks the ready replicas about the
//! waiting pods (a few pods at a time), looks again on its own timer while pods wait, and acts
//! only while this replica holds the Lease (a replica that turns follower forgets what it was
//! handed: when it leads again, every EurekaApp is reconciled and hands its pods anew).
//!
//! What it decides is pure, in [`Board`]: which pods to ask about now ([`Board::due`]), which to
//! open given the replicas' answers, the gate's `delaySeconds` and when every replica was first
//! seen holding each one ([`Board::settle`]), and when to look again ([`Board::next_wake`]).

use std::{collections::BTreeMap, time::Instant};

use super::*;

/// How soon a pod that some replica does not hold UP yet, or whose gate could not be written, is
/// looked at again (`--readiness-gate-recheck-ms`'s default).
pub const RECHECK: Duration = Duration::from_millis(500);

/// How long a gate this task opened is not opened again while reconciles still list its pod
/// (until the pod watch brings the True condition; after it, the pod is checked again)
/// (`--readiness-gate-opened-grace-ms`'s default).
pub const OPENED_GRACE: Duration = Duration::from_secs(5);

/// How many pods are checked (and gates written) at once (`--readiness-gate-concurrent-checks`'s
/// default).
pub const CONCURRENT_CHECKS: usize = 8;

/// The gate task's pace (flags; the constants above are the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateTiming {
    pub recheck: Duration,
    pub opened_grace: Duration,
    pub concurrent_checks: usize,
}

impl Default for GateTiming {
    fn default() -> Self {
        GateTiming {
            recheck: RECHECK,
            opened_grace: OPENED_GRACE,
            concurrent_checks: CONCURRENT_CHECKS,
        }
    }
}

/// A pod whose gate is closed while its instance is UP here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WaitingPod {
    pub(super) pod: String,
    /// Its instance's Eureka application and id.
    pub(super) app: String,
    pub(super) id: String,
}

/// The pods of one EurekaApp waiting for its readiness gate (what a reconcile hands the task).
pub(super) struct Gated {
    pub(super) gate: ReadinessGate,
    pub(super) waiting: Vec<WaitingPod>,
}

/// The pods whose `gate` is closed while their instance is UP here (the leader's gate task then
/// asks the other replicas).
pub(super) fn gate_waiting(
    gate: &ReadinessGate,
    plan: &Plan,
    pods: &[Arc<PodInfo>],
    instances: &[(PodOwner, InstanceView)],
) -> Vec<WaitingPod> {
    let up: HashSet<&str> = instances
        .iter()
        .filter(|(_, v)| v.info.status == crate::registry::instance::Status::Up)
        .map(|(_, v)| v.id())
        .collect();
    plan.desired
        .iter()
        .filter(|d| up.contains(d.info.id()))
        .filter(|d| closed(gate, pods, &d.owner.pod))
        .map(|d| WaitingPod {
            pod: d.owner.pod.to_string(),
            app: d.info.app.to_string(),
            id: d.info.id().to_string(),
        })
        .collect()
}

/// As [`gate_waiting`] for an adopting EurekaApp: the gated pods whose adopted registration is
/// UP here (a pod's claim shows the client's status once its containers are ready and only the
/// gate is missing).
pub(super) fn adopted_gate_waiting(
    gate: &ReadinessGate,
    pods: &[Arc<PodInfo>],
    adopted: &[(PodOwner, InstanceView)],
) -> Vec<WaitingPod> {
    adopted
        .iter()
        .filter(|(_, v)| v.info.status == crate::registry::instance::Status::Up)
        .filter(|(o, _)| closed(gate, pods, &o.pod))
        .map(|(o, v)| WaitingPod {
            pod: o.pod.to_string(),
            app: v.info.app.to_string(),
            id: v.id().to_string(),
        })
        .collect()
}

/// Whether the pod named `pod` lists `gate`'s condition and it is not True yet.
fn closed(gate: &ReadinessGate, pods: &[Arc<PodInfo>], pod: &str) -> bool {
    pods.iter()
        .any(|p| *p.name == *pod && p.declares(&gate.condition_type) && !p.gate_open(&gate.condition_type))
}

/// How long a gate waits once every replica holds the instance UP.
fn delay_of(gate: &ReadinessGate) -> Duration {
    if crate::mutants::on("gate-opens-early") {
        Duration::ZERO
    } else {
        Duration::from_secs(gate.delay_seconds.max(0) as u64)
    }
}

/// One pod to ask the ready replicas about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Check {
    pub(super) key: AppKey,
    pub(super) pod: WaitingPod,
}

/// A gate to set True now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Open {
    pub(super) key: AppKey,
    pub(super) pod: String,
    pub(super) condition: String,
}

/// What the gate task knows: the waiting pods the leader's reconciles handed over, by EurekaApp,
/// and per pod when every replica was first seen holding its instance UP and when this task
/// opened its gate. Pure: the caller passes the time and the replicas' answers.
#[derive(Default)]
pub(super) struct Board {
    apps: HashMap<AppKey, Watched>,
    timing: GateTiming,
}

/// One EurekaApp's gate and its waiting pods, by pod name.
struct Watched {
    gate: ReadinessGate,
    pods: BTreeMap<String, PodGate>,
}

struct PodGate {
    app: String,
    id: String,
    /// When every ready replica was first seen holding the instance UP (kept when one misses it
    /// later; the gate opens only on an answer that every replica holds it).
    confirmed: Option<Instant>,
    /// When this task set the gate True.
    opened: Option<Instant>,
}

impl Board {
    pub(super) fn new(timing: GateTiming) -> Board {
        Board {
            apps: HashMap::new(),
            timing,
        }
    }

    /// Replaces what `key`'s reconcile handed before (none, or no waiting pod, clears it); a pod
    /// handed again keeps what the task knows of it. Returns whether a pod was added (the task
    /// then looks at once).
    pub(super) fn hand(&mut self, key: &AppKey, gated: Option<Gated>) -> bool {
        let before = self.apps.remove(key);
        let Some(gated) = gated.filter(|g| !g.waiting.is_empty()) else {
            return false;
        };
        let mut known = before.map(|w| w.pods).unwrap_or_default();
        let mut added = false;
        let pods = gated
            .waiting
            .into_iter()
            .map(|w| {
                let (confirmed, opened) = match known.remove(&w.pod) {
                    Some(p) if p.app == w.app && p.id == w.id => (p.confirmed, p.opened),
                    _ => {
                        added = true;
                        (None, None)
                    }
                };
                let gate = PodGate {
                    app: w.app,
                    id: w.id,
                    confirmed,
                    opened,
                };
                (w.pod, gate)
            })
            .collect();
        self.apps.insert(key.clone(), Watched { gate: gated.gate, pods });
        added
    }

    /// The pods to ask the replicas about at `now`: every waiting pod but those whose delay is
    /// still running since every replica was seen holding them, and those whose gate this task
    /// opened less than the opened grace ago.
    pub(super) fn due(&self, now: Instant) -> Vec<Check> {
        let grace = self.timing.opened_grace;
        let mut due = Vec::new();
        for (key, w) in &self.apps {
            let delay = delay_of(&w.gate);
            for (pod, p) in &w.pods {
                if p.opened.is_some_and(|at| now < at + grace) || p.confirmed.is_some_and(|at| now < at + delay) {
                    continue;
                }
                due.push(Check {
                    key: key.clone(),
                    pod: WaitingPod {
                        pod: pod.clone(),
                        app: p.app.clone(),
                        id: p.id.clone(),
                    },
                });
            }
        }
        due
    }

    /// Takes the replicas' answers (whether every ready replica holds the pod's instance UP) at
    /// `now`, and returns the gates to open: those every replica holds whose delay has passed
    /// since every replica was first seen holding them. An answer about a pod that was handed
    /// away meanwhile is dropped.
    pub(super) fn settle(&mut self, answers: impl IntoIterator<Item = (Check, bool)>, now: Instant) -> Vec<Open> {
        let mut open = Vec::new();
        for (check, everywhere) in answers {
            let Some(w) = self.apps.get_mut(&check.key) else {
                continue;
            };
            let delay = delay_of(&w.gate);
            let Some(p) = w.pods.get_mut(&check.pod.pod) else {
                continue;
            };
            if p.app != check.pod.app || p.id != check.pod.id || !everywhere {
                continue;
            }
            let since = *p.confirmed.get_or_insert(now);
            if now >= since + delay {
                open.push(Open {
                    key: check.key,
                    pod: check.pod.pod,
                    condition: w.gate.condition_type.clone(),
                });
            }
        }
        open
    }

    /// The gate of `key`'s `pod` was set True at `now`.
    pub(super) fn opened(&mut self, key: &AppKey, pod: &str, now: Instant) {
        if let Some(p) = self.apps.get_mut(key).and_then(|w| w.pods.get_mut(pod)) {
            p.opened = Some(now);
            p.confirmed = None;
        }
    }

    /// How long after `now` to look again: when a delay ends or an opened gate's grace does,
    /// else the recheck interval; `None` while no pod waits.
    pub(super) fn next_wake(&self, now: Instant) -> Option<Duration> {
        let GateTiming {
            recheck, opened_grace, ..
        } = self.timing;
        self.apps
            .values()
            .flat_map(|w| {
                let delay = delay_of(&w.gate);
                w.pods.values().map(move |p| match (p.opened, p.confirmed) {
                    (Some(at), _) if now < at + opened_grace => at + opened_grace - now,
                    (_, Some(at)) if now < at + delay => at + delay - now,
                    _ => recheck,
                })
            })
            .min()
    }

    /// Whether any pod waits.
    pub(super) fn is_empty(&self) -> bool {
        self.apps.is_empty()
    }

    /// Forgets every pod (this replica no longer leads).
    pub(super) fn clear(&mut self) {
        self.apps.clear();
    }
}

/// The gate task's board, shared with the reconciles that fill it.
pub(super) struct Gates {
    board: Mutex<Board>,
    /// Wakes the task when a reconcile hands it a new pod.
    wake: tokio::sync::Notify,
}

impl Gates {
    pub(super) fn new(timing: GateTiming) -> Gates {
        Gates {
            board: Mutex::new(Board::new(timing)),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Hands the task `key`'s waiting pods (see [`Board::hand`]).
    pub(super) fn hand(&self, key: &AppKey, gated: Option<Gated>) {
        if self.board.lock().hand(key, gated) {
            self.wake.notify_one();
        }
    }
}

impl Context {
    /// The gate task (see the module docs): runs until shutdown.
    pub(super) async fn open_gates(self: Arc<Self>, mut leader: crate::leadership::Leader) -> anyhow::Result<()> {
        let mut wait: Option<Duration> = None;
        let mut leader_open = true;
        loop {
            let timer = async move {
                match wait {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.gates.wake.notified() => {}
                _ = timer => {}
                changed = leader.changed(), if leader_open => leader_open = changed.is_ok(),
            }
            let lead = *leader.borrow_and_update();
            wait = if lead.holds() {
                self.gate_round().await
            } else if lead == crate::leadership::Lead::Follower {
                // Another replica leads: what this one was handed is stale by the time it leads
                // again, when every EurekaApp is reconciled and hands its pods anew.
                self.gates.board.lock().clear();
                None
            } else {
                // A lead past its deadline can come back without a turn (a renewal after a
                // pause): look again soon rather than only on the next turn.
                (!self.gates.board.lock().is_empty()).then_some(self.settings.gates.recheck)
            };
        }
    }

    /// One round of the gate task: asks the ready replicas about the pods due, opens the gates
    /// the board says to, and returns when to look again.
    async fn gate_round(&self) -> Option<Duration> {
        let checks = self.gates.board.lock().due(Instant::now());
        if !checks.is_empty() {
            let replicas: Vec<Peer> = self
                .peers
                .borrow()
                .iter()
                .filter(|p| p.kind == PeerKind::Replica && p.ready)
                .cloned()
                .collect();
            let answers: Vec<(Check, bool)> = futures::stream::iter(checks)
                .map(|check| {
                    let replicas = &replicas;
                    async move {
                        let everywhere = self.held_everywhere(replicas, &check.pod).await;
                        (check, everywhere)
                    }
                })
                .buffer_unordered(self.settings.gates.concurrent_checks)
                .collect()
                .await;
            let open = self.gates.board.lock().settle(answers, Instant::now());
            futures::stream::iter(open)
                .for_each_concurrent(self.settings.gates.concurrent_checks, |o| {
                    self.open_gate(o, replicas.len())
                })
                .await;
        }
        self.gates.board.lock().next_wake(Instant::now())
    }

    /// Whether every one of `replicas` holds the pod's instance UP (asked one after another,
    /// stopping at the first that does not).
    async fn held_everywhere(&self, replicas: &[Peer], pod: &WaitingPod) -> bool {
        for peer in replicas {
            let status = self.peer_client.instance_status(&peer.url, &pod.app, &pod.id).await;
            if !matches!(status.as_ref().map(|s| s.as_deref()), Ok(Some("UP"))) {
                return false;
            }
        }
        true
    }

    /// Sets one gate True, unless the Lease went while the replicas were asked.
    async fn open_gate(&self, open: Open, replicas: usize) {
        if !self.leader.borrow().holds() {
            return;
        }
        match self
            .set_gate(&open.key.namespace, &open.pod, &open.condition, replicas)
            .await
        {
            Ok(()) => {
                self.gates.board.lock().opened(&open.key, &open.pod, Instant::now());
                self.metrics.gates_opened.inc();
            }
            Err(e) => {
                self.metrics.write_errors.inc();
                tracing::warn!(pod = %open.pod, error = %e, "failed to open a readiness gate; retrying");
            }
        }
    }

    /// Sets the pod's readiness-gate condition True (the status subresource, merged by type).
    pub(super) async fn set_gate(
        &self,
        namespace: &str,
        pod: &str,
        condition: &str,
        replicas: usize,
    ) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": condition,
            "status": "True",
            "reason": "InstanceRegistered",
            "message": format!("the instance is UP on this replica and {replicas} other ready replica(s)"),
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        }]}});
        api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        tracing::info!(pod, namespace, condition, "opened the readiness gate");
        Ok(())
    }
}
