//! The `wrk` rounds as an SVG beside the text report: per scenario and connection count,
//! throughput as a ratio to nginx (a gateway's new keys: to `nginx-keyed`, see
//! [`crate::scenarios::baseline`]), and the p50 and p99 latencies (medians of the rounds).

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use crate::report::median;
use crate::scenarios::{baseline, Scenario};
use crate::versus::WrkSample;
use crate::Settings;

/// One bar group: its label and its values.
struct Row {
    label: String,
    conns: usize,
    ratio: f64,
    p50: f64,
    p99: f64,
}

fn rows(
    scenarios: &[Scenario],
    samples: &BTreeMap<(usize, usize), Vec<WrkSample>>,
    set: &Settings,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for &conns in &set.connections {
        for (i, s) in scenarios.iter().enumerate() {
            let (Some(runs), Some(base)) = (
                samples.get(&(conns, i)),
                samples.get(&(conns, baseline(scenarios, i))),
            ) else {
                continue;
            };
            let med = |f: &dyn Fn(&WrkSample) -> f64| median(runs.iter().map(f).collect()).0;
            let ratios = runs
                .iter()
                .zip(base)
                .map(|(r, b)| r.ok_rate / b.ok_rate)
                .collect();
            rows.push(Row {
                label: format!("{} @{conns}", s.name),
                conns,
                ratio: median(ratios).0,
                p50: med(&|r| r.p50.as_secs_f64() * 1e3),
                p99: med(&|r| r.p99.as_secs_f64() * 1e3),
            });
        }
    }
    rows
}

/// Horizontal bars, one group per row: `bars` gives each row's values and their colours.
fn panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    caption: &str,
    rows: &[&Row],
    bars: &dyn Fn(&Row) -> Vec<(f64, RGBColor)>,
    mark: Option<f64>,
) {
    let n = rows.len();
    let max = rows
        .iter()
        .flat_map(|r| bars(r).into_iter().map(|b| b.0))
        .fold(mark.unwrap_or(0.0), f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(24)
        .y_label_area_size(190)
        .build_cartesian_2d(0f64..max.max(0.1), (0..n).into_segmented())
        .expect("chart");
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => rows.get(*i).map_or(String::new(), |r| r.label.clone()),
            _ => String::new(),
        })
        .draw()
        .expect("mesh");
    let bars_of = rows.iter().enumerate().flat_map(|(i, r)| {
        // Drawn over each other, the first lightest: give the longest first.
        bars(r)
            .into_iter()
            .enumerate()
            .map(move |(j, (v, colour))| {
                Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (v, SegmentValue::Exact(i + 1)),
                    ],
                    colour.mix(if j == 0 { 0.35 } else { 0.9 }).filled(),
                )
            })
    });
    chart.draw_series(bars_of).expect("bars");
    if let Some(x) = mark {
        let line = PathElement::new(
            vec![(x, SegmentValue::Exact(0)), (x, SegmentValue::Exact(n))],
            BLACK.stroke_width(1),
        );
        chart.draw_series(std::iter::once(line)).expect("mark");
    }
}

/// The height of a panel of `n` rows.
fn tall(n: usize) -> u32 {
    70 + 22 * n as u32
}

/// Writes the SVG to `path`: the ratios of every row, then the latencies of each
/// connection count apart (1,000 connections' are a hundred times 32's).
pub fn write(
    path: &Path,
    scenarios: &[Scenario],
    samples: &BTreeMap<(usize, usize), Vec<WrkSample>>,
    set: &Settings,
) {
    let rows = rows(scenarios, samples, set);
    let groups: Vec<(usize, Vec<&Row>)> = set
        .connections
        .iter()
        .map(|&c| (c, rows.iter().filter(|r| r.conns == c).collect()))
        .filter(|(_, g): &(usize, Vec<&Row>)| !g.is_empty())
        .collect();
    let height = tall(rows.len()) + groups.iter().map(|(_, g)| tall(g.len())).sum::<u32>();
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE).expect("background");
    let (top, mut rest) = root.split_vertically(tall(rows.len()));
    let all: Vec<&Row> = rows.iter().collect();
    panel(
        &top,
        "wrk: requests per second, x nginx proxy_pass sent the same requests (line: 1.0)",
        &all,
        &|r| vec![(r.ratio, BLUE)],
        Some(1.0),
    );
    for (conns, group) in &groups {
        let (area, below) = rest.split_vertically(tall(group.len()));
        panel(
            &area,
            &format!("wrk, {conns} connections: latency ms, p99 (light) and p50 (dark)"),
            group,
            &|r| vec![(r.p99, RED), (r.p50, RED)],
            None,
        );
        rest = below;
    }
    root.present().expect("svg written");
}
