//! A store driven by hand: the claims the store-level tests make (one request hash, a
//! minute's window), and a store on a `redis-server`.

use std::time::Duration;

use dedupe_gateway::store::{
    Claim, ClaimRequest, Claimant, Permit, RedisStore, RequestHash, Store, StoreKey,
};

use crate::RedisServer;

/// The request hash of every claim made here.
pub const H1: RequestHash = RequestHash::new([1; 32]);
/// The window of every claim made here, and of the completions the tests send.
pub const LONG: Duration = Duration::from_secs(60);

/// A store on `redis`.
pub fn store_on(redis: &RedisServer) -> Store {
    Store::Redis(RedisStore::new(&redis.url(), Duration::from_secs(1)).unwrap())
}

/// A claim of `key` by claimant `who`, with `lease`.
pub fn claim(key: &StoreKey, lease: Duration, who: u128) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        request_hash: &H1,
        lease,
        window: LONG,
        claimant: Claimant::new(who),
        hold: false,
        order: None,
    }
}

/// The permit of a claim that must win.
pub async fn won(s: &Store, k: &StoreKey, lease: Duration, who: u128) -> Permit {
    match s.claim(claim(k, lease, who)).await.unwrap() {
        Claim::Won { permit, .. } => permit,
        other => panic!("{k:?}: the claim did not win: {other:?}"),
    }
}
