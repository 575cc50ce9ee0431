//! Finds this operator's other replicas: the endpoints of its headless Service, from the
//! EndpointSlices labelled `kubernetes.io/service-name`. Publishes their Eureka URLs (with
//! readiness: an endpoint's `serving` condition, since the headless Service publishes not-ready
//! addresses and so marks every endpoint `ready`) on a watch channel; `None` until the first list.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher::watcher},
};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use super::watch::{Backoff, Follower, follow};
use crate::{health::Health, replication::peers::ReplicaEndpoint, supervisor::Shutdown};

/// Who we are, so we are never our own peer.
#[derive(Clone, Debug, Default)]
pub struct OwnPod {
    pub pod_name: Option<String>,
    pub pod_ip: Option<String>,
}

/// Pure: the replica URLs of a set of slices.
pub fn endpoints(slices: &BTreeMap<String, EndpointSlice>, me: &OwnPod) -> Vec<ReplicaEndpoint> {
    let mut out = Vec::new();
    for slice in slices.values() {
        let port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| matches!(p.name.as_deref(), Some("eureka") | Some("http")))
            .or_else(|| slice.ports.iter().flatten().next())
            .and_then(|p| p.port)
            .unwrap_or(8761);
        for ep in slice.endpoints.iter().flatten() {
            if ep
                .target_ref
                .as_ref()
                .and_then(|t| t.name.as_deref())
                .is_some_and(|n| Some(n) == me.pod_name.as_deref())
            {
                continue;
            }
            // `serving` is the pod's readiness; `ready` is always true behind a Service that
            // publishes not-ready addresses (as the chart's headless one does).
            let ready = ep
                .conditions
                .as_ref()
                .and_then(|c| c.serving.or(c.ready))
                .unwrap_or(true);
            let terminating = ep.conditions.as_ref().and_then(|c| c.terminating).unwrap_or(false);
            if terminating {
                continue;
            }
            for addr in &ep.addresses {
                if Some(addr.as_str()) == me.pod_ip.as_deref() {
                    continue;
                }
                let host = if addr.contains(':') {
                    format!("[{addr}]")
                } else {
                    addr.clone()
                };
                out.push(ReplicaEndpoint {
                    url: format!("http://{host}:{port}/eureka/"),
                    ready,
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Follows the slices of one Service, publishing the replica URLs.
struct Slices {
    me: OwnPod,
    slices: Mutex<BTreeMap<String, EndpointSlice>>,
    tx: watch::Sender<Option<Vec<ReplicaEndpoint>>>,
}

impl Slices {
    fn publish(&self) {
        let next = Some(endpoints(&self.slices.lock(), &self.me));
        self.tx.send_if_modified(|current| {
            let differs = *current != next;
            if differs {
                *current = next.clone();
            }
            differs
        });
    }
}

impl Follower<EndpointSlice> for Slices {
    type Item = EndpointSlice;

    fn project(&self, slice: &EndpointSlice) -> Option<EndpointSlice> {
        Some(slice.clone())
    }

    fn applied(&self, slice: EndpointSlice) {
        self.slices
            .lock()
            .insert(slice.metadata.name.clone().unwrap_or_default(), slice);
        self.publish();
    }

    fn deleted(&self, slice: &EndpointSlice) {
        self.slices
            .lock()
            .remove(slice.metadata.name.as_deref().unwrap_or_default());
        self.publish();
    }

    fn relisted(&self, slices: Vec<EndpointSlice>) {
        *self.slices.lock() = slices
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
            .collect();
        self.publish();
    }
}

/// Watches the slices of `namespace/service` until the stream ends (an error) or shutdown.
#[allow(clippy::too_many_arguments)]
pub async fn watch_replicas(
    client: Client,
    (namespace, service): (String, String),
    me: OwnPod,
    tx: watch::Sender<Option<Vec<ReplicaEndpoint>>>,
    (backoff, watch_timeout): (Backoff, u32),
    (errors, failing): (Counter, super::watch::WatchFailing),
    health: Arc<Health>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let config = super::watch::config(watch_timeout).labels(&format!("kubernetes.io/service-name={service}"));
    let stream = watcher(api, config).backoff(backoff);
    let follower = Slices {
        me,
        slices: Mutex::new(BTreeMap::new()),
        tx,
    };
    let followed = follow(
        format!("EndpointSlices of {namespace}/{service}"),
        stream,
        &follower,
        &errors,
        &failing,
        &health,
    );
    tokio::select! {
        ended = followed => ended,
        _ = shutdown.wait() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_ready_and_unready_endpoints_but_never_ourselves() {
        let slice: EndpointSlice = serde_saphyr::from_str(
            r#"
metadata: {name: eureka-abc, labels: {kubernetes.io/service-name: eureka-peers}}
addressType: IPv4
ports: [{name: admin, port: 8080}, {name: eureka, port: 8761}]
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: true}
  targetRef: {kind: Pod, name: eureka-0}
- addresses: [10.0.0.2]
  conditions: {ready: false}
  targetRef: {kind: Pod, name: eureka-1}
- addresses: [10.0.0.3]
  conditions: {ready: true}
  targetRef: {kind: Pod, name: eureka-2}
- addresses: [10.0.0.4]
  conditions: {ready: false, terminating: true}
  targetRef: {kind: Pod, name: eureka-3}
- addresses: [10.0.0.5]
  conditions: {ready: true, serving: false}
  targetRef: {kind: Pod, name: eureka-4}
"#,
        )
        .unwrap();
        let slices: BTreeMap<String, EndpointSlice> = [("s".to_string(), slice)].into();
        let me = OwnPod {
            pod_name: Some("eureka-2".into()),
            pod_ip: None,
        };
        assert_eq!(
            endpoints(&slices, &me),
            vec![
                ReplicaEndpoint {
                    url: "http://10.0.0.1:8761/eureka/".into(),
                    ready: true
                },
                ReplicaEndpoint {
                    url: "http://10.0.0.2:8761/eureka/".into(),
                    ready: false
                },
                // Published although not ready (publishNotReadyAddresses): `serving` tells.
                ReplicaEndpoint {
                    url: "http://10.0.0.5:8761/eureka/".into(),
                    ready: false
                },
            ]
        );
        let me = OwnPod {
            pod_name: None,
            pod_ip: Some("10.0.0.1".into()),
        };
        assert_eq!(endpoints(&slices, &me).len(), 3);
    }
}
