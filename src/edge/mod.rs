//! The hyper edge: everything that knows HTTP. It checks a request's framing, picks its
//! route, streams what needs no dedupe, reads and keys what does, hands that to the
//! protocol ([`crate::dedupe::run`]) with a forwarder, and turns the settled result into
//! a response and one access record.
//!
//! - [`gateway`]: the gateway's state (the live configuration as an atomic snapshot, the
//!   store, the metrics, the request tasks).
//! - `request`: the pipeline from a request to its response.
//! - `body`: a deduped request's body read within bounds; refused bodies drained, so a
//!   keep-alive connection stays usable.
//! - `head`: a request head's checks before routing (method, `Host`, origin-form target).
//! - `keyed`: a keyed request's task, from the claim to its accounted response.
//! - `inline`: that task run where its client waits, on its own once the client lets go.
//! - `passthrough`: streaming a request without dedupe.
//! - `signed`: a signed route's webhook signature, checked before the key is read.
//! - `forwarder`: the upstream call the protocol asks for (the owner's, or an unguarded
//!   one when failing open or in shadow mode), classified for the protocol.
//! - `grpc`: the winner's answer on a gRPC route, read whole for its `grpc-status`.
//! - `stream`: the winner's answer streamed to its client while a copy is kept for the
//!   store, and the hand-off of a keyed request's response.
//! - `capture`: reading bodies frame by frame: the winner's response for the store, and
//!   (`Gathered`) a deduped request's body.
//! - `join`: answers streaming now, that duplicates on `on_conflict = "join"` routes
//!   follow.
//! - `detach`: counting requests that outlive their client, so they can be bounded.
//! - `recent`: what a route's upstream calls took lately, for `Retry-After`.
//! - `replay`: answering from a stored record.
//! - `access`: the access record, logged and counted once per request.

mod access;
pub mod admin;
mod body;
mod capture;
mod detach;
mod forwarder;
pub mod framing;
pub mod gateway;
mod grpc;
mod head;
mod inline;
mod join;
mod keyed;
mod passthrough;
pub mod problem;
mod recent;
mod replay;
mod request;
pub mod server;
mod signed;
mod stream;

pub use self::gateway::{ConnInfo, Gateway, Live};
pub use self::head::is_plain_host;
