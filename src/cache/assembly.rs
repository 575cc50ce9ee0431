//! The full registry and the delta, assembled from one cached fragment per application so that
//! a write costs the encoding and compression of the applications it changed, not of the whole
//! registry.
//!
//! Each fragment keeps its application's encoding compressed as an independent deflate piece
//! (see [`super::gzip`]) with the CRC-32 of its text, and the text itself only while clients
//! that do not take gzip are fetching. A payload is a new head (version and hash code), the
//! fragments in name order and a tail: its gzip form is the pieces copied one after the other
//! with a combined CRC-32, its identity form the fragments' shared bytes, never copied.
//!
//! One build at a time per payload (single flight): the builder asks the registry which
//! applications changed since the version its fragments are valid for (their views are taken
//! under the registry lock, cheap `Arc` clones), releases it, encodes those, assembles and
//! publishes. Readers take the published payload from an atomic pointer; one that needs a newer
//! version than the published one starts a build or waits for the running one to publish, and
//! never waits on a lock held while encoding. Writes that arrive during a build are picked up
//! by the next one, so under a write storm builds coalesce by themselves.
//!
//! Lease timestamps (`leaseInfo`) in an unchanged application's fragment are those of the
//! moment its view was taken. Fragments older than [`Tuning::refresh_after`] are taken again in the
//! background, a bounded number of instances per build ([`Tuning::refresh_budget`]), so while fetches
//! keep coming they are at most about [`FRAGMENT_MAX_AGE`] old: the bound of Java's server,
//! whose read-write cache keeps an unchanged payload for `responseCacheAutoExpirationInSeconds`
//! (180 s). Refreshing sooner would re-encode the whole registry every few seconds at 50k
//! instances for timestamps no client acts on.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use parking_lot::Mutex;

use super::{
    Payload, Pieces,
    gzip::{self, Sum},
};
use crate::{
    codec::{self, Format},
    registry::{Registry, view::AppView},
};

/// How fragments age and how much one build refreshes (`--response-cache-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Fragments whose view is older than this are taken again in the background.
    pub refresh_after: Duration,
    /// Instances whose fragments one build refreshes for age (about 1-2 ms of encoding per
    /// 400), on top of those that changed.
    pub refresh_budget: usize,
    /// How long identity (not gzip) forms are kept after the last reader that wanted one.
    pub identity_keep: Duration,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            refresh_after: REFRESH_AFTER,
            refresh_budget: REFRESH_BUDGET,
            identity_keep: IDENTITY_KEEP,
        }
    }
}

/// The default of [`Tuning::refresh_after`].
pub const REFRESH_AFTER: Duration = Duration::from_secs(150);

/// What the lease timestamps in a fetched payload stay under while fetches keep coming.
pub const FRAGMENT_MAX_AGE: Duration = super::MAX_AGE;

/// The default of [`Tuning::refresh_budget`].
pub const REFRESH_BUDGET: usize = 400;

/// Applications whose views are taken under one registry lock when many changed at once
/// (first build, or after a long pause): the lock is released between batches.
const BATCH_APPS: usize = 64;

/// Deflate level of fragments: compressed once per change of their application.
const LEVEL: u32 = 6;

/// The default of [`Tuning::identity_keep`].
pub const IDENTITY_KEEP: Duration = Duration::from_secs(600);

/// Which document a builder makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `GET apps`: every application with instances.
    Full,
    /// `GET apps/delta`: the recent changes, grouped by application.
    Delta,
}

/// Where a builder reads the registry.
pub trait Source: Send + Sync + 'static {
    /// Runs `f` with the registry locked; keep `f` short.
    fn read<R>(&self, f: impl FnOnce(&Registry) -> R) -> R;
}

impl Kind {
    /// `versions__delta` of the document.
    fn versions_delta(self, r: &Registry) -> i64 {
        match self {
            Kind::Full => 1,
            Kind::Delta => r.version() as i64,
        }
    }

    fn changed_since(self, r: &Registry, version: u64) -> Option<Vec<Arc<str>>> {
        match self {
            Kind::Full => r.apps_changed_since(version),
            Kind::Delta => r.delta_apps_changed_since(version),
        }
    }

    fn versions(self, r: &Registry) -> Vec<(Arc<str>, u64)> {
        match self {
            Kind::Full => r.app_versions().into_iter().map(|(n, v)| (Arc::from(n), v)).collect(),
            Kind::Delta => r.delta_app_versions(),
        }
    }

    /// The applications whose fragments are missing, stale or gone, found by comparing every
    /// application's version with its fragment's (when the change log cannot say).
    fn stale(self, r: &Registry, fragments: &Fragments) -> Vec<Arc<str>> {
        let list = self.versions(r);
        let stale = list
            .iter()
            .filter(|(n, v)| fragments.map.get(n).is_none_or(|f| f.version != *v))
            .map(|(n, _)| n.clone());
        let present: std::collections::HashSet<&str> = list.iter().map(|(n, _)| &**n).collect();
        let gone = fragments.map.keys().filter(|n| !present.contains(&***n)).cloned();
        stale.chain(gone).collect()
    }

    fn view(self, r: &Registry, app: &str) -> Option<(AppView, u64)> {
        match self {
            Kind::Full => r.app_view(app).map(|view| (view, r.app_version(app).unwrap_or(0))),
            Kind::Delta => r.delta_app_view(app),
        }
    }
}

/// One application's part of the document.
struct Fragment {
    /// The version of the application (or of its part of the delta) the view was taken at.
    version: u64,
    /// When the view was taken (the age of its lease timestamps).
    taken: Instant,
    instances: usize,
    /// The text followed by the separator, while identity forms are kept.
    text: Option<Bytes>,
    /// The text (without separator) as a deflate piece ending with an empty stored block.
    deflated: Bytes,
    /// Of the text without and with the separator.
    plain: Sum,
    separated: Sum,
}

impl Fragment {
    fn encode(view: &AppView, version: u64, taken: Instant, format: Format, keep_text: bool) -> Fragment {
        let mut text = codec::encode_app_fragment(view, format);
        let plain = Sum::of(&text);
        let mut deflated = gzip::deflate(&text, LEVEL);
        deflated.shrink_to_fit();
        let sep = codec::separator(format);
        Fragment {
            version,
            taken,
            instances: view.instances.len(),
            text: keep_text.then(|| {
                text.extend_from_slice(sep);
                text.shrink_to_fit();
                Bytes::from(text)
            }),
            deflated: Bytes::from(deflated),
            plain,
            separated: plain.then(Sum::of(sep)),
        }
    }

    /// The text with the separator, from the deflate piece when it was not kept.
    fn text_or_inflate(&self, format: Format) -> Bytes {
        if let Some(t) = &self.text {
            return t.clone();
        }
        let mut text = gzip::inflate(&self.deflated).unwrap_or_default();
        text.extend_from_slice(codec::separator(format));
        Bytes::from(text)
    }
}

/// The builder's own state: only a build touches it.
#[derive(Default)]
struct Fragments {
    /// The registry version every fragment is valid for (0: none yet).
    built: u64,
    map: BTreeMap<Arc<str>, Fragment>,
}

/// Applications' fresh views, with their versions (`None`: the application is gone).
type Views = Vec<(Arc<str>, Option<(AppView, u64)>)>;

/// A consistent snapshot: what to change, taken under one lock.
struct Changes {
    version: u64,
    versions_delta: i64,
    hashcode: String,
    views: Views,
}

/// What the first look at the registry found.
enum Look {
    /// Few changes: everything needed, under that one lock.
    Ready(Changes),
    /// Many applications to take again (the version the list is valid at, and the names).
    TooMany(u64, Vec<Arc<str>>),
}

/// One payload (a kind in a format): its published version and its builder.
pub struct Assembly {
    kind: Kind,
    format: Format,
    published: ArcSwapOption<Payload>,
    building: AtomicBool,
    done: tokio::sync::watch::Sender<u64>,
    fragments: Mutex<Fragments>,
    /// Milliseconds after `epoch` of the last reader that wanted the identity form (0: none).
    identity_wanted: Arc<AtomicU64>,
    epoch: Instant,
    builds: AtomicU64,
    tuning: Tuning,
}

impl Assembly {
    pub fn new(kind: Kind, format: Format, tuning: Tuning) -> Assembly {
        Assembly {
            kind,
            format,
            published: ArcSwapOption::empty(),
            building: AtomicBool::new(false),
            done: tokio::sync::watch::Sender::new(0),
            fragments: Mutex::new(Fragments::default()),
            identity_wanted: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
            builds: AtomicU64::new(0),
            tuning,
        }
    }

    /// How many builds have run (for tests and metrics).
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    /// A payload at registry version `want` or newer: the published one, or the next build's.
    pub async fn get<S: Source + Clone>(self: &Arc<Self>, source: &S, want: u64) -> Arc<Payload> {
        loop {
            let mut done = self.done.subscribe();
            if let Some(p) = self.published.load_full()
                && p.version >= want
            {
                if p.oldest.elapsed() >= self.tuning.refresh_after && self.begin() {
                    // Serve this one; take old views again in the background.
                    let (this, source) = (self.clone(), source.clone());
                    tokio::task::spawn_blocking(move || this.run(&source));
                }
                return p;
            }
            if self.begin() {
                let (this, source) = (self.clone(), source.clone());
                // The build publishes even if this reader goes away meanwhile.
                let _ = tokio::task::spawn_blocking(move || this.run(&source)).await;
                continue;
            }
            let _ = done.changed().await;
        }
    }

    /// Builds now on this thread if no build runs (for tests and warm-up).
    pub fn build_now<S: Source>(&self, source: &S) -> Option<Arc<Payload>> {
        if self.begin() {
            self.run(source);
        }
        self.published.load_full()
    }

    /// Takes the single flight; false if a build runs.
    fn begin(&self) -> bool {
        self.building
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Builds and publishes until no fragment is due for a refresh, then ends the flight.
    fn run<S: Source>(&self, source: &S) {
        struct Flight<'a>(&'a Assembly);
        impl Drop for Flight<'_> {
            fn drop(&mut self) {
                self.0.building.store(false, Ordering::Release);
                self.0.done.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        let _flight = Flight(self);
        let mut fragments = self.fragments.lock();
        loop {
            let payload = Arc::new(self.build(source, &mut fragments));
            self.builds.fetch_add(1, Ordering::Relaxed);
            let due = payload.oldest.elapsed() >= self.tuning.refresh_after;
            self.published.store(Some(payload));
            self.done.send_modify(|n| *n = n.wrapping_add(1));
            if !due {
                break;
            }
        }
    }

    fn keep_identity(&self) -> bool {
        let at = self.identity_wanted.load(Ordering::Relaxed);
        at != 0 && self.epoch.elapsed().as_millis() as u64 <= at + self.tuning.identity_keep.as_millis() as u64
    }

    /// Brings the fragments up to the registry's current version and assembles a payload.
    fn build<S: Source>(&self, source: &S, fragments: &mut Fragments) -> Payload {
        let keep_text = self.keep_identity();
        let kind = self.kind;
        let mut batched = false;
        let snapshot = loop {
            let aged = if batched {
                Vec::new()
            } else {
                aged(fragments, &self.tuning)
            };
            let built = fragments.built;
            let look = source.read(|r| {
                let changed = kind
                    .changed_since(r, built)
                    .filter(|_| built > 0)
                    .unwrap_or_else(|| kind.stale(r, fragments));
                if !batched && changed.len() > BATCH_APPS {
                    return Look::TooMany(r.version(), changed);
                }
                let mut names = changed;
                names.extend(aged);
                names.sort();
                names.dedup();
                let views = names
                    .into_iter()
                    .map(|n| {
                        let view = kind.view(r, &n);
                        (n, view)
                    })
                    .collect();
                Look::Ready(Changes {
                    version: r.version(),
                    versions_delta: kind.versions_delta(r),
                    hashcode: if crate::mutants::on("wrong-hashcode") {
                        format!("{}UNKNOWN_1_", r.apps_hashcode())
                    } else {
                        r.apps_hashcode()
                    },
                    views,
                })
            });
            match look {
                Look::Ready(snapshot) => break snapshot,
                Look::TooMany(version, names) => {
                    // Many at once: take them a batch per lock, then look again for what changed
                    // meanwhile (all of it under one lock, so this ends).
                    for batch in names.chunks(BATCH_APPS) {
                        let views: Views =
                            source.read(|r| batch.iter().map(|n| (n.clone(), kind.view(r, n))).collect());
                        self.apply(fragments, views, keep_text);
                    }
                    fragments.built = version;
                    batched = true;
                }
            }
        };
        fragments.built = snapshot.version;
        self.apply(fragments, snapshot.views, keep_text);
        self.assemble(
            fragments,
            snapshot.version,
            snapshot.versions_delta,
            &snapshot.hashcode,
            keep_text,
        )
    }

    /// Encodes fresh views into fragments (outside the registry lock), dropping those of
    /// applications that are gone.
    fn apply(&self, fragments: &mut Fragments, views: Views, keep_text: bool) {
        let taken = Instant::now();
        for (name, view) in views {
            match view {
                Some((view, version)) => {
                    let f = Fragment::encode(&view, version, taken, self.format, keep_text);
                    fragments.map.insert(name, f);
                }
                None => {
                    fragments.map.remove(&name);
                }
            }
        }
    }

    fn assemble(
        &self,
        fragments: &mut Fragments,
        version: u64,
        versions_delta: i64,
        hashcode: &str,
        keep_text: bool,
    ) -> Payload {
        let format = self.format;
        let head = codec::apps_head(versions_delta, hashcode, format);
        let tail = codec::apps_tail(format);
        let sep = codec::separator(format);
        let (gz, oldest) = gzip_body(fragments, &head, tail, sep);
        let identity = if keep_text {
            Some(identity_body(fragments, head, tail, sep, format))
        } else {
            for f in fragments.map.values_mut() {
                f.text = None;
            }
            None
        };
        let n = fragments.map.len();
        let gzip_form = OnceLock::new();
        let _ = gzip_form.set(Bytes::from(gz));
        let identity_form = OnceLock::new();
        if let Some(p) = identity {
            let _ = identity_form.set(p);
        }
        Payload {
            version,
            oldest: if n == 0 { Instant::now() } else { oldest },
            empty: false,
            identity: identity_form,
            gzip: gzip_form,
            identity_wanted: Some((self.identity_wanted.clone(), self.epoch)),
        }
    }
}

/// The gzip form of a payload: a header, the head as a stored block, each fragment's deflated
/// piece (with the separator in its closing block), the tail, and a trailer whose CRC-32 is
/// combined from the pieces' own. Also the time the oldest fragment was encoded.
fn gzip_body(fragments: &Fragments, head: &[u8], tail: &[u8], sep: &[u8]) -> (Vec<u8>, Instant) {
    let sep_block = separator_block(sep);
    let head_piece = gzip::stored(head);
    let tail_piece = gzip::stored(tail);
    let n = fragments.map.len();
    let mut sum = Sum::of(head);
    let mut oldest = Instant::now();
    let mut size = gzip::HEADER.len() + head_piece.len() + tail_piece.len() + 10;
    for (i, f) in fragments.map.values().enumerate() {
        let last = i + 1 == n;
        sum = sum.then(if last { f.plain } else { f.separated });
        size += f.deflated.len() + sep_block.len();
        oldest = oldest.min(f.taken);
    }
    sum = sum.then(Sum::of(tail));

    let mut gz = Vec::with_capacity(size);
    gz.extend_from_slice(&gzip::HEADER);
    gz.extend_from_slice(&head_piece);
    for (i, f) in fragments.map.values().enumerate() {
        let last = i + 1 == n;
        if last || sep.is_empty() {
            gz.extend_from_slice(&f.deflated);
        } else {
            // The piece's closing empty stored block becomes one holding the separator.
            gz.extend_from_slice(&f.deflated[..f.deflated.len() - gzip::SYNC_TAIL.len()]);
            gz.extend_from_slice(&sep_block);
        }
    }
    gz.extend_from_slice(&tail_piece);
    gz.extend_from_slice(&gzip::trailer(sum));
    (gz, oldest)
}

/// The uncompressed form of a payload as shared pieces: the head, each fragment's text (kept, or
/// inflated once from its piece), the last without its separator, and the tail.
fn identity_body(fragments: &mut Fragments, head: Vec<u8>, tail: &'static [u8], sep: &[u8], format: Format) -> Pieces {
    let n = fragments.map.len();
    let mut parts = Vec::with_capacity(n + 2);
    parts.push(Bytes::from(head));
    for (i, f) in fragments.map.values_mut().enumerate() {
        let text = match &f.text {
            Some(t) => t.clone(),
            None => {
                let t = f.text_or_inflate(format);
                f.text = Some(t.clone());
                t
            }
        };
        if i + 1 == n {
            parts.push(text.slice(..text.len() - sep.len()));
        } else {
            parts.push(text);
        }
    }
    parts.push(Bytes::from_static(tail));
    Pieces::new(parts)
}

/// The bytes that turn a piece's closing empty stored block (`00 00 ff ff`) into one holding
/// `sep`: its length, the length's complement, and `sep`.
fn separator_block(sep: &[u8]) -> Vec<u8> {
    if sep.is_empty() {
        return gzip::SYNC_TAIL.to_vec();
    }
    let len = sep.len() as u16;
    let mut b = Vec::with_capacity(4 + sep.len());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&(!len).to_le_bytes());
    b.extend_from_slice(sep);
    b
}

/// The applications whose fragments are due for a refresh, oldest first, up to the budget
/// (at least one).
fn aged(fragments: &Fragments, tuning: &Tuning) -> Vec<Arc<str>> {
    let now = Instant::now();
    let mut due: Vec<(Instant, &Arc<str>, usize)> = fragments
        .map
        .iter()
        .filter(|(_, f)| now.duration_since(f.taken) >= tuning.refresh_after)
        .map(|(n, f)| (f.taken, n, f.instances))
        .collect();
    if due.is_empty() {
        return Vec::new();
    }
    due.sort_by_key(|(t, _, _)| *t);
    let mut budget = tuning.refresh_budget;
    let mut out = Vec::new();
    for (_, name, instances) in due {
        if !out.is_empty() && instances > budget {
            break;
        }
        budget = budget.saturating_sub(instances);
        out.push(name.clone());
    }
    out
}

#[cfg(test)]
mod tests {
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
            i.instance_id = Some(id.to_string());
            i.vip_address = Some(app.to_ascii_lowercase());
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
                String::from_utf8_lossy(&gunzip(&p.gzip_ready().unwrap())),
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
        let (full_before, delta_before) = (before(&full), before(&delta));
        s.set_status("APP-007", "app-7-1", Status::Down, T0 + 2_000);
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
        assert_eq!(
            String::from_utf8(gunzip(&p.gzip_ready().unwrap())).unwrap(),
            String::from_utf8(s.expected(Kind::Full, Format::Json)).unwrap()
        );
        delta.build_now(&s).unwrap();
        assert_eq!(changed(&delta, &delta_before), 1, "one fragment of the delta");
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
}
