//! HTTPS upstreams: a real TLS upstream with a certificate from a CA the test makes,
//! trusted through `server.upstream_ca_file`; and the same upstream untrusted.

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
