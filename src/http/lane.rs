//! The gateway's side of the HTTP/1 lane ([`crate::lane`]): which requests it may take
//! (all but a gRPC route's; a deduping route's go to [`Gateway::handle_read`]), the one
//! upstream call in bytes, and the request's accounting, as [`Gateway::handle`] does it
//! for a streamed request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Method, Response, Uri};
use tracing::warn;

use super::access::{Access, Origin};
use super::{Gateway, Live};
use crate::dedupe::Outcome;
use crate::problem::GatewayError;
use crate::route::{self, Dialect, Mode};
use crate::upstream::{RawHead, UpstreamBody};
use crate::Body;

/// The route a lane request is counted under: none, one that is off, or one that dedupes
/// (`keyed`: the full pipeline handles the request, read whole by the lane).
pub struct LaneRoute {
    name: Arc<str>,
    errors: Dialect,
    keyed: bool,
}

impl LaneRoute {
    /// The route dedupes: the request goes to [`Gateway::handle_read`] once read whole.
    pub fn keyed(&self) -> bool {
        self.keyed
    }
}

/// A request the lane has read whole.
pub struct LaneCall<'a> {
    /// Its method.
    pub method: Method,
    /// Its target as the client sent it, for the access line.
    pub target: &'a str,
    /// The request as the upstream gets it: its head, then its body.
    pub request: [Bytes; 2],
    /// When its head was read.
    pub started: Instant,
    /// When the upstream's head is due (`server.upstream_timeout` from the request's).
    pub deadline: tokio::time::Instant,
}

/// What the lane writes back.
pub enum LaneAnswer {
    /// The upstream's answer: its head written for the client (unended), and its body.
    Relayed {
        /// The head for the client, its status line and fields, not yet ended.
        out: Vec<u8>,
        /// What the head says of the body.
        head: RawHead,
        /// The body.
        body: UpstreamBody,
    },
    /// A response the gateway made: the upstream failed.
    Made(Response<Body>),
}

impl Gateway {
    /// The route `method` and `path` (normal, ASCII) are counted under when the lane may
    /// take them; `None` when a gRPC route matches (its trailers are HTTP/2's), or the
    /// upstream or the traces need the full path.
    pub fn lane_route(&self, live: &Live, method: &Method, path: &str) -> Option<LaneRoute> {
        if crate::telemetry::on() || live.upstream.lane().is_none() {
            return None;
        }
        match route::find(&live.config.routes, method, path) {
            None => Some(LaneRoute {
                name: self.no_route.clone(),
                errors: live.config.errors.clone(),
                keyed: false,
            }),
            Some(i) if live.config.routes[i].grpc => None,
            Some(i) => {
                let route = &live.config.routes[i];
                Some(LaneRoute {
                    name: route.name.clone(),
                    errors: route.errors.clone(),
                    keyed: route.mode != Mode::Off,
                })
            }
        }
    }

    /// Calls the upstream with a lane request and accounts for it, as a streamed request
    /// is: a passthrough, its upstream time, its status; an upstream that fails is a
    /// problem in the route's dialect. The call runs in the request's span, its accounting
    /// after it, as the full path's.
    pub async fn lane_call(&self, live: &Live, route: LaneRoute, call: LaneCall<'_>) -> LaneAnswer {
        let uri = PathAndQuery::try_from(call.target).map_or_else(|_| Uri::default(), Uri::from);
        let origin = Origin::bare(call.method.clone(), uri);
        let mut access = Access::keyless(call.started, route.name.clone(), Outcome::Passthrough);
        let relayed = origin.run_in(self.lane_exchange(live, &route, call)).await;
        match relayed {
            Ok((took, out, head, body)) => {
                access.upstream = Some(took);
                access.account(&self.metrics, head.status, &origin);
                LaneAnswer::Relayed { out, head, body }
            }
            Err(e) => LaneAnswer::Made(self.lane_refused(e, &route, access, &origin)),
        }
    }

    /// The upstream call: how long its head took, the head written for the client, and
    /// the body.
    async fn lane_exchange(
        &self,
        live: &Live,
        route: &LaneRoute,
        call: LaneCall<'_>,
    ) -> Result<(Duration, Vec<u8>, RawHead, UpstreamBody), GatewayError> {
        let mut out = Vec::with_capacity(512);
        let called = Instant::now();
        let relayed = live
            .upstream
            .relay(call.request, &call.method, &mut out, call.deadline)
            .await;
        match relayed {
            Ok((head, body)) => {
                let took = called.elapsed();
                self.metrics
                    .upstream(&route.name, head.status.as_u16(), took);
                Ok((took, out, head, body))
            }
            Err(e) => {
                warn!(route = &*route.name, error = %e.chain(), "upstream request failed");
                Err(e.into())
            }
        }
    }

    /// A lane request the gateway answers itself, accounted for.
    fn lane_refused(
        &self,
        e: GatewayError,
        route: &LaneRoute,
        access: Access,
        origin: &Origin,
    ) -> Response<Body> {
        let response = e.to_response_in(&route.errors);
        access.account(&self.metrics, response.status(), origin);
        response
    }

    /// A lane request whose body did not arrive by its upstream deadline
    /// (`server.upstream_timeout` from its head): a problem in the route's dialect (408,
    /// nothing was sent upstream), accounted for as a refused request.
    pub fn lane_body_timeout(
        &self,
        route: &LaneRoute,
        method: Method,
        target: &str,
        started: Instant,
    ) -> Response<Body> {
        let uri = PathAndQuery::try_from(target).map_or_else(|_| Uri::default(), Uri::from);
        let origin = Origin::bare(method, uri);
        let access = Access::keyless(started, route.name.clone(), Outcome::Rejected);
        self.lane_refused(GatewayError::BodyTimeout, route, access, &origin)
    }
}
