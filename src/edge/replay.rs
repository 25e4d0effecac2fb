//! Answering a duplicate from its stored record, and the `Idempotency-Expires` header that
//! won and replayed answers carry.

use std::time::SystemTime;

use bytes::Bytes;
use http::header::{HeaderValue, TRAILER};
use http::{HeaderMap, Response};
use http_body_util::BodyExt;
use hyper::body::Frame;
use tracing::error;

use crate::edge::problem::GatewayError;
use crate::protocol::headers::{IDEMPOTENCY_EXPIRES, REPLAYED};
use crate::protocol::record::{StoredBody, StoredResponse};
use crate::protocol::route::Dialect;
use crate::store::StoreKey;
use crate::{full, Body};

/// The stored response, byte for byte and with its trailers, marked `Idempotent-Replayed: true`, after checking
/// it was stored under this very key. A record without a body answers the original status
/// with a `response-not-stored` problem. With `advertise_expiry`, both carry
/// `Idempotency-Expires`. The problem is in the route's dialect, `errors`.
pub(super) fn respond(
    record: &bytes::Bytes,
    store_key: &StoreKey,
    advertise_expiry: bool,
    errors: &Dialect,
) -> Result<Response<Body>, GatewayError> {
    let stored = StoredResponse::decode(record, store_key).map_err(|e| {
        error!(error = %e, store_key = %store_key, "stored record unusable; refusing to replay it");
        GatewayError::CorruptRecord
    })?;
    let mut resp = match stored.body {
        StoredBody::Stored(body) => {
            let mut headers = stored.headers;
            let body = full_with_trailers(&mut headers, body, stored.trailers);
            let mut resp = Response::new(body);
            *resp.status_mut() = stored.status;
            *resp.headers_mut() = headers;
            resp.headers_mut()
                .insert(REPLAYED.clone(), HeaderValue::from_static("true"));
            resp
        }
        body => GatewayError::ReplayUnavailable {
            status: stored.status,
            body,
        }
        .to_response_in(errors),
    };
    if advertise_expiry {
        advertise(resp.headers_mut(), stored.expires);
    }
    Ok(resp)
}

/// Sets `Idempotency-Expires` to `expires` as an HTTP-date, when it is known.
pub(super) fn advertise(headers: &mut HeaderMap, expires: Option<SystemTime>) {
    if let Some(v) = expires.and_then(http_date) {
        headers.insert(IDEMPOTENCY_EXPIRES.clone(), v);
    }
}

/// `at` as an HTTP-date header value. The last one made on this thread is kept: answers
/// in the same second share it, and formatting a date cost more than the rest of the
/// header (measured in callgrind).
fn http_date(at: SystemTime) -> Option<HeaderValue> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    // `httpdate` panics outside 1970 to 9999: such a time is not advertised.
    const YEAR_10000: u64 = 253_402_300_800;
    let second = at.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    if second >= YEAR_10000 {
        return None;
    }
    // An HTTP-date is plain ASCII.
    let format = || HeaderValue::from_str(&httpdate::fmt_http_date(at)).ok();
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((s, v)) = &*last {
            if *s == second {
                return Some(v.clone());
            }
        }
        let v = format()?;
        *last = Some((second, v.clone()));
        Some(v)
    })
}

/// A whole body followed by a trailer section (a gRPC answer's messages and its
/// `grpc-status`), or just the body when there is none. With trailers its length is left
/// unstated, so HTTP/1.1 sends it chunked, the one framing that carries trailers, and the
/// head names them in `Trailer` unless it does already (hyper sends only the named ones;
/// an HTTP/2 upstream need not name them).
pub(super) fn full_with_trailers(head: &mut HeaderMap, body: Bytes, trailers: HeaderMap) -> Body {
    if trailers.is_empty() {
        return full(body);
    }
    // A body with trailers is framed by its writer (chunked, or HTTP/2's frames), whose
    // length it never declares: the upstream's, where it came with one, goes, so the
    // first answer and its replays (whose records keep no length) carry the same head.
    head.remove(http::header::CONTENT_LENGTH);
    if !head.contains_key(TRAILER) {
        let names: Vec<&str> = trailers.keys().map(|n| n.as_str()).collect();
        if let Ok(v) = HeaderValue::from_str(&names.join(", ")) {
            head.insert(TRAILER, v);
        }
    }
    WithTrailers {
        data: Some(body),
        trailers: Some(trailers),
    }
    .boxed()
}

/// The frames of [`full_with_trailers`].
struct WithTrailers {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl hyper::body::Body for WithTrailers {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, crate::BoxError>>> {
        let frame = match self.data.take() {
            Some(data) if !data.is_empty() => Some(Frame::data(data)),
            _ => self.trailers.take().map(Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::http_date;

    #[test]
    fn a_kept_date_is_the_date_of_its_own_second() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        for (secs, millis) in [(0, 0), (0, 999), (1, 0), (0, 500), (86_400, 1), (1, 999)] {
            let at = base + Duration::from_secs(secs) + Duration::from_millis(millis);
            assert_eq!(
                http_date(at).unwrap().to_str().unwrap(),
                httpdate::fmt_http_date(at),
                "{secs} s {millis} ms after the base"
            );
        }
        let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
        assert_eq!(
            http_date(last).unwrap().to_str().unwrap(),
            "Fri, 31 Dec 9999 23:59:59 GMT"
        );
        // Where `httpdate` would panic, no header.
        assert!(http_date(last + Duration::from_secs(1)).is_none());
        assert!(http_date(SystemTime::UNIX_EPOCH - Duration::from_secs(1)).is_none());
    }
}
