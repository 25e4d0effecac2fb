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
use crate::headers::{IDEMPOTENCY_FENCE, IDEMPOTENCY_KEY, IDEMPOTENCY_SCOPE};
use crate::metrics::Metrics;
use crate::route::Route;
use crate::store::{Fence, RequestHash, StoreKey};
use crate::telemetry;
use crate::upstream::sent::SentHead;
use crate::upstream::UpstreamFailure;

mod owned;

use self::owned::{Answer, OwnedCall, Relayed};

/// A keyed request, buffered, ready to go upstream once the protocol says how.
pub(super) struct Forwarder {
    pub live: Arc<Live>,
    pub route: usize,
    pub parts: Parts,
    pub body: Bytes,
    /// The head as the client sent it, read by the HTTP/1 lane: a winner writes the
    /// upstream's head from it, adds the owner's fields and sends it as it is, without a
    /// header map (see [`SentHead::keyed_upstream`]). `None` on hyper's path.
    pub sent: Option<SentHead>,
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
            sent,
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
        let span = telemetry::upstream();
        let deadline = live.upstream.deadline();
        let started = Instant::now();
        // The head from the client's bytes, with the owner's fields, when the lane's rules
        // hold (a plain upstream; the lane is off while traces are, so there is no
        // `traceparent` to add).
        let encoded = sent
            .zip(live.upstream.lane())
            .filter(|_| !telemetry::on())
            .and_then(|(sent, to)| {
                let head = sent.keyed_upstream(to, client_ip.as_bytes());
                owned_head(head, &key, &scope, fence)
            });
        let called = match encoded {
            Some(head) => relayed_call(&live, [head, body], &parts.method, (deadline, &span)).await,
            None => {
                let req = Request::from_parts(parts, full(body));
                let mut req = live.upstream.prepare(req, &client_ip);
                owner_headers(req.headers_mut(), &key, &scope, fence);
                if route.grpc {
                    crate::upstream::own_grpc_deadline(req.headers_mut(), deadline);
                }
                telemetry::inject(&span, req.headers_mut());
                let called = live.upstream.call(req, deadline, span.clone()).await;
                called.map(Answer::Map)
            }
        };
        let answer = match called {
            Ok(answer) => answer,
            Err(e) => return call.failed(e),
        };
        let took = started.elapsed();
        let status = answer.status().as_u16();
        telemetry::record_status(&span, status);
        metrics.upstream(&route.name, status, took);
        live.recent[route_idx].record(took);
        // The body the store keeps is read under the same span.
        call.answered(answer, took).instrument(span).await
    }
}

/// The winner's request in bytes (`request`: its head, then its body), its answer's head
/// written for the client as it is read, as the lane's plain requests' are: no header map
/// on either side. By `deadline`, in `span`.
async fn relayed_call(
    live: &Live,
    request: [Bytes; 2],
    method: &http::Method,
    (deadline, span): (tokio::time::Instant, &tracing::Span),
) -> Result<Answer, UpstreamFailure> {
    let mut out = Vec::with_capacity(256);
    let relayed = live.upstream.relay(request, method, &mut out, deadline);
    let (head, body) = relayed.instrument(span.clone()).await?;
    Ok(Answer::Relayed(Relayed { head, out, body }))
}

/// What the owner's call tells the upstream: the key, its fence and its scope.
fn owner_headers(headers: &mut http::HeaderMap, key: &str, scope: &str, fence: Fence) {
    // A header key is visible ASCII and a fingerprint is hex: both are valid values.
    if let Ok(v) = HeaderValue::from_str(&crate::key::forwarded_key(key)) {
        headers.insert(IDEMPOTENCY_KEY.clone(), v);
    }
    headers.insert(IDEMPOTENCY_FENCE.clone(), HeaderValue::from(fence.get()));
    // A hex hash or `-`: always a valid value.
    if let Ok(v) = HeaderValue::from_str(scope) {
        headers.insert(IDEMPOTENCY_SCOPE.clone(), v);
    }
}

/// The head written for the upstream from the client's (see [`Forwarder::sent`]) ended with the
/// owner's fields, as [`owner_headers`] sets them on a header map: `None` when the key or
/// the scope is no valid field value (never, for a header key or a fingerprint), so the
/// header map's way decides.
fn owned_head(mut head: Vec<u8>, key: &str, scope: &str, fence: Fence) -> Option<Bytes> {
    let key = crate::key::forwarded_key(key);
    if !(field_value(key.as_bytes()) && field_value(scope.as_bytes())) {
        return None;
    }
    head.extend_from_slice(b"idempotency-key: ");
    head.extend_from_slice(key.as_bytes());
    head.extend_from_slice(b"\r\nidempotency-fence: ");
    head.extend_from_slice(itoa::Buffer::new().format(fence.get()).as_bytes());
    head.extend_from_slice(b"\r\nidempotency-scope: ");
    head.extend_from_slice(scope.as_bytes());
    head.extend_from_slice(b"\r\n\r\n");
    Some(Bytes::from(head))
}

/// `HeaderValue::from_str` would take it: visible ASCII, spaces and tabs, no
/// line breaks or other controls.
fn field_value(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (32..127).contains(&b))
}
