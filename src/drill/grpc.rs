//! What the drill does differently on a `grpc = true` route: its requests are framed
//! gRPC calls (`content-type: application/grpc`, `te: trailers`, one length-prefixed
//! message), its counting upstream answers in gRPC (a framed message, then `grpc-status:
//! 0` in the trailers), and an answer's verdict is its `grpc-status`. The framing and the
//! codes are [`crate::grpc`]'s; the gateway's code for each refusal is
//! [`GatewayError::grpc_code`].

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, TE};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::grpc::{frame, status, GRPC_MESSAGE, GRPC_STATUS};
use crate::problem::GatewayError;

/// The body the upstream answers with, with or without trailers.
pub type AnswerBody = BoxBody<Bytes, Infallible>;

/// Makes `headers` a gRPC call's: `content-type: application/grpc` and `te: trailers`.
pub fn mark_call(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
}

/// The message a gRPC call's body frames (`None`: not exactly one message).
pub fn message(body: &[u8]) -> Option<&[u8]> {
    frame::single(body).ok().map(|m| m.payload)
}

/// The counting upstream's gRPC answer: 200, `content-type: application/grpc`, `payload`
/// as one message, trailers `grpc-status: 0`.
pub fn answer(payload: &[u8]) -> Response<AnswerBody> {
    let mut trailers = HeaderMap::new();
    trailers.insert(GRPC_STATUS, HeaderValue::from(status::code::OK));
    let body = Full::new(frame::encode(payload))
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed();
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    resp
}

/// The `grpc-status` of an answer: in the head of a trailers-only answer, else in its
/// trailers.
pub fn status_of(headers: &HeaderMap, trailers: &HeaderMap) -> Option<u16> {
    status::of(headers).or_else(|| status::of(trailers))
}

/// The problem's name in a gateway's gRPC refusal: its `grpc-message` reads
/// `Title (problem-name): detail`, percent-encoded (the name is plain ASCII).
pub fn problem_name(headers: &HeaderMap) -> Option<String> {
    let message = headers.get(GRPC_MESSAGE)?.to_str().ok()?;
    let (_, rest) = message.split_once(" (")?;
    let (name, _) = rest.split_once(')')?;
    Some(name.to_owned())
}

/// Whether an answer with `code` is the gateway's refusal `err` (as far as a code says).
pub fn is_refusal(code: Option<u16>, err: &GatewayError) -> bool {
    code == Some(err.grpc_code())
}

/// Whether an answer with `code` failed as a 5xx does: no status, or the gateway's or
/// upstream's failure (`UNKNOWN`, `DEADLINE_EXCEEDED`, `INTERNAL`, `UNAVAILABLE`).
pub fn failed(code: Option<u16>) -> bool {
    use status::code::*;
    match code {
        None => true,
        Some(c) => [2, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE].contains(&c),
    }
}

/// A code as the report shows it: `10 ABORTED`.
pub fn shown(code: Option<u16>) -> String {
    match code {
        Some(c) => format!("grpc-status {c} {}", status::name(c).unwrap_or("?")),
        None => "no grpc-status".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_read_by_its_code_and_its_name() {
        let err = GatewayError::Mismatch;
        let mut h = HeaderMap::new();
        let dialect = crate::route::Dialect {
            envelope: crate::route::Envelope::Grpc,
            ..Default::default()
        };
        let head = err.to_response_in(&dialect).headers().clone();
        assert!(is_refusal(status_of(&head, &h), &err));
        assert_eq!(problem_name(&head).as_deref(), Some(err.name()));
        h.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        assert_eq!(status_of(&HeaderMap::new(), &h), Some(0));
        assert_eq!(shown(Some(10)), "grpc-status 10 ABORTED");
    }

    #[test]
    fn a_call_is_one_framed_message() {
        let mut h = HeaderMap::new();
        mark_call(&mut h);
        assert!(crate::grpc::is_grpc_content(&h));
        let framed = frame::encode(b"{}");
        assert_eq!(message(&framed), Some(&b"{}"[..]));
        assert_eq!(message(b"{}"), None);
    }
}
