//! The gateway's own connection to a plaintext Redis: an ACL user and a database number
//! from the URL, a wrong password refused with a clear error that never shows the secret.
//! (Faults on that connection, `CLIENT KILL`, `CLIENT PAUSE`, SIGSTOP, restarts, are in
//! `redis_faults.rs` and `redis_ops.rs`: every plaintext store there uses it.)

use std::time::Duration;

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg, Upstream,
};
use http::StatusCode;

fn config(up: &Upstream, url: String) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(StoreCfg::redis(url).timeout("1s"))
        .admin()
        .route(RouteCfg::header("orders", "/orders/*"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_and_a_database_from_the_url() {
    let redis = RedisServer::start();
    let _: String = redis.cmd(&["ACL", "SETUSER", "app", "on", ">s3cret-pw", "~*", "+@all"]);
    let _: String = redis.cmd(&["ACL", "SETUSER", "default", "off"]);
    let up = Upstream::start().await;
    let http = Http::new();

    let wrong = GatewayProcess::start(&config(
        &up,
        format!("redis://app:wrong-pw@127.0.0.1:{}/3", redis.port),
    ));
    wrong.wait_logged("cannot reach Redis").await;
    let ready = http.get(&wrong.admin_url("/readyz"), &[]).await.status;
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE);
    wrong.assert_logged_without("Password authentication failed", "wrong-pw");
    let r = http
        .post(&wrong.url("/orders/a"), &[("Idempotency-Key", "a")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(up.effects(), 0, "fail-closed: nothing forwarded");
    drop(wrong);

    let gw = GatewayProcess::start(&config(
        &up,
        format!("redis://app:s3cret-pw@127.0.0.1:{}/3", redis.port),
    ));
    assert!(
        eventually(Duration::from_secs(5), || async {
            http.get(&gw.admin_url("/readyz"), &[]).await.status == StatusCode::OK
        })
        .await
    );
    let url = gw.url("/orders/db-3");
    let first = http.post(&url, &[("Idempotency-Key", "db-3")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let second = http.post(&url, &[("Idempotency-Key", "db-3")], "{}").await;
    assert!(second.replayed(), "{second:?}");
    assert_eq!(second.body, first.body);
    assert_eq!(up.effects(), 1);

    // The record is in database 3, and only there.
    let mut c = redis::Client::open(format!("redis://app:s3cret-pw@127.0.0.1:{}/3", redis.port))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    let in_3: Vec<String> = redis::cmd("KEYS").arg("*db-3*").query(&mut c).unwrap();
    assert_eq!(in_3.len(), 1, "{in_3:?}");
    redis::cmd("SELECT").arg(0).exec(&mut c).unwrap();
    let in_0: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(in_0.is_empty(), "{in_0:?}");
    assert!(!gw.log_lines().iter().any(|l| l.contains("s3cret-pw")));
}

/// A reply the gateway cannot read (here a line no RESP reply starts with, put before the
/// claim's reply by a proxy): the connection is dropped, the claim is sent once more on a
/// fresh one within the same deadline, and the request succeeds, executed once. The claim
/// that ran before the garbled reply is its own: the same claimant wins it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_reply_drops_the_connection_and_the_claim_is_sent_again() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let up = Upstream::start().await;
    let http = Http::new();
    let gw = GatewayProcess::start(&config(&up, proxy.redis_url()));
    let post = |key: &'static str| {
        let (http, url) = (http.clone(), gw.url(&format!("/orders/{key}")));
        async move { http.post(&url, &[("Idempotency-Key", key)], "{}").await }
    };
    assert_eq!(post("before").await.status, StatusCode::CREATED);
    let dialled = proxy.accepted();

    proxy.garble_replies();
    let r = post("garbled").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert!(!r.replayed(), "{r:?}");
    assert_eq!(up.effects(), 2, "one effect per key");
    assert!(proxy.accepted() > dialled, "no new connection was dialled");
    gw.wait_logged("the Redis connection was closed; dialling again")
        .await;
    let again = post("garbled").await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, r.body);
    assert_eq!(up.effects(), 2);
}

/// The Redis connections of everything but the asking client, by id (sorted: `CLIENT
/// LIST` keeps no order).
fn gateway_clients(redis: &RedisServer) -> Vec<String> {
    let mut ids = redis.other_client_ids();
    ids.sort();
    ids
}

/// The ids of the clients named `name`.
fn ids_named(redis: &RedisServer, name: &str) -> Vec<String> {
    let clients = redis.clients_named(name).into_iter();
    clients.filter_map(|mut c| c.remove("id")).collect()
}

/// `n` requests, each with a fresh key (`name-i`) on a client of its own: each a new
/// connection, dealt to the workers in turn. Every one must be won, not replayed.
async fn fresh_keys_on_fresh_connections(url: &str, name: &str, n: usize) {
    for i in 0..n {
        let key = format!("{name}-{i}");
        let r = Http::new()
            .post(url, &[("Idempotency-Key", key.as_str())], "{}")
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{key}: {}", r.text());
        assert!(!r.replayed(), "{key}: {r:?}");
    }
}

/// With connection workers, each worker has Redis connections of its own (one for claims,
/// one for leases) besides the main two, and a connection killed under one worker is
/// replaced by that worker without failing its next request: every request, whichever
/// worker serves it, is executed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_has_its_own_connection_and_each_is_replaced_on_its_own() {
    const WORKERS: usize = 3;
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(&up, redis.url()).workers(WORKERS));
    assert!(becomes_ready(&gw).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            gateway_clients(&redis).len() == 2 * (WORKERS + 1)
        })
        .await,
        "two connections per worker and the main two: {:?}",
        gateway_clients(&redis)
    );
    let before = gateway_clients(&redis);
    let url = gw.url("/orders/w");
    let round = |name: &'static str| fresh_keys_on_fresh_connections(&url, name, 2 * WORKERS);
    round("first").await;
    assert_eq!(up.effects(), 2 * WORKERS as u64);
    assert_eq!(gateway_clients(&redis), before, "no connection was added");

    let _: () = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    round("after-kill").await;
    assert_eq!(up.effects(), 4 * WORKERS as u64, "one effect per key");
    let after = gateway_clients(&redis);
    assert!(
        before.iter().all(|id| !after.contains(id)),
        "a killed connection is still listed: {before:?} {after:?}"
    );
    // Every worker dialled both again; the main connections are dialled again when they
    // are next asked for (readiness, the admin port), which may not have happened yet.
    assert!(
        (2 * WORKERS..=2 * (WORKERS + 1)).contains(&after.len()),
        "{after:?}"
    );
    // Every key is stored once: a retry through any worker replays it.
    let again = Http::new()
        .post(
            &gw.url("/orders/w"),
            &[("Idempotency-Key", "first-0")],
            "{}",
        )
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(up.effects(), 4 * WORKERS as u64);
}

/// Readiness asks every connection. One worker's connection killed by id while Redis has
/// no room for another client (`maxclients`): that worker cannot dial again, the log says
/// which connection and why, and the gateway is not ready though the main connection
/// answers. Once there is room, that worker alone dials again: the others' connections
/// stay, and every worker wins new keys, one effect each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refused_a_connection_is_not_ready_and_alone_dials_again() {
    const WORKERS: usize = 3;
    let redis = RedisServer::start();
    let _: String = redis.cmd(&["ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all"]);
    // The harness's own connection, kept: with every slot taken, a new one is refused.
    let mut harness = redis::Client::open(redis.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    let harness_id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut harness).unwrap();
    let up = Upstream::start().await;
    let url = format!("redis://app:app-pw@127.0.0.1:{}", redis.port);
    let gw = GatewayProcess::start(&config(&up, url).workers(WORKERS));
    assert!(becomes_ready(&gw).await);
    let orders = gw.url("/orders/r");
    fresh_keys_on_fresh_connections(&orders, "before", 2 * WORKERS).await;
    let before: Vec<String> = gateway_clients(&redis)
        .into_iter()
        .filter(|id| *id != harness_id.to_string())
        .collect();
    assert_eq!(before.len(), 2 * (WORKERS + 1), "{before:?}");
    // A worker's: its last command was one of the round's claims or completions (a
    // script, or a transaction), which the main connection never sends.
    let list: String = redis.cmd(&["CLIENT", "LIST"]);
    let killed = list
        .lines()
        .filter(|l| {
            ["cmd=evalsha", "cmd=eval ", "cmd=exec", "cmd=set "]
                .iter()
                .any(|c| l.contains(c))
        })
        .find_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .expect("a worker's connection")
        .to_owned();
    let config_set = |harness: &mut redis::Connection, n: &str| {
        redis::cmd("CONFIG")
            .arg(&["SET", "maxclients", n][..])
            .exec(harness)
            .unwrap()
    };
    let _: () = redis::cmd("CLIENT")
        .arg(&["KILL", "ID", killed.as_str()][..])
        .query(&mut harness)
        .unwrap();
    // Room for the harness and the gateway's connections still open, no more.
    config_set(&mut harness, &(1 + 2 * (WORKERS + 1) - 1).to_string());
    let refused_at = std::time::Instant::now();
    while refused_at.elapsed() < Duration::from_secs(2) {
        assert_eq!(readyz(&gw).await, StatusCode::SERVICE_UNAVAILABLE);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let why = gw
        .log_lines()
        .into_iter()
        .find(|l| l.contains("cannot reach Redis"))
        .expect("the refused dial is logged");
    assert!(why.contains(", worker "), "which connection: {why}");
    // Redis writes its refusal and closes: the crate's set-up reads the line, or meets the
    // close first (a reset, or a broken pipe when its own write crossed it).
    assert!(
        [
            "max number of clients reached",
            "reset by peer",
            "broken pipe"
        ]
        .iter()
        .any(|w| why.contains(w)),
        "why: {why}"
    );
    config_set(&mut harness, "10000");
    assert!(becomes_ready(&gw).await, "never ready once Redis had room");
    fresh_keys_on_fresh_connections(&orders, "after", 2 * WORKERS).await;
    assert_eq!(up.effects(), 4 * WORKERS as u64, "one effect per key");
    let after = gateway_clients(&redis);
    assert!(!after.contains(&killed), "{after:?}");
    for id in before.iter().filter(|id| **id != killed) {
        assert!(
            after.contains(id),
            "{id} was not killed, yet replaced: {after:?}"
        );
    }
}

/// A Redis frozen by SIGSTOP (TCP up, nothing answered): every worker's requests fail
/// closed within two store timeouts (and a loaded machine's slack), each worker's silent connection is probed and
/// dropped on its own, and after SIGCONT every worker wins new keys again. The upstream
/// runs exactly the requests that were answered 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_fails_every_worker_fast_and_each_connection_is_replaced() {
    const WORKERS: usize = 2;
    const TIMEOUT_MS: u64 = 250;
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(redis.url()).timeout(&format!("{TIMEOUT_MS}ms")))
            .admin()
            .workers(WORKERS)
            .route(RouteCfg::header("orders", "/orders/*")),
    );
    assert!(becomes_ready(&gw).await);
    let url = gw.url("/orders/f");
    fresh_keys_on_fresh_connections(&url, "warm", 2 * WORKERS).await;
    let before = redis.other_client_ids();
    assert_eq!(before.len(), 2 * (WORKERS + 1), "{before:?}");
    let claims_before = ids_named(&redis, "dedupe-gateway-claims");
    assert_eq!(claims_before.len(), WORKERS + 1, "{claims_before:?}");
    {
        let _frozen = redis.freeze();
        // Longer than a probe's patience (1s), and every worker asked twice: each
        // worker's connection is given up on.
        let frozen_at = std::time::Instant::now();
        let mut n = 0;
        while n < 2 * WORKERS || frozen_at.elapsed() < Duration::from_secs(3) {
            let key = format!("frozen-{n}");
            n += 1;
            let started = std::time::Instant::now();
            let r = Http::new()
                .post(&url, &[("Idempotency-Key", key.as_str())], "{}")
                .await;
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
            let bound = Duration::from_millis(2 * TIMEOUT_MS + 1500);
            assert!(started.elapsed() < bound, "waited {:?}", started.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(readyz(&gw).await, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(
        up.effects(),
        2 * WORKERS as u64,
        "fail-closed forwards nothing"
    );
    // Back: a round in which every worker wins, within the bound of a replaced connection
    // (the probe's patience, then a dial; slack for a loaded machine).
    let won = rounds_until_every_worker_wins(&url, WORKERS, Duration::from_secs(5))
        .await
        .expect("a worker never won again after SIGCONT");
    assert_eq!(up.effects(), 2 * WORKERS as u64 + won, "one effect per 201");
    // Each worker's claims' connection was given up on and replaced; the main one, asked
    // once by readiness just before SIGCONT, may have been answered in time and kept (as
    // may each leases' connection, asked by nothing else).
    let after = redis.other_client_ids();
    let kept = claims_before.iter().filter(|id| after.contains(id)).count();
    assert!(
        kept <= 1,
        "silent connections were kept: {before:?} {after:?}"
    );
}

/// Rounds of `workers` fresh keys on fresh connections (one per worker) until a round is
/// won whole, within `within`: how many requests were won (201) in all, or `None`.
async fn rounds_until_every_worker_wins(
    url: &str,
    workers: usize,
    within: Duration,
) -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (won, round) = (AtomicU64::new(0), AtomicU64::new(0));
    let recovered = eventually(within, || async {
        let r = round.fetch_add(1, Ordering::SeqCst);
        let mut all = true;
        for i in 0..workers {
            let key = format!("back-{r}-{i}");
            let reply = Http::new()
                .post(url, &[("Idempotency-Key", key.as_str())], "{}")
                .await;
            if reply.status == StatusCode::CREATED {
                won.fetch_add(1, Ordering::SeqCst);
            } else {
                all = false;
            }
        }
        all
    })
    .await;
    recovered.then(|| won.load(Ordering::SeqCst))
}

/// `/readyz`'s status, asked on a connection of its own.
async fn readyz(gw: &GatewayProcess) -> StatusCode {
    Http::new().get(&gw.admin_url("/readyz"), &[]).await.status
}

/// Whether the gateway is ready within 5 s.
async fn becomes_ready(gw: &GatewayProcess) -> bool {
    eventually(Duration::from_secs(5), || async {
        readyz(gw).await == StatusCode::OK
    })
    .await
}
