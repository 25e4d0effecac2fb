//! The gateway's behaviour against a real counting upstream, on the embedded store and on
//! a real redis-server. Every test counts the upstream's side effects: that is the truth.

use std::time::Duration;

use dedupe_test_support::on_every_store;
use dedupe_test_support::{
    eventually, Backend, GatewayConfig, Http, RedisServer, RouteCfg, StoreCfg, TestGateway,
    Upstream,
};
use http::StatusCode;

/// The routes every behaviour runs under, in front of `upstream`, on `store`.
fn config(upstream: &str, store: StoreCfg) -> GatewayConfig {
    GatewayConfig::new(upstream)
        .store(store)
        .default_lease("5s")
        .default_window("1h")
        .route(
            RouteCfg::header("payments", "/v1/payments/*")
                .methods(&["POST", "PATCH"])
                .required(true)
                .scope(&["header:Authorization"]),
        )
        .route(RouteCfg::header("optional", "/optional").required(false))
        .route(RouteCfg::fingerprint(
            "webhooks",
            "/webhooks/*",
            &[
                "method",
                "path",
                "json:/order_id",
                "json:/event_type",
                "header:X-Source",
            ],
        ))
        .route(RouteCfg::header("short-lease", "/short/*").lease("1s"))
        .route(RouteCfg::header("brief-window", "/brief/*").window("1s"))
        .route(RouteCfg::header("patient", "/patient/*").on_conflict_wait("5s"))
        .route(RouteCfg::header("impatient", "/impatient/*").on_conflict_wait("200ms"))
        .route(RouteCfg::header("small-cache", "/small/*").max_cached_body("1KiB"))
        .route(
            RouteCfg::header("held", "/held/*")
                .lease("1s")
                .on_unknown_hold(),
        )
        .admin()
}

struct Env {
    up: Upstream,
    gw: TestGateway,
    http: Http,
    _redis: Option<RedisServer>,
}

async fn env(backend: Backend) -> Env {
    env_with(backend, |c| c.max_body("64KiB").upstream_timeout("5s")).await
}

/// As `env`, with `server` setting the `[server]` fields the test needs.
async fn env_with(backend: Backend, server: impl FnOnce(GatewayConfig) -> GatewayConfig) -> Env {
    let up = Upstream::start().await;
    let (store, redis) = backend.start_store();
    let gw = TestGateway::start(&server(config(&up.url(), store))).await;
    Env {
        up,
        gw,
        http: Http::new(),
        _redis: redis,
    }
}

on_every_store!(
    same_request_twice_is_one_effect_and_a_byte_identical_replay,
    hundred_concurrent_requests_with_one_key_are_one_effect,
    same_key_different_body_is_422_without_effect,
    missing_or_invalid_required_key_is_400,
    same_key_under_two_tenants_is_two_effects,
    a_call_longer_than_its_lease_is_renewed_not_taken_over,
    not_executed_statuses_release_and_504_keeps_the_claim,
    an_unknown_outcome_is_held_until_resolved_as_retry,
    an_unknown_outcome_resolved_as_done_replays_the_given_response,
    upstream_5xx_releases_the_key,
    window_expiry_makes_the_key_new,
    fingerprint_route_dedupes_webhooks_without_a_key_header,
    fingerprint_route_rejects_bad_json,
    oversized_body_is_413,
    unmatched_requests_are_proxied_untouched,
    optional_key_absent_is_proxied_without_dedupe,
    response_too_large_to_store_is_delivered_once_and_never_reexecuted,
    connect_failure_releases_the_claim,
    upstream_silence_keeps_the_claim_until_the_lease_expires,
    waiting_duplicates_get_the_first_response_instead_of_409,
    a_wait_that_runs_out_is_409,
);

const AUTH_A: (&str, &str) = ("Authorization", "Bearer tenant-a");
const AUTH_B: (&str, &str) = ("Authorization", "Bearer tenant-b");

async fn same_request_twice_is_one_effect_and_a_byte_identical_replay(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/charge?currency=eur");
    let h = [
        ("Idempotency-Key", "order-1"),
        AUTH_A,
        ("Content-Type", "application/json"),
    ];
    let first = e.http.post(&url, &h, r#"{"amount":100}"#).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(!first.replayed());
    let second = e.http.post(&url, &h, r#"{"amount":100}"#).await;
    assert_eq!(e.up.effects(), 1);
    assert!(second.replayed());
    assert_eq!(second.status, first.status);
    assert_eq!(second.body, first.body, "body replayed byte for byte");
    let mut expected = first.headers.clone();
    expected.remove("set-cookie");
    expected.insert("idempotent-replayed", "true".parse().unwrap());
    assert_eq!(
        second.headers, expected,
        "headers replayed, minus Set-Cookie"
    );
    assert!(
        first.headers.contains_key("set-cookie"),
        "the first client gets its cookie"
    );

    let seen = &e.up.seen()[0];
    assert_eq!(seen.headers["idempotency-key"], "order-1");
    assert!(seen.fence().is_some_and(|f| f > 0));
    assert_eq!(seen.path, "/v1/payments/charge?currency=eur");
    assert_eq!(seen.body, r#"{"amount":100}"#);
}

async fn hundred_concurrent_requests_with_one_key_are_one_effect(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/storm");
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let http = e.http.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let h = [
                ("Idempotency-Key", "storm"),
                AUTH_A,
                ("x-test-delay-ms", "200"),
            ];
            http.post(&url, &h, "{}").await
        }));
    }
    let (mut created, mut replayed, mut conflicts) = (0, 0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            StatusCode::CREATED if r.replayed() => replayed += 1,
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {
                assert!(r.headers.contains_key("retry-after"));
                assert_eq!(
                    r.problem_type(),
                    "urn:dedupe-gateway:problem:request-in-flight"
                );
                conflicts += 1
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!(e.up.effects(), 1, "exactly one upstream effect");
    assert_eq!(created, 1);
    assert_eq!(created + replayed + conflicts, 100);
}

async fn same_key_different_body_is_422_without_effect(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/p");
    let h = [("Idempotency-Key", "reused"), AUTH_A];
    assert_eq!(
        e.http.post(&url, &h, r#"{"amount":1}"#).await.status,
        StatusCode::CREATED
    );
    let r = e.http.post(&url, &h, r#"{"amount":2}"#).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:idempotency-key-reused"
    );
    assert!(!r.replayed());
    // Same body on another path under the same key is also a different request.
    let r = e
        .http
        .post(&e.gw.url("/v1/payments/q"), &h, r#"{"amount":1}"#)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(e.up.effects(), 1);
}

async fn missing_or_invalid_required_key_is_400(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/p");
    let r = e.http.post(&url, &[AUTH_A], "{}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:idempotency-key-missing"
    );
    assert!(r.text().contains("idempotency-key"), "{}", r.text());
    let long = "k".repeat(256);
    for bad in ["has space", long.as_str()] {
        let r = e
            .http
            .post(&url, &[("Idempotency-Key", bad), AUTH_A], "{}")
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            r.problem_type(),
            "urn:dedupe-gateway:problem:idempotency-key-invalid"
        );
    }
    assert_eq!(e.up.effects(), 0);
}

async fn same_key_under_two_tenants_is_two_effects(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/p");
    let a = e
        .http
        .post(&url, &[("Idempotency-Key", "shared"), AUTH_A], "{}")
        .await;
    let bb = e
        .http
        .post(&url, &[("Idempotency-Key", "shared"), AUTH_B], "{}")
        .await;
    assert_eq!(e.up.effects(), 2);
    assert!(!a.replayed() && !bb.replayed());
    assert_ne!(a.body, bb.body, "tenant B never sees tenant A's response");
    // The upstream is told the tenants apart: the same key under two scope hashes, and a
    // client's own Idempotency-Scope never reaches it.
    let scopes: Vec<String> =
        e.up.seen()
            .iter()
            .map(|s| s.headers["idempotency-scope"].to_str().unwrap().to_owned())
            .collect();
    assert_eq!(scopes.len(), 2);
    assert_ne!(scopes[0], scopes[1]);
    assert!(scopes.iter().all(|s| s.len() == 32), "{scopes:?}");
    let forged = e
        .http
        .post(
            &url,
            &[
                ("Idempotency-Key", "forged"),
                AUTH_A,
                ("Idempotency-Scope", "other"),
            ],
            "{}",
        )
        .await;
    assert_eq!(forged.status, StatusCode::CREATED);
    assert_eq!(
        e.up.seen()[2].headers["idempotency-scope"],
        scopes[0].as_str()
    );
    let again = e
        .http
        .post(&url, &[("Idempotency-Key", "shared"), AUTH_B], "{}")
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, bb.body);
}

async fn a_call_longer_than_its_lease_is_renewed_not_taken_over(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/short/slow");
    // The winner's upstream call takes 3s, three times its 1s lease.
    let http = e.http.clone();
    let u = url.clone();
    let slow = tokio::spawn(async move {
        http.post(
            &u,
            &[("Idempotency-Key", "slow"), ("x-test-delay-ms", "3000")],
            "{}",
        )
        .await
    });
    e.up.wait_for_effects(1).await;
    // Duplicates all through the call, well past the first lease: 409 every time.
    for _ in 0..12 {
        let r = e
            .http
            .post(&url, &[("Idempotency-Key", "slow")], "{}")
            .await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
        if slow.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = slow.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = e
        .http
        .post(&url, &[("Idempotency-Key", "slow")], "{}")
        .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(e.up.effects(), 1);
    let metrics = e.gw.gateway.metrics().encode();
    assert!(
        metrics.contains(r#"dedupe_claim_events_total{event="takeover"} 0"#),
        "{metrics}"
    );
    // Every route's outcomes are exported from the start; no route's takeover is above 0.
    let takeovers = metrics
        .lines()
        .filter(|l| l.contains(r#"outcome="takeover""#) && !l.ends_with(" 0"));
    assert_eq!(takeovers.count(), 0, "{metrics}");
}

async fn not_executed_statuses_release_and_504_keeps_the_claim(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/statuses");
    // Every default "not executed" status releases the key: the retry executes.
    for (n, status) in ["408", "409", "425", "429"].into_iter().enumerate() {
        let key = format!("busy-{status}");
        let h = [("Idempotency-Key", key.as_str()), AUTH_A];
        let r = e
            .http
            .post(&url, &[h[0], h[1], ("x-test-status", status)], "{}")
            .await;
        assert_eq!(r.status.as_str(), status);
        let retry = e.http.post(&url, &h, "{}").await;
        assert_eq!(
            retry.status,
            StatusCode::CREATED,
            "{status} released the key"
        );
        assert!(!retry.replayed());
        assert_eq!(e.up.effects(), 2 * (n as u64 + 1));
    }

    // 504 from behind the upstream: maybe executed. The claim is kept.
    let h = [("Idempotency-Key", "timeout-behind"), AUTH_A];
    let r = e
        .http
        .post(&url, &[h[0], h[1], ("x-test-status", "504")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    let dup = e.http.post(&url, &h, "{}").await;
    assert_eq!(dup.status, StatusCode::CONFLICT, "{}", dup.text());
    assert_eq!(
        dup.problem_type(),
        "urn:dedupe-gateway:problem:request-in-flight"
    );
    assert_eq!(e.up.effects(), 9);
}

/// The admin record of `key` on the `held` route, as JSON.
async fn record(e: &Env, key: &str) -> serde_json::Value {
    let r = e
        .http
        .get(&e.gw.admin_url(&format!("/keys/held/{key}")), &[])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

/// Resolves `key` on the `held` route with `body`.
async fn resolve(e: &Env, key: &str, body: &str) -> dedupe_test_support::Reply {
    e.http
        .post(
            &e.gw.admin_url(&format!("/keys/held/{key}/resolve")),
            &[],
            body,
        )
        .await
}

/// A request on the `held` route whose outcome is unknown (a 504 behind the upstream),
/// past its lease: its fence.
async fn held_key(e: &Env, key: &str) -> u64 {
    let url = e.gw.url(&format!("/held/{key}"));
    let r = e
        .http
        .post(
            &url,
            &[("Idempotency-Key", key), ("x-test-status", "504")],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for _ in 0..2 {
        let dup = e.http.post(&url, &[("Idempotency-Key", key)], "{}").await;
        assert_eq!(dup.status, StatusCode::CONFLICT, "{}", dup.text());
        assert_eq!(
            dup.problem_type(),
            "urn:dedupe-gateway:problem:outcome-unknown"
        );
    }
    let rec = record(e, key).await;
    assert_eq!(rec["state"], "unknown", "{rec}");
    assert_eq!(rec["held"], true);
    rec["fence"].as_u64().unwrap()
}

async fn an_unknown_outcome_is_held_until_resolved_as_retry(b: Backend) {
    let e = env(b).await;
    let fence = held_key(&e, "h1").await;
    assert_eq!(
        e.up.effects(),
        1,
        "a held key is never executed again by itself"
    );
    let metrics = e.gw.gateway.metrics().encode();
    assert!(
        metrics.contains(r#"dedupe_claim_events_total{event="outcome_held"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"dedupe_requests_total{route="held",outcome="held"} 2"#));

    let stale = resolve(
        &e,
        "h1",
        &format!(r#"{{"fence": {}, "as": "retry"}}"#, fence - 1),
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(
        stale.problem_type(),
        "urn:dedupe-gateway:problem:stale-fence"
    );
    let ok = resolve(&e, "h1", &format!(r#"{{"fence": {fence}, "as": "retry"}}"#)).await;
    assert_eq!(ok.status, StatusCode::NO_CONTENT, "{}", ok.text());
    let twice = resolve(&e, "h1", &format!(r#"{{"fence": {fence}, "as": "retry"}}"#)).await;
    assert_eq!(
        twice.status,
        StatusCode::CONFLICT,
        "a second operator is refused"
    );

    let url = e.gw.url("/held/h1");
    let r = e.http.post(&url, &[("Idempotency-Key", "h1")], "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(!r.replayed());
    assert_eq!(e.up.effects(), 2, "executed once more after the resolution");
    assert!(e
        .http
        .post(&url, &[("Idempotency-Key", "h1")], "{}")
        .await
        .replayed());
    assert_eq!(e.up.effects(), 2);
}

async fn an_unknown_outcome_resolved_as_done_replays_the_given_response(b: Backend) {
    let e = env(b).await;
    let fence = held_key(&e, "h2").await;
    let bad = resolve(&e, "h2", &format!(r#"{{"fence": {fence}, "as": "done"}}"#)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "done needs a status");
    let body = format!(
        r#"{{"fence": {fence}, "as": "done", "status": 201, "headers": {{"content-type": "application/json"}}, "body": "{{\"id\": \"manual\"}}"}}"#
    );
    let ok = resolve(&e, "h2", &body).await;
    assert_eq!(ok.status, StatusCode::NO_CONTENT, "{}", ok.text());
    assert_eq!(resolve(&e, "h2", &body).await.status, StatusCode::CONFLICT);

    let r = e
        .http
        .post(&e.gw.url("/held/h2"), &[("Idempotency-Key", "h2")], "{}")
        .await;
    assert!(r.replayed());
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.text(), r#"{"id": "manual"}"#);
    assert_eq!(e.up.effects(), 1);
    assert_eq!(record(&e, "h2").await["state"], "completed");
}

async fn upstream_5xx_releases_the_key(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/p");
    let h = [("Idempotency-Key", "flaky"), AUTH_A];
    let failed = e
        .http
        .post(&url, &[h[0], h[1], ("x-test-status", "503")], "{}")
        .await;
    assert_eq!(
        failed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the upstream's own 503 passes through"
    );
    let retry = e.http.post(&url, &h, "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "the retry executed again");
    assert_eq!(e.up.effects(), 2);
    assert_eq!(e.up.increasing_fences().len(), 2);
    assert!(e.http.post(&url, &h, "{}").await.replayed());
    assert_eq!(e.up.effects(), 2);
}

async fn window_expiry_makes_the_key_new(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/brief/w");
    let h = [("Idempotency-Key", "w")];
    e.http.post(&url, &h, "{}").await;
    assert!(e.http.post(&url, &h, "{}").await.replayed());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = e.http.post(&url, &h, "{}").await;
    assert!(!after.replayed());
    assert_eq!(e.up.effects(), 2);
}

async fn fingerprint_route_dedupes_webhooks_without_a_key_header(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/webhooks/orders");
    let body = r#"{"order_id": 42, "event_type": "paid", "total": "9.99"}"#;
    let first = e.http.post(&url, &[("X-Source", "shop")], body).await;
    let second = e.http.post(&url, &[("X-Source", "shop")], body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(second.replayed());
    assert_eq!(e.up.effects(), 1);
    let fp = e.up.seen()[0].headers["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(fp.len(), 64, "the fingerprint is forwarded as the key");
    // Another event, or the same event from another source, is new work.
    e.http
        .post(
            &url,
            &[("X-Source", "shop")],
            r#"{"order_id": 43, "event_type": "paid"}"#,
        )
        .await;
    e.http.post(&url, &[("X-Source", "pos")], body).await;
    assert_eq!(e.up.effects(), 3);
}

async fn fingerprint_route_rejects_bad_json(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/webhooks/orders");
    let r = e.http.post(&url, &[], "{not json").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:malformed-json"
    );
    let r = e.http.post(&url, &[], r#"{"event_type": "paid"}"#).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("json:/order_id"), "{}", r.text());
    assert_eq!(e.up.effects(), 0);
}

async fn oversized_body_is_413(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/v1/payments/p");
    let big = "x".repeat(70 * 1024);
    let r = e
        .http
        .post(&url, &[("Idempotency-Key", "big"), AUTH_A], &big)
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:body-too-large"
    );
    assert_eq!(e.up.effects(), 0);
    // The key was never claimed: a right-sized retry proceeds.
    let ok = e
        .http
        .post(&url, &[("Idempotency-Key", "big"), AUTH_A], "{}")
        .await;
    assert_eq!(ok.status, StatusCode::CREATED);
}

async fn unmatched_requests_are_proxied_untouched(b: Backend) {
    let e = env(b).await;
    // No route, and a route's path with a method it does not list.
    let h = [
        ("Connection", "X-Hop"),
        ("X-Hop", "secret"),
        ("X-Forwarded-For", "10.9.8.7"),
    ];
    for _ in 0..2 {
        let r = e.http.post(&e.gw.url("/other?x=1"), &h, "body").await;
        assert_eq!(r.status, StatusCode::CREATED);
        assert!(!r.replayed());
    }
    let r = e.http.get(&e.gw.url("/v1/payments/p"), &[]).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(e.up.effects(), 3);
    let seen = e.up.seen();
    assert_eq!(seen[0].path, "/other?x=1");
    assert_eq!(seen[0].body, "body");
    assert!(
        !seen[0].headers.contains_key("x-hop"),
        "Connection-listed headers are stripped"
    );
    assert!(
        !seen[0].headers.contains_key("idempotency-fence"),
        "clients cannot forge a fence"
    );
    assert_eq!(seen[0].headers["x-forwarded-for"], "10.9.8.7, 127.0.0.1");
    assert_eq!(seen[0].headers["x-forwarded-proto"], "http");
    assert_eq!(
        seen[0].headers["x-forwarded-host"],
        e.gw.addr.to_string().as_str()
    );
}

async fn optional_key_absent_is_proxied_without_dedupe(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/optional");
    e.http.post(&url, &[], "{}").await;
    e.http.post(&url, &[], "{}").await;
    assert_eq!(e.up.effects(), 2);
    e.http.post(&url, &[("Idempotency-Key", "o")], "{}").await;
    assert!(e
        .http
        .post(&url, &[("Idempotency-Key", "o")], "{}")
        .await
        .replayed());
    assert_eq!(e.up.effects(), 3);
}

async fn response_too_large_to_store_is_delivered_once_and_never_reexecuted(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/small/report");
    let h = [
        ("Idempotency-Key", "big-answer"),
        ("x-test-body-bytes", "200000"),
    ];
    let first = e.http.post(&url, &h, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body.len(),
        200_000,
        "the first client gets the whole body"
    );
    let second = e.http.post(&url, &h, "{}").await;
    assert_eq!(
        second.status,
        StatusCode::CREATED,
        "the original status, so clients do not retry"
    );
    assert!(second.replayed());
    assert_eq!(
        second.problem_type(),
        "urn:dedupe-gateway:problem:response-not-stored"
    );
    assert_eq!(e.up.effects(), 1);
}

async fn connect_failure_releases_the_claim(b: Backend) {
    // An upstream port with nothing listening.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let (store, _redis) = b.start_store();
    let gw = TestGateway::start(&config(&format!("http://{dead_addr}"), store)).await;
    let http = Http::new();
    let h = [("Idempotency-Key", "k"), AUTH_A];
    let url = gw.url("/v1/payments/p");
    let r = http.post(&url, &h, "{}").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:upstream-unreachable"
    );
    // Released, not stuck in flight: the retry is forwarded again (502 again, not 409).
    let r = http.post(&url, &h, "{}").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
}

async fn upstream_silence_keeps_the_claim_until_the_lease_expires(b: Backend) {
    let e = env_with(b, |c| c.upstream_timeout("200ms")).await;
    let url = e.gw.url("/short/silent");
    let r = e
        .http
        .post(
            &url,
            &[("Idempotency-Key", "s"), ("x-test-drop", "1")],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:upstream-timeout"
    );
    // The upstream may have acted: the key stays claimed until its lease ends.
    let r = e.http.post(&url, &[("Idempotency-Key", "s")], "{}").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(e.up.effects(), 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = e.http.post(&url, &[("Idempotency-Key", "s")], "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(e.up.increasing_fences().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = env(Backend::Memory).await;
    let mut s = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    s.write_all(
        b"POST /v1/payments/p HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert_eq!(e.up.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_deduped_too() {
    let e = env(Backend::Memory).await;
    let h2 = Http::h2c();
    let url = e.gw.url("/v1/payments/h2");
    let h = [("Idempotency-Key", "h2"), AUTH_A];
    let first = h2.post(&url, &h, "{}").await;
    let second = h2.post(&url, &h, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(e.up.effects(), 1);
    let passthrough = h2.post(&e.gw.url("/other"), &[], "x").await;
    assert_eq!(passthrough.status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_heads_are_refused() {
    let e = env(Backend::Memory).await;
    let huge = "x".repeat(100 * 1024);
    let r = e
        .http
        .send(
            "POST",
            &e.gw.url("/v1/payments/p"),
            &[("X-Huge", &huge)],
            "{}",
        )
        .await;
    match r {
        Ok(r) => assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        // hyper may also close the connection while the client is still writing.
        Err(e) => assert!(e.contains("connection") || e.contains("SendRequest"), "{e}"),
    }
    assert_eq!(e.up.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_times_out_with_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = env_with(Backend::Memory, |c| c.body_read_timeout("200ms")).await;
    let mut s = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    s.write_all(b"POST /v1/payments/p HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\nContent-Length: 10\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert_eq!(e.up.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_does_not_abandon_its_claim() {
    use tokio::io::AsyncWriteExt;
    let e = env(Backend::Memory).await;
    let mut s = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    s.write_all(
        b"POST /short/hangup HTTP/1.1\r\nHost: x\r\nIdempotency-Key: gone\r\nx-test-delay-ms: 300\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    e.up.wait_for_effects(1).await;
    drop(s);
    // The upstream's answer is still stored: the retry replays it instead of waiting out
    // the lease (409) or executing again.
    let stored = eventually(Duration::from_secs(5), || async {
        e.http
            .post(
                &e.gw.url("/short/hangup"),
                &[("Idempotency-Key", "gone")],
                "{}",
            )
            .await
            .replayed()
    })
    .await;
    assert!(stored, "the hung-up request's outcome was lost");
    assert_eq!(e.up.effects(), 1);
    // ...and it was counted, although nobody was left to answer.
    let metrics = e.gw.gateway.metrics().encode();
    assert!(
        metrics.contains(r#"dedupe_requests_total{route="short-lease",outcome="won"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_max_connections_wait_for_a_free_slot() {
    let e = env_with(Backend::Memory, |c| c.max_connections(1)).await;
    let idle = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let http = e.http.clone();
    let url = e.gw.url("/other");
    let mut waiting = tokio::spawn(async move { http.post(&url, &[], "x").await });
    // The one slot is taken by the idle connection: the request is not served...
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "served past max_connections"
    );
    assert_eq!(e.up.effects(), 0);
    // ...until that connection goes away.
    drop(idle);
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, StatusCode::CREATED);
}

async fn waiting_duplicates_get_the_first_response_instead_of_409(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/patient/order");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let http = e.http.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            http.post(
                &url,
                &[("Idempotency-Key", "wait"), ("x-test-delay-ms", "300")],
                "{}",
            )
            .await
        }));
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        bodies.push(r.body);
    }
    assert_eq!(e.up.effects(), 1);
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every duplicate got the first response"
    );
}

async fn a_wait_that_runs_out_is_409(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/impatient/order");
    let http = e.http.clone();
    let u = url.clone();
    let first = tokio::spawn(async move {
        http.post(
            &u,
            &[("Idempotency-Key", "slow"), ("x-test-delay-ms", "1500")],
            "{}",
        )
        .await
    });
    e.up.wait_for_effects(1).await;
    let r = e
        .http
        .post(&url, &[("Idempotency-Key", "slow")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(e.up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_gives_its_slot_back() {
    use tokio::io::AsyncReadExt;
    let e = env_with(Backend::Memory, |c| {
        c.max_connections(1).header_read_timeout("200ms")
    })
    .await;
    // Connects and never sends a byte: it must not hold the only slot for long.
    let mut silent = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        e.http.post(&e.gw.url("/other"), &[], "x"),
    )
    .await
    .expect("the silent connection kept the slot");
    assert_eq!(r.status, StatusCode::CREATED);
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the silent connection was closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_http2_preface_gives_its_slot_back() {
    use tokio::io::AsyncWriteExt;
    let e = env_with(Backend::Memory, |c| {
        c.max_connections(1).header_read_timeout("200ms")
    })
    .await;
    // Half an HTTP/2 preface, then nothing: the protocol is never decided.
    let mut stalled = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    stalled.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        e.http.post(&e.gw.url("/other"), &[], "x"),
    )
    .await
    .expect("the stalled preface kept the slot");
    assert_eq!(r.status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_that_never_opens_a_stream_gives_its_slot_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = env_with(Backend::Memory, |c| {
        c.max_connections(1).header_read_timeout("200ms")
    })
    .await;
    // The whole preface and an empty SETTINGS frame, as an HTTP/2 client starts, then
    // nothing: hyper waits for a stream as long as the pings are answered.
    let mut idle = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        e.http.post(&e.gw.url("/other"), &[], "x"),
    )
    .await
    .expect("the idle HTTP/2 connection kept the slot");
    assert_eq!(r.status, StatusCode::CREATED);
    // The gateway's SETTINGS may come first; then the connection ends.
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(n) = idle.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the idle HTTP/2 connection was never closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_on_a_key_in_flight_is_when_the_routes_calls_usually_end() {
    let e = env(Backend::Memory).await;
    let url = e.gw.url("/v1/payments/slow");
    // The route's calls take 1.2 s: a duplicate should come back in 2 s, not when the
    // 10 s lease would run out (urllib3 honours Retry-After and waited all of it).
    for key in ["warm-1", "warm-2"] {
        let h = [
            ("Idempotency-Key", key),
            AUTH_A,
            ("x-test-delay-ms", "1200"),
        ];
        assert_eq!(
            e.http.post(&url, &h, "{}").await.status,
            StatusCode::CREATED
        );
    }
    let (http, u) = (e.http.clone(), url.clone());
    let first = tokio::spawn(async move {
        let h = [
            ("Idempotency-Key", "long"),
            AUTH_A,
            ("x-test-delay-ms", "3000"),
        ];
        http.post(&u, &h, "{}").await
    });
    e.up.wait_for_effects(3).await;
    let dup = e
        .http
        .post(&url, &[("Idempotency-Key", "long"), AUTH_A], "{}")
        .await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.headers["retry-after"], "2", "{:?}", dup.headers);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(e.up.effects(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_from_the_upstream_are_final_and_replayed() {
    let e = env(Backend::Memory).await;
    let url = e.gw.url("/v1/payments/declined");
    let h = [
        ("Idempotency-Key", "declined"),
        AUTH_A,
        ("x-test-status", "402"),
    ];
    let first = e.http.post(&url, &h, "{}").await;
    assert_eq!(first.status, StatusCode::PAYMENT_REQUIRED);
    let again = e.http.post(&url, &h, "{}").await;
    assert!(
        again.replayed(),
        "a 4xx is an outcome: stored for the window"
    );
    assert_eq!(again.body, first.body);
    assert_eq!(e.up.effects(), 1);
}
