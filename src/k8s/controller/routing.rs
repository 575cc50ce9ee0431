//! Trigger routing: the EurekaApp stores by watch scope, the reconcile requests sent to the
//! controller of the right scope, and the pod and node watches whose changes become those requests.

use super::*;
use crate::k8s::pods::Labels;

/// The EurekaApp stores, one per watch scope.
#[derive(Clone, Default)]
pub(super) struct Stores(pub(super) Vec<(Scope, Store<EurekaApp>)>);

impl Stores {
    /// The EurekaApps of `namespace`.
    pub(super) fn apps_in(&self, namespace: &str) -> Vec<Arc<EurekaApp>> {
        self.0
            .iter()
            .filter(|(scope, _)| scope.contains(namespace))
            .flat_map(|(_, store)| store.state())
            .filter(|a| a.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    pub(super) fn all(&self) -> Vec<Arc<EurekaApp>> {
        self.0.iter().flat_map(|(_, s)| s.state()).collect()
    }

    pub(super) fn ready(&self) -> bool {
        use futures::FutureExt;
        self.0
            .iter()
            .all(|(_, s)| s.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok()))
    }

    pub(super) fn contains(&self, key: &AppKey) -> bool {
        let r = ObjectRef::<EurekaApp>::new(&key.name).within(&key.namespace);
        self.0.iter().any(|(_, s)| s.get(&r).is_some())
    }
}

/// Sends reconcile requests to the controller of the right scope.
#[derive(Default)]
pub(super) struct Triggers(pub(super) Vec<(Scope, mpsc::UnboundedSender<ObjectRef<EurekaApp>>)>);

impl Triggers {
    pub(super) fn send(&self, key: &AppKey) {
        for (scope, tx) in &self.0 {
            if scope.contains(&key.namespace) {
                let _ = tx.send(ObjectRef::new(&key.name).within(&key.namespace));
            }
        }
    }
}

/// The Pod watches (one per scope) and the Node watch, into the index.
pub(super) async fn watch_pods_and_nodes(ctx: Arc<Context>, scopes: Vec<Scope>) -> anyhow::Result<()> {
    let pods = scopes.into_iter().map(|scope| {
        let api: Api<WatchedPod> = match &scope {
            Scope::All => Api::all(ctx.client.clone()),
            Scope::Namespace(ns) => Api::namespaced(ctx.client.clone(), ns),
        };
        let stream = watcher(
            api,
            crate::k8s::watch::config(ctx.settings.watch_timeout_seconds).page_size(ctx.settings.pod_watch_page_size),
        )
        .backoff(Backoff::new(ctx.settings.watch_max_backoff));
        let follower = PodFollower {
            ctx: ctx.clone(),
            scope: scope.clone(),
        };
        async move {
            follow(
                format!("Pods in {scope}"),
                stream,
                &follower,
                &follower.ctx.metrics.watch_errors,
                &follower.ctx.metrics.watch_failing,
                &follower.ctx.health,
            )
            .await
        }
        .boxed()
    });
    let nodes = {
        let api: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
        let stream: BoxStream<'static, _> = watcher(api, crate::k8s::watch::config(ctx.settings.watch_timeout_seconds))
            .backoff(Backoff::new(ctx.settings.watch_max_backoff))
            .boxed();
        let follower = NodeFollower(ctx.clone());
        async move {
            follow(
                "Nodes".to_string(),
                stream,
                &follower,
                &follower.0.metrics.watch_errors,
                &follower.0.metrics.watch_failing,
                &follower.0.health,
            )
            .await
        }
        .boxed()
    };
    let (ended, _, _) = futures::future::select_all(pods.chain(std::iter::once(nodes))).await;
    ended
}

pub(super) struct PodFollower {
    pub(super) ctx: Arc<Context>,
    pub(super) scope: Scope,
}

impl Follower<WatchedPod> for PodFollower {
    type Item = PodInfo;

    fn project(&self, pod: &WatchedPod) -> Option<PodInfo> {
        PodInfo::from_watched(pod, &mut self.ctx.interner.lock())
    }

    fn applied(&self, pod: PodInfo) {
        let touched = self.ctx.index.write().apply_pod(pod);
        self.ctx.touched(touched.into_iter());
    }

    fn deleted(&self, pod: &WatchedPod) {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
            return;
        };
        let touched = self.ctx.index.write().delete_pod(ns, name);
        self.ctx.touched(touched.into_iter());
    }

    fn relisted(&self, pods: Vec<PodInfo>) {
        let namespaces = self.ctx.index.write().replace_pods(&self.scope, pods);
        tracing::info!(scope = %self.scope, pods = self.ctx.index.read().pod_count(), "pods listed");
        self.ctx.relisted(&namespaces);
    }
}

pub(super) struct NodeFollower(pub(super) Arc<Context>);

impl Follower<PartialObjectMeta<Node>> for NodeFollower {
    type Item = (String, Option<String>);

    fn project(&self, node: &PartialObjectMeta<Node>) -> Option<(String, Option<String>)> {
        let zone = |m: &ObjectMeta| m.labels.as_ref().and_then(|l| l.get(ZONE_LABEL).cloned());
        Some((node.metadata.name.clone()?, zone(&node.metadata)))
    }

    fn applied(&self, (name, zone): (String, Option<String>)) {
        let touched = self.0.index.write().set_zone(&name, zone);
        self.0.touched(touched.into_iter());
    }

    fn deleted(&self, node: &PartialObjectMeta<Node>) {
        if let Some(name) = &node.metadata.name {
            let touched = self.0.index.write().set_zone(name, None);
            self.0.touched(touched.into_iter());
        }
    }

    fn relisted(&self, nodes: Vec<(String, Option<String>)>) {
        let zones = nodes.into_iter().filter_map(|(n, z)| Some((n, z?))).collect();
        let namespaces = self.0.index.write().replace_zones(zones);
        self.0.relisted(&namespaces);
    }
}

impl Context {
    /// Queues the EurekaApps that select any of the touched label sets (or whose status-override
    /// selectors do).
    pub(super) fn touched(&self, touched: impl Iterator<Item = Touched>) {
        self.metrics.indexed_pods.set(self.index.read().pod_count() as i64);
        if !self.index.read().synced() {
            return;
        }
        for t in touched {
            for app in self.stores.apps_in(&t.namespace) {
                if selects(&app, &t.labels)
                    && let Some(key) = AppKey::of(&app)
                {
                    self.triggers.send(&key);
                }
            }
        }
    }
}

/// Whether a change of a pod that had or has one of the label sets `labels` concerns `app`: its
/// selector matches one (an invalid selector counts as a match, so that the reconcile reports
/// it), or one of its status overrides' selectors does.
pub(super) fn selects(app: &EurekaApp, labels: &[Labels]) -> bool {
    let spec = &app.spec;
    labels.iter().any(|labels| {
        selector_matches(&spec.selector, labels).unwrap_or(true)
            || spec
                .status_overrides
                .iter()
                .any(|o| selector_matches(&o.selector, labels).unwrap_or(false))
    })
}
