//! Prometheus metrics: request latency per endpoint, and the registry's counters and gauges read
//! at scrape time (registrations, renewals, cancellations, evictions, renews in the last minute,
//! the threshold, self-preservation, size). Other subsystems register into the same registry,
//! under the `eureka_` prefix; the process's own figures (`process_*`, the names every Prometheus
//! client library uses) are read from `/proc` at scrape time by [`process::ProcessCollector`].

mod process;

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::ConstGauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::{registry::instance::Status, state::AppState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub endpoint: &'static str,
    /// One of the standard methods, or `OTHER` (a client's made-up method names no series).
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: &'static str,
}

/// Every metric of the process.
pub struct Metrics {
    /// The root (unprefixed: `process_*`); everything else goes in its `eureka` sub-registry.
    registry: Mutex<Registry>,
    pub http: Family<HttpLabels, Histogram>,
    /// Writes refused by a cap, by cap (`registry::limits`).
    pub limit_refusals: Family<LimitLabels, Counter>,
    /// The series of [`HEARTBEAT_OK`] in `http`, nearly every request a registry answers: taken
    /// from the family once, when first observed, so that a heartbeat does not hash its labels
    /// and lock the family's map to find it.
    heartbeat_ok: OnceLock<Histogram>,
}

/// A heartbeat answered 200: `PUT` on the `instance` endpoint.
const HEARTBEAT_OK: HttpLabels = HttpLabels {
    endpoint: "instance",
    method: "PUT",
    status: 200,
};

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("eureka");
        let http = Family::<HttpLabels, Histogram>::new_with_constructor(|| {
            // 0.1 ms to ~1.6 s.
            Histogram::new(exponential_buckets(0.000_1, 2.0, 15))
        });
        registry.register(
            "http_request_duration_seconds",
            "Eureka API request latency by endpoint",
            http.clone(),
        );
        let limit_refusals = Family::<LimitLabels, Counter>::default();
        for limit in crate::registry::limits::LimitExceeded::KINDS {
            drop(limit_refusals.get_or_create(&LimitLabels { limit }));
        }
        registry.register(
            "limit_refusals",
            "Writes refused because they exceed a cap (metadata keys, instance bytes, instances, applications, instances per application)",
            limit_refusals.clone(),
        );
        registry.register(
            "build",
            "The running version (always 1): the chart's appVersion and --version say the same",
            prometheus_client::metrics::info::Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Arc::new(Metrics {
            registry: Mutex::new(root),
            http,
            limit_refusals,
            heartbeat_ok: OnceLock::new(),
        })
    }

    /// Lets a subsystem register its metrics (named `eureka_...`).
    pub fn with_prometheus<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        f(self.registry.lock().sub_registry_with_prefix("eureka"))
    }

    /// The whole registry's `Debug` form: every registered metric, empty families too (what
    /// `docgen` lists them from).
    pub fn describe(&self) -> String {
        format!("{:?}", self.registry.lock())
    }

    /// Labels are static strings and a number, so a request's observation allocates nothing.
    pub fn observe_request(&self, endpoint: &'static str, method: &'static str, status: u16, seconds: f64) {
        let labels = HttpLabels {
            endpoint,
            method,
            status,
        };
        if labels == HEARTBEAT_OK {
            self.heartbeat_ok
                .get_or_init(|| self.http.get_or_create(&HEARTBEAT_OK).clone())
                .observe(seconds);
        } else {
            self.http.get_or_create(&labels).observe(seconds);
        }
    }

    /// Counts a write refused by a cap (`kind` from `LimitExceeded::kind`).
    pub fn limit_refused(&self, kind: &'static str) {
        self.limit_refusals.get_or_create(&LimitLabels { limit: kind }).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry.lock()).is_err() {
            out.clear();
        }
        out
    }
}

/// Reads the registry's figures at scrape time.
#[derive(Clone)]
pub struct RegistryCollector(pub AppState);

impl std::fmt::Debug for RegistryCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryCollector")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OriginLabel {
    origin: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

fn counter(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
    ConstCounter::new(v).encode(metric)
}

fn gauge(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
    ConstGauge::new(v).encode(metric)
}

impl Collector for RegistryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self.0.with_registry(|r, now| r.stats(now));
        let counters = [
            (
                "registrations",
                "Registrations (clients, peers and pods)",
                s.totals.registrations,
            ),
            ("renewals", "Successful lease renewals", s.totals.renewals),
            ("cancellations", "Cancelled leases", s.totals.cancellations),
            ("evictions", "Expired leases evicted", s.totals.evictions),
            ("status_updates", "Status override calls", s.totals.status_updates),
            (
                "eviction_runs_held",
                "Eviction runs held back by self-preservation",
                s.totals.eviction_runs_held,
            ),
        ];
        for (name, help, v) in counters {
            counter(&mut encoder, name, help, v)?;
        }
        let gauges = [
            ("expired_leases", "Expired leases not evicted yet", s.expired as i64),
            (
                "renewals_per_minute",
                "Renewals in the last complete minute (what Java calls renews in the last minute)",
                s.renews_last_min as i64,
            ),
            (
                "renewals_per_minute_threshold",
                "Renewals per minute at or below which self-preservation holds back expiry",
                s.renews_threshold,
            ),
            ("expected_clients", "Clients expected to renew", s.expected_clients),
            (
                "self_preservation_active",
                "1 while self-preservation holds back lease expiry",
                i64::from(s.self_preservation_active),
            ),
            (
                "lease_expiration_enabled",
                "1 while expired leases are evicted",
                i64::from(s.lease_expiration_enabled),
            ),
            ("applications", "Applications with instances", s.applications as i64),
            ("registry_version", "Version of the registry contents", s.version as i64),
        ];
        for (name, help, v) in gauges {
            gauge(&mut encoder, name, help, v)?;
        }
        by_origin_and_status(&mut encoder, &s)
    }
}

/// The instance gauges labelled by origin and by status.
fn by_origin_and_status(
    encoder: &mut DescriptorEncoder<'_>,
    s: &crate::registry::Stats,
) -> Result<(), std::fmt::Error> {
    {
        let mut metric = encoder.encode_descriptor(
            "instances",
            "Registered instances by origin",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (origin, n) in s.by_origin {
            ConstGauge::new(n as i64).encode(metric.encode_family(&OriginLabel {
                origin: origin.as_str(),
            })?)?;
        }
    }
    let mut metric = encoder.encode_descriptor(
        "instances_by_status",
        "Registered instances by status",
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for status in Status::ALL {
        ConstGauge::new(s.by_status.get(status) as i64).encode(metric.encode_family(&StatusLabel {
            status: status.as_str(),
        })?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `eureka_build_info` carries the crate's version, which is the chart's `appVersion` (what
    /// the image is tagged with by default), so a scrape says which release runs.
    #[test]
    fn build_info_names_the_version_the_chart_installs() {
        let text = super::Metrics::new().encode();
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            text.contains(&format!("eureka_build_info{{version=\"{version}\"}} 1")),
            "{text}"
        );
        let chart = include_str!("../charts/eureka-operator/Chart.yaml");
        assert!(
            chart.lines().any(|l| l == format!("appVersion: \"{version}\"")),
            "the chart's appVersion is not {version}"
        );
    }

    /// A heartbeat answered 200 is counted through the series kept aside for it, in the same
    /// family and under the same labels as every other request.
    #[test]
    fn heartbeats_and_other_requests_land_in_one_family() {
        let metrics = super::Metrics::new();
        for _ in 0..3 {
            metrics.observe_request("instance", "PUT", 200, 0.000_05);
        }
        metrics.observe_request("instance", "PUT", 404, 0.000_05);
        metrics.observe_request("apps", "GET", 200, 0.002);
        let text = metrics.encode();
        let count = |labels: &str| {
            text.lines()
                .find(|l| l.starts_with("eureka_http_request_duration_seconds_count") && l.contains(labels))
                .unwrap_or_else(|| panic!("no series with {labels}:\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(count(r#"endpoint="instance",method="PUT",status="200""#), "3");
        assert_eq!(count(r#"endpoint="instance",method="PUT",status="404""#), "1");
        assert_eq!(count(r#"endpoint="apps",method="GET",status="200""#), "1");
    }
}
