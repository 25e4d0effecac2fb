//! The record of a route without `order` (an ordered route's is a hash, see
//! [`super::scripts`]): one Redis string per record, a fixed binary header and then the stored response (pure).
//!
//! ```text
//! offset size field
//!   0     1   format tag (1)
//!   1     1   state: b'i' in flight, b'c' completed, b'r' released
//!   2     1   flags: 1 the route holds unknown outcomes, 2 a claim was told it is held
//!   3     8   fence                      (0: fresh, see below)
//!  11     8   lease end, server ms       (0: fresh)
//!  19     8   claimed at, server ms      (0: fresh)
//!  27     8   completed at, server ms    (0: none, or see below)
//!  35     8   lease, ms
//!  43     8   the TTL the record was last given, ms
//!  51     4   attempts: claims that won it
//!  55    16   claimant
//!  71    32   request hash
//! 103     2   version length n (0: no writer sets a version yet)
//! 105     n   version
//! 105+n   ... the encoded response (completed only)
//! ```
//!
//! All integers are big-endian (Lua's `struct` reads them with [`LUA_FORMAT`]).
//!
//! A first claim is one native `SET key header NX PX ttl GET`, whose value the gateway
//! builds before Redis has read its clock: such a *fresh* record carries fence, lease end
//! and claim time 0, and they derive from the key's expiry, which Redis set from its own
//! clock in the same command: created = `PEXPIRETIME - ttl`, fence = created × 1000 + 999
//! (µs: above every fence given out in an earlier millisecond, as `TIME`-based fences are),
//! lease end = created + lease. Every script that changes a record's expiry first writes
//! those three into the header, so the derivation only ever reads an expiry no one has
//! touched since the claim. Likewise completing writes no time: it sets the TTL field to
//! the window, and a completed record's completion time is its expiry less that.

use bytes::Bytes;

use crate::store::{Claimant, Fence, RequestHash};

/// The header's length without the version.
pub(super) const HEADER_LEN: usize = 105;

/// Where the claimant's 16 bytes start.
pub(super) const CLAIMANT_AT: usize = 55;

/// The header in Lua's `struct` notation, up to the version's length.
pub(super) const LUA_FORMAT: &str = ">BBBI8I8I8I8I8I8I4c16c32H";

const TAG: u8 = 1;
const HOLD: u8 = 1;
const TOLD: u8 = 2;

/// A record's state byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    InFlight,
    Completed,
    Released,
}

/// A decoded record, its response shared with the value it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StringRecord {
    pub(super) state: State,
    pub(super) hold: bool,
    pub(super) told: bool,
    /// As stored: 0 on a fresh record (see [`StringRecord::settled_at`]).
    pub(super) fence: u64,
    pub(super) lease_end: u64,
    pub(super) claimed_at: u64,
    pub(super) completed_at: u64,
    pub(super) lease: u64,
    pub(super) ttl: u64,
    pub(super) attempts: u32,
    pub(super) claimant: u128,
    pub(super) hash: [u8; 32],
    pub(super) version: Bytes,
    pub(super) response: Bytes,
}

/// A record's fence, claim time and lease end, fresh ones derived from its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Times {
    pub(super) fence: u64,
    pub(super) claimed_at: u64,
    pub(super) lease_end: u64,
}

/// The fence of a fresh record that expires at `expires_at` (server ms), created with `ttl`.
pub(super) fn fresh_fence(expires_at: u64, ttl: u64) -> u64 {
    expires_at.saturating_sub(ttl) * 1000 + 999
}

impl StringRecord {
    /// Fence, claim time and lease end; a fresh record's from its expiry.
    pub(super) fn settled_at(&self, expires_at: u64) -> Times {
        if self.fence != 0 {
            return Times {
                fence: self.fence,
                claimed_at: self.claimed_at,
                lease_end: self.lease_end,
            };
        }
        let created = expires_at.saturating_sub(self.ttl);
        Times {
            fence: fresh_fence(expires_at, self.ttl),
            claimed_at: created,
            lease_end: created + self.lease,
        }
    }
}

impl StringRecord {
    /// When it was completed (server ms, 0: not completed), derived from its expiry.
    pub(super) fn completed_at(&self, expires_at: u64) -> u64 {
        match (self.state, self.completed_at) {
            (State::Completed, 0) => expires_at.saturating_sub(self.ttl),
            (_, at) => at,
        }
    }
}

/// What a first claim writes: a fresh in-flight record (no response).
pub(super) fn encode_claim(
    hash: &RequestHash,
    claimant: Claimant,
    lease_ms: u64,
    ttl_ms: u64,
    hold: bool,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN);
    v.extend_from_slice(&[TAG, b'i', if hold { HOLD } else { 0 }]);
    for n in [0, 0, 0, 0, lease_ms, ttl_ms] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    v.extend_from_slice(&1u32.to_be_bytes());
    v.extend_from_slice(&claimant.get().to_be_bytes());
    v.extend_from_slice(hash.as_bytes());
    v.extend_from_slice(&0u16.to_be_bytes());
    v
}

/// The header of the completed record that the completion script writes from the fresh
/// claim `claimed` (what [`encode_claim`] wrote) under `fence`: state `c`, the permit's
/// fence and claim time (fence / 1000), no lease end or completion time (a completed
/// record's completion time is its expiry less the TTL field), and the window as the TTL
/// field; flags, lease, attempts, claimant, request hash and version as claimed. `None`
/// when `claimed` is not a fresh claim's header.
pub(super) fn completed_header(
    claimed: &[u8],
    fence: u64,
    window_ms: u64,
) -> Option<[u8; HEADER_LEN]> {
    let mut h: [u8; HEADER_LEN] = claimed.try_into().ok()?;
    if h[0] != TAG || h[1] != b'i' || h[3..11] != [0; 8] || h[103..105] != [0; 2] {
        return None;
    }
    h[1] = b'c';
    h[3..11].copy_from_slice(&fence.to_be_bytes());
    h[11..19].fill(0);
    h[19..27].copy_from_slice(&(fence / 1000).to_be_bytes());
    h[27..35].fill(0);
    h[43..51].copy_from_slice(&window_ms.to_be_bytes());
    Some(h)
}

/// Why a value is not a record of this format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a dedupe record: {0}")]
pub(super) struct NotARecord(&'static str);

/// Reads a value; its response and version share `value`'s buffer.
pub(super) fn decode(value: Bytes) -> Result<StringRecord, NotARecord> {
    if value.len() < HEADER_LEN {
        return Err(NotARecord("shorter than the header"));
    }
    if value[0] != TAG {
        return Err(NotARecord("unknown format tag"));
    }
    let state = match value[1] {
        b'i' => State::InFlight,
        b'c' => State::Completed,
        b'r' => State::Released,
        _ => return Err(NotARecord("unknown state")),
    };
    let u64_at = |at: usize| u64::from_be_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    let n = usize::from(u16::from_be_bytes([value[103], value[104]]));
    if value.len() < HEADER_LEN + n {
        return Err(NotARecord("version past the end"));
    }
    Ok(StringRecord {
        state,
        hold: value[2] & HOLD != 0,
        told: value[2] & TOLD != 0,
        fence: u64_at(3),
        lease_end: u64_at(11),
        claimed_at: u64_at(19),
        completed_at: u64_at(27),
        lease: u64_at(35),
        ttl: u64_at(43),
        attempts: u32::from_be_bytes(value[51..55].try_into().expect("4 bytes")),
        claimant: u128::from_be_bytes(
            value[CLAIMANT_AT..CLAIMANT_AT + 16]
                .try_into()
                .expect("16 bytes"),
        ),
        hash: value[71..103].try_into().expect("32 bytes"),
        version: value.slice(HEADER_LEN..HEADER_LEN + n),
        response: value.slice(HEADER_LEN + n..),
    })
}

/// What a claim's native read decided, or that only the claim script can decide it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Won (a fresh record of this claim, or this claimant's own retried claim).
    Won(Fence),
    /// Completed with the same request; `ttl_ms` left when the server's time was read
    /// (near-cache).
    Replay {
        response: Bytes,
        ttl_ms: Option<u64>,
    },
    Mismatch,
    Conflict {
        left_ms: u64,
    },
    /// Held, and a claim was told so already.
    HeldAgain(Fence),
    /// Another claim's record in flight, read without the server's time: whether its
    /// lease has ended needs a read that has it.
    Recheck,
    /// A takeover, a reclaim after a release, or the first claim told a record is held:
    /// writes that must compare first, so the claim script runs.
    Script,
}

/// Judges a claim from `SET NX GET`'s reply (`None`: the key was absent and is now this
/// claim's) and the key's expiry, read in one `MULTI`, with the server's time when that
/// `MULTI` asked for it (`now_ms`).
pub(super) fn judge(
    existing: Option<&StringRecord>,
    expires_at: u64,
    now_ms: Option<u64>,
    hash: &RequestHash,
    claimant: Claimant,
    ttl_ms: u64,
) -> Verdict {
    let Some(r) = existing else {
        return Verdict::Won(Fence::new(fresh_fence(expires_at, ttl_ms)));
    };
    let times = r.settled_at(expires_at);
    match r.state {
        State::Completed if r.hash == *hash.as_bytes() => Verdict::Replay {
            response: r.response.clone(),
            ttl_ms: now_ms.map(|now| expires_at.saturating_sub(now)),
        },
        State::Completed => Verdict::Mismatch,
        State::Released => Verdict::Script,
        State::InFlight if r.hash != *hash.as_bytes() => Verdict::Mismatch,
        State::InFlight if r.claimant == claimant.get() => Verdict::Won(Fence::new(times.fence)),
        State::InFlight => match now_ms {
            None => Verdict::Recheck,
            Some(now) if now < times.lease_end => Verdict::Conflict {
                left_ms: times.lease_end - now,
            },
            Some(_) if r.hold && r.told => Verdict::HeldAgain(Fence::new(times.fence)),
            Some(_) => Verdict::Script,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: RequestHash = RequestHash::new([7; 32]);
    const OTHER: RequestHash = RequestHash::new([8; 32]);

    fn fresh(hold: bool) -> StringRecord {
        decode(Bytes::from(encode_claim(
            &H,
            Claimant::new(42),
            1_000,
            61_000,
            hold,
        )))
        .unwrap()
    }

    /// A record as the scripts write it: fields set, a response behind a version.
    fn written(state: u8, fence: u64, version: &[u8], response: &[u8]) -> Bytes {
        let mut v = vec![TAG, state, HOLD | TOLD];
        for n in [fence, 5_000, 4_000, 6_000, 1_000, 61_000] {
            v.extend_from_slice(&n.to_be_bytes());
        }
        v.extend_from_slice(&3u32.to_be_bytes());
        v.extend_from_slice(&9u128.to_be_bytes());
        v.extend_from_slice(OTHER.as_bytes());
        v.extend_from_slice(&(version.len() as u16).to_be_bytes());
        v.extend_from_slice(version);
        v.extend_from_slice(response);
        Bytes::from(v)
    }

    #[test]
    fn a_claim_encodes_a_fresh_in_flight_header() {
        let r = fresh(true);
        assert_eq!(
            encode_claim(&H, Claimant::new(1), 1, 2, false).len(),
            HEADER_LEN
        );
        assert_eq!((r.state, r.hold, r.told), (State::InFlight, true, false));
        assert_eq!(
            (r.fence, r.lease_end, r.claimed_at, r.completed_at),
            (0, 0, 0, 0)
        );
        assert_eq!(
            (r.lease, r.ttl, r.attempts, r.claimant),
            (1_000, 61_000, 1, 42)
        );
        assert_eq!(r.hash, *H.as_bytes());
        assert!(r.version.is_empty() && r.response.is_empty());
    }

    #[test]
    fn every_field_decodes_and_the_response_follows_the_version() {
        let r = decode(written(b'c', 77, b"0003", b"\x00body\xff")).unwrap();
        assert_eq!(
            (r.state, r.hold, r.told, r.fence),
            (State::Completed, true, true, 77)
        );
        assert_eq!(
            (r.lease_end, r.claimed_at, r.completed_at),
            (5_000, 4_000, 6_000)
        );
        assert_eq!((r.attempts, r.claimant, r.hash), (3, 9, *OTHER.as_bytes()));
        assert_eq!(&r.version[..], b"0003");
        assert_eq!(&r.response[..], b"\x00body\xff");
        // Stored times are taken as they are.
        assert_eq!(r.settled_at(1).fence, 77);
        assert_eq!(r.completed_at(1), 6_000);
        // A completion writes no time: expiry less the window (the TTL field).
        let mut v = written(b'c', 77, b"", b"").to_vec();
        v[27..35].copy_from_slice(&0u64.to_be_bytes());
        let r = decode(Bytes::from(v)).unwrap();
        assert_eq!(r.completed_at(3_661_000), 3_600_000);
        assert_eq!(fresh(false).completed_at(1_061_000), 0);
    }

    #[test]
    fn anything_else_is_refused() {
        assert!(decode(Bytes::from_static(b"plain value")).is_err());
        let mut v = written(b'c', 1, b"", b"").to_vec();
        v[0] = 2;
        assert!(decode(Bytes::from(v.clone())).is_err());
        v[0] = TAG;
        v[1] = b'x';
        assert!(decode(Bytes::from(v)).is_err());
        let mut v = written(b'c', 1, b"", b"").to_vec();
        v[104] = 5; // a version longer than what follows
        assert!(decode(Bytes::from(v)).is_err());
    }

    #[test]
    fn a_fresh_record_takes_its_times_from_its_expiry() {
        // Created at 1_000_000 ms with a TTL of 61 s.
        let t = fresh(false).settled_at(1_061_000);
        assert_eq!(t.claimed_at, 1_000_000);
        assert_eq!(t.lease_end, 1_001_000);
        assert_eq!(t.fence, 1_000_000_999);
        // Above every µs fence of the millisecond before, as TIME-based fences are.
        assert!(t.fence > 999_999_999);
    }

    #[test]
    fn judging_a_claim_from_the_native_read() {
        let me = Claimant::new(42);
        let other = Claimant::new(43);
        let j = |r: Option<&StringRecord>, now, hash: &RequestHash, who| {
            judge(r, 1_061_000, Some(now), hash, who, 61_000)
        };
        assert_eq!(
            j(None, 1_000_000, &H, me),
            Verdict::Won(Fence::new(1_000_000_999))
        );
        let live = fresh(false);
        assert_eq!(
            j(Some(&live), 1_000_400, &H, me),
            Verdict::Won(Fence::new(1_000_000_999))
        );
        assert_eq!(
            j(Some(&live), 1_000_400, &H, other),
            Verdict::Conflict { left_ms: 600 }
        );
        assert_eq!(j(Some(&live), 1_000_400, &OTHER, other), Verdict::Mismatch);
        assert_eq!(j(Some(&live), 1_001_000, &H, other), Verdict::Script);
        let mut told = fresh(true);
        assert_eq!(j(Some(&told), 1_002_000, &H, other), Verdict::Script);
        told.told = true;
        assert_eq!(
            j(Some(&told), 1_002_000, &H, other),
            Verdict::HeldAgain(Fence::new(1_000_000_999))
        );
        let done = decode(written(b'c', 77, b"", b"resp")).unwrap();
        assert_eq!(
            j(Some(&done), 1_000_000, &OTHER, other),
            Verdict::Replay {
                response: Bytes::from_static(b"resp"),
                ttl_ms: Some(61_000)
            }
        );
        // Read without the server's time: a replay has no TTL to give, and another
        // claim's record in flight is read again with it.
        let timeless = |r: Option<&StringRecord>, who| judge(r, 1_061_000, None, &H, who, 61_000);
        assert_eq!(timeless(None, me), Verdict::Won(Fence::new(1_000_000_999)));
        assert_eq!(
            timeless(Some(&live), me),
            Verdict::Won(Fence::new(1_000_000_999))
        );
        assert_eq!(timeless(Some(&live), other), Verdict::Recheck);
        assert_eq!(
            judge(Some(&done), 1_061_000, None, &OTHER, other, 61_000),
            Verdict::Replay {
                response: Bytes::from_static(b"resp"),
                ttl_ms: None
            }
        );
        assert_eq!(j(Some(&done), 1_000_000, &H, other), Verdict::Mismatch);
        let released = decode(written(b'r', 77, b"", b"")).unwrap();
        assert_eq!(j(Some(&released), 1_000_000, &H, other), Verdict::Script);
    }

    #[test]
    fn a_completed_header_keeps_the_claim_and_takes_the_permits_fence() {
        let who = Claimant::new(42);
        let claimed = encode_claim(&H, who, 5_000, 65_000, true);
        let h = completed_header(&claimed, 1_700_000_000_123_999, 60_000).unwrap();
        let r = decode(Bytes::copy_from_slice(&h)).unwrap();
        assert_eq!(r.state, State::Completed);
        assert!(r.hold && !r.told);
        assert_eq!(r.fence, 1_700_000_000_123_999);
        assert_eq!(r.claimed_at, 1_700_000_000_123);
        assert_eq!((r.lease_end, r.completed_at), (0, 0));
        assert_eq!((r.lease, r.ttl, r.attempts), (5_000, 60_000, 1));
        assert_eq!((r.claimant, r.hash), (42, *H.as_bytes()));
        assert!(r.version.is_empty() && r.response.is_empty());
        // Only a fresh claim's header.
        assert!(completed_header(&claimed[..104], 1, 1).is_none());
        assert!(completed_header(&h, 1, 1).is_none());
        let mut renewed = claimed.clone();
        renewed[3..11].copy_from_slice(&7u64.to_be_bytes());
        assert!(completed_header(&renewed, 1, 1).is_none());
    }
}
