//! One shard of the embedded store, and the count of what every shard holds.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::time::Instant;

use super::records::{Due, Hashed, Records};
use super::{Record, RECORD_OVERHEAD};

/// What the records of every shard hold.
#[derive(Default)]
pub(super) struct Usage {
    pub(super) records: AtomicUsize,
    pub(super) bytes: AtomicUsize,
}

impl Usage {
    pub(super) fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The bytes a record is counted as.
pub(super) fn footprint(key: &str, r: &Record) -> usize {
    RECORD_OVERHEAD + key.len() + r.response.as_ref().map_or(0, Bytes::len)
}

#[derive(Default)]
pub(super) struct Shard {
    pub(super) records: Records,
    /// When this shard's records expire, earliest first, by key hash. Each record has one
    /// current entry: a write that brings its expiry forward (a completion's window ending
    /// before the claim's) queues it anew, and one that puts it back (a renewal, a
    /// reclaim) leaves the entry, which queues it again when it comes up. An entry
    /// overtaken so, or whose record is gone, is passed over: expiring costs what has come
    /// due, never a walk of the shard, and the queue holds at most about two entries a record.
    expiries: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Shard {
    /// Notes that the record at `at` now expires at `when`.
    pub(super) fn expires(&mut self, at: Hashed<'_>, when: Instant) {
        if self.records.queue(at, when) {
            self.expiries.push(Reverse((when, at.hash())));
        }
    }

    /// Whether an expiry has come due (the record may have lived on since).
    pub(super) fn due(&self, now: Instant) -> bool {
        self.expiries.peek().is_some_and(|e| e.0 .0 <= now)
    }

    /// Drops the records whose expiry has passed, looking at most at `budget` of the
    /// expiries that have come due (the rest wait for the next call).
    pub(super) fn expire(&mut self, now: Instant, live: &Usage, budget: usize) {
        let (mut freed, mut dropped) = (0, 0);
        for _ in 0..budget {
            let Some(top) = self.expiries.peek_mut().filter(|e| e.0 .0 <= now) else {
                break;
            };
            let Reverse((when, hash)) = PeekMut::pop(top);
            match self.records.come_due(hash, when, now) {
                Due::Stale => {}
                Due::Removed(bytes) => {
                    freed += bytes;
                    dropped += 1;
                }
                Due::Requeued(at) => self.expiries.push(Reverse((at, hash))),
            }
        }
        live.records.fetch_sub(dropped, Ordering::Relaxed);
        live.sub(freed);
    }

    /// The expiries noted and not yet come up (at least one per record).
    #[cfg(test)]
    pub(super) fn pending(&self) -> usize {
        self.expiries.len()
    }
}
