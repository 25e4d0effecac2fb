//! Warnings a valid configuration still earns at load: leases too short for the store's
//! timeout, and route settings that quietly defeat dedupe (a key part that changes on every
//! delivery, for one).

use super::server::ServerConfig;
use super::store::{StoreBackend, StoreConfig};
use crate::protocol::key::{KeyRule, MatchRule, RequestPart};
use crate::protocol::route::Route;

/// The winner renews its lease every third of it, one store operation each: a lease within
/// a few store timeouts of that leaves a renewal that times out too little time, and a
/// healthy but slow call could be taken over and executed twice. (The upstream timeout no
/// longer matters: a renewed lease outlives any call.) The embedded store never waits, and
/// `store.timeout` is Redis's: it gets no such warning.
pub(super) fn lease_warnings(store: &StoreConfig, routes: &[Route]) -> Vec<String> {
    if matches!(store.backend, StoreBackend::Memory { .. }) {
        return Vec::new();
    }
    let needed = store.timeout * 6;
    routes
        .iter()
        .filter(|r| r.lease <= needed)
        .map(|r| {
            format!(
                "routes[{}].lease: {} does not exceed six store operations ({}): it is renewed every third, \
                 and a renewal that times out could let a retry take over a healthy call and execute it twice",
                r.name,
                crate::config::format_duration(r.lease),
                crate::config::format_duration(needed),
            )
        })
        .collect()
}

/// Valid settings that quietly weaken dedupe: `check` prints them, `check --strict` fails
/// on them, `run` logs them.
pub(super) fn lints(server: &ServerConfig, routes: &[Route]) -> Vec<String> {
    let mut out = Vec::new();
    if server.max_body == 0 {
        out.push(
            "server.max_body: 0 refuses every deduped request that has a body (413)".to_owned(),
        );
    }
    for (j, later) in routes.iter().enumerate() {
        if let Some(earlier) = routes[..j].iter().find(|e| e.path.covers(&later.path)) {
            out.push(format!(
                "routes[{}] can never match: routes[{}] comes first and its path {:?} covers {:?} \
                 (the first route whose path matches decides, whatever its methods)",
                later.name,
                earlier.name,
                earlier.path.as_str(),
                later.path.as_str(),
            ));
        }
    }
    for r in routes {
        let name = &r.name;
        if let Some(preset) = r.preset.filter(|p| r.window < p.retry_horizon()) {
            out.push(format!(
                "routes[{name}].window: {} is shorter than {}'s retry horizon ({}, {}): \
                 a redelivery after the window executes again",
                crate::config::format_duration(r.window),
                preset.as_str(),
                crate::config::format_duration(preset.retry_horizon()),
                preset.docs(),
            ));
        }
        for m in &r.methods {
            if matches!(m.as_str(), "GET" | "HEAD" | "OPTIONS" | "TRACE") {
                out.push(format!(
                    "routes[{name}].methods: {m} is safe (RFC 9110): deduping it answers reads \
                     from the store for the whole window"
                ));
            }
        }
        // A header key without a scope is refused at validation (`unscoped`), not warned.
        let fingerprint = match &r.key {
            KeyRule::Header { .. } => None,
            KeyRule::Fingerprint(parts) => Some(parts),
        };
        let listed = [
            (
                "key.fingerprint",
                fingerprint.map(Vec::as_slice).unwrap_or_default(),
            ),
            ("scope", r.scope.as_slice()),
            (
                "match",
                match &r.must_match {
                    // The fingerprint's own parts were checked above.
                    MatchRule::Parts(p) if Some(p) != fingerprint => p.as_slice(),
                    _ => &[],
                },
            ),
        ];
        for (field, parts) in listed {
            for part in parts {
                if let Some(why) = changes_per_delivery(part, fingerprint.is_some()) {
                    out.push(format!(
                        "routes[{name}].{field}: {part} {why}, so a redelivery is not recognised"
                    ));
                }
            }
        }
    }
    out
}

/// Why a request part differs between deliveries of the same event, if it does.
fn changes_per_delivery(part: &RequestPart, webhook: bool) -> Option<&'static str> {
    match part {
        RequestPart::Body if webhook => Some(
            "is the raw body, which a sender may re-serialise or stamp with an attempt number; \
             prefer json: pointers to the event's own fields",
        ),
        RequestPart::Header(h) => {
            let h = h.as_str();
            let exact = [
                "date",
                "traceparent",
                "tracestate",
                "stripe-signature",
                "webhook-signature",
                "x-shopify-triggered-at",
            ];
            let parts = ["request-id", "correlation-id", "trace-id", "timestamp"];
            (exact.contains(&h) || parts.iter().any(|p| h.contains(p)))
                .then_some("is a per-request id, timestamp or timestamped signature")
        }
        _ => None,
    }
}
