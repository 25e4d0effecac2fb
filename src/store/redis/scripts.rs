//! The Lua scripts: the only place a record is read and written. Redis runs each one
//! atomically, on one key, so they run unchanged on a cluster.

use redis::{Script, ScriptInvocation};
use std::time::Duration;

use super::millis;
use crate::store::ClaimRequest;

/// ARGV: request hash, lease ms, window ms, claimant id, hold (`1` or `0`).
/// Replies: {1, fence} won, {2, record, ms to expiry} replay, {3, ms left} conflict, {4} mismatch,
/// {5, fence, old fence} takeover, {6, fence, first} held for a person.
const CLAIM: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[2])
local ttl = lease + tonumber(ARGV[3])
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'h', 'l', 'o', 'k', 'n')
local s = r[1]
if not s then
  redis.call('HSET', KEYS[1], 's', 'i', 'f', now_us, 'h', ARGV[1], 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5], 'a', 1, 't', now)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, now_us}
end
local f = math.max(tonumber(r[2]) + 1, now_us)
if s == 'r' then
  redis.call('HSET', KEYS[1], 's', 'i', 'f', f, 'h', ARGV[1], 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5], 't', now)
  redis.call('HINCRBY', KEYS[1], 'a', 1)
  redis.call('HDEL', KEYS[1], 'n', 'd')
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, f}
end
if r[3] ~= ARGV[1] then
  return {4}
end
if s == 'c' then
  return {2, redis.call('HGET', KEYS[1], 'r'), redis.call('PTTL', KEYS[1])}
end
if r[5] == ARGV[4] then
  return {1, tonumber(r[2])}
end
local l = tonumber(r[4])
if now < l then
  return {3, l - now}
end
if r[6] == '1' then
  if r[7] then
    return {6, tonumber(r[2]), 0}
  end
  redis.call('HSET', KEYS[1], 'n', '1')
  return {6, tonumber(r[2]), 1}
end
redis.call('HSET', KEYS[1], 'f', f, 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5], 't', now)
redis.call('HINCRBY', KEYS[1], 'a', 1)
redis.call('PEXPIRE', KEYS[1], ttl)
return {5, f, tonumber(r[2])}
"#;

/// ARGV: fence, lease ms. Extends the lease of the in-flight record `fence` owns; the
/// record outlives the new lease.
const RENEW: &str = r#"
local r = redis.call('HMGET', KEYS[1], 's', 'f')
if r[1] ~= 'i' or tonumber(r[2]) ~= tonumber(ARGV[1]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'l', now + lease)
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
"#;

/// ARGV: fence, new state (`c` or `r`), window ms, strict (`1`: an operator's resolution,
/// refused when already finished), response (for `c`).
const FINISH: &str = r#"
local r = redis.call('HMGET', KEYS[1], 's', 'f')
if tonumber(r[2]) ~= tonumber(ARGV[1]) then
  return 0
end
if r[1] ~= 'i' then
  -- Already finished under this fence: a client-side retry of this very script.
  if ARGV[4] ~= '1' and ((r[1] == 'c' and ARGV[2] == 'c') or (r[1] == 'r' and ARGV[2] == 'r')) then
    return 1
  end
  return 0
end
if ARGV[2] == 'c' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 's', 'c', 'r', ARGV[5], 'd', now)
else
  redis.call('HSET', KEYS[1], 's', 'r')
end
redis.call('HDEL', KEYS[1], 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#;

const INSPECT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'l', 'r', 'k', 'a', 't', 'd')
if not r[1] then
  return 0
end
local left = -1
if r[3] then
  left = math.max(0, tonumber(r[3]) - now)
end
local s = r[1]
if s == 'i' and r[5] == '1' and left == 0 then
  s = 'u'
end
return {s, tonumber(r[2]), left, redis.call('PTTL', KEYS[1]), r[4] or '', r[5] or '0',
  tonumber(r[6] or 0), tonumber(r[7] or -1), tonumber(r[8] or -1)}
"#;

pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) renew: Script,
    pub(super) finish: Script,
    pub(super) inspect: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            claim: Script::new(CLAIM),
            renew: Script::new(RENEW),
            finish: Script::new(FINISH),
            inspect: Script::new(INSPECT),
        }
    }
}

pub(super) fn claim_invocation<'a>(
    scripts: &'a Scripts,
    req: ClaimRequest<'_>,
) -> ScriptInvocation<'a> {
    let mut inv = scripts.claim.key(req.key.as_str());
    inv.arg(&req.request_hash.as_bytes()[..])
        .arg(millis(req.lease))
        .arg(millis(req.window))
        .arg(req.claimant.get().to_string())
        .arg(if req.hold { "1" } else { "0" });
    inv
}

pub(super) fn finish_invocation<'a>(
    scripts: &'a Scripts,
    key: &str,
    fence: u64,
    response: Option<&[u8]>,
    window: Duration,
    strict: bool,
) -> ScriptInvocation<'a> {
    let mut inv = scripts.finish.key(key);
    inv.arg(fence)
        .arg(if response.is_some() { "c" } else { "r" })
        .arg(millis(window))
        .arg(if strict { "1" } else { "0" });
    if let Some(r) = response {
        inv.arg(r);
    }
    inv
}
