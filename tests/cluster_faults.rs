//! A Redis Cluster master whose replies stop (`CLIENT PAUSE`: TCP up, the cluster bus
//! answering, client commands held): requests for its slots follow `on_error` within the
//! store's deadline, the other masters keep serving, and the gateway recovers when the
//! master answers again, without a restart.

use std::time::{Duration, Instant};

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    eventually, GatewayConfig, Http, RedisCluster, RouteCfg, StoreCfg, TestGateway, Upstream,
};
use http::StatusCode;

/// The store timeout, and how long a request that meets the paused master may take: its
/// claim and the second ask as the same claimant, each up to the timeout; slack on top
/// for a loaded 2-core machine.
const TIMEOUT_MS: u64 = 250;
const FAILS_WITHIN: Duration = Duration::from_millis(2 * TIMEOUT_MS + 1500);

fn records_on(node: &dedupe_test_support::RedisServer) -> usize {
    node.cmd::<Vec<String>>(&["KEYS", "stall:*"]).len()
}

/// A gateway on the cluster reached through `seeds`, with the tests' store deadline.
fn config(up: &Upstream, seeds: Vec<String>) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(seeds)
                .timeout(&format!("{TIMEOUT_MS}ms"))
                .prefix("stall"),
        )
        .route(RouteCfg::header("orders", "/orders"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_fails_its_slots_within_the_deadline_and_recovers() {
    // A cluster of this test's own: the pause must not reach other tests.
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(&up, cluster.urls())).await;
    let http = Http::new();
    let post = |key: String| {
        let (http, url) = (http.clone(), gw.url("/orders"));
        async move {
            let started = Instant::now();
            let r = http
                .post(&url, &[("Idempotency-Key", key.as_str())], "{}")
                .await;
            (r, started.elapsed())
        }
    };
    for i in 0..10 {
        let (r, _) = post(format!("warm-{i}")).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }

    // Longer than the cluster client's own reply timeout (4 × store.timeout, at least 1s),
    // shorter than the cluster's node timeout (2s is only for the bus, which keeps answering).
    let paused = &cluster.nodes[0];
    let _: String = paused.cmd(&["CLIENT", "PAUSE", "4000", "ALL"]);
    let pause_ends = Instant::now() + Duration::from_millis(4000);
    let (mut failed, mut served) = (0, 0);
    let mut i = 0;
    while Instant::now() + FAILS_WITHIN < pause_ends {
        i += 1;
        let (r, took) = post(format!("paused-{i}")).await;
        match r.status {
            StatusCode::CREATED => served += 1,
            StatusCode::SERVICE_UNAVAILABLE => failed += 1,
            other => panic!("{other}: {}", r.text()),
        }
        assert!(
            took < FAILS_WITHIN,
            "a request took {took:?} while a master was paused"
        );
    }
    assert!(
        failed > 0,
        "no request met the paused master ({served} served)"
    );
    assert!(
        served > 0,
        "the other masters stopped serving too ({failed} failed)"
    );

    // Answering again: keys on every master are won again, the paused one included.
    // The commands the pause held run when it ends; count records after they have.
    tokio::time::sleep_until((pause_ends + Duration::from_millis(500)).into()).await;
    let before = records_on(paused);
    let mut n = 0;
    let recovered = eventually(Duration::from_secs(10), || {
        n += 1;
        let batch = n;
        let post = &post;
        async move {
            for k in 0..20 {
                let (r, _) = post(format!("after-{batch}-{k}")).await;
                if r.status != StatusCode::CREATED {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(
        recovered,
        "the gateway did not recover from the paused master"
    );
    assert!(
        records_on(paused) > before,
        "no new record reached the master that was paused"
    );
    // Every key executed at most once.
    let seen = up.effects_per_key();
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_flow_to_one_master_is_replaced_without_a_restart() {
    // A master reached through a fault proxy: it announces the proxy's port, so slot maps
    // and redirects send clients through it.
    let cluster = RedisCluster::start();
    let through = &cluster.nodes[0];
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", through.port).parse().unwrap()).await;
    let proxy_port = proxy.redis_url().rsplit(':').next().unwrap().to_owned();
    let _: String = through.cmd(&["CONFIG", "SET", "cluster-announce-port", &proxy_port]);
    let announced = eventually(Duration::from_secs(10), || async {
        cluster.nodes.iter().all(|n| {
            let nodes: String = n.cmd(&["CLUSTER", "NODES"]);
            nodes.contains(&format!("127.0.0.1:{proxy_port}@"))
        })
    })
    .await;
    assert!(announced, "the proxy's port never spread over the bus");

    let up = Upstream::start().await;
    let seeds = cluster.nodes[1..].iter().map(|n| n.url()).collect();
    let gw = TestGateway::start(&config(&up, seeds)).await;
    let http = Http::new();
    let post = |key: String| {
        let (http, url) = (http.clone(), gw.url("/orders"));
        async move {
            http.post(&url, &[("Idempotency-Key", key.as_str())], "{}")
                .await
                .status
        }
    };
    for i in 0..20 {
        assert_eq!(post(format!("warm-{i}")).await, StatusCode::CREATED);
    }
    assert!(
        proxy.accepted() > 0,
        "the gateway never went through the proxy"
    );

    // Every flow through the proxy is lost for good: no reply, no FIN, no RST.
    proxy.lose_flows();
    let before = records_on(through);
    let mut n = 0;
    let recovered = eventually(Duration::from_secs(15), || {
        n += 1;
        let batch = n;
        let post = &post;
        async move {
            for k in 0..20 {
                if post(format!("after-{batch}-{k}")).await != StatusCode::CREATED {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(recovered, "the gateway kept the lost flow");
    assert!(
        records_on(through) > before,
        "no new record reached that master"
    );
    // Every key executed at most once.
    let seen = up.effects_per_key();
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
}
