//! Adoption scenarios with explicit instants: the orders in which a pod, its claim and its
//! client's registration can arrive, what the pod's state does to the registration, and how
//! adoption ends.

use crate::registry::{
    Claim, ClaimKey, ClaimState, Command, Outcome, PodOverrides, PodOwner, Registry, RegistryConfig, ReplicationAction,
    Reply, Writer,
    instance::{InstanceInfo, Status},
    preservation::PreservationConfig,
    view::Origin,
};

const T0: i64 = 1_700_000_000_000;
const APP: &str = "ORDERS";

fn registry() -> Registry {
    let config = RegistryConfig {
        preservation: PreservationConfig {
            enable_self_preservation: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = Registry::new(config, T0);
    r.open_for_traffic(10, T0);
    r
}

/// A registration as a pod's client makes it: from `ip`:8080.
fn client(id: &str, ip: &str, dirty: i64) -> InstanceInfo {
    let mut i = InstanceInfo::new(APP, ip, ip, dirty);
    i.instance_id = Some(id.to_string().into());
    i.port.port = 8080;
    i.lease.duration_secs = 3;
    i.lease.renewal_interval_secs = 1;
    i
}

fn owner(pod: &str) -> PodOwner {
    PodOwner {
        namespace: "shop".into(),
        eureka_app: "orders".into(),
        pod: pod.into(),
    }
}

fn claim(pod: &str, ip: &str, state: ClaimState) -> Claim {
    Claim {
        owner: owner(pod),
        key: ClaimKey {
            app: APP.into(),
            ip: ip.into(),
            port: 8080,
        },
        instance_id: None,
        state,
        linger_ms: 2_000,
    }
}

const READY: ClaimState = ClaimState::Live {
    status: Status::Up,
    spec: Status::Unknown,
};

fn live(status: Status) -> ClaimState {
    ClaimState::Live {
        status,
        spec: Status::Unknown,
    }
}

fn register(r: &mut Registry, info: InstanceInfo, writer: Writer, now: i64) -> Outcome {
    r.apply(Command::Register { info, writer }, now)
}

fn renew(r: &mut Registry, id: &str, now: i64) -> Reply {
    r.apply(
        Command::Renew {
            app: APP.into(),
            id: id.into(),
            writer: Writer::Client,
            overridden_status: None,
            last_dirty_timestamp: None,
        },
        now,
    )
    .reply
}

fn state(r: &mut Registry, id: &str, now: i64) -> Option<(Status, Origin)> {
    r.instance(APP, id, now).map(|v| (v.info.status, v.origin))
}

fn expected(r: &mut Registry) -> i64 {
    r.stats(T0).expected_clients
}

#[test]
fn a_claim_that_comes_first_adopts_the_registration_as_it_arrives_never_counted() {
    let mut r = registry();
    assert_eq!(
        r.apply(
            Command::Claim {
                claim: claim("p-1", "10.0.0.1", READY)
            },
            T0
        )
        .reply,
        Reply::Ok
    );
    let out = register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    assert_eq!(out.reply, Reply::Registered);
    assert_eq!(state(&mut r, "a", T0), Some((Status::Up, Origin::Adopted)));
    assert_eq!(expected(&mut r), 10, "an adopted registration is not expected to renew");
    // Its renewals do not count either; it never expires, it is never evicted.
    let renews = r.stats(T0).totals.renewals;
    assert_eq!(renew(&mut r, "a", T0 + 500), Reply::Ok);
    assert_eq!(r.stats(T0).totals.renewals, renews + 1);
    assert_eq!(r.stats(T0 + 60_000).renews_last_min, 0);
    let later = T0 + 3_600_000;
    assert!(r.evict(later, 1).is_empty());
    assert!(
        r.instance(APP, "a", later).is_some(),
        "visible although its lease ran out long ago"
    );
    assert_eq!(r.stats(later).expired, 0);
    assert_eq!(r.adopted_of("shop", "orders").len(), 1);
    assert!(
        r.pod_instances().is_empty(),
        "the client's registration, not a pod instance"
    );
}

#[test]
fn a_registration_that_comes_first_is_native_until_the_claim_adopts_it_in_place() {
    let mut r = registry();
    register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    assert_eq!(state(&mut r, "a", T0), Some((Status::Up, Origin::Native)));
    assert_eq!(expected(&mut r), 11);
    // The pod is seen, not Ready yet.
    let out = r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Starting)),
        },
        T0 + 10,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(state(&mut r, "a", T0), Some((Status::Starting, Origin::Adopted)));
    assert_eq!(expected(&mut r), 10);
    // Java peers hear of the status shown, from the controller (the leader sends it).
    assert_eq!(out.replicate.len(), 1);
    assert_eq!(out.replicate[0].writer, Writer::Controller);
    assert_eq!(out.replicate[0].status, Some(Status::Starting));
    // The same claim again changes nothing.
    let v = r.version();
    let again = r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Starting)),
        },
        T0 + 20,
    );
    assert_eq!(again.reply, Reply::Unchanged);
    assert_eq!(r.version(), v);
    // Ready: the client's own status shows.
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 30,
    );
    assert_eq!(state(&mut r, "a", T0), Some((Status::Up, Origin::Adopted)));
}

/// One adopted registration through each layer of its status in turn; each step starts from
/// the state the one before left, so this stays one test.
#[test]
fn the_pods_state_comes_first_then_overrides_then_the_clients_status() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0,
    );
    let mut starting = client("a", "10.0.0.1", T0);
    starting.status = Status::Starting;
    register(&mut r, starting, Writer::Client, T0);
    assert_eq!(
        state(&mut r, "a", T0).unwrap().0,
        Status::Starting,
        "the client's STARTING shows"
    );
    register(&mut r, client("a", "10.0.0.1", T0 + 1), Writer::Client, T0 + 1);
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Up);
    // Not Ready (DOWN as configured), whatever the client says.
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Down)),
        },
        T0 + 2,
    );
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Down);
    register(&mut r, client("a", "10.0.0.1", T0 + 3), Writer::Client, T0 + 3);
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Down);
    // The EurekaApp's override applies to a Ready pod's UP.
    r.apply(
        Command::Claim {
            claim: claim(
                "p-1",
                "10.0.0.1",
                ClaimState::Live {
                    status: Status::Up,
                    spec: Status::OutOfService,
                },
            ),
        },
        T0 + 4,
    );
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::OutOfService);
    // A REST override beats the EurekaApp's, as for pod instances.
    let set = r.apply(
        Command::SetStatus {
            app: APP.into(),
            id: "a".into(),
            status: Status::Up,
            last_dirty_timestamp: None,
            writer: Writer::Client,
        },
        T0 + 5,
    );
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Up);
    let actions: Vec<(ReplicationAction, Writer)> = set.replicate.iter().map(|x| (x.action, x.writer)).collect();
    assert_eq!(
        actions,
        [
            (ReplicationAction::Register, Writer::Controller),
            (ReplicationAction::StatusUpdate, Writer::Client)
        ]
    );
    // Terminating: OUT_OF_SERVICE whatever the overrides.
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::OutOfService)),
        },
        T0 + 6,
    );
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::OutOfService);
    // Hash code and counts follow the status shown.
    assert_eq!(r.full_view().apps_hashcode, "OUT_OF_SERVICE_1_");
}

#[test]
fn the_drain_ends_the_registration_and_the_pod_refuses_new_ones() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::OutOfService)),
        },
        T0,
    );
    register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    let out = r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", ClaimState::Drained),
        },
        T0 + 30_000,
    );
    assert_eq!(out.replicate.len(), 1);
    assert_eq!(
        (out.replicate[0].action, out.replicate[0].writer),
        (ReplicationAction::Cancel, Writer::Controller)
    );
    assert_eq!(state(&mut r, "a", T0 + 30_000), None);
    assert_eq!(
        expected(&mut r),
        10,
        "the cancel of an adopted registration moves nothing"
    );
    // The client, still shutting down, tries again: refused.
    let again = register(
        &mut r,
        client("a", "10.0.0.1", T0 + 30_001),
        Writer::Client,
        T0 + 30_001,
    );
    assert!(
        matches!(again.reply, Reply::Refused(ref m) if m.contains("pod shop/p-1")),
        "{again:?}"
    );
    assert!(again.replicate.is_empty());
}

#[test]
fn a_pod_that_goes_cancels_its_registration_and_refuses_its_endpoint_for_the_drain() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0,
    );
    register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    let out = r.apply(
        Command::Unclaim {
            owner: owner("p-1"),
            pod_gone: true,
        },
        T0 + 100,
    );
    assert_eq!(out.replicate[0].action, ReplicationAction::Cancel);
    assert_eq!(state(&mut r, "a", T0 + 100), None);
    assert!(r.claims_of("shop", "orders").is_empty());
    // A force-deleted pod's client may still try, within the drain.
    let late = register(&mut r, client("a", "10.0.0.1", T0 + 200), Writer::Client, T0 + 200);
    assert!(matches!(late.reply, Reply::Refused(_)), "{late:?}");
    // After it, the endpoint is anybody's again.
    r.purge(T0 + 2_101);
    let later = register(&mut r, client("a", "10.0.0.1", T0 + 2_101), Writer::Client, T0 + 2_101);
    assert_eq!(later.reply, Reply::Registered);
    assert_eq!(state(&mut r, "a", T0 + 2_101).unwrap().1, Origin::Native);
    // A new live claim on the endpoint (a new pod with the address) wins over a gone one.
    r.apply(
        Command::Unclaim {
            owner: owner("p-1"),
            pod_gone: true,
        },
        T0 + 3_000,
    );
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 3_000,
    );
    r.apply(
        Command::Unclaim {
            owner: owner("p-1"),
            pod_gone: true,
        },
        T0 + 3_001,
    );
    r.apply(
        Command::Claim {
            claim: claim("p-2", "10.0.0.1", READY),
        },
        T0 + 3_002,
    );
    let reused = register(&mut r, client("b", "10.0.0.1", T0 + 3_003), Writer::Client, T0 + 3_003);
    assert_eq!(reused.reply, Reply::Registered);
    assert_eq!(state(&mut r, "b", T0 + 3_003).unwrap().1, Origin::Adopted);
}

#[test]
fn a_released_registration_is_native_again_counted_and_expiring() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Down)),
        },
        T0,
    );
    register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    assert_eq!(expected(&mut r), 10);
    let out = r.apply(
        Command::Unclaim {
            owner: owner("p-1"),
            pod_gone: false,
        },
        T0 + 1_000,
    );
    assert_eq!(out.reply, Reply::Ok);
    // Its own status again, and Java hears of it.
    assert_eq!(state(&mut r, "a", T0 + 1_000), Some((Status::Up, Origin::Native)));
    assert_eq!(out.replicate[0].status, Some(Status::Up));
    assert_eq!(expected(&mut r), 11);
    // It expires as any native registration (3 s lease, no renewal since T0).
    let evicted = r.evict(T0 + 10_000, 1);
    assert_eq!(evicted.len(), 1);
}

#[test]
fn a_newer_registration_from_the_same_pod_supersedes_an_older_one() {
    let mut r = registry();
    // A registration under a random id; the container is OOM-killed and restarts with another.
    register(&mut r, client("orders:1f3a", "10.0.0.1", T0), Writer::Client, T0);
    register(
        &mut r,
        client("orders:9c2e", "10.0.0.1", T0 + 5_000),
        Writer::Client,
        T0 + 5_000,
    );
    // The claim adopts the newest and cancels the leftover at once.
    let out = r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 5_100,
    );
    assert!(
        out.replicate
            .iter()
            .any(|x| x.action == ReplicationAction::Cancel && x.id == "orders:1f3a")
    );
    assert_eq!(state(&mut r, "orders:1f3a", T0 + 5_100), None);
    assert_eq!(state(&mut r, "orders:9c2e", T0 + 5_100).unwrap().1, Origin::Adopted);
    // The next restart supersedes it on arrival.
    let out = register(
        &mut r,
        client("orders:77aa", "10.0.0.1", T0 + 9_000),
        Writer::Client,
        T0 + 9_000,
    );
    assert!(
        out.replicate
            .iter()
            .any(|x| x.action == ReplicationAction::Cancel && x.id == "orders:9c2e")
    );
    assert_eq!(r.adopted_of("shop", "orders").len(), 1);
    // A late replicated copy of an older one is refused.
    let stale = register(
        &mut r,
        client("orders:9c2e", "10.0.0.1", T0 + 5_000),
        Writer::REPLICA,
        T0 + 9_500,
    );
    assert!(
        matches!(stale.reply, Reply::Refused(ref m) if m.contains("orders:77aa")),
        "{stale:?}"
    );
    assert_eq!(
        expected(&mut r),
        10,
        "two natives counted, then one adopted and one cancelled"
    );
}

/// What replicates, step by step, from one adopted registration (one state, so one test).
#[test]
fn replicas_learn_the_clients_word_and_java_the_status_shown() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Starting)),
        },
        T0,
    );
    let out = register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    let raw = &out.replicate[0];
    assert_eq!(
        (raw.action, raw.writer, raw.origin),
        (ReplicationAction::Register, Writer::Client, Origin::Adopted)
    );
    assert_eq!(raw.instance.as_ref().unwrap().info.status, Status::Up);
    let shown = &out.replicate[1];
    assert_eq!(
        (shown.action, shown.writer),
        (ReplicationAction::Register, Writer::Controller)
    );
    assert_eq!(shown.instance.as_ref().unwrap().info.status, Status::Starting);
    assert_eq!(r.replica_view(APP, "a").unwrap().info.status, Status::Up);

    // Another replica, with the same claim from its own watch, shows the same.
    let mut other = registry();
    other.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Starting)),
        },
        T0,
    );
    other.apply(
        Command::Register {
            info: (*raw.instance.as_ref().unwrap().info).clone(),
            writer: Writer::REPLICA,
        },
        T0 + 5,
    );
    assert_eq!(state(&mut other, "a", T0).unwrap(), (Status::Starting, Origin::Adopted));
    other.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 10,
    );
    assert_eq!(state(&mut other, "a", T0).unwrap().0, Status::Up);

    // A Java peer handing back the status shown here does not become the client's word.
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::OutOfService)),
        },
        T0 + 20,
    );
    let mut echo = client("a", "10.0.0.1", T0);
    echo.status = Status::OutOfService;
    let out = register(&mut r, echo, Writer::JAVA, T0 + 30);
    assert_eq!(out.replicate.len(), 1, "nothing new for Java: {out:?}");
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 40,
    );
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Up);
}

#[test]
fn a_copy_from_a_peer_is_confirmed_by_the_next_heartbeat() {
    let mut r = registry();
    // A starting replica copies a peer's registry, where the pod was not Ready yet.
    let mut copy = client("a", "10.0.0.1", T0);
    copy.status = Status::Starting;
    assert_eq!(
        r.apply(Command::RegisterCopy { info: copy }, T0).reply,
        Reply::Registered
    );
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 10,
    );
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Starting);
    // Whoever holds the client's own copy is asked for it.
    assert_eq!(renew(&mut r, "a", T0 + 1_000), Reply::NotFound);
    register(&mut r, client("a", "10.0.0.1", T0), Writer::REPLICA, T0 + 1_001);
    assert_eq!(state(&mut r, "a", T0).unwrap().0, Status::Up);
    assert_eq!(renew(&mut r, "a", T0 + 2_000), Reply::Ok);
}

#[test]
fn a_pod_instance_takes_over_its_own_clients_registration_under_the_same_id() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0,
    );
    register(&mut r, client("p-1:orders:8080", "10.0.0.1", T0), Writer::Client, T0);
    // The EurekaApp switches to `registration: Operator` with Spring's ids.
    let mut desired = client("p-1:orders:8080", "10.0.0.1", T0 + 100);
    desired.metadata.insert("k8s.owner", "eureka-operator");
    let out = r.apply(
        Command::UpsertPod {
            info: desired,
            owner: owner("p-1"),
            overrides: PodOverrides::NONE,
        },
        T0 + 100,
    );
    assert_eq!(out.reply, Reply::Ok, "the same instance, no gap, no duplicate");
    let view = r.instance(APP, "p-1:orders:8080", T0 + 100).unwrap();
    assert_eq!(view.origin, Origin::Pod);
    assert_eq!(view.info.metadata.get("k8s.owner"), Some("eureka-operator"));
    assert!(
        view.info.last_dirty_timestamp > T0,
        "newer than the client's, so Java takes it"
    );
    r.apply(
        Command::Unclaim {
            owner: owner("p-1"),
            pod_gone: false,
        },
        T0 + 101,
    );
    let s = r.stats(T0 + 101);
    assert_eq!((s.instances, s.expected_clients), (1, 10));
    assert_eq!(s.by_origin[2], (Origin::Pod, 1));
    assert_eq!(s.by_origin[3], (Origin::Adopted, 0));
    // The client's heartbeats are acknowledged and ignored.
    assert_eq!(renew(&mut r, "p-1:orders:8080", T0 + 200), Reply::Ok);
}

#[test]
fn matching_by_instance_id_and_rival_claims() {
    let mut r = registry();
    let mut by_id = claim("p-1", "10.0.0.1", READY);
    by_id.instance_id = Some("p-1:orders:8080".into());
    r.apply(Command::Claim { claim: by_id }, T0);
    register(&mut r, client("other-id", "10.0.0.1", T0), Writer::Client, T0);
    register(
        &mut r,
        client("p-1:orders:8080", "10.0.0.1", T0 + 1),
        Writer::Client,
        T0 + 1,
    );
    assert_eq!(state(&mut r, "other-id", T0).unwrap().1, Origin::Native);
    assert_eq!(state(&mut r, "p-1:orders:8080", T0).unwrap().1, Origin::Adopted);
    // Another EurekaApp cannot claim the same endpoint while this claim lives.
    let mut rival = claim("p-1", "10.0.0.1", READY);
    rival.owner.eureka_app = "orders-too".into();
    let out = r.apply(Command::Claim { claim: rival }, T0 + 2);
    assert!(
        matches!(out.reply, Reply::Refused(ref m) if m.contains("already adopted by EurekaApp shop/orders")),
        "{out:?}"
    );
}

/// A client's metadata edits on an adopted registration, in turn (one state, so one test).
#[test]
fn a_metadata_edit_keeps_the_clients_status_and_the_caps_apply() {
    let mut r = registry();
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", live(Status::Down)),
        },
        T0,
    );
    register(&mut r, client("a", "10.0.0.1", T0), Writer::Client, T0);
    assert_eq!(state(&mut r, "a", T0), Some((Status::Down, Origin::Adopted)));
    // The API layer prepares the merge off the lock from the stored copy, which shows the pod's
    // DOWN; the client said UP, and UP must show again once the pod is Ready.
    let base = r.stored(APP, "a").unwrap();
    let mut merged = Box::new((*base).clone());
    merged.metadata.insert("zone", "b");
    let out = r.apply(
        Command::MergeMetadata {
            app: APP.into(),
            id: "a".into(),
            entries: [("zone", "b")].into_iter().collect(),
            base,
            merged,
        },
        T0 + 1,
    );
    assert_eq!(out.reply, Reply::Ok);
    let v = r.instance(APP, "a", T0 + 1).unwrap();
    assert_eq!((v.info.status, v.origin), (Status::Down, Origin::Adopted));
    assert_eq!(v.info.metadata.get("zone"), Some("b"));
    r.apply(
        Command::Claim {
            claim: claim("p-1", "10.0.0.1", READY),
        },
        T0 + 2,
    );
    assert_eq!(state(&mut r, "a", T0 + 2), Some((Status::Up, Origin::Adopted)));

    // A pod's own client is held to the same caps as any client.
    let mut r = Registry::new(
        RegistryConfig {
            limits: crate::registry::limits::Limits {
                max_instances_per_application: 1,
                ..Default::default()
            },
            ..Default::default()
        },
        T0,
    );
    r.apply(
        Command::Claim {
            claim: claim("p-2", "10.0.0.2", READY),
        },
        T0,
    );
    assert_eq!(
        register(&mut r, client("x", "10.0.0.9", T0), Writer::Client, T0).reply,
        Reply::Registered
    );
    assert!(matches!(
        register(&mut r, client("b", "10.0.0.2", T0), Writer::Client, T0).reply,
        Reply::OverLimit(_)
    ));
    assert!(r.adopted_of("shop", "orders").is_empty());
}
