//! The expositions and the figures the log prints.

use super::*;

#[test]
fn the_text_format_names_counters_by_their_samples_and_has_no_eof() {
    let m = Metrics::new();
    m.outcome(&Arc::from("orders"), "won");
    m.upstream(&Arc::from("orders"), 201, Duration::from_millis(3));
    let open = m.encode();
    assert!(open.contains("# TYPE dedupe_requests counter\n"), "{open}");
    assert!(open.ends_with("# EOF\n"), "{open}");
    let text = m.exposition(Exposition::PrometheusText);
    assert!(
        text.contains("# HELP dedupe_requests_total Requests by route and key outcome.\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE dedupe_requests_total counter\n"),
        "{text}"
    );
    assert!(
        text.contains("dedupe_requests_total{route=\"orders\",outcome=\"won\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE dedupe_upstream_latency_seconds histogram\n"),
        "{text}"
    );
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    // Every sample line of one is in the other.
    let samples = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(samples(&open), samples(&text));
}

#[test]
fn millis_print_without_float_noise() {
    assert_eq!(millis(Duration::from_nanos(1_057_678)).to_string(), "1.057");
    assert_eq!(millis(Duration::from_micros(2_500)).to_string(), "2.5");
    assert_eq!(millis(Duration::from_secs(3)).to_string(), "3000");
}
