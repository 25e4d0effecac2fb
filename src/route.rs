//! Routes and route matching: which requests are deduped, and with which rule.
//! Pure: no I/O, unit-tested here.

use std::sync::Arc;
use std::time::Duration;

use globset::{Glob, GlobBuilder, GlobMatcher};
use http::header::HeaderName;
use http::Method;
use serde::Deserialize;

use crate::key::{KeyRule, MatchRule, RequestPart};

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
#[serde(rename_all = "kebab-case", expecting = "\"reject\" or \"wait\"")]
pub enum OnConflict {
    /// 409 with `Retry-After`.
    Reject,
    /// Hold the duplicate (up to `conflict_wait`) until the first request finishes, then
    /// answer it with the stored response; 409 if the wait runs out.
    Wait,
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

/// A path pattern, matched against the normalised path ([`crate::path::normalise`]):
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
    /// matched after normalisation, so `/v1//x` or `/v1/./x` would never match).
    pub fn new(pattern: &str) -> Result<Self, String> {
        if !pattern.starts_with('/') {
            return Err(format!("{pattern:?} must start with '/'"));
        }
        match crate::path::normalise(pattern) {
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
            None if pattern.contains(GLOB_CHARS) => Shape::Glob(glob(pattern)?, None),
            None => Shape::Exact,
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
            Shape::Glob(..) => later.source.split(GLOB_CHARS).next().unwrap_or_default(),
        };
        let catch_all = match &self.shape {
            Shape::Exact => return false,
            Shape::Collection(base) => format!("{base}/"),
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

/// One validated `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct Route {
    /// Unique name; part of every stored key and every metric label.
    pub name: Arc<str>,
    /// Methods deduped here; other methods on the path pass through.
    pub methods: Vec<Method>,
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
mod tests {
    use super::*;
    use crate::config::Config;

    fn routes() -> Vec<Route> {
        Config::from_toml(include_str!("../config/example.toml"))
            .unwrap()
            .routes
    }

    fn name(method: Method, path: &str) -> Option<String> {
        let routes = routes();
        find(&routes, &method, path).map(|i| routes[i].name.to_string())
    }

    #[test]
    fn exact_and_prefix_paths() {
        assert_eq!(
            name(Method::POST, "/v1/payments/42").as_deref(),
            Some("payments")
        );
        assert_eq!(
            name(Method::POST, "/v1/payments/42/refunds").as_deref(),
            Some("payments")
        );
        assert_eq!(
            name(Method::POST, "/v1/payments").as_deref(),
            Some("payments"),
            "a collection pattern covers the collection itself"
        );
        assert_eq!(name(Method::POST, "/v1/payments/"), Some("payments".into()));
        assert_eq!(name(Method::POST, "/v1/paymentsX"), None);
        assert_eq!(
            name(Method::POST, "/webhooks/shopify").as_deref(),
            Some("shopify-orders")
        );
        assert_eq!(
            name(Method::POST, "/webhooks/stripe").as_deref(),
            Some("generic-webhooks")
        );
        assert_eq!(name(Method::POST, "/other"), None);
    }

    #[test]
    fn first_match_wins_and_methods_filter_it() {
        // `/webhooks/shopify` matches shopify-orders first; a GET there matches nothing
        // rather than falling through to generic-webhooks.
        assert_eq!(name(Method::GET, "/webhooks/shopify"), None);
        assert_eq!(
            name(Method::PATCH, "/v1/payments/1").as_deref(),
            Some("payments")
        );
        assert_eq!(name(Method::GET, "/v1/payments/1"), None);
    }

    #[test]
    fn patterns_must_be_absolute_valid_and_normalised() {
        assert!(PathPattern::new("v1").is_err());
        assert!(PathPattern::new("/a/[").is_err());
        for unnormal in ["/v1//payments/*", "/v1/./x", "/v1/%70ayments", "/a/../b"] {
            let e = PathPattern::new(unnormal).unwrap_err();
            assert!(e.contains("normalised"), "{e}");
        }
        assert!(PathPattern::new("/a/%2F").is_err());
        let p = PathPattern::new("/a/*/b").unwrap();
        assert!(p.matches("/a/x/b"));
        assert!(!p.matches("/a/x/c"));
    }

    #[test]
    fn collections_match_themselves_and_everything_below() {
        let p = PathPattern::new("/v1/payments/**").unwrap();
        for yes in [
            "/v1/payments",
            "/v1/payments/",
            "/v1/payments/x",
            "/v1/payments/x/y",
        ] {
            assert!(p.matches(yes), "{yes}");
        }
        for no in ["/v1/paymentsX", "/v1/payment", "/v1", "/v2/payments"] {
            assert!(!p.matches(no), "{no}");
        }
        let all = PathPattern::new("/**").unwrap();
        assert!(all.matches("/") && all.matches("/a/b"));
        let g = PathPattern::new("/v*/payments/**").unwrap();
        assert!(g.matches("/v1/payments") && g.matches("/v2/payments/x"));
        assert!(!g.matches("/v1/paymentsX"));
    }

    #[test]
    fn coverage_between_patterns() {
        let p = |s: &str| PathPattern::new(s).unwrap();
        assert!(p("/webhooks/*").covers(&p("/webhooks/shopify")));
        assert!(p("/webhooks/*").covers(&p("/webhooks/shopify/**")));
        assert!(p("/webhooks/**").covers(&p("/webhooks")));
        assert!(p("/webhooks/**").covers(&p("/webhooks/a*")));
        assert!(p("/**").covers(&p("/anything/**")));
        assert!(p("/a").covers(&p("/a")));
        assert!(!p("/webhooks/shopify").covers(&p("/webhooks/*")));
        assert!(
            !p("/webhooks/*").covers(&p("/webhooks/**")),
            "misses /webhooks"
        );
        assert!(!p("/webhooks/**").covers(&p("/webhooksX")));
        assert!(
            !p("/v1/*/x").covers(&p("/v1/a/**")),
            "unknown is not covered"
        );
    }
}
