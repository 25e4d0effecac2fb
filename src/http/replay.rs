//! Answering a duplicate from its stored record.

use http::header::HeaderValue;
use http::Response;
use tracing::error;

use crate::headers::REPLAYED;
use crate::problem::GatewayError;
use crate::record::{StoredBody, StoredResponse};
use crate::store::StoreKey;
use crate::{full, Body};

/// The stored response, byte for byte, marked `Idempotent-Replayed: true`, after checking
/// it was stored under this very key.
pub(super) fn respond(
    record: &bytes::Bytes,
    store_key: &StoreKey,
) -> Result<Response<Body>, GatewayError> {
    let stored = StoredResponse::decode(record, store_key).map_err(|e| {
        error!(error = %e, store_key = %store_key, "stored record unusable; refusing to replay it");
        GatewayError::CorruptRecord
    })?;
    match stored.body {
        StoredBody::Stored(body) => {
            let mut resp = Response::new(full(body));
            *resp.status_mut() = stored.status;
            *resp.headers_mut() = stored.headers;
            resp.headers_mut()
                .insert(REPLAYED.clone(), HeaderValue::from_static("true"));
            Ok(resp)
        }
        body => Err(GatewayError::ReplayUnavailable {
            status: stored.status,
            body,
        }),
    }
}
