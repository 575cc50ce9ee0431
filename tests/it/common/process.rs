//! Child processes that cannot outlive the test binary: every peer process is spawned from one
//! long-lived thread with `PR_SET_PDEATHSIG`, and each handle kills its process group on drop.

use std::{
    fs::File,
    io::Read,
    net::{Ipv4Addr, TcpListener},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, OnceLock, mpsc},
    time::{Duration, Instant},
};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, so children are forked
/// from a thread that lives as long as the test process: they die with the process, also when a
/// test panics or the harness is killed.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("peer-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("failed to start the peer spawner thread");
        Mutex::new(tx)
    })
}

/// A running peer process. Dropping it terminates the whole process group.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("failed to open log {}: {e}", log.display()));
        let err = out.try_clone().expect("failed to clone log handle");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: only async-signal-safe libc calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Own process group, so a JVM's or npm's children are killed with it.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .expect("spawner lock")
            .send((cmd, tx))
            .expect("spawner thread is gone");
        let child = rx
            .recv()
            .expect("spawner thread is gone")
            .unwrap_or_else(|e| panic!("failed to start {name}: {e}"));
        Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far (lossy UTF-8).
    pub fn log(&self) -> String {
        let mut buf = Vec::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The last `n` lines of the log, for assertion messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Whether the process has exited (and with which status).
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's process group.
        unsafe {
            libc::kill(-self.pid(), sig);
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the exit status.
    pub fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Some(status) = self.try_exit() {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        self.child.wait().ok()
    }

    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Freezes the process (SIGSTOP); `resume` thaws it.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            self.signal(libc::SIGCONT);
            self.terminate(Duration::from_secs(3));
        }
    }
}

/// The resident memory (`VmRSS`) of process `pid` in KiB, from `/proc`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// How many established TCP connections process `pid` holds to `port` (IPv4 and IPv6): its socket
/// descriptors matched by inode against the rows of `/proc/<pid>/net/tcp{,6}` whose remote port
/// is `port`.
pub fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|target| {
                    let t = target.to_string_lossy();
                    Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|row| {
                    let cols: Vec<&str> = row.split_whitespace().collect();
                    // local, remote (ADDR:PORT in hex), state (01 = established), ..., inode (10th).
                    cols.len() > 9
                        && cols[3] == "01"
                        && cols[2].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
                        && inodes.contains(cols[9])
                })
                .count()
        })
        .sum()
}

/// A TCP port that was free on `ip` a moment ago.
pub fn free_port(ip: Ipv4Addr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("failed to find a free port on {ip}: {e}"))
}

/// Addresses for `n` replicas on 127.0.0.`first`.. : their IPs, free (Eureka, admin) ports on
/// each, and their Eureka URLs.
pub fn replica_addresses(first: u8, n: usize) -> (Vec<Ipv4Addr>, Vec<(u16, u16)>, Vec<String>) {
    let ips: Vec<Ipv4Addr> = (0..n).map(|i| Ipv4Addr::new(127, 0, 0, first + i as u8)).collect();
    let ports: Vec<(u16, u16)> = ips.iter().map(|ip| (free_port(*ip), free_port(*ip))).collect();
    let urls = ips
        .iter()
        .zip(&ports)
        .map(|(ip, (p, _))| format!("http://{ip}:{p}/eureka/"))
        .collect();
    (ips, ports, urls)
}

/// Polls `check` every `every` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `get` every 50 ms until it returns `expected`, or panics after `timeout` with `what`
/// and the last value seen.
pub async fn wait_equal<T, F, Fut>(what: &str, timeout: Duration, expected: &T, mut get: F)
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let now = get().await;
        if now == *expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}: got {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh scratch directory that is removed on drop; named after the test process so stale ones
/// from killed runs can be recognised.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_stale_scratch_dirs);
    tempfile::Builder::new()
        .prefix(&format!("eo-{prefix}-{}-", std::process::id()))
        .tempdir()
        .expect("failed to create a scratch directory")
}

/// Removes scratch directories of test processes that no longer run (shared fixtures live in
/// statics, which are never dropped).
fn sweep_stale_scratch_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("eo-") else { continue };
        let Some(pid) = rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
