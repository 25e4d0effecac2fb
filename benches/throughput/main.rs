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
//! `32,1000`), `BENCH_ONLY` (comma-separated scenario names to run beside the baseline,
//! e.g. `passthrough,memory-won`), `BENCH_HOLD` (seconds to pause before each measured
//! pass, printing the gateway's pid, to attach a profiler), `BENCH_COMPARE` (the path of
//! another build's `dedupe-gateway`, run beside this one: `*@compare` rows). Run with
//! `cargo bench --bench throughput`.

mod load;
mod servers;
mod upstream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dedupe_test_support::{GatewayConfig, RedisServer, RouteCfg, StoreCfg};

use load::{Keys, Load, Pass};
use servers::{GatewayChild, Nginx};
use upstream::Counting;

const DEDUPED: &str = "/v1/payments/charge";

/// The gateway under test, in front of `upstream`, on `store`.
fn config(upstream: SocketAddr, store: StoreCfg) -> GatewayConfig {
    GatewayConfig::new(format!("http://{upstream}"))
        .max_body("64KiB")
        .upstream_timeout("5s")
        .store(store)
        .default_lease("5s")
        .default_window("1h")
        .route(RouteCfg::header("payments", "/v1/payments/*").required(true))
}

/// What a scenario sends, and what the upstream and the replies must show afterwards.
#[derive(Clone, Copy)]
enum Kind {
    /// No deduplication: every request is one upstream effect, none replayed.
    Plain,
    /// A fresh key per request: every request is one upstream effect, none replayed.
    Won,
    /// One key, primed by one request first: no further effect, every reply replayed.
    Replay,
}

/// One scenario: where it sends, and which gateway (if any) serves it.
struct Scenario {
    name: String,
    addr: SocketAddr,
    path: &'static str,
    kind: Kind,
    gateway: Option<usize>,
    /// The serving process's id (nginx's master, or the gateway), for a profiler and for
    /// the CPU time it spends per request.
    pid: Option<u32>,
    /// The `redis-server` the gateway stores in (process id, port), for the CPU time it
    /// spends per request and how many commands it gets per read.
    store_pid: Option<(u32, u16)>,
}

/// One scenario's pass in one round.
struct Sample {
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

struct Settings {
    requests: usize,
    limit: Duration,
    rounds: usize,
    connections: Vec<usize>,
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
    let connections = std::env::var("BENCH_CONNECTIONS").unwrap_or_else(|_| "32,1000".into());
    Settings {
        requests: env_num("BENCH_REQUESTS", 20_000usize).max(1),
        limit: Duration::from_secs_f64(env_num("BENCH_SECONDS", 4.0f64)),
        rounds: env_num("BENCH_ROUNDS", 3usize).max(1),
        connections: connections
            .split(',')
            .map(|c| {
                c.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("BENCH_CONNECTIONS: {c:?} is not a number"))
            })
            .collect(),
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
        let server_before = s.pid.map(servers::cpu_ticks);
        let redis_before = s.store_pid.map(|(pid, _)| servers::cpu_ticks(pid));
        let io_before = s.store_pid.and_then(|(_, port)| servers::redis_io(port));
        let result = load.run(s.path, &keys(pass), count, set.limit).await;
        let per_request = |ticks: u64| {
            ticks as f64 / servers::ticks_per_second() * 1e6 / result.requests() as f64
        };
        let server = s
            .pid
            .zip(server_before)
            .map(|(pid, before)| servers::cpu_ticks(pid).since(before));
        let redis = s
            .store_pid
            .zip(redis_before)
            .map(|((pid, _), before)| servers::cpu_ticks(pid).since(before));
        let io_after = s.store_pid.and_then(|(_, port)| servers::redis_io(port));
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
    let up = Counting::start().await;
    let nginx = Nginx::start(up.addr);
    if nginx.is_none() {
        println!(
            "note: nginx is not installed; ratios are to direct (apt-get install nginx-light)"
        );
    }
    // Kept alive until the end: dropping a RedisServer kills it.
    // With the `hash-max-listpack-value` the store check advises (docs/redis.md).
    let redis = on_path("redis-server")
        .then(|| RedisServer::start_with(&["--hash-max-listpack-value", "1024"]));
    if redis.is_none() {
        println!("note: redis-server is not on PATH; skipping the Redis scenarios");
    }
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("bench-key");
    std::fs::write(&key, "42".repeat(32)).unwrap();
    let sealed = [format!("file:{}", key.display())];

    let redis_pid = redis
        .as_ref()
        .and_then(|r| Some((servers::redis_pid(r.port)?, r.port)));
    let mut stores = vec![("memory", StoreCfg::memory())];
    if let Some(r) = &redis {
        stores.push(("redis", StoreCfg::redis(r.url()).timeout("500ms")));
    }
    let mut gateways: Vec<GatewayChild> = Vec::new();
    let mut scenarios = Vec::new();
    if let Some(n) = &nginx {
        scenarios.push(Scenario {
            name: "nginx".into(),
            addr: n.addr,
            path: DEDUPED,
            kind: Kind::Plain,
            gateway: None,
            pid: Some(n.pid()),
            store_pid: None,
        });
    }
    scenarios.push(Scenario {
        name: "direct".into(),
        addr: up.addr,
        path: DEDUPED,
        kind: Kind::Plain,
        gateway: None,
        pid: None,
        store_pid: None,
    });
    // This build's gateway, and with `BENCH_COMPARE` another build's binary beside it: the
    // same scenarios, suffixed `@compare`, interleaved in the same rounds, so a change is
    // measured against what it changed on the same machine at the same moments.
    let mut binaries = vec![(
        PathBuf::from(env!("CARGO_BIN_EXE_dedupe-gateway")),
        String::new(),
    )];
    if let Ok(other) = std::env::var("BENCH_COMPARE") {
        binaries.push((PathBuf::from(other), "@compare".into()));
    }
    for (bin, suffix) in &binaries {
        let first = gateways.len();
        for (name, store) in &stores {
            let store_pid = if *name == "redis" { redis_pid } else { None };
            for encrypted in [false, true] {
                let (store, name) = match encrypted {
                    false => (store.clone(), (*name).to_owned()),
                    true => (
                        store.clone().encryption_keys(&sealed),
                        format!("{name}-sealed"),
                    ),
                };
                if gateways.len() == first {
                    // A gateway of its own, so its memory is that of streaming with nothing
                    // stored.
                    let gw = GatewayChild::start(bin, config(up.addr, store.clone()));
                    scenarios.push(Scenario {
                        name: format!("passthrough{suffix}"),
                        addr: gw.addr,
                        path: "/other",
                        kind: Kind::Plain,
                        gateway: Some(first),
                        pid: Some(gw.pid()),
                        store_pid,
                    });
                    gateways.push(gw);
                }
                let gw = GatewayChild::start(bin, config(up.addr, store));
                let idx = gateways.len();
                scenarios.push(Scenario {
                    name: format!("{name}-won{suffix}"),
                    addr: gw.addr,
                    path: DEDUPED,
                    kind: Kind::Won,
                    gateway: Some(idx),
                    pid: Some(gw.pid()),
                    store_pid,
                });
                scenarios.push(Scenario {
                    name: format!("{name}-replay{suffix}"),
                    addr: gw.addr,
                    path: DEDUPED,
                    kind: Kind::Replay,
                    gateway: Some(idx),
                    pid: Some(gw.pid()),
                    store_pid,
                });
                gateways.push(gw);
            }
        }
        if let Some(r) = &redis {
            // Replays on Redis with the near-cache on (`store.near_cache`): served from the
            // gateway's copy, proved fresh by Redis's invalidations.
            let store = StoreCfg::redis(r.url())
                .timeout("500ms")
                .near_cache("64MiB");
            let gw = GatewayChild::start(bin, config(up.addr, store));
            scenarios.push(Scenario {
                name: format!("redis-cached-replay{suffix}"),
                addr: gw.addr,
                path: DEDUPED,
                kind: Kind::Replay,
                gateway: Some(gateways.len()),
                pid: Some(gw.pid()),
                store_pid: redis_pid,
            });
            gateways.push(gw);
        }
    }
    let idle: Vec<u64> = gateways.iter().map(GatewayChild::rss).collect();
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        let base = scenarios[0].name.clone();
        scenarios.retain(|s| s.name == base || only.contains(&s.name.trim_end_matches("@compare")));
    }

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
                let (pass, load, warm, costs) = measure(s, &up, conns, round, &set).await;
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
    report::table(&scenarios, &samples, &set);
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

mod report {
    //! The table: medians over rounds with their ranges.

    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::{Sample, Scenario, Settings};

    fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    pub fn table(
        scenarios: &[Scenario],
        samples: &BTreeMap<(usize, usize), Vec<Sample>>,
        set: &Settings,
    ) {
        let base_name = if scenarios[0].name == "nginx" {
            "nginx"
        } else {
            "direct"
        };
        let header = [
            "scenario",
            "conns",
            "req/s",
            &format!("vs {base_name} (range)"),
            "p50 ms",
            "p99 ms",
            "RSS MiB",
            "CPU us/req",
            "user us/req",
            "Redis us/req",
            "Redis cmds/read",
        ];
        let mut rows: Vec<Vec<String>> = Vec::new();
        for &conns in &set.connections {
            let base = &samples[&(conns, 0)];
            for (i, s) in scenarios.iter().enumerate() {
                let runs = &samples[&(conns, i)];
                let ratios = runs
                    .iter()
                    .zip(base)
                    .map(|(r, b)| r.rate / b.rate)
                    .collect();
                let (ratio, lo, hi) = median(ratios);
                let (rate, _, _) = median(runs.iter().map(|r| r.rate).collect());
                let (p50, _, _) = median(runs.iter().map(|r| ms(r.p50)).collect());
                let (p99, p99_lo, p99_hi) = median(runs.iter().map(|r| ms(r.p99)).collect());
                let rss = runs.iter().filter_map(|r| r.rss).max();
                let cpu: Vec<f64> = runs.iter().filter_map(|r| r.costs.cpu_us).collect();
                let cpu = (!cpu.is_empty()).then(|| median(cpu));
                let user: Vec<f64> = runs.iter().filter_map(|r| r.costs.user_us).collect();
                let user = (!user.is_empty()).then(|| median(user));
                let redis: Vec<f64> = runs.iter().filter_map(|r| r.costs.redis_us).collect();
                let redis = (!redis.is_empty()).then(|| median(redis));
                let depth: Vec<f64> = runs.iter().filter_map(|r| r.costs.depth).collect();
                let depth = (!depth.is_empty()).then(|| median(depth));
                rows.push(vec![
                    s.name.clone(),
                    conns.to_string(),
                    format!("{rate:.0}"),
                    format!("{ratio:.2} ({lo:.2}-{hi:.2})"),
                    format!("{p50:.2}"),
                    format!("{p99:.2} ({p99_lo:.1}-{p99_hi:.1})"),
                    rss.map_or("-".into(), |b| {
                        format!("{:.1}", b as f64 / (1024.0 * 1024.0))
                    }),
                    cpu.map_or("-".into(), |(c, lo, hi)| {
                        format!("{c:.1} ({lo:.1}-{hi:.1})")
                    }),
                    user.map_or("-".into(), |(c, _, _)| format!("{c:.1}")),
                    redis.map_or("-".into(), |(c, _, _)| format!("{c:.1}")),
                    depth.map_or("-".into(), |(d, _, _)| format!("{d:.2}")),
                ]);
            }
        }
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: &[String]| {
            let mut out = format!("{:<w$}", cells[0], w = widths[0]);
            for (cell, w) in cells[1..].iter().zip(&widths[1..]) {
                out.push_str(&format!("  {cell:>w$}"));
            }
            println!("{out}");
        };
        line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
        line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
        for row in &rows {
            line(row);
        }
    }
}
