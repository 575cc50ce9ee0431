//! Mutants: switches that bring a known defect back, so that a test can be shown to fail on the
//! very defect it guards against. Test builds only (the `fault-injection` feature): the process
//! runs with at most one, named by `EUREKA_MUTANT=<name>`; `tests/mutants` runs each strict test
//! with its mutant on (it must fail) and off (it must pass). In other builds [`on`] is a constant
//! `false` and every switch compiles away.
//!
//! Each mutant is small and named for what it breaks; [`ALL`] lists them with the defect.

/// Every mutant and the defect it brings back.
pub const ALL: &[(&str, &str)] = &[
    (
        "ready-before-complete",
        "report ready and answer fetches before the start-up sync and the first reconcile",
    ),
    (
        "stall-heartbeats",
        "a metadata update holds the registry lock for 30 s, so heartbeats wait behind it",
    ),
    (
        "lose-pods-on-apiserver-cut",
        "a failing pod watch is taken for an empty list, so every pod instance goes until its pod changes",
    ),
    (
        "anti-entropy-off",
        "the leader never compares registries with its peers",
    ),
    (
        "keep-cancelled",
        "a cancel is answered 200 but leaves the instance listed",
    ),
    (
        "two-leaders",
        "eviction runs on every replica, not only on the Lease holder",
    ),
    (
        "decode-whole-body",
        "a gzip body is inflated whole before the size check",
    ),
    (
        "partial-sync",
        "the start-up sync keeps only the first application of a peer's registry",
    ),
    ("gate-opens-early", "a readiness gate ignores its delaySeconds"),
    (
        "idle-keepalive",
        "an idle keep-alive connection is kept 30 times the header-read timeout",
    ),
    (
        "wrong-hashcode",
        "full and delta payloads carry an apps__hashcode one instance off",
    ),
    (
        "offer-forgets-removals",
        "an instance an on-request link no longer offers leaves its `?regions=` view without a DELETED entry in the delta",
    ),
    (
        "heartbeats-behind-the-limit",
        "plain heartbeats go through the in-flight limit, so they are shed while slow requests hold every slot",
    ),
    (
        "unfiled-renewals",
        "a heartbeat on a lease already counted as expired leaves it where it was filed, so it stays counted",
    ),
    (
        "stale-piece-window",
        "a payload piece is not recompressed when the fragment before it, which it refers back into, changed",
    ),
    (
        "stale-payload-group",
        "a group of gzip pieces is reused when its first piece is, though another piece in it changed",
    ),
    (
        "unbounded-reconciles",
        "`--reconcile-concurrency` is ignored: every EurekaApp due is reconciled at once",
    ),
];

/// Whether the mutant `name` is on.
#[cfg(feature = "fault-injection")]
pub fn on(name: &str) -> bool {
    selected().is_some_and(|m| m == name)
}

/// Whether the mutant `name` is on: never, outside test builds.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub const fn on(_name: &str) -> bool {
    false
}

#[cfg(feature = "fault-injection")]
fn selected() -> Option<&'static str> {
    static SELECTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SELECTED
        .get_or_init(|| std::env::var("EUREKA_MUTANT").ok().filter(|m| !m.is_empty()))
        .as_deref()
}

/// Failures of [`check`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to select the mutant {0:?}: there is none of that name (tests/mutants --list names them)")]
    Unknown(String),
    #[error("failed to select the mutant {0:?}: this build has no mutants (build with the fault-injection feature)")]
    NotATestBuild(String),
}

/// At start-up: a mutant named in `EUREKA_MUTANT` must exist in this build, so that a typo
/// cannot make a mutant run silently do nothing. Logs the one that is on.
pub fn check() -> Result<(), Error> {
    let Some(name) = std::env::var("EUREKA_MUTANT").ok().filter(|m| !m.is_empty()) else {
        return Ok(());
    };
    if !cfg!(feature = "fault-injection") {
        return Err(Error::NotATestBuild(name));
    }
    match ALL.iter().find(|(m, _)| *m == name) {
        Some((m, defect)) => {
            tracing::warn!(
                mutant = m,
                defect,
                "a mutant is on: this process carries a known defect"
            );
            Ok(())
        }
        None => Err(Error::Unknown(name)),
    }
}
