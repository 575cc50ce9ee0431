//! The soak test (#9): three operator replicas (cluster mode, one Lease, every directed link
//! between them through its own proxy, each one's apiserver connection through its own proxy), a
//! Java Eureka server peered both ways through proxies, a few hundred pods under EurekaApps
//! (created and marked Ready by the test, some flipping readiness, some deleted and replaced), and
//! a few hundred simulated native clients (tokio tasks that register and heartbeat like Netflix's
//! client against an assigned replica or the Java server, fail over to the next replica when one
//! does not answer, register again after a 404, and sometimes cancel and register again), under
//! random faults drawn from a seeded generator: link cuts both ways and one way, black holes,
//! delays, one direction's bytes dropped, a replica cut off from the others, kill -9 and restart,
//! SIGTERM and restart, SIGSTOP, the apiserver cut from one or every replica, the Java links cut.
//!
//! Faults come in episodes (one fault, sometimes two at once); after each one heals the test
//! measures how long until every ready replica holds every live instance again. An invariant
//! checker fetches every replica's full registry about once a second, from the moment the
//! registries first converged to the end:
//!
//! * **Presence**: a live instance (a native client whose current registration is older than
//!   [`PROPAGATION`] and that renewed within its lease; a pod in the same state for that long) is
//!   in every registry a replica answers with 200, ready or not (ready means complete: there is no
//!   grace after a restart), with the right status, unless a fault on the instance's own write
//!   path explains its absence, one active within the last *bound* (`EO_SOAK_BOUND_SECS`, 15 s):
//!   the replica's process was frozen (SIGSTOP; a killed or restarted replica has no excuse once it
//!   answers); a pod changed while the replica's apiserver link was cut (a pod that existed before
//!   the cut and did not change must stay); the link into the replica from a server the client's
//!   registration and renewals went through was cut, unless that server is another replica and
//!   the replica led and could still pull from it, which anti-entropy must then do within
//!   [`ANTI_ENTROPY_GRACE`] (anti-entropy compares replicas only, never the Java peer); the client's
//!   registration went to a server killed or stopped just after. Faults of other links, of other
//!   replicas, delays and apiserver outages explain nothing. The absence must end within the bound
//!   after the fault heals.
//! * **Cancels**: an instance cancelled more than [`PROPAGATION`] ago is in no registry, unless a
//!   fault on the cancel's path (the server it went to, or the link from it into the replica)
//!   explains it within the bound.
//! * **One leader**: no two replicas report leading in the same round, and no replica evicts while
//!   another leads.
//! * **Convergence**: after each episode heals, every ready replica holds every live instance
//!   within the bound; every native client becomes live.
//! * **No live instance removed**: every heartbeat 404 a client gets is judged by the same rule
//!   (a 404 means the server lost the instance or never got it), and an absence on the very
//!   replica a client renews on is counted apart.
//! * **No duplicates**: no instance id twice in any replica's registry.
//!
//! One explanation is a limit of the protocol, counted apart instead of failing the test (it
//! does with `EO_SOAK_STRICT=1`): a client's `DELETE` taken by a stopped server (the client timed
//! out, failed over and registered again), or the Java server's replicated cancel taken by a
//! stopped replica, is acted on when the server resumes, possibly after the newer registration,
//! and removes it everywhere (neither carries a timestamp; Netflix's servers do the same). A
//! cancel held in a replica's replication queue behind a cut link is no excuse: our replicas'
//! cancels name the copy they removed, and a newer registration is kept.
//!
//! It prints the seed (`EO_SOAK_SEED` replays the fault sequence), the faults injected by kind,
//! what the proxies did, the client counters, what explained each absence, the convergence times
//! after each heal, and every violation (keeping every process's log under
//! `CARGO_TARGET_TMPDIR` when there is one); it fails unless there are none. Sizes:
//! `EO_SOAK_SECS` (faults for 120 s), `EO_SOAK_PODS` (200), `EO_SOAK_CLIENTS` (200);
//! `EO_SOAK_SELF_PRESERVATION=1` keeps self-preservation on (off by default, so that expired
//! leases are evicted and the eviction paths are exercised); `EO_SOAK_ONLY=kind,...` draws only
//! the named fault kinds.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use serde_json::Value;
use tokio::{sync::watch, time::Instant};

use crate::common::{
    eureka::{Native, http},
    mesh::{Mesh, MeshSpec},
    operator::{delete_pod, eureka_app, namespace, pod, prepared, set_ready},
    proxy::{Direction, Mode, Proxy},
    rng::Rng,
};

const REPLICAS: usize = 3;
/// The Java server's node number (replicas are 0..REPLICAS).
const JAVA: usize = REPLICAS;
const FIRST_IP: u8 = 201;
const NS: &str = "soak";
/// EurekaApps the pods are spread over.
const EUREKA_APPS: usize = 5;
/// Applications the native clients are spread over.
const NATIVE_APPS: usize = 8;
/// Native clients' lease and renewal interval.
const LEASE_SECS: u32 = 10;
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// A client's request timeout; then it tries the next server.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a write may take to reach every replica when nothing is broken.
const PROPAGATION: Duration = Duration::from_secs(3);
/// Probability that a client cancels (and registers again a little later) at a heartbeat.
const CHURN: f64 = 1.0 / 150.0;
/// The checker's pause between rounds.
const ROUND_EVERY: Duration = Duration::from_millis(500);
/// The soak's anti-entropy interval (`--anti-entropy-interval-ms`).
const ANTI_ENTROPY_EVERY: Duration = Duration::from_secs(2);
/// How long an instance renewing only behind a one-way cut may be missing on a leader that can
/// still pull it: two anti-entropy rounds and a fetch.
const ANTI_ENTROPY_GRACE: Duration = Duration::from_secs(6);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// === faults ===

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    CutBothWays,
    CutOneWay,
    Blackhole,
    Delay,
    DropOneDirection,
    Isolate,
    /// A replica cut off for longer than a client's lease several times over.
    LongIsolate,
    Kill,
    Restart,
    Stop,
    ApiserverCut,
    ApiserverCutAll,
    JavaCut,
    JavaCutOneWay,
}

impl Kind {
    const ALL: [(Kind, u32); 14] = [
        (Kind::CutBothWays, 3),
        (Kind::CutOneWay, 3),
        (Kind::Blackhole, 2),
        (Kind::Delay, 2),
        (Kind::DropOneDirection, 2),
        (Kind::Isolate, 2),
        (Kind::LongIsolate, 1),
        (Kind::Kill, 2),
        (Kind::Restart, 1),
        (Kind::Stop, 2),
        (Kind::ApiserverCut, 2),
        (Kind::ApiserverCutAll, 1),
        (Kind::JavaCut, 1),
        (Kind::JavaCutOneWay, 1),
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::CutBothWays => "link-cut-both-ways",
            Kind::CutOneWay => "link-cut-one-way",
            Kind::Blackhole => "link-blackhole",
            Kind::Delay => "link-delay",
            Kind::DropOneDirection => "link-drop-one-direction",
            Kind::Isolate => "replica-isolated",
            Kind::LongIsolate => "replica-isolated-long",
            Kind::Kill => "kill-9-restart",
            Kind::Restart => "sigterm-restart",
            Kind::Stop => "sigstop",
            Kind::ApiserverCut => "apiserver-cut-one",
            Kind::ApiserverCutAll => "apiserver-cut-all",
            Kind::JavaCut => "java-cut-both-ways",
            Kind::JavaCutOneWay => "java-cut-one-way",
        }
    }

    fn process(self) -> bool {
        matches!(self, Kind::Kill | Kind::Restart | Kind::Stop)
    }
}

/// A proxy of the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Replica(usize, usize),
    Apiserver(usize),
    ToJava(usize),
    FromJava(usize),
}

fn proxy(mesh: &Mesh, link: Link) -> &Proxy {
    match link {
        Link::Replica(a, b) => mesh.link(a, b),
        Link::Apiserver(r) => mesh.apiserver(r),
        Link::ToJava(r) => mesh.to_java(r),
        Link::FromJava(r) => mesh.java_to(r),
    }
}

#[derive(Clone, Debug)]
enum Act {
    Net(Vec<(Link, Mode)>),
    Kill(usize),
    Restart(usize),
    Stop(usize),
}

/// A fault to inject, and what it can keep from whom.
#[derive(Clone, Debug)]
struct Planned {
    kind: Kind,
    what: String,
    act: Act,
    hold: Duration,
    /// Directed links (from node, to node) that stop carrying writes.
    blocked: Vec<(usize, usize)>,
    /// Replicas whose process is affected.
    procs: Vec<usize>,
    /// Replicas whose apiserver link is affected.
    api: Vec<usize>,
}

/// A fault as injected.
#[derive(Clone, Debug)]
struct FaultRec {
    kind: Kind,
    what: String,
    start: Instant,
    /// When it healed (a restarted replica: when it was ready again).
    end: Option<Instant>,
    blocked: Vec<(usize, usize)>,
    procs: Vec<usize>,
    api: Vec<usize>,
}

impl FaultRec {
    fn active_within(&self, from: Instant, to: Instant) -> bool {
        self.start <= to && self.end.is_none_or(|e| e >= from)
    }
}

fn node(n: usize) -> String {
    if n == JAVA { "java".into() } else { format!("r{n}") }
}

fn two(rng: &mut Rng) -> (usize, usize) {
    let a = rng.below(REPLICAS as u64) as usize;
    let b = (a + 1 + rng.below(REPLICAS as u64 - 1) as usize) % REPLICAS;
    (a, b)
}

/// Draws a fault of `kind`; `leader` (if known) is the target of half the process faults.
fn draw(rng: &mut Rng, kind: Kind, leader: Option<usize>) -> Planned {
    let replica = |rng: &mut Rng| match leader {
        Some(l) if rng.chance(0.5) => l,
        _ => rng.below(REPLICAS as u64) as usize,
    };
    let span = |rng: &mut Rng, lo: u64, hi: u64| rng.duration(Duration::from_secs(lo), Duration::from_secs(hi));
    let mut p = Planned {
        kind,
        what: String::new(),
        act: Act::Net(Vec::new()),
        hold: span(rng, 2, 12),
        blocked: Vec::new(),
        procs: Vec::new(),
        api: Vec::new(),
    };
    match kind {
        Kind::CutBothWays => {
            let (a, b) = two(rng);
            p.what = format!("r{a}<->r{b} refused");
            p.act = Act::Net(vec![
                (Link::Replica(a, b), Mode::Refuse),
                (Link::Replica(b, a), Mode::Refuse),
            ]);
            p.blocked = vec![(a, b), (b, a)];
        }
        Kind::CutOneWay => {
            let (a, b) = two(rng);
            p.what = format!("r{a}->r{b} refused");
            p.act = Act::Net(vec![(Link::Replica(a, b), Mode::Refuse)]);
            p.blocked = vec![(a, b)];
        }
        Kind::Blackhole => {
            let (a, b) = two(rng);
            let both = rng.chance(0.5);
            let mut links = vec![(Link::Replica(a, b), Mode::Blackhole)];
            p.blocked = vec![(a, b)];
            if both {
                links.push((Link::Replica(b, a), Mode::Blackhole));
                p.blocked.push((b, a));
            }
            p.what = format!("r{a}{}r{b} black-holed", if both { "<->" } else { "->" });
            p.act = Act::Net(links);
        }
        Kind::Delay => {
            let (a, b) = two(rng);
            let ms = |rng: &mut Rng| rng.duration(Duration::from_millis(20), Duration::from_millis(800));
            let (u1, d1, u2, d2) = (ms(rng), ms(rng), ms(rng), ms(rng));
            p.what = format!(
                "r{a}->r{b} +{}/{} ms, r{b}->r{a} +{}/{} ms",
                u1.as_millis(),
                d1.as_millis(),
                u2.as_millis(),
                d2.as_millis()
            );
            p.act = Act::Net(vec![
                (Link::Replica(a, b), Mode::Delay { up: u1, down: d1 }),
                (Link::Replica(b, a), Mode::Delay { up: u2, down: d2 }),
            ]);
            p.hold = span(rng, 3, 12);
        }
        Kind::DropOneDirection => {
            let (a, b) = two(rng);
            let dir = if rng.chance(0.5) {
                Direction::Up
            } else {
                Direction::Down
            };
            p.what = format!(
                "r{a}->r{b}: {} dropped",
                if dir == Direction::Up { "requests" } else { "answers" }
            );
            p.act = Act::Net(vec![(Link::Replica(a, b), Mode::Drop(dir))]);
            p.blocked = vec![(a, b)];
        }
        Kind::Isolate | Kind::LongIsolate => {
            let r = replica(rng);
            if kind == Kind::LongIsolate {
                p.hold = span(rng, 30, 60);
            }
            let mut links = Vec::new();
            for o in (0..REPLICAS).filter(|o| *o != r) {
                links.push((Link::Replica(r, o), Mode::Refuse));
                links.push((Link::Replica(o, r), Mode::Refuse));
                p.blocked.extend([(r, o), (o, r)]);
            }
            p.what = format!("r{r} cut off from the other replicas for {:.0} s", secs(p.hold));
            p.act = Act::Net(links);
        }
        Kind::Kill => {
            let r = replica(rng);
            p.hold = rng.duration(Duration::from_millis(500), Duration::from_secs(4));
            p.what = format!("kill -9 r{r}, restart after {:.1} s", secs(p.hold));
            p.act = Act::Kill(r);
            p.procs = vec![r];
        }
        Kind::Restart => {
            let r = replica(rng);
            p.hold = rng.duration(Duration::ZERO, Duration::from_secs(2));
            p.what = format!("SIGTERM r{r}, restart after {:.1} s", secs(p.hold));
            p.act = Act::Restart(r);
            p.procs = vec![r];
        }
        Kind::Stop => {
            let r = replica(rng);
            p.hold = span(rng, 2, 8);
            p.what = format!("SIGSTOP r{r} for {:.1} s", secs(p.hold));
            p.act = Act::Stop(r);
            p.procs = vec![r];
        }
        Kind::ApiserverCut | Kind::ApiserverCutAll => {
            let targets: Vec<usize> = if kind == Kind::ApiserverCut {
                vec![replica(rng)]
            } else {
                (0..REPLICAS).collect()
            };
            let mode = if rng.chance(0.5) { Mode::Refuse } else { Mode::Blackhole };
            p.hold = span(rng, 3, 15);
            p.what = format!(
                "apiserver {} for {}",
                if mode == Mode::Refuse { "refused" } else { "black-holed" },
                targets.iter().map(|r| node(*r)).collect::<Vec<_>>().join(",")
            );
            p.act = Act::Net(targets.iter().map(|r| (Link::Apiserver(*r), mode)).collect());
            p.api = targets;
        }
        Kind::JavaCut | Kind::JavaCutOneWay => {
            let (to, from) = if kind == Kind::JavaCut {
                (true, true)
            } else {
                let to = rng.chance(0.5);
                (to, !to)
            };
            let mode = if rng.chance(0.5) { Mode::Refuse } else { Mode::Blackhole };
            let mut links = Vec::new();
            for r in 0..REPLICAS {
                if to {
                    links.push((Link::ToJava(r), mode));
                    p.blocked.push((r, JAVA));
                }
                if from {
                    links.push((Link::FromJava(r), mode));
                    p.blocked.push((JAVA, r));
                }
            }
            p.hold = span(rng, 3, 15);
            p.what = format!(
                "{} {}",
                match (to, from) {
                    (true, true) => "replicas<->java",
                    (true, false) => "replicas->java",
                    _ => "java->replicas",
                },
                if mode == Mode::Refuse { "refused" } else { "black-holed" }
            );
            p.act = Act::Net(links);
        }
    }
    p
}

// === what the test knows ===

struct ClientSpec {
    app: String,
    id: String,
    /// Servers in the order the client tries them (node numbers).
    servers: Vec<usize>,
}

#[derive(Clone, Default)]
struct ClientRec {
    /// Registered (its last registration was answered 204, no 404 or cancel since).
    live: bool,
    /// When the registration that made it live was answered.
    live_since: Option<Instant>,
    cancelled_at: Option<Instant>,
    /// Index in `servers` of the server in use.
    current: usize,
    /// `lastDirtyTimestamp` of the current registration.
    dirty: i64,
    /// Answered exchanges (server, when), newest last.
    answered: VecDeque<(usize, Instant)>,
    last_register: Option<(usize, Instant)>,
    /// Cancels that got no answer (a stopped server may still act on them).
    unanswered_cancels: Vec<(usize, Instant)>,
    /// The server the last cancel went to first, and when.
    last_cancel: Option<(usize, Instant)>,
    beats: u64,
    beats_404: u64,
    failures: u64,
    registrations: u64,
    cancels: u64,
}

impl ClientRec {
    fn last_answer(&self) -> Option<Instant> {
        self.answered.back().map(|(_, t)| *t)
    }

    /// Servers it exchanged with since `since`.
    fn servers_since(&self, since: Instant) -> BTreeSet<usize> {
        self.answered
            .iter()
            .filter(|(_, t)| *t >= since)
            .map(|(s, _)| *s)
            .collect()
    }

    fn answered_by(&mut self, server: usize, at: Instant) {
        self.answered.push_back((server, at));
        while self.answered.len() > 64 {
            self.answered.pop_front();
        }
    }

    /// Whether every ready replica must hold it at `t`: registered for longer than the
    /// propagation time, and renewed within its lease.
    fn expected(&self, t: Instant) -> bool {
        self.live
            && self.live_since.is_some_and(|s| s + PROPAGATION <= t)
            && self
                .last_answer()
                .is_some_and(|a| a + Duration::from_secs(u64::from(LEASE_SECS) - 1) >= t)
    }
}

struct Client {
    spec: ClientSpec,
    rec: Mutex<ClientRec>,
}

#[derive(Clone, Debug, PartialEq)]
struct PodRec {
    app: usize,
    ip: String,
    ready: bool,
    deleted: bool,
    /// An API call about it is under way.
    busy: bool,
    changed: Instant,
}

impl PodRec {
    /// `Some(status)` it must have, `Some(None)` absent, `None` not judged yet.
    fn expected(&self, t: Instant) -> Option<Option<&'static str>> {
        if self.busy || self.changed + PROPAGATION > t {
            return None;
        }
        Some(if self.deleted {
            None
        } else if self.ready {
            Some("UP")
        } else {
            Some("STARTING")
        })
    }
}

fn pod_id(name: &str, app: usize) -> String {
    format!("{name}.{NS}:e{app}:8080")
}

/// What one checker round saw, for the fault scheduler.
#[derive(Clone, Copy, Debug)]
struct RoundSummary {
    t0: Instant,
    t1: Instant,
    ready: usize,
    missing: usize,
    duplicates: usize,
}

impl RoundSummary {
    fn converged(&self) -> bool {
        self.ready == REPLICAS && self.missing == 0 && self.duplicates == 0
    }
}

/// Why an instance may be missing on a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    /// The replica's own process was stopped, killed or restarting.
    OwnProcess,
    /// The replica could not reach the apiserver (pod instances).
    Apiserver,
    /// The client's registration went to a server whose process was stopped or killed just
    /// after (the write died with it, or waited in it).
    LostWrite,
    /// A link into the replica from a server the client's registration and renewals went
    /// through was cut: they could not arrive (and with the lease run out, the leader evicted).
    PathCut,
    /// As `PathCut`, but the replica led all along and could still reach those servers: its
    /// anti-entropy should have kept the instance (counted apart, to see whether it does).
    PathCutLeaderCouldPull,
    /// A cancel the client sent before it registered again (or the Java server's replicated
    /// copy of it) was taken by a stopped server and acted on when it resumed, removing the new
    /// registration (neither carries a timestamp).
    StaleCancel,
}

impl Why {
    fn name(self) -> &'static str {
        match self {
            Why::OwnProcess => "own-process",
            Why::Apiserver => "apiserver",
            Why::LostWrite => "write-lost-with-its-server",
            Why::PathCut => "path-cut",
            Why::PathCutLeaderCouldPull => "path-cut-leader-could-pull",
            Why::StaleCancel => "stale-cancel",
        }
    }
}

#[derive(Clone, Debug)]
struct Explained {
    why: Why,
    fault: FaultRec,
}

/// A missing (or wrong) instance on one replica, from when it was first seen.
struct Missing {
    since: Instant,
    excused: bool,
    violation: bool,
}

#[derive(Default)]
struct Findings {
    violations: Vec<String>,
    by_rule: BTreeMap<&'static str, usize>,
    /// Missing-instance episodes a fault explains, by fault kind and by reason.
    excused: BTreeMap<&'static str, usize>,
    excused_why: BTreeMap<&'static str, usize>,
    /// Heartbeat 404s a fault explains, by reason.
    excused_404: BTreeMap<&'static str, usize>,
    /// Live instances removed by a cancel a stopped server took before they registered again
    /// (see [`Why::StaleCancel`]).
    stale_cancels: Vec<String>,
    /// Missing on the replica the client was renewing on: (explained by a fault, violations).
    vanished_renewing: (usize, usize),
    missing: HashMap<(usize, String), Missing>,
    /// Cancelled instances still listed: episodes and the longest.
    leftovers: HashMap<(usize, String), Instant>,
    leftover_episodes: usize,
    leftover_max: Duration,
    rounds: u64,
    /// Time spent in rounds (fetching and judging), and the longest.
    round_time: Duration,
    round_max: Duration,
    judged_fetches: u64,
    /// Explained episodes worth reading (a live instance gone from the replica it renewed on).
    notes: Vec<String>,
    two_leaders_rounds: u64,
    /// Convergence time after each episode healed, with the episode's kinds.
    convergence: Vec<(Vec<Kind>, Duration)>,
}

struct Shared {
    t0: Instant,
    bound: Duration,
    clients: Vec<Client>,
    pods: Mutex<BTreeMap<String, PodRec>>,
    faults: Mutex<Vec<FaultRec>>,
    findings: Mutex<Findings>,
    leader: Mutex<Option<usize>>,
    /// Who led at each round (`None`: nobody, or more than one, or not known).
    leaders: Mutex<Vec<(Instant, Option<usize>)>>,
    /// Each replica's `eureka_evictions_total` at the last round that read it.
    evictions: Mutex<Vec<Option<u64>>>,
    /// Whether clients may cancel (off for the final checks).
    churn: AtomicBool,
    /// Set once the registries converged before the first fault: findings count from then on.
    judging: AtomicBool,
    /// Stale cancels from stopped servers are violations too (`EO_SOAK_STRICT=1`).
    strict: bool,
    /// Stop injecting faults at the first violation (`EO_SOAK_FAIL_FAST=1`: tests/mutants).
    fail_fast: bool,
    stop: AtomicBool,
}

impl Shared {
    fn at(&self, t: Instant) -> String {
        format!("+{:.1}s", secs(t.saturating_duration_since(self.t0)))
    }

    fn violation(&self, rule: &'static str, text: String) {
        let mut f = self.findings.lock().unwrap();
        *f.by_rule.entry(rule).or_default() += 1;
        eprintln!("SOAK VIOLATION [{rule}] {text}");
        f.violations.push(format!("[{rule}] {text}"));
    }

    /// Why native client `c` may be missing on replica `r` (or `r` may answer its heartbeat with
    /// 404) at `t`, if a fault explains it: see the module docs.
    fn excuse_native(&self, r: usize, c: &ClientRec, t: Instant) -> Option<Explained> {
        let from = t.checked_sub(self.bound).unwrap_or(self.t0);
        let lease = Duration::from_secs(u64::from(LEASE_SECS));
        // The servers its current registration went through.
        let since = c
            .live_since
            .map(|l| l.checked_sub(Duration::from_secs(1)).unwrap_or(self.t0))
            .unwrap_or(self.t0)
            .max(from.checked_sub(lease).unwrap_or(self.t0));
        let path = c.servers_since(since);
        let faults = self.faults.lock().unwrap();
        let mut found = None;
        for f in faults.iter() {
            let end = f.end.unwrap_or(t);
            let explained = |why| Some(Explained { why, fault: f.clone() });
            let e = if !f.active_within(from, t) {
                None
            } else if f.procs.contains(&r)
                && (f.kind == Kind::Stop
                    || f.end.is_none()
                    || c.live_since.is_some_and(|l| l + PROPAGATION >= f.start && l <= end))
            {
                // Frozen: what was written meanwhile reaches it after the thaw. Killed or
                // restarted: excused until it is ready again, and then only for a registration
                // written while it was down (its replication arrives with a retry); anything
                // older it must hold once it answers (its start-up sync brings it).
                explained(Why::OwnProcess)
            } else if f.procs.iter().any(|p| {
                c.last_register
                    .is_some_and(|(s, at)| s == *p && at + Duration::from_secs(2) >= f.start && at <= end)
            }) {
                explained(Why::LostWrite)
            } else if f.blocked.iter().any(|(a, b)| *b == r && path.contains(a)) {
                // Anti-entropy compares replicas only: what a cut from the Java server alone kept
                // from `r` arrives with Java's own retries and heartbeats after the heal.
                let only_java = f
                    .blocked
                    .iter()
                    .filter(|(a, b)| *b == r && path.contains(a))
                    .all(|(a, _)| *a == JAVA);
                let pull_cut = only_java
                    || faults
                        .iter()
                        .filter(|g| g.active_within(from.checked_sub(lease).unwrap_or(self.t0), t))
                        .any(|g| g.blocked.iter().any(|(a, b)| *a == r && path.contains(b)));
                let led = self.led_throughout(r, t.checked_sub(lease).unwrap_or(self.t0), t);
                explained(if led && !pull_cut {
                    Why::PathCutLeaderCouldPull
                } else {
                    Why::PathCut
                })
            } else {
                None
            };
            // A cancel sent before this registration to a stopped server, which acted on it when
            // it resumed. Judged over the whole time since the cancel. (One queued behind a cut
            // link into `r` explains nothing: a replicated cancel spares a newer registration.)
            // The same when the client cancelled on the Java server and a replica was stopped
            // as Java replicated the cancel (Java's replicated cancels carry no timestamp either;
            // the resumed replica may apply it after the newer registration and pass it on).
            let stale = c.last_cancel.is_some_and(|(a, at)| {
                c.live_since.is_some_and(|l| at < l)
                    && f.start <= t
                    && f.end.is_none_or(|e| e >= at)
                    && ((f.procs.contains(&a) && c.unanswered_cancels.iter().any(|(s, u)| *s == a && *u >= at))
                        || (a == JAVA && f.kind == Kind::Stop && f.start <= at + Duration::from_secs(1)))
            });
            let e = e.or_else(|| {
                stale.then(|| Explained {
                    why: Why::StaleCancel,
                    fault: f.clone(),
                })
            });
            // The first explanation that is not a stale cancel wins: those are counted apart.
            match e {
                Some(x) if x.why != Why::StaleCancel => return Some(x),
                Some(x) if found.is_none() => found = Some(x),
                _ => {}
            }
        }
        found
    }

    /// Whether every round between `from` and `to` (at least one) saw replica `r` lead alone.
    fn led_throughout(&self, r: usize, from: Instant, to: Instant) -> bool {
        let seen = self.leaders.lock().unwrap();
        let mut rounds = seen.iter().filter(|(t, _)| *t >= from && *t <= to).peekable();
        rounds.peek().is_some() && rounds.all(|(_, l)| *l == Some(r))
    }

    /// Why replica `r` may not show pod `pod`'s current state at `t`, if a fault explains it:
    /// only a pod that changed since the replica stopped seeing changes (its apiserver link cut,
    /// or its process frozen), within the bound. A pod that existed before the fault and did not
    /// change must stay.
    fn excuse_pod(&self, r: usize, pod: &PodRec, t: Instant) -> Option<Explained> {
        let from = t.checked_sub(self.bound).unwrap_or(self.t0);
        let faults = self.faults.lock().unwrap();
        faults.iter().filter(|f| f.active_within(from, t)).find_map(|f| {
            // Changed since the fault began (during it, or while the watch caught up after it).
            let changed_during = pod.changed + PROPAGATION >= f.start;
            let why = if f.procs.contains(&r) && f.kind == Kind::Stop && changed_during {
                Why::OwnProcess
            } else if f.api.contains(&r) && changed_during {
                Why::Apiserver
            } else {
                return None;
            };
            Some(Explained { why, fault: f.clone() })
        })
    }

    /// Why a cancelled instance may still be listed on replica `r` at `t`, if a fault on the
    /// cancel's path explains it: the server it went to was down or frozen, or the link from it
    /// into `r` was cut, within the bound.
    fn excuse_leftover(&self, r: usize, c: &ClientRec, t: Instant) -> Option<FaultRec> {
        let (server, at) = c.last_cancel?;
        let from = t.checked_sub(self.bound).unwrap_or(self.t0).min(at);
        let faults = self.faults.lock().unwrap();
        faults
            .iter()
            .filter(|f| f.active_within(from, t))
            .find(|f| {
                f.procs.contains(&server)
                    || (f.procs.contains(&r) && f.kind == Kind::Stop)
                    || f.blocked.contains(&(server, r))
                    || (server == JAVA && matches!(f.kind, Kind::JavaCut | Kind::JavaCutOneWay))
            })
            .cloned()
    }

    /// Judges a heartbeat 404 from `server` to client `idx` (its record as it was before).
    fn judge_404(&self, idx: usize, server: usize, c: &ClientRec, t: Instant) {
        let registered_long_ago = c.live_since.is_some_and(|s| s + PROPAGATION <= t);
        let renewing = c
            .last_answer()
            .is_some_and(|a| a + Duration::from_secs(u64::from(LEASE_SECS) - 1) >= t);
        if !(registered_long_ago && renewing && self.judging.load(Ordering::Acquire)) {
            return;
        }
        let spec = &self.clients[idx].spec;
        let what = format!(
            "{} {} answered a heartbeat of {} ({}) with 404: registered {} ago, last answer {}",
            self.at(t),
            node(server),
            spec.id,
            spec.app,
            c.live_since.map_or("?".into(), |s| format!("{:.1}s", secs(t - s))),
            c.last_answer().map_or("-".into(), |a| self.at(a)),
        );
        match self.excuse_native(server, c, t) {
            Some(x) if x.why == Why::StaleCancel => self.stale_cancel(format!("{what}; held by {}", x.fault.what)),
            Some(x) => {
                *self
                    .findings
                    .lock()
                    .unwrap()
                    .excused_404
                    .entry(x.why.name())
                    .or_default() += 1
            }
            None => self.violation("heartbeat-404", what),
        }
    }

    /// A live instance removed by a stale cancel from a stopped server: a limit of the protocol,
    /// counted apart (a violation with `EO_SOAK_STRICT=1`).
    fn stale_cancel(&self, what: String) {
        if self.strict {
            self.violation("stale-cancel", what);
        } else {
            eprintln!("SOAK STALE CANCEL {what}");
            self.findings.lock().unwrap().stale_cancels.push(what);
        }
    }

    fn recent_faults(&self, t: Instant) -> String {
        let from = t.checked_sub(self.bound).unwrap_or(self.t0);
        let faults = self.faults.lock().unwrap();
        let list: Vec<String> = faults
            .iter()
            .filter(|f| f.active_within(from, t))
            .map(|f| {
                format!(
                    "{} ({} .. {})",
                    f.what,
                    self.at(f.start),
                    f.end.map_or("now".into(), |e| self.at(e))
                )
            })
            .collect();
        if list.is_empty() {
            "none".into()
        } else {
            list.join("; ")
        }
    }
}

// === native clients ===

async fn request(http: &reqwest::Client, method: reqwest::Method, url: String, body: Option<String>) -> Option<u16> {
    let mut b = http.request(method, url);
    if let Some(body) = body {
        b = b.header("Content-Type", "application/json").body(body);
    }
    b.send().await.ok().map(|r| r.status().as_u16())
}

/// Registers client `idx`, trying its servers in turn from the current one; whether it worked.
async fn register(shared: &Shared, idx: usize, urls: &[String], http: &reqwest::Client, tries: usize) -> bool {
    let spec = &shared.clients[idx].spec;
    for _ in 0..tries {
        let current = shared.clients[idx].rec.lock().unwrap().current;
        let server = spec.servers[current];
        let native = Native::new(&urls[server], &spec.app, &spec.id).lease(LEASE_SECS, RENEW_EVERY.as_secs() as u32);
        let body = native.body();
        let dirty = body["instance"]["lastDirtyTimestamp"].as_i64().unwrap_or_default();
        let url = format!("{}apps/{}", urls[server], spec.app);
        let code = request(http, reqwest::Method::POST, url, Some(body.to_string())).await;
        let now = Instant::now();
        let mut rec = shared.clients[idx].rec.lock().unwrap();
        if code == Some(204) {
            rec.live = true;
            rec.live_since = Some(now);
            rec.dirty = dirty;
            rec.last_register = Some((server, now));
            rec.answered_by(server, now);
            rec.registrations += 1;
            return true;
        }
        rec.failures += 1;
        rec.current = (rec.current + 1) % spec.servers.len();
    }
    false
}

async fn heartbeat(shared: &Shared, idx: usize, urls: &[String], http: &reqwest::Client) {
    let spec = &shared.clients[idx].spec;
    for _ in 0..spec.servers.len() {
        let (server, dirty) = {
            let rec = shared.clients[idx].rec.lock().unwrap();
            (spec.servers[rec.current], rec.dirty)
        };
        let url = format!(
            "{}apps/{}/{}?status=UP&lastDirtyTimestamp={dirty}",
            urls[server], spec.app, spec.id
        );
        let code = request(http, reqwest::Method::PUT, url, None).await;
        let now = Instant::now();
        match code {
            Some(200) => {
                let mut rec = shared.clients[idx].rec.lock().unwrap();
                rec.beats += 1;
                rec.answered_by(server, now);
                return;
            }
            Some(404) => {
                let before = {
                    let mut rec = shared.clients[idx].rec.lock().unwrap();
                    let before = rec.clone();
                    rec.beats += 1;
                    rec.beats_404 += 1;
                    rec.live = false;
                    rec.live_since = None;
                    rec.answered_by(server, now);
                    before
                };
                shared.judge_404(idx, server, &before, now);
                register(shared, idx, urls, http, 1).await;
                return;
            }
            _ => {
                let mut rec = shared.clients[idx].rec.lock().unwrap();
                rec.failures += 1;
                rec.current = (rec.current + 1) % spec.servers.len();
            }
        }
    }
}

async fn cancel(shared: &Shared, idx: usize, urls: &[String], http: &reqwest::Client) {
    let spec = &shared.clients[idx].spec;
    {
        let mut rec = shared.clients[idx].rec.lock().unwrap();
        rec.live = false;
        rec.live_since = None;
        rec.cancelled_at = Some(Instant::now());
        rec.last_cancel = Some((spec.servers[rec.current], Instant::now()));
        rec.cancels += 1;
    }
    for _ in 0..spec.servers.len() {
        let server = spec.servers[shared.clients[idx].rec.lock().unwrap().current];
        let url = format!("{}apps/{}/{}", urls[server], spec.app, spec.id);
        let sent = Instant::now();
        let code = request(http, reqwest::Method::DELETE, url, None).await;
        let mut rec = shared.clients[idx].rec.lock().unwrap();
        match code {
            Some(200) | Some(404) => {
                rec.answered_by(server, Instant::now());
                return;
            }
            _ => {
                rec.unanswered_cancels.push((server, sent));
                rec.failures += 1;
                rec.current = (rec.current + 1) % spec.servers.len();
            }
        }
    }
}

async fn run_client(shared: Arc<Shared>, idx: usize, urls: Arc<Vec<String>>, http: reqwest::Client, mut rng: Rng) {
    tokio::time::sleep(rng.duration(Duration::ZERO, RENEW_EVERY)).await;
    while !shared.stop.load(Ordering::Acquire) {
        let live = shared.clients[idx].rec.lock().unwrap().live;
        if !live {
            register(&shared, idx, &urls, &http, shared.clients[idx].spec.servers.len()).await;
        } else if shared.churn.load(Ordering::Acquire) && rng.chance(CHURN) {
            cancel(&shared, idx, &urls, &http).await;
            tokio::time::sleep(rng.duration(Duration::from_secs(1), Duration::from_secs(4))).await;
            let n = shared.clients[idx].spec.servers.len();
            if n > 1 && rng.chance(0.5) {
                shared.clients[idx].rec.lock().unwrap().current = rng.below(n as u64) as usize;
            }
            continue;
        } else {
            heartbeat(&shared, idx, &urls, &http).await;
        }
        let jitter = rng.duration(Duration::ZERO, Duration::from_millis(200));
        tokio::time::sleep(RENEW_EVERY - Duration::from_millis(100) + jitter).await;
    }
}

// === pods ===

async fn create_pod(client: &kube::Client, shared: &Shared, name: &str, app: usize, ip: &str) {
    pod(
        client,
        NS,
        name,
        &[("app", &format!("e{app}"))],
        &[("http", 8080)],
        "node-a",
    )
    .await;
    set_ready(client, NS, name, ip, true).await;
    shared.pods.lock().unwrap().insert(
        name.to_string(),
        PodRec {
            app,
            ip: ip.to_string(),
            ready: true,
            deleted: false,
            busy: false,
            changed: Instant::now(),
        },
    );
}

fn pod_ip(n: usize) -> String {
    format!("10.7.{}.{}", n / 250, n % 250 + 1)
}

/// Flips pods' readiness, deletes pods and creates new ones until `stop`.
async fn churn_pods(shared: Arc<Shared>, client: kube::Client, mut rng: Rng, mut next: usize) -> u64 {
    let mut changes = 0;
    while !shared.stop.load(Ordering::Acquire) && shared.churn.load(Ordering::Acquire) {
        tokio::time::sleep(rng.duration(Duration::from_millis(700), Duration::from_millis(1500))).await;
        let names: Vec<String> = shared
            .pods
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| !p.deleted)
            .map(|(n, _)| n.clone())
            .collect();
        let name = rng.pick(&names).clone();
        let p = {
            let mut pods = shared.pods.lock().unwrap();
            let p = pods.get_mut(&name).unwrap();
            p.busy = true;
            p.changed = Instant::now();
            p.clone()
        };
        if rng.chance(0.65) {
            set_ready(&client, NS, &name, &p.ip, !p.ready).await;
            let mut pods = shared.pods.lock().unwrap();
            let p = pods.get_mut(&name).unwrap();
            p.ready = !p.ready;
            p.busy = false;
            p.changed = Instant::now();
        } else {
            delete_pod(&client, NS, &name).await;
            {
                let mut pods = shared.pods.lock().unwrap();
                let p = pods.get_mut(&name).unwrap();
                p.deleted = true;
                p.busy = false;
                p.changed = Instant::now();
            }
            let new = format!("p-{next}");
            create_pod(&client, &shared, &new, next % EUREKA_APPS, &pod_ip(next)).await;
            next += 1;
        }
        changes += 1;
    }
    changes
}

// === the checker ===

/// `(app, instanceId, status)` of every instance in a full fetch.
type Listing = Vec<(String, String, String)>;

/// What one replica showed in a round.
struct Fetched {
    /// `/readyz` answered 200.
    ready: bool,
    /// Its full registry, when a fetch was answered 200 (ready or not: ready means complete).
    listing: Option<Listing>,
    /// Whether it reported leading (`eureka_leader`).
    leads: Option<bool>,
    /// Its `eureka_evictions_total`.
    evictions: Option<u64>,
}

async fn fetch_replica(http: &reqwest::Client, url: &str, admin: &str) -> Fetched {
    let timeout = Duration::from_secs(3);
    let ready = async {
        http.get(format!("{admin}/readyz"))
            .timeout(timeout)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    };
    let metrics = async {
        http.get(format!("{admin}/metrics"))
            .timeout(timeout)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    };
    let (ready, metrics, listing) = tokio::join!(ready, metrics, listing(http, url));
    let sample = |name: &str| {
        metrics
            .as_deref()?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
    };
    Fetched {
        ready,
        listing,
        leads: sample("eureka_leader").map(|v| v == 1),
        evictions: sample("eureka_evictions_total"),
    }
}

/// A server's full registry, unless it does not answer 200.
async fn listing(http: &reqwest::Client, url: &str) -> Option<Listing> {
    let r = http
        .get(format!("{url}apps"))
        .header("Accept", "application/json")
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    let mut out = Vec::new();
    let none = Vec::new();
    for app in v["applications"]["application"].as_array().unwrap_or(&none) {
        for i in app["instance"].as_array().unwrap_or(&none) {
            out.push((
                i["app"].as_str().unwrap_or("").to_string(),
                i["instanceId"].as_str().unwrap_or("").to_string(),
                i["status"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    Some(out)
}

fn snapshot(shared: &Shared) -> (Vec<ClientRec>, BTreeMap<String, PodRec>) {
    let clients = shared.clients.iter().map(|c| c.rec.lock().unwrap().clone()).collect();
    let pods = shared.pods.lock().unwrap().clone();
    (clients, pods)
}

/// One round: fetches every replica and judges what it holds.
async fn check_round(shared: &Shared, http: &reqwest::Client, replicas: &[(String, String)]) -> RoundSummary {
    let (clients_before, pods_before) = snapshot(shared);
    let t0 = Instant::now();
    let fetched = futures::future::join_all(replicas.iter().map(|(url, admin)| fetch_replica(http, url, admin))).await;
    let t1 = Instant::now();
    let (clients_after, pods_after) = snapshot(shared);
    let leaders: Vec<usize> = fetched
        .iter()
        .enumerate()
        .filter(|(_, f)| f.leads == Some(true))
        .map(|(i, _)| i)
        .collect();
    if leaders.len() == 1 {
        *shared.leader.lock().unwrap() = Some(leaders[0]);
    }
    let alone = (leaders.len() == 1).then(|| leaders[0]);
    let before = shared.leaders.lock().unwrap().last().and_then(|(_, l)| *l);
    shared.leaders.lock().unwrap().push((t0, alone));
    // Evictions are the leader's: a replica that evicted while another led, in this round and the
    // one before, is a second leader.
    for (r, f) in fetched.iter().enumerate() {
        let Some(now) = f.evictions else { continue };
        let was = shared.evictions.lock().unwrap()[r].replace(now);
        let other = match (before, alone) {
            (Some(a), Some(b)) if a == b && a != r => Some(a),
            _ => None,
        };
        if let (Some(was), Some(l)) = (was, other)
            && now > was
            && shared.judging.load(Ordering::Acquire)
        {
            shared.violation(
                "evicted-as-follower",
                format!("{} r{r} evicted {} lease(s) while r{l} led", shared.at(t0), now - was),
            );
        }
    }
    let mut summary = RoundSummary {
        t0,
        t1,
        ready: 0,
        missing: 0,
        duplicates: 0,
    };
    {
        let mut f = shared.findings.lock().unwrap();
        f.rounds += 1;
        if leaders.len() > 1 {
            f.two_leaders_rounds += 1;
            drop(f);
            shared.violation(
                "two-leaders",
                format!(
                    "{} replicas {leaders:?} both reported leading; faults within the bound: {}",
                    shared.at(t0),
                    shared.recent_faults(t1)
                ),
            );
        }
    }
    let judging = shared.judging.load(Ordering::Acquire);
    summary.ready = fetched.iter().filter(|f| f.ready && f.listing.is_some()).count();
    for (r, Fetched { listing, .. }) in fetched.iter().enumerate() {
        let Some(listing) = listing else { continue };
        shared.findings.lock().unwrap().judged_fetches += 1;
        let mut seen: HashMap<&str, (&str, &str)> = HashMap::new();
        let mut dups = BTreeSet::new();
        for (app, id, status) in listing {
            if seen.insert(id, (app, status)).is_some() {
                dups.insert(id.clone());
            }
        }
        summary.duplicates += dups.len();
        for id in dups.iter().filter(|_| judging) {
            let key = (r, format!("dup:{id}"));
            let new = !shared.findings.lock().unwrap().missing.contains_key(&key);
            if new {
                shared.findings.lock().unwrap().missing.insert(
                    key,
                    Missing {
                        since: t0,
                        excused: false,
                        violation: true,
                    },
                );
                shared.violation(
                    "duplicate-id",
                    format!("{} r{r} lists instance id {id} more than once", shared.at(t0)),
                );
            }
        }
        let mut wrong: Vec<(String, String, bool, Option<Explained>)> = Vec::new();
        // Native clients.
        for (idx, (before, after)) in clients_before.iter().zip(&clients_after).enumerate() {
            let spec = &shared.clients[idx].spec;
            let same = before.live_since == after.live_since && before.live == after.live;
            if same && before.expected(t0) && after.expected(t0) {
                let ok = seen
                    .get(spec.id.as_str())
                    .is_some_and(|(app, status)| *app == spec.app && *status == "UP");
                if !ok {
                    let lease = Duration::from_secs(u64::from(LEASE_SECS));
                    let renewing_here = after
                        .answered
                        .back()
                        .is_some_and(|(s, at)| *s == r && *at + lease >= t0);
                    wrong.push((
                        spec.id.clone(),
                        format!(
                            "native {} ({}) live since {}, last answer {} from {}, registered on {}",
                            spec.id,
                            spec.app,
                            before.live_since.map_or("?".into(), |s| shared.at(s)),
                            after.last_answer().map_or("-".into(), |a| shared.at(a)),
                            after.answered.back().map_or("-".into(), |(s, _)| node(*s)),
                            after.last_register.map_or("-".into(), |(s, _)| node(s)),
                        ),
                        renewing_here,
                        shared.excuse_native(r, after, t1),
                    ));
                }
            }
            // Leftovers: cancelled a while ago and still listed.
            let cancelled = !before.live
                && !after.live
                && after.cancelled_at.is_some_and(|c| c + PROPAGATION <= t0)
                && after.live_since.is_none();
            let key = (r, spec.id.clone());
            if cancelled && seen.contains_key(spec.id.as_str()) && judging {
                let new = !shared.findings.lock().unwrap().leftovers.contains_key(&key);
                let cancel = after.last_cancel.expect("a cancelled client has sent a cancel");
                // A cancel that got no answer (the client timed out and went on) may be acted
                // on late, within the bound.
                let unanswered = after
                    .unanswered_cancels
                    .iter()
                    .any(|(_, u)| *u >= cancel.1 && *u + shared.bound >= t0);
                if new && !unanswered && shared.excuse_leftover(r, after, t1).is_none() {
                    shared.violation(
                        "leftover",
                        format!(
                            "{} r{r} still lists {} ({}), cancelled on {} at {}; faults within the bound: {}",
                            shared.at(t0),
                            spec.id,
                            spec.app,
                            node(cancel.0),
                            shared.at(cancel.1),
                            shared.recent_faults(t1)
                        ),
                    );
                }
            }
            let mut f = shared.findings.lock().unwrap();
            if cancelled && seen.contains_key(spec.id.as_str()) {
                if !f.leftovers.contains_key(&key) {
                    f.leftover_episodes += 1;
                    f.leftovers.insert(key, after.cancelled_at.unwrap());
                }
            } else if let Some(since) = f.leftovers.remove(&key) {
                let lasted = t0.saturating_duration_since(since);
                f.leftover_max = f.leftover_max.max(lasted);
            }
        }
        // Pods.
        for (name, before) in &pods_before {
            let Some(after) = pods_after.get(name) else { continue };
            if before != after {
                continue;
            }
            let Some(want) = after.expected(t0) else { continue };
            let id = pod_id(name, after.app);
            let have = seen.get(id.as_str()).map(|(_, s)| *s);
            if have != want {
                wrong.push((
                    id.clone(),
                    format!(
                        "pod {name} (ready={}, deleted={}, changed {}): want {want:?}, have {have:?}",
                        after.ready,
                        after.deleted,
                        shared.at(after.changed)
                    ),
                    false,
                    shared.excuse_pod(r, after, t1),
                ));
            }
        }
        summary.missing += wrong.len();
        if !judging {
            continue;
        }
        // Episodes: new ones are counted once, as explained or as a violation; one that outlives
        // its explanation becomes a violation.
        let wrong_ids: BTreeSet<String> = wrong.iter().map(|w| w.0.clone()).collect();
        for (id, what, renewing_here, excuse) in wrong {
            let key = (r, id);
            let mut f = shared.findings.lock().unwrap();
            let entry = f.missing.entry(key).or_insert(Missing {
                since: t0,
                excused: false,
                violation: false,
            });
            if entry.violation {
                continue;
            }
            match excuse {
                Some(x) if x.why == Why::PathCutLeaderCouldPull => {
                    // Anti-entropy's case: it must pull the instance within the grace.
                    if t0.saturating_duration_since(entry.since) > ANTI_ENTROPY_GRACE {
                        entry.violation = true;
                        let since = entry.since;
                        drop(f);
                        shared.violation(
                            "anti-entropy",
                            format!(
                                "{} r{r}, leading and able to pull from the client's server, lacks {what} since {} ({})",
                                shared.at(t0),
                                shared.at(since),
                                x.fault.what
                            ),
                        );
                    }
                }
                Some(x) if x.why == Why::StaleCancel => {
                    if !entry.excused {
                        entry.excused = true;
                        drop(f);
                        shared.stale_cancel(format!(
                            "{} r{r} lacks {what}; the cancel was held by {}",
                            shared.at(t0),
                            x.fault.what
                        ));
                    }
                }
                Some(x) => {
                    if !entry.excused {
                        entry.excused = true;
                        *f.excused.entry(x.fault.kind.name()).or_default() += 1;
                        *f.excused_why.entry(x.why.name()).or_default() += 1;
                        if renewing_here {
                            f.vanished_renewing.0 += 1;
                            let note = format!(
                                "{} r{r} lacks {what}; {} ({})",
                                shared.at(t0),
                                x.why.name(),
                                x.fault.what
                            );
                            f.notes.push(note);
                        }
                    }
                }
                None => {
                    entry.violation = true;
                    let since = entry.since;
                    if renewing_here {
                        f.vanished_renewing.1 += 1;
                    }
                    drop(f);
                    shared.violation(
                        if renewing_here {
                            "vanished-where-renewing"
                        } else {
                            "missing"
                        },
                        format!(
                            "{} r{r} lacks {what} (missing since {}); faults within the bound: {}",
                            shared.at(t0),
                            shared.at(since),
                            shared.recent_faults(t1)
                        ),
                    );
                }
            }
        }
        // Episodes that ended.
        shared.findings.lock().unwrap().missing.retain(|(rr, id), _| {
            *rr != r || wrong_ids.contains(id) || (id.starts_with("dup:") && dups.contains(&id[4..]))
        });
    }
    let took = t0.elapsed();
    let mut f = shared.findings.lock().unwrap();
    f.round_time += took;
    f.round_max = f.round_max.max(took);
    summary
}

async fn run_checker(
    shared: Arc<Shared>,
    replicas: Vec<(String, String)>,
    rounds: watch::Sender<Option<RoundSummary>>,
) {
    let http = http();
    while !shared.stop.load(Ordering::Acquire) {
        let summary = check_round(&shared, &http, &replicas).await;
        rounds.send_replace(Some(summary));
        tokio::time::sleep(ROUND_EVERY).await;
    }
}

/// Waits for a round that started after `after` and found everything converged; its end time.
async fn converged_after(
    rounds: &mut watch::Receiver<Option<RoundSummary>>,
    after: Instant,
    timeout: Duration,
) -> Option<Instant> {
    tokio::time::timeout(timeout, async {
        loop {
            if let Some(s) = *rounds.borrow_and_update()
                && s.t0 >= after
                && s.converged()
            {
                return s.t1;
            }
            if rounds.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    })
    .await
    .ok()
}

// === the fault scheduler ===

/// Injects one fault; its record's index.
async fn inject(mesh: &mut Mesh, shared: &Shared, p: &Planned) -> usize {
    match &p.act {
        Act::Net(links) => {
            for (link, mode) in links {
                proxy(mesh, *link).set(*mode);
            }
        }
        Act::Kill(r) => mesh.kill(*r),
        Act::Restart(r) => {
            let r = *r;
            let clean = tokio::task::block_in_place(|| mesh.terminate(r, Duration::from_secs(25)));
            if !clean {
                shared.violation(
                    "unclean-exit",
                    format!("{} r{r} did not exit cleanly on SIGTERM", shared.at(Instant::now())),
                );
            }
        }
        Act::Stop(r) => mesh.freeze(*r),
    }
    let mut faults = shared.faults.lock().unwrap();
    faults.push(FaultRec {
        kind: p.kind,
        what: p.what.clone(),
        start: Instant::now(),
        end: None,
        blocked: p.blocked.clone(),
        procs: p.procs.clone(),
        api: p.api.clone(),
    });
    eprintln!("SOAK {} inject {}", shared.at(Instant::now()), p.what);
    faults.len() - 1
}

/// Heals one fault (a link another fault still holds takes that fault's mode); a restarted
/// replica counts as healed once it is ready.
async fn heal(mesh: &mut Mesh, shared: &Shared, p: &Planned, id: usize, others: &[&Planned]) {
    match &p.act {
        Act::Net(links) => {
            for (link, _) in links {
                let held = others.iter().find_map(|o| match &o.act {
                    Act::Net(l) => l.iter().find(|(k, _)| k == link).map(|(_, m)| *m),
                    _ => None,
                });
                proxy(mesh, *link).set(held.unwrap_or(Mode::Pass));
            }
        }
        Act::Kill(r) | Act::Restart(r) => {
            let r = *r;
            mesh.respawn(r);
            let started = Instant::now();
            while !mesh.ready(r, Duration::from_secs(2)).await {
                if started.elapsed() > Duration::from_secs(90) {
                    shared.violation(
                        "not-ready",
                        format!(
                            "{} r{r} not ready 90 s after its restart\n{}",
                            shared.at(Instant::now()),
                            mesh.replicas[r].server.proc.log_tail(30)
                        ),
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Act::Stop(r) => mesh.thaw(*r),
    }
    shared.faults.lock().unwrap()[id].end = Some(Instant::now());
    eprintln!("SOAK {} healed {}", shared.at(Instant::now()), p.what);
}

/// Draws an episode: one fault, sometimes two at once (at most one process fault).
fn draw_episode(rng: &mut Rng, leader: Option<usize>, only: &[String]) -> Vec<Planned> {
    let weights: Vec<u32> = Kind::ALL
        .iter()
        .map(|(k, w)| {
            if only.is_empty() || only.iter().any(|o| o == k.name()) {
                *w
            } else {
                0
            }
        })
        .collect();
    assert!(
        weights.iter().any(|w| *w > 0),
        "EO_SOAK_ONLY names no fault kind: {only:?}"
    );
    let first = Kind::ALL[rng.weighted(&weights)].0;
    let mut out = vec![draw(rng, first, leader)];
    if rng.chance(0.3) {
        for _ in 0..10 {
            let second = Kind::ALL[rng.weighted(&weights)].0;
            if first.process() && second.process() {
                continue;
            }
            // A replica restarted while its apiserver is cut cannot list its watches, so cannot
            // be ready until the cut heals: docs/src/guides/faults.md says so; the episode would only wait on it.
            let p = draw(rng, second, leader);
            let clash = |a: &Planned, b: &Planned| a.procs.iter().any(|r| b.api.contains(r));
            if !(clash(&out[0], &p) || clash(&p, &out[0])) {
                out.push(p);
                break;
            }
        }
    }
    out
}

async fn run_episode(mesh: &mut Mesh, shared: &Shared, faults: &[Planned]) {
    let start = Instant::now();
    let mut ids = Vec::new();
    for p in faults {
        ids.push(inject(mesh, shared, p).await);
    }
    let mut order: Vec<usize> = (0..faults.len()).collect();
    order.sort_by_key(|i| faults[*i].hold);
    for (n, &i) in order.iter().enumerate() {
        tokio::time::sleep_until(start + faults[i].hold).await;
        let others: Vec<&Planned> = order[n + 1..].iter().map(|j| &faults[*j]).collect();
        heal(mesh, shared, &faults[i], ids[i], &others).await;
    }
}

// === the test ===

fn counts(m: &BTreeMap<&'static str, usize>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter().map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_live_instance_survives_random_faults() {
    let Some(cluster) = prepared() else { return };
    let duration = Duration::from_secs(env_u64("EO_SOAK_SECS", 120));
    let pods = env_u64("EO_SOAK_PODS", 200) as usize;
    let clients = env_u64("EO_SOAK_CLIENTS", 200) as usize;
    let bound = Duration::from_secs(env_u64("EO_SOAK_BOUND_SECS", 15));
    let self_preservation = std::env::var("EO_SOAK_SELF_PRESERVATION").is_ok_and(|v| v == "1");
    let strict = std::env::var("EO_SOAK_STRICT").is_ok_and(|v| v == "1");
    // Fault kinds to draw from (comma-separated names as printed), to aim at one.
    let only: Vec<String> = std::env::var("EO_SOAK_ONLY")
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let (mut rng, seed) = Rng::from_env("EO_SOAK_SEED");
    eprintln!(
        "SOAK seed={seed} (replay: EO_SOAK_SEED={seed}) faults for {}s, {pods} pods, {clients} native clients, bound {}s, self-preservation {}",
        duration.as_secs(),
        bound.as_secs(),
        if self_preservation { "on" } else { "off" }
    );
    let kube = cluster.admin().await;
    namespace(&kube, NS).await;
    for a in 0..EUREKA_APPS {
        eureka_app(
            cluster,
            NS,
            &format!("e{a}"),
            &format!("  selector: {{matchLabels: {{app: e{a}}}}}\n  port: http\n  terminating: Deregister\n"),
        );
    }
    let client_specs: Vec<ClientSpec> = (0..clients)
        .map(|i| {
            // About one client in seven registers with the Java server (and only there).
            let servers = if i % 7 == 6 {
                vec![JAVA]
            } else {
                (0..REPLICAS).map(|k| (i + k) % REPLICAS).collect()
            };
            ClientSpec {
                app: format!("SOAK-{}", i % NATIVE_APPS),
                id: format!("c-{i}"),
                servers,
            }
        })
        .collect();
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        bound,
        clients: client_specs
            .into_iter()
            .map(|spec| Client {
                spec,
                rec: Mutex::new(ClientRec::default()),
            })
            .collect(),
        pods: Mutex::new(BTreeMap::new()),
        faults: Mutex::new(Vec::new()),
        findings: Mutex::new(Findings::default()),
        leader: Mutex::new(None),
        leaders: Mutex::new(Vec::new()),
        evictions: Mutex::new(vec![None; REPLICAS]),
        churn: AtomicBool::new(true),
        judging: AtomicBool::new(false),
        strict,
        fail_fast: std::env::var("EO_SOAK_FAIL_FAST").is_ok_and(|v| v == "1"),
        stop: AtomicBool::new(false),
    });
    futures::stream::iter(0..pods)
        .map(|i| {
            let (kube, shared) = (kube.clone(), shared.clone());
            async move { create_pod(&kube, &shared, &format!("p-{i}"), i % EUREKA_APPS, &pod_ip(i)).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;

    let mut args: Vec<String> = [
        "--replication-max-batching-delay-ms",
        "50",
        "--anti-entropy-interval-ms",
        &ANTI_ENTROPY_EVERY.as_millis().to_string(),
        "--eviction-interval-timer-in-ms",
        "1000",
        "--java-peer-heartbeat-interval-ms",
        "2000",
        "--peer-node-read-timeout-ms",
        "2000",
        "--registry-sync-retries",
        "3",
        "--registry-sync-retry-wait-ms",
        "1000",
        "--wait-time-in-ms-when-sync-empty",
        "0",
        // Time scaled down like the rest: a request to the apiserver that gets no answer (a
        // connection that died without a reset) is abandoned within 8 s, inside the bound.
        "--watch-timeout-seconds",
        "3",
        "--kubernetes-read-timeout-ms",
        "8000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !self_preservation {
        args.extend(["--enable-self-preservation".to_string(), "false".to_string()]);
    }
    let spec = MeshSpec {
        namespace: NS.into(),
        lease: "soak".into(),
        first_ip: FIRST_IP,
        replicas: REPLICAS,
        args,
        java: Some(vec!["--eureka.server.peer-node-read-timeout-ms=2000".into()]),
    };
    let set_up = Instant::now();
    let Some(mut mesh) = Mesh::start(cluster, spec).await else {
        return;
    };
    eprintln!("SOAK mesh up in {:.1}s", secs(set_up.elapsed()));
    let mut urls: Vec<String> = mesh.urls.clone();
    urls.push(mesh.java_url());
    let urls = Arc::new(urls);
    let replicas: Vec<(String, String)> = mesh
        .replicas
        .iter()
        .map(|o| (o.server.url(), o.server.admin()))
        .collect();
    let (rounds_tx, mut rounds) = watch::channel(None);
    let checker = tokio::spawn(run_checker(shared.clone(), replicas, rounds_tx));
    let client_http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let client_tasks: Vec<_> = (0..clients)
        .map(|i| {
            tokio::spawn(run_client(
                shared.clone(),
                i,
                urls.clone(),
                client_http.clone(),
                rng.fork(),
            ))
        })
        .collect();
    let churn = tokio::spawn(churn_pods(shared.clone(), kube.clone(), rng.fork(), pods));

    // Everything registered and everywhere before the first fault.
    let warm = Instant::now();
    let everyone_live = || shared.clients.iter().all(|c| c.rec.lock().unwrap().live);
    let mut converged_at = None;
    while warm.elapsed() < Duration::from_secs(120) {
        if everyone_live() {
            converged_at = converged_after(&mut rounds, Instant::now() + PROPAGATION, Duration::from_secs(30)).await;
            if converged_at.is_some() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        converged_at.is_some(),
        "the registries never converged before the faults:\n{}",
        shared.findings.lock().unwrap().violations.join("\n")
    );
    shared.judging.store(true, Ordering::Release);
    eprintln!("SOAK converged before the faults after {:.1}s", secs(warm.elapsed()));

    // Faults.
    let faults_from = Instant::now();
    let mut episodes = 0;
    let mut slow = 0;
    let failed = || shared.fail_fast && !shared.findings.lock().unwrap().violations.is_empty();
    while faults_from.elapsed() < duration && !failed() {
        let leader = *shared.leader.lock().unwrap();
        let planned = draw_episode(&mut rng, leader, &only);
        run_episode(&mut mesh, &shared, &planned).await;
        episodes += 1;
        let healed = Instant::now();
        let kinds: Vec<Kind> = planned.iter().map(|p| p.kind).collect();
        match converged_after(&mut rounds, healed, bound * 3).await {
            Some(at) => {
                let took = at - healed;
                eprintln!("SOAK {} converged {:.1}s after the heal", shared.at(at), secs(took));
                if took > bound {
                    slow += 1;
                    shared.violation(
                        "slow-convergence",
                        format!(
                            "{} episode {episodes} ({}): converged {:.1}s after the heal (bound {}s)",
                            shared.at(at),
                            planned.iter().map(|p| p.what.clone()).collect::<Vec<_>>().join(" + "),
                            secs(took),
                            bound.as_secs()
                        ),
                    );
                }
                shared.findings.lock().unwrap().convergence.push((kinds, took));
            }
            None => {
                shared.violation(
                    "no-convergence",
                    format!(
                        "{} episode {episodes} ({}): not converged {}s after the heal",
                        shared.at(Instant::now()),
                        planned.iter().map(|p| p.what.clone()).collect::<Vec<_>>().join(" + "),
                        (bound * 3).as_secs()
                    ),
                );
            }
        }
        tokio::time::sleep(rng.duration(Duration::from_millis(500), Duration::from_secs(2))).await;
    }
    let fault_secs = faults_from.elapsed();

    // The end: churn stops; the registries must converge and stay converged.
    shared.churn.store(false, Ordering::Release);
    mesh.heal_all();
    let pod_changes = churn.await.expect("the pod churn task failed");
    let end = Instant::now();
    let final_at = converged_after(&mut rounds, end, bound * 3).await;
    if final_at.is_none() {
        shared.violation(
            "no-convergence",
            format!("{} not converged at the end", shared.at(Instant::now())),
        );
    }
    // A few more rounds, all converged.
    let hold_from = Instant::now();
    let mut final_rounds = 0;
    while hold_from.elapsed() < Duration::from_secs(4) {
        if rounds.changed().await.is_err() {
            break;
        }
        let s = (*rounds.borrow()).expect("a round");
        final_rounds += 1;
        if !s.converged() {
            shared.violation(
                "no-convergence",
                format!("{} a final round was not converged: {s:?}", shared.at(s.t0)),
            );
            break;
        }
    }
    shared.stop.store(true, Ordering::Release);
    checker.await.expect("the checker failed");
    for t in client_tasks {
        t.await.expect("a client task failed");
    }

    // Every native client became live at least once.
    for c in &shared.clients {
        if c.rec.lock().unwrap().registrations == 0 {
            shared.violation(
                "never-live",
                format!("client {} ({}) never registered", c.spec.id, c.spec.app),
            );
        }
    }

    // The Java server's view at the end (not judged: it is the peer, not a replica).
    let java_view = {
        let ids: BTreeSet<String> = listing(&http(), &mesh.java_url())
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        let t = Instant::now();
        let natives: Vec<&str> = shared
            .clients
            .iter()
            .filter(|c| c.rec.lock().unwrap().expected(t))
            .map(|c| c.spec.id.as_str())
            .collect();
        let pods: Vec<String> = shared
            .pods
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| !p.deleted)
            .map(|(n, p)| pod_id(n, p.app))
            .collect();
        format!(
            "{} of {} live native instances and {} of {} pod instances",
            natives.iter().filter(|id| ids.contains(**id)).count(),
            natives.len(),
            pods.iter().filter(|id| ids.contains(*id)).count(),
            pods.len()
        )
    };

    // Report.
    let f = shared.findings.lock().unwrap();
    let faults = shared.faults.lock().unwrap();
    let mut by_kind: BTreeMap<&'static str, usize> = BTreeMap::new();
    for rec in faults.iter() {
        *by_kind.entry(rec.kind.name()).or_default() += 1;
    }
    let total_faults: usize = by_kind.values().sum();
    let stats = mesh.proxy_stats();
    let recs: Vec<ClientRec> = shared.clients.iter().map(|c| c.rec.lock().unwrap().clone()).collect();
    let sum = |g: fn(&ClientRec) -> u64| recs.iter().map(g).sum::<u64>();
    let mut all: Vec<Duration> = f.convergence.iter().map(|(_, d)| *d).collect();
    all.sort();
    let pct = |xs: &[Duration], p: f64| -> f64 {
        if xs.is_empty() {
            return 0.0;
        }
        secs(xs[((xs.len() - 1) as f64 * p).round() as usize])
    };
    eprintln!("==== SOAK REPORT (seed {seed}) ====");
    eprintln!(
        "SOAK run: {:.0}s of faults in {episodes} episodes, {pods} pods (+{pod_changes} readiness flips and replacements), {clients} native clients ({} on the Java server), bound {}s",
        secs(fault_secs),
        shared.clients.iter().filter(|c| c.spec.servers == [JAVA]).count(),
        bound.as_secs()
    );
    eprintln!("SOAK faults injected: {total_faults}: {}", counts(&by_kind));
    eprintln!(
        "SOAK proxies: {} connections forwarded, {} refused, {} held in a black hole, {} reset by a fault; {} bytes forwarded, {} dropped",
        stats.forwarded, stats.refused, stats.held, stats.reset, stats.bytes_forwarded, stats.bytes_dropped
    );
    eprintln!(
        "SOAK clients: {} heartbeats, {} answered 404 (explained: {}), {} failed requests (failovers), {} registrations, {} cancels",
        sum(|c| c.beats),
        sum(|c| c.beats_404),
        counts(&f.excused_404),
        sum(|c| c.failures),
        sum(|c| c.registrations),
        sum(|c| c.cancels)
    );
    eprintln!(
        "SOAK checker: {} rounds, {} replica registries judged; instances missing while a fault explained it: {} (by fault: {}; by reason: {}); of them on the replica the client renewed on: {}; rounds with two leaders: {}",
        f.rounds,
        f.judged_fetches,
        f.excused.values().sum::<usize>(),
        counts(&f.excused),
        counts(&f.excused_why),
        f.vanished_renewing.0,
        f.two_leaders_rounds
    );
    eprintln!(
        "SOAK stale cancels (a live instance removed by a cancel a stopped server took before it registered again): {}",
        f.stale_cancels.len()
    );
    for n in f.stale_cancels.iter().take(10) {
        eprintln!("SOAK   stale cancel: {n}");
    }
    eprintln!(
        "SOAK checker rounds took {:.2}s on average, {:.2}s at most (a round every {:.2}s)",
        secs(f.round_time) / f.rounds.max(1) as f64,
        secs(f.round_max),
        secs(f.round_time + ROUND_EVERY * f.rounds as u32) / f.rounds.max(1) as f64
    );
    for n in f.notes.iter().take(12) {
        eprintln!("SOAK   note: {n}");
    }
    eprintln!(
        "SOAK convergence after a heal (every ready replica holds every live instance): n={} p50={:.1}s p90={:.1}s p99={:.1}s max={:.1}s; over the bound: {slow}",
        all.len(),
        pct(&all, 0.5),
        pct(&all, 0.9),
        pct(&all, 0.99),
        all.last().map_or(0.0, |d| secs(*d))
    );
    let mut per_kind: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for (kinds, d) in &f.convergence {
        for k in kinds {
            per_kind.entry(k.name()).or_default().push(*d);
        }
    }
    for (k, ds) in per_kind.iter_mut() {
        ds.sort();
        eprintln!(
            "SOAK   after {k}: n={} p50={:.1}s max={:.1}s",
            ds.len(),
            pct(ds, 0.5),
            secs(*ds.last().unwrap())
        );
    }
    eprintln!(
        "SOAK leftovers (cancelled instances still listed after {}s): {} episodes, longest {:.1}s",
        PROPAGATION.as_secs(),
        f.leftover_episodes,
        secs(f.leftover_max)
    );
    eprintln!(
        "SOAK end: converged {} after the heal, {final_rounds} final rounds converged; the Java server holds {java_view}",
        final_at.map_or("never".into(), |at| format!("{:.1}s", secs(at - end)))
    );
    eprintln!("SOAK violations: {} ({})", f.violations.len(), counts(&f.by_rule));
    for v in f.violations.iter().take(40) {
        eprintln!("SOAK   {v}");
    }
    if !f.violations.is_empty() {
        let dest = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("soak-{seed}"));
        match mesh.keep_logs(&dest) {
            Ok(()) => eprintln!(
                "SOAK logs of every replica process and the Java peer: {}",
                dest.display()
            ),
            Err(e) => eprintln!("SOAK failed to keep the logs in {}: {e}", dest.display()),
        }
    }
    assert!(
        total_faults > 0 && stats.refused + stats.reset + stats.bytes_dropped > 0,
        "no fault bit"
    );
    assert!(
        f.violations.is_empty(),
        "{} invariant violations (seed {seed}); see the SOAK lines above",
        f.violations.len()
    );
}
