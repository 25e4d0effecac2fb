//! The `wrk` rounds: every scenario driven by `wrk -t1 --latency` in front of an nginx
//! origin (`return 201`), beside nginx `proxy_pass` (`keepalive 1024`, `reuseport`) to
//! the same origin, with the CPU time each process spends per request: the proxy (nginx
//! or the gateway), the origin, `wrk`, `redis-server` (and its main thread, and its
//! commands from `INFO commandstats`), and the whole machine. A gateway's new keys are
//! compared with `nginx-keyed`, nginx sent the same keyed requests; every other row with
//! nginx. At more than 100 connections only the passthrough is measured beside nginx.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cpu::{self, RedisWork};
use crate::load::{Keys, Load};
use crate::scenarios::{self, Kind, Scenario, Setup};
use crate::servers::{FloorChild, Nginx};
use crate::wrk::{self, WrkKeys};
use crate::{plot, versus_table, Settings};

/// One scenario's `wrk` run in one round; CPU in microseconds per request.
pub struct WrkSample {
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub proxy_us: f64,
    pub origin_us: f64,
    pub wrk_us: f64,
    /// `redis-server`'s process (Redis scenarios).
    pub redis_us: Option<f64>,
    pub machine_us: f64,
    /// Redis's main thread, and its commands: name -> (calls, usec) per request.
    pub redis_main_us: Option<f64>,
    /// Redis's socket reads per request (its wake-ups: how deep the gateway pipelines).
    pub redis_reads: Option<f64>,
    pub commands: BTreeMap<String, (f64, f64)>,
}

impl WrkSample {
    /// The processes measured, together.
    pub fn sum_us(&self) -> f64 {
        self.proxy_us + self.origin_us + self.wrk_us + self.redis_us.unwrap_or(0.0)
    }
}

/// Runs the rounds, prints the table and writes it, with its plot, under `target/bench/`.
pub async fn run(set: &Settings, setup: &Setup<'_>) {
    let Some(origin) = Nginx::origin() else {
        println!("note: nginx is not installed; no wrk rounds (apt-get install nginx-light)");
        return;
    };
    let nginx = Nginx::proxy(origin.addr, 1024, true).expect("nginx starts");
    let (_gateways, mut scenarios) = scenarios::build(origin.addr, Some(&nginx), false, setup);
    // `BENCH_FLOOR`: the floor proxy beside nginx, in every round and at every count.
    let floor = std::env::var_os("BENCH_FLOOR")
        .map(|bin| FloorChild::floor(std::path::Path::new(&bin), origin.addr));
    if let Some(f) = &floor {
        scenarios.insert(1, Scenario::plain("floor", f.addr, Some(f.pid())));
    }
    // New keys make wrk build every request in Lua: nginx is sent the same, as their baseline.
    if scenarios.iter().any(|s| s.kind == Kind::Won) {
        scenarios.insert(1, Scenario::nginx_keyed(&nginx));
    }
    // Keys never sent before in any run: the process id and the time start every one.
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let run_id = format!("{}-{}", std::process::id(), since.as_millis());
    let seconds = set.limit.as_secs_f64();
    let mut samples: BTreeMap<(usize, usize), Vec<WrkSample>> = BTreeMap::new();
    for &conns in &set.connections {
        for round in 0..set.rounds {
            for (i, s) in scenarios.iter().enumerate() {
                if conns > 100 && i > 0 && !s.name.starts_with("passthrough") && s.name != "floor" {
                    continue;
                }
                let tag = format!("{run_id}-{}-{conns}-{round}", s.name);
                let sample = measure(s, origin.pid(), conns, &tag, seconds).await;
                eprintln!(
                    "wrk {conns:>5} conns, round {round}: {:<20} {:>8.0} req/s p99 {:>6.2} ms, proxy {:.1} us/req, machine {:.1}",
                    s.name,
                    sample.rate,
                    sample.p99.as_secs_f64() * 1e3,
                    sample.proxy_us,
                    sample.machine_us,
                );
                samples.entry((conns, i)).or_default().push(sample);
            }
        }
    }
    let text = versus_table::render(&scenarios, &samples, set);
    println!("\n{text}");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
            Into::into,
        )
        .join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    let txt = dir.join("throughput.txt");
    std::fs::write(&txt, &text).unwrap();
    let svg = dir.join("throughput.svg");
    plot::write(&svg, &scenarios, &samples, set);
    println!("wrote {} and {}", txt.display(), svg.display());
}

/// Primes a replay's key, warms the connections up for a second, then measures one run.
///
/// A new-key run on Redis starts from an empty Redis. Every record lives for the window
/// (an hour), so without that the keys of every earlier run stay, and whichever run
/// crosses a doubling of Redis's key and expiry tables pays for rehashing all of them: in
/// such a run `dictRehash` and key hashing were a third of Redis's CPU (`perf`), and
/// Redis's cost per new key ranged over 9.2-12.7 µs in one bench (run 25).
async fn measure(s: &Scenario, origin: u32, conns: usize, tag: &str, seconds: f64) -> WrkSample {
    let same = format!("{tag}-same");
    if let (Kind::Won, Some((_, port))) = (s.kind, s.store_pid) {
        cpu::redis_flush(port);
    }
    if s.kind == Kind::Replay {
        let mut load = Load::connect(s.addr, 1).await;
        let primed = load
            .run(s.path, &Keys::Same(same.clone()), 1, Duration::from_secs(5))
            .await;
        assert_eq!(primed.requests(), 1);
    }
    let (warm, main) = (format!("{tag}-warm-"), format!("{tag}-main-"));
    let keys = |prefix: &str| match s.kind {
        Kind::Plain => WrkKeys::None,
        Kind::Won => WrkKeys::Unique(prefix.to_owned()),
        Kind::Replay => WrkKeys::Same(same.clone()),
    };
    let (addr, path) = (s.addr, s.path);
    let (warm_keys, main_keys) = (keys(&warm), keys(&main));
    tokio::task::spawn_blocking(move || wrk::run(addr, path, &warm_keys, conns, 1.0))
        .await
        .unwrap();
    let pids = (s.pid, s.store_pid);
    tokio::task::spawn_blocking(move || {
        measured(pids, origin, addr, path, &main_keys, conns, seconds)
    })
    .await
    .unwrap()
}

/// One measured run, with every process's CPU time read before and after.
fn measured(
    (proxy, store): (Option<u32>, Option<(u32, u16)>),
    origin: u32,
    addr: std::net::SocketAddr,
    path: &str,
    keys: &WrkKeys,
    conns: usize,
    seconds: f64,
) -> WrkSample {
    let ticks = |pid: Option<u32>| pid.map_or(0, |p| cpu::cpu_ticks(p).total());
    let redis_pid = store.map(|(pid, _)| pid);
    let before = (
        ticks(proxy),
        ticks(Some(origin)),
        ticks(redis_pid),
        cpu::machine_ticks(),
    );
    let work_before = store.and_then(|(_, port)| RedisWork::read(port));
    let run = wrk::run(addr, path, keys, conns, seconds);
    let after = (
        ticks(proxy),
        ticks(Some(origin)),
        ticks(redis_pid),
        cpu::machine_ticks(),
    );
    let work = store
        .and_then(|(_, port)| RedisWork::read(port))
        .zip(work_before)
        .map(|(a, b)| a.since(&b));
    assert_eq!(
        run.errors, 0,
        "wrk on {addr}{path}: errors or non-2xx answers"
    );
    let n = run.requests.max(1) as f64;
    let us = |t: u64| t as f64 / cpu::ticks_per_second() * 1e6 / n;
    WrkSample {
        rate: run.rate,
        p50: run.p50,
        p99: run.p99,
        proxy_us: us(after.0 - before.0),
        origin_us: us(after.1 - before.1),
        wrk_us: us(run.ticks),
        redis_us: redis_pid.map(|_| us(after.2 - before.2)),
        machine_us: us(after.3 - before.3),
        redis_main_us: work.as_ref().map(|w| w.main_thread * 1e6 / n),
        redis_reads: work.as_ref().map(|w| w.reads as f64 / n),
        commands: work.map_or_else(BTreeMap::new, |w| {
            w.commands
                .into_iter()
                .map(|(name, (calls, usec))| (name, (calls as f64 / n, usec as f64 / n)))
                .collect()
        }),
    }
}
