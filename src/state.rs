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

use crate::{
    cache::{
        Payload, PayloadKey, ResponseCache,
        assembly::{Assembly, Kind, Source, Tuning},
    },
    codec::{self, Format},
    registry::{Command, Outcome, Registry},
};

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
        self.inner.version.store(registry.version(), Ordering::Release);
        result
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
                            PayloadKey::Vip(vip) => {
                                codec::encode_apps(&state.with_registry(|r, _| r.vip_view(&vip, false)), format)
                            }
                            PayloadKey::Svip(vip) => {
                                codec::encode_apps(&state.with_registry(|r, _| r.vip_view(&vip, true)), format)
                            }
                            PayloadKey::Full | PayloadKey::Delta => Vec::new(),
                        }
                    })
                    .await
            }
        }
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

impl Source for AppState {
    fn read<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        self.with_registry(|r, _| f(r))
    }
}
