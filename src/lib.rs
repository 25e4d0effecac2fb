//! dedupe-gateway: a reverse proxy that makes retried HTTP writes safe.
//!
//! Where a request goes:
//!
//! 1. [`server`] accepts it (HTTP/1 or h2c) and hands it to [`proxy::Gateway::handle`].
//! 2. [`route::find`] picks the first matching route; no match means it is streamed to the
//!    upstream untouched ([`upstream`]).
//! 3. On a route, the body is buffered (bounded), and [`key`] derives the idempotency key,
//!    the tenant scope and the request hash: pure functions.
//! 4. [`store::Store::claim`] claims the key in one atomic operation (memory, Redis or
//!    Redis Cluster). The outcome decides: forward the winner, replay a stored response
//!    ([`record`]), or refuse with 409 / 422.
//! 5. The winner's upstream response is encoded ([`record`]) and stored with a
//!    compare-and-set on its fencing token; 5xx and connect failures release the claim.
//! 6. Every error the gateway makes itself becomes problem+json in one place: [`problem`].
//!
//! [`config`] validates the TOML file before anything binds; [`admin`] serves metrics,
//! health and key inspection on a separate port; [`metrics`] holds the counters.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod config;
pub mod dedupe;
pub mod framing;
pub mod headers;
pub mod http;
pub mod key;
pub mod metrics;
pub mod problem;
pub mod record;
pub mod reload;
pub mod route;
pub mod server;
pub mod store;
pub mod upstream;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// Boxed error of a response body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every request sent upstream and every response sent to a client.
pub type Body = BoxBody<Bytes, BoxError>;

/// A body holding the given bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}
