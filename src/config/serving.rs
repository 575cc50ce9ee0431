//! Flags of the HTTP layer: timeouts and limits of both listeners (the Eureka API and the admin
//! endpoints), TLS for the Eureka API, and how replicas trust their peers' certificates. Kept
//! apart from `Args` so the serving code ([`crate::api::server`]) takes one plain value,
//! [`HttpConfig`], and the TLS code ([`crate::tls`]) its own.

use std::{path::PathBuf, time::Duration};

use clap::Args as ClapArgs;

use crate::tls::{PeerTlsConfig, ServerTlsConfig};

/// HTTP timeouts and limits, and TLS.
#[derive(Clone, Debug, ClapArgs)]
pub struct ServingArgs {
    /// How long a connection may take to send a complete request head, counted from when it is
    /// ready for one (accepted, or done with its previous response): also the idle keep-alive
    /// timeout, and the limit of a TLS handshake.
    #[arg(long, env = "EUREKA_HTTP_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub http_header_read_timeout_ms: u64,

    /// Longest a request may take from its head to its answer, body included (408 after).
    #[arg(long, env = "EUREKA_HTTP_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub http_request_timeout_ms: u64,

    /// Longest a request body may take to arrive, from the first to the last byte (408 after).
    #[arg(long, env = "EUREKA_HTTP_BODY_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub http_body_read_timeout_ms: u64,

    /// Open connections per listener; up to as many again are answered 503 with `Retry-After`
    /// and closed, beyond that new connections are closed at once.
    #[arg(long, env = "EUREKA_HTTP_MAX_CONNECTIONS", default_value_t = 8_192)]
    pub http_max_connections: usize,

    /// Requests handled at once per listener; more are answered 503 with `Retry-After` at once (plain heartbeats, answered from their head in front of this limit, are never shed).
    #[arg(long, env = "EUREKA_HTTP_MAX_IN_FLIGHT_REQUESTS", default_value_t = 512)]
    pub http_max_in_flight_requests: usize,

    /// Largest request head (request line and headers) in bytes, at least 8192 (431 beyond).
    #[arg(long, env = "EUREKA_HTTP_MAX_HEADER_BYTES", default_value_t = 65_536)]
    pub http_max_header_bytes: usize,

    /// Most headers in a request (431 beyond).
    #[arg(long, env = "EUREKA_HTTP_MAX_HEADERS", default_value_t = 100)]
    pub http_max_headers: usize,

    /// The `Retry-After` (seconds) of a 503 sent under load.
    #[arg(long, env = "EUREKA_HTTP_RETRY_AFTER_SECONDS", default_value_t = 1)]
    pub http_retry_after_seconds: u32,

    /// How long shutdown waits for open requests to finish.
    #[arg(long, env = "EUREKA_HTTP_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    pub http_shutdown_grace_ms: u64,

    /// PEM certificate chain for the Eureka API; with `--tls-key-file` the API is served over
    /// HTTPS only. Reloaded when the file changes (a renewed, mounted Secret).
    #[arg(long, env = "EUREKA_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `--tls-cert-file`; reloaded with it.
    #[arg(long, env = "EUREKA_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// How often the certificate and key files are checked for changes.
    #[arg(long, env = "EUREKA_TLS_RELOAD_INTERVAL_MS", default_value_t = 10_000)]
    pub tls_reload_interval_ms: u64,

    /// PEM CA bundle trusted for `https://` peers (replicas and Java servers), in addition to
    /// the system roots unless `--peer-tls-system-roots false`.
    #[arg(long, env = "EUREKA_PEER_TLS_CA_FILE")]
    pub peer_tls_ca_file: Option<PathBuf>,

    /// Also trust the system's root certificates for `https://` peers.
    #[arg(long, env = "EUREKA_PEER_TLS_SYSTEM_ROOTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub peer_tls_system_roots: bool,

    /// Verify peers' certificates for this name instead of the host in their URL (replicas
    /// found by pod IP then present the Service's certificate).
    #[arg(long, env = "EUREKA_PEER_TLS_SERVER_NAME")]
    pub peer_tls_server_name: Option<String>,
}

impl ServingArgs {
    /// The timeouts and limits, each at least 1 (ms or unit): a zero would refuse everything.
    pub fn http(&self) -> crate::api::server::HttpConfig {
        let ms = |v: u64| Duration::from_millis(v.max(1));
        crate::api::server::HttpConfig {
            header_read_timeout: ms(self.http_header_read_timeout_ms),
            request_timeout: ms(self.http_request_timeout_ms),
            body_read_timeout: ms(self.http_body_read_timeout_ms),
            max_connections: self.http_max_connections.max(1),
            max_in_flight_requests: self.http_max_in_flight_requests.max(1),
            max_header_bytes: self.http_max_header_bytes.max(crate::api::server::MIN_HEADER_BYTES),
            max_headers: self.http_max_headers.max(1),
            retry_after_seconds: self.http_retry_after_seconds,
            shutdown_grace: Duration::from_millis(self.http_shutdown_grace_ms),
        }
    }

    /// TLS for the Eureka API, when a certificate and key are given.
    pub fn server_tls(&self) -> Option<ServerTlsConfig> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(ServerTlsConfig {
                cert_file: cert.clone(),
                key_file: key.clone(),
                reload_interval: Duration::from_millis(self.tls_reload_interval_ms.max(100)),
            }),
            _ => None,
        }
    }

    /// How peers' certificates are checked; `None` for the system roots alone (reqwest's own).
    pub fn peer_tls(&self) -> Option<PeerTlsConfig> {
        let settings = PeerTlsConfig {
            ca_file: self.peer_tls_ca_file.clone(),
            system_roots: self.peer_tls_system_roots,
            server_name: self.peer_tls_server_name.clone().filter(|s| !s.trim().is_empty()),
        };
        let default = settings.ca_file.is_none() && settings.system_roots && settings.server_name.is_none();
        (!default).then_some(settings)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Args;

    #[test]
    fn defaults_match_the_settings_default() {
        let args = Args::parse_from(["eureka-operator"]);
        assert_eq!(args.serving.http(), crate::api::server::HttpConfig::default());
        assert!(args.serving.server_tls().is_none());
        assert!(args.serving.peer_tls().is_none());
        let args = Args::parse_from(["eureka-operator", "--peer-tls-system-roots", "false"]);
        let peer = args.serving.peer_tls().unwrap();
        assert!(!peer.system_roots && peer.ca_file.is_none());
    }

    #[test]
    fn zeros_become_the_smallest_useful_value() {
        let args = Args::parse_from([
            "eureka-operator",
            "--http-max-connections",
            "0",
            "--http-max-in-flight-requests",
            "0",
            "--http-header-read-timeout-ms",
            "0",
            "--http-max-header-bytes",
            "10",
        ]);
        let s = args.serving.http();
        assert_eq!((s.max_connections, s.max_in_flight_requests), (1, 1));
        assert_eq!(s.max_header_bytes, crate::api::server::MIN_HEADER_BYTES);
        assert_eq!(s.header_read_timeout, Duration::from_millis(1));
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let err = Args::try_parse_from(["eureka-operator", "--tls-cert-file", "/tls/tls.crt"]).unwrap_err();
        assert!(err.to_string().contains("--tls-key-file"), "{err}");
        let args = Args::parse_from([
            "eureka-operator",
            "--tls-cert-file",
            "/tls/tls.crt",
            "--tls-key-file",
            "/tls/tls.key",
        ]);
        let tls = args.serving.server_tls().unwrap();
        assert_eq!(tls.key_file, PathBuf::from("/tls/tls.key"));
        assert_eq!(tls.reload_interval, Duration::from_secs(10));
    }
}
