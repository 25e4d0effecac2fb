//! The pooled hyper-util clients an upstream is reached through, built once per runtime:
//! plain HTTP/1.1, rustls for `https`, h2c for gRPC calls.

use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{IDLE_TIMEOUT, MAX_IDLE};
use crate::config::ServerConfig;
use crate::Body;

/// The connector of an `https` upstream. The connect timeout never exceeds the upstream
/// timeout, so "could not connect" (nothing sent, the claim is released) is told apart from
/// "no answer" (outcome unknown, the claim is kept).
pub(super) fn tls_connector(
    cfg: &ServerConfig,
    connect_timeout: Duration,
) -> HttpsConnector<HttpConnector> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    // The TLS layer below takes https; the URL's scheme is fixed by config anyway.
    connector.enforce_http(false);
    let (roots, problems) = crate::config::tls::upstream_roots(cfg.upstream_ca.as_ref());
    for p in &problems {
        tracing::warn!(problem = %p, "a platform root certificate could not be loaded");
    }
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(crate::config::tls::upstream_client_config(roots))
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(connector)
}

/// A client of a plain-`http` upstream (one per runtime), pooling its HTTP/1.1
/// connections: a connection goes back once its answer was read to the end, and one the
/// upstream closed, or sent bytes on unasked, is never lent again.
pub(super) fn plain_client(connect_timeout: Duration) -> Client<HttpConnector, Body> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(MAX_IDLE)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}

/// A client of an `https` upstream, pooling its connections.
pub(super) fn tls_client(
    connector: HttpsConnector<HttpConnector>,
) -> Client<HttpsConnector<HttpConnector>, Body> {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(MAX_IDLE)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}

/// An h2c client of an `http` upstream (one per runtime): HTTP/2 with prior knowledge,
/// one multiplexed connection, pinged while idle so a silently dropped one is noticed.
pub(super) fn h2c_client(connect_timeout: Duration) -> Client<HttpConnector, Body> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .http2_keep_alive_interval(Some(IDLE_TIMEOUT / 2))
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(MAX_IDLE)
        .build(connector)
}
