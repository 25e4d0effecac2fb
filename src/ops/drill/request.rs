//! Requests a drill sends: built from a route's key rule and scope so that the gateway
//! derives a key from them, marked so that no real client's key can collide, and signed
//! with a signed route's first secret. On a `grpc = true` route, a gRPC call: the JSON
//! framed as its one message. Pure but for the signature's clock.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method};
use serde_json::{Map, Value};

use super::grpc;
use crate::protocol::key::{self, KeyRule, RequestPart, RequestView};
use crate::protocol::route::{self, Namespace, Route};
use crate::store::{RequestHash, StoreKey};

/// One request, with what the gateway will make of it.
#[derive(Debug, Clone)]
pub struct DrillRequest {
    /// Method.
    pub method: Method,
    /// Path, without query.
    pub path: String,
    /// Query, without `?`.
    pub query: Option<String>,
    /// Headers.
    pub headers: HeaderMap,
    /// Body (JSON; on a gRPC route, framed as one message).
    pub body: Bytes,
    /// The key the gateway derives: the header's value, or the fingerprint.
    pub key: String,
    /// The scope hash (`-` without scope).
    pub scope: String,
    /// The request hash.
    pub hash: RequestHash,
    /// On an ordered route: the entity's hash.
    pub entity: Option<String>,
}

impl DrillRequest {
    /// Path and query, as sent.
    pub fn path_and_query(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }

    /// The store key under the store's namespace.
    pub fn store_key(&self, ns: Namespace<'_>, route: &str) -> StoreKey {
        ns.record_key(route, &self.scope, &self.key, self.entity.as_deref())
    }
}

/// The marks a request carries.
#[derive(Debug, Clone)]
pub struct Marks<'a> {
    /// Unique per drill and run (`drill-<run>-replay`): the key, or the fingerprinted fields.
    pub key: &'a str,
    /// Unique per run: the scope's fields (one drill tenant per run).
    pub tenant: &'a str,
    /// Headers the caller sets itself (`--header`), which win over generated ones.
    pub headers: &'a HeaderMap,
}

/// Builds a request that reaches `routes[index]` and has a key there.
pub fn for_route(
    routes: &[Route],
    index: usize,
    marks: &Marks<'_>,
) -> Result<DrillRequest, String> {
    let route = &routes[index];
    let method = if route.methods.contains(&Method::POST) {
        Method::POST
    } else {
        route.methods[0].clone()
    };
    let path = path_for(routes, index, &method, marks.key)?;
    let mut headers = HeaderMap::new();
    if route.grpc {
        grpc::mark_call(&mut headers);
    } else {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    let mut query = None;
    let mut body = Value::Object(Map::from_iter([(
        "drill".to_owned(),
        Value::String(marks.key.to_owned()),
    )]));
    let mut fill = |part: &RequestPart, mark: &str, headers: &mut HeaderMap| match part {
        RequestPart::Header(name) => {
            // Marks are plain ASCII: always a valid header value.
            if let Ok(v) = HeaderValue::from_str(mark) {
                headers.insert(name.clone(), v);
            }
        }
        RequestPart::Query => query = Some(format!("drill={mark}")),
        RequestPart::Json(pointer) => set_pointer(&mut body, pointer, mark),
        RequestPart::Method | RequestPart::Path | RequestPart::Body => {}
    };
    for part in &route.scope {
        fill(part, marks.tenant, &mut headers);
    }
    match &route.key {
        KeyRule::Header { name, .. } => {
            fill(&RequestPart::Header(name.clone()), marks.key, &mut headers)
        }
        KeyRule::Fingerprint(parts) => {
            for part in parts {
                fill(part, marks.key, &mut headers);
            }
        }
    }
    // An ordered route: the drill's own entity (its key mark, so no drill's version is
    // stale for another) at a version every `compare` accepts.
    if let Some(order) = &route.order {
        fill(&order.entity, marks.key, &mut headers);
        let version = match order.compare {
            key::order::Compare::Timestamp => "2000-01-01T00:00:00Z",
            key::order::Compare::Integer | key::order::Compare::String => "1",
        };
        fill(&order.version, version, &mut headers);
    }
    for (name, value) in marks.headers {
        headers.insert(name.clone(), value.clone());
    }
    // A JSON value always serialises.
    let body = grpc::body_of(route, serde_json::to_vec(&body).unwrap_or_default());
    finish(route, method, path, query, headers, body)
}

/// The same key under the same scope with a different request (what a key computed
/// outside a loop sends), or `None` when the route's key covers every part the request
/// hash covers.
pub fn misuse(route: &Route, req: &DrillRequest) -> Option<DrillRequest> {
    let mut candidates = Vec::new();
    let json = grpc::json_of(route, &req.body);
    if let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(json) {
        body.insert("drill_misuse".into(), Value::Bool(true));
        let body = grpc::body_of(route, serde_json::to_vec(&body).unwrap_or_default());
        candidates.push((req.query.clone(), req.headers.clone(), body));
    }
    let query = match &req.query {
        Some(q) => format!("{q}&drill_misuse=1"),
        None => "drill_misuse=1".to_owned(),
    };
    candidates.push((Some(query), req.headers.clone(), req.body.clone()));
    for name in &route.hash_headers {
        let mut headers = req.headers.clone();
        headers.insert(name.clone(), HeaderValue::from_static("drill-misuse"));
        candidates.push((req.query.clone(), headers, req.body.clone()));
    }
    candidates.into_iter().find_map(|(query, headers, body)| {
        let other = finish(
            route,
            req.method.clone(),
            req.path.clone(),
            query,
            headers,
            body,
        )
        .ok()?;
        (other.key == req.key && other.scope == req.scope && other.hash != req.hash)
            .then_some(other)
    })
}

fn finish(
    route: &Route,
    method: Method,
    path: String,
    query: Option<String>,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<DrillRequest, String> {
    // A signed route refuses what its provider did not sign: sign as the provider does.
    if let Some(verifier) = &route.verify {
        verifier.sign(&mut headers, &body, std::time::SystemTime::now());
    }
    let view = RequestView {
        method: &method,
        path: &path,
        query: query.as_deref(),
        headers: &headers,
        body: &body,
    };
    let derived = route
        .derive(&view)
        .map_err(|e| {
            format!("the generated request has no usable key, scope, match or order parts: {e}")
        })?
        .ok_or("the generated request has no key")?;
    Ok(DrillRequest {
        method,
        path,
        query,
        headers,
        body,
        key: derived.key,
        scope: derived.scope,
        hash: derived.request_hash,
        entity: derived.ordered.map(|o| o.entity),
    })
}

/// A path the route's pattern matches and no earlier route takes first.
fn path_for(routes: &[Route], index: usize, method: &Method, mark: &str) -> Result<String, String> {
    let pattern = routes[index].path.as_str();
    let candidates = [
        fill_glob(pattern, mark),
        fill_glob(pattern, &format!("{mark}/{mark}")),
        fill_glob(pattern, ""),
    ];
    candidates
        .into_iter()
        .find(|p| route::find(routes, method, p) == Some(index))
        .ok_or_else(|| {
            format!("no generated path for {pattern:?} reaches this route (an earlier route matches it first)")
        })
}

/// `pattern` with `*` replaced by `fill`, `?` by `d`, `{a,b}` by `a` and `[xy]` by `x`.
fn fill_glob(pattern: &str, fill: &str) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                out.push_str(fill);
            }
            '?' => out.push('d'),
            '{' => {
                let alt: String = chars.by_ref().take_while(|&c| c != '}').collect();
                out.push_str(alt.split(',').next().unwrap_or(""));
            }
            '[' => {
                let class: String = chars.by_ref().take_while(|&c| c != ']').collect();
                let class = class.trim_start_matches(['!', '^']);
                out.push(class.chars().next().unwrap_or('d'));
            }
            c => out.push(c),
        }
    }
    out
}

/// Sets the value at an RFC 6901 pointer, making the objects (or arrays, for numeric
/// tokens) on the way.
fn set_pointer(doc: &mut Value, pointer: &str, mark: &str) {
    if pointer.is_empty() {
        return; // the whole body: it carries the mark already
    }
    let tokens: Vec<String> = pointer[1..]
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let mut at = doc;
    for (i, token) in tokens.iter().enumerate() {
        let last = i + 1 == tokens.len();
        let next = if last {
            Value::String(mark.to_owned())
        } else if tokens[i + 1].parse::<usize>().is_ok() {
            Value::Array(Vec::new())
        } else {
            Value::Object(Map::new())
        };
        if !matches!(at, Value::Object(_) | Value::Array(_)) {
            *at = Value::Object(Map::new());
        }
        at = match at {
            Value::Array(items) => {
                let Ok(n) = token.parse::<usize>() else {
                    return;
                };
                if items.len() <= n {
                    items.resize(n + 1, Value::Null);
                }
                if last || items[n].is_null() {
                    items[n] = next;
                }
                &mut items[n]
            }
            Value::Object(map) => {
                let slot = map.entry(token.clone()).or_insert(Value::Null);
                if last || slot.is_null() {
                    *slot = next;
                }
                slot
            }
            _ => return,
        };
    }
}

/// Parses `Name: value` as given to `--header`.
pub fn parse_header(s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not \"Name: value\""))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of {name} is not a header value"))?;
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn routes(toml: &str) -> Vec<Route> {
        Config::from_toml(toml).unwrap().routes
    }

    fn marks<'a>(key: &'a str, headers: &'a HeaderMap) -> Marks<'a> {
        Marks {
            key,
            tenant: "drill-run1",
            headers,
        }
    }

    #[test]
    fn ordered_routes_get_an_entity_and_a_version_their_compare_accepts() {
        for compare in ["integer", "timestamp", "string"] {
            let routes = routes(&format!(
                "[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://127.0.0.1:2\"\n\
                 [[routes]]\nname = \"o\"\nmethods = [\"POST\"]\npath = \"/o\"\n\
                 key = {{ header = \"Idempotency-Key\" }}\nscope = []\n\
                 order = {{ entity = \"json:/data/id\", version = \"header:x-v\", compare = \"{compare}\" }}\n"
            ));
            let none = HeaderMap::new();
            let a = for_route(&routes, 0, &marks("drill-run1-replay", &none)).unwrap();
            let b = for_route(&routes, 0, &marks("drill-run1-conflict", &none)).unwrap();
            let view = |r: &DrillRequest| {
                routes[0]
                    .order
                    .as_ref()
                    .unwrap()
                    .derive(&RequestView {
                        method: &r.method,
                        path: &r.path,
                        query: r.query.as_deref(),
                        headers: &r.headers,
                        body: &r.body,
                    })
                    .unwrap()
            };
            // Each drill writes an entity of its own: none is stale for another.
            assert_ne!(view(&a).entity, view(&b).entity, "{compare}");
        }
    }

    #[test]
    fn every_route_of_the_example_gets_a_request_that_reaches_it() {
        let routes = routes(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/example.toml"
        )));
        let none = HeaderMap::new();
        for i in 0..routes.len() {
            let r = for_route(&routes, i, &marks("drill-run1-replay", &none)).unwrap();
            assert_eq!(route::find(&routes, &r.method, &r.path), Some(i), "{r:?}");
        }
        // The fingerprint route under /webhooks/* must not land on /webhooks/shopify.
        let generic = for_route(&routes, 2, &marks("drill-run1-replay", &none)).unwrap();
        assert_eq!(generic.path, "/webhooks/drill-run1-replay");
        let body: Value = serde_json::from_slice(&generic.body).unwrap();
        assert_eq!(body["order_id"], "drill-run1-replay");
        assert_eq!(generic.headers["x-source"], "drill-run1-replay");
        assert_eq!(generic.key.len(), 64, "a fingerprint");
    }

    #[test]
    fn header_keys_and_scopes_carry_the_marks() {
        let routes = routes(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/example.toml"
        )));
        let none = HeaderMap::new();
        let r = for_route(&routes, 0, &marks("drill-run1-race", &none)).unwrap();
        assert_eq!(r.key, "drill-run1-race");
        assert_eq!(r.headers["authorization"], "drill-run1");
        assert_ne!(r.scope, "-");
        // A caller's own header wins (a real token for a staging tenant).
        let mut mine = HeaderMap::new();
        mine.insert("authorization", HeaderValue::from_static("Bearer t"));
        let r2 = for_route(&routes, 0, &marks("drill-run1-race", &mine)).unwrap();
        assert_eq!(r2.headers["authorization"], "Bearer t");
        assert_ne!(r2.scope, r.scope);
    }

    #[test]
    fn nested_pointers_and_array_indexes_are_built() {
        let mut doc = serde_json::json!({"drill": "m"});
        set_pointer(&mut doc, "/a/b", "m");
        set_pointer(&mut doc, "/a/c", "m");
        set_pointer(&mut doc, "/items/1/id", "m");
        set_pointer(&mut doc, "/x~1y", "m");
        assert_eq!(
            doc,
            serde_json::json!({"drill":"m","a":{"b":"m","c":"m"},"items":[null,{"id":"m"}],"x/y":"m"})
        );
    }

    #[test]
    fn misuse_keeps_key_and_scope_and_changes_the_hash() {
        let routes = routes(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/example.toml"
        )));
        let none = HeaderMap::new();
        for i in 0..routes.len() {
            let r = for_route(&routes, i, &marks("drill-run1-misuse", &none)).unwrap();
            match misuse(&routes[i], &r) {
                Some(m) => {
                    assert_eq!((&m.key, &m.scope), (&r.key, &r.scope));
                    assert_ne!(m.hash, r.hash);
                }
                // A fingerprint route matches on the fingerprint's own parts by default:
                // the same key cannot come with a request that must not replay.
                None => assert!(
                    matches!(routes[i].key, crate::protocol::key::KeyRule::Fingerprint(_)),
                    "no misuse request for {}",
                    routes[i].name
                ),
            }
        }
    }

    #[test]
    fn misuse_is_impossible_when_the_key_covers_the_whole_request() {
        let routes = routes(
            r#"
[server]
listen = "127.0.0.1:1"
upstream = "http://127.0.0.1:2"
[[routes]]
name = "all"
methods = ["POST"]
path = "/all"
key = { fingerprint = ["method", "path", "query", "body"] }
"#,
        );
        let none = HeaderMap::new();
        let r = for_route(&routes, 0, &marks("m", &none)).unwrap();
        assert!(misuse(&routes[0], &r).is_none());
    }

    #[test]
    fn glob_filling() {
        assert_eq!(fill_glob("/v1/payments/*", "m"), "/v1/payments/m");
        assert_eq!(fill_glob("/a/**/b?", "m"), "/a/m/bd");
        assert_eq!(fill_glob("/{x,y}/[ab]", "m"), "/x/a");
        assert!(parse_header("Authorization: Bearer t").is_ok());
        assert!(parse_header("nocolon").is_err());
    }
}
