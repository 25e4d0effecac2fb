//! The zombie drill, end to end: two gateway processes on one Redis in front of the
//! fenced upstream example (`examples/fenced_upstream`). The winner's gateway is frozen
//! (SIGSTOP) mid-call past its lease, a retry takes over through the other gateway and
//! writes, then the zombie wakes: its write reaches the upstream under the stale fence
//! and is refused there, and the store refuses its completion.

// The example's ledger and HTTP service, exactly as `cargo run --example fenced_upstream`
// runs them.
#[path = "../examples/fenced_upstream/ledger.rs"]
mod ledger;

use std::time::Duration;

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg,
};
use http::StatusCode;

fn config(upstream: String, redis: &RedisServer) -> GatewayConfig {
    GatewayConfig::new(upstream)
        .store(StoreCfg::redis(redis.url()))
        .upstream_timeout("30s")
        .admin()
        .route(
            RouteCfg::header("orders", "/orders")
                .scope(&["header:X-Tenant"])
                .lease("1s"),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_winner_is_taken_over_and_its_stale_write_refused_by_upstream_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger::Ledger::open(&dir.path().join("orders.db")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(ledger::serve(listener, ledger.clone()));
    // The zombie's hop to the upstream holds its request until the drill lets it through,
    // so it lands after its successor's, as a frozen gateway's delayed write would.
    let hop = FaultProxy::start(upstream).await;
    hop.hold_new();

    let redis = RedisServer::start();
    let zombie = GatewayProcess::start(&config(format!("http://{}", hop.addr), &redis));
    let other = GatewayProcess::start(&config(format!("http://{upstream}"), &redis));
    let http = Http::new();
    let headers = [("Idempotency-Key", "order-1"), ("X-Tenant", "acme")];

    let url = zombie.url("/orders");
    let h = http.clone();
    let first = tokio::spawn(async move { h.post(&url, &headers, r#"{"sku":"tea"}"#).await });
    // The zombie won the claim and is forwarding: freeze it, renewals included.
    assert!(eventually(Duration::from_secs(5), || async { hop.accepted() >= 1 }).await);
    zombie.signal("STOP");

    // Its lease runs out; a retry through the other gateway takes over and writes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        let r = http
            .post(&other.url("/orders"), &headers, r#"{"sku":"tea"}"#)
            .await;
        if r.status != StatusCode::CONFLICT {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no takeover through the other gateway"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(taken.status, StatusCode::CREATED, "{}", taken.text());
    let log = other.logs.lock().unwrap().clone();
    assert!(
        log.iter().any(|l| l["level"] == "WARN"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("taking over under a new fence"))),
        "the takeover is logged at warn: {log:?}"
    );

    // The zombie's write reaches the upstream now, under its old fence, and is refused.
    hop.pass();
    assert!(
        eventually(Duration::from_secs(5), || async {
            ledger.report().unwrap()["stale_writes"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
        })
        .await,
        "the stale write never reached the upstream"
    );
    zombie.signal("CONT");
    let first = first.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::CONFLICT,
        "the zombie's client gets the upstream's refusal: {}",
        first.text()
    );
    // The upstream's 409 says it did not act (a default retry status): the zombie's
    // release of the key is refused under its old fence, as a completion would be.
    zombie
        .wait_logged("refused: the key was taken over under a newer fence")
        .await;
    let metrics = http.get(&zombie.admin_url("/metrics"), &[]).await.text();
    assert!(
        metrics.contains(r#"dedupe_requests_total{route="orders",outcome="fenced_out"} 1"#),
        "{metrics}"
    );

    // Exactly one business row, under the successor's fence; the stale fence refused.
    let report = ledger.report().unwrap();
    let orders = report["orders"].as_array().unwrap();
    assert_eq!(orders.len(), 1, "{report}");
    let stale = report["stale_writes"].as_array().unwrap();
    assert_eq!(stale.len(), 1, "{report}");
    assert!(
        stale[0]["fence"].as_i64() < orders[0]["fence"].as_i64(),
        "{report}"
    );
    assert_eq!(stale[0]["highest"], orders[0]["fence"], "{report}");
    assert_eq!(orders[0]["key"], "order-1");
    assert_ne!(
        orders[0]["scope"], "-",
        "the scope hash reached the upstream"
    );

    // The record shows both attempts: the zombie's claim and the takeover.
    let record = http
        .get(
            &other.admin_url("/keys/orders/order-1?header:X-Tenant=acme"),
            &[],
        )
        .await;
    let record: serde_json::Value = serde_json::from_slice(&record.body).unwrap();
    assert_eq!(record["state"], "completed", "{record}");
    assert_eq!(record["attempts"], 2, "{record}");
    assert_eq!(
        record["fence"].as_i64(),
        orders[0]["fence"].as_i64(),
        "{record}"
    );
    assert!(record["completed_at"].is_string(), "{record}");

    // Both gateways replay the successor's response from now on.
    for gw in [&zombie, &other] {
        let r = http
            .post(&gw.url("/orders"), &headers, r#"{"sku":"tea"}"#)
            .await;
        assert!(r.replayed(), "{r:?}");
        assert_eq!(r.body, taken.body);
    }
    assert_eq!(
        ledger.report().unwrap()["orders"].as_array().unwrap().len(),
        1
    );
}
