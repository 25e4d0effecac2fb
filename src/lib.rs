//! dedupe-gateway: a reverse proxy that makes retried HTTP writes safe.
//!
//! # Where a request goes
//!
//! ```text
//!  server ──▶ http::Gateway::handle ──▶ framing check ──▶ route::find
//!                                                          │
//!            no route, or no optional key ◀────────────────┤
//!            http::passthrough (streamed)                  │ a route
//!                                                          ▼
//!                                      body read (bounded) ─▶ key: key, scope, request hash
//!                                                          │
//!                                                          ▼  (a tracked task from here)
//!                       dedupe::run ─▶ store::Store::claim (one atomic operation)
//!                         │ Won(Lease) ─▶ http::winner forwards ─▶ lease.complete / release / keep
//!                         │ Replay ─────▶ http::replay (record, checked against its key)
//!                         └ Conflict 409 / Mismatch 422 / store error (on_error)
//!                                                          │
//!            problem (errors → problem+json) ◀─────────────┘ ─▶ access record (log + metrics)
//! ```
//!
//! # The modules, lowest first (no module imports one listed after it; tests aside)
//!
//! - [`tls`]: certificates, keys and CAs from PEM files; the rustls configurations.
//! - [`tokens`]: the values a claim is made of ([`tokens::StoreKey`], [`tokens::Fence`],
//!   [`tokens::RequestHash`], [`tokens::Claimant`]), as types that cannot be swapped.
//! - [`record`]: the encoding of a stored response, bound to its store key (pure).
//! - [`seal`]: encryption at rest of stored records, bound to their store key (pure).
//! - [`key`]: key derivation, fingerprints, scope and request hashes, store keys (pure).
//! - [`path`]: request path normalisation: what routes match and the upstream gets (pure).
//! - [`route`]: validated routes, their policies and route matching (pure).
//! - [`config`]: the TOML file, validated into a [`config::Config`] before anything binds.
//! - [`store`]: the store contract and its backends (memory, Redis, Redis Cluster).
//! - [`headers`]: every header name the gateway reads or writes.
//! - [`log`]: one writer thread for every log line; the access line, formatted without
//!   `tracing`'s layers.
//! - [`metrics`]: Prometheus counters and histograms.
//! - [`dedupe`]: the protocol (claim, wait, lease, settle), with no HTTP types.
//! - [`problem`]: the one place errors become RFC 9457 problem+json responses.
//! - [`explain`]: `check --request`: what the gateway would do with one request (pure).
//! - [`upstream`]: the pooled upstream client and the proxy hop's header rules.
//! - [`framing`]: the request-smuggling guard on the raw connection.
//! - [`reload`]: what a SIGHUP may change, and what waits for a restart (pure).
//! - [`http`]: the hyper edge: gateway state, the request pipeline, passthrough, the
//!   winner's call, replays, the access record.
//! - [`admin`]: metrics, health and key inspection on a separate port.
//! - [`server`]: listeners, connection limits, signals, graceful drain.
//! - [`drill`]: `dedupe-gateway drill`: five drills per route and the store checks, against
//!   an in-process gateway or a live one.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod config;
pub mod dedupe;
pub mod drill;
pub mod explain;
pub mod framing;
pub mod headers;
pub mod http;
pub mod key;
pub mod log;
pub mod metrics;
pub mod path;
pub mod problem;
pub mod record;
pub mod reload;
pub mod route;
pub mod seal;
pub mod server;
pub mod store;
pub mod tls;
pub mod tokens;
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

#[cfg(test)]
mod layout_tests {
    /// The README's layout section names every module this file declares, and the module
    /// map above names them in the same order.
    #[test]
    fn readme_layout_and_module_map_match_the_modules() {
        let lib = include_str!("lib.rs");
        let readme = include_str!("../README.md");
        let layout = readme
            .split("## Layout")
            .nth(1)
            .expect("README has a Layout section");
        let modules: Vec<&str> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod "))
            .map(|l| l.trim_end_matches(';'))
            .collect();
        assert!(modules.len() > 10, "{modules:?}");
        for m in &modules {
            assert!(
                layout.contains(&format!("src/{m}.rs")) || layout.contains(&format!("src/{m}/")),
                "README layout misses module {m}"
            );
            assert!(
                lib.contains(&format!("//! - [`{m}`]")),
                "the module map in lib.rs misses {m}"
            );
        }
    }
}
