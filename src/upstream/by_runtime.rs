//! hyper clients kept per runtime: on connection workers (`crate::server::Workers`), each
//! worker gets its own client for the upstream (plain or `https`) and for h2c calls, so a
//! connection a client opens (driven by a task on the runtime that opened it) serves only
//! the calls made on that runtime. A call never waits on a connection whose task runs on
//! another worker's thread.

use std::sync::{Arc, Mutex};

use crate::config::defaults::MAX_WORKERS;
use crate::timers::runtime;

/// The most runtimes given a client of their own: every worker (`server.workers` is
/// bounded by [`MAX_WORKERS`]) and the main runtime. Calls on any further runtime (only
/// seen when a process makes runtimes over and over, as tests do) share the first one's.
const RUNTIMES_MAX: usize = MAX_WORKERS + 1;

type Runtime = Option<tokio::runtime::Id>;

/// A client per runtime, each made on first use by `make`.
pub(super) struct ByRuntime<C> {
    make: Box<dyn Fn() -> C + Send + Sync>,
    made: Mutex<Vec<(Runtime, C)>>,
}

impl<C: Clone> ByRuntime<C> {
    /// None made yet.
    pub(super) fn new(make: impl Fn() -> C + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            make: Box::new(make),
            made: Mutex::new(Vec::new()),
        })
    }

    /// The client for the runtime this runs on.
    pub(super) fn here(&self) -> C {
        let here = runtime();
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, client)) = made.iter().find(|(r, _)| *r == here) {
            return client.clone();
        }
        if made.len() >= RUNTIMES_MAX {
            return made[0].1.clone();
        }
        let client = (self.make)();
        made.push((here, client.clone()));
        client
    }

    /// How many runtimes have a client.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.made.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn each_runtime_gets_its_own_client_made_once() {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let clients = ByRuntime::new(|| MADE.fetch_add(1, Ordering::SeqCst));
        let (a, b) = (current_thread(), current_thread());
        let on_a = a.block_on(async { clients.here() });
        let on_b = b.block_on(async { clients.here() });
        assert_ne!(on_a, on_b, "two runtimes, two clients");
        assert_eq!(a.block_on(async { clients.here() }), on_a, "kept");
        assert_eq!(b.block_on(async { clients.here() }), on_b, "kept");
        assert_eq!(clients.here(), 2, "outside a runtime: one of its own");
        assert_eq!(MADE.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn past_the_bound_runtimes_share_the_first_client() {
        let made = Arc::new(AtomicUsize::new(0));
        let count = made.clone();
        let clients = ByRuntime::new(move || count.fetch_add(1, Ordering::SeqCst));
        let first = clients.here();
        for _ in 0..RUNTIMES_MAX + 5 {
            let rt = current_thread();
            rt.block_on(async { clients.here() });
        }
        assert_eq!(clients.len(), RUNTIMES_MAX);
        assert_eq!(made.load(Ordering::SeqCst), RUNTIMES_MAX);
        let rt = current_thread();
        assert_eq!(rt.block_on(async { clients.here() }), first);
    }
}
