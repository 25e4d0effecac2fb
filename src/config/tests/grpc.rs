//! `grpc = true` routes, their status codes and h2c to the upstream.

use super::*;
use crate::protocol::route::{dialect::Envelope, StatusMeaning};

const ROUTE: &str = r#"
[[routes]]
name = "pay"
methods = ["POST"]
path = "/pay.v1.Payments/Create"
key = { header = "idempotency-key" }
scope = []
grpc = true
"#;

#[test]
fn a_grpc_route_reads_codes_by_number_or_name_and_answers_in_grpc() {
    let c = with(ROUTE).unwrap();
    let r = &c.routes[0];
    assert!(r.grpc);
    assert_eq!(r.errors.envelope, Envelope::Grpc);
    assert_eq!(r.grpc_codes.classify(14), StatusMeaning::Retry);
    assert_eq!(r.grpc_codes.classify(8), StatusMeaning::Retry);
    assert_eq!(r.grpc_codes.classify(4), StatusMeaning::Unknown);
    assert_eq!(r.grpc_codes.classify(3), StatusMeaning::Final);
    assert_eq!(c.server.upstream_http2, UpstreamHttp2::Grpc);
    let c = with(&format!(
        "{ROUTE}grpc_retry_codes = [\"UNAVAILABLE\", 10]\ngrpc_unknown_codes = []\n"
    ))
    .unwrap();
    let codes = &c.routes[0].grpc_codes;
    assert_eq!(codes.classify(10), StatusMeaning::Retry);
    assert_eq!(codes.classify(8), StatusMeaning::Final);
    assert_eq!(codes.classify(4), StatusMeaning::Final);
}

#[test]
fn grpc_fields_are_checked_against_the_route() {
    let e = err(&ROUTE.replace("[\"POST\"]", "[\"POST\", \"PUT\"]"));
    assert!(
        e.starts_with("routes[pay].methods: a grpc = true route"),
        "{e}"
    );
    let e = err(&format!("{ROUTE}store_body = false\n"));
    assert!(e.starts_with("routes[pay].store_body:"), "{e}");
    let e = err(&format!("{ROUTE}grpc_retry_codes = [\"NOPE\"]\n"));
    assert!(e.contains("gRPC status code"), "{e}");
    let plain = ROUTE.replace("grpc = true\n", "grpc_unknown_codes = [4]\n");
    let e = err(&plain);
    assert!(e.contains("applies to a grpc = true route only"), "{e}");
}

#[test]
fn upstream_http2_is_one_of_three() {
    let c = Config::from_toml(&format!("{BASE}upstream_http2 = \"prior-knowledge\"\n")).unwrap();
    assert_eq!(c.server.upstream_http2, UpstreamHttp2::PriorKnowledge);
    let e = err("upstream_http2 = \"h2\"\n");
    assert!(e.contains("prior-knowledge"), "{e}");
}
