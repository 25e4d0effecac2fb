//! Answering a duplicate from its stored record, and the `Idempotency-Expires` header that
//! won and replayed answers carry.

use std::time::SystemTime;

use http::header::HeaderValue;
use http::{HeaderMap, Response};
use tracing::error;

use crate::headers::{IDEMPOTENCY_EXPIRES, REPLAYED};
use crate::problem::GatewayError;
use crate::record::{StoredBody, StoredResponse};
use crate::route::Dialect;
use crate::store::StoreKey;
use crate::{full_with_trailers, Body};

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
            let mut resp = Response::new(full_with_trailers(body, stored.trailers));
            *resp.status_mut() = stored.status;
            *resp.headers_mut() = stored.headers;
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
    if let Some(at) = expires {
        // An HTTP-date is plain ASCII.
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
            headers.insert(IDEMPOTENCY_EXPIRES.clone(), v);
        }
    }
}
