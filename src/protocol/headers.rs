//! Every header name the gateway itself reads or writes, in one place: the HTTP edge, the
//! upstream client and the admin API all take them from here.

use http::header::HeaderName;

/// `Idempotent-Replayed: true` marks a response served from the store.
pub static REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// `Idempotency-Key`, forwarded to the upstream with the derived key.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// `Idempotency-Fence`, forwarded to the upstream with the claim's fencing token. A client
/// never gets to send its own: the upstream client strips it from every request.
pub static IDEMPOTENCY_FENCE: HeaderName = HeaderName::from_static("idempotency-fence");

/// `Idempotency-Scope`, forwarded to the upstream with the scope hash of the request (`-`
/// on a route without scope), so an upstream that records keys keeps two tenants' `order-1`
/// apart. Like the fence, a client never gets to send its own.
pub static IDEMPOTENCY_SCOPE: HeaderName = HeaderName::from_static("idempotency-scope");

/// `Idempotency-Expires: <HTTP-date>` on won and replayed answers: when the gateway forgets
/// the key (completion plus the route's window). Not a standard header: it follows the
/// open discussion of the IETF idempotency-key draft (its issues #35 and #49).
pub static IDEMPOTENCY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-expires");

/// `X-Forwarded-For`: the client's address, appended to any the client's own proxies set.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-Proto`: `https` when the client's hop was TLS, whatever the client claimed.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// `X-Forwarded-Host`: the `Host` the client asked for.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// `Keep-Alive`: hop-by-hop (RFC 9110 §7.6.1), never forwarded.
pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// `Proxy-Connection`: a non-standard hop-by-hop header some clients still send, never
/// forwarded.
pub const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// `Dedupe-Stale: true` on the 200 answering an ordered route's request whose version is
/// not greater than the highest one completed for its entity: it was never forwarded.
pub static STALE: HeaderName = HeaderName::from_static("dedupe-stale");

/// `Stripe-Should-Retry: true | false` on the gateway's idempotency errors in the `stripe`
/// dialect: Stripe's clients obey it before their own rules, so an in-flight conflict is
/// retried even at the status that makes them raise `IdempotencyError`.
pub static STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

/// W3C Trace Context's `traceparent`: read from the client and, with `[telemetry]`,
/// replaced on the way upstream by one naming the gateway's upstream call (untouched
/// otherwise). Written by the propagator (`crate::telemetry::traces`), which names it itself.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// W3C Trace Context's `tracestate`: carried on with the caller's trace, as `traceparent`.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
