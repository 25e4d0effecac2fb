//! A bounded local copy of completed records, so a replay on Redis needs no round trip.
//!
//! A completed record never changes until it expires or an operator deletes it, so a copy
//! is good until then, provided this process hears of every change. Redis tells it:
//! server-assisted client-side caching (`CLIENT TRACKING`) sends an invalidation for a key
//! once another client changes it (a delete, a resolve, an expiry, a reclaim). On one
//! server the claim connection itself is tracked (it reports the keys it read); on a
//! cluster one connection per master in BCAST mode reports every write under the store's
//! prefix. The cache is pure: the Redis backends feed it the invalidations, the
//! channel's fate and its proofs; the claim path that marks, inserts and drops copies is
//! the same for both.
//!
//! What keeps it sound:
//!
//! - **Race with an invalidation.** An invalidation can be applied before the claim whose
//!   reply it follows has inserted its copy. Every invalidation takes a sequence number;
//!   a claim notes the number before it is sent ([`NearCache::mark`]) and its copy is kept
//!   only if no invalidation of that key (and no flush) came since. The last
//!   [`RECENT_INVALIDATIONS`] are remembered; past that, an insert older than the oldest
//!   one remembered is refused.
//! - **A lost channel.** A flush (connection closed, replaced, or found silent) empties the
//!   cache and refuses every insert marked before it.
//! - **A silent channel.** The cache serves only while the connection has lately proved it
//!   delivers: a `PING` answered on it proves every invalidation sent before the `PING`
//!   ran was applied (one connection, replies and pushes in order). A proof lasts
//!   [`PROOF_LASTS`]; without a fresh one, every lookup misses and goes to Redis.
//! - **The window.** Every copy carries its record's expiry (the `PTTL` the claim saw,
//!   counted from before the claim was sent), and is never served past it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::tokens::RequestHash;

/// How many recent invalidations are remembered to judge racing inserts.
pub const RECENT_INVALIDATIONS: usize = 4096;
/// How long a proof that the invalidation channel delivers lets the cache serve: the
/// bound on how stale a copy can be when the channel goes silent without closing.
pub const PROOF_LASTS: Duration = Duration::from_secs(1);
/// Bytes counted per entry beyond its key and record (map slot, queue slot, hash).
pub const ENTRY_OVERHEAD: u64 = 128;

/// A point in the invalidation sequence, taken before a claim is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark(u64);

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NearCacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that went to Redis.
    pub misses: u64,
    /// Entries dropped by invalidations and flushes.
    pub invalidations: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Whether the channel has proved it delivers lately enough for copies to be served
    /// now: false while it is silent, lost, or not yet subscribed.
    pub serving: bool,
}

struct Entry {
    record: Bytes,
    hash: RequestHash,
    expires: Instant,
    /// Which insert made it: the eviction queue may still name a replaced entry.
    id: u64,
    size: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Insertion order, for eviction (oldest first); stale slots are skipped.
    order: VecDeque<(String, u64)>,
    bytes: u64,
    next_id: u64,
    seq: u64,
    recent: VecDeque<(u64, String)>,
    /// The newest sequence number no longer in `recent`.
    forgotten_upto: u64,
    flushed_at: u64,
    proven_until: Option<Instant>,
}

/// The cache: a byte budget of completed records, by store key.
pub struct NearCache {
    budget: u64,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    invalidations: AtomicU64,
}

impl NearCache {
    /// An empty cache holding at most `budget` bytes. It serves nothing until proved.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock may have left an invalidation half-applied: the
        // cache is flushed (emptied, inserts marked before refused, no serving until a
        // new proof) and the poison cleared, so it recovers rather than staying empty.
        self.inner.lock().unwrap_or_else(|poisoned| {
            let mut inner = poisoned.into_inner();
            self.inner.clear_poison();
            let dropped = inner.map.len() as u64;
            inner.flush();
            self.invalidations.fetch_add(dropped, Ordering::Relaxed);
            inner
        })
    }

    /// The copy of `key`'s completed record, if one is held, was made for the same
    /// request, is within its window, and the channel has lately proved it delivers.
    pub fn get(&self, key: &str, hash: &RequestHash, now: Instant) -> Option<Bytes> {
        let found = {
            let mut inner = self.lock();
            if inner.proven_until.is_some_and(|until| now < until) {
                match inner.map.get(key) {
                    Some(e) if now >= e.expires => {
                        inner.remove(key);
                        None
                    }
                    Some(e) if &e.hash == hash => Some(e.record.clone()),
                    _ => None,
                }
            } else {
                None
            }
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The point to judge a later [`NearCache::insert`] against: take it before sending.
    pub fn mark(&self) -> Mark {
        Mark(self.lock().seq)
    }

    /// Keeps a copy of a completed record a claim marked at `mark` saw, expiring at
    /// `expires`; refused when an invalidation of the key or a flush came since `mark`.
    pub fn insert(
        &self,
        key: &str,
        hash: RequestHash,
        record: Bytes,
        expires: Instant,
        mark: Mark,
    ) -> bool {
        let size = key.len() as u64 + record.len() as u64 + ENTRY_OVERHEAD;
        if size > self.budget / 4 {
            return false; // one record may not crowd out the rest
        }
        let mut inner = self.lock();
        let Mark(at) = mark;
        if inner.flushed_at > at
            || inner.forgotten_upto > at
            // Newest first, stopping at the mark: with BCAST tracking on a cluster every
            // write brings an invalidation, so the queue is usually full.
            || inner
                .recent
                .iter()
                .rev()
                .take_while(|(s, _)| *s > at)
                .any(|(_, k)| k == key)
        {
            return false;
        }
        inner.remove(key);
        while inner.bytes + size > self.budget {
            let Some((old, id)) = inner.order.pop_front() else {
                break;
            };
            if inner.map.get(&old).is_some_and(|e| e.id == id) {
                inner.remove(&old);
            }
        }
        inner.next_id += 1;
        let id = inner.next_id;
        inner.order.push_back((key.to_owned(), id));
        // Invalidated, expired and replaced entries leave their slot in the queue, which
        // eviction alone never drains while the bytes stay under budget: compacted once
        // it is twice the entries, so it stays within the budget's reach (amortised O(1)).
        if inner.order.len() > 2 * inner.map.len() + 64 {
            let Inner { order, map, .. } = &mut *inner;
            order.retain(|(k, id)| map.get(k).is_some_and(|e| e.id == *id));
        }
        inner.bytes += size;
        inner.map.insert(
            key.to_owned(),
            Entry {
                record,
                hash,
                expires,
                id,
                size,
            },
        );
        true
    }

    /// Redis reports `key` changed: drop its copy, and refuse copies made before now.
    pub fn invalidate(&self, key: &str) {
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        if inner.remove(key) {
            self.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        inner.recent.push_back((seq, key.to_owned()));
        if inner.recent.len() > RECENT_INVALIDATIONS {
            if let Some((s, _)) = inner.recent.pop_front() {
                inner.forgotten_upto = s;
            }
        }
    }

    /// The channel is gone or cannot be trusted: drop everything, refuse copies made
    /// before now, and serve nothing until proved again.
    pub fn flush(&self) {
        let mut inner = self.lock();
        let dropped = inner.map.len() as u64;
        inner.flush();
        self.invalidations.fetch_add(dropped, Ordering::Relaxed);
    }

    /// A `PING` marked at `mark` was answered on the tracking connection: the cache may
    /// serve until `until`, unless a flush came since the mark.
    pub fn prove(&self, mark: Mark, until: Instant) {
        let mut inner = self.lock();
        if inner.flushed_at <= mark.0 {
            inner.proven_until = Some(inner.proven_until.map_or(until, |u| u.max(until)));
        }
    }

    /// Counters, bytes held, and whether copies may be served at `now`, for metrics.
    pub fn stats(&self, now: Instant) -> NearCacheStats {
        let (bytes, serving) = {
            let inner = self.lock();
            (
                inner.bytes,
                inner.proven_until.is_some_and(|until| now < until),
            )
        };
        NearCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            bytes,
            serving,
        }
    }
}

impl Inner {
    fn remove(&mut self, key: &str) -> bool {
        match self.map.remove(key) {
            Some(e) => {
                self.bytes -= e.size;
                true
            }
            None => false,
        }
    }

    /// Empties the cache, refuses inserts marked before now, serves nothing until proved.
    fn flush(&mut self) {
        self.map.clear();
        self.order.clear();
        self.bytes = 0;
        self.proven_until = None;
        self.seq += 1;
        self.flushed_at = self.seq;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(b: u8) -> RequestHash {
        RequestHash::new([b; 32])
    }

    fn proved(budget: u64) -> (NearCache, Instant) {
        let c = NearCache::new(budget);
        let now = Instant::now();
        c.prove(c.mark(), now + Duration::from_secs(60));
        (c, now)
    }

    fn rec(n: usize) -> Bytes {
        Bytes::from(vec![7u8; n])
    }

    #[test]
    fn serves_the_same_request_within_its_window_only() {
        let (c, now) = proved(1 << 20);
        let m = c.mark();
        assert!(c.insert("k", hash(1), rec(10), now + Duration::from_secs(5), m));
        assert_eq!(c.get("k", &hash(1), now), Some(rec(10)));
        assert_eq!(c.get("k", &hash(2), now), None, "a mismatch goes to Redis");
        assert_eq!(c.get("k", &hash(1), now + Duration::from_secs(5)), None);
        assert_eq!(c.stats(now).bytes, 0, "the expired copy is dropped");
        assert_eq!(c.stats(now).hits, 1);
        assert_eq!(c.stats(now).misses, 2);
    }

    #[test]
    fn an_invalidation_drops_the_copy_and_refuses_a_racing_insert() {
        let (c, now) = proved(1 << 20);
        let later = now + Duration::from_secs(5);
        let m = c.mark();
        assert!(c.insert("k", hash(1), rec(10), later, m));
        c.invalidate("k");
        assert_eq!(c.get("k", &hash(1), now), None);
        assert_eq!(c.stats(now).invalidations, 1);
        // A claim sent before an invalidation of its key, answered after it.
        let m = c.mark();
        c.invalidate("k");
        assert!(!c.insert("k", hash(1), rec(10), later, m));
        // Another key's invalidation does not refuse it.
        let m = c.mark();
        c.invalidate("other");
        assert!(c.insert("k", hash(1), rec(10), later, m));
    }

    #[test]
    fn too_many_invalidations_since_the_mark_refuse_the_insert() {
        let (c, now) = proved(1 << 20);
        let m = c.mark();
        for i in 0..=RECENT_INVALIDATIONS {
            c.invalidate(&format!("x{i}"));
        }
        assert!(!c.insert("k", hash(1), rec(1), now + Duration::from_secs(5), m));
    }

    #[test]
    fn stats_say_whether_copies_are_served() {
        let c = NearCache::new(1 << 20);
        let now = Instant::now();
        assert!(!c.stats(now).serving, "not proved yet");
        c.prove(c.mark(), now + PROOF_LASTS);
        assert!(c.stats(now).serving);
        assert!(
            !c.stats(now + PROOF_LASTS).serving,
            "the proof ran out: silent"
        );
        c.prove(c.mark(), now + PROOF_LASTS);
        c.flush();
        assert!(!c.stats(now).serving, "a flush needs a new proof");
    }

    #[test]
    fn a_flush_empties_refuses_older_inserts_and_needs_a_new_proof() {
        let (c, now) = proved(1 << 20);
        let later = now + Duration::from_secs(5);
        let before = c.mark();
        assert!(c.insert("a", hash(1), rec(10), later, before));
        c.flush();
        assert_eq!(c.stats(now).bytes, 0);
        assert!(!c.insert("b", hash(1), rec(10), later, before));
        let m = c.mark();
        assert!(c.insert("b", hash(1), rec(10), later, m));
        assert_eq!(c.get("b", &hash(1), now), None, "no proof since the flush");
        // A proof marked before the flush does not count.
        c.prove(before, later);
        assert_eq!(c.get("b", &hash(1), now), None);
        c.prove(c.mark(), later);
        assert_eq!(c.get("b", &hash(1), now), Some(rec(10)));
        assert_eq!(c.get("b", &hash(1), later), None, "the proof ran out");
    }

    #[test]
    fn the_byte_budget_evicts_the_oldest() {
        let size = 1 + 100 + ENTRY_OVERHEAD;
        let (c, now) = proved(size * 4);
        let later = now + Duration::from_secs(5);
        for k in ["a", "b", "c", "d", "e"] {
            assert!(c.insert(k, hash(1), rec(100), later, c.mark()));
        }
        assert_eq!(c.stats(now).bytes, size * 4);
        assert_eq!(c.get("a", &hash(1), now), None);
        assert!(c.get("e", &hash(1), now).is_some());
        // Replacing a key counts it once.
        assert!(c.insert("e", hash(1), rec(100), later, c.mark()));
        assert_eq!(c.stats(now).bytes, size * 4);
        assert!(!c.insert("big", hash(1), rec(size as usize * 2), later, c.mark()));
    }

    #[test]
    fn invalidated_entries_leave_no_slots_behind() {
        let (c, now) = proved(1 << 20);
        let later = now + Duration::from_secs(5);
        for i in 0..10_000 {
            let k = format!("k{}", i % 3);
            assert!(c.insert(&k, hash(1), rec(10), later, c.mark()));
            c.invalidate(&k);
        }
        assert_eq!(c.stats(now).bytes, 0);
        let queued = c.lock().order.len();
        assert!(queued <= 64 + 1, "{queued} slots queued for no entries");
    }

    #[test]
    fn a_poisoned_lock_flushes_and_recovers() {
        let (c, now) = proved(1 << 20);
        let later = now + Duration::from_secs(5);
        let before = c.mark();
        assert!(c.insert("a", hash(1), rec(10), later, before));
        let poison = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = c.inner.lock().unwrap();
            panic!("a panic while the cache is locked");
        }));
        assert!(poison.is_err() && c.inner.is_poisoned());
        assert_eq!(c.get("a", &hash(1), now), None, "emptied");
        assert!(!c.inner.is_poisoned());
        assert_eq!(c.stats(now).bytes, 0);
        assert!(!c.insert("b", hash(1), rec(10), later, before));
        assert!(c.insert("b", hash(1), rec(10), later, c.mark()));
        assert_eq!(c.get("b", &hash(1), now), None, "no proof since the flush");
        c.prove(c.mark(), later);
        assert_eq!(c.get("b", &hash(1), now), Some(rec(10)), "serves again");
    }
}
