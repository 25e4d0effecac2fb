//! `store.near_cache` on a real 3-master Redis Cluster: replays served from a local copy,
//! kept true by one BCAST tracking connection per master. Each test has a cluster of its
//! own: they kill tracking connections and move masters.

use std::time::Duration;

use dedupe_test_support::near_cache::{self, claims_sent, near, near_bytes, order, served_locally};
use dedupe_test_support::{
    eventually, move_slot, start_moving_slot, GatewayConfig, Http, RedisCluster, RedisServer,
    RouteCfg, StoreCfg, TestGateway, Upstream,
};

/// What the gateway's tracking connections call themselves in `CLIENT LIST`.
const TRACKING_NAME: &str = "dedupe-gateway-tracking";

fn config(up: &Upstream, cluster: &RedisCluster, window: &str) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(cluster.urls())
                .timeout("2s")
                .near_cache("1MiB"),
        )
        .admin()
        .route(RouteCfg::header("orders", "/orders/*").window(window))
}

fn masters(cluster: &RedisCluster) -> Vec<&RedisServer> {
    cluster.nodes.iter().collect()
}

/// The one node holding records (each test stores one key).
fn owner(cluster: &RedisCluster) -> &RedisServer {
    let owners: Vec<&RedisServer> = cluster
        .nodes
        .iter()
        .filter(|n| n.cmd::<i64>(&["DBSIZE"]) > 0)
        .collect();
    assert_eq!(owners.len(), 1, "one key, one owner");
    owners[0]
}

/// The ids of the gateway's tracking connections on `node`, from `CLIENT LIST`.
fn tracking_ids(node: &RedisServer) -> Vec<String> {
    let list: String = node.cmd(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("name={TRACKING_NAME}")))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_through_another_gateway_reaches_the_cache_on_a_cluster() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let b = TestGateway::start(&config(&up, &cluster, "1h")).await;
    // Every master reports writes to each gateway: one tracking connection per gateway.
    for n in &cluster.nodes {
        assert!(
            eventually(Duration::from_secs(5), || async {
                tracking_ids(n).len() == 2
            })
            .await,
            "node {}",
            n.port
        );
    }
    near_cache::a_delete_through_b_reaches_a(&up, &a, &b, &masters(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_never_outlives_its_window_on_a_cluster() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &cluster, "2s")).await;
    near_cache::a_copy_never_outlives_its_window(&up, &a, &masters(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tracking_connection_empties_the_cache() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let http = Http::new();
    let nodes = masters(&cluster);
    assert_eq!(order(&http, &a, "c").await, 201);
    assert!(served_locally(&http, &a, &nodes, "c").await);
    assert!(near_bytes(&http, &a).await > 0);

    let owner = owner(&cluster);
    let ids = tracking_ids(owner);
    assert_eq!(ids.len(), 1, "one tracking connection per master");
    let killed: i64 = owner.cmd(&["CLIENT", "KILL", "ID", &ids[0]]);
    assert_eq!(killed, 1);
    // The gateway empties the cache as the connection ends, before any request.
    assert!(
        eventually(Duration::from_secs(5), || async {
            near_bytes(&http, &a).await == 0
        })
        .await,
        "the copy outlived its invalidation channel"
    );
    // So the next replay reads the cluster (the claim script runs), a replay still.
    let (hits, calls) = (near(&http, &a, "hit").await, claims_sent(&nodes));
    assert_eq!(order(&http, &a, "c").await, 201);
    assert_eq!(near(&http, &a, "hit").await, hits);
    assert!(claims_sent(&nodes) > calls);
    assert_eq!(up.effects(), 1);
    // A new tracking connection replaces the killed one, and copies are served again.
    assert!(served_locally(&http, &a, &nodes, "c").await);
    assert_eq!(tracking_ids(owner).len(), 1);
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tracking_connection_empties_the_cache() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let http = Http::new();
    let nodes = masters(&cluster);
    assert_eq!(order(&http, &a, "s").await, 201);
    assert!(served_locally(&http, &a, &nodes, "s").await);
    let owner = owner(&cluster);
    // Every client of the owner, the tracking connection included, gets no reply for 4s:
    // the connection stays open, only silent. A round unanswered within max(timeout, 1s)
    // = 2s empties the cache, with no request to prompt it.
    let _: () = owner.cmd(&["CLIENT", "PAUSE", "4000", "ALL"]);
    assert!(
        eventually(Duration::from_secs(10), || async {
            near_bytes(&http, &a).await == 0
        })
        .await,
        "a copy outlived a silent invalidation channel"
    );
    // Once the master answers again (this PING waits out the pause) the gateway subscribes
    // again and serves copies.
    let pong: String = tokio::task::block_in_place(|| owner.cmd(&["PING"]));
    assert_eq!(pong, "PONG");
    assert!(served_locally(&http, &a, &nodes, "s").await);
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_empties_the_cache_and_the_new_master_is_tracked() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let b = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let http = Http::new();
    assert_eq!(order(&http, &a, "f").await, 201);
    assert!(served_locally(&http, &a, &masters(&cluster), "f").await);
    assert!(near_bytes(&http, &a).await > 0);

    let old = owner(&cluster);
    let new = tokio::task::block_in_place(|| cluster.fail_over_to_a_new_node(old));
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().chain([&new]).collect();
    // The master set changed: the copy goes, with no request to prompt it.
    assert!(
        eventually(Duration::from_secs(10), || async {
            near_bytes(&http, &a).await == 0
        })
        .await,
        "a copy outlived the failover of its master"
    );
    // The gateway tracks the new master, and serves copies again.
    assert!(
        eventually(Duration::from_secs(10), || async {
            tracking_ids(&new).len() == 2
        })
        .await,
        "the new master is never tracked"
    );
    assert!(served_locally(&http, &a, &nodes, "f").await);
    assert_eq!(up.effects(), 1);
    // A delete through B on the new master reaches A's cache.
    let deleted = http
        .send("DELETE", &b.admin_url("/keys/orders/f"), &[], "")
        .await
        .unwrap();
    assert!(deleted.status.is_success(), "{}", deleted.status);
    assert!(
        eventually(Duration::from_secs(5), || async {
            assert_eq!(order(&http, &a, "f").await, 201);
            up.effects() == 2
        })
        .await,
        "a delete on the new master never reached A's cache"
    );
}

/// A slot in migration to a master that owns no slots (here one emptied earlier, as a
/// rebalance does): `CLUSTER SLOTS` names the source only, but a key already moved lives
/// on the target (reached by `ASK`), and writes to it happen there. The target must be
/// tracked before a copy read there is kept: a delete through B on the target reaches
/// A's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_to_a_master_with_no_slots_is_tracked() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let a = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let b = TestGateway::start(&config(&up, &cluster, "1h")).await;
    let http = Http::new();
    assert_eq!(order(&http, &a, "g").await, 201);
    assert!(served_locally(&http, &a, &masters(&cluster), "g").await);

    let source = owner(&cluster);
    let keys: Vec<String> = source.cmd(&["KEYS", "*"]);
    let key = keys[0].clone();
    let slot: i64 = source.cmd(&["CLUSTER", "KEYSLOT", &key]);
    let slot = slot.to_string();
    let target = tokio::task::block_in_place(|| cluster.join_a_new_node(source));
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().chain([&target]).collect();
    // The target owns the slot for a while, then gives it back and owns no slots: the
    // gateways stop tracking it.
    tokio::task::block_in_place(|| move_slot(&nodes, &slot, &[&key], source, &target));
    assert!(served_locally(&http, &a, &nodes, "g").await);
    assert_eq!(order(&http, &b, "g").await, 201);
    tokio::task::block_in_place(|| move_slot(&nodes, &slot, &[&key], &target, source));
    assert!(
        eventually(Duration::from_secs(10), || async {
            tracking_ids(&target).is_empty()
        })
        .await,
        "a node with no slots is still tracked"
    );
    assert!(served_locally(&http, &a, &nodes, "g").await);

    // The slot starts moving to the target again, and the key is moved there.
    tokio::task::block_in_place(|| start_moving_slot(&slot, &[&key], source, &target));
    // A reads the record on the target (ASK) and serves it from its copy again.
    assert!(served_locally(&http, &a, &nodes, "g").await);
    assert_eq!(up.effects(), 1);

    let deleted = http
        .send("DELETE", &b.admin_url("/keys/orders/g"), &[], "")
        .await
        .unwrap();
    assert!(deleted.status.is_success(), "{}", deleted.status);
    let left: i64 = target.cmd(&["DBSIZE"]);
    assert_eq!(left, 0, "the delete ran on the target");
    assert!(
        eventually(Duration::from_secs(5), || async {
            assert_eq!(order(&http, &a, "g").await, 201);
            up.effects() == 2
        })
        .await,
        "a delete on the migration's target never reached A's cache"
    );
}
