//! The gRPC dialect (a `grpc = true` route): every answer of the gateway's own is a
//! trailers-only gRPC response: HTTP 200, `content-type: application/grpc`, `grpc-status`
//! and a percent-encoded `grpc-message` a person can read, with no message. The same
//! errors as in every dialect, read as gRPC clients read statuses: `UNAVAILABLE` and
//! `ABORTED` are what their retry policies retry.

use http::header::{HeaderMap, HeaderValue};

use super::GatewayError;
use crate::protocol::grpc::status::{self, code};
use crate::protocol::grpc::{GRPC_MESSAGE, GRPC_STATUS};
use crate::protocol::key::coding::CodingError;
use crate::protocol::key::KeyError;
use crate::upstream::UpstreamFailure;

/// `grpc-retry-pushback-ms`: how long gRPC's own retry policy waits before the next
/// attempt (gRFC A6), set beside `Retry-After` on a key in flight.
pub const RETRY_PUSHBACK: http::HeaderName =
    http::HeaderName::from_static("grpc-retry-pushback-ms");

impl GatewayError {
    /// The gRPC status code this error answers with.
    pub fn grpc_code(&self) -> u16 {
        use GatewayError::*;
        match self {
            Key(KeyError::Coding(CodingError::Unsupported(_) | CodingError::TooMany { .. }))
            | MethodNotSupported => 12,
            Key(KeyError::Coding(CodingError::TooLarge { .. })) | BodyTooLarge { .. } => {
                code::RESOURCE_EXHAUSTED
            }
            Key(_) | AmbiguousFraming | Path(_) | MethodCase | HostInvalid(_) | BodyUnreadable
            | BadAdminRequest(_) => code::INVALID_ARGUMENT,
            BodyTimeout | Upstream(UpstreamFailure::Timeout(_)) => code::DEADLINE_EXCEEDED,
            Unauthorized | SignatureInvalid => code::UNAUTHENTICATED,
            NotFound | UnknownRoute | RecordNotFound => 5,
            Mismatch | Stale | StaleFence | ClaimLive { .. } => code::FAILED_PRECONDITION,
            Conflict { .. } | OutcomeUnknown => code::ABORTED,
            StoreUnavailable | Overloaded | Upstream(UpstreamFailure::Connect(_)) => {
                code::UNAVAILABLE
            }
            // The call may have taken effect: neither retryable nor a refusal.
            Upstream(UpstreamFailure::Broken(_)) => 2,
            // Executed once; its answer was not kept.
            ReplayUnavailable { .. } => 6,
            CorruptRecord | RecordUnreadable | Internal => code::INTERNAL,
        }
    }

    /// `grpc-message`: the title, what the client can do, and for a held key, the hold.
    fn grpc_message(&self) -> String {
        let (_, name, title) = self.describe();
        let mut message = format!("{title} ({name})");
        if let Some(detail) = self.detail() {
            message.push_str(": ");
            message.push_str(&detail);
        }
        if let GatewayError::OutcomeUnknown = self {
            message.push_str(" (held: on_unknown = \"hold\")");
        }
        message
    }

    /// The trailers-only head's gRPC fields.
    pub(super) fn add_grpc_headers(&self, headers: &mut HeaderMap) {
        headers.insert(GRPC_STATUS, HeaderValue::from(self.grpc_code()));
        let message = status::percent_encode(&self.grpc_message());
        // Percent-encoded: visible ASCII only.
        if let Ok(v) = HeaderValue::from_str(&message) {
            headers.insert(GRPC_MESSAGE, v);
        }
        if let GatewayError::Conflict { retry_after } = self {
            let ms = retry_after.as_millis().max(1);
            headers.insert(RETRY_PUSHBACK, HeaderValue::from(ms as u64));
        }
    }
}
