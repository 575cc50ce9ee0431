//! The full registry and the delta, assembled from one cached fragment per application so that
//! a write costs the encoding and compression of the applications it changed, not of the whole
//! registry.
//!
//! Each fragment keeps its application's encoding compressed as a deflate piece (see
//! [`super::gzip`]), compressed after the tail of the fragment before it, with the CRC-32 of its
//! text, and the text itself only while clients that do not take gzip are fetching. A payload is
//! a new head (version and hash code), the fragments in name order and a tail: its gzip form is
//! the pieces joined in groups of up to about 256 KB (a group joined again only when one of its
//! pieces changed) with a combined CRC-32, its identity form the fragments' shared bytes;
//! both are sent as those shared parts, never copied into one buffer.
//!
//! One build at a time per payload (single flight): the builder asks the registry which
//! applications changed since the version its fragments are valid for (their views are taken
//! under the registry lock, cheap `Arc` clones), releases it, encodes those, assembles and
//! publishes. Readers take the published payload from an atomic pointer; one that needs a newer
//! version than the published one starts a build or waits for the running one to publish, and
//! never waits on a lock held while encoding. Writes that arrive during a build are picked up
//! by the next one, so under a write storm builds coalesce by themselves.
//!
//! A payload that readers fetched recently ([`Tuning::build_ahead`]) is also built ahead of
//! them: [`Assembly::build_ahead`] starts a build as soon as the registry's version moves past
//! the published one, so that the next reader usually finds the write's payload published and
//! waits for nothing. It is the same build (same single flight, same snapshot), only started by
//! the write instead of by the next reader; a reader that comes while it runs waits for it as for
//! any build, so a write is still visible to the next read. So that a write storm cannot keep a
//! thread building, builds ahead take at most half of one: after each, the next waits as long as
//! it took (readers still build on demand meanwhile).
//!
//! Lease timestamps (`leaseInfo`) in an unchanged application's fragment are those of the
//! moment its view was taken. Fragments older than [`Tuning::refresh_after`] are taken again in the
//! background, a bounded number of instances per build ([`Tuning::refresh_budget`]), so while fetches
//! keep coming they are at most about [`FRAGMENT_MAX_AGE`] old: the bound of Java's server,
//! whose read-write cache keeps an unchanged payload for `responseCacheAutoExpirationInSeconds`
//! (180 s). Refreshing sooner would re-encode the whole registry every few seconds at 50k
//! instances for timestamps no client acts on.

mod body;
mod fragments;
#[cfg(test)]
mod tests;

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

use self::{
    body::{gzip_body, identity_body},
    fragments::{Fragment, Fragments, Views, aged, chain, shared},
};
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
    /// How recently a payload must have been read to be built ahead of its readers when the
    /// registry changes (zero: only readers start builds).
    pub build_ahead: Duration,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            refresh_after: REFRESH_AFTER,
            refresh_budget: REFRESH_BUDGET,
            identity_keep: IDENTITY_KEEP,
            build_ahead: BUILD_AHEAD,
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

/// Deflate level of fragments: compressed once per change of their application. zlib-rs at 8
/// gives what miniz_oxide gave at 6 in about half the time (see [`super::gzip`]).
const LEVEL: u32 = 8;

/// The default of [`Tuning::identity_keep`].
pub const IDENTITY_KEEP: Duration = Duration::from_secs(600);

/// The default of [`Tuning::build_ahead`]: a few fetch intervals of a busy registry's clients
/// taken together (1,000 clients fetching every 30 s come about 30 ms apart).
pub const BUILD_AHEAD: Duration = Duration::from_secs(5);

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
    /// Milliseconds after `epoch` of the last reader (0: none).
    read_at: AtomicU64,
    epoch: Instant,
    builds: AtomicU64,
    builds_ahead: AtomicU64,
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
            read_at: AtomicU64::new(0),
            epoch: Instant::now(),
            builds: AtomicU64::new(0),
            builds_ahead: AtomicU64::new(0),
            tuning,
        }
    }

    /// How many builds have run (for tests and metrics).
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    /// A payload at registry version `want` or newer: the published one, or the next build's.
    pub async fn get<S: Source + Clone>(self: &Arc<Self>, source: &S, want: u64) -> Arc<Payload> {
        self.read_at.store(self.millis().max(1), Ordering::Relaxed);
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

    /// Builds the payload again whenever `versions` (the registry's version) moves past the
    /// published one while readers keep fetching it (see the module docs); runs until `versions`
    /// closes. Nothing is built before the first reader.
    pub async fn build_ahead<S: Source + Clone>(
        self: Arc<Self>,
        source: S,
        mut versions: tokio::sync::watch::Receiver<u64>,
    ) {
        loop {
            let mut done = self.done.subscribe();
            let current = *versions.borrow_and_update();
            let behind = self.published.load().as_ref().is_some_and(|p| p.version < current);
            if behind && self.read_recently() {
                if self.begin() {
                    self.builds_ahead.fetch_add(1, Ordering::Relaxed);
                    let started = Instant::now();
                    let (this, source) = (self.clone(), source.clone());
                    let _ = tokio::task::spawn_blocking(move || this.run(&source)).await;
                    tokio::time::sleep(started.elapsed()).await;
                    continue;
                }
                // A reader's build runs: it may have started before the newest write.
                tokio::select! {
                    _ = done.changed() => {}
                    changed = versions.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
                continue;
            }
            if versions.changed().await.is_err() {
                return;
            }
        }
    }

    /// Whether a reader fetched this payload within [`Tuning::build_ahead`].
    fn read_recently(&self) -> bool {
        let at = self.read_at.load(Ordering::Relaxed);
        let ahead = self.tuning.build_ahead.as_millis() as u64;
        ahead > 0 && at != 0 && self.millis() <= at + ahead
    }

    /// How many builds [`Assembly::build_ahead`] started (for tests).
    pub fn builds_ahead(&self) -> u64 {
        self.builds_ahead.load(Ordering::Relaxed)
    }

    fn millis(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
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
        at != 0 && self.millis() <= at + self.tuning.identity_keep.as_millis() as u64
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
                        self.apply(fragments, views);
                    }
                    fragments.built = version;
                    batched = true;
                }
            }
        };
        fragments.built = snapshot.version;
        self.apply(fragments, snapshot.views);
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
    fn apply(&self, fragments: &mut Fragments, views: Views) {
        let taken = Instant::now();
        for (name, view) in views {
            match view {
                Some((view, version)) => {
                    let f = Fragment::encode(&view, version, taken, self.format);
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
        chain(fragments, format, keep_text);
        let (gz, oldest) = gzip_body(fragments, &head, tail, sep);
        let identity = keep_text.then(|| identity_body(fragments, head, tail, sep, format));
        let n = fragments.map.len();
        let gzip_form = OnceLock::new();
        let _ = gzip_form.set(gz);
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
