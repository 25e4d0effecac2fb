use super::*;

#[test]
fn request_counters_are_read_per_route() {
    let page = "# TYPE dedupe_requests counter\n\
        dedupe_requests_total{route=\"orders\",outcome=\"won\"} 3\n\
        dedupe_requests_total{route=\"orders\",outcome=\"replayed\"} 2\n\
        dedupe_requests_total{route=\"orders-b\",outcome=\"won\"} 9\n\
        dedupe_upstream_responses_total{route=\"orders\",class=\"2xx\"} 3\n";
    let m = requests_by_outcome(page, "orders");
    assert_eq!(m.len(), 2);
    assert_eq!(m["won"], 3.0);
    assert_eq!(m["replayed"], 2.0);
}

#[test]
fn only_plain_http_base_urls() {
    assert_eq!(
        base_url("--target", "http://127.0.0.1:8080/").unwrap(),
        "http://127.0.0.1:8080"
    );
    assert!(base_url("--target", "https://x").is_err());
    assert!(base_url("--target", "localhost:1").is_err());
}
