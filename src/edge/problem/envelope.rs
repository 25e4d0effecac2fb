//! The body and headers of an answer in each dialect: RFC 9457 problem+json, Stripe's
//! error object (and how Stripe's clients read it), the operator's template, or gRPC's
//! trailers-only answer.

use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use http::StatusCode;
use serde::Serialize;

use super::GatewayError;
use crate::protocol::headers::{REPLAYED, STALE, STRIPE_SHOULD_RETRY};
use crate::protocol::route::dialect::{Dialect, Envelope, Fields};

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    /// `claim-live`: the live claim's fence and lease left (extension members).
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_left_ms: Option<u128>,
}

/// Stripe's error object: `{"error": {...}}`.
#[derive(Serialize)]
struct StripeBody<'a> {
    error: StripeError<'a>,
}

#[derive(Serialize)]
struct StripeError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    doc_url: Option<&'a str>,
}

/// How an answer reads to Stripe's clients.
pub(super) struct StripeReading {
    pub(super) status: StatusCode,
    kind: &'static str,
    code: String,
    pub(super) should_retry: Option<&'static str>,
}

impl GatewayError {
    /// The headers an answer carries in every dialect, and Stripe's retry advice in its.
    pub(super) fn add_headers(&self, headers: &mut HeaderMap, dialect: &Dialect) {
        match dialect.envelope {
            Envelope::Stripe => {
                if let Some(retry) = self.stripe_reading().should_retry {
                    headers.insert(STRIPE_SHOULD_RETRY.clone(), HeaderValue::from_static(retry));
                }
            }
            Envelope::Grpc => self.add_grpc_headers(headers),
            Envelope::Problem | Envelope::Template(_) => {}
        }
        match self {
            GatewayError::Conflict { retry_after } => {
                let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
                headers.insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
            }
            GatewayError::StoreUnavailable | GatewayError::Overloaded => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            GatewayError::Unauthorized => {
                headers.insert(
                    http::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer"),
                );
            }
            GatewayError::Stale => {
                headers.insert(STALE.clone(), HeaderValue::from_static("true"));
            }
            GatewayError::ReplayUnavailable { .. } => {
                headers.insert(REPLAYED.clone(), HeaderValue::from_static("true"));
            }
            _ => {}
        }
    }

    /// The status, content type and body of the answer in `dialect`.
    pub(super) fn body_in(&self, dialect: &Dialect) -> (StatusCode, HeaderValue, Vec<u8>) {
        let (status, name, title) = self.describe();
        let kind = dialect.problem_type(name);
        let detail = self.detail();
        let detail = detail.as_deref();
        // Serialising structs of strings and integers cannot fail.
        match &dialect.envelope {
            Envelope::Problem => {
                let problem = Problem {
                    kind: &kind,
                    title,
                    status: status.as_u16(),
                    detail,
                    fence: match self {
                        GatewayError::ClaimLive { fence, .. } => Some(*fence),
                        _ => None,
                    },
                    lease_left_ms: match self {
                        GatewayError::ClaimLive { lease_left, .. } => Some(lease_left.as_millis()),
                        _ => None,
                    },
                };
                let body = serde_json::to_vec(&problem).unwrap_or_default();
                let problem_json = HeaderValue::from_static("application/problem+json");
                (status, problem_json, body)
            }
            Envelope::Stripe => {
                let reading = self.stripe_reading();
                let message = match detail {
                    Some(d) => format!("{title}: {d}"),
                    None => title.to_owned(),
                };
                let error = StripeError {
                    kind: reading.kind,
                    code: &reading.code,
                    message: &message,
                    doc_url: dialect.problem_base_url.is_some().then_some(&*kind),
                };
                let body = serde_json::to_vec(&StripeBody { error }).unwrap_or_default();
                let json = HeaderValue::from_static("application/json");
                (reading.status, json, body)
            }
            // Trailers-only: the status is in the head (`add_headers`), with no message.
            Envelope::Grpc => {
                let grpc = HeaderValue::from_static("application/grpc");
                (StatusCode::OK, grpc, Vec::new())
            }
            Envelope::Template(t) => {
                let fields = Fields {
                    status: status.as_u16(),
                    kind: &kind,
                    name,
                    title,
                    detail,
                };
                let body = t.fill(&fields).into_bytes();
                (status, t.content_type().clone(), body)
            }
        }
    }

    /// How Stripe's clients are to read this error. The idempotency errors (in flight,
    /// reused, held) are `idempotency_error` at 400: stripe-python and stripe-ruby raise
    /// `IdempotencyError` only for that type at 400 or 404 (Stripe answers a key in flight
    /// with 409, which they raise as a generic `APIError`), and `Stripe-Should-Retry` tells
    /// them which of the three to retry. Other statuses stay: `api_error` for 5xx,
    /// `invalid_request_error` for the rest. The code is the problem's name in Stripe's
    /// spelling, and Stripe's own `idempotency_key_in_use` for a key in flight.
    pub(super) fn stripe_reading(&self) -> StripeReading {
        let (status, name, _) = self.describe();
        let code = name.replace('-', "_");
        let idempotency = |code: String, retry| StripeReading {
            status: StatusCode::BAD_REQUEST,
            kind: "idempotency_error",
            code,
            should_retry: Some(retry),
        };
        match self {
            GatewayError::Conflict { .. } => idempotency("idempotency_key_in_use".into(), "true"),
            GatewayError::Mismatch | GatewayError::OutcomeUnknown => idempotency(code, "false"),
            _ => StripeReading {
                status,
                kind: if status.is_server_error() {
                    "api_error"
                } else {
                    "invalid_request_error"
                },
                code,
                should_retry: None,
            },
        }
    }
}
