//! A claim in the embedded store: what it decides on meeting its key's record (new,
//! expired, released, in flight, completed) and the record it writes when it wins.

use std::time::SystemTime;

use bytes::Bytes;
use tokio::time::Instant;

use super::{next_fence, wall_now, Record};
use crate::store::{Claim, ClaimRequest, Fence, Permit, RecordState};

/// What a claim decides about its key's record.
pub(super) enum Decision {
    /// Answered from the record as it stands; nothing written, no entity marked.
    Answer(Claim),
    /// The record is now this claim's, in flight under `fence`.
    Won {
        fence: u64,
        /// The fence whose lease ran out, when this claim took its record over.
        takeover: Option<Fence>,
    },
}

impl Decision {
    pub(super) fn won(fence: u64, takeover: Option<Fence>) -> Self {
        Decision::Won { fence, takeover }
    }
}

/// One claim: the request and the times it would write, read once from the clocks.
pub(super) struct Attempt<'a> {
    req: ClaimRequest<'a>,
    now: Instant,
    pub(super) lease_until: Instant,
    pub(super) expires_at: Instant,
    claimed_at: SystemTime,
}

impl<'a> Attempt<'a> {
    pub(super) fn new(req: ClaimRequest<'a>, now: Instant) -> Self {
        Self {
            req,
            now,
            lease_until: now + req.lease,
            expires_at: now + req.lease + req.window,
            claimed_at: wall_now(),
        }
    }

    fn version(&self) -> Option<Bytes> {
        self.req.order.map(|o| Bytes::copy_from_slice(o.version))
    }

    /// A new in-flight record owned by this claim.
    pub(super) fn fresh(&self, fence: u64, attempts: u32) -> Record {
        Record {
            state: RecordState::InFlight,
            fence,
            request_hash: *self.req.request_hash.as_bytes(),
            lease_until: self.lease_until,
            expires_at: self.expires_at,
            claimant: self.req.claimant,
            hold: self.req.hold,
            hold_noted: false,
            response: None,
            attempts,
            claimed_at: self.claimed_at,
            completed_at: None,
            version: self.version(),
        }
    }

    /// The claim meets a live record. `gate` answers for an ordered route's entity; it is
    /// asked only where the claim would otherwise win.
    pub(super) fn on_live(
        &self,
        r: &mut Record,
        gate: &mut impl FnMut() -> Option<Claim>,
    ) -> Decision {
        let now = self.now;
        if r.state == RecordState::Released {
            if let Some(refused) = gate() {
                return Decision::Answer(refused);
            }
            // A released record holds no response: its bytes stay the same.
            *r = self.fresh(next_fence(r.fence), r.attempts.saturating_add(1));
            return Decision::won(r.fence, None);
        }
        if r.request_hash != *self.req.request_hash.as_bytes() {
            return Decision::Answer(Claim::Mismatch);
        }
        if r.state == RecordState::Completed {
            return Decision::Answer(Claim::Replay(r.response.clone().unwrap_or_default()));
        }
        if r.claimant == self.req.claimant {
            // The same attempt claiming again (its first reply was lost): it already owns
            // the record, which stays as it is.
            return Decision::Answer(Claim::Won {
                permit: Permit::new(self.req.key, Fence::new(r.fence)),
                takeover: None,
            });
        }
        if now < r.lease_until {
            return Decision::Answer(Claim::Conflict {
                retry_after: r.lease_until - now,
            });
        }
        if r.hold {
            let first = !r.hold_noted;
            r.hold_noted = true;
            return Decision::Answer(Claim::Held {
                fence: Fence::new(r.fence),
                first,
            });
        }
        if let Some(refused) = gate() {
            return Decision::Answer(refused);
        }
        self.take_over(r)
    }

    /// Takes over an in-flight record whose lease ran out without an outcome: a higher
    /// fence and this claim's lease, one more attempt; the request it holds is the same.
    fn take_over(&self, r: &mut Record) -> Decision {
        let previous = Fence::new(r.fence);
        r.fence = next_fence(r.fence);
        r.claimant = self.req.claimant;
        r.lease_until = self.lease_until;
        r.expires_at = self.expires_at;
        r.hold = self.req.hold;
        r.attempts = r.attempts.saturating_add(1);
        r.claimed_at = self.claimed_at;
        r.version = self.version();
        Decision::won(r.fence, Some(previous))
    }
}
