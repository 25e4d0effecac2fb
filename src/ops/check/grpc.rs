//! `check --request` on a `grpc = true` route: the route's gRPC rules, and the gateway's
//! answer as the gRPC status a client would see.

use std::fmt::Write;

use crate::edge::problem::GatewayError;
use crate::protocol::route::Route;

/// A gRPC route's own rules: the one message, and which statuses settle the claim how.
pub(super) fn rules(out: &mut String, route: &Route) {
    let codes = |specs: &[crate::protocol::route::StatusSpec]| {
        let names: Vec<String> = specs
            .iter()
            .map(|s| match s {
                crate::protocol::route::StatusSpec::Code(c) => {
                    crate::protocol::grpc::status::name(*c).map_or(c.to_string(), str::to_owned)
                }
                crate::protocol::route::StatusSpec::Class(c) => format!("{c}xx"),
            })
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    let _ = writeln!(
        out,
        "grpc: one request message (--body), hashed after its grpc-encoding; release on {}; unknown on {}; errors answered as gRPC statuses",
        codes(&route.grpc_codes.retry),
        codes(&route.grpc_codes.unknown)
    );
}

/// A refusal as the gRPC client sees it: its status code and the problem's name.
pub(super) fn answer(out: &mut String, e: &GatewayError) {
    let code = e.grpc_code();
    let name = crate::protocol::grpc::status::name(code).unwrap_or("?");
    let _ = write!(out, "answer: gRPC {name} ({code}), {}", e.name());
    let _ = match e.client_detail() {
        Some(d) => writeln!(out, ": {d}"),
        None => writeln!(out),
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_grpc_request_is_explained_with_its_message_and_grpc_answers() {
        let toml = r#"
[server]
listen = "127.0.0.1:8080"
upstream = "http://127.0.0.1:50051"
[[routes]]
name = "pay"
methods = ["POST"]
path = "/pay.v1.Payments/Create"
key = { header = "idempotency-key" }
scope = []
grpc = true
"#;
        let line = "POST /pay.v1.Payments/Create";
        let out =
            super::super::tests::probe_on(toml, line, &[("idempotency-key", "k-1")], "amount 10");
        assert!(out.contains("grpc: one request message"), "{out}");
        assert!(
            out.contains("release on UNAVAILABLE, RESOURCE_EXHAUSTED"),
            "{out}"
        );
        assert!(out.contains("unknown on DEADLINE_EXCEEDED"), "{out}");
        assert!(out.contains("key value: k-1"), "{out}");
        assert!(
            out.contains("required (missing: INVALID_ARGUMENT)"),
            "{out}"
        );
        assert!(
            out.contains("ABORTED in flight, FAILED_PRECONDITION if"),
            "{out}"
        );
        let out =
            super::super::tests::probe_on(toml, line, &[("content-type", "application/grpc")], "x");
        assert!(
            out.contains("answer: gRPC INVALID_ARGUMENT (3), idempotency-key-missing"),
            "{out}"
        );
    }
}
