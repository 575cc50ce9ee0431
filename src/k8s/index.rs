//! The in-memory index the pod and node watches feed: compact pod projections by namespace, and
//! node zones. EurekaApps are not here: they live in the controllers' stores (kube-runtime's
//! reflectors), and the caller maps a pod change to the EurekaApps that select it.
//!
//! A completed re-list replaces one watch scope (a namespace, or all of them) at once, so pods
//! deleted while the watch was down disappear, and interleaved re-lists of several namespaces never
//! mix. Nothing counts as synced until every scope and the nodes have been listed once.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use super::{
    crd::EurekaApp,
    pods::{Labels, PodInfo, Text},
};

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

/// What one watch covers: one namespace, or every namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    /// The scopes of `--watch-namespaces` (all namespaces when empty).
    pub fn of(namespaces: &[String]) -> Vec<Scope> {
        if namespaces.is_empty() {
            vec![Scope::All]
        } else {
            namespaces.iter().map(|n| Scope::Namespace(n.clone())).collect()
        }
    }

    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespace(n) => n == namespace,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::All => f.write_str("all namespaces"),
            Scope::Namespace(n) => write!(f, "namespace {n}"),
        }
    }
}

/// The label sets a pod change touched, in one namespace: the EurekaApps selecting any of them
/// need a look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Touched {
    pub namespace: String,
    pub labels: Vec<Labels>,
}

/// What a reconcile reads.
pub struct Snapshot {
    /// The pods of the EurekaApp's namespace.
    pub pods: Vec<Arc<PodInfo>>,
    /// Node zones (`topology.kubernetes.io/zone`) by node name.
    pub zones: Arc<BTreeMap<String, String>>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Index {
    /// Pod projections by namespace, then name (both keys shared with the projection).
    pods: HashMap<Text, BTreeMap<Text, Arc<PodInfo>>>,
    /// Node zones, shared with snapshots (copied on write).
    zones: Arc<BTreeMap<String, String>>,
    /// The pod watch scopes, and which have listed once.
    scopes: Vec<Scope>,
    listed: HashSet<Scope>,
    /// Whether the node watch has listed once (or nodes are not watched).
    nodes_listed: bool,
}

impl Index {
    /// An index for pod watches over `scopes`.
    pub fn new(scopes: Vec<Scope>) -> Index {
        Index {
            pods: HashMap::new(),
            zones: Arc::default(),
            scopes,
            listed: HashSet::new(),
            nodes_listed: false,
        }
    }

    /// Whether every scope and the nodes have been listed at least once (before that, nothing
    /// may be removed).
    pub fn synced(&self) -> bool {
        self.nodes_listed && self.scopes.iter().all(|s| self.listed.contains(s))
    }

    pub fn pod_count(&self) -> usize {
        self.pods.values().map(BTreeMap::len).sum()
    }

    /// A pod was added or changed; `None` when nothing a plan reads changed.
    pub fn apply_pod(&mut self, mut pod: PodInfo) -> Option<Touched> {
        let ns = self.pods.entry(pod.namespace.clone()).or_default();
        let first = match ns.get_key_value(&*pod.name) {
            Some((name, old)) => {
                // The map keeps its key on replacement: the new projection shares it.
                pod.name = name.clone();
                old.deleting_since
            }
            None => None,
        };
        keep_drain_start(&mut pod, first);
        let pod = Arc::new(pod);
        let old = ns.insert(pod.name.clone(), pod.clone());
        if old.as_deref() == Some(&*pod) {
            return None;
        }
        let mut labels = vec![pod.labels.clone()];
        labels.extend(old.map(|o| o.labels.clone()).filter(|l| *l != pod.labels));
        Some(Touched {
            namespace: pod.namespace.to_string(),
            labels,
        })
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> Option<Touched> {
        let ns = self.pods.get_mut(namespace)?;
        let old = ns.remove(name)?;
        if ns.is_empty() {
            self.pods.remove(namespace);
        }
        Some(Touched {
            namespace: namespace.to_string(),
            labels: vec![old.labels.clone()],
        })
    }

    /// A completed re-list of the pods of `scope`; returns the namespaces whose pods may have
    /// changed (those before and after).
    pub fn replace_pods(&mut self, scope: &Scope, pods: Vec<PodInfo>) -> Vec<String> {
        let mut touched: HashSet<String> = self
            .pods
            .keys()
            .filter(|ns| scope.contains(ns))
            .map(|ns| ns.to_string())
            .collect();
        let old: HashMap<Text, BTreeMap<Text, Arc<PodInfo>>> =
            self.pods.extract_if(|ns, _| scope.contains(ns)).collect();
        for mut pod in pods {
            let first = old
                .get(&*pod.namespace)
                .and_then(|ns| ns.get(&*pod.name))
                .and_then(|p| p.deleting_since);
            keep_drain_start(&mut pod, first);
            touched.insert(pod.namespace.to_string());
            self.pods
                .entry(pod.namespace.clone())
                .or_default()
                .insert(pod.name.clone(), Arc::new(pod));
        }
        self.listed.insert(scope.clone());
        let mut touched: Vec<String> = touched.into_iter().collect();
        touched.sort();
        touched
    }

    /// A node's zone changed (or the node went): the pods on it, if it changed.
    pub fn set_zone(&mut self, node: &str, zone: Option<String>) -> Vec<Touched> {
        if self.zones.get(node) == zone.as_ref() {
            return Vec::new();
        }
        let zones = Arc::make_mut(&mut self.zones);
        match zone {
            Some(z) => zones.insert(node.to_string(), z),
            None => zones.remove(node),
        };
        self.pods_on(node)
    }

    /// A completed re-list of node zones: every namespace may need a look.
    pub fn replace_zones(&mut self, zones: BTreeMap<String, String>) -> Vec<String> {
        let changed = *self.zones != zones;
        self.zones = Arc::new(zones);
        self.nodes_listed = true;
        if changed {
            self.pods.keys().map(|ns| ns.to_string()).collect()
        } else {
            Vec::new()
        }
    }

    /// Without a node watch (no zone lookups), nodes count as listed.
    pub fn mark_nodes_listed(&mut self) {
        self.nodes_listed = true;
    }

    fn pods_on(&self, node: &str) -> Vec<Touched> {
        self.pods
            .iter()
            .filter_map(|(ns, pods)| {
                let labels: Vec<Labels> = pods
                    .values()
                    .filter(|p| p.node_name.as_deref() == Some(node))
                    .map(|p| p.labels.clone())
                    .collect();
                (!labels.is_empty()).then(|| Touched {
                    namespace: ns.to_string(),
                    labels,
                })
            })
            .collect()
    }

    pub fn snapshot(&self, namespace: &str) -> Snapshot {
        Snapshot {
            pods: self
                .pods
                .get(namespace)
                .map(|ns| ns.values().cloned().collect())
                .unwrap_or_default(),
            zones: self.zones.clone(),
        }
    }
}

/// A deletion whose grace period is shortened (the kubelet's final delete with grace 0 at the end
/// of the grace period, `kubectl delete --force`) moves the deletionTimestamp: the drain began at
/// the first one, so a drained instance never comes back OUT_OF_SERVICE before its pod goes.
fn keep_drain_start(pod: &mut PodInfo, first: Option<i64>) {
    if let Some(first) = first {
        pod.deleting_since = Some(pod.deleting_since.map_or(first, |now| now.min(first)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, label: &str) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: [("app", label)].into_iter().collect(),
            node_name: Some("n1".into()),
            ..PodInfo::default()
        }
    }

    fn labels(l: &str) -> Labels {
        [("app", l)].into_iter().collect()
    }

    #[test]
    fn changes_name_the_labels_they_touch() {
        let mut idx = Index::new(vec![Scope::Namespace("a".into()), Scope::Namespace("b".into())]);
        assert!(!idx.synced());
        idx.replace_pods(&Scope::Namespace("a".into()), vec![]);
        idx.mark_nodes_listed();
        assert!(!idx.synced(), "namespace b has not listed yet");
        idx.replace_pods(&Scope::Namespace("b".into()), vec![pod("b", "x", "web")]);
        assert!(idx.synced());
        let t = idx.apply_pod(pod("a", "p1", "web")).unwrap();
        assert_eq!(t.labels, vec![labels("web")]);
        assert!(
            idx.apply_pod(pod("a", "p1", "web")).is_none(),
            "no change, no reconcile"
        );
        // A label change touches the old and the new labels.
        let t = idx.apply_pod(pod("a", "p1", "api")).unwrap();
        assert_eq!(t.labels, vec![labels("api"), labels("web")]);
        assert_eq!(idx.delete_pod("a", "p1").unwrap().labels, vec![labels("api")]);
        assert!(idx.delete_pod("a", "p1").is_none());
        idx.apply_pod(pod("a", "p2", "web"));
        assert_eq!(idx.set_zone("n1", Some("z1".into())).len(), 2, "pods on n1 in a and b");
        assert!(idx.set_zone("n1", Some("z1".into())).is_empty());
        assert_eq!(idx.snapshot("a").zones.get("n1").map(String::as_str), Some("z1"));
        assert_eq!(idx.snapshot("a").pods.len(), 1);
    }

    #[test]
    fn a_drain_starts_at_the_first_deletion_timestamp() {
        let mut idx = Index::new(vec![Scope::All]);
        let mut p = pod("a", "p1", "web");
        p.deleting_since = Some(1_000);
        idx.apply_pod(p.clone());
        p.deleting_since = Some(9_000);
        idx.apply_pod(p.clone());
        assert_eq!(idx.snapshot("a").pods[0].deleting_since, Some(1_000));
        p.deleting_since = Some(12_000);
        idx.replace_pods(&Scope::All, vec![p]);
        assert_eq!(
            idx.snapshot("a").pods[0].deleting_since,
            Some(1_000),
            "across a re-list too"
        );
    }

    #[test]
    fn a_relist_replaces_only_its_own_scope() {
        let a = Scope::Namespace("a".into());
        let b = Scope::Namespace("b".into());
        let mut idx = Index::new(vec![a.clone(), b.clone()]);
        idx.replace_pods(&a, vec![pod("a", "a1", "web"), pod("a", "a2", "web")]);
        idx.replace_pods(&b, vec![pod("b", "b1", "web")]);
        // b re-lists after a watch gap in which b1 went: a's pods stay.
        assert_eq!(idx.replace_pods(&b, vec![]), vec!["b".to_string()]);
        assert_eq!(idx.snapshot("a").pods.len(), 2);
        assert!(idx.snapshot("b").pods.is_empty());
        let mut all = Index::new(vec![Scope::All]);
        all.replace_pods(&Scope::All, vec![pod("a", "a1", "web"), pod("c", "c1", "x")]);
        assert_eq!(all.replace_pods(&Scope::All, vec![pod("c", "c1", "x")]), vec!["a", "c"]);
        assert_eq!(all.pod_count(), 1);
    }
}
