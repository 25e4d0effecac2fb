//! The winner's answer on a `grpc = true` route: read whole before the claim is settled,
//! since its status (`grpc-status`) comes in the trailers after the messages, and what
//! that status means for the claim.

use std::time::Duration;

use http::response::Parts;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;

use super::capture::Gathered;
use super::stream::{Partial, Ready};
use crate::protocol::grpc::status;
use crate::protocol::route::{Route, StatusMeaning};
use crate::upstream::UpstreamBody;

/// Reads the body and its trailers, waiting at most `idle` for each frame: whole; broken
/// off or stalled (a stream reset after the head); or, past `limit` bytes, what was read
/// and the rest, to be streamed.
pub(super) async fn read_answer(mut body: UpstreamBody, limit: u64, idle: Duration) -> Ready {
    let mut read = Gathered::default();
    let mut trailers = HeaderMap::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                let why = "the upstream body stalled for server.upstream_timeout";
                return Ready::Broken(why.to_owned());
            }
            Ok(None) => return Ready::Whole(read.into_bytes(), trailers),
            Ok(Some(Err(e))) => return Ready::Broken(e.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        match frame.into_data() {
            Ok(data) => {
                if read.push(data) as u64 > limit {
                    return Ready::More(Partial {
                        read,
                        over: true,
                        rest: body,
                    });
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers.extend(t);
                }
            }
        }
    }
}

/// What a gRPC answer means for the claim: its `grpc-status` (in the head of a
/// trailers-only answer, else in the trailers) under the route's `grpc_retry_codes` and
/// `grpc_unknown_codes`. An answer that broke off after its head, or a 200 that ended
/// without a status, leaves the outcome unknown; an HTTP answer without one (a proxy's
/// 404, its HTTP status already judged final) is final, and so is one past
/// `max_cached_body` (its status comes too late to decide).
pub(super) fn meaning(route: &Route, head: &Parts, ready: &Ready) -> StatusMeaning {
    match ready {
        Ready::Whole(_, trailers) => {
            match status::of(&head.headers).or_else(|| status::of(trailers)) {
                Some(code) => route.grpc_codes.classify(code),
                None if head.status == StatusCode::OK => StatusMeaning::Unknown,
                None => StatusMeaning::Final,
            }
        }
        Ready::Broken(_) => StatusMeaning::Unknown,
        Ready::More(_) => StatusMeaning::Final,
    }
}
