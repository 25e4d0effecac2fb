//! Overload (issue 56): past what it can serve in time, the gateway refuses a keyed request
//! before its claim (503 `overloaded`, `Retry-After`), never after its upstream ran. About
//! a thousand clients on their own connections send fresh keys for a few seconds to a
//! gateway (the real binary) on a real redis-server, each retrying whatever was not a 2xx
//! with the same key, as `Retry-After` says, a bounded number of times; then every key
//! reached the counting upstream exactly once and was answered 2xx, nothing is unstored,
//! and every other answer was `overloaded` or a 409. Also the limit and the byte budget
//! one request at a time, and the same load while Redis is paused for a while.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use dedupe_gateway::telemetry::metrics::AdmissionLoad;
use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, Reply, RouteCfg, StoreCfg,
    TestGateway, Upstream,
};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

/// Clients, each on a connection of its own.
const CLIENTS: usize = 1_000;
/// How long clients start new keys.
const SEND_FOR: Duration = Duration::from_secs(5);
/// How often each client starts a new key: a thousand clients offer about 670 new keys a
/// second, more than a debug build of the gateway serves on a shared two-core machine (the
/// commit before issue 56 answered 247 of them `store-unavailable` here; at 2 s a key it
/// served them all).
const PACE: Duration = Duration::from_millis(1_500);
/// The most attempts a key gets (the first and its retries).
const ATTEMPTS: usize = 12;
const OVERLOADED: &str = "urn:dedupe-gateway:problem:overloaded";

/// One test of this file at a time: each is the load, or must not share the machine with
/// a thousand clients.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Raises this process's open-file limit to its hard limit: a thousand client connections
/// and the upstream's side of the gateway's connections all live here.
fn raise_open_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Up to a second (a fraction of a second, read as seconds), different for every call.
fn jitter() -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    Duration::from_millis(h.finish() % 1_000)
}

/// One answer as a client sees it.
struct Answer {
    status: u16,
    problem: Option<String>,
    retry_after: Option<u64>,
}

/// What one client saw.
#[derive(Default)]
struct Seen {
    /// Keys answered 2xx.
    done: Vec<String>,
    /// Keys that ran out of attempts, with their last answer.
    failed: Vec<(String, u16, Option<String>)>,
    first_attempts: u64,
    first_admitted: u64,
    /// Every answer that was not a 2xx, by status and problem type.
    refused: BTreeMap<(u16, String), u64>,
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    loop {
        if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
            let io = TokioIo::new(stream);
            if let Ok((sender, conn)) = hyper::client::conn::http1::handshake(io).await {
                tokio::spawn(conn);
                return sender;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends one keyed POST on the client's connection (a new one when it was closed).
async fn post(
    addr: SocketAddr,
    conn: &mut Option<SendRequest<Full<Bytes>>>,
    key: &str,
) -> Option<Answer> {
    if conn.as_ref().is_none_or(|c| c.is_closed()) {
        *conn = Some(connect(addr).await);
    }
    let sender = conn.as_mut()?;
    sender.ready().await.ok()?;
    let req = http::Request::post(format!("http://{addr}/orders/{key}"))
        .header("host", "gateway")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap();
    let resp = match sender.send_request(req).await {
        Ok(resp) => resp,
        Err(_) => {
            *conn = None;
            return None;
        }
    };
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    if header("connection").is_some_and(|v| v == "close") {
        *conn = None;
    }
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    let problem = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned));
    Some(Answer {
        status,
        problem,
        retry_after,
    })
}

/// One client: a new key every [`PACE`] (starting somewhere in the first) until `until`,
/// each retried as its answers say.
async fn client(addr: SocketAddr, id: usize, until: Instant) -> Seen {
    let mut seen = Seen::default();
    let mut conn = None;
    let mut n = 0;
    tokio::time::sleep(PACE.mul_f64(jitter().as_secs_f64())).await;
    while Instant::now() < until {
        let next = Instant::now() + PACE;
        let key = format!("c{id}-{n}");
        n += 1;
        let mut last = (0, None);
        for attempt in 0..ATTEMPTS {
            let answer = post(addr, &mut conn, &key).await;
            let Some(answer) = answer else {
                // The connection broke before an answer: the request was never taken
                // (a connection refused or reset), or the gateway's answer was lost;
                // either way the same key is safe to send again.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            if attempt == 0 {
                seen.first_attempts += 1;
                let shed = answer.problem.as_deref() == Some(OVERLOADED);
                seen.first_admitted += u64::from(!shed);
            }
            if (200..300).contains(&answer.status) {
                seen.done.push(key.clone());
                last = (answer.status, None);
                break;
            }
            let problem = answer.problem.clone().unwrap_or_default();
            *seen.refused.entry((answer.status, problem)).or_default() += 1;
            last = (answer.status, answer.problem);
            // As `Retry-After` says, and up to a second more: clients told the same thing at
            // the same moment must not all come back in the same instant (docs/clients.md:
            // "with backoff").
            let wait = Duration::from_secs(answer.retry_after.unwrap_or(1).clamp(1, 3));
            tokio::time::sleep(wait + jitter()).await;
        }
        if last.0 < 200 || last.0 >= 300 {
            seen.failed.push((key, last.0, last.1));
        }
        tokio::time::sleep_until(next).await;
    }
    seen
}

/// Every client's tally, summed.
#[derive(Debug, Default)]
struct Load {
    done: Vec<String>,
    failed: Vec<(String, u16, Option<String>)>,
    first_attempts: u64,
    first_admitted: u64,
    refused: BTreeMap<(u16, String), u64>,
}

async fn run_load(addr: SocketAddr) -> Load {
    let until = Instant::now() + SEND_FOR;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(addr, id, until)))
        .collect();
    let mut load = Load::default();
    for t in tasks {
        let seen = t.await.unwrap();
        load.done.extend(seen.done);
        load.failed.extend(seen.failed);
        load.first_attempts += seen.first_attempts;
        load.first_admitted += seen.first_admitted;
        for (k, v) in seen.refused {
            *load.refused.entry(k).or_default() += v;
        }
    }
    load
}

fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Unstored completions and store errors on the route, and refusals before the claim.
async fn counted(gw: &GatewayProcess) -> (f64, f64, f64) {
    let text = Http::new().get(&gw.admin_url("/metrics"), &[]).await.text();
    (
        sample(
            &text,
            r#"dedupe_requests_total{route="orders",outcome="unstored"}"#,
        ),
        sample(
            &text,
            r#"dedupe_requests_total{route="orders",outcome="store_error"}"#,
        ),
        sample(&text, r#"dedupe_claim_events_total{event="overloaded"}"#),
    )
}

/// Each key answered 2xx and executed exactly once upstream; no key failed.
fn assert_each_key_once(load: &Load, up: &Upstream) {
    assert!(
        load.failed.is_empty(),
        "keys never answered 2xx: {:?} of {load:?}",
        &load.failed[..load.failed.len().min(20)]
    );
    let per_key = up.effects_per_key();
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "keys executed more than once: {twice:?}");
    assert_eq!(per_key.len(), load.done.len(), "{load:?}");
    assert!(load.done.iter().all(|k| per_key.contains_key(k.as_str())));
}

/// A gateway on `redis` with the Redis suite's store timeout (`Backend::start_store`):
/// this runs on a shared two-core machine beside its own thousand clients.
fn gateway_on(redis: &RedisServer, up: &Upstream, route: RouteCfg) -> GatewayProcess {
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::redis(redis.url()).timeout("500ms"))
        .admin()
        .route(route);
    GatewayProcess::start(&config)
}

// A load test: the tests of this file run one at a time (`ONE_AT_A_TIME`), and cargo runs
// one test binary at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_get_each_key_executed_once_and_refusals_only_before_the_claim() {
    let _serial = ONE_AT_A_TIME.lock().await;
    raise_open_files();
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = gateway_on(&redis, &up, RouteCfg::header("orders", "/orders/*"));
    let load = run_load(gw.addr).await;
    eprintln!(
        "{} keys; first attempts admitted {} of {}; refused {:?}",
        load.done.len(),
        load.first_admitted,
        load.first_attempts,
        load.refused
    );
    assert_each_key_once(&load, &up);
    let (unstored, store_errors, overloaded) = counted(&gw).await;
    assert_eq!((unstored, store_errors), (0.0, 0.0), "{load:?}");
    let others: Vec<_> = load
        .refused
        .keys()
        .filter(|(status, problem)| !(*status == 409 || problem == OVERLOADED))
        .collect();
    assert!(
        others.is_empty(),
        "answers neither overloaded nor 409: {others:?}"
    );
    let shed: u64 = load
        .refused
        .iter()
        .filter(|((_, p), _)| p == OVERLOADED)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(overloaded, shed as f64, "each refusal counted once");
    // At least half: a limit that refuses what it could serve fails here (an earlier
    // version of the limit, cut by its gradient alone, admitted 17% to 31%).
    assert!(
        load.first_admitted * 2 >= load.first_attempts,
        "fewer than half of the first attempts admitted: {load:?}"
    );
}

// A load test: the tests of this file run one at a time (`ONE_AT_A_TIME`), and cargo runs
// one test binary at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_paused_for_less_than_a_lease_completions_land_and_each_key_runs_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    raise_open_files();
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let route = RouteCfg::header("orders", "/orders/*").lease("3s");
    let gw = gateway_on(&redis, &up, route);
    let load = tokio::spawn(run_load(gw.addr));
    tokio::time::sleep(SEND_FOR / 3).await;
    // Every command waits a second, writes and reads alike: claims, renewals and the
    // completions of calls the upstream has already answered.
    let _: () = redis.cmd(&["CLIENT", "PAUSE", "1000", "ALL"]);
    let load = load.await.unwrap();
    eprintln!("{} keys; refused {:?}", load.done.len(), load.refused);
    assert_each_key_once(&load, &up);
    let (unstored, _, _) = counted(&gw).await;
    assert_eq!(unstored, 0.0, "{load:?}");
}

/// A POST to `/orders/{key}` with its key, sent on a task of its own.
fn send(http: &Http, gw: &TestGateway, key: &'static str) -> tokio::task::JoinHandle<Reply> {
    let (http, url) = (http.clone(), gw.url(&format!("/orders/{key}")));
    tokio::spawn(async move { http.post(&url, &[("Idempotency-Key", key)], "{}").await })
}

/// Whether the in-process gateway's admission comes to `holds` within a few seconds.
async fn admission_comes_to(gw: &TestGateway, holds: impl Fn(AdmissionLoad) -> bool) -> bool {
    eventually(Duration::from_secs(9), || async {
        holds(gw.gateway.admission_load())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_a_request_is_refused_before_its_claim() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::redis(redis.url()).timeout("10s"))
        .max_concurrent_claims(1)
        .route(RouteCfg::header("orders", "/orders/*"));
    // In this process: its admission is read directly, as a scrape would wait on a ping
    // queued behind the paused claim on the same connection.
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    // The one place is taken by a claim Redis holds unanswered for a while.
    let _: () = redis.cmd(&["CLIENT", "PAUSE", "10000", "WRITE"]);
    let first = send(&http, &gw, "first");
    let claiming = admission_comes_to(&gw, |load| load.claiming == 1).await;
    assert!(claiming, "the first claim never waited on Redis");
    // The second waits for a place (`server.admission_timeout`, 1 s) and gets none.
    let second = send(&http, &gw, "second");
    let waited = admission_comes_to(&gw, |load| load.waiting == 1).await;
    assert!(waited, "the second request never waited for a place");
    let refused = second.await.unwrap();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.problem_type(), OVERLOADED);
    assert_eq!(refused.headers["retry-after"], "1");
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "{first:?}");
    // The refused key was never claimed nor sent upstream; its retry is a first attempt.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*second*"]);
    assert!(keys.is_empty(), "{keys:?}");
    assert_eq!(up.effects_per_key().get("second"), None);
    let retried = http
        .post(
            &gw.url("/orders/second"),
            &[("Idempotency-Key", "second")],
            "{}",
        )
        .await;
    assert_eq!(retried.status, 201, "{retried:?}");
    assert_eq!(up.effects(), 2);
    let text = gw.gateway.metrics().encode();
    let overloaded = sample(&text, r#"dedupe_claim_events_total{event="overloaded"}"#);
    assert_eq!(overloaded, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_limit_a_request_waits_for_a_place_and_is_claimed_when_one_is_given_back() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::redis(redis.url()).timeout("10s"))
        .max_concurrent_claims(1)
        .admission_timeout("30s")
        .route(RouteCfg::header("orders", "/orders/*"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    let _: () = redis.cmd(&["CLIENT", "PAUSE", "3000", "WRITE"]);
    let first = send(&http, &gw, "first");
    let claiming = admission_comes_to(&gw, |load| load.claiming == 1).await;
    assert!(claiming, "the first claim never waited on Redis");
    let second = send(&http, &gw, "second");
    let waited = admission_comes_to(&gw, |load| load.waiting == 1).await;
    assert!(waited, "the second request never waited for a place");
    // Redis answers again: the first's place goes to the second.
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(second.status, 201, "{second:?}");
    assert_eq!(up.effects(), 2);
    let load = gw.gateway.admission_load();
    assert_eq!((load.claiming, load.waiting), (0, 0));
    let text = gw.gateway.metrics().encode();
    let overloaded = sample(&text, r#"dedupe_claim_events_total{event="overloaded"}"#);
    assert_eq!(overloaded, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_byte_budget_a_request_is_refused_before_its_claim() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    // Room for one answer of 600 KiB beside small bodies; not for two.
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::redis(redis.url()))
        .max_buffered_bytes("1MiB")
        .admin()
        .route(RouteCfg::header("orders", "/orders/*").max_cached_body("600KiB"));
    let gw = GatewayProcess::start(&config);
    let http = Http::new();
    let slow = tokio::spawn({
        let (http, url) = (http.clone(), gw.url("/orders/slow"));
        async move {
            let headers = [("Idempotency-Key", "slow"), ("x-test-delay-ms", "1500")];
            http.post(&url, &headers, "{}").await
        }
    });
    up.wait_for_effects(1).await;
    let refused = http
        .post(
            &gw.url("/orders/next"),
            &[("Idempotency-Key", "next")],
            "{}",
        )
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.problem_type(), OVERLOADED);
    // A body larger than what is left is refused while it is read.
    let big = "x".repeat(700 * 1024);
    let refused = http
        .post(&gw.url("/orders/big"), &[("Idempotency-Key", "big")], &big)
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(slow.await.unwrap().status, 201);
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys.len(), 1, "only the admitted key was claimed: {keys:?}");
    assert_eq!(up.effects(), 1);
    let metrics = gw.admin_url("/metrics");
    let given_back = eventually(Duration::from_secs(5), || async {
        sample(
            &http.get(&metrics, &[]).await.text(),
            "dedupe_buffered_bytes",
        ) == 0.0
    })
    .await;
    assert!(given_back, "bytes still held once every request ended");
    // Once the slow one is over, the budget admits again.
    let next = http
        .post(
            &gw.url("/orders/next"),
            &[("Idempotency-Key", "next")],
            "{}",
        )
        .await;
    assert_eq!(next.status, 201, "{next:?}");
}
