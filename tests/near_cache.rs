//! `store.near_cache`: replays served from a local copy of completed records, kept
//! correct across gateways by Redis's invalidations. Two gateways on one real Redis.

use std::time::Duration;

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::near_cache::{self, claims_sent, near, order, served_locally};
use dedupe_test_support::{
    eventually, GatewayConfig, Http, RedisServer, RouteCfg, StoreCfg, TestGateway, Upstream,
};

fn config(up: &Upstream, redis: &RedisServer, window: &str) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(
            StoreCfg::redis(redis.url())
                .timeout("2s")
                .near_cache("1MiB"),
        )
        .admin()
        .route(RouteCfg::header("orders", "/orders/*").window(window))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_through_another_gateway_reaches_the_cache() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &redis, "1h")).await;
    let b = TestGateway::start(&config(&up, &redis, "1h")).await;
    near_cache::a_delete_through_b_reaches_a(&up, &a, &b, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_never_outlives_its_window() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &redis, "2s")).await;
    near_cache::a_copy_never_outlives_its_window(&up, &a, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_empties_the_cache() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &redis, "1h")).await;
    let http = Http::new();
    assert_eq!(order(&http, &a, "c").await, 201);
    assert!(served_locally(&http, &a, &[&redis], "c").await);
    let bytes_before = {
        let text = http.get(&a.admin_url("/metrics"), &[]).await.text();
        assert!(text.contains("dedupe_near_cache_bytes "), "{text}");
        text
    };
    assert!(!bytes_before.contains("dedupe_near_cache_bytes 0\n"));

    let _: () = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    // Once the gateway sees the connection end, the cache is empty: a replay goes to
    // Redis (the claim script runs), and it is a replay still.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let calls = claims_sent(&[&redis]);
            let hits = near(&http, &a, "hit").await;
            assert_eq!(order(&http, &a, "c").await, 201);
            near(&http, &a, "hit").await == hits && claims_sent(&[&redis]) > calls
        })
        .await,
        "the cache kept serving after its connection was killed"
    );
    assert_eq!(up.effects(), 1);
    // Tracking is on again on the new connection: copies are served once more.
    assert!(served_locally(&http, &a, &[&redis], "c").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushall_by_another_client_empties_the_cache() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &redis, "1h")).await;
    let http = Http::new();
    assert_eq!(order(&http, &a, "f").await, 201);
    assert!(served_locally(&http, &a, &[&redis], "f").await);
    // Redis pushes a null invalidation (every key) to each tracking client.
    let _: () = redis.cmd(&["FLUSHALL"]);
    assert!(
        eventually(Duration::from_secs(5), || async {
            assert_eq!(order(&http, &a, "f").await, 201);
            up.effects() == 2
        })
        .await,
        "a copy outlived FLUSHALL"
    );
}

/// A's connection goes through a proxy that loses its flow (TCP stays up, bytes vanish):
/// no invalidation reaches A, not even the one for a delete through B. Without a fresh
/// proof A stops serving its copy, with no close and no request to tell it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_stops_the_cache_serving() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let up = Upstream::start().await;
    let through_proxy = GatewayConfig::new(up.url())
        .store(
            StoreCfg::redis(proxy.redis_url())
                .timeout("2s")
                .near_cache("1MiB"),
        )
        .admin()
        .route(RouteCfg::header("orders", "/orders/*").window("1h"));
    let a = TestGateway::start(&through_proxy).await;
    let b = TestGateway::start(&config(&up, &redis, "1h")).await;
    let http = Http::new();
    assert_eq!(order(&http, &a, "s").await, 201);
    assert!(served_locally(&http, &a, &[&redis], "s").await);

    proxy.hold_new();
    proxy.lose_flows();
    let deleted = http
        .send("DELETE", &b.admin_url("/keys/orders/s"), &[], "")
        .await
        .unwrap();
    assert!(deleted.status.is_success(), "{}", deleted.status);
    // Within the proof's life the copy may still be served; past it, a request is not
    // answered from the cache (it waits on Redis and fails per on_error).
    assert!(
        eventually(Duration::from_secs(10), || async {
            let hits = near(&http, &a, "hit").await;
            let status = order(&http, &a, "s").await;
            near(&http, &a, "hit").await == hits && status != 201
        })
        .await,
        "a silent connection's cache kept serving"
    );
    assert_eq!(up.effects(), 1);
    // Once the flow passes again A dials afresh, reads Redis and runs the request.
    proxy.pass();
    assert!(
        eventually(Duration::from_secs(10), || async {
            order(&http, &a, "s").await == 201 && up.effects() == 2
        })
        .await,
        "A never reached Redis again"
    );
}
