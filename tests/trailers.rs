//! Trailers on plain HTTP routes (#28): an HTTP/1.1 chunked answer's trailer section is
//! stored with the response and replayed, to clients that take trailers (`TE: trailers`).

use dedupe_test_support::{GatewayConfig, Http, RouteCfg, TestGateway, Upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_chunked_trailers_are_stored_and_replayed() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url()).route(RouteCfg::header("orders", "/orders")),
    )
    .await;
    let http = Http::new();
    let headers = [
        ("idempotency-key", "t-1"),
        ("te", "trailers"),
        ("x-test-respond-trailer", "x-checksum=abc123"),
    ];
    let first = http.post(&gw.url("/orders"), &headers, "{}").await;
    assert_eq!(first.status, 201, "{}", first.text());
    let trailers = first.trailers.clone().expect("the winner's trailers");
    assert_eq!(trailers["x-checksum"], "abc123");
    assert!(!first.replayed());
    let again = http.post(&gw.url("/orders"), &headers, "{}").await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(again.trailers, Some(trailers));
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_takes_no_trailers_gets_the_body_alone() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url()).route(RouteCfg::header("orders", "/orders")),
    )
    .await;
    let http = Http::new();
    let headers = [
        ("idempotency-key", "t-2"),
        ("x-test-respond-trailer", "x-checksum=abc123"),
    ];
    let first = http.post(&gw.url("/orders"), &headers, "{}").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.trailers, None);
    let again = http.post(&gw.url("/orders"), &headers, "{}").await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(up.effects(), 1);
}
