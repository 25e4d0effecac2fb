//! A Redis Cluster backend: the cluster-async client, one connection rebuilt in the
//! background when a master stops answering; with a near-cache, its invalidations come
//! through a channel of their own (see [`super::tracking`]).

use super::*;

/// A Redis Cluster through the cluster-async client (slot routing, redirects and
/// reconnects are the client's), shared by every request.
#[derive(Clone)]
pub struct RedisClusterStore {
    /// Filled once by the connecting task; every operation waits on it (within its
    /// deadline) rather than dialling the cluster itself.
    /// The claims' connection and the leases' (see [`Lane`]), made and replaced together.
    con: tokio::sync::watch::Receiver<Option<[ClusterConnection; 2]>>,
    /// Tells the connecting task an operation timed out: it probes every master and
    /// rebuilds the connection when one stays silent.
    stalled: tokio::sync::mpsc::Sender<()>,
    /// Completed records kept locally (`store.near_cache`), invalidated through the
    /// tracking channel.
    near: Option<std::sync::Arc<NearCache>>,
    scripts: std::sync::Arc<Scripts>,
    timeout: Duration,
    /// What the masters support for completions, asked again on a new connection.
    completion: std::sync::Arc<Strategy>,
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
        Self::with_near_cache(urls, access, timeout, 0, "")
    }

    /// As [`RedisClusterStore::with_access`], keeping up to `near_cache` bytes of completed
    /// records locally (0: none), invalidated by every master through `CLIENT TRACKING ...
    /// BCAST PREFIX <prefix>:{` (`prefix`: `store.prefix`; see [`crate::store::near_cache`]).
    pub fn with_near_cache(
        urls: &[String],
        access: &RedisAccess,
        timeout: Duration,
        near_cache: u64,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        let client = access::cluster_builder(urls, access)
            .connection_timeout(timeout)
            .response_timeout(dead_connection_after(timeout))
            .retries(2)
            .build()
            .map_err(unavailable)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StoreError::Unavailable(format!("no async runtime: {e}")))?;
        let near = (near_cache > 0).then(|| std::sync::Arc::new(NearCache::new(near_cache)));
        if let Some(near) = &near {
            tracking::Channel::start(urls, access, prefix, near, timeout, &runtime);
        }
        let (tx, con) = tokio::sync::watch::channel(None);
        // One report is enough: while the task probes, more say the same thing.
        let (stalled, mut reports) = tokio::sync::mpsc::channel(1);
        let patience = link::patience(timeout);
        let completion = std::sync::Arc::new(Strategy::default());
        let learnt = completion.clone();
        runtime.spawn(async move {
            loop {
                let mut pause = Duration::from_millis(100);
                loop {
                    let pair = async {
                        let claims = client.get_async_connection().await?;
                        Ok::<_, redis::RedisError>([claims, client.get_async_connection().await?])
                    };
                    match pair.await {
                        Ok(c) => {
                            // Masters may have changed (a failover, an upgrade): asked again.
                            learnt.forget();
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
                    let Some([mut con, _]) = tx.borrow().clone() else {
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
            near,
            scripts: std::sync::Arc::new(Scripts::new()),
            timeout,
            completion,
        })
    }

    /// What the masters support for completions.
    fn completion(&self) -> &Strategy {
        &self.completion
    }

    async fn con(&self, lane: Lane) -> Result<ClusterConnection, StoreError> {
        let mut rx = self.con.clone();
        let con = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StoreError::Unavailable("cluster connector stopped".into()))?;
        // Present: `wait_for` returned on `is_some`.
        let [claims, leases] = con
            .clone()
            .ok_or_else(|| StoreError::Unavailable("not connected".into()))?;
        Ok(match lane {
            Lane::Claims => claims,
            Lane::Leases => leases,
        })
    }

    /// As [`RedisClusterStore::query`]: the cluster client is one, whatever the runtime.
    async fn query_each<T, F, Fut>(&self, op: F) -> Result<Vec<T>, StoreError>
    where
        F: Fn(ClusterConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        Ok(vec![self.query(op).await?])
    }

    /// Runs `op` within `store.timeout`; the cluster client retries and reconnects on
    /// its own.
    async fn query<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: Fn(ClusterConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.query_lane(Lane::Claims, op).await
    }

    /// As [`RedisClusterStore::query`], on the connection of `lane`.
    async fn query_lane<T, F, Fut>(&self, lane: Lane, op: F) -> Result<T, StoreError>
    where
        F: Fn(ClusterConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let result = bounded(self.timeout, async {
            let con = self.con(lane).await?;
            op(con).await.map_err(failed)
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
    pub(in crate::store) async fn health_replies(
        &self,
    ) -> Result<(Vec<NodeReplies>, ClusterReplies), StoreError> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
        let masters = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let info = redis::cmd("CLUSTER").arg("INFO").clone();
        let info = bounded(self.timeout, async {
            let mut con = self.con(Lane::Claims).await?;
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
                    let mut con = self.con(Lane::Claims).await?;
                    con.route_command(cmd, masters).await.map_err(unavailable)
                })
                .await
                .map(per_node)
                .unwrap_or_default()
            }
        };
        // Per node: its `CONFIG GET` replies, then `INFO replication` and `INFO server`.
        type Asked = ([Option<Value>; 4], [Option<Value>; 2]);
        let mut replies: std::collections::BTreeMap<String, Asked> = Default::default();
        for (i, name) in CONFIG_CHECKED.iter().enumerate() {
            for (node, v) in ask(redis::cmd("CONFIG").arg("GET").arg(*name).clone()).await {
                replies.entry(node).or_default().0[i] = Some(v);
            }
        }
        for (i, section) in ["replication", "server"].into_iter().enumerate() {
            for (node, v) in ask(redis::cmd("INFO").arg(section).clone()).await {
                replies.entry(node).or_default().1[i] = Some(v);
            }
        }
        let nodes = replies
            .into_iter()
            .map(|(node, (config, infos))| node_replies(node, config, infos))
            .collect();
        Ok((nodes, ClusterReplies { info }))
    }
}

impl RedisClusterStore {
    /// Every master, as the client addresses it, in a stable order (a listing's cursor
    /// names one by its place).
    pub(super) async fn masters(
        &self,
    ) -> Result<Vec<redis::cluster_routing::SingleNodeRoutingInfo>, StoreError> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
        let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let reply = self
            .query(|mut con| {
                let all = all.clone();
                async move { con.route_command(redis::cmd("PING"), all).await }
            })
            .await?;
        let Value::Map(pairs) = reply else {
            return Err(StoreError::Protocol(format!(
                "PING to every master: {reply:?}"
            )));
        };
        let mut masters: Vec<(String, u16)> = pairs
            .into_iter()
            .filter_map(|(k, _)| {
                let addr: String = redis::from_redis_value(k).ok()?;
                let (host, port) = addr.rsplit_once(':')?;
                Some((host.to_owned(), port.parse().ok()?))
            })
            .collect();
        masters.sort();
        Ok(masters
            .into_iter()
            .map(|(host, port)| SingleNodeRoutingInfo::ByAddress { host, port })
            .collect())
    }

    /// Sends `pipe` to the node `at`, within `store.timeout`.
    pub(super) async fn send_to(
        &self,
        pipe: redis::Pipeline,
        at: redis::cluster_routing::SingleNodeRoutingInfo,
    ) -> Result<Vec<Value>, StoreError> {
        let n = pipe.len();
        let pipe = &pipe;
        self.query(|mut con| {
            let at = at.clone();
            async move { con.route_pipeline(pipe.clone(), 0, n, at).await }
        })
        .await
    }
}
