//! The record format on one real Redis: a fleet of gateways shares it, a fresh record's
//! derived fence and a completion's header hold, and a key that holds anything the gateway
//! cannot read as a record (another Redis type, a value no gateway wrote) fails closed,
//! written over by no operation and never forwarded, whatever the route's `on_error`.

use std::time::Duration;

use bytes::Bytes;
use dedupe_gateway::store::{
    Claim, ClaimRequest, Claimant, Completion, Order, RecordState, RedisStore, RequestHash, Store,
    StoreError, StoreKey,
};
use dedupe_test_support::{
    fleet, GatewayConfig, Http, RedisServer, RouteCfg, StoreCfg, TestGateway, Upstream,
};
use http::StatusCode;

const H1: RequestHash = RequestHash::new([1; 32]);
const LONG: Duration = Duration::from_secs(60);

fn store(redis: &RedisServer) -> Store {
    Store::Redis(RedisStore::new(&redis.url(), Duration::from_secs(1)).unwrap())
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

/// Two gateway processes on one Redis: the same keys sent concurrently to both execute
/// once each, and every replay, on either, is the answer the upstream gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_executes_each_key_once() {
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
    let s = store(&redis);
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
    let s = store(&redis);
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

/// What a key may hold that is no record of this gateway: a hash (a pre-release build's
/// layout), a string too short to be one, a string of another format (its tag byte), a
/// list.
fn unreadable_values(key: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut other_tag = vec![2u8; 105];
    other_tag[1] = b'c';
    other_tag[103..105].fill(0);
    vec![
        (
            "hash",
            vec!["HSET".into(), key.into(), "s".into(), "c".into()],
        ),
        (
            "garbage",
            vec!["SET".into(), key.into(), "not a record".into()],
        ),
        (
            "other-tag",
            vec![
                "SET".into(),
                key.into(),
                String::from_utf8(other_tag).unwrap(),
            ],
        ),
        ("list", vec!["RPUSH".into(), key.into(), "x".into()]),
    ]
}

fn put(redis: &RedisServer, args: &[String]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _: redis::Value = redis.cmd(&args);
}

fn dump(redis: &RedisServer, key: &str) -> Vec<u8> {
    redis.cmd(&["DUMP", key])
}

/// Every operation on a key that holds no record of this gateway fails as
/// [`StoreError::Unreadable`] and leaves the key as it was: a claim (plain or ordered), a
/// renewal and a completion by a permit whose record was replaced, an inspection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_holds_no_record_is_unreadable_and_left_as_it_is() {
    let redis = RedisServer::start();
    let s = store(&redis);
    let unreadable = |r: Result<_, StoreError>, what: &str| match r {
        Err(StoreError::Unreadable(_)) => {}
        other => panic!("{what}: {other:?}"),
    };
    let entity = StoreKey::from_raw("entity:1");
    for (name, args) in unreadable_values("unreadable:k") {
        let k = StoreKey::from_raw(format!("unreadable:{name}"));
        let args: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a == "unreadable:k" {
                    k.as_str().to_owned()
                } else {
                    a
                }
            })
            .collect();
        // A claim that won, its record replaced behind it.
        let Claim::Won { permit, .. } = s.claim(claim(&k, &H1, LONG, 1)).await.unwrap() else {
            panic!("{name}: the first claim did not win")
        };
        let _: i64 = redis.cmd(&["DEL", k.as_str()]);
        put(&redis, &args);
        let before = dump(&redis, k.as_str());
        unreadable(
            s.claim(claim(&k, &H1, LONG, 2)).await.map(|_| ()),
            &format!("{name}: claim"),
        );
        if name != "hash" {
            // An ordered route's record is a hash: anything else under its key is not one.
            unreadable(
                s.claim(ClaimRequest {
                    order: Some(Order {
                        entity: &entity,
                        version: b"0001",
                    }),
                    ..claim(&k, &H1, LONG, 3)
                })
                .await
                .map(|_| ()),
                &format!("{name}: ordered claim"),
            );
        }
        unreadable(
            s.renew(&permit, LONG, None).await.map(|_| ()),
            &format!("{name}: renew"),
        );
        unreadable(
            s.complete(&permit, Bytes::from_static(b"answer"), LONG, None)
                .await
                .map(|_| ()),
            &format!("{name}: complete"),
        );
        if name != "hash" {
            // An operator's inspection reads a hash as an ordered route's record.
            unreadable(s.inspect(&k).await.map(|_| ()), &format!("{name}: inspect"));
        }
        assert_eq!(
            dump(&redis, k.as_str()),
            before,
            "{name}: the key was written"
        );
    }
    // An ordered route's record is a hash: a plain record under its key is not one.
    let k = StoreKey::from_raw("unreadable:ordered");
    let Claim::Won { .. } = s.claim(claim(&k, &H1, LONG, 1)).await.unwrap() else {
        panic!("the plain claim did not win")
    };
    unreadable(
        s.claim(ClaimRequest {
            order: Some(Order {
                entity: &entity,
                version: b"0001",
            }),
            ..claim(&k, &H1, LONG, 4)
        })
        .await
        .map(|_| ()),
        "a plain record under an ordered route's key",
    );
}

/// Through a gateway whose routes fail open: a request whose key holds no record of this
/// gateway is answered 500 `record-unreadable` and never reaches the upstream (its record
/// is there, so it may have run), unlike a store that does not answer; the key is left as
/// it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_holds_no_record_fails_closed_even_on_a_fail_open_route() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(redis.url()).timeout("1s"))
            .default_lease("5s")
            .default_window("1h")
            .route(RouteCfg::header("open", "/open/*").fail_open()),
    )
    .await;
    let http = Http::new();
    for (name, args) in unreadable_values("unreadable:k") {
        let key = format!("unreadable-{name}");
        let record = dedupe_gateway::protocol::key::store_key("dedupe", "open", "-", &key);
        let args: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a == "unreadable:k" {
                    record.as_str().to_owned()
                } else {
                    a
                }
            })
            .collect();
        put(&redis, &args);
        let before = dump(&redis, record.as_str());
        let r = http
            .post(&gw.url("/open/x"), &[("Idempotency-Key", &key)], "{}")
            .await;
        assert_eq!(
            r.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{name}: {}",
            r.text()
        );
        assert!(
            r.problem_type().ends_with("record-unreadable"),
            "{name}: {}",
            r.text()
        );
        assert_eq!(
            dump(&redis, record.as_str()),
            before,
            "{name}: the key was written"
        );
    }
    assert_eq!(
        up.effects(),
        0,
        "a request whose key holds no record was forwarded"
    );
    // The same route with a key of its own: forwarded and stored as usual.
    let r = http
        .post(&gw.url("/open/x"), &[("Idempotency-Key", "readable")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(up.effects(), 1);
}
