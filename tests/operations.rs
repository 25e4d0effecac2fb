//! Operating the gateway: admin port (metrics, health, keys, token), SIGTERM drain,
//! SIGHUP reload, JSON access logs.

use std::time::Duration;

use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg, TestGateway,
    Upstream,
};
use http::StatusCode;

/// One scoped payments route in front of `up`.
fn payments(up: &Upstream) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .default_lease("5s")
        .route(RouteCfg::header("payments", "/v1/payments/*").scope(&["header:Authorization"]))
}

fn counter(metrics: &str, route: &str, outcome: &str) -> u64 {
    let prefix = format!("dedupe_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_key_outcome() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&payments(&up).admin()).await;
    let http = Http::new();
    let url = gw.url("/v1/payments/1");
    let metrics = || async { http.get(&gw.admin_url("/metrics"), &[]).await.text() };
    let before = metrics().await;
    assert_eq!(counter(&before, "payments", "won"), 0);

    http.post(&url, &[("Idempotency-Key", "m")], "{}").await;
    http.post(&url, &[("Idempotency-Key", "m")], "{}").await;
    http.post(&url, &[("Idempotency-Key", "m")], "{}").await;
    http.post(&url, &[("Idempotency-Key", "m")], "{\"other\":1}")
        .await;
    http.post(&url, &[], "{}").await;
    http.post(&url, &[("Idempotency-Key", "bad key")], "{}")
        .await;
    let h = http.clone();
    let u = url.clone();
    let slow = tokio::spawn(async move {
        h.post(
            &u,
            &[("Idempotency-Key", "slow"), ("x-test-delay-ms", "300")],
            "{}",
        )
        .await
    });
    up.wait_for_effects(2).await;
    assert_eq!(
        http.post(&url, &[("Idempotency-Key", "slow")], "{}")
            .await
            .status,
        StatusCode::CONFLICT
    );
    slow.await.unwrap();
    http.post(&gw.url("/elsewhere"), &[], "").await;

    let m = metrics().await;
    assert_eq!(counter(&m, "payments", "won"), 2, "{m}");
    assert_eq!(counter(&m, "payments", "replayed"), 2);
    assert_eq!(counter(&m, "payments", "mismatch"), 1);
    assert_eq!(counter(&m, "payments", "conflict"), 1);
    assert_eq!(counter(&m, "payments", "missing_key"), 1);
    assert_eq!(counter(&m, "payments", "invalid_key"), 1);
    assert_eq!(counter(&m, "-", "passthrough"), 1);
    assert!(
        m.contains(r#"dedupe_upstream_responses_total{route="payments",class="2xx"} 2"#),
        "{m}"
    );
    assert!(m.contains("dedupe_upstream_latency_seconds_bucket"));
    assert!(m.contains("dedupe_store_latency_seconds_bucket{le="));
    assert!(m.contains("dedupe_inflight_claims 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_can_be_inspected_and_forgotten_behind_the_admin_token() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&payments(&up).admin_with_token("s3cret")).await;
    let http = Http::new();
    let url = gw.url("/v1/payments/1");
    let tenant = ("Authorization", "Bearer tenant-a");
    http.post(&url, &[("Idempotency-Key", "stuck/1"), tenant], "{}")
        .await;
    assert_eq!(up.effects(), 1);

    let key_url = gw.admin_url("/keys/payments/stuck%2F1?header:Authorization=Bearer%20tenant-a");
    let auth = [("Authorization", "Bearer s3cret")];
    // The token guards everything but the probes.
    assert_eq!(
        http.get(&key_url, &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    let wrong = http
        .get(&key_url, &[("Authorization", "Bearer nope")])
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong.problem_type(),
        "urn:dedupe-gateway:problem:unauthorized"
    );
    assert_eq!(
        http.get(&gw.admin_url("/metrics"), &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        http.get(&gw.admin_url("/metrics"), &auth).await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.get(&gw.admin_url("/healthz"), &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.get(&gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );

    let shown = http.get(&key_url, &auth).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text());
    let v: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(
        v["fence"].as_u64(),
        up.seen()[0].fence(),
        "the fence the upstream saw"
    );
    assert_eq!(v["status"], 201);
    assert_eq!(v["body_stored"], true);
    assert_eq!(v["attempts"], 1, "one claim won it, no takeover");
    let when = |field: &str| {
        humantime::parse_rfc3339(v[field].as_str().unwrap_or_else(|| panic!("{field}: {v}")))
            .unwrap()
    };
    assert!(when("claimed_at") <= when("completed_at"), "{v}");
    // Another tenant's view of the same key is another record.
    let other = gw.admin_url("/keys/payments/stuck%2F1?header:Authorization=Bearer%20tenant-b");
    assert_eq!(http.get(&other, &auth).await.status, StatusCode::NOT_FOUND);
    // The scope hash from the access log works as well.
    let by_hash = gw.admin_url(&format!(
        "/keys/payments/stuck%2F1?scope={}",
        v["scope"].as_str().unwrap()
    ));
    assert_eq!(http.get(&by_hash, &auth).await.status, StatusCode::OK);

    let deleted = http.send("DELETE", &key_url, &auth, "").await.unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        http.get(&key_url, &auth).await.status,
        StatusCode::NOT_FOUND
    );
    let again = http
        .post(&url, &[("Idempotency-Key", "stuck/1"), tenant], "{}")
        .await;
    assert!(!again.replayed(), "a forgotten key executes again");
    assert_eq!(up.effects(), 2);
    // A request that lacked its scope header is found by leaving the scope input out
    // (absent), which is not the same record as an empty value.
    http.post(&url, &[("Idempotency-Key", "no-tenant")], "{}")
        .await;
    let absent = gw.admin_url("/keys/payments/no-tenant");
    assert_eq!(http.get(&absent, &auth).await.status, StatusCode::OK);
    let empty = gw.admin_url("/keys/payments/no-tenant?header:Authorization=");
    assert_eq!(
        http.get(&empty, &auth).await.problem_type(),
        "urn:dedupe-gateway:problem:record-not-found"
    );
}

/// An orders route with a 1s lease in front of `up`, on `redis`.
fn redis_config(up: &Upstream, redis: &RedisServer) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(StoreCfg::redis(redis.url()))
        .default_lease("1s")
        .route(RouteCfg::header("orders", "/orders"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_slow_upstream_call_finish_and_store_its_response() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let mut a = GatewayProcess::start(&redis_config(&up, &redis).shutdown_grace("10s"));
    let http = Http::new();
    let url = a.url("/orders");
    let h = http.clone();
    let call = tokio::spawn(async move {
        h.post(
            &url,
            &[("Idempotency-Key", "drain"), ("x-test-delay-ms", "800")],
            "{}",
        )
        .await
    });
    up.wait_for_effects(1).await;
    a.signal("TERM");
    a.wait_logged("draining").await;
    let answered = call.await.unwrap();
    assert_eq!(
        answered.status,
        StatusCode::CREATED,
        "the in-flight call finished"
    );
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(
        std::net::TcpStream::connect(a.addr).is_err(),
        "the drained gateway no longer accepts"
    );

    // Its response was stored: another gateway on the same Redis replays it.
    let b = GatewayProcess::start(&redis_config(&up, &redis));
    let replay = http
        .post(&b.url("/orders"), &[("Idempotency-Key", "drain")], "{}")
        .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, answered.body);
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_off_by_the_grace_period_keeps_its_claim_for_a_takeover() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let mut a = GatewayProcess::start(&redis_config(&up, &redis).shutdown_grace("100ms"));
    let http = Http::new();
    let url = a.url("/orders");
    let h = http.clone();
    let call = tokio::spawn(async move {
        h.send(
            "POST",
            &url,
            &[("Idempotency-Key", "cut"), ("x-test-delay-ms", "3000")],
            "{}",
        )
        .await
    });
    up.wait_for_effects(1).await;
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(5)), Some(0));
    assert!(
        call.await.unwrap().is_err(),
        "the cut-off client gets no made-up answer"
    );

    let b = GatewayProcess::start(&redis_config(&up, &redis));
    let r = http
        .post(&b.url("/orders"), &[("Idempotency-Key", "cut")], "{}")
        .await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "outcome unknown: the claim is neither completed nor released"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = http
        .post(&b.url("/orders"), &[("Idempotency-Key", "cut")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(up.increasing_fences().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_new_routes_and_keeps_the_old_config_when_the_new_one_is_broken() {
    let up = Upstream::start().await;
    let base = GatewayConfig::new(up.url());
    let gw = GatewayProcess::start(&base);
    let http = Http::new();
    let url = gw.url("/new");
    http.post(&url, &[("Idempotency-Key", "n")], "{}").await;
    http.post(&url, &[("Idempotency-Key", "n")], "{}").await;
    assert_eq!(up.effects(), 2, "no route yet: proxied twice");

    let new = RouteCfg::header("new", "/new");
    let with_route = base.clone().route(new.clone());
    std::fs::write(&gw.config_path, with_route.to_toml()).unwrap();
    gw.signal("HUP");
    gw.wait_logged("configuration reloaded").await;
    http.post(&url, &[("Idempotency-Key", "n")], "{}").await;
    assert!(http
        .post(&url, &[("Idempotency-Key", "n")], "{}")
        .await
        .replayed());
    assert_eq!(up.effects(), 3);

    let broken = base.route(new.lease("soon"));
    std::fs::write(&gw.config_path, broken.to_toml()).unwrap();
    gw.signal("HUP");
    gw.wait_logged("configuration refused").await;
    assert!(
        http.post(&url, &[("Idempotency-Key", "n")], "{}")
            .await
            .replayed(),
        "old config in force"
    );

    // Listen changes are reported as needing a restart.
    let moved = with_route.listen("127.0.0.1:1");
    std::fs::write(&gw.config_path, moved.to_toml()).unwrap();
    gw.signal("HUP");
    gw.wait_logged("takes effect only after a restart").await;
    assert!(http
        .post(&url, &[("Idempotency-Key", "n")], "{}")
        .await
        .replayed());

    // One JSON access line per request, with what an operator needs.
    let access_lines = || {
        let logs = gw.logs.lock().unwrap();
        logs.iter()
            .filter(|l| l["target"] == "dedupe_gateway::access")
            .cloned()
            .collect::<Vec<_>>()
    };
    eventually(Duration::from_secs(5), || async {
        access_lines().len() >= 6
    })
    .await;
    let access = access_lines();
    assert_eq!(access.len(), 6, "{access:#?}");
    let won = access.iter().find(|l| l["outcome"] == "won").unwrap();
    assert_eq!(won["route"], "new");
    assert_eq!(won["status"], 201);
    assert_eq!(won["fence"].as_u64(), up.seen()[2].fence());
    assert!(won["upstream_ms"].as_f64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_sets_listen_upstream_and_admin_through_the_environment() {
    let up = Upstream::start().await;
    // The file names addresses that do not work here; the environment overrides them.
    let file = GatewayConfig::new("http://127.0.0.1:9")
        .listen("127.0.0.1:1")
        .route(RouteCfg::header("orders", "/orders"));
    let gw = GatewayProcess::start_with_env(
        &file,
        &[
            ("DEDUPE_LISTEN", "127.0.0.1:0"),
            ("DEDUPE_UPSTREAM", &up.url()),
            ("DEDUPE_ADMIN_LISTEN", "127.0.0.1:0"),
            ("DEDUPE_ADMIN_TOKEN", "t0ken"),
        ],
    );
    let http = Http::new();
    let r = http
        .post(&gw.url("/orders"), &[("Idempotency-Key", "env")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(http
        .post(&gw.url("/orders"), &[("Idempotency-Key", "env")], "{}")
        .await
        .replayed());
    assert_eq!(up.effects(), 1);
    assert_eq!(
        http.get(&gw.admin_url("/healthz"), &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.get(&gw.admin_url("/metrics"), &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    let m = http
        .get(
            &gw.admin_url("/metrics"),
            &[("Authorization", "Bearer t0ken")],
        )
        .await;
    assert_eq!(m.status, StatusCode::OK);
}

/// The gateway process on its connection workers (one per CPU, `server.workers` unset),
/// at one worker and at two: each key runs once whatever the concurrency, and one
/// client's requests one after another (a worker idle between each) are all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_workers_run_each_key_once_and_answer_one_client_in_turn() {
    for workers in [None, Some(1), Some(2)] {
        let up = Upstream::start().await;
        let gw = GatewayProcess::start(
            &workers
                .map_or(GatewayConfig::new(up.url()), |n| {
                    GatewayConfig::new(up.url()).workers(n)
                })
                .store(StoreCfg::memory())
                .route(RouteCfg::header("orders", "/orders")),
        );
        let http = Http::new();
        let calls: Vec<_> = (0..40)
            .flat_map(|k| (0..3).map(move |_| k))
            .map(|k| {
                let (h, url) = (http.clone(), gw.url("/orders"));
                tokio::spawn(async move {
                    h.post(&url, &[("Idempotency-Key", &format!("k{k}"))], "{}")
                        .await
                        .status
                })
            })
            .collect();
        for c in calls {
            let status = c.await.unwrap();
            assert!(
                [StatusCode::CREATED, StatusCode::CONFLICT].contains(&status),
                "workers {workers:?}: {status}"
            );
        }
        for i in 0..100 {
            let answer = http
                .post(
                    &gw.url("/orders"),
                    &[("Idempotency-Key", &format!("s{i}"))],
                    "{}",
                )
                .await;
            assert_eq!(answer.status, StatusCode::CREATED, "workers {workers:?}");
        }
        assert_eq!(up.effects(), 140, "workers {workers:?}: one effect per key");
    }
}
