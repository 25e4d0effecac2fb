//! A 3-master Redis Cluster over TLS (`tls-cluster yes`, `tls-replication yes`) with a CA
//! the test makes: the store contract, and claims, replays and readiness through a gateway
//! given only `rediss://` seeds and `store.tls_ca_file`.

use std::sync::OnceLock;
use std::time::Duration;

use dedupe_gateway::config::tls::PemFile;
use dedupe_gateway::config::RedisAccess;
use dedupe_gateway::store::{RedisClusterStore, Store};
use dedupe_test_support::{
    eventually, store_contract, GatewayConfig, Http, RedisCluster, RedisTls, RouteCfg, StoreCfg,
    TestCa, TestGateway, Upstream,
};
use http::StatusCode;

struct TlsCluster {
    ca: TestCa,
    cluster: RedisCluster,
}

/// The TLS cluster this test binary shares, started by the first test that asks.
fn tls_cluster() -> &'static TlsCluster {
    static CLUSTER: OnceLock<TlsCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let ca = TestCa::new("cluster");
        let tls = RedisTls {
            server: ca.issue("cluster-node"),
            ca_file: ca.ca_file.clone(),
            require_client_cert: false,
        };
        let cluster = RedisCluster::start_tls(&tls);
        TlsCluster { ca, cluster }
    })
}

fn tls_cluster_store() -> (Store, ()) {
    let c = tls_cluster();
    let access = RedisAccess {
        ca: Some(PemFile::read(&c.ca.ca_file).unwrap()),
        ..RedisAccess::default()
    };
    let store =
        RedisClusterStore::with_access(&c.cluster.urls(), &access, Duration::from_secs(2)).unwrap();
    (Store::Cluster(Box::new(store)), ())
}

store_contract!(contract, tls_cluster_store);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_replays_and_readiness_go_over_tls_to_every_master() {
    let c = tls_cluster();
    let urls = c.cluster.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(urls)
                .tls_ca_file(&c.ca.ca_file)
                .timeout("1s")
                .prefix("tls"),
        )
        .admin()
        .route(RouteCfg::header("orders", "/orders"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    assert!(
        eventually(Duration::from_secs(10), || async {
            http.get(&gw.admin_url("/readyz"), &[]).await.status == StatusCode::OK
        })
        .await,
        "never ready over TLS"
    );
    // Enough keys that every master holds some: each is won once and replayed once.
    for i in 0..30 {
        let key = format!("tls-order-{i}");
        let headers = [("Idempotency-Key", key.as_str())];
        let first = http.post(&gw.url("/orders"), &headers, "{}").await;
        assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
        let again = http.post(&gw.url("/orders"), &headers, "{}").await;
        assert!(again.replayed(), "{key}: {}", again.text());
        assert_eq!(again.body, first.body);
    }
    assert_eq!(up.effects(), 30, "one effect per key");
    let holding = c
        .cluster
        .nodes
        .iter()
        .filter(|n| !n.cmd::<Vec<String>>(&["KEYS", "tls:*"]).is_empty())
        .count();
    assert_eq!(holding, 3, "every master holds records, reached over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_certificate_from_another_ca_is_never_ready() {
    let c = tls_cluster();
    let other = TestCa::new("other");
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(
            StoreCfg::cluster(c.cluster.urls())
                .tls_ca_file(&other.ca_file)
                .timeout("500ms"),
        )
        .admin()
        .route(RouteCfg::header("orders", "/orders"));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    // Not ready, and a deduped request is refused (fail-closed) without reaching upstream.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        http.get(&gw.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let r = http
        .post(
            &gw.url("/orders"),
            &[("Idempotency-Key", "untrusted")],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(up.effects(), 0);
}
