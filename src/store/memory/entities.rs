//! Ordered routes in the embedded store: per entity, the highest version completed and
//! the claim in flight.

use std::collections::HashMap;

use tokio::time::Instant;

use super::MIN_SWEEP;
use crate::store::{Claim, Order};

/// An ordered route's record of one entity: the highest version completed and the claim
/// in flight. Kept behind its own lock, always taken after a shard's (never before), so a
/// claim, completion, release or renewal updates both in one critical section.
#[derive(Debug)]
struct Entity {
    completed: Option<Vec<u8>>,
    in_flight: Option<Marker>,
    expires_at: Instant,
}

/// The claim in flight: the fence that owns it and until when its lease runs.
#[derive(Debug)]
struct Marker {
    fence: u64,
    lease_until: Instant,
}

#[derive(Default)]
pub(super) struct Entities {
    map: HashMap<String, Entity>,
    sweep_at: usize,
}

impl Entities {
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entity> {
        self.map.get_mut(key).filter(|e| e.expires_at > now)
    }

    /// Whether a claim of `order` may proceed: `Some` answer when it is stale or another
    /// version's live claim is in flight. A marker whose lease ended is dead and ignored.
    pub(super) fn gate(&mut self, order: Order<'_>, now: Instant) -> Option<Claim> {
        let e = self.live(order.entity.as_str(), now)?;
        if e.completed.as_deref().is_some_and(|c| order.version <= c) {
            return Some(Claim::Stale);
        }
        match &e.in_flight {
            Some(m) if m.lease_until > now => Some(Claim::Conflict {
                retry_after: m.lease_until - now,
            }),
            _ => None,
        }
    }

    /// Marks `order` in flight under `fence`; the entity is remembered at least until
    /// `expires_at`.
    pub(super) fn mark(
        &mut self,
        order: Order<'_>,
        fence: u64,
        lease_until: Instant,
        expires_at: Instant,
    ) {
        let now = Instant::now();
        if self.map.len() >= self.sweep_at.max(MIN_SWEEP) {
            self.map.retain(|_, e| e.expires_at > now);
            self.sweep_at = self.map.len() * 2;
        }
        let marker = Marker { fence, lease_until };
        match self.map.get_mut(order.entity.as_str()) {
            Some(e) if e.expires_at > now => {
                e.in_flight = Some(marker);
                e.expires_at = e.expires_at.max(expires_at);
            }
            _ => {
                self.map.insert(
                    order.entity.as_str().to_owned(),
                    Entity {
                        completed: None,
                        in_flight: Some(marker),
                        expires_at,
                    },
                );
            }
        }
    }

    /// Settles `fence`'s claim of `order`: its marker cleared, and, when `completed`, the
    /// highest version raised to its version (never lowered: a zombie's late completion
    /// of an older version leaves it).
    pub(super) fn settle(
        &mut self,
        order: Order<'_>,
        fence: u64,
        completed: bool,
        expires_at: Instant,
    ) {
        let now = Instant::now();
        let e = match self.map.entry(order.entity.as_str().to_owned()) {
            std::collections::hash_map::Entry::Occupied(o) => {
                let e = o.into_mut();
                if e.expires_at <= now {
                    *e = Entity {
                        completed: None,
                        in_flight: None,
                        expires_at,
                    };
                }
                e
            }
            std::collections::hash_map::Entry::Vacant(v) if completed => v.insert(Entity {
                completed: None,
                in_flight: None,
                expires_at,
            }),
            std::collections::hash_map::Entry::Vacant(_) => return,
        };
        if e.in_flight.as_ref().is_some_and(|m| m.fence == fence) {
            e.in_flight = None;
        }
        if completed && e.completed.as_deref().is_none_or(|c| order.version > c) {
            e.completed = Some(order.version.to_vec());
        }
        e.expires_at = e.expires_at.max(expires_at);
    }

    pub(super) fn renew(&mut self, order: Order<'_>, fence: u64, lease_until: Instant) {
        let now = Instant::now();
        if let Some(e) = self.live(order.entity.as_str(), now) {
            if let Some(m) = e.in_flight.as_mut().filter(|m| m.fence == fence) {
                m.lease_until = lease_until;
                e.expires_at = e.expires_at.max(lease_until);
            }
        }
    }
}
