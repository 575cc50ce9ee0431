//! Scenario tests of the controller's pure parts, one behaviour each, on small fixtures (pods,
//! EurekaApps and the registry's instances as a reconcile sees them): which pods wait for their
//! readiness gate, the gate task's decisions, the Events and counts of a reconcile, which
//! EurekaApps a pod change wakes, and the write retries' backoff. The real apiserver's tests
//! (`tests/it`: controller, adopt, readiness_gate, lifecycle) run the same parts end to end.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

use super::{
    apply::change_notes,
    gates::{Board, Check, Gated, OPENED_GRACE, Open, RECHECK, WaitingPod, adopted_gate_waiting, gate_waiting},
    routing::selects,
    wakers::adopted_counts,
    writes::backoff,
    *,
};
use crate::{
    k8s::pods::Labels,
    registry::{
        instance::{InstanceInfo, Status},
        view::LeaseView,
    },
};

const NS: &str = "shop";
const GATE: &str = "eureka-operator.dev/registered";
const NOW_MS: i64 = 1_800_000_000_000;

// ---- fixtures ----

/// The EurekaApp `web` of [`NS`] selecting `app: web`, with `extra` spec lines.
fn eureka_app(extra: &str) -> EurekaApp {
    let yaml = format!(
        "apiVersion: eureka-operator.dev/v1alpha1
kind: EurekaApp
metadata: {{name: web, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  port: http
{extra}"
    );
    serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("bad EurekaApp fixture: {e}"))
}

/// `web` with a readiness gate of `delay_seconds`.
fn gated_app(delay_seconds: i64) -> EurekaApp {
    eureka_app(&format!(
        "  readinessGate: {{conditionType: {GATE}, delaySeconds: {delay_seconds}}}\n"
    ))
}

/// `web` adopting its pods' own registrations, with a readiness gate.
fn adopting_app() -> EurekaApp {
    eureka_app(&format!(
        "  registration: Adopt\n  readinessGate: {{conditionType: {GATE}, delaySeconds: 1}}\n"
    ))
}

fn gate_of(app: &EurekaApp) -> ReadinessGate {
    app.spec.readiness_gate.clone().expect("a gated EurekaApp")
}

fn key(namespace: &str, name: &str) -> AppKey {
    AppKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// The readiness gate a pod fixture lists, if any.
#[derive(Clone, Copy)]
enum PodGate {
    /// The pod lists no readiness gate (Ready once its containers are).
    None,
    /// It lists [`GATE`] and the condition is not True: Ready only once it is.
    Closed,
    /// It lists [`GATE`] and the condition is True.
    Open,
    /// It lists another condition type, still False.
    Other,
}

/// A running pod of `web` (labels `app: web`) in [`NS`], its containers ready, at 10.1.0.`n`.
fn pod(name: &str, n: u8, gate: PodGate) -> Arc<PodInfo> {
    let (gates, condition) = match gate {
        PodGate::None => (String::new(), String::new()),
        PodGate::Closed => (gate_spec(GATE), gate_condition(GATE, false)),
        PodGate::Open => (gate_spec(GATE), gate_condition(GATE, true)),
        PodGate::Other => (
            gate_spec("example.com/other"),
            gate_condition("example.com/other", false),
        ),
    };
    let ready = matches!(gate, PodGate::None | PodGate::Open);
    let yaml = format!(
        r#"
metadata:
  name: {name}
  namespace: {NS}
  uid: uid-{name}
  labels: {{app: web}}
spec:
  nodeName: node-a
{gates}  containers:
  - name: app
    ports: [{{name: http, containerPort: 8080}}]
status:
  podIP: 10.1.0.{n}
  conditions:
  - {{type: Ready, status: "{ready}"}}
  - {{type: ContainersReady, status: "True"}}
{condition}"#,
        ready = if ready { "True" } else { "False" },
    );
    let p: Pod = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("bad pod fixture: {e}"));
    Arc::new(PodInfo::from_pod(&p).expect("a pod with a name and namespace"))
}

fn gate_spec(condition: &str) -> String {
    format!("  readinessGates: [{{conditionType: {condition}}}]\n")
}

fn gate_condition(condition: &str, open: bool) -> String {
    format!(
        "  - {{type: {condition}, status: \"{}\"}}\n",
        if open { "True" } else { "False" }
    )
}

/// `app`'s plan for `pods` (the plan tests' own fixture).
fn plan_of(app: &EurekaApp, pods: &[Arc<PodInfo>]) -> Plan {
    let pods: Vec<PodInfo> = pods.iter().map(|p| (**p).clone()).collect();
    crate::k8s::plan::tests::run(app, &pods)
}

/// The pod instances this replica holds: the plan's instances of the pods named, with a status.
fn held(plan: &Plan, statuses: &[(&str, Status)]) -> Vec<(PodOwner, InstanceView)> {
    statuses
        .iter()
        .map(|(pod, status)| {
            let d = plan
                .desired
                .iter()
                .find(|d| d.owner.pod == *pod)
                .unwrap_or_else(|| panic!("{pod} is not planned"));
            let mut info = d.info.clone();
            info.status = *status;
            (d.owner.clone(), view(info, Origin::Pod))
        })
        .collect()
}

/// A registration of `pod`'s own client (app `WEB`, id `<pod>:web:8080`) adopted for it.
fn adopted(pod: &str, status: Status) -> (PodOwner, InstanceView) {
    let mut info = InstanceInfo::new("web", &format!("{pod}.local"), "10.1.0.9", NOW_MS);
    info.instance_id = Some(format!("{pod}:web:8080").into());
    info.status = status;
    let owner = PodOwner {
        namespace: NS.into(),
        eureka_app: "web".into(),
        pod: pod.into(),
    };
    (owner, view(info, Origin::Adopted))
}

fn view(info: InstanceInfo, origin: Origin) -> InstanceView {
    InstanceView {
        info: Arc::new(info),
        lease: LeaseView::default(),
        origin,
    }
}

fn pod_names(waiting: &[WaitingPod]) -> Vec<&str> {
    waiting.iter().map(|w| w.pod.as_str()).collect()
}

// ---- which pods wait for their gate ----

#[test]
fn a_gated_pod_whose_instance_is_up_here_waits_for_its_gate() {
    let app = gated_app(2);
    let pods = [pod("web-1", 1, PodGate::Closed)];
    let plan = plan_of(&app, &pods);
    let waiting = gate_waiting(&gate_of(&app), &plan, &pods, &held(&plan, &[("web-1", Status::Up)]));
    assert_eq!(
        waiting,
        [WaitingPod {
            pod: "web-1".into(),
            app: "WEB".into(),
            id: plan.desired[0].info.id().to_string(),
        }],
        "held back only by its gate, the pod is planned UP and waits"
    );
}

#[test]
fn a_pod_whose_gate_is_open_no_longer_waits() {
    let app = gated_app(2);
    let pods = [pod("web-1", 1, PodGate::Open), pod("web-2", 2, PodGate::Closed)];
    let plan = plan_of(&app, &pods);
    let here = held(&plan, &[("web-1", Status::Up), ("web-2", Status::Up)]);
    assert_eq!(pod_names(&gate_waiting(&gate_of(&app), &plan, &pods, &here)), ["web-2"]);
}

#[test]
fn a_pod_that_lists_no_gate_or_another_one_does_not_wait() {
    let app = gated_app(2);
    let pods = [pod("web-1", 1, PodGate::None), pod("web-2", 2, PodGate::Other)];
    let plan = plan_of(&app, &pods);
    let here = held(&plan, &[("web-1", Status::Up)]);
    assert!(gate_waiting(&gate_of(&app), &plan, &pods, &here).is_empty());
}

#[test]
fn a_gated_pod_waits_only_once_its_instance_is_up_here() {
    let app = gated_app(2);
    let pods = [pod("web-1", 1, PodGate::Closed), pod("web-2", 2, PodGate::Closed)];
    let plan = plan_of(&app, &pods);
    let gate = gate_of(&app);
    // Not registered here yet, or not UP (an override, a refused id).
    assert!(gate_waiting(&gate, &plan, &pods, &[]).is_empty());
    let here = held(&plan, &[("web-1", Status::OutOfService), ("web-2", Status::Starting)]);
    assert!(gate_waiting(&gate, &plan, &pods, &here).is_empty());
    let here = held(&plan, &[("web-1", Status::OutOfService), ("web-2", Status::Up)]);
    assert_eq!(pod_names(&gate_waiting(&gate, &plan, &pods, &here)), ["web-2"]);
}

#[test]
fn an_adopting_eureka_app_waits_for_the_clients_registration_up_here() {
    let app = adopting_app();
    let gate = gate_of(&app);
    let pods = [
        pod("web-1", 1, PodGate::Closed),
        pod("web-2", 2, PodGate::Closed),
        pod("web-3", 3, PodGate::Open),
        pod("web-4", 4, PodGate::Closed),
    ];
    let registrations = [
        adopted("web-1", Status::Up),
        adopted("web-2", Status::Starting),
        adopted("web-3", Status::Up),
    ];
    let waiting = adopted_gate_waiting(&gate, &pods, &registrations);
    assert_eq!(
        waiting,
        [WaitingPod {
            pod: "web-1".into(),
            app: "WEB".into(),
            id: "web-1:web:8080".into(),
        }],
        "web-2 is not UP, web-3's gate is open, web-4 has no registration"
    );
}

// ---- the gate task's decisions ----

/// A [`Gated`] of `web` waiting for `pods` (instance `<pod>:8080` each).
fn handed(delay_seconds: i64, pods: &[&str]) -> Gated {
    Gated {
        gate: gate_of(&gated_app(delay_seconds)),
        waiting: pods.iter().map(|p| waiting(p)).collect(),
    }
}

fn waiting(pod: &str) -> WaitingPod {
    WaitingPod {
        pod: pod.into(),
        app: "WEB".into(),
        id: format!("{pod}:8080"),
    }
}

/// The EurekaApp `web` of [`NS`].
fn web() -> AppKey {
    key(NS, "web")
}

/// A board that the reconcile of `web` handed `pods` under a gate of `delay_seconds`, and the
/// instant the scenario starts at.
fn board_of(delay_seconds: i64, pods: &[&str]) -> (Board, Instant) {
    let mut board = Board::default();
    board.hand(&web(), Some(handed(delay_seconds, pods)));
    (board, Instant::now())
}

/// The pods due, by name.
fn due(board: &Board, now: Instant) -> Vec<String> {
    let mut due: Vec<String> = board.due(now).into_iter().map(|c| c.pod.pod).collect();
    due.sort();
    due
}

/// Every check due at `now` answered `everywhere`; the pods whose gate opens.
fn answer(board: &mut Board, now: Instant, everywhere: bool) -> Vec<String> {
    let answers: Vec<(Check, bool)> = board.due(now).into_iter().map(|c| (c, everywhere)).collect();
    let mut open: Vec<String> = board.settle(answers, now).into_iter().map(|o| o.pod).collect();
    open.sort();
    open
}

const S: Duration = Duration::from_secs(1);

#[test]
fn a_handed_pod_is_checked_at_once() {
    let mut board = Board::default();
    assert!(board.hand(&web(), Some(handed(2, &["web-1"]))), "wakes the task");
    let t0 = Instant::now();
    assert_eq!(due(&board, t0), ["web-1"]);
    assert_eq!(board.next_wake(t0), Some(RECHECK));
}

/// The flags' pace replaces the defaults: the recheck interval and the opened grace.
#[test]
fn the_board_keeps_the_configured_pace() {
    let timing = super::gates::GateTiming {
        recheck: Duration::from_millis(120),
        opened_grace: Duration::from_secs(2),
        concurrent_checks: 1,
    };
    let mut board = Board::new(timing);
    board.hand(&web(), Some(handed(0, &["web-1"])));
    let t0 = Instant::now();
    assert_eq!(board.next_wake(t0), Some(Duration::from_millis(120)));
    assert_eq!(answer(&mut board, t0, true), ["web-1"]);
    board.opened(&web(), "web-1", t0);
    board.hand(&web(), Some(handed(0, &["web-1"])));
    assert!(due(&board, t0 + S).is_empty());
    assert_eq!(board.next_wake(t0 + S), Some(S), "2 s of grace, 1 s gone");
    assert_eq!(due(&board, t0 + 2 * S), ["web-1"]);
}

#[test]
fn a_gate_opens_once_its_delay_has_passed_since_every_replica_held_the_instance() {
    let (mut board, t0) = board_of(2, &["web-1"]);
    assert!(answer(&mut board, t0, true).is_empty(), "not before the delay");
    assert_eq!(board.next_wake(t0), Some(2 * S), "looks again when the delay ends");
    assert!(
        due(&board, t0 + S).is_empty(),
        "no replica is asked while the delay runs"
    );
    let at = t0 + 2 * S;
    let checks = board.due(at);
    assert_eq!(checks.len(), 1, "asked again once it ended");
    let open = board.settle(checks.into_iter().map(|c| (c, true)), at);
    assert_eq!(
        open,
        [Open {
            key: web(),
            pod: "web-1".into(),
            condition: GATE.into(),
        }]
    );
}

#[test]
fn a_gate_without_delay_opens_on_the_first_answer_that_every_replica_holds_it() {
    let (mut board, t0) = board_of(0, &["web-1"]);
    assert_eq!(answer(&mut board, t0, true), ["web-1"]);
}

#[test]
fn a_replica_without_the_instance_holds_the_gate_and_it_is_asked_again_soon() {
    let (mut board, t0) = board_of(0, &["web-1"]);
    for i in 0..3 {
        assert!(answer(&mut board, t0 + i * RECHECK, false).is_empty());
        assert_eq!(board.next_wake(t0 + i * RECHECK), Some(RECHECK));
    }
    assert_eq!(answer(&mut board, t0 + 3 * RECHECK, true), ["web-1"]);
}

#[test]
fn the_delay_counts_from_the_first_time_every_replica_held_the_instance() {
    let (mut board, t0) = board_of(2, &["web-1"]);
    assert!(answer(&mut board, t0, true).is_empty());
    // When the delay ends a replica misses it (a restart): the gate holds, and opens on the next
    // answer that every replica holds it, without a second delay.
    assert!(answer(&mut board, t0 + 2 * S, false).is_empty());
    assert_eq!(board.next_wake(t0 + 2 * S), Some(RECHECK));
    assert_eq!(answer(&mut board, t0 + 2 * S + RECHECK, true), ["web-1"]);
}

#[test]
fn handing_the_same_pods_again_does_not_restart_their_delay() {
    let (mut board, t0) = board_of(2, &["web-1"]);
    answer(&mut board, t0, true);
    assert!(
        !board.hand(&web(), Some(handed(2, &["web-1"]))),
        "nothing new: the task need not look at once"
    );
    assert_eq!(answer(&mut board, t0 + 2 * S, true), ["web-1"]);
}

#[test]
fn a_pod_whose_instance_id_changed_is_confirmed_anew() {
    let (mut board, t0) = board_of(2, &["web-1"]);
    answer(&mut board, t0, true);
    let mut renamed = handed(2, &["web-1"]);
    renamed.waiting[0].id = "web-1:9090".into();
    assert!(board.hand(&web(), Some(renamed)), "a new instance to confirm");
    assert!(
        answer(&mut board, t0 + 2 * S, true).is_empty(),
        "its own delay starts now"
    );
    assert_eq!(answer(&mut board, t0 + 4 * S, true), ["web-1"]);
}

#[test]
fn a_handed_set_replaces_the_eureka_apps_last_one_and_leaves_the_others() {
    let (mut board, t0) = board_of(0, &["web-1", "web-2"]);
    board.hand(&key(NS, "api"), Some(handed(0, &["api-1"])));
    board.hand(&key("other", "web"), Some(handed(0, &["web-1"])));
    assert_eq!(board.due(t0).len(), 4);
    board.hand(&web(), Some(handed(0, &["web-2", "web-3"])));
    let mut due: Vec<(String, String)> = board
        .due(t0)
        .into_iter()
        .map(|c| (c.key.to_string(), c.pod.pod))
        .collect();
    due.sort();
    assert_eq!(
        due,
        [
            ("other/web".into(), "web-1".into()),
            ("shop/api".into(), "api-1".into()),
            ("shop/web".into(), "web-2".into()),
            ("shop/web".into(), "web-3".into()),
        ]
    );
}

#[test]
fn an_eureka_app_with_no_waiting_pod_or_deleted_clears_its_entry() {
    let (mut board, t0) = board_of(0, &["web-1"]);
    let api = key(NS, "api");
    board.hand(&api, Some(handed(0, &["api-1"])));
    assert!(!board.hand(&web(), Some(handed(0, &[]))), "no waiting pod");
    assert_eq!(due(&board, t0), ["api-1"]);
    board.hand(&api, None);
    assert!(board.is_empty());
    assert_eq!(
        board.next_wake(t0),
        None,
        "nothing waits: the task sleeps until handed more"
    );
}

#[test]
fn a_replica_that_turns_follower_forgets_what_it_was_handed() {
    let (mut board, t0) = board_of(2, &["web-1"]);
    board.hand(&key(NS, "api"), Some(handed(2, &["api-1"])));
    board.clear();
    assert!(board.is_empty() && board.due(t0).is_empty());
    assert_eq!(board.next_wake(t0), None);
}

#[test]
fn an_answer_about_a_pod_handed_away_meanwhile_opens_nothing() {
    let (mut board, t0) = board_of(0, &["web-1"]);
    let checks = board.due(t0);
    // While the replicas were asked, a reconcile saw the pod go (or its gate open).
    board.hand(&web(), None);
    assert!(board.settle(checks.iter().cloned().map(|c| (c, true)), t0).is_empty());
    board.hand(&web(), Some(handed(0, &["web-2"])));
    assert!(board.settle(checks.into_iter().map(|c| (c, true)), t0).is_empty());
}

#[test]
fn an_opened_gate_is_not_opened_again_before_the_pod_watch_shows_it() {
    let (mut board, t0) = board_of(0, &["web-1"]);
    assert_eq!(answer(&mut board, t0, true), ["web-1"]);
    board.opened(&web(), "web-1", t0);
    // A reconcile from before the pod watch brought the True condition still lists it.
    board.hand(&web(), Some(handed(0, &["web-1"])));
    assert!(due(&board, t0 + S).is_empty());
    assert_eq!(board.next_wake(t0 + S), Some(OPENED_GRACE - S));
    // Listed still after the grace: the gate was not set after all (or was reset): again.
    assert_eq!(answer(&mut board, t0 + OPENED_GRACE, true), ["web-1"]);
}

#[test]
fn the_task_wakes_for_the_soonest_pod() {
    let (mut board, t0) = board_of(3, &["web-1"]);
    board.hand(&key(NS, "api"), Some(handed(2, &["api-1"])));
    answer(&mut board, t0, true);
    assert_eq!(board.next_wake(t0 + S / 2), Some(2 * S - S / 2));
    assert_eq!(board.next_wake(t0 + 2 * S), Some(RECHECK), "api-1 is due again");
}

// ---- a reconcile's Events and counts ----

#[test]
fn a_reconcile_that_changed_nothing_records_no_event() {
    assert!(change_notes("WEB", &[], 0).is_empty());
}

#[test]
fn registrations_and_removals_are_one_event_each() {
    let notes = change_notes("WEB", &["web-1:8080".into(), "web-2:8080".into()], 3);
    let seen: Vec<(&str, &str, bool, &str)> = notes
        .iter()
        .map(|n| (n.reason, n.action, n.warning, n.message.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "Registered",
                "Register",
                false,
                "registered 2 instance(s) of WEB: web-1:8080, web-2:8080"
            ),
            ("Deregistered", "Deregister", false, "deregistered 3 instance(s) of WEB"),
        ]
    );
    let one = change_notes("WEB", &[], 1);
    assert_eq!(one.len(), 1, "a single removal is one event too");
    assert_eq!(one[0].reason, "Deregistered");
}

#[test]
fn adopted_counts_count_registrations_by_status() {
    let app = adopting_app();
    let pods = [pod("web-1", 1, PodGate::None), pod("web-2", 2, PodGate::None)];
    let plan = plan_of(&app, &pods);
    let (counts, awaiting) = adopted_counts(&plan, &[adopted("web-1", Status::Up), adopted("web-2", Status::Down)]);
    assert_eq!(
        counts,
        InstanceCounts {
            registered: 2,
            adopted: 2,
            up: 1,
            down: 1,
            ..InstanceCounts::default()
        }
    );
    assert!(awaiting.is_empty());
}

#[test]
fn live_pods_without_a_registration_are_listed_as_awaiting_in_order() {
    let app = adopting_app();
    let pods = [
        pod("web-3", 3, PodGate::None),
        pod("web-1", 1, PodGate::None),
        pod("web-2", 2, PodGate::None),
    ];
    let mut plan = plan_of(&app, &pods);
    // Whatever order the plan states its claims in.
    plan.claims.sort_by(|a, b| b.owner.pod.cmp(&a.owner.pod));
    let (counts, awaiting) = adopted_counts(&plan, &[adopted("web-2", Status::Up)]);
    assert_eq!(counts.registered, 1);
    assert_eq!(awaiting, ["web-1", "web-3"]);
}

#[test]
fn a_drained_pod_awaits_no_registration() {
    let app = eureka_app("  registration: Adopt\n  terminating: Deregister\n");
    let mut draining = (*pod("web-1", 1, PodGate::None)).clone();
    draining.deleting_since = Some(NOW_MS - 1_000);
    let plan = plan_of(&app, &[Arc::new(draining), pod("web-2", 2, PodGate::None)]);
    assert!(
        plan.claims.iter().any(|c| c.state == ClaimState::Drained),
        "fixture: web-1 is drained: {:?}",
        plan.claims
    );
    let (_, awaiting) = adopted_counts(&plan, &[]);
    assert_eq!(awaiting, ["web-2"]);
}

// ---- trigger routing ----

fn labels(pairs: &[(&str, &str)]) -> Labels {
    let mut l = Labels::default();
    for (k, v) in pairs {
        l.insert(k, v);
    }
    l
}

#[test]
fn a_pod_change_concerns_the_eureka_apps_whose_selector_matches_its_labels_before_or_after() {
    let app = eureka_app("");
    assert!(selects(&app, &[labels(&[("app", "web"), ("track", "canary")])]));
    assert!(!selects(&app, &[labels(&[("app", "api")])]));
    // Relabelled away from `app: web`: the EurekaApp must look (its instance goes).
    assert!(selects(&app, &[labels(&[("app", "web")]), labels(&[("app", "api")])]));
    assert!(!selects(&app, &[]));
}

#[test]
fn a_pod_change_concerns_an_eureka_app_whose_status_override_selects_it() {
    let app =
        eureka_app("  statusOverrides:\n  - selector: {matchLabels: {track: canary}}\n    status: OUT_OF_SERVICE\n");
    assert!(selects(&app, &[labels(&[("app", "api"), ("track", "canary")])]));
    assert!(!selects(&app, &[labels(&[("app", "api"), ("track", "stable")])]));
}

#[test]
fn an_invalid_selector_concerns_every_pod_but_an_invalid_override_selector_none() {
    let invalid = "{matchExpressions: [{key: app, operator: Sometimes, values: [web]}]}";
    let app = eureka_app(&format!(
        "  statusOverrides:\n  - selector: {invalid}\n    status: DOWN\n"
    ));
    assert!(
        !selects(&app, &[labels(&[("app", "api")])]),
        "the override's selector is invalid and the main one does not match"
    );
    let mut app = eureka_app("");
    app.spec.selector = serde_saphyr::from_str(invalid).unwrap();
    assert!(
        selects(&app, &[labels(&[("app", "api")])]),
        "the reconcile reports the invalid selector"
    );
}

/// Stores and triggers for the scopes `namespaces` (all namespaces when empty), holding `apps`.
fn routing(
    namespaces: &[&str],
    apps: &[EurekaApp],
) -> (Stores, Triggers, Vec<mpsc::UnboundedReceiver<ObjectRef<EurekaApp>>>) {
    let namespaces: Vec<String> = namespaces.iter().map(|n| n.to_string()).collect();
    let (mut stores, mut triggers, mut queues) = (Stores::default(), Triggers::default(), Vec::new());
    for scope in Scope::of(&namespaces) {
        let (store, mut writer) = reflector::store();
        for app in apps
            .iter()
            .filter(|a| scope.contains(a.metadata.namespace.as_deref().unwrap()))
        {
            writer.apply_watcher_event(&Event::Apply(app.clone()));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        stores.0.push((scope.clone(), store));
        triggers.0.push((scope, tx));
        queues.push(rx);
    }
    (stores, triggers, queues)
}

fn in_namespace(namespace: &str, name: &str) -> EurekaApp {
    let mut app = eureka_app("");
    app.metadata.namespace = Some(namespace.into());
    app.metadata.name = Some(name.into());
    app
}

fn names(apps: Vec<Arc<EurekaApp>>) -> Vec<String> {
    let mut names: Vec<String> = apps.iter().map(|a| AppKey::of(a).unwrap().to_string()).collect();
    names.sort();
    names
}

fn queued(rx: &mut mpsc::UnboundedReceiver<ObjectRef<EurekaApp>>) -> Vec<String> {
    std::iter::from_fn(|| rx.try_recv().ok())
        .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
        .collect()
}

#[test]
fn a_pod_change_is_matched_against_the_eureka_apps_of_its_namespace_only() {
    let apps = [
        in_namespace("shop", "web"),
        in_namespace("shop", "api"),
        in_namespace("bank", "web"),
    ];
    let (stores, _, _) = routing(&[], &apps);
    assert_eq!(names(stores.apps_in("shop")), ["shop/api", "shop/web"]);
    assert_eq!(names(stores.apps_in("bank")), ["bank/web"]);
    assert!(stores.apps_in("else").is_empty());
    let (stores, _, _) = routing(&["shop", "bank"], &apps);
    assert_eq!(names(stores.apps_in("shop")), ["shop/api", "shop/web"]);
    assert!(stores.contains(&key("bank", "web")) && !stores.contains(&key("bank", "api")));
}

#[test]
fn a_reconcile_request_goes_to_the_controller_of_its_namespace() {
    let (_, triggers, mut queues) = routing(&["shop", "bank"], &[]);
    triggers.send(&key("bank", "web"));
    triggers.send(&key("else", "web"));
    assert!(queued(&mut queues[0]).is_empty());
    assert_eq!(queued(&mut queues[1]), ["bank/web"]);
    let (_, triggers, mut queues) = routing(&[], &[]);
    triggers.send(&key("else", "web"));
    assert_eq!(
        queued(&mut queues[0]),
        ["else/web"],
        "one controller watches every namespace"
    );
}

// ---- retries ----

#[test]
fn a_failed_write_is_retried_after_500_ms_doubling_per_failure() {
    let cap = Duration::from_secs(60);
    let waits: Vec<Duration> = (1..=5).map(|n| backoff(n, cap)).collect();
    assert_eq!(waits, [500, 1_000, 2_000, 4_000, 8_000].map(Duration::from_millis));
    assert_eq!(backoff(0, cap), Duration::from_millis(500), "as after one failure");
}

#[test]
fn the_backoff_stops_at_its_cap_and_never_overflows() {
    let cap = Duration::from_secs(60);
    assert_eq!(backoff(8, cap), cap, "64 s is past the cap");
    assert_eq!(backoff(u32::MAX, cap), cap);
    assert_eq!(backoff(u32::MAX, Duration::MAX), Duration::from_millis(500) * (1 << 16));
}
