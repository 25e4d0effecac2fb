//! A slot moving to a master that just joined the cluster and has never run the gateway's
//! scripts: claims and replays of keys in that slot succeed while the slot migrates
//! (reached through `ASK`) and once it has moved (`MOVED`), each executing upstream
//! exactly once. Each test has a cluster of its own: it adds a node and moves a slot.

use dedupe_gateway::protocol::key::store_key;
use dedupe_test_support::{
    move_slot, slot_of, start_moving_slot, GatewayConfig, Http, RedisCluster, RedisServer, Reply,
    RouteCfg, StoreCfg, TestGateway, Upstream,
};

const PREFIX: &str = "reshard";

fn config(up: &Upstream, cluster: &RedisCluster) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(cluster.urls())
                .timeout("2s")
                .prefix(PREFIX),
        )
        .route(RouteCfg::header("orders", "/orders"))
}

/// The store key of `/orders` with `Idempotency-Key: key` (the route has no scope).
fn record_of(key: &str) -> String {
    store_key(PREFIX, "orders", "-", key).as_str().to_owned()
}

/// An idempotency key not used before whose record falls in `slot`.
fn new_key_in(slot: u16, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|k| slot_of(&record_of(k)) == slot)
        .expect("some key falls in every slot")
}

async fn order(http: &Http, gw: &TestGateway, key: &str) -> Reply {
    http.post(&gw.url("/orders"), &[("Idempotency-Key", key)], "{}")
        .await
}

/// `EVAL` calls `node` ran: only the fallback for a node lacking a script sends one.
fn evals(node: &RedisServer) -> u64 {
    node.command_calls().get("eval").copied().unwrap_or(0)
}

/// Whether `node` stores `record` (`KEYS`: no redirect, whatever the slot's state).
fn holds(node: &RedisServer, record: &str) -> bool {
    node.cmd::<Vec<String>>(&["KEYS", record]).len() == 1
}

/// The master holding `record`, and its slot (checked against the server's own
/// `CLUSTER KEYSLOT`, so a wrong local computation fails here).
fn owner_of<'a>(cluster: &'a RedisCluster, record: &str) -> (&'a RedisServer, u16) {
    let slot = slot_of(record);
    let told: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", record]);
    assert_eq!(i64::from(slot), told);
    let owner = cluster
        .nodes
        .iter()
        .find(|n| holds(n, record))
        .expect("the record is stored");
    (owner, slot)
}

/// Stores the key `old` through `gw`, then joins a fourth master that has never run a
/// script: `old`'s record, the master holding it and its slot, and the new node.
async fn old_key_and_a_new_node<'a>(
    cluster: &'a RedisCluster,
    http: &Http,
    gw: &TestGateway,
) -> (String, &'a RedisServer, u16, RedisServer) {
    let first = order(http, gw, "old").await;
    assert_eq!(first.status, 201, "{}", first.text());
    let old = record_of("old");
    let (source, slot) = owner_of(cluster, &old);
    let target = tokio::task::block_in_place(|| cluster.join_a_new_node(source));
    (old, source, slot, target)
}

/// A new key and a replay, each on a node with no script cached, while the slot migrates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_succeed_on_a_slot_migrating_to_a_new_master() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(&up, &cluster)).await;
    let http = Http::new();
    let (old, source, slot, target) = old_key_and_a_new_node(&cluster, &http, &gw).await;

    // Migrating, no key moved yet: a new key in the slot is missing on the source, so the
    // source answers `ASK` and the record is created on the target.
    let slot_arg = slot.to_string();
    tokio::task::block_in_place(|| start_moving_slot(&slot_arg, &[], source, &target));
    let fresh = new_key_in(slot, "fresh");
    let r = order(&http, &gw, &fresh).await;
    assert_eq!(r.status, 201, "a new key on a migrating slot: {}", r.text());
    assert!(!r.replayed());
    assert_eq!(up.effects(), 2);
    assert!(
        holds(&target, &record_of(&fresh)),
        "the claim ran on the target"
    );
    assert!(evals(&target) >= 1, "the target never lacked the script");
    let r = order(&http, &gw, &fresh).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.replayed());

    // The old record moves too; the target forgets its scripts (as a restart would), and
    // the replay of the old key reads it there through `ASK`.
    tokio::task::block_in_place(|| start_moving_slot(&slot_arg, &[&old], source, &target));
    let _: () = target.cmd(&["SCRIPT", "FLUSH"]);
    let evals_before = evals(&target);
    let r = order(&http, &gw, "old").await;
    assert_eq!(r.status, 201, "a replay on a migrating slot: {}", r.text());
    assert!(r.replayed());
    assert!(
        evals(&target) > evals_before,
        "the replay never met NOSCRIPT"
    );
    assert_eq!(up.effects(), 2, "replays execute nothing");
}

/// A large answer on a migrating slot: the claim and its staged completion are each a
/// `MULTI`, which the source discards (it answers `ASK` for a key it lacks, and the redis
/// crate follows no redirect inside a transaction). Each then runs as one script, which
/// follows `ASK`: a new key with a large answer executes once and replays whole, and a
/// record that moved replays. No staged key is left on either node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_is_claimed_and_completed_on_a_migrating_slot() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(&up, &cluster)).await;
    let http = Http::new();
    let (old, source, slot, target) = old_key_and_a_new_node(&cluster, &http, &gw).await;
    let slot_arg = slot.to_string();
    tokio::task::block_in_place(|| start_moving_slot(&slot_arg, &[], source, &target));
    let fresh = new_key_in(slot, "fresh");
    let large = |key: &str| {
        let (url, key) = (gw.url("/orders"), key.to_owned());
        let http = http.clone();
        async move {
            let headers = [
                ("Idempotency-Key", key.as_str()),
                ("x-test-body-bytes", "16000"),
            ];
            http.post(&url, &headers, "{}").await
        }
    };
    let first = large(&fresh).await;
    assert_eq!(
        first.status,
        201,
        "a new key on a migrating slot: {}",
        first.text()
    );
    assert_eq!(first.body.len(), 16_000);
    assert!(
        holds(&target, &record_of(&fresh)),
        "the claim ran on the target"
    );
    let again = large(&fresh).await;
    assert_eq!(again.status, 201, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);

    tokio::task::block_in_place(|| start_moving_slot(&slot_arg, &[&old], source, &target));
    let r = order(&http, &gw, "old").await;
    assert_eq!(r.status, 201, "a replay on a migrating slot: {}", r.text());
    assert!(r.replayed());
    assert_eq!(up.effects(), 2, "one execution per key");
    for node in [source, &target] {
        let staged: Vec<String> = node.cmd(&["KEYS", "*~*"]);
        assert!(staged.is_empty(), "{staged:?}");
    }
}

/// A new key and a replay on a slot that has moved to a new master (`MOVED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_succeed_on_a_slot_moved_to_a_new_master() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(&up, &cluster)).await;
    let http = Http::new();
    let (old, source, slot, target) = old_key_and_a_new_node(&cluster, &http, &gw).await;
    let every: Vec<&RedisServer> = cluster.nodes.iter().chain([&target]).collect();
    let slot_arg = slot.to_string();
    tokio::task::block_in_place(|| move_slot(&every, &slot_arg, &[&old], source, &target));

    let r = order(&http, &gw, "old").await;
    assert_eq!(r.status, 201, "a replay on a moved slot: {}", r.text());
    assert!(r.replayed());
    assert!(evals(&target) >= 1, "the target never lacked the script");

    let _: () = target.cmd(&["SCRIPT", "FLUSH"]);
    let evals_before = evals(&target);
    let fresh = new_key_in(slot, "fresh");
    let r = order(&http, &gw, &fresh).await;
    assert_eq!(r.status, 201, "a new key on a moved slot: {}", r.text());
    assert!(!r.replayed());
    assert!(
        evals(&target) > evals_before,
        "the claim never met NOSCRIPT"
    );
    let r = order(&http, &gw, &fresh).await;
    assert!(r.replayed(), "{}", r.text());
    assert_eq!(up.effects(), 2, "one execution per key");
}

/// An ordered route's scripts take two keys in one slot (the record and its entity's
/// order record, under the entity's hash tag). Both moved to a new master mid-migration:
/// a replay reads them there through `ASK` (`ASKING`, then the script with both keys); a
/// new version, whose record exists on neither node, waits out the migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_route_follows_ask_with_both_keys() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(cluster.urls())
                .timeout("2s")
                .prefix(PREFIX),
        )
        .route(RouteCfg::header("events", "/events").order("json:/id", "json:/version", "integer"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    let event = |key: &'static str, version: u32| {
        let (http, url) = (http.clone(), gw.url("/events"));
        async move {
            let body = format!(r#"{{"id":7,"version":{version}}}"#);
            http.post(&url, &[("Idempotency-Key", key)], &body).await
        }
    };
    let r = event("v1", 1).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let source = cluster
        .nodes
        .iter()
        .find(|n| !n.cmd::<Vec<String>>(&["KEYS", "reshard:*"]).is_empty())
        .expect("the records are stored");
    let keys: Vec<String> = source.cmd(&["KEYS", "reshard:*"]);
    assert_eq!(keys.len(), 2, "the record and the entity's: {keys:?}");
    let slot = slot_of(&keys[0]);
    assert_eq!(slot, slot_of(&keys[1]), "one slot");
    let target = tokio::task::block_in_place(|| cluster.join_a_new_node(source));
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let slot_arg = slot.to_string();
    tokio::task::block_in_place(|| start_moving_slot(&slot_arg, &keys, source, &target));

    let r = event("v1", 1).await;
    assert_eq!(r.status, 201, "a replay of two moved keys: {}", r.text());
    assert!(r.replayed());
    assert!(evals(&target) >= 1, "the target never lacked the script");
    assert_eq!(up.effects(), 1);

    // A new version: the entity's record is on the target, the new record on neither, so
    // the target answers `TRYAGAIN` until the migration ends. The cluster client sends it
    // again after at least 1.28s (twice at most), within `store.timeout` here; by then the
    // slot is the target's and the claim runs there.
    let finish = std::thread::spawn({
        let (slot, target_id) = (slot_arg.clone(), target.cmd::<String>(&["CLUSTER", "MYID"]));
        let ports: Vec<u16> = cluster
            .nodes
            .iter()
            .map(|n| n.port)
            .chain([target.port])
            .collect();
        move || {
            std::thread::sleep(std::time::Duration::from_millis(600));
            for port in ports {
                let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let _: () = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(&slot)
                    .arg("NODE")
                    .arg(&target_id)
                    .query(&mut c)
                    .unwrap();
            }
        }
    });
    let r = event("v2", 2).await;
    finish.join().unwrap();
    assert_eq!(
        r.status,
        201,
        "a new version during migration: {}",
        r.text()
    );
    assert!(!r.replayed());
    assert!(
        try_again(&target) > 0,
        "the claim never met TRYAGAIN (the migration ended first)"
    );
    assert_eq!(up.effects(), 2);
    let r = event("v1", 1).await;
    assert!(r.replayed(), "{}", r.text());
    assert_eq!(up.effects(), 2);
}

/// `TRYAGAIN` errors `node` answered, from `INFO errorstats`.
fn try_again(node: &RedisServer) -> u64 {
    let info: String = node.cmd(&["INFO", "errorstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
