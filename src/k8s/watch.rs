//! One adapter from a kube-runtime watcher stream to an index, used for Pods, Nodes and the
//! replicas' EndpointSlices. kube-runtime's reflector stores whole objects; these watches keep only
//! compact projections, so the adapter projects each object as it arrives and buffers projections
//! (never objects) during a re-list.
//!
//! One call follows one stream with its own re-list buffer: with `--watch-namespaces a,b` each
//! namespace's watch re-lists on its own, and a re-list of `a` can never clear what `b` buffered.
//! A failing watch is retried by kube-runtime's backoff; every error is counted, logged, and shown
//! as a `/readyz` warning until the watch delivers again, and `eureka_watch_failing{watch}` is 1
//! meanwhile (what an alert on a stale watch reads). A stream that ends returns `Err`: the
//! supervisor stops the process rather than serve from a dead watch.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

use crate::health::Health;

/// What to do with the objects of one watched stream.
pub trait Follower<K>: Send + Sync {
    /// The compact form kept of an object.
    type Item: Send;

    /// Projects an object; `None` to ignore it.
    fn project(&self, obj: &K) -> Option<Self::Item>;

    /// An object was added or changed.
    fn applied(&self, item: Self::Item);

    /// An object was deleted (its last state).
    fn deleted(&self, obj: &K);

    /// A (re-)list completed: these are all the objects there are in the stream's scope.
    fn relisted(&self, items: Vec<Self::Item>);
}

/// The watch a `eureka_watch_failing` series is about (`Pods in ns`, `Nodes`, `EurekaApps`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabel {
    pub watch: String,
}

/// `eureka_watch_failing{watch}`: 1 while that watch fails, 0 once it delivers (every watch has
/// a series from its start). One family for every watch of the process.
pub type WatchFailing = Family<WatchLabel, Gauge>;

/// Registers [`WatchFailing`].
pub fn register_failing(failing: &WatchFailing, registry: &mut prometheus_client::registry::Registry) {
    registry.register(
        "watch_failing",
        "1 while the Kubernetes watch fails (what this replica holds from it is stale), 0 while it delivers",
        failing.clone(),
    );
}

/// Follows `stream` until it ends (which is an error: watcher streams never end on their own).
pub async fn follow<K, F>(
    what: String,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    follower: &F,
    errors: &Counter,
    failing_gauge: &WatchFailing,
    health: &Arc<Health>,
) -> anyhow::Result<()>
where
    F: Follower<K>,
{
    let source = format!("watch of {what}");
    let gauge = failing_gauge.get_or_create(&WatchLabel { watch: what.clone() }).clone();
    gauge.set(0);
    let mut buffer: Vec<F::Item> = Vec::new();
    let mut failing = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if failing && event.is_ok() {
            failing = false;
            gauge.set(0);
            health.clear(&source);
            tracing::info!(watch = %what, "the watch delivers again");
        }
        match event {
            Ok(Event::Apply(obj)) => {
                if let Some(item) = follower.project(&obj) {
                    follower.applied(item);
                }
            }
            Ok(Event::Delete(obj)) => follower.deleted(&obj),
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(obj)) => buffer.extend(follower.project(&obj)),
            Ok(Event::InitDone) => follower.relisted(std::mem::take(&mut buffer)),
            Err(e) => {
                if !failing && what.starts_with("Pods") && crate::mutants::on("lose-pods-on-apiserver-cut") {
                    follower.relisted(Vec::new());
                }
                errors.inc();
                if !failing {
                    tracing::warn!(watch = %what, error = %e, "watch failed; retrying with backoff");
                } else {
                    tracing::debug!(watch = %what, error = %e, "watch still failing");
                }
                failing = true;
                gauge.set(1);
                health.warn(source.clone(), format!("failing ({e}); retrying with backoff"));
            }
        }
    }
    anyhow::bail!("failed to keep the {what} watch running: the stream ended")
}

/// Every watch's configuration: the apiserver ends each watch request after `timeout_secs` and
/// the watcher resumes from its resourceVersion, so no request waits on the apiserver longer than
/// that while it is healthy, and the client's read timeout (`--kubernetes-read-timeout-ms`, which
/// is longer) finds a connection that died silently.
pub fn config(timeout_secs: u32) -> watcher::Config {
    watcher::Config::default().timeout(timeout_secs)
}

/// How a failing watch retries: exponential from 250 ms up to `max` (`--watch-max-backoff-ms`),
/// with ±20 % jitter so replicas do not retry in step, reset once the watch delivers. kube-runtime's
/// default follows client-go (up to 30 s); a registry must converge within seconds of an
/// apiserver coming back.
#[derive(Clone, Debug)]
pub struct Backoff {
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub const MIN: Duration = Duration::from_millis(250);

    pub fn new(max: Duration) -> Backoff {
        Backoff {
            max: max.max(Backoff::MIN),
            next: Backoff::MIN,
        }
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        // Jitter from the clock's nanoseconds: no shared RNG needed for a spread of ±20 %.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let factor = 0.8 + 0.4 * f64::from(nanos % 1000) / 1000.0;
        Some(base.mul_f64(factor))
    }
}

impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        self.next = Backoff::MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Follower<String> for Recorder {
        type Item = String;
        fn project(&self, obj: &String) -> Option<String> {
            (!obj.starts_with('-')).then(|| obj.to_uppercase())
        }
        fn applied(&self, item: String) {
            self.0.lock().push(format!("apply {item}"));
        }
        fn deleted(&self, obj: &String) {
            self.0.lock().push(format!("delete {obj}"));
        }
        fn relisted(&self, items: Vec<String>) {
            self.0.lock().push(format!("relist {}", items.join(",")));
        }
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        use kube::runtime::utils::Backoff as _;
        let mut b = Backoff::new(Duration::from_secs(2));
        let d: Vec<Duration> = (0..6).map(|_| b.next().unwrap()).collect();
        let within = |d: Duration, base: u64| {
            d >= Duration::from_millis(base * 8 / 10) && d <= Duration::from_millis(base * 12 / 10)
        };
        assert!(
            within(d[0], 250) && within(d[1], 500) && within(d[3], 2000) && within(d[5], 2000),
            "{d:?}"
        );
        b.reset();
        assert!(within(b.next().unwrap(), 250));
    }

    #[tokio::test]
    async fn relists_buffer_projections_and_errors_are_reported_until_recovery() {
        let health = Health::new(Arc::new(std::sync::atomic::AtomicBool::new(true)));
        let errors = Counter::default();
        let events: Vec<Result<Event<String>, watcher::Error>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply("a".into())),
            Ok(Event::InitApply("-ignored".into())),
            Ok(Event::InitApply("b".into())),
            Ok(Event::InitDone),
            Err(watcher::Error::NoResourceVersion),
        ];
        let r = Recorder::default();
        let failing = WatchFailing::default();
        let gauge = || {
            failing
                .get_or_create(&WatchLabel {
                    watch: "pods in a".into(),
                })
                .get()
        };
        let ended = follow(
            "pods in a".into(),
            futures::stream::iter(events),
            &r,
            &errors,
            &failing,
            &health,
        )
        .await;
        assert!(ended.unwrap_err().to_string().contains("stream ended"));
        assert_eq!(gauge(), 1, "failing when its stream ended");
        assert_eq!(*r.0.lock(), vec!["relist A,B"]);
        assert_eq!(errors.get(), 1);
        assert_eq!(health.warnings().len(), 1, "a failing watch shows in /readyz");

        let events: Vec<Result<Event<String>, watcher::Error>> = vec![
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Apply("c".into())),
            Ok(Event::Delete("c".into())),
        ];
        let r = Recorder::default();
        let _ = follow(
            "pods in a".into(),
            futures::stream::iter(events),
            &r,
            &errors,
            &failing,
            &health,
        )
        .await;
        assert_eq!(*r.0.lock(), vec!["apply C", "delete c"]);
        assert_eq!(gauge(), 0, "delivers again");
        assert!(health.warnings().is_empty(), "recovered");
    }
}
