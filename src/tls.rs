//! TLS with rustls (the `ring` provider, the one the Kubernetes client already uses): the Eureka
//! API's certificate, reloaded when its files change, and the client configuration replicas use
//! to reach `https://` peers.
//!
//! * **Serving.** [`ServerTls`] reads a PEM certificate chain and key and hands rustls a resolver
//!   that answers every handshake with the current pair. [`ServerTls::watch`] re-reads both files
//!   every `--tls-reload-interval-ms` and swaps the pair in when their contents changed, so a
//!   Secret that cert-manager renews (and the kubelet rewrites in the pod through its `..data`
//!   symlink) is used by the next connection without a restart. The files are compared by
//!   content, not by modification time: the kubelet's symlink swap keeps the old mtimes visible
//!   through the link. A pair that does not load (a key written before its certificate, a key
//!   that does not match) keeps the previous pair in use and is retried at the next check.
//! * **Peers.** [`peer_client_config`] trusts the system roots and/or a CA bundle, and can
//!   verify every peer's certificate for one configured name instead of the host in its URL:
//!   replicas found through the headless Service are reached by pod IP, which no certificate
//!   can name, so they present the Service's certificate and are checked against its name.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("failed to parse the PEM certificates in {path}: {detail}")]
    Certificates { path: PathBuf, detail: String },
    #[error("failed to find a certificate in {path}")]
    NoCertificate { path: PathBuf },
    #[error("failed to find a private key in {path}: {detail}")]
    Key { path: PathBuf, detail: String },
    #[error("failed to pair the certificate {cert} with the key {key}: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("failed to trust the CA certificates in {path}: {detail}")]
    Trust { path: PathBuf, detail: String },
    #[error("failed to build the peer TLS verifier: no trusted certificate (no system roots and no CA file)")]
    NoRoots,
    #[error("failed to use {0:?} as the peer TLS server name")]
    ServerName(String),
    #[error("failed to build the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// The crypto provider of every TLS configuration built here.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes `ring` the process-wide rustls provider, if none is yet: reqwest is built without a
/// provider of its own (it would bring aws-lc-rs, a second, C-built one) and asks for the
/// process default whenever a client is built. Call it before building any reqwest client.
pub fn install_default_provider() {
    if CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: one provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

// === serving ===

/// Where the API's certificate and key are, and how often they are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub reload_interval: Duration,
}

/// `eureka_tls_reload_failing` (1 while the changed files do not load) and
/// `eureka_tls_reload_failures_total`; registered with or without TLS (then 0).
#[derive(Clone, Debug, Default)]
pub struct ReloadMetrics {
    pub failing: prometheus_client::metrics::gauge::Gauge,
    pub failures: prometheus_client::metrics::counter::Counter,
}

impl ReloadMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let r = registry.sub_registry_with_prefix("tls");
        r.register(
            "reload_failing",
            "1 while the certificate files changed but do not load (the previous certificate is served)",
            self.failing.clone(),
        );
        r.register(
            "reload_failures",
            "Checks of changed certificate files that failed to load",
            self.failures.clone(),
        );
    }
}

/// The API's TLS: a rustls configuration whose certificate can be swapped while it serves.
pub struct ServerTls {
    settings: ServerTlsConfig,
    resolver: Arc<Resolver>,
    /// The file contents the current pair was built from.
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
    config: Arc<ServerConfig>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").field("settings", &self.settings).finish()
    }
}

/// Answers every handshake with the current certificate.
struct Resolver(ArcSwap<CertifiedKey>);

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Certificates {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// A certificate chain and its key, checked to belong together.
fn certified_key(settings: &ServerTlsConfig, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, Error> {
    let chain = certificates(&settings.cert_file, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| Error::Key {
        path: settings.key_file.clone(),
        detail: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|source| Error::Pair {
        cert: settings.cert_file.clone(),
        key: settings.key_file.clone(),
        source,
    })
}

impl ServerTls {
    /// Reads the certificate and key; an error names the file at fault.
    pub fn load(settings: ServerTlsConfig) -> Result<Arc<ServerTls>, Error> {
        let cert_pem = read(&settings.cert_file)?;
        let key_pem = read(&settings.key_file)?;
        let key = certified_key(&settings, &cert_pem, &key_pem)?;
        let resolver = Arc::new(Resolver(ArcSwap::from_pointee(key)));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(Error::Config)?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        // The listener speaks HTTP/1.1 only; a client offering h2 and http/1.1 gets http/1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(ServerTls {
            settings,
            resolver,
            loaded: Mutex::new((cert_pem, key_pem)),
            config: Arc::new(config),
        }))
    }

    /// The acceptor for the listener; it always uses the current certificate.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// Re-reads the files and swaps the pair in if they changed. `Ok(true)` when it did.
    pub fn reload(&self) -> Result<bool, Error> {
        let cert_pem = read(&self.settings.cert_file)?;
        let key_pem = read(&self.settings.key_file)?;
        let mut loaded = self.loaded.lock();
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(&self.settings, &cert_pem, &key_pem)?;
        self.resolver.0.store(Arc::new(key));
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }

    /// Checks the files every reload interval until `shutdown` resolves.
    pub async fn watch(self: Arc<ServerTls>, metrics: ReloadMetrics, shutdown: impl Future<Output = ()>) {
        let mut tick = tokio::time::interval(self.settings.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        tokio::pin!(shutdown);
        // Logged once per distinct failure, not at every check.
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {}
            }
            let this = self.clone();
            let result = tokio::task::spawn_blocking(move || this.reload()).await;
            match result {
                Ok(Ok(true)) => {
                    last_error = None;
                    metrics.failing.set(0);
                    tracing::info!(cert = %self.settings.cert_file.display(), "reloaded the TLS certificate");
                }
                Ok(Ok(false)) => {
                    last_error = None;
                    metrics.failing.set(0);
                }
                Ok(Err(e)) => {
                    metrics.failing.set(1);
                    metrics.failures.inc();
                    let message = e.to_string();
                    if last_error.as_deref() != Some(message.as_str()) {
                        tracing::warn!(error = %message, "failed to reload the TLS certificate; serving the previous one");
                        last_error = Some(message);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "failed to run the TLS certificate check"),
            }
        }
    }
}

// === peers ===

/// How replicas check the certificates of `https://` peers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerTlsConfig {
    /// A PEM bundle of CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// Whether the system's roots are trusted too.
    pub system_roots: bool,
    /// Verify every peer for this name instead of the host in its URL.
    pub server_name: Option<String>,
}

/// The TLS client configurations toward peers.
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// For our replicas: the configured roots, and the name override if any.
    pub replicas: ClientConfig,
    /// For Java peers: the same roots, their URL's host as the name.
    pub others: ClientConfig,
}

/// Both peer configurations: a Java server's certificate names its own host, never our Service.
pub fn peer_tls(settings: &PeerTlsConfig) -> Result<PeerTls, Error> {
    let others = PeerTlsConfig {
        server_name: None,
        ..settings.clone()
    };
    Ok(PeerTls {
        replicas: peer_client_config(settings)?,
        others: peer_client_config(&others)?,
    })
}

/// The client configuration for peers: HTTP/1.1, the configured roots, and the name override.
pub fn peer_client_config(settings: &PeerTlsConfig) -> Result<ClientConfig, Error> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    if settings.system_roots {
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::debug!(error = %e, "skipped a system root certificate source");
        }
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, ignored, "system root certificates for peers");
    }
    if let Some(path) = &settings.ca_file {
        let pem = read(path)?;
        let certs = certificates(path, &pem).map_err(|e| Error::Trust {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        for cert in certs {
            roots.add(cert).map_err(|e| Error::Trust {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        }
    }
    if roots.is_empty() {
        return Err(Error::NoRoots);
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| Error::Trust {
            path: settings.ca_file.clone().unwrap_or_default(),
            detail: e.to_string(),
        })?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::Config)?;
    let mut config = match &settings.server_name {
        None => builder.with_webpki_verifier(webpki).with_no_client_auth(),
        Some(name) => {
            let name = ServerName::try_from(name.trim().to_string()).map_err(|_| Error::ServerName(name.clone()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(FixedName { name, inner: webpki }))
                .with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Full WebPKI verification (chain, validity, signatures), for a fixed name instead of the
/// URL's host. Only the name changes: nothing is skipped.
#[derive(Debug)]
struct FixedName {
    name: ServerName<'static>,
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for FixedName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        ca: rcgen::Issuer<'static, rcgen::KeyPair>,
        ca_pem: String,
    }

    fn pki() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            ca: rcgen::Issuer::new(params, key),
        }
    }

    fn leaf(pki: &Pki, name: &str) -> (String, String) {
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &pki.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn settings(dir: &Path) -> ServerTlsConfig {
        ServerTlsConfig {
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
            reload_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_changed_pair_is_swapped_in_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let pki = pki();
        let (c1, k1) = leaf(&pki, "one.example");
        std::fs::write(&s.cert_file, &c1).unwrap();
        std::fs::write(&s.key_file, &k1).unwrap();
        let tls = ServerTls::load(s.clone()).unwrap();
        let first = tls.resolver.0.load_full();
        assert!(!tls.reload().unwrap(), "unchanged files are not reloaded");

        // The certificate is rewritten before its key: the pair does not match yet.
        let (c2, k2) = leaf(&pki, "two.example");
        std::fs::write(&s.cert_file, &c2).unwrap();
        assert!(matches!(tls.reload(), Err(Error::Pair { .. })));
        assert!(Arc::ptr_eq(&tls.resolver.0.load_full(), &first));

        std::fs::write(&s.key_file, &k2).unwrap();
        assert!(tls.reload().unwrap());
        let second = tls.resolver.0.load_full();
        assert!(!Arc::ptr_eq(&second, &first));
        assert_eq!(
            second.cert[0].as_ref(),
            certificates(&s.cert_file, c2.as_bytes()).unwrap()[0].as_ref()
        );
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let missing = ServerTls::load(s.clone()).unwrap_err();
        assert!(missing.to_string().starts_with("failed to read"), "{missing}");
        std::fs::write(&s.cert_file, "not pem").unwrap();
        std::fs::write(&s.key_file, "not pem").unwrap();
        let e = ServerTls::load(s.clone()).unwrap_err();
        assert!(matches!(e, Error::NoCertificate { .. }), "{e}");
        let (c, _) = leaf(&pki(), "x.example");
        std::fs::write(&s.cert_file, c).unwrap();
        let e = ServerTls::load(s).unwrap_err();
        assert!(matches!(e, Error::Key { .. }), "{e}");
        assert!(e.to_string().contains("tls.key"), "{e}");
    }

    #[test]
    fn peer_trust_needs_a_root_and_a_valid_name() {
        let none = PeerTlsConfig::default();
        assert!(matches!(peer_client_config(&none), Err(Error::NoRoots)));
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, pki().ca_pem).unwrap();
        let ok = PeerTlsConfig {
            ca_file: Some(ca.clone()),
            system_roots: false,
            server_name: Some("eureka.eureka-system.svc".into()),
        };
        peer_client_config(&ok).unwrap();
        let bad = PeerTlsConfig {
            server_name: Some("not a name".into()),
            ..ok
        };
        assert!(matches!(peer_client_config(&bad), Err(Error::ServerName(_))));
    }
}
