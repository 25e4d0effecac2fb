//! A route's gRPC fields: `grpc`, `grpc_retry_codes`, `grpc_unknown_codes`, checked
//! against the rest of the route.

use http::Method;

use super::defaults::{DEFAULT_GRPC, DEFAULT_GRPC_RETRY_CODES, DEFAULT_GRPC_UNKNOWN_CODES};
use super::file::FileRoute;
use super::{invalid, ConfigError};
use crate::protocol::grpc::status::Code;
use crate::protocol::route::dialect::Envelope;
use crate::protocol::route::{Dialect, StatusPolicy, StatusSpec};

/// `grpc_retry_codes` and `grpc_unknown_codes`, as the status policy reads them.
pub(super) fn codes(r: &FileRoute) -> StatusPolicy {
    StatusPolicy {
        retry: listed(&r.grpc_retry_codes, DEFAULT_GRPC_RETRY_CODES),
        unknown: listed(&r.grpc_unknown_codes, DEFAULT_GRPC_UNKNOWN_CODES),
    }
}

fn listed(written: &Option<Vec<Code>>, default: &[StatusSpec]) -> Vec<StatusSpec> {
    match written {
        Some(codes) => codes.iter().map(|c| StatusSpec::Code(c.0)).collect(),
        None => default.to_vec(),
    }
}

/// `grpc = true`: POST only (every gRPC call is a POST), and none of the gRPC fields
/// without it.
pub(super) fn validate(at: &str, r: &FileRoute, methods: &[Method]) -> Result<bool, ConfigError> {
    let grpc = r.grpc.unwrap_or(DEFAULT_GRPC);
    if grpc && methods.iter().any(|m| m != Method::POST) {
        return Err(invalid(
            format!("{at}.methods"),
            "a grpc = true route takes [\"POST\"]: every gRPC call is a POST",
        ));
    }
    if grpc && r.store_body == Some(false) {
        return Err(invalid(
            format!("{at}.store_body"),
            "a grpc = true route stores its answers: the status a replay needs is in them",
        ));
    }
    if !grpc && (r.grpc_retry_codes.is_some() || r.grpc_unknown_codes.is_some()) {
        return Err(invalid(
            format!("{at}.grpc_retry_codes"),
            "applies to a grpc = true route only",
        ));
    }
    Ok(grpc)
}

/// A gRPC route's own answers are gRPC statuses, whatever `errors` says.
pub(super) fn dialect(mut errors: Dialect, grpc: bool) -> Dialect {
    if grpc {
        errors.envelope = Envelope::Grpc;
    }
    errors
}
