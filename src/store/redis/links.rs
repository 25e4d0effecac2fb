//! A connection per runtime: with connection workers (`crate::server::Workers`), each
//! worker runtime gets a [`Link`] of its own to the same server, its socket on that
//! worker's reactor and its connection task on that worker's thread. A command sent from
//! a worker is then written, answered and handed back on one thread: no wake crosses to
//! the main runtime and back, as one shared connection needed twice per command.
//!
//! The main runtime keeps a link of its own for what runs there (the admin port, store
//! checks, readiness). Each link is dialled, watched and replaced on its own (see
//! [`super::link`]): a worker whose connection was cut dials again without disturbing
//! the others.
//!
//! Only a plain server without a near-cache is spread: the near-cache's invalidations
//! and their proof come from one connection, and a Sentinel lookup is kept to one per
//! dial.

use std::sync::Arc;

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

    /// Adds a link per runtime in `runtimes`, each made by `start` on that runtime.
    pub(super) fn spread(self, runtimes: &[Handle], start: impl Fn(&Handle) -> Link) -> Self {
        let workers = runtimes.iter().map(|h| (h.id(), start(h))).collect();
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

    /// How many connections are kept: the main one and one per worker.
    pub(super) fn count(&self) -> usize {
        1 + self.workers.len()
    }
}
