//! What the drill does differently on a `grpc = true` route: its requests are framed
//! gRPC calls (`content-type: application/grpc`, `te: trailers`, one length-prefixed
//! message), its counting upstream answers in gRPC (a framed message, then `grpc-status:
//! 0` in the trailers), and an answer's verdict is its `grpc-status`. The framing and the
//! codes are [`crate::protocol::grpc`]'s; the gateway's code for each refusal is
//! [`GatewayError::grpc_code`].

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, TE};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::edge::problem::GatewayError;
use crate::protocol::grpc::{frame, status, GRPC_MESSAGE, GRPC_STATUS};
use crate::protocol::route::Route;

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

/// A drill request's JSON as `route`'s body: as is, or on a gRPC route framed as one
/// message.
pub fn body_of(route: &Route, json: Vec<u8>) -> Bytes {
    if route.grpc {
        frame::encode(&json)
    } else {
        Bytes::from(json)
    }
}

/// The JSON in a drill request's body on `route` (the inverse of [`body_of`]).
pub fn json_of<'a>(route: &Route, body: &'a [u8]) -> &'a [u8] {
    if route.grpc {
        message(body).unwrap_or_default()
    } else {
        body
    }
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
        let dialect = crate::protocol::route::Dialect {
            envelope: crate::protocol::route::Envelope::Grpc,
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
    fn a_grpc_route_gets_a_framed_call_keyed_in_its_metadata_and_a_changed_message() {
        use crate::ops::drill::request::{for_route, misuse, Marks};
        let routes = crate::config::Config::from_toml(
            "[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://127.0.0.1:2\"\n\
             [[routes]]\nname = \"pay\"\nmethods = [\"POST\"]\n\
             path = \"/pay.v1.Payments/Create\"\ngrpc = true\n\
             key = { header = \"idempotency-key\", required = true }\nscope = []\n",
        )
        .unwrap()
        .routes;
        let none = HeaderMap::new();
        let marks = Marks {
            key: "drill-run1-replay",
            tenant: "drill-run1",
            headers: &none,
        };
        let req = for_route(&routes, 0, &marks).unwrap();
        assert_eq!(req.headers[CONTENT_TYPE], "application/grpc");
        assert_eq!(req.headers[TE], "trailers");
        assert_eq!(req.headers["idempotency-key"], "drill-run1-replay");
        assert_eq!(req.key, "drill-run1-replay");
        let json: serde_json::Value = serde_json::from_slice(message(&req.body).unwrap()).unwrap();
        assert_eq!(json["drill"], "drill-run1-replay");
        // The same key with another message: a mismatch the gateway must refuse.
        let other = misuse(&routes[0], &req).unwrap();
        assert_eq!(other.key, req.key);
        assert_ne!(other.hash, req.hash);
        assert!(message(&other.body).is_some());
    }

    #[test]
    fn a_call_is_one_framed_message() {
        let mut h = HeaderMap::new();
        mark_call(&mut h);
        assert!(crate::protocol::grpc::is_grpc_content(&h));
        let framed = frame::encode(b"{}");
        assert_eq!(message(&framed), Some(&b"{}"[..]));
        assert_eq!(message(b"{}"), None);
    }
}
