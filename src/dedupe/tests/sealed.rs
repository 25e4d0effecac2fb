//! Sealed records: encrypted in the store, opened on replay, refused when no key opens them.

use super::*;

fn ring(keys: &[[u8; 32]]) -> Keyring {
    Keyring::new(keys).unwrap()
}

const K1: [u8; 32] = [7; 32];
const K2: [u8; 32] = [9; 32];

fn secret(response: &'static str) -> Attempt<&'static str> {
    Attempt::Final {
        record: Bytes::from_static(b"DGR2 card tok_4242"),
        response,
    }
}

#[tokio::test(start_paused = true)]
async fn records_are_sealed_in_the_store_and_replayed_in_clear() {
    let h = Harness::sealed(100, ring(&[K1]));
    let p = policy(OnConflict::Reject);
    h.request(&key("a"), 1, &p, NOW, secret).await;
    let raw = h.store.inspect(&key("a")).await.unwrap().unwrap();
    let raw = raw.response.unwrap();
    assert!(!raw.windows(8).any(|w| w == b"tok_4242"), "{raw:?}");
    let again = h.request(&key("a"), 1, &p, NOW, secret).await;
    assert!(matches!(again.answer, Answer::Replay(ref r) if r == "DGR2 card tok_4242"));
    assert_eq!(h.calls(), 1);
}

/// Completes `key` on `h`'s store with `record` as it is (a copy made behind the
/// gateway's back).
async fn plant(h: &Harness, k: &StoreKey, hash: u8, record: Bytes) {
    let won = h
        .store
        .claim(ClaimRequest {
            key: k,
            request_hash: &RequestHash::new([hash; 32]),
            lease: Duration::from_secs(10),
            window: Duration::from_secs(3600),
            claimant: h.claimants.next_id(),
            hold: false,
            order: None,
        })
        .await
        .unwrap();
    let Claim::Won { permit, .. } = won else {
        panic!("{won:?}")
    };
    let done = h
        .store
        .complete(&permit, record, Duration::from_secs(3600), None);
    assert_eq!(done.await.unwrap(), crate::store::Completion::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_record_no_key_opens_fails_closed_without_a_forward() {
    let h = Harness::sealed(100, ring(&[K1]));
    let p = Policy {
        on_error: OnError::FailClosed,
        ..policy(OnConflict::Reject)
    };
    // Sealed under a key this gateway does not have.
    let foreign = ring(&[K2]).seal(&key("a"), Bytes::from_static(b"r"));
    plant(&h, &key("a"), 1, foreign).await;
    let s = h.request(&key("a"), 1, &p, NOW, done).await;
    assert_eq!(s.outcome, Outcome::StoreError);
    assert!(matches!(s.answer, Answer::StoreUnavailable));
    // Moved from another store key: the right key, the wrong binding.
    let moved = h.keyring.seal(&key("b"), Bytes::from_static(b"r"));
    plant(&h, &key("c"), 1, moved).await;
    let s = h.request(&key("c"), 1, &p, NOW, done).await;
    assert!(matches!(s.answer, Answer::StoreUnavailable));
    // In clear while keys are set.
    plant(&h, &key("d"), 1, Bytes::from_static(b"DGR2 forged")).await;
    let s = h.request(&key("d"), 1, &p, NOW, done).await;
    assert!(matches!(s.answer, Answer::StoreUnavailable));
    assert_eq!(h.calls(), 0, "never re-executed");
}

#[tokio::test(start_paused = true)]
async fn a_record_no_key_opens_is_never_executed_again_even_on_a_fail_open_route() {
    let h = Harness::sealed(100, ring(&[K1]));
    let p = policy(OnConflict::Reject);
    assert_eq!(p.on_error, OnError::FailOpen);
    let foreign = ring(&[K2]).seal(&key("a"), Bytes::from_static(b"r"));
    plant(&h, &key("a"), 1, foreign.clone()).await;
    let s = h.request(&key("a"), 1, &p, NOW, done).await;
    assert_eq!(s.outcome, Outcome::StoreError);
    assert!(matches!(s.answer, Answer::StoreUnavailable));
    assert_eq!(
        h.calls(),
        0,
        "the record proves it executed: never forwarded again"
    );
    assert_eq!(s.finish, None, "no claim was made, nothing settled");
    let raw = h.store.inspect(&key("a")).await.unwrap().unwrap();
    assert_eq!(raw.response, Some(foreign));
}

#[tokio::test(start_paused = true)]
async fn a_rotated_keyring_replays_records_of_the_old_key() {
    let old = Harness::sealed(100, ring(&[K1]));
    let p = policy(OnConflict::Reject);
    old.request(&key("a"), 1, &p, NOW, secret).await;
    let stored = old.store.inspect(&key("a")).await.unwrap().unwrap();
    let rotated = Harness::sealed(100, ring(&[K2, K1]));
    plant(&rotated, &key("a"), 1, stored.response.unwrap()).await;
    let s = rotated.request(&key("a"), 1, &p, NOW, secret).await;
    assert!(matches!(s.answer, Answer::Replay(ref r) if r == "DGR2 card tok_4242"));
    assert_eq!(rotated.calls(), 0);
}
