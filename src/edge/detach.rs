//! Requests that outlive their client. From its claim on, a deduped request runs in its
//! own task so that a client hanging up never strands a claim or an upstream call; this
//! counts the tasks whose client has gone, so that their number can be bounded.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

const ATTACHED: u8 = 0;
const DETACHED: u8 = 1;
const DONE: u8 = 2;

/// Shared between a request's task and the client-facing future that awaits it.
#[derive(Clone)]
pub(super) struct Tether {
    state: Arc<AtomicU8>,
    detached: Arc<AtomicUsize>,
}

impl Tether {
    /// A tether counted in `detached` once its client lets go.
    pub fn new(detached: &Arc<AtomicUsize>) -> Self {
        Self {
            state: Arc::new(AtomicU8::new(ATTACHED)),
            detached: detached.clone(),
        }
    }

    /// Held by the client-facing future: dropping it before the task is done (the client
    /// hung up) counts the task as detached.
    pub fn client(&self) -> ClientSide {
        ClientSide(self.clone())
    }

    /// Called by the task when its work is over, however it ended.
    pub fn task_done(&self) {
        if self.state.swap(DONE, Ordering::AcqRel) == DETACHED {
            self.detached.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The client's end of a [`Tether`].
pub(super) struct ClientSide(Tether);

impl Drop for ClientSide {
    fn drop(&mut self) {
        let t = &self.0;
        if t.state
            .compare_exchange(ATTACHED, DETACHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            t.detached.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Marks the task done when dropped: the task's work is over even if it panicked.
pub(super) struct TaskSide(pub Tether);

impl Drop for TaskSide {
    fn drop(&mut self) {
        self.0.task_done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_leaving_first_counts_until_the_task_ends() {
        let n = Arc::new(AtomicUsize::new(0));
        let t = Tether::new(&n);
        let client = t.client();
        let task = TaskSide(t);
        drop(client);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        drop(task);
        assert_eq!(n.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_task_ending_first_is_never_counted() {
        let n = Arc::new(AtomicUsize::new(0));
        let t = Tether::new(&n);
        let client = t.client();
        drop(TaskSide(t));
        drop(client);
        assert_eq!(n.load(Ordering::SeqCst), 0);
    }
}
