//! Finds this operator's other replicas: the endpoints of its headless Service, from the
//! EndpointSlices labelled `kubernetes.io/service-name`. Publishes their Eureka URLs (with
//! readiness) on a watch channel; `None` until the first list.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        watcher::{self, Event, watcher},
    },
};
use tokio::sync::watch;

/// A replica's Eureka URL and whether it is ready (a source for the start-up sync).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReplicaEndpoint {
    pub url: String,
    pub ready: bool,
}

/// Who we are, so we are never our own peer.
#[derive(Clone, Debug, Default)]
pub struct Me {
    pub pod_name: Option<String>,
    pub pod_ip: Option<String>,
}

/// Pure: the replica URLs of a set of slices.
pub fn endpoints(slices: &BTreeMap<String, EndpointSlice>, me: &Me) -> Vec<ReplicaEndpoint> {
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
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
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

/// Watches the slices of `namespace/service` until the process ends.
pub async fn watch_replicas(
    client: Client,
    namespace: String,
    service: String,
    me: Me,
    tx: watch::Sender<Option<Vec<ReplicaEndpoint>>>,
) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    let mut slices: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut buffer: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(Event::Apply(s)) => {
                slices.insert(s.metadata.name.clone().unwrap_or_default(), s);
                true
            }
            Ok(Event::Delete(s)) => {
                slices.remove(s.metadata.name.as_deref().unwrap_or_default());
                true
            }
            Ok(Event::Init) => {
                buffer.clear();
                false
            }
            Ok(Event::InitApply(s)) => {
                buffer.insert(s.metadata.name.clone().unwrap_or_default(), s);
                false
            }
            Ok(Event::InitDone) => {
                slices = std::mem::take(&mut buffer);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "EndpointSlice watch failed; retrying");
                false
            }
        };
        if changed {
            let next = Some(endpoints(&slices, &me));
            tx.send_if_modified(|current| {
                let differs = *current != next;
                if differs {
                    *current = next.clone();
                }
                differs
            });
        }
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
"#,
        )
        .unwrap();
        let slices: BTreeMap<String, EndpointSlice> = [("s".to_string(), slice)].into();
        let me = Me {
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
            ]
        );
        let me = Me {
            pod_name: None,
            pod_ip: Some("10.0.0.1".into()),
        };
        assert_eq!(endpoints(&slices, &me).len(), 2);
    }
}
