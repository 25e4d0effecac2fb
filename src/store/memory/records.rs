//! A shard's records by key, each key's hash kept beside it: a key is hashed once per
//! operation (that one hash picks its shard and finds it in the shard's table), and a table
//! that grows moves its entries without hashing every key again. (A map from the standard
//! library hashes each key twice for a claim that inserts, once more to find it at
//! completion, and every key again at each doubling: on a store that fills with new keys,
//! a fifth of a claim's time.)
//!
//! The hash is the standard library's SipHash-1-3 under this process's random key, as its
//! own maps use: which keys collide cannot be worked out from outside.

use std::hash::BuildHasher;
use std::sync::OnceLock;

use hashbrown::HashTable;

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

    /// Keeps the records `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str, &Record) -> bool) {
        self.0.retain(|s| keep(&s.key, &s.record));
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Record)> {
        self.0.iter().map(|s| (&*s.key, &s.record))
    }
}
