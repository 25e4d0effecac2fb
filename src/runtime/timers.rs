//! Deadlines on timers kept for reuse.
//!
//! `tokio::time::timeout` arms a new timer on each call: its first wait takes the timer
//! wheel's lock to insert it, and its drop takes the lock again to remove it. On a
//! request path that runs one per upstream call and per store command, that was about
//! 700 instructions each (callgrind; docs/benchmarks.md). A timer kept here is moved on to
//! its next, later deadline with one atomic store instead: the wheel keeps it where it
//! was, and when that earlier moment comes, finds the later deadline and files it again
//! (once per timeout period, not once per call).
//!
//! A kept timer may still fire while it waits here; it wakes the task that last waited
//! on it, which finds nothing new and waits on, and its next use files it again. A
//! deadline earlier than a kept timer's (a shorter timeout after a reload) files it again
//! too. Timers belong to the runtime they were made on, so they are kept per runtime
//! ([`PerRuntime`]): a runtime takes only its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

use super::PerRuntime;

/// The most timers a runtime keeps: as many as calls are waiting at once, within this
/// bound.
const KEPT_MAX: usize = 1024;

/// Timers kept for the next deadline, by the runtime each was made on. (Another
/// runtime's timer would still work, its wheel waking this runtime's task, but only when
/// that runtime's thread turns to its timers.)
pub struct Timers {
    kept: PerRuntime<Kept>,
}

/// One runtime's kept timers.
type Kept = Mutex<Vec<Timer>>;

/// A timer, pinned where it was made.
type Timer = Pin<Box<Sleep>>;

/// A timer lent out, and where it goes back: the kept timers of the runtime it was made
/// on.
type Lent<'a> = (&'a Kept, Timer);

impl Default for Timers {
    fn default() -> Self {
        Self::new()
    }
}

impl Timers {
    /// Timers, none kept yet.
    pub fn new() -> Self {
        Self {
            kept: PerRuntime::lazy(Kept::default),
        }
    }

    /// `f`'s output, or `None` once `deadline` has passed first. What `f` has ready is
    /// taken before the deadline is looked at, as with `tokio::time::timeout_at`; `f` is
    /// held in place, not moved again (a call's future is kilobytes).
    pub fn within<F: Future>(&self, deadline: Instant, f: F) -> Within<'_, F> {
        Within {
            f,
            timers: self,
            deadline,
            timer: None,
        }
    }

    fn take(&self, deadline: Instant) -> Lent<'_> {
        let kept = self.kept.here();
        let timer = kept.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match timer {
            Some(mut timer) => {
                timer.as_mut().reset(deadline);
                (kept, timer)
            }
            None => (kept, Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Keeps the timer `lent` holds, if any, for the next wait.
    fn give_back(lent: &mut Option<Lent<'_>>) {
        if let Some((kept, timer)) = lent.take() {
            let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() < KEPT_MAX {
                kept.push(timer);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Timers::within`]'s wait: a timer is taken when `f` first waits, and given back
    /// when the wait ends or is dropped.
    pub struct Within<'a, F> {
        #[pin]
        f: F,
        timers: &'a Timers,
        deadline: Instant,
        timer: Option<Lent<'a>>,
    }

    impl<'a, F> PinnedDrop for Within<'a, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            Timers::give_back(this.timer);
        }
    }
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let had_budget = tokio::task::coop::has_budget_remaining();
        if let Poll::Ready(out) = this.f.poll(cx) {
            Timers::give_back(this.timer);
            return Poll::Ready(Some(out));
        }
        let (_, timer) = this
            .timer
            .get_or_insert_with(|| this.timers.take(*this.deadline));
        // As tokio's timeout does: when `f` spent the task's budget, the deadline is
        // still looked at (else a future that always spends it would never time out).
        let elapsed = if had_budget && !tokio::task::coop::has_budget_remaining() {
            Pin::new(&mut tokio::task::coop::unconstrained(timer.as_mut())).poll(cx)
        } else {
            timer.as_mut().poll(cx)
        };
        match elapsed {
            Poll::Ready(()) => {
                Timers::give_back(this.timer);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    impl Timers {
        fn kept(&self) -> usize {
            self.kept.iter().map(|t| t.lock().unwrap().len()).sum()
        }
    }

    #[test]
    fn each_runtime_takes_only_its_own_timers() {
        let timers = Timers::new();
        let one = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let two = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let wait = |rt: &tokio::runtime::Runtime| {
            rt.block_on(timers.within(
                Instant::now() + Duration::from_millis(1),
                std::future::pending::<()>(),
            ))
        };
        assert_eq!(wait(&one), None);
        assert_eq!(wait(&two), None);
        assert_eq!(wait(&one), None);
        let kept: Vec<usize> = timers
            .kept
            .iter()
            .map(|t| t.lock().unwrap().len())
            .collect();
        assert_eq!(
            kept,
            [1, 1],
            "one timer each, each kept by the runtime that made it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_timer_ends_each_wait_at_its_own_deadline() {
        let timers = Timers::new();
        // Ready at once: the output, whatever the deadline.
        assert_eq!(timers.within(Instant::now(), async { 7 }).await, Some(7));
        for round in 1..=5u64 {
            let start = Instant::now();
            let late = timers
                .within(
                    start + Duration::from_secs(round),
                    std::future::pending::<()>(),
                )
                .await;
            assert_eq!(late, None, "round {round}");
            assert_eq!(start.elapsed(), Duration::from_secs(round), "round {round}");
            // In time: the output, and no wait beyond it.
            let start = Instant::now();
            let out = timers
                .within(start + Duration::from_secs(10), async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    round
                })
                .await;
            assert_eq!(out, Some(round));
            assert_eq!(start.elapsed(), Duration::from_millis(300));
        }
        assert_eq!(timers.kept(), 1, "one timer, reused");
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_than_the_kept_timers_still_ends_the_wait_on_time() {
        let timers = Timers::new();
        let start = Instant::now();
        let out = timers
            .within(start + Duration::from_secs(60), async { 1 })
            .await;
        assert_eq!(out, Some(1));
        // The kept timer was filed for 60 s; this wait must end at 2 s.
        let late = timers
            .within(start + Duration::from_secs(2), std::future::pending::<()>())
            .await;
        assert_eq!(late, None);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_dropped_midway_gives_its_timer_back_and_many_at_once_each_get_one() {
        let timers = std::sync::Arc::new(Timers::new());
        let start = Instant::now();
        let waits: Vec<_> = (1..=8u64)
            .map(|i| {
                let timers = timers.clone();
                tokio::spawn(async move {
                    timers
                        .within(start + Duration::from_secs(i), std::future::pending::<()>())
                        .await;
                    start.elapsed()
                })
            })
            .collect();
        for (i, w) in waits.into_iter().enumerate() {
            assert_eq!(w.await.unwrap(), Duration::from_secs(i as u64 + 1));
        }
        assert_eq!(timers.kept(), 8);
        let dropped = tokio::time::timeout(
            Duration::from_millis(10),
            timers.within(
                Instant::now() + Duration::from_secs(30),
                std::future::pending::<()>(),
            ),
        )
        .await;
        assert!(dropped.is_err());
        assert_eq!(timers.kept(), 8, "given back when dropped");
    }
}
