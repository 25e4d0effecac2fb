//! `[[routes]]` and the `[defaults]` they inherit: methods, path, key rule, scope and the
//! per-route dedupe policy.

use std::time::Duration;

use http::Method;

use super::defaults::{
    DEFAULT_ADVERTISE_EXPIRY, DEFAULT_ALLOW_EXTENSION_METHODS, DEFAULT_CONFLICT_WAIT,
    DEFAULT_KEY_REQUIRED, DEFAULT_LEASE, DEFAULT_MATCH_FINGERPRINT, DEFAULT_MATCH_HEADER,
    DEFAULT_MAX_CACHED_BODY, DEFAULT_MODE, DEFAULT_ON_CONFLICT, DEFAULT_ON_ERROR,
    DEFAULT_ON_UNKNOWN, DEFAULT_ORDER_COMPARE, DEFAULT_RETRY_STATUSES, DEFAULT_STORE_BODY,
    DEFAULT_UNKNOWN_STATUSES, DEFAULT_WINDOW, MAX_BODY_LIMIT, MAX_LEASE, MAX_TIMEOUT, MAX_WINDOW,
};
use super::file::{FileDefaults, FileKey, FileMatch, FileOrder, FileRoute};
use super::{invalid, parse, ConfigError};
use crate::protocol::key::order::OrderRule;
use crate::protocol::key::{KeyRule, MatchRule, RequestPart};
use crate::protocol::route::preset::UNVERIFIED_REFUSALS;
use crate::protocol::route::{
    Dialect, HeaderPattern, MatchMode, OnConflict, OnError, OnUnknown, PathPattern, Preset, Route,
    StatusPolicy, StatusSpec,
};

/// What a route takes from `[defaults]` (and `[store] on_error`) when it sets nothing.
pub(super) struct Inherited {
    lease: Duration,
    window: Duration,
    max_cached_body: u64,
    on_conflict: OnConflict,
    conflict_wait: Duration,
    on_error: OnError,
    on_unknown: OnUnknown,
    retry_statuses: Vec<StatusSpec>,
    unknown_statuses: Vec<StatusSpec>,
    /// `[defaults] errors` and `problem_base_url`.
    pub(super) errors: Dialect,
}

impl Inherited {
    /// Validates `[defaults]`; `on_error` is `[store] on_error`.
    pub(super) fn from_file(
        d: &FileDefaults,
        on_error: Option<OnError>,
    ) -> Result<Self, ConfigError> {
        let at = |field: &str| format!("defaults.{field}");
        Ok(Self {
            lease: opt(d.lease.as_deref(), |v| lease(&at("lease"), v))?.unwrap_or(DEFAULT_LEASE),
            window: opt(d.window.as_deref(), |v| window(&at("window"), v))?
                .unwrap_or(DEFAULT_WINDOW),
            max_cached_body: opt(d.max_cached_body.as_deref(), |v| {
                max_cached_body(&at("max_cached_body"), v)
            })?
            .unwrap_or(DEFAULT_MAX_CACHED_BODY),
            on_conflict: d.on_conflict.unwrap_or(DEFAULT_ON_CONFLICT),
            conflict_wait: opt(d.conflict_wait.as_deref(), |v| {
                conflict_wait(&at("conflict_wait"), v)
            })?
            .unwrap_or(DEFAULT_CONFLICT_WAIT),
            on_error: on_error.unwrap_or(DEFAULT_ON_ERROR),
            on_unknown: d.on_unknown.unwrap_or(DEFAULT_ON_UNKNOWN),
            retry_statuses: d
                .retry_statuses
                .clone()
                .unwrap_or_else(|| DEFAULT_RETRY_STATUSES.to_vec()),
            unknown_statuses: d
                .unknown_statuses
                .clone()
                .unwrap_or_else(|| DEFAULT_UNKNOWN_STATUSES.to_vec()),
            errors: super::errors::defaults(d)?,
        })
    }
}

/// RFC 9110's methods and PATCH (RFC 5789).
const STANDARD_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// A method as HTTP compares it: case-sensitive, so `post` would never match a `POST`.
/// Outside the standard set, a name is far likelier a typo (`PSOT`) than a WebDAV verb, and
/// a typo here silently switches dedupe off; such names need `allow_extension_methods`.
fn method(at: &str, m: &str, extensions: bool) -> Result<Method, ConfigError> {
    let method = Method::from_bytes(m.as_bytes())
        .map_err(|_| invalid(at, format!("{m:?} is not an HTTP method")))?;
    if m.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(invalid(
            at,
            format!(
                "{m:?}: methods are case-sensitive and written in uppercase: {:?}",
                m.to_ascii_uppercase()
            ),
        ));
    }
    if !extensions && !STANDARD_METHODS.contains(&m) {
        return Err(invalid(
            at,
            format!(
                "{m:?} is not a standard HTTP method ({}); set allow_extension_methods = true \
                 on this route if the API really uses it",
                STANDARD_METHODS.join(", ")
            ),
        ));
    }
    Ok(method)
}

fn opt<T>(
    v: Option<&str>,
    parse: impl FnOnce(&str) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    v.map(parse).transpose()
}

fn lease(at: &str, v: &str) -> Result<Duration, ConfigError> {
    parse::duration(at, v, MAX_LEASE)
}

fn window(at: &str, v: &str) -> Result<Duration, ConfigError> {
    parse::duration(at, v, MAX_WINDOW)
}

fn conflict_wait(at: &str, v: &str) -> Result<Duration, ConfigError> {
    parse::duration(at, v, MAX_TIMEOUT)
}

fn max_cached_body(at: &str, v: &str) -> Result<u64, ConfigError> {
    parse::size(at, v, 0, MAX_BODY_LIMIT)
}

pub(super) fn validate(
    at: &str,
    r: &FileRoute,
    inherited: &Inherited,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Route, ConfigError> {
    name(at, &r.name)?;
    let methods = methods(at, r)?;
    let grpc = super::grpc::validate(at, r, &methods)?;
    let path = PathPattern::new(&r.path).map_err(|e| invalid(format!("{at}.path"), e))?;
    let key = key(at, r)?;
    let must_match = must_match(at, r, &key)?;
    let scope = match (&r.scope, r.preset) {
        (Some(parts), _) => parse_parts(&format!("{at}.scope"), parts)?,
        (None, Some(preset)) => preset.scope(),
        (None, None) => unscoped(at, &key)?,
    };
    let hash_headers = r
        .hash_headers
        .iter()
        .map(|h| parse::header_name(&format!("{at}.hash_headers"), h))
        .collect::<Result<Vec<_>, _>>()?;

    let lease = match &r.lease {
        Some(v) => lease(&format!("{at}.lease"), v)?,
        None => inherited.lease,
    };
    let window = route_window(at, r, inherited)?;
    let replay_drop_headers = r
        .replay_drop_headers
        .iter()
        .map(|p| HeaderPattern::new(p).map_err(|e| invalid(format!("{at}.replay_drop_headers"), e)))
        .collect::<Result<Vec<_>, _>>()?;
    let max_cached_body = match &r.max_cached_body {
        Some(v) => max_cached_body(&format!("{at}.max_cached_body"), v)?,
        None => inherited.max_cached_body,
    };
    Ok(Route {
        name: r.name.as_str().into(),
        methods,
        mode: r.mode.unwrap_or(DEFAULT_MODE),
        preset: r.preset,
        path,
        key,
        scope,
        must_match,
        hash_headers,
        lease,
        window,
        max_cached_body,
        on_conflict: r.on_conflict.unwrap_or(inherited.on_conflict),
        conflict_wait: match &r.conflict_wait {
            Some(v) => conflict_wait(&format!("{at}.conflict_wait"), v)?,
            None => inherited.conflict_wait,
        },
        on_error: r.on_error.unwrap_or(inherited.on_error),
        on_unknown: r.on_unknown.unwrap_or(inherited.on_unknown),
        statuses: StatusPolicy {
            retry: r
                .retry_statuses
                .clone()
                .unwrap_or_else(|| unverified_refusals(inherited.retry_statuses.clone(), r)),
            unknown: r
                .unknown_statuses
                .clone()
                .unwrap_or_else(|| inherited.unknown_statuses.clone()),
        },
        grpc,
        grpc_codes: super::grpc::codes(r),
        store_body: r.store_body.unwrap_or(DEFAULT_STORE_BODY),
        replay_drop_headers,
        advertise_expiry: r.advertise_expiry.unwrap_or(DEFAULT_ADVERTISE_EXPIRY),
        order: r.order.as_ref().map(|o| order_rule(at, o)).transpose()?,
        verify: super::verify::validate(at, r, env)?,
        errors: super::grpc::dialect(super::errors::route(at, r, &inherited.errors)?, grpc),
    })
}

/// The scope of a route that writes none and has no preset: empty for a fingerprint (its
/// key is the request's own content), refused for a header key. A header key is a value
/// each caller picks, so without a scope every caller shares one key space and one
/// caller's key replays another's stored response; `scope = []`, written, is the file
/// saying one caller. A preset's sender is its one provider, and its key an id that
/// provider mints, so a preset route is never asked.
fn unscoped(at: &str, key: &KeyRule) -> Result<Vec<RequestPart>, ConfigError> {
    match key {
        KeyRule::Fingerprint(_) => Ok(Vec::new()),
        KeyRule::Header { name, .. } => Err(invalid(
            format!("{at}.scope"),
            format!(
                "required with a header key: a header key without a scope is shared by every \
                 caller, so one caller's {name} replays another caller's stored response. \
                 Name what identifies a caller (scope = [\"header:Authorization\"], or the \
                 header naming the tenant), or write scope = [] if one caller alone ever \
                 sends to this route"
            ),
        )),
    }
}

fn name(at: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid(
            format!("{at}.name"),
            "must be 1 to 64 letters, digits, '-' or '_'",
        ));
    }
    Ok(())
}

fn methods(at: &str, r: &FileRoute) -> Result<Vec<Method>, ConfigError> {
    if r.methods.is_empty() {
        return Err(invalid(
            format!("{at}.methods"),
            "must list at least one method",
        ));
    }
    let extensions = r
        .allow_extension_methods
        .unwrap_or(DEFAULT_ALLOW_EXTENSION_METHODS);
    r.methods
        .iter()
        .map(|m| method(&format!("{at}.methods"), m, extensions))
        .collect()
}

/// The route's own `key`, else its preset's; one of them is required.
fn key(at: &str, r: &FileRoute) -> Result<KeyRule, ConfigError> {
    match (&r.key, r.preset) {
        (Some(k), _) => key_rule(at, k),
        (None, Some(preset)) => Ok(preset.key()),
        (None, None) => Err(invalid(
            format!("{at}.key"),
            "required: `{ header = \"Idempotency-Key\" }`, `{ fingerprint = [...] }`, \
             or a `preset` (\"stripe\", \"github\", \"shopify\", \"standard-webhooks\")",
        )),
    }
}

/// `match`: what a retry must repeat besides the key; by default what the key kind (or
/// the preset) implies.
fn must_match(at: &str, r: &FileRoute, key: &KeyRule) -> Result<MatchRule, ConfigError> {
    let default = match key {
        KeyRule::Header { .. } => DEFAULT_MATCH_HEADER,
        KeyRule::Fingerprint(_) => DEFAULT_MATCH_FINGERPRINT,
    };
    Ok(match &r.must_match {
        None => match_rule(r.preset.map_or(default, Preset::must_match), key),
        Some(FileMatch::Mode(mode)) => match_rule(*mode, key),
        Some(FileMatch::Parts(parts)) if parts.is_empty() => {
            return Err(invalid(
                format!("{at}.match"),
                "must list at least one request part (or say \"key\" for the key alone)",
            ))
        }
        Some(FileMatch::Parts(parts)) => {
            MatchRule::Parts(parse_parts(&format!("{at}.match"), parts)?)
        }
    })
}

fn route_window(at: &str, r: &FileRoute, inherited: &Inherited) -> Result<Duration, ConfigError> {
    Ok(match (&r.window, r.preset) {
        (Some(v), _) => window(&format!("{at}.window"), v)?,
        // A preset never shortens what `[defaults]` asks for.
        (None, Some(preset)) => inherited.window.max(preset.window()),
        (None, None) => inherited.window,
    })
}

/// The inherited `retry_statuses`, with 401 and 403 on a preset route without `verify`
/// (see [`UNVERIFIED_REFUSALS`]).
fn unverified_refusals(mut statuses: Vec<StatusSpec>, r: &FileRoute) -> Vec<StatusSpec> {
    if r.preset.is_some() && r.verify.is_none() {
        for refusal in UNVERIFIED_REFUSALS {
            if !statuses.contains(&refusal) {
                statuses.push(refusal);
            }
        }
    }
    statuses
}

/// `order = { entity, version, compare }`: one request part each, as in fingerprints.
fn order_rule(at: &str, o: &FileOrder) -> Result<OrderRule, ConfigError> {
    let part = |field: &str, p: &str| {
        RequestPart::parse(p).map_err(|e| invalid(format!("{at}.order.{field}"), e))
    };
    Ok(OrderRule {
        entity: part("entity", &o.entity)?,
        version: part("version", &o.version)?,
        compare: o.compare.unwrap_or(DEFAULT_ORDER_COMPARE),
    })
}

/// `key = { ... }` as written: exactly one of `header` or `fingerprint`.
fn key_rule(at: &str, k: &FileKey) -> Result<KeyRule, ConfigError> {
    Ok(match (&k.header, &k.fingerprint) {
        (Some(h), None) => KeyRule::Header {
            name: parse::header_name(&format!("{at}.key.header"), h)?,
            alias: None,
            required: k.required.unwrap_or(DEFAULT_KEY_REQUIRED),
        },
        (None, Some(parts)) => {
            if k.required.is_some() {
                return Err(invalid(
                    format!("{at}.key.required"),
                    "applies to header keys only; a fingerprint is always derived",
                ));
            }
            if parts.is_empty() {
                return Err(invalid(
                    format!("{at}.key.fingerprint"),
                    "must list at least one request part",
                ));
            }
            KeyRule::Fingerprint(parse_parts(&format!("{at}.key.fingerprint"), parts)?)
        }
        _ => {
            return Err(invalid(
                format!("{at}.key"),
                "set exactly one of `header` or `fingerprint`",
            ))
        }
    })
}

fn match_rule(mode: MatchMode, key: &KeyRule) -> MatchRule {
    match (mode, key) {
        (MatchMode::Request, _) => MatchRule::Request,
        (MatchMode::Key, KeyRule::Fingerprint(parts)) => MatchRule::Parts(parts.clone()),
        (MatchMode::Key, KeyRule::Header { .. }) => MatchRule::Parts(Vec::new()),
    }
}

fn parse_parts(at: &str, parts: &[String]) -> Result<Vec<RequestPart>, ConfigError> {
    parts
        .iter()
        .map(|p| RequestPart::parse(p).map_err(|e| invalid(at, e)))
        .collect()
}
