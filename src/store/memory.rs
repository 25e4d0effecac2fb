//! The embedded store: records in sharded maps behind short critical sections.
//! Protects one gateway process; several replicas need Redis.

use std::collections::hash_map::{DefaultHasher, Entry as MapEntry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Claim, ClaimRequest, RecordInfo, RecordState, StoreError};

const SHARDS: usize = 32;
/// A shard sweeps out expired records once it has grown past this many since its last sweep.
const MIN_SWEEP: usize = 256;

#[derive(Debug)]
struct Record {
    state: RecordState,
    fence: u64,
    request_hash: [u8; 32],
    lease_until: Instant,
    expires_at: Instant,
    claimant: u128,
    response: Option<Bytes>,
}

#[derive(Default)]
struct Shard {
    records: HashMap<String, Record>,
    sweep_at: usize,
}

impl Shard {
    /// Amortised expiry: a shard sweeps when it has doubled since its last sweep, so
    /// unique keys cannot grow memory past twice the live records.
    fn maybe_sweep(&mut self, now: Instant, live: &AtomicUsize) {
        if self.records.len() < self.sweep_at.max(MIN_SWEEP) {
            return;
        }
        let _ = self.sweep(now, live);
    }

    /// Drops expired records; returns the earliest expiry of those kept.
    fn sweep(&mut self, now: Instant, live: &AtomicUsize) -> Option<Instant> {
        let before = self.records.len();
        let mut earliest: Option<Instant> = None;
        self.records.retain(|_, r| {
            let keep = r.expires_at > now;
            if keep {
                earliest = Some(earliest.map_or(r.expires_at, |e| e.min(r.expires_at)));
            }
            keep
        });
        live.fetch_sub(before - self.records.len(), Ordering::Relaxed);
        self.sweep_at = self.records.len() * 2;
        earliest
    }
}

/// The next fence after `previous`: `max(previous + 1, wall clock in microseconds)`, as in
/// the Redis scripts, so fences keep growing across a record's expiry or deletion.
fn next_fence(previous: u64) -> u64 {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    (previous + 1).max(now_us)
}

/// In-process store with the same contract as the Redis backends.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Vec<Mutex<Shard>>,
    len: AtomicUsize,
    max_records: usize,
    started: Instant,
    /// Lower bound of the earliest `expires_at` held, in ms since `started`.
    next_expiry_ms: AtomicU64,
}

impl MemoryStore {
    /// A store that refuses new claims (as a store error) past `max_records` live records.
    pub fn new(max_records: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                len: AtomicUsize::new(0),
                max_records,
                started: Instant::now(),
                next_expiry_ms: AtomicU64::new(u64::MAX),
            }),
        }
    }

    /// Records held, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Relaxed)
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.inner.started).as_millis() as u64
    }

    fn next_expiry(&self) -> u64 {
        self.inner.next_expiry_ms.load(Ordering::Relaxed)
    }

    /// Records that some record now expires at `at`.
    fn note_expiry(&self, at: Instant) {
        self.inner
            .next_expiry_ms
            .fetch_min(self.ms(at), Ordering::Relaxed);
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        let i = (h.finish() as usize) % SHARDS;
        // A panic while holding a shard lock cannot leave a record half-written (every
        // critical section assigns whole fields), so a poisoned lock is still usable.
        self.inner.shards[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        if self.len() >= self.inner.max_records && self.ms(Instant::now()) >= self.next_expiry() {
            // Full, and some record is due to expire: sweep before refusing. Only then, so
            // a flood of unique keys cannot make every claim walk the whole store.
            self.sweep();
        }
        let now = Instant::now();
        let mut shard = self.shard(req.key);
        shard.maybe_sweep(now, &self.inner.len);
        let lease_until = now + req.lease;
        let expires_at = now + req.lease + req.window;
        self.note_expiry(expires_at);
        match shard.records.entry(req.key.to_owned()) {
            MapEntry::Occupied(mut e) if e.get().expires_at > now => {
                let r = e.get_mut();
                if r.state == RecordState::Released {
                    *r = Record {
                        state: RecordState::InFlight,
                        fence: next_fence(r.fence),
                        request_hash: *req.request_hash,
                        lease_until,
                        expires_at,
                        claimant: req.claimant,
                        response: None,
                    };
                    return Ok(Claim::Won {
                        fence: r.fence,
                        takeover: false,
                    });
                }
                if r.request_hash != *req.request_hash {
                    return Ok(Claim::Mismatch);
                }
                if r.state == RecordState::Completed {
                    return Ok(Claim::Replay(r.response.clone().unwrap_or_default()));
                }
                if r.claimant == req.claimant {
                    return Ok(Claim::Won {
                        fence: r.fence,
                        takeover: false,
                    });
                }
                if now < r.lease_until {
                    return Ok(Claim::Conflict {
                        retry_after: r.lease_until - now,
                    });
                }
                r.fence = next_fence(r.fence);
                r.claimant = req.claimant;
                r.lease_until = lease_until;
                r.expires_at = expires_at;
                Ok(Claim::Won {
                    fence: r.fence,
                    takeover: true,
                })
            }
            MapEntry::Occupied(mut e) => {
                // Expired but not yet swept: the key is new again.
                let fence = next_fence(e.get().fence);
                e.insert(Record {
                    state: RecordState::InFlight,
                    fence,
                    request_hash: *req.request_hash,
                    lease_until,
                    expires_at,
                    claimant: req.claimant,
                    response: None,
                });
                Ok(Claim::Won {
                    fence,
                    takeover: false,
                })
            }
            MapEntry::Vacant(e) => {
                if self.inner.len.load(Ordering::Relaxed) >= self.inner.max_records {
                    return Err(StoreError::Full(self.inner.max_records));
                }
                self.inner.len.fetch_add(1, Ordering::Relaxed);
                let fence = next_fence(0);
                e.insert(Record {
                    state: RecordState::InFlight,
                    fence,
                    request_hash: *req.request_hash,
                    lease_until,
                    expires_at,
                    claimant: req.claimant,
                    response: None,
                });
                Ok(Claim::Won {
                    fence,
                    takeover: false,
                })
            }
        }
    }

    /// Moves the live in-flight record owned by `fence` to `to`, applying `f`. Finishing
    /// twice under the same fence is idempotent (true, nothing rewritten), as in Redis.
    fn finish(
        &self,
        key: &str,
        fence: u64,
        to: RecordState,
        f: impl FnOnce(&mut Record, Instant),
    ) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.records.get_mut(key) {
            Some(r) if r.expires_at > now && r.fence == fence => {
                if r.state == RecordState::InFlight {
                    r.state = to;
                    f(r, now);
                    true
                } else {
                    r.state == to
                }
            }
            _ => false,
        }
    }

    pub(super) async fn complete(
        &self,
        key: &str,
        fence: u64,
        record: Bytes,
        window: Duration,
    ) -> Result<bool, StoreError> {
        let done = self.finish(key, fence, RecordState::Completed, |r, now| {
            r.response = Some(record);
            r.expires_at = now + window;
        });
        self.note_expiry(Instant::now() + window);
        Ok(done)
    }

    pub(super) async fn release(
        &self,
        key: &str,
        fence: u64,
        window: Duration,
    ) -> Result<bool, StoreError> {
        let done = self.finish(key, fence, RecordState::Released, |r, now| {
            r.expires_at = now + window;
        });
        self.note_expiry(Instant::now() + window);
        Ok(done)
    }

    pub(super) async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let now = Instant::now();
        let shard = self.shard(key);
        Ok(shard
            .records
            .get(key)
            .filter(|r| r.expires_at > now)
            .map(|r| RecordInfo {
                state: r.state,
                fence: r.fence,
                lease_left: (r.state == RecordState::InFlight)
                    .then(|| r.lease_until.saturating_duration_since(now)),
                expires_in: Some(r.expires_at - now),
                response: r.response.clone(),
            }))
    }

    pub(super) async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.records.remove(key) {
            Some(r) => {
                self.inner.len.fetch_sub(1, Ordering::Relaxed);
                Ok(r.expires_at > now)
            }
            None => Ok(false),
        }
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Sweeps every shard now (a full store does this when a record is due to expire;
    /// otherwise requests sweep shard by shard as they go).
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut earliest = u64::MAX;
        for shard in &self.inner.shards {
            let kept = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .sweep(now, &self.inner.len);
            if let Some(at) = kept {
                earliest = earliest.min(self.ms(at));
            }
        }
        // A claim landing during the sweep may have its lower bound overwritten here; at
        // worst a full store then refuses claims a little longer than it had to.
        self.inner.next_expiry_ms.store(earliest, Ordering::Relaxed);
    }
}
