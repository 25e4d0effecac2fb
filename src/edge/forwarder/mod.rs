//! The won claim's upstream call, classified for the protocol: a final answer to store,
//! a failure without effect (release), or an unknown outcome (keep the claim).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http::request::Parts;
use http::Request;
use tracing::Instrument;

use super::join::Streams;
use super::passthrough::{self, Forwarded};
use super::stream::Delivery;
use super::Live;
use crate::dedupe::{Attempt, Forward};
use crate::full;
use crate::protocol::headers::{IDEMPOTENCY_FENCE, IDEMPOTENCY_KEY, IDEMPOTENCY_SCOPE};
use crate::protocol::route::Route;
use crate::store::{Fence, RequestHash, StoreKey};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::traces;

mod owned;

use self::owned::OwnedCall;

/// A keyed request, buffered, ready to go upstream once the protocol says how.
pub(super) struct Forwarder {
    pub live: Arc<Live>,
    pub route: usize,
    pub parts: Parts,
    pub body: Bytes,
    /// The client's IP address, for `X-Forwarded-For`.
    pub client_ip: HeaderValue,
    /// The client's key (or fingerprint), forwarded as `Idempotency-Key`.
    pub key: String,
    /// The scope hash, forwarded as `Idempotency-Scope`.
    pub scope: String,
    /// Where a streamed answer's head goes at once.
    pub delivery: Delivery,
    /// On an `on_conflict = "join"` route: where a streamed answer is offered to
    /// duplicates, under the request's hash.
    pub join: Option<(Arc<Streams>, RequestHash)>,
}

impl Forwarder {
    /// Performs the upstream call the protocol asked for.
    pub async fn execute(
        self,
        metrics: &Metrics,
        store_key: &StoreKey,
        forward: Forward,
    ) -> Attempt<Forwarded> {
        let Forwarder {
            live,
            route,
            parts,
            body,
            client_ip,
            key,
            scope,
            delivery,
            join,
        } = self;
        let route_idx = route;
        let route: &Route = &live.config.routes[route_idx];
        let fence = match forward {
            Forward::Owned(fence) => fence,
            // Failing open: a plain forward. The protocol does not settle anything for it,
            // so its classification is never read.
            Forward::Unguarded => {
                let req = Request::from_parts(parts, full(body));
                let fwd = passthrough::forward(&live, metrics, req, &client_ip, &route.name).await;
                return Attempt::Unknown(fwd);
            }
        };
        let call = OwnedCall {
            route,
            store_key,
            fence,
            idle: live.config.server.upstream_timeout,
            delivery: &delivery,
            join: join.as_ref(),
        };
        let span = traces::upstream();
        let deadline = live.upstream.deadline();
        let started = Instant::now();
        let req = Request::from_parts(parts, full(body));
        let mut req = live.upstream.prepare(req, &client_ip);
        owner_headers(req.headers_mut(), &key, &scope, fence);
        if route.grpc {
            crate::upstream::own_grpc_deadline(req.headers_mut(), deadline);
        }
        traces::inject(&span, req.headers_mut());
        let called = live.upstream.call(req, deadline, span.clone()).await;
        let answer = match called {
            Ok(answer) => answer,
            Err(e) => return call.failed(e),
        };
        let took = started.elapsed();
        let status = answer.status().as_u16();
        traces::record_status(&span, status);
        metrics.upstream(&route.name, status, took);
        live.recent[route_idx].record(took);
        // The body the store keeps is read under the same span.
        call.answered(answer, took).instrument(span).await
    }
}

/// What the owner's call tells the upstream: the key, its fence and its scope.
fn owner_headers(headers: &mut http::HeaderMap, key: &str, scope: &str, fence: Fence) {
    // A header key is visible ASCII and a fingerprint is hex: both are valid values.
    if let Ok(v) = HeaderValue::from_str(&crate::protocol::key::forwarded_key(key)) {
        headers.insert(IDEMPOTENCY_KEY.clone(), v);
    }
    headers.insert(IDEMPOTENCY_FENCE.clone(), HeaderValue::from(fence.get()));
    // A hex hash or `-`: always a valid value.
    if let Ok(v) = HeaderValue::from_str(scope) {
        headers.insert(IDEMPOTENCY_SCOPE.clone(), v);
    }
}
