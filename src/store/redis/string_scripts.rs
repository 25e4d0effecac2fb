//! The string record's Lua: the scripts that run where a write must compare first (a
//! takeover, a reclaim after a release, the first claim told a record is held, completing,
//! releasing, renewing). Each reads the record with [`READ`] and unpacks its header in the
//! format [`super::string_record::LUA_FORMAT`] names; [`super::strings`] builds their calls.

use super::scripts::Script;
use super::string_record::{CLAIMANT_AT, HEADER_LEN, LUA_FORMAT};

/// Reads a record (`v` nil when absent, and then every field): a fresh fence, claim time and
/// lease end derive from the key's expiry. A value that is no record of this format (too
/// short, another tag) is refused with an `UNREADABLE` error, written over by no script;
/// a key of another type fails the `GET` (`WRONGTYPE`).
const READ: &str = r#"
local F = '{F}'
local v = redis.call('GET', KEYS[1])
local ok, tag, s, fl, f, le, ca, da, ls, tl, a, o, h, n
local fresh = false
if v then
  ok, tag, s, fl, f, le, ca, da, ls, tl, a, o, h, n = pcall(struct.unpack, F, v)
  if not ok or tag ~= 1 or #v < {H} + n then
    return redis.error_reply('UNREADABLE the key holds no record of this gateway')
  end
  if f == 0 then
    fresh = true
    ca = redis.call('PEXPIRETIME', KEYS[1]) - tl
    f = ca * 1000 + 999
    le = ca + ls
  end
end
"#;

/// ARGV: request hash, lease ms, window ms, claimant, hold. Replies as the ordered
/// routes' claim (see [`super::scripts`]): {1, fence} won, {2, record, ms} replay, {3, ms} conflict, {4} mismatch,
/// {5, fence, old} takeover, {6, fence, first} held.
const CLAIM: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[2])
local ttl = lease + tonumber(ARGV[3])
local function claim(fence, attempts)
  redis.call('SET', KEYS[1], struct.pack(F, 1, 105, ARGV[5] == '1' and 1 or 0, fence, now + lease,
    now, 0, lease, ttl, attempts, ARGV[4], ARGV[1], 0), 'PX', ttl)
end
if not v then
  claim(now_us, 1)
  return {1, now_us}
end
if s == 99 then
  if h ~= ARGV[1] then
    return {4}
  end
  return {2, string.sub(v, 106 + n), redis.call('PTTL', KEYS[1])}
end
local nf = math.max(f + 1, now_us)
if s == 114 then
  claim(nf, a + 1)
  return {1, nf}
end
if h ~= ARGV[1] then
  return {4}
end
if o == ARGV[4] then
  return {1, f}
end
if now < le then
  return {3, le - now}
end
if fl % 2 == 1 then
  if fl >= 2 then
    return {6, f, 0}
  end
  redis.call('SET', KEYS[1], struct.pack(F, 1, s, 3, f, le, ca, da, ls, tl, a, o, h, 0), 'KEEPTTL')
  return {6, f, 1}
end
claim(nf, a + 1)
return {5, nf, f}
"#;

/// ARGV: fence, lease ms, claimant (empty: by fence alone). Extends the lease of the
/// in-flight record `fence` owns; a fresh record is its claimant's (see [`OWNS`]).
const RENEW: &str = r#"
if s ~= 105 or not owns(ARGV[1], ARGV[3]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local ttl = math.max(redis.call('PTTL', KEYS[1]), lease)
redis.call('SET', KEYS[1], struct.pack(F, 1, s, fl, f, now + lease, ca, da, ls, tl, a, o, h, 0), 'PX', ttl)
return 1
"#;

/// The finish script's arguments, in either of two forms. The full form (a release, a
/// strict or fence-only finish, a completion of a record this gateway did not write with
/// its claim's `SET`): fence, new state (`c` or `r`), window ms, strict, response, as the
/// ordered routes' finish; then the claimant (empty: by fence alone; see [`OWNS`]). The compare form
/// (a completion, not strict, whose claim's `SET` wrote the record): the value that `SET`
/// wrote, the completed record whole, window ms. Its second argument is a record, never one
/// byte long, which tells the forms apart.
///
/// The compare form is the common case (a call that ended within its first lease): the key
/// then holds the value its claim wrote, and the completed record is a plain `SET`, with no
/// record unpacked and no string built in Lua, as `SET ... IFEQ` does natively (see
/// [`super::compare`]). Anything else falls through to [`FINISH`], which decides as for
/// the full form, its fence read from the completed record, its claimant from the claim's
/// value and its response cut from the completed record: each argument Redis turns into a
/// Lua string costs the call, so the compare form carries no other.
///
/// The staged form is the compare form of a large record (see [`super::staged`]): a second
/// key (KEYS[2]) holds the completed record, written by the same `MULTI` with the window as
/// its TTL, and ARGV is the claim's value and the window. Where the key holds the claim's
/// value the staged record is renamed onto it, and never becomes a Lua string; else it is
/// read, and the call falls through as the compare form's does.
const FINISH_ARGS: &str = r#"
local fence_arg, state_arg, window_arg, strict_arg, response_arg, claimant_arg =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if KEYS[2] then
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('RENAME', KEYS[2], KEYS[1])
    return 1
  end
  local done = redis.call('GET', KEYS[2])
  fence_arg, state_arg, window_arg, strict_arg, response_arg, claimant_arg =
    struct.unpack('>I8', done, 4), 'c', ARGV[2], '0', string.sub(done, {H} + 1),
    string.sub(ARGV[1], {C} + 1, {C} + 16)
elseif #ARGV[2] > 1 then
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
  end
  fence_arg, state_arg, strict_arg, response_arg, claimant_arg =
    struct.unpack('>I8', ARGV[2], 4), 'c', '0', string.sub(ARGV[2], {H} + 1),
    string.sub(ARGV[1], {C} + 1, {C} + 16)
end
"#;

/// Completes or releases (see [`FINISH_ARGS`] for its arguments): `1` written (or, not
/// strict, already in that state), `0` not this permit's record.
const FINISH: &str = r#"
if not owns(fence_arg, claimant_arg) then
  return 0
end
if s ~= 105 then
  if strict_arg ~= '1' and s == string.byte(state_arg) then
    return 1
  end
  return 0
end
-- No TIME: the record's TTL field becomes the window, so its completion time is its
-- expiry less the window, set by Redis's clock in this SET.
redis.call('SET', KEYS[1], struct.pack(F, 1, string.byte(state_arg), fl, f, 0, ca, 0, ls,
  tonumber(window_arg), a, o, h, 0) .. response_arg, 'PX', window_arg)
return 1
"#;

/// Whether the permit (`fence`, and the `claimant` of the claim that won, empty for an
/// operator's resolve) owns the record. A fresh record has had one owner, the claimant
/// whose `SET NX` wrote it, and its derived fence moves if its expiry does (a `MIGRATE`
/// sends the remaining TTL): it is owned by its claimant, and the owner's fence, the one
/// it was granted, is what gets written (with its claim time) when the record is next
/// written. Every other record is owned by its stored fence, and by its claimant where the
/// permit names one: two claims can share a fence number (a fresh record deleted and
/// claimed again within its millisecond), never a claimant.
const OWNS: &str = r#"
local function owns(fence, claimant)
  if fresh and claimant ~= '' then
    if o ~= claimant then
      return false
    end
    f = tonumber(fence)
    ca = math.floor(f / 1000)
    le = ca + ls
    return true
  end
  return f == tonumber(fence) and (claimant == '' or o == claimant)
end
"#;

/// Deletes a record, string or an ordered route's hash (an operator's forget): `1` deleted, `0` none, `-1`
/// not yet. A string record's next first claim takes its fence from the millisecond it is
/// made in, so a record is not deleted within the millisecond its own fence names (or
/// before it, should Redis's clock be behind the fence): the key claimed again at once
/// would be given the same fence number. The caller asks again a millisecond later. A
/// value that is not a record (no header to read) is deleted as it is.
const FORGET: &str = r#"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
  return redis.call('DEL', KEYS[1])
end
local v = redis.call('GET', KEYS[1])
local ok, _, s, fl, f, le, ca, da, ls, tl = pcall(struct.unpack, '{F}', v)
if ok then
  if f == 0 then
    f = (redis.call('PEXPIRETIME', KEYS[1]) - tl) * 1000 + 999
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now <= math.floor(f / 1000) then
    return -1
  end
end
return redis.call('DEL', KEYS[1])
"#;

/// An inspection as one script, its reply the inspection `MULTI`'s (value, expiry,
/// time): for a transaction Redis discarded (a slot migrating on Redis Cluster; a script
/// follows `ASK`, a transaction does not).
const INSPECT: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PEXPIRETIME', KEYS[1]), redis.call('TIME')}
"#;

/// The string record's scripts.
pub(super) struct StringScripts {
    pub(super) claim: Script,
    pub(super) renew: Script,
    pub(super) finish: Script,
    pub(super) forget: Script,
    pub(super) inspect: Script,
}

impl StringScripts {
    pub(super) fn new() -> Self {
        let script = |body: &str| {
            Script::new(
                format!("{READ}{body}")
                    .replace("{F}", LUA_FORMAT)
                    .replace("{H}", &HEADER_LEN.to_string()),
            )
        };
        Self {
            claim: script(CLAIM),
            renew: script(&format!("{OWNS}{RENEW}")),
            forget: Script::new(FORGET.replace("{F}", LUA_FORMAT)),
            inspect: Script::new(INSPECT.to_owned()),
            finish: Script::new(
                format!("{FINISH_ARGS}{READ}{OWNS}{FINISH}")
                    .replace("{F}", LUA_FORMAT)
                    .replace("{H}", &HEADER_LEN.to_string())
                    .replace("{C}", &CLAIMANT_AT.to_string()),
            ),
        }
    }
}
