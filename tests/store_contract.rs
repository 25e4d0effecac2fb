//! Every single-node backend passes the same store contract (the cluster runs it in
//! `tests/cluster.rs`).

mod common;

use std::time::Duration;

use common::RedisServer;
use dedupe_gateway::store::{MemoryStore, RedisStore, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_keeps_the_contract() {
    common::contract::run_all(&Store::Memory(MemoryStore::new(10_000))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_keeps_the_contract() {
    let redis = RedisServer::start();
    let store = Store::Redis(RedisStore::new(&redis.url(), Duration::from_secs(1)).unwrap());
    common::contract::run_all(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_is_bounded_and_sweeps_expired_records() {
    use dedupe_gateway::store::{ClaimRequest, StoreError};
    let mem = MemoryStore::new(100);
    let store = Store::Memory(mem.clone());
    let short = Duration::from_millis(20);
    for i in 0..100 {
        let k = format!("k{i}");
        store
            .claim(ClaimRequest {
                key: &k,
                request_hash: &[0; 32],
                lease: short,
                window: short,
            })
            .await
            .unwrap();
    }
    // Full of live records: the next new key is refused as a store error (fail-closed/open).
    let refused = store
        .claim(ClaimRequest {
            key: "one-more",
            request_hash: &[0; 32],
            lease: short,
            window: short,
        })
        .await;
    assert!(matches!(refused, Err(StoreError::Full(100))), "{refused:?}");
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Expired records make room again, and unique keys do not grow memory without bound.
    for i in 0..1000 {
        let k = format!("u{i}");
        store
            .claim(ClaimRequest {
                key: &k,
                request_hash: &[0; 32],
                lease: short,
                window: short,
            })
            .await
            .unwrap();
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(mem.len() <= 100, "{} records held", mem.len());
}
