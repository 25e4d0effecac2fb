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

/// A POST sent again with the same key while the gateway refuses it before its claim (503
/// `overloaded`, as a burst past the admission limit is), after its `Retry-After`, as a
/// client is told to: at most ten times.
async fn post_until_admitted(
    http: &dedupe_test_support::Http,
    url: &str,
    headers: &[(&str, &str)],
) -> dedupe_test_support::Reply {
    let mut reply = http.post(url, headers, "{}").await;
    for _ in 0..10 {
        let refused = reply.status == StatusCode::SERVICE_UNAVAILABLE
            && reply.text().contains("problem:overloaded");
        if !refused {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        reply = http.post(url, headers, "{}").await;
    }
    reply
}

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
            post_until_admitted(
                &http,
                &url,
                &[("Idempotency-Key", "storm"), ("x-test-delay-ms", "200")],
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
            post_until_admitted(&http, &url, &[("Idempotency-Key", &key)]).await
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

/// Ordered routes on the cluster: each record takes its entity's hash tag, so the claim
/// script touches the record and the entity's order record in one slot. Entities spread
/// over every master; per entity: an older version after a newer one is stale and never
/// forwarded, concurrent versions execute in order, a failed version runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_routes_keep_versions_in_order_on_the_cluster() {
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(cluster().urls())
                .timeout("1s")
                .prefix("ordered"),
        )
        .admin()
        .route(
            RouteCfg::header("events", "/events")
                .order("json:/id", "json:/v", "integer")
                .on_conflict_wait("10s"),
        );
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    let send = |key: String, id: u32, v: i64, extra: Option<(&'static str, &'static str)>| {
        let (http, url) = (http.clone(), gw.url("/events"));
        async move {
            let mut h = vec![("Idempotency-Key", key.as_str())];
            h.extend(extra);
            http.post(&url, &h, &format!(r#"{{"id":{id},"v":{v}}}"#))
                .await
        }
    };
    let stale =
        |r: &dedupe_test_support::Reply| r.headers.get("dedupe-stale").is_some_and(|v| v == "true");
    let executed = |id: u32| -> Vec<i64> {
        up.seen()
            .iter()
            .filter_map(|s| {
                let v: serde_json::Value = serde_json::from_slice(&s.body).ok()?;
                (v["id"] == id).then(|| v["v"].as_i64().unwrap())
            })
            .collect()
    };
    for id in 0..12u32 {
        // v1 and v2 at once: never v1 after v2.
        let slow = Some(("x-test-delay-ms", "50"));
        let (a, b) = tokio::join!(
            send(format!("{id}-1"), id, 1, slow),
            send(format!("{id}-2"), id, 2, slow)
        );
        assert_eq!(b.status, StatusCode::CREATED, "{}", b.text());
        match executed(id).as_slice() {
            [1, 2] => assert_eq!(a.status, StatusCode::CREATED),
            [2] => assert!(stale(&a), "{a:?}"),
            other => panic!("entity {id}: executed {other:?}"),
        }
        // v4 fails (5xx): v3 still runs, then v4's retry succeeds; v3 is stale after it.
        let failed = send(format!("{id}-4"), id, 4, Some(("x-test-status", "503"))).await;
        assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            send(format!("{id}-3"), id, 3, None).await.status,
            StatusCode::CREATED
        );
        assert_eq!(
            send(format!("{id}-4"), id, 4, None).await.status,
            StatusCode::CREATED
        );
        let late = send(format!("{id}-3-late"), id, 3, None).await;
        assert!(stale(&late), "{late:?}");
        assert_eq!(executed(id).last(), Some(&4));
    }
    // The admin API finds an ordered record by its entity's value.
    let shown = http
        .get(&gw.admin_url("/keys/events/5-4?entity=5"), &[])
        .await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text());
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    assert_eq!(shown["version"], "4");
    assert_eq!(
        http.get(&gw.admin_url("/keys/events/5-4"), &[])
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
}
