//! The response cache: each payload (full registry, delta, one app, one VIP) is encoded once per
//! registry version and format, gzipped at most once, and served to every reader as shared bytes.
//!
//! Readers check the registry version (an atomic) and take the cached bytes without touching the
//! registry lock. On a miss, one reader encodes (outside the registry lock: it snapshots, releases,
//! then encodes) while the others for the same slot wait for that result. A payload labelled with
//! version `v` is never older than `v`, so a write is visible to the next read.

use std::{
    collections::HashMap,
    io::Write,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use crate::codec::Format;

/// What a payload is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Full,
    Delta,
    App(String),
    Vip(String),
    Svip(String),
}

/// Encoded bytes, with their gzip form computed on first demand.
#[derive(Debug)]
pub struct Payload {
    pub body: Bytes,
    gzip: OnceLock<Bytes>,
    /// An empty payload stands for "nothing there" (an unknown app: 404).
    pub empty: bool,
}

impl Payload {
    pub fn new(body: Vec<u8>) -> Payload {
        Payload {
            empty: body.is_empty(),
            body: Bytes::from(body),
            gzip: OnceLock::new(),
        }
    }

    /// The gzip body if it has been compressed already.
    pub fn gzip_ready(&self) -> Option<Bytes> {
        self.gzip.get().cloned()
    }

    /// The gzip-compressed body, compressed once (CPU-heavy: call it off the async workers).
    pub fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| {
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(self.body.len() / 4 + 64),
                    // Compressed once per version, off the request threads. Level 4: on a
                    // 2000-instance registry (1.9 MB of JSON) it is within 2 % of the default
                    // level's size in half the time (5 ms against 12), and smaller than Java's.
                    flate2::Compression::new(4),
                );
                // Writing into a Vec cannot fail.
                let _ = enc.write_all(&self.body);
                Bytes::from(enc.finish().unwrap_or_default())
            })
            .clone()
    }
}

type Cell = Arc<OnceCell<Arc<Payload>>>;

/// A cached payload: the registry version it was made at, when, and the payload (once encoded).
type Slot = (u64, Instant, Cell);

/// An application's encoding: the version of the application's last change, when, and the bytes.
type Fragment = (u64, Instant, Bytes);

/// How long a payload is reused while nothing changes, so that the lease timestamps in it are
/// refreshed now and then (Java's `responseCacheAutoExpirationInSeconds`).
pub const MAX_AGE: Duration = Duration::from_secs(180);

/// How long an application's encoding is reused while the application does not change: lease
/// timestamps in a full fetch are at most this old (Java's read-only cache refreshes every 30 s).
pub const FRAGMENT_MAX_AGE: Duration = Duration::from_secs(30);

/// Entries kept before the cache is cleared (Java's `initialCapacityOfResponseCache`).
const MAX_ENTRIES: usize = 1000;

#[derive(Default)]
pub struct ResponseCache {
    slots: Mutex<HashMap<(Key, Format), Slot>>,
}

impl ResponseCache {
    pub fn new() -> ResponseCache {
        ResponseCache::default()
    }

    /// The payload for `key`/`format` at registry `version`, encoding it with `encode` (on a
    /// blocking thread) if no reader has yet.
    pub async fn get<F>(&self, key: Key, format: Format, version: u64, encode: F) -> Arc<Payload>
    where
        F: FnOnce() -> Vec<u8> + Send + 'static,
    {
        let cell = {
            let mut slots = self.slots.lock();
            match slots.get(&(key.clone(), format)) {
                Some((v, at, cell)) if *v >= version && at.elapsed() < MAX_AGE => cell.clone(),
                _ => {
                    if slots.len() >= MAX_ENTRIES {
                        // Many application or VIP names (any client can ask for any): start
                        // those over, but keep the registry-wide payloads everyone fetches.
                        slots.retain(|(k, _), _| matches!(k, Key::Full | Key::Delta));
                    }
                    let cell: Cell = Arc::new(OnceCell::new());
                    slots.insert((key, format), (version, Instant::now(), cell.clone()));
                    cell
                }
            }
        };
        cell.get_or_init(|| async move {
            let body = tokio::task::spawn_blocking(encode).await.unwrap_or_default();
            Arc::new(Payload::new(body))
        })
        .await
        .clone()
    }

    pub fn len(&self) -> usize {
        self.slots.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Each application's encoding inside `applications` documents, per format, with the registry
/// version of the application's last change: a full fetch after a write re-encodes only the
/// applications that changed.
#[derive(Default)]
pub struct Fragments {
    map: Mutex<HashMap<(String, Format), Fragment>>,
}

impl Fragments {
    /// The versions of the current (not too old) encodings.
    pub fn versions(&self, format: Format) -> HashMap<String, u64> {
        self.map
            .lock()
            .iter()
            .filter(|((_, f), (_, at, _))| *f == format && at.elapsed() < FRAGMENT_MAX_AGE)
            .map(|((app, _), (v, _, _))| (app.clone(), *v))
            .collect()
    }

    /// Stores an encoding unless a newer one is there.
    pub fn put(&self, app: String, format: Format, version: u64, bytes: Bytes) {
        let mut map = self.map.lock();
        match map.get(&(app.clone(), format)) {
            Some((v, _, _)) if *v > version => {}
            _ => {
                map.insert((app, format), (version, Instant::now(), bytes));
            }
        }
    }

    /// The encodings of `apps` (name, version) in order, dropping those of applications that are
    /// gone; `None` if one is missing or of another version (a concurrent encoder moved on).
    pub fn collect(&self, apps: &[(String, u64)], format: Format) -> Option<Vec<Bytes>> {
        let mut map = self.map.lock();
        if map.len() > apps.len() * 2 + 16 {
            let keep: std::collections::HashSet<&str> = apps.iter().map(|(a, _)| a.as_str()).collect();
            map.retain(|(app, _), _| keep.contains(app.as_str()));
        }
        apps.iter()
            .map(|(app, v)| match map.get(&(app.clone(), format)) {
                Some((fv, _, bytes)) if fv == v => Some(bytes.clone()),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn encodes_once_per_version_and_format() {
        let cache = ResponseCache::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let enc = |calls: Arc<AtomicUsize>, s: &'static str| {
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
                s.as_bytes().to_vec()
            }
        };
        let mut readers = Vec::new();
        for _ in 0..16 {
            let c = calls.clone();
            let cache = &cache;
            readers.push(async move { cache.get(Key::Full, Format::Json, 1, enc(c, "v1")).await });
        }
        let all = futures::future::join_all(readers).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(all.iter().all(|p| Arc::ptr_eq(p, &all[0])));
        let xml = cache.get(Key::Full, Format::Xml, 1, enc(calls.clone(), "x")).await;
        assert_eq!(&xml.body[..], b"x");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let v2 = cache.get(Key::Full, Format::Json, 2, enc(calls.clone(), "v2")).await;
        assert_eq!(&v2.body[..], b"v2");
        // An older version never replaces a newer payload.
        let again = cache.get(Key::Full, Format::Json, 1, enc(calls.clone(), "old")).await;
        assert_eq!(&again.body[..], b"v2");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn fragments_are_reused_until_their_application_changes() {
        let f = Fragments::default();
        f.put("A".into(), Format::Json, 3, Bytes::from_static(b"a3"));
        f.put("B".into(), Format::Json, 5, Bytes::from_static(b"b5"));
        f.put("A".into(), Format::Json, 2, Bytes::from_static(b"old"));
        assert_eq!(
            f.versions(Format::Json).get("A"),
            Some(&3),
            "an older encoding never replaces a newer one"
        );
        assert!(f.versions(Format::Xml).is_empty());
        let got = f.collect(&[("A".into(), 3), ("B".into(), 5)], Format::Json).unwrap();
        assert_eq!(got, vec![Bytes::from_static(b"a3"), Bytes::from_static(b"b5")]);
        assert!(f.collect(&[("A".into(), 4)], Format::Json).is_none());
    }

    #[test]
    fn gzip_is_computed_once_and_decodes_back() {
        let p = Payload::new(b"hello hello hello hello".to_vec());
        let a = p.gzip();
        let b = p.gzip();
        assert_eq!(a.as_ptr(), b.as_ptr());
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&a[..]), &mut out).unwrap();
        assert_eq!(out, "hello hello hello hello");
        assert!(Payload::new(Vec::new()).empty);
    }

    #[tokio::test]
    async fn many_application_names_do_not_push_out_the_full_registry() {
        let cache = ResponseCache::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let full = |calls: Arc<AtomicUsize>| {
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
                b"full".to_vec()
            }
        };
        cache.get(Key::Full, Format::Json, 1, full(calls.clone())).await;
        for i in 0..MAX_ENTRIES + 10 {
            cache.get(Key::App(format!("APP-{i}")), Format::Json, 1, Vec::new).await;
        }
        assert!(cache.len() < MAX_ENTRIES);
        cache.get(Key::Full, Format::Json, 1, full(calls.clone())).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the full payload was kept");
    }
}
