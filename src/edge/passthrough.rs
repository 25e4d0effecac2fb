//! Forwarding without dedupe: streamed both ways, bounded by `upstream_timeout` until the
//! response head.

use http::HeaderValue;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{Request, Response};
use http_body_util::BodyExt;
use tracing::warn;

use super::stream::Tail;
use super::Live;
use crate::edge::problem::GatewayError;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::traces;
use crate::upstream::{UpstreamBody, UpstreamFailure};
use crate::{Body, BoxError};

/// An upstream call's result and how long its head took.
pub(super) struct Forwarded {
    pub response: Result<Response<Body>, GatewayError>,
    pub upstream: Option<Duration>,
    /// The expiry the winner's record carries, once stored: `Idempotency-Expires`.
    pub expires: Option<SystemTime>,
    /// A streamed answer's end, sent once its record is stored.
    pub tail: Option<Tail>,
}

impl Forwarded {
    /// A call that ended in an error the gateway answers itself.
    pub fn failed(e: GatewayError) -> Self {
        Self {
            response: Err(e),
            upstream: None,
            expires: None,
            tail: None,
        }
    }
}

/// Forwards `req` as it is (after the proxy hop's header rules) and streams the answer.
pub(super) async fn forward(
    live: &Live,
    metrics: &Metrics,
    req: Request<Body>,
    client_ip: &HeaderValue,
    route: &Arc<str>,
) -> Forwarded {
    let mut req = live.upstream.prepare(req, client_ip);
    let span = traces::upstream();
    traces::inject(&span, req.headers_mut());
    let started = Instant::now();
    let deadline = live.upstream.deadline();
    match live.upstream.call(req, deadline, span.clone()).await {
        Err(e) => {
            warn!(route = &**route, error = %e.chain(), "upstream request failed");
            Forwarded::failed(e.into())
        }
        Ok(resp) => {
            let took = started.elapsed();
            traces::record_status(&span, resp.status().as_u16());
            metrics.upstream(route, resp.status().as_u16(), took);
            Forwarded {
                response: Ok(stream_response(resp)),
                upstream: Some(took),
                expires: None,
                tail: None,
            }
        }
    }
}

/// Raised when the client's request body fails while it is streamed upstream (a malformed
/// chunk, a reset): the upstream call then breaks because of the client, which gets a 400,
/// not a 502 blaming the upstream.
#[derive(Clone, Default)]
pub(super) struct ClientBodyFailed(Arc<AtomicBool>);

impl ClientBodyFailed {
    /// `req` with its body watched.
    pub fn watch(&self, req: Request<Body>) -> Request<Body> {
        let flag = self.0.clone();
        req.map(|b| {
            b.map_err(move |e| {
                flag.store(true, Ordering::Relaxed);
                e
            })
            .boxed()
        })
    }

    /// The error to answer with: the client's, when its body failed.
    pub fn blame(&self, e: GatewayError) -> GatewayError {
        match e {
            GatewayError::Upstream(UpstreamFailure::Broken(_))
                if self.0.load(Ordering::Relaxed) =>
            {
                GatewayError::BodyUnreadable
            }
            e => e,
        }
    }
}

/// The upstream's response, streamed, without its hop-by-hop headers.
pub(super) fn stream_response(resp: Response<UpstreamBody>) -> Response<Body> {
    resp.map(|body| body.map_err(BoxError::from).boxed())
}
