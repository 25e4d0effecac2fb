//! A request past its claim's inputs, run to its end in a task of its own: tracked for
//! shutdown, so a client that hangs up never abandons a claim or an upstream call under
//! way; the task settles the protocol, builds the response and accounts for the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Response;
use tracing::{error, warn, Instrument};

use super::access::{Access, Origin};
use super::detach::{TaskSide, Tether};
use super::forwarder::Forwarder;
use super::inline::TaskFuture;
use super::passthrough::Forwarded;
use super::recent::RecentLatency;
use super::request::Handled;
use super::stream::Delivery;
use super::{replay, Gateway};
use crate::dedupe::{self, Answer, Finish, Outcome, Policy};
use crate::edge::problem::GatewayError;
use crate::protocol::route::{Dialect, Keyed, Mode, OnConflict};
use crate::runtime::boxed;
use crate::store::Order;
use crate::Body;

/// A request past its claim's inputs: everything its task needs.
pub(super) struct KeyedRequest {
    pub(super) forwarder: Forwarder,
    pub(super) policy: Policy,
    pub(super) keyed: Keyed,
    pub(super) route_name: Arc<str>,
    pub(super) advertise_expiry: bool,
    pub(super) started: Instant,
    pub(super) origin: Origin,
}

impl KeyedRequest {
    /// The protocol as a task that accounts for the request, for [`Inline`] to run where
    /// its client waits (and on its own once the client lets go).
    ///
    /// A plain function, not part of `dispatch`'s state: built there, the task's future
    /// (several KiB) was kept in the request future too and copied with it on every move.
    /// The response goes to `delivery`: early, by the forwarder, when the winner's answer
    /// streams; at the task's end otherwise.
    ///
    /// [`Inline`]: super::inline::Inline
    pub(super) fn task(
        self: Box<Self>,
        gateway: &Arc<Gateway>,
        tether: Tether,
        delivery: Delivery,
    ) -> TaskFuture {
        let this = self;
        // In the request's spans, as `Gateway::handle` runs it (see `Origin::run_in`).
        let (span, trace) = (this.origin.span.clone(), this.origin.trace.clone());
        let gateway = gateway.clone();
        // Built in its box (see `boxed`): a 5 KiB future moved by value was copied whole
        // at each move; a box makes each move, and a detach into a task of its own, a
        // pointer's. Boxed before the spans wrap it, or each wrapper copies it once more on
        // its way in; the wrapped future is boxed again, small.
        let task = boxed::pinned(move || Self::run(this, gateway, tether, delivery));
        Box::pin(task.instrument(span).instrument(trace))
    }
}

impl KeyedRequest {
    /// The task: the protocol, then the response and the request's account. Its future
    /// starts as its four arguments, built in the box `spawn` gives it.
    async fn run(this: Box<Self>, gateway: Arc<Gateway>, tether: Tether, delivery: Delivery) {
        // Unboxed in the task, where it stays: the forwarder's call takes it by value.
        let this = *this;
        let _task = TaskSide(tether);
        let env = gateway.env();
        let keyed = &this.keyed;
        // The forwarder goes into the protocol; the route's latencies stay for a 409.
        let (live, route) = (this.forwarder.live.clone(), this.forwarder.route);
        if let Some(response) = this.joined(&gateway) {
            return delivery.deliver(response);
        }
        let order = keyed.order.as_ref().map(|(entity, o)| Order {
            entity,
            version: &o.version,
        });
        let (key, scope, route_name): (&str, &str, &str) =
            (&keyed.key, &keyed.scope, &this.route_name);
        let mut settled = dedupe::run(
            &env,
            &keyed.store_key,
            &keyed.request_hash,
            &this.policy,
            order,
            |forward| {
                this.forwarder
                    .execute(&gateway.metrics, &keyed.store_key, forward)
            },
        )
        .await;
        // The record is stored (or refused): a streamed answer may end now.
        if let Answer::Forwarded(f) = &mut settled.answer {
            if let Some(tail) = f.tail.take() {
                tail.finish().await;
            }
        }
        if settled.outcome == Outcome::Stale {
            if let Some((_, o)) = &keyed.order {
                warn!(route = route_name, key = %key, scope = %scope, version = %o.shown,
                    "stale version: a newer version of this entity was already written; answered 200 Dedupe-Stale, not forwarded");
            }
        }
        let errors = &live.config.routes[route].errors;
        let answered = Answered {
            keyed: &this.keyed,
            recent: &live.recent[route],
            route_name: &this.route_name,
            advertise_expiry: this.advertise_expiry,
            errors,
        };
        let (response, upstream) = answered.respond(settled.answer, settled.finish);
        let access = Access {
            started: this.started,
            route: this.route_name,
            outcome: settled.outcome,
            finish: settled.finish,
            fence: settled.fence,
            upstream,
            key: Some((this.keyed.key, this.keyed.scope)),
            would: settled.would,
        };
        let handled = Handled {
            response,
            access,
            close: false,
            errors: errors.clone(),
        };
        delivery.deliver(gateway.conclude(handled, &this.origin));
    }

    /// On an `on_conflict = "join"` route, the first request's answer streaming on this
    /// gateway for the same request, followed from where it is (accounted as `joined`):
    /// no claim is made, the winner's one upstream call serves both.
    fn joined(&self, gateway: &Gateway) -> Option<Response<Body>> {
        if self.policy.on_conflict != OnConflict::Join || self.policy.mode != Mode::Enforce {
            return None;
        }
        let keyed = &self.keyed;
        let response = gateway
            .streams
            .join(&keyed.store_key, &keyed.request_hash)?;
        let access = Access {
            started: self.started,
            route: self.route_name.clone(),
            outcome: Outcome::Joined,
            finish: None,
            fence: None,
            upstream: None,
            key: Some((keyed.key.clone(), keyed.scope.clone())),
            would: None,
        };
        let forwarder = &self.forwarder;
        let handled = Handled {
            response: Ok(response),
            access,
            close: false,
            errors: forwarder.live.config.routes[forwarder.route].errors.clone(),
        };
        Some(gateway.conclude(handled, &self.origin))
    }
}

/// What a keyed request's response is made from, once the protocol has answered.
struct Answered<'a> {
    keyed: &'a Keyed,
    recent: &'a RecentLatency,
    route_name: &'a str,
    advertise_expiry: bool,
    /// The route's dialect, for a record whose body was not stored.
    errors: &'a Dialect,
}

impl Answered<'_> {
    /// The client's response for the protocol's answer, and how long the upstream took
    /// to answer its head when it was called.
    fn respond(
        &self,
        answer: Answer<Forwarded>,
        finish: Option<Finish>,
    ) -> (Result<Response<Body>, GatewayError>, Option<Duration>) {
        let keyed = self.keyed;
        match answer {
            Answer::Forwarded(Forwarded {
                mut response,
                upstream,
                expires,
                ..
            }) => {
                // Only a stored record has an expiry to advertise.
                let stored = finish == Some(Finish::Completed);
                if let (Ok(r), true) = (&mut response, stored && self.advertise_expiry) {
                    replay::advertise(r.headers_mut(), expires);
                }
                (response, upstream)
            }
            Answer::Replay(record) => (
                replay::respond(
                    &record,
                    &keyed.store_key,
                    self.advertise_expiry,
                    self.errors,
                ),
                None,
            ),
            Answer::Conflict { retry_after } => {
                let retry_after = self.recent.retry_after(retry_after);
                (Err(GatewayError::Conflict { retry_after }), None)
            }
            Answer::Mismatch => (Err(GatewayError::Mismatch), None),
            Answer::OutcomeUnknown { fence, first } => {
                // Once per held key (the store tells the first claim to see it): a person
                // must look at it.
                if first {
                    error!(route = self.route_name, key = %keyed.key, scope = %keyed.scope, fence = fence.get(),
                        "outcome unknown and held: the first request's lease ended without an outcome; \
                         resolve it with POST /keys/{{route}}/{{key}}/resolve on the admin port");
                }
                (Err(GatewayError::OutcomeUnknown), None)
            }
            Answer::StoreUnavailable => (Err(GatewayError::StoreUnavailable), None),
            Answer::RecordUnreadable => (Err(GatewayError::RecordUnreadable), None),
            Answer::Stale => (Err(GatewayError::Stale), None),
        }
    }
}
