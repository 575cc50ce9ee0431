//! Operator replicas wired for fault injection: each replica on its own 127.0.0.N; each directed
//! link between replicas through its own [`Proxy`] (replica i reaches replica j only through
//! `link(i, j)`, so a link can be cut one way); each replica's apiserver connection through its
//! own proxy; and optionally a Java Eureka peer that every replica reaches through its own proxy
//! and that reaches every replica through one more. Process faults (kill -9, SIGSTOP/SIGCONT,
//! SIGTERM, a restart on the same ports with the same flags) act on one replica's process.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use super::{
    cluster::Cluster,
    eureka::{JavaServer, http},
    operator::{Launch, Operator},
    process::{free_port, scratch_dir},
    proxy::{Proxy, ProxyStats},
};

/// What to start.
#[derive(Clone, Debug)]
pub struct MeshSpec {
    /// Namespace the replicas watch.
    pub namespace: String,
    /// The Lease they share (replica i is named `<lease>-<i>`).
    pub lease: String,
    /// Replica i listens on 127.0.0.(first_ip + i); the Java peer on the next address.
    pub first_ip: u8,
    pub replicas: usize,
    /// Flags for every replica (besides the peer URLs, which the mesh sets).
    pub args: Vec<String>,
    /// With a Java peer: its extra Spring properties (`--key=value`).
    pub java: Option<Vec<String>>,
}

/// The Java peer and its links.
pub struct JavaPeer {
    pub server: JavaServer,
    /// Replica i's connections to the Java server.
    pub to_java: Vec<Proxy>,
    /// The Java server's connections to replica i.
    pub from_java: Vec<Proxy>,
}

pub struct Mesh {
    pub replicas: Vec<Operator>,
    pub ips: Vec<Ipv4Addr>,
    /// Each replica's own Eureka URL (what clients use; not proxied).
    pub urls: Vec<String>,
    links: BTreeMap<(usize, usize), Proxy>,
    apiserver: Vec<Proxy>,
    pub java: Option<JavaPeer>,
    /// Logs of replica processes that were replaced by a restart.
    archive: tempfile::TempDir,
    /// Per replica, how many processes it had so far.
    generations: Vec<usize>,
}

impl Mesh {
    /// Starts the proxies, the Java peer (if any, and waits for it), then the replicas one by
    /// one, each waited for until ready. `None` when the Java peer is missing outside CI.
    pub async fn start(cluster: &Cluster, spec: MeshSpec) -> Option<Mesh> {
        let n = spec.replicas;
        let (ips, ports, urls) = super::process::replica_addresses(spec.first_ip, n);
        let mut links = BTreeMap::new();
        for from in 0..n {
            for to in 0..n {
                if from != to {
                    let target = SocketAddr::from((ips[to], ports[to].0));
                    links.insert((from, to), Proxy::start(ips[from], target).await);
                }
            }
        }
        let api: SocketAddr = cluster
            .url
            .trim_start_matches("https://")
            .parse()
            .expect("the apiserver URL is https://ip:port");
        let mut apiserver = Vec::new();
        for _ in 0..n {
            // On 127.0.0.1: the apiserver's certificate names that address.
            apiserver.push(Proxy::start(Ipv4Addr::LOCALHOST, api).await);
        }
        let java = match &spec.java {
            None => None,
            Some(extra) => {
                let java_ip = Ipv4Addr::new(127, 0, 0, spec.first_ip + n as u8);
                let java_port = free_port(java_ip);
                let java_addr = SocketAddr::from((java_ip, java_port));
                let mut to_java = Vec::new();
                let mut from_java = Vec::new();
                for i in 0..n {
                    to_java.push(Proxy::start(ips[i], java_addr).await);
                    from_java.push(Proxy::start(java_ip, SocketAddr::from((ips[i], ports[i].0))).await);
                }
                let zone: Vec<String> = from_java.iter().map(Proxy::url).collect();
                let mut flags = vec![
                    format!("--eureka.client.service-url.defaultZone={}", zone.join(",")),
                    // Its peers are the proxies (on its own address): say which URL is its own.
                    format!("--eureka.server.my-url=http://{java_ip}:{java_port}/eureka/"),
                    "--eureka.server.peer-eureka-nodes-update-interval-ms=1000".into(),
                ];
                flags.extend(extra.iter().cloned());
                let server = JavaServer::start_on(java_ip, java_port, &flags).await?;
                Some(JavaPeer {
                    server,
                    to_java,
                    from_java,
                })
            }
        };
        let mut replicas = Vec::new();
        for i in 0..n {
            let peers: Vec<String> = (0..n).filter(|j| *j != i).map(|j| links[&(i, j)].url()).collect();
            let mut args = vec!["--peer-urls".to_string(), peers.join(",")];
            if let Some(j) = &java {
                args.extend(["--java-peer-urls".to_string(), j.to_java[i].url()]);
            }
            args.extend(spec.args.iter().cloned());
            let mut launch = Launch::new(ips[i], &spec.namespace, &spec.lease);
            launch.extra = args;
            launch.ports = Some(ports[i]);
            launch.replica = format!("{}-{i}", spec.lease);
            launch.apiserver = Some(format!("https://{}", apiserver[i].addr));
            replicas.push(Operator::launch_with(cluster, launch).await);
        }
        Some(Mesh {
            replicas,
            ips,
            urls,
            links,
            apiserver,
            java,
            archive: scratch_dir("mesh-logs"),
            generations: vec![0; n],
        })
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Replica `from`'s connections to replica `to`.
    pub fn link(&self, from: usize, to: usize) -> &Proxy {
        &self.links[&(from, to)]
    }

    /// Replica `i`'s connections to the apiserver.
    pub fn apiserver(&self, i: usize) -> &Proxy {
        &self.apiserver[i]
    }

    fn java_peer(&self) -> &JavaPeer {
        self.java.as_ref().expect("this mesh has no Java peer")
    }

    /// Replica `i`'s connections to the Java peer.
    pub fn to_java(&self, i: usize) -> &Proxy {
        &self.java_peer().to_java[i]
    }

    /// The Java peer's connections to replica `i`.
    pub fn java_to(&self, i: usize) -> &Proxy {
        &self.java_peer().from_java[i]
    }

    /// The Java peer's own Eureka URL (not proxied).
    pub fn java_url(&self) -> String {
        self.java_peer().server.url()
    }

    /// Every proxy of the mesh.
    pub fn proxies(&self) -> Vec<&Proxy> {
        let mut all: Vec<&Proxy> = self.links.values().chain(&self.apiserver).collect();
        if let Some(j) = &self.java {
            all.extend(j.to_java.iter().chain(&j.from_java));
        }
        all
    }

    /// The sum of every proxy's counters.
    pub fn proxy_stats(&self) -> ProxyStats {
        let mut total = ProxyStats::default();
        for p in self.proxies() {
            total += p.stats();
        }
        total
    }

    /// Every proxy passes traffic again.
    pub fn heal_all(&self) {
        for p in self.proxies() {
            p.heal();
        }
    }

    /// kill -9 of replica `i` (it stays down until [`Mesh::respawn`]).
    pub fn kill(&mut self, i: usize) {
        self.replicas[i].server.proc.kill();
    }

    /// SIGTERM to replica `i`, SIGKILL after `grace`; whether it exited cleanly.
    pub fn terminate(&mut self, i: usize, grace: Duration) -> bool {
        self.replicas[i]
            .server
            .proc
            .terminate(grace)
            .is_some_and(|s| s.success())
    }

    /// Starts replica `i` again (same ports, same flags) without waiting for it; the log of the
    /// process it replaces is kept for [`Mesh::keep_logs`].
    pub fn respawn(&mut self, i: usize) {
        let old = self.replicas[i].server.proc.log_path().to_path_buf();
        let kept = self.archive.path().join(format!("r{i}-{}.log", self.generations[i]));
        let _ = std::fs::copy(old, kept);
        self.generations[i] += 1;
        self.replicas[i].spawn_again();
    }

    /// Copies every replica's logs (those of replaced processes too) and the Java peer's into
    /// `dest`, to read after a failed run.
    pub fn keep_logs(&self, dest: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dest)?;
        for entry in std::fs::read_dir(self.archive.path())? {
            let entry = entry?;
            std::fs::copy(entry.path(), dest.join(entry.file_name()))?;
        }
        for (i, r) in self.replicas.iter().enumerate() {
            std::fs::copy(
                r.server.proc.log_path(),
                dest.join(format!("r{i}-{}.log", self.generations[i])),
            )?;
        }
        if let Some(j) = &self.java {
            std::fs::copy(j.server.proc.log_path(), dest.join("java.log"))?;
        }
        Ok(())
    }

    /// SIGSTOP of replica `i`.
    pub fn freeze(&self, i: usize) {
        self.replicas[i].server.proc.freeze();
    }

    /// SIGCONT of replica `i`.
    pub fn thaw(&self, i: usize) {
        self.replicas[i].server.proc.resume();
    }

    /// Whether replica `i` answers `/readyz` with 200 within `timeout`.
    pub async fn ready(&self, i: usize, timeout: Duration) -> bool {
        let url = format!("{}/readyz", self.replicas[i].server.admin());
        http()
            .get(url)
            .timeout(timeout)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// Whether replica `i` says it holds the Lease (`None`: it did not answer).
    pub async fn leads(&self, i: usize, timeout: Duration) -> Option<bool> {
        let url = format!("{}/metrics", self.replicas[i].server.admin());
        let text = http().get(url).timeout(timeout).send().await.ok()?.text().await.ok()?;
        Some(text.lines().any(|l| l == "eureka_leader 1"))
    }
}
