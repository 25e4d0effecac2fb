//! `store.record_layout`: a fleet mid-upgrade, gateways of both layouts on one real Redis.
//! Each reads the other's records as its own: replays, conflicts, mismatches, takeovers
//! and settlements agree, and no key executes twice.

use std::time::Duration;

use bytes::Bytes;
use dedupe_gateway::config::RecordLayout;
use dedupe_gateway::store::{
    Claim, ClaimRequest, Claimant, Completion, RecordState, RedisStore, RequestHash, Store,
    StoreKey,
};
use dedupe_test_support::{fleet, RedisServer};

const H1: RequestHash = RequestHash::new([1; 32]);
const H2: RequestHash = RequestHash::new([2; 32]);
const LONG: Duration = Duration::from_secs(60);

fn store(redis: &RedisServer, layout: RecordLayout) -> Store {
    Store::Redis(
        RedisStore::new(&redis.url(), Duration::from_secs(1))
            .unwrap()
            .with_record_layout(layout),
    )
}

fn claim<'a>(
    key: &'a StoreKey,
    hash: &'a RequestHash,
    lease: Duration,
    who: u128,
) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        request_hash: hash,
        lease,
        window: LONG,
        claimant: Claimant::new(who),
        hold: false,
        order: None,
    }
}

/// The writer's record, met by the reader of the other layout: conflict, mismatch,
/// takeover with a higher fence, the zombie fenced out, replay, inspection, forget.
async fn the_other_layout_is_read_as_its_own(writer: &Store, reader: &Store, name: &str) {
    let k = StoreKey::from_raw(format!("mixed:{name}"));
    let lease = Duration::from_millis(300);
    let Claim::Won { permit: first, .. } = writer.claim(claim(&k, &H1, lease, 1)).await.unwrap()
    else {
        panic!("the writer's first claim did not win")
    };
    assert!(matches!(
        reader.claim(claim(&k, &H1, lease, 2)).await.unwrap(),
        Claim::Conflict { .. }
    ));
    assert_eq!(
        reader.claim(claim(&k, &H2, lease, 2)).await.unwrap(),
        Claim::Mismatch
    );
    let seen = reader.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        (seen.state, seen.fence, seen.attempts),
        (RecordState::InFlight, first.fence(), 1)
    );
    let own = writer.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        (own.state, own.fence, own.claimed_at, own.held),
        (seen.state, seen.fence, seen.claimed_at, seen.held)
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    let Claim::Won {
        permit: second,
        takeover: Some(old),
    } = reader.claim(claim(&k, &H1, LONG, 3)).await.unwrap()
    else {
        panic!("no takeover across layouts")
    };
    assert_eq!(old, first.fence());
    assert!(second.fence() > first.fence());
    // The zombie, on either gateway, can neither renew, complete nor release.
    assert!(!writer.renew(&first, LONG, None).await.unwrap());
    assert_eq!(
        writer
            .complete(&first, Bytes::from_static(b"zombie"), LONG, None)
            .await
            .unwrap(),
        Completion::Fenced
    );
    assert!(!reader.release(&first, LONG, None).await.unwrap());
    // The owner renews and completes through the other gateway's store just as well.
    assert!(writer.renew(&second, LONG, None).await.unwrap());
    assert_eq!(
        writer
            .complete(&second, Bytes::from_static(b"done"), LONG, None)
            .await
            .unwrap(),
        Completion::Completed
    );
    for s in [writer, reader] {
        assert_eq!(
            s.claim(claim(&k, &H1, LONG, 4)).await.unwrap(),
            Claim::Replay(Bytes::from_static(b"done"))
        );
        assert_eq!(
            s.claim(claim(&k, &H2, LONG, 4)).await.unwrap(),
            Claim::Mismatch
        );
    }
    let info = reader.inspect(&k).await.unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (RecordState::Completed, 2));
    assert_eq!(info.response.as_deref(), Some(&b"done"[..]));
    assert!(reader.forget(&k).await.unwrap());
    // Reused after the delete, by either layout: the fence still rises.
    let Claim::Won { permit: third, .. } = reader.claim(claim(&k, &H1, LONG, 5)).await.unwrap()
    else {
        panic!("a forgotten key was not claimed afresh")
    };
    assert!(third.fence() > second.fence());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_layout_reads_the_others_records() {
    let redis = RedisServer::start();
    let hash = store(&redis, RecordLayout::Hash);
    let string = store(&redis, RecordLayout::String);
    the_other_layout_is_read_as_its_own(&hash, &string, "hash-first").await;
    the_other_layout_is_read_as_its_own(&string, &hash, "string-first").await;
    let kind: String = redis.cmd(&["TYPE", "mixed:hash-first"]);
    assert_eq!(kind, "string", "the string store wrote the reclaimed key");
    let kind: String = redis.cmd(&["TYPE", "mixed:string-first"]);
    assert_eq!(kind, "hash", "the hash store wrote the reclaimed key");
}

/// Two gateway processes, one of each layout, on one Redis: the same keys sent
/// concurrently to both execute once each, and every replay, on either, is the answer the
/// upstream gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_both_layouts_executes_each_key_once() {
    let redis = RedisServer::start();
    fleet::executes_each_key_once(&redis, 40, 6).await;
}

/// A slot migration sends a key's *remaining* TTL (`MIGRATE`), which moves a fresh string
/// record's absolute expiry, from which its fence derives: its owner still renews and
/// completes it under the fence it was granted, and a claim that did not win it (the key
/// deleted and claimed again) is never taken for its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_string_record_whose_expiry_moved_stays_its_owners() {
    let redis = RedisServer::start();
    let s = store(&redis, RecordLayout::String);
    let k = StoreKey::from_raw("moved:1");
    let Claim::Won { permit, .. } = s.claim(claim(&k, &H1, LONG, 7)).await.unwrap() else {
        panic!("the first claim did not win")
    };
    // What a migration does to the expiry: here 5 s later than Redis set it.
    let pttl: i64 = redis.cmd(&["PTTL", k.as_str()]);
    let _: i64 = redis.cmd(&["PEXPIRE", k.as_str(), &(pttl + 5000).to_string()]);
    let moved = s.inspect(&k).await.unwrap().unwrap();
    assert_ne!(
        moved.fence,
        permit.fence(),
        "the derived fence did not move"
    );
    assert!(
        s.renew(&permit, LONG, None).await.unwrap(),
        "its owner was refused"
    );
    let renewed = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        renewed.fence,
        permit.fence(),
        "the granted fence was not kept"
    );
    assert_eq!(
        s.complete(&permit, Bytes::from_static(b"kept"), LONG, None)
            .await
            .unwrap(),
        Completion::Completed
    );

    // Deleted while fresh and claimed again: the first owner is shut out.
    let k = StoreKey::from_raw("moved:2");
    let Claim::Won { permit: first, .. } = s.claim(claim(&k, &H1, LONG, 8)).await.unwrap() else {
        panic!("the first claim did not win")
    };
    assert!(s.forget(&k).await.unwrap());
    let Claim::Won { permit: second, .. } = s.claim(claim(&k, &H1, LONG, 9)).await.unwrap() else {
        panic!("the claim after the delete did not win")
    };
    assert!(!s.renew(&first, LONG, None).await.unwrap());
    assert_eq!(
        s.complete(&first, Bytes::from_static(b"zombie"), LONG, None)
            .await
            .unwrap(),
        Completion::Fenced
    );
    assert_eq!(
        s.complete(&second, Bytes::from_static(b"own"), LONG, None)
            .await
            .unwrap(),
        Completion::Completed
    );
}

/// A completion writes the same record whether it finds the claim's own header untouched
/// (written without unpacking it) or a record a renewal rewrote (unpacked and packed
/// again): the header agrees field by field but for the fence, the claim time and the
/// claimant, each the permit's own; a fresh record whose expiry moved is completed under
/// the fence its claim was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_writes_the_same_record_from_a_fresh_or_a_renewed_claim() {
    let redis = RedisServer::start();
    let s = store(&redis, RecordLayout::String);
    let raw = |k: &StoreKey| -> Vec<u8> { redis.cmd(&["GET", k.as_str()]) };
    let u64_at = |v: &[u8], at: usize| u64::from_be_bytes(v[at..at + 8].try_into().unwrap());
    let mut written = Vec::new();
    for (name, who, renew, moved) in [
        ("fresh", 21, false, false),
        ("renewed", 22, true, false),
        ("moved", 23, false, true),
    ] {
        let k = StoreKey::from_raw(format!("finish:{name}"));
        let Claim::Won { permit, .. } = s.claim(claim(&k, &H1, LONG, who)).await.unwrap() else {
            panic!("{name}: the claim did not win")
        };
        if renew {
            assert!(
                s.renew(&permit, LONG, None).await.unwrap(),
                "{name}: renewal"
            );
        }
        if moved {
            let pttl: i64 = redis.cmd(&["PTTL", k.as_str()]);
            let _: i64 = redis.cmd(&["PEXPIRE", k.as_str(), &(pttl + 5000).to_string()]);
        }
        assert_eq!(
            s.complete(&permit, Bytes::from_static(b"the answer"), LONG, None)
                .await
                .unwrap(),
            Completion::Completed,
            "{name}"
        );
        let v = raw(&k);
        let fence = permit.fence().get();
        assert_eq!((v[0], v[1]), (1, b'c'), "{name}: tag and state");
        assert_eq!(u64_at(&v, 3), fence, "{name}: the permit's fence");
        assert_eq!(u64_at(&v, 19), fence / 1000, "{name}: claim time");
        assert_eq!(
            u64_at(&v, 43),
            60_000,
            "{name}: the window as the TTL field"
        );
        assert_eq!(&v[55..71], &who.to_be_bytes()[..], "{name}: claimant");
        assert_eq!(&v[105..], b"the answer", "{name}: response");
        let info = s.inspect(&k).await.unwrap().unwrap();
        assert_eq!(info.state, RecordState::Completed, "{name}");
        assert_eq!(info.fence, permit.fence(), "{name}: inspected fence");
        // Masked: fence, claim time, claimant.
        let mut masked = v.clone();
        masked[3..11].fill(0);
        masked[19..27].fill(0);
        masked[55..71].fill(0);
        written.push((name, masked));
    }
    for (name, masked) in &written[1..] {
        assert_eq!(
            masked, &written[0].1,
            "{name} differs from a fresh claim's completion"
        );
    }
}
