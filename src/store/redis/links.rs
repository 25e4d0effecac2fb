//! A connection per runtime: with connection workers (`crate::edge::server::Workers`), each
//! worker runtime gets a [`Link`] of its own to the same server, its socket on that
//! worker's reactor and its connection task on that worker's thread. A command sent from
//! a worker is then written, answered and handed back on one thread: no wake crosses to
//! the main runtime and back, as one shared connection needed twice per command.
//!
//! The main runtime keeps a link of its own for what runs there (the admin port, store
//! checks). Each link is dialled, watched and replaced on its own (see [`super::link`]): a
//! worker whose connection was cut dials again without disturbing the others, and its log
//! lines name it (`redis="host:port, worker 1"`). Readiness and `dedupe_store_up` ask
//! every link ([`every`]): a worker refused a connection (`maxclients`) or left with a
//! silent one makes the gateway not ready.
//!
//! Only a plain server without a near-cache is spread: the near-cache's invalidations
//! and their proof come from one connection, and a Sentinel lookup is kept to one per
//! dial.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::runtime::{Handle, Id};

use super::link::Link;

/// The main link, and one per worker runtime.
#[derive(Clone)]
pub(super) struct Links {
    main: Link,
    workers: Arc<[(Id, Link)]>,
}

impl Links {
    /// One link, used from every runtime.
    pub(super) fn one(main: Link) -> Self {
        Self {
            main,
            workers: Arc::new([]),
        }
    }

    /// Adds a link per runtime in `runtimes`, each made by `start` on that runtime (and
    /// given its index).
    pub(super) fn spread(
        self,
        runtimes: &[Handle],
        start: impl Fn(usize, &Handle) -> Link,
    ) -> Self {
        let workers = runtimes
            .iter()
            .enumerate()
            .map(|(i, h)| (h.id(), start(i, h)))
            .collect();
        Self {
            main: self.main,
            workers,
        }
    }

    /// The link made for `runtime`, else the main one.
    pub(super) fn on(&self, runtime: Option<Id>) -> &Link {
        runtime
            .and_then(|id| self.workers.iter().find(|(r, _)| *r == id))
            .map_or(&self.main, |(_, link)| link)
    }

    /// The main runtime's link.
    pub(super) fn main(&self) -> &Link {
        &self.main
    }

    /// Every link: the main one, then each worker's.
    pub(super) fn all(&self) -> impl Iterator<Item = &Link> {
        std::iter::once(&self.main).chain(self.workers.iter().map(|(_, link)| link))
    }
}

/// Every one of `asks` run at once, to its end: their outputs in order.
pub(super) async fn every<F: Future>(asks: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut asks: Vec<Pin<Box<F>>> = asks.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = asks.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (ask, output) in asks.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match ask.as_mut().poll(cx) {
                    Poll::Ready(v) => *output = Some(v),
                    Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::every;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn every_ask_runs_at_once_and_the_outputs_keep_their_order() {
        let started = tokio::time::Instant::now();
        let asks = [30u64, 10, 20].into_iter().map(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        });
        assert_eq!(every(asks).await, [30, 10, 20]);
        // At once: the longest, not the sum.
        assert_eq!(started.elapsed(), Duration::from_millis(30));
        assert!(every(std::iter::empty::<std::future::Ready<()>>())
            .await
            .is_empty());
    }
}
