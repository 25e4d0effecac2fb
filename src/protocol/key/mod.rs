//! Key derivation, fingerprinting, request hashing and key namespacing. Pure functions
//! over a [`RequestView`]; unit-tested here.
//!
//! A wrong key poisons the dedupe store: two different operations sharing a key means the
//! second client silently gets the first one's response. So every digest here length-prefixes
//! each part (no two different inputs can concatenate to the same bytes) and carries a
//! domain tag (a fingerprint can never equal a request hash or a scope hash).

pub mod coding;
mod json;
pub mod order;

use http::header::HeaderName;
use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::protocol::tokens::{RequestHash, StoreKey};

/// The request as key derivation sees it: borrowed, already buffered.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    /// Method.
    pub method: &'a Method,
    /// Path, without query.
    pub path: &'a str,
    /// Query string, without `?`.
    pub query: Option<&'a str>,
    /// Headers.
    pub headers: &'a HeaderMap,
    /// The whole body.
    pub body: &'a [u8],
}

/// A part of a request that can be hashed into a fingerprint or a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestPart {
    /// `method`
    Method,
    /// `path`
    Path,
    /// `query`
    Query,
    /// `body`: the raw bytes.
    Body,
    /// `header:Name`: every value of the header, in order; absence is hashed as absence.
    Header(HeaderName),
    /// `json:/pointer`: the JSON value at an RFC 6901 pointer in the body.
    Json(String),
}

impl RequestPart {
    /// Parses `method`, `path`, `query`, `body`, `header:Name` or `json:/pointer`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "method" => return Ok(Self::Method),
            "path" => return Ok(Self::Path),
            "query" => return Ok(Self::Query),
            "body" => return Ok(Self::Body),
            _ => {}
        }
        if let Some(name) = s.strip_prefix("header:") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(Self::Header)
                .map_err(|_| format!("{s:?}: {name:?} is not a header name"));
        }
        if let Some(pointer) = s.strip_prefix("json:") {
            if !pointer.is_empty() && !pointer.starts_with('/') {
                return Err(format!(
                    "{s:?}: {pointer:?} is not a JSON pointer (RFC 6901: \"\" or starting with '/')"
                ));
            }
            return Ok(Self::Json(pointer.to_owned()));
        }
        Err(format!(
            "{s:?} is not a request part (method, path, query, body, header:NAME, json:/POINTER)"
        ))
    }

    fn tag(&self) -> u8 {
        match self {
            Self::Method => 1,
            Self::Path => 2,
            Self::Query => 3,
            Self::Body => 4,
            Self::Header(_) => 5,
            Self::Json(_) => 6,
        }
    }
}

impl std::fmt::Display for RequestPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Method => f.write_str("method"),
            Self::Path => f.write_str("path"),
            Self::Query => f.write_str("query"),
            Self::Body => f.write_str("body"),
            Self::Header(h) => write!(f, "header:{h}"),
            Self::Json(p) => write!(f, "json:{p}"),
        }
    }
}

/// Where a route's idempotency key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRule {
    /// A client-supplied header.
    Header {
        /// Which header.
        name: HeaderName,
        /// The same header under another name, read when `name` is absent (Svix sends
        /// Standard Webhooks' `webhook-id` as `svix-id`).
        alias: Option<HeaderName>,
        /// Refuse (400) a request without it, or pass it through undeduped.
        required: bool,
    },
    /// The SHA-256 of the listed request parts.
    Fingerprint(Vec<RequestPart>),
}

/// Why no key could be derived. Each maps to a 400 for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A required key header is absent.
    #[error("the {header} header is required on this route")]
    Missing {
        /// The header.
        header: HeaderName,
    },
    /// The key header is present but unusable.
    #[error("the {header} header {reason}")]
    Invalid {
        /// The header.
        header: HeaderName,
        /// What is wrong.
        reason: &'static str,
    },
    /// The body is not JSON but a `json:` part needs it.
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// A `json:` pointer names nothing in the body.
    #[error("the request body has no value at {0}")]
    MissingPart(String),
    /// The JSON body names one key twice in an object: which value counts is ambiguous.
    #[error("the request body is ambiguous: the JSON key {0:?} appears twice in one object")]
    DuplicateJsonKey(String),
    /// The version of an ordered route's request is unusable (see [`order`]).
    #[error("the version {0}")]
    BadVersion(String),
    /// The body's content coding could not be undone (see [`coding`]).
    #[error(transparent)]
    Coding(#[from] coding::CodingError),
    /// A `grpc = true` route's request is not exactly one gRPC message.
    #[error(transparent)]
    Grpc(#[from] crate::protocol::grpc::frame::FrameError),
}

/// Longest client key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

impl KeyRule {
    /// Derives the key for a request. `Ok(None)` means an optional header is absent:
    /// the request is forwarded without dedupe.
    pub fn derive(&self, req: &RequestView<'_>) -> Result<Option<String>, KeyError> {
        match self {
            Self::Header {
                name,
                alias,
                required,
            } => {
                let name = match alias {
                    Some(alias) if !req.headers.contains_key(name) => alias,
                    _ => name,
                };
                let mut values = req.headers.get_all(name).iter();
                let Some(value) = values.next() else {
                    return if *required {
                        Err(KeyError::Missing {
                            header: name.clone(),
                        })
                    } else {
                        Ok(None)
                    };
                };
                let invalid = |reason| KeyError::Invalid {
                    header: name.clone(),
                    reason,
                };
                if values.next().is_some() {
                    return Err(invalid("must appear once"));
                }
                let unquoted;
                let mut bytes = value.as_bytes();
                if bytes.first() == Some(&b'"') {
                    unquoted = sf_string(bytes).ok_or_else(|| {
                        invalid("is not a valid Structured Field string (RFC 8941 §3.3.3)")
                    })?;
                    bytes = &unquoted;
                }
                if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
                    return Err(invalid("must be 1 to 255 characters long"));
                }
                if !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
                    return Err(invalid(
                        "must be visible ASCII characters only (no spaces or control characters)",
                    ));
                }
                // Checked above: every byte is visible ASCII, so this is valid UTF-8 (read
                // as such at once: the lossy reading walks it in chunks, at ten times the cost).
                Ok(Some(
                    std::str::from_utf8(bytes).unwrap_or_default().to_owned(),
                ))
            }
            Self::Fingerprint(parts) => {
                let digest = digest_parts(b"dedupe-gateway/fingerprint/v1", parts, req)?;
                Ok(Some(hex::encode(digest)))
            }
        }
    }
}

/// A header key as forwarded upstream in `Idempotency-Key`: bare, as most clients send it,
/// unless it starts with `"`. Then it is sent as an sf-string of itself: the key `"abc"`
/// (a client's `"\"abc\""`) forwarded bare would read as the key `abc` to an upstream
/// that parses sf-strings, as it does to the gateway.
pub fn forwarded_key(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.starts_with('"') {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len() + 4);
    out.push('"');
    for c in key.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    std::borrow::Cow::Owned(out)
}

/// The content of an RFC 8941 sf-string (`"..."` with `\"` and `\\` escapes), or `None`
/// when it is malformed. The IETF Idempotency-Key draft makes the header an sf-string,
/// while most clients send the bare key: both spell the same key. Parameters after the
/// string are refused rather than ignored, so no two spellings differ only in what the
/// gateway dropped.
fn sf_string(value: &[u8]) -> Option<Vec<u8>> {
    let inner = value.strip_prefix(b"\"")?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return None,
            },
            b'"' => return bytes.next().is_none().then_some(out),
            0x20..=0x7e => out.push(b),
            _ => return None,
        }
    }
    None
}

/// Hash of the scope parts that namespaces a key (tenant isolation): 32 hex characters,
/// or `-` for a route without scope.
pub fn scope_hash(parts: &[RequestPart], req: &RequestView<'_>) -> Result<String, KeyError> {
    if parts.is_empty() {
        return Ok("-".to_owned());
    }
    let digest = digest_parts(b"dedupe-gateway/scope/v1", parts, req)?;
    Ok(hex::encode(&digest[..16]))
}

/// What must be equal for a repeat of a key to be a replay rather than a 422.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchRule {
    /// The whole request: method, path, query, raw body (and `hash_headers`).
    Request,
    /// Only these parts (and `hash_headers`); empty: the key alone. JSON parts are compared
    /// canonically, so key order and whitespace never matter.
    Parts(Vec<RequestPart>),
}

/// The request hash under a route's [`MatchRule`]: what makes "the same request". Same key
/// with a different hash is a 422. Fails only on a `json:` part the body lacks.
pub fn request_hash(
    req: &RequestView<'_>,
    rule: &MatchRule,
    hash_headers: &[HeaderName],
) -> Result<RequestHash, KeyError> {
    match rule {
        MatchRule::Request => Ok(whole_request_hash(req, hash_headers)),
        MatchRule::Parts(parts) => {
            let parts: Vec<RequestPart> = parts
                .iter()
                .cloned()
                .chain(hash_headers.iter().cloned().map(RequestPart::Header))
                .collect();
            let digest = digest_parts(b"dedupe-gateway/match/v1", &parts, req)?;
            Ok(RequestHash::new(digest))
        }
    }
}

/// SHA-256 over method, path, query, body and `hash_headers`.
fn whole_request_hash(req: &RequestView<'_>, hash_headers: &[HeaderName]) -> RequestHash {
    let mut h = Sha256::new();
    h.update(b"dedupe-gateway/request/v1");
    field(&mut h, Some(req.method.as_str().as_bytes()));
    field(&mut h, Some(req.path.as_bytes()));
    field(&mut h, req.query.map(str::as_bytes));
    field(&mut h, Some(req.body));
    for name in hash_headers {
        field(&mut h, Some(name.as_str().as_bytes()));
        header_values(&mut h, req.headers, name);
    }
    RequestHash::new(h.finalize().into())
}

/// The store key of a record: `prefix:{tag}:route:scope:key`.
///
/// The `{tag}` is a Redis Cluster hash tag derived from the whole key, so a hostile client
/// cannot steer many keys into one slot by putting braces in its key, and the rest stays
/// readable for an operator in `redis-cli`.
pub fn store_key(prefix: &str, route: &str, scope: &str, key: &str) -> StoreKey {
    compose(prefix, route, scope, key, key)
}

/// The one spelling of a store key: `prefix:{tag}:route:scope:name`, where the Redis
/// Cluster hash tag is the slot hash of the route, the scope and `tagged_by` (the key
/// itself, or on an ordered route on a cluster, the entity whose records share a slot).
/// Every [`StoreKey`] the gateway makes is made here.
fn compose(prefix: &str, route: &str, scope: &str, tagged_by: &str, name: &str) -> StoreKey {
    let mut h = Sha256::new();
    h.update(b"dedupe-gateway/slot/v1");
    for part in [route, scope, tagged_by] {
        field(&mut h, Some(part.as_bytes()));
    }
    let digest = h.finalize();
    // Pushed piece by piece: `format!` cost more than the hash (measured in callgrind).
    let mut key = String::with_capacity(prefix.len() + route.len() + scope.len() + name.len() + 18);
    key.push_str(prefix);
    key.push_str(":{");
    let mut tag = [0u8; 12];
    if hex::encode_to_slice(&digest[..6], &mut tag).is_ok() {
        // Lower-case hex digits: ASCII.
        key.push_str(std::str::from_utf8(&tag).unwrap_or_default());
    }
    for part in ["}:", route, ":", scope, ":", name] {
        key.push_str(part);
    }
    StoreKey::from_raw(key)
}

fn digest_parts(
    domain: &[u8],
    parts: &[RequestPart],
    req: &RequestView<'_>,
) -> Result<[u8; 32], KeyError> {
    let mut json: Option<json::Value<'_>> = None;
    let mut h = Sha256::new();
    h.update(domain);
    for part in parts {
        h.update([part.tag()]);
        match part {
            RequestPart::Method => field(&mut h, Some(req.method.as_str().as_bytes())),
            RequestPart::Path => field(&mut h, Some(req.path.as_bytes())),
            RequestPart::Query => field(&mut h, req.query.map(str::as_bytes)),
            RequestPart::Body => field(&mut h, Some(req.body)),
            RequestPart::Header(name) => header_values(&mut h, req.headers, name),
            RequestPart::Json(pointer) => {
                if json.is_none() {
                    json = Some(json::parse(req.body).map_err(|e| match e {
                        json::JsonError::Syntax(e) => KeyError::MalformedJson(e),
                        json::JsonError::DuplicateKey(k) => {
                            KeyError::DuplicateJsonKey(k.chars().take(64).collect())
                        }
                    })?);
                }
                let value = json
                    .as_ref()
                    .and_then(|j| j.pointer(pointer))
                    .ok_or_else(|| KeyError::MissingPart(part.to_string()))?;
                // Object keys sorted, so key order on the wire does not matter; numbers as
                // written, so "42" and 42 stay distinct and so do integers past 64 bits.
                let mut canonical = Vec::new();
                value.canonical(&mut canonical);
                field(&mut h, Some(&canonical));
            }
        }
    }
    Ok(h.finalize().into())
}

fn header_values(h: &mut Sha256, headers: &HeaderMap, name: &HeaderName) {
    let values = headers.get_all(name);
    let count = values.iter().count() as u64;
    h.update(count.to_be_bytes());
    for v in values {
        field(h, Some(v.as_bytes()));
    }
}

/// Absent and empty are different; every present value carries its length.
fn field(h: &mut Sha256, value: Option<&[u8]>) {
    match value {
        None => h.update([0u8]),
        Some(v) => {
            h.update([1u8]);
            h.update((v.len() as u64).to_be_bytes());
            h.update(v);
        }
    }
}

#[cfg(test)]
mod tests;
