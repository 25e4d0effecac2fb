//! The dedupe store: its contract, written once, and the backends that keep it.
//!
//! A record lives under one key and moves through these states:
//!
//! ```text
//!            claim (absent)                complete(fence == current)
//!   absent ─────────────────▶ in-flight ───────────────────────────▶ completed ──(window)──▶ absent
//!                              │  ▲  │ release(fence == current)
//!        claim after lease ────┘  │  └──────────────────────────────▶ released ──(window)──▶ absent
//!        (takeover, fence + 1)    └──── claim (fence + 1) ◀──────────────┘
//! ```
//!
//! While its upstream call runs, the owner renews the lease (`renew`, fenced). A claim made
//! with `hold` (a route with `on_unknown = "hold"`) is never taken over: once its lease
//! ends without an outcome it is `unknown`, and claims get [`Claim::Held`] until an
//! operator resolves it (`resolve`: release or complete under the fence, refused twice).
//!
//! On a route with `order`, each claim also names its entity and version ([`Order`]): a
//! claim that would win is [`Claim::Stale`] when the entity has completed a version at
//! least as high, and a conflict while another version's live claim is in flight; winning
//! marks it in flight. Completing raises the entity's highest version, releasing only
//! clears the marker, renewing extends it: each in the same atomic step as the record's.
//!
//! Every transition is one atomic store operation (a Lua script in Redis, one critical
//! section in memory): there is no read-then-write from the gateway. The fence grows on
//! every takeover and every reclaim after a release, so a worker that froze past its
//! lease can never complete a record that somebody else now owns.

pub(crate) mod coalesce;
pub mod health;
pub mod listing;
mod memory;
pub mod near_cache;
mod permit;
mod redis;

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::config::{StoreBackend, StoreConfig};

pub use self::memory::{MemoryStore, RECORD_OVERHEAD};
pub(crate) use self::permit::Owner;
pub use self::permit::Permit;
pub use self::redis::{RedisClusterStore, RedisStore};
pub use crate::protocol::tokens::{Claimant, Claimants, Fence, RequestHash, StoreKey};

/// A request to claim a key.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The namespaced store key.
    pub key: &'a StoreKey,
    /// SHA-256 of the request; a different hash under the same key is a mismatch.
    pub request_hash: &'a RequestHash,
    /// How long the claim is honoured before a retry may take over.
    pub lease: Duration,
    /// How long a completed record is remembered.
    pub window: Duration,
    /// Who is claiming: unique per request attempt. Claiming again with the same id while
    /// the claim is in flight (a client-side retry of a claim whose reply was lost) wins
    /// again with the same fence instead of conflicting with itself.
    pub claimant: Claimant,
    /// The route holds unknown outcomes for a person (`on_unknown = "hold"`): stored in the
    /// record, so a claim whose owner died is held too.
    pub hold: bool,
    /// On an ordered route: the entity this request writes and its version, checked and
    /// marked in flight in the same atomic step as the claim.
    pub order: Option<Order<'a>>,
}

/// One request's place in its entity's order (a route with `order`): the store keeps, per
/// entity, the highest version completed and the one in flight.
#[derive(Debug, Clone, Copy)]
pub struct Order<'a> {
    /// The entity's order record (see [`crate::protocol::key::order::entity_key`]).
    pub entity: &'a StoreKey,
    /// The version, encoded so that byte order is version order.
    pub version: &'a [u8],
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This request owns the key: forward it upstream under the permit's fence.
    Won {
        /// The right to settle the key: the only way to complete, release or renew it.
        permit: Permit,
        /// The fence taken over, when the previous owner's lease expired without an
        /// outcome.
        takeover: Option<Fence>,
    },
    /// The claim's outcome is unknown and the route holds it for a person: no claim takes
    /// it over until an operator resolves it.
    Held {
        /// The fence of the claim whose outcome is unknown.
        fence: Fence,
        /// Whether this is the first claim told so (the one that logs it loudly).
        first: bool,
    },
    /// Completed with the same request: the encoded [`crate::protocol::record::StoredResponse`].
    Replay(Bytes),
    /// Another request holds an unexpired lease.
    Conflict {
        /// Lease time left.
        retry_after: Duration,
    },
    /// The key was used with a different request.
    Mismatch,
    /// Ordered route: the version is not greater than the highest completed for its
    /// entity. Nothing was written: the request must not be forwarded.
    Stale,
}

/// The outcome of completing a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The record now holds the response.
    Completed,
    /// The fence is stale (a takeover happened) or the record is gone: nothing was written.
    Fenced,
}

/// A record's state, as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed, no outcome yet.
    InFlight,
    /// Holds a response for replay.
    Completed,
    /// Released after a failure; the next claim proceeds.
    Released,
    /// In flight on a holding route, its lease over without an outcome: held for a person.
    Unknown,
}

impl RecordState {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in-flight",
            Self::Completed => "completed",
            Self::Released => "released",
            Self::Unknown => "unknown",
        }
    }
}

/// A record, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    /// State.
    pub state: RecordState,
    /// Current fencing token.
    pub fence: Fence,
    /// Whether the claim holds an unknown outcome for a person (`on_unknown = "hold"`).
    pub held: bool,
    /// Lease time left (in flight only; zero when expired and awaiting takeover).
    pub lease_left: Option<Duration>,
    /// Time until the record is forgotten.
    pub expires_in: Option<Duration>,
    /// The encoded response (completed only).
    pub response: Option<Bytes>,
    /// How many claims have won this record: 1 for the first, one more per takeover and
    /// per reclaim after a release. 0 for a record written before the count was kept.
    pub attempts: u32,
    /// When the current claim won (store clock, to the millisecond).
    pub claimed_at: Option<SystemTime>,
    /// When the record was completed (store clock, to the millisecond).
    pub completed_at: Option<SystemTime>,
    /// On an ordered route: the version the current claim carried, in its comparable
    /// encoding (see [`crate::protocol::key::order::show`]).
    pub version: Option<Bytes>,
}

/// How an operator settles a claim by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Free the key: the next request executes.
    Retry,
    /// Complete the key with this encoded [`crate::protocol::record::StoredResponse`].
    Done(Bytes),
}

/// Why a store operation failed. The request then follows the route's `on_error`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within `[store] timeout`.
    #[error("store operation timed out after {0:?}")]
    Timeout(Duration),
    /// Connection or server error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The server answered something the gateway does not understand.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// The key holds something this gateway cannot read as a record: a value it did not
    /// write, a format it does not know, or a Redis type other than the route's layout.
    /// Never read as absent: the request may have run, so it must not run again.
    #[error("stored record unreadable: {0}")]
    Unreadable(String),
    /// The memory backend holds `max_records` live records.
    #[error("store is full ({0} records)")]
    Full(usize),
    /// The memory backend's records count `max_bytes` bytes.
    #[error("store is full ({0} bytes)")]
    FullBytes(u64),
}

/// The configured backend. A closed set: every one passes the same contract suite.
#[derive(Clone)]
pub enum Store {
    /// In-process.
    Memory(MemoryStore),
    /// One Redis server, or the primary Redis Sentinel names.
    Redis(RedisStore),
    /// A Redis Cluster (boxed: its client is much larger than the other handles).
    Cluster(Box<RedisClusterStore>),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {{
        match $self {
            // Never waits on anything: no deadline to keep.
            Store::Memory($s) => $call.await,
            // The Redis backends keep `[store] timeout` themselves: the single-server one
            // must see its own timeouts to notice a connection that stopped answering.
            Store::Redis($s) => $call.await,
            Store::Cluster($s) => $call.await,
        }
    }};
}

/// Runs a store operation within `[store] timeout`; past it, the operation has failed.
/// Dropping the operation there is what bounds a request's wait on a stalled store.
async fn bounded<T>(
    timeout: Duration,
    op: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

impl Store {
    /// Builds the configured backend. Redis connections are dialled in the background and
    /// re-made by themselves, so a gateway starts (warning, and reporting not-ready) while
    /// Redis is down. Call from within the Tokio runtime.
    pub fn from_config(cfg: &StoreConfig) -> Result<Self, StoreError> {
        Self::from_config_on(cfg, &[])
    }

    /// As [`Store::from_config`], with a Redis connection of its own for each of
    /// `runtimes` (the connection workers'), where the backend spreads its connections
    /// (see [`RedisStore::on_runtimes`]).
    pub fn from_config_on(
        cfg: &StoreConfig,
        runtimes: &[tokio::runtime::Handle],
    ) -> Result<Self, StoreError> {
        Ok(match &cfg.backend {
            StoreBackend::Memory {
                max_records,
                max_bytes,
            } => Store::Memory(MemoryStore::with_limits(*max_records, *max_bytes)),
            StoreBackend::Redis {
                url,
                near_cache,
                access,
            } => Store::Redis(
                RedisStore::with_near_cache(url, access, cfg.timeout, *near_cache)?
                    .on_runtimes(runtimes),
            ),
            StoreBackend::Cluster {
                urls,
                near_cache,
                access,
            } => Store::Cluster(Box::new(RedisClusterStore::with_near_cache(
                urls,
                access,
                cfg.timeout,
                *near_cache,
                &cfg.prefix,
            )?)),
            StoreBackend::Sentinel {
                sentinels,
                master_name,
                access,
            } => Store::Redis(RedisStore::sentinel(
                sentinels,
                master_name,
                access,
                cfg.timeout,
            )?),
        })
    }

    /// Claims a key: one atomic operation.
    pub async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        dispatch!(self, s => s.claim(req))
    }

    /// Settles an in-flight claim by hand, if `fence` still owns it. Unlike `complete` and
    /// `release`, a second resolution under the same fence is refused (false): two
    /// operators cannot both resolve one claim.
    pub async fn resolve(
        &self,
        key: &StoreKey,
        fence: Fence,
        resolution: Resolution,
        window: Duration,
    ) -> Result<bool, StoreError> {
        let key = key.as_str();
        let owner = Owner::by_fence(fence.get());
        match resolution {
            Resolution::Retry => {
                dispatch!(self, s => s.release(key, owner, window, true, None))
            }
            Resolution::Done(record) => {
                dispatch!(self, s => s.complete(key, owner, record, window, true, None))
            }
        }
    }

    /// Reads a record for an operator.
    pub async fn inspect(&self, key: &StoreKey) -> Result<Option<RecordInfo>, StoreError> {
        let key = key.as_str();
        dispatch!(self, s => s.inspect(key))
    }

    /// Lists records in a state, within the request's bounds (see [`listing`]).
    pub async fn list(&self, req: &listing::ListRequest) -> Result<listing::Listing, StoreError> {
        dispatch!(self, s => s.list(req))
    }

    /// Deletes a record (an operator resolving an unknown outcome).
    pub async fn forget(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let key = key.as_str();
        dispatch!(self, s => s.forget(key))
    }

    /// Checks that the store answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping())
    }

    /// Store checks: settings of the store that let duplicates through (see [`health`]).
    /// The embedded store has none. Fails only when the store does not answer.
    pub async fn health_findings(&self) -> Result<Vec<health::Finding>, StoreError> {
        Ok(self.health().await?.1)
    }

    /// What the store checks read of each node (none for the embedded store), and what
    /// they found.
    pub async fn health(
        &self,
    ) -> Result<(Vec<health::NodeReplies>, Vec<health::Finding>), StoreError> {
        match self {
            Store::Memory(_) => Ok((Vec::new(), Vec::new())),
            Store::Redis(s) => {
                let node = s.health_replies().await?;
                let found = health::findings(std::slice::from_ref(&node), None);
                Ok((vec![node], found))
            }
            Store::Cluster(s) => {
                let (nodes, cluster) = s.health_replies().await?;
                let found = health::findings(&nodes, Some(&cluster));
                Ok((nodes, found))
            }
        }
    }

    /// The near-cache's counters (`store.near_cache`), when the backend keeps one.
    pub fn near_cache_stats(&self) -> Option<near_cache::NearCacheStats> {
        match self {
            Store::Redis(s) => s.near_cache_stats(),
            Store::Cluster(s) => s.near_cache_stats(),
            Store::Memory(_) => None,
        }
    }

    /// The backend's name, for logs.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(s) if s.follows_sentinel() => "redis-sentinel",
            Store::Redis(_) => "redis",
            Store::Cluster(_) => "redis-cluster",
        }
    }
}

/// The settle operations, under a [`Permit`]. Crate-private: outside the crate a key is
/// settled only through the lease its claim granted. The store contract suite, which
/// drives every backend through them (zombie owners included), sees them with the
/// `store-contract` feature.
macro_rules! settle_operations {
    ($vis:vis) => {
        impl Store {
            /// Stores the response if the permit's fence still owns the in-flight record.
            /// On an ordered route (`order`), in the same atomic step, the entity's highest
            /// completed version rises to `order.version` (never falls) and its in-flight
            /// marker, if this fence's, is cleared.
            $vis async fn complete(
                &self,
                permit: &Permit,
                record: Bytes,
                window: Duration,
                order: Option<Order<'_>>,
            ) -> Result<Completion, StoreError> {
                let (key, owner) = (permit.key().as_str(), permit.owner());
                let owned =
                    dispatch!(self, s => s.complete(key, owner, record, window, false, order))?;
                Ok(if owned {
                    Completion::Completed
                } else {
                    Completion::Fenced
                })
            }

            /// Gives the key up after a failure that had no effect, if the permit's fence
            /// still owns it. The record keeps its fence so the next owner's token is
            /// higher. On an ordered route, the entity's in-flight marker, if this fence's,
            /// is cleared in the same step; its highest version does not rise.
            $vis async fn release(
                &self,
                permit: &Permit,
                window: Duration,
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                let (key, owner) = (permit.key().as_str(), permit.owner());
                dispatch!(self, s => s.release(key, owner, window, false, order))
            }

            /// Extends the in-flight claim the permit owns to `lease` from now: one round
            /// trip. False when its fence no longer owns the record (taken over, settled, or
            /// gone). On an ordered route, the entity's in-flight marker, if this fence's,
            /// is extended with the lease, so no later version starts meanwhile.
            $vis async fn renew(
                &self,
                permit: &Permit,
                lease: Duration,
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                let (key, owner) = (permit.key().as_str(), permit.owner());
                dispatch!(self, s => s.renew(key, owner, lease, order))
            }
        }
    };
}

#[cfg(feature = "store-contract")]
settle_operations!(pub);
#[cfg(not(feature = "store-contract"))]
settle_operations!(pub(crate));
