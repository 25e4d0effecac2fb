//! The string record's commands: a claim and an inspection are one `MULTI` of native
//! commands; Lua runs only where a write must compare first (a takeover, a reclaim after
//! a release, the first claim told a record is held, completing, releasing, renewing).
//! The record's format is [`super::string_record`]'s.
//!
//! Ordered routes (`order`) keep their records as hashes (see [`super::scripts`]): their
//! claim, renewal and settlement touch the entity's record in the same script.

use bytes::Bytes;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};
use std::time::{Duration, UNIX_EPOCH};

use super::compare::CompletedValue;
use super::scripts::Call;
use super::string_record::{
    completed_header, decode, encode_claim, judge, State, StringRecord, Verdict, CLAIMANT_AT,
    HEADER_LEN,
};
use super::string_scripts::StringScripts;
use super::{int, millis, protocol};
use crate::store::{
    Claim, ClaimRequest, Fence, Owner, Permit, RecordInfo, RecordState, StoreError,
};

/// The claim's `SET ... NX PX ttl GET` and the key's expiry in one `MULTI`, and the
/// server's time when `with_time` (a replay's TTL for the near-cache; whether another
/// claim's lease has ended): the value decides the claim without a script in every case
/// but a takeover, a reclaim and the first claim told a record is held.
pub(super) fn claim_transaction(
    req: ClaimRequest<'_>,
    value: &[u8],
    with_time: bool,
) -> redis::Pipeline {
    let key = req.key.as_str();
    let mut pipe = redis::Pipeline::with_capacity(3);
    pipe.atomic()
        .ignore_errors()
        .cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(claim_ttl(req))
        .arg("GET")
        .cmd("PEXPIRETIME")
        .arg(key);
    if with_time {
        pipe.cmd("TIME");
    }
    pipe
}

/// The value a first claim writes (a fresh record, see [`super::string_record`]).
pub(super) fn claim_value(req: ClaimRequest<'_>) -> Bytes {
    Bytes::from(encode_claim(
        req.request_hash,
        req.claimant,
        millis(req.lease),
        claim_ttl(req),
        req.hold,
    ))
}

fn claim_ttl(req: ClaimRequest<'_>) -> u64 {
    millis(req.lease) + millis(req.window)
}

/// The record (`None` when absent), its expiry and, when asked for, the server's time
/// in ms, from a `MULTI` whose first reply is the value, then `PEXPIRETIME` and `TIME`.
fn read_reply(
    v: Value,
    what: &str,
) -> Result<(Option<StringRecord>, u64, Option<u64>), StoreError> {
    let bad = |v: &Value| protocol(what, v);
    let Value::Array(items) = &v else {
        return Err(bad(&v));
    };
    let (value, expires, now) = match &items[..] {
        [value, expires] => (value, expires, None),
        [value, expires, Value::Array(time)] => {
            let (Some(secs), Some(micros)) =
                (time.first().and_then(int), time.get(1).and_then(int))
            else {
                return Err(bad(&v));
            };
            (value, expires, Some((secs * 1000 + micros / 1000) as u64))
        }
        _ => return Err(bad(&v)),
    };
    let expires = int(expires).ok_or_else(|| bad(&v))?;
    let record = match value {
        Value::Nil => None,
        Value::BulkString(b) => Some(
            decode(Bytes::copy_from_slice(b)).map_err(|e| StoreError::Unreadable(e.to_string()))?,
        ),
        _ => return Err(bad(&v)),
    };
    Ok((record, expires.max(0) as u64, now))
}

/// What the claim's `MULTI` decided, and the TTL of a replayed record.
pub(super) enum Native {
    Decided(Claim, Option<Duration>),
    /// Read again with the server's time.
    Recheck,
    /// Only the claim script can decide.
    Script,
}

/// `value` is what the claim's `SET` wrote: the permit of a claim that won keeps it, for
/// a completion that compares the record with it (see [`super::compare`]).
pub(super) fn parse_native_claim(
    v: Value,
    req: ClaimRequest<'_>,
    value: &Bytes,
) -> Result<Native, StoreError> {
    let (record, expires, now) = read_reply(v, "string claim")?;
    let verdict = judge(
        record.as_ref(),
        expires,
        now,
        req.request_hash,
        req.claimant,
        claim_ttl(req),
    );
    let won = |fence| Claim::Won {
        permit: Permit::new(req.key, fence)
            .claimed_by(req.claimant)
            .wrote(value.clone()),
        takeover: None,
    };
    let (claim, ttl) = match verdict {
        Verdict::Won(fence) => (won(fence), None),
        Verdict::Replay { response, ttl_ms } => (
            Claim::Replay(response),
            ttl_ms.filter(|ms| *ms > 0).map(Duration::from_millis),
        ),
        Verdict::Mismatch => (Claim::Mismatch, None),
        Verdict::Conflict { left_ms } => (
            Claim::Conflict {
                retry_after: Duration::from_millis(left_ms),
            },
            None,
        ),
        Verdict::HeldAgain(fence) => (
            Claim::Held {
                fence,
                first: false,
            },
            None,
        ),
        Verdict::Recheck => return Ok(Native::Recheck),
        Verdict::Script => return Ok(Native::Script),
    };
    Ok(Native::Decided(claim, ttl))
}

/// The claim script's call, for what the native read could not decide.
pub(super) fn claim_invocation<'a>(scripts: &'a StringScripts, req: ClaimRequest<'_>) -> Call<'a> {
    let mut inv = scripts.claim.key(req.key.as_str());
    inv.arg(&req.request_hash.as_bytes()[..])
        .arg(millis(req.lease))
        .arg(millis(req.window))
        .arg(&req.claimant.get().to_be_bytes()[..])
        .arg(if req.hold { "1" } else { "0" });
    inv
}

pub(super) fn renew_invocation<'a>(
    scripts: &'a StringScripts,
    key: &str,
    fence: u64,
    claimant: Option<u128>,
    lease: Duration,
) -> Call<'a> {
    let mut inv = scripts.renew.key(key);
    inv.arg(fence)
        .arg(millis(lease))
        .arg(claimant_arg(claimant));
    inv
}

/// A claimant as the scripts compare it: its 16 bytes as stored, or empty for none.
fn claimant_arg(claimant: Option<u128>) -> Vec<u8> {
    claimant.map_or_else(Vec::new, |c| c.to_be_bytes().to_vec())
}

/// The completed record's header, the response and the claim's value, for a completion
/// sent in the compare form (or staged, see [`super::staged`]): one, not strict, whose
/// claim's `SET` wrote the record and whose claimant is the permit's (the compare form's
/// fall-through reads the fence from the completed record and the claimant from the
/// claim's value).
/// A completion in the compare form: the completed record's header, the response, and
/// the value the claim's `SET` wrote.
pub(super) type Fresh<'a> = ([u8; HEADER_LEN], &'a [u8], &'a [u8]);

pub(super) fn fresh_completion<'a>(
    Owner {
        fence,
        claimant,
        claimed,
    }: Owner<'a>,
    response: Option<&'a [u8]>,
    window: Duration,
    strict: bool,
) -> Option<Fresh<'a>> {
    let (response, claimed) = response.zip(claimed).filter(|_| !strict)?;
    let header = completed_header(claimed, fence, millis(window))?;
    let claimant = claimant?.to_be_bytes();
    (header[CLAIMANT_AT..CLAIMANT_AT + claimant.len()] == claimant)
        .then_some((header, response, claimed))
}

/// A completion (`response`) or release (`None`) by `owner`. A completion, not strict,
/// whose claim's `SET` wrote the record (the owner knows the value it wrote, and is the
/// claimant named in it: `fresh`, from [`fresh_completion`]) is sent in the compare form
/// (see `FINISH_ARGS` in [`super::string_scripts`]), every other finish in the full form.
pub(super) fn finish_call<'a>(
    scripts: &'a StringScripts,
    key: &str,
    owner: Owner<'_>,
    response: Option<&[u8]>,
    window: Duration,
    strict: bool,
    fresh: Option<Fresh<'_>>,
) -> Call<'a> {
    if let Some((header, response, claimed)) = fresh {
        let size = claimed.len() + header.len() + response.len() + 20;
        let mut inv = scripts.finish.call(key, None, size);
        inv.arg(claimed)
            .arg(CompletedValue { header, response })
            .arg(millis(window));
        return inv;
    }
    let mut inv = super::scripts::finish_call(
        &scripts.finish,
        key,
        None,
        owner.fence,
        response,
        window,
        strict,
    );
    inv.arg(claimant_arg(owner.claimant));
    inv
}

/// An inspection: the value, its expiry and the server's time in one `MULTI`.
pub(super) fn inspect_pipeline(key: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .ignore_errors()
        .cmd("GET")
        .arg(key)
        .cmd("PEXPIRETIME")
        .arg(key)
        .cmd("TIME");
    pipe
}

pub(super) fn parse_inspect(v: Value) -> Result<Option<RecordInfo>, StoreError> {
    let (record, expires, now) = read_reply(v, "string inspect")?;
    let Some(r) = record else {
        return Ok(None);
    };
    let now = now.ok_or_else(|| StoreError::Protocol("string inspect: no TIME".into()))?;
    let times = r.settled_at(expires);
    let completed_at = r.completed_at(expires);
    let at = |ms: u64| (ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(ms));
    let lease_left = (r.state == State::InFlight).then(|| times.lease_end.saturating_sub(now));
    let state = match r.state {
        State::InFlight if r.hold && lease_left == Some(0) => RecordState::Unknown,
        State::InFlight => RecordState::InFlight,
        State::Completed => RecordState::Completed,
        State::Released => RecordState::Released,
    };
    Ok(Some(RecordInfo {
        state,
        fence: Fence::new(times.fence),
        held: r.hold,
        lease_left: lease_left.map(Duration::from_millis),
        expires_in: (expires > 0).then(|| Duration::from_millis(expires.saturating_sub(now))),
        response: (r.state == State::Completed).then_some(r.response),
        attempts: r.attempts,
        claimed_at: at(times.claimed_at),
        completed_at: at(completed_at),
        version: (!r.version.is_empty()).then_some(r.version),
    }))
}

/// `None` for a transaction Redis discarded before running any of it (`EXECABORT`): a
/// queued command was refused, as on Redis Cluster while the key's slot migrates (the
/// source answers `ASK` for a key it lacks, and the redis crate does not follow it for a
/// transaction), or for memory. A single command (a script) may still get through.
pub(super) fn discarded<T>(e: redis::RedisError) -> RedisResult<Option<T>> {
    if e.code() == Some("EXECABORT") {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Sends a `MULTI`; a command in it that failed fails the whole (on a key that is not a
/// string, the first command's `WRONGTYPE`: a read, or an `NX` write that did not happen).
pub(super) async fn send(
    pipe: &redis::Pipeline,
    con: &mut (impl ConnectionLike + Send),
) -> RedisResult<Value> {
    let v: Value = pipe.query_async(con).await?;
    if let Value::Array(items) = &v {
        if let Some(err) = items.iter().find_map(|i| match i {
            Value::ServerError(e) => Some(e),
            _ => None,
        }) {
            return Err(err.clone().into());
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::scripts::tests::words;
    use crate::store::{Claimant, RequestHash};

    const CLAIMANT: u128 = 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10;

    #[test]
    fn the_claim_is_one_transaction_of_native_commands() {
        let key = crate::store::StoreKey::from_raw("dedupe:k\r\n");
        let hash = RequestHash::new([7; 32]);
        let req = ClaimRequest {
            key: &key,
            request_hash: &hash,
            lease: Duration::from_millis(1_500),
            window: Duration::from_secs(3_600),
            claimant: Claimant::new(CLAIMANT),
            hold: false,
            order: None,
        };
        let value = claim_value();
        for with_time in [false, true] {
            let pipe = claim_transaction(req, &value, with_time);
            assert!(pipe.is_transaction());
            let words: Vec<_> = pipe.cmd_iter().map(words).collect();
            assert_eq!(words[0][..2], [b"SET".to_vec(), b"dedupe:k\r\n".to_vec()]);
            assert_eq!(words[0][2], value);
            let rest: Vec<&[u8]> = words[0][3..].iter().map(Vec::as_slice).collect();
            assert_eq!(rest, [&b"NX"[..], b"PX", b"3601500", b"GET"]);
            assert_eq!(
                words[1],
                [b"PEXPIRETIME".to_vec(), b"dedupe:k\r\n".to_vec()]
            );
            assert_eq!(
                words.len(),
                2 + usize::from(with_time),
                "with_time {with_time}"
            );
        }
    }

    fn claim_value() -> Vec<u8> {
        encode_claim(
            &RequestHash::new([7; 32]),
            Claimant::new(CLAIMANT),
            1_000,
            61_000,
            false,
        )
    }

    /// The finish script's call for these arguments.
    fn finish_invocation<'a>(
        scripts: &'a StringScripts,
        key: &str,
        owner: Owner<'_>,
        response: Option<&[u8]>,
        window: Duration,
        strict: bool,
    ) -> Call<'a> {
        let fresh = fresh_completion(owner, response, window, strict);
        finish_call(scripts, key, owner, response, window, strict, fresh)
    }

    /// The arguments after `EVALSHA sha numkeys key`.
    fn args(call: &Call<'_>) -> Vec<Vec<u8>> {
        call.args().into_iter().skip(4).collect()
    }

    fn owner(claimant: u128, claimed: &[u8]) -> Owner<'_> {
        Owner {
            fence: 1_780_000_000_123_999,
            claimant: Some(claimant),
            claimed: Some(claimed),
        }
    }

    #[test]
    fn a_completion_of_its_own_claim_sends_the_claim_and_the_completed_record_only() {
        let scripts = StringScripts::new();
        let claimed = claim_value();
        let window = Duration::from_secs(60);
        let own = owner(CLAIMANT, &claimed);
        let call = finish_invocation(&scripts, "k", own, Some(b"body"), window, false);
        let header = completed_header(&claimed, own.fence, 60_000).unwrap();
        assert_eq!(
            args(&call),
            [
                claimed.clone(),
                [&header[..], b"body"].concat(),
                b"60000".to_vec()
            ]
        );
    }

    #[test]
    fn strict_foreign_and_release_finishes_send_the_full_form() {
        let scripts = StringScripts::new();
        let claimed = claim_value();
        let window = Duration::from_secs(60);
        let full = |call: Call<'_>| {
            let a = args(&call);
            assert_eq!(a.len(), 6, "{a:?}");
            assert!(a[1] == b"c" || a[1] == b"r", "{a:?}");
        };
        let own = owner(CLAIMANT, &claimed);
        full(finish_invocation(
            &scripts,
            "k",
            own,
            Some(b"b"),
            window,
            true,
        ));
        full(finish_invocation(&scripts, "k", own, None, window, false));
        let other = owner(CLAIMANT + 1, &claimed);
        full(finish_invocation(
            &scripts,
            "k",
            other,
            Some(b"b"),
            window,
            false,
        ));
        let by_fence = Owner::by_fence(own.fence);
        full(finish_invocation(
            &scripts,
            "k",
            by_fence,
            Some(b"b"),
            window,
            false,
        ));
    }
}
