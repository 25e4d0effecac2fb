//! Redis and Redis Cluster backends.
//!
//! Each record is one Redis string, a binary header then the stored response (see
//! [`string_record`]): a first claim and a replay are one `MULTI` of native commands
//! ([`strings`]), and Lua runs only where a write must compare first ([`string_scripts`]).
//! An ordered route's record is one Redis hash instead (`s` state, `f` fence, `h` request
//! hash, `l` lease end in server milliseconds, `o` the claimant, `k` `1` when the route
//! holds unknown outcomes, `n` set once a claim was told the record is held, `r` encoded
//! response, `a` claims that won it, `t` when the current claim won and `d` when it was
//! completed, `v` the version): its claim, renew and finish also take the entity's record
//! (`c` highest version completed, `i`/`g`/`e` the version in flight, its fence and lease
//! end) as a second key, in one script ([`scripts`]), so the order check is in the same
//! atomic step. (Two keys need one slot: on a cluster both take the entity's hash tag.) A
//! key that holds anything else is [`StoreError::Unreadable`] (see [`ops`]). Lease time
//! comes from the Redis server's `TIME`, so gateways with skewed clocks agree on when a
//! lease has expired.
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
mod compare;
mod completion;
mod con;
mod dial;
mod link;
mod links;
#[macro_use]
mod ops;
mod own;
mod reply;
mod scan;
mod scripts;
mod staged;
mod string_record;
mod string_scripts;
mod strings;
mod topology;
mod tracking;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use redis::cluster_async::ClusterConnection;
use redis::Value;

use self::completion::{Form, Strategy};
use self::link::{Dialer, Link, NoConnection};
use self::links::Links;
use self::reply::{
    node_replies, parse_claim, parse_finish, parse_inspect, parse_renew, replay_ttl, CONFIG_CHECKED,
};
use self::scripts::{claim_invocation, finish_invocation, renew_invocation, Call, Scripts};
use super::health::{ClusterReplies, NodeReplies};
use super::near_cache::{NearCache, NearCacheStats};
use super::{bounded, Claim, ClaimRequest, Order, Owner, RecordInfo, StoreError};
use crate::config::RedisAccess;

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// A command's failure: the key's, where it holds no record this gateway can read
/// (`WRONGTYPE`: the other layout's type; `UNREADABLE`: a script's refusal of a string
/// that is no record, see [`string_scripts`]), else the server's.
fn failed(e: redis::RedisError) -> StoreError {
    match e.code() {
        Some("WRONGTYPE" | "UNREADABLE") => StoreError::Unreadable(e.to_string()),
        _ => unavailable(e),
    }
}

fn no_connection(e: NoConnection) -> StoreError {
    StoreError::Unavailable(format!("no connection to Redis: {}", e.0))
}

/// The error shows the connection is unusable (closed, reset, out of step): the command
/// may not have reached Redis, and a fresh connection is needed either way.
fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// The node refused a write because it is a replica now: after a failover, the old
/// primary rejoins as a replica and a connection kept to it gets `READONLY`. Nothing was
/// written (a script stops at its first write), so sending again elsewhere is safe.
fn demoted(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY")
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

/// One Redis server (or the primary Sentinel names) through a multiplexed connection
/// shared by every request on a runtime (one for the process, or one per connection
/// worker: see [`links`]), each kept by a background task that replaces it when it closes
/// or stops answering.
#[derive(Clone)]
pub struct RedisStore {
    links: Links,
    /// The server's client, for links on worker runtimes; none where connections are
    /// not spread (Sentinel, a near-cache).
    spreads: Option<std::sync::Arc<redis::Client>>,
    /// Completed records kept locally (`store.near_cache`), invalidated by Redis.
    near: Option<std::sync::Arc<NearCache>>,
    /// `host:port` for store checks until a connection names the node it reached.
    node: std::sync::Arc<str>,
    scripts: std::sync::Arc<Scripts>,
    timeout: Duration,
    /// The commands' deadlines, on timers kept for the next command.
    timers: std::sync::Arc<crate::runtime::Timers>,
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
        Self::with_near_cache(url, access, timeout, 0)
    }

    /// As [`RedisStore::with_access`], keeping up to `near_cache` bytes of completed
    /// records locally (0: none), invalidated through `CLIENT TRACKING` (see
    /// [`crate::store::near_cache`]).
    pub fn with_near_cache(
        url: &str,
        access: &RedisAccess,
        timeout: Duration,
        near_cache: u64,
    ) -> Result<Self, StoreError> {
        let near = (near_cache > 0).then(|| std::sync::Arc::new(NearCache::new(near_cache)));
        let client = access::client(url, access, near.is_some()).map_err(unavailable)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StoreError::Unavailable(format!("no async runtime: {e}")))?;
        let node = client.get_connection_info().addr().to_string();
        let spreads = near.is_none().then(|| std::sync::Arc::new(client.clone()));
        Ok(Self {
            node: node.into(),
            links: Links::one(Link::start(
                Dialer::Direct(Box::new(client)),
                timeout,
                near.clone(),
                &runtime,
                "",
            )),
            spreads,
            near,
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
            timers: Default::default(),
        })
    }

    /// The primary that the sentinels at `sentinels` monitor as `master_name`, found again
    /// on every dial: after a failover the next dial reaches the new primary. TLS and
    /// passwords as for [`RedisStore::with_access`] (see `access::sentinel`). Call from
    /// within the Tokio runtime.
    pub fn sentinel(
        sentinels: &[String],
        master_name: &str,
        access: &RedisAccess,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = access::sentinel(sentinels, master_name, access).map_err(unavailable)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StoreError::Unavailable(format!("no async runtime: {e}")))?;
        let dialer = Dialer::Sentinel {
            client: Box::new(client),
            master_name: master_name.to_owned(),
        };
        Ok(Self {
            node: format!("sentinel primary {master_name}").into(),
            links: Links::one(Link::start(dialer, timeout, None, &runtime, "")),
            spreads: None,
            near: None,
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
            timers: Default::default(),
        })
    }

    /// What the server behind this runtime's connection supports for completions.
    fn completion(&self) -> &Strategy {
        self.links.on(crate::runtime::here()).completion()
    }

    /// Whether the primary is found through Sentinel.
    pub fn follows_sentinel(&self) -> bool {
        self.links.main().follows_primary()
    }

    /// Gives each of `runtimes` (the connection workers') a connection of its own, used
    /// by the commands sent from there (see [`links`]). A store whose connections are not
    /// spread (Sentinel, a near-cache) keeps its one.
    pub fn on_runtimes(mut self, runtimes: &[tokio::runtime::Handle]) -> Self {
        let Some(client) = self.spreads.take() else {
            return self;
        };
        let timeout = self.timeout;
        self.links = self.links.spread(runtimes, |i, runtime| {
            Link::start(
                Dialer::Direct(Box::new((*client).clone())),
                timeout,
                None,
                runtime,
                &format!("worker {i}"),
            )
        });
        self
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
    ///
    /// The connection is the one kept for the runtime this runs on (see [`links`]).
    async fn query<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(con::Con) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.query_on(self.links.on(crate::runtime::here()), op)
            .await
    }

    /// Runs `op` on every connection kept (the main one and each worker's) at once, as
    /// [`RedisStore::query`] does on one: every result, or the first failure. Readiness
    /// and `dedupe_store_up` ask this way, so a worker whose connection is refused
    /// (`maxclients`) or has gone silent shows, not only the main runtime's.
    async fn query_each<T, F, Fut>(&self, op: F) -> Result<Vec<T>, StoreError>
    where
        F: Fn(con::Con) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let asks = self.links.all().map(|link| self.query_on(link, &op));
        links::every(asks).await.into_iter().collect()
    }

    async fn query_on<T, F, Fut>(&self, link: &Link, op: F) -> Result<T, StoreError>
    where
        F: Fn(con::Con) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // The connection the operation is waiting on (0: none yet, still dialling).
        let waiting_on = AtomicU64::new(0);
        let attempt = async {
            let first = link.connection(None).await.map_err(no_connection)?;
            waiting_on.store(first.id, Ordering::Relaxed);
            let follows_primary = link.follows_primary();
            let err = match op(first.con).await {
                Ok(v) => return Ok(v),
                Err(e) if connection_lost(&e) => e,
                Err(e) if follows_primary && demoted(&e) => e,
                Err(e) => return Err(failed(e)),
            };
            link.lost(first.id);
            tracing::debug!(error = %err, "Redis connection lost; sending once more on a fresh one");
            waiting_on.store(0, Ordering::Relaxed);
            let fresh = link
                .connection(Some(first.id))
                .await
                .map_err(no_connection)?;
            waiting_on.store(fresh.id, Ordering::Relaxed);
            op(fresh.con).await.map_err(|e| {
                if connection_lost(&e) || (follows_primary && demoted(&e)) {
                    link.lost(fresh.id);
                }
                failed(e)
            })
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        match self.timers.within(deadline, attempt).await {
            Some(result) => result,
            None => {
                let id = waiting_on.load(Ordering::Relaxed);
                if id != 0 {
                    link.stalled(id);
                }
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }
}

redis_backend!(RedisStore);

impl RedisStore {
    /// The node's settings that store checks read. Fails only when Redis does not
    /// answer at all; a refused `CONFIG` leaves its fields empty.
    pub(super) async fn health_replies(&self) -> Result<NodeReplies, StoreError> {
        // On the main connection alone: a worker's refused connection must not hide the
        // node's settings.
        let ping = &redis::cmd("PING");
        let _: String = self
            .query(move |mut con| async move { ping.query_async(&mut con).await })
            .await?;
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
            ask(["CONFIG", "GET", CONFIG_CHECKED[3]]).await,
        ];
        let info = |section: &'static str| async move {
            let cmd = &redis::cmd("INFO").arg(section).clone();
            self.query(move |mut con| async move { cmd.query_async::<Value>(&mut con).await })
                .await
                .ok()
        };
        let infos = [info("replication").await, info("server").await];
        let node = self
            .links
            .main()
            .node()
            .unwrap_or_else(|| self.node.clone());
        Ok(node_replies(node.to_string(), config, infos))
    }
}

// After the macro: textual scope.
mod cluster;

pub use self::cluster::RedisClusterStore;
