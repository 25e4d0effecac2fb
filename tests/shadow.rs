//! `mode = "shadow"` and `mode = "off"`: a shadow route forwards every request and counts
//! what enforcement would have done; switching it to `enforce` by SIGHUP blocks the next
//! duplicate (the real binary); an off route passes through under its own name.

use std::time::Duration;

use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RouteCfg, TestGateway, Upstream,
};
use http::StatusCode;

fn shadow_count(metrics: &str, route: &str, would: &str) -> u64 {
    let prefix = format!("dedupe_shadow_total{{route=\"{route}\",would=\"{would}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn outcome_count(metrics: &str, route: &str, outcome: &str) -> u64 {
    let prefix = format!("dedupe_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn orders(up: &Upstream, mode: &'static str) -> GatewayConfig {
    GatewayConfig::new(up.url()).admin().route(
        RouteCfg::header("orders", "/orders")
            .scope(&["header:Authorization"])
            .mode(mode),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_route_forwards_a_duplicate_then_sighup_to_enforce_blocks_the_next() {
    let up = Upstream::start().await;
    let shadow = orders(&up, "shadow");
    let gw = GatewayProcess::start(&shadow);
    let http = Http::new();
    let url = gw.url("/orders");
    let headers = [("Idempotency-Key", "o-1"), ("Authorization", "Bearer a")];

    let first = http.post(&url, &headers, r#"{"sku":"tea"}"#).await;
    let second = http.post(&url, &headers, r#"{"sku":"tea"}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(
        !second.replayed(),
        "shadow mode never answers from the store"
    );
    assert_eq!(
        up.effects(),
        2,
        "both copies of the duplicate reached the upstream"
    );
    assert_eq!(
        second.headers["x-effect"], "2",
        "the duplicate got its own upstream answer"
    );
    let metrics = http.get(&gw.admin_url("/metrics"), &[]).await.text();
    assert_eq!(shadow_count(&metrics, "orders", "replay"), 1, "{metrics}");
    assert_eq!(outcome_count(&metrics, "orders", "won"), 1, "{metrics}");
    assert_eq!(
        outcome_count(&metrics, "orders", "shadowed"),
        1,
        "{metrics}"
    );
    // The access line says what enforce would have done.
    let logged = eventually(Duration::from_secs(5), || async {
        gw.logs.lock().unwrap().iter().any(|l| {
            l["target"] == "dedupe_gateway::access"
                && l["would"] == "replay"
                && l["outcome"] == "shadowed"
        })
    })
    .await;
    assert!(logged, "no access line with would = replay");

    // A different body under the key: enforce would answer 422; shadow forwards it.
    let changed = http.post(&url, &headers, r#"{"sku":"coffee"}"#).await;
    assert_eq!(changed.status, StatusCode::CREATED);
    assert_eq!(up.effects(), 3);

    std::fs::write(&gw.config_path, orders(&up, "enforce").to_toml()).unwrap();
    gw.signal("HUP");
    gw.wait_logged("configuration reloaded").await;
    // The shadow winner completed its record, so the next duplicate is recognised at once.
    let blocked = http.post(&url, &headers, r#"{"sku":"tea"}"#).await;
    assert!(blocked.replayed(), "enforced: the duplicate is replayed");
    assert_eq!(
        blocked.headers["x-effect"], "1",
        "the shadow winner's answer"
    );
    let mismatch = http.post(&url, &headers, r#"{"sku":"coffee"}"#).await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(up.effects(), 3, "nothing more reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_route_forwards_a_request_enforce_would_refuse_for_its_missing_key() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&orders(&up, "shadow")).await;
    let http = Http::new();
    let r = http
        .post(&gw.url("/orders"), &[("Authorization", "Bearer a")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "not the 400 enforce answers");
    assert_eq!(up.effects(), 1);
    let metrics = http.get(&gw.admin_url("/metrics"), &[]).await.text();
    assert_eq!(
        shadow_count(&metrics, "orders", "missing_key"),
        1,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_off_route_passes_through_under_its_name() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&orders(&up, "off")).await;
    let http = Http::new();
    let url = gw.url("/orders");
    let headers = [("Idempotency-Key", "o-1"), ("Authorization", "Bearer a")];
    http.post(&url, &headers, "{}").await;
    let again = http.post(&url, &headers, "{}").await;
    assert!(!again.replayed());
    let keyless = http.post(&url, &[], "{}").await;
    assert_eq!(keyless.status, StatusCode::CREATED, "no key is required");
    assert_eq!(up.effects(), 3);
    assert!(
        up.seen().iter().all(|s| s.fence().is_none()),
        "nothing was claimed"
    );
    let metrics = http.get(&gw.admin_url("/metrics"), &[]).await.text();
    assert_eq!(
        outcome_count(&metrics, "orders", "passthrough"),
        3,
        "{metrics}"
    );
}

#[test]
fn drill_skips_shadow_and_off_routes_and_drills_the_enforced_one() {
    let tmp = tempfile::tempdir().unwrap();
    let config = GatewayConfig::new("http://127.0.0.1:9")
        .route(RouteCfg::header("enforced", "/a").scope(&["header:Authorization"]))
        .route(
            RouteCfg::header("measured", "/b")
                .scope(&["header:Authorization"])
                .mode("shadow"),
        )
        .route(RouteCfg::header("unused", "/c").mode("off"));
    let path = tmp.path().join("gateway.toml");
    std::fs::write(&path, config.to_toml()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
        .args(["drill", "--lease", "500ms", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("PASS enforced/replay"), "{text}");
    assert!(text.contains("SKIP measured/replay"), "{text}");
    assert!(text.contains("skipped: mode = shadow"), "{text}");
    assert!(text.contains("SKIP unused/misuse"), "{text}");
    assert!(text.contains("skipped: mode = off"), "{text}");
}
