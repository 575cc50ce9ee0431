//! Who this replica is: its name, the host peers reach it at, and its pod's name and IP, read
//! once from the flags and the pod's environment (the downward API).

/// Who this replica is, read once from the flags and the pod's environment.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `--replica-id`, else the pod name, else the host name.
    pub replica: String,
    /// The host peers reach the Eureka listener at.
    pub host: String,
    /// `POD_IP` (the downward API), if set.
    pub pod_ip: Option<String>,
    /// `POD_NAME`, if set.
    pub pod_name: Option<String>,
}

impl Identity {
    pub fn read(flag: Option<&str>, bind: std::net::SocketAddr) -> Identity {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let hostname = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty());
        let pod_name = env("POD_NAME");
        let pod_ip = env("POD_IP");
        let replica = flag
            .map(str::to_string)
            .or_else(|| pod_name.clone())
            .or_else(|| hostname.clone())
            .unwrap_or_else(|| format!("eureka-operator-{}", std::process::id()));
        let host = if bind.ip().is_unspecified() {
            pod_ip.clone().or(hostname).unwrap_or_else(|| "localhost".into())
        } else {
            bind.ip().to_string()
        };
        Identity {
            replica,
            host,
            pod_ip,
            pod_name,
        }
    }
}
