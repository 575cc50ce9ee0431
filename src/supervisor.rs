//! Owns every long-lived task of the process. A subsystem hands its future to the [`Supervisor`]
//! under a name; the supervisor runs them all in one `JoinSet` until the process is asked to stop
//! (SIGTERM, Ctrl-C) or a task ends on its own. A task that ends on its own is a failure unless it
//! was spawned as [`Expect::Finishes`] and ended cleanly: then the supervisor logs it, flips
//! `/livez`, asks every other task to stop, and makes the process exit non-zero so that Kubernetes
//! restarts it. Nothing in the process serves without one of its parts.
//!
//! Shutdown is cooperative: every task is given the [`Shutdown`] signal and finishes its own
//! draining (the API its in-flight requests, replication its queues, the Lease its release) within
//! the grace period; what is still running after it is aborted.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{sync::watch, task::JoinSet};

/// A stop signal many tasks can wait on (cheap to clone).
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Resolves once the process is stopping.
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// Whether the process is stopping.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
}

/// What a task is expected to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Run until shutdown: ending earlier, even cleanly, is a failure.
    RunsForever,
    /// Finish its job and end cleanly (for example the start-up sync); failing is still a failure.
    Finishes,
}

/// Why the supervisor stopped the process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to keep the {task} task running: it ended unexpectedly")]
    Ended { task: &'static str },
    #[error("failed to keep the {task} task running: {source}")]
    Failed {
        task: &'static str,
        #[source]
        source: anyhow::Error,
    },
    #[error("failed to keep the {task} task running: it panicked")]
    Panicked { task: &'static str },
}

type Outcome = (&'static str, Expect, Result<(), anyhow::Error>);

/// The owner of every task. See the module docs.
pub struct Supervisor {
    /// The running tasks; each yields its name, what was expected of it and how it ended.
    tasks: JoinSet<Outcome>,
    /// Names of the tasks by their Tokio id, to name a task that panicked.
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
    /// Sends the stop signal to every task.
    stop: watch::Sender<bool>,
    /// `false` once a task failed: `/livez` answers 503 until the process is gone.
    alive: Arc<AtomicBool>,
    /// How long tasks get to drain after the stop signal.
    grace: Duration,
}

impl Supervisor {
    pub fn new(grace: Duration) -> Supervisor {
        let (stop, _) = watch::channel(false);
        Supervisor {
            tasks: JoinSet::new(),
            names: Default::default(),
            stop,
            alive: Arc::new(AtomicBool::new(true)),
            grace,
        }
    }

    /// The stop signal, for tasks to drain on.
    pub fn shutdown(&self) -> Shutdown {
        Shutdown(self.stop.subscribe())
    }

    /// `false` once a task has failed (what `/livez` reports).
    pub fn liveness(&self) -> Arc<AtomicBool> {
        self.alive.clone()
    }

    /// Runs `task` under `name`.
    pub fn spawn<F>(&mut self, name: &'static str, expect: Expect, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        #[cfg(feature = "fault-injection")]
        let task = inject_fault(name, task);
        let handle = self.tasks.spawn(async move { (name, expect, task.await) });
        self.names.insert(handle.id(), name);
    }

    /// Runs until `stop` resolves (a signal) or a task fails; then stops every task, waits up to
    /// the grace period, and returns the failure, if any.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> Result<(), Error> {
        tokio::pin!(stop);
        let mut failure = None;
        loop {
            tokio::select! {
                _ = &mut stop => {
                    tracing::info!("shutting down");
                    break;
                }
                joined = self.tasks.join_next_with_id() => {
                    let Some(joined) = joined else { break };
                    if let Some(e) = self.judge(joined) {
                        tracing::error!(error = %e, "a task of the process failed: stopping the process");
                        self.alive.store(false, Ordering::Release);
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        self.stop.send_replace(true);
        let deadline = tokio::time::Instant::now() + self.grace;
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next_with_id()).await {
                Ok(Some(joined)) => {
                    if let Some(e) = self.judge_during_shutdown(joined) {
                        tracing::warn!(error = %e, "a task failed while the process stopped");
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        still_running = self.tasks.len(),
                        grace = ?self.grace,
                        "tasks did not stop within the grace period: aborting them"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A task ended while the process was running: `Some` when that is a failure.
    fn judge(&mut self, joined: Result<(tokio::task::Id, Outcome), tokio::task::JoinError>) -> Option<Error> {
        match joined {
            Ok((id, (name, expect, result))) => {
                self.names.remove(&id);
                match (result, expect) {
                    (Ok(()), Expect::Finishes) => {
                        tracing::debug!(task = name, "task finished");
                        None
                    }
                    (Ok(()), Expect::RunsForever) => Some(Error::Ended { task: name }),
                    (Err(source), _) => Some(Error::Failed { task: name, source }),
                }
            }
            Err(e) => {
                let task = self.names.remove(&e.id()).unwrap_or("unknown");
                Some(Error::Panicked { task })
            }
        }
    }

    /// A task ended after the stop signal: only errors and panics are worth reporting.
    fn judge_during_shutdown(
        &mut self,
        joined: Result<(tokio::task::Id, Outcome), tokio::task::JoinError>,
    ) -> Option<Error> {
        match joined {
            Ok((id, (name, _, result))) => {
                self.names.remove(&id);
                result.err().map(|source| Error::Failed { task: name, source })
            }
            Err(e) if e.is_cancelled() => None,
            Err(e) => Some(Error::Panicked {
                task: self.names.remove(&e.id()).unwrap_or("unknown"),
            }),
        }
    }
}

/// Test builds: `EUREKA_FAULT_INJECT=<task>:<ms>` panics the task named `<task>` after `<ms>`.
#[cfg(feature = "fault-injection")]
fn inject_fault<F>(name: &'static str, task: F) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>
where
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let fault = std::env::var("EUREKA_FAULT_INJECT").ok().and_then(|v| {
        let (task, ms) = v.rsplit_once(':')?;
        (task == name).then(|| ms.parse::<u64>().ok()).flatten()
    });
    match fault {
        None => Box::pin(task),
        Some(ms) => Box::pin(async move {
            tokio::select! {
                result = task => result,
                _ = tokio::time::sleep(Duration::from_millis(ms)) => panic!("injected fault in the {name} task"),
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_stops_the_others_and_fails_the_process() {
        let mut s = Supervisor::new(Duration::from_secs(5));
        let shutdown = s.shutdown();
        let drained = Arc::new(AtomicBool::new(false));
        let d = drained.clone();
        s.spawn("worker", Expect::RunsForever, async move {
            shutdown.wait().await;
            d.store(true, Ordering::Release);
            Ok(())
        });
        s.spawn("startup", Expect::Finishes, async { Ok(()) });
        s.spawn("replicator", Expect::RunsForever, async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        });
        let alive = s.liveness();
        let err = s.run(std::future::pending()).await.unwrap_err();
        assert!(matches!(err, Error::Ended { task: "replicator" }), "{err}");
        assert!(
            drained.load(Ordering::Acquire),
            "the others were asked to stop and drained"
        );
        assert!(!alive.load(Ordering::Acquire));
    }

    #[tokio::test(start_paused = true)]
    async fn panics_and_errors_are_named() {
        let mut s = Supervisor::new(Duration::from_secs(1));
        s.spawn("controller", Expect::RunsForever, async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            panic!("boom")
        });
        s.spawn("stuck", Expect::RunsForever, std::future::pending());
        let err = s.run(std::future::pending()).await.unwrap_err();
        assert!(matches!(err, Error::Panicked { task: "controller" }), "{err}");

        let mut s = Supervisor::new(Duration::from_secs(1));
        s.spawn("lease", Expect::Finishes, async {
            Err(anyhow::anyhow!("failed to renew"))
        });
        let err = s.run(std::future::pending()).await.unwrap_err();
        assert!(err.to_string().contains("lease") && err.to_string().contains("failed to renew"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_stops_cleanly_and_stragglers_are_aborted_after_the_grace() {
        let mut s = Supervisor::new(Duration::from_secs(2));
        let shutdown = s.shutdown();
        s.spawn("api", Expect::RunsForever, async move {
            shutdown.wait().await;
            Ok(())
        });
        s.spawn("ignores-the-signal", Expect::RunsForever, std::future::pending());
        let started = tokio::time::Instant::now();
        s.run(tokio::time::sleep(Duration::from_secs(1))).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
