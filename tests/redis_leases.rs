//! Issue #56, item 3: what a lease's holder sends once it has won (renewals, completions,
//! releases) goes on a Redis connection of its own, so it never waits behind claims.
//! Injected with real parts: a TCP proxy between the gateway and Redis holds the claims'
//! connection still, with a flood of new keys' claims queued on it, while a request that
//! won before the hold finishes; a second gateway, straight on Redis, tells whether its
//! completion landed. No timing is asserted: the hold lasts until the checks are done,
//! and new connections are held too, so a completion queued behind claims could not land
//! by a retry on a fresh connection either.

use std::time::Duration;

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    eventually, GatewayConfig, Http, RedisServer, RouteCfg, StoreCfg, TestGateway, Upstream,
};
use http::StatusCode;

fn config(up: &Upstream, url: &str) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .upstream_timeout("10s")
        .store(StoreCfg::redis(url).timeout("250ms"))
        .default_lease("5s")
        .default_window("1h")
        .route(RouteCfg::header("orders", "/orders/*"))
}

/// The ports (as Redis sees them: the proxy's side) of the clients named `name`.
fn ports_named(redis: &RedisServer, name: &str) -> Vec<u16> {
    let clients = redis.clients_named(name).into_iter();
    clients
        .filter_map(|c| c.get("addr")?.rsplit_once(':')?.1.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_lands_while_the_claims_connection_is_held_with_claims_queued() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let gw = TestGateway::start(&config(&up, &proxy.redis_url())).await;
    // A second gateway on the same Redis, not through the proxy: it sees what landed.
    let witness = TestGateway::start(&config(&up, &redis.url())).await;
    let both = || async {
        !ports_named(&redis, "dedupe-gateway-claims").is_empty()
            && !ports_named(&redis, "dedupe-gateway-leases").is_empty()
    };
    assert!(
        eventually(Duration::from_secs(5), both).await,
        "the claims' and the leases' connections are named"
    );
    let http = Http::new();
    let url = gw.url("/orders/held");
    let first = tokio::spawn({
        let http = http.clone();
        async move {
            let h = [("Idempotency-Key", "held"), ("x-test-delay-ms", "300")];
            http.post(&url, &h, "{}").await
        }
    });
    // The claim was won and the upstream is at work: from here on the claims' connection
    // is held still, and so is any new one (a replacement dialled once it is found
    // silent), so nothing queued behind claims can reach Redis. (The witness goes
    // through no proxy.)
    up.wait_for_effects(1).await;
    proxy.hold_new();
    proxy.stall(&ports_named(&redis, "dedupe-gateway-claims"));
    // A flood of new keys: their claims queue on the held connection.
    let flood: Vec<_> = (0..20)
        .map(|i| {
            let http = http.clone();
            let url = gw.url(&format!("/orders/flood-{i}"));
            tokio::spawn(async move {
                let key = format!("flood-{i}");
                http.post(&url, &[("Idempotency-Key", key.as_str())], "{}")
                    .await
            })
        })
        .collect();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    // Stored while every claim still waits: the completion went on its own connection.
    let seen = http
        .post(
            &witness.url("/orders/held"),
            &[("Idempotency-Key", "held")],
            "{}",
        )
        .await;
    assert!(seen.replayed(), "the completion did not land: {seen:?}");
    assert_eq!(seen.body, first.body);
    for f in flood {
        let r = f.await.unwrap();
        assert_eq!(
            r.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "a held claim fails closed: {}",
            r.text()
        );
    }
    assert_eq!(up.effects(), 1, "only the won request ran");
    proxy.pass();
    proxy.unstall();
    // Once a claims' connection answers again (the held one, or its replacement).
    let replayed = eventually(Duration::from_secs(10), || async {
        http.post(
            &gw.url("/orders/held"),
            &[("Idempotency-Key", "held")],
            "{}",
        )
        .await
        .replayed()
    })
    .await;
    assert!(replayed, "the gateway never replayed its own completion");
    assert_eq!(up.effects(), 1);
}
