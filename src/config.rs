//! Command-line and environment configuration. Every flag has an environment variable; registry
//! knobs mirror Spring's `eureka.server.*` property names (`--enable-self-preservation`,
//! `EUREKA_SERVER_ENABLE_SELF_PRESERVATION`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args as ClapArgs, Parser, ValueEnum};

pub mod identity;
pub mod limits;
pub mod serving;

use crate::registry::{RegistryConfig, lease::ExpiryMode, preservation::PreservationConfig};

/// A fraction in (0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not in (0, 1]"))
    }
}

/// A positive number of milliseconds or items (zero would spin or block forever).
fn positive(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

#[derive(Clone, Debug, Parser)]
#[command(
    name = "eureka-operator",
    version,
    about = "A Netflix Eureka registry and a Kubernetes operator in one process"
)]
pub struct Args {
    /// Address of the Eureka API and dashboard.
    #[arg(long, env = "EUREKA_BIND", default_value = "0.0.0.0:8761")]
    pub bind: SocketAddr,

    /// Address of the admin listener (/metrics, /livez, /readyz).
    #[arg(long, env = "EUREKA_ADMIN_BIND", default_value = "0.0.0.0:8080")]
    pub admin_bind: SocketAddr,

    /// Log filter (tracing `EnvFilter` syntax).
    #[arg(long, env = "EUREKA_LOG", default_value = "info")]
    pub log: String,

    /// Log format.
    #[arg(long, env = "EUREKA_LOG_FORMAT", value_enum, default_value = "plain")]
    pub log_format: LogFormat,

    /// Largest accepted request body, after decompression.
    #[arg(long, env = "EUREKA_MAX_REQUEST_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_request_body_bytes: usize,

    /// How long tasks get to drain on SIGTERM (in-flight requests, replication queues, the Lease)
    /// before they are aborted; keep it below the pod's terminationGracePeriodSeconds.
    #[arg(long, env = "EUREKA_SHUTDOWN_GRACE_MS", default_value_t = 20_000, value_parser = positive)]
    pub shutdown_grace_ms: u64,

    /// On SIGTERM, how long to keep serving with /readyz failing before draining, so that Service
    /// endpoints and kube-proxy stop sending new connections here first (a second signal skips
    /// it). 0 drains at once; the chart sets 5000.
    #[arg(long, env = "EUREKA_SHUTDOWN_DELAY_MS", default_value_t = 0)]
    pub shutdown_delay_ms: u64,

    /// How often the heap's free pages are given back to the kernel (`malloc_trim`: glibc keeps
    /// the pages a burst freed in the middle of the heap resident otherwise). 0 never does.
    #[arg(long, env = "EUREKA_MEMORY_TRIM_INTERVAL_MS", default_value_t = 10_000)]
    pub memory_trim_interval_ms: u64,

    #[command(flatten)]
    pub serving: serving::ServingArgs,

    #[command(flatten)]
    pub server: ServerArgs,

    #[command(flatten)]
    pub auth: AuthArgs,

    #[command(flatten)]
    pub peers: PeerArgs,

    #[command(flatten)]
    pub kubernetes: KubernetesArgs,

    #[command(flatten)]
    pub limits: limits::LimitArgs,

    #[command(flatten)]
    pub links: LinkArgs,
}

/// Links to other clusters' registries (see `crate::links`).
#[derive(Clone, Debug, ClapArgs)]
pub struct LinkArgs {
    /// A YAML list of links to other clusters' registries, each pulled by every replica;
    /// re-read when it changes. No links when unset.
    #[arg(long, env = "EUREKA_REMOTE_CLUSTERS_FILE")]
    pub remote_clusters_file: Option<PathBuf>,

    /// How long a starting replica waits for its links' first answers before it reports ready
    /// anyway (with a warning per link that did not answer).
    #[arg(long, env = "EUREKA_REMOTE_INITIAL_SYNC_TIMEOUT_MS", default_value_t = 10_000)]
    pub remote_initial_sync_timeout_ms: u64,

    /// How often the remote clusters file and the CA files it names are checked for changes.
    #[arg(long, env = "EUREKA_REMOTE_CLUSTERS_RELOAD_INTERVAL_MS", default_value_t = 2_000, value_parser = positive)]
    pub remote_clusters_reload_interval_ms: u64,

    /// Connect timeout toward linked clusters.
    #[arg(long, env = "EUREKA_REMOTE_CONNECT_TIMEOUT_MS", default_value_t = 2_000, value_parser = positive)]
    pub remote_connect_timeout_ms: u64,

    /// Read timeout toward linked clusters (a full answer of a large export must fit in it).
    #[arg(long, env = "EUREKA_REMOTE_READ_TIMEOUT_MS", default_value_t = 10_000, value_parser = positive)]
    pub remote_read_timeout_ms: u64,

    /// Applications this cluster never exports over links (comma-separated).
    #[arg(long, env = "EUREKA_CLUSTER_LOCAL_APPS", value_delimiter = ',')]
    pub cluster_local_apps: Vec<String>,

    /// A changes answer to a link that covers more applications than this is sent whole.
    #[arg(long, env = "EUREKA_LINK_MAX_CHANGED_APPS", default_value_t = 1000, value_parser = positive)]
    pub link_max_changed_apps: u64,
}

impl LinkArgs {
    pub fn links_config(&self) -> crate::links::LinksConfig {
        crate::links::LinksConfig {
            file: self.remote_clusters_file.clone(),
            initial_sync_timeout: Duration::from_millis(self.remote_initial_sync_timeout_ms),
            reload_interval: Duration::from_millis(self.remote_clusters_reload_interval_ms),
            connect_timeout: Duration::from_millis(self.remote_connect_timeout_ms),
            read_timeout: Duration::from_millis(self.remote_read_timeout_ms),
        }
    }

    /// The cluster-local applications, upper-case as Eureka keys them.
    pub fn cluster_local(&self) -> Vec<String> {
        self.cluster_local_apps
            .iter()
            .map(|a| a.trim().to_ascii_uppercase())
            .filter(|a| !a.is_empty())
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

/// Registry behaviour (`eureka.server.*`).
#[derive(Clone, Debug, ClapArgs)]
pub struct ServerArgs {
    /// Hold back lease expiry when renewals drop below the threshold.
    #[arg(long, env = "EUREKA_SERVER_ENABLE_SELF_PRESERVATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_self_preservation: bool,

    /// Fraction of expected renewals below which self-preservation starts; also caps evictions per run.
    #[arg(long, env = "EUREKA_SERVER_RENEWAL_PERCENT_THRESHOLD", default_value_t = 0.85, value_parser = fraction)]
    pub renewal_percent_threshold: f64,

    /// How often clients are expected to renew.
    #[arg(
        long,
        env = "EUREKA_SERVER_EXPECTED_CLIENT_RENEWAL_INTERVAL_SECONDS",
        default_value_t = 30
    )]
    pub expected_client_renewal_interval_seconds: i64,

    /// Initial number of clients expected to renew (Spring's `expected-number-of-clients-sending-renews`).
    #[arg(
        long,
        env = "EUREKA_SERVER_EXPECTED_NUMBER_OF_CLIENTS_SENDING_RENEWS",
        default_value_t = 1
    )]
    pub expected_number_of_clients_sending_renews: i64,

    /// Count used when the registry opens with no instances from peers (0 = Netflix behaviour).
    #[arg(long, env = "EUREKA_SERVER_DEFAULT_OPEN_FOR_TRAFFIC_COUNT", default_value_t = 1)]
    pub default_open_for_traffic_count: i64,

    /// How often the leader evicts expired leases.
    #[arg(long, env = "EUREKA_SERVER_EVICTION_INTERVAL_TIMER_IN_MS", default_value_t = 60_000, value_parser = positive)]
    pub eviction_interval_timer_in_ms: u64,

    /// How often the leader recomputes the renewal threshold from the registry's size.
    #[arg(
        long,
        env = "EUREKA_SERVER_RENEWAL_THRESHOLD_UPDATE_INTERVAL_MS",
        default_value_t = 900_000
    , value_parser = positive)]
    pub renewal_threshold_update_interval_ms: u64,

    /// After an empty start, fetches are refused this long; also the grace before the EMERGENCY banner.
    #[arg(
        long,
        env = "EUREKA_SERVER_WAIT_TIME_IN_MS_WHEN_SYNC_EMPTY",
        default_value_t = 300_000
    )]
    pub wait_time_in_ms_when_sync_empty: i64,

    /// How long a change stays in `GET apps/delta`.
    #[arg(
        long,
        env = "EUREKA_SERVER_RETENTION_TIME_IN_MS_IN_DELTA_QUEUE",
        default_value_t = 180_000
    )]
    pub retention_time_in_ms_in_delta_queue: i64,

    /// How long a cancel is remembered: a replicated registration of the cancelled copy (a
    /// renewal that waited behind a slow link, answered 404, then its Register; a peer's stale
    /// registry) is refused meanwhile, so replication cannot undo a cancel.
    #[arg(long, env = "EUREKA_CANCEL_MEMORY_MS", default_value_t = 180_000, value_parser = clap::value_parser!(i64).range(0..))]
    pub cancel_memory_ms: i64,

    /// How often old changes are pruned from the delta.
    #[arg(
        long,
        env = "EUREKA_SERVER_DELTA_RETENTION_TIMER_INTERVAL_IN_MS",
        default_value_t = 30_000
    , value_parser = positive)]
    pub delta_retention_timer_interval_in_ms: u64,

    /// Full and delta payloads are assembled from per-application fragments; an unchanged
    /// application's fragment (its lease timestamps) is encoded again once it is this old.
    #[arg(
        long,
        env = "EUREKA_SERVER_RESPONSE_CACHE_REFRESH_AFTER_MS",
        default_value_t = crate::cache::assembly::REFRESH_AFTER.as_millis() as u64,
        value_parser = positive
    )]
    pub response_cache_refresh_after_ms: u64,

    /// Instances whose aged fragments one payload build encodes again (the rest wait for the
    /// next build), so refreshing never makes one reader wait long.
    #[arg(
        long,
        env = "EUREKA_SERVER_RESPONSE_CACHE_REFRESH_BUDGET",
        default_value_t = crate::cache::assembly::REFRESH_BUDGET,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub response_cache_refresh_budget: usize,

    /// How long uncompressed payload text is kept after the last reader that did not take gzip.
    #[arg(
        long,
        env = "EUREKA_SERVER_RESPONSE_CACHE_IDENTITY_KEEP_MS",
        default_value_t = crate::cache::assembly::IDENTITY_KEEP.as_millis() as u64,
        value_parser = positive
    )]
    pub response_cache_identity_keep_ms: u64,

    /// A full or delta payload fetched within this long is built again as soon as a write
    /// changes the registry, so its next reader does not wait for the build (0: readers start
    /// every build). Builds ahead take at most half of one thread per payload.
    #[arg(
        long,
        env = "EUREKA_SERVER_RESPONSE_CACHE_BUILD_AHEAD_MS",
        default_value_t = crate::cache::assembly::BUILD_AHEAD.as_millis() as u64
    )]
    pub response_cache_build_ahead_ms: u64,

    /// Answer `GET apps/delta` with 403 (clients then always fetch the full registry).
    #[arg(long, env = "EUREKA_SERVER_DISABLE_DELTA", default_value_t = false, action = clap::ArgAction::Set)]
    pub disable_delta: bool,

    /// Arbitrate heartbeats by `lastDirtyTimestamp` (404/409 answers).
    #[arg(long, env = "EUREKA_SERVER_SYNC_WHEN_TIMESTAMP_DIFFERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub sync_when_timestamp_differs: bool,

    /// `exact`: a lease expires `duration` after its last renewal. `java`: Java's `2 × duration`.
    #[arg(long, env = "EUREKA_SERVER_LEASE_EXPIRY", value_enum, default_value = "exact")]
    pub lease_expiry: LeaseExpiryArg,

    /// Length of the renews-per-minute window (60 s in Java; shorten only in tests).
    #[arg(long, env = "EUREKA_SERVER_RENEWS_WINDOW_MS", default_value_t = 60_000, hide = true)]
    pub renews_window_ms: i64,

    /// Start-up sync from peers: attempts while nothing was found.
    #[arg(long, env = "EUREKA_SERVER_REGISTRY_SYNC_RETRIES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub registry_sync_retries: u32,

    /// Wait between start-up sync attempts.
    #[arg(long, env = "EUREKA_SERVER_REGISTRY_SYNC_RETRY_WAIT_MS", default_value_t = 5_000, value_parser = positive)]
    pub registry_sync_retry_wait_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LeaseExpiryArg {
    Exact,
    Java,
}

/// Optional HTTP basic auth on the Eureka API and the dashboard.
#[derive(Clone, Debug, ClapArgs)]
pub struct AuthArgs {
    /// Require HTTP basic auth with this user (and `--basic-auth-password`).
    #[arg(long, env = "EUREKA_BASIC_AUTH_USERNAME")]
    pub basic_auth_username: Option<String>,

    /// The basic-auth password (never logged).
    #[arg(long, env = "EUREKA_BASIC_AUTH_PASSWORD", hide_env_values = true)]
    pub basic_auth_password: Option<String>,

    /// A file holding `username:password` (e.g. a mounted Secret); read at start.
    #[arg(long, env = "EUREKA_BASIC_AUTH_FILE")]
    pub basic_auth_file: Option<PathBuf>,

    /// With basic auth on, the user other replicas and Java peers authenticate as. Only requests
    /// with these credentials may replicate (batches, `x-netflix-discovery-replication`); our
    /// replicas send them. Defaults to the basic-auth user, so any client can then replicate.
    #[arg(long, env = "EUREKA_PEER_AUTH_USERNAME")]
    pub peer_auth_username: Option<String>,

    /// The peer password (never logged).
    #[arg(long, env = "EUREKA_PEER_AUTH_PASSWORD", hide_env_values = true)]
    pub peer_auth_password: Option<String>,

    /// A file holding the peer `username:password` (e.g. a mounted Secret); read at start.
    #[arg(long, env = "EUREKA_PEER_AUTH_FILE")]
    pub peer_auth_file: Option<PathBuf>,

    /// A file of `username:password` lines that other clusters' links may read `link/apps` with,
    /// and nothing else (needs basic auth on); re-read when it changes, so a rotation lists both.
    #[arg(long, env = "EUREKA_LINK_AUTH_FILE")]
    pub link_auth_file: Option<PathBuf>,

    /// How long the link credentials file is trusted before a request that needs it reads it
    /// again, in ms (0: read on every such request).
    #[arg(long, env = "EUREKA_LINK_AUTH_RECHECK_MS", default_value_t = 2000)]
    pub link_auth_recheck_ms: u64,
}

/// Peer replication: other replicas of this operator and Java Eureka servers.
#[derive(Clone, Debug, ClapArgs)]
pub struct PeerArgs {
    /// Static peer URLs of other replicas (e.g. `http://10.0.0.7:8761/eureka/`), comma-separated.
    #[arg(long, env = "EUREKA_PEER_URLS", value_delimiter = ',')]
    pub peer_urls: Vec<String>,

    /// Headless Service whose EndpointSlices list the replicas (`namespace/name`), in a cluster.
    #[arg(long, env = "EUREKA_PEER_SERVICE")]
    pub peer_service: Option<String>,

    /// Java Eureka servers to peer with both ways (migration), comma-separated service URLs.
    #[arg(long, env = "EUREKA_JAVA_PEER_URLS", value_delimiter = ',')]
    pub java_peer_urls: Vec<String>,

    /// This replica's own URL as peers see it (so it is never its own peer).
    #[arg(long, env = "EUREKA_SERVER_MY_URL")]
    pub my_url: Option<String>,

    /// A stable name for this replica (defaults to the pod name or host name).
    #[arg(long, env = "EUREKA_REPLICA_ID")]
    pub replica_id: Option<String>,

    /// Connect timeout toward peers.
    #[arg(long, env = "EUREKA_SERVER_PEER_NODE_CONNECT_TIMEOUT_MS", default_value_t = 1_000, value_parser = positive)]
    pub peer_node_connect_timeout_ms: u64,

    /// Read timeout toward peers (a timeout counts as congestion and is retried).
    #[arg(long, env = "EUREKA_SERVER_PEER_NODE_READ_TIMEOUT_MS", default_value_t = 5_000, value_parser = positive)]
    pub peer_node_read_timeout_ms: u64,

    /// Pending replication tasks per peer before the oldest are dropped.
    #[arg(
        long,
        env = "EUREKA_SERVER_MAX_ELEMENTS_IN_PEER_REPLICATION_POOL",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_elements_in_peer_replication_pool: u32,

    /// Replication tasks older than this are dropped instead of sent.
    #[arg(long, env = "EUREKA_SERVER_MAX_TIME_FOR_REPLICATION", default_value_t = 30_000, value_parser = positive)]
    pub max_time_for_replication: u64,

    /// Longest a task waits for more to batch with.
    #[arg(long, env = "EUREKA_REPLICATION_MAX_BATCHING_DELAY_MS", default_value_t = 100)]
    pub replication_max_batching_delay_ms: u64,

    /// How often the leader renews pod instances on Java peers.
    #[arg(long, env = "EUREKA_JAVA_PEER_HEARTBEAT_INTERVAL_MS", default_value_t = 30_000, value_parser = positive)]
    pub java_peer_heartbeat_interval_ms: u64,

    /// On SIGTERM, how long to keep sending what is queued for peers before giving up.
    #[arg(long, env = "EUREKA_REPLICATION_FLUSH_TIMEOUT_MS", default_value_t = 5_000)]
    pub replication_flush_timeout_ms: u64,

    /// How often the leader compares registries with peers to repair what partitions lost.
    #[arg(long, env = "EUREKA_ANTI_ENTROPY_INTERVAL_MS", default_value_t = 60_000, value_parser = positive)]
    pub anti_entropy_interval_ms: u64,
}

/// The Kubernetes side.
#[derive(Clone, Debug, ClapArgs)]
pub struct KubernetesArgs {
    /// `auto`: run the controller when a cluster is found (in-cluster or KUBECONFIG).
    #[arg(long, env = "EUREKA_KUBERNETES", value_enum, default_value = "auto")]
    pub kubernetes: KubernetesMode,

    /// Namespace of the operator itself (for its Lease); defaults to the pod's namespace.
    #[arg(long, env = "EUREKA_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,

    /// Name of the coordination.k8s.io Lease that elects the leader.
    #[arg(long, env = "EUREKA_LEASE_NAME", default_value = "eureka-operator")]
    pub lease_name: String,

    /// Lease duration; a new leader takes over this long, plus at most a third of it (one look), after the old one's last renewal.
    #[arg(long, env = "EUREKA_LEASE_DURATION_SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease_duration_seconds: u64,

    /// Namespaces to watch (comma-separated); all when empty.
    #[arg(long, env = "EUREKA_WATCH_NAMESPACES", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,

    /// Identifies this cluster in instance metadata (`k8s.cluster`) and ownership checks; defaults
    /// to the UID of the `kube-system` namespace, unique per cluster.
    #[arg(long, env = "EUREKA_CLUSTER_ID")]
    pub cluster_id: Option<String>,

    /// A name for this cluster that people read (`k8s.clusterName` metadata, `{clusterName}` in
    /// instance ids); defaults to the value of the `cluster.clusterset.k8s.io` ClusterProperty
    /// (the Multi-Cluster Services API's cluster id) when there is one, else the cluster id.
    #[arg(long, env = "EUREKA_CLUSTER_NAME", value_parser = crate::k8s::parse_cluster_name)]
    pub cluster_name: Option<String>,

    /// The cluster's DNS domain, for `hostName: PodFQDN`.
    #[arg(long, env = "EUREKA_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,

    /// Longest wait between retries of a failed Kubernetes write (status, finalizer, annotation).
    #[arg(long, env = "EUREKA_KUBERNETES_WRITE_MAX_BACKOFF_MS", default_value_t = 60_000, value_parser = positive)]
    pub kubernetes_write_max_backoff_ms: u64,

    /// Longest wait between retries of a failing watch (exponential from 250 ms, with jitter).
    #[arg(long, env = "EUREKA_WATCH_MAX_BACKOFF_MS", default_value_t = 5_000, value_parser = positive)]
    pub watch_max_backoff_ms: u64,

    /// EurekaApps reconciled at once (per watched namespace, or in all when every namespace is
    /// watched). Each reconcile may write to the apiserver, and the Kubernetes client keeps a
    /// connection open for 90 s for every write that ran at once: this bounds that pool.
    #[arg(long, env = "EUREKA_RECONCILE_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub reconcile_concurrency: u16,

    /// The apiserver ends each watch after this many seconds and the watch resumes from where it
    /// was (no re-list): a watch that goes quiet is so proven alive, or found dead by
    /// `--kubernetes-read-timeout-ms`, within a bounded time.
    #[arg(long, env = "EUREKA_WATCH_TIMEOUT_SECONDS", default_value_t = 45, value_parser = clap::value_parser!(u32).range(1..))]
    pub watch_timeout_seconds: u32,

    /// Longest silence from the apiserver on any request (a watch, a list, a write) before it is
    /// abandoned and retried: without it a request on a connection that died without a reset
    /// waits forever, and a watch stuck so would leave the registry stale while ready. At least
    /// 5 s more than `--watch-timeout-seconds`.
    #[arg(long, env = "EUREKA_KUBERNETES_READ_TIMEOUT_MS", default_value_t = 60_000, value_parser = positive)]
    pub kubernetes_read_timeout_ms: u64,

    /// Pods per page of the pod watch's (re-)list. Smaller pages keep less of the apiserver's
    /// answer in memory at once (glibc keeps much of a freed page resident): 100 instead of
    /// kube-runtime's 500 cut the RSS per watched pod from 2.7 to 1.1 KB at 5000 pods.
    #[arg(long, env = "EUREKA_POD_WATCH_PAGE_SIZE", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub pod_watch_page_size: u32,

    /// How often pod instances whose EurekaApp is gone are looked for (they are also removed when
    /// a re-list shows the EurekaApp gone).
    #[arg(long, env = "EUREKA_POD_INSTANCE_SWEEP_INTERVAL_MS", default_value_t = 30_000, value_parser = positive)]
    pub pod_instance_sweep_interval_ms: u64,

    /// How soon the leader asks the replicas again about a pod waiting for its readiness gate
    /// (some replica does not hold it UP yet, or its gate could not be written).
    #[arg(long, env = "EUREKA_READINESS_GATE_RECHECK_MS", default_value_t = 500, value_parser = positive)]
    pub readiness_gate_recheck_ms: u64,

    /// How long a readiness gate the leader opened is not opened again while the pod watch has
    /// not shown it True yet.
    #[arg(long, env = "EUREKA_READINESS_GATE_OPENED_GRACE_MS", default_value_t = 5_000, value_parser = positive)]
    pub readiness_gate_opened_grace_ms: u64,

    /// How many pods the leader checks on the replicas (and whose gates it writes) at once.
    #[arg(long, env = "EUREKA_READINESS_GATE_CONCURRENT_CHECKS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub readiness_gate_concurrent_checks: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KubernetesMode {
    Auto,
    On,
    Off,
}

impl ServerArgs {
    pub fn registry_config(&self) -> RegistryConfig {
        RegistryConfig {
            preservation: PreservationConfig {
                enable_self_preservation: self.enable_self_preservation,
                renewal_percent_threshold: self.renewal_percent_threshold,
                expected_client_renewal_interval_seconds: self.expected_client_renewal_interval_seconds,
                wait_time_in_ms_when_sync_empty: self.wait_time_in_ms_when_sync_empty,
                renews_window_ms: self.renews_window_ms,
            },
            expected_number_of_clients_sending_renews: self.expected_number_of_clients_sending_renews,
            default_open_for_traffic_count: self.default_open_for_traffic_count,
            eviction_interval_timer_in_ms: self.eviction_interval_timer_in_ms as i64,
            retention_time_in_ms_in_delta_queue: self.retention_time_in_ms_in_delta_queue,
            cancel_memory_ms: self.cancel_memory_ms,
            sync_when_timestamp_differs: self.sync_when_timestamp_differs,
            lease_expiry: match self.lease_expiry {
                LeaseExpiryArg::Exact => ExpiryMode::Exact,
                LeaseExpiryArg::Java => ExpiryMode::Java,
            },
            ..RegistryConfig::default()
        }
    }

    /// The timer periods of the registry's background work.
    pub fn intervals(&self) -> crate::timers::Intervals {
        crate::timers::Intervals {
            eviction: Duration::from_millis(self.eviction_interval_timer_in_ms),
            renewal_threshold_update: Duration::from_millis(self.renewal_threshold_update_interval_ms),
            delta_retention: Duration::from_millis(self.delta_retention_timer_interval_in_ms),
        }
    }

    /// How payload fragments age and are refreshed.
    pub fn cache_tuning(&self) -> crate::cache::assembly::Tuning {
        crate::cache::assembly::Tuning {
            refresh_after: Duration::from_millis(self.response_cache_refresh_after_ms),
            refresh_budget: self.response_cache_refresh_budget,
            identity_keep: Duration::from_millis(self.response_cache_identity_keep_ms),
            build_ahead: Duration::from_millis(self.response_cache_build_ahead_ms),
        }
    }

    /// How hard the start-up sync tries.
    pub fn sync_retries(&self) -> crate::replication::sync::Retries {
        crate::replication::sync::Retries {
            attempts: self.registry_sync_retries,
            wait: Duration::from_millis(self.registry_sync_retry_wait_ms),
        }
    }
}

impl AuthArgs {
    /// The client and peer credentials; `None` when auth is off.
    pub fn access(&self) -> Result<Option<crate::api::auth::Access>, crate::api::auth::Error> {
        crate::api::auth::configure(
            (
                self.basic_auth_username.as_deref(),
                self.basic_auth_password.as_deref(),
                self.basic_auth_file.as_deref(),
            ),
            (
                self.peer_auth_username.as_deref(),
                self.peer_auth_password.as_deref(),
                self.peer_auth_file.as_deref(),
            ),
            self.link_auth_file
                .as_deref()
                .map(|path| (path, Duration::from_millis(self.link_auth_recheck_ms))),
        )
    }
}

impl PeerArgs {
    /// Replication settings for the replica named `replica_id`; our replicas authenticate with the
    /// peer credentials.
    pub fn replication_settings(
        &self,
        replica_id: &str,
        access: Option<&crate::api::auth::Access>,
    ) -> crate::replication::ReplicationConfig {
        crate::replication::ReplicationConfig {
            limits: crate::replication::batcher::Limits {
                capacity: self.max_elements_in_peer_replication_pool as usize,
                max_age: Duration::from_millis(self.max_time_for_replication),
                max_delay: Duration::from_millis(self.replication_max_batching_delay_ms),
            },
            connect_timeout: Duration::from_millis(self.peer_node_connect_timeout_ms),
            read_timeout: Duration::from_millis(self.peer_node_read_timeout_ms),
            replica_id: replica_id.to_string(),
            credentials: access.map(|a| a.peer.pair()),
            java_heartbeat_interval: Duration::from_millis(self.java_peer_heartbeat_interval_ms),
            anti_entropy_interval: Duration::from_millis(self.anti_entropy_interval_ms),
            flush_timeout: Duration::from_millis(self.replication_flush_timeout_ms),
            tls: None,
        }
    }
}

impl KubernetesArgs {
    /// Applies the read timeout to the client's configuration; refuses a read timeout that a
    /// quiet watch would trip.
    pub fn tune_client(&self, config: &mut kube::Config) -> Result<(), String> {
        let read = Duration::from_millis(self.kubernetes_read_timeout_ms);
        let watch = Duration::from_secs(self.watch_timeout_seconds.into());
        if read < watch + Duration::from_secs(5) {
            return Err(format!(
                "failed to configure the Kubernetes client: --kubernetes-read-timeout-ms ({} ms) must be at \
                 least 5 s more than --watch-timeout-seconds ({} s), or every quiet watch would time out",
                self.kubernetes_read_timeout_ms, self.watch_timeout_seconds
            ));
        }
        config.read_timeout = Some(read);
        // The timeout counts from the request, not from when its pooled connection went idle.
        config.reset_reader_on_write = true;
        Ok(())
    }

    /// The cluster subsystem's settings, for an operator running in `namespace`.
    pub fn cluster_settings(
        &self,
        namespace: &str,
        peers: &PeerArgs,
        me: &identity::Identity,
    ) -> crate::k8s::ClusterConfig {
        let peer_service = peers.peer_service.as_ref().map(|s| match s.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (namespace.to_string(), s.clone()),
        });
        crate::k8s::ClusterConfig {
            cluster_id: self.cluster_id.clone(),
            cluster_name: self.cluster_name.clone(),
            cluster_domain: self.cluster_domain.clone(),
            namespaces: self.watch_namespaces.clone(),
            lease: crate::k8s::lease::LeaseConfig {
                namespace: namespace.to_string(),
                name: self.lease_name.clone(),
                identity: me.replica.clone(),
                duration: Duration::from_secs(self.lease_duration_seconds),
                watch_timeout_seconds: self.watch_timeout_seconds,
            },
            peer_service,
            me: crate::k8s::peers::OwnPod {
                pod_name: Some(me.replica.clone()),
                pod_ip: me.pod_ip.clone(),
            },
            max_backoff: Duration::from_millis(self.kubernetes_write_max_backoff_ms),
            watch_max_backoff: Duration::from_millis(self.watch_max_backoff_ms),
            watch_timeout_seconds: self.watch_timeout_seconds,
            reconcile_concurrency: self.reconcile_concurrency,
            pod_watch_page_size: self.pod_watch_page_size,
            sweep_interval: Duration::from_millis(self.pod_instance_sweep_interval_ms),
            gates: crate::k8s::controller::gates::GateTiming {
                recheck: Duration::from_millis(self.readiness_gate_recheck_ms),
                opened_grace: Duration::from_millis(self.readiness_gate_opened_grace_ms),
                concurrent_checks: self.readiness_gate_concurrent_checks as usize,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_read_timeout_a_quiet_watch_would_trip_is_refused() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let tight = Args::parse_from([
            "eureka-operator",
            "--watch-timeout-seconds",
            "10",
            "--kubernetes-read-timeout-ms",
            "14999",
        ]);
        let err = tight.kubernetes.tune_client(&mut config).unwrap_err();
        assert!(err.contains("--kubernetes-read-timeout-ms (14999 ms)"), "{err}");
        assert_eq!(config.read_timeout, None);
        let defaults = Args::parse_from(["eureka-operator"]);
        defaults.kubernetes.tune_client(&mut config).unwrap();
        assert_eq!(config.read_timeout, Some(Duration::from_secs(60)));
        assert!(config.reset_reader_on_write);
    }

    #[test]
    fn cluster_names_are_dns_label_like() {
        for ok in ["blue", "eu-west-1.shop", "a", "0x", &"a".repeat(63)] {
            assert_eq!(crate::k8s::parse_cluster_name(ok).as_deref(), Ok(ok));
        }
        for bad in ["", "Blue", "-a", "a-", "a_b", "a b", ".a", &"a".repeat(64)] {
            assert!(crate::k8s::parse_cluster_name(bad).is_err(), "{bad:?} accepted");
        }
        let refused = Args::try_parse_from(["eureka-operator", "--cluster-name", "Prod_1"]).unwrap_err();
        assert!(refused.to_string().contains("is not a cluster name"), "{refused}");
    }

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    /// No flag goes undocumented: each has help text (its doc comment, which the generated flags
    /// page `docs/src/reference/flags.md` shows; `readme::the_reference_pages_are_current` checks
    /// that page is current) and an environment variable.
    #[test]
    fn every_flag_has_help_and_a_variable() {
        for arg in Args::command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(!help.trim().is_empty(), "--{long} has no help (its doc comment)");
            assert!(arg.get_env().is_some(), "--{long} has no environment variable");
        }
    }

    #[test]
    fn defaults_mirror_spring() {
        let args = Args::parse_from(["eureka-operator"]);
        assert_eq!(args.bind.port(), 8761);
        let c = args.server.registry_config();
        assert!(c.preservation.enable_self_preservation);
        assert_eq!(c.preservation.renewal_percent_threshold, 0.85);
        assert_eq!(c.eviction_interval_timer_in_ms, 60_000);
        assert_eq!(c.retention_time_in_ms_in_delta_queue, 180_000);
        let off = Args::parse_from([
            "eureka-operator",
            "--enable-self-preservation",
            "false",
            "--lease-expiry",
            "java",
        ]);
        assert!(!off.server.registry_config().preservation.enable_self_preservation);
        assert_eq!(off.server.registry_config().lease_expiry, ExpiryMode::Java);
    }
}
