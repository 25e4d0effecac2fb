//! Request throughput of the gateway against a same-run baseline.
//!
//! Every scenario sends a fixed number of POSTs with a fixed number in flight, through one
//! shared client, to the real counting upstream of the integration tests, either directly
//! or through an in-process gateway. Figures are reported as ratios against `direct`,
//! measured in the same run: on a small, noisy machine absolute numbers mean little.
//!
//! `BENCH_REQUESTS` sets the measured requests per scenario (default 20000).
//! Run with `cargo bench --bench throughput`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedupe_test_support::{
    Backend, GatewayConfig, Http, RedisServer, RouteCfg, TestGateway, Upstream,
};

/// Requests in flight at any time.
const CONCURRENCY: usize = 32;
/// Measured requests per scenario unless `BENCH_REQUESTS` says otherwise.
const DEFAULT_REQUESTS: usize = 20_000;
/// Requests per scenario in the warm-up pass (capped at the measured count).
const WARMUP_REQUESTS: usize = 500;
const BODY: &str = r#"{"amount":100}"#;

/// The gateway under test, in front of `upstream`, on `store`.
fn config(upstream: &Upstream, store: dedupe_test_support::StoreCfg) -> GatewayConfig {
    GatewayConfig::new(upstream.url())
        .max_body("64KiB")
        .upstream_timeout("5s")
        .store(store)
        .default_lease("5s")
        .default_window("1h")
        .route(RouteCfg::header("payments", "/v1/payments/*").required(true))
}

/// How each request of a run is keyed.
#[derive(Clone)]
enum Keys {
    /// No `Idempotency-Key` header.
    None,
    /// `{prefix}-{i}`: a fresh key per request.
    Unique(String),
    /// The same key on every request.
    Same(String),
}

impl Keys {
    fn key(&self, i: usize) -> Option<String> {
        match self {
            Keys::None => None,
            Keys::Unique(prefix) => Some(format!("{prefix}-{i}")),
            Keys::Same(key) => Some(key.clone()),
        }
    }
}

/// One measured run.
struct Run {
    elapsed: Duration,
    /// Per-request latencies, sorted.
    latencies: Vec<Duration>,
    /// Responses marked `Idempotent-Replayed: true`.
    replayed: usize,
}

impl Run {
    fn requests(&self) -> usize {
        self.latencies.len()
    }

    fn rate(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64()
    }

    fn mean(&self) -> Duration {
        self.latencies.iter().sum::<Duration>() / self.requests().max(1) as u32
    }

    /// Nearest-rank percentile, `p` in (0, 100].
    fn percentile(&self, p: f64) -> Duration {
        let n = self.latencies.len();
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        self.latencies[rank.clamp(1, n) - 1]
    }
}

/// Sends one POST; any transport error or non-2xx answer is a failure.
async fn post(http: &Http, url: &str, key: Option<&str>) -> bool {
    let headers: Vec<(&str, &str)> = match key {
        Some(k) => vec![("Idempotency-Key", k), ("Content-Type", "application/json")],
        None => vec![("Content-Type", "application/json")],
    };
    let reply = http
        .send("POST", url, &headers, BODY)
        .await
        .unwrap_or_else(|e| panic!("POST {url} failed: {e}"));
    assert!(
        reply.status.is_success(),
        "POST {url} answered {}: {}",
        reply.status,
        reply.text()
    );
    reply.replayed()
}

/// Sends `n` requests to `url`, `CONCURRENCY` at a time, and times each one.
async fn run(http: &Http, url: &str, keys: &Keys, n: usize) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..CONCURRENCY.min(n))
        .map(|_| {
            let (http, url, keys, next) =
                (http.clone(), url.to_owned(), keys.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(n / CONCURRENCY + 1);
                let mut replayed = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let key = keys.key(i);
                    let sent = Instant::now();
                    replayed += usize::from(post(&http, &url, key.as_deref()).await);
                    latencies.push(sent.elapsed());
                }
                (latencies, replayed)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(n);
    let mut replayed = 0;
    for worker in workers {
        let (l, r) = worker.await.expect("a request failed");
        latencies.extend(l);
        replayed += r;
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Run {
        elapsed,
        latencies,
        replayed,
    }
}

/// What a scenario sends, and what the upstream and the replies must show afterwards.
#[derive(Clone, Copy)]
enum Kind {
    /// No deduplication: every request is one upstream effect, none replayed.
    Plain,
    /// A fresh key per request: every request is one upstream effect, none replayed.
    Won,
    /// One key, primed by one request first: one upstream effect, every reply replayed.
    Replay,
}

/// Warms `url` up, then measures `n` requests and checks the upstream's effect count.
async fn scenario(name: &str, http: &Http, up: &Upstream, url: &str, kind: Kind, n: usize) -> Run {
    let warm = WARMUP_REQUESTS.min(n);
    for pass in ["warm", "main"] {
        let count = if pass == "warm" { warm } else { n };
        let before = up.effects();
        let keys = match kind {
            Kind::Plain => Keys::None,
            Kind::Won => Keys::Unique(format!("{name}-{pass}")),
            Kind::Replay => {
                let key = format!("{name}-{pass}");
                post(http, url, Some(&key)).await;
                Keys::Same(key)
            }
        };
        let result = run(http, url, &keys, count).await;
        let effects = up.effects() - before;
        let (want_effects, want_replayed) = match kind {
            Kind::Plain | Kind::Won => (count as u64, 0),
            Kind::Replay => (1, count),
        };
        assert_eq!(
            effects, want_effects,
            "{name} ({pass}): upstream effects after {count} requests"
        );
        assert_eq!(
            result.replayed, want_replayed,
            "{name} ({pass}): replayed responses after {count} requests"
        );
        if pass == "main" {
            return result;
        }
    }
    unreachable!()
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn requests() -> usize {
    match std::env::var("BENCH_REQUESTS") {
        Ok(v) => match v.trim().parse() {
            Ok(n) if n > 0 => n,
            _ => panic!("BENCH_REQUESTS must be a positive integer, got {v:?}"),
        },
        Err(_) => DEFAULT_REQUESTS,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn print_table(results: &[(String, Run)]) {
    let base = results
        .iter()
        .find(|(name, _)| name == "direct")
        .map(|(_, r)| r.rate())
        .expect("direct was measured");
    let header = [
        "scenario",
        "requests",
        "seconds",
        "req/s",
        "mean ms",
        "p50 ms",
        "p99 ms",
        "vs direct",
    ];
    let rows: Vec<[String; 8]> = results
        .iter()
        .map(|(name, r)| {
            [
                name.clone(),
                r.requests().to_string(),
                format!("{:.3}", r.elapsed.as_secs_f64()),
                format!("{:.0}", r.rate()),
                ms(r.mean()),
                ms(r.percentile(50.0)),
                ms(r.percentile(99.0)),
                format!("{:.2}x", r.rate() / base),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = format!("{:<w$}", cells[0], w = widths[0]);
        for (cell, w) in cells[1..].iter().zip(&widths[1..]) {
            out.push_str(&format!("  {cell:>w$}"));
        }
        println!("{out}");
    };
    line(&header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(&rule.iter().map(String::as_str).collect::<Vec<_>>());
    for row in &rows {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = requests();
    let http = Http::new();
    let up = Upstream::start().await;

    let mut backends = vec![Backend::Memory];
    if on_path("redis-server") {
        backends.push(Backend::Redis);
    } else {
        println!("note: redis-server is not on PATH; skipping redis-won and redis-replay");
    }

    println!(
        "throughput: {n} requests per scenario, {CONCURRENCY} in flight, {} warm-up",
        WARMUP_REQUESTS.min(n)
    );
    let mut results = Vec::new();
    let direct = format!("{}/v1/payments/charge", up.url());
    results.push((
        "direct".to_owned(),
        scenario("direct", &http, &up, &direct, Kind::Plain, n).await,
    ));

    // Kept alive until the end: dropping a RedisServer kills it.
    let mut redis: Vec<RedisServer> = Vec::new();
    // Encryption at rest: the same scenarios with `store.encryption_keys` set.
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("bench-key");
    std::fs::write(&key, "42".repeat(32)).unwrap();
    let sealed = [format!("file:{}", key.display())];
    for backend in backends {
        let (store, server) = backend.start_store();
        redis.extend(server);
        let prefix = match backend {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
        };
        for encrypted in [false, true] {
            let store = match encrypted {
                false => store.clone(),
                true => store.clone().encryption_keys(&sealed),
            };
            let gw = TestGateway::start(&config(&up, store)).await;
            let prefix = match encrypted {
                false => prefix.to_owned(),
                true => format!("{prefix}-sealed"),
            };
            let mut cases = vec![];
            if backend == Backend::Memory && !encrypted {
                cases.push(("passthrough".to_owned(), gw.url("/other"), Kind::Plain));
            }
            let deduped = gw.url("/v1/payments/charge");
            cases.push((format!("{prefix}-won"), deduped.clone(), Kind::Won));
            cases.push((format!("{prefix}-replay"), deduped, Kind::Replay));
            for (name, url, kind) in cases {
                let r = scenario(&name, &http, &up, &url, kind, n).await;
                results.push((name, r));
            }
        }
    }

    println!();
    print_table(&results);
}
