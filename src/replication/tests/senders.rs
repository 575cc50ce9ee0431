//! The per-peer senders against a peer on a local socket: batching, shutdown flushes, removal.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::{codec::batch, leadership::Lead, supervisor::Supervisor};

/// A peer that answers 200 to every item; each batch's size is recorded.
async fn peer() -> (PeerUrl, Arc<Mutex<Vec<usize>>>) {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let seen = batches.clone();
    let answer = move |body: axum::body::Bytes| {
        let seen = seen.clone();
        async move {
            let items = batch::decode_list(&body, 0).expect("a replication batch").len();
            seen.lock().push(items);
            let ok = batch::ItemResponse {
                status_code: 200,
                entity: None,
            };
            batch::encode_response(&vec![ok; items])
        }
    };
    let app = axum::Router::new().route("/eureka/peerreplication/batch/", axum::routing::post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = PeerUrl::parse(&format!("http://{}/eureka/", listener.local_addr().unwrap())).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, batches)
}

/// A URL where nothing listens (connections are refused).
async fn away() -> PeerUrl {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/eureka/", listener.local_addr().unwrap());
    drop(listener);
    PeerUrl::parse(&url).unwrap()
}

fn java(url: &PeerUrl) -> Peer {
    Peer {
        url: url.clone(),
        kind: PeerKind::Java,
        ready: true,
    }
}

struct Running {
    replicator: Arc<Replicator>,
    state: AppState,
    peers: watch::Sender<Vec<Peer>>,
    supervisor: Supervisor,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// A replicator running with `peers`, batches waiting `max_delay`.
async fn running(peers: Vec<Peer>, max_delay: Duration) -> Running {
    let settings = ReplicationConfig {
        limits: Limits {
            capacity: 1000,
            max_age: Duration::from_secs(60),
            max_delay,
        },
        connect_timeout: Duration::from_secs(1),
        read_timeout: Duration::from_secs(5),
        replica_id: "test".into(),
        credentials: None,
        java_heartbeat_interval: Duration::from_secs(30),
        anti_entropy_interval: Duration::from_secs(60),
        flush_timeout: Duration::from_secs(5),
        tls: None,
    };
    let state = AppState::open_for_tests();
    let (_lead, leader) = watch::channel(Lead::Always);
    let (_id, cluster_id) = watch::channel(None);
    let health = Health::new(Arc::new(AtomicBool::new(true)));
    let replicator = Replicator::new(
        state.clone(),
        leader,
        settings,
        ReplicationMetrics::default(),
        health,
        cluster_id,
    );
    state.add_listener(replicator.clone());
    let wanted = peers.len();
    let (tx, rx) = watch::channel(peers);
    let supervisor = Supervisor::new(Duration::from_secs(10));
    let task = tokio::spawn(replicator.clone().run(rx, supervisor.shutdown()));
    let r = Running {
        replicator,
        state,
        peers: tx,
        supervisor,
        task,
    };
    r.queues(wanted).await;
    r
}

impl Running {
    fn register(&self, id: &str) {
        let mut info = InstanceInfo::new("A", &format!("{id}.example"), "10.0.0.1", self.state.now());
        info.instance_id = Some(id.into());
        self.state.apply(Command::Register {
            info,
            writer: Writer::Client,
        });
    }

    /// Waits until the replicator has `n` queues.
    async fn queues(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while self.replicator.queues_of(None).len() != n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the peer list applied");
    }

    fn queued(&self) -> usize {
        self.replicator
            .queues_of(None)
            .iter()
            .map(|q| q.batcher.lock().len())
            .sum()
    }

    /// Stops the process; returns how long the replicator took to end.
    async fn shut_down(self) -> Duration {
        let started = Instant::now();
        self.supervisor.run(async {}).await.expect("no task failed");
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the replicator ends");
        ended.expect("no panic").expect("a clean end");
        started.elapsed()
    }
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test]
async fn tasks_go_in_one_batch_when_the_oldest_has_waited() {
    let (url, batches) = peer().await;
    let r = running(vec![java(&url)], Duration::from_millis(200)).await;
    for id in ["a1", "a2", "a3"] {
        r.register(id);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(batches.lock().is_empty(), "sent before the batching delay");
    eventually("the batch", || !batches.lock().is_empty()).await;
    assert_eq!(*batches.lock(), vec![3]);
    assert_eq!(r.queued(), 0);
    r.shut_down().await;
}

#[tokio::test]
async fn a_shutdown_flushes_what_waits_to_be_batched() {
    let (url, batches) = peer().await;
    // Batches wait 30 s: only the flush can deliver in time.
    let r = running(vec![java(&url)], Duration::from_secs(30)).await;
    r.register("a1");
    r.register("a2");
    let took = r.shut_down().await;
    assert_eq!(*batches.lock(), vec![2]);
    assert!(took < Duration::from_secs(2), "the flush took {took:?}");
}

#[tokio::test]
async fn a_shutdown_does_not_retry_toward_a_peer_that_is_away() {
    let r = running(vec![java(&away().await)], Duration::from_secs(30)).await;
    r.register("a1");
    let took = r.shut_down().await;
    // One try, no backoff, well within the flush timeout (5 s).
    assert!(took < Duration::from_secs(2), "the flush took {took:?}");
}

#[tokio::test]
async fn a_removed_peer_loses_its_queue_and_its_sender() {
    let (url, batches) = peer().await;
    let r = running(vec![java(&url)], Duration::from_secs(30)).await;
    r.register("a1");
    assert_eq!(r.queued(), 1);
    let old = r.replicator.queues_of(None).remove(0);
    r.peers.send_replace(Vec::new());
    r.queues(0).await;
    // What it held is counted as dropped (without a peer label), and its own series are gone.
    let mut registry = prometheus_client::registry::Registry::default();
    r.replicator.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.lines()
            .any(|l| l == r#"replication_dropped_total{peer="",reason="peer_removed"} 1"#),
        "the removed peer's unsent task is counted:\n{text}"
    );
    let peer = format!("peer=\"{}\"", old.labels().peer);
    assert!(!text.contains(&peer), "the removed peer's series remain:\n{text}");
    // Its sender ended: nothing else holds the old queue.
    eventually("the sender to end", || Arc::strong_count(&old) == 1).await;
    // Back in the list: a new queue, without what the old one held.
    r.peers.send_replace(vec![java(&url)]);
    r.queues(1).await;
    assert_eq!(r.queued(), 0);
    r.register("a2");
    r.shut_down().await;
    assert_eq!(
        *batches.lock(),
        vec![1],
        "only the task queued after the peer came back"
    );
}

/// `eureka_replication_peer_up`: 1 once a peer answered, 0 once it could not be reached; every
/// failure class and drop reason of a peer has a series from the start (at 0).
#[tokio::test]
async fn peer_up_follows_what_the_last_attempt_met() {
    let (url, _batches) = peer().await;
    let gone = away().await;
    let r = running(vec![java(&url), java(&gone)], Duration::from_millis(10)).await;
    let mut registry = prometheus_client::registry::Registry::default();
    r.replicator.metrics.register(&mut registry);
    let text = || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    };
    let before = text();
    assert!(
        !before.contains("replication_peer_up{"),
        "no series before an attempt:\n{before}"
    );
    for class in ["congestion", "network", "unauthorized", "permanent"] {
        assert!(
            before.contains(&format!("class=\"{class}\"}} 0")),
            "{class} not at 0:\n{before}"
        );
    }
    assert!(before.contains("reason=\"overflow\"} 0"), "{before}");
    r.register("a1");
    let up = |u: &PeerUrl| {
        let peer = format!("peer=\"{}\"", u.display());
        let line = text()
            .lines()
            .find(|l| l.starts_with("replication_peer_up{") && l.contains(&peer))
            .map(str::to_string);
        line.map(|l| l.ends_with(" 1"))
    };
    eventually("both peers tried", || up(&url).is_some() && up(&gone).is_some()).await;
    assert_eq!(up(&url), Some(true), "{}", text());
    assert_eq!(up(&gone), Some(false), "{}", text());
    r.shut_down().await;
}
