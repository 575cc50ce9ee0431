//! Instances imported from other clusters over links: each link's copy of what the other side
//! exports, and which entries of those copies the registry shows.
//!
//! An imported instance is its own origin ([`Origin::Imported`]): it never expires, is never
//! evicted, counts neither toward self-preservation nor toward adoption, and nothing written
//! about it is replicated (an import produces no replication record, so no peer, replica or
//! Java, ever hears of it). Imports are in the delta change log and the hash code like any
//! instance, so a client's full and delta fetches agree. A local instance (native, replicated,
//! pod or adopted) with the same application and id wins: the import is hidden, counted, and
//! shown again when the local one goes. Which link's entry is shown is decided per application
//! by [`LinkRule`]: always, only while no other source has an UP instance of the application
//! (failover, or a link withdrawn after a partition), or never. A link shown only on request
//! (Netflix's `?regions=`) is kept out of the main view; what it offers is kept by the `offers` module.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use super::{
    Outcome, Registry, Reply,
    instance::{ActionType, InstanceInfo, Status},
    lease::Lease,
    store::{Entry, Holding},
    view::{AppView, AppsView, InstanceView, Origin, StatusCounts},
};

/// How a link's instances appear to this registry's clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Visibility {
    /// In the same applications and VIPs as local instances (the default).
    #[default]
    Merged,
    /// Only while no other source has an UP instance of the application.
    Fallback,
    /// Never in the main view: only for fetches that name the link in `?regions=`.
    OnRequest,
}

/// What happens to a link's instances once it has not answered for its withdraw time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnWithdraw {
    /// Withdrawn from applications that have an UP instance from another source; applications
    /// only the link serves keep its last copy.
    #[default]
    UnlessOnlySource,
    /// Withdrawn everywhere.
    Always,
    /// Kept everywhere (the last copy stays until the link answers again).
    Never,
}

/// Whether a link's instances are shown now: its visibility and its partition state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkRule {
    pub visibility: Visibility,
    pub on_withdraw: OnWithdraw,
    /// The link has not answered for its withdraw time.
    pub withdrawn: bool,
}

/// When a rule shows a link's entries of an application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shows {
    Always,
    WhileNoOtherUp,
    Never,
}

impl LinkRule {
    fn shows(self) -> Shows {
        let base = match self.visibility {
            Visibility::Merged => Shows::Always,
            Visibility::Fallback => Shows::WhileNoOtherUp,
            Visibility::OnRequest => Shows::Never,
        };
        if !self.withdrawn {
            return base;
        }
        match (self.on_withdraw, base) {
            (OnWithdraw::Never, _) | (_, Shows::Never) => base,
            (OnWithdraw::Always, _) => Shows::Never,
            (OnWithdraw::UnlessOnlySource, _) => Shows::WhileNoOtherUp,
        }
    }

    /// When an on-request link's entries show in the fetches that name it: always, until a
    /// withdrawal applies its policy as it does in the main view.
    fn offers(self) -> Shows {
        if self.visibility != Visibility::OnRequest {
            return Shows::Never;
        }
        match (self.withdrawn, self.on_withdraw) {
            (false, _) | (true, OnWithdraw::Never) => Shows::Always,
            (true, OnWithdraw::Always) => Shows::Never,
            (true, OnWithdraw::UnlessOnlySource) => Shows::WhileNoOtherUp,
        }
    }
}

/// What one fetch over a link brought.
#[derive(Clone, Debug, Default)]
pub struct ImportBatch {
    /// The whole export (a full fetch): applications not listed are gone. Otherwise only the
    /// listed applications changed.
    pub full: bool,
    /// Applications with every instance the source exports of each now (empty: none left).
    pub apps: Vec<(String, Vec<InstanceInfo>)>,
}

/// The figures of one link's copy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkFigures {
    /// Instances in the copy.
    pub instances: u64,
    /// Of those, how many the registry shows.
    pub shown: u64,
    /// Of those, how many a local instance with the same id hides.
    pub hidden_by_local: u64,
    /// The reconcile hash code of the copy, to compare with the source's.
    pub hashcode: String,
}

/// One link's copy of the source's export.
#[derive(Clone, Debug, Default)]
struct LinkCopy {
    rule: LinkRule,
    /// Application → instance id → the instance as the source shows it.
    apps: HashMap<String, BTreeMap<String, Arc<InstanceInfo>>>,
    counts: StatusCounts,
    /// What the link offers to fetches that name it (empty unless it is on request).
    offer: offers::Offer,
}

impl LinkCopy {
    fn get(&self, app: &str, id: &str) -> Option<&Arc<InstanceInfo>> {
        self.apps.get(app).and_then(|a| a.get(id))
    }

    /// Replaces one application's part; returns whether anything changed.
    fn set_app(&mut self, app: &str, instances: BTreeMap<String, Arc<InstanceInfo>>) -> bool {
        let old = if instances.is_empty() {
            self.apps.remove(app)
        } else {
            self.apps.insert(app.to_string(), instances)
        };
        if let Some(old) = &old {
            for i in old.values() {
                self.counts.remove(i.status);
            }
        }
        let new = self.apps.get(app);
        if let Some(new) = new {
            for i in new.values() {
                self.counts.add(i.status);
            }
        }
        match (old, new) {
            (None, None) => false,
            (Some(old), Some(new)) => old != *new,
            _ => true,
        }
    }

    fn up_in(&self, app: &str) -> bool {
        self.apps
            .get(app)
            .is_some_and(|a| a.values().any(|i| i.status == Status::Up))
    }
}

/// Every link's copy (see the module docs).
#[derive(Clone, Debug, Default)]
pub(super) struct Imports {
    links: BTreeMap<Arc<str>, LinkCopy>,
}

impl Imports {
    /// Whether no link is known (the registry then skips every import check).
    pub(super) fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Whether any link holds instances of `app`.
    pub(super) fn holds_app(&self, app: &str) -> bool {
        self.links.values().any(|l| l.apps.contains_key(app))
    }

    /// The links' instance ids of `app`.
    fn ids_of(&self, app: &str) -> BTreeSet<String> {
        self.links
            .values()
            .filter_map(|l| l.apps.get(app))
            .flat_map(|a| a.keys().cloned())
            .collect()
    }

    fn rule(&self, link: &str) -> Option<LinkRule> {
        self.links.get(link).map(|l| l.rule)
    }
}

/// An import as stored: the source's description, marked as added (clients take ADDED and
/// MODIFIED alike, so one shared copy serves every state of a shown import).
fn normalised(mut info: InstanceInfo) -> InstanceInfo {
    info.action_type = Some(ActionType::Added);
    info.shrink_to_fit();
    info
}

impl Registry {
    /// Applies what a fetch over `link` brought: the copy is updated, and what the registry shows
    /// of the applications involved is settled. Replicates nothing.
    pub(super) fn import(&mut self, link: &str, batch: ImportBatch, now: i64) -> Outcome {
        let key: Arc<str> = match self.imports.links.get_key_value(link) {
            Some((k, _)) => k.clone(),
            None => Arc::from(link),
        };
        let copy = self.imports.links.entry(key).or_default();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        let listed: BTreeSet<String> = batch.apps.iter().map(|(a, _)| a.to_ascii_uppercase()).collect();
        if batch.full {
            let gone: Vec<String> = copy.apps.keys().filter(|a| !listed.contains(*a)).cloned().collect();
            for app in gone {
                copy.set_app(&app, BTreeMap::new());
                touched.insert(app);
            }
        }
        let mut grouped: BTreeMap<String, BTreeMap<String, Arc<InstanceInfo>>> =
            listed.into_iter().map(|a| (a, BTreeMap::new())).collect();
        for (app, instances) in batch.apps {
            let app = app.to_ascii_uppercase();
            for info in instances {
                if info.app != app {
                    continue;
                }
                let group = grouped.entry(app.clone()).or_default();
                // An unchanged description keeps the copy the registry already shares.
                let id = info.id().to_string();
                let info = normalised(info);
                let kept = copy.get(&app, &id).filter(|old| ***old == info).cloned();
                group.insert(id, kept.unwrap_or_else(|| Arc::new(info)));
            }
        }
        for (app, instances) in grouped {
            if copy.set_app(&app, instances) {
                touched.insert(app);
            }
        }
        for app in touched {
            self.settle_imports(&app, now);
        }
        Outcome::reply(Reply::Ok)
    }

    /// Sets how `link`'s instances are shown (its visibility, or its partition state).
    pub(super) fn set_link_rule(&mut self, link: &str, rule: LinkRule, now: i64) -> Outcome {
        let key: Arc<str> = match self.imports.links.get_key_value(link) {
            Some((k, _)) => k.clone(),
            None => Arc::from(link),
        };
        let copy = self.imports.links.entry(key).or_default();
        if copy.rule == rule {
            return Outcome::reply(Reply::Unchanged);
        }
        copy.rule = rule;
        let apps: Vec<String> = copy.apps.keys().cloned().collect();
        for app in apps {
            self.settle_imports(&app, now);
        }
        Outcome::reply(Reply::Ok)
    }

    /// Forgets a link and everything imported through it (the link left the configuration).
    pub(super) fn drop_link(&mut self, link: &str, now: i64) -> Outcome {
        let Some(copy) = self.imports.links.remove(link) else {
            return Outcome::reply(Reply::NotFound);
        };
        for app in copy.apps.keys() {
            self.settle_imports(app, now);
        }
        Outcome::reply(Reply::Ok)
    }

    /// Makes what the registry shows of `app`'s imports, in the main view and in what on-request
    /// links offer, what the copies and rules say.
    pub(super) fn settle_imports(&mut self, app: &str, now: i64) {
        self.settle_shown(app, now);
        self.settle_offers(app, now);
    }

    /// The main view of `app`'s imports: each id without a local instance shows the first link
    /// (by name) whose rule shows it now.
    fn settle_shown(&mut self, app: &str, now: i64) {
        let mut ids = self.imports.ids_of(app);
        if let Some(entries) = self.store.app(app) {
            ids.extend(
                entries
                    .iter()
                    .filter(|(_, e)| matches!(e.holding, Holding::Imported { .. }))
                    .map(|(id, _)| id.to_string()),
            );
        }
        if ids.is_empty() {
            return;
        }
        // Another source has an UP instance: a local one, or a link shown always.
        let local_up = self.store.app(app).is_some_and(|entries| {
            entries
                .values()
                .any(|e| e.info.status == Status::Up && !matches!(e.holding, Holding::Imported { .. }))
        });
        let other_up = local_up
            || self
                .imports
                .links
                .values()
                .any(|l| l.rule.shows() == Shows::Always && l.up_in(app));
        for id in ids {
            let current = self.store.get(app, &id).map(|e| match &e.holding {
                Holding::Imported { link } => Some((link.clone(), e.info.clone())),
                _ => None,
            });
            let Some(current) = current.clone().map_or(Some(None), |c| c.map(Some)) else {
                // A local instance holds the id: the imports stay hidden.
                continue;
            };
            let wanted = self.imports.links.iter().find_map(|(name, l)| {
                let shown = match l.rule.shows() {
                    Shows::Always => true,
                    Shows::WhileNoOtherUp => !other_up,
                    Shows::Never => false,
                };
                if shown {
                    l.get(app, &id).map(|info| (name.clone(), info.clone()))
                } else {
                    None
                }
            });
            match (current, wanted) {
                (None, None) => {}
                (Some(_), None) => {
                    self.store.remove(app, &id, now);
                }
                (Some((link, info)), Some((want_link, want))) if link == want_link && Arc::ptr_eq(&info, &want) => {}
                (_, Some((link, info))) => self.show_import(link, info, now),
            }
        }
    }

    fn show_import(&mut self, link: Arc<str>, info: Arc<InstanceInfo>, now: i64) {
        let terms = info.lease.normalised();
        let mut lease = Lease::new(now, terms.duration_secs);
        if info.status == Status::Up {
            lease.service_up(now);
        }
        self.store
            .put(Entry::new(info, lease, Holding::Imported { link }, false), now);
    }

    /// Settles every application of every link: after writes whose applications are not known
    /// (adoption claims), so failover and withdrawal never lag long.
    pub(super) fn settle_all_imports(&mut self, now: i64) {
        let apps: BTreeSet<String> = self
            .imports
            .links
            .values()
            .filter(|l| l.rule.shows() == Shows::WhileNoOtherUp || l.rule.offers() == Shows::WhileNoOtherUp)
            .flat_map(|l| l.apps.keys().cloned())
            .collect();
        for app in apps {
            self.settle_imports(&app, now);
        }
    }

    /// The link an instance is imported through, if it is an import the registry shows.
    pub(super) fn imported_through(&self, app: &str, id: &str) -> Option<Arc<str>> {
        match self.store.get(app, id).map(|e| &e.holding) {
            Some(Holding::Imported { link }) => Some(link.clone()),
            _ => None,
        }
    }

    // === reads ===

    /// The figures of each link's copy, by link name.
    pub fn link_figures(&self) -> BTreeMap<String, LinkFigures> {
        self.imports
            .links
            .iter()
            .map(|(name, l)| (name.to_string(), self.figures_of(name, l)))
            .collect()
    }

    /// The figures of one link's copy (the default for an unknown link); costs its size.
    pub fn link_figures_of(&self, link: &str) -> LinkFigures {
        match self.imports.links.get_key_value(link) {
            Some((name, l)) => self.figures_of(name, l),
            None => LinkFigures::default(),
        }
    }

    fn figures_of(&self, name: &Arc<str>, l: &LinkCopy) -> LinkFigures {
        let mut f = LinkFigures {
            hashcode: l.counts.hashcode(),
            ..LinkFigures::default()
        };
        for (app, instances) in &l.apps {
            for id in instances.keys() {
                f.instances += 1;
                if l.offer.holds(app, id) {
                    f.shown += 1;
                    continue;
                }
                match self.store.get(app, id).map(|e| &e.holding) {
                    Some(Holding::Imported { link }) if link == name => f.shown += 1,
                    Some(Holding::Imported { .. }) | None => {}
                    Some(_) => f.hidden_by_local += 1,
                }
            }
        }
        f
    }

    /// The reconcile hash code of one link's copy (empty for an unknown link).
    pub fn link_hashcode(&self, link: &str) -> String {
        self.imports
            .links
            .get(link)
            .map(|l| l.counts.hashcode())
            .unwrap_or_default()
    }

    /// The rule a link is shown by now.
    pub fn link_rule(&self, link: &str) -> Option<LinkRule> {
        self.imports.rule(link)
    }

    /// What this registry exports over links: every instance except imports, of the
    /// applications `exported` accepts, with the hash code of exactly that.
    pub fn export_view(&self, exported: &dyn Fn(&str) -> bool) -> AppsView {
        let mut apps: Vec<AppView> = self
            .store
            .apps()
            .filter(|(name, _)| exported(name))
            .filter_map(|(name, entries)| self.export_app(name, entries))
            .collect();
        apps.sort_by(|a, b| a.name.cmp(&b.name));
        let hash = StatusCounts::of(apps.iter().flat_map(|a| &a.instances)).hashcode();
        AppsView {
            versions_delta: self.store.version() as i64,
            apps_hashcode: hash,
            apps,
        }
    }

    /// The exported applications that changed after `version`, each with all it exports now (an
    /// empty application: none left), and the hash code of the whole export; `None` when the
    /// change log no longer reaches back to `version` (the caller then sends everything).
    pub fn export_changes_since(&self, version: u64, exported: &dyn Fn(&str) -> bool) -> Option<AppsView> {
        let changed = self.store.changes().apps_changed_since(version)?;
        let apps: Vec<AppView> = changed
            .iter()
            .filter(|app| exported(app))
            .map(|app| match self.store.app(app) {
                Some(entries) => self.export_app(app, entries).unwrap_or_else(|| AppView {
                    name: app.to_string(),
                    instances: Vec::new(),
                }),
                None => AppView {
                    name: app.to_string(),
                    instances: Vec::new(),
                },
            })
            .collect();
        Some(AppsView {
            versions_delta: self.store.version() as i64,
            apps_hashcode: self.export_counts(exported).hashcode(),
            apps,
        })
    }

    /// The counts by status of the export: all but the imports, less the applications not
    /// exported (costs the number of applications and the size of those not exported).
    fn export_counts(&self, exported: &dyn Fn(&str) -> bool) -> StatusCounts {
        let mut counts = self.store.counts().less(self.store.imported_counts());
        for (_, entries) in self.store.apps().filter(|(name, _)| !exported(name)) {
            for e in entries.values().filter(|e| e.holding.kind() != Origin::Imported) {
                counts.remove(e.info.status);
            }
        }
        counts
    }

    fn export_app(&self, name: &str, entries: &HashMap<Arc<str>, Entry>) -> Option<AppView> {
        let mut instances: Vec<InstanceView> = entries
            .values()
            .filter(|e| e.holding.kind() != Origin::Imported)
            .map(|e| self.store.view(e))
            .collect();
        if instances.is_empty() {
            return None;
        }
        instances.sort_by(|a, b| a.id().cmp(b.id()));
        Some(AppView {
            name: name.to_string(),
            instances,
        })
    }
}

mod offers;
#[cfg(test)]
mod tests;
