//! A keyed request's task, run in its client's future for as long as the client waits,
//! and spawned on its own only when the client lets go first.
//!
//! The task must outlive its client (a claim or an upstream call under way must settle),
//! but most clients wait for their answer. Spawning every task cost a replay a twentieth
//! of the gateway's CPU (the task's registration, its scheduling, and the wake-up of the
//! client's future when the answer came), to guard against the rare client that leaves.
//! So the task is polled where the client waits, counted for shutdown all along by a
//! tracker token, and moved into a task of its own, already pinned in its box, when:
//! - the future awaiting it is dropped before it ends (the client hung up, or hyper
//!   dropped the service), or
//! - its answer was delivered early (a streamed answer), so its client's future ends
//!   while the task still pumps the body and stores the record.
//!
//! A panic in the task ends it, as a spawned task's would, and its client is answered 500
//! (the delivery never came); it does not take the client's connection down with it.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use tokio::sync::oneshot;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use crate::Body;

/// A request's task, boxed and pinned: moving it to a task of its own moves the pointer.
pub(super) type TaskFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The task and the answer it delivers, awaited together.
pub(super) struct Inline {
    /// The task, until it ends or is spawned.
    task: Option<TaskFuture>,
    /// Where its answer arrives.
    delivered: oneshot::Receiver<Response<Body>>,
    tasks: TaskTracker,
    /// Counts the task as tracked while it runs here (shutdown waits for it).
    _tracked: TaskTrackerToken,
}

impl Inline {
    /// `task`, tracked in `tasks`, delivering to `delivered`.
    pub(super) fn new(
        task: TaskFuture,
        delivered: oneshot::Receiver<Response<Body>>,
        tasks: &TaskTracker,
    ) -> Self {
        Self {
            task: Some(task),
            delivered,
            tasks: tasks.clone(),
            _tracked: tasks.token(),
        }
    }

    /// Moves the task, unfinished, into a task of its own.
    fn detach(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        // Outside a runtime (it is being torn down) there is nowhere to run it: dropped,
        // as the runtime would drop a spawned one.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            self.tasks.spawn_on(task, &handle);
        }
    }
}

impl Future for Inline {
    /// The task's answer; `None` when it ended without one.
    type Output = Option<Response<Body>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(task) = this.task.as_mut() {
            match catch_unwind(AssertUnwindSafe(|| task.as_mut().poll(cx))) {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) | Err(_) => this.task = None,
            }
        }
        if this.task.is_none() {
            // The task is over, so its sender is gone: it delivered or it never will.
            // Read without a poll: tokio's cooperative budget, spent by the task's own last
            // poll (or by the connection's socket work before it), makes a poll answer
            // `Pending` for a value already sent, and that `Pending` would read as "ended
            // without an answer", a 500 for a request the upstream carried out.
            return Poll::Ready(this.delivered.try_recv().ok());
        }
        match Pin::new(&mut this.delivered).poll(cx) {
            Poll::Ready(delivered) => {
                // Delivered early: the task runs on by itself.
                this.detach();
                Poll::Ready(delivered.ok())
            }
            // Not yet (or the budget is spent, and tokio wakes us to try again).
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        self.detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn answer() -> Response<Body> {
        Response::new(crate::full(bytes::Bytes::from_static(b"ok")))
    }

    #[tokio::test]
    async fn a_waiting_client_gets_the_answer_and_nothing_is_spawned() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel();
        let task = Box::pin(async move {
            tokio::task::yield_now().await;
            let _ = tx.send(answer());
        });
        let inline = Inline::new(task, rx, &tasks);
        assert_eq!(tasks.len(), 1, "tracked while it runs inline");
        let response = inline.await.expect("an answer");
        assert_eq!(response.status(), 200);
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn a_client_that_leaves_leaves_the_task_running_and_tracked() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel();
        let (go, wait) = oneshot::channel::<()>();
        let done = Arc::new(AtomicBool::new(false));
        let seen = done.clone();
        let task = Box::pin(async move {
            let _ = wait.await;
            seen.store(true, Ordering::SeqCst);
            let _ = tx.send(answer());
        });
        let mut inline = Box::pin(Inline::new(task, rx, &tasks));
        // Polled once, not finished: the client hangs up.
        assert!(futures_poll_once(inline.as_mut()).await.is_none());
        drop(inline);
        assert_eq!(tasks.len(), 1, "the task runs on, tracked");
        go.send(()).unwrap();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_early_answer_returns_while_the_task_runs_on() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel();
        let (go, wait) = oneshot::channel::<()>();
        let task = Box::pin(async move {
            let _ = tx.send(answer());
            let _ = wait.await;
        });
        let response = Inline::new(task, rx, &tasks).await;
        assert!(response.is_some());
        assert_eq!(tasks.len(), 1, "the rest of the task is a task of its own");
        go.send(()).unwrap();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_task_that_panics_ends_without_an_answer() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel::<Response<Body>>();
        let task = Box::pin(async move {
            let _keep = tx;
            panic!("a bug");
        });
        assert!(Inline::new(task, rx, &tasks).await.is_none());
        assert!(tasks.is_empty());
    }

    /// Polls `f` once: its output if ready.
    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match Pin::new(&mut f).poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    /// `n` items ready to receive: each receive spends a unit of tokio's budget.
    fn ready(n: u32) -> tokio::sync::mpsc::UnboundedReceiver<u32> {
        let (queue, items) = tokio::sync::mpsc::unbounded_channel();
        (0..n).for_each(|i| queue.send(i).unwrap());
        items
    }

    /// A task whose last poll spends tokio's whole cooperative budget (128 ready
    /// receives) and then delivers: its answer is the client's, not a 500.
    #[tokio::test]
    async fn an_answer_delivered_on_the_last_unit_of_budget_is_not_lost() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel();
        let mut items = ready(128);
        let task = Box::pin(async move {
            for _ in 0..128 {
                items.recv().await.unwrap();
            }
            let _ = tx.send(answer());
        });
        let response = Inline::new(task, rx, &tasks).await;
        assert_eq!(response.expect("the delivered answer").status(), 200);
    }

    /// Most of the budget spent by the client's side of the poll (its connection's socket
    /// work), the rest by the task's one ready receive before it delivers: the answer
    /// still arrives.
    #[tokio::test]
    async fn an_answer_delivered_after_the_connection_spent_the_budget_is_not_lost() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel();
        let (mut items, mut first) = (ready(127), ready(1));
        let mut inline = Inline::new(
            Box::pin(async move {
                first.recv().await.unwrap();
                let _ = tx.send(answer());
            }),
            rx,
            &tasks,
        );
        let response = std::future::poll_fn(|cx| {
            for _ in 0..127 {
                assert!(items.poll_recv(cx).is_ready(), "within the budget");
            }
            Pin::new(&mut inline).poll(cx)
        })
        .await;
        assert_eq!(response.expect("the delivered answer").status(), 200);
    }

    /// A task that panics after it delivered: its answer is still the client's.
    #[tokio::test]
    async fn a_task_that_panics_after_delivering_still_answers() {
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel();
        let task = Box::pin(async move {
            let _ = tx.send(answer());
            panic!("a bug after the answer");
        });
        let response = Inline::new(task, rx, &tasks).await;
        assert_eq!(response.expect("the delivered answer").status(), 200);
    }
}
