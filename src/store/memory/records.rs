//! A shard's records by key, each key's hash kept beside it: a key is hashed once per
//! operation (that one hash picks its shard and finds it in the shard's table), and a table
//! that grows moves its entries without hashing every key again. (A map from the standard
//! library hashes each key twice for a claim that inserts, once more to find it at
//! completion, and every key again at each doubling: on a store that fills with new keys,
//! most of a claim's time in one profile; docs/benchmarks.md, run 18.)
//!
//! The hash is the standard library's SipHash-1-3 under a random key drawn once per process
//! (its own maps draw one per map): which keys collide cannot be worked out from outside.

use std::hash::BuildHasher;
use std::sync::OnceLock;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::shard::footprint;
use super::{Record, SHARDS};

/// A key and its hash, computed once for an operation.
#[derive(Clone, Copy)]
pub(super) struct Hashed<'a> {
    key: &'a str,
    hash: u64,
}

impl<'a> Hashed<'a> {
    pub(super) fn new(key: &'a str) -> Self {
        static STATE: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        let hash = STATE.get_or_init(Default::default).hash_one(key);
        Self { key, hash }
    }

    /// The shard the key's record lives in. Bits the shard's table does not look at: it
    /// takes a bucket from the low bits (as many as it has buckets) and a tag from the top
    /// seven, so every shard's keys still spread over its whole table.
    pub(super) fn shard(&self) -> usize {
        (self.hash >> 32) as usize % SHARDS
    }

    pub(super) fn hash(&self) -> u64 {
        self.hash
    }
}

struct Slot {
    hash: u64,
    key: Box<str>,
    record: Record,
    /// The time of this record's one current entry in the shard's expiry queue.
    queued: Option<Instant>,
}

/// What became of a record whose entry in the expiry queue came up.
pub(super) enum Due {
    /// Not the record's current entry (one queued earlier since, or the record is gone).
    Stale,
    /// Expired and removed: the bytes it was counted as.
    Removed(usize),
    /// It lives on: queued again for when it now expires.
    Requeued(Instant),
}

/// One shard's records.
#[derive(Default)]
pub(super) struct Records(HashTable<Slot>);

impl Records {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn get(&self, at: Hashed<'_>) -> Option<&Record> {
        self.0
            .find(at.hash, |s| *s.key == *at.key)
            .map(|s| &s.record)
    }

    pub(super) fn get_mut(&mut self, at: Hashed<'_>) -> Option<&mut Record> {
        self.0
            .find_mut(at.hash, |s| *s.key == *at.key)
            .map(|s| &mut s.record)
    }

    /// Adds the record of a key the shard does not hold (the caller looked first).
    pub(super) fn insert_new(&mut self, at: Hashed<'_>, record: Record) {
        let slot = Slot {
            hash: at.hash,
            key: at.key.into(),
            record,
            queued: None,
        };
        self.0.insert_unique(at.hash, slot, |s| s.hash);
    }

    pub(super) fn remove(&mut self, at: Hashed<'_>) -> Option<Record> {
        let found = self.0.find_entry(at.hash, |s| *s.key == *at.key).ok()?;
        Some(found.remove().0.record)
    }

    /// Whether the record at `at` must be queued for `when`: it has no entry in the
    /// expiry queue yet, or only a later one. A record that now expires later keeps its
    /// entry, and is queued again when that comes up: each record has one current entry.
    pub(super) fn queue(&mut self, at: Hashed<'_>, when: Instant) -> bool {
        let Some(slot) = self.0.find_mut(at.hash, |s| *s.key == *at.key) else {
            return false;
        };
        if slot.queued.is_some_and(|q| q <= when) {
            return false;
        }
        slot.queued = Some(when);
        true
    }

    /// The expiry queue's entry (`when`, `hash`) came up at `now`. Two keys of one shard
    /// sharing all 64 bits of a keyed hash and a queued time are not expected; were they,
    /// each is still removed only once expired.
    pub(super) fn come_due(&mut self, hash: u64, when: Instant, now: Instant) -> Due {
        let Ok(found) = self
            .0
            .find_entry(hash, |s| s.hash == hash && s.queued == Some(when))
        else {
            return Due::Stale;
        };
        if found.get().record.expires_at <= now {
            let (slot, _) = found.remove();
            return Due::Removed(footprint(&slot.key, &slot.record));
        }
        let slot = found.into_mut();
        slot.queued = Some(slot.record.expires_at);
        Due::Requeued(slot.record.expires_at)
    }

    /// Keeps the records `keep` says yes to.
    #[cfg(test)]
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str, &Record) -> bool) {
        self.0.retain(|s| keep(&s.key, &s.record));
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Record)> {
        self.0.iter().map(|s| (&*s.key, &s.record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClaimRequest, Claimant, RequestHash, StoreKey};
    use std::collections::HashMap;
    use std::time::Duration;
    use tokio::time::Instant;

    fn record(fence: u64) -> Record {
        let key = StoreKey::from_raw("k");
        let hash = RequestHash::new([1; 32]);
        let req = ClaimRequest {
            key: &key,
            request_hash: &hash,
            lease: Duration::from_secs(1),
            window: Duration::from_secs(60),
            claimant: Claimant::new(7),
            hold: false,
            order: None,
        };
        super::super::claim::Attempt::new(req, Instant::now()).fresh(fence, 1)
    }

    /// The overhead counted per record covers what the tables spend on one: its slot at
    /// the table's fullest (7 of 8 buckets), a control byte, two entries of the expiry
    /// queue and the rounding of the key's allocation.
    #[test]
    fn the_counted_overhead_covers_a_records_slot_and_expiries() {
        let slot = std::mem::size_of::<Slot>() * 8 / 7 + 1;
        let expiries = 2 * std::mem::size_of::<std::cmp::Reverse<(Instant, u64)>>();
        let spent = slot + expiries + 16;
        assert!(
            super::super::RECORD_OVERHEAD >= spent,
            "RECORD_OVERHEAD {} < {spent} bytes a record takes",
            super::super::RECORD_OVERHEAD
        );
    }

    /// Through many doublings, removals and a retain, the table holds what a standard map
    /// given the same operations holds, every key found under its own record.
    #[test]
    fn the_table_agrees_with_a_map_through_growth_removal_and_retain() {
        let mut table = Records::default();
        let mut model: HashMap<String, u64> = HashMap::new();
        let key = |i: u64| format!("dedupe:{{0a1b2c3d4e5f}}:payments:-:order-{i}");
        for i in 0..20_000u64 {
            let k = key(i);
            assert!(table.get(Hashed::new(&k)).is_none());
            table.insert_new(Hashed::new(&k), record(i));
            model.insert(k, i);
        }
        for i in (0..20_000u64).step_by(3) {
            let k = key(i);
            assert_eq!(table.remove(Hashed::new(&k)).map(|r| r.fence), Some(i));
            assert!(table.remove(Hashed::new(&k)).is_none());
            model.remove(&k);
        }
        if let Some(r) = table.get_mut(Hashed::new(&key(1))) {
            r.fence = 1_000_001;
        }
        model.insert(key(1), 1_000_001);
        table.retain(|_, r| r.fence % 2 == 1);
        model.retain(|_, f| *f % 2 == 1);
        assert_eq!(table.len(), model.len());
        for (k, r) in table.iter() {
            assert_eq!(model.get(k), Some(&r.fence), "{k}");
        }
        for (k, f) in &model {
            assert_eq!(table.get(Hashed::new(k)).map(|r| r.fence), Some(*f));
        }
    }
}
