//! The right to settle a key a won claim grants ([`Permit`]), and who a backend checks
//! a settle by ([`Owner`]).

use bytes::Bytes;

use super::{Claimant, Fence, StoreKey};

/// The right to settle one key under one fence, granted by a won claim.
///
/// As pingora-cache's `lock()` hands back its `WritePermit`, [`Store::claim`] hands back
/// this: outside the crate nothing else can complete, release or renew a key (the
/// protocol's [`crate::dedupe::Lease`] owns it and is consumed by one settle). Operators
/// resolve a held claim by its fence through [`Store::resolve`], their own door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    key: StoreKey,
    fence: Fence,
    /// The claim that won, where the backend needs it to recognise its owner (a fresh
    /// string record, whose fence derives from its expiry).
    claimant: Option<Claimant>,
    /// The value the claim wrote, where the backend can settle by comparing the whole
    /// record with it (a first claim's string record, completed by `SET ... IFEQ`).
    claimed: Option<Bytes>,
}

/// Who settles a record, as a backend checks it: the permit's fence, its claimant when
/// known, and the value its claim wrote when the backend kept it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub(crate) fence: u64,
    pub(crate) claimant: Option<u128>,
    pub(crate) claimed: Option<&'a [u8]>,
}

impl Owner<'_> {
    /// An owner known by its fence alone (an operator's resolve).
    pub(crate) fn by_fence(fence: u64) -> Self {
        Self {
            fence,
            claimant: None,
            claimed: None,
        }
    }
}

impl Permit {
    /// A permit a backend grants to the claim that won `key` under `fence`.
    pub(crate) fn new(key: &StoreKey, fence: Fence) -> Self {
        Self {
            key: key.clone(),
            fence,
            claimant: None,
            claimed: None,
        }
    }

    /// The same, naming the claim that won.
    pub(crate) fn claimed_by(mut self, claimant: Claimant) -> Self {
        self.claimant = Some(claimant);
        self
    }

    /// The same, with the value the claim wrote.
    pub(crate) fn wrote(mut self, value: Bytes) -> Self {
        self.claimed = Some(value);
        self
    }

    /// Forgets the value the claim wrote once a renewal may have rewritten the record:
    /// a completion compared with it would only miss.
    pub(crate) fn renewed(&mut self) {
        self.claimed = None;
    }

    /// What a backend checks ownership by.
    pub(super) fn owner(&self) -> Owner<'_> {
        Owner {
            fence: self.fence.get(),
            claimant: self.claimant.map(Claimant::get),
            claimed: self.claimed.as_deref(),
        }
    }

    /// A permit no claim granted: for the store contract suite's zombie owners and forged
    /// fences, which the store must refuse.
    #[cfg(feature = "store-contract")]
    pub fn forged(key: &StoreKey, fence: u64) -> Self {
        Self::new(key, Fence::new(fence))
    }

    /// The key it settles.
    pub fn key(&self) -> &StoreKey {
        &self.key
    }

    /// The fencing token, forwarded upstream.
    pub fn fence(&self) -> Fence {
        self.fence
    }
}
