//! Shutdown bookkeeping: every task of an edge holds a [`TaskGuard`]; the
//! edge's shutdown cancels the token and waits until every guard is gone,
//! so sockets are closed (and ports free) when `shutdown` returns.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Held by a task for as long as it runs.
#[derive(Clone)]
pub(crate) struct TaskGuard {
    pub(crate) cancel: CancellationToken,
    _alive: mpsc::Sender<()>,
}

/// Waits for all guards.
pub(crate) struct TaskSet {
    pub(crate) cancel: CancellationToken,
    alive: mpsc::Receiver<()>,
}

pub(crate) fn task_set() -> (TaskGuard, TaskSet) {
    let cancel = CancellationToken::new();
    let (tx, rx) = mpsc::channel(1);
    (
        TaskGuard {
            cancel: cancel.clone(),
            _alive: tx,
        },
        TaskSet { cancel, alive: rx },
    )
}

impl TaskSet {
    /// Cancels everything and waits for every task to drop its guard.
    pub(crate) async fn shutdown(mut self) {
        self.cancel.cancel();
        // `recv` returns `None` once every sender (guard) is dropped.
        while self.alive.recv().await.is_some() {}
    }
}
