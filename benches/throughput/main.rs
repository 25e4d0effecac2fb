//! Request throughput of the gateway beside nginx `proxy_pass`, measured in the same run.
//!
//! Every scenario sends POSTs over keep-alive connections (32, then 1,000) to the same
//! counting upstream: directly, through nginx (when installed), and through the gateway's
//! release binary on the memory store and on Redis (when `redis-server` is installed). Each
//! scenario runs once per round, rounds interleaved, and every figure printed is the median
//! over the rounds with its range; throughput is given as a ratio to nginx in the same
//! round. Beside it: the CPU time the serving process spent per request (nginx's master
//! and workers; the gateway's threads), which a shared machine's noise moves less, and the
//! part of it spent in user space (the rest is system calls and the loopback delivery
//! they run). A last scenario replays on Redis with the near-cache on
//! (`redis-cached-replay`). After each pass the upstream's effect count is checked: one
//! per request, or one in all for a replayed key.
//!
//! Environment: `BENCH_REQUESTS` (most requests per pass, default 20000), `BENCH_SECONDS`
//! (longest pass, default 4), `BENCH_ROUNDS` (default 3), `BENCH_CONNECTIONS` (default
//! `32,1000`), `BENCH_WRK_CONNECTIONS` (the `wrk` rounds', default `32,1000,4000`), `BENCH_ONLY` (comma-separated scenario names to run beside the baseline,
//! e.g. `passthrough,memory-won`), `BENCH_HOLD` (seconds to pause before each measured
//! pass, printing the gateway's pid, to attach a profiler), `BENCH_COMPARE` (the path of
//! another build's `dedupe-gateway`, run beside this one: `*@compare` rows), `BENCH_FLOOR`
//! (the path of a built `examples/floor_proxy`, measured beside nginx in the wrk rounds:
//! the `floor` row), `BENCH_PEER` (the path of a built `idempotent-proxy-server`, the
//! nearest open-source peer, run on the same Redis in the wrk rounds: `peer-won` and
//! `peer-replay` rows), `BENCH_WRK`
//! (`off`: no wrk rounds; `only`: wrk rounds alone), `BENCH_STORE_SERVER` (`valkey`: the
//! Redis scenarios on the `valkey-server` that `DEDUPE_TEST_VALKEY` names, which
//! `scripts/test` builds). Run with `cargo bench --bench throughput`.
//!
//! `BENCH_RATE=N` measures latency instead: each scenario at a fixed N requests a second,
//! open-loop, beside a direct call to the upstream (`latency.rs`).
//!
//! When `wrk` is installed, every scenario is also driven by `wrk -t1 --latency` in front
//! of an nginx origin (`versus.rs`), with the CPU every process spends per request; past
//! 100 connections, Redis's new keys and replays too, where only 2xx answers count as
//! throughput, beside the count of every other status and of `unstored` answers. There,
//! too, `passthrough-tls` streams to the origin's TLS listener beside `nginx-tls` (nginx
//! proxying to the same listener, its ratio's baseline). `passthrough-traced` is the
//! passthrough with traces on (`telemetry.otlp_endpoint`, `sample_ratio = 0`).

mod cpu;
mod latency;
mod load;
mod plot;
mod report;
mod scenarios;
mod servers;
mod upstream;
mod versus;
mod versus_table;
mod wrk;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use dedupe_test_support::{RedisServer, StoreCfg};

use load::{Keys, Load, Pass};
use scenarios::{Kind, Scenario, Setup};
use servers::{GatewayChild, Nginx};
use upstream::Counting;

/// One scenario's pass in one round.
pub struct Sample {
    rate: f64,
    p50: Duration,
    p99: Duration,
    /// The gateway's resident memory after the pass, connections still open.
    rss: Option<u64>,
    costs: Costs,
}

/// What a pass cost the processes measured, per request.
struct Costs {
    /// CPU time the serving process spent per request, in microseconds: steadier than
    /// throughput on a shared machine, since it does not count time others took.
    cpu_us: Option<f64>,
    /// The part of `cpu_us` spent in user space (the rest is the kernel's: system calls,
    /// and the loopback TCP delivery they run).
    user_us: Option<f64>,
    /// CPU time `redis-server` spent per request, in microseconds (Redis scenarios).
    redis_us: Option<f64>,
    /// Commands `redis-server` processed per read from a socket (Redis scenarios).
    depth: Option<f64>,
}

pub struct Settings {
    requests: usize,
    pub limit: Duration,
    pub rounds: usize,
    pub connections: Vec<usize>,
    /// The `wrk` rounds' connection counts (`BENCH_WRK_CONNECTIONS`).
    pub wrk_connections: Vec<usize>,
}

/// A comma-separated list of connection counts from `name`, or `default`.
fn counts(name: &str, default: &str) -> Vec<usize> {
    let list = std::env::var(name).unwrap_or_else(|_| default.into());
    list.split(',')
        .map(|c| {
            c.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {c:?} is not a number"))
        })
        .collect()
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a positive number, got {v:?}")),
        Err(_) => default,
    }
}

fn settings() -> Settings {
    Settings {
        requests: env_num("BENCH_REQUESTS", 20_000usize).max(1),
        limit: Duration::from_secs_f64(env_num("BENCH_SECONDS", 4.0f64)),
        rounds: env_num("BENCH_ROUNDS", 3usize).max(1),
        connections: counts("BENCH_CONNECTIONS", "32,1000"),
        wrk_connections: counts("BENCH_WRK_CONNECTIONS", "32,1000,4000"),
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Warms the connections up, then measures one pass and checks the upstream's effects.
async fn measure(
    s: &Scenario,
    up: &Counting,
    conns: usize,
    round: usize,
    set: &Settings,
) -> (Pass, Load, usize, Costs) {
    let mut load = Load::connect(s.addr, conns).await;
    let tag = format!("{}-{conns}-{round}", s.name);
    let keys = |pass: &str| match s.kind {
        Kind::Plain => Keys::None,
        Kind::Won => Keys::Unique(format!("{tag}-{pass}")),
        Kind::Replay => Keys::Same(tag.clone()),
    };
    if let Kind::Replay = s.kind {
        let before = up.effects();
        let primed = load.run(s.path, &keys("prime"), 1, set.limit).await;
        assert_eq!(primed.requests(), 1);
        assert_eq!(up.effects() - before, 1, "{tag}: priming is one effect");
    }
    // One request per connection at least: every connection (and the server's upstream
    // pool behind it) is open and warm before the clock starts.
    let warm = (2 * conns).min(set.requests.max(conns));
    let hold = env_num("BENCH_HOLD", 0.0f64);
    for (pass, count) in [("warm", warm), ("main", set.requests)] {
        if pass == "main" && hold > 0.0 {
            eprintln!("{tag}: measuring in {hold}s; gateway pid {:?}", s.pid);
            tokio::time::sleep(Duration::from_secs_f64(hold)).await;
        }
        let before = up.effects();
        let server_before = s.pid.map(cpu::cpu_ticks);
        let redis_before = s.store_pid.map(|(pid, _)| cpu::cpu_ticks(pid));
        let io_before = s.store_pid.and_then(|(_, port)| cpu::redis_io(port));
        let result = load.run(s.path, &keys(pass), count, set.limit).await;
        let per_request =
            |ticks: u64| ticks as f64 / cpu::ticks_per_second() * 1e6 / result.requests() as f64;
        let server = s
            .pid
            .zip(server_before)
            .map(|(pid, before)| cpu::cpu_ticks(pid).since(before));
        let redis = s
            .store_pid
            .zip(redis_before)
            .map(|((pid, _), before)| cpu::cpu_ticks(pid).since(before));
        let io_after = s.store_pid.and_then(|(_, port)| cpu::redis_io(port));
        let costs = Costs {
            cpu_us: server.map(|t| per_request(t.total())),
            user_us: server.map(|t| per_request(t.user)),
            redis_us: redis.map(|t| per_request(t.total())),
            // The INFO call itself is one read: left out.
            depth: io_before.zip(io_after).map(|((c0, r0), (c1, r1))| {
                (c1 - c0) as f64 / (r1 - r0).saturating_sub(1).max(1) as f64
            }),
        };
        let effects = up.effects() - before;
        let n = result.requests();
        let (want_effects, want_replayed) = match s.kind {
            Kind::Plain | Kind::Won => (n as u64, 0),
            Kind::Replay => (0, n),
        };
        assert_eq!(
            effects, want_effects,
            "{tag} ({pass}): upstream effects after {n} requests"
        );
        assert_eq!(
            result.replayed, want_replayed,
            "{tag} ({pass}): replays after {n} requests"
        );
        if pass == "main" {
            return (result, load, warm, costs);
        }
    }
    unreachable!()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let set = settings();
    // Kept alive until the end: dropping a RedisServer kills it.
    // With the `hash-max-listpack-value` the store check advises (docs/redis.md).
    // `BENCH_STORE_SERVER=valkey`: the Redis scenarios on the Valkey that scripts/test
    // builds (`DEDUPE_TEST_VALKEY`; it has `SET ... IFEQ`), not Debian's redis-server.
    let listpack = ["--hash-max-listpack-value", "1024"];
    let redis = if std::env::var("BENCH_STORE_SERVER").as_deref() == Ok("valkey") {
        println!("note: the Redis scenarios run on valkey-server (BENCH_STORE_SERVER=valkey)");
        Some(RedisServer::start_valkey(&listpack))
    } else {
        on_path("redis-server").then(|| RedisServer::start_with(&listpack))
    };
    if redis.is_none() {
        println!("note: redis-server is not on PATH; skipping the Redis scenarios");
    }
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("bench-key");
    std::fs::write(&key, "42".repeat(32)).unwrap();
    let sealed = [format!("file:{}", key.display())];

    let redis_pid = redis
        .as_ref()
        .and_then(|r| Some((cpu::redis_pid(r.port)?, r.port)));
    // Every new key stays a record for the window (an hour): at about 80,000 new keys a
    // second (run 24) the default million records held two rounds of `wrk` and the third
    // was refused as a full store (503), which is the bound working, not the figure
    // wanted here.
    let memory = StoreCfg::memory()
        .max_bytes("10GiB")
        .max_records(10_000_000);
    let mut stores = vec![("memory", memory)];
    if let Some(r) = &redis {
        stores.push(("redis", StoreCfg::redis(r.url()).timeout("500ms")));
    }
    // This build's gateway, and with `BENCH_COMPARE` another build's binary beside it.
    let mut binaries = vec![(
        PathBuf::from(env!("CARGO_BIN_EXE_dedupe-gateway")),
        String::new(),
    )];
    if let Ok(other) = std::env::var("BENCH_COMPARE") {
        binaries.push((PathBuf::from(other), "@compare".into()));
    }
    let setup = Setup {
        stores: &stores,
        binaries: &binaries,
        redis: redis.as_ref().map(|r| (r.url(), redis_pid)),
        sealed: &sealed,
    };
    if let Ok(rate) = std::env::var("BENCH_RATE") {
        let rate = rate.trim().parse().expect("BENCH_RATE: requests a second");
        latency::run(rate, &set, &setup).await;
        return;
    }
    let wrk = std::env::var("BENCH_WRK").unwrap_or_default();
    if wrk != "only" {
        generator(&set, &setup).await;
    }
    if wrk != "off" {
        if on_path("wrk") {
            versus::run(&set, &setup).await;
        } else {
            println!("note: wrk is not installed; no wrk table (apt-get install wrk)");
        }
    }
}

/// The built-in generator's rounds, in front of the bench's counting upstream.
async fn generator(set: &Settings, setup: &Setup<'_>) {
    let up = Counting::start().await;
    let nginx = Nginx::start(up.addr);
    if nginx.is_none() {
        println!(
            "note: nginx is not installed; ratios are to direct (apt-get install nginx-light)"
        );
    }
    let (gateways, scenarios) = scenarios::build(up.addr, nginx.as_ref(), true, setup);
    let idle: Vec<u64> = gateways.iter().map(GatewayChild::rss).collect();

    println!(
        "throughput: at most {} requests or {:?} per pass, {} rounds, connections {:?}",
        set.requests, set.limit, set.rounds, set.connections
    );
    // (connections, scenario index) -> one sample per round.
    let mut samples: BTreeMap<(usize, usize), Vec<Sample>> = BTreeMap::new();
    let mut memory_records = 0usize;
    for &conns in &set.connections {
        for round in 0..set.rounds {
            for (i, s) in scenarios.iter().enumerate() {
                let (pass, load, warm, costs) = measure(s, &up, conns, round, set).await;
                if s.name == "memory-won" {
                    memory_records += pass.requests() + warm;
                }
                let rss = s.gateway.map(|g| gateways[g].rss());
                drop(load);
                eprintln!(
                    "{conns:>5} conns, round {round}: {:<20} {:>8.0} req/s {:>6} CPU us/req",
                    s.name,
                    pass.rate(),
                    costs.cpu_us.map_or("-".into(), |c| format!("{c:.1}")),
                );
                samples.entry((conns, i)).or_default().push(Sample {
                    rate: pass.rate(),
                    p50: pass.percentile(50.0),
                    p99: pass.percentile(99.0),
                    rss,
                    costs,
                });
            }
        }
    }
    println!();
    report::table(&scenarios, &samples, set);
    println!();
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "gateway RSS when idle at start: {:.1} MiB (memory store)",
        mb(idle[0])
    );
    // gateways[1] serves memory-won and memory-replay: its growth over its own idle RSS
    // is the records it holds (plus whatever the connections left allocated).
    if memory_records > 0 {
        let now = gateways[1].rss();
        println!(
            "memory store: {memory_records} small records held, RSS {:.1} MiB, about {:.0} bytes per record over idle",
            mb(now),
            now.saturating_sub(idle[1]) as f64 / memory_records as f64
        );
    }
}
