//! Gives the heap's free pages back to the kernel. glibc's malloc returns memory to the system
//! only from the top of each arena, so the pages that a burst freed in the middle of the heap (the
//! pod list pages of a start-up or a re-list, registrations replicated in a batch, payloads
//! rebuilt during a deploy storm) stay resident for good: at 5,000 pods they were about 1.7 KB of
//! RSS per registered pod above what the heap held. `malloc_trim(0)` walks every arena and hands
//! each whole free page back (`MADV_DONTNEED`); a supervised task calls it every
//! `--memory-trim-interval-ms`, on a blocking thread since it runs for milliseconds on a large
//! heap, and counts what it gave back. glibc has no setting that does this on its own (its trim
//! threshold looks only at the top of the heap), hence this small task. Other allocators (musl's,
//! another OS) have no such call, and the task is not started there.

use std::time::Duration;

use prometheus_client::{
    metrics::{
        counter::Counter,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::supervisor::Shutdown;

/// Whether this build's allocator can be trimmed.
pub const TRIMMABLE: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// What the trims did, as `eureka_memory_trim_*`.
#[derive(Clone, Debug)]
pub struct TrimMetrics {
    seconds: Histogram,
    released: Counter,
}

impl Default for TrimMetrics {
    fn default() -> TrimMetrics {
        TrimMetrics {
            // 0.1 ms to ~1.6 s.
            seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 15)),
            released: Counter::default(),
        }
    }
}

impl TrimMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "memory_trim_duration_seconds",
            "Time one malloc_trim took (it gives the heap's free pages back to the kernel)",
            self.seconds.clone(),
        );
        registry.register(
            "memory_trim_released_bytes",
            "Resident memory the trims gave back to the kernel",
            self.released.clone(),
        );
    }
}

/// Resident memory of this process, in bytes (0 where `/proc` does not answer).
fn resident_bytes() -> u64 {
    procfs::process::Process::myself()
        .and_then(|me| me.statm())
        .map(|statm| statm.resident * procfs::page_size())
        .unwrap_or(0)
}

/// One trim; returns the resident bytes it gave back.
fn trim() -> u64 {
    let before = resident_bytes();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim has no preconditions; it takes each arena's lock itself.
    unsafe {
        libc::malloc_trim(0);
    }
    before.saturating_sub(resident_bytes())
}

/// Trims every `interval` until shutdown.
pub async fn run(interval: Duration, figures: TrimMetrics, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = ticker.tick() => {
                let started = std::time::Instant::now();
                let released = tokio::task::spawn_blocking(trim).await?;
                let took = started.elapsed();
                figures.seconds.observe(took.as_secs_f64());
                figures.released.inc_by(released);
                tracing::debug!(released, took_ms = took.as_millis() as u64, "trimmed the heap");
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Memory freed below a live allocation stays resident until a trim gives it back.
    #[test]
    fn a_trim_gives_back_pages_freed_in_the_middle_of_the_heap() {
        const MIB: usize = 1024 * 1024;
        // 1 KiB blocks are far below the mmap threshold: they come from the heap, one after another.
        let blocks: Vec<Vec<u8>> = (0..64 * 1024).map(|i| vec![i as u8; 1024]).collect();
        // Allocated after them, it keeps the top of the heap in use, so free() cannot shrink it.
        let pin = vec![1u8; 1024];
        drop(blocks);
        let released = trim();
        assert!(
            released >= 32 * MIB as u64,
            "a trim gave back {released} bytes after 64 MiB were freed"
        );
        assert_eq!(pin[0], 1);
    }
}
