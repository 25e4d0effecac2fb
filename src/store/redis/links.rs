//! A connection per runtime: with connection workers (`crate::runtime::Workers`), each
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
//! Each runtime has two links (see [`Lane`]): one for claims and what else requests and
//! operators ask, one for what a lease's holder sends once it has won, so completions
//! never queue behind claims.
//!
//! Only a plain server without a near-cache is spread: the near-cache's invalidations
//! and their proof come from one connection, and a Sentinel lookup is kept to one per
//! dial.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::runtime::Handle;

use super::link::Link;
use crate::runtime::PerRuntime;

/// Which of a runtime's two connections to a server a link keeps.
///
/// What a lease's holder sends once it has won (renewals, completions, releases) goes on
/// a connection of its own: the crate's connection sends in order and its queue is the
/// claims', so on one connection a completion waited behind every claim queued before it,
/// and under load timed out there with the upstream's answer in hand (issue #56). On its
/// own connection it waits behind other leases' operations only, at most one per request
/// in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Claims, and every other operation a request or an operator asks for.
    Claims,
    /// Renewals, completions and releases.
    Leases,
}

impl Lane {
    /// The connection's name (`CLIENT SETNAME`), so `CLIENT LIST` tells which is which.
    pub(crate) fn client_name(self) -> &'static str {
        match self {
            Lane::Claims => "dedupe-gateway-claims",
            Lane::Leases => "dedupe-gateway-leases",
        }
    }
}

/// A runtime's two links to the server, one per [`Lane`].
#[derive(Clone)]
pub(super) struct Lanes {
    claims: Link,
    leases: Link,
}

impl Lanes {
    /// Both links, each made by `start` for its lane.
    pub(super) fn start(mut start: impl FnMut(Lane) -> Link) -> Self {
        Self {
            claims: start(Lane::Claims),
            leases: start(Lane::Leases),
        }
    }

    /// The link of `lane`.
    pub(super) fn lane(&self, lane: Lane) -> &Link {
        match lane {
            Lane::Claims => &self.claims,
            Lane::Leases => &self.leases,
        }
    }
}

/// The main runtime's lanes, and each worker runtime's (a [`PerRuntime`]).
#[derive(Clone)]
pub(super) struct Links(Arc<PerRuntime<Lanes>>);

impl Links {
    /// One pair of links, used from every runtime.
    pub(super) fn one(main: Lanes) -> Self {
        Self(Arc::new(PerRuntime::made_on(
            main,
            &[],
            |_, _| unreachable!(),
        )))
    }

    /// Adds a pair of links per runtime in `runtimes`, each made by `start` on that
    /// runtime (and given its index).
    pub(super) fn spread(
        self,
        runtimes: &[Handle],
        start: impl Fn(usize, &Handle) -> Lanes,
    ) -> Self {
        let main = self.main().clone();
        Self(Arc::new(PerRuntime::made_on(main, runtimes, start)))
    }

    /// The links made for the runtime this runs on, else the main ones.
    pub(super) fn here(&self) -> &Lanes {
        self.0.here()
    }

    /// The main runtime's links.
    pub(super) fn main(&self) -> &Lanes {
        self.0.first()
    }

    /// Every link: the main ones, then each worker's.
    pub(super) fn all(&self) -> impl Iterator<Item = &Link> {
        self.0
            .iter()
            .flat_map(|lanes| [&lanes.claims, &lanes.leases])
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
