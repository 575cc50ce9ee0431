//! Completeness and the sweep: when the registry may answer fetches (every watch listed, every
//! EurekaApp reconciled after that), re-lists, and the periodic removal of pod instances whose
//! EurekaApp is gone.

use super::*;

impl Context {
    /// A watch re-listed: its namespaces need a look; the first time everything has listed,
    /// every EurekaApp does.
    pub(super) fn relisted(&self, namespaces: &[String]) {
        self.metrics.indexed_pods.set(self.index.read().pod_count() as i64);
        if !self.index.read().synced() {
            return;
        }
        if !self.complete.is_met() {
            tracing::info!(
                pods = self.index.read().pod_count(),
                "every watch has listed: reconciling"
            );
            for tx in &self.reconcile_all {
                let _ = tx.send(());
            }
            self.check_complete();
            return;
        }
        for ns in namespaces {
            for app in self.stores.apps_in(ns) {
                if let Some(key) = AppKey::of(&app) {
                    self.triggers.send(&key);
                }
            }
        }
    }

    /// Marks the registry complete once every EurekaApp in the stores has been reconciled since
    /// every watch listed.
    pub(super) fn check_complete(&self) {
        if self.complete.is_met() || !self.index.read().synced() || !self.stores.ready() {
            return;
        }
        let apps = self.stores.all();
        let reconciled = self.reconciled.lock();
        let pending = apps
            .iter()
            .filter_map(|a| AppKey::of(a))
            .filter(|k| !reconciled.contains(k))
            .count();
        if pending == 0 {
            drop(reconciled);
            self.complete.met();
            self.reconciled.lock().clear();
        } else {
            self.complete.waiting(format!(
                "{} of {} EurekaApps reconciled",
                apps.len() - pending,
                apps.len()
            ));
        }
    }

    /// Background work: completeness checks until complete, reconciling everything on taking the
    /// Lease, and the sweep of pod instances whose EurekaApp is gone.
    pub(super) async fn background(self: Arc<Self>, mut leader: crate::leadership::Leader) -> anyhow::Result<()> {
        let mut sweep = tokio::time::interval(self.settings.sweep_interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                changed = leader.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if leader.borrow_and_update().holds() && self.index.read().synced() {
                        tracing::info!("leading: reconciling every EurekaApp to write its status");
                        for tx in &self.reconcile_all {
                            let _ = tx.send(());
                        }
                    }
                }
                _ = sweep.tick() => self.sweep(),
                _ = check.tick(), if !self.complete.is_met() => self.check_complete(),
            }
        }
    }

    /// Removes the pod instances of EurekaApps that are gone.
    pub(super) fn sweep(&self) {
        if !self.index.read().synced() || !self.stores.ready() {
            return;
        }
        let orphans: Vec<(PodOwner, InstanceView)> = self.state.with_registry(|r, _| {
            r.pod_instances()
                .into_iter()
                .filter(|(o, _)| {
                    !self.stores.contains(&AppKey {
                        namespace: o.namespace.to_string(),
                        name: o.eureka_app.to_string(),
                    })
                })
                .collect()
        });
        self.metrics.apps.retain(|key| self.stores.contains(key));
        let n = self.remove(&orphans);
        if n > 0 {
            self.metrics.swept.inc_by(n as u64);
            tracing::info!(removed = n, "removed pod instances whose EurekaApp is gone");
        }
        let orphan_claims: Vec<PodOwner> = self.state.with_registry(|r, _| {
            r.claim_owners()
                .into_iter()
                .filter(|o| {
                    !self.stores.contains(&AppKey {
                        namespace: o.namespace.to_string(),
                        name: o.eureka_app.to_string(),
                    })
                })
                .collect()
        });
        for owner in &orphan_claims {
            self.state.apply(Command::Unclaim {
                owner: owner.clone(),
                pod_gone: false,
            });
        }
        if !orphan_claims.is_empty() {
            tracing::info!(
                released = orphan_claims.len(),
                "released the registrations adopted for EurekaApps that are gone"
            );
        }
    }

    /// Deregisters the given pod instances; returns how many went.
    pub(super) fn remove(&self, instances: &[(PodOwner, InstanceView)]) -> usize {
        instances
            .iter()
            .filter(|(owner, view)| {
                let outcome = self.state.apply(Command::RemovePod {
                    app: view.info.app.to_string(),
                    id: view.id().to_string(),
                    owner: owner.clone(),
                });
                outcome.reply == Reply::Ok
            })
            .count()
    }
}
