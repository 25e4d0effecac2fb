//! Routing that cannot be bypassed: every spelling of a path the upstream reads as the
//! same path matches the same route, and the upstream gets the normalised path. Counted
//! on a real upstream.

use dedupe_test_support::{GatewayConfig, Http, RouteCfg, StoreCfg, TestGateway, Upstream};
use http::StatusCode;

/// Spellings the upstream's router treats as `/v1/payments/x`.
const VARIANTS: [&str; 8] = [
    "/v1/payments/x",
    "//v1/payments/x",
    "/v1//payments///x",
    "/v1/%70ayments/x",
    "/v1/./payments/x",
    "/x/../v1/payments/x",
    "/v1/payments/%2e/x",
    "/v1/%2E%2E/v1/payments/y/../x",
];

async fn start() -> (Upstream, TestGateway, Http) {
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .route(RouteCfg::header("payments", "/v1/payments/**").scope(&["header:Authorization"]))
        .route(RouteCfg::fingerprint(
            "hooks",
            "/hooks/**",
            &["path", "json:/id"],
        ));
    let gw = TestGateway::start(&cfg).await;
    (up, gw, Http::new())
}

const AUTH: (&str, &str) = ("Authorization", "Bearer a");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_is_one_effect_at_the_normalised_path() {
    let (up, gw, http) = start().await;
    let mut first = true;
    for v in VARIANTS {
        for _ in 0..3 {
            let r = http
                .post(&gw.url(v), &[("Idempotency-Key", "one"), AUTH], "{}")
                .await;
            assert_eq!(r.status, StatusCode::CREATED, "{v}: {}", r.text());
            assert_eq!(r.replayed(), !first, "{v}");
            first = false;
        }
    }
    assert_eq!(up.effects(), 1, "all spellings are one request");
    assert_eq!(up.seen()[0].path, "/v1/payments/x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_400_on_every_spelling() {
    let (up, gw, http) = start().await;
    for v in VARIANTS
        .iter()
        .chain(&["/v1/payments", "/v1/payments/", "/v1/%70ayments"])
    {
        let r = http.post(&gw.url(v), &[AUTH], "{}").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(
            r.problem_type(),
            "urn:dedupe-gateway:problem:idempotency-key-missing",
            "{v}"
        );
    }
    assert_eq!(up.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bare_collection_path_is_deduped() {
    let (up, gw, http) = start().await;
    for _ in 0..3 {
        let r = http
            .post(
                &gw.url("/v1/payments"),
                &[("Idempotency-Key", "create"), AUTH],
                "{}",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_routes_see_the_normalised_path() {
    let (up, gw, http) = start().await;
    for v in [
        "/hooks/a",
        "//hooks/a",
        "/hooks/./a",
        "/%68ooks/a",
        "/x/../hooks/a",
    ] {
        let r = http.post(&gw.url(v), &[], r#"{"id":"evt_1"}"#).await;
        assert_eq!(r.status, StatusCode::CREATED, "{v}: {}", r.text());
    }
    assert_eq!(up.effects(), 1);
    assert_eq!(up.seen()[0].path, "/hooks/a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_leaving_the_route_is_not_deduped_and_forwarded_normalised() {
    let (up, gw, http) = start().await;
    // Not a payment: the upstream acts on /v1/x, so it must not be deduped as one.
    let r = http
        .post(
            &gw.url("/v1/payments/../x?q=1"),
            &[("Idempotency-Key", "k"), AUTH],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(!r.replayed());
    let r = http.post(&gw.url("/v1/payments/../x?q=1"), &[], "{}").await;
    assert_eq!(r.status, StatusCode::CREATED, "no key needed off the route");
    assert_eq!(up.effects(), 2);
    let seen = up.seen();
    assert!(seen.iter().all(|s| s.path == "/v1/x?q=1"), "{seen:?}");
    assert!(
        seen[0].headers.get("idempotency-fence").is_none(),
        "passed through, not claimed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_cannot_be_normalised_safely_are_400() {
    let (up, gw, http) = start().await;
    for bad in [
        "/v1/payments/a%2Fb",
        "/v1/payments/a%2fb",
        "/v1/payments%5Cx",
        "/v1/payments/x%00",
        "/..",
        "/v1/../../payments/x",
        "/other/%2e%2e/%2e%2e/etc",
        "/v1/payments/%zz",
    ] {
        let r = http
            .post(&gw.url(bad), &[("Idempotency-Key", "k"), AUTH], "{}")
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            r.problem_type(),
            "urn:dedupe-gateway:problem:path-invalid",
            "{bad}"
        );
    }
    assert_eq!(up.effects(), 0, "nothing unsafe reaches the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sf_string_and_bare_keys_replay_each_other() {
    let (up, gw, http) = start().await;
    let url = gw.url("/v1/payments");
    let first = http
        .post(&url, &[("Idempotency-Key", "\"8e03978e\""), AUTH], "{}")
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let bare = http
        .post(&url, &[("Idempotency-Key", "8e03978e"), AUTH], "{}")
        .await;
    assert!(bare.replayed());
    assert_eq!(bare.body, first.body);
    assert_eq!(up.effects(), 1);
    assert_eq!(
        up.seen()[0].headers["idempotency-key"],
        "8e03978e",
        "the upstream gets the key itself"
    );
    for bad in ["\"8e03978e", "\"8e03978e\";x=1", "\"a\\qb\""] {
        let r = http
            .post(&url, &[("Idempotency-Key", bad), AUTH], "{}")
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            r.problem_type(),
            "urn:dedupe-gateway:problem:idempotency-key-invalid"
        );
    }
    assert_eq!(up.effects(), 1);
}
