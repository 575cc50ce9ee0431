//! What links with `visibility: OnRequest` offer to the fetches that name them (Netflix's
//! `?regions=` on `GET apps` and `GET apps/delta`), and the views of those fetches.
//!
//! Per on-request link the registry keeps its offer: the link's copy less the ids the main view
//! holds (a local instance or an import shown there wins), less what a withdrawal hides by the
//! link's policy, each with a lease view fixed when it was first offered, and a change log of the
//! offer. A regions view is the main view plus, for each named link in name order, the offered
//! instances whose ids no earlier link offered. Its delta lists every instance that the main
//! log or a named link's log mentions, each in its state in that view now (the main view's, else
//! the first offer's, else deleted with its last state), so that a change in one layer that
//! hides or uncovers another's entry reaches the client as a change of the view, and the full
//! fetch, the delta and the hash code always agree. Nothing here is cached: a Spring client
//! that sets `fetch-remote-regions-registry` asks once per refresh, and the view costs the size
//! of the registry, as a full fetch without the cache would.

use super::*;
use crate::registry::{changes::ChangeLog, view::LeaseView};

/// One on-request link's offer: application → instance id → the instance as offered.
#[derive(Clone, Debug, Default)]
pub(super) struct Offer {
    apps: HashMap<String, BTreeMap<String, InstanceView>>,
    log: ChangeLog,
}

impl Offer {
    /// Whether `app`/`id` is on offer.
    pub(super) fn holds(&self, app: &str, id: &str) -> bool {
        self.apps.get(app).is_some_and(|a| a.contains_key(id))
    }

    fn get(&self, app: &str, id: &str) -> Option<&InstanceView> {
        self.apps.get(app).and_then(|a| a.get(id))
    }
}

/// An import as offered: its lease view starts when it is first offered.
fn offered(info: &Arc<InstanceInfo>, before: Option<&InstanceView>, now: i64) -> InstanceView {
    let terms = info.lease.normalised();
    let registered = before.map_or(now, |b| b.lease.registration_ts);
    let up_since = before.map_or(0, |b| b.lease.service_up_ts);
    InstanceView {
        info: info.clone(),
        lease: LeaseView {
            renewal_interval_secs: terms.renewal_interval_secs,
            duration_secs: terms.duration_secs,
            registration_ts: registered,
            last_renewal_ts: now,
            eviction_ts: 0,
            service_up_ts: match (info.status, up_since) {
                (Status::Up, 0) => now,
                (_, t) => t,
            },
        },
        origin: Origin::Imported,
    }
}

/// The last state of an instance withdrawn from an offer, as the delta lists it.
fn withdrawn(view: &InstanceView, now: i64) -> InstanceView {
    let mut view = view.clone();
    let info = Arc::make_mut(&mut view.info);
    info.action_type = Some(ActionType::Deleted);
    info.last_updated_timestamp = now;
    view.lease.eviction_ts = now;
    view
}

impl Registry {
    /// Makes what each on-request link offers of `app` what its copy, its rule and the main view
    /// say, logging every change of an offer.
    pub(super) fn settle_offers(&mut self, app: &str, now: i64) {
        let involved = |l: &LinkCopy| l.rule.offers() != Shows::Never || l.offer.apps.contains_key(app);
        if !self.imports.links.values().any(involved) {
            return;
        }
        let store = &self.store;
        let other_up = store
            .app(app)
            .is_some_and(|entries| entries.values().any(|e| e.info.status == Status::Up));
        let version = store.version();
        let app_key: Arc<str> = Arc::from(app);
        for l in self.imports.links.values_mut().filter(|l| involved(l)) {
            let shown = match l.rule.offers() {
                Shows::Always => true,
                Shows::WhileNoOtherUp => !other_up,
                Shows::Never => false,
            };
            let wanted: Vec<(&String, &Arc<InstanceInfo>)> = match (shown, l.apps.get(app)) {
                (true, Some(copy)) => copy.iter().filter(|(id, _)| store.get(app, id).is_none()).collect(),
                _ => Vec::new(),
            };
            let before = l.offer.apps.remove(app).unwrap_or_default();
            let mut after: BTreeMap<String, InstanceView> = BTreeMap::new();
            for (id, info) in wanted {
                let old = before.get(id);
                if let Some(old) = old.filter(|old| Arc::ptr_eq(&old.info, info)) {
                    after.insert(id.clone(), old.clone());
                    continue;
                }
                l.offer
                    .log
                    .record(now, version, &app_key, &Arc::from(id.as_str()), None);
                after.insert(id.clone(), offered(info, old, now));
            }
            for (id, view) in &before {
                if !after.contains_key(id) && !crate::mutants::on("offer-forgets-removals") {
                    let gone = withdrawn(view, now);
                    l.offer
                        .log
                        .record(now, version, &app_key, &Arc::from(id.as_str()), Some(gone));
                }
            }
            if !after.is_empty() {
                l.offer.apps.insert(app.to_string(), after);
            }
        }
    }

    /// Drops the offers' log entries older than `horizon` (with the main log's, in a purge).
    pub(in crate::registry) fn prune_offers(&mut self, now: i64, horizon: i64) {
        let version = self.store.version();
        for l in self.imports.links.values_mut() {
            if let Some(touched) = l.offer.log.prune(horizon) {
                l.offer.log.pruned_at(now, horizon, version, touched);
            }
        }
    }

    // === reads ===

    /// The on-request links among the `?regions=` names (any case; unknown names and links shown
    /// in the main view add nothing, as Java ignores regions it does not know), in name order.
    pub fn offering_links(&self, names: &[&str]) -> Vec<Arc<str>> {
        self.imports
            .links
            .iter()
            .filter(|(name, l)| {
                l.rule.visibility == Visibility::OnRequest && names.iter().any(|n| n.eq_ignore_ascii_case(name))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// `GET apps?regions=`: the main view with what the named links offer.
    pub fn regions_full_view(&self, links: &[Arc<str>]) -> AppsView {
        let mut view = self.full_view();
        let added = self.offered_in_view(links);
        let mut counts = *self.store.counts();
        for view in added.values().flatten() {
            counts.add(view.status());
        }
        let mut apps: BTreeMap<String, AppView> = view.apps.drain(..).map(|a| (a.name.clone(), a)).collect();
        for (app, instances) in added {
            let entry = apps.entry(app.clone()).or_insert_with(|| AppView {
                name: app,
                instances: Vec::new(),
            });
            entry.instances.extend(instances);
            entry.instances.sort_by(|a, b| a.id().cmp(b.id()));
        }
        view.apps = apps.into_values().collect();
        view.apps_hashcode = counts.hashcode();
        view
    }

    /// `GET apps/delta?regions=`: every instance the main log or a named link's log lists, in
    /// its state in the regions view now.
    pub fn regions_delta_view(&self, links: &[Arc<str>]) -> AppsView {
        let offers: Vec<&Offer> = links
            .iter()
            .filter_map(|n| self.imports.links.get(n))
            .map(|l| &l.offer)
            .collect();
        let main = self.store.changes();
        let mut apps: BTreeSet<&str> = main.delta_apps().collect();
        for o in &offers {
            apps.extend(o.log.delta_apps());
        }
        let mut out: Vec<AppView> = Vec::new();
        for app in apps {
            // Per id the last state of a removal, the main log's first.
            let mut entries: BTreeMap<&str, Option<&InstanceView>> = BTreeMap::new();
            for log in std::iter::once(main).chain(offers.iter().map(|o| &o.log)) {
                for (id, removed) in log.delta_entries(app) {
                    let slot = entries.entry(id).or_insert(None);
                    if slot.is_none() {
                        *slot = removed;
                    }
                }
            }
            let mut instances: Vec<InstanceView> = entries
                .into_iter()
                .filter_map(|(id, removed)| {
                    self.store
                        .view_of(app, id)
                        .or_else(|| offers.iter().find_map(|o| o.get(app, id).cloned()))
                        .or_else(|| removed.cloned())
                })
                .collect();
            if instances.is_empty() {
                continue;
            }
            // Removed instances last, as in the main delta (see `Registry::delta_view`).
            instances.sort_by(|a, b| {
                let removed = |i: &InstanceView| i.action_type() == Some(ActionType::Deleted);
                (removed(a), a.id()).cmp(&(removed(b), b.id()))
            });
            out.push(AppView {
                name: app.to_string(),
                instances,
            });
        }
        AppsView {
            versions_delta: self.store.version() as i64,
            apps_hashcode: self.regions_counts(links).hashcode(),
            apps: out,
        }
    }

    /// What the named links add to the main view: per application, the offered instances whose
    /// ids no earlier link offered (the main view's ids are never on offer).
    fn offered_in_view(&self, links: &[Arc<str>]) -> BTreeMap<String, Vec<InstanceView>> {
        let mut added: BTreeMap<String, Vec<InstanceView>> = BTreeMap::new();
        self.each_offered(links, |app, view| {
            added.entry(app.to_string()).or_default().push(view.clone())
        });
        added
    }

    /// The counts by status of the regions view of `links`.
    fn regions_counts(&self, links: &[Arc<str>]) -> StatusCounts {
        let mut counts = *self.store.counts();
        self.each_offered(links, |_, view| counts.add(view.status()));
        counts
    }

    /// Calls `f` with each instance the named links add to the main view (see
    /// [`Registry::offered_in_view`]).
    fn each_offered(&self, links: &[Arc<str>], mut f: impl FnMut(&str, &InstanceView)) {
        let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
        for l in links.iter().filter_map(|n| self.imports.links.get(n)) {
            for (app, instances) in &l.offer.apps {
                for (id, view) in instances {
                    if seen.insert((app, id)) {
                        f(app, view);
                    }
                }
            }
        }
    }
}
