//! The admin listener: Prometheus metrics, health, readiness, and key inspection for a
//! human resolving an unknown outcome. Never served on the public port.
//!
//! `/healthz` and `/readyz` need no token (probes cannot carry secrets); `/metrics` and
//! `/keys/...` need `Authorization: Bearer <token>` when `[admin] token` is set.
//!
//! `GET /keys?state=held|in-flight` lists the records in that state (see [`list`]);
//! `POST /keys/{route}/{key}/resolve` settles a claim by hand (an unknown outcome held for
//! a person): released for a retry, or completed with a given response, under the fence
//! `GET` showed; the store refuses a stale fence and a second resolution atomically.
//! Neither it nor `DELETE` acts on a claim whose lease is live (409 `claim-live`) unless
//! the operator adds `"force": true` (`?force=true` on `DELETE`); `DELETE ...?fence=N`
//! deletes only the record under that fence.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderName;
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::edge::problem::GatewayError;
use crate::edge::Gateway;
use crate::protocol::key::{self, RequestPart, RequestView};
use crate::protocol::record::{StoredBody, StoredResponse};
use crate::protocol::route::Route;
use crate::store::{Fence, RecordState, Resolution, StoreKey};
use crate::telemetry::metrics::Exposition;
use crate::{full, Body};

mod list;
mod live;
mod resolve;

use self::resolve::{read_body, resolve};

/// Handles one admin request.
pub async fn handle(gateway: Arc<Gateway>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    route(&gateway, &parts.method, &parts.uri, &parts.headers, body)
        .await
        .unwrap_or_else(|e| e.to_response())
}

async fn route(
    gateway: &Gateway,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<Response<Body>, GatewayError> {
    let path = uri.path();
    // HEAD answers as GET does (hyper leaves the body out): probes use either.
    let read = method == Method::GET || method == Method::HEAD;
    match path {
        "/healthz" if read => return Ok(text(StatusCode::OK, "ok\n")),
        "/readyz" if read => {
            return match gateway.store().ping().await {
                Ok(()) => Ok(text(StatusCode::OK, "ready\n")),
                Err(e) => {
                    warn!(error = %e, "readiness: store does not answer");
                    Err(GatewayError::StoreUnavailable)
                }
            };
        }
        _ => {}
    }
    authorize(gateway, headers)?;
    match (method, path) {
        (_, "/metrics") if read => {
            // A ping per scrape, as /readyz makes: an idle gateway's lost store shows
            // before the first request fails (`dedupe_store_up`).
            let up = gateway.store().ping().await.is_ok();
            gateway.metrics().store_up(up);
            if let Some(stats) = gateway.store().near_cache_stats() {
                gateway.metrics().near_cache(stats);
            }
            let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
            let format = Exposition::negotiate(accept);
            let mut resp = Response::new(full(gateway.metrics().exposition(format)));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            Ok(resp)
        }
        (&Method::POST, p) if p.starts_with("/keys/") && p.ends_with("/resolve") => {
            let p = &p[..p.len() - "/resolve".len()];
            let body = read_body(gateway, body).await?;
            resolve(gateway, p, uri.query(), &body).await
        }
        (_, "/keys") if read => list::list(gateway, uri.query()).await,
        (&Method::GET | &Method::DELETE, p) if p.starts_with("/keys/") => {
            keys(gateway, method, p, uri.query()).await
        }
        _ => Err(GatewayError::NotFound),
    }
}

fn authorize(gateway: &Gateway, headers: &HeaderMap) -> Result<(), GatewayError> {
    let live = gateway.live();
    let Some(token) = live.config.admin.as_ref().and_then(|a| a.token.as_deref()) else {
        return Ok(());
    };
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err(GatewayError::Unauthorized)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Serialize)]
struct KeyView<'a> {
    route: &'a str,
    key: &'a str,
    scope: &'a str,
    store_key: &'a str,
    state: &'static str,
    fence: u64,
    held: bool,
    /// Claims that won the key: 1, plus one per takeover and per retry after a release.
    attempts: u32,
    /// RFC 3339, store clock.
    claimed_at: Option<String>,
    completed_at: Option<String>,
    /// On an ordered route: the version the current claim carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    lease_left_ms: Option<u128>,
    expires_in_ms: Option<u128>,
    status: Option<u16>,
    body_stored: Option<bool>,
    size: Option<usize>,
}

/// The record a `/keys/{route}/{key}` path names.
struct Located {
    route: Route,
    key: String,
    scope: String,
    store_key: StoreKey,
}

fn locate(gateway: &Gateway, path: &str, query: Option<&str>) -> Result<Located, GatewayError> {
    let rest = &path["/keys/".len()..];
    let (route_name, raw_key) = rest.split_once('/').ok_or(GatewayError::NotFound)?;
    let key = percent_encoding::percent_decode_str(raw_key)
        .decode_utf8()
        .map_err(|_| GatewayError::BadAdminRequest("the key is not valid UTF-8".into()))?;
    // A client's key, or a fingerprint's 64 hex digits.
    let longest = key::MAX_KEY_LEN.max(64);
    if key.is_empty() || key.len() > longest {
        return Err(GatewayError::BadAdminRequest(format!(
            "the key must be 1 to {longest} characters"
        )));
    }
    let live = gateway.live();
    let route = live
        .config
        .routes
        .iter()
        .find(|r| &*r.name == route_name)
        .ok_or(GatewayError::UnknownRoute)?;
    let scope = scope_from_query(&route.scope, query)?;
    let entity = match (&route.order, live.config.store.tags_by_entity()) {
        (Some(_), true) => Some(entity_from_query(query)?),
        _ => None,
    };
    let store_key =
        live.config
            .store
            .namespace()
            .record_key(&route.name, &scope, &key, entity.as_deref());
    Ok(Located {
        route: route.clone(),
        key: key.into_owned(),
        scope,
        store_key,
    })
}

fn store_failed(e: crate::store::StoreError) -> GatewayError {
    warn!(error = %e, "admin: store operation failed");
    GatewayError::StoreUnavailable
}

async fn keys(
    gateway: &Gateway,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let located = locate(gateway, path, query)?;
    if method == Method::DELETE {
        return delete(gateway, &located, query).await;
    }
    inspect(gateway, &located).await
}

/// `DELETE /keys/{route}/{key}`: forgets the record, unless its claim is live (without
/// `force`) or it is no longer under the `fence` the caller names.
async fn delete(
    gateway: &Gateway,
    located: &Located,
    query: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let Located {
        route,
        key,
        scope,
        store_key,
    } = located;
    let route_name = &*route.name;
    let fence = live::fence_param(query)?;
    let act = live::Act {
        what: "delete",
        force: live::forced(query)?,
        fence,
        route: route_name,
        key,
    };
    let info = live::guard(gateway, store_key, act)
        .await?
        .ok_or(GatewayError::RecordNotFound)?;
    // `fence=N`: only the record the caller saw (the drill deletes only its own).
    if fence.is_some_and(|f| f != info.fence.get()) {
        return Err(GatewayError::StaleFence);
    }
    let existed = gateway
        .store()
        .forget(store_key)
        .await
        .map_err(store_failed)?;
    if !existed {
        return Err(GatewayError::RecordNotFound);
    }
    info!(route = route_name, key = %key, scope, "admin: record forgotten; the next request with this key executes again");
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

/// `GET /keys/{route}/{key}`: the record as JSON.
async fn inspect(gateway: &Gateway, located: &Located) -> Result<Response<Body>, GatewayError> {
    let Located {
        route,
        key,
        scope,
        store_key,
    } = located;
    let info = gateway
        .store()
        .inspect(store_key)
        .await
        .map_err(store_failed)?
        .ok_or(GatewayError::RecordNotFound)?;
    let stored = info
        .response
        .as_ref()
        .and_then(|r| gateway.keyring().open(store_key, r.clone()).ok())
        .and_then(|r| StoredResponse::decode(&r, store_key).ok());
    let view = KeyView {
        route: &route.name,
        key,
        scope,
        store_key: store_key.as_str(),
        state: info.state.as_str(),
        fence: info.fence.get(),
        held: info.held,
        attempts: info.attempts,
        claimed_at: info.claimed_at.map(rfc3339),
        completed_at: info.completed_at.map(rfc3339),
        version: route
            .order
            .as_ref()
            .zip(info.version.as_ref())
            .map(|(o, v)| key::order::show(o.compare, v)),
        lease_left_ms: info.lease_left.map(|d| d.as_millis()),
        expires_in_ms: info.expires_in.map(|d| d.as_millis()),
        status: stored.as_ref().map(|s| s.status.as_u16()),
        body_stored: (info.state == RecordState::Completed).then(|| {
            matches!(
                stored.as_ref().map(|s| &s.body),
                Some(StoredBody::Stored(_))
            )
        }),
        size: info.response.as_ref().map(Bytes::len),
    };
    // A struct of strings and numbers always serialises.
    let body = serde_json::to_vec_pretty(&view).unwrap_or_default();
    let mut resp = Response::new(full(body));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An operator's resolution, as posted.
/// On a cluster, an ordered route's record lives beside its entity: `entity=<value>` (the
/// entity's value as the request carried it: `cus_123`, or `42` for a JSON number).
/// Or `entity_hash=<32 hex digits>`, the hash itself (as `check --request` and `keys`
/// derive it).
fn entity_from_query(query: Option<&str>) -> Result<String, GatewayError> {
    let pairs = || form_urlencoded::parse(query.unwrap_or("").as_bytes());
    if let Some((_, h)) = pairs().find(|(k, _)| k == "entity_hash") {
        let valid = h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit());
        return valid.then(|| h.to_ascii_lowercase()).ok_or_else(|| {
            GatewayError::BadAdminRequest("entity_hash must be 32 hex digits".into())
        });
    }
    pairs()
        .find(|(k, _)| k == "entity")
        .map(|(_, v)| key::order::entity_hash(v.as_bytes()))
        .ok_or_else(|| {
            GatewayError::BadAdminRequest(
                "on a redis-cluster, an ordered route's record lives beside its entity: \
                 add entity=<the entity's value>"
                    .into(),
            )
        })
}

/// The scope comes either as `scope=<hash>` (as printed in the access log) or as the
/// route's scope inputs, one query parameter per `header:NAME` part; a part left out is
/// taken as absent from the request (`?header:X-Tenant=` is present and empty).
fn scope_from_query(parts: &[RequestPart], query: Option<&str>) -> Result<String, GatewayError> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    if let Some((_, scope)) = pairs.iter().find(|(k, _)| k == "scope") {
        let valid =
            scope == "-" || (scope.len() == 32 && scope.bytes().all(|b| b.is_ascii_hexdigit()));
        if !valid {
            return Err(GatewayError::BadAdminRequest(
                "scope must be the 32-hex-digit hash from the access log, or -".into(),
            ));
        }
        return Ok(scope.to_ascii_lowercase());
    }
    let mut headers = HeaderMap::new();
    for part in parts {
        let RequestPart::Header(name) = part else {
            return Err(GatewayError::BadAdminRequest(format!(
                "this route's scope includes {part}: pass ?scope=<hash from the access log>"
            )));
        };
        let wanted = format!("header:{name}");
        for (_, v) in pairs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(&wanted))
        {
            let v = HeaderValue::from_str(v).map_err(|_| {
                GatewayError::BadAdminRequest(format!("{wanted} is not a header value"))
            })?;
            headers.append(name.clone(), v);
        }
        // A part without a parameter is absent, as it was on a request that lacked the
        // header: absent and empty hash differently, so such records can be found too.
    }
    let view = RequestView {
        method: &Method::GET,
        path: "/",
        query: None,
        headers: &headers,
        body: &[],
    };
    key::scope_hash(parts, &view).map_err(|e| GatewayError::BadAdminRequest(e.to_string()))
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_from_header_params_matches_the_request_path() {
        let parts = vec![RequestPart::parse("header:Authorization").unwrap()];
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer a"));
        let view = RequestView {
            method: &Method::POST,
            path: "/v1/payments/1",
            query: None,
            headers: &h,
            body: b"{}",
        };
        let expected = key::scope_hash(&parts, &view).unwrap();
        let got = scope_from_query(&parts, Some("header:Authorization=Bearer%20a")).unwrap();
        assert_eq!(got, expected);
        assert_eq!(
            scope_from_query(&parts, Some(&format!("scope={expected}"))).unwrap(),
            expected
        );
        // Left out is absent, which is another scope than empty.
        let empty =
            HeaderMap::from_iter([(http::header::AUTHORIZATION, HeaderValue::from_static(""))]);
        let absent_view = RequestView {
            headers: &HeaderMap::new(),
            ..view
        };
        let empty_view = RequestView {
            headers: &empty,
            ..view
        };
        let absent = scope_from_query(&parts, None).unwrap();
        assert_eq!(absent, key::scope_hash(&parts, &absent_view).unwrap());
        let empty_scope = scope_from_query(&parts, Some("header:Authorization=")).unwrap();
        assert_eq!(empty_scope, key::scope_hash(&parts, &empty_view).unwrap());
        assert_ne!(absent, empty_scope);
        assert!(scope_from_query(&parts, Some("scope=xyz")).is_err());
        assert_eq!(scope_from_query(&[], None).unwrap(), "-");
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
