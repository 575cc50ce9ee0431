//! One link's puller on this replica: polls the source, imports what it answers, checks the copy
//! against the source's hash code, and tracks how long the source has been silent (stale, then
//! withdrawn).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use reqwest::{StatusCode, header};
use tokio::sync::watch;

use super::{Identity, LinkMetrics, LinksConfig, spec::LinkSpec, wire};
use crate::{
    health::Health,
    registry::{
        Command,
        imports::{ImportBatch, LinkRule},
    },
    state::AppState,
};

/// Why a poll failed, by metric class.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to reach {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("failed to get an answer from {url} in time")]
    Timeout { url: String },
    #[error("failed to authenticate to {url}: HTTP {status} (check the link's usernameFile and passwordFile)")]
    Unauthorized { url: String, status: u16 },
    #[error("failed to link to {url}: it is this cluster itself ({message})")]
    Loop { url: String, message: String },
    #[error("failed to poll {url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("failed to read the answer of {url}: {detail}")]
    Invalid { url: String, detail: String },
    #[error("failed to import from {url}: it exports {count} instances, over the link's maxInstances {limit}")]
    OverLimit { url: String, count: u64, limit: u64 },
    #[error("failed to read the link's credentials: {0}")]
    Credentials(String),
    #[error("failed to set up the link's HTTP client: {0}")]
    Client(String),
}

impl Error {
    fn class(&self) -> &'static str {
        match self {
            Error::Unreachable { .. } => "unreachable",
            Error::Timeout { .. } => "timeout",
            Error::Unauthorized { .. } | Error::Credentials(_) => "unauthorized",
            Error::Loop { .. } => "loop",
            Error::Http { .. } => "http",
            Error::Invalid { .. } | Error::Client(_) => "invalid",
            Error::OverLimit { .. } => "over_limit",
        }
    }

    /// Failures an operator must fix, warned about at once (not only once the link is stale).
    fn needs_operator(&self) -> bool {
        matches!(
            self,
            Error::Unauthorized { .. }
                | Error::Credentials(_)
                | Error::Client(_)
                | Error::Loop { .. }
                | Error::OverLimit { .. }
        )
    }
}

/// The `/readyz` warning source of a link.
pub fn health_source(link: &str) -> String {
    format!("link {link}")
}

/// What every puller shares with the process.
#[derive(Clone)]
pub struct Shared {
    pub state: AppState,
    pub health: Arc<Health>,
    pub identity: Identity,
    pub metrics: LinkMetrics,
    pub board: super::Board,
}

pub struct Puller {
    spec: LinkSpec,
    bases: Vec<String>,
    client: Result<reqwest::Client, String>,
    shared: Shared,
    synced: watch::Sender<bool>,
    /// The epoch and version of the copy, when the next poll may ask for changes only.
    since: Option<(String, u64)>,
    /// Which URL to ask next (moves on after a failure).
    next_url: usize,
    last_success: Option<Instant>,
    started: Instant,
    withdrawn: bool,
    /// Polls since the figures were last counted.
    since_figures: u32,
}

impl Puller {
    pub fn new(spec: LinkSpec, config: &LinksConfig, shared: Shared, synced: watch::Sender<bool>) -> Puller {
        let client = client(&spec, config);
        if let Err(e) = &client {
            tracing::error!(link = %spec.name, error = %e, "failed to set up the link's HTTP client");
        }
        Puller {
            bases: spec.bases(),
            spec,
            client,
            shared,
            synced,
            since: None,
            next_url: 0,
            last_success: None,
            started: Instant::now(),
            withdrawn: false,
            since_figures: 0,
        }
    }

    fn rule(&self) -> LinkRule {
        LinkRule {
            visibility: self.spec.visibility(),
            on_withdraw: self.spec.on_withdraw(),
            withdrawn: self.withdrawn,
        }
    }

    pub async fn run(mut self) {
        let name = self.spec.name.clone();
        let source = health_source(&name);
        self.shared.metrics.started(&name);
        let urls = self.bases.clone();
        self.shared.board.update(&name, |s| {
            *s = super::LinkState {
                urls,
                ..Default::default()
            }
        });
        self.shared.state.apply(Command::SetLinkRule {
            link: name.clone(),
            rule: self.rule(),
        });
        let mut tick = tokio::time::interval(self.spec.poll_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.poll().await {
                Ok(()) => {
                    self.last_success = Some(Instant::now());
                    let at = self.shared.state.now();
                    self.shared.board.update(&name, |s| {
                        s.last_success = Some(at);
                        s.last_error = None;
                        s.stale = false;
                    });
                    if failing {
                        tracing::info!(link = %name, "the link answers again");
                        failing = false;
                    }
                    self.shared.health.clear(&source);
                    self.synced.send_replace(true);
                    if self.withdrawn {
                        self.withdrawn = false;
                        tracing::info!(link = %name, "the link's instances are shown again");
                        self.set_rule();
                    }
                }
                Err(e) => {
                    self.shared.metrics.failed(&name, e.class());
                    self.since_figures = u32::MAX;
                    self.next_url = self.next_url.wrapping_add(1);
                    if !failing {
                        tracing::warn!(link = %name, error = %e, "the link failed to answer; keeping its copy");
                        failing = true;
                    } else {
                        tracing::debug!(link = %name, error = %e, "the link still fails");
                    }
                    let message = e.to_string();
                    self.shared.board.update(&name, |s| s.last_error = Some(message));
                    if e.needs_operator() {
                        self.shared.health.warn(&source, e.to_string());
                    }
                    self.silence(&source, &e);
                }
            }
            self.count_figures();
            let age = self.last_success.unwrap_or(self.started).elapsed();
            self.shared.metrics.age(&name, age.as_secs_f64());
        }
    }

    /// After a failed poll: a warning once the link is stale, and its withdrawal once it has
    /// been silent for the withdraw time.
    fn silence(&mut self, source: &str, e: &Error) {
        let silent = self.last_success.unwrap_or(self.started).elapsed();
        if silent >= self.spec.stale_after() {
            self.shared.board.update(&self.spec.name, |s| s.stale = true);
            self.shared.health.warn(
                source,
                format!(
                    "link {} has not answered for {} s: {e}",
                    self.spec.name,
                    silent.as_secs()
                ),
            );
        }
        if silent >= self.spec.withdraw_after() && !self.withdrawn {
            self.withdrawn = true;
            tracing::warn!(
                link = %self.spec.name,
                silent_s = silent.as_secs(),
                policy = ?self.spec.on_withdraw,
                "withdrawing the link's instances after its silence"
            );
            self.set_rule();
        }
    }

    fn set_rule(&self) {
        self.shared.metrics.withdrawn(&self.spec.name, self.withdrawn);
        let withdrawn = self.withdrawn;
        self.shared.board.update(&self.spec.name, |s| s.withdrawn = withdrawn);
        self.shared.state.apply(Command::SetLinkRule {
            link: self.spec.name.clone(),
            rule: self.rule(),
        });
    }

    /// The copy's figures: after each poll that changed something, and every 16 polls (local
    /// instances hide imports without a poll).
    fn count_figures(&mut self) {
        self.since_figures = self.since_figures.saturating_add(1);
        if self.since_figures < 16 {
            return;
        }
        self.since_figures = 0;
        let name = self.spec.name.clone();
        let figures = self.shared.state.with_registry(|r, _| r.link_figures_of(&name));
        self.shared
            .metrics
            .figures(&name, figures.instances, figures.hidden_by_local);
    }

    async fn poll(&mut self) -> Result<(), Error> {
        let client = match &self.client {
            Ok(c) => c.clone(),
            Err(e) => return Err(Error::Client(e.clone())),
        };
        let base = self.bases[self.next_url % self.bases.len()].clone();
        let request = wire::Request {
            since: self.since.clone(),
            include: self.spec.apps.include.clone(),
            exclude: self.spec.apps.exclude.clone(),
        };
        let url = format!("{base}{}?{}", wire::PATH, request.query());
        let mut builder = client.get(&url).header(header::ACCEPT, "application/json");
        if let Some(id) = self.shared.identity.current() {
            builder = builder.header(wire::CLUSTER_HEADER, id);
        }
        if let Some((user, password)) = self.credentials()? {
            builder = builder.basic_auth(user, Some(password));
        }
        let classify = |source: reqwest::Error| {
            if source.is_timeout() {
                Error::Timeout { url: base.clone() }
            } else {
                Error::Unreachable {
                    url: base.clone(),
                    source,
                }
            }
        };
        let resp = builder.send().await.map_err(classify)?;
        let status = resp.status();
        match status {
            s if s.is_success() => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(Error::Unauthorized {
                    url: base,
                    status: status.as_u16(),
                });
            }
            StatusCode::CONFLICT => {
                let message = resp.text().await.unwrap_or_default();
                return Err(Error::Loop { url: base, message });
            }
            _ => {
                return Err(Error::Http {
                    url: base,
                    status: status.as_u16(),
                });
            }
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (epoch, full, apps) = (
            header(wire::EPOCH_HEADER),
            header(wire::FULL_HEADER),
            header(wire::APPS_HEADER),
        );
        let body = resp.bytes().await.map_err(classify)?;
        let now = self.shared.state.now();
        let decode = move || wire::Answer::decode(epoch.as_deref(), full.as_deref(), apps.as_deref(), &body, now);
        let answer = tokio::task::spawn_blocking(decode)
            .await
            .map_err(|e| Error::Invalid {
                url: base.clone(),
                detail: e.to_string(),
            })?
            .map_err(|detail| Error::Invalid {
                url: base.clone(),
                detail,
            })?;
        let count = wire::hashcode_total(&answer.hashcode);
        if count > self.spec.max_instances {
            return Err(Error::OverLimit {
                url: base,
                count,
                limit: self.spec.max_instances,
            });
        }
        let name = self.spec.name.clone();
        let changed = !answer.apps.is_empty();
        let full = answer.full;
        let batch = ImportBatch {
            full,
            apps: answer.apps,
        };
        self.shared.state.apply(Command::Import {
            link: name.clone(),
            batch,
        });
        // Only this puller writes the link's copy: nothing changes it between the two calls.
        let ours = self.shared.state.with_registry(|r, _| r.link_hashcode(&name));
        self.shared.metrics.polled(&name, full);
        if changed {
            self.since_figures = u32::MAX;
        }
        if ours == answer.hashcode {
            self.since = Some((answer.epoch, answer.version));
        } else {
            self.shared.metrics.mismatch(&name);
            tracing::warn!(
                link = %name,
                ours = %ours,
                theirs = %answer.hashcode,
                full,
                "the link's copy differs from the source's hash code; fetching everything"
            );
            // After a full answer, asking again for everything would not help: go on with
            // changes and let the next one tell.
            self.since = full.then_some((answer.epoch, answer.version));
        }
        Ok(())
    }

    /// The credentials, read from their files at each poll (so a rotated Secret takes effect
    /// without a restart).
    fn credentials(&self) -> Result<Option<(String, String)>, Error> {
        let (Some(u), Some(p)) = (&self.spec.username_file, &self.spec.password_file) else {
            return Ok(None);
        };
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
                .map_err(|e| Error::Credentials(format!("{}: {e}", path.display())))
        };
        Ok(Some((read(u)?, read(p)?)))
    }
}

/// The link's HTTP client: its CA (else the system roots), the timeouts, gzip.
fn client(spec: &LinkSpec, config: &LinksConfig) -> Result<reqwest::Client, String> {
    crate::tls::install_default_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .timeout(config.connect_timeout + config.read_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("eureka-operator/", env!("CARGO_PKG_VERSION"), " link"));
    if spec.bases().iter().any(|u| u.starts_with("https://")) || spec.ca_file.is_some() {
        let tls = crate::tls::peer_client_config(&crate::tls::PeerTlsConfig {
            ca_file: spec.ca_file.clone(),
            system_roots: spec.ca_file.is_none(),
            server_name: None,
        })
        .map_err(|e| e.to_string())?;
        builder = builder.tls_backend_preconfigured(tls);
    }
    builder.build().map_err(|e| e.to_string())
}
