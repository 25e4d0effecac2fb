//! One shard of the embedded store, and the count of what every shard holds.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::time::Instant;

use super::records::Records;
use super::{Record, MIN_SWEEP, RECORD_OVERHEAD};

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
    sweep_at: usize,
    /// A lower bound of the earliest `expires_at` in this shard (exact after a sweep).
    earliest: Option<Instant>,
}

impl Shard {
    /// Notes that a record of this shard now expires at `at`.
    pub(super) fn expires(&mut self, at: Instant) {
        self.earliest = Some(self.earliest.map_or(at, |e| e.min(at)));
    }

    /// Whether a sweep could free anything now.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.earliest.is_some_and(|e| e <= now)
    }

    /// Amortised expiry: a shard sweeps when it has doubled since its last sweep.
    pub(super) fn maybe_sweep(&mut self, now: Instant, live: &Usage) {
        if self.records.len() >= self.sweep_at.max(MIN_SWEEP) {
            self.sweep(now, live);
        }
    }

    /// Drops expired records and recomputes the earliest expiry.
    pub(super) fn sweep(&mut self, now: Instant, live: &Usage) {
        let before = self.records.len();
        let mut earliest: Option<Instant> = None;
        let mut freed = 0;
        self.records.retain(|k, r| {
            let keep = r.expires_at > now;
            if keep {
                earliest = Some(earliest.map_or(r.expires_at, |e| e.min(r.expires_at)));
            } else {
                freed += footprint(k, r);
            }
            keep
        });
        live.records
            .fetch_sub(before - self.records.len(), Ordering::Relaxed);
        live.sub(freed);
        self.sweep_at = self.records.len() * 2;
        self.earliest = earliest;
    }
}
