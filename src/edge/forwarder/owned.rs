//! What the key owner's upstream answer means for the claim: released, kept unknown, or
//! final, with the record to store and the client's response (read whole or streamed).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::SET_COOKIE;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use tracing::{info, warn};

use super::super::grpc;
use super::super::join::Streams;
use super::super::passthrough::{stream_response, Forwarded};
use super::super::replay::{self, full_with_trailers};
use super::super::stream::{self, Delivery, Ready, StreamedMark};
use crate::dedupe::Attempt;
use crate::edge::problem::GatewayError;
use crate::protocol::record::{self, Field, StoredBody};
use crate::protocol::route::{self as routes, Route, StatusMeaning};
use crate::store::{Fence, RequestHash, StoreKey};
use crate::upstream::{UpstreamBody, UpstreamFailure};
use crate::{full, BoxError};

/// A record's fields: the headers it keeps, about how many bytes they take, the trailers.
type Section<'h, I> = (I, usize, &'h http::HeaderMap);

/// A final answer's record, with this client's response.
struct Kept {
    /// The record, encoded under the store key.
    record: Bytes,
    response: Result<Response<crate::Body>, GatewayError>,
    /// A streamed answer's end, sent once the record is stored.
    tail: Option<stream::Tail>,
}

/// The key owner's upstream call, classified for the protocol.
pub(super) struct OwnedCall<'a> {
    pub(super) route: &'a Route,
    pub(super) store_key: &'a StoreKey,
    pub(super) fence: Fence,
    /// The longest wait for the next frame of a streamed answer (`server.upstream_timeout`).
    pub(super) idle: Duration,
    pub(super) delivery: &'a Delivery,
    pub(super) join: Option<&'a (Arc<Streams>, RequestHash)>,
}

impl OwnedCall<'_> {
    /// No response head: the claim is released only when nothing was sent.
    pub(super) fn failed(&self, e: UpstreamFailure) -> Attempt<Forwarded> {
        let (route, store_key, fence) = (&*self.route.name, self.store_key, self.fence.get());
        if e.may_have_executed() {
            warn!(route, store_key = %store_key, fence, error = %e.chain(),
                "upstream call failed after the request may have been sent: outcome unknown");
            return Attempt::Unknown(Forwarded::failed(e.into()));
        }
        warn!(route, error = %e.chain(), "upstream unreachable: nothing was sent, releasing the claim");
        Attempt::NotExecuted(Forwarded::failed(e.into()))
    }

    /// A response head: what its status means for the claim, and for a final one, the
    /// record to store once its body has been read (streamed to the client meanwhile).
    pub(super) async fn answered(
        &self,
        resp: Response<UpstreamBody>,
        took: Duration,
    ) -> Attempt<Forwarded> {
        let route = self.route;
        let meaning = route.statuses.classify(resp.status().as_u16());
        let forwarded = |response| Forwarded {
            response,
            upstream: Some(took),
            expires: None,
            tail: None,
        };
        match meaning {
            // The upstream says it did not act: the next retry should execute again.
            StatusMeaning::Retry => {
                return Attempt::NotExecuted(forwarded(Ok(stream_response(resp))));
            }
            // A timeout behind the upstream: it may have acted. Keep the claim.
            StatusMeaning::Unknown => {
                warn!(route = &*route.name, store_key = %self.store_key, fence = self.fence.get(),
                    status = resp.status().as_u16(), "upstream answered a status that leaves the outcome unknown");
                return Attempt::Unknown(forwarded(Ok(stream_response(resp))));
            }
            StatusMeaning::Final => {}
        }
        let (head, body) = resp.into_parts();
        let limit = route.max_cached_body;
        let ready = if route.grpc {
            // gRPC's status comes in the trailers: the answer is read before the claim is
            // settled, within `max_cached_body`.
            let ready = grpc::read_answer(body, limit, self.idle).await;
            match grpc::meaning(route, &head, &ready) {
                StatusMeaning::Final => ready,
                meaning => return self.unsettled(meaning, head, ready, took),
            }
        } else if route.store_body {
            stream::read_ready(body, limit).await
        } else {
            // Only the outcome is kept: the body streams to this client alone.
            let body = body.map_err(BoxError::from).boxed();
            return self.outcome_only(head, body, took);
        };
        // The store forgets the key a window after completion, which follows at once: to
        // the second, this is when, and never later than the store does.
        let expires = SystemTime::now() + route.window;
        let kept = self.kept(head, ready, expires).await;
        self.settled(kept, expires, took)
    }

    /// A final answer's record, with this client's response.
    fn settled(&self, kept: Kept, expires: SystemTime, took: Duration) -> Attempt<Forwarded> {
        Attempt::Final {
            record: kept.record,
            response: Forwarded {
                response: kept.response,
                upstream: Some(took),
                expires: Some(expires),
                tail: kept.tail,
            },
        }
    }

    /// A route that keeps only the outcome (`store_body = false`): final, its body
    /// streamed to this client alone.
    fn outcome_only(
        &self,
        head: http::response::Parts,
        body: crate::Body,
        took: Duration,
    ) -> Attempt<Forwarded> {
        let expires = SystemTime::now() + self.route.window;
        let none = http::HeaderMap::new();
        let fields = (record::map_fields(&none), 0, &none);
        let kept = Kept {
            record: self.record(head.status, fields, &StoredBody::NotStored, expires),
            response: Ok(Response::from_parts(head, body)),
            tail: None,
        };
        self.settled(kept, expires, took)
    }

    /// A gRPC answer read whole whose status releases the key or leaves the outcome
    /// unknown: answered as it came, nothing stored.
    fn unsettled(
        &self,
        meaning: StatusMeaning,
        head: http::response::Parts,
        ready: Ready,
        took: Duration,
    ) -> Attempt<Forwarded> {
        let response = match ready {
            Ready::Whole(bytes, trailers) => {
                let mut head = head;
                let body = full_with_trailers(&mut head.headers, bytes, trailers);
                Ok(Response::from_parts(head, body))
            }
            Ready::Broken(reason) => {
                warn!(route = &*self.route.name, store_key = %self.store_key, fence = self.fence.get(),
                    reason, "gRPC answer broke off after its head: outcome unknown");
                Err(UpstreamFailure::Broken("the response body broke off".into()).into())
            }
            // Never unsettled: past the limit the status cannot be read in time.
            Ready::More(_) => Err(GatewayError::Internal),
        };
        let forwarded = Forwarded {
            response,
            upstream: Some(took),
            expires: None,
            tail: None,
        };
        match meaning {
            StatusMeaning::Retry => Attempt::NotExecuted(forwarded),
            _ => {
                warn!(route = &*self.route.name, store_key = %self.store_key, fence = self.fence.get(),
                    "gRPC status leaves the outcome unknown");
                Attempt::Unknown(forwarded)
            }
        }
    }

    /// The status, headers and body to store under the replay policy, and this client's
    /// response: from memory when the body was already whole, streamed otherwise (then the
    /// client has it already, and what comes back only carries its status).
    async fn kept(&self, head: http::response::Parts, ready: Ready, expires: SystemTime) -> Kept {
        let route = self.route;
        let limit = route.max_cached_body;
        let status = head.status;
        let partial = match ready {
            Ready::Whole(bytes, trailers) => return self.whole(head, (bytes, trailers), expires),
            Ready::Broken(reason) => return self.cut_off(&head, &reason, expires),
            Ready::More(partial) => partial,
        };
        // The head as it came, for the record written at the body's end (the client's
        // head takes `Idempotency-Expires` first).
        let headers = head.headers.clone();
        // Joiners get the head a replay would.
        let offered_headers = self.join.map(|_| {
            let mut offered = headers.clone();
            offered.remove(SET_COOKIE);
            routes::drop_headers(&route.replay_drop_headers, &mut offered);
            offered
        });
        if partial.over {
            info!(
                route = &*route.name,
                limit, "response body larger than max_cached_body: stored without its body"
            );
        }
        let length = head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let (tx, streamed) = stream::channel();
        let mut head = head;
        // Sent with the head, before the record exists: a streamed answer is stored at
        // its end, under this expiry.
        if route.advertise_expiry {
            replay::advertise(&mut head.headers, Some(expires));
        }
        let offer = self
            .join
            .zip(offered_headers)
            .map(|((streams, hash), headers)| {
                streams.open(self.store_key, *hash, status, headers, limit)
            });
        let mut response = Response::from_parts(head, streamed.boxed());
        response.extensions_mut().insert(StreamedMark);
        self.delivery.deliver(response);
        let pumped = stream::pump(partial, limit, self.idle, length, tx, offer).await;
        if let Some(reason) = &pumped.broke {
            self.broke(reason);
        }
        // The client has its response; this one only carries its status to the log.
        let mut delivered = Response::new(full(Bytes::new()));
        *delivered.status_mut() = status;
        delivered.extensions_mut().insert(StreamedMark);
        let fields = self.kept_fields(&headers, &pumped.trailers);
        Kept {
            record: self.record(status, fields, &pumped.body, expires),
            response: Ok(delivered),
            tail: Some(pumped.tail),
        }
    }

    /// An answer read whole: its record written now, from the head the client gets (no copy
    /// of its header map), and the client's response from memory.
    fn whole(
        &self,
        mut head: http::response::Parts,
        (bytes, trailers): (Bytes, http::HeaderMap),
        expires: SystemTime,
    ) -> Kept {
        let body = StoredBody::Stored(bytes.clone());
        let fields = self.kept_fields(&head.headers, &trailers);
        let record = self.record(head.status, fields, &body, expires);
        let body = full_with_trailers(&mut head.headers, bytes, trailers);
        Kept {
            record,
            response: Ok(Response::from_parts(head, body)),
            tail: None,
        }
    }

    /// An answer whose body broke off before it was whole: executed, stored without a
    /// replayable body; its client gets the failure.
    fn cut_off(&self, head: &http::response::Parts, reason: &str, expires: SystemTime) -> Kept {
        self.broke(reason);
        let broken = UpstreamFailure::Broken("the response body broke off".into());
        let none = http::HeaderMap::new();
        let body = &StoredBody::Incomplete;
        Kept {
            record: self.record(
                head.status,
                self.kept_fields(&head.headers, &none),
                body,
                expires,
            ),
            response: Err(broken.into()),
            tail: None,
        }
    }

    /// The record of a final answer: its headers (those the replay policy keeps: dropped
    /// headers never reach the store), its trailers and its body, expiring at `expires`.
    fn record<'h>(
        &self,
        status: StatusCode,
        (headers, size, trailers): Section<'h, impl Iterator<Item = Field<'h>>>,
        body: &StoredBody,
        expires: SystemTime,
    ) -> Bytes {
        let fields = record::Fields {
            headers,
            size,
            trailers,
        };
        record::encode(self.store_key, status, fields, body, Some(expires))
    }

    /// The fields of `headers` the replay policy keeps, with `trailers`, for [`Self::record`].
    fn kept_fields<'h>(
        &self,
        headers: &'h http::HeaderMap,
        trailers: &'h http::HeaderMap,
    ) -> Section<'h, impl Iterator<Item = Field<'h>> + use<'h, '_>> {
        let drops = &self.route.replay_drop_headers;
        let kept =
            record::map_fields(headers).filter(move |(name, _)| routes::replay_keeps(drops, name));
        (kept, record::map_size(headers), trailers)
    }

    fn broke(&self, reason: &str) {
        warn!(route = &*self.route.name, store_key = %self.store_key, fence = self.fence.get(), reason,
            "upstream answered but its body broke off: stored as executed without a replayable body");
    }
}
