//! An operator's resolve or DELETE never acts on a claim whose lease is live, unless forced:
//! its owner may still be executing it, and a retry let through meanwhile would execute the
//! key a second time.
//!
//! The check reads the record, then the action runs under the fence read: a takeover in
//! between makes the action stale (refused). What remains is the moment between the read
//! and the action, in which a frozen owner could renew a lease that had run out; the
//! operator acted on a claim that looked abandoned, as the documented takeover does.

use super::*;
use crate::store::RecordInfo;

/// What an operator asked to do, for the log.
#[derive(Clone, Copy)]
pub(super) struct Act<'a> {
    /// `resolve retry`, `resolve done`, `delete`.
    pub what: &'static str,
    /// `"force": true` (resolve) or `?force=true` (DELETE).
    pub force: bool,
    /// The fence the operator gave, if any.
    pub fence: Option<u64>,
    /// The route and key, for the log.
    pub route: &'a str,
    pub key: &'a str,
}

/// The record (if any), once it is safe to act on: 409 `claim-live` for a live lease
/// without `force` (a forced one is logged at warn with both fences).
pub(super) async fn guard(
    gateway: &Gateway,
    store_key: &StoreKey,
    act: Act<'_>,
) -> Result<Option<RecordInfo>, GatewayError> {
    let info = gateway
        .store()
        .inspect(store_key)
        .await
        .map_err(store_failed)?;
    let Some(info) = info else {
        return Ok(None);
    };
    let lease_left = match info.lease_left {
        Some(left) if info.state == RecordState::InFlight && !left.is_zero() => left,
        _ => return Ok(Some(info)),
    };
    if !act.force {
        info!(route = act.route, key = %act.key, action = act.what, live_fence = info.fence.get(),
            lease_left_ms = lease_left.as_millis() as u64,
            "admin: refused: the claim's lease is live");
        return Err(GatewayError::ClaimLive {
            fence: info.fence.get(),
            lease_left,
        });
    }
    warn!(route = act.route, key = %act.key, action = act.what,
        fence = act.fence, live_fence = info.fence.get(),
        lease_left_ms = lease_left.as_millis() as u64,
        "admin: forced on a live claim: its request may still be executing, and a retry may now execute the key again");
    Ok(Some(info))
}

/// `force=true` among the query's parameters.
pub(super) fn forced(query: Option<&str>) -> Result<bool, GatewayError> {
    match param(query, "force").as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(GatewayError::BadAdminRequest(
            "force must be true or false".into(),
        )),
    }
}

/// `fence=N` among the query's parameters: DELETE only a record with that fence.
pub(super) fn fence_param(query: Option<&str>) -> Result<Option<u64>, GatewayError> {
    param(query, "fence")
        .map(|v| {
            v.parse()
                .map_err(|_| GatewayError::BadAdminRequest("fence must be a number".into()))
        })
        .transpose()
}

fn param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}
