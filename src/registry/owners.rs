//! The owner index: which instances each EurekaApp holds (its pod instances and the registrations
//! adopted for it), so that the controller's reconcile of one EurekaApp costs what that EurekaApp
//! holds, not the size of the registry. The registry keeps it in step with its own writes: every
//! place an entry is stored, removed, or changes holding reports the owner before and after.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use super::{PodOwner, instance::CompactString};

/// `(application, instance id)`, the registry's own names, shared.
type Held = BTreeSet<(Arc<str>, Arc<str>)>;

/// The instances held for each EurekaApp, by namespace then EurekaApp name.
#[derive(Debug, Default)]
pub(super) struct Owners {
    by_app: HashMap<CompactString, HashMap<CompactString, Held>>,
}

impl Owners {
    /// `app`/`id` is now held for `to` (none: native or replicated, or gone) instead of `from`.
    pub(super) fn moved(&mut self, app: &Arc<str>, id: &Arc<str>, from: Option<&PodOwner>, to: Option<&PodOwner>) {
        let same_app = |a: &PodOwner, b: &PodOwner| a.namespace == b.namespace && a.eureka_app == b.eureka_app;
        if let (Some(f), Some(t)) = (from, to)
            && same_app(f, t)
        {
            return;
        }
        if let Some(f) = from {
            self.remove(app, id, f);
        }
        if let Some(t) = to {
            self.by_app
                .entry(t.namespace.clone())
                .or_default()
                .entry(t.eureka_app.clone())
                .or_default()
                .insert((app.clone(), id.clone()));
        }
    }

    fn remove(&mut self, app: &Arc<str>, id: &Arc<str>, owner: &PodOwner) {
        let Some(ns) = self.by_app.get_mut(&owner.namespace) else {
            return;
        };
        if let Some(held) = ns.get_mut(&owner.eureka_app) {
            held.remove(&(app.clone(), id.clone()));
            if held.is_empty() {
                ns.remove(&owner.eureka_app);
            }
        }
        if ns.is_empty() {
            self.by_app.remove(&owner.namespace);
        }
    }

    /// The `(application, instance id)` held for one EurekaApp.
    pub(super) fn of<'a>(&'a self, namespace: &str, eureka_app: &str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.by_app
            .get(namespace)
            .and_then(|ns| ns.get(eureka_app))
            .into_iter()
            .flatten()
            .map(|(app, id)| (&**app, &**id))
    }

    /// Every `(namespace, EurekaApp, application, id)`, sorted (for the tests' consistency check).
    #[cfg(test)]
    pub(super) fn all(&self) -> Vec<(String, String, String, String)> {
        let mut all: Vec<_> = self
            .by_app
            .iter()
            .flat_map(|(ns, apps)| {
                apps.iter().flat_map(move |(ea, held)| {
                    held.iter()
                        .map(move |(app, id)| (ns.to_string(), ea.to_string(), app.to_string(), id.to_string()))
                })
            })
            .collect();
        all.sort();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(ea: &str, pod: &str) -> PodOwner {
        PodOwner {
            namespace: "shop".into(),
            eureka_app: ea.into(),
            pod: pod.into(),
        }
    }

    #[test]
    fn moves_between_owners_and_forgets_empty_ones() {
        let mut o = Owners::default();
        let (a, b) = (owner("orders", "p-1"), owner("billing", "p-1"));
        o.moved(&"ORDERS".into(), &"i-1".into(), None, Some(&a));
        o.moved(&"ORDERS".into(), &"i-2".into(), None, Some(&a));
        // Another pod of the same EurekaApp: still held for it.
        o.moved(&"ORDERS".into(), &"i-2".into(), Some(&a), Some(&owner("orders", "p-2")));
        assert_eq!(o.of("shop", "orders").count(), 2);
        o.moved(&"ORDERS".into(), &"i-1".into(), Some(&a), Some(&b));
        assert_eq!(o.of("shop", "orders").collect::<Vec<_>>(), [("ORDERS", "i-2")]);
        assert_eq!(o.of("shop", "billing").collect::<Vec<_>>(), [("ORDERS", "i-1")]);
        o.moved(&"ORDERS".into(), &"i-1".into(), Some(&b), None);
        o.moved(&"ORDERS".into(), &"i-2".into(), Some(&a), None);
        assert_eq!(o.of("shop", "orders").count(), 0);
        assert!(o.by_app.is_empty(), "{o:?}");
    }
}
