//! HTTPS upstreams: a real TLS upstream with a certificate from a CA the test makes,
//! trusted through `server.upstream_ca_file`; and the same upstream untrusted.

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    GatewayConfig, GatewayProcess, Http, RouteCfg, StoreCfg, TestCa, TestGateway, Upstream,
};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn winner_replay_and_passthrough_reach_an_https_upstream_over_h2() {
    let ca = TestCa::new("upstream");
    let up = Upstream::start_tls(&ca.issue("upstream")).await;
    // By name, not address: the certificate is checked for "localhost", which SNI and the
    // Host the upstream sees both come from.
    let url = format!("https://localhost:{}/base", up.port());
    let gw = TestGateway::start(
        &GatewayConfig::new(url)
            .upstream_ca_file(&ca.ca_file)
            .store(StoreCfg::memory())
            .route(RouteCfg::header("orders", "/orders/*")),
    )
    .await;
    let http = Http::new();
    let key = [("Idempotency-Key", "k1")];
    let first = http.post(&gw.url("/orders/1"), &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let second = http.post(&gw.url("/orders/1"), &key, "{}").await;
    assert!(second.replayed(), "{second:?}");
    assert_eq!(second.body, first.body);
    let pass = http.get(&gw.url("/status?x=1"), &[]).await;
    assert_eq!(pass.status, StatusCode::CREATED, "{}", pass.text());
    assert!(!pass.replayed());

    let seen = up.seen();
    assert_eq!(seen.len(), 2, "one winner and one passthrough: {seen:?}");
    assert_eq!(seen[0].path, "/base/orders/1");
    assert_eq!(seen[1].path, "/base/status?x=1");
    for s in &seen {
        assert_eq!(s.version, http::Version::HTTP_2, "ALPN chose h2: {s:?}");
        assert_eq!(
            s.host.as_deref(),
            Some(format!("localhost:{}", up.port()).as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_upstream_certificate_is_a_502_and_the_log_says_why() {
    let ca = TestCa::new("untrusted");
    let up = Upstream::start_tls(&ca.issue("upstream")).await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::memory())
            .route(RouteCfg::header("orders", "/orders/*")),
    );
    let http = Http::new();
    let r = http
        .post(&gw.url("/orders/1"), &[("Idempotency-Key", "k")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    let r = http.get(&gw.url("/status"), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(up.effects(), 0);
    gw.wait_logged("upstream unreachable").await;
    let lines: Vec<String> = gw
        .logs
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.to_string())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("upstream unreachable") && l.contains("UnknownIssuer")),
        "no log line says the certificate is not trusted: {lines:#?}"
    );
    // Nothing was sent, so the claim was released: a retry is a new attempt, not a 409.
    let r = http
        .post(&gw.url("/orders/1"), &[("Idempotency-Key", "k")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
}

/// On connection workers each worker has its own client for an `https` upstream: calls
/// served on two workers reach an HTTP/2 upstream over two connections, one per worker,
/// each reused by its worker's later calls (a connection is driven by the worker that
/// opened it). Counted by a TCP proxy in front of the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_reaches_an_https_upstream_over_its_own_connection() {
    const WORKERS: usize = 2;
    let ca = TestCa::new("per-worker");
    let up = Upstream::start_tls(&ca.issue("upstream")).await;
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", up.port()).parse().unwrap()).await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(format!("https://localhost:{}", proxy.addr.port()))
            .upstream_ca_file(&ca.ca_file)
            .workers(WORKERS)
            .store(StoreCfg::memory())
            .route(RouteCfg::header("orders", "/orders/*")),
    );
    // A client per request: each a new connection, dealt to the workers in turn.
    for i in 0..3 * WORKERS {
        let key = format!("k{i}");
        let r = Http::new()
            .post(
                &gw.url("/orders/1"),
                &[("Idempotency-Key", key.as_str())],
                "{}",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }
    assert_eq!(up.effects(), 3 * WORKERS as u64);
    assert_eq!(
        proxy.accepted(),
        WORKERS as u64,
        "one HTTP/2 connection per worker, each reused"
    );
}
