//! `BENCH_RATE=N`: the latency the gateway adds to a call at a fixed rate of N requests a
//! second, beside a direct call to the same upstream and beside nginx `proxy_pass`.
//!
//! Open-loop (see [`Load::run_paced`]): requests are sent when they are due, not when the
//! previous answer came, so a stall shows in the percentiles as the wait it caused. Each
//! scenario runs `BENCH_SECONDS` per round on the first of `BENCH_CONNECTIONS`
//! connections, rounds interleaved; every row's "added" figures are its percentile minus
//! the direct call's in the same round, medians over the rounds. The `*-sealed` rows run
//! only when `BENCH_ONLY` names them.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::load::{Keys, Load, Pass};
use crate::report::median;
use crate::scenarios::{self, Kind, Scenario, Setup};
use crate::servers::Nginx;
use crate::upstream::Counting;
use crate::Settings;

/// One scenario's p50 and p99 in one round.
struct Sample {
    p50: Duration,
    p99: Duration,
}

pub async fn run(rate: f64, set: &Settings, setup: &Setup<'_>) {
    let up = Counting::start().await;
    let nginx = Nginx::start(up.addr);
    let (_gateways, mut scenarios) = scenarios::build(up.addr, nginx.as_ref(), true, setup);
    if std::env::var("BENCH_ONLY").is_err() {
        scenarios.retain(|s| !s.name.contains("-sealed"));
    }
    let direct = scenarios
        .iter()
        .position(|s| s.name == "direct")
        .expect("the direct scenario");
    let conns = set.connections[0];
    println!(
        "latency: {rate} requests/s open-loop for {:?} per pass, {} rounds, {conns} connections",
        set.limit, set.rounds
    );
    let mut samples: BTreeMap<usize, Vec<Sample>> = BTreeMap::new();
    for round in 0..set.rounds {
        for (i, s) in scenarios.iter().enumerate() {
            let pass = paced(s, &up, conns, round, rate, set.limit).await;
            let got = pass.rate();
            eprintln!(
                "round {round}: {:<22} {got:>7.0} req/s  p50 {:>6.3} ms  p99 {:>6.3} ms",
                s.name,
                ms(pass.percentile(50.0)),
                ms(pass.percentile(99.0))
            );
            samples.entry(i).or_default().push(Sample {
                p50: pass.percentile(50.0),
                p99: pass.percentile(99.0),
            });
        }
    }
    table(&scenarios, &samples, direct);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Warms the connections, primes a replayed key, then one paced pass; checks the
/// upstream's effects.
async fn paced(
    s: &Scenario,
    up: &Counting,
    conns: usize,
    round: usize,
    rate: f64,
    limit: Duration,
) -> Pass {
    let mut load = Load::connect(s.addr, conns).await;
    let tag = format!("latency-{}-{round}", s.name);
    let keys = |pass: &str| match s.kind {
        Kind::Plain => Keys::None,
        Kind::Won => Keys::Unique(format!("{tag}-{pass}")),
        Kind::Replay => Keys::Same(tag.clone()),
    };
    if let Kind::Replay = s.kind {
        // One request first, alone: the key's record, which every later one replays.
        let primed = load.run(s.path, &keys("prime"), 1, limit).await;
        assert_eq!(primed.requests(), 1, "{tag}: priming");
    }
    let warm = load.run(s.path, &keys("warm"), 2 * conns, limit).await;
    assert_eq!(warm.requests(), 2 * conns, "{tag}: warm-up");
    let before = up.effects();
    let pass = load.run_paced(s.path, &keys("main"), rate, limit).await;
    let (effects, n) = (up.effects() - before, pass.requests());
    let (want_effects, want_replayed) = match s.kind {
        Kind::Plain | Kind::Won => (n as u64, 0),
        Kind::Replay => (0, n),
    };
    assert_eq!(effects, want_effects, "{tag}: upstream effects after {n}");
    assert_eq!(pass.replayed, want_replayed, "{tag}: replays after {n}");
    pass
}

fn table(scenarios: &[Scenario], samples: &BTreeMap<usize, Vec<Sample>>, direct: usize) {
    let us = |v: f64| format!("{:.0}", v * 1e3);
    println!(
        "{:<24} {:>20} {:>20} {:>18} {:>18}",
        "scenario", "p50 ms", "p99 ms", "added p50 us", "added p99 us"
    );
    let base = &samples[&direct];
    for (i, s) in scenarios.iter().enumerate() {
        let runs = &samples[&i];
        let (p50, lo50, hi50) = median(runs.iter().map(|r| ms(r.p50)).collect());
        let (p99, lo99, hi99) = median(runs.iter().map(|r| ms(r.p99)).collect());
        let added = |f: fn(&Sample) -> Duration| {
            let (m, lo, hi) = median(
                runs.iter()
                    .zip(base)
                    .map(|(r, b)| ms(f(r)) - ms(f(b)))
                    .collect(),
            );
            format!("{} ({}..{})", us(m), us(lo), us(hi))
        };
        println!(
            "{:<24} {:>20} {:>20} {:>18} {:>18}",
            s.name,
            format!("{p50:.3} ({lo50:.2}-{hi50:.2})"),
            format!("{p99:.3} ({lo99:.2}-{hi99:.2})"),
            added(|r| r.p50),
            added(|r| r.p99),
        );
    }
}
