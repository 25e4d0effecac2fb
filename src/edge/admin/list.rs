//! `GET /keys?state=held|in-flight[&route=R][&limit=N][&cursor=C]`: the records in a state,
//! so an operator finds what waits for them without reading a log. Bounded (see
//! [`crate::store::listing`]): a page says whether it stopped early, and the cursor to go on
//! from.

use super::*;
use crate::store::listing::{Cursor, ListRequest, Listing, Wanted, DEFAULT_LIMIT, MAX_LIMIT};

#[derive(Serialize)]
struct ListView<'a> {
    state: &'static str,
    route: Option<&'a str>,
    keys: Vec<ListedView>,
    /// Keys the store looked at for this page.
    scanned: usize,
    /// Stopped at the limit or the scan bound: more may follow from `cursor`.
    truncated: bool,
    cursor: Option<String>,
}

#[derive(Serialize)]
struct ListedView {
    route: Option<String>,
    key: Option<String>,
    scope: Option<String>,
    store_key: String,
    state: &'static str,
    fence: u64,
    attempts: u32,
    claimed_at: Option<String>,
    lease_left_ms: Option<u128>,
}

/// The listing a query asks for (pure): `state` is required, `limit` 1 to [`MAX_LIMIT`].
fn request(gateway: &Gateway, query: Option<&str>) -> Result<ListRequest, GatewayError> {
    let bad = |m: String| GatewayError::BadAdminRequest(m);
    let mut wanted = None;
    let (mut route, mut limit, mut cursor) = (None, DEFAULT_LIMIT, None);
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "state" => {
                wanted =
                    Some(Wanted::parse(&v).ok_or_else(|| {
                        bad(format!("state must be held or in-flight, not {v:?}"))
                    })?)
            }
            "route" => route = Some(v.into_owned()),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| bad(format!("limit must be 1 to {MAX_LIMIT}")))?
            }
            "cursor" => {
                cursor = Some(
                    Cursor::parse(&v)
                        .ok_or_else(|| bad("cursor must be one a previous page returned".into()))?,
                )
            }
            other => return Err(bad(format!("unknown parameter {other:?}"))),
        }
    }
    let wanted = wanted.ok_or_else(|| bad("state=held or state=in-flight is required".into()))?;
    let live = gateway.live();
    if let Some(r) = &route {
        if !live.config.routes.iter().any(|c| &*c.name == r) {
            return Err(GatewayError::UnknownRoute);
        }
    }
    Ok(ListRequest {
        wanted,
        prefix: live.config.store.prefix.clone(),
        route,
        limit,
        cursor,
    })
}

/// `GET /keys?state=...`: a page of the records in that state, as JSON.
pub(super) async fn list(
    gateway: &Gateway,
    query: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let req = request(gateway, query)?;
    let listing = gateway.store().list(&req).await.map_err(store_failed)?;
    let view = view(&req, listing);
    // A struct of strings and numbers always serialises.
    let body = serde_json::to_vec_pretty(&view).unwrap_or_default();
    let mut resp = Response::new(full(body));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

fn view(req: &ListRequest, listing: Listing) -> ListView<'_> {
    let keys = listing
        .records
        .into_iter()
        .map(|l| {
            let (route, scope, key) = match l.name {
                Some(n) => (Some(n.route), Some(n.scope), Some(n.key)),
                None => (None, None, None),
            };
            ListedView {
                route,
                key,
                scope,
                store_key: l.store_key,
                state: l.state.as_str(),
                fence: l.fence.get(),
                attempts: l.attempts,
                claimed_at: l.claimed_at.map(rfc3339),
                lease_left_ms: l.lease_left.map(|d| d.as_millis()),
            }
        })
        .collect();
    ListView {
        state: req.wanted.as_str(),
        route: req.route.as_deref(),
        keys,
        scanned: listing.scanned,
        truncated: listing.truncated,
        cursor: listing.cursor.map(|c| c.to_string()),
    }
}
