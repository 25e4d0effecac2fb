//! The HTTP/1 lane: an HTTP/1.1 connection's requests read once; those that need no
//! dedupe proxied in bytes, keyed ones handed whole to the pipeline and answered in bytes.
//!
//! A streamed request through hyper's server and the pool's client was parsed into a
//! header map, rewritten, encoded again, and its answer's head parsed into another map and
//! encoded again: two thirds of the gateway's own instructions per request went to that
//! and to hyper's dispatch (docs/benchmarks.md, run 15). The lane reads a request head
//! once ([`head`]), writes the upstream's head straight from the client's bytes, sends it
//! with the body over a pooled connection, turns the answer's head into the client's
//! (`upstream::wire`'s relay) and writes it back with the body ([`answer`]). A request on
//! a deduping route skips hyper's server connection the same way: its head becomes the
//! `http` request the pipeline reads ([`head::Head::request`]), its body is read whole,
//! and the pipeline's response is written as hyper's server writes it
//! ([`answer::served`]).
//!
//! It takes only what it forwards exactly as the full path would, and nothing it would
//! have to refuse: the first request it does not take (a gRPC route, a framing or
//! upgrade field, HTTP/1.0, an unusual target, a large body, a head it cannot read) goes
//! to hyper with the bytes read so far, and hyper serves the connection from then on.
//! Over a TLS listener the lane serves HTTP/1.1 (ALPN's `h2` goes to hyper) and tells the
//! upstream `X-Forwarded-Proto: https`. Upstreams over TLS or h2c, and exported traces,
//! take the full path throughout. The connection's loop is `server::lane`.

pub mod answer;
pub mod head;
