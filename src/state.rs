//! The shared application state: the registry behind one short-held lock, the clock, the
//! response cache, and the listeners that consume every write's [`Outcome`] (replication, the
//! controller's override persistence).
//!
//! The registry sits behind a `parking_lot::Mutex`, not an async lock: every critical section is a
//! few map operations or an `Arc`-cloning snapshot, never held across an `.await`, so a blocking
//! lock is both cheaper and safe. Its version is mirrored in an atomic so readers of cached
//! payloads never take the lock.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
};

use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::{
    cache::{
        Payload, PayloadKey, ResponseCache,
        assembly::{Assembly, Kind, Source, Tuning},
    },
    codec::{self, Format},
    registry::{Command, Outcome, Registry, view::AppView},
};

/// Applications one registry lock covers in [`AppState::app_views_batched`].
pub const VIEW_BATCH_APPS: usize = 64;

/// Wall-clock milliseconds, injectable for tests.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// Something that acts on every write's outcome. Listeners are called with the registry locked,
/// so they see outcomes in the order the registry made them; they must only enqueue or signal,
/// never touch the registry (`AppState`) themselves.
pub trait OutcomeListener: Send + Sync + 'static {
    fn on_outcome(&self, outcome: &Outcome);
}

struct Inner {
    registry: Mutex<Registry>,
    version: AtomicU64,
    /// The version again, for the tasks that build payloads ahead of their readers.
    versions: watch::Sender<u64>,
    cache: ResponseCache,
    /// The full registry and the delta, in JSON and XML.
    assembled: [Arc<Assembly>; 4],
    clock: Arc<dyn Clock>,
    listeners: RwLock<Vec<Arc<dyn OutcomeListener>>>,
    registry_ready: AtomicBool,
    /// Until when fetches are refused after an empty start (`i64::MIN`: never), mirrored from
    /// the registry when it opens for traffic, so reads do not take the lock to ask.
    reads_refused_until: AtomicI64,
    disable_delta: bool,
}

/// Cheap to clone; shared by every handler and task.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl AppState {
    pub fn new(registry: Registry, clock: Arc<dyn Clock>, disable_delta: bool, tuning: Tuning) -> AppState {
        let version = registry.version();
        AppState {
            inner: Arc::new(Inner {
                registry: Mutex::new(registry),
                version: AtomicU64::new(version),
                versions: watch::Sender::new(version),
                cache: ResponseCache::new(),
                assembled: [
                    (Kind::Full, Format::Json),
                    (Kind::Full, Format::Xml),
                    (Kind::Delta, Format::Json),
                    (Kind::Delta, Format::Xml),
                ]
                .map(|(kind, format)| Arc::new(Assembly::new(kind, format, tuning))),
                clock,
                listeners: RwLock::new(Vec::new()),
                registry_ready: AtomicBool::new(false),
                reads_refused_until: AtomicI64::new(i64::MIN),
                disable_delta,
            }),
        }
    }

    pub fn now(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    pub fn add_listener(&self, listener: Arc<dyn OutcomeListener>) {
        self.inner.listeners.write().push(listener);
    }

    /// Applies a write and hands its outcome to every listener.
    pub fn apply(&self, command: Command) -> Outcome {
        self.with_registry(|r, now| {
            let outcome = r.apply(command, now);
            self.notify(&outcome);
            outcome
        })
    }

    /// Tells every listener; called with the registry locked (see [`OutcomeListener`]).
    fn notify(&self, outcome: &Outcome) {
        for listener in self.inner.listeners.read().iter() {
            listener.on_outcome(outcome);
        }
    }

    /// Runs `f` with the registry locked and the current time. Keep `f` short.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry, i64) -> R) -> R {
        let now = self.now();
        let mut registry = self.inner.registry.lock();
        let result = f(&mut registry, now);
        let version = registry.version();
        // Only a write moves it (under this lock); a heartbeat leaves the atomic untouched.
        let moved = self.inner.version.load(Ordering::Relaxed) != version;
        if moved {
            self.inner.version.store(version, Ordering::Release);
        }
        drop(registry);
        if moved {
            // Outside the lock; writers racing here leave the highest version.
            self.inner.versions.send_if_modified(|v| {
                let newer = version > *v;
                if newer {
                    *v = version;
                }
                newer
            });
        }
        result
    }

    /// Builds the full registry and the delta again as the registry changes, each while its
    /// readers keep fetching it ([`Assembly::build_ahead`]); runs as long as the state lives.
    pub async fn build_payloads_ahead(&self) {
        let builders = self
            .inner
            .assembled
            .iter()
            .map(|a| a.clone().build_ahead(self.clone(), self.versions()));
        futures::future::join_all(builders).await;
    }

    /// The registry's version, changed after each write that moved it.
    pub fn versions(&self) -> watch::Receiver<u64> {
        self.inner.versions.subscribe()
    }

    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    pub fn disable_delta(&self) -> bool {
        self.inner.disable_delta
    }

    /// The full registry or the delta in `format`, as assembled from per-application fragments.
    pub fn assembled(&self, kind: Kind, format: Format) -> &Arc<Assembly> {
        let i = match (kind, format) {
            (Kind::Full, Format::Json) => 0,
            (Kind::Full, Format::Xml) => 1,
            (Kind::Delta, Format::Json) => 2,
            (Kind::Delta, Format::Xml) => 3,
        };
        &self.inner.assembled[i]
    }

    /// The encoded payload for `key` at the current registry version or newer: the full
    /// registry and the delta from their assemblies, others from the cache or encoded now
    /// (once per version).
    pub async fn payload(&self, key: PayloadKey, format: Format) -> Arc<Payload> {
        let version = self.version();
        match key {
            PayloadKey::Full => self.assembled(Kind::Full, format).get(self, version).await,
            PayloadKey::Delta => self.assembled(Kind::Delta, format).get(self, version).await,
            key => {
                let state = self.clone();
                let k = key.clone();
                self.inner
                    .cache
                    .get(key, format, version, move || {
                        // Snapshot under the lock (Arc clones), encode after releasing it.
                        match k {
                            PayloadKey::App(app) => match state.with_registry(|r, _| r.app_view(&app)) {
                                Some(view) => codec::encode_app(&view, format),
                                None => Vec::new(),
                            },
                            PayloadKey::Vip(vip) => codec::encode_apps(&state.vip_view_batched(&vip, false), format),
                            PayloadKey::Svip(vip) => codec::encode_apps(&state.vip_view_batched(&vip, true), format),
                            PayloadKey::Full | PayloadKey::Delta => Vec::new(),
                        }
                    })
                    .await
            }
        }
    }

    /// Every application's view in name order, taken [`VIEW_BATCH_APPS`] applications per
    /// registry lock with a yield between batches: for readers that walk the whole registry but
    /// need no single moment across applications (the dashboard, anti-entropy), so that they
    /// hold neither the lock nor a runtime worker for the whole walk (one full view is about
    /// 80 ms of lock at 100,000 instances). Each application is consistent in itself.
    pub async fn app_views_batched(&self) -> Vec<AppView> {
        let names = self.with_registry(|r, _| r.app_versions());
        let mut apps = Vec::with_capacity(names.len());
        for batch in names.chunks(VIEW_BATCH_APPS) {
            self.with_registry(|r, _| apps.extend(batch.iter().filter_map(|(name, _)| r.app_view(name))));
            tokio::task::yield_now().await;
        }
        apps.retain(|a| !a.instances.is_empty());
        apps
    }

    /// `GET vips/{vip}` (or `svips/`), taken [`VIEW_BATCH_APPS`] applications per registry lock:
    /// finding a VIP's instances walks every instance, and the document needs no single moment
    /// across applications (its hash code is of the instances it lists). Called off the runtime
    /// (the cache encodes on a blocking thread), so it does not yield.
    fn vip_view_batched(&self, vip: &str, secure: bool) -> crate::registry::view::AppsView {
        let names = self.with_registry(|r, _| r.app_versions());
        let mut apps = Vec::new();
        for batch in names.chunks(VIEW_BATCH_APPS) {
            self.with_registry(|r, _| {
                apps.extend(batch.iter().filter_map(|(name, _)| r.vip_app_view(name, vip, secure)))
            });
        }
        crate::registry::view::AppsView::of_vip(apps)
    }

    /// One eviction run; its cancels go to the listeners. Returns how many were evicted.
    pub fn evict(&self, seed: u64) -> usize {
        self.with_registry(|r, now| {
            let records = r.evict(now, seed);
            let n = records.len();
            if n > 0 {
                let outcome = Outcome {
                    reply: crate::registry::Reply::Ok,
                    replicate: records,
                    pod_override: None,
                };
                self.notify(&outcome);
            }
            n
        })
    }

    /// Whether the registry has been filled from peers (or found none) and serves traffic.
    pub fn registry_ready(&self) -> bool {
        self.inner.registry_ready.load(Ordering::Acquire)
    }

    /// Opens the registry for traffic with the count of instances found at start.
    pub fn open_for_traffic(&self, count: i64) {
        let refused_until = self.with_registry(|r, now| {
            r.open_for_traffic(count, now);
            r.reads_refused_until()
        });
        self.inner
            .reads_refused_until
            .store(refused_until.unwrap_or(i64::MIN), Ordering::Release);
        self.inner.registry_ready.store(true, Ordering::Release);
    }

    /// Whether fetches are allowed now (Java's `shouldAllowAccess`), without the registry lock.
    pub fn allow_access(&self) -> bool {
        self.now() > self.inner.reads_refused_until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
impl AppState {
    /// A state on the system clock with the default registry, open for traffic.
    pub fn open_for_tests() -> AppState {
        let state = AppState::new(
            Registry::new(crate::registry::RegistryConfig::default(), SystemClock.now_ms()),
            Arc::new(SystemClock),
            false,
            Default::default(),
        );
        state.open_for_traffic(0);
        state
    }
}

impl Source for AppState {
    fn read<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        self.with_registry(|r, _| f(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Writer, instance::InstanceInfo};

    /// A write that moves the registry's version wakes the builders, a heartbeat does not; a
    /// payload read before the write is then built ahead of its next reader.
    #[tokio::test]
    async fn writes_wake_the_builders_ahead_and_heartbeats_do_not() {
        let state = AppState::open_for_tests();
        let mut versions = state.versions();
        let mut info = InstanceInfo::new("APP", "app-1.example", "10.0.0.1", state.now());
        info.instance_id = Some("app-1".into());
        state.apply(Command::Register {
            info,
            writer: Writer::Client,
        });
        assert!(versions.has_changed().unwrap());
        assert_eq!(*versions.borrow_and_update(), state.version());
        let builders = tokio::spawn({
            let state = state.clone();
            async move { state.build_payloads_ahead().await }
        });
        let read = state.payload(PayloadKey::Delta, Format::Json).await;
        assert_eq!(read.version, state.version());
        state.apply(Command::Renew {
            app: "APP".into(),
            id: "app-1".into(),
            last_dirty_timestamp: None,
            overridden_status: None,
            writer: Writer::Client,
        });
        assert!(!versions.has_changed().unwrap(), "a heartbeat changes no payload");
        state.apply(Command::Cancel {
            app: "APP".into(),
            id: "app-1".into(),
            writer: Writer::Client,
        });
        assert!(versions.has_changed().unwrap());
        let delta = state.assembled(Kind::Delta, Format::Json);
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while delta.builds_ahead() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the delta read before the cancel is built again without a reader");
        let full = state.assembled(Kind::Full, Format::Json);
        assert_eq!(full.builds_ahead(), 0, "never read: built by its first reader only");
        let p = state.payload(PayloadKey::Delta, Format::Json).await;
        assert_eq!(p.version, state.version());
        builders.abort();
    }

    /// Whole-registry readers that take applications batch by batch see what one full view shows:
    /// every application with instances, in name order, none twice, none lost at a batch's edge.
    #[tokio::test]
    async fn batched_views_equal_the_full_view() {
        let state = AppState::open_for_tests();
        let register = |app: &str, id: &str| {
            let mut info = InstanceInfo::new(app, &format!("{id}.example"), "10.0.0.1", state.now());
            info.instance_id = Some(id.into());
            // Every other application's instances under one VIP.
            if app.ends_with(['0', '2', '4', '6', '8']) {
                info.vip_address = Some("shared".into());
            }
            state.apply(Command::Register {
                info,
                writer: Writer::Client,
            });
        };
        // Two and a half batches, one application emptied in the middle.
        let apps = VIEW_BATCH_APPS * 2 + VIEW_BATCH_APPS / 2;
        for a in 0..apps {
            for i in 0..(a % 3 + 1) {
                register(&format!("APP-{a:04}"), &format!("i-{a}-{i}"));
            }
        }
        state.apply(Command::Cancel {
            app: "APP-0069".into(),
            id: "i-69-0".into(),
            writer: Writer::Client,
        });
        let batched = state.app_views_batched().await;
        let vip = state.vip_view_batched("shared", false);
        assert_eq!(vip.apps.len(), apps / 2, "the VIP's applications, across every batch");
        assert_eq!(vip, state.with_registry(|r, _| r.vip_view("shared", false)));
        let full = state.with_registry(|r, _| r.full_view()).apps;
        assert_eq!(batched.len(), apps - 1, "the emptied application is left out");
        let names = |v: &[AppView]| v.iter().map(|a| a.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&batched), names(&full));
        for (b, f) in batched.iter().zip(&full) {
            let ids = |a: &AppView| a.instances.iter().map(|i| i.id().to_string()).collect::<Vec<_>>();
            assert_eq!(ids(b), ids(f), "{}", b.name);
        }
    }
}
