//! The built-in generator's table: medians over rounds with their ranges.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Sample, Scenario, Settings};

pub fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
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
