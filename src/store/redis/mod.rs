//! Redis and Redis Cluster backends.
//!
//! Each record is one Redis hash (`s` state, `f` fence, `h` request hash, `l` lease end in
//! server milliseconds, `o` the claimant, `k` `1` when the route holds unknown outcomes,
//! `n` set once a claim was told the record is held, `r` encoded response, `a` claims that
//! won it, `t` when the current claim won and `d` when it was completed, in server
//! milliseconds), so every script touches exactly one key and runs unchanged on a cluster.
//! On an ordered route (`order`), claim, renew and finish also take the entity's record
//! (`c` highest version completed, `i`/`g`/`e` the version in flight, its fence and lease
//! end) as a second key: one script, so the order check is in the same atomic step. (Two
//! keys need one slot, so ordered routes are refused on a cluster for now.) Each step
//! (claim, complete, release) is one `EVALSHA` round
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
mod reply;
mod scripts;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::Value;

use self::link::{Dialer, Link, NoConnection};
use self::reply::{
    node_replies, parse_claim, parse_finish, parse_inspect, parse_renew, CONFIG_CHECKED,
};
use self::scripts::{claim_invocation, finish_invocation, renew_invocation, Scripts};
use super::health::{ClusterReplies, NodeReplies};
use super::{bounded, Claim, ClaimRequest, Order, RecordInfo, StoreError};
use crate::config::RedisAccess;

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
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                let inv = &finish_invocation(
                    &self.scripts,
                    key,
                    fence,
                    Some(&record),
                    window,
                    strict,
                    order,
                );
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
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                let inv =
                    &finish_invocation(&self.scripts, key, fence, None, window, strict, order);
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
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                let inv = &renew_invocation(&self.scripts, key, fence, lease, order);
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

/// One Redis server (or the primary Sentinel names) through one multiplexed connection
/// shared by every request, kept by a background task that replaces it when it closes or
/// stops answering.
#[derive(Clone)]
pub struct RedisStore {
    link: Link,
    /// `host:port` for store checks until a connection names the node it reached.
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
            link: Link::start(Dialer::Direct(Box::new(client)), timeout, &runtime),
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
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
            link: Link::start(dialer, timeout, &runtime),
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
        })
    }

    /// Whether the primary is found through Sentinel.
    pub fn follows_sentinel(&self) -> bool {
        self.link.follows_primary()
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
            let follows_primary = self.link.follows_primary();
            let err = match op(first.con).await {
                Ok(v) => return Ok(v),
                Err(e) if connection_lost(&e) => e,
                Err(e) if follows_primary && demoted(&e) => e,
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
                if connection_lost(&e) || (follows_primary && demoted(&e)) {
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
        let node = self.link.node().unwrap_or_else(|| self.node.clone());
        Ok(node_replies(node.to_string(), config, replication))
    }
}

/// A Redis Cluster through the cluster-async client (slot routing, redirects and
/// reconnects are the client's), shared by every request.
#[derive(Clone)]
pub struct RedisClusterStore {
    /// Filled once by the connecting task; every operation waits on it (within its
    /// deadline) rather than dialling the cluster itself.
    con: tokio::sync::watch::Receiver<Option<ClusterConnection>>,
    /// Tells the connecting task an operation timed out: it probes every master and
    /// rebuilds the connection when one stays silent.
    stalled: tokio::sync::mpsc::Sender<()>,
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
        // One report is enough: while the task probes, more say the same thing.
        let (stalled, mut reports) = tokio::sync::mpsc::channel(1);
        let patience = link::patience(timeout);
        runtime.spawn(async move {
            loop {
                let mut pause = Duration::from_millis(100);
                loop {
                    match client.get_async_connection().await {
                        Ok(c) => {
                            let _ = tx.send(Some(c));
                            break;
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
                // The cluster client replaces a connection only after its own errors; one
                // whose replies stopped for good (a lost flow) was kept, and every
                // operation on that master's slots timed out. So a timeout is checked
                // here: every master is pinged and, if one stays silent, the whole
                // connection is built again (the old one serves until the new one is up).
                loop {
                    if reports.recv().await.is_none() {
                        return; // every handle is gone
                    }
                    let Some(mut con) = tx.borrow().clone() else {
                        break;
                    };
                    if cluster_answers(&mut con, patience).await {
                        continue;
                    }
                    tracing::warn!(patience = ?patience, "a Redis Cluster master stopped answering; connecting to the cluster again");
                    break;
                }
            }
        });
        Ok(Self {
            stalled,
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
        let result = bounded(self.timeout, async {
            let con = self.con().await?;
            op(con).await.map_err(unavailable)
        })
        .await;
        if matches!(result, Err(StoreError::Timeout(_))) {
            let _ = self.stalled.try_send(());
        }
        result
    }
}

/// Whether every master answers a `PING` within `patience`.
async fn cluster_answers(con: &mut ClusterConnection, patience: Duration) -> bool {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
    let masters = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let ping = con.route_command(redis::cmd("PING"), masters);
    matches!(tokio::time::timeout(patience, ping).await, Ok(Ok(_)))
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
