//! The process's own figures under the names every Prometheus client library exports
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ...), read
//! from `/proc/self` by the `procfs` crate at scrape time. prometheus-client has no process
//! collector, and the crates that do (`metrics-process`) target the `metrics` facade, so this
//! small adapter does the encoding. Figures `/proc` cannot give (another OS) are left out.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter},
};

/// Reads `/proc/self` at every scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One scrape's readings; `None` where `/proc` did not answer.
#[derive(Debug, Default, PartialEq)]
struct Readings {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    start_time_seconds: Option<u64>,
    threads: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
}

#[cfg(target_os = "linux")]
fn read() -> Readings {
    use procfs::{
        WithCurrentSystemInfo,
        process::{LimitValue, Process},
    };
    let mut r = Readings::default();
    let Ok(me) = Process::myself() else { return r };
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second() as f64;
        r.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
        r.resident_bytes = Some(stat.rss_bytes().get());
        r.virtual_bytes = Some(stat.vsize);
        r.threads = u64::try_from(stat.num_threads).ok();
        r.start_time_seconds = procfs::boot_time_secs()
            .ok()
            .map(|boot| boot + (stat.starttime as f64 / ticks) as u64);
    }
    r.open_fds = me.fd_count().ok().map(|n| n as u64);
    if let Ok(limits) = me.limits() {
        r.max_fds = match limits.max_open_files.soft_limit {
            LimitValue::Value(v) => Some(v),
            LimitValue::Unlimited => None,
        };
    }
    r
}

#[cfg(not(target_os = "linux"))]
fn read() -> Readings {
    Readings::default()
}

/// A gauge `/proc` could read; nothing when it could not.
fn gauge(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: Option<u64>) -> Result<(), std::fmt::Error> {
    match v {
        Some(v) => super::gauge(encoder, name, help, v as i64),
        None => Ok(()),
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let r = read();
        if let Some(cpu) = r.cpu_seconds {
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(cpu).encode(metric)?;
        }
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            r.resident_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            r.virtual_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            r.start_time_seconds,
        )?;
        gauge(
            &mut encoder,
            "process_threads",
            "Number of OS threads in the process",
            r.threads,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            r.open_fds,
        )?;
        gauge(
            &mut encoder,
            "process_max_fds",
            "Maximum number of open file descriptors (the soft limit)",
            r.max_fds,
        )
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The figures come from this very process: it has threads, memory, open files and a start
    /// time in the past, and its CPU time only grows.
    #[test]
    fn reads_this_process() {
        let before = super::read();
        let files: Vec<std::fs::File> = (0..8)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        let busy = (0..2_000_000u64).fold(0u64, |a, b| a.wrapping_add(b * b));
        let after = super::read();
        assert!(busy > 0);
        assert!(
            after.open_fds.unwrap() >= before.open_fds.unwrap() + 8,
            "{before:?} {after:?}"
        );
        drop(files);
        assert!(after.threads.unwrap() >= 1);
        assert!(after.resident_bytes.unwrap() > 1 << 20);
        assert!(after.virtual_bytes.unwrap() >= after.resident_bytes.unwrap());
        assert!(after.cpu_seconds.unwrap() >= before.cpu_seconds.unwrap());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let started = after.start_time_seconds.unwrap();
        assert!(started <= now + 1 && started > now - 86_400 * 30, "{started} vs {now}");
        assert!(after.max_fds.is_none_or(|m| m >= after.open_fds.unwrap()));
    }

    /// The exposition names them as client_golang does, without the `eureka_` prefix.
    #[test]
    fn exported_under_the_standard_names() {
        let text = crate::metrics::Metrics::new().encode();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_threads ",
            "process_start_time_seconds ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "{name} missing:\n{text}");
        }
        assert!(!text.contains("eureka_process_"));
    }
}
