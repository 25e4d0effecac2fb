//! Routes and route matching: which requests are deduped, and with which rule.
//! Pure: no I/O, unit-tested here.

use std::sync::Arc;
use std::time::Duration;

use globset::{Glob, GlobBuilder, GlobMatcher};
use http::header::HeaderName;
use http::{HeaderMap, Method};
use serde::Deserialize;

use crate::protocol::key::{KeyRule, MatchRule, RequestPart};

pub mod dialect;
mod foreign;
mod keyed;
pub mod preset;

pub use self::dialect::{Dialect, Envelope};
pub use self::keyed::{Derived, Keyed, Named, Namespace, Skip, Verdict};
pub use self::preset::Preset;

/// What a deduped request does when the store fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"fail-closed\" or \"fail-open\""
)]
pub enum OnError {
    /// Answer 503 and forward nothing.
    FailClosed,
    /// Forward without dedupe (logged and counted).
    FailOpen,
}

/// What an in-flight duplicate gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"reject\", \"wait\" or \"join\""
)]
pub enum OnConflict {
    /// 409 with `Retry-After`.
    Reject,
    /// Hold the duplicate (up to `conflict_wait`) until the first request finishes, then
    /// answer it with the stored response; 409 if the wait runs out.
    Wait,
    /// A duplicate that meets the first request's answer streaming on the same gateway
    /// receives the bytes so far and then the rest as they arrive, from the one upstream
    /// call, marked as a replay; otherwise, as `Wait`.
    Join,
}

impl OnConflict {
    /// Whether a duplicate is held until the first request finishes (`wait`, and `join`
    /// where there is nothing to join).
    pub fn waits(self) -> bool {
        matches!(self, OnConflict::Wait | OnConflict::Join)
    }
}

/// What becomes of a claim whose outcome is unknown (its owner died, its upstream timed
/// out or broke the connection, shutdown cut it off) once its lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", expecting = "\"retry\" or \"hold\"")]
pub enum OnUnknown {
    /// The next retry takes it over under a higher fence and executes again (logged at
    /// warn with both fences).
    Retry,
    /// Never taken over automatically: duplicates get 409 `outcome-unknown` until an
    /// operator resolves the key (admin `POST /keys/.../resolve`).
    Hold,
}

/// How a route applies dedupe: `mode = "enforce" | "shadow" | "off"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"enforce\", \"shadow\" or \"off\""
)]
pub enum Mode {
    /// Dedupe: duplicates are replayed, refused (409, 422) or held.
    Enforce,
    /// Claim and record exactly as `enforce` does, but forward every request and never
    /// answer from the store; what `enforce` would have done is logged and counted. For
    /// measuring duplicates in production before switching dedupe on.
    Shadow,
    /// No dedupe: the route's requests pass through, counted under the route's name.
    Off,
}

impl Mode {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }
}

/// One entry of a status list: an exact status, or a whole class (`"5xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "StatusEntry")]
pub enum StatusSpec {
    /// One status code.
    Code(u16),
    /// Every status of a class: `5` for `"5xx"`.
    Class(u16),
}

/// A status list entry as written: a number or a `"Nxx"` string.
#[derive(Deserialize)]
#[serde(untagged)]
enum StatusEntry {
    Code(i64),
    Class(String),
}

impl TryFrom<StatusEntry> for StatusSpec {
    type Error = String;

    fn try_from(entry: StatusEntry) -> Result<Self, String> {
        match entry {
            StatusEntry::Code(c) if (100..=599).contains(&c) => Ok(StatusSpec::Code(c as u16)),
            StatusEntry::Code(c) => Err(format!("{c} is not an HTTP status (100 to 599)")),
            StatusEntry::Class(s) => match s.as_bytes() {
                [d @ b'1'..=b'5', b'x', b'x'] => Ok(StatusSpec::Class(u16::from(d - b'0'))),
                _ => Err(format!(
                    "{s:?} is not a status class: write \"1xx\" to \"5xx\", or a number"
                )),
            },
        }
    }
}

impl StatusSpec {
    /// Whether `status` is this code or in this class.
    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusSpec::Code(c) => c == status,
            StatusSpec::Class(c) => status / 100 == c,
        }
    }
}

/// How a route reads its upstream's status, for the winner's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPolicy {
    /// The upstream did not act: release the key, the next retry executes.
    pub retry: Vec<StatusSpec>,
    /// The upstream may or may not have acted (a gateway timeout behind it): keep the
    /// claim, as for a timeout. Checked before `retry`, so `"5xx"` there excludes these.
    pub unknown: Vec<StatusSpec>,
}

/// What an upstream status means for the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMeaning {
    /// Final: store it and replay it.
    Final,
    /// Not executed: release the key.
    Retry,
    /// Unknown: keep the claim.
    Unknown,
}

impl StatusPolicy {
    /// What `status` means under this policy: unknown first, then retry, else final.
    pub fn classify(&self, status: u16) -> StatusMeaning {
        if self.unknown.iter().any(|s| s.matches(status)) {
            StatusMeaning::Unknown
        } else if self.retry.iter().any(|s| s.matches(status)) {
            StatusMeaning::Retry
        } else {
            StatusMeaning::Final
        }
    }
}

/// `match = "request" | "key"` as written; a list of parts is the third form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", expecting = "\"request\" or \"key\"")]
pub enum MatchMode {
    /// The whole request must match.
    Request,
    /// The key's own parts: the fingerprint's parts, or a header key alone.
    Key,
}

/// A path pattern, matched against the normalised path in its match form
/// ([`crate::protocol::path::normalise`], [`crate::protocol::path::match_form`]):
/// an exact path; a collection `P/**`, which matches `P` itself and everything under
/// `P/`; or a glob where `*` matches any run of characters (slashes included), so
/// `/v1/payments/*` matches everything under `/v1/payments/` but not `/v1/payments`.
#[derive(Debug, Clone)]
pub struct PathPattern {
    source: String,
    shape: Shape,
}

#[derive(Debug, Clone)]
enum Shape {
    Exact,
    /// `base/**` with a literal base: `base` and anything under `base/`.
    Collection(String),
    /// A literal prefix and one `*` at the end: every path that starts with the prefix, as
    /// the glob would match it (`*` takes any run, slashes included), without a regex.
    Prefix(String),
    /// Anything else with a glob character; for `base/**` with a glob base, the base's own
    /// matcher goes with it.
    Glob(GlobMatcher, Option<GlobMatcher>),
}

const GLOB_CHARS: [char; 4] = ['*', '?', '[', '{'];

fn glob(pattern: &str) -> Result<GlobMatcher, String> {
    let glob: Glob = GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .map_err(|e| format!("{pattern:?} is not a valid path pattern: {e}"))?;
    Ok(glob.compile_matcher())
}

impl PathPattern {
    /// Compiles a pattern; it must start with `/` and be in normal form (requests are
    /// matched after normalisation, so `/v1//x` or `/v1/./x` would never match), and in
    /// this gateway's syntax: a path parameter (`{id}`, `:id`) or a regular expression
    /// (`.*`) would be a valid glob that matches none of the paths it means.
    pub fn new(pattern: &str) -> Result<Self, String> {
        if let Some(refusal) = foreign::refusal(pattern) {
            return Err(refusal);
        }
        if !pattern.starts_with('/') {
            return Err(format!("{pattern:?} must start with '/'"));
        }
        // Requests are matched in their match form: raw UTF-8 in a pattern is written
        // percent-encoded, as requests are matched.
        match crate::protocol::path::normalise(pattern).map(|n| crate::protocol::path::match_form(&n).into_owned()) {
            Ok(normal) if normal == pattern => {}
            Ok(normal) => {
                return Err(format!(
                    "{pattern:?} is not a normalised path, so no request would match it; write {normal:?}"
                ))
            }
            Err(e) => return Err(format!("{pattern:?} can never match a request: {e}")),
        }
        let shape = match pattern.strip_suffix("/**") {
            Some(base) if !base.contains(GLOB_CHARS) => Shape::Collection(base.to_owned()),
            Some(base) => Shape::Glob(glob(&format!("{base}/*"))?, Some(glob(base)?)),
            None => match pattern.strip_suffix('*') {
                // A backslash escapes in a glob: such a prefix is left to the glob.
                Some(prefix) if !prefix.contains(GLOB_CHARS) && !prefix.contains('\\') => {
                    glob(pattern)?;
                    Shape::Prefix(prefix.to_owned())
                }
                _ if pattern.contains(GLOB_CHARS) => Shape::Glob(glob(pattern)?, None),
                _ => Shape::Exact,
            },
        };
        Ok(Self {
            source: pattern.to_owned(),
            shape,
        })
    }

    /// Whether a normalised request path (without query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match &self.shape {
            Shape::Exact => self.source == path,
            Shape::Collection(base) => {
                path == base
                    || path
                        .strip_prefix(base.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            Shape::Prefix(prefix) => path.starts_with(prefix.as_str()),
            Shape::Glob(m, base) => {
                m.is_match(path) || base.as_ref().is_some_and(|b| b.is_match(path))
            }
        }
    }

    /// Whether every path `later` matches is matched by this pattern too, as far as can be
    /// told without enumerating paths: equal patterns, an exact path this one matches, and
    /// a pattern whose literal start lies under this one's catch-all prefix (`P/**` or a
    /// pattern ending in its only `*`). `false` means "not known to cover".
    pub fn covers(&self, later: &PathPattern) -> bool {
        if self.source == later.source {
            return true;
        }
        let literal = match &later.shape {
            Shape::Exact => return self.matches(&later.source),
            Shape::Collection(base) => base.as_str(),
            Shape::Prefix(prefix) => prefix.as_str(),
            Shape::Glob(..) => later.source.split(GLOB_CHARS).next().unwrap_or_default(),
        };
        let catch_all = match &self.shape {
            Shape::Exact => return false,
            Shape::Collection(base) => format!("{base}/"),
            Shape::Prefix(prefix) => prefix.clone(),
            Shape::Glob(..) => match self.source.strip_suffix('*') {
                Some(prefix) if !prefix.contains(GLOB_CHARS) => prefix.to_owned(),
                _ => return false,
            },
        };
        literal.starts_with(&catch_all)
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// A header never stored for replay: a name, or a prefix (`x-ratelimit-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderPattern {
    /// This header.
    Name(HeaderName),
    /// Every header whose name starts with this (lower-case) prefix.
    Prefix(String),
}

impl HeaderPattern {
    /// Parses `x-request-id` or `x-ratelimit-*`; a bare `*` is refused (it would drop
    /// `Content-Type` and every other header a replay needs).
    pub fn new(pattern: &str) -> Result<Self, String> {
        match pattern.strip_suffix('*') {
            Some("") => Err("\"*\" alone would drop every header; name them, or a prefix like \"x-ratelimit-*\"".to_owned()),
            Some(prefix) => HeaderName::from_bytes(prefix.as_bytes())
                .map(|n| Self::Prefix(n.as_str().to_owned()))
                .map_err(|_| format!("{pattern:?} is not a header name or a prefix ending in '*'")),
            None => HeaderName::from_bytes(pattern.as_bytes())
                .map(Self::Name)
                .map_err(|_| format!("{pattern:?} is not a header name or a prefix ending in '*'")),
        }
    }

    /// Whether the field `name` (in lower case, as a `HeaderName` is) is one of these.
    fn matches(&self, name: &[u8]) -> bool {
        match self {
            Self::Name(n) => n.as_str().as_bytes() == name,
            Self::Prefix(p) => name.starts_with(p.as_bytes()),
        }
    }
}

/// Whether a replay keeps the header `name`: never `Set-Cookie` (one client's cookie is no
/// other's), nor one of the route's `replay_drop_headers` (`patterns`). `name` is in lower
/// case, as a `HeaderName` is.
pub fn replay_keeps(patterns: &[HeaderPattern], name: &[u8]) -> bool {
    name != b"set-cookie" && !patterns.iter().any(|p| p.matches(name))
}

/// Removes every header `patterns` name from `headers`.
pub fn drop_headers(patterns: &[HeaderPattern], headers: &mut HeaderMap) {
    if patterns.is_empty() {
        return;
    }
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|n| patterns.iter().any(|p| p.matches(n.as_str().as_bytes())))
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// One validated `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct Route {
    /// Unique name; part of every stored key and every metric label.
    pub name: Arc<str>,
    /// Methods deduped here; other methods on the path pass through.
    pub methods: Vec<Method>,
    /// Whether dedupe is enforced, only measured (shadow), or off.
    pub mode: Mode,
    /// The webhook preset the key, scope, `match` and window came from (where the route
    /// did not set them itself).
    pub preset: Option<Preset>,
    /// Which paths.
    pub path: PathPattern,
    /// Where the idempotency key comes from.
    pub key: KeyRule,
    /// Request parts whose hash namespaces the key (tenant isolation).
    pub scope: Vec<RequestPart>,
    /// What must be equal for a repeat to be a replay rather than a 422.
    pub must_match: MatchRule,
    /// Extra headers folded into the request hash.
    pub hash_headers: Vec<HeaderName>,
    /// How long an in-flight claim is honoured.
    pub lease: Duration,
    /// How long a completed key is remembered.
    pub window: Duration,
    /// Largest upstream body stored for replay.
    pub max_cached_body: u64,
    /// What an in-flight duplicate gets.
    pub on_conflict: OnConflict,
    /// With [`OnConflict::Wait`]: the longest a duplicate is held.
    pub conflict_wait: Duration,
    /// What happens when the store fails.
    pub on_error: OnError,
    /// What becomes of a claim whose outcome is unknown.
    pub on_unknown: OnUnknown,
    /// Which upstream statuses release the key, and which leave the outcome unknown.
    pub statuses: StatusPolicy,
    /// `grpc = true`: gRPC methods. The request is one length-prefixed message (hashed
    /// after its `grpc-encoding`), `grpc-status` decides the claim under `grpc_codes`, and
    /// the gateway's own answers are gRPC statuses.
    pub grpc: bool,
    /// Which gRPC status codes release the key, and which leave the outcome unknown.
    pub grpc_codes: StatusPolicy,
    /// Whether the upstream's body and headers are stored for replay; without them a
    /// duplicate gets the original status and a `response-not-stored` problem.
    pub store_body: bool,
    /// Headers never stored for replay, beside the hop-by-hop ones and `Set-Cookie`.
    pub replay_drop_headers: Vec<HeaderPattern>,
    /// Whether won and replayed answers carry `Idempotency-Expires`.
    pub advertise_expiry: bool,
    /// Out-of-order versions: the entity and version a request writes; a version not
    /// greater than the highest completed is stale and never forwarded.
    pub order: Option<crate::protocol::key::order::OrderRule>,
    /// Webhook signatures checked on the raw body before the claim: a delivery that does
    /// not verify is answered 401 and never claimed, stored or forwarded.
    pub verify: Option<crate::protocol::verify::Verifier>,
    /// How the gateway's own answers on this route are written.
    pub errors: Dialect,
}

/// The index of the first route (in file order) whose path matches, if its methods include
/// the request's. A request matching a route's path but not its methods matches nothing:
/// it passes through untouched rather than falling to a later route.
pub fn find(routes: &[Route], method: &Method, path: &str) -> Option<usize> {
    routes
        .iter()
        .position(|r| r.path.matches(path))
        .filter(|&i| routes[i].methods.contains(method))
}

#[cfg(test)]
mod tests;
