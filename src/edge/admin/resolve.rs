//! `POST /keys/{route}/{key}/resolve`: an operator settles a claim by hand, under the fence
//! `GET` showed.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveRequest {
    /// The fence `GET` showed: a resolution under any other is refused.
    fence: u64,
    #[serde(rename = "as")]
    resolve_as: ResolveAs,
    status: Option<u16>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<String>,
    /// Act even on a claim whose lease is live (logged at warn with both fences).
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum ResolveAs {
    Retry,
    Done,
}

/// Whether a resolved response may not carry a header: framing and hop-by-hop fields
/// (RFC 9110 §7.6.1, [`crate::protocol::hop_by_hop::is_framing`]), which no record keeps, and `Trailer`,
/// which names trailers a resolution has none of. A `content-length: 1000` over a 3-byte
/// body would break every replay.
fn refused(name: &str) -> bool {
    crate::protocol::hop_by_hop::is_framing(name.as_bytes()) || name.eq_ignore_ascii_case("trailer")
}

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::BadAdminRequest(message.into())
}

/// The store operation a posted resolution asks for (pure): the response of `"done"` is
/// encoded under the record's key, as the winner would have stored it.
fn resolution(
    req: ResolveRequest,
    store_key: &StoreKey,
    expires: std::time::SystemTime,
) -> Result<Resolution, GatewayError> {
    if req.resolve_as == ResolveAs::Retry {
        if req.status.is_some() || !req.headers.is_empty() || req.body.is_some() {
            return Err(bad("\"as\": \"retry\" takes no status, headers or body"));
        }
        return Ok(Resolution::Retry);
    }
    let status = req
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .filter(|s| (200..=599).contains(&s.as_u16()))
        .ok_or_else(|| bad("\"as\": \"done\" needs a \"status\" from 200 to 599"))?;
    let mut headers = HeaderMap::new();
    for (name, value) in &req.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad(format!("{name:?} is not a header name")))?;
        if refused(name.as_str()) {
            return Err(bad(format!(
                "{name} is a hop-by-hop or framing header: stored responses never carry one \
                 (a replay frames its body itself)"
            )));
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| bad(format!("the value of {name} is not a header value")))?;
        headers.append(name, value);
    }
    let body = Bytes::from(req.body.unwrap_or_default());
    Ok(Resolution::Done(
        StoredResponse {
            status,
            headers,
            body: StoredBody::Stored(body),
            expires: Some(expires),
            trailers: http::HeaderMap::new(),
        }
        .encode(store_key),
    ))
}

/// Reads an admin request body, within the public limits on size and time.
pub(super) async fn read_body(gateway: &Gateway, body: Incoming) -> Result<Bytes, GatewayError> {
    let server = gateway.live().config.server.clone();
    let limited = Limited::new(body, usize::try_from(server.max_body).unwrap_or(usize::MAX));
    match tokio::time::timeout(server.body_read_timeout, limited.collect()).await {
        Err(_) => Err(GatewayError::BodyTimeout),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(_)) => Err(GatewayError::BodyUnreadable),
    }
}

pub(super) async fn resolve(
    gateway: &Gateway,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Result<Response<Body>, GatewayError> {
    let Located {
        route,
        key,
        scope,
        store_key,
    } = locate(gateway, path, query)?;
    let req: ResolveRequest = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "expected {{\"fence\": N, \"as\": \"retry\"}} or {{\"fence\": N, \"as\": \"done\", \"status\": 201, \"headers\": {{...}}, \"body\": \"...\"}}: {e}"
        ))
    })?;
    let fence = Fence::new(req.fence);
    let what = match req.resolve_as {
        ResolveAs::Retry => "retry",
        ResolveAs::Done => "done",
    };
    let act = super::live::Act {
        what: match req.resolve_as {
            ResolveAs::Retry => "resolve retry",
            ResolveAs::Done => "resolve done",
        },
        force: req.force,
        fence: Some(req.fence),
        route: &route.name,
        key: &key,
    };
    super::live::guard(gateway, &store_key, act).await?;
    let expires = std::time::SystemTime::now() + route.window;
    // Sealed like the winner's records, so it opens where they open.
    let resolution = match resolution(req, &store_key, expires)? {
        Resolution::Done(record) => Resolution::Done(gateway.keyring().seal(&store_key, record)),
        retry => retry,
    };
    let resolved = gateway
        .store()
        .resolve(&store_key, fence, resolution, route.window)
        .await
        .map_err(store_failed)?;
    if !resolved {
        warn!(route = &*route.name, key = %key, scope, fence = fence.get(),
            "admin: resolution refused: the claim is not in flight under this fence");
        return Err(GatewayError::StaleFence);
    }
    info!(route = &*route.name, key = %key, scope, fence = fence.get(), resolved_as = what,
        "admin: claim resolved by hand");
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(headers: &[(&str, &str)]) -> Result<Resolution, GatewayError> {
        let req = ResolveRequest {
            fence: 1,
            resolve_as: ResolveAs::Done,
            status: Some(201),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: Some("abc".into()),
            force: false,
        };
        resolution(req, &StoreKey::from_raw("k"), std::time::SystemTime::now())
    }

    #[test]
    fn done_refuses_hop_by_hop_and_framing_headers() {
        for name in [
            "content-length",
            "Transfer-Encoding",
            "connection",
            "upgrade",
            "te",
        ] {
            assert!(done(&[(name, "1000")]).is_err(), "{name}");
        }
        assert!(done(&[("content-type", "text/plain")]).is_ok());
    }
}
