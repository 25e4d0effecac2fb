//! A real 3-master Redis Cluster: the store contract, and storms through the gateway.

use std::process::Command;
use std::time::{Duration, Instant};

use dedupe_gateway::store::{RedisClusterStore, Store};
use dedupe_test_support::{
    contract, free_port, GatewayConfig, Http, RedisServer, RouteCfg, StoreCfg, TestGateway,
    Upstream,
};
use http::StatusCode;

struct Cluster {
    nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Three masters, no replicas, created with `redis-cli --cluster create`.
    fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                // The bus port is set explicitly: port + 10000 may not exist for high
                // ephemeral ports.
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli not installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            loop {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster never became ok: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_the_store_contract_and_survives_storms() {
    let cluster = Cluster::start();

    let store = Store::Cluster(Box::new(
        RedisClusterStore::new(&cluster.urls(), Duration::from_secs(2)).unwrap(),
    ));
    contract::run_all(&store).await;

    // Through the gateway: a storm on one key, then many keys spread over every master.
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::cluster(cluster.urls()).timeout("1s"))
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
        .filter(|n| n.cmd::<i64>(&["DBSIZE"]) > 0)
        .count();
    assert_eq!(holding, 3, "every master holds records");
}
