//! Reads: the views fetches are encoded from (full, delta, one application, VIPs, one
//! instance), what the controller reads back (pod instances, pending overrides), and the figures
//! of the dashboard and the metrics, which come from counts the store keeps, not from a scan.

use std::sync::Arc;

use super::{
    PodOverride, PodOwner, Recent, Registry, Stats,
    instance::{ActionType, InstanceInfo},
    store::{Entry, Holding, RestOverride},
    view::{AppView, AppsView, InstanceView, Origin, StatusCounts},
};

impl Registry {
    /// The whole registry (`GET apps`), including expired leases not yet evicted, as Java.
    pub fn full_view(&self) -> AppsView {
        let mut apps: Vec<AppView> = self
            .store
            .apps()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(name, entries)| AppView {
                name: name.to_string(),
                instances: self.views(entries.values()),
            })
            .collect();
        apps.sort_by(|a, b| a.name.cmp(&b.name));
        AppsView {
            versions_delta: 1,
            apps_hashcode: self.store.counts().hashcode(),
            apps,
        }
    }

    /// The applications with instances, sorted, with the version of each one's last change:
    /// what a per-application cache needs to know which of its encodings are still current.
    pub fn app_versions(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .store
            .apps()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(name, _)| (name.to_string(), self.store.app_version(name).unwrap_or(0)))
            .collect();
        v.sort();
        v
    }

    /// `apps__hashcode` of the whole registry.
    pub fn apps_hashcode(&self) -> String {
        self.store.counts().hashcode()
    }

    /// The recent changes (`GET apps/delta`), each with the instance's current state, and the hash
    /// code of the full registry at the same moment.
    pub fn delta_view(&self) -> AppsView {
        let apps: Vec<AppView> = self
            .store
            .changes()
            .delta_apps()
            .filter_map(|app| self.delta_group(app))
            .collect();
        AppsView {
            versions_delta: self.store.version() as i64,
            apps_hashcode: self.store.counts().hashcode(),
            apps,
        }
    }

    /// One application's part of the delta (`None` if it has none), with the version of its
    /// last change: what a per-application cache of the delta needs.
    pub fn delta_app_view(&self, app: &str) -> Option<(AppView, u64)> {
        let version = self.store.changes().delta_app_version(app)?;
        self.delta_group(app).map(|view| (view, version))
    }

    /// The applications the delta lists, sorted, with the version of each one's part.
    pub fn delta_app_versions(&self) -> Vec<(Arc<str>, u64)> {
        self.store.changes().delta_app_versions()
    }

    /// The applications changed after registry version `version` (sorted), or `None` if the
    /// change log no longer reaches back that far.
    pub fn apps_changed_since(&self, version: u64) -> Option<Vec<Arc<str>>> {
        self.store.changes().apps_changed_since(version)
    }

    /// The applications whose part of the delta changed after `version` (sorted), or `None`.
    pub fn delta_apps_changed_since(&self, version: u64) -> Option<Vec<Arc<str>>> {
        self.store.changes().delta_apps_changed_since(version)
    }

    /// The registry version of `app`'s last change, if it has instances.
    pub fn app_version(&self, app: &str) -> Option<u64> {
        self.store.app_version(app)
    }

    /// The delta's entries for `app`: each changed instance in its current state, or its last
    /// state if it was removed.
    fn delta_group(&self, app: &str) -> Option<AppView> {
        let mut instances: Vec<InstanceView> = self
            .store
            .changes()
            .delta_entries(app)
            .filter_map(|(id, removed)| match removed {
                Some(removed) => Some(removed.clone()),
                None => self.store.view_of(app, id),
            })
            .collect();
        if instances.is_empty() {
            return None;
        }
        // Removed instances last: Netflix's client (1.x and 2.x, `updateDelta`) adopts the
        // delta's whole application object at its first ADDED or MODIFIED entry when the
        // application is new to it, and skips DELETED entries seen before that, so a
        // removed instance listed first would stay in its copy and break the hash code.
        instances.sort_by(|a, b| {
            let removed = |i: &InstanceView| i.action_type() == Some(ActionType::Deleted);
            (removed(a), a.id()).cmp(&(removed(b), b.id()))
        });
        Some(AppView {
            name: app.to_string(),
            instances,
        })
    }

    /// One application (`GET apps/{app}`); `None` when it has no instances.
    pub fn app_view(&self, app: &str) -> Option<AppView> {
        let entries = self.store.app(app)?;
        Some(AppView {
            name: app.to_string(),
            instances: self.views(entries.values()),
        })
    }

    /// Instances with `vip` among their (secure) VIP addresses (`GET vips/{vip}`, `svips/{vip}`),
    /// under one lock: the tests' reference for the batched form the server answers with
    /// (`AppState`'s, built from [`Registry::vip_app_view`]).
    #[cfg(test)]
    pub fn vip_view(&self, vip: &str, secure: bool) -> AppsView {
        let apps = self
            .app_versions()
            .iter()
            .filter_map(|(name, _)| self.vip_app_view(name, vip, secure))
            .collect();
        AppsView::of_vip(apps)
    }

    /// `app`'s instances with `vip` among their (secure) VIP addresses, if it has any.
    pub fn vip_app_view(&self, app: &str, vip: &str, secure: bool) -> Option<AppView> {
        let entries = self.store.app(app)?;
        let instances = self.views(entries.values().filter(|e| e.info.has_vip(vip, secure)));
        (!instances.is_empty()).then(|| AppView {
            name: app.to_string(),
            instances,
        })
    }

    /// `GET apps/{app}/{id}`: hidden once expired while expiration is enabled.
    pub fn instance(&mut self, app: &str, id: &str, now: i64) -> Option<InstanceView> {
        if !self.visible(app, id, now) {
            return None;
        }
        self.store.view_of(app, id)
    }

    /// `GET instances/{id}`: the first application holding `id`.
    pub fn find_instance(&mut self, id: &str, now: i64) -> Option<InstanceView> {
        let mut names: Vec<String> = self
            .store
            .apps()
            .filter(|(_, e)| e.contains_key(id))
            .map(|(n, _)| n.to_string())
            .collect();
        names.sort();
        names.into_iter().find_map(|app| self.instance(&app, id, now))
    }

    /// Pod instances, for the controller to diff against what it wants.
    pub fn pod_instances(&self) -> Vec<(PodOwner, InstanceView)> {
        self.store
            .entries()
            .filter_map(|e| match &e.holding {
                Holding::Pod { owner, .. } => Some((owner.clone(), self.store.view(e))),
                _ => None,
            })
            .collect()
    }

    /// The REST overrides on pod instances that their pods' annotations do not show yet (for
    /// the leader to record on the pods).
    pub fn pending_pod_overrides(&self) -> Vec<PodOverride> {
        self.store
            .entries()
            .filter_map(|e| match &e.holding {
                Holding::Pod {
                    owner, rest: Some(r), ..
                } => Some(PodOverride {
                    owner: owner.clone(),
                    status: match r {
                        RestOverride::Set(s) => Some(*s),
                        RestOverride::Deleted => None,
                    },
                }),
                _ => None,
            })
            .collect()
    }

    /// The stored description of `app`/`id` (expired or not), shared.
    pub fn stored(&self, app: &str, id: &str) -> Option<Arc<InstanceInfo>> {
        self.store.get(app, id).map(|e| e.info.clone())
    }

    /// Whether a lease exists for `app`/`id` (expired or not).
    pub fn contains(&self, app: &str, id: &str) -> bool {
        self.store.get(app, id).is_some()
    }

    /// The pod instances of one EurekaApp.
    pub fn pod_instances_of(&self, namespace: &str, eureka_app: &str) -> Vec<(PodOwner, InstanceView)> {
        self.store
            .owned_by(namespace, eureka_app)
            .filter_map(|e| match &e.holding {
                Holding::Pod { owner, .. } if owner.namespace == namespace && owner.eureka_app == eureka_app => {
                    Some((owner.clone(), self.store.view(e)))
                }
                _ => None,
            })
            .collect()
    }

    /// Until when fetches are refused after an empty start, if they are.
    pub fn reads_refused_until(&self) -> Option<i64> {
        self.preservation.reads_refused_until()
    }

    pub fn stats(&mut self, now: i64) -> Stats {
        let lease_expiration_enabled = self.preservation.lease_expiration_enabled(now);
        Stats {
            renews_last_min: self.preservation.renews_last_min(now),
            renews_threshold: self.preservation.threshold,
            expected_clients: self.preservation.expected_clients,
            self_preservation_enabled: self.config.preservation.enable_self_preservation,
            lease_expiration_enabled,
            below_renew_threshold: self.preservation.below_renew_threshold(now),
            self_preservation_active: self.preservation.active(now),
            allow_access: self.preservation.allow_access(now),
            startup_time: self.preservation.startup_time,
            instances: self.store.counts().total(),
            expired: self.store.expired_count(now),
            by_origin: Origin::ALL.map(|k| (k, self.store.held(k))),
            by_status: *self.store.counts(),
            applications: self.store.application_count(),
            version: self.store.version(),
            totals: self.totals,
        }
    }

    /// The last registrations and cancellations, newest first, as `(time, "APP(id)")`.
    pub fn recent(&self) -> (Recent, Recent) {
        (
            self.recent_registered.iter().rev().cloned().collect(),
            self.recent_cancelled.iter().rev().cloned().collect(),
        )
    }

    // === internals ===

    fn views<'a>(&self, entries: impl Iterator<Item = &'a Entry>) -> Vec<InstanceView> {
        let mut v: Vec<InstanceView> = entries.map(|e| self.store.view(e)).collect();
        v.sort_by(|a, b| a.id().cmp(b.id()));
        v
    }
}

impl AppsView {
    /// A VIP document of `apps` (in name order): `versions__delta` -1 and the hash code of the
    /// instances it lists.
    pub fn of_vip(apps: Vec<AppView>) -> AppsView {
        let hash = StatusCounts::of(apps.iter().flat_map(|a| &a.instances)).hashcode();
        AppsView {
            versions_delta: -1,
            apps_hashcode: hash,
            apps,
        }
    }
}
