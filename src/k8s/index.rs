//! The in-memory index the watches feed: compact pod projections by namespace, the EurekaApps,
//! and node zones. Each change returns the EurekaApps it may affect, so reconciles are targeted.
//! A re-list (`Init` … `InitDone`) replaces a whole kind at once, so objects deleted while the
//! watch was down disappear; nothing counts as synced until every kind has been listed once.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{crd::EurekaApp, plan::selector_matches, pods::PodInfo};

/// Names an EurekaApp.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AppKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl AppKey {
    pub fn of(app: &EurekaApp) -> Option<AppKey> {
        Some(AppKey {
            namespace: app.metadata.namespace.clone()?,
            name: app.metadata.name.clone()?,
        })
    }
}

/// What a reconcile reads.
pub struct Snapshot {
    pub app: Option<Arc<EurekaApp>>,
    pub pods: Vec<Arc<PodInfo>>,
    pub zones: Arc<BTreeMap<String, String>>,
}

#[derive(Default)]
pub struct Index {
    pods: HashMap<String, BTreeMap<String, Arc<PodInfo>>>,
    apps: BTreeMap<AppKey, Arc<EurekaApp>>,
    zones: Arc<BTreeMap<String, String>>,
    pods_synced: bool,
    apps_synced: bool,
    nodes_synced: bool,
}

impl Index {
    /// Whether every kind has been listed at least once (before that, nothing may be removed).
    pub fn synced(&self) -> bool {
        self.pods_synced && self.apps_synced && self.nodes_synced
    }

    pub fn pod_count(&self) -> usize {
        self.pods.values().map(BTreeMap::len).sum()
    }

    /// EurekaApps in `namespace` that select any of `label_sets`.
    fn apps_selecting(&self, namespace: &str, label_sets: &[&BTreeMap<String, String>]) -> Vec<AppKey> {
        self.apps
            .iter()
            .filter(|(k, _)| k.namespace == namespace)
            .filter(|(_, app)| {
                label_sets.iter().any(|labels| {
                    selector_matches(&app.spec.selector, labels).unwrap_or(true)
                        || app
                            .spec
                            .status_overrides
                            .iter()
                            .any(|o| selector_matches(&o.selector, labels).unwrap_or(false))
                })
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub fn all_apps(&self) -> Vec<AppKey> {
        self.apps.keys().cloned().collect()
    }

    pub fn apply_pod(&mut self, mut pod: PodInfo) -> Vec<AppKey> {
        let ns = self.pods.entry(pod.namespace.clone()).or_default();
        // A deletion whose grace period is shortened (the kubelet's final delete with grace 0,
        // `kubectl delete --force`) moves the deletionTimestamp: the drain began at the first one.
        if let Some(first) = ns.get(&pod.name).and_then(|o| o.deleting_since) {
            pod.deleting_since = Some(pod.deleting_since.map_or(first, |now| now.min(first)));
        }
        let old = ns.insert(pod.name.clone(), Arc::new(pod.clone()));
        if old.as_deref() == Some(&pod) {
            return Vec::new();
        }
        match &old {
            Some(old) => self.apps_selecting(&pod.namespace, &[&old.labels, &pod.labels]),
            None => self.apps_selecting(&pod.namespace, &[&pod.labels]),
        }
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> Vec<AppKey> {
        let Some(old) = self.pods.get_mut(namespace).and_then(|ns| ns.remove(name)) else {
            return Vec::new();
        };
        self.apps_selecting(namespace, &[&old.labels])
    }

    /// A completed re-list of pods: everything may have changed.
    pub fn reset_pods(&mut self, pods: Vec<PodInfo>) -> Vec<AppKey> {
        self.pods.clear();
        for pod in pods {
            self.pods
                .entry(pod.namespace.clone())
                .or_default()
                .insert(pod.name.clone(), Arc::new(pod));
        }
        self.pods_synced = true;
        self.all_apps()
    }

    pub fn apply_app(&mut self, app: EurekaApp) -> Vec<AppKey> {
        let Some(key) = AppKey::of(&app) else { return Vec::new() };
        self.apps.insert(key.clone(), Arc::new(app));
        vec![key]
    }

    pub fn delete_app(&mut self, app: &EurekaApp) -> Vec<AppKey> {
        let Some(key) = AppKey::of(app) else { return Vec::new() };
        self.apps.remove(&key);
        vec![key]
    }

    /// A completed re-list of EurekaApps: the old and the new keys all need a look.
    pub fn reset_apps(&mut self, apps: Vec<EurekaApp>) -> Vec<AppKey> {
        let mut touched: Vec<AppKey> = self.apps.keys().cloned().collect();
        self.apps = apps
            .into_iter()
            .filter_map(|a| Some((AppKey::of(&a)?, Arc::new(a))))
            .collect();
        touched.extend(self.apps.keys().cloned());
        touched.sort();
        touched.dedup();
        self.apps_synced = true;
        touched
    }

    /// A node's zone changed (or the node went): apps with pods on it need a look.
    pub fn set_zone(&mut self, node: &str, zone: Option<String>) -> Vec<AppKey> {
        if self.zones.get(node) == zone.as_ref() {
            return Vec::new();
        }
        let zones = Arc::make_mut(&mut self.zones);
        match zone {
            Some(z) => zones.insert(node.to_string(), z),
            None => zones.remove(node),
        };
        self.apps_on_node(node)
    }

    pub fn reset_zones(&mut self, zones: BTreeMap<String, String>) -> Vec<AppKey> {
        self.zones = Arc::new(zones);
        self.nodes_synced = true;
        self.all_apps()
    }

    /// Without a node watch (no zone lookups), nodes count as synced.
    pub fn mark_nodes_synced(&mut self) {
        self.nodes_synced = true;
    }

    fn apps_on_node(&self, node: &str) -> Vec<AppKey> {
        let mut keys: Vec<AppKey> = Vec::new();
        for (ns, pods) in &self.pods {
            let on_node: Vec<&BTreeMap<String, String>> = pods
                .values()
                .filter(|p| p.node_name.as_deref() == Some(node))
                .map(|p| &p.labels)
                .collect();
            if !on_node.is_empty() {
                keys.extend(self.apps_selecting(ns, &on_node));
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    pub fn snapshot(&self, key: &AppKey) -> Snapshot {
        Snapshot {
            app: self.apps.get(key).cloned(),
            pods: self
                .pods
                .get(&key.namespace)
                .map(|ns| ns.values().cloned().collect())
                .unwrap_or_default(),
            zones: self.zones.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(ns: &str, name: &str, selector: &str) -> EurekaApp {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: {name}, namespace: {ns}}}\nspec: {{selector: {{matchLabels: {{app: {selector}}}}}}}\n"
        ))
        .unwrap()
    }

    fn pod(ns: &str, name: &str, label: &str) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: [("app".to_string(), label.to_string())].into(),
            node_name: Some("n1".into()),
            ..PodInfo::default()
        }
    }

    #[test]
    fn a_drain_starts_at_the_first_deletion_timestamp() {
        let mut idx = Index::default();
        let mut p = pod("a", "p1", "web");
        p.deleting_since = Some(1_000);
        idx.apply_pod(p.clone());
        // The final delete with grace 0 moves deletionTimestamp to the end of the grace period.
        p.deleting_since = Some(9_000);
        idx.apply_pod(p);
        let key = AppKey {
            namespace: "a".into(),
            name: "web".into(),
        };
        assert_eq!(idx.snapshot(&key).pods[0].deleting_since, Some(1_000));
    }

    #[test]
    fn changes_point_at_the_apps_they_affect() {
        let mut idx = Index::default();
        assert!(!idx.synced());
        idx.reset_apps(vec![
            app("a", "web", "web"),
            app("a", "api", "api"),
            app("b", "web", "web"),
        ]);
        idx.reset_pods(vec![]);
        idx.mark_nodes_synced();
        assert!(idx.synced());
        let web = AppKey {
            namespace: "a".into(),
            name: "web".into(),
        };
        let api = AppKey {
            namespace: "a".into(),
            name: "api".into(),
        };
        assert_eq!(idx.apply_pod(pod("a", "p1", "web")), vec![web.clone()]);
        assert!(
            idx.apply_pod(pod("a", "p1", "web")).is_empty(),
            "no change, no reconcile"
        );
        // A label change touches the old and the new selector.
        let mut keys = idx.apply_pod(pod("a", "p1", "api"));
        keys.sort();
        assert_eq!(keys, vec![api.clone(), web.clone()]);
        assert_eq!(idx.delete_pod("a", "p1"), vec![api.clone()]);
        assert!(idx.delete_pod("a", "p1").is_empty());
        idx.apply_pod(pod("a", "p2", "web"));
        assert_eq!(idx.set_zone("n1", Some("z1".into())), vec![web.clone()]);
        assert!(idx.set_zone("n1", Some("z1".into())).is_empty());
        assert_eq!(idx.snapshot(&web).zones.get("n1").map(String::as_str), Some("z1"));
        assert_eq!(idx.snapshot(&web).pods.len(), 1);
        // A re-list that lost an app reports it so its instances can go.
        let touched = idx.reset_apps(vec![app("a", "web", "web")]);
        assert!(touched.contains(&api));
        assert!(idx.snapshot(&api).app.is_none());
    }
}
