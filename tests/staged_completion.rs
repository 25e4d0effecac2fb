//! Large completions on a server without `SET ... IFEQ` (Redis 7.0), string layout: the
//! completed record is written under a staged key and renamed onto the record by the
//! finish script, in one `MULTI`, so the response never becomes a Lua string
//! (`src/store/redis/staged.rs`). Each writes the record the script would write, decides
//! ownership as the script does, and leaves no staged key behind.

use std::time::Duration;

use bytes::Bytes;
use dedupe_gateway::protocol::key::store_key;
use dedupe_gateway::store::{Claim, Completion, RedisClusterStore, Store, StoreError, StoreKey};
use dedupe_test_support::claims::{claim, store_on, won, LONG};
use dedupe_test_support::{
    slot_of, start_moving_slot, GatewayConfig, GatewayProcess, Http, RedisCluster, RedisServer,
    RouteCfg, StoreCfg, Upstream,
};

/// `n` bytes that differ from one another (no run a compressor or a shared prefix hides).
fn big(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 8) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// A key as the gateway makes them: `dedupe:{tag}:route:scope:key`.
fn key(name: &str) -> StoreKey {
    store_key("dedupe", "payments", "-", name)
}

/// Every key on `redis` that is not a record's (a staged key left behind).
fn staged_keys(redis: &RedisServer) -> Vec<String> {
    redis.cmd(&["KEYS", "*~*"])
}

/// The record's value with the fields that differ between two claims (fence, claim
/// time) masked.
fn masked(v: &[u8]) -> Vec<u8> {
    let mut v = v.to_vec();
    v[3..11].fill(0);
    v[19..27].fill(0);
    v
}

/// A 64 KiB completion is renamed into place: the record is the one the finish script
/// writes for the same response (a key without a hash tag is never staged), its TTL is
/// the window, a claim replays it whole, and no staged key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_completion_is_staged_and_written_as_the_script_writes_it() {
    let redis = RedisServer::start();
    let s = store_on(&redis);
    let body = big(64 * 1024, 7);
    let staged = key("large-1");
    let scripted = StoreKey::from_raw("no-tag:large-2");
    // One claimant on two keys: the records differ only where two claims' do.
    for (i, k) in [&staged, &scripted].into_iter().enumerate() {
        let permit = won(&s, k, LONG, 1).await;
        let done = s.complete(&permit, body.clone(), LONG, None).await.unwrap();
        assert_eq!(done, Completion::Completed, "{k:?}");
        assert_eq!(
            redis.command_calls().get("rename"),
            Some(&1),
            "{k:?}: staged {i}"
        );
    }
    let value = |k: &StoreKey| -> Vec<u8> { redis.cmd(&["GET", k.as_str()]) };
    let (a, b) = (masked(&value(&staged)), masked(&value(&scripted)));
    assert_eq!(a[..105], b[..105], "the headers differ");
    assert!(
        a[105..] == b[105..] && a[105..] == body[..],
        "the responses differ"
    );
    let ttl: i64 = redis.cmd(&["PTTL", staged.as_str()]);
    assert!(ttl > 55_000 && ttl <= 60_000, "{ttl}");
    match s.claim(claim(&staged, LONG, 3)).await.unwrap() {
        Claim::Replay(r) => assert_eq!(r, body),
        other => panic!("{other:?}"),
    }
    assert!(staged_keys(&redis).is_empty(), "{:?}", staged_keys(&redis));
}

/// A renewed claim's record no longer holds its claim's value: the staged completion falls
/// through to the script's own decision, which completes it from the staged record. A
/// claim taken over is fenced out, and writes nothing. Neither leaves a staged key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_completion_decides_ownership_as_the_script_does() {
    let redis = RedisServer::start();
    let s = store_on(&redis);
    let body = big(8 * 1024, 1);
    let renewed = key("renewed");
    let permit = won(&s, &renewed, LONG, 10).await;
    assert!(s.renew(&permit, LONG, None).await.unwrap());
    let done = s.complete(&permit, body.clone(), LONG, None).await.unwrap();
    assert_eq!(done, Completion::Completed);
    let info = s.inspect(&renewed).await.unwrap().unwrap();
    assert_eq!(info.response, Some(body.clone()));
    assert_eq!(info.fence, permit.fence());
    // Sent again (a retry after a lost reply): completed, written once.
    let again = s.complete(&permit, body.clone(), LONG, None).await.unwrap();
    assert_eq!(again, Completion::Completed);

    let taken = key("taken");
    let late = won(&s, &taken, Duration::from_millis(50), 11).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let Claim::Won {
        permit: taker,
        takeover: Some(_),
    } = s.claim(claim(&taken, LONG, 12)).await.unwrap()
    else {
        panic!("no takeover")
    };
    let fenced = s
        .complete(&late, big(8 * 1024, 2), LONG, None)
        .await
        .unwrap();
    assert_eq!(fenced, Completion::Fenced);
    let info = s.inspect(&taken).await.unwrap().unwrap();
    assert_eq!(info.response, None, "the late completion wrote");
    let done = s.complete(&taker, body.clone(), LONG, None).await.unwrap();
    assert_eq!(done, Completion::Completed);
    let info = s.inspect(&taken).await.unwrap().unwrap();
    assert_eq!((info.fence, info.response), (taker.fence(), Some(body)));
    assert!(staged_keys(&redis).is_empty(), "{:?}", staged_keys(&redis));
}

/// A node that lost its scripts (`SCRIPT FLUSH`, a restart) answers the transaction's
/// `EVALSHA` with `NOSCRIPT` after the staged `SET` ran: the `DEL` in the same transaction
/// removes it, and the completion is sent again with `EVAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_script_completes_by_eval_and_keeps_no_staged_key() {
    let redis = RedisServer::start();
    let s = store_on(&redis);
    let body = big(4 * 1024, 3);
    let k = key("flushed");
    let permit = won(&s, &k, LONG, 20).await;
    let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
    let done = s.complete(&permit, body.clone(), LONG, None).await.unwrap();
    assert_eq!(done, Completion::Completed);
    let stats = redis.command_calls();
    assert_eq!(stats.get("eval"), Some(&1), "{stats:?}");
    assert_eq!(stats.get("rename"), Some(&1), "{stats:?}");
    let info = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.response, Some(body));
    assert!(staged_keys(&redis).is_empty(), "{:?}", staged_keys(&redis));
}

/// A key whose record was replaced by a hash (a pre-release build's layout): the staged
/// transaction's script meets `WRONGTYPE`, the completion fails as unreadable with the key
/// left as it was, and the staged key goes with the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_holding_a_hash_is_unreadable_and_left_as_it_is() {
    let redis = RedisServer::start();
    let s = store_on(&redis);
    let k = key("relaid");
    let zombie = won(&s, &k, LONG, 30).await;
    let _: i64 = redis.cmd(&["DEL", k.as_str()]);
    let _: i64 = redis.cmd(&["HSET", k.as_str(), "s", "i"]);
    let failed = s.complete(&zombie, big(4096, 4), LONG, None).await;
    assert!(
        matches!(failed, Err(StoreError::Unreadable(_))),
        "{failed:?}"
    );
    let kind: String = redis.cmd(&["TYPE", k.as_str()]);
    assert_eq!(kind, "hash");
    let fields: Vec<String> = redis.cmd(&["HGETALL", k.as_str()]);
    assert_eq!(fields, ["s", "i"]);
    assert!(staged_keys(&redis).is_empty(), "{:?}", staged_keys(&redis));
}

/// On Redis Cluster the staged key shares the record's hash tag, so the transaction runs
/// on the master that holds the record's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_stages_a_large_completion_in_the_records_slot() {
    let cluster = RedisCluster::start();
    let s = Store::Cluster(Box::new(
        RedisClusterStore::new(&cluster.urls(), Duration::from_secs(2)).unwrap(),
    ));
    for i in 0..6u8 {
        let k = key(&format!("clustered-{i}"));
        let body = big(16 * 1024, i);
        let permit = won(&s, &k, LONG, 40 + u128::from(i)).await;
        let done = s.complete(&permit, body.clone(), LONG, None).await.unwrap();
        assert_eq!(done, Completion::Completed);
        match s.claim(claim(&k, LONG, 50 + u128::from(i))).await.unwrap() {
            Claim::Replay(r) => assert_eq!(r, body),
            other => panic!("{other:?}"),
        }
    }
    let renames: u64 = cluster
        .nodes
        .iter()
        .map(|n| n.command_calls().get("rename").copied().unwrap_or(0))
        .sum();
    assert_eq!(renames, 6);
    for node in &cluster.nodes {
        assert!(staged_keys(node).is_empty(), "{:?}", staged_keys(node));
    }
}

/// Through the gateway: a 200 KB answer is stored staged, and a retry gets it byte for
/// byte, the upstream called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_replays_whole_through_the_gateway() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(redis.url()).timeout("1s"))
            .route(RouteCfg::header("orders", "/orders/*")),
    );
    let http = Http::new();
    let url = gw.url("/orders/1");
    let send = || {
        http.post(
            &url,
            &[
                ("Idempotency-Key", "big-1"),
                ("x-test-body-bytes", "200000"),
            ],
            "{}",
        )
    };
    let first = send().await;
    assert!(first.status.is_success(), "{}", first.status);
    assert_eq!(first.body.len(), 200_000);
    let again = send().await;
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(up.effects(), 1);
    assert_eq!(redis.command_calls().get("rename"), Some(&1));
    assert!(staged_keys(&redis).is_empty(), "{:?}", staged_keys(&redis));
}

/// A gateway on an ACL user: one granted the prefix's keys (`~dedupe:*`) stages, the
/// staged key being under the prefix. One denied `RENAME` gets the script's refusal (with
/// nothing written), completes that call unstaged, says so once, and stages no more; so
/// does one granted only records' keys, whose staged `SET` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_rename_completes_unstaged() {
    let redis = RedisServer::start();
    let acl = |user: &str, keys: &str, extra: &[&str]| {
        let mut args = vec!["ACL", "SETUSER", user, "on", ">pw", keys, "+@all"];
        args.extend_from_slice(extra);
        let _: String = redis.cmd(&args);
    };
    acl("stager", "~dedupe:*", &[]);
    acl("plain", "~dedupe:*", &["-rename"]);
    // Records' keys only: the staged key's SET is refused while queued, which the redis
    // crate's connection (here for the near-cache) reports as an aborted transaction.
    acl("tagged", "~dedupe:{*", &[]);
    let up = Upstream::start().await;
    let http = Http::new();
    let gateway = |user: &str, near: &str| {
        GatewayProcess::start(
            &GatewayConfig::new(up.url())
                .store(
                    StoreCfg::redis(format!("redis://{user}:pw@127.0.0.1:{}", redis.port))
                        .timeout("1s")
                        .near_cache(near),
                )
                .route(RouteCfg::header("orders", "/orders/*")),
        )
    };
    let (stager, plain) = (gateway("stager", "0"), gateway("plain", "0"));
    let tagged = gateway("tagged", "1MiB");
    let sends = [
        (&stager, "s"),
        (&plain, "p"),
        (&plain, "q"),
        (&tagged, "t"),
        (&tagged, "u"),
    ];
    for (gw, name) in sends {
        let url = gw.url("/orders/1");
        let headers = [("Idempotency-Key", name), ("x-test-body-bytes", "10000")];
        let send = || http.post(&url, &headers, "{}");
        let first = send().await;
        assert!(first.status.is_success(), "{name}: {}", first.text());
        let again = send().await;
        assert_eq!(
            (again.status, &again.body),
            (first.status, &first.body),
            "{name}"
        );
        if name == "s" {
            assert_eq!(redis.command_calls().get("rename"), Some(&1), "not staged");
        }
    }
    assert_eq!(up.effects(), 5);
    let refused = "Redis refused a staged completion";
    for gw in [&plain, &tagged] {
        let said = gw
            .log_lines()
            .iter()
            .filter(|l| l.contains(refused))
            .count();
        assert_eq!(said, 1, "{:?}", gw.log_lines());
    }
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    let rename = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_rename:"))
        .unwrap();
    // The stager's, and the plain gateway's first, refused: its second large completion
    // was never staged.
    assert!(
        rename.starts_with("cmdstat_rename:calls=1,") && rename.contains("rejected_calls=1,"),
        "{rename}"
    );
    // The tagged gateway's first staged `SET` refused while queued, its second never sent.
    let set = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_set:"))
        .unwrap();
    assert!(set.contains("rejected_calls=1,"), "{set}");
    assert!(staged_keys(&redis).is_empty(), "{:?}", staged_keys(&redis));
}

/// While a slot migrates, Redis discards a staged completion's transaction (the source
/// answers `ASK` for the staged key it lacks; the target, `TRYAGAIN`), and the redis crate
/// follows no redirect inside one: the completion is then sent unstaged, as one script,
/// which does follow `ASK`, before the records move and after. An inspection, also a
/// `MULTI`, is read by a script likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_completion_on_a_migrating_slot_is_sent_unstaged() {
    let cluster = RedisCluster::start();
    let s = Store::Cluster(Box::new(
        RedisClusterStore::new(&cluster.urls(), Duration::from_secs(2)).unwrap(),
    ));
    let slot = slot_of(key("moving-0").as_str());
    let keys: Vec<StoreKey> = (0..)
        .map(|i| key(&format!("moving-{i}")))
        .filter(|k| slot_of(k.as_str()) == slot)
        .take(2)
        .collect();
    let mut permits = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        permits.push(won(&s, k, LONG, 60 + i as u128).await);
    }
    let holds =
        |n: &RedisServer, k: &StoreKey| n.cmd::<Vec<String>>(&["KEYS", k.as_str()]).len() == 1;
    let source = cluster.nodes.iter().find(|n| holds(n, &keys[0])).unwrap();
    let target = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let slot = slot.to_string();
    // Migrating, the records still on the source; then the second moved to the target.
    tokio::task::block_in_place(|| start_moving_slot(&slot, &[], source, target));
    let body = big(16 * 1024, 9);
    let done = s
        .complete(&permits[0], body.clone(), LONG, None)
        .await
        .unwrap();
    assert_eq!(done, Completion::Completed);
    let moved = [keys[1].as_str()];
    tokio::task::block_in_place(|| start_moving_slot(&slot, &moved, source, target));
    let done = s
        .complete(&permits[1], body.clone(), LONG, None)
        .await
        .unwrap();
    assert_eq!(done, Completion::Completed);
    assert!(holds(target, &keys[1]));
    // An operator's inspection (a `MULTI` too) of the record moved, and of one on
    // neither node: the script reads them through `ASK`.
    let info = s.inspect(&keys[1]).await.unwrap().unwrap();
    assert_eq!(info.response, Some(body.clone()));
    let nowhere = (0..)
        .map(|i| key(&format!("nowhere-{i}")))
        .find(|k| slot_of(k.as_str()) == slot_of(keys[0].as_str()))
        .unwrap();
    assert_eq!(s.inspect(&nowhere).await.unwrap(), None);
    for (i, k) in keys.iter().enumerate() {
        match s.claim(claim(k, LONG, 70 + i as u128)).await.unwrap() {
            Claim::Replay(r) => assert_eq!(r, body),
            other => panic!("{other:?}"),
        }
    }
    for node in &cluster.nodes {
        assert!(staged_keys(node).is_empty(), "{:?}", staged_keys(node));
    }
}
