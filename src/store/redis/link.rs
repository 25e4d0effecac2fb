//! The one connection to a Redis server: dialled, watched and replaced by one background
//! task, so no request ever waits on a socket that has stopped answering.
//!
//! Why not the redis crate's `ConnectionManager`: it replaces a connection only after an
//! error or its own response timeout, and every operation here is cancelled at
//! `store.timeout` first, so a connection whose replies stopped (a NAT that lost the flow,
//! a frozen Redis) was kept forever. Here the operation reports what it saw instead:
//!
//! - a reply that shows the connection is gone (broken pipe, reset, EOF): [`Link::lost`],
//!   and the task dials again at once;
//! - an operation that timed out: [`Link::stalled`]; the task sends one `PING` on that
//!   connection and drops it if no reply comes within [`patience`]. A slow but live Redis
//!   answers the probe and keeps its connection.
//!
//! With Sentinel, every dial first asks the sentinels where the primary is (the redis
//! crate's discovery, which also checks the node's own `ROLE`): a connection lost to a
//! failover, or dropped because the demoted node answers `READONLY`, is replaced by one to
//! whichever node the sentinels name now.
//!
//! With a near-cache, every connection speaks RESP3 and turns on `CLIENT TRACKING` before
//! any request may use it; its invalidation pushes feed the cache, the cache is emptied
//! whenever a connection is dropped, replaced or closes, and a heartbeat `PING` proves
//! the current connection delivers (see [`crate::store::near_cache`]).
//!
//! Requests never dial themselves: one dial at a time, however many requests arrive. A
//! request that finds no connection asks for a dial and waits (within its deadline) for
//! the outcome of an attempt that starts after it arrived, so the first request after
//! Redis returns gets the fresh connection rather than an old failure.

use std::time::Duration;

use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Client, PushInfo, PushKind, Value};
use std::sync::Arc;

use super::links::Lane;
use crate::store::near_cache::{NearCache, PROOF_LASTS};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The first pause after a failed dial; it doubles up to [`DIAL_PAUSE_MAX`].
const DIAL_PAUSE_MIN: Duration = Duration::from_millis(100);
/// The longest pause between dials while nobody is waiting: with no traffic, a Redis
/// that returns is connected to within this long (and `/readyz`, which waits, at once).
pub(super) const DIAL_PAUSE_MAX: Duration = Duration::from_secs(1);
/// The shortest gap between two dials, however many requests are waiting: a storm of
/// requests against a refused port costs at most one dial per gap.
const DIAL_GAP: Duration = Duration::from_millis(20);

/// The time a dial through Sentinel may spend finding the primary, beyond the dial's own.
const SENTINEL_LOOKUP: Duration = Duration::from_secs(2);

/// How long a probed connection (or a dial) may take to answer before it counts as dead:
/// never shorter than one second, so a Redis that is merely slow for a moment (a fork, a
/// big key) keeps its connection even with a short `store.timeout`.
pub(super) fn patience(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(1))
}

/// Where connections go: one fixed server, or the primary the sentinels name at the
/// moment of each dial.
pub(super) enum Dialer {
    /// One server (boxed, as the sentinel client: both are large).
    Direct(Box<Client>),
    /// The primary monitored under a name.
    Sentinel {
        /// The crate's sentinel client; it keeps its connections to the sentinels.
        client: Box<SentinelClient>,
        /// The name, for logs.
        master_name: String,
    },
}

impl Dialer {
    /// What the logs call the target.
    fn target(&self) -> String {
        match self {
            Dialer::Direct(client) => client.get_connection_info().addr().to_string(),
            Dialer::Sentinel { master_name, .. } => format!("sentinel primary {master_name}"),
        }
    }

    /// A client for the server to dial now.
    async fn client(&mut self) -> redis::RedisResult<Client> {
        match self {
            Dialer::Direct(client) => Ok((**client).clone()),
            Dialer::Sentinel { client, .. } => client.async_get_client().await,
        }
    }
}

/// A live connection, its number and the server it reaches; reports name the connection
/// they are about, so a late report about a connection that was already replaced changes
/// nothing.
#[derive(Clone)]
pub(super) struct Live {
    pub(super) id: u64,
    pub(super) con: redis::aio::MultiplexedConnection,
    /// `host:port`: with Sentinel, the primary found for this connection.
    pub(super) node: std::sync::Arc<str>,
    /// The connection's task, ended when the last copy of this goes (a connection the
    /// crate dialled ends its own).
    pub(super) _driver: Option<std::sync::Arc<super::dial::Driver>>,
}

#[derive(Clone, Default)]
struct State {
    live: Option<Live>,
    /// Dial attempts started and finished so far.
    started: u64,
    finished: u64,
    /// Why the last dial failed.
    last_error: Option<String>,
}

enum Report {
    /// A request needs a connection and there is none.
    Wanted,
    /// This connection answered with a dropped-connection error.
    Lost(u64),
    /// An operation on this connection timed out.
    Stalled(u64),
    /// The probe of this connection ended; `alive` if it answered.
    Probed { id: u64, alive: bool },
}

/// A handle on the connection; cheap to clone. The task ends when the last handle goes.
#[derive(Clone)]
pub(super) struct Link {
    state: watch::Receiver<State>,
    /// What the server behind the current connection supports for completions, forgotten
    /// when a new connection is made.
    completion: Arc<super::completion::Strategy>,
    reports: mpsc::Sender<Report>,
    /// The target is whichever node the sentinels name: a node that turned read-only was
    /// demoted, and a connection elsewhere is what helps.
    follows_primary: bool,
}

/// Why no connection could be had.
pub(super) struct NoConnection(pub(super) String);

impl Link {
    /// Starts the connecting task on `runtime`: it dials at once and warns if Redis cannot
    /// be reached, so an unreachable Redis shows at start-up, not at the first request.
    /// `name` (empty for the main one) tells this connection apart in the log.
    pub(super) fn start(
        dialer: Dialer,
        timeout: Duration,
        near: Option<Arc<NearCache>>,
        runtime: &tokio::runtime::Handle,
        name: &str,
        lane: Lane,
    ) -> Self {
        let (tx, state) = watch::channel(State::default());
        let completion = Arc::new(super::completion::Strategy::default());
        // Bounded, and reports are only sent with `try_send`: when it is full the task is
        // busy and later reports about the same connection say the same thing.
        let (reports, rx) = mpsc::channel(64);
        let follows_primary = matches!(dialer, Dialer::Sentinel { .. });
        let task = Supervisor {
            name: match (name, lane) {
                (name, Lane::Claims) => name.to_owned(),
                ("", Lane::Leases) => "leases".to_owned(),
                (name, Lane::Leases) => format!("{name} leases"),
            },
            lane,
            dialer,
            patience: patience(timeout),
            state: tx,
            reports: rx,
            probe_reports: reports.downgrade(),
            probing: None,
            next_id: 0,
            near: near.clone(),
            completion: completion.clone(),
        };
        if let Some(near) = near {
            runtime.spawn(heartbeat(state.clone(), near, patience(timeout)));
        }
        runtime.spawn(task.run());
        Self {
            state,
            completion,
            reports,
            follows_primary,
        }
    }

    /// What the server behind the current connection supports for completions.
    pub(super) fn completion(&self) -> &super::completion::Strategy {
        &self.completion
    }

    /// Whether the connection goes wherever the sentinels say the primary is.
    pub(super) fn follows_primary(&self) -> bool {
        self.follows_primary
    }

    /// The server the current connection reaches, if there is one.
    pub(super) fn node(&self) -> Option<std::sync::Arc<str>> {
        self.state.borrow().live.as_ref().map(|l| l.node.clone())
    }

    /// The current connection, or the one the next dial makes. `not` names a connection
    /// that just failed: a different one is awaited. Waits as long as the caller lets it.
    pub(super) async fn connection(&self, not: Option<u64>) -> Result<Live, NoConnection> {
        let usable = |s: &State| s.live.as_ref().filter(|l| Some(l.id) != not).cloned();
        let target = {
            let s = self.state.borrow();
            if let Some(live) = usable(&s) {
                return Ok(live);
            }
            // The next attempt to start begins after this request arrived.
            s.started + 1
        };
        let _ = self.reports.try_send(Report::Wanted);
        let mut rx = self.state.clone();
        let s = rx
            .wait_for(|s| usable(s).is_some() || s.finished >= target)
            .await
            .map_err(|_| NoConnection("the Redis connecting task stopped".into()))?;
        usable(&s).ok_or_else(|| {
            NoConnection(
                s.last_error
                    .clone()
                    .unwrap_or_else(|| "not connected".into()),
            )
        })
    }

    /// The connection answered with an error showing it is gone.
    pub(super) fn lost(&self, id: u64) {
        let _ = self.reports.try_send(Report::Lost(id));
    }

    /// An operation on the connection timed out.
    pub(super) fn stalled(&self, id: u64) {
        let _ = self.reports.try_send(Report::Stalled(id));
    }
}

struct Supervisor {
    /// Which of the store's connections this is, for the log ("" for the main one).
    name: String,
    lane: Lane,
    dialer: Dialer,
    patience: Duration,
    state: watch::Sender<State>,
    reports: mpsc::Receiver<Report>,
    /// Weak, so that a running probe does not keep the task alive after the store is gone.
    probe_reports: mpsc::WeakSender<Report>,
    probing: Option<u64>,
    next_id: u64,
    /// Fed by every connection's invalidations; emptied whenever a connection goes.
    near: Option<Arc<NearCache>>,
    /// Forgotten whenever a connection is made: the server may be another one.
    completion: Arc<super::completion::Strategy>,
}

impl Supervisor {
    async fn run(mut self) {
        let where_ = match self.name.as_str() {
            "" => self.dialer.target(),
            name => format!("{}, {name}", self.dialer.target()),
        };
        let mut pause = DIAL_PAUSE_MIN;
        // Whether the last dial failed: warn once per outage, not on every attempt.
        let mut down = false;
        loop {
            if self.state.borrow().live.is_none() {
                match self.dial().await {
                    Ok((super::dial::Dialled { con, driver }, node)) => {
                        self.next_id += 1;
                        let id = self.next_id;
                        self.completion.forget();
                        if matches!(self.dialer, Dialer::Sentinel { .. }) {
                            tracing::info!(redis = %where_, node = %node, id, "connected to the primary the sentinels name");
                        }
                        self.state.send_modify(|s| {
                            s.live = Some(Live {
                                id,
                                con,
                                node: node.into(),
                                _driver: driver.map(std::sync::Arc::new),
                            });
                            s.finished += 1;
                            s.last_error = None;
                        });
                        if down {
                            tracing::info!(redis = %where_, "connected to Redis again");
                        }
                        down = false;
                        pause = DIAL_PAUSE_MIN;
                    }
                    Err(e) => {
                        if !down {
                            tracing::warn!(
                                redis = %where_, error = %e,
                                "cannot reach Redis; requests follow each route's on_error until it answers; dialling again"
                            );
                        }
                        down = true;
                        self.state.send_modify(|s| {
                            s.finished += 1;
                            s.last_error = Some(e);
                        });
                        let failed_at = Instant::now();
                        if !self.wait_to_dial(failed_at + pause).await {
                            return;
                        }
                        tokio::time::sleep_until(failed_at + DIAL_GAP).await;
                        pause = (pause * 2).min(DIAL_PAUSE_MAX);
                    }
                }
                continue;
            }
            let Some(report) = self.reports.recv().await else {
                return; // every handle is gone
            };
            self.handle(report, &where_);
        }
    }

    /// One dial: the connection and the `host:port` it reaches.
    async fn dial(&mut self) -> Result<(super::dial::Dialled, String), String> {
        self.state.send_modify(|s| s.started += 1);
        let mut config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.patience))
            // Operations bound themselves (`store.timeout`); a silent connection is found
            // by the probe, not by a reply timeout that cancelled operations never see.
            .set_response_timeout(None);
        if let Some(near) = &self.near {
            let near = near.clone();
            config = config.set_push_sender(move |info: PushInfo| {
                on_push(&near, info);
                Ok::<(), std::convert::Infallible>(())
            });
        }
        let near = self.near.clone();
        let lane = self.lane;
        // With Sentinel the lookup has a budget of its own on top: the crate bounds each
        // sentinel's answer (1s to connect, 500ms to reply) and asks the next one after.
        let budget = match self.dialer {
            Dialer::Direct(_) => self.patience,
            Dialer::Sentinel { .. } => self.patience + SENTINEL_LOOKUP,
        };
        let dialer = &mut self.dialer;
        let dial = async move {
            let client = dialer.client().await?;
            let node = client.get_connection_info().addr().to_string();
            let mut dialled = super::dial::connect(&client, config).await?;
            let con = &mut dialled.con;
            super::dial::name(con, lane).await?;
            if let Some(near) = near {
                // Default mode: Redis remembers the keys this connection reads (the claim
                // script's reads included) and reports when another client changes them.
                // NOLOOP: this gateway's own writes go through the store, which drops its
                // copy itself.
                redis::cmd("CLIENT")
                    .arg("TRACKING")
                    .arg("ON")
                    .arg("NOLOOP")
                    .query_async::<()>(con)
                    .await?;
                // Copies made through an earlier connection lose their channel now.
                near.flush();
            }
            Ok::<_, redis::RedisError>((dialled, node))
        };
        match tokio::time::timeout(budget, dial).await {
            Ok(Ok(dialled)) => Ok(dialled),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer to the connection within {budget:?}")),
        }
    }

    /// Waits until `until`, or until a request wants a connection. False when every
    /// handle is gone.
    async fn wait_to_dial(&mut self, until: Instant) -> bool {
        let sleep = tokio::time::sleep_until(until);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                report = self.reports.recv() => match report {
                    None => return false,
                    Some(Report::Wanted) => return true,
                    // About connections already gone.
                    Some(_) => {}
                },
            }
        }
    }

    fn current(&self) -> Option<Live> {
        self.state.borrow().live.clone()
    }

    fn handle(&mut self, report: Report, where_: &str) {
        let current = self.current();
        let is_current = |id: u64| current.as_ref().is_some_and(|l| l.id == id);
        match report {
            Report::Wanted => {}
            Report::Lost(id) if is_current(id) => {
                tracing::warn!(redis = %where_, "the Redis connection was closed; dialling again");
                self.drop_connection();
            }
            Report::Stalled(id) if is_current(id) && self.probing != Some(id) => {
                self.probing = Some(id);
                let Some(live) = current else { return };
                let reports = self.probe_reports.clone();
                let patience = self.patience;
                tokio::spawn(async move {
                    let mut con = live.con;
                    let ping = redis::cmd("PING");
                    let ping = ping.query_async::<String>(&mut con);
                    let alive = matches!(tokio::time::timeout(patience, ping).await, Ok(Ok(_)));
                    if let Some(reports) = reports.upgrade() {
                        // Must arrive even when the queue is busy: it ends the probe.
                        let _ = reports.send(Report::Probed { id, alive }).await;
                    }
                });
            }
            Report::Probed { id, alive } => {
                if self.probing == Some(id) {
                    self.probing = None;
                }
                if !alive && is_current(id) {
                    tracing::warn!(
                        redis = %where_, patience = ?self.patience,
                        "the Redis connection stopped answering; dropping it and dialling again"
                    );
                    self.drop_connection();
                }
            }
            Report::Lost(_) | Report::Stalled(_) => {}
        }
    }

    /// Forgets the connection; requests still holding it finish or time out on their own.
    fn drop_connection(&mut self) {
        self.state.send_modify(|s| s.live = None);
        if let Some(near) = &self.near {
            // Its invalidations may no longer arrive (a silent connection).
            near.flush();
        }
    }
}

/// Applies an invalidation push: named keys, or all of them (a null list: Redis flushed
/// its tracking table). The connection's end empties the cache.
pub(super) fn on_push(near: &NearCache, info: PushInfo) {
    match info.kind {
        PushKind::Invalidate => match info.data.first() {
            Some(Value::Array(keys)) => {
                for key in keys {
                    match <String as redis::FromRedisValue>::from_redis_value_ref(key) {
                        Ok(key) => near.invalidate(&key),
                        Err(_) => near.flush(),
                    }
                }
            }
            _ => near.flush(),
        },
        PushKind::Disconnection => near.flush(),
        _ => {}
    }
}

/// Proves, every quarter of [`PROOF_LASTS`], that the current connection delivers its
/// invalidations: a `PING` answered on it follows every push sent before it ran. Ends
/// with the connecting task.
async fn heartbeat(state: watch::Receiver<State>, near: Arc<NearCache>, patience: Duration) {
    let mut tick = tokio::time::interval(PROOF_LASTS / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if state.has_changed().is_err() {
            return; // the connecting task ended
        }
        // The mark comes first: a flush after it (a connection dropped or replaced)
        // voids this proof, whichever connection the PING went to.
        let mark = near.mark();
        let sent = std::time::Instant::now();
        let Some(live) = state.borrow().live.clone() else {
            continue;
        };
        let mut con = live.con;
        let ping = redis::cmd("PING");
        let ping = ping.query_async::<String>(&mut con);
        if let Ok(Ok(_)) = tokio::time::timeout(patience.min(PROOF_LASTS), ping).await {
            near.prove(mark, sent + PROOF_LASTS);
        }
    }
}
