//! The pipeline from a client request to its response: framing check, route, key, then
//! either a stream to the upstream or the dedupe protocol in a tracked task.

use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;
use tracing::error;

use super::access::{Access, Origin};
use super::admission::{Admitted, Shed};
use super::body::{read_body, streamed, Refusal};
use super::budget::Held;
use super::detach::Tether;
use super::forwarder::Forwarder;
use super::head;
use super::inline::Inline;
use super::keyed::KeyedRequest;
use super::passthrough;
use super::stream::{Delivery, StreamedMark, Tethered};
use super::{ConnInfo, Gateway, Live};
use crate::dedupe::{Outcome, Policy, Would};
use crate::edge::problem::GatewayError;
use crate::protocol::key::{KeyError, RequestView};
use crate::protocol::path;
use crate::protocol::route::{self, Dialect, Mode, OnConflict, Route, Skip, Verdict};
use crate::runtime::boxed;
use crate::{full, Body};

/// A request's response, and what it did, for the access record.
pub(super) struct Handled {
    pub response: Result<Response<Body>, GatewayError>,
    pub access: Access,
    /// Answered with `Connection: close`: the client's body was left unread.
    pub close: bool,
    /// How an error in `response` is written: its route's dialect.
    pub errors: Dialect,
}

/// Where a request stands once its deduping route is known.
#[derive(Clone, Copy)]
struct Routed<'a> {
    live: &'a Arc<Live>,
    route: usize,
    conn: &'a ConnInfo,
    origin: &'a Origin,
    started: Instant,
}

/// How `dispatch` ended.
enum Dispatched {
    /// Answered without a claim: the caller accounts for it.
    Handled(Handled),
    /// Answered by the request's task, which accounted for it.
    Settled(Response<Body>),
}

impl Gateway {
    /// Handles one client request. Never fails: errors become problem+json responses.
    /// Every response leaves here, framed by the body it carries
    /// ([`crate::protocol::hop_by_hop::frame_for_client`]).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let head = req.method() == http::Method::HEAD;
        let mut response = self.answer(req, conn).await;
        let status = response.status();
        let bodiless = head || status.is_informational() || matches!(status.as_u16(), 204 | 304);
        let exact = hyper::body::Body::size_hint(response.body()).exact();
        crate::protocol::hop_by_hop::frame_for_client(response.headers_mut(), exact, bodiless);
        response
    }

    /// A request's response, its framing as it came.
    async fn answer(self: Arc<Self>, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let origin = Origin::of(&req);
        let started = Instant::now();
        let live = self.live();
        // Boxed: the spans wrap it by value, and each wrapper, the dispatcher's slot and
        // every move of this future copied the dispatch whole (about 5 KB); a box makes
        // each a pointer's, and it is still dropped inside its spans if the client leaves.
        // Built in its box: `Box::pin` copied its 5.4 KiB in once more (a uprobe on
        // `memmove`: a streamed request's copies from 26.3 to 21.1 KB).
        let dispatched = boxed::pinned(|| self.dispatch(live, req, &conn, &origin, started));
        let handled = origin.run_in(dispatched).await;
        match handled {
            Dispatched::Handled(handled) => self.conclude(handled, &origin),
            // Counted and logged by its task, which finishes even if the client left.
            Dispatched::Settled(response) => response,
        }
    }

    /// Turns an error into its response and accounts for the request: once per request.
    pub(super) fn conclude(&self, handled: Handled, origin: &Origin) -> Response<Body> {
        let errors = &handled.errors;
        let mut response = handled
            .response
            .unwrap_or_else(|e| e.to_response_in(errors));
        if handled.close {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        handled
            .access
            .account(&self.metrics, response.status(), origin);
        response
    }

    /// Answers a request that needs no claim, or runs the protocol in a tracked task that
    /// accounts for the request itself.
    async fn dispatch(
        self: &Arc<Self>,
        live: Arc<Live>,
        req: Request<Incoming>,
        conn: &ConnInfo,
        origin: &Origin,
        started: Instant,
    ) -> Dispatched {
        // Refused before a route is known: in `[defaults]`'s dialect.
        let refused = |route: &Arc<str>, refusal: Refusal| {
            Dispatched::Handled(Handled {
                response: Err(refusal.error),
                access: Access::keyless(started, route.clone(), Outcome::Rejected),
                close: refusal.close,
                errors: live.config.errors.clone(),
            })
        };
        let req = match admit(req, conn) {
            Ok(req) => req,
            Err((e, body)) => return refused(&self.no_route, Refusal::drained(e, body).await),
        };
        // Routes and keys read the path with bytes outside ASCII percent-encoded.
        let matched = path::match_form(req.uri().path()).into_owned();
        if let Err(e) = head::method_case(&live.config.routes, req.method(), &matched) {
            let refusal = Refusal::drained(e, req.into_body()).await;
            return refused(&self.no_route, refusal);
        }
        // No route, or a route that is off: streamed, counted under the route's name.
        let route_idx = match route::find(&live.config.routes, req.method(), &matched) {
            Some(i) if live.config.routes[i].mode != Mode::Off => i,
            found => {
                let route = found.map(|i| &live.config.routes[i]);
                let name = route.map_or(&self.no_route, |r| &r.name);
                let errors = route.map_or(&live.config.errors, |r| &r.errors);
                let req = req.map(streamed);
                let to = (name, errors);
                let handled = self
                    .stream(&live, req, conn, to, Outcome::Passthrough, started)
                    .await;
                return Dispatched::Handled(handled);
            }
        };
        let routed = Routed {
            live: &live,
            route: route_idx,
            conn,
            origin,
            started,
        };
        self.dedupe(routed, req, &matched).await
    }

    /// A request on a route that dedupes: its key refused or absent (answered or streamed
    /// without a claim), or its body read, its signature checked and its verdict claimed.
    async fn dedupe(
        self: &Arc<Self>,
        at: Routed<'_>,
        req: Request<Incoming>,
        matched: &str,
    ) -> Dispatched {
        let Routed {
            live,
            route: route_idx,
            conn,
            started,
            ..
        } = at;
        let route = &live.config.routes[route_idx];
        // Refused in the route's dialect.
        let refused = |refusal: Refusal| {
            Dispatched::Handled(Handled {
                response: Err(refusal.error),
                access: Access::keyless(started, route.name.clone(), Outcome::Rejected),
                close: refusal.close,
                errors: route.errors.clone(),
            })
        };
        // A header key needs no body: refuse a bad one, or stream a keyless request on an
        // optional-key route, before buffering anything (not on a signed route: see
        // `Route::verdict_from_headers`).
        let (parts, body) = req.into_parts();
        let header_key = match route.header_key(&parts.headers) {
            Ok(key) => key,
            Err(skip) => {
                let req = Request::from_parts(parts, streamed(body));
                return self.skip(live, route, skip, req, conn, started).await;
            }
        };
        let mut held = Held::none(&self.budget);
        let body = match read_body(body, &parts, &live.config, &mut held).await {
            Ok(body) => body,
            Err(refusal) => {
                if let GatewayError::Overloaded = refusal.error {
                    self.shed(Shed::Memory, live);
                }
                return refused(refusal);
            }
        };
        if let Err(e) = self.check_signature(route, &parts.headers, &body) {
            return refused(Refusal::read(e));
        }
        let keyed = match verdict((live, route_idx), &parts, matched, &body, header_key).await {
            Verdict::Claim(keyed) => keyed,
            Verdict::Skip(skip) => {
                let req = Request::from_parts(parts, full(body));
                return self.skip(live, route, skip, req, conn, started).await;
            }
        };
        // Nothing is claimed, stored or sent upstream for a request refused here.
        let admitted = match self.admit_claim(live, route, held).await {
            Ok(admitted) => admitted,
            Err(shed) => {
                self.shed(shed, live);
                return refused(Refusal::read(GatewayError::Overloaded));
            }
        };
        let (delivery, delivered) = Delivery::new();
        let request = self.keyed_request(at, (parts, body), (keyed, admitted), &delivery);
        self.claim(request, delivery, delivered, &route.errors)
            .await
    }

    /// A keyed request with everything its task needs, built in its box: it goes on to
    /// the claim, the spawn and the task (0.9 KiB, copied whole at each by value).
    fn keyed_request(
        &self,
        at: Routed<'_>,
        (parts, body): (Parts, bytes::Bytes),
        (keyed, admitted): (route::Keyed, Admitted),
        delivery: &Delivery,
    ) -> Box<KeyedRequest> {
        let route = &at.live.config.routes[at.route];
        let join = (route.on_conflict == OnConflict::Join)
            .then(|| (self.streams.clone(), keyed.request_hash));
        let forwarder = Forwarder {
            join,
            delivery: delivery.clone(),
            live: at.live.clone(),
            route: at.route,
            parts,
            body,
            client_ip: at.conn.client_ip.clone(),
            key: keyed.key.clone(),
            scope: keyed.scope.clone(),
        };
        boxed::boxed(|| KeyedRequest {
            forwarder,
            policy: policy(route),
            keyed,
            route_name: route.name.clone(),
            advertise_expiry: route.advertise_expiry,
            started: at.started,
            origin: at.origin.clone(),
            admitted,
        })
    }

    /// Runs a keyed request's protocol as a task tracked for shutdown, where its client
    /// waits (see [`Inline`]): a client that hangs up must not abandon a claim or an
    /// upstream call under way and leave its outcome unknown, so its task runs on alone.
    async fn claim(
        self: &Arc<Self>,
        keyed_request: Box<KeyedRequest>,
        delivery: Delivery,
        delivered: oneshot::Receiver<Response<Body>>,
        errors: &Dialect,
    ) -> Dispatched {
        let tether = Tether::new(&self.detached);
        let client = tether.client();
        let task = keyed_request.task(self, tether, delivery);
        Dispatched::Settled(match Inline::new(task, delivered, &self.tasks).await {
            // A streamed answer's task runs on while the client reads: counted as
            // attached until the client lets go of the body.
            Some(response) if response.extensions().get::<StreamedMark>().is_some() => response
                .map(|body| {
                    Tethered {
                        body,
                        _client: client,
                    }
                    .boxed()
                }),
            Some(response) => response,
            None => {
                error!("request task ended without a response");
                GatewayError::Internal.to_response_in(errors)
            }
        })
    }

    /// A request on a deduping route that makes no claim: streamed without a key, or
    /// refused with a 400 (forwarded instead on a shadow route, the 400 recorded as what
    /// enforcement would answer).
    async fn skip(
        &self,
        live: &Live,
        route: &Route,
        skip: Skip,
        req: Request<Body>,
        conn: &ConnInfo,
        started: Instant,
    ) -> Dispatched {
        let (error, forwarded) = match skip {
            Skip::NoKey => {
                let to = (&route.name, &route.errors);
                let handled = self
                    .stream(live, req, conn, to, Outcome::NoKey, started)
                    .await;
                return Dispatched::Handled(handled);
            }
            Skip::Refused { error, forwarded } => (error, forwarded),
        };
        let (outcome, would) = match error {
            KeyError::Missing { .. } => (Outcome::MissingKey, Would::MissingKey),
            _ => (Outcome::InvalidKey, Would::InvalidKey),
        };
        if forwarded {
            let to = (&route.name, &route.errors);
            let mut handled = self
                .stream(live, req, conn, to, Outcome::Shadowed, started)
                .await;
            handled.access.would = Some(would);
            return Dispatched::Handled(handled);
        }
        // Refused before its body was read: drained, so the connection stays usable.
        let refusal = Refusal::drained(GatewayError::from(error), req.into_body()).await;
        Dispatched::Handled(Handled {
            response: Err(refusal.error),
            access: Access::keyless(started, route.name.clone(), outcome),
            close: refusal.close,
            errors: route.errors.clone(),
        })
    }

    /// Streams a request that needs no dedupe, counted under `route`'s name and answered
    /// in its dialect should the upstream fail.
    async fn stream(
        &self,
        live: &Live,
        req: Request<Body>,
        conn: &ConnInfo,
        (route, errors): (&Arc<str>, &Dialect),
        outcome: Outcome,
        started: Instant,
    ) -> Handled {
        let body_failed = passthrough::ClientBodyFailed::default();
        let req = body_failed.watch(req);
        let fwd = passthrough::forward(live, &self.metrics, req, &conn.client_ip, route).await;
        let mut access = Access::keyless(started, route.clone(), outcome);
        access.upstream = fwd.upstream;
        Handled {
            response: fwd.response.map_err(|e| body_failed.blame(e)),
            access,
            close: false,
            errors: errors.clone(),
        }
    }
}

/// A route's dedupe settings for the protocol.
fn policy(route: &Route) -> Policy {
    Policy {
        lease: route.lease,
        window: route.window,
        on_conflict: route.on_conflict,
        conflict_wait: route.conflict_wait,
        on_error: route.on_error,
        on_unknown: route.on_unknown,
        mode: route.mode,
    }
}

/// A request whose framing and head are sound, with an origin-form target and its path in
/// normal form: what routes match and the upstream gets. Refused, its body comes back
/// unread.
fn admit<B>(req: Request<B>, conn: &ConnInfo) -> Result<Request<B>, (GatewayError, B)> {
    let (parts, body) = req.into_parts();
    let head = Request::from_parts(parts, ());
    // hyper drops Content-Length when both arrive, so the evidence is the connection's
    // head scanner; the header check is defence in depth should hyper ever keep both.
    let chunked = head.headers().contains_key(TRANSFER_ENCODING);
    if chunked && (head.headers().contains_key(CONTENT_LENGTH) || conn.framing.seen()) {
        return Err((GatewayError::AmbiguousFraming, body));
    }
    if let Err(e) = head::check(&head) {
        return Err((e, body));
    }
    // A spelling the upstream reads as the same path must not slip past its route, and
    // the upstream never sees the client's authority.
    match head::origin_form(head) {
        Ok(head) => Ok(head.map(|()| body)),
        Err(e) => Err((e.into(), body)),
    }
}

/// The route's verdict on a whole request. Undoing a content coding (or a gRPC message's
/// compression) reads up to `server.max_body` bytes out of a bomb: that runs on tokio's
/// blocking threads, so the connections that share this request's event loop never wait
/// on it; a plain body is keyed where it is.
async fn verdict(
    (live, route_idx): (&Arc<Live>, usize),
    parts: &Parts,
    matched: &str,
    body: &bytes::Bytes,
    header_key: Option<String>,
) -> Verdict {
    let route = &live.config.routes[route_idx];
    let (ns, max_body) = (live.config.store.namespace(), live.config.server.max_body);
    if !route.decodes(&parts.headers) {
        return route.verdict_with(ns, max_body, &view(parts, matched, body), header_key);
    }
    let (live, body, matched) = (live.clone(), body.clone(), matched.to_owned());
    let (method, uri, headers) = (
        parts.method.clone(),
        parts.uri.clone(),
        parts.headers.clone(),
    );
    let decoding = tokio::task::spawn_blocking(move || {
        let view = RequestView {
            method: &method,
            path: &matched,
            query: uri.query(),
            headers: &headers,
            body: &body,
        };
        let (ns, max_body) = (live.config.store.namespace(), live.config.server.max_body);
        live.config.routes[route_idx].verdict_with(ns, max_body, &view, header_key)
    });
    decoding.await.unwrap_or_else(|e| {
        error!(error = %e, "decoding a request body failed in its thread");
        let corrupt = crate::protocol::key::coding::CodingError::Corrupt {
            coding: "in its content coding",
        };
        Verdict::Skip(route.refuse(KeyError::Coding(corrupt)))
    })
}

/// The parts of a request the key rules read; the path in its match form.
fn view<'a>(parts: &'a Parts, path: &'a str, body: &'a [u8]) -> RequestView<'a> {
    RequestView {
        method: &parts.method,
        path,
        query: parts.uri.query(),
        headers: &parts.headers,
        body,
    }
}
