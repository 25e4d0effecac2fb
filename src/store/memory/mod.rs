//! The embedded store: records in sharded maps behind short critical sections.
//! Protects one gateway process; several replicas need Redis.
//!
//! Expiry is lazy: an expired record is treated as absent, and is dropped when its
//! expiry comes up in its shard's queue. Each claim drops a few of its shard's expired
//! records ([`CLAIM_EXPIRES`]), more than a claim adds, and a full store drops up to
//! [`ROOM_EXPIRES`] from each shard until there is room: no operation walks a shard, so a
//! store at its bound under a steady stream of new keys costs what has expired, not what
//! it holds.
//!
//! Memory is bounded twice: by live records and by their bytes (key, stored response and
//! a fixed per-record overhead). Past either bound, claims for new keys fail as store
//! errors. A completed record is never evicted early to make room: forgetting it before
//! its window would let a retry execute the write again. A completion is always stored,
//! so the bytes can pass the bound by the responses of the claims in flight at the time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// The tokio clock, so the protocol's unit tests run on paused time.
use tokio::time::Instant;

use bytes::Bytes;

use super::{
    Claim, ClaimRequest, Fence, Order, Owner, Permit, RecordInfo, RecordState, StoreError,
};

mod claim;
mod entities;
mod listing;
mod records;
mod shard;

use self::claim::{Attempt, Decision};
use self::entities::Entities;
use self::records::Hashed;
use self::shard::{footprint, Shard, Usage};

const SHARDS: usize = 32;

/// The ordered routes' entities sweep once they have grown past this many since the last sweep.
const MIN_SWEEP: usize = 256;
/// How many of its shard's due expiries a claim looks at.
const CLAIM_EXPIRES: usize = 8;
/// How many due expiries of each shard a full store looks at to make room for a claim.
const ROOM_EXPIRES: usize = 256;
/// Bytes a record costs besides its key and response: its slot in the shard's table (the
/// record, the key's hash and pointer) at the table's fullest load, two entries of the
/// expiry queue, and the key's allocation's rounding; rounded up (a unit test in
/// `memory/records.rs` checks it against the sizes this build has).
pub const RECORD_OVERHEAD: usize = 352;

#[derive(Debug)]
struct Record {
    state: RecordState,
    fence: u64,
    request_hash: [u8; 32],
    lease_until: Instant,
    expires_at: Instant,
    claimant: super::Claimant,
    /// Set at claim time by a route with `on_unknown = "hold"`: once the lease ends
    /// without an outcome, the claim is held for a person instead of taken over.
    hold: bool,
    /// Whether a claim has already been told the record is held (it logs at error once).
    hold_noted: bool,
    response: Option<Bytes>,
    /// Claims that won this record (first, takeovers, reclaims after a release).
    attempts: u32,
    /// When the current claim won (wall clock: shown to operators, never compared).
    claimed_at: SystemTime,
    completed_at: Option<SystemTime>,
    /// On an ordered route: the current claim's version (shown to operators).
    version: Option<Bytes>,
}

impl Record {
    /// The state an operator is shown: a holding claim whose lease ran out is unknown.
    fn shown_state(&self, now: Instant) -> RecordState {
        if self.state == RecordState::InFlight && self.hold && now >= self.lease_until {
            RecordState::Unknown
        } else {
            self.state
        }
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

/// The wall clock to the millisecond, as the Redis scripts keep it.
fn wall_now() -> SystemTime {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// In-process store with the same contract as the Redis backends.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Vec<Mutex<Shard>>,
    /// Ordered routes' entities; locked after a shard, never before.
    entities: Mutex<Entities>,
    usage: Usage,
    max_records: usize,
    max_bytes: usize,
}

impl MemoryStore {
    /// A store that refuses new claims (as a store error) past `max_records` live
    /// records, with no bound on their bytes.
    pub fn new(max_records: usize) -> Self {
        Self::with_limits(max_records, u64::MAX)
    }

    /// A store that refuses new claims (as a store error) past `max_records` live records
    /// or `max_bytes` of them (see [`RECORD_OVERHEAD`]).
    pub fn with_limits(max_records: usize, max_bytes: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                entities: Mutex::default(),
                usage: Usage::default(),
                max_records,
                max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            }),
        }
    }

    /// Records held, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.inner.usage.records.load(Ordering::Relaxed)
    }

    /// Bytes the held records are counted as, expired ones not yet swept included.
    pub fn bytes(&self) -> usize {
        self.inner.usage.bytes.load(Ordering::Relaxed)
    }

    /// Why a new record of `need` bytes does not fit, if it does not.
    fn no_room(&self, need: usize) -> Option<StoreError> {
        if self.len() >= self.inner.max_records {
            return Some(StoreError::Full(self.inner.max_records));
        }
        if self.bytes().saturating_add(need) > self.inner.max_bytes {
            return Some(StoreError::FullBytes(self.inner.max_bytes as u64));
        }
        None
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
        // A panic while holding a shard lock cannot leave a record half-written (every
        // critical section assigns whole fields), so a poisoned lock is still usable.
        shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entities(&self) -> MutexGuard<'_, Entities> {
        // As for shards: every critical section leaves whole fields.
        self.inner
            .entities
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn shard(&self, at: Hashed<'_>) -> MutexGuard<'_, Shard> {
        Self::lock(&self.inner.shards[at.shard()])
    }

    /// A full store drops what has expired, a bounded number from each shard that has
    /// something due, one lock at a time, until there is room.
    fn make_room(&self, now: Instant, need: usize) {
        for shard in &self.inner.shards {
            if self.no_room(need).is_none() {
                return;
            }
            let mut shard = Self::lock(shard);
            if shard.due(now) {
                shard.expire(now, &self.inner.usage, ROOM_EXPIRES);
            }
        }
    }

    pub(super) async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let need = RECORD_OVERHEAD + req.key.as_str().len();
        if self.no_room(need).is_some() {
            self.make_room(now, need);
        }
        let at = Hashed::new(req.key.as_str());
        let mut shard = self.shard(at);
        shard.expire(now, &self.inner.usage, CLAIM_EXPIRES);
        let attempt = Attempt::new(req, now);
        // Taken after the shard's lock: the entity is checked and marked in the same
        // critical section as the claim.
        let mut entities = req.order.map(|_| self.entities());
        let mut gate = || match (req.order, entities.as_mut()) {
            (Some(order), Some(e)) => e.gate(order, now),
            _ => None,
        };
        let decision = match shard.records.get_mut(at) {
            Some(r) if r.expires_at > now => attempt.on_live(r, &mut gate),
            // Expired but not yet swept: the key is new again, its fence still grows.
            Some(r) => match gate() {
                Some(refused) => Decision::Answer(refused),
                None => {
                    self.inner
                        .usage
                        .sub(r.response.as_ref().map_or(0, Bytes::len));
                    *r = attempt.fresh(next_fence(r.fence), 1);
                    Decision::won(r.fence, None)
                }
            },
            None => match gate() {
                Some(refused) => Decision::Answer(refused),
                None => {
                    if let Some(full) = self.no_room(need) {
                        return Err(full);
                    }
                    self.inner.usage.records.fetch_add(1, Ordering::Relaxed);
                    self.inner.usage.add(need);
                    let record = attempt.fresh(next_fence(0), 1);
                    let fence = record.fence;
                    shard.records.insert_new(at, record);
                    Decision::won(fence, None)
                }
            },
        };
        let (fence, takeover) = match decision {
            Decision::Answer(claim) => return Ok(claim),
            Decision::Won { fence, takeover } => (fence, takeover),
        };
        if let (Some(order), Some(e)) = (req.order, entities.as_mut()) {
            e.mark(order, fence, attempt.lease_until, attempt.expires_at);
        }
        shard.expires(at, attempt.expires_at);
        Ok(Claim::Won {
            permit: Permit::new(req.key, Fence::new(fence)),
            takeover,
        })
    }

    /// Moves the live in-flight record owned by `fence` to `to`, applying `f`. Finishing
    /// twice under the same fence is idempotent (true, nothing rewritten), as in Redis,
    /// unless `strict` (an operator's resolution: the second of two is refused).
    fn finish(
        &self,
        key: &str,
        fence: u64,
        to: RecordState,
        strict: bool,
        order: Option<Order<'_>>,
        f: impl FnOnce(&mut Record, Instant),
    ) -> bool {
        let now = Instant::now();
        let at = Hashed::new(key);
        let mut shard = self.shard(at);
        let expires_at = match shard.records.get_mut(at) {
            Some(r) if r.expires_at > now && r.fence == fence => {
                if r.state != RecordState::InFlight {
                    return !strict && r.state == to;
                }
                r.state = to;
                f(r, now);
                r.expires_at
            }
            _ => return false,
        };
        if let Some(order) = order {
            self.entities()
                .settle(order, fence, to == RecordState::Completed, expires_at);
        }
        shard.expires(at, expires_at);
        true
    }

    pub(super) async fn complete(
        &self,
        key: &str,
        Owner { fence, .. }: Owner<'_>,
        record: Bytes,
        window: Duration,
        strict: bool,
        order: Option<Order<'_>>,
    ) -> Result<bool, StoreError> {
        let usage = &self.inner.usage;
        Ok(self.finish(
            key,
            fence,
            RecordState::Completed,
            strict,
            order,
            |r, now| {
                // Stored even past max_bytes: refusing a completion would let a retry run
                // the write again.
                usage.add(record.len());
                r.response = Some(record);
                r.completed_at = Some(wall_now());
                r.expires_at = now + window;
            },
        ))
    }

    pub(super) async fn release(
        &self,
        key: &str,
        Owner { fence, .. }: Owner<'_>,
        window: Duration,
        strict: bool,
        order: Option<Order<'_>>,
    ) -> Result<bool, StoreError> {
        Ok(self.finish(
            key,
            fence,
            RecordState::Released,
            strict,
            order,
            |r, now| {
                r.expires_at = now + window;
            },
        ))
    }

    /// Extends the lease of the in-flight record owned by `fence` to `lease` from now
    /// (the record outlives it), even if the lease had run out while nobody took over.
    pub(super) async fn renew(
        &self,
        key: &str,
        Owner { fence, .. }: Owner<'_>,
        lease: Duration,
        order: Option<Order<'_>>,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let at = Hashed::new(key);
        let mut shard = self.shard(at);
        let expires_at = match shard.records.get_mut(at) {
            Some(r)
                if r.expires_at > now && r.fence == fence && r.state == RecordState::InFlight =>
            {
                r.lease_until = now + lease;
                r.expires_at = r.expires_at.max(r.lease_until);
                r.expires_at
            }
            _ => return Ok(false),
        };
        if let Some(order) = order {
            self.entities().renew(order, fence, now + lease);
        }
        shard.expires(at, expires_at);
        Ok(true)
    }

    pub(super) async fn inspect(&self, key: &str) -> Result<Option<RecordInfo>, StoreError> {
        let now = Instant::now();
        let at = Hashed::new(key);
        let shard = self.shard(at);
        Ok(shard
            .records
            .get(at)
            .filter(|r| r.expires_at > now)
            .map(|r| RecordInfo {
                state: r.shown_state(now),
                held: r.hold,
                fence: Fence::new(r.fence),
                lease_left: (r.state == RecordState::InFlight)
                    .then(|| r.lease_until.saturating_duration_since(now)),
                expires_in: Some(r.expires_at - now),
                response: r.response.clone(),
                attempts: r.attempts,
                claimed_at: Some(r.claimed_at),
                completed_at: r.completed_at,
                version: r.version.clone(),
            }))
    }

    pub(super) async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        let now = Instant::now();
        let at = Hashed::new(key);
        let mut shard = self.shard(at);
        match shard.records.remove(at) {
            Some(r) => {
                self.inner.usage.records.fetch_sub(1, Ordering::Relaxed);
                self.inner.usage.sub(footprint(key, &r));
                Ok(r.expires_at > now)
            }
            None => Ok(false),
        }
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Drops every expired record now.
    pub fn sweep(&self) {
        let now = Instant::now();
        for shard in &self.inner.shards {
            Self::lock(shard).expire(now, &self.inner.usage, usize::MAX);
        }
    }
}

#[cfg(test)]
mod tests;
