//! Redis Sentinel with real processes (one primary, one replica, one sentinel): the store
//! contract on the primary the sentinel names, and a gateway that follows a failover
//! without a restart.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use dedupe_gateway::config::RedisAccess;
use dedupe_gateway::store::{RedisStore, Store};
use dedupe_test_support::{
    eventually, store_contract, GatewayConfig, Http, RedisServer, Reply, RouteCfg, SentinelGroup,
    StoreCfg, TestGateway, Upstream, MASTER_NAME,
};
use http::StatusCode;

/// The group the contract shares (its primary never fails), started by the first test
/// that asks; its processes end with the test binary.
fn shared_group() -> &'static SentinelGroup {
    static GROUP: OnceLock<SentinelGroup> = OnceLock::new();
    GROUP.get_or_init(SentinelGroup::start)
}

fn sentinel_store() -> (Store, ()) {
    let group = shared_group();
    let store = RedisStore::sentinel(
        &group.sentinel_urls(),
        MASTER_NAME,
        &RedisAccess::default(),
        Duration::from_secs(1),
    )
    .unwrap();
    (Store::Redis(store), ())
}

store_contract!(contract, sentinel_store);

async fn post(http: &Http, gw: &TestGateway, key: &str) -> Reply {
    http.post(&gw.url("/orders"), &[("Idempotency-Key", key)], "{}")
        .await
}

/// New keys until one is won (201) through the new primary, without restarting `gw`.
async fn wins_again(http: &Http, gw: &TestGateway) {
    let mut n = 0;
    let recovered = eventually(Duration::from_secs(15), || {
        n += 1;
        let key = format!("after-{n}");
        async move { post(http, gw, &key).await.status == StatusCode::CREATED }
    })
    .await;
    assert!(recovered, "no request won through the new primary");
}

/// A key is won once and replayed after, with one side effect.
async fn dedupes(http: &Http, gw: &TestGateway, up: &Upstream, key: &str) {
    let first = post(http, gw, key).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let again = post(http, gw, key).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert!(again.replayed(), "the retry of {key} was not a replay");
    assert_eq!(up.effects_per_key().get(key), Some(&1), "{key}");
}

/// The node a store check reports on, and whether any check is about its role.
async fn checked_node(store: &Store) -> (String, bool) {
    let findings = store.health_findings().await.unwrap();
    let role = findings.iter().any(|f| f.check == "role");
    // Persistence is off in the test servers: that finding names the node checked.
    let node = findings
        .iter()
        .find(|f| f.check == "persistence")
        .map(|f| f.node.clone())
        .unwrap_or_default();
    (node, role)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_follows_a_failover_without_a_restart() {
    let group = SentinelGroup::start();
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::sentinel(group.sentinel_urls(), MASTER_NAME).timeout("250ms"))
        .default_lease("5s")
        .default_window("1h")
        .route(RouteCfg::header("orders", "/orders"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();

    dedupes(&http, &gw, &up, "before-1").await;
    dedupes(&http, &gw, &up, "before-2").await;
    // Store checks read the primary the sentinel named, and find it a primary.
    let (node, role) = checked_node(gw.gateway.store()).await;
    assert_eq!(node, format!("127.0.0.1:{}", group.primary.port));
    assert!(!role, "the sentinel's primary was flagged as a replica");

    let mut group = group;
    group.primary.stop(); // SIGKILL
    group.wait_for_promotion(Duration::from_secs(30));

    // Requests during and after the failover: each key executes at most once, and a new
    // key is won again through the new primary, without restarting the gateway.
    wins_again(&http, &gw).await;
    let started = Instant::now();
    dedupes(&http, &gw, &up, "after-failover").await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let (node, role) = checked_node(gw.gateway.store()).await;
    assert_eq!(node, format!("127.0.0.1:{}", group.replica.port));
    assert!(!role, "the promoted primary was flagged as a replica");

    // A key completed before the failover may or may not have reached the replica
    // (replication is asynchronous): whatever it answers, it is one of a replay or one
    // more execution, never more than two in all.
    let _ = post(&http, &gw, "before-1").await;
    for (key, times) in up.effects_per_key() {
        let most = if key.starts_with("before-") { 2 } else { 1 };
        assert!(times <= most, "{key} executed {times} times");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left_for_the_promoted_one() {
    // A failover the sentinel is told to make: the old primary lives on as a replica.
    let group = SentinelGroup::start();
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::sentinel(group.sentinel_urls(), MASTER_NAME).timeout("250ms"))
        .route(RouteCfg::header("orders", "/orders"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    dedupes(&http, &gw, &up, "before").await;
    // The replica has every write so far: the record survives the failover. (`WAIT` on a
    // connection of its own proves nothing: that connection wrote nothing, so it returns
    // at once, and a loaded machine's replica was seen without the record.)
    assert!(replica_caught_up(&group), "the replica never caught up");

    group.force_failover();
    group.wait_for_promotion(Duration::from_secs(30));
    // The sentinel demotes the old primary after promoting the replica.
    let demoted = eventually(Duration::from_secs(15), || async {
        // Its reconfiguration kills client connections: one may fail.
        let info = group.primary.connection().and_then(|mut c| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c)
        });
        info.is_ok_and(|i| i.contains("role:slave"))
    })
    .await;
    assert!(demoted, "the old primary was never demoted");

    wins_again(&http, &gw).await;
    dedupes(&http, &gw, &up, "after-failover").await;
    // Acknowledged by the replica before the failover: the earlier key replays.
    let r = post(&http, &gw, "before").await;
    assert!(r.replayed(), "{}", r.text());
    for (key, times) in up.effects_per_key() {
        assert_eq!(times, 1, "{key}");
    }
}

/// Whether the replica's offset reaches the primary's offset of now, within 10 seconds.
fn replica_caught_up(group: &SentinelGroup) -> bool {
    let offset = |server: &RedisServer, field: &str| -> i64 {
        let info: String = server.cmd(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1)
    };
    let target = offset(&group.primary, "master_repl_offset:");
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if offset(&group.replica, "slave_repl_offset:") >= target {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
