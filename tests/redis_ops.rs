//! Many gateways on one Redis, and Redis misbehaving: stopped, paused, restarted.
//! Real redis-server processes and real gateway processes on ephemeral loopback ports.

use std::collections::HashMap;
use std::time::Duration;

use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg, TestGateway,
    Upstream,
};
use http::StatusCode;

/// A fail-closed `orders` route and a fail-open `open` route in front of `up`, on `store`.
fn config(up: &Upstream, store: StoreCfg, lease: &str) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(store)
        .default_lease(lease)
        .default_window("1h")
        .route(RouteCfg::header("orders", "/orders/*"))
        .route(RouteCfg::header("open", "/open/*").fail_open())
}

/// An in-process gateway on `store` with a 5s lease.
async fn gateway_on(up: &Upstream, store: StoreCfg) -> TestGateway {
    TestGateway::start(&config(up, store, "5s")).await
}

/// A gateway process on `redis` with a `lease`.
fn process_config(up: &Upstream, redis: &RedisServer, lease: &str) -> GatewayConfig {
    let store = StoreCfg::redis(redis.url()).timeout("500ms");
    config(up, store, lease).upstream_timeout("10s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_on_one_redis_give_one_effect_per_key() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let a = GatewayProcess::start(&process_config(&up, &redis, "5s"));
    let b = GatewayProcess::start(&process_config(&up, &redis, "5s"));
    let http = Http::new();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let url = if i % 2 == 0 {
            a.url("/orders/x")
        } else {
            b.url("/orders/x")
        };
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            http.post(
                &url,
                &[("Idempotency-Key", "split"), ("x-test-delay-ms", "100")],
                "{}",
            )
            .await
        }));
    }
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert!(!r.status.is_server_error(), "{}: {}", r.status, r.text());
        *statuses.entry(r.status.as_u16()).or_default() += 1;
    }
    assert_eq!(
        up.effects(),
        1,
        "one effect across both gateways: {statuses:?}"
    );
    assert_eq!(statuses.values().sum::<usize>(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_winner_is_taken_over_by_the_other_gateway_after_its_lease() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let mut a = GatewayProcess::start(&process_config(&up, &redis, "2s"));
    let b = GatewayProcess::start(&process_config(&up, &redis, "2s"));
    let http = Http::new();
    let url_a = a.url("/orders/crash");
    let h = http.clone();
    let doomed = tokio::spawn(async move {
        h.send(
            "POST",
            &url_a,
            &[("Idempotency-Key", "crash"), ("x-test-delay-ms", "3000")],
            "{}",
        )
        .await
    });
    // The upstream took the request; now the winning gateway dies before answering.
    up.wait_for_effects(1).await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    assert!(
        doomed.await.unwrap().is_err(),
        "the client of the dead gateway gets no answer"
    );

    let url_b = b.url("/orders/crash");
    let r = http
        .post(&url_b, &[("Idempotency-Key", "crash")], "{}")
        .await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "the dead winner's lease still holds"
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = http
        .post(&url_b, &[("Idempotency-Key", "crash")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(
        up.increasing_fences().len(),
        2,
        "the takeover carries a higher fence"
    );
    assert!(http
        .post(&url_b, &[("Idempotency-Key", "crash")], "{}")
        .await
        .replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_or_open_per_route_and_recovers_without_restart() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let store = StoreCfg::redis(redis.url()).timeout("250ms");
    let gw = TestGateway::start(&config(&up, store, "5s").admin()).await;
    let http = Http::new();
    let ok = http
        .post(&gw.url("/orders/a"), &[("Idempotency-Key", "before")], "{}")
        .await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(
        http.get(&gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );

    redis.stop();
    let closed = http
        .post(&gw.url("/orders/a"), &[("Idempotency-Key", "during")], "{}")
        .await;
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        closed.problem_type(),
        "urn:dedupe-gateway:problem:store-unavailable"
    );
    assert!(closed.headers.contains_key("retry-after"));
    assert_eq!(up.effects(), 1, "fail-closed forwards nothing");
    let open = http
        .post(&gw.url("/open/a"), &[("Idempotency-Key", "during")], "{}")
        .await;
    assert_eq!(
        open.status,
        StatusCode::CREATED,
        "fail-open forwards without dedupe"
    );
    assert_eq!(up.effects(), 2);
    assert_eq!(
        http.get(&gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let metrics = http.get(&gw.admin_url("/metrics"), &[]).await.text();
    assert!(
        metrics.contains(r#"dedupe_requests_total{route="orders",outcome="store_error"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"dedupe_requests_total{route="open",outcome="fail_open"} 1"#),
        "{metrics}"
    );

    redis.restart();
    // The same gateway reconnects by itself.
    let recovered = eventually(Duration::from_secs(10), || async {
        http.post(&gw.url("/orders/a"), &[("Idempotency-Key", "after")], "{}")
            .await
            .status
            == StatusCode::CREATED
    })
    .await;
    assert!(recovered, "dedupe never came back after Redis restarted");
    let replay = http
        .post(&gw.url("/orders/a"), &[("Idempotency-Key", "after")], "{}")
        .await;
    assert!(replay.replayed());
    assert_eq!(
        http.get(&gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_past_the_store_timeout_fails_fast_instead_of_hanging() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway_on(&up, StoreCfg::redis(redis.url()).timeout("200ms")).await;
    let http = Http::new();
    // Connect and load the scripts first.
    http.post(&gw.url("/orders/p"), &[("Idempotency-Key", "warm")], "{}")
        .await;

    let _: () = redis.cmd(&["CLIENT", "PAUSE", "3000", "ALL"]);
    // Bounded well below the pause: a hang would trip this, not a slow machine.
    let bound = Duration::from_millis(2500);
    let closed = tokio::time::timeout(
        bound,
        http.post(&gw.url("/orders/p"), &[("Idempotency-Key", "paused")], "{}"),
    )
    .await
    .expect("the request waited for Redis instead of timing out");
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE);
    let open = tokio::time::timeout(
        bound,
        http.post(&gw.url("/open/p"), &[("Idempotency-Key", "paused")], "{}"),
    )
    .await
    .expect("fail-open waited for Redis");
    assert_eq!(open.status, StatusCode::CREATED);
    assert_eq!(up.effects(), 2, "warm-up and the fail-open forward");
}

/// Round trips (`EXEC` of a transaction, `EVALSHA` of a script) and any other command a
/// client sent, since `before`.
fn top_level_calls(redis: &RedisServer, before: &HashMap<String, u64>) -> (u64, Vec<String>) {
    // Commands queued in a transaction or run by a script are counted too; they are not
    // round trips.
    const INSIDE: [&str; 7] = [
        "multi",
        "set",
        "get",
        "pexpiretime",
        "time",
        "pttl",
        "pexpire",
    ];
    let after = redis.command_calls();
    let mut evalsha = 0;
    let mut others = Vec::new();
    for (name, calls) in &after {
        let delta = calls - before.get(name).copied().unwrap_or(0);
        if delta == 0 || name == "info" || INSIDE.contains(&name.as_str()) {
            continue;
        }
        if name == "evalsha" || name == "exec" {
            evalsha += delta;
        } else {
            others.push(format!("{name}={delta}"));
        }
    }
    (evalsha, others)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_winner_costs_two_round_trips_a_replay_and_a_conflict_one() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway_on(&up, StoreCfg::redis(redis.url())).await;
    let http = Http::new();
    // Connect, load the scripts (EVALSHA, NOSCRIPT, EVAL happen once) and learn that the
    // server has no `SET ... IFEQ`.
    http.post(&gw.url("/orders/w"), &[("Idempotency-Key", "warm")], "{}")
        .await;

    let before = redis.command_calls();
    let r = http
        .post(&gw.url("/orders/w"), &[("Idempotency-Key", "k1")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        top_level_calls(&redis, &before),
        (2, vec![]),
        "winner: claim + complete"
    );

    let before = redis.command_calls();
    let r = http
        .post(&gw.url("/orders/w"), &[("Idempotency-Key", "k1")], "{}")
        .await;
    assert!(r.replayed());
    assert_eq!(
        top_level_calls(&redis, &before),
        (1, vec![]),
        "replay: the claim's transaction only"
    );

    let h = http.clone();
    let url = gw.url("/orders/w");
    let slow = tokio::spawn(async move {
        h.post(
            &url,
            &[("Idempotency-Key", "k2"), ("x-test-delay-ms", "500")],
            "{}",
        )
        .await
    });
    up.wait_for_effects(3).await;
    let before = redis.command_calls();
    let r = http
        .post(&gw.url("/orders/w"), &[("Idempotency-Key", "k2")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        top_level_calls(&redis, &before),
        (2, vec![]),
        "conflict: the claim's transaction, again with the server's time"
    );
    slow.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_one_string_key_each_and_replays_check_the_key() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway_on(&up, StoreCfg::redis(redis.url()).prefix("t")).await;
    let http = Http::new();
    http.post(&gw.url("/orders/r"), &[("Idempotency-Key", "one")], "{}")
        .await;
    http.post(&gw.url("/orders/r"), &[("Idempotency-Key", "two")], "{}")
        .await;
    let keys: Vec<String> = redis.cmd(&["KEYS", "t:*"]);
    assert_eq!(keys.len(), 2, "{keys:?}");
    for k in &keys {
        let kind: String = redis.cmd(&["TYPE", k]);
        assert_eq!(kind, "string");
        let ttl: i64 = redis.cmd(&["PTTL", k]);
        assert!(ttl > 0, "every record expires");
    }
    // Swap the two records' stored responses: a replay must refuse a record that names
    // another key rather than answer with someone else's response.
    let (k1, k2) = (&keys[0], &keys[1]);
    let mut con = redis.connection().unwrap();
    // Each value is a 105-byte header (no version on this route), then the response.
    let v1: Vec<u8> = redis::cmd("GET").arg(k1).query(&mut con).unwrap();
    let v2: Vec<u8> = redis::cmd("GET").arg(k2).query(&mut con).unwrap();
    let swapped = [&v2[..105], &v1[105..]].concat();
    let _: () = redis::cmd("SET")
        .arg(k2)
        .arg(swapped)
        .arg("KEEPTTL")
        .query(&mut con)
        .unwrap();
    let key2 = k2.rsplit(':').next().unwrap();
    let r = http
        .post(&gw.url("/orders/r"), &[("Idempotency-Key", key2)], "{}")
        .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:record-unusable"
    );
    assert_eq!(up.effects(), 2, "and nothing was executed again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_timed_out_does_not_strand_its_key() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway_on(&up, StoreCfg::redis(redis.url()).timeout("300ms")).await;
    let http = Http::new();
    http.post(&gw.url("/orders/t"), &[("Idempotency-Key", "warm")], "{}")
        .await;

    // Redis holds the first claim past the store timeout, then runs it. The gateway asks
    // again as the same claimant: it wins once, instead of 503 now and 409 for a lease.
    let _: () = redis.cmd(&["CLIENT", "PAUSE", "400", "ALL"]);
    let r = http
        .post(
            &gw.url("/orders/t"),
            &[("Idempotency-Key", "slow-reply")],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert!(http
        .post(
            &gw.url("/orders/t"),
            &[("Idempotency-Key", "slow-reply")],
            "{}"
        )
        .await
        .replayed());
    assert_eq!(up.effects(), 2, "warm-up and one execution");
}
