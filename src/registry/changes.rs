//! The delta change log: every visible change of the last `retentionTimeInMSInDeltaQueue`, in
//! order, indexed by application so that a reader can ask what changed since a version it knows
//! and rebuild only the applications involved.
//!
//! Each change carries the registry version it made. Per application the log keeps the instances
//! the delta lists (the latest change of each: the instance's last state when that change removed
//! it) and the version at which that list last changed, which moves on a new change and when
//! pruning drops an instance's last change. Names are shared `Arc<str>`s, held once per
//! application and instance however many changes mention them.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::Arc,
};

use super::view::InstanceView;

#[derive(Clone, Debug)]
struct Change {
    at: i64,
    version: u64,
    app: Arc<str>,
    id: Arc<str>,
}

/// What the delta lists for one application.
#[derive(Clone, Debug, Default)]
struct AppChanges {
    /// The registry version at which this application's part of the delta last changed.
    version: u64,
    /// Per instance: how many changes of it the log holds, and its last state if the latest of
    /// them removed it (boxed: most changes are not removals, and every entry of the map would
    /// otherwise hold a view's room).
    ids: HashMap<Arc<str>, (u32, Option<Box<InstanceView>>)>,
}

/// Applications whose delta lost instances to one pruning run.
#[derive(Clone, Debug)]
struct Pruned {
    at: i64,
    version: u64,
    apps: Vec<Arc<str>>,
}

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct ChangeLog {
    log: VecDeque<Change>,
    apps: BTreeMap<Arc<str>, AppChanges>,
    /// The highest version among the changes pruning dropped: what changed after an older version
    /// can no longer be told from the log.
    pruned_through: u64,
    pruned: VecDeque<Pruned>,
    /// The highest version among the pruning records dropped in turn.
    pruned_records_through: u64,
}

impl ChangeLog {
    /// Logs a change of `app`/`id` made at registry version `version`; `removed` is the last
    /// state of an instance the change removed.
    pub fn record(&mut self, at: i64, version: u64, app: &Arc<str>, id: &Arc<str>, removed: Option<InstanceView>) {
        // The registry's names are shared; a name the log already holds keeps the log's copy.
        let app_key = match self.apps.get_key_value(&**app) {
            Some((k, _)) => k.clone(),
            None => app.clone(),
        };
        let entry = self.apps.entry(app_key.clone()).or_default();
        entry.version = version;
        let id_key = match entry.ids.get_key_value(&**id) {
            Some((k, _)) => k.clone(),
            None => id.clone(),
        };
        let slot = entry.ids.entry(id_key.clone()).or_insert((0, None));
        slot.0 += 1;
        slot.1 = removed.map(Box::new);
        self.log.push_back(Change {
            at,
            version,
            app: app_key,
            id: id_key,
        });
    }

    /// Drops the changes made before `horizon`; true if there were any. [`ChangeLog::pruned_at`]
    /// must follow with the version the registry moves to.
    pub fn prune(&mut self, horizon: i64) -> Option<Vec<Arc<str>>> {
        let mut touched: Vec<Arc<str>> = Vec::new();
        let mut any = false;
        while self.log.front().is_some_and(|c| c.at < horizon) {
            let Some(c) = self.log.pop_front() else { break };
            any = true;
            self.pruned_through = self.pruned_through.max(c.version);
            let Some(entry) = self.apps.get_mut(&c.app) else {
                continue;
            };
            let gone = match entry.ids.get_mut(&c.id) {
                Some(slot) => {
                    slot.0 = slot.0.saturating_sub(1);
                    slot.0 == 0
                }
                None => false,
            };
            if gone {
                entry.ids.remove(&c.id);
                if touched.last() != Some(&c.app) {
                    touched.push(c.app.clone());
                }
                if entry.ids.is_empty() {
                    self.apps.remove(&c.app);
                }
            }
        }
        if !any {
            return None;
        }
        touched.sort();
        touched.dedup();
        Some(touched)
    }

    /// Records that pruning at `at` moved the registry to `version` and changed the delta of
    /// `apps`; forgets such records older than `horizon`.
    pub fn pruned_at(&mut self, at: i64, horizon: i64, version: u64, apps: Vec<Arc<str>>) {
        for app in &apps {
            if let Some(entry) = self.apps.get_mut(app) {
                entry.version = version;
            }
        }
        self.pruned.push_back(Pruned { at, version, apps });
        while self.pruned.front().is_some_and(|p| p.at < horizon) {
            if let Some(p) = self.pruned.pop_front() {
                self.pruned_records_through = self.pruned_records_through.max(p.version);
            }
        }
    }

    /// The applications changed after `version` (sorted), or `None` if the log no longer tells.
    pub fn apps_changed_since(&self, version: u64) -> Option<Vec<Arc<str>>> {
        if self.pruned_through > version {
            return None;
        }
        let first = self.log.partition_point(|c| c.version <= version);
        let mut seen: HashSet<&Arc<str>> = HashSet::new();
        let mut apps: Vec<Arc<str>> = Vec::new();
        for c in self.log.range(first..) {
            if seen.insert(&c.app) {
                apps.push(c.app.clone());
            }
        }
        apps.sort();
        Some(apps)
    }

    /// The applications whose part of the delta changed after `version` (sorted), or `None` if
    /// the log no longer tells.
    pub fn delta_apps_changed_since(&self, version: u64) -> Option<Vec<Arc<str>>> {
        if self.pruned_records_through > version {
            return None;
        }
        let mut apps = self.apps_changed_since(version)?;
        for p in self.pruned.iter().filter(|p| p.version > version) {
            apps.extend(p.apps.iter().cloned());
        }
        apps.sort();
        apps.dedup();
        Some(apps)
    }

    /// Every application the delta lists, sorted, with the version of its part's last change.
    pub fn delta_app_versions(&self) -> Vec<(Arc<str>, u64)> {
        self.apps.iter().map(|(k, e)| (k.clone(), e.version)).collect()
    }

    /// The version of the last change of `app`'s part of the delta.
    pub fn delta_app_version(&self, app: &str) -> Option<u64> {
        self.apps.get(app).map(|e| e.version)
    }

    /// The instances the delta lists for `app`: id, and the last state of a removed one.
    pub fn delta_entries(&self, app: &str) -> impl Iterator<Item = (&str, Option<&InstanceView>)> {
        self.apps
            .get(app)
            .into_iter()
            .flat_map(|e| e.ids.iter().map(|(id, (_, removed))| (&**id, removed.as_deref())))
    }

    /// The applications the delta lists, sorted.
    pub fn delta_apps(&self) -> impl Iterator<Item = &str> {
        self.apps.keys().map(|k| &**k)
    }

    pub fn len(&self) -> usize {
        self.log.len()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: Option<Vec<Arc<str>>>) -> Option<Vec<String>> {
        v.map(|v| v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn tells_what_changed_since_a_version_until_pruning_forgets_it() {
        let mut log = ChangeLog::default();
        log.record(1_000, 2, &"A".into(), &"a-1".into(), None);
        log.record(2_000, 3, &"B".into(), &"b-1".into(), None);
        log.record(3_000, 4, &"A".into(), &"a-2".into(), None);
        assert_eq!(names(log.apps_changed_since(1)), Some(vec!["A".into(), "B".into()]));
        assert_eq!(names(log.apps_changed_since(3)), Some(vec!["A".into()]));
        assert_eq!(names(log.apps_changed_since(4)), Some(vec![]));
        assert_eq!(log.delta_app_version("A"), Some(4));

        // Pruning the first change: a-1 leaves A's delta (version 5), older versions are unknown.
        let touched = log.prune(1_500).unwrap();
        assert_eq!(touched.len(), 1);
        log.pruned_at(1_500, 0, 5, touched);
        assert_eq!(log.delta_app_version("A"), Some(5));
        assert_eq!(names(log.apps_changed_since(1)), None);
        assert_eq!(names(log.apps_changed_since(2)), Some(vec!["A".into(), "B".into()]));
        assert_eq!(names(log.delta_apps_changed_since(4)), Some(vec!["A".into()]));
        assert_eq!(names(log.delta_apps_changed_since(5)), Some(vec![]));
        assert!(log.prune(1_500).is_none(), "nothing left to prune");

        // A pruning record older than the horizon is forgotten, and with it what it told.
        log.record(9_000, 6, &"C".into(), &"c-1".into(), None);
        let touched = log.prune(2_500).unwrap();
        log.pruned_at(9_000, 5_000, 7, touched);
        assert_eq!(names(log.delta_apps_changed_since(4)), None);
        assert_eq!(
            names(log.delta_apps_changed_since(5)),
            Some(vec!["B".into(), "C".into()])
        );
    }

    #[test]
    fn an_instance_stays_in_the_delta_while_any_of_its_changes_is_logged() {
        let mut log = ChangeLog::default();
        log.record(1_000, 2, &"A".into(), &"a-1".into(), None);
        log.record(2_000, 3, &"A".into(), &"a-1".into(), None);
        let touched = log.prune(1_500).unwrap();
        assert!(touched.is_empty(), "a-1 still has a change in the window");
        log.pruned_at(1_500, 0, 4, touched);
        assert_eq!(log.delta_app_version("A"), Some(3));
        assert_eq!(log.delta_entries("A").count(), 1);
        let touched = log.prune(2_500).unwrap();
        log.pruned_at(2_500, 0, 5, touched);
        assert_eq!(log.delta_entries("A").count(), 0);
        assert!(log.delta_apps().next().is_none());
        assert!(log.is_empty());
    }
}
