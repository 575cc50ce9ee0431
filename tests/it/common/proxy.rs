//! A TCP proxy on loopback that a test puts on one link (a replica's connections to another, an
//! operator's to the apiserver, ours to a Java peer) to inject network faults for real. Its
//! [`Mode`] can change at any time and applies to open connections too:
//!
//! * `Pass`: bytes flow both ways.
//! * `Refuse`: open connections and new ones are reset (RST), as when nothing listens.
//! * `Blackhole`: connections are accepted and held, nothing is forwarded (bytes are read and
//!   dropped), so the peer waits for its own timeout.
//! * `Delay`: added latency per direction; order and content are kept.
//! * `Drop(direction)`: the bytes of one direction are dropped, the other passes (requests arrive
//!   but their answers never come back, or the reverse).
//!
//! A connection that lost bytes (black-holed or one direction dropped) is reset when the fault
//! ends, since its stream is no longer whole. [`Proxy::cut`] and [`Proxy::heal`] are `Refuse` and
//! `Pass`. [`Proxy::stats`] counts what the proxy did, so a test can show its faults bit.

use std::{
    net::{Ipv4Addr, SocketAddr},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, watch},
    time::Instant,
};

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the side that connected to the proxy toward the target (requests).
    Up,
    /// From the target back (answers).
    Down,
}

/// What the proxy does with traffic (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Refuse,
    Blackhole,
    Delay { up: Duration, down: Duration },
    Drop(Direction),
}

impl Mode {
    /// Whether bytes going `dir` are dropped in this mode.
    fn drops(self, dir: Direction) -> bool {
        match self {
            Mode::Blackhole => true,
            Mode::Drop(d) => d == dir,
            _ => false,
        }
    }

    /// The latency added to bytes going `dir`.
    fn delay(self, dir: Direction) -> Duration {
        match (self, dir) {
            (Mode::Delay { up, .. }, Direction::Up) => up,
            (Mode::Delay { down, .. }, Direction::Down) => down,
            _ => Duration::ZERO,
        }
    }

    /// Whether a connection that lost bytes can go on in this mode (it cannot: it is reset).
    fn whole(self) -> bool {
        matches!(self, Mode::Pass | Mode::Delay { .. })
    }
}

/// What a proxy did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted and forwarded.
    pub forwarded: u64,
    /// New connections reset at once (`Refuse`, or the target did not accept).
    pub refused: u64,
    /// New connections accepted and held without a target (`Blackhole`).
    pub held: u64,
    /// Open connections reset by a mode change.
    pub reset: u64,
    /// Bytes delivered.
    pub bytes_forwarded: u64,
    /// Bytes read and dropped.
    pub bytes_dropped: u64,
}

impl std::ops::AddAssign for ProxyStats {
    fn add_assign(&mut self, o: ProxyStats) {
        self.forwarded += o.forwarded;
        self.refused += o.refused;
        self.held += o.held;
        self.reset += o.reset;
        self.bytes_forwarded += o.bytes_forwarded;
        self.bytes_dropped += o.bytes_dropped;
    }
}

#[derive(Default)]
struct Counters {
    forwarded: AtomicU64,
    refused: AtomicU64,
    held: AtomicU64,
    reset: AtomicU64,
    bytes_forwarded: AtomicU64,
    bytes_dropped: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub target: SocketAddr,
    mode: watch::Sender<Mode>,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of `ip` and forwards to `target`, passing traffic.
    pub async fn start(ip: Ipv4Addr, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind((ip, 0)).await.expect("proxy bind");
        let addr = listener.local_addr().unwrap();
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let rx = mode_rx.clone();
                let c = c.clone();
                match *mode_rx.borrow() {
                    Mode::Refuse => {
                        Counters::add(&c.refused, 1);
                        reset(&inbound);
                    }
                    Mode::Blackhole => {
                        Counters::add(&c.held, 1);
                        tokio::spawn(hold(inbound, rx, c));
                    }
                    _ => {
                        tokio::spawn(forward(inbound, target, rx, c));
                    }
                }
            }
        });
        Proxy {
            addr,
            target,
            mode,
            counters,
            task,
        }
    }

    /// `http://addr/eureka/` through this proxy.
    pub fn url(&self) -> String {
        format!("http://{}/eureka/", self.addr)
    }

    /// Sets the mode; open connections follow it at once.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Resets open connections and refuses new ones.
    pub fn cut(&self) {
        self.set(Mode::Refuse);
    }

    /// Passes traffic again.
    pub fn heal(&self) {
        self.set(Mode::Pass);
    }

    pub fn refuse(&self) {
        self.set(Mode::Refuse);
    }

    pub fn blackhole(&self) {
        self.set(Mode::Blackhole);
    }

    pub fn delay(&self, up: Duration, down: Duration) {
        self.set(Mode::Delay { up, down });
    }

    /// Drops the bytes going `dir`; the other direction passes.
    pub fn drop_direction(&self, dir: Direction) {
        self.set(Mode::Drop(dir));
    }

    pub fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            forwarded: get(&c.forwarded),
            refused: get(&c.refused),
            held: get(&c.held),
            reset: get(&c.reset),
            bytes_forwarded: get(&c.bytes_forwarded),
            bytes_dropped: get(&c.bytes_dropped),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Open connections end too: their mode receivers see the sender go.
        self.task.abort();
    }
}

/// Makes the next close of `fd` send a RST instead of a FIN.
fn zero_linger(fd: std::os::fd::RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket this proxy owns, with a correctly sized option value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Resets a connection (the caller drops it right after).
fn reset(stream: &TcpStream) {
    zero_linger(stream.as_raw_fd());
}

/// Accepts and holds a connection, reading and dropping its bytes, until the black hole ends
/// (then it is reset) or the proxy goes.
async fn hold(mut inbound: TcpStream, mut mode: watch::Receiver<Mode>, c: Arc<Counters>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = inbound.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => Counters::add(&c.bytes_dropped, n as u64),
            },
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow() != Mode::Blackhole {
                    reset(&inbound);
                    return;
                }
            }
        }
    }
}

/// Forwards one connection until either side closes, a mode change resets it, or the proxy goes.
async fn forward(inbound: TcpStream, target: SocketAddr, mut mode: watch::Receiver<Mode>, c: Arc<Counters>) {
    let outbound = match TcpStream::connect(target).await {
        Ok(s) => s,
        Err(_) => {
            Counters::add(&c.refused, 1);
            reset(&inbound);
            return;
        }
    };
    let _ = outbound.set_nodelay(true);
    Counters::add(&c.forwarded, 1);
    let fds = [inbound.as_raw_fd(), outbound.as_raw_fd()];
    // Set when bytes were dropped: the stream is no longer whole.
    let tainted = Arc::new(AtomicBool::new(false));
    let (ri, wi) = inbound.into_split();
    let (ro, wo) = outbound.into_split();
    let up = pipe(ri, wo, Direction::Up, mode.clone(), c.clone(), tainted.clone());
    let down = pipe(ro, wi, Direction::Down, mode.clone(), c.clone(), tainted.clone());
    tokio::pin!(up, down);
    let watch_mode = async {
        loop {
            if mode.changed().await.is_err() {
                return;
            }
            let m = *mode.borrow();
            if m == Mode::Refuse || (tainted.load(Ordering::Acquire) && m.whole()) {
                return;
            }
        }
    };
    tokio::select! {
        _ = &mut up => {}
        _ = &mut down => {}
        _ = watch_mode => {
            Counters::add(&c.reset, 1);
            // The halves (and so the sockets) are dropped when this function returns.
            for fd in fds {
                zero_linger(fd);
            }
        }
    }
}

/// One direction: reads chunks, drops or delays them as the mode says, writes them in order.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    dir: Direction,
    mode: watch::Receiver<Mode>,
    c: Arc<Counters>,
    tainted: Arc<AtomicBool>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(1024);
    let c2 = c.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let m = *mode.borrow();
            if m.drops(dir) || m == Mode::Refuse {
                tainted.store(true, Ordering::Release);
                Counters::add(&c2.bytes_dropped, n as u64);
                continue;
            }
            let at = Instant::now() + m.delay(dir);
            if tx.send((at, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
        // The writer ends once it delivered what is queued.
        drop(tx);
    };
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
            Counters::add(&c.bytes_forwarded, bytes.len() as u64);
        }
        let _ = to.shutdown().await;
    };
    tokio::pin!(reader, writer);
    tokio::select! {
        _ = &mut writer => return,
        _ = &mut reader => {}
    }
    writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server that also reports every chunk it receives.
    async fn echo() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        let _ = tx.send(buf[..n].to_vec());
                    }
                });
            }
        });
        (addr, rx)
    }

    /// Sends `msg` and waits up to `wait` for the echo: `Ok(Some)` echoed, `Ok(None)` nothing
    /// came, `Err` the connection failed.
    async fn round_trip(s: &mut TcpStream, msg: &[u8], wait: Duration) -> std::io::Result<Option<Vec<u8>>> {
        s.write_all(msg).await?;
        let mut buf = vec![0u8; msg.len()];
        match tokio::time::timeout(wait, s.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Ok(Some(buf)),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    #[tokio::test]
    async fn every_mode_does_what_it_says() {
        let (target, mut seen) = echo().await;
        let p = Proxy::start(Ipv4Addr::LOCALHOST, target).await;
        let short = Duration::from_millis(300);
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        assert_eq!(
            round_trip(&mut s, b"pass", short).await.unwrap().as_deref(),
            Some(&b"pass"[..])
        );
        assert_eq!(seen.recv().await.unwrap(), b"pass");

        // Delay: the answer takes at least the added latency of both directions.
        p.delay(Duration::from_millis(150), Duration::from_millis(100));
        let sent = Instant::now();
        let echoed = round_trip(&mut s, b"slow", Duration::from_secs(2)).await.unwrap();
        assert_eq!(echoed.as_deref(), Some(&b"slow"[..]));
        assert!(sent.elapsed() >= Duration::from_millis(250), "{:?}", sent.elapsed());
        seen.recv().await.unwrap();
        p.heal();

        // Answers dropped: the target gets the request, the client no answer; the healed
        // connection, no longer whole, is reset.
        p.drop_direction(Direction::Down);
        assert_eq!(round_trip(&mut s, b"lost", short).await.unwrap(), None);
        assert_eq!(seen.recv().await.unwrap(), b"lost");
        p.heal();
        let after = round_trip(&mut s, b"again", short).await;
        assert!(!matches!(after, Ok(Some(_))), "a tainted connection went on: {after:?}");

        // Requests dropped: the target gets nothing.
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        p.drop_direction(Direction::Up);
        assert_eq!(round_trip(&mut s, b"void", short).await.unwrap(), None);
        assert!(seen.try_recv().is_err(), "a dropped request arrived");
        p.heal();

        // Black hole: a new connection is accepted and held; nothing comes back or through.
        p.blackhole();
        let mut held = TcpStream::connect(p.addr).await.unwrap();
        assert_eq!(round_trip(&mut held, b"hole", short).await.unwrap(), None);
        assert!(seen.try_recv().is_err());
        p.heal();
        let after = round_trip(&mut held, b"hole", short).await;
        assert!(!matches!(after, Ok(Some(_))), "a held connection came back: {after:?}");

        // Refuse: an open connection is reset, new ones too; heal passes again.
        let mut open = TcpStream::connect(p.addr).await.unwrap();
        assert!(round_trip(&mut open, b"open", short).await.unwrap().is_some());
        seen.recv().await.unwrap();
        p.cut();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!matches!(round_trip(&mut open, b"x", short).await, Ok(Some(_))));
        let mut refused = TcpStream::connect(p.addr).await.unwrap();
        let r = round_trip(&mut refused, b"x", short).await;
        assert!(r.is_err() || r.as_ref().is_ok_and(|v| v.is_none()), "{r:?}");
        p.heal();
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        assert!(round_trip(&mut s, b"back", short).await.unwrap().is_some());

        let stats = p.stats();
        assert!(stats.refused >= 1 && stats.held >= 1 && stats.reset >= 2, "{stats:?}");
        assert!(stats.bytes_dropped >= 8 && stats.bytes_forwarded > 0, "{stats:?}");
    }
}
