//! Scenario tests of the registry with explicit instants, following the Java registry's tests
//! (`InstanceRegistryTest`, `TimeConsumingInstanceRegistryTest`) where they exist. One file on
//! purpose, over the usual size: the scenarios share their fixtures and read in the order of the
//! Java tests they follow; adopt mode's are in `adoption/tests.rs`.

use super::*;
use crate::registry::instance::ActionType;

const T0: i64 = 1_700_000_000_000;

fn inst(app: &str, id: &str) -> InstanceInfo {
    let mut i = InstanceInfo::new(app, &format!("{id}.example"), "10.0.0.1", T0);
    i.instance_id = Some(id.to_string().into());
    i.vip_address = Some(app.to_ascii_lowercase().into());
    i
}

fn registry() -> Registry {
    let mut r = Registry::new(RegistryConfig::default(), T0);
    r.open_for_traffic(0, T0);
    r
}

fn register(r: &mut Registry, i: InstanceInfo, now: i64) -> Outcome {
    r.apply(
        Command::Register {
            info: i,
            writer: Writer::Client,
        },
        now,
    )
}

fn renew(r: &mut Registry, app: &str, id: &str, now: i64) -> Reply {
    r.apply(
        Command::Renew {
            app: app.into(),
            id: id.into(),
            writer: Writer::Client,
            overridden_status: None,
            last_dirty_timestamp: None,
        },
        now,
    )
    .reply
}

fn status_of(r: &mut Registry, app: &str, id: &str) -> Status {
    r.instance(app, id, T0).expect("instance").info.status
}

fn delta_ids(r: &Registry) -> Vec<(String, ActionType)> {
    r.delta_view()
        .apps
        .iter()
        .flat_map(|a| {
            a.instances
                .iter()
                .map(|i| (i.id().to_string(), i.action_type().unwrap()))
        })
        .collect()
}

#[test]
fn register_renew_cancel_round_trip() {
    let mut r = registry();
    let out = register(&mut r, inst("orders", "o-1"), T0);
    assert_eq!(out.reply, Reply::Registered);
    assert_eq!(out.replicate.len(), 1);
    assert_eq!(out.replicate[0].action, ReplicationAction::Register);
    assert_eq!(r.full_view().apps_hashcode, "UP_1_");
    assert_eq!(r.full_view().apps[0].name, "ORDERS");

    assert_eq!(renew(&mut r, "ORDERS", "o-1", T0 + 30_000), Reply::Ok);
    assert_eq!(renew(&mut r, "ORDERS", "nope", T0 + 30_000), Reply::NotFound);
    assert_eq!(renew(&mut r, "BILLING", "o-1", T0 + 30_000), Reply::NotFound);

    let v = r.version();
    assert_eq!(renew(&mut r, "ORDERS", "o-1", T0 + 60_000), Reply::Ok);
    assert_eq!(r.version(), v, "a renewal is not a visible change");

    let out = r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::Client,
        },
        T0 + 61_000,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(out.replicate[0].action, ReplicationAction::Cancel);
    assert_eq!(r.full_view().apps_hashcode, "");
    assert!(r.full_view().apps.is_empty());
    assert_eq!(delta_ids(&r), vec![("o-1".to_string(), ActionType::Deleted)]);
    let out = r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::Client,
        },
        T0 + 62_000,
    );
    assert_eq!(out.reply, Reply::NotFound);
}

#[test]
fn replicated_writes_are_marked_as_such() {
    let mut r = registry();
    let out = r.apply(
        Command::Register {
            info: inst("orders", "o-1"),
            writer: Writer::REPLICA,
        },
        T0,
    );
    assert_eq!(out.reply, Reply::Registered);
    assert_eq!(
        out.replicate[0].writer,
        Writer::REPLICA,
        "the replicator must not send it back"
    );
    let out = r.apply(
        Command::Renew {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::REPLICA,
            overridden_status: None,
            last_dirty_timestamp: None,
        },
        T0 + 1,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(out.replicate[0].writer, Writer::REPLICA);
    assert_eq!(r.instance("ORDERS", "o-1", T0).unwrap().origin, Origin::Replicated);
}

#[test]
fn renew_arbitrates_by_last_dirty_timestamp() {
    let mut r = registry();
    let mut i = inst("orders", "o-1");
    i.last_dirty_timestamp = 1_000;
    register(&mut r, i, T0);
    let hb = |writer, ldt, o| Command::Renew {
        app: "ORDERS".into(),
        id: "o-1".into(),
        writer,
        overridden_status: o,
        last_dirty_timestamp: Some(ldt),
    };
    // The caller is newer: it must re-register (the lease was renewed anyway).
    assert_eq!(r.apply(hb(Writer::Client, 2_000, None), T0 + 1).reply, Reply::NotFound);
    // A peer that is newer also carries its override, which is stored.
    assert_eq!(
        r.apply(hb(Writer::REPLICA, 2_000, Some(Status::OutOfService)), T0 + 2)
            .reply,
        Reply::NotFound
    );
    assert_eq!(
        r.instance("ORDERS", "o-1", T0).unwrap().info.overridden_status,
        Status::OutOfService
    );
    // We are newer: a peer gets 409 with our copy, a client just 200.
    match r.apply(hb(Writer::REPLICA, 500, None), T0 + 3).reply {
        Reply::Conflict(view) => assert_eq!(view.info.last_dirty_timestamp, 1_000),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(r.apply(hb(Writer::Client, 500, None), T0 + 4).reply, Reply::Ok);
    assert_eq!(r.apply(hb(Writer::REPLICA, 1_000, None), T0 + 5).reply, Reply::Ok);
}

#[test]
fn a_stale_registration_keeps_the_stored_copy_but_a_new_lease() {
    let mut r = registry();
    let mut newer = inst("orders", "o-1");
    newer.last_dirty_timestamp = 2_000;
    newer.metadata.insert("v", "2");
    register(&mut r, newer, T0);
    let mut older = inst("orders", "o-1");
    older.last_dirty_timestamp = 1_000;
    older.metadata.insert("v", "1");
    let out = r.apply(
        Command::Register {
            info: older,
            writer: Writer::REPLICA,
        },
        T0 + 5_000,
    );
    assert_eq!(out.reply, Reply::Registered);
    let stored = r.instance("ORDERS", "o-1", T0 + 5_000).unwrap();
    assert_eq!(stored.info.metadata.get("v"), Some("2"));
    assert_eq!(stored.lease.registration_ts, T0 + 5_000);
    // Equal timestamps: the incoming copy wins.
    let mut same = inst("orders", "o-1");
    same.last_dirty_timestamp = 2_000;
    same.metadata.insert("v", "3");
    register(&mut r, same, T0 + 6_000);
    assert_eq!(
        r.instance("ORDERS", "o-1", T0).unwrap().info.metadata.get("v"),
        Some("3")
    );
}

#[test]
fn status_override_sticks_across_re_registration_and_delete_forces_re_register() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    let set = Command::SetStatus {
        app: "ORDERS".into(),
        id: "o-1".into(),
        status: Status::OutOfService,
        last_dirty_timestamp: Some(T0 + 10),
        writer: Writer::Client,
    };
    let out = r.apply(set, T0 + 10);
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(out.replicate[0].action, ReplicationAction::StatusUpdate);
    assert_eq!(out.replicate[0].status, Some(Status::OutOfService));
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::OutOfService);
    assert_eq!(r.full_view().apps_hashcode, "OUT_OF_SERVICE_1_");
    assert_eq!(delta_ids(&r), vec![("o-1".to_string(), ActionType::Modified)]);

    // Clients bump their dirty timestamp whenever they register with changed data.
    let at = |status: Status, t: i64| {
        let mut i = inst("orders", "o-1");
        i.status = status;
        i.last_dirty_timestamp = t;
        i
    };
    // The client re-registers UP: the override wins, and renewals keep it.
    register(&mut r, at(Status::Up, T0 + 20), T0 + 20);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::OutOfService);
    assert_eq!(renew(&mut r, "ORDERS", "o-1", T0 + 30), Reply::Ok);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::OutOfService);
    // A client starting up (STARTING/DOWN) beats the override.
    register(&mut r, at(Status::Starting, T0 + 40), T0 + 40);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::Starting);
    // A stale registration (older dirty timestamp) does not change the stored copy.
    register(&mut r, at(Status::Up, T0 + 30), T0 + 45);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::Starting);
    register(&mut r, at(Status::Up, T0 + 50), T0 + 50);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::OutOfService);

    // Deleting the override without a value leaves UNKNOWN; the next heartbeat gets 404.
    let del = Command::DeleteStatusOverride {
        app: "ORDERS".into(),
        id: "o-1".into(),
        status: Status::Unknown,
        last_dirty_timestamp: None,
        writer: Writer::Client,
    };
    let out = r.apply(del, T0 + 60);
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(out.replicate[0].action, ReplicationAction::DeleteStatusOverride);
    assert_eq!(out.replicate[0].status, Some(Status::Unknown));
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::Unknown);
    assert_eq!(renew(&mut r, "ORDERS", "o-1", T0 + 70), Reply::NotFound);
    // The client re-registers UP; with no override and an existing UNKNOWN lease it is UP.
    register(&mut r, at(Status::Up, T0 + 80), T0 + 80);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::Up);
}

#[test]
fn setting_the_current_status_records_no_override() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    let v = r.version();
    let out = r.apply(
        Command::SetStatus {
            app: "ORDERS".into(),
            id: "o-1".into(),
            status: Status::Up,
            last_dirty_timestamp: None,
            writer: Writer::Client,
        },
        T0 + 1,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(out.replicate.len(), 1, "Java still replicates it");
    assert_eq!(r.version(), v);
    assert_eq!(
        r.instance("ORDERS", "o-1", T0).unwrap().info.overridden_status,
        Status::Unknown
    );
    let missing = Command::SetStatus {
        app: "ORDERS".into(),
        id: "zzz".into(),
        status: Status::Down,
        last_dirty_timestamp: None,
        writer: Writer::Client,
    };
    assert_eq!(r.apply(missing, T0).reply, Reply::NotFound);
}

#[test]
fn delete_override_with_a_value_sets_it_at_once() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    r.apply(
        Command::SetStatus {
            app: "ORDERS".into(),
            id: "o-1".into(),
            status: Status::OutOfService,
            last_dirty_timestamp: None,
            writer: Writer::Client,
        },
        T0,
    );
    r.apply(
        Command::DeleteStatusOverride {
            app: "ORDERS".into(),
            id: "o-1".into(),
            status: Status::Up,
            last_dirty_timestamp: None,
            writer: Writer::Client,
        },
        T0 + 1,
    );
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::Up);
    assert_eq!(renew(&mut r, "ORDERS", "o-1", T0 + 2), Reply::Ok);
}

#[test]
fn a_registration_carrying_an_override_creates_it() {
    let mut r = registry();
    let mut i = inst("orders", "o-1");
    i.overridden_status = Status::OutOfService;
    r.apply(
        Command::Register {
            info: i,
            writer: Writer::REPLICA,
        },
        T0,
    );
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::OutOfService);
    // Cancel always forgets the override.
    r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::Client,
        },
        T0 + 1,
    );
    register(&mut r, inst("orders", "o-1"), T0 + 2);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::Up);
}

#[test]
fn metadata_update_re_registers() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    let out = r.apply(
        Command::UpdateMetadata {
            app: "ORDERS".into(),
            id: "o-1".into(),
            entries: [("zone", "a"), ("team", "x")].into_iter().collect(),
        },
        T0 + 500,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(out.replicate[0].action, ReplicationAction::Register);
    let v = r.instance("ORDERS", "o-1", T0).unwrap();
    assert_eq!(v.info.metadata.get("zone"), Some("a"));
    assert_eq!(v.lease.registration_ts, T0 + 500, "a new lease, as in Java");
    assert_eq!(v.action_type(), Some(ActionType::Added));
    let missing = Command::UpdateMetadata {
        app: "ORDERS".into(),
        id: "x".into(),
        entries: Metadata::new(),
    };
    assert_eq!(r.apply(missing, T0).reply, Reply::NotFound);
}

#[test]
fn delta_shows_current_state_and_is_pruned_after_retention() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    register(&mut r, inst("orders", "o-2"), T0 + 1_000);
    register(&mut r, inst("billing", "b-1"), T0 + 2_000);
    r.apply(
        Command::SetStatus {
            app: "ORDERS".into(),
            id: "o-1".into(),
            status: Status::Down,
            last_dirty_timestamp: None,
            writer: Writer::Client,
        },
        T0 + 3_000,
    );
    let delta = r.delta_view();
    assert_eq!(delta.apps_hashcode, "DOWN_1_UP_2_", "the hash of the full registry");
    assert_eq!(delta.apps.len(), 2);
    // o-1 was registered then modified: one entry, current state.
    let orders = &delta.apps.iter().find(|a| a.name == "ORDERS").unwrap().instances;
    assert_eq!(orders.len(), 2);
    assert_eq!(orders[0].action_type(), Some(ActionType::Modified));
    assert_eq!(orders[0].status(), Status::Down);

    // 180 s retention: entries older than now - 180 s go, younger stay.
    let v = r.version();
    r.purge(T0 + 181_500);
    assert!(r.version() > v, "pruning changes what a delta reader sees");
    let left: Vec<String> = delta_ids(&r).into_iter().map(|(id, _)| id).collect();
    assert_eq!(left, vec!["b-1".to_string(), "o-1".to_string()]);
    r.purge(T0 + 184_000);
    assert!(delta_ids(&r).is_empty());
    assert_eq!(r.full_view().apps.iter().map(|a| a.instances.len()).sum::<usize>(), 3);
}

#[test]
fn delta_lists_an_applications_removed_instances_after_the_others() {
    // Netflix's client adopts the delta's application object at its first ADDED or MODIFIED entry
    // when it does not know the application yet; a DELETED entry before that would stick.
    let mut r = registry();
    register(&mut r, inst("orders", "a-gone"), T0);
    register(&mut r, inst("orders", "b-here"), T0 + 1_000);
    register(&mut r, inst("orders", "c-here"), T0 + 2_000);
    let out = r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "a-gone".into(),
            writer: Writer::Client,
        },
        T0 + 3_000,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert_eq!(
        delta_ids(&r),
        vec![
            ("b-here".to_string(), ActionType::Added),
            ("c-here".to_string(), ActionType::Added),
            ("a-gone".to_string(), ActionType::Deleted),
        ]
    );
}

#[test]
fn delta_version_moves_with_each_visible_change() {
    let mut r = registry();
    let v0 = r.delta_view().versions_delta;
    register(&mut r, inst("orders", "o-1"), T0);
    let v1 = r.delta_view().versions_delta;
    assert!(v1 > v0);
    assert_eq!(r.full_view().versions_delta, 1);
}

#[test]
fn vip_lookup_is_exact_and_split_on_commas() {
    let mut r = registry();
    let mut a = inst("orders", "o-1");
    a.vip_address = Some("orders,shop".into());
    a.secure_vip_address = Some("orders-secure".into());
    register(&mut r, a, T0);
    let mut b = inst("billing", "b-1");
    b.vip_address = Some("Shop".into());
    register(&mut r, b, T0);
    let shop = r.vip_view("shop", false);
    assert_eq!(shop.apps.len(), 1);
    assert_eq!(shop.apps[0].name, "ORDERS");
    assert_eq!(shop.versions_delta, -1);
    assert_eq!(shop.apps_hashcode, "UP_1_");
    assert!(r.vip_view("nothing", false).apps.is_empty());
    assert_eq!(r.vip_view("orders-secure", true).apps.len(), 1);
    assert!(r.vip_view("orders-secure", false).apps.is_empty());
}

#[test]
fn threshold_follows_registrations_and_cancels() {
    let mut r = registry(); // opened with 0 → Spring's default count 1
    assert_eq!(r.stats(T0).renews_threshold, 1);
    for n in 0..10 {
        register(&mut r, inst("orders", &format!("o-{n}")), T0);
    }
    let s = r.stats(T0);
    assert_eq!(s.expected_clients, 11);
    assert_eq!(s.renews_threshold, 18); // (int)(11 × 2 × 0.85) = 18.7
    // Re-registering an existing lease does not count again.
    register(&mut r, inst("orders", "o-1"), T0 + 1);
    assert_eq!(r.stats(T0).expected_clients, 11);
    r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::Client,
        },
        T0 + 2,
    );
    assert_eq!(r.stats(T0).expected_clients, 10);
}

fn renewing_registry(n: usize, lease_secs: i32, config: RegistryConfig) -> Registry {
    let mut r = Registry::new(config, T0);
    r.open_for_traffic(0, T0);
    for i in 0..n {
        let mut info = inst("orders", &format!("o-{i:02}"));
        info.lease = instance::LeaseTerms {
            renewal_interval_secs: 10,
            duration_secs: lease_secs,
        };
        register(&mut r, info, T0);
    }
    r
}

#[test]
fn self_preservation_holds_eviction_until_renews_exceed_the_threshold() {
    // 10 clients expected → threshold 18 renews/min.
    let mut r = renewing_registry(10, 90, RegistryConfig::default());
    // Nobody renews: every lease expires after 90 s, but the first minute has no renew count and
    // the threshold is not exceeded, so nothing is evicted.
    assert!(r.evict(T0 + 60_000, 1).is_empty());
    assert!(r.stats(T0 + 60_000).self_preservation_active);
    // 19 renews in a minute by two clients keep them alive and lift the protection.
    for t in 0..19 {
        let id = if t % 2 == 0 { "o-00" } else { "o-01" };
        assert_eq!(renew(&mut r, "ORDERS", id, T0 + 60_000 + t), Reply::Ok);
    }
    assert!(!r.stats(T0 + 120_000).self_preservation_active);
    let victims = r.evict(T0 + 120_000, 7);
    // A registry of 10 → at most 10 - (int)(10 × 0.85) = 2 per run.
    assert_eq!(victims.len(), 2);
    assert!(
        victims.iter().all(|v| v.id != "o-00" && v.id != "o-01"),
        "renewed leases are not expired"
    );
    assert!(
        victims
            .iter()
            .all(|v| v.action == ReplicationAction::Cancel && v.writer == Writer::Expiry)
    );
    assert_eq!(r.full_view().apps[0].instances.len(), 8);
    // The expectation dropped with each eviction: 11 - 2 = 9 → threshold (int)(9×2×0.85) = 15.
    assert_eq!(r.stats(T0 + 120_000).renews_threshold, 15);
    // Evictions show in the delta as DELETED and are not replicated (there is nothing to return).
    let deleted: Vec<_> = delta_ids(&r)
        .into_iter()
        .filter(|(_, a)| *a == ActionType::Deleted)
        .collect();
    assert_eq!(deleted.len(), 2);
}

#[test]
fn eviction_without_self_preservation_is_capped_per_run() {
    let config = RegistryConfig {
        preservation: PreservationConfig {
            enable_self_preservation: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = renewing_registry(100, 30, config);
    let mut left = 100;
    let mut now = T0 + 31_000;
    let mut runs = 0;
    while left > 0 {
        let victims = r.evict(now, runs);
        let limit = left - (left as f64 * 0.85) as usize;
        assert_eq!(victims.len(), limit.min(left));
        left -= victims.len();
        now += 60_000;
        runs += 1;
        assert!(runs < 100);
    }
    assert_eq!(runs, 20, "15% per run, at least one");
}

#[test]
fn eviction_compensates_for_a_late_run() {
    let config = RegistryConfig {
        preservation: PreservationConfig {
            enable_self_preservation: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = renewing_registry(1, 60, config);
    assert!(r.evict(T0, 0).is_empty());
    // The timer should have run at T0+60 s but ran at T0+100 s (a 40 s pause): the lease, expired
    // since T0+60 s, gets 40 s of grace and survives this run.
    assert!(r.evict(T0 + 100_000, 0).is_empty());
    // The next, punctual run evicts it.
    assert_eq!(r.evict(T0 + 160_000, 0).len(), 1);
}

/// The expired-lease figure the metrics and the dashboard show comes from the store's expiry
/// order, not a scan: it must say what each lease's own expiry says, at any instant, in both
/// expiry modes, and leave pod instances out.
#[test]
fn the_expired_count_follows_each_lease_in_both_modes() {
    for mode in [ExpiryMode::Exact, ExpiryMode::Java] {
        let config = RegistryConfig {
            lease_expiry: mode,
            ..Default::default()
        };
        let mut r = renewing_registry(3, 30, config);
        let owner = PodOwner {
            namespace: "shop".into(),
            eureka_app: "orders".into(),
            pod: "p".into(),
        };
        let mut pod = inst("ORDERS", "pod-1");
        pod.ip_addr = "10.0.9.9".into();
        r.apply(
            Command::UpsertPod {
                info: pod,
                owner,
                overrides: PodOverrides::NONE,
            },
            T0,
        );
        renew(&mut r, "ORDERS", "o-01", T0 + 20_000);
        let scan = |r: &mut Registry, now: i64| {
            let ids: Vec<String> = r.full_view().apps[0]
                .instances
                .iter()
                .map(|i| i.id().to_string())
                .collect();
            ids.iter()
                .filter(|id| {
                    let e = r.store.get("ORDERS", id).unwrap();
                    e.holding.expires() && e.lease.is_expired(now, 0, mode)
                })
                .count() as u64
        };
        for now in (T0..T0 + 130_000)
            .step_by(5_000)
            .chain([T0 + 30_000, T0 + 30_001, T0 + 50_001])
        {
            assert_eq!(r.stats(now).expired, scan(&mut r, now), "{mode:?} at +{} ms", now - T0);
        }
        assert_eq!(
            r.stats(T0 + 30_001).expired,
            2,
            "{mode:?}: two unrenewed leases expired"
        );
        assert_eq!(r.stats(T0 + 200_000).expired, 3, "{mode:?}: every client lease, no pod");
        // The count is kept as leases come and go after it was taken: a renewal takes one out,
        // a cancel another, and later expiries are added when next asked.
        renew(&mut r, "ORDERS", "o-01", T0 + 200_000);
        assert_eq!(r.stats(T0 + 200_000).expired, 2, "{mode:?}: renewed");
        r.apply(
            Command::Cancel {
                app: "ORDERS".into(),
                id: "o-02".into(),
                writer: Writer::Client,
            },
            T0 + 200_000,
        );
        assert_eq!(r.stats(T0 + 200_000).expired, 1, "{mode:?}: cancelled");
        assert_eq!(
            r.stats(T0 + 400_000).expired,
            2,
            "{mode:?}: the renewed one expired again"
        );
        assert_eq!(r.stats(T0 + 400_000).expired, scan(&mut r, T0 + 400_000));
    }
}

/// Leases are filed lazily (a heartbeat leaves its lease where it is filed; readers refile what
/// they reach): at any instant, with heartbeats, counts, eviction runs and a clock that sometimes
/// steps back in between, the expired count and the leases eviction finds must be exactly those
/// whose own lease says they are expired, as if every heartbeat had moved its lease.
#[test]
fn lazily_filed_leases_count_and_evict_as_if_moved_at_every_heartbeat() {
    for mode in [ExpiryMode::Exact, ExpiryMode::Java] {
        let mut config = RegistryConfig {
            lease_expiry: mode,
            ..Default::default()
        };
        config.preservation.enable_self_preservation = false;
        let mut r = renewing_registry(24, 30, config);
        let expired_by_scan = |r: &Registry, now: i64| {
            let mut ids: Vec<String> = r
                .store
                .entries()
                .filter(|e| e.holding.expires() && e.lease.is_expired(now, 0, mode))
                .map(|e| e.info.id().to_string())
                .collect();
            ids.sort();
            ids
        };
        let (mut now, mut seed) = (T0, 0x9e37_79b9_7f4a_7c15u64);
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut steps_back = 0;
        for step in 0..6_000 {
            let roll = next();
            now += match roll % 100 {
                0..=2 => {
                    steps_back += 1;
                    -(((roll >> 8) % 5_000) as i64)
                }
                _ => ((roll >> 8) % 600) as i64,
            };
            let id = format!("o-{:02}", (roll >> 24) % 24);
            match (roll >> 40) % 10 {
                0..=3 => {
                    if renew(&mut r, "ORDERS", &id, now) == Reply::NotFound {
                        let mut info = inst("orders", &id);
                        info.lease.duration_secs = 30;
                        register(&mut r, info, now);
                    }
                }
                4..=6 => {
                    let scanned = expired_by_scan(&r, now);
                    assert_eq!(r.stats(now).expired, scanned.len() as u64, "{mode:?}, step {step}");
                }
                7..=8 => {
                    let mut found: Vec<String> = r.store.expired(now, 0).map(|(_, id)| id.to_string()).collect();
                    found.sort();
                    assert_eq!(found, expired_by_scan(&r, now), "{mode:?}, step {step}");
                }
                _ => {
                    let expired = expired_by_scan(&r, now);
                    for record in r.evict(now, roll) {
                        assert!(
                            expired.contains(&record.id),
                            "{mode:?}, step {step}: {} evicted alive",
                            record.id
                        );
                    }
                }
            }
        }
        assert!(steps_back > 50, "the clock stepped back {steps_back} times");
    }
}

#[test]
fn java_expiry_mode_keeps_renewed_leases_twice_as_long() {
    let config = RegistryConfig {
        preservation: PreservationConfig {
            enable_self_preservation: false,
            ..Default::default()
        },
        lease_expiry: ExpiryMode::Java,
        ..Default::default()
    };
    let mut r = renewing_registry(1, 30, config.clone());
    renew(&mut r, "ORDERS", "o-00", T0 + 10_000);
    assert_eq!(
        r.instance("ORDERS", "o-00", T0 + 10_000).unwrap().lease.last_renewal_ts,
        T0 + 40_000
    );
    assert!(r.evict(T0 + 60_000, 0).is_empty(), "Java: expires at renew + 2 × 30 s");
    assert_eq!(r.evict(T0 + 70_001, 0).len(), 1);

    let exact = RegistryConfig {
        lease_expiry: ExpiryMode::Exact,
        ..config
    };
    let mut r = renewing_registry(1, 30, exact);
    renew(&mut r, "ORDERS", "o-00", T0 + 10_000);
    assert_eq!(
        r.instance("ORDERS", "o-00", T0 + 10_000).unwrap().lease.last_renewal_ts,
        T0 + 10_000
    );
    assert_eq!(r.evict(T0 + 40_001, 0).len(), 1);
}

#[test]
fn expired_instances_are_hidden_from_lookups_only_while_expiration_is_enabled() {
    let config = RegistryConfig {
        preservation: PreservationConfig {
            enable_self_preservation: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = renewing_registry(1, 30, config);
    assert!(r.instance("ORDERS", "o-00", T0 + 31_000).is_none());
    assert!(r.find_instance("o-00", T0 + 31_000).is_none());
    // The full fetch still lists it until it is evicted, as Java.
    assert_eq!(r.full_view().apps.len(), 1);

    let mut r = renewing_registry(1, 30, RegistryConfig::default());
    assert!(
        r.instance("ORDERS", "o-00", T0 + 31_000).is_some(),
        "self-preservation keeps it"
    );
}

#[test]
fn threshold_update_adopts_the_local_count_with_damping() {
    let mut r = registry();
    for n in 0..20 {
        register(&mut r, inst("orders", &format!("o-{n}")), T0);
    }
    assert_eq!(r.stats(T0).expected_clients, 21);
    assert!(r.update_renewal_threshold(), "20 > 0.85 × 21");
    assert_eq!(r.stats(T0).expected_clients, 20);
}

fn pod(app: &str, id: &str, status: Status) -> InstanceInfo {
    let mut i = inst(app, id);
    i.status = status;
    i
}

fn owner(pod: &str) -> PodOwner {
    PodOwner {
        namespace: "shop".into(),
        eureka_app: "orders".into(),
        pod: pod.into(),
    }
}

/// One pod instance through the writes others may try on it, in turn (one state, so one test).
#[test]
fn pod_instances_are_owned_by_the_controller() {
    let mut r = registry();
    let upsert = |i, o| Command::UpsertPod {
        info: i,
        owner: owner(o),
        overrides: PodOverrides::NONE,
    };
    let out = r.apply(upsert(pod("orders", "p-1", Status::Up), "p-1"), T0);
    assert_eq!(out.reply, Reply::Registered);
    assert_eq!(out.replicate[0].origin, Origin::Pod);
    // The same desired state again changes nothing.
    let v = r.version();
    assert_eq!(
        r.apply(upsert(pod("orders", "p-1", Status::Up), "p-1"), T0 + 1).reply,
        Reply::Unchanged
    );
    assert_eq!(r.version(), v);
    // Readiness lost: STARTING, a MODIFIED delta, a newer dirty timestamp.
    assert_eq!(
        r.apply(upsert(pod("orders", "p-1", Status::Starting), "p-1"), T0 + 2)
            .reply,
        Reply::Ok
    );
    let view = r.instance("ORDERS", "p-1", T0 + 2).unwrap();
    assert_eq!(view.info.status, Status::Starting);
    assert!(view.info.last_dirty_timestamp > T0);

    // Clients cannot take over, cancel or edit it.
    let out = register(&mut r, inst("orders", "p-1"), T0 + 3);
    assert!(
        matches!(out.reply, Reply::Refused(ref m) if m.contains("EurekaApp shop/orders")),
        "{out:?}"
    );
    let out = r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "p-1".into(),
            writer: Writer::Client,
        },
        T0 + 3,
    );
    assert!(matches!(out.reply, Reply::Refused(_)));
    // Another EurekaApp's pod cannot take the id either.
    let other = PodOwner {
        namespace: "shop".into(),
        eureka_app: "other".into(),
        pod: "q".into(),
    };
    let out = r.apply(
        Command::UpsertPod {
            info: pod("orders", "p-1", Status::Up),
            owner: other,
            overrides: PodOverrides::NONE,
        },
        T0 + 4,
    );
    assert!(matches!(out.reply, Reply::Refused(ref m) if m.contains("already held by EurekaApp shop/orders")));
    // Nor can a pod take the id of a native client elsewhere (another address: another process).
    let mut elsewhere = inst("orders", "native-1");
    elsewhere.ip_addr = "10.9.9.9".into();
    register(&mut r, elsewhere, T0);
    let out = r.apply(upsert(pod("orders", "native-1", Status::Up), "x"), T0 + 5);
    assert!(matches!(out.reply, Reply::Refused(ref m) if m.contains("natively registered")));
}

#[test]
fn pod_instances_never_expire_and_do_not_count_toward_self_preservation() {
    let config = RegistryConfig {
        preservation: PreservationConfig {
            enable_self_preservation: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = Registry::new(config, T0);
    r.open_for_traffic(0, T0);
    for n in 0..50 {
        let info = pod("orders", &format!("p-{n}"), Status::Up);
        r.apply(
            Command::UpsertPod {
                info,
                owner: owner(&format!("p-{n}")),
                overrides: PodOverrides::NONE,
            },
            T0,
        );
    }
    assert_eq!(r.stats(T0).expected_clients, 1, "pods are not expected to renew");
    assert!(r.evict(T0 + 3_600_000, 3).is_empty());
    // Scaling down to zero is 50 deliberate removals; the expectation does not move.
    for n in 0..50 {
        let out = r.apply(
            Command::RemovePod {
                app: "ORDERS".into(),
                id: format!("p-{n}"),
                owner: owner(&format!("p-{n}")),
            },
            T0 + 3_600_000,
        );
        assert_eq!(out.reply, Reply::Ok);
        assert_eq!(out.replicate[0].action, ReplicationAction::Cancel);
    }
    assert_eq!(r.stats(T0).expected_clients, 1);
    assert_eq!(r.stats(T0).instances, 0);
}

fn spec_override(status: Status) -> PodOverrides {
    PodOverrides {
        annotation: None,
        spec: status,
    }
}

/// One pod's override layers changed in turn; each step starts from the state the one before
/// left, so this stays one test.
#[test]
fn pod_overrides_combine_owner_and_rest_layers() {
    let mut r = registry();
    let up = |o| Command::UpsertPod {
        info: pod("orders", "p-1", Status::Up),
        owner: owner("p-1"),
        overrides: spec_override(o),
    };
    let set = |status| Command::SetStatus {
        app: "ORDERS".into(),
        id: "p-1".into(),
        status,
        last_dirty_timestamp: None,
        writer: Writer::Client,
    };
    let delete = || Command::DeleteStatusOverride {
        app: "ORDERS".into(),
        id: "p-1".into(),
        status: Status::Unknown,
        last_dirty_timestamp: None,
        writer: Writer::Client,
    };
    r.apply(up(Status::OutOfService), T0);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::OutOfService);
    // A REST override on top: applied at once, and the controller is asked to persist it.
    let out = r.apply(set(Status::Up), T0 + 1);
    assert_eq!(
        out.pod_override,
        Some(PodOverride {
            owner: owner("p-1"),
            status: Some(Status::Up)
        })
    );
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Up);
    // A reconcile that still carries the EurekaApp's override does not undo the REST one.
    r.apply(up(Status::OutOfService), T0 + 2);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Up);
    // Deleting the REST override falls back to the EurekaApp's.
    let out = r.apply(delete(), T0 + 3);
    assert_eq!(
        out.pod_override,
        Some(PodOverride {
            owner: owner("p-1"),
            status: None
        })
    );
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::OutOfService);
    // The EurekaApp drops its override: UP again, and Java peers are told to delete theirs.
    let out = r.apply(up(Status::Unknown), T0 + 4);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Up);
    let actions: Vec<ReplicationAction> = out.replicate.iter().map(|r| r.action).collect();
    assert_eq!(
        actions,
        vec![ReplicationAction::Register, ReplicationAction::DeleteStatusOverride]
    );
    // A REST override persisted on the pod's annotation: from then on the annotation rules, so
    // removing it with kubectl takes effect.
    let annotated = |a| Command::UpsertPod {
        info: pod("orders", "p-1", Status::Up),
        owner: owner("p-1"),
        overrides: PodOverrides {
            annotation: a,
            spec: Status::Unknown,
        },
    };
    r.apply(set(Status::OutOfService), T0 + 10);
    // A reconcile before the annotation is written keeps the REST override.
    r.apply(annotated(None), T0 + 11);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::OutOfService);
    r.apply(annotated(Some(Status::OutOfService)), T0 + 12);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::OutOfService);
    r.apply(annotated(None), T0 + 13);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Up);
    // A REST delete wins over a stale annotation until the annotation is gone.
    r.apply(annotated(Some(Status::Down)), T0 + 14);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Down);
    r.apply(delete(), T0 + 15);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Up);
    r.apply(annotated(Some(Status::Down)), T0 + 16);
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Up);
    r.apply(annotated(None), T0 + 17);
    r.apply(annotated(Some(Status::Down)), T0 + 18);
    assert_eq!(
        status_of(&mut r, "ORDERS", "p-1"),
        Status::Down,
        "a later kubectl edit applies"
    );

    // A not-ready pod is STARTING whatever the override says.
    r.apply(
        Command::UpsertPod {
            info: pod("orders", "p-1", Status::Starting),
            owner: owner("p-1"),
            overrides: spec_override(Status::OutOfService),
        },
        T0 + 5,
    );
    assert_eq!(status_of(&mut r, "ORDERS", "p-1"), Status::Starting);
}

#[test]
fn renew_corrects_a_status_and_logs_it_for_deltas() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    // A peer stores an override through a newer heartbeat; the next renew applies it.
    r.apply(
        Command::Renew {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::REPLICA,
            overridden_status: Some(Status::OutOfService),
            last_dirty_timestamp: Some(T0 + 100),
        },
        T0 + 1,
    );
    let v = r.version();
    assert_eq!(renew(&mut r, "ORDERS", "o-1", T0 + 2), Reply::Ok);
    assert_eq!(status_of(&mut r, "ORDERS", "o-1"), Status::OutOfService);
    assert!(r.version() > v);
    assert_eq!(r.delta_view().apps_hashcode, "OUT_OF_SERVICE_1_");
}

#[test]
fn recent_lists_are_bounded_and_newest_first() {
    let mut r = Registry::new(
        RegistryConfig {
            recent_queue_len: 3,
            ..Default::default()
        },
        T0,
    );
    for n in 0..5 {
        register(&mut r, inst("orders", &format!("o-{n}")), T0 + n);
    }
    let (registered, cancelled) = r.recent();
    assert_eq!(registered.len(), 3);
    assert_eq!(registered[0], (T0 + 4, "ORDERS(o-4)".to_string()));
    assert!(cancelled.is_empty());
}

#[test]
fn id_falls_back_to_amazon_instance_id_then_host_name() {
    let mut i = InstanceInfo::new("a", "host-1", "10.0.0.1", 0);
    assert_eq!(i.id(), "host-1");
    i.data_center_info = instance::DataCenterInfo {
        name: instance::DataCenterName::Amazon,
        metadata: [("instance-id", "i-123")].into_iter().collect(),
    };
    assert_eq!(i.id(), "i-123");
    i.instance_id = Some("explicit".into());
    assert_eq!(i.id(), "explicit");
}

#[test]
fn a_dirty_timestamp_at_the_end_of_time_does_not_overflow() {
    let mut r = registry();
    let upsert = |status| Command::UpsertPod {
        info: pod("orders", "p-1", status),
        owner: owner("p-1"),
        overrides: PodOverrides::NONE,
    };
    r.apply(upsert(Status::Up), T0);
    let set = |status| Command::SetStatus {
        app: "ORDERS".into(),
        id: "p-1".into(),
        status,
        last_dirty_timestamp: Some(i64::MAX),
        writer: Writer::Client,
    };
    r.apply(set(Status::OutOfService), T0 + 1);
    r.apply(set(Status::Up), T0 + 2);
    assert_eq!(r.apply(upsert(Status::Starting), T0 + 3).reply, Reply::Ok);
    let view = r.instance("ORDERS", "p-1", T0 + 3).unwrap();
    assert_eq!(view.info.last_dirty_timestamp, i64::MAX);
}

#[test]
fn an_application_whose_last_instance_goes_is_forgotten() {
    let mut r = registry();
    register(&mut r, inst("orders", "o-1"), T0);
    assert_eq!(r.app_versions().len(), 1);
    let out = r.apply(
        Command::Cancel {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer: Writer::Client,
        },
        T0 + 1,
    );
    assert_eq!(out.reply, Reply::Ok);
    assert!(r.app_versions().is_empty());
    assert!(r.app_view("ORDERS").is_none());
    // Its cancellation is still in the delta.
    assert_eq!(r.delta_view().apps.len(), 1);
    register(&mut r, inst("orders", "o-2"), T0 + 2);
    assert_eq!(r.app_view("ORDERS").unwrap().instances.len(), 1);
}

#[test]
fn a_replicated_eviction_spares_a_lease_that_renewed_here() {
    let mut r = registry();
    register(&mut r, inst("ORDERS", "live"), T0);
    register(&mut r, inst("ORDERS", "dead"), T0);
    // `live` keeps renewing on this replica; the leader never saw those renewals.
    renew(&mut r, "ORDERS", "live", T0 + 80_000);
    let evict = |id: &str| Command::Evict {
        app: "ORDERS".into(),
        id: id.into(),
    };
    let now = T0 + 100_000;
    let out = r.apply(evict("live"), now);
    assert!(matches!(out.reply, Reply::Refused(_)), "{:?}", out.reply);
    assert!(r.contains("ORDERS", "live"));
    let out = r.apply(evict("dead"), now);
    assert_eq!(out.reply, Reply::Ok);
    assert!(!r.contains("ORDERS", "dead"));
    assert_eq!(
        out.replicate[0].writer,
        Writer::REPLICA,
        "a replicated eviction goes no further"
    );
    assert_eq!(r.apply(evict("dead"), now).reply, Reply::NotFound);
}

#[test]
fn a_cancel_held_behind_a_partition_spares_a_newer_registration() {
    // Replica A: the client cancels; the replicated Cancel names the copy it removed.
    let mut a = registry();
    let mut first = inst("orders", "o-1");
    first.last_dirty_timestamp = T0 + 1;
    register(&mut a, first.clone(), T0 + 1);
    let cancel = |writer| Command::Cancel {
        app: "ORDERS".into(),
        id: "o-1".into(),
        writer,
    };
    let out = a.apply(cancel(Writer::Client), T0 + 2_000);
    assert_eq!(out.replicate[0].last_dirty_timestamp, Some(T0 + 1));
    // Replica B: the Cancel arrives after the client registered again there.
    let mut b = registry();
    let mut again = inst("orders", "o-1");
    again.last_dirty_timestamp = T0 + 5_000;
    register(&mut b, again, T0 + 5_000);
    let copy = |dirty| Command::CancelCopy {
        app: "ORDERS".into(),
        id: "o-1".into(),
        writer: Writer::REPLICA,
        last_dirty_timestamp: dirty,
    };
    assert!(matches!(b.apply(copy(T0 + 1), T0 + 9_000).reply, Reply::Refused(_)));
    assert!(
        b.instance("ORDERS", "o-1", T0 + 9_000).is_some(),
        "the newer registration stays"
    );
    // A Cancel of that very registration (or one without a timestamp, as Java sends) removes it.
    assert_eq!(b.apply(copy(T0 + 5_000), T0 + 9_000).reply, Reply::Ok);
    register(&mut b, first, T0 + 10_000);
    assert_eq!(b.apply(cancel(Writer::REPLICA), T0 + 11_000).reply, Reply::Ok);
    assert!(b.instance("ORDERS", "o-1", T0 + 11_000).is_none());
}

#[test]
fn replication_cannot_undo_a_cancel() {
    let mut copy = inst("orders", "o-1");
    copy.last_dirty_timestamp = T0 + 1;
    // A registry that held `copy` and saw it cancelled by `writer` at T0 + 1000.
    let cancelled_by = |writer: Writer| {
        let mut r = registry();
        register(&mut r, copy.clone(), T0 + 1);
        let cancel = Command::Cancel {
            app: "ORDERS".into(),
            id: "o-1".into(),
            writer,
        };
        assert_eq!(r.apply(cancel, T0 + 1_000).reply, Reply::Ok);
        r
    };
    let from = |writer: Writer, info: InstanceInfo| Command::Register { info, writer };
    let mut r = cancelled_by(Writer::Client);
    // A renewal queued behind a cut link arrives after the cancel: 404, then its sender's
    // Register of the copy that was cancelled; or a peer's stale registry brings it back.
    assert_eq!(
        r.apply(
            Command::Renew {
                app: "ORDERS".into(),
                id: "o-1".into(),
                writer: Writer::REPLICA,
                overridden_status: None,
                last_dirty_timestamp: Some(T0 + 1),
            },
            T0 + 5_000
        )
        .reply,
        Reply::NotFound
    );
    for command in [
        from(Writer::REPLICA, copy.clone()),
        Command::RegisterCopy { info: copy.clone() },
    ] {
        assert!(matches!(r.apply(command, T0 + 5_000).reply, Reply::Refused(_)));
        assert!(!r.contains("ORDERS", "o-1"), "the cancel stands");
    }
    // The client registering again (a newer copy, or its own word) is taken.
    let mut again = copy.clone();
    again.last_dirty_timestamp = T0 + 6_000;
    assert_eq!(
        r.apply(from(Writer::REPLICA, again), T0 + 6_000).reply,
        Reply::Registered
    );
    let mut r = cancelled_by(Writer::REPLICA);
    assert_eq!(register(&mut r, copy.clone(), T0 + 2_000).reply, Reply::Registered);
    // Remembered for `cancel_memory_ms` only.
    let mut r = cancelled_by(Writer::Client);
    let later = T0 + 1_000 + r.config().cancel_memory_ms;
    assert_eq!(
        r.apply(from(Writer::REPLICA, copy.clone()), later).reply,
        Reply::Registered
    );
    // A Java peer's Register is taken: Java's cancels carry no timestamp, and one held by a
    // paused replica removes a registration made after it; Java's Register after the 404 of its
    // next replicated heartbeat puts it back.
    let java = Writer::Peer(PeerKind::Java);
    let mut r = cancelled_by(java);
    assert_eq!(r.apply(from(java, copy.clone()), T0 + 2_000).reply, Reply::Registered);
    assert!(r.contains("ORDERS", "o-1"));
}

#[test]
fn an_evicted_instance_that_renews_elsewhere_comes_back_through_replication() {
    let mut r = registry();
    let mut copy = inst("orders", "o-1");
    copy.last_dirty_timestamp = T0;
    register(&mut r, copy.clone(), T0);
    // The leader's eviction, replicated here after the lease expired here too.
    let out = r.apply(
        Command::Evict {
            app: "ORDERS".into(),
            id: "o-1".into(),
        },
        T0 + 100_000,
    );
    assert_eq!(out.reply, Reply::Ok);
    // A peer that still gets its renewals sends the Register after a 404: taken.
    let out = r.apply(
        Command::Register {
            info: copy,
            writer: Writer::REPLICA,
        },
        T0 + 101_000,
    );
    assert_eq!(out.reply, Reply::Registered);
}
