//! Redis connection faults, injected with real parts: a TCP proxy that loses flows, holds
//! or cuts connections; a redis-server frozen with SIGSTOP, restarted, closing idle
//! clients (`CONFIG SET timeout`) or killing them (`CLIENT KILL`). Each test counts the
//! upstream's side effects and checks recovery without restarting the gateway.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg, TestGateway,
    Upstream,
};
use http::StatusCode;

/// The tests' gateway: a fail-closed and a fail-open route on Redis, an admin port.
fn config(up: &Upstream, url: &str, lease: &str, upstream_timeout: &str) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .upstream_timeout(upstream_timeout)
        .store(StoreCfg::redis(url).timeout(&format!("{}ms", TIMEOUT.as_millis())))
        .default_lease(lease)
        .default_window("1h")
        .admin()
        .route(RouteCfg::header("orders", "/orders/*"))
        .route(RouteCfg::header("open", "/open/*").fail_open())
}

/// The store timeout the tests run with, and the bound docs/faults.md states for replacing
/// a connection that stopped answering: the timeout that notices it, then the probe's
/// patience (at least 1s), then a dial. Slack on top for a loaded 2-core machine.
const TIMEOUT: Duration = Duration::from_millis(250);
const REPLACED_WITHIN: Duration = Duration::from_millis(250 + 1000 + 2500);
/// A request that meets a silent store answers within two store timeouts (the claim and
/// its second ask as the same claimant); slack on top.
const FAILS_WITHIN: Duration = Duration::from_millis(2 * 250 + 1500);

async fn gateway(url: &str, up: &Upstream) -> TestGateway {
    TestGateway::start(&config(up, url, "5s", "10s")).await
}

fn redis_addr(redis: &RedisServer) -> std::net::SocketAddr {
    format!("127.0.0.1:{}", redis.port).parse().unwrap()
}

/// A fresh idempotency key per call.
fn fresh(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::SeqCst))
}

async fn post(http: &Http, gw: &TestGateway, path: &str, key: &str) -> dedupe_test_support::Reply {
    http.post(&gw.url(path), &[("Idempotency-Key", key)], "{}")
        .await
}

async fn ready(http: &Http, gw: &TestGateway) -> StatusCode {
    http.get(&gw.admin_url("/readyz"), &[]).await.status
}

/// Polls with a new key each time (a retried key could meet its own earlier claim) until a
/// deduped request is won again; returns how long that took.
async fn recovers(http: &Http, gw: &TestGateway, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let ok = eventually(within, || async {
        post(http, gw, "/orders/r", &fresh("recover")).await.status == StatusCode::CREATED
    })
    .await;
    ok.then(|| started.elapsed())
}

/// Sends requests for `during`; every one must fail closed (503) within `FAILS_WITHIN`.
async fn fails_closed_fast(http: &Http, gw: &TestGateway, during: Duration) -> usize {
    let until = Instant::now() + during;
    let mut n = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let r = post(http, gw, "/orders/f", &fresh("down")).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
        assert!(
            started.elapsed() < FAILS_WITHIN,
            "a request waited {:?} on a silent store",
            started.elapsed()
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    n
}

fn stat(redis: &RedisServer, section: &str, field: &str) -> u64 {
    let info: String = redis.cmd(&["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .parse()
        .unwrap()
}

/// Clients connected to Redis other than the one asking.
fn other_clients(redis: &RedisServer) -> u64 {
    stat(redis, "clients", "connected_clients") - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_flow_is_dropped_and_dialled_again_within_the_bound() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis_addr(&redis)).await;
    let up = Upstream::start().await;
    let gw = gateway(&proxy.redis_url(), &up).await;
    let http = Http::new();
    assert_eq!(
        post(&http, &gw, "/orders/a", "before").await.status,
        StatusCode::CREATED
    );
    assert_eq!(ready(&http, &gw).await, StatusCode::OK);
    let dialled = proxy.accepted();

    // The NAT forgets the flow: TCP stays up, nothing arrives. A new flow would pass.
    proxy.lose_flows();
    let lost_at = Instant::now();
    let r = post(&http, &gw, "/orders/a", "during").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "fails closed");
    assert!(lost_at.elapsed() < FAILS_WITHIN);
    assert_eq!(up.effects(), 1, "fail-closed forwards nothing");

    let took = recovers(&http, &gw, REPLACED_WITHIN)
        .await
        .expect("the silent connection was never replaced");
    eprintln!("recovered {took:?} after the first failure");
    assert!(lost_at.elapsed() < REPLACED_WITHIN + FAILS_WITHIN);
    // Each connection worker's link finds its own flow lost and dials again.
    assert!(
        eventually(REPLACED_WITHIN, || async {
            ready(&http, &gw).await == StatusCode::OK
        })
        .await,
        "a worker's silent connection was never replaced"
    );
    assert!(proxy.accepted() > dialled, "no new connection was dialled");
    // Recovery kept dedupe: the recovered key is replayed, not executed again.
    assert_eq!(up.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_path_fails_per_on_error_then_recovers_when_it_passes_again() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis_addr(&redis)).await;
    let up = Upstream::start().await;
    let gw = gateway(&proxy.redis_url(), &up).await;
    let http = Http::new();
    assert_eq!(
        post(&http, &gw, "/orders/b", "before").await.status,
        StatusCode::CREATED
    );

    // Everything silent: the open flow and every new dial.
    proxy.hold_new();
    proxy.lose_flows();
    let n = fails_closed_fast(&http, &gw, Duration::from_secs(3)).await;
    assert!(n >= 3);
    let open = post(&http, &gw, "/open/b", &fresh("open")).await;
    assert_eq!(open.status, StatusCode::CREATED, "fail-open forwards");
    assert_eq!(ready(&http, &gw).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(up.effects(), 2, "only the fail-open request was forwarded");

    proxy.pass();
    recovers(&http, &gw, REPLACED_WITHIN)
        .await
        .expect("never recovered after the path passed again");
    assert!(
        eventually(Duration::from_secs(2), || async {
            ready(&http, &gw).await == StatusCode::OK
        })
        .await
    );
    assert_eq!(up.effects(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_frozen_by_sigstop_fails_fast_and_recovers_after_sigcont() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway(&redis.url(), &up).await;
    let http = Http::new();
    assert_eq!(
        post(&http, &gw, "/orders/s", "before").await.status,
        StatusCode::CREATED
    );
    // The gateway's connections: the main one and each connection worker's.
    let before = redis.other_client_ids();
    assert!(!before.is_empty(), "the gateway's connections");
    {
        let _frozen = redis.freeze();
        fails_closed_fast(&http, &gw, Duration::from_secs(4)).await;
        assert_eq!(ready(&http, &gw).await, StatusCode::SERVICE_UNAVAILABLE);
    }
    recovers(&http, &gw, REPLACED_WITHIN)
        .await
        .expect("never recovered after SIGCONT");
    assert!(
        eventually(REPLACED_WITHIN, || async {
            ready(&http, &gw).await == StatusCode::OK
        })
        .await
    );
    // The connection whose commands timed out was replaced, not merely answering again
    // after SIGCONT (a worker's link that sent nothing meanwhile may keep its own).
    let after = redis.other_client_ids();
    assert!(
        before.iter().any(|id| !after.contains(id)),
        "the connection that stopped answering was kept: {before:?} {after:?}"
    );
    assert_eq!(up.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_redis_closed_while_idle_does_not_fail_the_next_claim() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway(&redis.url(), &up).await;
    let http = Http::new();
    let first = post(&http, &gw, "/open/i", "once").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(other_clients(&redis) >= 1, "the gateway's connections");

    let _: () = redis.cmd(&["CONFIG", "SET", "timeout", "1"]);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(other_clients(&redis), 0, "Redis closed the idle connection");
    // fail-open: had the claim failed, this would have run upstream a second time.
    let again = post(&http, &gw, "/open/i", "once").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "not replayed: {again:?}");
    assert_eq!(up.effects(), 1, "one upstream execution per key");

    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(other_clients(&redis), 0);
    let started = Instant::now();
    let closed = post(&http, &gw, "/orders/i", "new").await;
    assert_eq!(closed.status, StatusCode::CREATED, "{}", closed.text());
    assert!(started.elapsed() < FAILS_WITHIN);
    assert_eq!(up.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_after_a_long_upstream_call_under_an_idle_timeout_still_stores() {
    let redis = RedisServer::start();
    let _: () = redis.cmd(&["CONFIG", "SET", "timeout", "1"]);
    let up = Upstream::start().await;
    let gw = gateway(&redis.url(), &up).await;
    let http = Http::new();
    let slow = http
        .post(
            &gw.url("/orders/slow"),
            &[("Idempotency-Key", "slow"), ("x-test-delay-ms", "3000")],
            "{}",
        )
        .await;
    assert_eq!(slow.status, StatusCode::CREATED);
    // Stored: the retry is a replay, not a conflict on a stranded claim or a takeover.
    let retry = post(&http, &gw, "/orders/slow", "slow").await;
    assert!(retry.replayed(), "not stored: {retry:?}");
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_cut_connections_do_not_fail_the_next_request() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis_addr(&redis)).await;
    let up = Upstream::start().await;
    let gw = gateway(&proxy.redis_url(), &up).await;
    let http = Http::new();
    assert_eq!(
        post(&http, &gw, "/orders/k", "warm").await.status,
        StatusCode::CREATED
    );
    let _: () = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = post(&http, &gw, "/open/k", "after-kill").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(!r.replayed());
    assert!(
        post(&http, &gw, "/open/k", "after-kill").await.replayed(),
        "the claim after CLIENT KILL was not stored: fail-open ran it twice"
    );

    proxy.cut();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = post(&http, &gw, "/orders/k", "after-cut").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(up.effects(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_after_a_redis_restart_succeeds() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway(&redis.url(), &up).await;
    let http = Http::new();
    assert_eq!(
        post(&http, &gw, "/orders/r", "before").await.status,
        StatusCode::CREATED
    );
    redis.restart();
    let r = post(&http, &gw, "/orders/r", "after").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(ready(&http, &gw).await, StatusCode::OK);
    assert_eq!(up.effects(), 2);
}

/// A Redis that lost its script cache (`SCRIPT FLUSH`, as a restart or a failover to a
/// replica that never ran them leaves it) answers the first `EVALSHA` with `NOSCRIPT`. A
/// claim runs no script and a completion does (in the form that carries the completed
/// record whole): after `SCRIPT FLUSH` the completion meets `NOSCRIPT`, is sent again as
/// `EVAL`, and its record replays byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_costs_a_completion_one_eval() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let store = StoreCfg::redis(redis.url()).timeout(&format!("{}ms", TIMEOUT.as_millis()));
    let gw = TestGateway::start(&config(&up, &redis.url(), "5s", "10s").store(store)).await;
    let http = Http::new();
    let evals = || redis.command_calls().get("eval").copied().unwrap_or(0);
    assert_eq!(
        post(&http, &gw, "/orders/s", "warm").await.status,
        StatusCode::CREATED
    );
    let _: () = redis.cmd(&["SCRIPT", "FLUSH"]);
    let before = evals();
    let first = post(&http, &gw, "/orders/s", "after-flush").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert_eq!(evals(), before + 1, "the completion never met NOSCRIPT");
    let again = post(&http, &gw, "/orders/s", "after-flush").await;
    assert!(again.replayed(), "{}", again.text());
    assert_eq!(again.body, first.body);
    assert_eq!(up.effects(), 2, "one execution per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_reported_at_start_up_and_the_gateway_starts_anyway() {
    let mut redis = RedisServer::start();
    redis.stop();
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(&up, &redis.url(), "5s", "10s"));
    gw.wait_logged("cannot reach Redis").await;
    let http = Http::new();
    assert_eq!(
        http.get(&gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    redis.restart();
    assert!(
        eventually(Duration::from_secs(3), || async {
            http.get(&gw.admin_url("/readyz"), &[]).await.status == StatusCode::OK
        })
        .await,
        "not ready after Redis came up"
    );
}

/// Load on two gateways sharing one Redis while Redis's clients are killed, Redis is
/// frozen, and Redis is killed and restarted (with `appendfsync always`, so keys survive).
/// Fails on a key executed twice under one fence (a second execution is only allowed as
/// a takeover or reclaim, which carries a new fence), on any panic in the gateway, and on
/// a gateway that has not recovered within a few seconds of Redis returning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_two_gateways_one_redis_killed_frozen_and_cut_under_load() {
    static GATEWAY_PANICS: AtomicU64 = AtomicU64::new(0);
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.location().is_some_and(|l| l.file().starts_with("src")) {
            GATEWAY_PANICS.fetch_add(1, Ordering::SeqCst);
        }
        default_hook(info);
    }));

    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let up = Upstream::start().await;
    // At a connection cap that silent clients keep filling (below).
    let config = config(&up, &redis.url(), "3s", "2s")
        .max_connections(24)
        .header_read_timeout("1s");
    let gateways = std::sync::Arc::new([
        TestGateway::start(&config).await,
        TestGateway::start(&config).await,
    ]);
    // header_read_timeout is 1s: pooled connections are let go well before the gateway's
    // idle close, on a machine slow enough to leave one idle that long.
    let http = Http::with_idle_timeout(Duration::from_millis(300));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(
        std::collections::BTreeMap::<u16, u64>::new(),
    ));
    let mut load = Vec::new();
    for client in 0..6u64 {
        let (gws, http, stop, statuses) = (
            gateways.clone(),
            http.clone(),
            stop.clone(),
            statuses.clone(),
        );
        load.push(tokio::spawn(async move {
            let mut x = client * 7919 + 1;
            while !stop.load(Ordering::SeqCst) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("chaos-{}", (x >> 33) % 300);
                let gw = &gws[((x >> 20) % 2) as usize];
                let r = http
                    .post(
                        &gw.url("/orders/c"),
                        &[("Idempotency-Key", &key), ("x-test-delay-ms", "10")],
                        "{}",
                    )
                    .await;
                *statuses
                    .lock()
                    .unwrap()
                    .entry(r.status.as_u16())
                    .or_default() += 1;
            }
        }));
    }

    // Clients that connect and send nothing, or only an HTTP/2 preface and SETTINGS,
    // eight every 300 ms to either gateway, each held until the gateway closes it: the
    // slots they take must come back within header_read_timeout, or the load starves.
    let silent = {
        let (gws, stop) = (gateways.clone(), stop.clone());
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for _ in 0..8 {
                    n += 1;
                    let addr = gws[(n % 2) as usize].addr;
                    tokio::spawn(async move {
                        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                            return;
                        };
                        if n.is_multiple_of(3) {
                            let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
                            let _ = s.write_all(preface).await;
                        }
                        let mut buf = [0u8; 256];
                        // Held until the gateway closes it (or 10 s: then it never did).
                        let _ = tokio::time::timeout(Duration::from_secs(10), async {
                            use tokio::io::AsyncReadExt;
                            while let Ok(n) = s.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                            }
                        })
                        .await;
                    });
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    let recovered = |what: &'static str| {
        let gateways = gateways.clone();
        let http = http.clone();
        async move {
            for (i, gw) in gateways.iter().enumerate() {
                let ok = eventually(Duration::from_secs(5), || async {
                    ready(&http, gw).await == StatusCode::OK
                        && post(&http, gw, "/orders/p", &fresh("probe")).await.status
                            == StatusCode::CREATED
                })
                .await;
                assert!(ok, "gateway {i} not recovered within 5s after {what}");
            }
        }
    };
    let pause = |ms| tokio::time::sleep(Duration::from_millis(ms));

    pause(3000).await;
    for _round in 0..2 {
        for _ in 0..3 {
            let _: () = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
            pause(700).await;
        }
        recovered("CLIENT KILL").await;
        {
            let _frozen = redis.freeze();
            pause(3000).await;
        }
        recovered("SIGCONT").await;
        pause(1500).await;
        redis.stop();
        pause(1500).await;
        redis.restart();
        recovered("a restart").await;
        pause(3000).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.await.unwrap();
    }
    silent.await.unwrap();

    let statuses = statuses.lock().unwrap().clone();
    eprintln!("statuses: {statuses:?}, upstream effects: {}", up.effects());
    assert!(
        statuses.keys().all(|s| [201, 409, 503].contains(s)),
        "unexpected statuses: {statuses:?}"
    );
    assert!(
        statuses.get(&201).copied().unwrap_or(0) > 100,
        "{statuses:?}"
    );
    let mut fences: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for seen in up.seen() {
        let key = seen.headers["idempotency-key"].to_str().unwrap().to_owned();
        let fence = seen
            .fence()
            .expect("forwarded without a fence (fail-open?)");
        fences.entry(key).or_default().push(fence);
    }
    for (key, f) in &fences {
        let mut distinct = f.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            f.len(),
            "{key} executed twice under one fence: {f:?}"
        );
    }
    assert_eq!(
        GATEWAY_PANICS.load(Ordering::SeqCst),
        0,
        "the gateway panicked"
    );
}

/// Issue #56, item 3: a completion that times out behind a paused Redis is tried again
/// within one lease, and lands: the retry replays, the upstream ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_times_out_is_tried_again_within_the_lease_and_lands() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway(&redis.url(), &up).await;
    let http = Http::new();
    let url = gw.url("/orders/paused");
    let first = tokio::spawn({
        let http = http.clone();
        async move {
            let h = [("Idempotency-Key", "paused"), ("x-test-delay-ms", "400")];
            http.post(&url, &h, "{}").await
        }
    });
    // The claim is made and the upstream is at work: Redis stops taking writes for longer
    // than the store timeout (250 ms), so the completion's first try times out.
    up.wait_for_effects(1).await;
    let _: () = redis.cmd(&["CLIENT", "PAUSE", "1200", "WRITE"]);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let retry = post(&http, &gw, "/orders/paused", "paused").await;
    assert!(
        retry.replayed(),
        "the completion was never stored: {retry:?}"
    );
    assert_eq!(up.effects(), 1);
}
