//! What a request costs Redis's main thread: `cargo bench --bench redis_cpu`.
//!
//! For each run, on a redis-server of its own: `BENCH_KEYS` new keys (default 20000),
//! each claimed and completed with a `BENCH_RESPONSE_BYTES`-byte response (default 200)
//! as a gateway does, then one replay of each; `BENCH_CONCURRENCY` (default 32) at once over the store's two multiplexed
//! connections (claims; completions). Redis's main-thread CPU (`used_cpu_user_main_thread` +
//! `used_cpu_sys_main_thread`, `INFO cpu`) before and after each phase, divided by the
//! requests, and `INFO commandstats` (calls per request, µs per call). The HTTP side is
//! left out: these are the commands the gateway sends per request, and Redis is the part
//! a fleet shares.
//!
//! First, the unit: a plain `SET key value PX window` per key (the value as long as the
//! response), sent the same way on the redis crate's multiplexed connection; each figure
//! after it is also given as a multiple of what that `SET` cost Redis in the same run.
//!
//! Two runs: `staged`, with keys as the gateway makes them (a completion of 2 KiB or more
//! is staged, `src/store/redis/staged.rs`), and `unstaged` with keys whose hash tag does
//! not follow the prefix, which no completion stages: the finish script then carries the
//! response.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dedupe_gateway::store::{
    Claim, ClaimRequest, Claimants, RedisStore, RequestHash, Store, StoreKey,
};
use dedupe_test_support::RedisServer;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Main-thread CPU in µs so far.
fn main_thread_cpu(redis: &RedisServer) -> f64 {
    let info: String = redis.cmd(&["INFO", "cpu"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in INFO cpu (Redis 7.0 or later?)"))
    };
    (field("used_cpu_user_main_thread") + field("used_cpu_sys_main_thread")) * 1e6
}

/// `INFO commandstats`: command -> (calls, usec).
fn commandstats(redis: &RedisServer) -> BTreeMap<String, (u64, u64)> {
    let info: String = redis.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let get = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))?
                    .parse::<u64>()
                    .ok()
            };
            Some((name.to_owned(), (get("calls")?, get("usec")?)))
        })
        .collect()
}

struct Phase {
    name: &'static str,
    requests: usize,
    cpu_us: f64,
    stats: BTreeMap<String, (u64, u64)>,
}

impl Phase {
    fn per_request(&self) -> f64 {
        self.cpu_us / self.requests as f64
    }

    /// Prints the phase; `unit` is a plain `SET`'s cost per request, in µs.
    fn print(&self, layout: &str, unit: f64) {
        println!(
            "{layout:>15} {:<8} {:>6.2} µs Redis main-thread CPU per request, {:.2} × SET PX ({} requests)",
            self.name,
            self.per_request(),
            self.per_request() / unit,
            self.requests
        );
        for (cmd, (calls, usec)) in &self.stats {
            if *calls == 0 || cmd == "info" {
                continue;
            }
            println!(
                "{:>26} {cmd:<12} {:>5.2} calls/request {:>6.2} µs/call",
                "",
                *calls as f64 / self.requests as f64,
                *usec as f64 / *calls as f64
            );
        }
    }
}

/// Runs `op` for each of `n` keys, `concurrency` at once, measuring Redis around it.
async fn phase<F, Fut>(
    name: &'static str,
    redis: &RedisServer,
    n: usize,
    concurrency: usize,
    op: F,
) -> Phase
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let cpu = main_thread_cpu(redis);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let op = Arc::new(op);
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, op) = (next.clone(), op.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    op(i).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let elapsed = started.elapsed();
    let cpu_us = main_thread_cpu(redis) - cpu;
    eprintln!("  {name}: {n} in {elapsed:?}");
    Phase {
        name,
        requests: n,
        cpu_us,
        stats: commandstats(redis),
    }
}

async fn measure(
    staged: bool,
    keys: usize,
    concurrency: usize,
    response_bytes: usize,
) -> Vec<Phase> {
    let redis = RedisServer::start_with(&["--hash-max-listpack-value", "1024"]);
    let store = Store::Redis(RedisStore::new(&redis.url(), Duration::from_secs(5)).unwrap());
    store.ping().await.unwrap();
    let claimants = Arc::new(Claimants::new());
    let response = Bytes::from(vec![b'r'; response_bytes]);
    let hash = RequestHash::new([3; 32]);
    let claim = move |store: Store, claimants: Arc<Claimants>, i: usize| async move {
        let key = if staged {
            StoreKey::from_raw(format!("bench:{{{i}}}:k"))
        } else {
            StoreKey::from_raw(format!("bench:k:{{{i}}}"))
        };
        store
            .claim(ClaimRequest {
                key: &key,
                request_hash: &hash,
                lease: Duration::from_secs(10),
                window: Duration::from_secs(3600),
                claimant: claimants.next_id(),
                hold: false,
                order: None,
            })
            .await
            .unwrap()
    };
    let (s, c, r) = (store.clone(), claimants.clone(), response.clone());
    let won = phase("new key", &redis, keys, concurrency, move |i| {
        let (s, c, r) = (s.clone(), c.clone(), r.clone());
        async move {
            let Claim::Won { permit, .. } = claim(s.clone(), c, i).await else {
                panic!("a new key did not win")
            };
            s.complete(&permit, r, Duration::from_secs(3600), None)
                .await
                .unwrap();
        }
    })
    .await;
    let (s, c) = (store.clone(), claimants.clone());
    let replay = phase("replay", &redis, keys, concurrency, move |i| {
        let (s, c) = (s.clone(), c.clone());
        async move {
            assert!(matches!(claim(s, c, i).await, Claim::Replay(_)));
        }
    })
    .await;
    vec![won, replay]
}

/// The unit: one `SET key value PX window` a key, `concurrency` at once, on the crate's
/// multiplexed connection, with a value of `response_bytes`.
async fn plain_set(keys: usize, concurrency: usize, response_bytes: usize) -> Phase {
    let redis = RedisServer::start_with(&["--hash-max-listpack-value", "1024"]);
    let client = redis::Client::open(redis.url()).unwrap();
    let con = client.get_multiplexed_async_connection().await.unwrap();
    let value = Bytes::from(vec![b'r'; response_bytes]);
    phase("SET PX", &redis, keys, concurrency, move |i| {
        let (mut con, value) = (con.clone(), value.clone());
        async move {
            let _: () = redis::cmd("SET")
                .arg(format!("bench:{{{i}}}:k"))
                .arg(&value[..])
                .arg("PX")
                .arg(3_600_000)
                .query_async(&mut con)
                .await
                .unwrap();
        }
    })
    .await
}

fn main() {
    let keys = env_num("BENCH_KEYS", 20_000);
    let concurrency = env_num("BENCH_CONCURRENCY", 32).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let response_bytes = env_num("BENCH_RESPONSE_BYTES", 200);
    println!("{keys} keys, {concurrency} at once, {response_bytes}-byte responses");
    eprintln!("plain:");
    let set = rt.block_on(plain_set(keys, concurrency, response_bytes));
    let unit = set.per_request();
    set.print("plain", unit);
    for (staged, name) in [(true, "staged"), (false, "unstaged")] {
        eprintln!("{name}:");
        let phases = measure(staged, keys, concurrency, response_bytes);
        for p in rt.block_on(phases) {
            p.print(name, unit);
        }
    }
}
