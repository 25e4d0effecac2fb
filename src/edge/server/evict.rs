//! The admin port's slots under a flood of silent connections: health and readiness probes
//! must still be answered. When every admin slot is taken, the oldest connection that has
//! not begun a request is closed to make room for the new one; a connection serving a
//! request (a probe, a key operation) is never closed for another.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::greeting::FirstRequest;

/// The connections of one listener that may be closed to make room, oldest first.
#[derive(Clone, Default)]
pub(super) struct Evictable {
    inner: Arc<EvictableState>,
}

#[derive(Default)]
struct EvictableState {
    next: AtomicU64,
    /// By accept order: each connection's first request and its close signal.
    conns: Mutex<BTreeMap<u64, (FirstRequest, CancellationToken)>>,
}

impl Evictable {
    /// Registers a new connection; it leaves the register when the returned entry drops.
    pub(super) fn register(&self) -> Entry {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let first = FirstRequest::default();
        let evicted = CancellationToken::new();
        self.lock().insert(id, (first.clone(), evicted.clone()));
        Entry {
            id,
            first,
            evicted,
            register: self.clone(),
        }
    }

    /// Closes the oldest connection that has not begun a request; false when there is none.
    pub(super) fn evict_oldest(&self) -> bool {
        let mut conns = self.lock();
        let oldest = conns
            .iter()
            .find(|(_, (first, _))| !first.begun())
            .map(|(&id, _)| id);
        match oldest.and_then(|id| conns.remove(&id)) {
            Some((_, evicted)) => {
                evicted.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (FirstRequest, CancellationToken)>> {
        self.inner.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One registered connection: its first request (marked by the connection) and the signal
/// that it was chosen to make room.
pub(super) struct Entry {
    id: u64,
    pub(super) first: FirstRequest,
    pub(super) evicted: CancellationToken,
    register: Evictable,
}

impl Entry {
    /// Resolves when this connection is closed to make room before its first request.
    pub(super) async fn closed_for_room(&self) {
        self.evicted.cancelled().await;
        if self.first.begun() {
            // Chosen just as its first request began: that request is served.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.register.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_connection_without_a_request_is_evicted_first() {
        let reg = Evictable::default();
        let a = reg.register();
        let b = reg.register();
        let c = reg.register();
        a.first.mark();
        assert!(reg.evict_oldest());
        assert!(
            !a.evicted.is_cancelled(),
            "a connection serving requests stays"
        );
        assert!(b.evicted.is_cancelled());
        assert!(!c.evicted.is_cancelled());
        drop(c);
        assert!(!reg.evict_oldest(), "nothing left to evict");
    }
}
