//! A real 3-master Redis Cluster: the store contract, and storms through the gateway.
//!
//! The cluster starts once per test binary and every test shares it, each on keys of its
//! own; its redis-servers end with the binary (see `RedisServer`).

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use dedupe_gateway::store::{RedisClusterStore, Store};
use dedupe_test_support::{
    store_contract, GatewayConfig, Http, RedisCluster, RouteCfg, StoreCfg, TestGateway, Upstream,
};
use http::StatusCode;

/// The cluster this test binary shares, started by the first test that asks.
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// A client of the shared cluster, on the calling test's runtime.
fn cluster_store() -> (Store, ()) {
    let store = RedisClusterStore::new(&cluster().urls(), Duration::from_secs(2)).unwrap();
    (Store::Cluster(Box::new(store)), ())
}

store_contract!(contract, cluster_store);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_survives_storms() {
    let cluster = cluster();

    // Through the gateway: a storm on one key, then many keys spread over every master.
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        // A prefix of its own: the contract's records share the cluster.
        .store(
            StoreCfg::cluster(cluster.urls())
                .timeout("1s")
                .prefix("storm"),
        )
        .route(RouteCfg::header("orders", "/orders").lease("10s"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let http = http.clone();
        let url = gw.url("/orders");
        tasks.push(tokio::spawn(async move {
            http.post(
                &url,
                &[("Idempotency-Key", "storm"), ("x-test-delay-ms", "200")],
                "{}",
            )
            .await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert!(
            r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT,
            "{}: {}",
            r.status,
            r.text()
        );
    }
    assert_eq!(up.effects(), 1);

    // 300 requests over 100 keys, three deliveries each, concurrently.
    let mut tasks = Vec::new();
    for i in 0..300 {
        let http = http.clone();
        let url = gw.url("/orders");
        tasks.push(tokio::spawn(async move {
            let key = format!("order-{}", i % 100);
            http.post(&url, &[("Idempotency-Key", &key)], "{}").await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert!(!r.status.is_server_error(), "{}: {}", r.status, r.text());
    }
    assert_eq!(up.effects(), 101, "one effect per key");
    // The records really are spread over the masters.
    let holding = cluster
        .nodes
        .iter()
        .filter(|n| !n.cmd::<Vec<String>>(&["KEYS", "storm:*"]).is_empty())
        .count();
    assert_eq!(holding, 3, "every master holds records");
}

/// `drill --config` on a cluster: the store checks find every slot served and no
/// evicting master, the five drills pass, and the drill's keys are gone afterwards.
#[test]
fn drill_passes_on_the_cluster_and_cleans_up() {
    let urls: Vec<String> = cluster().nodes.iter().map(|n| n.url()).collect();
    let text = GatewayConfig::new("http://127.0.0.1:9")
        .store(StoreCfg::cluster(urls).timeout("1s"))
        .route(RouteCfg::header("orders", "/orders").scope(&["header:Authorization"]))
        .to_toml();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
        .args(["drill", "--lease", "1s", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("PASS store redis-cluster"), "{stdout}");
    assert!(!stdout.contains("cluster-slots"), "{stdout}");
    assert!(stdout.contains("PASS orders/crash"), "{stdout}");
    for node in &cluster().nodes {
        let keys: Vec<String> = node.cmd(&["KEYS", "*-drill-*"]);
        assert!(keys.is_empty(), "left behind: {keys:?}");
    }
}
