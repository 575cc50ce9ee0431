//! The response cache: what readers are served. The full registry and the delta are assembled
//! from per-application fragments ([`assembly`]), so a write costs the re-encoding of what it
//! changed; a single application or VIP is encoded whole once per registry version and format
//! ([`ResponseCache`]). Either way readers share the bytes, take them without the registry
//! lock, and get a payload labelled with a version at least the one they saw, so a write is
//! visible to the next read.

pub mod assembly;
pub mod gzip;

use std::{
    collections::HashMap,
    io::Write,
    pin::Pin,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use crate::codec::Format;

/// What a payload is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PayloadKey {
    Full,
    Delta,
    App(String),
    Vip(String),
    Svip(String),
}

/// A body made of shared pieces, served one after the other without being joined.
#[derive(Clone, Debug, Default)]
pub struct Pieces {
    parts: Arc<[Bytes]>,
    len: u64,
}

impl Pieces {
    pub fn new(parts: Vec<Bytes>) -> Pieces {
        let len = parts.iter().map(|b| b.len() as u64).sum();
        Pieces {
            parts: parts.into(),
            len,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces joined (a copy; for tests and small payloads).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len as usize);
        for p in self.parts.iter() {
            out.extend_from_slice(p);
        }
        out
    }

    /// An HTTP body sending the pieces in order, with their exact length.
    pub fn body(&self) -> PiecesBody {
        PiecesBody {
            parts: self.parts.clone(),
            next: 0,
            remaining: self.len,
        }
    }
}

/// See [`Pieces::body`].
pub struct PiecesBody {
    parts: Arc<[Bytes]>,
    next: usize,
    remaining: u64,
}

impl Body for PiecesBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        while let Some(part) = self.parts.get(self.next).cloned() {
            self.next += 1;
            if !part.is_empty() {
                self.remaining -= part.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(part))));
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// An encoded document in its identity and gzip forms; each is made on first demand if the
/// payload was not built with it.
#[derive(Debug)]
pub struct Payload {
    /// The registry version it shows.
    pub version: u64,
    /// When the oldest view in it was taken.
    pub oldest: Instant,
    /// An empty payload stands for "nothing there" (an unknown app: 404).
    pub empty: bool,
    identity: OnceLock<Pieces>,
    gzip: OnceLock<Pieces>,
    /// Where a reader of the identity form says so (the builder then keeps it), and its epoch.
    identity_wanted: Option<(Arc<AtomicU64>, Instant)>,
}

impl Payload {
    pub fn new(body: Vec<u8>) -> Payload {
        let identity = OnceLock::new();
        let empty = body.is_empty();
        let _ = identity.set(Pieces::new(vec![Bytes::from(body)]));
        Payload {
            version: 0,
            oldest: Instant::now(),
            empty,
            identity,
            gzip: OnceLock::new(),
            identity_wanted: None,
        }
    }

    /// Tells the builder that readers want the identity form (it then keeps it).
    fn want_identity(&self) {
        if let Some((wanted, epoch)) = &self.identity_wanted {
            wanted.store((epoch.elapsed().as_millis() as u64).max(1), Ordering::Relaxed);
        }
    }

    /// The identity form if it is there already.
    pub fn identity_ready(&self) -> Option<Pieces> {
        self.want_identity();
        self.identity.get().cloned()
    }

    /// The identity form, inflated from the gzip form if the payload was built without it
    /// (CPU-heavy then: call it off the async workers).
    pub fn identity(&self) -> Pieces {
        self.want_identity();
        self.identity
            .get_or_init(|| {
                let gz = self.gzip.get().map(Pieces::to_vec).unwrap_or_default();
                let mut out = Vec::new();
                // Our own gzip member: it decodes.
                let _ = std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out);
                Pieces::new(vec![Bytes::from(out)])
            })
            .clone()
    }

    /// The gzip body if it has been compressed already.
    pub fn gzip_ready(&self) -> Option<Pieces> {
        self.gzip.get().cloned()
    }

    /// The gzip-compressed body, compressed once (CPU-heavy: call it off the async workers).
    pub fn gzip(&self) -> Pieces {
        self.gzip
            .get_or_init(|| {
                let identity = self.identity.get().cloned().unwrap_or_default();
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(identity.len() as usize / 4 + 64),
                    flate2::Compression::new(4),
                );
                for part in identity.parts.iter() {
                    // Writing into a Vec cannot fail.
                    let _ = enc.write_all(part);
                }
                Pieces::new(vec![Bytes::from(enc.finish().unwrap_or_default())])
            })
            .clone()
    }
}

type Cell = Arc<OnceCell<Arc<Payload>>>;

/// A cached payload: the registry version it was made at, when, and the payload (once encoded).
type Slot = (u64, Instant, Cell);

/// How long a payload is reused while nothing changes, so that the lease timestamps in it are
/// refreshed now and then (Java's `responseCacheAutoExpirationInSeconds`).
pub const MAX_AGE: Duration = Duration::from_secs(180);

/// Entries kept before the cache is cleared (Java's `initialCapacityOfResponseCache`).
const MAX_ENTRIES: usize = 1000;

/// Single applications and VIPs, encoded whole once per registry version and format.
#[derive(Default)]
pub struct ResponseCache {
    slots: Mutex<HashMap<(PayloadKey, Format), Slot>>,
}

impl ResponseCache {
    pub fn new() -> ResponseCache {
        ResponseCache::default()
    }

    /// The payload for `key`/`format` at registry `version`, encoding it with `encode` (on a
    /// blocking thread) if no reader has yet.
    pub async fn get<F>(&self, key: PayloadKey, format: Format, version: u64, encode: F) -> Arc<Payload>
    where
        F: FnOnce() -> Vec<u8> + Send + 'static,
    {
        let cell = {
            let mut slots = self.slots.lock();
            match slots.get(&(key.clone(), format)) {
                Some((v, at, cell)) if *v >= version && at.elapsed() < MAX_AGE => cell.clone(),
                _ => {
                    if slots.len() >= MAX_ENTRIES {
                        // Many application or VIP names (any client can ask for any): start over.
                        slots.clear();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

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
        let key = || PayloadKey::App("A".into());
        let mut readers = Vec::new();
        for _ in 0..16 {
            let c = calls.clone();
            let cache = &cache;
            readers.push(async move { cache.get(key(), Format::Json, 1, enc(c, "v1")).await });
        }
        let all = futures::future::join_all(readers).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(all.iter().all(|p| Arc::ptr_eq(p, &all[0])));
        let xml = cache.get(key(), Format::Xml, 1, enc(calls.clone(), "x")).await;
        assert_eq!(xml.identity().to_vec(), b"x");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let v2 = cache.get(key(), Format::Json, 2, enc(calls.clone(), "v2")).await;
        assert_eq!(v2.identity().to_vec(), b"v2");
        // An older version never replaces a newer payload.
        let again = cache.get(key(), Format::Json, 1, enc(calls.clone(), "old")).await;
        assert_eq!(again.identity().to_vec(), b"v2");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn gzip_is_computed_once_and_decodes_back() {
        let p = Payload::new(b"hello hello hello hello".to_vec());
        let (a, b) = (p.gzip(), p.gzip());
        assert!(Arc::ptr_eq(&a.parts, &b.parts), "compressed once");
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&a.to_vec()[..]), &mut out).unwrap();
        assert_eq!(out, "hello hello hello hello");
        assert!(Payload::new(Vec::new()).empty);
    }

    #[tokio::test]
    async fn many_names_start_the_cache_over() {
        let cache = ResponseCache::new();
        for i in 0..MAX_ENTRIES + 10 {
            cache
                .get(PayloadKey::App(format!("APP-{i}")), Format::Json, 1, Vec::new)
                .await;
        }
        assert!(cache.len() < MAX_ENTRIES);
    }

    #[tokio::test]
    async fn pieces_are_sent_in_order_with_their_length() {
        use http_body_util::BodyExt;
        let pieces = Pieces::new(vec![
            Bytes::from_static(b"ab"),
            Bytes::new(),
            Bytes::from_static(b"cde"),
        ]);
        let body = pieces.body();
        assert_eq!(body.size_hint().exact(), Some(5));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"abcde");
        assert_eq!(pieces.to_vec(), b"abcde");
    }
}
