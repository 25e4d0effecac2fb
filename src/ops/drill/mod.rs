//! `dedupe-gateway drill`: prove dedupe on your own deployment with five drills per route
//! (replay, lease, crash, race, misuse), as the idempotency checklist asks: "prove it with
//! a drill, not with an argument".
//!
//! - [`local`]: `drill --config`: the real gateway code in this process, the user's own
//!   routes and store (under a key prefix of the drill's own, deleted afterwards), and a
//!   [`upstream::CountingUpstream`] that counts side effects; plus the store checks.
//! - [`target`]: `drill --target`: a black-box run against a live gateway, its effects
//!   read from the admin API and `/metrics`.
//! - [`request`]: requests that satisfy a route's key rule and scope (pure);
//!   [`client`]: sending them; [`report`]: the results as text or JSON (pure).
//! - [`grpc`]: on a `grpc = true` route, framed gRPC calls over h2c, the counting
//!   upstream's gRPC answer, and verdicts read from `grpc-status`.

pub mod client;
pub mod grpc;
pub mod local;
pub mod report;
pub mod request;
pub mod target;
pub mod upstream;

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::protocol::route::Route;

/// The lease every route gets for `drill --config`, so the crash drill takes seconds.
pub const DEFAULT_DRILL_LEASE: Duration = Duration::from_secs(2);
/// Concurrent requests in the race drill.
pub const DEFAULT_RACE: usize = 8;

/// Why a drill could not start (a failed drill is a result, not an error).
#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    /// `--route` names no route of the configuration.
    #[error("--route {0}: no such route in the configuration")]
    UnknownRoute(String),
    /// The configuration has no routes to drill.
    #[error("the configuration has no routes: nothing is deduped, nothing to drill")]
    NoRoutes,
    /// A loopback port could not be bound.
    #[error("cannot bind a loopback port: {0}")]
    Bind(std::io::Error),
    /// The store client could not be built.
    #[error("store: {0}")]
    Store(String),
    /// A `--target`/`--admin` URL or `--header` the drill cannot use.
    #[error("{0}")]
    Usage(String),
    /// `--target`: the admin API cannot be used (a wrong token: the clean-up could not
    /// run), or a drill key has a record already. Nothing was sent.
    #[error("drill --target: {0}; nothing was sent to the upstream")]
    Preflight(String),
    /// No request can be generated for a route.
    #[error("route {route}: {message}")]
    Request {
        /// The route.
        route: String,
        /// Why.
        message: String,
    },
}

/// The indexes of the routes to drill: the named ones, or all.
fn select_routes(routes: &[Route], names: &[String]) -> Result<Vec<usize>, DrillError> {
    if routes.is_empty() {
        return Err(DrillError::NoRoutes);
    }
    if names.is_empty() {
        return Ok((0..routes.len()).collect());
    }
    names
        .iter()
        .map(|n| {
            routes
                .iter()
                .position(|r| &*r.name == n)
                .ok_or_else(|| DrillError::UnknownRoute(n.clone()))
        })
        .collect()
}

/// Eight hex digits unique enough to keep two runs' keys apart.
fn run_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_selected_by_name() {
        let routes = crate::config::Config::from_toml(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/example.toml"
        )))
        .unwrap()
        .routes;
        assert_eq!(select_routes(&routes, &[]).unwrap(), [0, 1, 2]);
        assert_eq!(
            select_routes(&routes, &["generic-webhooks".into()]).unwrap(),
            [2]
        );
        assert!(matches!(
            select_routes(&routes, &["nope".into()]),
            Err(DrillError::UnknownRoute(_))
        ));
        assert_ne!(run_id(), run_id());
    }
}
