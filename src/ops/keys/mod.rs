//! `dedupe-gateway keys`: an operator's tools for one record (`show`, `resolve`, `delete`)
//! and for finding records in a state (`list`), through a running gateway's admin API.
//!
//! The record is named locally, from the user's config, with the pipeline's own derivation
//! ([`Route::record_of`]: [`Route::derive`]'s key, scope and order, and the one store key): the key from `--key` (header-keyed
//! routes) or from the request parts given (fingerprint routes), the scope from the given
//! headers, hashed as the gateway hashes them. The admin API is then asked for that route,
//! key and scope hash (`?scope=`), and names the same store key: `show` says if it does not
//! (the gateway runs another config).

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method};

use crate::config::Config;
use crate::protocol::key::{KeyError, KeyRule, RequestPart, RequestView};
use crate::protocol::route::{self, Mode, Route};
use crate::protocol::tokens::StoreKey;

pub mod act;
pub mod client;
pub mod output;

/// Why a `keys` command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The arguments do not name a record (unknown route, missing key, bad header).
    #[error("{0}")]
    Usage(String),
    /// The key or scope could not be derived from the request parts given.
    #[error("cannot derive the key: {0}")]
    Derive(#[from] KeyError),
    /// The admin API could not be reached.
    #[error("admin API {url}: {reason}")]
    Unreachable {
        /// Where.
        url: String,
        /// Why.
        reason: String,
    },
    /// The admin API answered with a problem (a 4xx or 5xx).
    #[error("admin API answered {status}: {title}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The problem's `type`.
        problem_type: Option<String>,
        /// The problem's `title`.
        title: String,
        /// The problem's `detail`.
        detail: Option<String>,
    },
    /// The admin API answered something this command does not understand.
    #[error("unexpected answer from the admin API: {0}")]
    Reply(String),
}

/// What names one record on the command line.
#[derive(Debug, Clone, Default)]
pub struct KeyArgs {
    /// `--route`.
    pub route: String,
    /// `--key`: the idempotency key (a fingerprint route: the fingerprint itself).
    pub key: Option<String>,
    /// `--request "METHOD /path?query"`: for a route whose key or scope reads them.
    pub request: Option<String>,
    /// `-H "Name: value"`.
    pub headers: Vec<String>,
    /// `--body`.
    pub body: Option<String>,
}

/// A record, named as the gateway names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The route.
    pub route: String,
    /// The idempotency key or fingerprint.
    pub key: String,
    /// The scope hash (`-` without scope).
    pub scope: String,
    /// On an ordered route whose records carry it (a cluster): the entity's hash.
    pub entity: Option<String>,
    /// The store key the config derives.
    pub store_key: StoreKey,
    /// The route's scope headers that the arguments did not give (each hashed as absent):
    /// why a record a client made may not be found under this name.
    pub scope_not_given: Vec<String>,
}

impl Located {
    /// The record's admin path: `/keys/{route}/{key}?scope=...`.
    pub fn admin_path(&self) -> String {
        let key =
            percent_encoding::utf8_percent_encode(&self.key, percent_encoding::NON_ALPHANUMERIC);
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("scope", &self.scope);
        if let Some(e) = &self.entity {
            query.append_pair("entity_hash", e);
        }
        format!("/keys/{}/{key}?{}", self.route, query.finish())
    }
}

fn usage(message: impl Into<String>) -> KeysError {
    KeysError::Usage(message.into())
}

/// Names the record `args` describe under `config`, with the pipeline's verdict.
pub fn locate(config: &Config, args: &KeyArgs) -> Result<Located, KeysError> {
    let route = config
        .routes
        .iter()
        .find(|r| *r.name == *args.route)
        .ok_or_else(|| {
            let known: Vec<&str> = config.routes.iter().map(|r| &*r.name).collect();
            usage(format!(
                "--route {:?}: no such route (the config has {})",
                args.route,
                known.join(", ")
            ))
        })?;
    if route.mode == Mode::Off {
        return Err(usage(format!(
            "route {} is off: it keeps no records",
            route.name
        )));
    }
    let mut headers = parse_headers(&args.headers)?;
    let fingerprint_given = matches!(route.key, KeyRule::Fingerprint(_)) && args.key.is_some();
    let (method, path, query) = target(config, route, args.request.as_deref(), !fingerprint_given)?;
    let body = args.body.as_deref().unwrap_or("").as_bytes();
    let fingerprint = match (&route.key, &args.key) {
        (KeyRule::Header { name, .. }, Some(key)) => {
            set_key(&mut headers, name, key)?;
            None
        }
        (KeyRule::Fingerprint(_), Some(key)) => Some(key.clone()),
        (KeyRule::Header { name, .. }, None) if !headers.contains_key(name) => {
            return Err(usage(format!(
                "route {} is keyed by the {name} header: give --key (or -H \"{name}: ...\")",
                route.name
            )))
        }
        _ => None,
    };
    let view = RequestView {
        method: &method,
        path: &path,
        query: query.as_deref(),
        headers: &headers,
        body,
    };
    let ns = config.store.namespace();
    if let Some(key) = fingerprint {
        // The fingerprint as listed: only the scope is derived.
        let scope = crate::protocol::key::scope_hash(&route.scope, &view)?;
        let store_key = ns.record_key(&route.name, &scope, &key, None);
        return Ok(located(route, (key, scope, None), store_key, &headers));
    }
    let named = route
        .record_of(ns, config.server.max_body, &view)?
        .ok_or_else(|| usage("no key: the request carries none"))?;
    let entity = named.entity.filter(|_| ns.tags_by_entity);
    Ok(located(
        route,
        (named.key, named.scope, entity),
        named.store_key,
        &headers,
    ))
}

fn located(
    route: &Route,
    (key, scope, entity): (String, String, Option<String>),
    store_key: StoreKey,
    headers: &HeaderMap,
) -> Located {
    let scope_not_given = route
        .scope
        .iter()
        .filter(|p| matches!(p, RequestPart::Header(name) if !headers.contains_key(name)))
        .map(ToString::to_string)
        .collect();
    Located {
        route: route.name.to_string(),
        key,
        scope,
        entity,
        store_key,
        scope_not_given,
    }
}

impl Located {
    /// What to add to an admin API's "no record under that key": the scope parts this
    /// name was derived without, when there are any.
    pub fn not_found_hint(&self) -> Option<String> {
        (!self.scope_not_given.is_empty()).then(|| {
            let them = if self.scope_not_given.len() == 1 {
                "it"
            } else {
                "them"
            };
            format!(
                "route {} scopes its keys by {}: not given here, so the record was looked for \
                 in the scope of a request without {them}; give each as the client sent it \
                 (-H \"Name: value\")",
                self.route,
                self.scope_not_given.join(", "),
            )
        })
    }
}

/// `--key` as the route's key header, unless `-H` gave it already (then they must agree).
fn set_key(headers: &mut HeaderMap, name: &HeaderName, key: &str) -> Result<(), KeysError> {
    let value = HeaderValue::from_str(key)
        .map_err(|_| usage(format!("--key {key:?} is not a header value")))?;
    match headers.get(name) {
        Some(given) if *given != value => Err(usage(format!(
            "--key and -H \"{name}: ...\" name two different keys"
        ))),
        Some(_) => Ok(()),
        None => {
            headers.insert(name.clone(), value);
            Ok(())
        }
    }
}

/// `-H "Name: value"` as headers, in order.
pub fn parse_headers(given: &[String]) -> Result<HeaderMap, KeysError> {
    let mut map = HeaderMap::new();
    for h in given {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| usage(format!("-H {h:?}: expected \"Name: value\"")))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| usage(format!("-H {h:?}: {name:?} is not a header name")))?;
        let value = HeaderValue::from_str(value.trim())
            .map_err(|_| usage(format!("-H {h:?}: the value is not a header value")))?;
        map.append(name, value);
    }
    Ok(map)
}

/// The method, path and query derivation sees: `--request`'s (which must take `route`), or,
/// for a route whose key, scope and order read none of them, the route's first method.
fn target(
    config: &Config,
    route: &Route,
    request: Option<&str>,
    deriving_key: bool,
) -> Result<(Method, String, Option<String>), KeysError> {
    let Some(request) = request else {
        if let Some(part) = target_part(route, deriving_key) {
            return Err(usage(format!(
                "route {}'s key or scope reads {part}: give --request \"METHOD /path\"",
                route.name
            )));
        }
        let method = route.methods.first().cloned().unwrap_or(Method::POST);
        return Ok((method, "/".to_owned(), None));
    };
    let (method, target) = request
        .trim()
        .split_once(' ')
        .ok_or_else(|| usage(format!("--request {request:?}: expected \"METHOD /path\"")))?;
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| usage(format!("--request: {method:?} is not a method")))?;
    let (raw, query) = match target.trim().split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (target.trim(), None),
    };
    let normal =
        crate::protocol::path::normalise(raw).map_err(|e| usage(format!("--request: {e}")))?;
    let path = crate::protocol::path::match_form(&normal).into_owned();
    let taken = route::find(&config.routes, &method, &path).map(|i| &*config.routes[i].name);
    if taken != Some(&*route.name) {
        return Err(usage(format!(
            "--request {request:?} takes route {}, not {}",
            taken.unwrap_or("(none: passthrough)"),
            route.name
        )));
    }
    Ok((method, path, query))
}

/// A part of the request line the route's key (when `deriving_key`), scope or order
/// reads, if any.
fn target_part(route: &Route, deriving_key: bool) -> Option<&RequestPart> {
    let line = |p: &&RequestPart| {
        matches!(
            p,
            RequestPart::Method | RequestPart::Path | RequestPart::Query
        )
    };
    let key = match &route.key {
        KeyRule::Fingerprint(parts) if deriving_key => parts.as_slice(),
        _ => &[],
    };
    let order = route.order.iter().flat_map(|o| [&o.entity, &o.version]);
    key.iter().chain(route.scope.iter()).chain(order).find(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::route::Verdict;

    fn example() -> Config {
        Config::from_toml(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/example.toml"
        )))
        .unwrap()
    }

    /// The store key the gateway's pipeline gives a whole request.
    fn pipeline(
        c: &Config,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> StoreKey {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let i = route::find(&c.routes, &method, path).unwrap();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let view = RequestView {
            method: &method,
            path,
            query: None,
            headers: &map,
            body: body.as_bytes(),
        };
        match c.routes[i].verdict(c.store.namespace(), c.server.max_body, &view) {
            Verdict::Claim(k) => k.store_key,
            Verdict::Skip(s) => panic!("{s:?}"),
        }
    }

    fn args(route: &str, key: Option<&str>, headers: &[&str]) -> KeyArgs {
        KeyArgs {
            route: route.into(),
            key: key.map(Into::into),
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            ..KeyArgs::default()
        }
    }

    #[test]
    fn a_scoped_header_key_is_named_as_the_pipeline_names_it() {
        let c = example();
        let got = locate(
            &c,
            &args("payments", Some("k1"), &["Authorization: Bearer a"]),
        )
        .unwrap();
        let want = pipeline(
            &c,
            "POST",
            "/v1/payments/42",
            &[("Idempotency-Key", "k1"), ("Authorization", "Bearer a")],
            "{}",
        );
        assert_eq!(got.store_key, want);
        // The sf-string spelling of the same key is the same record.
        let quoted = locate(
            &c,
            &args("payments", Some("\"k1\""), &["Authorization: Bearer a"]),
        )
        .unwrap();
        assert_eq!(quoted.store_key, want);
        assert!(
            got.admin_path().starts_with("/keys/payments/k1?scope="),
            "{}",
            got.admin_path()
        );
        // Another caller, another record.
        let other = locate(
            &c,
            &args("payments", Some("k1"), &["Authorization: Bearer b"]),
        )
        .unwrap();
        assert_ne!(other.store_key, want);
    }

    #[test]
    fn a_fingerprint_that_reads_the_path_needs_the_request() {
        let c = example();
        let body = r#"{"order_id":"o1","event_type":"paid"}"#;
        let mut a = args("generic-webhooks", None, &["X-Source: shop"]);
        a.body = Some(body.into());
        let err = locate(&c, &a).unwrap_err();
        assert!(err.to_string().contains("--request"), "{err}");
        a.request = Some("POST /webhooks/orders".into());
        let got = locate(&c, &a).unwrap();
        let want = pipeline(
            &c,
            "POST",
            "/webhooks/orders",
            &[("X-Source", "shop")],
            body,
        );
        assert_eq!(got.store_key, want);
        // The fingerprint itself names the same record.
        let by_key = locate(&c, &args("generic-webhooks", Some(&got.key), &[])).unwrap();
        assert_eq!(by_key.store_key, want);
        // A request another route takes is refused.
        a.request = Some("POST /v1/payments/1".into());
        assert!(matches!(locate(&c, &a), Err(KeysError::Usage(_))));
    }

    #[test]
    fn a_header_keyed_route_needs_its_key() {
        let c = example();
        assert!(matches!(
            locate(&c, &args("payments", None, &[])),
            Err(KeysError::Usage(_))
        ));
        assert!(matches!(
            locate(&c, &args("nope", Some("k"), &[])),
            Err(KeysError::Usage(_))
        ));
    }
}
