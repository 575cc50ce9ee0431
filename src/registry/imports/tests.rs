//! Imported instances: their origin's rules, local precedence, visibility and the export view.

use super::*;
use crate::registry::{Command, Registry, RegistryConfig, Writer, instance::InstanceInfo};

const T0: i64 = 1_700_000_000_000;

fn inst(app: &str, id: &str, status: Status) -> InstanceInfo {
    let mut i = InstanceInfo::new(app, &format!("{id}.example"), "10.1.0.1", T0);
    i.instance_id = Some(id.to_string().into());
    i.vip_address = Some(app.to_ascii_lowercase().into());
    i.status = status;
    i
}

fn registry() -> Registry {
    let mut r = Registry::new(RegistryConfig::default(), T0);
    r.open_for_traffic(0, T0);
    r
}

fn import(r: &mut Registry, link: &str, full: bool, apps: Vec<(&str, Vec<InstanceInfo>)>, now: i64) {
    let batch = ImportBatch {
        full,
        apps: apps.into_iter().map(|(a, i)| (a.to_string(), i)).collect(),
    };
    let out = r.apply(
        Command::Import {
            link: link.into(),
            batch,
        },
        now,
    );
    assert!(out.replicate.is_empty(), "an import is never replicated");
}

fn shown(r: &Registry) -> Vec<(String, Origin)> {
    r.full_view()
        .apps
        .iter()
        .flat_map(|a| a.instances.iter().map(|i| (i.id().to_string(), i.origin)))
        .collect()
}

fn client(command: &str, app: &str, id: &str) -> Command {
    let (app, id) = (app.to_string(), id.to_string());
    match command {
        "renew" => Command::Renew {
            app,
            id,
            writer: Writer::Client,
            overridden_status: None,
            last_dirty_timestamp: None,
        },
        "cancel" => Command::Cancel {
            app,
            id,
            writer: Writer::Client,
        },
        "status" => Command::SetStatus {
            app,
            id,
            status: Status::OutOfService,
            last_dirty_timestamp: None,
            writer: Writer::Client,
        },
        _ => unreachable!(),
    }
}

#[test]
fn imports_are_shown_counted_apart_and_never_expire_or_replicate() {
    let mut r = registry();
    import(
        &mut r,
        "east",
        true,
        vec![(
            "orders",
            vec![inst("ORDERS", "e-1", Status::Up), inst("ORDERS", "e-2", Status::Down)],
        )],
        T0,
    );
    assert_eq!(
        shown(&r),
        vec![("e-1".into(), Origin::Imported), ("e-2".into(), Origin::Imported)]
    );
    assert_eq!(r.full_view().apps_hashcode, "DOWN_1_UP_1_");
    assert_eq!(r.delta_view().apps[0].instances.len(), 2, "imports are in the delta");
    let stats = r.stats(T0);
    assert_eq!(stats.by_origin[4], (Origin::Imported, 2));
    assert_eq!(
        stats.expected_clients, 1,
        "imports do not count toward self-preservation"
    );

    // Ten lease durations later, eviction finds nothing.
    let later = T0 + 900_000;
    assert!(r.evict(later, 7).is_empty());
    assert_eq!(r.stats(later).expired, 0);
    assert_eq!(shown(&r).len(), 2);

    // The same full fetch again changes nothing a reader sees.
    let v = r.version();
    import(
        &mut r,
        "east",
        true,
        vec![(
            "ORDERS",
            vec![inst("ORDERS", "e-1", Status::Up), inst("ORDERS", "e-2", Status::Down)],
        )],
        later,
    );
    assert_eq!(r.version(), v, "an unchanged copy is not a change");

    // A delta: ORDERS lost e-2; a full fetch without ORDERS removes it entirely.
    import(
        &mut r,
        "east",
        false,
        vec![("ORDERS", vec![inst("ORDERS", "e-1", Status::Up)])],
        later,
    );
    assert_eq!(shown(&r), vec![("e-1".into(), Origin::Imported)]);
    assert_eq!(r.link_hashcode("east"), "UP_1_");
    import(
        &mut r,
        "east",
        true,
        vec![("BILLING", vec![inst("BILLING", "b-1", Status::Up)])],
        later,
    );
    assert_eq!(shown(&r), vec![("b-1".into(), Origin::Imported)]);
    let deleted: Vec<_> = r
        .delta_view()
        .apps
        .iter()
        .filter(|a| a.name == "ORDERS")
        .flat_map(|a| a.instances.iter().map(|i| (i.id().to_string(), i.action_type())))
        .collect();
    assert_eq!(
        deleted,
        vec![
            ("e-1".into(), Some(ActionType::Deleted)),
            ("e-2".into(), Some(ActionType::Deleted))
        ]
    );
}

#[test]
fn client_writes_on_an_import_follow_the_link_rules() {
    let mut r = registry();
    import(
        &mut r,
        "east",
        true,
        vec![("ORDERS", vec![inst("ORDERS", "e-1", Status::Up)])],
        T0,
    );
    assert_eq!(r.apply(client("renew", "ORDERS", "e-1"), T0).reply, Reply::NotFound);
    assert_eq!(r.apply(client("cancel", "ORDERS", "e-1"), T0).reply, Reply::NotFound);
    match r.apply(client("status", "ORDERS", "e-1"), T0).reply {
        Reply::Refused(message) => assert!(message.contains("\"east\""), "{message}"),
        other => panic!("status on an import: {other:?}"),
    }
    assert_eq!(shown(&r), vec![("e-1".into(), Origin::Imported)], "nothing changed");

    // A registration takes the id: the local instance wins and the import is hidden.
    let out = r.apply(
        Command::Register {
            info: inst("ORDERS", "e-1", Status::Starting),
            writer: Writer::Client,
        },
        T0 + 1,
    );
    assert_eq!(out.reply, Reply::Registered);
    assert_eq!(out.replicate.len(), 1, "the local registration is replicated as usual");
    assert_eq!(shown(&r), vec![("e-1".into(), Origin::Native)]);
    let figures = &r.link_figures()["east"];
    assert_eq!((figures.instances, figures.shown, figures.hidden_by_local), (1, 0, 1));
    assert_eq!(r.stats(T0 + 1).expected_clients, 1 + 1, "the local one counts");

    // The local one goes: the import shows again.
    assert_eq!(r.apply(client("cancel", "ORDERS", "e-1"), T0 + 2).reply, Reply::Ok);
    assert_eq!(shown(&r), vec![("e-1".into(), Origin::Imported)]);
    assert_eq!(status_of(&r, "e-1"), Status::Up);
}

fn status_of(r: &Registry, id: &str) -> Status {
    r.full_view()
        .apps
        .iter()
        .flat_map(|a| a.instances.iter())
        .find(|i| i.id() == id)
        .expect("shown")
        .status()
}

#[test]
fn the_first_link_by_name_shows_an_id_both_import() {
    let mut r = registry();
    import(
        &mut r,
        "west",
        true,
        vec![("ORDERS", vec![inst("ORDERS", "x", Status::Down)])],
        T0,
    );
    import(
        &mut r,
        "east",
        true,
        vec![("ORDERS", vec![inst("ORDERS", "x", Status::Up)])],
        T0,
    );
    assert_eq!(status_of(&r, "x"), Status::Up, "east comes first");
    r.apply(Command::DropLink { link: "east".into() }, T0);
    assert_eq!(status_of(&r, "x"), Status::Down, "west shows it once east is gone");
    r.apply(Command::DropLink { link: "west".into() }, T0);
    assert!(shown(&r).is_empty());
}

fn rule(visibility: Visibility, on_withdraw: OnWithdraw, withdrawn: bool) -> LinkRule {
    LinkRule {
        visibility,
        on_withdraw,
        withdrawn,
    }
}

#[test]
fn fallback_and_withdrawal_show_a_link_only_while_no_other_source_is_up() {
    let mut r = registry();
    r.apply(
        Command::SetLinkRule {
            link: "east".into(),
            rule: rule(Visibility::Fallback, OnWithdraw::UnlessOnlySource, false),
        },
        T0,
    );
    import(
        &mut r,
        "east",
        true,
        vec![
            ("ORDERS", vec![inst("ORDERS", "e-1", Status::Up)]),
            ("BILLING", vec![inst("BILLING", "eb-1", Status::Up)]),
        ],
        T0,
    );
    // No local ORDERS: east's shows.
    assert_eq!(shown(&r).len(), 2);
    // A local ORDERS comes UP: east's ORDERS is no longer shown; BILLING still is.
    r.apply(
        Command::Register {
            info: inst("ORDERS", "a-1", Status::Up),
            writer: Writer::Client,
        },
        T0 + 1,
    );
    let ids: BTreeSet<String> = shown(&r).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["a-1", "eb-1"].into_iter().map(String::from).collect());
    // It goes DOWN: the failover shows east's again.
    r.apply(client("status", "ORDERS", "a-1"), T0 + 2);
    let ids: BTreeSet<String> = shown(&r).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["a-1", "e-1", "eb-1"].into_iter().map(String::from).collect());

    // A merged link withdrawn after a partition: the same rule; Always hides everything, Never
    // keeps everything.
    r.apply(client("cancel", "ORDERS", "a-1"), T0 + 3);
    r.apply(
        Command::Register {
            info: inst("ORDERS", "a-2", Status::Up),
            writer: Writer::Client,
        },
        T0 + 3,
    );
    for (on_withdraw, expected) in [
        (OnWithdraw::UnlessOnlySource, vec!["a-2", "eb-1"]),
        (OnWithdraw::Always, vec!["a-2"]),
        (OnWithdraw::Never, vec!["a-2", "e-1", "eb-1"]),
    ] {
        r.apply(
            Command::SetLinkRule {
                link: "east".into(),
                rule: rule(Visibility::Merged, on_withdraw, true),
            },
            T0 + 4,
        );
        let ids: BTreeSet<String> = shown(&r).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, expected.into_iter().map(String::from).collect(), "{on_withdraw:?}");
    }
    // Healed: everything shows again.
    r.apply(
        Command::SetLinkRule {
            link: "east".into(),
            rule: rule(Visibility::Merged, OnWithdraw::UnlessOnlySource, false),
        },
        T0 + 5,
    );
    assert_eq!(shown(&r).len(), 3);
    // On request only: never in the main view.
    r.apply(
        Command::SetLinkRule {
            link: "east".into(),
            rule: rule(Visibility::OnRequest, OnWithdraw::UnlessOnlySource, false),
        },
        T0 + 6,
    );
    assert_eq!(shown(&r), vec![("a-2".into(), Origin::Native)]);
}

#[test]
fn the_export_leaves_out_imports_and_unexported_apps_with_a_matching_hash() {
    let mut r = registry();
    for (app, id, status) in [
        ("ORDERS", "a-1", Status::Up),
        ("ORDERS", "a-2", Status::Down),
        ("LOCAL", "l-1", Status::Up),
    ] {
        r.apply(
            Command::Register {
                info: inst(app, id, status),
                writer: Writer::Client,
            },
            T0,
        );
    }
    import(
        &mut r,
        "east",
        true,
        vec![("ORDERS", vec![inst("ORDERS", "e-1", Status::Up)])],
        T0,
    );
    let exported = |app: &str| app != "LOCAL";
    let full = r.export_view(&exported);
    let ids: Vec<&str> = full
        .apps
        .iter()
        .flat_map(|a| a.instances.iter().map(|i| i.id()))
        .collect();
    assert_eq!(ids, vec!["a-1", "a-2"]);
    assert_eq!(full.apps_hashcode, "DOWN_1_UP_1_");

    // Since that version nothing changed; then a-2 goes and e-2 is imported: ORDERS is listed
    // whole, the hash code is the export's.
    let since = full.versions_delta as u64;
    let none = r.export_changes_since(since, &exported).unwrap();
    assert!(none.apps.is_empty());
    assert_eq!(none.apps_hashcode, "DOWN_1_UP_1_");
    r.apply(client("cancel", "ORDERS", "a-2"), T0 + 1);
    let changes = r.export_changes_since(since, &exported).unwrap();
    assert_eq!(changes.apps.len(), 1);
    assert_eq!(changes.apps[0].instances.len(), 1);
    assert_eq!(changes.apps_hashcode, "UP_1_");
    // An application whose last exported instance went is listed empty.
    r.apply(client("cancel", "ORDERS", "a-1"), T0 + 2);
    let changes = r.export_changes_since(since, &exported).unwrap();
    assert_eq!(
        (changes.apps[0].name.as_str(), changes.apps[0].instances.len()),
        ("ORDERS", 0)
    );
    assert_eq!(changes.apps_hashcode, "");
    // Pruned past the version: the caller must send everything.
    r.purge(T0 + 10_000_000);
    assert!(r.export_changes_since(since, &exported).is_none());
}

#[test]
fn imports_do_not_take_the_local_caps() {
    let mut config = RegistryConfig::default();
    config.limits.max_instances = 1;
    let mut r = Registry::new(config, T0);
    r.open_for_traffic(0, T0);
    import(
        &mut r,
        "east",
        true,
        vec![(
            "ORDERS",
            vec![inst("ORDERS", "e-1", Status::Up), inst("ORDERS", "e-2", Status::Up)],
        )],
        T0,
    );
    let out = r.apply(
        Command::Register {
            info: inst("ORDERS", "a-1", Status::Up),
            writer: Writer::Client,
        },
        T0,
    );
    assert_eq!(
        out.reply,
        Reply::Registered,
        "imports leave the local cap to local clients"
    );
    // A registration of an import's id that the cap refuses leaves the import shown.
    let out = r.apply(
        Command::Register {
            info: inst("ORDERS", "e-1", Status::Up),
            writer: Writer::Client,
        },
        T0,
    );
    assert!(matches!(out.reply, Reply::OverLimit(_)), "{:?}", out.reply);
    let origins: Vec<(String, Origin)> = shown(&r);
    assert!(origins.contains(&("e-1".into(), Origin::Imported)), "{origins:?}");
}

/// A Netflix client's copy of a (regions) view: full fetches replace it, deltas are applied
/// entry by entry (DELETED removes, anything else replaces by id).
#[derive(Default)]
struct ClientCopy(BTreeMap<(String, String), Status>);

impl ClientCopy {
    fn full(view: &AppsView) -> ClientCopy {
        let mut c = ClientCopy::default();
        c.apply(view);
        c
    }

    fn apply(&mut self, delta: &AppsView) {
        for app in &delta.apps {
            for i in &app.instances {
                let key = (app.name.clone(), i.id().to_string());
                if i.action_type() == Some(ActionType::Deleted) {
                    self.0.remove(&key);
                } else {
                    self.0.insert(key, i.status());
                }
            }
        }
    }

    fn hashcode(&self) -> String {
        let mut c = StatusCounts::default();
        for s in self.0.values() {
            c.add(*s);
        }
        c.hashcode()
    }
}

#[test]
fn an_on_request_link_shows_only_in_regions_fetches_whose_full_delta_and_hash_agree() {
    let mut r = registry();
    let regions = |r: &Registry| r.offering_links(&["EAST", "nowhere"]);
    import(
        &mut r,
        "east",
        true,
        vec![(
            "orders",
            vec![inst("ORDERS", "e-1", Status::Up), inst("ORDERS", "x-1", Status::Up)],
        )],
        T0,
    );
    assert!(regions(&r).is_empty(), "a merged link adds nothing to a regions fetch");
    r.apply(
        Command::SetLinkRule {
            link: "east".into(),
            rule: rule(Visibility::OnRequest, OnWithdraw::UnlessOnlySource, false),
        },
        T0,
    );
    assert!(shown(&r).is_empty(), "not in the main view");
    let links = regions(&r);
    assert_eq!(links, vec![Arc::<str>::from("east")]);
    let full = r.regions_full_view(&links);
    assert_eq!(full.apps_hashcode, "UP_2_");
    assert_eq!(r.full_view().apps_hashcode, "");
    let mut copy = ClientCopy::full(&full);
    // A local instance with the id of an offered one wins; when it goes the offer returns.
    r.apply(
        Command::Register {
            info: inst("ORDERS", "x-1", Status::Down),
            writer: Writer::Client,
        },
        T0 + 1,
    );
    let delta = r.regions_delta_view(&links);
    copy.apply(&delta);
    assert_eq!(copy.hashcode(), delta.apps_hashcode);
    assert_eq!(copy.hashcode(), "DOWN_1_UP_1_");
    r.apply(client("cancel", "ORDERS", "x-1"), T0 + 2);
    let delta = r.regions_delta_view(&links);
    copy.apply(&delta);
    assert_eq!(copy.hashcode(), "UP_2_");
    assert_eq!(copy.0, ClientCopy::full(&r.regions_full_view(&links)).0);
    assert_eq!(r.link_figures()["east"].shown, 2, "offered instances count as shown");
}

mod offers_agree {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// A fetch over `link` (0 east, 1 west) bringing these instances of ORDERS.
        Import(usize, Vec<(u8, bool)>),
        Register(u8, bool),
        Cancel(u8),
        Rule(usize, u8, bool),
        Purge,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..2usize, proptest::collection::vec((0..6u8, any::<bool>()), 0..5)).prop_map(|(l, v)| Op::Import(l, v)),
            (0..6u8, any::<bool>()).prop_map(|(i, up)| Op::Register(i, up)),
            (0..6u8).prop_map(Op::Cancel),
            (0..2usize, 0..3u8, any::<bool>()).prop_map(|(l, v, w)| Op::Rule(l, v, w)),
            Just(Op::Purge),
        ]
    }

    fn status(up: bool) -> Status {
        if up { Status::Up } else { Status::Down }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Whatever the writes, rules and prunings, a client that fetched once and then applies
        /// every delta holds exactly the full regions view and its hash code, and so does a
        /// client of the main view.
        #[test]
        fn a_regions_client_copy_follows_full_delta_and_hash(ops in proptest::collection::vec(op(), 1..40)) {
            let mut r = registry();
            let links = ["east", "west"];
            for link in links {
                r.apply(Command::SetLinkRule { link: link.into(), rule: rule(Visibility::OnRequest, OnWithdraw::UnlessOnlySource, false) }, T0);
            }
            let names: Vec<Arc<str>> = links.iter().map(|l| Arc::from(*l)).collect();
            let (mut regions, mut main) = (ClientCopy::full(&r.regions_full_view(&names)), ClientCopy::full(&r.full_view()));
            for (step, op) in ops.into_iter().enumerate() {
                let now = T0 + 1 + step as i64;
                match op {
                    Op::Import(l, v) => {
                        let instances = v.iter().map(|(i, up)| inst("ORDERS", &format!("o-{i}"), status(*up))).collect();
                        import(&mut r, links[l], true, vec![("ORDERS", instances)], now);
                    }
                    Op::Register(i, up) => {
                        r.apply(Command::Register { info: inst("ORDERS", &format!("o-{i}"), status(up)), writer: Writer::Client }, now);
                    }
                    Op::Cancel(i) => {
                        r.apply(client("cancel", "ORDERS", &format!("o-{i}")), now);
                    }
                    Op::Rule(l, v, withdrawn) => {
                        let visibility = [Visibility::OnRequest, Visibility::Merged, Visibility::Fallback][v as usize];
                        r.apply(Command::SetLinkRule { link: links[l].into(), rule: rule(visibility, OnWithdraw::UnlessOnlySource, withdrawn) }, now);
                    }
                    // Everything older than this step leaves the delta logs.
                    Op::Purge => r.purge(now + RegistryConfig::default().retention_time_in_ms_in_delta_queue),
                }
                let offering = r.offering_links(&links);
                let full = r.regions_full_view(&names);
                let delta = r.regions_delta_view(&names);
                prop_assert_eq!(&delta.apps_hashcode, &full.apps_hashcode);
                // The client fetches after every step, so the delta always reaches back to its copy.
                regions.apply(&delta);
                prop_assert_eq!(regions.hashcode(), delta.apps_hashcode.clone(), "step {}", step);
                prop_assert_eq!(&regions.0, &ClientCopy::full(&full).0, "step {} ({:?} offering)", step, offering);
                let main_delta = r.delta_view();
                main.apply(&main_delta);
                prop_assert_eq!(main.hashcode(), main_delta.apps_hashcode.clone());
                prop_assert_eq!(&main.0, &ClientCopy::full(&r.full_view()).0);
                prop_assert!(r.full_view().apps.iter().flat_map(|a| &a.instances).all(|i| {
                    r.imported_through("ORDERS", i.id()).is_none_or(|l| r.link_rule(&l).is_some_and(|rule| rule.visibility != Visibility::OnRequest))
                }), "an on-request link never shows in the main view");
            }
        }
    }
}
