//! gRPC over HTTP/2, as far as the gateway needs it (pure): which requests are gRPC
//! calls, the length-prefixed message framing ([`frame`]), status codes, their names,
//! what each means for a claim and `grpc-message`'s percent-encoding ([`status`]), and
//! `grpc-timeout`'s encoding ([`timeout`]).

use http::header::{HeaderMap, CONTENT_TYPE};
use http::Version;

pub mod frame;
pub mod status;
pub mod timeout;

/// `grpc-status`: the call's status code, in the trailers (or a trailers-only head).
pub const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
/// `grpc-message`: the status message, percent-encoded.
pub const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");
/// `grpc-encoding`: the compression of the messages whose flag says compressed.
pub const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");

/// Whether `headers` carry a gRPC content type (`application/grpc`, `application/grpc+proto`,
/// `application/grpc;...`), not gRPC-Web's `application/grpc-web*`.
pub fn is_grpc_content(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            let ct = ct.trim().to_ascii_lowercase();
            match ct.strip_prefix("application/grpc") {
                Some(rest) => rest.is_empty() || rest.starts_with('+') || rest.starts_with(';'),
                None => false,
            }
        })
}

/// Whether a request is a gRPC call: HTTP/2 with a gRPC content type (gRPC has no
/// HTTP/1.1 form).
pub fn is_call(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_2 && is_grpc_content(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ct(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn grpc_content_types_are_told_from_others() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC;charset=x",
        ] {
            assert!(is_grpc_content(&ct(yes)), "{yes}");
            assert!(is_call(Version::HTTP_2, &ct(yes)));
            assert!(!is_call(Version::HTTP_11, &ct(yes)));
        }
        for no in [
            "application/grpc-web",
            "application/json",
            "application/grpcx",
        ] {
            assert!(!is_grpc_content(&ct(no)), "{no}");
        }
        assert!(!is_grpc_content(&HeaderMap::new()));
    }
}
