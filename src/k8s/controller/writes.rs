//! The leader's Kubernetes writes: the status by server-side apply, Events, the removal of an
//! earlier version's finalizer, and the error policy that retries them with backoff.

use super::apply::Applied;
use super::*;

/// A failed reconcile (a Kubernetes write) is retried with exponential backoff per EurekaApp,
/// from 500 ms up to `--kubernetes-write-max-backoff-ms`.
pub(super) fn error_policy(app: Arc<EurekaApp>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.write_errors.inc();
    let Some(key) = AppKey::of(&app) else {
        return Action::await_change();
    };
    let failures = {
        let mut f = ctx.failures.lock();
        let n = f.entry(key.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(failures, ctx.settings.max_backoff);
    tracing::warn!(app = %key, error = %error, retry_in = ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// Removes the finalizer that versions before 0.2 added (they deregistered through it), so that
/// nothing is left that only a running operator could lift: deleting an EurekaApp, or its
/// namespace, never waits on the operator. A merge patch of the list without it, guarded by the
/// resource version (a concurrent change answers 409 and the reconcile is retried).
pub(super) async fn remove_legacy_finalizer(api: &Api<EurekaApp>, key: &AppKey, app: &EurekaApp) -> Result<(), Error> {
    let finalizers = app.metadata.finalizers.as_deref().unwrap_or_default();
    if !finalizers.iter().any(|f| f == LEGACY_FINALIZER) {
        return Ok(());
    }
    let rest: Vec<&String> = finalizers.iter().filter(|f| *f != LEGACY_FINALIZER).collect();
    let patch = serde_json::json!({"metadata": {
        "finalizers": rest,
        "resourceVersion": app.metadata.resource_version,
    }});
    api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Finalizer {
            key: key.clone(),
            source,
        })?;
    tracing::info!(app = %key, finalizer = LEGACY_FINALIZER, "removed the finalizer of an earlier version");
    Ok(())
}

/// The wait after `failures` consecutive failures: 500 ms doubling, at most `cap`.
pub(super) fn backoff(failures: u32, cap: Duration) -> Duration {
    Duration::from_millis(500)
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(cap)
}

impl Context {
    /// The leader's writes: the status, the Events, and the removal of the finalizer an earlier
    /// version added; the pods waiting for their readiness gate go to the gate task (which
    /// opens them without holding up the reconcile).
    pub(super) async fn write(&self, app: Arc<EurekaApp>, key: &AppKey, applied: Applied) -> Result<Action, Error> {
        let api: Api<EurekaApp> = Api::namespaced(self.client.clone(), &key.namespace);
        self.gates.hand(key, applied.gated);
        let result = async {
            remove_legacy_finalizer(&api, key, &app).await?;
            match &applied.status {
                Some(status) if app.metadata.deletion_timestamp.is_none() => {
                    self.write_status(&api, key, &app, status).await
                }
                _ => Ok(()),
            }
        }
        .await;
        self.record(key, &applied.notes).await;
        result.map(|()| applied.action)
    }

    /// Server-side applies the status unless only its sync time changed.
    pub(super) async fn write_status(
        &self,
        api: &Api<EurekaApp>,
        key: &AppKey,
        app: &EurekaApp,
        status: &EurekaAppStatus,
    ) -> Result<(), Error> {
        if app.status.as_ref().is_some_and(|s| !status::differs(s, status)) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": EurekaApp::api_version(&()),
            "kind": EurekaApp::kind(&()),
            "status": status,
        });
        api.patch_status(
            &key.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| Error::Status {
            key: key.clone(),
            source,
        })?;
        self.metrics.status_writes.inc();
        Ok(())
    }

    /// Records Events, at most [`status::NOTES_PER_WINDOW`] per app and reason a minute.
    pub(super) async fn record(&self, key: &AppKey, notes: &[Note]) {
        if notes.is_empty() {
            return;
        }
        let reference = ObjectRef::<EurekaApp>::new(&key.name).within(&key.namespace);
        let Some(app) = self.stores.0.iter().find_map(|(_, s)| s.get(&reference)) else {
            return;
        };
        let reference = app.object_ref(&());
        for note in notes {
            let admitted = self.limiter.lock().admit(key, note.reason, tokio::time::Instant::now());
            if !admitted {
                self.metrics.events_dropped.inc();
                continue;
            }
            let event = KubeEvent {
                type_: if note.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: note.reason.to_string(),
                note: Some(note.message.chars().take(1024).collect()),
                action: note.action.to_string(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => {
                    self.metrics.event_writes.inc();
                }
                Err(e) => {
                    self.metrics.write_errors.inc();
                    tracing::warn!(app = %key, error = %e, "failed to record an Event");
                }
            }
        }
    }
}
