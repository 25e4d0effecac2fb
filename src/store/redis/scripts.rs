//! The Lua scripts of an ordered route's records, each a hash (see [`super::ops`]): the only
//! place one is read and written, with the entity's record in the same step. Redis runs
//! each one atomically, on two keys in one slot, so they run unchanged on a cluster. The
//! call and its `NOSCRIPT` fallback serve the string record's scripts too.
//!
//! Each call is sent as `EVALSHA`; a node that answers `NOSCRIPT` gets that one call again
//! as `EVAL` with the body, which also caches the script there. redis-rs's own
//! `ScriptInvocation::invoke_async` answers `NOSCRIPT` with `SCRIPT LOAD` and a second
//! `EVALSHA` instead, and on a cluster that `SCRIPT LOAD` goes to the nodes of the
//! client's slot map: a master that just joined, reached through an `ASK` redirect (or a
//! `MOVED` one before the map is refreshed), is not among them, so the second `EVALSHA`
//! met `NOSCRIPT` again and the claim failed as "store unavailable". `EVAL` follows the
//! key, redirects included, so any node that serves the key runs the script.

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisResult, Value};
use std::time::Duration;

use super::millis;
use crate::store::{ClaimRequest, Order};

/// Lua helpers of the ordered scripts: versions compare byte by byte (Lua's `<` on strings
/// follows the server's locale). The entity record (KEYS[2], on ordered routes only) holds
/// `c` the highest version completed, and `i` the version in flight with `g` the fence
/// that owns it and `e` its lease end in server milliseconds. The helpers exist only on
/// ordered routes: Redis runs a script's top level on every call, and making closures there
/// was about half a microsecond of every claim's and completion's Redis CPU.
const ORDER_LIB: &str = r#"
local newer, extend
if KEYS[2] then
  newer = function(a, b)
    local n = math.min(#a, #b)
    for i = 1, n do
      local x, y = string.byte(a, i), string.byte(b, i)
      if x ~= y then
        return x > y
      end
    end
    return #a > #b
  end
  extend = function(key, ms)
    if redis.call('PTTL', key) < ms then
      redis.call('PEXPIRE', key, ms)
    end
  end
end
"#;

/// KEYS: the record, and on ordered routes the entity's record. ARGV: request hash, lease
/// ms, window ms, claimant id, hold (`1` or `0`), and on ordered routes the version.
/// Replies: {1, fence} won, {2, record, ms to expiry} replay, {3, ms left} conflict, {4} mismatch,
/// {5, fence, old fence} takeover, {6, fence, first} held for a person, {7} stale.
const CLAIM: &str = r#"
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'h', 'l', 'o', 'k', 'n')
local s = r[1]
-- A completed record is replayed, or refused to a different request: no clock needed.
-- The response is read only for a replay: a refusal costs nothing however large it is.
if s == 'c' then
  if r[3] ~= ARGV[1] then
    return {4}
  end
  return {2, redis.call('HGET', KEYS[1], 'r'), redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease = tonumber(ARGV[2])
local ttl = lease + tonumber(ARGV[3])
-- Ordered routes only: on a claim about to win, is it stale, or is another version's
-- live claim in flight? And the marks that claim leaves on the entity's record.
local gate, mark
if KEYS[2] then
  gate = function()
    local e = redis.call('HMGET', KEYS[2], 'c', 'i', 'e')
    if e[1] and not newer(ARGV[6], e[1]) then
      return {7}
    end
    if e[2] and tonumber(e[3]) > now then
      return {3, tonumber(e[3]) - now}
    end
    return nil
  end
  mark = function(fence)
    redis.call('HSET', KEYS[1], 'v', ARGV[6])
    redis.call('HSET', KEYS[2], 'i', ARGV[6], 'g', fence, 'e', now + lease)
    extend(KEYS[2], ttl)
  end
end
if not s then
  local refused = KEYS[2] and gate()
  if refused then
    return refused
  end
  redis.call('HSET', KEYS[1], 's', 'i', 'f', now_us, 'h', ARGV[1], 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5], 'a', 1, 't', now)
  redis.call('PEXPIRE', KEYS[1], ttl)
  if KEYS[2] then
    mark(now_us)
  end
  return {1, now_us}
end
local f = math.max(tonumber(r[2]) + 1, now_us)
if s == 'r' then
  local refused = KEYS[2] and gate()
  if refused then
    return refused
  end
  redis.call('HSET', KEYS[1], 's', 'i', 'f', f, 'h', ARGV[1], 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5], 't', now)
  redis.call('HINCRBY', KEYS[1], 'a', 1)
  redis.call('HDEL', KEYS[1], 'n', 'd')
  redis.call('PEXPIRE', KEYS[1], ttl)
  if KEYS[2] then
    mark(f)
  end
  return {1, f}
end
if r[3] ~= ARGV[1] then
  return {4}
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
local refused = KEYS[2] and gate()
if refused then
  return refused
end
redis.call('HSET', KEYS[1], 'f', f, 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5], 't', now)
redis.call('HINCRBY', KEYS[1], 'a', 1)
redis.call('PEXPIRE', KEYS[1], ttl)
if KEYS[2] then
  mark(f)
end
return {5, f, tonumber(r[2])}
"#;

/// ARGV: fence, lease ms. Extends the lease of the in-flight record `fence` owns; the
/// record outlives the new lease. On ordered routes (KEYS[2]) the entity's in-flight
/// marker, if this fence's, is extended alike.
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
if KEYS[2] and tonumber(redis.call('HGET', KEYS[2], 'g')) == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[2], 'e', now + lease)
  extend(KEYS[2], lease)
end
return 1
"#;

/// ARGV: fence, new state (`c` or `r`), window ms, strict (`1`: an operator's resolution,
/// refused when already finished), response (for `c`, else empty), and on ordered routes
/// (KEYS[2]) the version: its in-flight marker, if this fence's, is cleared, and a
/// completion raises the highest version (never lowers it). The lease field `l` goes: a
/// gateway of an earlier version, during a rolling upgrade, shows a lease wherever it is.
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
if KEYS[2] then
  local e = redis.call('HMGET', KEYS[2], 'c', 'g')
  if tonumber(e[2]) == tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[2], 'i', 'g', 'e')
  end
  if ARGV[2] == 'c' and (not e[1] or newer(ARGV[6], e[1])) then
    redis.call('HSET', KEYS[2], 'c', ARGV[6])
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    extend(KEYS[2], tonumber(ARGV[3]))
  end
end
return 1
"#;

const INSPECT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'l', 'r', 'k', 'a', 't', 'd', 'v')
if not r[1] then
  return 0
end
local left = -1
if r[1] == 'i' and r[3] then
  left = math.max(0, tonumber(r[3]) - now)
end
local s = r[1]
if s == 'i' and r[5] == '1' and left == 0 then
  s = 'u'
end
return {s, tonumber(r[2]), left, redis.call('PTTL', KEYS[1]), r[4] or '', r[5] or '0',
  tonumber(r[6] or 0), tonumber(r[7] or -1), tonumber(r[8] or -1), r[9] or ''}
"#;

/// A script's body and the SHA1 that names it in a node's script cache.
pub(super) struct Script {
    body: String,
    sha: String,
}

impl Script {
    pub(super) fn new(body: String) -> Self {
        // redis-rs computes the same SHA1 Redis does; only the hash is taken from it.
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Self { body, sha }
    }

    /// A call of this script on `key` (`KEYS[1]`).
    pub(super) fn key(&self, key: &str) -> Call<'_> {
        self.call(key, None, 0)
    }

    /// A call of this script on `key` and, on ordered routes, the entity's record
    /// (`KEYS[2]`), its arguments (about `arg_bytes` long) to follow.
    pub(super) fn call(&self, key: &str, second: Option<&str>, arg_bytes: usize) -> Call<'_> {
        let keys = 1 + usize::from(second.is_some());
        let key_bytes = key.len() + second.map_or(0, str::len);
        // Sized once: growing the command's buffers arg by arg cost more than encoding.
        let mut cmd = Cmd::with_capacity(
            3 + keys + 12,
            self.sha.len() + 8 + key_bytes + arg_bytes + 64,
        );
        cmd.arg("EVALSHA").arg(&self.sha).arg(keys).arg(key);
        if let Some(second) = second {
            cmd.arg(second);
        }
        Call { script: self, cmd }
    }
}

/// One call of a script: `EVALSHA`, its keys and its arguments, built once and sent by
/// [`Call::invoke`] (each argument copied into the command once, the response included).
pub(super) struct Call<'a> {
    script: &'a Script,
    /// `EVALSHA sha numkeys keys... args...`.
    cmd: Cmd,
}

impl Call<'_> {
    pub(super) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// `EVALSHA`, or `EVAL` where the node lacks the script (see the module's comment).
    /// Either way the script runs at most once: `NOSCRIPT` means it did not run.
    pub(super) async fn invoke(&self, con: &mut impl ConnectionLike) -> RedisResult<Value> {
        match self.cmd.query_async(con).await {
            Err(e) if no_script(&e) => {
                tracing::debug!("a Redis node lacks the script; sending it with EVAL");
                self.eval().query_async(con).await
            }
            reply => reply,
        }
    }

    /// The call as one command, `EVAL` with the body (`eval`) or `EVALSHA`, for a
    /// transaction that carries it.
    pub(super) fn command(&self, eval: bool) -> Cmd {
        if eval {
            self.eval()
        } else {
            self.cmd.clone()
        }
    }

    /// The command's words, for tests.
    #[cfg(test)]
    pub(super) fn args(&self) -> Vec<Vec<u8>> {
        tests::words(&self.cmd)
    }

    /// The same call as `EVAL` with the script's body: its keys and arguments are the
    /// `EVALSHA`'s after the verb and the hash.
    fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&self.script.body);
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

/// The node does not hold the script: a master that joined the cluster since, a restart,
/// `SCRIPT FLUSH`.
pub(super) fn no_script(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) renew: Script,
    pub(super) finish: Script,
    pub(super) inspect: Script,
    /// The string record's.
    pub(super) string: super::string_scripts::StringScripts,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            claim: Script::new(format!("{ORDER_LIB}{CLAIM}")),
            renew: Script::new(format!("{ORDER_LIB}{RENEW}")),
            finish: Script::new(format!("{ORDER_LIB}{FINISH}")),
            inspect: Script::new(INSPECT.to_owned()),
            string: super::string_scripts::StringScripts::new(),
        }
    }
}

pub(super) fn claim_invocation<'a>(scripts: &'a Scripts, req: ClaimRequest<'_>) -> Call<'a> {
    let entity = req.order.map(|order| order.entity.as_str());
    let mut inv = scripts.claim.call(req.key.as_str(), entity, 128);
    inv.arg(&req.request_hash.as_bytes()[..])
        .arg(millis(req.lease))
        .arg(millis(req.window))
        .arg(req.claimant.get().to_string())
        .arg(if req.hold { "1" } else { "0" });
    if let Some(order) = req.order {
        inv.arg(order.version);
    }
    inv
}

pub(super) fn renew_invocation<'a>(
    scripts: &'a Scripts,
    key: &str,
    fence: u64,
    lease: Duration,
    order: Option<Order<'_>>,
) -> Call<'a> {
    let entity = order.map(|order| order.entity.as_str());
    let mut inv = scripts.renew.call(key, entity, 40);
    inv.arg(fence).arg(millis(lease));
    inv
}

pub(super) fn finish_invocation<'a>(
    scripts: &'a Scripts,
    key: &str,
    fence: u64,
    response: Option<&[u8]>,
    window: Duration,
    strict: bool,
    order: Option<Order<'_>>,
) -> Call<'a> {
    let entity = order.map(|order| order.entity.as_str());
    let mut inv = finish_call(
        &scripts.finish,
        key,
        entity,
        fence,
        response,
        window,
        strict,
    );
    if let Some(order) = order {
        inv.arg(order.version);
    }
    inv
}

/// A completion (`response`) or release (`None`) on one record, by the hash or the string
/// record's finish script: the arguments are the same.
pub(super) fn finish_call<'a>(
    script: &'a Script,
    key: &str,
    entity: Option<&str>,
    fence: u64,
    response: Option<&[u8]>,
    window: Duration,
    strict: bool,
) -> Call<'a> {
    let response_bytes = response.map_or(0, <[u8]>::len);
    let mut inv = script.call(key, entity, response_bytes + 96);
    inv.arg(fence)
        .arg(if response.is_some() { "c" } else { "r" })
        .arg(millis(window))
        .arg(if strict { "1" } else { "0" })
        .arg(response.unwrap_or_default());
    inv
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A command's words, as sent.
    pub(in crate::store::redis) fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"<cursor>".to_vec(),
            })
            .collect()
    }

    #[test]
    fn a_call_sends_its_keys_before_its_arguments_and_eval_sends_the_same() {
        let script = Script::new("return 1".to_owned());
        let mut call = script.call("rec", Some("entity"), 8);
        call.arg(7u64).arg(&b""[..]).arg(&b"body"[..]);
        let sha = words(&call.cmd);
        assert_eq!(
            sha,
            [
                &b"EVALSHA"[..],
                script.sha.as_bytes(),
                b"2",
                b"rec",
                b"entity",
                b"7",
                b"",
                b"body"
            ]
        );
        let eval = words(&call.eval());
        assert_eq!(eval[..2], [b"EVAL".to_vec(), b"return 1".to_vec()]);
        assert_eq!(eval[2..], sha[2..]);
        let one = words(&script.key("k").cmd);
        assert_eq!(one[2..], [b"1".to_vec(), b"k".to_vec()]);
    }
}
