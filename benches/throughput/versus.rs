//! The `wrk` rounds: every scenario driven by `wrk -t1 --latency` in front of an nginx
//! origin (`return 201`), beside nginx `proxy_pass` (`keepalive 1024`, `reuseport`) to
//! the same origin, with the CPU time each process spends per request: the proxy (nginx
//! or the gateway), the origin, `wrk`, `redis-server` (and its main thread, and its
//! commands from `INFO commandstats`), and the whole machine. A gateway's new keys are
//! compared with `nginx-keyed`, nginx sent the same keyed requests; every other row with
//! nginx. At more than 100 connections the passthrough and Redis's new keys and replays
//! are measured beside nginx: there the gateway may refuse requests before their claim
//! (503 `overloaded`), so only 2xx answers count as throughput, and the answers of every
//! other status and the gateway's `unstored` count are shown beside it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cpu::{self, RedisWork};
use crate::load::{Keys, Load};
use crate::scenarios::{self, Kind, Scenario, Setup};
use crate::servers::{FloorChild, Nginx};
use crate::wrk::{self, WrkKeys};
use crate::{plot, versus_table, Settings};
use dedupe_test_support::tls::TestCa;

/// One scenario's `wrk` run in one round; CPU in microseconds per request.
pub struct WrkSample {
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
    /// 2xx answers per second (every answer, where they were not counted by status): the
    /// throughput.
    pub ok_rate: f64,
    /// Answers other than 2xx by status (`0`: socket errors), where counted.
    pub refused: BTreeMap<u16, u64>,
    /// The gateway's `unstored` answers over the run.
    pub unstored: Option<u64>,
}

/// Whether scenario `s` runs at `conns` connections: every one up to 100; past that the
/// baselines, the passthrough and Redis's new keys and replays (issue 56's overload rows).
fn runs_at(s: &Scenario, i: usize, conns: usize) -> bool {
    let name = s.name.trim_end_matches("@compare");
    conns <= 100
        || i == 0
        || matches!(
            name,
            "floor"
                | "nginx-keyed"
                | "nginx-tls"
                | "redis-won"
                | "redis-replay"
                | "peer-won"
                | "peer-replay"
        )
        || name.starts_with("passthrough")
}

/// The gateway's `unstored` count (every route), read from its `/metrics`.
async fn unstored(admin: Option<std::net::SocketAddr>) -> Option<u64> {
    let url = format!("http://{}/metrics", admin?);
    let text = dedupe_test_support::Http::new().get(&url, &[]).await.text();
    let sum = text
        .lines()
        .filter(|l| l.starts_with("dedupe_requests_total{") && l.contains("outcome=\"unstored\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Some(sum as u64)
}

impl WrkSample {
    /// The processes measured, together.
    pub fn sum_us(&self) -> f64 {
        self.proxy_us + self.origin_us + self.wrk_us + self.redis_us.unwrap_or(0.0)
    }
}

/// Runs the rounds, prints the table and writes it, with its plot, under `target/bench/`.
pub async fn run(set: &Settings, setup: &Setup<'_>) {
    // The `*-tls` rows: the origin's second listener speaks TLS with a certificate of a
    // private CA, which nginx and the gateway both verify.
    let ca = TestCa::new("bench");
    let origin_cert = ca.issue("origin");
    let Some(origin) = Nginx::origin(Some(&origin_cert)) else {
        println!("note: nginx is not installed; no wrk rounds (apt-get install nginx-light)");
        return;
    };
    let nginx = Nginx::proxy(origin.addr, 1024, true).expect("nginx starts");
    let (mut gateways, mut scenarios) = scenarios::build(origin.addr, Some(&nginx), false, setup);
    let tls_origin = origin.tls_addr.expect("the origin's TLS listener");
    let nginx_tls = Nginx::proxy_tls(tls_origin, &ca.ca_file).expect("nginx starts");
    if scenarios::wanted("passthrough-tls") {
        scenarios.push(Scenario::plain(
            scenarios::NGINX_TLS,
            nginx_tls.addr,
            Some(nginx_tls.pid()),
        ));
        let (bin, _) = &setup.binaries[0];
        let (gw, s) = scenarios::tls_passthrough(bin, tls_origin, &ca.ca_file, gateways.len());
        scenarios.push(s);
        gateways.push(gw);
    }
    let _gateways = gateways;
    // `BENCH_FLOOR`: the floor proxy beside nginx, in every round and at every count.
    let floor = std::env::var_os("BENCH_FLOOR")
        .map(|bin| FloorChild::floor(std::path::Path::new(&bin), origin.addr));
    if let Some(f) = &floor {
        scenarios.insert(1, Scenario::plain("floor", f.addr, Some(f.pid())));
    }
    // `BENCH_PEER`: idempotent-proxy on the same Redis, new keys and a replay, beside the
    // gateway's Redis rows in every round and at every count.
    let _peer = match (std::env::var_os("BENCH_PEER"), &setup.redis) {
        (Some(bin), Some((url, pid))) => {
            let p = FloorChild::peer(std::path::Path::new(&bin), origin.addr, url);
            for (name, kind) in [("peer-won", Kind::Won), ("peer-replay", Kind::Replay)] {
                scenarios.push(Scenario::peer(name, &p, kind, *pid));
            }
            Some(p)
        }
        _ => None,
    };
    // New keys make wrk build every request in Lua: nginx is sent the same, as their baseline.
    if scenarios.iter().any(|s| s.kind == Kind::Won) {
        scenarios.insert(1, Scenario::nginx_keyed(&nginx));
    }
    // Keys never sent before in any run: the process id and the time start every one.
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let run_id = format!("{}-{}", std::process::id(), since.as_millis());
    let seconds = set.limit.as_secs_f64();
    let mut samples: BTreeMap<(usize, usize), Vec<WrkSample>> = BTreeMap::new();
    let set = &Settings {
        requests: set.requests,
        limit: set.limit,
        rounds: set.rounds,
        connections: set.wrk_connections.clone(),
        wrk_connections: set.wrk_connections.clone(),
    };
    for &conns in &set.connections {
        for round in 0..set.rounds {
            for (i, s) in scenarios.iter().enumerate() {
                if !runs_at(s, i, conns) {
                    continue;
                }
                let tag = format!("{run_id}-{}-{conns}-{round}", s.name);
                let sample = measure(s, origin.pid(), conns, &tag, seconds).await;
                eprintln!(
                    "wrk {conns:>5} conns, round {round}: {:<20} {:>8.0} 2xx/s p99 {:>6.2} ms, proxy {:.1} us/req, machine {:.1}, non-2xx {:?}, unstored {:?}",
                    s.name,
                    sample.ok_rate,
                    sample.p99.as_secs_f64() * 1e3,
                    sample.proxy_us,
                    sample.machine_us,
                    sample.refused,
                    sample.unstored,
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
    tokio::task::spawn_blocking(move || wrk::run(addr, path, &warm_keys, (conns, 1.0), false))
        .await
        .unwrap();
    let pids = (s.pid, s.store_pid);
    let before = unstored(s.admin).await;
    let mut sample = tokio::task::spawn_blocking(move || {
        measured(pids, origin, addr, path, &main_keys, (conns, seconds))
    })
    .await
    .unwrap();
    sample.unstored = unstored(s.admin).await.zip(before).map(|(a, b)| a - b);
    sample
}

/// One measured run, with every process's CPU time read before and after.
fn measured(
    (proxy, store): (Option<u32>, Option<(u32, u16)>),
    origin: u32,
    addr: std::net::SocketAddr,
    path: &str,
    keys: &WrkKeys,
    (conns, seconds): (usize, f64),
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
    // Past 100 connections a gateway may refuse before the claim: its answers are counted.
    let counted = conns > 100;
    let run = wrk::run(addr, path, keys, (conns, seconds), counted);
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
    assert!(
        counted || run.errors == 0,
        "wrk on {addr}{path}: errors or non-2xx answers"
    );
    let mut refused: BTreeMap<u16, u64> = (run.statuses.iter())
        .filter(|(code, _)| !(200..300).contains(*code))
        .map(|(code, n)| (*code, *n))
        .collect();
    if run.socket_errors > 0 {
        refused.insert(0, run.socket_errors);
    }
    let ok: u64 = (run.statuses.iter())
        .filter(|(code, _)| (200..300).contains(*code))
        .map(|(_, n)| n)
        .sum();
    let ok_rate = match counted {
        true => run.rate * ok as f64 / run.requests.max(1) as f64,
        false => run.rate,
    };
    let n = run.requests.max(1) as f64;
    let us = |t: u64| t as f64 / cpu::ticks_per_second() * 1e6 / n;
    WrkSample {
        p50: run.p50,
        p99: run.p99,
        proxy_us: us(after.0 - before.0),
        origin_us: us(after.1 - before.1),
        wrk_us: us(run.ticks),
        redis_us: redis_pid.map(|_| us(after.2 - before.2)),
        machine_us: us(after.3 - before.3),
        redis_main_us: work.as_ref().map(|w| w.main_thread * 1e6 / n),
        redis_reads: work.as_ref().map(|w| w.reads as f64 / n),
        ok_rate,
        refused,
        unstored: None,
        commands: work.map_or_else(BTreeMap::new, |w| {
            w.commands
                .into_iter()
                .map(|(name, (calls, usec))| (name, (calls as f64 / n, usec as f64 / n)))
                .collect()
        }),
    }
}
