//! The one place an error becomes a response: a stable status, problem name, `type` and
//! `title`, written in the route's dialect (RFC 9457 `application/problem+json` by default,
//! Stripe's error object, or the operator's template) with the same headers in each. The
//! client gets a short, stable message; the cause goes to the log at the point the error
//! is made.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};

use crate::protocol::grpc::frame::FrameError;
use crate::protocol::key::coding::CodingError;
use crate::protocol::key::KeyError;
use crate::protocol::path::PathError;
use crate::protocol::record::StoredBody;
use crate::protocol::route::dialect::{Dialect, Envelope};
use crate::upstream::UpstreamFailure;
use crate::{full, Body};

mod envelope;
mod grpc;

pub use self::grpc::RETRY_PUSHBACK;

/// Every error the gateway answers itself.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Both `Content-Length` and `Transfer-Encoding` (request smuggling risk).
    #[error("request has both Content-Length and Transfer-Encoding")]
    AmbiguousFraming,
    /// A path that cannot be normalised safely.
    #[error(transparent)]
    Path(#[from] PathError),
    /// `CONNECT`: a reverse proxy opens no tunnels.
    #[error("CONNECT is not supported")]
    MethodNotSupported,
    /// A method in other than upper case where a route would match its upper-case form.
    #[error("method not in upper case")]
    MethodCase,
    /// `Host` missing, repeated or malformed.
    #[error("{0}")]
    HostInvalid(&'static str),
    /// The request body exceeds `server.max_body`.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: u64,
    },
    /// The request body could not be read.
    #[error("request body could not be read")]
    BodyUnreadable,
    /// The request body did not arrive within `server.body_read_timeout`.
    #[error("request body timed out")]
    BodyTimeout,
    /// Admin: missing or wrong bearer token.
    #[error("admin token missing or wrong")]
    Unauthorized,
    /// Admin: no such endpoint.
    #[error("not found")]
    NotFound,
    /// Admin: no route of that name.
    #[error("no such route")]
    UnknownRoute,
    /// Admin: the route exists but holds no record under that key.
    #[error("no such record")]
    RecordNotFound,
    /// Admin: a request the admin API cannot use.
    #[error("{0}")]
    BadAdminRequest(String),
    /// No usable idempotency key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A signed route's request whose webhook signature is missing, does not verify or is
    /// too old: never claimed, stored or forwarded. Why is logged, never told.
    #[error("webhook signature missing, invalid or expired")]
    SignatureInvalid,
    /// Same key, different request.
    #[error("idempotency key reused with a different request")]
    Mismatch,
    /// The first request with this key is still in flight.
    #[error("a request with this idempotency key is in flight")]
    Conflict {
        /// Lease time left.
        retry_after: Duration,
    },
    /// An earlier request's outcome is unknown and held for an operator.
    #[error("the outcome of a request with this idempotency key is unknown")]
    OutcomeUnknown,
    /// An ordered route's request whose version is not greater than the highest completed
    /// for its entity: never forwarded, answered 200 with `Dedupe-Stale: true` (a sender
    /// must not retry an obsolete event).
    #[error("a newer version of this entity was already written")]
    Stale,
    /// Admin: a resolution under a fence that no longer owns the claim.
    #[error("stale fence")]
    StaleFence,
    /// Admin: resolve or DELETE on a claim whose lease is live (its owner may still be
    /// executing it), without `"force": true`.
    #[error("the claim's lease is live")]
    ClaimLive {
        /// The claim's fence.
        fence: u64,
        /// Lease time left.
        lease_left: Duration,
    },
    /// The store failed and the route fails closed.
    #[error("dedupe store unavailable")]
    StoreUnavailable,
    /// Too many requests whose clients hung up are still running: no new claim is made.
    #[error("too many detached requests in flight")]
    Overloaded,
    /// The upstream call got no (whole) answer: unreachable (502), no answer in time
    /// (504), or broken (502). The typed cause decides which, here and nowhere else.
    #[error(transparent)]
    Upstream(#[from] UpstreamFailure),
    /// The key completed, but its response body was not stored.
    #[error("original response not stored")]
    ReplayUnavailable {
        /// The original status.
        status: StatusCode,
        /// Why the body is missing.
        body: StoredBody,
    },
    /// A stored record could not be decoded or belongs to another key.
    #[error("stored record unusable")]
    CorruptRecord,
    /// The store holds something under the key that is no record this gateway can read
    /// (another layout, an unknown format, a value no gateway wrote): never forwarded.
    #[error("stored record unreadable")]
    RecordUnreadable,
    /// A bug: a task panicked.
    #[error("internal error")]
    Internal,
}

/// Status, problem type suffix and title of a refused key (see [`GatewayError::describe`]).
fn key_problem(e: &KeyError) -> (StatusCode, &'static str, &'static str) {
    match e {
        KeyError::Missing { .. } => (
            StatusCode::BAD_REQUEST,
            "idempotency-key-missing",
            "Idempotency key missing",
        ),
        KeyError::Invalid { .. } => (
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            "Idempotency key invalid",
        ),
        KeyError::MalformedJson(_) => (
            StatusCode::BAD_REQUEST,
            "malformed-json",
            "Request body is not valid JSON",
        ),
        KeyError::DuplicateJsonKey(_) => (
            StatusCode::BAD_REQUEST,
            "ambiguous-json",
            "Request body has a duplicated JSON object key",
        ),
        KeyError::MissingPart(_) => (
            StatusCode::BAD_REQUEST,
            "fingerprint-part-missing",
            "Request lacks a fingerprint part",
        ),
        KeyError::BadVersion(_) => (
            StatusCode::BAD_REQUEST,
            "version-invalid",
            "Request version unusable",
        ),
        KeyError::Coding(CodingError::Unsupported(_) | CodingError::TooMany { .. }) => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content-encoding-unsupported",
            "Request body content coding not supported",
        ),
        KeyError::Coding(CodingError::TooLarge { .. }) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
        ),
        KeyError::Grpc(FrameError::Several(_)) => (
            StatusCode::BAD_REQUEST,
            "grpc-streaming-refused",
            "A deduped gRPC method takes exactly one request message",
        ),
        KeyError::Grpc(_) => (
            StatusCode::BAD_REQUEST,
            "grpc-framing-invalid",
            "Request is not one well-framed gRPC message",
        ),
        KeyError::Coding(CodingError::Corrupt { .. }) => (
            StatusCode::BAD_REQUEST,
            "content-encoding-invalid",
            "Request body not valid in its content coding",
        ),
    }
}

/// Status, problem type suffix and title of a failed upstream call.
fn upstream_problem(f: &UpstreamFailure) -> (StatusCode, &'static str, &'static str) {
    match f {
        UpstreamFailure::Connect(_) => (
            StatusCode::BAD_GATEWAY,
            "upstream-unreachable",
            "Upstream unreachable",
        ),
        UpstreamFailure::Timeout(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            "upstream-timeout",
            "Upstream timed out",
        ),
        UpstreamFailure::Broken(_) => (
            StatusCode::BAD_GATEWAY,
            "upstream-broken",
            "Upstream response broken",
        ),
    }
}

impl GatewayError {
    /// Status, problem type suffix and title: the stable part of the contract.
    fn describe(&self) -> (StatusCode, &'static str, &'static str) {
        use GatewayError::*;
        match self {
            AmbiguousFraming => (
                StatusCode::BAD_REQUEST,
                "ambiguous-framing",
                "Request has both Content-Length and Transfer-Encoding",
            ),
            Path(_) => (
                StatusCode::BAD_REQUEST,
                "path-invalid",
                "Request path cannot be normalised safely",
            ),
            MethodNotSupported => (
                StatusCode::NOT_IMPLEMENTED,
                "method-not-supported",
                "Method not supported by the gateway",
            ),
            MethodCase => (
                StatusCode::BAD_REQUEST,
                "method-case",
                "Method must be in upper case",
            ),
            HostInvalid(_) => (
                StatusCode::BAD_REQUEST,
                "host-invalid",
                "Host header missing, repeated or malformed",
            ),
            BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
            ),
            BodyUnreadable => (
                StatusCode::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
            ),
            BodyTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body timed out",
            ),
            Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Admin token missing or wrong",
            ),
            NotFound => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            UnknownRoute => (
                StatusCode::NOT_FOUND,
                "unknown-route",
                "No route of that name",
            ),
            RecordNotFound => (
                StatusCode::NOT_FOUND,
                "record-not-found",
                "No record under that key",
            ),
            BadAdminRequest(_) => (
                StatusCode::BAD_REQUEST,
                "bad-admin-request",
                "Bad admin request",
            ),
            Key(e) => key_problem(e),
            SignatureInvalid => (
                StatusCode::UNAUTHORIZED,
                "signature-invalid",
                "Webhook signature missing, invalid or expired",
            ),
            Mismatch => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency key reused with a different request",
            ),
            Conflict { .. } => (
                StatusCode::CONFLICT,
                "request-in-flight",
                "A request with this idempotency key is still in flight",
            ),
            OutcomeUnknown => (
                StatusCode::CONFLICT,
                "outcome-unknown",
                "The outcome of a request with this idempotency key is unknown",
            ),
            Stale => (
                StatusCode::OK,
                "stale-version",
                "A newer version of this entity was already written",
            ),
            StaleFence => (
                StatusCode::CONFLICT,
                "stale-fence",
                "The claim is no longer in flight under this fence",
            ),
            ClaimLive { .. } => (
                StatusCode::CONFLICT,
                "claim-live",
                "The claim's lease is live: its owner may still be executing it",
            ),
            StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Dedupe store unavailable",
            ),
            Overloaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "Gateway overloaded by requests whose clients left",
            ),
            Upstream(f) => upstream_problem(f),
            ReplayUnavailable { status, .. } => (
                *status,
                "response-not-stored",
                "Request already executed; its response was not stored",
            ),
            CorruptRecord => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "record-unusable",
                "Stored response unusable",
            ),
            RecordUnreadable => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "record-unreadable",
                "The key's stored record cannot be read by this gateway",
            ),
            Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal gateway error",
            ),
        }
    }

    /// Client-safe detail: only for errors the client caused and can fix.
    fn detail(&self) -> Option<String> {
        match self {
            GatewayError::Key(e) => Some(e.to_string()),
            GatewayError::Path(e) => Some(e.to_string()),
            GatewayError::BadAdminRequest(e) => Some(e.clone()),
            GatewayError::HostInvalid(e) => Some((*e).to_owned()),
            GatewayError::MethodCase => Some(
                "methods are case-sensitive: a route dedupes this method in upper case; send it so"
                    .to_owned(),
            ),
            GatewayError::MethodNotSupported => {
                Some("the gateway is a reverse proxy: it opens no tunnels".to_owned())
            }
            GatewayError::ClaimLive { fence, lease_left } => Some(format!(
                "fence {fence} holds a live lease for {} ms more: its request may still be \
                 executing; wait for the lease to end, or add \"force\": true to act anyway",
                lease_left.as_millis()
            )),
            GatewayError::OutcomeUnknown => Some(
                "an earlier request with this key may or may not have taken effect; it will not be \
                 executed again automatically: an operator must resolve the key"
                    .to_owned(),
            ),
            GatewayError::Stale => Some(
                "this request was not forwarded: its version is not greater than the highest \
                 version already written for its entity; do not retry it"
                    .to_owned(),
            ),
            GatewayError::StaleFence => Some(
                "the key was resolved, settled or taken over since: read it again with GET".to_owned(),
            ),
            GatewayError::BodyTooLarge { limit } => {
                Some(format!("this route buffers at most {limit} bytes"))
            }
            GatewayError::ReplayUnavailable { body, .. } => Some(
                match body {
                    StoredBody::TooLarge => "the original response body was larger than this route stores; the request was executed once and will not be executed again",
                    StoredBody::NotStored => "this route does not store responses; the request was executed once and will not be executed again",
                    _ => "the upstream's original response broke off; the request was executed once and will not be executed again",
                }
                .to_owned(),
            ),
            _ => None,
        }
    }

    /// The problem's short stable name (`request-in-flight`).
    pub fn name(&self) -> &'static str {
        self.describe().1
    }

    /// The problem `type` URI, as a route without `problem_base_url` carries it.
    pub fn problem_type(&self) -> String {
        Dialect::default().problem_type(self.name())
    }

    /// The client-safe detail, as the response carries it.
    pub fn client_detail(&self) -> Option<String> {
        self.detail()
    }

    /// The status this error answers with in problem+json.
    pub fn status(&self) -> StatusCode {
        self.describe().0
    }

    /// The status this error answers with in `dialect` (only Stripe's changes some).
    pub fn status_in(&self, dialect: &Dialect) -> StatusCode {
        match dialect.envelope {
            Envelope::Stripe => self.stripe_reading().status,
            Envelope::Problem | Envelope::Template(_) => self.status(),
            Envelope::Grpc => StatusCode::OK,
        }
    }

    /// The problem+json response with the gateway's URN types: the admin port's answers,
    /// which the gateway's own tools read.
    pub fn to_response(&self) -> Response<Body> {
        self.to_response_in(&Dialect::default())
    }

    /// The response in a route's dialect. Every dialect carries the same headers
    /// (`Retry-After`, `WWW-Authenticate`, `Dedupe-Stale`, `Idempotent-Replayed`).
    pub fn to_response_in(&self, dialect: &Dialect) -> Response<Body> {
        let (status, content_type, body) = self.body_in(dialect);
        let mut resp = Response::new(full(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(CONTENT_TYPE, content_type);
        self.add_headers(resp.headers_mut(), dialect);
        resp
    }
}

#[cfg(test)]
mod tests;
