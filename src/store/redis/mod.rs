//! Redis and Redis Cluster backends.
//!
//! Each record is one Redis hash (`s` state, `f` fence, `h` request hash, `l` lease end in
//! server milliseconds, `o` the claimant, `k` `1` when the route holds unknown outcomes,
//! `n` set once a claim was told the record is held, `r` encoded response), so every script touches exactly one key and
//! runs unchanged on a cluster. Each step (claim, complete, release) is one `EVALSHA` round
//! trip: the scripts are the only place a record is read and written, and Redis runs a
//! script atomically. Lease time comes from the Redis server's `TIME`, so gateways with
//! skewed clocks agree on when a lease has expired.
//!
//! The connection to one server is kept by [`link`]: replaced when its replies stop, and an
//! operation that finds it closed is sent once more on a fresh one (see
//! [`RedisStore::query`] for why that is safe).
//!
//! Fences are `max(previous + 1, server time in microseconds)`: they grow on every
//! takeover and reclaim, and keep growing when a record expires or is deleted and the key
//! is claimed afresh, so a stale owner never matches a later owner's fence. (They stay
//! below 2^53, exact in Lua's doubles.) Finishing is idempotent for the same fence, so a
//! client-side retry of a script that already ran does not report a false fence-out.

mod access;
mod link;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Script, ScriptInvocation, Value};

use self::link::{Link, NoConnection};
use super::health::{ClusterReplies, NodeReplies};
use super::{bounded, Claim, ClaimRequest, RecordInfo, RecordState, StoreError};
use crate::config::RedisAccess;

/// ARGV: request hash, lease ms, window ms, claimant id, hold (`1` or `0`).
/// Replies: {1, fence} won, {2, record} replay, {3, ms left} conflict, {4} mismatch,
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
  redis.call('HSET', KEYS[1], 's', 'i', 'f', now_us, 'h', ARGV[1], 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, now_us}
end
local f = math.max(tonumber(r[2]) + 1, now_us)
if s == 'r' then
  redis.call('HSET', KEYS[1], 's', 'i', 'f', f, 'h', ARGV[1], 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5])
  redis.call('HDEL', KEYS[1], 'n')
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, f}
end
if r[3] ~= ARGV[1] then
  return {4}
end
if s == 'c' then
  return {2, redis.call('HGET', KEYS[1], 'r')}
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
redis.call('HSET', KEYS[1], 'f', f, 'l', now + lease, 'o', ARGV[4], 'k', ARGV[5])
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
  redis.call('HSET', KEYS[1], 's', 'c', 'r', ARGV[5])
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
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'l', 'r', 'k')
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
return {s, tonumber(r[2]), left, redis.call('PTTL', KEYS[1]), r[4] or '', r[5] or '0'}
"#;

struct Scripts {
    claim: Script,
    renew: Script,
    finish: Script,
    inspect: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            claim: Script::new(CLAIM),
            renew: Script::new(RENEW),
            finish: Script::new(FINISH),
            inspect: Script::new(INSPECT),
        }
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn no_connection(e: NoConnection) -> StoreError {
    StoreError::Unavailable(format!("no connection to Redis: {}", e.0))
}

/// The error shows the connection is unusable (closed, reset, out of step): the command
/// may not have reached Redis, and a fresh connection is needed either way.
fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_unrecoverable_error()
}

fn protocol(what: &str, v: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: {v:?}"))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn millis(d: Duration) -> u64 {
    // Redis rejects a zero PEXPIRE; config validation already refuses zero durations.
    (d.as_millis() as u64).max(1)
}

fn claim_invocation<'a>(scripts: &'a Scripts, req: ClaimRequest<'_>) -> ScriptInvocation<'a> {
    let mut inv = scripts.claim.key(req.key.as_str());
    inv.arg(&req.request_hash.as_bytes()[..])
        .arg(millis(req.lease))
        .arg(millis(req.window))
        .arg(req.claimant.get().to_string())
        .arg(if req.hold { "1" } else { "0" });
    inv
}

fn finish_invocation<'a>(
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

fn parse_claim(v: Value) -> Result<Claim, StoreError> {
    let Value::Array(mut items) = v else {
        return Err(protocol("claim", &v));
    };
    let code = items.first().and_then(int);
    let bad = |items: &[Value]| protocol("claim", &Value::Array(items.to_vec()));
    let fence_at = |i: usize| {
        items
            .get(i)
            .and_then(int)
            .map(|f| super::Fence::new(f as u64))
            .ok_or_else(|| bad(&items))
    };
    match code {
        Some(1) => Ok(Claim::Won {
            fence: fence_at(1)?,
            takeover: None,
        }),
        Some(5) => Ok(Claim::Won {
            fence: fence_at(1)?,
            takeover: Some(fence_at(2)?),
        }),
        Some(6) => Ok(Claim::Held {
            fence: fence_at(1)?,
            first: items.get(2).and_then(int) == Some(1),
        }),
        // Take the record out of the reply rather than copy it: it can be large.
        Some(2) if matches!(items.get(1), Some(Value::BulkString(_))) => {
            match items.swap_remove(1) {
                Value::BulkString(b) => Ok(Claim::Replay(Bytes::from(b))),
                other => Err(protocol("claim record", &other)),
            }
        }
        Some(3) => Ok(Claim::Conflict {
            retry_after: Duration::from_millis(
                items
                    .get(1)
                    .and_then(int)
                    .ok_or_else(|| bad(&items))?
                    .max(0) as u64,
            ),
        }),
        Some(4) => Ok(Claim::Mismatch),
        _ => Err(bad(&items)),
    }
}

fn parse_finish(v: Value) -> Result<bool, StoreError> {
    match int(&v) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("finish", &v)),
    }
}

fn parse_renew(v: Value) -> Result<bool, StoreError> {
    match int(&v) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("renew", &v)),
    }
}

fn parse_inspect(v: Value) -> Result<Option<RecordInfo>, StoreError> {
    let items = match &v {
        Value::Int(0) => return Ok(None),
        Value::Array(items) if items.len() == 6 => items,
        _ => return Err(protocol("inspect", &v)),
    };
    let state = match &items[0] {
        Value::BulkString(s) if s == b"i" => RecordState::InFlight,
        Value::BulkString(s) if s == b"c" => RecordState::Completed,
        Value::BulkString(s) if s == b"r" => RecordState::Released,
        Value::BulkString(s) if s == b"u" => RecordState::Unknown,
        _ => return Err(protocol("inspect state", &v)),
    };
    let fence = int(&items[1]).ok_or_else(|| protocol("inspect fence", &v))? as u64;
    let left = int(&items[2]).ok_or_else(|| protocol("inspect lease", &v))?;
    let pttl = int(&items[3]).ok_or_else(|| protocol("inspect ttl", &v))?;
    let response = match &items[4] {
        Value::BulkString(b) if !b.is_empty() => Some(Bytes::from(b.clone())),
        _ => None,
    };
    Ok(Some(RecordInfo {
        state,
        fence: super::Fence::new(fence),
        held: matches!(&items[5], Value::BulkString(b) if b == b"1"),
        lease_left: (left >= 0).then(|| Duration::from_millis(left as u64)),
        expires_in: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
        response,
    }))
}

/// The operations, the same on both backends: each builds its command once and hands
/// `query` a closure that sends it on a connection (possibly twice, see
/// [`RedisStore::query`]); replies are parsed apart from the I/O.
macro_rules! redis_backend {
    ($name:ident) => {
        impl $name {
            /// Per-operation deadline.
            pub fn timeout(&self) -> Duration {
                self.timeout
            }

            pub(super) async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
                let inv = &claim_invocation(&self.scripts, req);
                let v = self
                    .query(move |mut con| async move { inv.invoke_async(&mut con).await })
                    .await?;
                parse_claim(v)
            }

            pub(super) async fn complete(
                &self,
                key: &str,
                fence: u64,
                record: Bytes,
                window: Duration,
                strict: bool,
            ) -> Result<bool, StoreError> {
                let inv =
                    &finish_invocation(&self.scripts, key, fence, Some(&record), window, strict);
                let v = self
                    .query(move |mut con| async move { inv.invoke_async(&mut con).await })
                    .await?;
                parse_finish(v)
            }

            pub(super) async fn release(
                &self,
                key: &str,
                fence: u64,
                window: Duration,
                strict: bool,
            ) -> Result<bool, StoreError> {
                let inv = &finish_invocation(&self.scripts, key, fence, None, window, strict);
                let v = self
                    .query(move |mut con| async move { inv.invoke_async(&mut con).await })
                    .await?;
                parse_finish(v)
            }

            pub(super) async fn renew(
                &self,
                key: &str,
                fence: u64,
                lease: Duration,
            ) -> Result<bool, StoreError> {
                let mut inv = self.scripts.renew.key(key);
                inv.arg(fence).arg(millis(lease));
                let inv = &inv;
                let v = self
                    .query(move |mut con| async move { inv.invoke_async(&mut con).await })
                    .await?;
                parse_renew(v)
            }

            pub(super) async fn inspect(
                &self,
                key: &str,
            ) -> Result<Option<RecordInfo>, StoreError> {
                let inv = &self.scripts.inspect.key(key);
                let v = self
                    .query(move |mut con| async move { inv.invoke_async(&mut con).await })
                    .await?;
                parse_inspect(v)
            }

            pub(super) async fn forget(&self, key: &str) -> Result<bool, StoreError> {
                let cmd = &redis::cmd("DEL").arg(key).clone();
                let n: i64 = self
                    .query(move |mut con| async move { cmd.query_async(&mut con).await })
                    .await?;
                Ok(n > 0)
            }

            pub(super) async fn ping(&self) -> Result<(), StoreError> {
                let cmd = &redis::cmd("PING");
                let _: String = self
                    .query(move |mut con| async move { cmd.query_async(&mut con).await })
                    .await?;
                Ok(())
            }
        }
    };
}

/// One Redis server through one multiplexed connection shared by every request, kept by
/// a background task that replaces it when it closes or stops answering.
#[derive(Clone)]
pub struct RedisStore {
    link: Link,
    /// `host:port`, for store checks.
    node: std::sync::Arc<str>,
    scripts: std::sync::Arc<Scripts>,
    timeout: Duration,
}

impl RedisStore {
    /// Prepares the client and starts connecting in the background (a warning is logged
    /// if Redis cannot be reached; the store works as soon as it can). Call from within
    /// the Tokio runtime.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::with_access(url, &RedisAccess::default(), timeout)
    }

    /// As [`RedisStore::new`], with TLS material and a password (`rediss://`, ACL users).
    pub fn with_access(
        url: &str,
        access: &RedisAccess,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = access::client(url, access).map_err(unavailable)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StoreError::Unavailable(format!("no async runtime: {e}")))?;
        let node = client.get_connection_info().addr().to_string();
        Ok(Self {
            node: node.into(),
            link: Link::start(client, timeout, &runtime),
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
        })
    }

    /// Runs `op` on the connection within `store.timeout`.
    ///
    /// An error that shows the connection is gone (Redis closed it while idle, `CLIENT
    /// KILL`, a restart, a proxy's idle cut: broken pipe, reset, EOF) is sent once more on
    /// a fresh connection, within the same deadline. Usually the command never left the
    /// gateway; but the error cannot always tell "never sent" from "ran, reply lost", and
    /// the retry is safe either way because every operation is idempotent for its caller:
    /// a claim carries its claimant id, and the same claimant claiming an in-flight record
    /// again wins again with the same fence (never a conflict with itself, never a second
    /// fence); complete and release under the same fence report success when the record
    /// already holds that outcome; inspect and ping read; forget deletes.
    ///
    /// A timeout tells the connection it may have stopped answering: it is probed and,
    /// if silent, replaced (see [`link`]).
    async fn query<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // The connection the operation is waiting on (0: none yet, still dialling).
        let waiting_on = AtomicU64::new(0);
        let attempt = async {
            let first = self.link.connection(None).await.map_err(no_connection)?;
            waiting_on.store(first.id, Ordering::Relaxed);
            let err = match op(first.con).await {
                Ok(v) => return Ok(v),
                Err(e) if connection_lost(&e) => e,
                Err(e) => return Err(unavailable(e)),
            };
            self.link.lost(first.id);
            tracing::debug!(error = %err, "Redis connection lost; sending once more on a fresh one");
            waiting_on.store(0, Ordering::Relaxed);
            let fresh = self
                .link
                .connection(Some(first.id))
                .await
                .map_err(no_connection)?;
            waiting_on.store(fresh.id, Ordering::Relaxed);
            op(fresh.con).await.map_err(|e| {
                if connection_lost(&e) {
                    self.link.lost(fresh.id);
                }
                unavailable(e)
            })
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                let id = waiting_on.load(Ordering::Relaxed);
                if id != 0 {
                    self.link.stalled(id);
                }
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }
}

redis_backend!(RedisStore);

/// `CONFIG GET name` as one value; `None` when the node refuses it.
fn config_value(v: Value, name: &str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = redis::from_redis_value(v).ok()?;
    map.get(name).cloned()
}

/// The commands a store check sends to each node.
const CONFIG_CHECKED: [&str; 3] = ["maxmemory-policy", "appendonly", "save"];

fn node_replies(
    node: String,
    config: [Option<Value>; 3],
    replication: Option<Value>,
) -> NodeReplies {
    let [policy, aof, save] = config;
    let get = |v: Option<Value>, name| v.and_then(|v| config_value(v, name));
    NodeReplies {
        node,
        maxmemory_policy: get(policy, CONFIG_CHECKED[0]),
        appendonly: get(aof, CONFIG_CHECKED[1]),
        save: get(save, CONFIG_CHECKED[2]),
        replication: replication.and_then(|v| redis::from_redis_value(v).ok()),
    }
}

impl RedisStore {
    /// The node's settings that store checks read. Fails only when Redis does not
    /// answer at all; a refused `CONFIG` leaves its fields empty.
    pub(super) async fn health_replies(&self) -> Result<NodeReplies, StoreError> {
        self.ping().await?;
        let ask = |args: [&'static str; 3]| async move {
            let cmd = &redis::cmd(args[0]).arg(args[1]).arg(args[2]).clone();
            self.query(move |mut con| async move { cmd.query_async::<Value>(&mut con).await })
                .await
                .ok()
        };
        let config = [
            ask(["CONFIG", "GET", CONFIG_CHECKED[0]]).await,
            ask(["CONFIG", "GET", CONFIG_CHECKED[1]]).await,
            ask(["CONFIG", "GET", CONFIG_CHECKED[2]]).await,
        ];
        let cmd = &redis::cmd("INFO").arg("replication").clone();
        let replication = self
            .query(move |mut con| async move { cmd.query_async::<Value>(&mut con).await })
            .await
            .ok();
        Ok(node_replies(self.node.to_string(), config, replication))
    }
}

/// A Redis Cluster through the cluster-async client (slot routing, redirects and
/// reconnects are the client's), shared by every request.
#[derive(Clone)]
pub struct RedisClusterStore {
    /// Filled once by the connecting task; every operation waits on it (within its
    /// deadline) rather than dialling the cluster itself.
    con: tokio::sync::watch::Receiver<Option<ClusterConnection>>,
    scripts: std::sync::Arc<Scripts>,
    timeout: Duration,
}

/// How long the cluster client itself waits for a reply before it drops the connection
/// and dials again (a half-open TCP connection would otherwise hang every command).
/// Longer than `store.timeout`: an operation past its deadline fails on its own, as a
/// timeout the gateway can act on, and a merely slow reply does not cost the connection.
fn dead_connection_after(timeout: Duration) -> Duration {
    (timeout * 4).max(Duration::from_secs(1))
}

impl RedisClusterStore {
    /// Prepares the client and starts connecting in the background, retrying until the
    /// cluster answers: one attempt at a time however many requests arrive meanwhile, and
    /// no operation deadline can cancel a slow first connect (slot map, a connection to
    /// every master). Call from within the Tokio runtime.
    pub fn new(urls: &[String], timeout: Duration) -> Result<Self, StoreError> {
        Self::with_access(urls, &RedisAccess::default(), timeout)
    }

    /// As [`RedisClusterStore::new`], with TLS material and a password (`rediss://` seeds,
    /// a cluster run with `tls-cluster yes`, ACL users).
    pub fn with_access(
        urls: &[String],
        access: &RedisAccess,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = access::cluster_builder(urls, access)
            .connection_timeout(timeout)
            .response_timeout(dead_connection_after(timeout))
            .retries(2)
            .build()
            .map_err(unavailable)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StoreError::Unavailable(format!("no async runtime: {e}")))?;
        let (tx, con) = tokio::sync::watch::channel(None);
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                match client.get_async_connection().await {
                    Ok(c) => {
                        let _ = tx.send(Some(c));
                        return;
                    }
                    Err(e) => {
                        if tx.is_closed() {
                            return; // the store is gone
                        }
                        tracing::warn!(error = %e, "cannot reach the Redis Cluster yet; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
        Ok(Self {
            con,
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
        })
    }

    async fn con(&self) -> Result<ClusterConnection, StoreError> {
        let mut rx = self.con.clone();
        let con = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StoreError::Unavailable("cluster connector stopped".into()))?;
        // Present: `wait_for` returned on `is_some`.
        con.clone()
            .ok_or_else(|| StoreError::Unavailable("not connected".into()))
    }

    /// Runs `op` within `store.timeout`; the cluster client retries and reconnects on
    /// its own.
    async fn query<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(ClusterConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        bounded(self.timeout, async {
            let con = self.con().await?;
            op(con).await.map_err(unavailable)
        })
        .await
    }
}

redis_backend!(RedisClusterStore);

/// A reply routed to every master: `address -> reply`, server errors left out.
fn per_node(v: Value) -> Vec<(String, Value)> {
    let Value::Map(pairs) = v else {
        return Vec::new();
    };
    pairs
        .into_iter()
        .filter(|(_, v)| !matches!(v, Value::ServerError(_)))
        .filter_map(|(k, v)| Some((redis::from_redis_value::<String>(k).ok()?, v)))
        .collect()
}

impl RedisClusterStore {
    /// Every master's settings and the cluster's slot coverage. Fails only when the
    /// cluster does not answer at all.
    pub(super) async fn health_replies(
        &self,
    ) -> Result<(Vec<NodeReplies>, ClusterReplies), StoreError> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
        let masters = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let info = redis::cmd("CLUSTER").arg("INFO").clone();
        let info = bounded(self.timeout, async {
            let mut con = self.con().await?;
            con.route_command(info, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                .await
                .map_err(unavailable)
        })
        .await?;
        let info: String = redis::from_redis_value(info)
            .map_err(|e| StoreError::Protocol(format!("CLUSTER INFO: {e}")))?;
        let ask = |cmd: redis::Cmd| {
            let masters = masters.clone();
            async move {
                bounded(self.timeout, async {
                    let mut con = self.con().await?;
                    con.route_command(cmd, masters).await.map_err(unavailable)
                })
                .await
                .map(per_node)
                .unwrap_or_default()
            }
        };
        let mut replies: std::collections::BTreeMap<String, ([Option<Value>; 3], Option<Value>)> =
            Default::default();
        for (i, name) in CONFIG_CHECKED.iter().enumerate() {
            for (node, v) in ask(redis::cmd("CONFIG").arg("GET").arg(*name).clone()).await {
                replies.entry(node).or_default().0[i] = Some(v);
            }
        }
        for (node, v) in ask(redis::cmd("INFO").arg("replication").clone()).await {
            replies.entry(node).or_default().1 = Some(v);
        }
        let nodes = replies
            .into_iter()
            .map(|(node, (config, repl))| node_replies(node, config, repl))
            .collect();
        Ok((nodes, ClusterReplies { info }))
    }
}
