//! The store contract: one suite every backend (memory, redis, redis-cluster) must pass.
//!
//! Each check is an `async fn(&Store)`; `store_contract!` turns them into one test per
//! check for a backend, so one failing check does not hide the others. Every check makes
//! its own keys, so checks can share a store (and a cluster) and run concurrently.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dedupe_gateway::store::{
    Claim, ClaimRequest, Claimant, Completion, Fence, Order, Permit, RecordState, RequestHash,
    Resolution, Store, StoreKey,
};

/// One `#[tokio::test]` per contract check, in a module named `$backend`, each on the
/// store that `$make()` returns. `$make` is a function in the invoking module:
/// `fn() -> (Store, G)`; `G` is kept alive for the test (the redis-server behind the store).
///
/// A new check is listed here as well as written below.
#[macro_export]
macro_rules! store_contract {
    ($backend:ident, $make:ident) => {
        $crate::store_contract!(
            @tests $backend, $make,
            won_conflict_mismatch,
            complete_then_replay,
            takeover_raises_the_fence_and_fences_out_the_zombie,
            release_lets_the_next_claim_win_with_a_higher_fence,
            window_expiry_forgets_the_key_but_not_the_fence_order,
            abandoned_claims_expire,
            inspect_and_forget,
            concurrent_claims_have_one_winner,
            a_retried_claim_wins_again,
            renew_extends_only_the_owners_lease,
            a_held_claim_is_never_taken_over_and_resolves_once,
            a_held_claims_late_answer_is_stored_and_replayed,
            inspect_counts_attempts_and_shows_when_claimed_and_completed,
            versions_of_one_entity_complete_in_order,
        );
    };
    (@tests $backend:ident, $make:ident, $($check:ident),+ $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let (store, _alive) = super::$make();
                    $crate::contract::$check(&store).await;
                }
            )+
        }
    };
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn fresh_key(name: &str) -> StoreKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    StoreKey::from_raw(format!(
        "contract:{{{nanos}{}}}:{name}",
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

const H1: RequestHash = RequestHash::new([1; 32]);
const H2: RequestHash = RequestHash::new([2; 32]);
const LONG: Duration = Duration::from_secs(60);

static CLAIMANT: AtomicU64 = AtomicU64::new(1);

/// A claim by a new claimant.
fn req<'a>(
    key: &'a StoreKey,
    hash: &'a RequestHash,
    lease: Duration,
    window: Duration,
) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        request_hash: hash,
        lease,
        window,
        claimant: Claimant::new((u128::from(CLAIMANT.fetch_add(1, Ordering::Relaxed)) << 64) | 7),
        hold: false,
        order: None,
    }
}

/// Completes under `permit` with the contract's window.
async fn complete(store: &Store, permit: &Permit, record: Bytes) -> Completion {
    store.complete(permit, record, LONG, None).await.unwrap()
}

/// The permit of a won claim, checking whether it was a takeover.
fn won(claim: Claim, takeover: bool) -> Permit {
    match claim {
        Claim::Won {
            permit,
            takeover: t,
        } if t.is_some() == takeover => permit,
        other => panic!("expected a win (takeover: {takeover}), got {other:?}"),
    }
}

/// The same claimant asking again (its first reply was lost) wins again, not a conflict.
pub async fn a_retried_claim_wins_again(store: &Store) {
    let k = fresh_key("retried");
    let first = req(&k, &H1, LONG, LONG);
    let f = won(store.claim(first).await.unwrap(), false);
    // The same claimant again (its first reply was lost): the same win, not a conflict.
    assert_eq!(won(store.claim(first).await.unwrap(), false), f);
    assert!(matches!(
        store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(),
        Claim::Conflict { .. }
    ));
    complete(store, &f, Bytes::from_static(b"once")).await;
    assert_eq!(
        store.claim(first).await.unwrap(),
        Claim::Replay(Bytes::from_static(b"once"))
    );
}

/// The first claim wins; the same request in flight conflicts; another request mismatches.
pub async fn won_conflict_mismatch(store: &Store) {
    let k = fresh_key("won");
    let f = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), false);
    assert!(f.fence() > Fence::new(0));
    match store.claim(req(&k, &H1, LONG, LONG)).await.unwrap() {
        Claim::Conflict { retry_after } => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= LONG,
                "{retry_after:?}"
            )
        }
        other => panic!("expected conflict, got {other:?}"),
    }
    assert_eq!(
        store.claim(req(&k, &H2, LONG, LONG)).await.unwrap(),
        Claim::Mismatch
    );
}

/// A completed record replays byte for byte; completing again is idempotent, releasing it refused.
pub async fn complete_then_replay(store: &Store) {
    let k = fresh_key("replay");
    let f = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), false);
    let record = Bytes::from_static(b"\x00binary\xffrecord");
    assert_eq!(
        complete(store, &f, record.clone()).await,
        Completion::Completed
    );
    assert_eq!(
        store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(),
        Claim::Replay(record.clone())
    );
    assert_eq!(
        store.claim(req(&k, &H2, LONG, LONG)).await.unwrap(),
        Claim::Mismatch
    );
    // Completing again under the same fence (a retried store call) is idempotent and
    // rewrites nothing; a release of a completed record is refused.
    assert_eq!(
        complete(store, &f, Bytes::from_static(b"other")).await,
        Completion::Completed
    );
    assert!(!store.release(&f, LONG, None).await.unwrap());
    assert_eq!(
        store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(),
        Claim::Replay(record)
    );
}

/// After the lease a claim takes over with a higher fence; the old owner can neither complete nor release.
pub async fn takeover_raises_the_fence_and_fences_out_the_zombie(store: &Store) {
    let k = fresh_key("takeover");
    let lease = Duration::from_millis(400);
    let f1 = won(store.claim(req(&k, &H1, lease, LONG)).await.unwrap(), false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let f2 = won(store.claim(req(&k, &H1, lease, LONG)).await.unwrap(), true);
    assert!(
        f2.fence() > f1.fence(),
        "the takeover's fence {f2:?} is above the zombie's {f1:?}"
    );
    // The new lease holds.
    assert!(matches!(
        store.claim(req(&k, &H1, lease, LONG)).await.unwrap(),
        Claim::Conflict { .. }
    ));
    // The zombie can neither complete nor release.
    assert_eq!(
        complete(store, &f1, Bytes::from_static(b"zombie")).await,
        Completion::Fenced
    );
    assert!(!store.release(&f1, LONG, None).await.unwrap());
    assert_eq!(
        complete(store, &f2, Bytes::from_static(b"owner")).await,
        Completion::Completed
    );
    assert_eq!(
        store.claim(req(&k, &H1, lease, LONG)).await.unwrap(),
        Claim::Replay(Bytes::from_static(b"owner"))
    );
    assert_eq!(
        complete(store, &f1, Bytes::from_static(b"zombie")).await,
        Completion::Fenced,
        "not even after the owner completed"
    );
    // A mismatched request never takes over, even after the lease.
    let k2 = fresh_key("takeover-mismatch");
    store.claim(req(&k2, &H1, lease, LONG)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        store.claim(req(&k2, &H2, lease, LONG)).await.unwrap(),
        Claim::Mismatch
    );
}

/// A released claim lets the next claim win, with a higher fence.
pub async fn release_lets_the_next_claim_win_with_a_higher_fence(store: &Store) {
    let k = fresh_key("release");
    let f1 = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), false);
    assert!(store.release(&f1, LONG, None).await.unwrap());
    assert!(
        store.release(&f1, LONG, None).await.unwrap(),
        "releasing twice is idempotent"
    );
    assert_eq!(
        complete(store, &f1, Bytes::from_static(b"late")).await,
        Completion::Fenced,
        "a released claim cannot complete"
    );
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Released);
    // The next claim wins, even with another body, and its fence is higher.
    let f2 = won(store.claim(req(&k, &H2, LONG, LONG)).await.unwrap(), false);
    assert!(f2.fence() > f1.fence());
    assert_eq!(
        complete(store, &f1, Bytes::from_static(b"stale")).await,
        Completion::Fenced
    );
    assert_eq!(
        complete(store, &f2, Bytes::from_static(b"new")).await,
        Completion::Completed
    );
}

/// After the window the key is new, but its fences keep rising.
pub async fn window_expiry_forgets_the_key_but_not_the_fence_order(store: &Store) {
    let k = fresh_key("window");
    let window = Duration::from_millis(500);
    let f1 = won(
        store.claim(req(&k, &H1, LONG, window)).await.unwrap(),
        false,
    );
    store
        .complete(&f1, Bytes::from_static(b"r"), window, None)
        .await
        .unwrap();
    assert!(matches!(
        store.claim(req(&k, &H1, LONG, window)).await.unwrap(),
        Claim::Replay(_)
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(store.inspect(&k).await.unwrap(), None);
    let f2 = won(
        store.claim(req(&k, &H2, LONG, window)).await.unwrap(),
        false,
    );
    assert!(
        f2.fence() > f1.fence(),
        "a new generation of the key never reuses an old fence"
    );
}

/// A claim never settled expires after its lease and window.
pub async fn abandoned_claims_expire(store: &Store) {
    let k = fresh_key("abandoned");
    let (lease, window) = (Duration::from_millis(200), Duration::from_millis(200));
    store.claim(req(&k, &H1, lease, window)).await.unwrap();
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::InFlight);
    assert!(info.expires_in.unwrap() <= lease + window);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(store.inspect(&k).await.unwrap(), None);
}

/// Records can be inspected and forgotten; a forgotten key's old owner stays fenced out.
pub async fn inspect_and_forget(store: &Store) {
    let k = fresh_key("inspect");
    assert_eq!(store.inspect(&k).await.unwrap(), None);
    let f1 = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), false);
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.fence),
        (RecordState::InFlight, f1.fence())
    );
    assert!(info.lease_left.unwrap() > Duration::from_secs(50));
    assert!(info.response.is_none());
    complete(store, &f1, Bytes::from_static(b"done")).await;
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Completed);
    assert_eq!(info.lease_left, None);
    assert_eq!(info.response.as_deref(), Some(&b"done"[..]));
    assert!(store.forget(&k).await.unwrap());
    assert!(!store.forget(&k).await.unwrap());
    let f2 = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), false);
    assert!(
        f2.fence() > f1.fence(),
        "an operator's delete does not let an old owner match the new one"
    );
    assert_eq!(
        complete(store, &f1, Bytes::from_static(b"old owner")).await,
        Completion::Fenced
    );
}

/// Of 64 concurrent claims on one key exactly one wins.
pub async fn concurrent_claims_have_one_winner(store: &Store) {
    let k = fresh_key("race");
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let store = store.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            store.claim(req(&k, &H1, LONG, LONG)).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            Claim::Won { .. } => won += 1,
            Claim::Conflict { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(won, 1);
}

/// Renewing extends the lease of the fence that owns the claim, past its first end, and
/// nobody else's: a stale fence, a settled record or a missing one is refused.
pub async fn renew_extends_only_the_owners_lease(store: &Store) {
    let k = fresh_key("renew");
    let short = Duration::from_millis(300);
    let f = won(store.claim(req(&k, &H1, short, LONG)).await.unwrap(), false);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(store.renew(&f, LONG, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Past the first lease: still in flight, not taken over.
    match store.claim(req(&k, &H1, short, LONG)).await.unwrap() {
        Claim::Conflict { retry_after } => assert!(retry_after > Duration::from_secs(50)),
        other => panic!("a renewed claim was not in flight: {other:?}"),
    }
    assert!(!store
        .renew(&Permit::forged(&k, f.fence().get() + 1), LONG, None)
        .await
        .unwrap());
    assert!(!store
        .renew(
            &Permit::forged(&fresh_key("absent"), f.fence().get()),
            LONG,
            None
        )
        .await
        .unwrap());
    complete(store, &f, Bytes::from_static(b"done")).await;
    assert!(
        !store.renew(&f, LONG, None).await.unwrap(),
        "renewed a completed record"
    );

    // A takeover fences the old owner's renewals out.
    let k = fresh_key("renew-takeover");
    let f1 = won(store.claim(req(&k, &H1, short, LONG)).await.unwrap(), false);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let f2 = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), true);
    assert!(!store.renew(&f1, LONG, None).await.unwrap());
    assert!(store.renew(&f2, LONG, None).await.unwrap());
}

/// A claim made with `hold` whose lease ends without an outcome is held: claims get `Held`
/// (the first one told so), never a takeover, and inspect shows it `unknown`. An operator
/// resolves it once under its fence: a second resolution, or a stale fence, is refused.
pub async fn a_held_claim_is_never_taken_over_and_resolves_once(store: &Store) {
    let short = Duration::from_millis(100);
    let held = |k| {
        let mut r = req(k, &H1, short, LONG);
        r.hold = true;
        r
    };
    let k = fresh_key("held");
    let f = won(store.claim(held(&k)).await.unwrap(), false);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        store.claim(held(&k)).await.unwrap(),
        Claim::Held {
            fence: f.fence(),
            first: true
        }
    );
    // Whatever the later claim's own route says, the record holds.
    assert_eq!(
        store.claim(req(&k, &H1, short, LONG)).await.unwrap(),
        Claim::Held {
            fence: f.fence(),
            first: false
        }
    );
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Unknown);
    assert!(info.held);
    assert_eq!(info.fence, f.fence());
    // Resolved as "retry": the next claim executes under a higher fence.
    assert!(!store
        .resolve(&k, Fence::new(f.fence().get() + 1), Resolution::Retry, LONG)
        .await
        .unwrap());
    assert!(store
        .resolve(&k, f.fence(), Resolution::Retry, LONG)
        .await
        .unwrap());
    assert!(
        !store
            .resolve(&k, f.fence(), Resolution::Retry, LONG)
            .await
            .unwrap(),
        "a second resolution under one fence"
    );
    let f2 = won(store.claim(held(&k)).await.unwrap(), false);
    assert!(f2.fence() > f.fence());
    assert_eq!(
        store.inspect(&k).await.unwrap().unwrap().state,
        RecordState::InFlight
    );

    // Resolved as "done": duplicates replay the given record.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(matches!(
        store.claim(held(&k)).await.unwrap(),
        Claim::Held { first: true, .. }
    ));
    let record = Bytes::from_static(b"resolved");
    assert!(!store
        .resolve(&k, f.fence(), Resolution::Done(record.clone()), LONG)
        .await
        .unwrap());
    assert!(store
        .resolve(&k, f2.fence(), Resolution::Done(record.clone()), LONG)
        .await
        .unwrap());
    assert!(!store
        .resolve(
            &k,
            f2.fence(),
            Resolution::Done(Bytes::from_static(b"other")),
            LONG
        )
        .await
        .unwrap());
    assert_eq!(store.claim(held(&k)).await.unwrap(), Claim::Replay(record));
}

/// A held claim's own call may still answer after its lease: its completion is stored
/// and replayed whole, though the record was rewritten as held since the claim wrote it
/// (the string layout compares the claim's value first, then decides by the fence).
pub async fn a_held_claims_late_answer_is_stored_and_replayed(store: &Store) {
    let short = Duration::from_millis(100);
    let k = fresh_key("held-late");
    let held = || {
        let mut r = req(&k, &H1, short, LONG);
        r.hold = true;
        r
    };
    let f = won(store.claim(held()).await.unwrap(), false);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        store.claim(held()).await.unwrap(),
        Claim::Held {
            fence: f.fence(),
            first: true
        }
    );
    let record = Bytes::from(b"late \x00answer ".repeat(20));
    assert_eq!(
        complete(store, &f, record.clone()).await,
        Completion::Completed
    );
    assert_eq!(store.claim(held()).await.unwrap(), Claim::Replay(record));
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, RecordState::Completed);
    assert_eq!(info.fence, f.fence());
}

/// A record counts the claims that won it (the first, each takeover, each reclaim after a
/// release) and tells when the current claim won and when it was completed.
pub async fn inspect_counts_attempts_and_shows_when_claimed_and_completed(store: &Store) {
    use std::time::SystemTime;
    // Store clocks are the machine's own here; a second's slack covers rounding.
    let slack = Duration::from_secs(1);
    let around = |t: Option<SystemTime>, from: SystemTime| {
        let t = t.expect("a time is shown");
        assert!(t + slack >= from && t <= SystemTime::now() + slack, "{t:?}");
        t
    };
    let k = fresh_key("attempts");
    let lease = Duration::from_millis(300);
    let start = SystemTime::now();
    won(store.claim(req(&k, &H1, lease, LONG)).await.unwrap(), false);
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.attempts, 1);
    let first = around(info.claimed_at, start);
    assert_eq!(info.completed_at, None);

    tokio::time::sleep(Duration::from_millis(400)).await;
    let f2 = won(store.claim(req(&k, &H1, lease, LONG)).await.unwrap(), true);
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.attempts, 2, "a takeover is one more attempt");
    let second = around(info.claimed_at, start);
    assert!(
        second > first,
        "the takeover's claim time replaces the first"
    );

    assert!(store.release(&f2, LONG, None).await.unwrap());
    let f3 = won(store.claim(req(&k, &H1, LONG, LONG)).await.unwrap(), false);
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        info.attempts, 3,
        "a reclaim after a release is one more attempt"
    );
    assert_eq!(info.completed_at, None);

    let before_completion = SystemTime::now();
    complete(store, &f3, Bytes::from_static(b"done")).await;
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.attempts, 3);
    let done = around(info.completed_at, before_completion);
    assert!(done >= info.claimed_at.unwrap());
    // A fresh key starts counting again.
    let k2 = fresh_key("attempts-fresh");
    won(store.claim(req(&k2, &H1, LONG, LONG)).await.unwrap(), false);
    assert_eq!(store.inspect(&k2).await.unwrap().unwrap().attempts, 1);
}

/// Ordered claims: one version of an entity in flight at a time; a release frees the entity
/// without raising its highest version; a completion raises it (never lowers it, even when
/// a dead claim of an older version completes late); a version not above it is stale,
/// while a retry of the completed key still replays. Renewal keeps the marker alive, and a
/// dead claim's marker does not block the next version. Every key shares one hash tag, as
/// a cluster needs for the two keys of one script.
pub async fn versions_of_one_entity_complete_in_order(store: &Store) {
    let base = fresh_key("order");
    let tag = base.as_str().split(':').nth(1).unwrap().to_owned();
    let key = |name: &str| StoreKey::from_raw(format!("contract:{tag}:{name}"));
    let entity = key("=entity:e");
    let v = |n: u8| [b'0', b'0', b'0', b'0' + n];
    let ordered = |k: &'static str, n: u8| (key(k), v(n));
    let claim = |k: &StoreKey, version: [u8; 4], lease: Duration| {
        let version = version.to_vec();
        let k = k.clone();
        let entity = entity.clone();
        async move {
            let mut r = req(&k, &H1, lease, LONG);
            r.order = Some(Order {
                entity: &entity,
                version: &version,
            });
            store.claim(r).await.unwrap()
        }
    };
    fn order<'a>(entity: &'a StoreKey, version: &'a [u8; 4]) -> Order<'a> {
        Order {
            entity,
            version: &version[..],
        }
    }

    let (k2, v2) = ordered("v2", 2);
    let f2 = won(claim(&k2, v2, LONG).await, false);
    // Another version of the entity while v2 is in flight, older or newer: a conflict.
    let (k1, v1) = ordered("v1", 1);
    assert!(matches!(claim(&k1, v1, LONG).await, Claim::Conflict { .. }));
    let (k3, v3) = ordered("v3", 3);
    assert!(matches!(claim(&k3, v3, LONG).await, Claim::Conflict { .. }));
    // v2 released (a 5xx): the entity is free and its highest version unchanged.
    assert!(store
        .release(&f2, LONG, Some(order(&entity, &v2)))
        .await
        .unwrap());
    let f1 = won(claim(&k1, v1, LONG).await, false);
    assert_eq!(
        store
            .complete(
                &f1,
                Bytes::from_static(b"v1"),
                LONG,
                Some(order(&entity, &v1))
            )
            .await
            .unwrap(),
        Completion::Completed
    );
    // v2 again (its released key reclaimed) wins and completes: the mark is v2.
    let f2 = won(claim(&k2, v2, LONG).await, false);
    store
        .complete(
            &f2,
            Bytes::from_static(b"v2"),
            LONG,
            Some(order(&entity, &v2)),
        )
        .await
        .unwrap();
    // v1 under a new key, and v2 under a new key: not above the mark, stale.
    assert_eq!(claim(&key("v1-again"), v1, LONG).await, Claim::Stale);
    assert_eq!(claim(&key("v2-again"), v2, LONG).await, Claim::Stale);
    // A retry of the completed v2 key replays (the key comes before the order).
    assert_eq!(
        claim(&k2, v2, LONG).await,
        Claim::Replay(Bytes::from_static(b"v2"))
    );

    // v3 claimed with a short lease and renewed past it: the marker lives on.
    let short = Duration::from_millis(300);
    let f3 = won(claim(&k3, v3, short).await, false);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(store
        .renew(&f3, Duration::from_millis(600), Some(order(&entity, &v3)))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (k4, v4) = ordered("v4", 4);
    assert!(matches!(claim(&k4, v4, LONG).await, Claim::Conflict { .. }));
    // v3's claim dies (no renewal): once its lease ends, v4 is not blocked by its marker.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let f4 = won(claim(&k4, v4, LONG).await, false);
    store
        .complete(
            &f4,
            Bytes::from_static(b"v4"),
            LONG,
            Some(order(&entity, &v4)),
        )
        .await
        .unwrap();
    // The dead v3 completing late (nobody took its key over) does not lower the mark.
    store
        .complete(
            &f3,
            Bytes::from_static(b"v3"),
            LONG,
            Some(order(&entity, &v3)),
        )
        .await
        .unwrap();
    assert_eq!(claim(&key("v4-again"), v4, LONG).await, Claim::Stale);
    let (k5, v5) = ordered("v5", 5);
    won(claim(&k5, v5, LONG).await, false);
}
