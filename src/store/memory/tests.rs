use super::*;

use crate::store::{Claimant, RequestHash, StoreKey};

const HASH: RequestHash = RequestHash::new([1; 32]);

fn req<'a>(key: &'a StoreKey, hash: &'a RequestHash, lease: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        request_hash: hash,
        lease,
        window: Duration::from_secs(3600),
        claimant: Claimant::new(key.as_str().len() as u128),
        hold: false,
        order: None,
    }
}

/// A claim of `key` that expires 1 ms after its lease (1 ms) ends.
fn short(key: &StoreKey) -> ClaimRequest<'_> {
    ClaimRequest {
        window: Duration::from_millis(1),
        ..req(key, &HASH, Duration::from_millis(1))
    }
}

async fn win(store: &MemoryStore, key: &str) -> Result<u64, StoreError> {
    let key = StoreKey::from_raw(key);
    match store
        .claim(req(&key, &HASH, Duration::from_secs(60)))
        .await?
    {
        Claim::Won { permit, .. } => Ok(permit.fence().get()),
        other => panic!("{key}: {other:?}"),
    }
}

#[tokio::test]
async fn claims_past_max_bytes_fail_and_completed_records_stay() {
    let body = Bytes::from(vec![b'x'; 1000]);
    let store = MemoryStore::with_limits(1_000, 3 * (1000 + RECORD_OVERHEAD as u64 + 2));
    for key in ["k1", "k2", "k3"] {
        let fence = win(&store, key).await.unwrap();
        assert!(store
            .complete(
                key,
                Owner::by_fence(fence),
                body.clone(),
                Duration::from_secs(3600),
                false,
                None
            )
            .await
            .unwrap());
    }
    assert_eq!(store.bytes(), 3 * (1000 + RECORD_OVERHEAD + 2));
    // Full by bytes: a new key is refused as a store error...
    assert!(matches!(
        win(&store, "k4").await,
        Err(StoreError::FullBytes(_))
    ));
    // ...and nothing completed was evicted to make room: every one still replays.
    for key in ["k1", "k2", "k3"] {
        let k = StoreKey::from_raw(key);
        let c = store
            .claim(req(&k, &HASH, Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(c, Claim::Replay(body.clone()), "{key}");
    }
    // Forgetting one gives its bytes back.
    assert!(store.forget("k1").await.unwrap());
    assert_eq!(store.bytes(), 2 * (1000 + RECORD_OVERHEAD + 2));
    win(&store, "k4").await.unwrap();
}

#[tokio::test]
async fn swept_and_reclaimed_records_give_their_bytes_back() {
    let store = MemoryStore::with_limits(1_000, u64::MAX);
    let a = StoreKey::from_raw("a");
    let Claim::Won { permit, .. } = store.claim(short(&a)).await.unwrap() else {
        panic!()
    };
    let fence = permit.fence();
    store
        .complete(
            "a",
            Owner::by_fence(fence.get()),
            Bytes::from_static(b"12345"),
            Duration::from_millis(1),
            false,
            None,
        )
        .await
        .unwrap();
    assert_eq!(store.bytes(), RECORD_OVERHEAD + 1 + 5);
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Claimed again after expiry, before any sweep: the old response is no longer held.
    win(&store, "a").await.unwrap();
    assert_eq!(store.bytes(), RECORD_OVERHEAD + 1);
    assert!(store.forget("a").await.unwrap());
    assert_eq!((store.len(), store.bytes()), (0, 0));
    // Released records hold nothing extra; a sweep after expiry returns to zero.
    let (bb, two) = (StoreKey::from_raw("bb"), RequestHash::new([2; 32]));
    let b = ClaimRequest {
        window: Duration::from_millis(1),
        ..req(&bb, &two, Duration::from_millis(1))
    };
    let Claim::Won { permit, .. } = store.claim(b).await.unwrap() else {
        panic!()
    };
    let fence = permit.fence();
    assert!(store
        .release(
            "bb",
            Owner::by_fence(fence.get()),
            Duration::from_millis(1),
            false,
            None
        )
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(80)).await;
    store.sweep();
    assert_eq!((store.len(), store.bytes()), (0, 0));
}

#[test]
fn keys_spread_over_every_shard() {
    // Store keys as the gateway spells them, differing only in the client's key, and keys
    // that differ in one byte: each shard gets its share within a quarter.
    for spell in [
        |i: usize| format!("dedupe:{{0a1b2c3d4e5f}}:payments:-:order-{i}"),
        |i: usize| format!("k{i:07}"),
    ] {
        let mut counts = [0usize; SHARDS];
        let n = SHARDS * 1_000;
        for i in 0..n {
            counts[Hashed::new(&spell(i)).shard()] += 1;
        }
        for (shard, c) in counts.iter().enumerate() {
            assert!(
                (750..=1_250).contains(c),
                "shard {shard} got {c} of {n}: {counts:?}"
            );
        }
    }
}

/// Wins each key with a claim that expires 1 ms after its lease (1 ms) ends.
async fn short_lived(store: &MemoryStore, keys: impl IntoIterator<Item = String>) {
    for key in keys {
        let key = StoreKey::from_raw(key);
        let won = store.claim(short(&key)).await.unwrap();
        assert!(matches!(won, Claim::Won { .. }), "{key}: {won:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_drops_a_bounded_number_of_expired_records_and_walks_nothing() {
    let store = MemoryStore::with_limits(1_000_000, u64::MAX);
    // Every key in one shard, so one claim's share of the expiring is seen whole.
    let keys: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| Hashed::new(k).shard() == 0)
        .take(101)
        .collect();
    short_lived(&store, keys[..100].iter().cloned()).await;
    assert_eq!(store.len(), 100);
    tokio::time::advance(Duration::from_millis(5)).await;
    // All 100 have expired: a claim in their shard drops only its share of them.
    win(&store, &keys[100]).await.unwrap();
    assert_eq!(store.len(), 100 - CLAIM_EXPIRES + 1);
    store.sweep();
    assert_eq!(store.len(), 1);
    assert_eq!(MemoryStore::lock(&store.inner.shards[0]).pending(), 1);
}

/// Wins `key` with a claim whose lease and window are 5 ms each; its fence.
async fn won_for_10ms(store: &MemoryStore, key: &StoreKey) -> u64 {
    let claim = ClaimRequest {
        window: Duration::from_millis(5),
        ..req(key, &HASH, Duration::from_millis(5))
    };
    match store.claim(claim).await.unwrap() {
        Claim::Won { permit, .. } => permit.fence().get(),
        other => panic!("{key}: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_that_lives_on_is_not_dropped_when_its_first_expiry_comes_up() {
    let store = MemoryStore::with_limits(1_000, u64::MAX);
    let key = StoreKey::from_raw("k");
    // Claimed to expire in 10 ms, then completed for an hour.
    let owner = Owner::by_fence(won_for_10ms(&store, &key).await);
    let body = Bytes::from_static(b"kept");
    let hour = Duration::from_secs(3600);
    assert!(store
        .complete("k", owner, body.clone(), hour, false, None)
        .await
        .unwrap());
    tokio::time::advance(Duration::from_millis(20)).await;
    store.sweep();
    assert_eq!(store.len(), 1);
    let again = store
        .claim(req(&key, &HASH, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(again, Claim::Replay(body));
    tokio::time::advance(hour).await;
    store.sweep();
    assert_eq!((store.len(), store.bytes()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn renewals_within_the_window_note_no_expiry() {
    let store = MemoryStore::with_limits(1_000, u64::MAX);
    let fence = win(&store, "k").await.unwrap();
    let shard = Hashed::new("k").shard();
    let pending = || MemoryStore::lock(&store.inner.shards[shard]).pending();
    assert_eq!(pending(), 1);
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let renewed = store
            .renew("k", Owner::by_fence(fence), Duration::from_secs(60), None)
            .await
            .unwrap();
        assert!(renewed);
    }
    assert_eq!(pending(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_store_makes_room_from_what_has_expired() {
    let store = MemoryStore::with_limits(64, u64::MAX);
    short_lived(&store, (0..64).map(|i| format!("old{i}"))).await;
    assert!(matches!(
        win(&store, "new0").await,
        Err(StoreError::Full(_))
    ));
    tokio::time::advance(Duration::from_millis(5)).await;
    // Each new key finds room: the expired records are dropped for it.
    for i in 0..64 {
        win(&store, &format!("new{i}")).await.unwrap();
    }
    assert_eq!(store.len(), 64);
}

#[tokio::test(start_paused = true)]
async fn a_lease_renewed_past_the_window_keeps_its_record_until_then() {
    let store = MemoryStore::with_limits(1_000, u64::MAX);
    let key = StoreKey::from_raw("k");
    // Expires in 10 ms, until a renewal takes the lease an hour on.
    let owner = Owner::by_fence(won_for_10ms(&store, &key).await);
    let hour = Duration::from_secs(3600);
    assert!(store.renew("k", owner, hour, None).await.unwrap());
    tokio::time::advance(Duration::from_millis(20)).await;
    store.sweep();
    assert_eq!(store.len(), 1, "dropped when its first expiry came up");
    let shard = Hashed::new("k").shard();
    assert_eq!(MemoryStore::lock(&store.inner.shards[shard]).pending(), 1);
    tokio::time::advance(hour).await;
    store.sweep();
    assert_eq!((store.len(), store.bytes()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn claims_and_releases_of_one_key_queue_no_more_expiries() {
    let store = MemoryStore::with_limits(1_000, u64::MAX);
    let key = StoreKey::from_raw("k");
    let shard = Hashed::new("k").shard();
    for _ in 0..100 {
        let Claim::Won { permit, .. } = store
            .claim(req(&key, &HASH, Duration::from_secs(60)))
            .await
            .unwrap()
        else {
            panic!()
        };
        let owner = Owner::by_fence(permit.fence().get());
        let window = Duration::from_secs(3600);
        assert!(store
            .release("k", owner, window, false, None)
            .await
            .unwrap());
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    assert!(MemoryStore::lock(&store.inner.shards[shard]).pending() <= 2);
}
