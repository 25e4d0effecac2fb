//! The values a claim is made of, as types that cannot be swapped for one another or for
//! plain strings and numbers: the store key, the fencing token, the request hash and the
//! claimant id.

use std::fmt;

/// The namespaced key of one record in the store (`prefix:{tag}:route:scope:key`).
///
/// Spelled in one place (`key::compose`, behind [`crate::protocol::key::store_key`] and
/// [`crate::protocol::key::order`]'s record and entity keys): a key built any other way would miss
/// the namespace and the cluster hash tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreKey(String);

impl StoreKey {
    /// Wraps an already namespaced key, exactly as the store holds it (the store
    /// contract suite names its keys itself, with the `store-contract` feature).
    #[cfg(feature = "store-contract")]
    pub fn from_raw(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// Wraps an already namespaced key, exactly as the store holds it.
    #[cfg(not(feature = "store-contract"))]
    pub(crate) fn from_raw(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key as the store holds it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fencing token: grows on every takeover and every reclaim, so the owner of an older
/// fence can never complete a record that somebody else now owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// A fence as the store reported it, or as an operator names it to resolve a held
    /// claim (a fence alone settles nothing: completing, releasing and renewing take the
    /// [`crate::store::Permit`] a claim granted).
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The number, as forwarded in `Idempotency-Fence`.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// SHA-256 of what makes "the same request"; a different hash under one key is a 422.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    /// Wraps a digest.
    pub const fn new(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The digest's bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Who is claiming: unique per request attempt across every gateway process. Claiming
/// again as the same claimant (a retry of a claim whose reply was lost) wins again with the
/// same fence instead of conflicting with itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claimant(u128);

impl Claimant {
    /// Wraps an id.
    pub const fn new(id: u128) -> Self {
        Self(id)
    }

    /// The id.
    pub const fn get(self) -> u128 {
        self.0
    }
}

/// Hands out claimant ids: a random per-process prefix and a counter.
#[derive(Debug)]
pub struct Claimants {
    prefix: u64,
    next: std::sync::atomic::AtomicU64,
}

impl Default for Claimants {
    fn default() -> Self {
        Self::new()
    }
}

impl Claimants {
    /// A generator whose prefix no other process shares.
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hash, Hasher};
        // RandomState is seeded from the OS's randomness: no two processes share a prefix
        // (containers all running as pid 1 included).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        std::process::id().hash(&mut h);
        std::time::SystemTime::now().hash(&mut h);
        Self {
            prefix: h.finish(),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The next id.
    pub fn next_id(&self) -> Claimant {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Claimant((u128::from(self.prefix) << 64) | u128::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimant_ids_are_unique_within_and_across_generators() {
        let a = Claimants::new();
        let b = Claimants::new();
        let ids = [a.next_id(), a.next_id(), b.next_id(), b.next_id()];
        for (i, x) in ids.iter().enumerate() {
            for y in &ids[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }
}
