//! The request path: route, buffer, derive the key, claim it, then forward the one winner
//! and store its outcome, or answer a duplicate from the store.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, SET_COOKIE, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn, Instrument};

use crate::config::{Config, OnConflict, OnError};
use crate::key::{self, KeyError, KeyRule, RequestView};
use crate::metrics::{Metrics, Outcome};
use crate::problem::GatewayError;
use crate::record::{StoredBody, StoredResponse};
use crate::route::{self, Route};
use crate::store::{Claim, ClaimRequest, Completion, Store, StoreError};
use crate::upstream::{strip_hop_by_hop, Upstream, UpstreamError};
use crate::{full, Body, BoxError, REPLAYED};

/// `Idempotency-Key`, forwarded to the upstream with the derived key.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `Idempotency-Fence`, forwarded to the upstream with the claim's fencing token.
pub static IDEMPOTENCY_FENCE: HeaderName = HeaderName::from_static("idempotency-fence");

/// What the gateway knows about the client connection a request came on.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// Raised when a request head on this connection had both framing headers.
    pub framing: crate::framing::AmbiguousFraming,
}

/// What a reload swaps: the configuration and the upstream client built from it.
pub struct Live {
    /// The validated configuration.
    pub config: Config,
    /// The pooled upstream client.
    pub upstream: Upstream,
}

/// The gateway: reloadable configuration, the store, the metrics.
pub struct Gateway {
    live: RwLock<Arc<Live>>,
    store: Store,
    metrics: Metrics,
    tasks: TaskTracker,
    claimants: Claimants,
    /// The route label of requests that match no route.
    no_route: Arc<str>,
}

/// Claimant ids: a random per-process prefix and a counter, unique across gateways.
struct Claimants {
    prefix: u64,
    next: std::sync::atomic::AtomicU64,
}

impl Claimants {
    fn new() -> Self {
        use std::hash::{BuildHasher, Hash, Hasher};
        // RandomState is seeded from the OS's randomness: no two processes share a prefix
        // (containers all running as pid 1 included).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        std::process::id().hash(&mut h);
        std::time::SystemTime::now().hash(&mut h);
        Self {
            prefix: h.finish(),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn next(&self) -> u128 {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (u128::from(self.prefix) << 64) | u128::from(n)
    }
}

/// How `dispatch` ended.
enum Dispatched {
    /// Answered before any claim: `handle` accounts for it.
    Early(Response<Body>),
    /// Answered by the request's task, which accounted for it.
    Settled(Response<Body>),
}

/// What one request did, for its access-log line and metrics.
#[derive(Default, Clone)]
struct Trace {
    started: Option<Instant>,
    route: Option<Arc<str>>,
    outcome: Option<Outcome>,
    finish: Option<Outcome>,
    fence: Option<u64>,
    upstream: Option<Duration>,
    key: Option<String>,
    scope: Option<String>,
}

impl Gateway {
    /// A gateway over a validated config and a store.
    pub fn new(config: Config, store: Store) -> Arc<Self> {
        let upstream = Upstream::new(&config.server);
        Arc::new(Self {
            live: RwLock::new(Arc::new(Live { config, upstream })),
            store,
            metrics: Metrics::new(),
            tasks: TaskTracker::new(),
            claimants: Claimants::new(),
            no_route: Arc::from("-"),
        })
    }

    /// The configuration in force now.
    pub fn live(&self) -> Arc<Live> {
        // A panic cannot happen while the lock is held (it only swaps an Arc).
        self.live
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Applies a new configuration to new requests. Returns the settings that changed but
    /// only take effect after a restart (listeners and store).
    pub fn reload(&self, config: Config) -> Vec<&'static str> {
        let old = self.live();
        let mut restart = Vec::new();
        if old.config.server.listen != config.server.listen {
            restart.push("server.listen");
        }
        if old.config.admin.as_ref().map(|a| a.listen) != config.admin.as_ref().map(|a| a.listen) {
            restart.push("admin.listen");
        }
        if old.config.admin.as_ref().map(|a| a.max_connections)
            != config.admin.as_ref().map(|a| a.max_connections)
        {
            restart.push("admin.max_connections");
        }
        if old.config.store != config.store {
            restart.push("store");
        }
        let (o, n) = (&old.config.server, &config.server);
        if o.max_header_bytes != n.max_header_bytes
            || o.header_read_timeout != n.header_read_timeout
            || o.max_connections != n.max_connections
            || o.max_concurrent_streams != n.max_concurrent_streams
            || o.write_timeout != n.write_timeout
        {
            restart.push("server connection limits (max_header_bytes, header_read_timeout, write_timeout, max_connections, max_concurrent_streams)");
        }
        if old.config.server.shutdown_grace != config.server.shutdown_grace {
            restart.push("server.shutdown_grace");
        }
        let upstream = Upstream::new(&config.server);
        let mut config = config;
        // Keep what needs a restart as it is, so the admin port and metrics tell the truth.
        config.server.listen = old.config.server.listen;
        config.store = old.config.store.clone();
        match (config.admin.as_mut(), old.config.admin.as_ref()) {
            (Some(new), Some(old)) => new.listen = old.listen,
            // The admin listener stays bound until a restart: keep guarding it with the
            // old token rather than leave it open.
            (None, Some(old)) => config.admin = Some(old.clone()),
            _ => {}
        }
        *self
            .live
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(Live { config, upstream });
        restart
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Requests past their claim, which shutdown waits for (within the grace period)
    /// even when their clients have hung up.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Handles one client request. Never fails: errors become problem+json responses.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let span = tracing::info_span!(
            "request",
            method = %req.method(),
            path = %req.uri().path(),
            route = tracing::field::Empty,
            outcome = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        let mut t = Trace {
            started: Some(Instant::now()),
            ..Trace::default()
        };
        let result = self
            .dispatch(self.live(), req, &conn, &mut t)
            .instrument(span.clone())
            .await;
        match result {
            // Counted and logged by its task, which finishes even if the client left.
            Ok(Dispatched::Settled(resp)) => resp,
            Ok(Dispatched::Early(resp)) => {
                self.account(&t, resp.status(), &span);
                resp
            }
            Err(e) => {
                let resp = e.to_response();
                self.account(&t, resp.status(), &span);
                resp
            }
        }
    }

    /// Counts a finished request and writes its access-log line: once per request.
    fn account(&self, t: &Trace, status: http::StatusCode, span: &tracing::Span) {
        let route = t.route.as_ref().unwrap_or(&self.no_route);
        let outcome = t.outcome.unwrap_or(Outcome::rejected);
        self.metrics.outcome(route, outcome);
        if let Some(finish) = t.finish {
            self.metrics.outcome(route, finish);
        }
        let route: &str = route;
        span.record("route", route);
        span.record("outcome", outcome.as_str());
        span.record("status", status.as_u16());
        span.in_scope(|| {
            info!(
                target: "dedupe_gateway::access",
                route,
                outcome = outcome.as_str(),
                finish = t.finish.map(Outcome::as_str),
                status = status.as_u16(),
                fence = t.fence,
                upstream_ms = t.upstream.map(crate::metrics::millis),
                total_ms = t.started.map(|s| crate::metrics::millis(s.elapsed())),
                key = t.key.as_deref(),
                scope = t.scope.as_deref(),
                "request"
            )
        });
    }

    async fn dispatch(
        self: &Arc<Self>,
        live: Arc<Live>,
        req: Request<Incoming>,
        conn: &ConnInfo,
        t: &mut Trace,
    ) -> Result<Dispatched, GatewayError> {
        let remote = conn.remote;
        // hyper drops Content-Length when both arrive, so the evidence is the connection's
        // head scanner; the header check is defence in depth should hyper ever keep both.
        let chunked = req.headers().contains_key(TRANSFER_ENCODING);
        if chunked && (req.headers().contains_key(CONTENT_LENGTH) || conn.framing.seen()) {
            t.outcome = Some(Outcome::rejected);
            return Err(GatewayError::AmbiguousFraming);
        }
        let Some(route_idx) = route::find(&live.config.routes, req.method(), req.uri().path())
        else {
            t.outcome = Some(Outcome::passthrough);
            let req = req.map(|b| b.map_err(BoxError::from).boxed());
            return self
                .forward(&live, req, remote, &self.no_route, t)
                .await
                .map(Dispatched::Early);
        };
        let route = &live.config.routes[route_idx];
        t.route = Some(route.name.clone());
        let key_error = |t: &mut Trace, e: KeyError| {
            t.outcome = Some(match e {
                KeyError::Missing { .. } => Outcome::missing_key,
                _ => Outcome::invalid_key,
            });
            GatewayError::from(e)
        };

        // A header key needs no body: refuse a bad one, or stream a keyless request on an
        // optional-key route, before buffering anything.
        let (parts, body) = req.into_parts();
        let header_key = match &route.key {
            KeyRule::Header { .. } => {
                let view = RequestView {
                    method: &parts.method,
                    path: parts.uri.path(),
                    query: parts.uri.query(),
                    headers: &parts.headers,
                    body: &[],
                };
                match route.key.derive(&view) {
                    Ok(Some(key)) => Some(key),
                    Ok(None) => {
                        t.outcome = Some(Outcome::no_key);
                        let body = body.map_err(BoxError::from).boxed();
                        let req = Request::from_parts(parts, body);
                        return self
                            .forward(&live, req, remote, &route.name, t)
                            .await
                            .map(Dispatched::Early);
                    }
                    Err(e) => return Err(key_error(t, e)),
                }
            }
            KeyRule::Fingerprint(_) => None,
        };
        let body = read_body(body, &parts, &live.config)
            .await
            .inspect_err(|_| {
                t.outcome = Some(Outcome::rejected);
            })?;
        let view = RequestView {
            method: &parts.method,
            path: parts.uri.path(),
            query: parts.uri.query(),
            headers: &parts.headers,
            body: &body,
        };
        let key = match header_key {
            Some(key) => key,
            // A fingerprint always yields a key or an error.
            None => match route.key.derive(&view) {
                Ok(Some(key)) => key,
                Ok(None) => return Err(GatewayError::Internal),
                Err(e) => return Err(key_error(t, e)),
            },
        };
        let scope = key::scope_hash(&route.scope, &view).map_err(|e| key_error(t, e))?;
        let request_hash = key::request_hash(&view, &route.hash_headers);
        let store_key = key::store_key(&live.config.store.prefix, &route.name, &scope, &key);
        t.key = Some(key);
        t.scope = Some(scope);

        let claimed = Claimed {
            gateway: self.clone(),
            live: live.clone(),
            route: route_idx,
            store_key,
            request_hash,
            remote,
        };
        // From the claim on, the request runs in its own task, tracked for shutdown: a
        // client that hangs up must not abandon a claim or an upstream call under way and
        // leave its outcome unknown.
        let gateway = self.clone();
        let trace = t.clone();
        let span = tracing::Span::current();
        let task = self.tasks.spawn(
            async move {
                let (result, trace) = claimed.settle(parts, body, trace).await;
                let resp = result.unwrap_or_else(|e| e.to_response());
                gateway.account(&trace, resp.status(), &span);
                resp
            }
            .in_current_span(),
        );
        match task.await {
            Ok(resp) => Ok(Dispatched::Settled(resp)),
            Err(e) => {
                error!(error = %e, "request task failed");
                Err(GatewayError::Internal)
            }
        }
    }

    /// Forwards without dedupe, streaming both ways.
    async fn forward(
        &self,
        live: &Live,
        req: Request<Body>,
        remote: SocketAddr,
        route: &Arc<str>,
        t: &mut Trace,
    ) -> Result<Response<Body>, GatewayError> {
        let req = live.upstream.prepare(req, remote);
        let started = Instant::now();
        let sent =
            tokio::time::timeout(live.config.server.upstream_timeout, live.upstream.send(req))
                .await;
        match sent {
            Err(_) => {
                warn!("upstream timed out");
                Err(GatewayError::UpstreamTimeout)
            }
            Ok(Err(e)) => {
                warn!(error = %e, "upstream request failed");
                Err(match e {
                    UpstreamError::Connect(_) => GatewayError::UpstreamConnect,
                    UpstreamError::Broken(_) => GatewayError::UpstreamBroken,
                })
            }
            Ok(Ok(resp)) => {
                t.upstream = Some(started.elapsed());
                self.metrics
                    .upstream(route, resp.status().as_u16(), started.elapsed());
                Ok(stream_response(resp))
            }
        }
    }
}

/// Buffers a deduped request's body within `server.max_body` and `server.body_read_timeout`.
async fn read_body(body: Incoming, parts: &Parts, config: &Config) -> Result<Bytes, GatewayError> {
    let limit = config.server.max_body;
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(config.server.body_read_timeout, limited.collect()).await {
        Err(_) => Err(GatewayError::BodyTimeout),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(GatewayError::BodyTooLarge { limit })
        }
        Ok(Err(e)) => {
            warn!(error = %e, "request body could not be read");
            Err(GatewayError::BodyUnreadable)
        }
    }
}

/// Answers from a stored record, after checking it was stored under this very key.
fn replay(record: &Bytes, store_key: &str) -> Result<Response<Body>, GatewayError> {
    let stored = StoredResponse::decode(record, store_key).map_err(|e| {
        error!(error = %e, store_key, "stored record unusable; refusing to replay it");
        GatewayError::CorruptRecord
    })?;
    match stored.body {
        StoredBody::Stored(body) => {
            let mut resp = Response::new(full(body));
            *resp.status_mut() = stored.status;
            *resp.headers_mut() = stored.headers;
            resp.headers_mut()
                .insert(REPLAYED.clone(), HeaderValue::from_static("true"));
            Ok(resp)
        }
        body => Err(GatewayError::ReplayUnavailable {
            status: stored.status,
            body,
        }),
    }
}

fn stream_response(resp: Response<Incoming>) -> Response<Body> {
    let (mut head, body) = resp.into_parts();
    strip_hop_by_hop(&mut head.headers);
    Response::from_parts(head, body.map_err(BoxError::from).boxed())
}

/// A deduped request from its claim on, running in its own task.
struct Claimed {
    gateway: Arc<Gateway>,
    live: Arc<Live>,
    route: usize,
    store_key: String,
    request_hash: [u8; 32],
    remote: SocketAddr,
}

enum Captured {
    Whole(Bytes),
    TooLarge(Bytes, Incoming),
    Broken(String),
}

impl Claimed {
    /// The route, from the configuration pinned when the request arrived.
    fn route(&self) -> &Route {
        &self.live.config.routes[self.route]
    }

    /// Claims the key and acts on the outcome.
    async fn settle(
        self,
        parts: Parts,
        body: Bytes,
        mut t: Trace,
    ) -> (Result<Response<Body>, GatewayError>, Trace) {
        let result = self.claim_and_act(parts, body, &mut t).await;
        (result, t)
    }

    async fn claim_and_act(
        &self,
        parts: Parts,
        body: Bytes,
        t: &mut Trace,
    ) -> Result<Response<Body>, GatewayError> {
        let gateway = &self.gateway;
        let route = self.route();
        let key = t.key.clone().unwrap_or_default();
        let wait_until = (route.on_conflict == OnConflict::Wait)
            .then(|| tokio::time::Instant::now() + route.conflict_wait);
        let claimant = gateway.claimants.next();
        let mut pause = Duration::from_millis(5);
        // While waiting, the last conflict seen: a duplicate is known to be in flight.
        let mut in_flight: Option<Duration> = None;
        let request = ClaimRequest {
            key: &self.store_key,
            request_hash: &self.request_hash,
            lease: route.lease,
            window: route.window,
            claimant,
        };
        let claim_once = || async {
            let started = Instant::now();
            let claim = gateway.store.claim(request).await;
            gateway
                .metrics
                .store_op("claim", started.elapsed(), claim.is_ok());
            claim
        };
        let claim = loop {
            let mut claim = claim_once().await;
            if let Err(StoreError::Timeout(_)) = claim {
                // The claim may have run with only its reply lost: ask once more as the
                // same claimant, which then wins again instead of finding a stranded claim.
                claim = claim_once().await;
            }
            // `on_conflict = "wait"`: poll (each poll one atomic claim) with a growing
            // pause, never past the lease end or the wait budget, until the first request
            // finishes, is taken over, or the budget runs out. Shutdown ends the wait.
            match (&claim, wait_until) {
                (Ok(Claim::Conflict { retry_after }), Some(until))
                    if tokio::time::Instant::now() < until && !gateway.tasks.is_closed() =>
                {
                    in_flight = Some(*retry_after);
                    let nap = pause.min(*retry_after + Duration::from_millis(1));
                    tokio::time::sleep_until(until.min(tokio::time::Instant::now() + nap)).await;
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                // A store error after a conflict was seen must not fail open: the first
                // request is in flight, and forwarding this one would run the write twice.
                (Err(e), _) if in_flight.is_some() => {
                    warn!(error = %e, key, "store failed while waiting on an in-flight duplicate");
                    break Ok(Claim::Conflict {
                        retry_after: in_flight.unwrap_or_default(),
                    });
                }
                _ => break claim,
            }
        };
        match claim {
            Err(e) => match route.on_error {
                OnError::FailClosed => {
                    error!(error = %e, key, "store claim failed; failing closed (503)");
                    t.outcome = Some(Outcome::store_error);
                    Err(GatewayError::StoreUnavailable)
                }
                OnError::FailOpen => {
                    warn!(error = %e, key, "store claim failed; failing open: forwarding without dedupe");
                    t.outcome = Some(Outcome::fail_open);
                    let req = Request::from_parts(parts, full(body));
                    gateway
                        .forward(&self.live, req, self.remote, &route.name, t)
                        .await
                }
            },
            Ok(Claim::Replay(record)) => {
                t.outcome = Some(Outcome::replayed);
                replay(&record, &self.store_key)
            }
            Ok(Claim::Conflict { retry_after }) => {
                t.outcome = Some(Outcome::conflict);
                Err(GatewayError::Conflict { retry_after })
            }
            Ok(Claim::Mismatch) => {
                t.outcome = Some(Outcome::mismatch);
                Err(GatewayError::Mismatch)
            }
            Ok(Claim::Won { fence, takeover }) => {
                t.outcome = Some(if takeover {
                    Outcome::takeover
                } else {
                    Outcome::won
                });
                t.fence = Some(fence);
                if takeover {
                    info!(
                        key,
                        fence, "previous lease expired without an outcome; taking over"
                    );
                }
                let winner = Winner {
                    claimed: self,
                    key: &key,
                    fence,
                };
                winner.execute(parts, body, t).await
            }
        }
    }
}

/// The request that owns a key under `fence`.
struct Winner<'a> {
    claimed: &'a Claimed,
    key: &'a str,
    fence: u64,
}

impl Winner<'_> {
    fn route(&self) -> &Route {
        self.claimed.route()
    }

    async fn execute(
        &self,
        parts: Parts,
        body: Bytes,
        t: &mut Trace,
    ) -> Result<Response<Body>, GatewayError> {
        let metrics = &self.claimed.gateway.metrics;
        let _held = metrics.claim_held();
        let server = &self.claimed.live.config.server;
        let req = Request::from_parts(parts, full(body));
        let mut req = self.claimed.live.upstream.prepare(req, self.claimed.remote);
        // A header key is visible ASCII and a fingerprint is hex: both are valid values.
        if let Ok(v) = HeaderValue::from_str(self.key) {
            req.headers_mut().insert(IDEMPOTENCY_KEY.clone(), v);
        }
        req.headers_mut()
            .insert(IDEMPOTENCY_FENCE.clone(), HeaderValue::from(self.fence));

        let deadline = tokio::time::Instant::now() + server.upstream_timeout;
        let started = Instant::now();
        let sent = tokio::time::timeout_at(deadline, self.claimed.live.upstream.send(req)).await;
        let resp = match sent {
            Err(_) => {
                warn!(key = %self.key, fence = self.fence,
                    "upstream did not answer in time: outcome unknown, the claim is kept until its lease expires");
                t.finish = Some(Outcome::outcome_unknown);
                return Err(GatewayError::UpstreamTimeout);
            }
            Ok(Err(UpstreamError::Connect(e))) => {
                warn!(error = %e, "upstream unreachable: nothing was sent, releasing the claim");
                self.release(t).await;
                return Err(GatewayError::UpstreamConnect);
            }
            Ok(Err(UpstreamError::Broken(e))) => {
                warn!(key = %self.key, fence = self.fence, error = %e,
                    "upstream connection broke before an answer: outcome unknown, the claim is kept until its lease expires");
                t.finish = Some(Outcome::outcome_unknown);
                return Err(GatewayError::UpstreamBroken);
            }
            Ok(Ok(resp)) => resp,
        };
        t.upstream = Some(started.elapsed());
        metrics.upstream(
            &self.route().name,
            resp.status().as_u16(),
            started.elapsed(),
        );

        if resp.status().is_server_error() {
            // The upstream says it failed: the next retry should execute again.
            self.release(t).await;
            return Ok(stream_response(resp));
        }

        let (mut head, body) = resp.into_parts();
        strip_hop_by_hop(&mut head.headers);
        let limit = self.route().max_cached_body;
        let captured = capture(body, limit, deadline).await;
        let mut stored_headers = head.headers.clone();
        stored_headers.remove(SET_COOKIE);
        let (stored_body, client_body) = match captured {
            Captured::Whole(bytes) => (StoredBody::Stored(bytes.clone()), Some(full(bytes))),
            Captured::TooLarge(prefix, rest) => {
                info!(
                    limit,
                    "response body larger than max_cached_body: stored without its body"
                );
                (
                    StoredBody::TooLarge,
                    Some(
                        Prefixed {
                            prefix: Some(prefix),
                            rest,
                        }
                        .map_err(BoxError::from)
                        .boxed(),
                    ),
                )
            }
            Captured::Broken(reason) => {
                warn!(key = %self.key, fence = self.fence, reason,
                    "upstream answered but its body broke off: stored as executed without a replayable body");
                (StoredBody::Incomplete, None)
            }
        };
        let record = StoredResponse {
            status: head.status,
            headers: stored_headers,
            body: stored_body,
        }
        .encode(&self.claimed.store_key);
        self.complete(record, t).await;
        match client_body {
            Some(body) => Ok(Response::from_parts(head, body)),
            None => Err(GatewayError::UpstreamBroken),
        }
    }

    async fn complete(&self, record: Bytes, t: &mut Trace) {
        let started = Instant::now();
        let window = self.route().window;
        let gateway = &self.claimed.gateway;
        let done = gateway
            .store
            .complete(&self.claimed.store_key, self.fence, record, window)
            .await;
        gateway
            .metrics
            .store_op("complete", started.elapsed(), done.is_ok());
        match done {
            Ok(Completion::Completed) => {}
            Ok(Completion::Fenced) => {
                warn!(key = %self.key, fence = self.fence,
                    "completion refused: the key was taken over under a newer fence; this response reached its client only");
                t.finish = Some(Outcome::fenced_out);
            }
            Err(e) => {
                error!(key = %self.key, fence = self.fence, error = %e,
                    "could not store the response: a retry after the lease expires will execute again");
                t.finish = Some(Outcome::unstored);
            }
        }
    }

    async fn release(&self, t: &mut Trace) {
        let started = Instant::now();
        let window = self.route().window;
        let gateway = &self.claimed.gateway;
        let released = gateway
            .store
            .release(&self.claimed.store_key, self.fence, window)
            .await;
        gateway
            .metrics
            .store_op("release", started.elapsed(), released.is_ok());
        match released {
            Ok(true) => t.finish = Some(Outcome::released),
            Ok(false) => {
                warn!(key = %self.key, fence = self.fence, "release refused: the key was taken over under a newer fence");
                t.finish = Some(Outcome::fenced_out);
            }
            Err(e) => {
                error!(key = %self.key, fence = self.fence, error = %e,
                    "could not release the claim: retries get 409 until its lease expires");
                t.finish = Some(Outcome::unstored);
            }
        }
    }
}

/// Reads the upstream body until it ends, passes `limit`, breaks, or the deadline passes.
/// A body that arrives in one frame (the common case) is kept without a copy.
async fn capture(mut body: Incoming, limit: u64, deadline: tokio::time::Instant) -> Captured {
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Captured::Broken("timed out reading the body".to_owned()),
            Ok(None) => return Captured::Whole(first.unwrap_or_else(|| buf.freeze())),
            Ok(Some(Err(e))) => return Captured::Broken(e.to_string()),
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let held = match first.take() {
                    None if buf.is_empty() => {
                        first = Some(data);
                        first.as_ref().map_or(0, Bytes::len)
                    }
                    earlier => {
                        if let Some(earlier) = earlier {
                            buf.extend_from_slice(&earlier);
                        }
                        buf.extend_from_slice(&data);
                        buf.len()
                    }
                };
                if held as u64 > limit {
                    let prefix = first.take().unwrap_or_else(|| buf.freeze());
                    return Captured::TooLarge(prefix, body);
                }
            }
        }
    }
}

/// A body that yields an already-read prefix, then the rest of the upstream's stream.
struct Prefixed {
    prefix: Option<Bytes>,
    rest: Incoming,
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let n = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + n);
        }
        hint.set_lower(rest.lower() + n);
        hint
    }
}
