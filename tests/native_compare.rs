//! Completions without Lua on a server that compares and sets natively (`SET ... IFEQ`:
//! Valkey 8.1, built by `scripts/test` from Debian's source), and the script on one that
//! does not (Redis 7.0): the same records, the same ownership, the store contract on both.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use dedupe_gateway::store::{
    Claim, Completion, Permit, RedisClusterStore, RedisStore, Store, StoreKey,
};
use dedupe_test_support::claims::{claim, store_on, won, LONG};
use dedupe_test_support::{
    fleet, store_contract, GatewayConfig, GatewayProcess, Http, RedisCluster, RedisServer,
    RouteCfg, StoreCfg, Upstream,
};

fn valkey_string_store() -> (Store, RedisServer) {
    let valkey = RedisServer::start_valkey(&[]);
    (store_on(&valkey), valkey)
}

/// A Valkey cluster this test binary shares, started by the first test that asks.
fn valkey_cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start_valkey)
}

fn valkey_cluster_string_store() -> (Store, ()) {
    let store = RedisClusterStore::new(&valkey_cluster().urls(), Duration::from_secs(2)).unwrap();
    (Store::Cluster(Box::new(store)), ())
}

store_contract!(valkey_string, valkey_string_store);
store_contract!(valkey_cluster_string, valkey_cluster_string_store);

/// Completes `permit`'s claim with `body`.
async fn complete(s: &Store, permit: &Permit, body: &'static [u8]) -> Completion {
    s.complete(permit, Bytes::from_static(body), LONG, None)
        .await
        .unwrap()
}

/// `INFO commandstats`: command → (calls, failed and rejected calls).
fn commandstats(redis: &RedisServer) -> HashMap<String, (u64, u64)> {
    let info: String = redis.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, fields) = l.split_once(':')?;
            let field = |f: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            Some((
                name.to_owned(),
                (
                    field("calls"),
                    field("failed_calls") + field("rejected_calls"),
                ),
            ))
        })
        .collect()
}

/// Scripts that ran (an `EVALSHA` refused with `NOSCRIPT` is sent again as `EVAL`).
fn scripts_run(stats: &HashMap<String, (u64, u64)>) -> u64 {
    ["evalsha", "eval"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .map(|(calls, failed)| calls - failed)
        .sum()
}

/// The record completed from a claim, with the fields that differ between claims (fence,
/// claim time) masked.
fn masked(v: &[u8]) -> Vec<u8> {
    let mut v = v.to_vec();
    v[3..11].fill(0);
    v[19..27].fill(0);
    v
}

/// Completes a fresh claim and a renewed one of `who` on `redis`; returns the two records
/// as written (masked) and the scripts each completion ran.
async fn complete_fresh_and_renewed(redis: &RedisServer, who: u128) -> [(Vec<u8>, u64); 2] {
    let s = store_on(redis);
    let mut out = Vec::new();
    for (name, renew) in [("fresh", false), ("renewed", true)] {
        let k = StoreKey::from_raw(format!("native:{name}"));
        let permit = won(&s, &k, LONG, who).await;
        if renew {
            assert!(s.renew(&permit, LONG, None).await.unwrap(), "{name}");
        }
        let before = scripts_run(&commandstats(redis));
        assert_eq!(
            complete(&s, &permit, b"the answer").await,
            Completion::Completed,
            "{name}"
        );
        let scripts = scripts_run(&commandstats(redis)) - before;
        let v: Vec<u8> = redis.cmd(&["GET", k.as_str()]);
        assert_eq!(
            u64::from_be_bytes(v[3..11].try_into().unwrap()),
            permit.fence().get(),
            "{name}: the permit's fence"
        );
        assert_eq!(
            u64::from_be_bytes(v[19..27].try_into().unwrap()),
            permit.fence().get() / 1000,
            "{name}: the claim time, the fence's milliseconds"
        );
        assert_eq!(&v[105..], b"the answer", "{name}");
        out.push((masked(&v), scripts));
    }
    out.try_into().unwrap()
}

/// On Valkey a fresh claim completes with one `SET ... IFEQ` and no script; a renewed
/// one (its record rewritten) through the script. Both records are byte for byte what
/// Redis 7.0 writes for the same claims, and the record the gateway builds for a fresh
/// claim (sent with `IFEQ`, or to the script's compare-and-set) is the one the script
/// packs itself for a renewed claim, fence and claim time checked against each permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_claim_completes_natively_with_the_scripts_record() {
    let valkey = RedisServer::start_valkey(&[]);
    let redis = RedisServer::start();
    let [(fresh, fresh_scripts), (renewed, renewed_scripts)] =
        complete_fresh_and_renewed(&valkey, 7).await;
    assert_eq!(fresh_scripts, 0, "a fresh claim's completion ran a script");
    assert!(
        renewed_scripts >= 1,
        "a renewed claim's completion is the script's"
    );
    let [(lua_fresh, _), (lua_renewed, _)] = complete_fresh_and_renewed(&redis, 7).await;
    assert_eq!(
        fresh, lua_fresh,
        "IFEQ and Redis 7.0's compare-and-set differ"
    );
    assert_eq!(renewed, lua_renewed);
    assert_eq!(
        fresh, renewed,
        "the record the gateway builds and the one the script packs differ"
    );
    let stats = commandstats(&valkey);
    assert_eq!(stats.get("set").map(|s| s.1), Some(0), "{stats:?}");
}

/// On a Valkey cluster too, a fresh claim completes with no script (on whichever master
/// holds its slot), and its record replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_completes_natively() {
    let (s, ()) = valkey_cluster_string_store();
    let scripts = || -> u64 {
        valkey_cluster()
            .nodes
            .iter()
            .map(|n| scripts_run(&commandstats(n)))
            .sum()
    };
    let before = scripts();
    for i in 0..6 {
        let k = StoreKey::from_raw(format!("native-cluster:{i}"));
        let permit = won(&s, &k, LONG, 100 + i).await;
        assert_eq!(
            complete(&s, &permit, b"clustered").await,
            Completion::Completed
        );
        match s.claim(claim(&k, LONG, 200 + i)).await.unwrap() {
            Claim::Replay(r) => assert_eq!(&r[..], b"clustered"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        scripts() - before,
        0,
        "a completion on the cluster ran a script"
    );
}

/// Redis 7.0 has no `IFEQ`: the first completion on a connection learns it (one refused
/// `SET`, nothing written) and every completion runs the script, until the connection is
/// replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_ifeq_is_learnt_once_per_connection() {
    let redis = RedisServer::start();
    let s = store_on(&redis);
    let completes = |from: u128, to: u128| {
        let s = s.clone();
        async move {
            for i in from..to {
                let k = StoreKey::from_raw(format!("learn:{i}"));
                let permit = won(&s, &k, LONG, 10 + i).await;
                assert_eq!(complete(&s, &permit, b"done").await, Completion::Completed);
                let info = s.inspect(&k).await.unwrap().unwrap();
                assert_eq!(info.response.as_deref(), Some(&b"done"[..]));
            }
        }
    };
    completes(0, 3).await;
    let stats = commandstats(&redis);
    assert_eq!(stats.get("set").map(|s| s.1), Some(1), "{stats:?}");
    assert_eq!(scripts_run(&stats), 3, "{stats:?}");
    // A new connection may reach another server (a failover): it is asked once more,
    // and the completion that asks still completes, by the script.
    let _: i64 = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    completes(3, 6).await;
    let stats = commandstats(&redis);
    assert_eq!(stats.get("set").map(|s| s.1), Some(2), "{stats:?}");
    assert_eq!(scripts_run(&stats), 6, "{stats:?}");
}

/// A claim whose record was deleted and claimed again by another is fenced out: its
/// `IFEQ` finds the other claimant's value, and the script refuses it. A completion sent
/// twice (a retry after a lost reply) is completed both times and writes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_holds_without_the_script() {
    let valkey = RedisServer::start_valkey(&[]);
    let s = store_on(&valkey);
    let k = StoreKey::from_raw("native:zombie");
    let zombie = won(&s, &k, LONG, 1).await;
    let _: i64 = valkey.cmd(&["DEL", k.as_str()]);
    // A later millisecond: a fresh record deleted and claimed again within the same one
    // gets the same fence number (a documented limit, docs/redis.md), and once completed
    // it is owned by that number.
    tokio::time::sleep(Duration::from_millis(3)).await;
    let owner = won(&s, &k, LONG, 2).await;
    assert!(owner.fence() > zombie.fence());
    assert_eq!(complete(&s, &zombie, b"zombie").await, Completion::Fenced);
    for _ in 0..2 {
        assert_eq!(complete(&s, &owner, b"owner").await, Completion::Completed);
    }
    assert_eq!(complete(&s, &zombie, b"zombie").await, Completion::Fenced);
    let info = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.fence, owner.fence());
    assert_eq!(info.response.as_deref(), Some(&b"owner"[..]));
    // A lease that ran out and was taken over: the takeover rewrote the record.
    let k = StoreKey::from_raw("native:taken");
    let late = won(&s, &k, Duration::from_millis(50), 3).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let Claim::Won {
        permit: taker,
        takeover: Some(_),
    } = s.claim(claim(&k, LONG, 4)).await.unwrap()
    else {
        panic!("no takeover")
    };
    assert_eq!(complete(&s, &late, b"late").await, Completion::Fenced);
    assert_eq!(complete(&s, &taker, b"taker").await, Completion::Completed);
    let info = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.response.as_deref(), Some(&b"taker"[..]));
}

/// Gateways of both layouts on one Valkey: the same keys sent concurrently to both execute
/// once each, and replays, on either, are the upstream's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_valkey_executes_each_key_once() {
    let valkey = RedisServer::start_valkey(&[]);
    fleet::executes_each_key_once(&valkey, 30, 4).await;
}

/// A call that outlived a third of its lease was renewed, which rewrote its record: its
/// completion goes straight to the script, without first sending the response in a
/// `SET ... IFEQ` that could only miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_call_completes_through_the_script_alone() {
    let valkey = RedisServer::start_valkey(&[]);
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(valkey.url()).timeout("1s"))
            .default_lease("300ms")
            .default_window("1h")
            .upstream_timeout("10s")
            .route(RouteCfg::header("orders", "/orders/*")),
    );
    let http = Http::new();
    let monitor = Monitor::start(&valkey);
    let r = http
        .post(
            &gw.url("/orders/x"),
            &[("Idempotency-Key", "slow"), ("x-test-delay-ms", "450")],
            "{}",
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    let replay = http
        .post(&gw.url("/orders/x"), &[("Idempotency-Key", "slow")], "{}")
        .await;
    assert!(replay.replayed(), "{}", replay.text());
    let sent = monitor.stop();
    assert!(
        !sent.iter().any(|l| l.contains("\"IFEQ\"")),
        "a renewed call's completion tried IFEQ: {sent:#?}"
    );
    assert!(sent.iter().any(|l| l.contains("EVALSHA")), "{sent:#?}");
    assert_eq!(up.effects(), 1);
    // The control: a quick call's completion is the `IFEQ`.
    let monitor = Monitor::start(&valkey);
    let r = http
        .post(&gw.url("/orders/x"), &[("Idempotency-Key", "quick")], "{}")
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    let sent = monitor.stop();
    assert!(sent.iter().any(|l| l.contains("\"IFEQ\"")), "{sent:#?}");
}

/// Only a server that cannot parse `IFEQ` is taken for one without it: a completion
/// refused for another reason (a response over the server's `proto-max-bulk-len`) leaves
/// the next ones native.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_refusal_is_not_taken_for_a_server_without_ifeq() {
    let valkey = RedisServer::start_valkey(&["--proto-max-bulk-len", "1mb"]);
    let s = store_on(&valkey);
    let k = StoreKey::from_raw("native:huge");
    let permit = won(&s, &k, LONG, 31).await;
    let huge = Bytes::from(vec![b'x'; 1536 * 1024]);
    assert!(s.complete(&permit, huge, LONG, None).await.is_err());
    let monitor = Monitor::start(&valkey);
    let k = StoreKey::from_raw("native:small");
    let permit = won(&s, &k, LONG, 32).await;
    assert_eq!(complete(&s, &permit, b"small").await, Completion::Completed);
    let sent = monitor.stop();
    assert!(sent.iter().any(|l| l.contains("\"IFEQ\"")), "{sent:#?}");
    assert!(!sent.iter().any(|l| l.contains("EVALSHA")), "{sent:#?}");
}

/// Two claims with one fence number (a fresh record deleted and claimed again within its
/// millisecond, made here by giving the second claim's record the first one's expiry): the
/// first owner can neither renew nor complete the second's record, before or after the
/// second has renewed or completed it; the second's own retry still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_completion_under_a_shared_fence_number_is_fenced() {
    for server in [RedisServer::start_valkey(&[]), RedisServer::start()] {
        let s = store_on(&server);
        let k = StoreKey::from_raw("native:same-ms");
        let first = won(&s, &k, LONG, 51).await;
        let mut value: Vec<u8> = server.cmd(&["GET", k.as_str()]);
        let expires: i64 = server.cmd(&["PEXPIRETIME", k.as_str()]);
        let _: i64 = server.cmd(&["DEL", k.as_str()]);
        // The second claim's own value, created at the first's millisecond.
        value[55..71].copy_from_slice(&52u128.to_be_bytes());
        let mut c = server.connection().unwrap();
        let _: () = redis::cmd("SET")
            .arg(k.as_str())
            .arg(&value)
            .arg("PXAT")
            .arg(expires)
            .query(&mut c)
            .unwrap();
        let second = won(&s, &k, LONG, 52).await;
        assert_eq!(second.fence(), first.fence(), "one fence number");
        // Renewed, the second's record carries the shared number in its header.
        assert!(s.renew(&second, LONG, None).await.unwrap());
        assert!(!s.renew(&first, LONG, None).await.unwrap());
        assert_eq!(complete(&s, &first, b"first").await, Completion::Fenced);
        assert_eq!(
            complete(&s, &second, b"second").await,
            Completion::Completed
        );
        assert_eq!(complete(&s, &first, b"first").await, Completion::Fenced);
        // The second's own retry is still a completion.
        assert_eq!(
            complete(&s, &second, b"second").await,
            Completion::Completed
        );
        let info = s.inspect(&k).await.unwrap().unwrap();
        assert_eq!(info.response.as_deref(), Some(&b"second"[..]));
    }
}

/// Valkey paused (`CLIENT PAUSE`: TCP up, no replies) when a completion's `IFEQ` is sent:
/// the completion fails within its deadline, as a script's did, having written nothing;
/// the claim stays in flight, and once the pause ends its owner completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_fails_the_completion_within_its_deadline() {
    let valkey = RedisServer::start_valkey(&[]);
    let s = Store::Redis(RedisStore::new(&valkey.url(), Duration::from_millis(250)).unwrap());
    let k = StoreKey::from_raw("native:paused");
    let permit = won(&s, &k, LONG, 41).await;
    let started = std::time::Instant::now();
    let _: () = valkey.cmd(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let done = s
        .complete(&permit, Bytes::from_static(b"paused"), LONG, None)
        .await;
    assert!(done.is_err(), "{done:?}");
    // Bounded by `store.timeout`, not by the pause (generous for a loaded machine).
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "{:?}",
        started.elapsed()
    );
    // Once the pause is over (the store's connection may have been replaced meanwhile).
    tokio::time::sleep(Duration::from_millis(1700).saturating_sub(started.elapsed())).await;
    let info = s.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.state, dedupe_gateway::store::RecordState::InFlight);
    assert_eq!(complete(&s, &permit, b"later").await, Completion::Completed);
}

/// Every command a server runs, as `MONITOR` shows it, from when `start` returns.
struct Monitor {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(redis: &RedisServer) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "monitor"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("redis-cli");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if line == "OK" {
                    let _ = tx.send(());
                }
                kept.lock().unwrap().push(line);
            }
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("MONITOR did not start");
        Self { child, lines }
    }

    /// The commands seen so far (a moment's grace for the last to arrive).
    fn stop(mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(200));
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.lines.lock().unwrap())
    }
}

/// A forget in a fresh claim's millisecond waits it out: the key claimed again at once
/// gets a higher fence, every time. A value that is not a record is deleted as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_forgotten_and_claimed_again_at_once_gets_a_higher_fence() {
    let server = RedisServer::start();
    let s = store_on(&server);
    for i in 0..100u128 {
        let k = StoreKey::from_raw(format!("native:forget-{i}"));
        let first = won(&s, &k, LONG, 2 * i + 1).await;
        assert!(s.forget(&k).await.unwrap());
        let second = won(&s, &k, LONG, 2 * i + 2).await;
        assert!(
            second.fence() > first.fence(),
            "round {i}: {} after {}",
            second.fence(),
            first.fence()
        );
    }
    let k = StoreKey::from_raw("native:not-a-record");
    let _: () = server.cmd(&["SET", k.as_str(), "x"]);
    assert!(s.forget(&k).await.unwrap());
    assert!(!s.forget(&k).await.unwrap());
    let _: () = server.cmd(&["HSET", k.as_str(), "s", "c"]);
    assert!(s.forget(&k).await.unwrap());
}
