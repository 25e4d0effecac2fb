//! The four `keys` actions against the admin API, each answering one JSON object (the
//! `--format json` output, and what the text output is made of).

use http::Method;
use serde::Serialize;
use serde_json::{json, Value};

use super::client::Admin;
use super::{KeysError, Located};

/// How `keys resolve` settles a claim: the admin API's `as`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResolveAs {
    /// Release the key: the next request executes.
    Retry,
    /// Complete it with the given response.
    Done,
}

/// `keys resolve`'s request, in the admin API's names.
#[derive(Debug, Clone, Serialize)]
pub struct Resolve {
    /// The fence `keys show` or `keys list` showed.
    pub fence: u64,
    /// Retry or done.
    #[serde(rename = "as")]
    pub resolve_as: ResolveAs,
    /// Done: the response's status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Done: its headers.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Done: its body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Act on a claim whose lease is live.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// `keys list`'s request.
#[derive(Debug, Clone, Default)]
pub struct List {
    /// `held` or `in-flight`.
    pub state: String,
    /// Only this route's records.
    pub route: Option<String>,
    /// At most this many.
    pub limit: Option<usize>,
    /// Where a previous page stopped.
    pub cursor: Option<String>,
}

fn parse(body: &[u8]) -> Result<Value, KeysError> {
    serde_json::from_slice(body).map_err(|e| KeysError::Reply(e.to_string()))
}

/// The record's fields as named locally, for the actions' answers.
fn named(located: &Located, action: &str) -> Value {
    json!({
        "action": action,
        "route": located.route,
        "key": located.key,
        "scope": located.scope,
        "store_key": located.store_key.as_str(),
    })
}

/// `keys show`: the admin API's view of the record, with `derived_store_key` when the
/// gateway names another store key than the local config does (another prefix, another
/// scope rule: the gateway runs another config).
pub async fn show(admin: &Admin, located: &Located) -> Result<Value, KeysError> {
    let body = admin.call(Method::GET, &located.admin_path(), None).await?;
    let mut view = parse(&body)?;
    let theirs = view.get("store_key").and_then(Value::as_str);
    if theirs != Some(located.store_key.as_str()) {
        view["derived_store_key"] = json!(located.store_key.as_str());
    }
    Ok(view)
}

/// `keys resolve`: settles the claim under `req.fence`.
pub async fn resolve(admin: &Admin, located: &Located, req: &Resolve) -> Result<Value, KeysError> {
    let (path, query) = located
        .admin_path()
        .split_once('?')
        .map(|(p, q)| (p.to_owned(), q.to_owned()))
        .unwrap_or_default();
    let body = serde_json::to_vec(req).map_err(|e| KeysError::Usage(e.to_string()))?;
    admin
        .call(Method::POST, &format!("{path}/resolve?{query}"), Some(body))
        .await?;
    let mut out = named(located, "resolve");
    out["as"] = json!(req.resolve_as);
    out["fence"] = json!(req.fence);
    Ok(out)
}

/// `keys delete`: forgets the record (only under `fence`, when given).
pub async fn delete(
    admin: &Admin,
    located: &Located,
    fence: Option<u64>,
    force: bool,
) -> Result<Value, KeysError> {
    let mut path = located.admin_path();
    if let Some(f) = fence {
        path += &format!("&fence={f}");
    }
    if force {
        path += "&force=true";
    }
    admin.call(Method::DELETE, &path, None).await?;
    let mut out = named(located, "delete");
    out["fence"] = json!(fence);
    Ok(out)
}

/// `keys list`: one page of the records in a state.
pub async fn list(admin: &Admin, req: &List) -> Result<Value, KeysError> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("state", &req.state);
    if let Some(r) = &req.route {
        query.append_pair("route", r);
    }
    if let Some(n) = req.limit {
        query.append_pair("limit", &n.to_string());
    }
    if let Some(c) = &req.cursor {
        query.append_pair("cursor", c);
    }
    let body = admin
        .call(Method::GET, &format!("/keys?{}", query.finish()), None)
        .await?;
    parse(&body)
}
