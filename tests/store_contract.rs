//! Every single-node backend passes the same store contract, one test per check (the
//! cluster runs it in `tests/cluster.rs`).

use std::time::Duration;

use dedupe_gateway::store::{MemoryStore, RedisStore, Store};
use dedupe_test_support::{store_contract, RedisServer};

/// The embedded store.
fn memory_store() -> (Store, ()) {
    (Store::Memory(MemoryStore::new(10_000)), ())
}

/// A store on a redis-server of the test's own.
fn redis_store() -> (Store, RedisServer) {
    let redis = RedisServer::start();
    let store = Store::Redis(RedisStore::new(&redis.url(), Duration::from_secs(1)).unwrap());
    (store, redis)
}

store_contract!(memory, memory_store);
store_contract!(redis, redis_store);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_is_bounded_and_sweeps_expired_records() {
    use dedupe_gateway::store::{ClaimRequest, Claimant, RequestHash, StoreError, StoreKey};
    let short = Duration::from_millis(20);
    let claim = |store: &Store, k: String| {
        let store = store.clone();
        async move {
            store
                .claim(ClaimRequest {
                    key: &StoreKey::from_raw(k),
                    request_hash: &RequestHash::new([0; 32]),
                    lease: short,
                    window: short,
                    claimant: Claimant::new(0),
                    hold: false,
                    order: None,
                })
                .await
        }
    };
    let mem = MemoryStore::new(100);
    let store = Store::Memory(mem.clone());
    for i in 0..100 {
        claim(&store, format!("k{i}")).await.unwrap();
    }
    // Full of live records: the next new key is refused as a store error (fail-closed/open).
    let refused = claim(&store, "one-more".into()).await;
    assert!(matches!(refused, Err(StoreError::Full(100))), "{refused:?}");
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Expired records make room again.
    for i in 0..100 {
        claim(&store, format!("again{i}")).await.unwrap();
    }
    assert_eq!(mem.len(), 100);

    // Unique keys do not grow memory without bound: expired records are swept as the
    // shards grow, with no full-store walk.
    let mem = MemoryStore::new(1_000_000);
    let store = Store::Memory(mem.clone());
    for batch in 0..20 {
        for i in 0..1000 {
            claim(&store, format!("u{batch}-{i}")).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        mem.len() < 10_000,
        "{} records held after 20000 short-lived keys",
        mem.len()
    );
}
