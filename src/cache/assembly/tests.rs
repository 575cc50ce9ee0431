//! Assembled payloads against whole encodings, through writes, pruning and readers racing.

use super::*;
use crate::registry::{Command, RegistryConfig, Writer, instance::InstanceInfo, instance::Status};

const T0: i64 = 1_700_000_000_000;

#[derive(Clone)]
struct Shared(Arc<Mutex<Registry>>);

impl Source for Shared {
    fn read<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        f(&self.0.lock())
    }
}

impl Shared {
    fn new() -> Shared {
        let mut r = Registry::new(RegistryConfig::default(), T0);
        r.open_for_traffic(0, T0);
        Shared(Arc::new(Mutex::new(r)))
    }

    fn apply(&self, command: Command, now: i64) {
        self.0.lock().apply(command, now);
    }

    fn register(&self, app: &str, id: &str, now: i64) {
        let mut i = InstanceInfo::new(app, &format!("{id}.example"), "10.0.0.1", now);
        i.instance_id = Some(id.to_string().into());
        i.vip_address = Some(app.to_ascii_lowercase().into());
        self.apply(
            Command::Register {
                info: i,
                writer: Writer::Client,
            },
            now,
        );
    }

    fn cancel(&self, app: &str, id: &str, now: i64) {
        self.apply(
            Command::Cancel {
                app: app.into(),
                id: id.into(),
                writer: Writer::Client,
            },
            now,
        );
    }

    fn set_status(&self, app: &str, id: &str, status: Status, now: i64) {
        self.apply(
            Command::SetStatus {
                app: app.into(),
                id: id.into(),
                status,
                last_dirty_timestamp: None,
                writer: Writer::Client,
            },
            now,
        );
    }

    /// What encoding the whole view at once gives.
    fn expected(&self, kind: Kind, format: Format) -> Vec<u8> {
        let r = self.0.lock();
        let view = match kind {
            Kind::Full => r.full_view(),
            Kind::Delta => r.delta_view(),
        };
        codec::encode_apps(&view, format)
    }
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(data), &mut out).expect("one valid gzip member");
    out
}

/// Builds every kind and format and checks both forms against a whole encoding.
fn check(s: &Shared, assemblies: &[Assembly]) {
    for a in assemblies {
        a.identity_wanted.store(1, Ordering::Relaxed);
        let p = a.build_now(s).expect("published");
        let expected = s.expected(a.kind, a.format);
        let label = format!("{:?} {:?}", a.kind, a.format);
        assert_eq!(p.version, s.0.lock().version(), "{label}");
        assert_eq!(
            String::from_utf8_lossy(&gunzip(&p.gzip_ready().unwrap().to_vec())),
            String::from_utf8_lossy(&expected),
            "{label}: gzip form"
        );
        assert_eq!(p.identity_ready().unwrap().to_vec(), expected, "{label}: identity form");
    }
}

fn all() -> Vec<Assembly> {
    [
        (Kind::Full, Format::Json),
        (Kind::Full, Format::Xml),
        (Kind::Delta, Format::Json),
        (Kind::Delta, Format::Xml),
    ]
    .into_iter()
    .map(|(k, f)| Assembly::new(k, f, Tuning::default()))
    .collect()
}

#[test]
fn assembled_payloads_match_a_whole_encoding_through_writes_and_pruning() {
    let s = Shared::new();
    let assemblies = all();
    check(&s, &assemblies);
    for a in 0..5 {
        for i in 0..4 {
            s.register(&format!("APP-{a}"), &format!("app-{a}-{i}"), T0 + 1_000);
        }
    }
    check(&s, &assemblies);
    s.set_status("APP-2", "app-2-1", Status::OutOfService, T0 + 2_000);
    check(&s, &assemblies);
    s.cancel("APP-4", "app-4-0", T0 + 3_000);
    s.cancel("APP-0", "app-0-0", T0 + 3_000);
    check(&s, &assemblies);
    // The last application goes away (the separator moves), and a new first one comes.
    for i in 1..4 {
        s.cancel("APP-4", &format!("app-4-{i}"), T0 + 4_000);
    }
    s.register("AAA", "aaa-1", T0 + 4_000);
    check(&s, &assemblies);
    // Pruning takes the first changes out of the delta.
    s.0.lock().purge(T0 + 181_500);
    check(&s, &assemblies);
    s.0.lock().purge(T0 + 185_000);
    check(&s, &assemblies);
    // Only one application left, then none.
    for a in 0..4 {
        for i in 0..4 {
            s.cancel(&format!("APP-{a}"), &format!("app-{a}-{i}"), T0 + 190_000);
        }
    }
    check(&s, &assemblies);
    s.cancel("AAA", "aaa-1", T0 + 191_000);
    check(&s, &assemblies);
}

#[test]
fn a_write_reencodes_only_the_application_it_changed() {
    let s = Shared::new();
    for a in 0..(BATCH_APPS * 2 + 5) {
        for i in 0..3 {
            s.register(&format!("APP-{a:03}"), &format!("app-{a}-{i}"), T0 + 1_000);
        }
    }
    let full = Assembly::new(Kind::Full, Format::Json, Tuning::default());
    let delta = Assembly::new(Kind::Delta, Format::Json, Tuning::default());
    full.build_now(&s).unwrap();
    delta.build_now(&s).unwrap();
    let before = |a: &Assembly| a.fragments.lock().map.values().map(|f| f.version).collect::<Vec<_>>();
    // The pieces themselves, not their addresses: holding them keeps their buffers alive, so a
    // piece encoded since cannot be allocated where one of them is and pass for it.
    let pieces = |a: &Assembly| {
        a.fragments
            .lock()
            .map
            .values()
            .map(|f| f.deflated.clone())
            .collect::<Vec<_>>()
    };
    let (full_before, delta_before, pieces_before) = (before(&full), before(&delta), pieces(&full));
    s.set_status("APP-007", "app-7-2", Status::Down, T0 + 2_000);
    let p = full.build_now(&s).unwrap();
    let changed = |a: &Assembly, old: &[u64]| {
        a.fragments
            .lock()
            .map
            .values()
            .zip(old)
            .filter(|(f, v)| f.version != **v)
            .count()
    };
    assert_eq!(changed(&full, &full_before), 1, "one fragment of the full registry");
    let recompressed = |before: &[Bytes]| {
        pieces(&full)
            .iter()
            .zip(before)
            .filter(|(a, b)| a.as_ptr() != b.as_ptr())
            .count()
    };
    let whole = |p: &Payload| {
        assert_eq!(
            String::from_utf8(gunzip(&p.gzip_ready().unwrap().to_vec())).unwrap(),
            String::from_utf8(s.expected(Kind::Full, Format::Json)).unwrap()
        )
    };
    assert_eq!(
        recompressed(&pieces_before),
        2,
        "its piece and the next one's, which is compressed after its tail (the last instance changed)"
    );
    whole(&p);
    delta.build_now(&s).unwrap();
    assert_eq!(changed(&delta, &delta_before), 1, "one fragment of the delta");

    // The first instance is outside the last WINDOW bytes: the next piece stays valid.
    let tail_before = full.fragments.lock().map["APP-007"].tail.clone();
    let pieces_before = pieces(&full);
    s.set_status("APP-007", "app-7-0", Status::Down, T0 + 3_000);
    let p = full.build_now(&s).unwrap();
    assert_eq!(full.fragments.lock().map["APP-007"].tail, tail_before);
    assert_eq!(
        recompressed(&pieces_before),
        1,
        "its own piece only: the bytes the next one follows are the same"
    );
    whole(&p);
}

#[test]
fn a_payload_of_many_groups_stays_whole_and_a_write_joins_only_its_group_again() {
    let s = Shared::new();
    for a in 0..300 {
        for i in 0..3 {
            s.register(&format!("APP-{a:03}"), &format!("app-{a}-{i}"), T0 + 1_000);
        }
    }
    let assemblies = all();
    check(&s, &assemblies);
    let full = &assemblies[0];
    let groups = full.fragments.lock().groups.len();
    assert!(groups >= 4, "300 applications make several groups, not {groups}");
    // Writes to applications anywhere in their groups, first or not, each checked whole.
    for (k, a) in (0..300).step_by(23).enumerate() {
        let (app, id) = (format!("APP-{a:03}"), format!("app-{a}-1"));
        s.set_status(&app, &id, Status::OutOfService, T0 + 2_000 + k as i64);
        check(&s, &assemblies);
    }
    // The parts themselves are held, so that a new one cannot be allocated where an old one was.
    let parts = |p: &Payload| p.gzip_ready().unwrap().parts.to_vec();
    let before = parts(&full.build_now(&s).unwrap());
    // The first instance is outside the bytes the next piece follows: one piece changes.
    s.set_status("APP-150", "app-150-0", Status::Down, T0 + 3_000);
    let after = parts(&full.build_now(&s).unwrap());
    assert_eq!(before.len(), groups + 2, "the head, each group, the tail");
    assert_eq!(after.len(), before.len());
    let joined_again = before[1..groups + 1]
        .iter()
        .zip(&after[1..groups + 1])
        .filter(|(a, b)| a.as_ptr() != b.as_ptr())
        .count();
    assert_eq!(joined_again, 1, "the group of the application written to");
    check(&s, &assemblies);
}

#[test]
fn identity_forms_are_kept_only_while_wanted() {
    let s = Shared::new();
    s.register("APP", "app-1", T0);
    let a = Assembly::new(Kind::Full, Format::Json, Tuning::default());
    let p = a.build_now(&s).unwrap();
    assert!(
        p.identity.get().is_none(),
        "gzip only until a reader wants the identity form"
    );
    let text = p.identity().to_vec();
    assert_eq!(
        text,
        s.expected(Kind::Full, Format::Json),
        "inflated from the gzip form"
    );
    s.register("APP", "app-2", T0);
    let p = a.build_now(&s).unwrap();
    assert_eq!(
        p.identity.get().map(Pieces::to_vec),
        Some(s.expected(Kind::Full, Format::Json)),
        "now built with it"
    );
}

#[tokio::test]
async fn readers_get_a_payload_at_least_as_new_as_the_registry() {
    let s = Shared::new();
    let a = Arc::new(Assembly::new(Kind::Delta, Format::Xml, Tuning::default()));
    let mut readers = Vec::new();
    for i in 0..20 {
        s.register("APP", &format!("app-{i}"), T0);
        let want = s.0.lock().version();
        let (a, s) = (a.clone(), s.clone());
        readers.push(tokio::spawn(async move { (want, a.get(&s, want).await) }));
    }
    for r in readers {
        let (want, p) = r.await.unwrap();
        assert!(p.version >= want);
    }
    assert!(a.builds() <= 20, "builds coalesce: {}", a.builds());
}

/// Waits (up to a bound that only a failure reaches) until `a` publishes version `want`.
async fn published(a: &Assembly, want: u64) -> Arc<Payload> {
    let wait = async {
        loop {
            let mut done = a.done.subscribe();
            if let Some(p) = a.published.load_full().filter(|p| p.version >= want) {
                return p;
            }
            let _ = done.changed().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("published in time")
}

#[tokio::test]
async fn a_payload_read_recently_is_built_ahead_of_its_next_reader() {
    let s = Shared::new();
    s.register("APP", "app-0", T0);
    let version = || s.0.lock().version();
    let a = Arc::new(Assembly::new(Kind::Delta, Format::Json, Tuning::default()));
    let (versions, rx) = tokio::sync::watch::channel(version());
    let ahead = tokio::spawn(a.clone().build_ahead(s.clone(), rx));

    // Nothing read yet: a write starts no build.
    s.register("APP", "app-1", T0);
    versions.send_replace(version());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!a.building.load(Ordering::Acquire));
    assert_eq!(a.builds(), 0);

    let read = a.get(&s, version()).await;
    assert_eq!((read.version, a.builds(), a.builds_ahead()), (version(), 1, 0));

    // A write after the read: built without a reader, and the next reader takes it as it is.
    s.cancel("APP", "app-0", T0 + 1_000);
    versions.send_replace(version());
    let ahead_of_reader = published(&a, version()).await;
    assert_eq!(a.builds_ahead(), 1);
    let next = a.get(&s, version()).await;
    assert!(Arc::ptr_eq(&next, &ahead_of_reader), "no build of its own");
    assert_eq!(a.builds(), 2);
    assert_eq!(
        gunzip(&next.gzip_ready().unwrap().to_vec()),
        s.expected(Kind::Delta, Format::Json)
    );

    // The watch closes: the builder ends.
    drop(versions);
    tokio::time::timeout(Duration::from_secs(30), ahead)
        .await
        .expect("ends")
        .unwrap();
}

#[tokio::test]
async fn building_ahead_can_be_turned_off() {
    let s = Shared::new();
    s.register("APP", "app-0", T0);
    let version = || s.0.lock().version();
    let tuning = Tuning {
        build_ahead: Duration::ZERO,
        ..Tuning::default()
    };
    let a = Arc::new(Assembly::new(Kind::Full, Format::Xml, tuning));
    let (versions, rx) = tokio::sync::watch::channel(version());
    let ahead = tokio::spawn(a.clone().build_ahead(s.clone(), rx));
    a.get(&s, version()).await;
    s.register("APP", "app-1", T0);
    versions.send_replace(version());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!a.building.load(Ordering::Acquire));
    assert_eq!((a.builds(), a.builds_ahead()), (1, 0));
    let p = a.get(&s, version()).await;
    assert_eq!((p.version, a.builds()), (version(), 2), "its reader builds it");
    ahead.abort();
}
