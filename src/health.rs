//! What `/livez` and `/readyz` report, and whether the registry may answer fetches.
//!
//! * **Completeness**: named conditions that must all hold before this replica's registry holds
//!   everything its peers and its Kubernetes watches already hold (the start-up sync from peers,
//!   every watch listed, every EurekaApp reconciled once). Until then fetches are answered
//!   `503 Service Unavailable` (Eureka clients then try their next server) and `/readyz` fails.
//!   Completeness is reached once and kept: later outages (a peer, the apiserver) leave the
//!   replica serving what it has.
//! * **Warnings**: problems that do not make the registry incomplete but need an operator's eye,
//!   such as a peer refusing our credentials. `/readyz` lists them and stays green.
//! * **Liveness**: `false` once a supervised task failed (the process is about to exit).
//! * **Stopping**: set when the process is asked to stop. `/readyz` fails from then on, so the
//!   replica leaves its Service's endpoints while it still serves (the shutdown delay), and
//!   responses carry `Connection: close` so that clients reconnect elsewhere.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use parking_lot::RwLock;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};

/// A header on the 503 that refuses a fetch while the registry is not complete, so a replica's
/// start-up sync can tell a peer that is starting (not a source) from one that is busy.
pub const INCOMPLETE_HEADER: &str = "x-eureka-registry-incomplete";

/// One completeness condition; cheap to clone, shared with the part that fulfils it.
#[derive(Clone, Debug)]
pub struct Condition {
    inner: Arc<ConditionState>,
    /// Set when every condition of the set is met, so reads check one atomic.
    complete: Arc<AtomicBool>,
    /// Every condition of the set, to recompute `complete`.
    all: Arc<RwLock<Vec<Arc<ConditionState>>>>,
}

#[derive(Debug)]
struct ConditionState {
    /// What it waits for, as `/readyz` names it.
    name: &'static str,
    /// Whether it holds.
    met: AtomicBool,
    /// What it is waiting for right now (`/readyz` detail).
    detail: RwLock<String>,
}

impl Condition {
    /// Marks the condition met (for good).
    pub fn met(&self) {
        if !self.inner.met.swap(true, Ordering::AcqRel) {
            tracing::info!(condition = self.inner.name, "readiness condition met");
        }
        let all_met = self.all.read().iter().all(|c| c.met.load(Ordering::Acquire));
        if all_met && !self.complete.swap(true, Ordering::AcqRel) {
            tracing::info!("the registry is complete: answering fetches and reporting ready");
        }
    }

    /// Says what the condition is waiting for (shown by `/readyz`).
    pub fn waiting(&self, detail: impl Into<String>) {
        *self.inner.detail.write() = detail.into();
    }

    pub fn is_met(&self) -> bool {
        self.inner.met.load(Ordering::Acquire)
    }
}

/// The health of the process. See the module docs.
#[derive(Debug, Default)]
pub struct Health {
    /// Every completeness condition, in the order they were added.
    conditions: Arc<RwLock<Vec<Arc<ConditionState>>>>,
    /// Whether every condition holds (kept once reached).
    complete: Arc<AtomicBool>,
    /// Current warnings by source (for example `replication http://10.0.0.7:8761/eureka/`).
    warnings: RwLock<BTreeMap<String, String>>,
    /// `false` once a supervised task failed.
    alive: Arc<AtomicBool>,
    /// `true` once the process was asked to stop.
    stopping: Arc<AtomicBool>,
}

impl Health {
    pub fn new(alive: Arc<AtomicBool>) -> Arc<Health> {
        Arc::new(Health {
            complete: Arc::new(AtomicBool::new(true)),
            alive,
            ..Health::default()
        })
    }

    /// Adds a completeness condition, not met yet. Add them all before serving.
    pub fn condition(&self, name: &'static str) -> Condition {
        let inner = Arc::new(ConditionState {
            name,
            met: AtomicBool::new(false),
            detail: RwLock::new(String::new()),
        });
        self.conditions.write().push(inner.clone());
        self.complete.store(false, Ordering::Release);
        Condition {
            inner,
            complete: self.complete.clone(),
            all: self.conditions.clone(),
        }
    }

    /// Whether the registry holds everything it should (reads are answered).
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire) || crate::mutants::on("ready-before-complete")
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Marks the process as stopping: not ready from now on.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// `true` once the process was asked to stop (shared with the HTTP listeners).
    pub fn stopping(&self) -> Arc<AtomicBool> {
        self.stopping.clone()
    }

    /// Sets or replaces the warning from `source`.
    pub fn warn(&self, source: impl Into<String>, message: impl Into<String>) {
        self.warnings.write().insert(source.into(), message.into());
    }

    /// Clears the warning from `source`, if any.
    pub fn clear(&self, source: &str) {
        if self.warnings.read().contains_key(source) {
            self.warnings.write().remove(source);
        }
    }

    pub fn warnings(&self) -> Vec<(String, String)> {
        self.warnings
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// What `/readyz` answers, without its report: alive, not stopping, every condition met.
    pub fn is_ready(&self) -> bool {
        self.is_alive() && !self.stopping.load(Ordering::Acquire) && self.is_complete()
    }

    /// The `/readyz` report: ready or not, and one line per condition and warning.
    pub fn report(&self) -> (bool, String) {
        let mut out = String::new();
        let mut ready = self.is_alive();
        if !ready {
            out.push_str("[-] process: a supervised task failed; the process is stopping\n");
        } else if self.stopping.load(Ordering::Acquire) {
            ready = false;
            out.push_str("[-] process: shutting down (still serving until the shutdown delay ends)\n");
        }
        for c in self.conditions.read().iter() {
            if c.met.load(Ordering::Acquire) || crate::mutants::on("ready-before-complete") {
                out.push_str(&format!("[+] {}: ok\n", c.name));
            } else {
                ready = false;
                let detail = c.detail.read();
                let detail = if detail.is_empty() { "waiting" } else { detail.as_str() };
                out.push_str(&format!("[-] {}: {detail}\n", c.name));
            }
        }
        for (source, message) in self.warnings.read().iter() {
            out.push_str(&format!("[!] {source}: {message}\n"));
        }
        out.push_str(if ready { "ready\n" } else { "not ready\n" });
        (ready, out)
    }
}

/// `eureka_ready`: 1 while `/readyz` passes, read at scrape time (an alert on a replica that
/// stays unready needs no kube-state-metrics).
#[derive(Debug)]
pub struct ReadyGauge(pub Arc<Health>);

impl Collector for ReadyGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let metric = encoder.encode_descriptor(
            "ready",
            "1 while /readyz passes: alive, not stopping, the registry complete",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.0.is_ready())).encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_once_every_condition_is_met_and_warnings_do_not_block() {
        let h = Health::new(Arc::new(AtomicBool::new(true)));
        assert!(h.is_complete(), "nothing to wait for");
        let sync = h.condition("registry synced from peers");
        let pods = h.condition("EurekaApps reconciled");
        assert!(!h.is_complete());
        pods.waiting("3 of 5 EurekaApps reconciled");
        sync.met();
        assert!(!h.is_complete());
        let (ready, text) = h.report();
        assert!(!ready);
        assert!(text.contains("[-] EurekaApps reconciled: 3 of 5"), "{text}");
        h.warn("replication http://a/eureka/", "401 Unauthorized: check --peer-auth-*");
        pods.met();
        assert!(h.is_complete());
        let (ready, text) = h.report();
        assert!(ready, "{text}");
        assert!(text.contains("[!] replication http://a/eureka/: 401"), "{text}");
        h.clear("replication http://a/eureka/");
        assert!(h.warnings().is_empty());
    }

    #[test]
    fn a_stopping_process_is_not_ready_but_stays_complete() {
        let h = Health::new(Arc::new(AtomicBool::new(true)));
        assert!(h.report().0);
        h.stop();
        let (ready, text) = h.report();
        assert!(!ready && text.contains("shutting down"), "{text}");
        assert!(h.is_complete(), "fetches are still answered while it stops");
        assert!(h.stopping().load(Ordering::Acquire));
    }

    #[test]
    fn a_dead_process_is_not_ready() {
        let alive = Arc::new(AtomicBool::new(true));
        let h = Health::new(alive.clone());
        alive.store(false, Ordering::Release);
        assert!(!h.report().0);
    }

    /// `eureka_ready` says what `/readyz` says: not before completeness, yes after, not once
    /// stopping.
    #[test]
    fn the_ready_gauge_follows_readyz() {
        let gauge = |h: &Arc<Health>| {
            let mut registry = prometheus_client::registry::Registry::with_prefix("eureka");
            registry.register_collector(Box::new(ReadyGauge(h.clone())));
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("eureka_ready "))
                .unwrap()
                .to_string();
            assert_eq!(h.report().0, line.ends_with(" 1"), "{line}");
            line
        };
        let h = Health::new(Arc::new(AtomicBool::new(true)));
        let sync = h.condition("registry synced from peers");
        assert_eq!(gauge(&h), "eureka_ready 0");
        sync.met();
        assert_eq!(gauge(&h), "eureka_ready 1");
        h.stop();
        assert_eq!(gauge(&h), "eureka_ready 0");
    }
}
