//! What must match on a repeat (`match`): a redelivered webhook is a replay whatever else
//! in it changed; a client reusing a key for another request is told so. Counted on a real
//! upstream.

use dedupe_test_support::{GatewayConfig, Http, RouteCfg, StoreCfg, TestGateway, Upstream};
use http::StatusCode;

async fn start(routes: Vec<RouteCfg>) -> (Upstream, TestGateway, Http) {
    let up = Upstream::start().await;
    let mut cfg = GatewayConfig::new(up.url()).store(StoreCfg::memory());
    for r in routes {
        cfg = cfg.route(r);
    }
    let gw = TestGateway::start(&cfg).await;
    (up, gw, Http::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_redelivery_with_reordered_keys_and_an_extra_field_replays() {
    let (up, gw, http) = start(vec![RouteCfg::fingerprint(
        "hooks",
        "/hooks/**",
        &["path", "json:/id"],
    )])
    .await;
    let url = gw.url("/hooks/orders");
    let first = http
        .post(
            &url,
            &[],
            r#"{"id":"evt_1","type":"paid","data":{"a":1,"b":2}}"#,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = http
        .post(
            &url,
            &[],
            r#"{ "data": {"b":2, "a":1}, "type": "paid", "id": "evt_1", "attempt": 2 }"#,
        )
        .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_route_matching_the_whole_request_refuses_a_changed_body() {
    let (up, gw, http) = start(vec![RouteCfg::fingerprint(
        "hooks",
        "/hooks/**",
        &["json:/id"],
    )
    .match_mode("request")])
    .await;
    let url = gw.url("/hooks/x");
    assert_eq!(
        http.post(&url, &[], r#"{"id":1}"#).await.status,
        StatusCode::CREATED
    );
    let r = http.post(&url, &[], r#"{"id":1,"attempt":2}"#).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_keys_match_the_whole_request_by_default_or_the_parts_listed() {
    let (up, gw, http) = start(vec![
        RouteCfg::header("strict", "/strict"),
        RouteCfg::header("amounts", "/amounts").match_parts(&["method", "json:/amount"]),
        RouteCfg::header("ids", "/ids").match_mode("key"),
    ])
    .await;
    let k = [("Idempotency-Key", "k1")];
    let post = |path: &'static str, body: &'static str| {
        let (http, url) = (http.clone(), gw.url(path));
        async move { http.post(&url, &k, body).await }
    };
    assert_eq!(
        post("/strict", r#"{"amount":1,"note":"a"}"#).await.status,
        StatusCode::CREATED
    );
    let r = post("/strict", r#"{"note":"a","amount":1}"#).await;
    assert_eq!(
        r.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "raw bytes differ"
    );

    assert_eq!(
        post("/amounts", r#"{"amount":1,"note":"a"}"#).await.status,
        StatusCode::CREATED
    );
    assert!(post("/amounts", r#"{"note":"b","amount":1}"#)
        .await
        .replayed());
    let r = post("/amounts", r#"{"amount":2}"#).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = post("/amounts", r#"{"note":"no amount"}"#).await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "a listed part that is missing is named"
    );
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:fingerprint-part-missing"
    );

    assert_eq!(post("/ids", "a").await.status, StatusCode::CREATED);
    assert!(post("/ids", "anything else").await.replayed());
    assert_eq!(up.effects(), 3);
}
