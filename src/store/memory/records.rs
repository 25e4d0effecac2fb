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
        };
        self.0.insert_unique(at.hash, slot, |s| s.hash);
    }

    pub(super) fn remove(&mut self, at: Hashed<'_>) -> Option<Record> {
        let found = self.0.find_entry(at.hash, |s| *s.key == *at.key).ok()?;
        Some(found.remove().0.record)
    }

    /// Removes a record under `hash` whose expiry has passed, and tells the bytes it was
    /// counted as. Two keys of one shard sharing all 64 bits of a keyed hash are not
    /// expected; were they, removing either expired record would still be right.
    pub(super) fn remove_expired(&mut self, hash: u64, now: Instant) -> Option<usize> {
        let found = self
            .0
            .find_entry(hash, |s| s.hash == hash && s.record.expires_at <= now)
            .ok()?;
        let (slot, _) = found.remove();
        Some(footprint(&slot.key, &slot.record))
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
