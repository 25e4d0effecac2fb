//! The near-cache's checks, the same on a single Redis and on a cluster: its metrics, the
//! script calls that tell a replay served locally from one that reached Redis, and the two
//! behaviours every backend with a near-cache must show.

use std::time::Duration;

use crate::{eventually, Http, RedisServer, TestGateway, Upstream};

async fn metrics(http: &Http, gw: &TestGateway) -> String {
    http.get(&gw.admin_url("/metrics"), &[]).await.text()
}

/// `dedupe_near_cache_total{result}` on `gw`.
pub async fn near(http: &Http, gw: &TestGateway, result: &str) -> u64 {
    let prefix = format!("dedupe_near_cache_total{{result=\"{result}\"}} ");
    metrics(http, gw)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `dedupe_near_cache_bytes` on `gw`.
pub async fn near_bytes(http: &Http, gw: &TestGateway) -> u64 {
    metrics(http, gw)
        .await
        .lines()
        .find_map(|l| l.strip_prefix("dedupe_near_cache_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the bytes gauge is exported")
}

/// Claims sent to any of `nodes` so far: scripts (`EVALSHA`, the hash layout) and
/// transactions (`EXEC`, the string layout's native claim).
pub fn claims_sent(nodes: &[&RedisServer]) -> u64 {
    nodes
        .iter()
        .map(|n| {
            let calls = n.command_calls();
            ["evalsha", "exec"]
                .iter()
                .map(|c| calls.get(*c).copied().unwrap_or(0))
                .sum::<u64>()
        })
        .sum()
}

/// One order under `key` through `gw` (route `orders` on `/orders/*`); its status.
pub async fn order(http: &Http, gw: &TestGateway, key: &str) -> u16 {
    http.post(&gw.url("/orders/x"), &[("Idempotency-Key", key)], "{}")
        .await
        .status
        .as_u16()
}

/// Replays on `gw` until one is answered from the near-cache without reaching any node.
pub async fn served_locally(
    http: &Http,
    gw: &TestGateway,
    nodes: &[&RedisServer],
    key: &str,
) -> bool {
    eventually(Duration::from_secs(10), || async {
        let (hits, calls) = (near(http, gw, "hit").await, claims_sent(nodes));
        assert_eq!(order(http, gw, key).await, 201);
        near(http, gw, "hit").await == hits + 1 && claims_sent(nodes) == calls
    })
    .await
}

/// Two gateways on `nodes` with a 1h window: a replay cached on `a`, a DELETE through
/// `b`'s admin port, and the next request on `a` executes; then it is cached again.
pub async fn a_delete_through_b_reaches_a(
    up: &Upstream,
    a: &TestGateway,
    b: &TestGateway,
    nodes: &[&RedisServer],
) {
    let http = Http::new();
    assert_eq!(order(&http, a, "k1").await, 201);
    assert_eq!(up.effects(), 1);
    assert!(served_locally(&http, a, nodes, "k1").await);
    assert_eq!(up.effects(), 1, "replays only");

    let deleted = http
        .send("DELETE", &b.admin_url("/keys/orders/k1"), &[], "")
        .await
        .unwrap();
    assert!(deleted.status.is_success(), "{}", deleted.status);
    // The invalidation travels to A beside B's reply: the next requests on A replay from
    // the cache at most until it lands, then one executes.
    assert!(
        eventually(Duration::from_secs(5), || async {
            assert_eq!(order(&http, a, "k1").await, 201);
            up.effects() == 2
        })
        .await,
        "the delete through B never reached A's cache"
    );
    assert!(near(&http, a, "invalidated").await >= 1);
    // And the new record is replayed again, once more from the cache.
    assert!(served_locally(&http, a, nodes, "k1").await);
    assert_eq!(up.effects(), 2);
}

/// A gateway on `nodes` with a 2s window: a copy served from the cache is not served past
/// the window; the request executes again.
pub async fn a_copy_never_outlives_its_window(
    up: &Upstream,
    a: &TestGateway,
    nodes: &[&RedisServer],
) {
    let http = Http::new();
    assert_eq!(order(&http, a, "w").await, 201);
    assert!(served_locally(&http, a, nodes, "w").await);
    assert_eq!(up.effects(), 1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(order(&http, a, "w").await, 201);
    assert_eq!(
        up.effects(),
        2,
        "past the window the request executes again"
    );
}
