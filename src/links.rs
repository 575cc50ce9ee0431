//! Links to other clusters' registries: every replica pulls each link itself (a full fetch,
//! then the changes every poll interval, checked against the source's hash code) and imports
//! what it gets ([`crate::registry::imports`]); the other side serves its export view
//! ([`wire`], `crate::api::link`).
//!
//! The links come from `--remote-clusters-file` ([`spec`]), re-read when it changes: a link
//! that leaves the file takes its imports with it, a changed link restarts its puller (the copy
//! stays until the new puller's first answer replaces it). No leader is needed and no replica
//! depends on another: a partition cuts only the replicas it cuts. A link that has not answered
//! for `staleAfter` is a `/readyz` warning; after `withdrawAfter` its instances are withdrawn as
//! its `onWithdraw` policy says; its first answer after that restores it.

pub mod spec;
pub mod wire;

mod metrics;
mod puller;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;

pub use metrics::LinkMetrics;
use spec::LinkSpec;

use crate::{
    health::{Condition, Health},
    registry::Command,
    state::AppState,
    supervisor::{Expect, Shutdown, Supervisor},
};

/// Settings of the links subsystem (from the flags).
#[derive(Clone, Debug)]
pub struct LinksConfig {
    /// `--remote-clusters-file`.
    pub file: Option<PathBuf>,
    /// How long a starting replica waits for its links' first answers before it is ready anyway.
    pub initial_sync_timeout: Duration,
    /// How often the file (and the CA files it names) is checked for changes.
    pub reload_interval: Duration,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

/// Who this cluster is on a link: the cluster id (the flag, else the one Kubernetes gives),
/// else the cluster name. A puller sends it; a source refuses a request that carries its own.
#[derive(Clone, Debug)]
pub struct Identity {
    pub flag: Option<String>,
    pub discovered: watch::Receiver<Option<String>>,
    pub name: Option<String>,
}

impl Identity {
    pub fn current(&self) -> Option<String> {
        self.flag
            .clone()
            .or_else(|| self.discovered.borrow().clone())
            .or_else(|| self.name.clone())
    }
}

/// What each link's puller last saw, for the dashboard.
#[derive(Clone, Debug, Default)]
pub struct Board(Arc<parking_lot::RwLock<BTreeMap<String, LinkState>>>);

/// One link's state as its puller last saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkState {
    /// The URLs it polls (credentials never shown: they are in files, not URLs).
    pub urls: Vec<String>,
    /// When it last answered (ms), if it has.
    pub last_success: Option<i64>,
    /// Why its last poll failed, while it fails.
    pub last_error: Option<String>,
    /// Silent for its stale time.
    pub stale: bool,
    /// Its instances are withdrawn.
    pub withdrawn: bool,
}

impl Board {
    pub fn update(&self, link: &str, edit: impl FnOnce(&mut LinkState)) {
        edit(self.0.write().entry(link.to_string()).or_default());
    }

    pub fn remove(&self, link: &str) {
        self.0.write().remove(link);
    }

    /// Every link's state, by name.
    pub fn snapshot(&self) -> BTreeMap<String, LinkState> {
        self.0.read().clone()
    }
}

/// The applications this cluster never exports: `--cluster-local-apps`, and those of EurekaApps
/// with `clusterLocal: true` (kept by the controller on every replica).
#[derive(Clone, Debug, Default)]
pub struct ClusterLocal {
    flag: Arc<Vec<String>>,
    /// EurekaApp (`namespace/name`) → its application, for those marked cluster-local.
    apps: Arc<parking_lot::RwLock<BTreeMap<String, String>>>,
}

impl ClusterLocal {
    /// From the flag's application names.
    pub fn new(flag: Vec<String>) -> ClusterLocal {
        ClusterLocal {
            flag: Arc::new(flag.into_iter().map(|a| a.to_ascii_uppercase()).collect()),
            apps: Arc::default(),
        }
    }

    /// Records whether an EurekaApp makes its application cluster-local (`None`: it does not,
    /// or it is gone).
    pub fn set(&self, eureka_app: &str, app: Option<String>) {
        let mut apps = self.apps.write();
        match app {
            Some(app) => {
                apps.insert(eureka_app.to_string(), app);
            }
            None => {
                apps.remove(eureka_app);
            }
        }
    }

    pub fn contains(&self, app: &str) -> bool {
        self.flag.iter().any(|a| a == app) || self.apps.read().values().any(|a| a == app)
    }
}

/// What the source side of a link needs (shared with the API).
#[derive(Clone, Debug)]
pub struct Serving {
    pub identity: Identity,
    /// Applications never exported.
    pub cluster_local: ClusterLocal,
    /// Versions are comparable only within one process: a restart changes the epoch.
    pub epoch: String,
    /// A changes answer covering more applications than this is sent whole instead.
    pub max_changed_apps: usize,
    /// This replica's own links, for the dashboard.
    pub board: Board,
}

/// What the links subsystem needs from the rest of the process.
pub struct LinksWiring {
    pub state: AppState,
    pub health: Arc<Health>,
    pub identity: Identity,
    pub metrics: LinkMetrics,
    pub board: Board,
    /// Met once every link of the file at start has answered, or the start-up timeout passed.
    pub synced: Condition,
}

/// Starts the links subsystem. A file that cannot be read or parsed at start is an error (the
/// process does not start with links it cannot honour); later it is a warning and the running
/// links go on.
pub fn start(config: LinksConfig, wiring: LinksWiring, supervisor: &mut Supervisor) -> Result<(), spec::Error> {
    let Some(path) = config.file.clone() else {
        wiring.synced.met();
        return Ok(());
    };
    let first = spec::read(&path)?;
    let manager = Manager {
        config,
        path,
        wiring,
        running: BTreeMap::new(),
    };
    let shutdown = supervisor.shutdown();
    supervisor.spawn("links", Expect::RunsForever, manager.run(first, shutdown));
    Ok(())
}

/// A running puller.
struct Running {
    /// What it runs with: the spec and the CA file's contents.
    fingerprint: (LinkSpec, Option<Vec<u8>>),
    task: tokio::task::JoinHandle<()>,
    synced: watch::Receiver<bool>,
}

struct Manager {
    config: LinksConfig,
    path: PathBuf,
    wiring: LinksWiring,
    running: BTreeMap<String, Running>,
}

/// The health source of the file's problems.
const FILE_SOURCE: &str = "remote clusters file";

impl Manager {
    async fn run(mut self, first: Vec<LinkSpec>, shutdown: Shutdown) -> anyhow::Result<()> {
        self.apply(first);
        let started = Instant::now();
        let mut initial: Option<Vec<(String, watch::Receiver<bool>)>> = Some(
            self.running
                .iter()
                .map(|(name, r)| (name.clone(), r.synced.clone()))
                .collect(),
        );
        let mut last_reload = Instant::now();
        let stop = shutdown.wait();
        tokio::pin!(stop);
        loop {
            // Every 100 ms while the first answers are awaited, then at the reload interval.
            let pause = if initial.is_some() {
                self.config.reload_interval.min(Duration::from_millis(100))
            } else {
                self.config.reload_interval
            };
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(pause) => {}
            }
            if let Some(waiting) = &initial {
                let pending: Vec<&str> = waiting
                    .iter()
                    .filter(|(_, rx)| !*rx.borrow())
                    .map(|(n, _)| n.as_str())
                    .collect();
                if pending.is_empty() {
                    tracing::info!("every link answered: the imports are in place");
                    self.wiring.synced.met();
                    initial = None;
                } else if started.elapsed() >= self.config.initial_sync_timeout {
                    for name in &pending {
                        self.wiring.health.warn(
                            puller::health_source(name),
                            format!(
                                "link {name} did not answer within the start-up timeout ({} ms); ready without its instances",
                                self.config.initial_sync_timeout.as_millis()
                            ),
                        );
                    }
                    tracing::warn!(links = ?pending, "ready without the links that did not answer in time");
                    self.wiring.synced.met();
                    initial = None;
                } else {
                    self.wiring
                        .synced
                        .waiting(format!("waiting for the first answer of links {}", pending.join(", ")));
                }
            }
            self.restart_ended();
            if last_reload.elapsed() >= self.config.reload_interval {
                last_reload = Instant::now();
                match spec::read(&self.path) {
                    Ok(links) => {
                        self.wiring.health.clear(FILE_SOURCE);
                        self.apply(links);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "keeping the running links");
                        self.wiring.health.warn(FILE_SOURCE, e.to_string());
                    }
                }
            }
        }
        for (_, r) in std::mem::take(&mut self.running) {
            r.task.abort();
        }
        Ok(())
    }

    /// Starts, restarts and stops pullers so that they run what `links` says.
    fn apply(&mut self, links: Vec<LinkSpec>) {
        let wanted: BTreeMap<String, (LinkSpec, Option<Vec<u8>>)> = links
            .into_iter()
            .map(|l| {
                let ca = l.ca_file.as_ref().and_then(|p| std::fs::read(p).ok());
                (l.name.clone(), (l, ca))
            })
            .collect();
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(r) = self.running.remove(&name) {
                r.task.abort();
            }
            self.wiring.state.apply(Command::DropLink { link: name.clone() });
            self.wiring.metrics.forget(&name);
            self.wiring.board.remove(&name);
            self.wiring.health.clear(&puller::health_source(&name));
            tracing::info!(link = %name, "link removed: its imports are gone");
        }
        for (name, fingerprint) in wanted {
            if self.running.get(&name).is_some_and(|r| r.fingerprint == fingerprint) {
                continue;
            }
            if let Some(old) = self.running.remove(&name) {
                old.task.abort();
                tracing::info!(link = %name, "link changed: restarting its puller");
            } else {
                tracing::info!(link = %name, urls = ?fingerprint.0.urls, "link added");
            }
            self.spawn(name, fingerprint);
        }
    }

    fn spawn(&mut self, name: String, fingerprint: (LinkSpec, Option<Vec<u8>>)) {
        let (synced_tx, synced) = watch::channel(false);
        let puller = puller::Puller::new(
            fingerprint.0.clone(),
            &self.config,
            puller::Shared {
                state: self.wiring.state.clone(),
                health: self.wiring.health.clone(),
                identity: self.wiring.identity.clone(),
                metrics: self.wiring.metrics.clone(),
                board: self.wiring.board.clone(),
            },
            synced_tx,
        );
        let task = tokio::spawn(puller.run());
        self.running.insert(
            name,
            Running {
                fingerprint,
                task,
                synced,
            },
        );
    }

    /// A puller never ends on its own; one that did (a panic) is logged and started again.
    fn restart_ended(&mut self) {
        let ended: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        for name in ended {
            if let Some(r) = self.running.remove(&name) {
                tracing::error!(link = %name, "the link's puller ended unexpectedly; starting it again");
                self.wiring.metrics.restarted(&name);
                self.spawn(name, r.fingerprint);
            }
        }
    }
}
