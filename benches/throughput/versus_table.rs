//! The `wrk` table: per scenario and connection count, medians over the rounds with their
//! ranges, ratios to nginx in the same round, and CPU per request of every process.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::report::median;
use crate::scenarios::{baseline, Scenario};
use crate::versus::WrkSample;
use crate::Settings;

/// `median (low-high)` of `f` over the rounds.
fn spread(runs: &[WrkSample], f: impl Fn(&WrkSample) -> Option<f64>, digits: usize) -> String {
    let v: Vec<f64> = runs.iter().filter_map(f).collect();
    if v.is_empty() {
        return "-".into();
    }
    let (m, lo, hi) = median(v);
    format!("{m:.digits$} ({lo:.digits$}-{hi:.digits$})")
}

/// `f` of each round over `f` of nginx in the same round.
fn ratio(runs: &[WrkSample], base: &[WrkSample], f: impl Fn(&WrkSample) -> f64) -> String {
    let v = runs.iter().zip(base).map(|(r, b)| f(r) / f(b)).collect();
    let (m, lo, hi) = median(v);
    format!("{m:.2} ({lo:.2}-{hi:.2})")
}

/// Every round's answers other than 2xx, by status (`sock`: socket errors), summed.
fn refused(runs: &[WrkSample]) -> String {
    let mut all: BTreeMap<u16, u64> = BTreeMap::new();
    for (code, n) in runs.iter().flat_map(|r| &r.refused) {
        *all.entry(*code).or_default() += n;
    }
    if all.is_empty() {
        return "-".into();
    }
    let shown: Vec<String> = all
        .iter()
        .map(|(code, n)| match code {
            0 => format!("sock:{n}"),
            c => format!("{c}:{n}"),
        })
        .collect();
    shown.join(" ")
}

/// Every round's `unstored` answers, summed (`-` where the server is no gateway).
fn unstored(runs: &[WrkSample]) -> String {
    let counts: Vec<u64> = runs.iter().filter_map(|r| r.unstored).collect();
    match counts.is_empty() {
        true => "-".into(),
        false => counts.iter().sum::<u64>().to_string(),
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The whole text report.
pub fn render(
    scenarios: &[Scenario],
    samples: &BTreeMap<(usize, usize), Vec<WrkSample>>,
    set: &Settings,
) -> String {
    let speed = [
        "scenario",
        "conns",
        "2xx/s",
        "x nginx",
        "non-2xx",
        "unstored",
        "p50 ms",
        "p99 ms",
        "p99 x nginx",
    ];
    let cost = [
        "scenario",
        "conns",
        "proxy",
        "origin",
        "wrk",
        "redis",
        "sum",
        "sum x nginx",
        "machine",
        "machine x nginx",
        "redis main",
        "redis calls",
        "redis usec",
        "redis reads",
    ];
    let (mut fast, mut cheap): (Vec<Vec<String>>, Vec<Vec<String>>) = (vec![], vec![]);
    for &conns in &set.connections {
        for (i, s) in scenarios.iter().enumerate() {
            let (Some(runs), Some(base)) = (
                samples.get(&(conns, i)),
                samples.get(&(conns, baseline(scenarios, i))),
            ) else {
                continue;
            };
            let total = |r: &WrkSample, col: usize| {
                r.redis_main_us.map(|_| {
                    r.commands
                        .values()
                        .map(|c| if col == 0 { c.0 } else { c.1 })
                        .sum()
                })
            };
            fast.push(vec![
                s.name.clone(),
                conns.to_string(),
                spread(runs, |r| Some(r.ok_rate), 0),
                ratio(runs, base, |r| r.ok_rate),
                refused(runs),
                unstored(runs),
                spread(runs, |r| Some(ms(r.p50)), 2),
                spread(runs, |r| Some(ms(r.p99)), 2),
                ratio(runs, base, |r| ms(r.p99)),
            ]);
            cheap.push(vec![
                s.name.clone(),
                conns.to_string(),
                spread(runs, |r| Some(r.proxy_us), 1),
                spread(runs, |r| Some(r.origin_us), 1),
                spread(runs, |r| Some(r.wrk_us), 1),
                spread(runs, |r| r.redis_us, 1),
                spread(runs, |r| Some(r.sum_us()), 1),
                ratio(runs, base, WrkSample::sum_us),
                spread(runs, |r| Some(r.machine_us), 1),
                ratio(runs, base, |r| r.machine_us),
                spread(runs, |r| r.redis_main_us, 1),
                spread(runs, |r| total(r, 0), 2),
                spread(runs, |r| total(r, 1), 1),
                spread(runs, |r| r.redis_reads, 3),
            ]);
        }
    }
    let mut out = format!(
        "wrk -t1 --latency, {} rounds of {:?}: medians (range); 2xx/s: 2xx answers a second \
         (past 100 connections answers are counted by status, and only 2xx count); x nginx: the \
         ratio to nginx proxy_pass in the same round, sent the same kind of requests (a \
         gateway's new keys: nginx-keyed, a key never sent before on every request; every other \
         row: nginx); non-2xx: the other answers by status over all rounds (sock: socket \
         errors); unstored: the gateway's unstored answers over all rounds\n\n",
        set.rounds, set.limit
    );
    table(&mut out, &speed, &fast);
    out.push_str(
        "\nCPU time per request, us: the proxy (nginx or the gateway), the nginx origin, wrk, \
         redis-server; their sum; the whole machine (shared: others' work counts too); \
         Redis's main thread, and its commands per request (INFO commandstats, summed: a \
         script's usec holds those of the commands it runs, which count again on their own), \
         and its reads from client sockets per request (each a wake-up of Redis)\n\n",
    );
    table(&mut out, &cost, &cheap);
    commands(&mut out, scenarios, samples);
    out
}

/// Redis's commands per request, summed over the rounds, for every Redis scenario.
fn commands(
    out: &mut String,
    scenarios: &[Scenario],
    samples: &BTreeMap<(usize, usize), Vec<WrkSample>>,
) {
    out.push_str("\nINFO commandstats per request (calls, usec per call), mean of the rounds:\n");
    for (&(conns, i), runs) in samples {
        let mut merged: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for (name, (calls, usec)) in runs.iter().flat_map(|r| &r.commands) {
            let m = merged.entry(name).or_default();
            m.0 += calls / runs.len() as f64;
            m.1 += usec / runs.len() as f64;
        }
        if merged.is_empty() {
            continue;
        }
        let _ = write!(out, "  {} ({conns} conns):", scenarios[i].name);
        for (name, (calls, usec)) in merged {
            let _ = write!(out, " {name} {calls:.2} x {:.2}us;", usec / calls.max(1e-9));
        }
        out.push('\n');
    }
}

/// Aligned columns: the first left, the rest right.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut line = |cells: &[String]| {
        let _ = write!(out, "{:<w$}", cells[0], w = widths[0]);
        for (cell, w) in cells[1..].iter().zip(&widths[1..]) {
            let _ = write!(out, "  {cell:>w$}");
        }
        out.push('\n');
    };
    line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
    for row in rows {
        line(row);
    }
}
