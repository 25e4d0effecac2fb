//! The near-cache's invalidation channel on a Redis Cluster: one RESP3 connection per
//! master, each in `CLIENT TRACKING ON BCAST PREFIX <store.prefix>:{` mode (every record's
//! key, the hash tag opening; not a staged completion's, see [`super::staged`]), opened, proved
//! and replaced by one background task.
//!
//! Why a channel of its own: the cluster client opens and replaces its node connections
//! by itself, with no hook to turn tracking on for each, so the connections the claims
//! read through cannot be tracked. In BCAST mode a node reports every write to a key
//! under the prefix, whoever wrote it and whoever read it: the reading connection need
//! not be tracked. (A replay claim writes nothing, so replays bring no invalidations;
//! every other write does, this gateway's own included, which only drops copies.)
//!
//! What keeps the cache sound here, beside the rules of [`crate::store::near_cache`]:
//!
//! - **Every master, and only while they are the masters.** BCAST covers the node it is
//!   turned on at. Each heartbeat round sends `CLUSTER SLOTS` on every tracking
//!   connection; the cache is proved only when every master answered and each names
//!   exactly the masters subscribed. A failover, a slot given to a node not subscribed, a
//!   master gone: the cache is flushed and the task subscribes to the masters named now.
//!   Its reply also stands in for a `PING`: it follows every push the node sent before.
//!   (BCAST pushes of one event-loop turn go out at its end, after the replies of that
//!   turn but in the same write: a proof can precede the push for a write of its own
//!   turn by that much, which the 1s bound absorbs.)
//! - **Every node a key can live on.** While a slot migrates, keys already moved live on
//!   the target (reached by `ASK`) though `CLUSTER SLOTS` still names only the source,
//!   and the target may own no slot at all. So each round also asks every master's
//!   `CLUSTER NODES` for the slots it is migrating (`[slot->-id]`, shown only by the
//!   source itself, which every round asks); a target not subscribed flushes the cache,
//!   and the next subscription takes it in. Keys move only once the source migrates, so a
//!   copy read on the target was read after its tracking was on.
//! - **Tracking before copies.** A subscription ends with a flush once tracking is on at
//!   every master, so every copy kept was read after each master reports writes to it.
//! - **A lost or silent channel.** A tracking connection that closes flushes the cache at
//!   once (the library's disconnection push); a round that fails or is not answered
//!   within [`super::link::patience`] flushes it and the task subscribes again. Until a
//!   new round proves the channel, nothing is served (at most [`PROOF_LASTS`] after the
//!   last proof).

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, Value};

use super::access;
use super::link::{on_push, patience};
use super::topology::{masters, migration_targets, text, Node};
use crate::config::RedisAccess;
use crate::store::near_cache::{NearCache, PROOF_LASTS};

/// The `CLIENT SETNAME` of every tracking connection, so an operator (or a test) can
/// tell them in `CLIENT LIST`.
pub const TRACKING_CLIENT_NAME: &str = "dedupe-gateway-tracking";

/// The first pause before subscribing again after a failure; it doubles up to a second.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// What the channel task needs to reach the masters.
pub(super) struct Channel {
    /// Seed URLs: where the masters are first learnt, and how to reach a node.
    seeds: Vec<String>,
    access: RedisAccess,
    /// `store.prefix` followed by `:{`: the keys reported (records' keys).
    prefix: String,
    /// Weak, so that the task (and its connections) end when the store is dropped.
    near: Weak<NearCache>,
    patience: Duration,
}

/// The tracking connections of one subscription.
struct Subscribed {
    /// The masters that own slots, as `CLUSTER SLOTS` named them.
    owners: BTreeSet<Node>,
    /// Every master tracked: the owners and the targets of migrations seen before.
    masters: BTreeSet<Node>,
    cons: Vec<(Node, MultiplexedConnection)>,
}

impl Subscribed {
    fn tracks(&self, node: &Node) -> bool {
        // By id: a target's address comes from `CLUSTER NODES`, an owner's from `CLUSTER
        // SLOTS`, which may name it by another endpoint.
        self.masters.iter().any(|m| m.id == node.id)
    }
}

/// What one master says in a round.
struct View {
    owners: BTreeSet<Node>,
    targets: BTreeSet<Node>,
}

/// Why a subscription no longer holds.
struct Ended {
    why: String,
    /// Whether it was proved at all.
    proved: bool,
    /// The migration targets the last round saw: the next subscription takes them in.
    targets: BTreeSet<Node>,
}

impl Channel {
    /// Starts the task that keeps the channel for `near`. Call from within the runtime.
    pub(super) fn start(
        seeds: &[String],
        access: &RedisAccess,
        prefix: &str,
        near: &Arc<NearCache>,
        timeout: Duration,
        runtime: &tokio::runtime::Handle,
    ) {
        let channel = Channel {
            seeds: seeds.to_vec(),
            access: access.clone(),
            prefix: format!("{prefix}:{{"),
            near: Arc::downgrade(near),
            patience: patience(timeout),
        };
        runtime.spawn(channel.run());
    }

    async fn run(self) {
        let mut known = BTreeSet::new();
        let mut targets = BTreeSet::new();
        let mut pause = RETRY_MIN;
        // Warn once per outage, not on every attempt.
        let mut down = false;
        loop {
            let subscribed = match self.subscribe(&known, &targets).await {
                Ok(s) => s,
                Err(e) => {
                    // A target that cannot be reached may be gone; the next round that
                    // sees a migration names its target again.
                    targets.clear();
                    if self.near.strong_count() == 0 {
                        return;
                    }
                    if !down {
                        tracing::warn!(error = %e, "near-cache: cannot subscribe to the Redis Cluster's invalidations; replays read Redis until it can");
                    }
                    down = true;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                    continue;
                }
            };
            let Some(near) = self.near.upgrade() else {
                return;
            };
            // Tracking is on at every master: copies read before now lose their channel.
            near.flush();
            drop(near);
            tracing::debug!(masters = ?subscribed.masters.iter().map(Node::to_string).collect::<Vec<_>>(), "near-cache: tracking every master");
            known = subscribed.masters.clone();
            if down {
                tracing::info!("near-cache: subscribed to the Redis Cluster's invalidations again");
            }
            down = false;
            let Some(Ended {
                why,
                proved,
                targets: seen,
            }) = self.prove(&subscribed).await
            else {
                return;
            };
            targets = seen;
            if let Some(near) = self.near.upgrade() {
                near.flush();
            }
            tracing::warn!(reason = %why, "near-cache: emptied; subscribing to the Redis Cluster's masters again");
            // A channel that held for a while is replaced at once; one that never proved
            // (masters still disagreeing) waits longer each time.
            pause = if proved {
                RETRY_MIN
            } else {
                (pause * 2).min(RETRY_MAX)
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Proves the channel every quarter of [`PROOF_LASTS`] while it holds. Returns why it
    /// no longer does, or `None` once the store is gone.
    async fn prove(&self, s: &Subscribed) -> Option<Ended> {
        let mut proved = false;
        let mut tick = tokio::time::interval(PROOF_LASTS / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The mark comes first: a flush after it (a connection closed) voids the proof.
            let (mark, sent) = {
                let near = self.near.upgrade()?;
                (near.mark(), Instant::now())
            };
            let ended = |why: String, targets: BTreeSet<Node>| {
                Some(Ended {
                    why,
                    proved,
                    targets,
                })
            };
            let views = match tokio::time::timeout(self.patience, round(s)).await {
                Ok(Ok(views)) => views,
                Ok(Err(e)) => return ended(e, BTreeSet::new()),
                Err(_) => {
                    let why = format!("a master did not answer within {:?}", self.patience);
                    return ended(why, BTreeSet::new());
                }
            };
            let targets: BTreeSet<Node> = views
                .iter()
                .flat_map(|(_, v)| v.targets.iter().cloned())
                .collect();
            if let Some((node, view)) = views.iter().find(|(_, v)| v.owners != s.owners) {
                let why = format!(
                    "the masters changed: {node} names {:?}",
                    view.owners.iter().map(Node::to_string).collect::<Vec<_>>()
                );
                return ended(why, targets);
            }
            if let Some(target) = targets.iter().find(|t| !s.tracks(t)) {
                let why = format!("a slot migrates to {target}, a master not tracked");
                return ended(why, targets);
            }
            self.near.upgrade()?.prove(mark, sent + PROOF_LASTS);
            proved = true;
        }
    }

    /// Learns the masters (from the ones known, else the seeds) and opens a tracking
    /// connection to each, and to each of `targets` (where slots were seen migrating).
    async fn subscribe(
        &self,
        known: &BTreeSet<Node>,
        targets: &BTreeSet<Node>,
    ) -> Result<Subscribed, String> {
        let owners = self.topology(known).await?;
        let mut masters = owners.clone();
        for t in targets {
            if !owners.iter().any(|o| o.id == t.id) {
                masters.insert(t.clone());
            }
        }
        let mut cons = Vec::with_capacity(masters.len());
        for node in &masters {
            let con = tokio::time::timeout(self.patience, self.track(node))
                .await
                .map_err(|_| format!("{node}: no answer within {:?}", self.patience))?
                .map_err(|e| format!("{node}: {e}"))?;
            cons.push((node.clone(), con));
        }
        Ok(Subscribed {
            owners,
            masters,
            cons,
        })
    }

    /// The masters one reachable node names, asked of the known masters first.
    async fn topology(&self, known: &BTreeSet<Node>) -> Result<BTreeSet<Node>, String> {
        let seed = &self.seeds[0];
        let mut asked: Vec<(String, Option<&Node>)> =
            known.iter().map(|n| (seed.clone(), Some(n))).collect();
        asked.extend(self.seeds.iter().map(|s| (s.clone(), None)));
        let mut last = String::from("no seed");
        for (url, node) in asked {
            let client = match node {
                Some(n) => access::node_client(&url, &n.host, n.port, &self.access, false),
                None => access::client(&url, &self.access, false),
            };
            let ask = async {
                let client = client?;
                let host = client.get_connection_info().addr().to_string();
                let host = host
                    .rsplit_once(':')
                    .map_or(host.clone(), |(h, _)| h.into());
                let mut con = client.get_multiplexed_async_connection().await?;
                let reply: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut con)
                    .await?;
                Ok::<_, redis::RedisError>((reply, host))
            };
            match tokio::time::timeout(self.patience, ask).await {
                Ok(Ok((reply, host))) => match masters(&reply, &host) {
                    Some(m) if !m.is_empty() => return Ok(m),
                    _ => last = format!("CLUSTER SLOTS: {reply:?}"),
                },
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = format!("no answer within {:?}", self.patience),
            }
        }
        Err(last)
    }

    /// One tracking connection: RESP3, named, in BCAST mode for the prefix, its pushes
    /// applied to the cache.
    async fn track(&self, node: &Node) -> redis::RedisResult<MultiplexedConnection> {
        let client =
            access::node_client(&self.seeds[0], &node.host, node.port, &self.access, true)?;
        let near = self.near.clone();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.patience))
            .set_response_timeout(None)
            .set_push_sender(move |info: PushInfo| {
                if let Some(near) = near.upgrade() {
                    on_push(&near, info);
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let mut con = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(TRACKING_CLIENT_NAME)
            .query_async::<()>(&mut con)
            .await?;
        redis::cmd("CLIENT")
            .arg("TRACKING")
            .arg("ON")
            .arg("BCAST")
            .arg("PREFIX")
            .arg(&self.prefix)
            .query_async::<()>(&mut con)
            .await?;
        Ok(con)
    }
}

/// Asks every tracking connection, at once, which masters own slots and where its node
/// migrates slots to.
async fn round(s: &Subscribed) -> Result<Vec<(Node, View)>, String> {
    let mut asks = tokio::task::JoinSet::new();
    for (node, con) in &s.cons {
        let (node, mut con) = (node.clone(), con.clone());
        asks.spawn(async move {
            let reply: redis::RedisResult<(Value, Value)> = redis::pipe()
                .cmd("CLUSTER")
                .arg("SLOTS")
                .cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut con)
                .await;
            (node, reply)
        });
    }
    let mut views = Vec::with_capacity(s.cons.len());
    while let Some(done) = asks.join_next().await {
        let (node, reply) = done.map_err(|e| e.to_string())?;
        let (slots, nodes) = reply.map_err(|e| format!("{node}: {e}"))?;
        let owners = masters(&slots, &node.host)
            .ok_or_else(|| format!("{node}: CLUSTER SLOTS: {slots:?}"))?;
        let targets = text(&nodes)
            .as_deref()
            .and_then(migration_targets)
            .ok_or_else(|| format!("{node}: CLUSTER NODES: {nodes:?}"))?;
        views.push((node, View { owners, targets }));
    }
    Ok(views)
}
