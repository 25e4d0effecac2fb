//! Traces: a span per request under the caller's W3C `traceparent`, with children for the
//! claim, the upstream call and the completion, exported over OTLP/HTTP when
//! `[telemetry] otlp_endpoint` is set ([`export`]).
//!
//! Off, nothing here costs more than one atomic load per request: every constructor
//! answers [`Span::none`] and no span is created, none is entered, no header is touched.
//! On, the spans are `tracing` spans at [`TARGET`], which only the OpenTelemetry layer
//! sees (the log's filter leaves them out), so the log's lines are what they were.
//!
//! Attributes follow the access log's privacy: route, outcome, finish, fence, the key as
//! the access line shows it and the scope's *hash*; never a scope input, a header value
//! or a body.

pub mod export;

use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span that becomes a trace span.
pub const TARGET: &str = "dedupe_gateway::trace";

/// Set once the exporter's layer is installed.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// A request's root span (kind server), its parent the caller's `traceparent` when it
/// sent a valid one.
pub fn request(method: &Method, path: &str, headers: &HeaderMap) -> Span {
    if !on() {
        return Span::none();
    }
    let span = tracing::info_span!(target: TARGET, "request",
        otel.name = %method,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %method,
        url.path = path,
        http.response.status_code = Empty,
        dedupe.route = Empty,
        dedupe.outcome = Empty,
        dedupe.finish = Empty,
        dedupe.fence = Empty,
        dedupe.key = Empty,
        dedupe.scope = Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Carrier(headers));
    // Before any child exists: a span's parent is fixed once it starts.
    let _ = span.set_parent(parent);
    span
}

/// The claim in the store (a child of the current request span).
pub fn claim() -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, "claim")
}

/// The upstream call (kind client); its context is what [`inject`] sends upstream.
pub fn upstream() -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, "upstream",
        otel.kind = "client",
        http.response.status_code = Empty,
    )
}

/// The completion: the outcome stored under the key, or the claim released.
pub fn completion() -> Span {
    if !on() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, "completion")
}

/// Sets `traceparent` (and `tracestate`) on an upstream request to `span`'s context,
/// replacing the caller's; nothing when `span` is not exported.
pub fn inject(span: &Span, headers: &mut HeaderMap) {
    if span.is_none() {
        return;
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut CarrierMut(headers));
}

/// Records a response's status on a request or upstream span as an integer, the type
/// OpenTelemetry's semantic conventions give `http.response.status_code` (a `u16` would
/// reach the exporter as text: `tracing-opentelemetry` keeps only `i64`s as integers).
pub fn record_status(span: &Span, status: u16) {
    span.record("http.response.status_code", i64::from(status));
}

/// What a request ended as, on its root span.
pub struct Ending<'a> {
    /// The route's name.
    pub route: &'a str,
    /// The access line's outcome.
    pub outcome: &'a str,
    /// How a won claim was settled.
    pub finish: Option<&'a str>,
    /// The claim's fence.
    pub fence: Option<u64>,
    /// The key as the access line shows it, and the scope's hash.
    pub key: Option<(&'a str, &'a str)>,
    /// The response status.
    pub status: u16,
}

/// Records how the request ended on its root span.
pub fn end(span: &Span, method: &Method, ending: &Ending<'_>) {
    if span.is_none() {
        return;
    }
    // Named once the route is known; the span has started by now, so through its context.
    let name = format!("{method} {}", ending.route);
    span.context().span().update_name(name);
    span.record("dedupe.route", ending.route);
    span.record("dedupe.outcome", ending.outcome);
    record_status(span, ending.status);
    if ending.status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
    if let Some(finish) = ending.finish {
        span.record("dedupe.finish", finish);
    }
    if let Some(fence) = ending.fence {
        // OTLP integers are signed 64-bit; a fence is a u64 that stays below 2^63.
        span.record("dedupe.fence", i64::try_from(fence).unwrap_or(i64::MAX));
    }
    if let Some((key, scope)) = ending.key {
        span.record("dedupe.key", key);
        span.record("dedupe.scope", scope);
    }
}

/// Headers read as a propagation carrier.
struct Carrier<'a>(&'a HeaderMap);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Headers written as a propagation carrier.
struct CarrierMut<'a>(&'a mut HeaderMap);

impl Injector for CarrierMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The caller's `tracestate`, when it had none to carry on, goes too.
        if value.is_empty() {
            self.0.remove(key);
            return;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_propagator_reads_and_writes_the_headers_the_registry_names() {
        let propagator = TraceContextPropagator::new();
        let fields: Vec<&str> = propagator.fields().collect();
        let named = [
            &crate::protocol::headers::TRACEPARENT,
            &crate::protocol::headers::TRACESTATE,
        ];
        assert_eq!(fields, named.map(HeaderName::as_str));
    }

    #[test]
    fn off_no_span_is_made_and_no_header_is_touched() {
        assert!(!on());
        let mut headers = HeaderMap::new();
        let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        headers.insert("traceparent", HeaderValue::from_static(caller));
        let span = request(&Method::POST, "/orders", &headers);
        assert!(span.is_none() && claim().is_none() && upstream().is_none());
        inject(&upstream(), &mut headers);
        assert_eq!(headers["traceparent"], caller);
        assert_eq!(headers.len(), 1);
    }
}
