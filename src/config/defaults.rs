//! Every default the configuration applies, and every bound it enforces, named once.
//! Validation reads these and nothing else; a test in this crate holds the book's
//! reference table (docs/configuration.md) to them.
//!
//! The bounds are sanity limits, far above any useful setting: they exist so that no value
//! can overflow a deadline (`Instant + d`), a multiplication or an allocation at run time.

use std::time::Duration;

use super::store::Backend;
use crate::protocol::route::dialect::BuiltIn;
use crate::protocol::route::{MatchMode, Mode, OnConflict, OnError, OnUnknown, StatusSpec};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// `server.upstream_timeout`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// `server.upstream_http2`: gRPC calls go over h2c to an `http://` upstream.
pub const DEFAULT_UPSTREAM_HTTP2: super::server::UpstreamHttp2 = super::server::UpstreamHttp2::Grpc;
/// `server.underscores_in_headers`: request fields named with `_` are dropped.
pub const DEFAULT_UNDERSCORES_IN_HEADERS: bool = false;
/// `server.connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `server.max_body`.
pub const DEFAULT_MAX_BODY: u64 = MIB;
/// `server.max_header_bytes`.
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 64 * KIB;
/// `server.header_read_timeout`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `server.body_read_timeout`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// `server.write_timeout`.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// `server.shutdown_grace`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// `server.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// `server.max_concurrent_streams`.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// `server.max_concurrent_claims`: the ceiling the adaptive admission limit never passes.
/// A healthy store answers a claim in about a millisecond, so even 10,000 keyed requests a
/// second keep a few dozen claims waiting; the limit itself follows measured latency.
pub const DEFAULT_MAX_CONCURRENT_CLAIMS: usize = 1_000;
/// `server.max_buffered_bytes`: room for about a thousand keyed requests in flight on
/// routes that keep the default `max_cached_body` (1 MiB each) for their answers.
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 1024 * MIB;
/// `server.admission_timeout`: as long as the `Retry-After` a refusal asks for, so that a
/// request waits no longer than its retry would.
pub const DEFAULT_ADMISSION_TIMEOUT: Duration = Duration::from_secs(1);

/// `store.backend`.
pub const DEFAULT_BACKEND: Backend = Backend::Memory;
/// `store.prefix`.
pub const DEFAULT_PREFIX: &str = "dedupe";
/// `store.timeout`.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(250);
/// `store.on_error`.
pub const DEFAULT_ON_ERROR: OnError = OnError::FailClosed;
/// `store.max_records`.
pub const DEFAULT_MAX_RECORDS: usize = 1_000_000;

/// `store.max_bytes`.
pub const DEFAULT_MAX_BYTES: u64 = 256 * MIB;
/// `store.near_cache`: off; a replay then always reads Redis.
pub const DEFAULT_NEAR_CACHE: u64 = 0;
/// `store.tls_insecure`: Redis's certificate is verified.
pub const DEFAULT_TLS_INSECURE: bool = false;
/// `admin.max_connections`.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// `admin.allow_unauthenticated`: an admin listener off loopback needs a token.
pub const DEFAULT_ADMIN_ALLOW_UNAUTHENTICATED: bool = false;
/// `telemetry.service_name`: the `service.name` of the exported spans.
pub const DEFAULT_SERVICE_NAME: &str = "dedupe-gateway";
/// `telemetry.sample_ratio`: every trace that starts at the gateway is exported.
pub const DEFAULT_SAMPLE_RATIO: f64 = 1.0;

/// `defaults.lease`: short, because the winner renews it every third while its call runs;
/// it bounds how long a dead gateway's claim blocks its key.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// `defaults.window`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// `defaults.on_conflict`.
pub const DEFAULT_ON_CONFLICT: OnConflict = OnConflict::Reject;
/// `defaults.conflict_wait`.
pub const DEFAULT_CONFLICT_WAIT: Duration = Duration::from_secs(10);
/// `defaults.max_cached_body`.
pub const DEFAULT_MAX_CACHED_BODY: u64 = MIB;
/// `defaults.on_unknown`.
pub const DEFAULT_ON_UNKNOWN: OnUnknown = OnUnknown::Retry;
/// `defaults.retry_statuses`: the upstream says it did not act, or asks for a retry.
/// `unknown_statuses` is checked first, so 504 is not among these.
pub const DEFAULT_RETRY_STATUSES: &[StatusSpec] = &[
    StatusSpec::Code(408),
    StatusSpec::Code(409),
    StatusSpec::Code(425),
    StatusSpec::Code(429),
    StatusSpec::Class(5),
];
/// `defaults.unknown_statuses`: a gateway timeout behind the upstream may have acted.
pub const DEFAULT_UNKNOWN_STATUSES: &[StatusSpec] = &[StatusSpec::Code(504)];
/// `routes[].grpc`: a route is plain HTTP unless it says gRPC.
pub const DEFAULT_GRPC: bool = false;
/// `routes[].grpc_retry_codes`: UNAVAILABLE and RESOURCE_EXHAUSTED say the call did not
/// take effect.
pub const DEFAULT_GRPC_RETRY_CODES: &[StatusSpec] = &[StatusSpec::Code(14), StatusSpec::Code(8)];
/// `routes[].grpc_unknown_codes`: DEADLINE_EXCEEDED may have taken effect.
pub const DEFAULT_GRPC_UNKNOWN_CODES: &[StatusSpec] = &[StatusSpec::Code(4)];
/// `defaults.errors`: RFC 9457 problem+json.
pub const DEFAULT_ERRORS: BuiltIn = BuiltIn::Problem;
/// `defaults.errors.content_type`: a template's answers are JSON.
pub const DEFAULT_TEMPLATE_CONTENT_TYPE: &str = "application/json";

/// `routes[].mode`: dedupe enforced.
pub const DEFAULT_MODE: Mode = Mode::Enforce;
/// `routes[].key.required`.
pub const DEFAULT_KEY_REQUIRED: bool = true;
/// `routes[].match` on a route keyed by a header: the whole request, as the IETF draft
/// and Stripe do (a client reusing a key for a different request is told so).
pub const DEFAULT_MATCH_HEADER: MatchMode = MatchMode::Request;
/// `routes[].match` on a fingerprint route: the fingerprint's own parts, so a redelivery is
/// a replay whatever else in it changed.
pub const DEFAULT_MATCH_FINGERPRINT: MatchMode = MatchMode::Key;
/// `routes[].allow_extension_methods`.
pub const DEFAULT_ALLOW_EXTENSION_METHODS: bool = false;
/// `routes[].store_body`.
pub const DEFAULT_STORE_BODY: bool = true;
/// `routes[].advertise_expiry`.
pub const DEFAULT_ADVERTISE_EXPIRY: bool = true;
/// `routes[].order.compare`: versions are integers unless the route says otherwise.
pub const DEFAULT_ORDER_COMPARE: crate::protocol::key::order::Compare =
    crate::protocol::key::order::Compare::Integer;
/// `routes[].verify.tolerance`: Stripe's and Standard Webhooks' libraries' own default.
pub const DEFAULT_VERIFY_TOLERANCE: Duration = Duration::from_secs(300);

/// Upper bound of every timeout and wait on the request path (`upstream_timeout`,
/// `connect_timeout`, `header_read_timeout`, `body_read_timeout`, `shutdown_grace`,
/// `admission_timeout`, `conflict_wait`).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Upper bound of `store.timeout`: one store operation.
pub const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound of `lease`.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
/// Upper bound of `window`.
pub const MAX_WINDOW: Duration = Duration::from_secs(365 * 24 * 3600);
/// Upper bound of `max_body` and `max_cached_body`: both are held in memory whole.
pub const MAX_BODY_LIMIT: u64 = 64 * MIB;
/// Lower bound of `server.max_header_bytes`.
pub const MIN_HEADER_BYTES: u64 = 8 * KIB;
/// Upper bound of `server.max_header_bytes`.
pub const MAX_HEADER_BYTES: u64 = MIB;
/// Upper bound of `server.max_connections`.
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// Upper bound of `server.max_concurrent_streams`.
pub const MAX_CONCURRENT_STREAMS: u32 = 1_000;
/// Upper bound of `server.max_concurrent_claims`.
pub const MAX_CONCURRENT_CLAIMS: usize = 100_000;
/// Lower bound of `server.max_buffered_bytes`: one request of the largest `max_body`
/// beside one answer of the largest `max_cached_body` (see the routes' check).
pub const MIN_BUFFERED_BYTES: u64 = MIB;
/// Upper bound of `server.max_buffered_bytes`.
pub const MAX_BUFFERED_BYTES: u64 = 1024 * 1024 * MIB;
/// Upper bound of `server.workers`.
pub const MAX_WORKERS: usize = 1_024;
/// Lower bound of `store.max_bytes`.
pub const MIN_STORE_BYTES: u64 = 64 * KIB;
/// Upper bound of `store.max_bytes`.
pub const MAX_STORE_BYTES: u64 = 1024 * 1024 * MIB;
/// Upper bound of `store.near_cache`.
pub const MAX_NEAR_CACHE: u64 = 64 * 1024 * MIB;
/// Upper bound of `admin.max_connections`.
pub const MAX_ADMIN_CONNECTIONS: usize = 1024;
/// Upper bound of `routes[].verify.tolerance`.
pub const MAX_VERIFY_TOLERANCE: Duration = Duration::from_secs(24 * 3600);
/// Upper bound of `store.max_records`.
pub const MAX_RECORDS: usize = 10_000_000;
/// Upper bound of an `errors` template file, in bytes: it is held whole and filled for
/// every answer.
pub const MAX_TEMPLATE_BYTES: u64 = 64 * KIB;
/// Upper bound of `store.prefix`, in bytes: the whole store key must fit the stored
/// record's 16-bit key length, beside a route name and a client key.
pub const MAX_PREFIX_LEN: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    /// One row of the book's reference table (docs/configuration.md), backticks removed.
    struct Row {
        field: String,
        default: String,
        bound: String,
    }

    fn reference_rows() -> Vec<Row> {
        let book = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/configuration.md"
        ));
        let table = book
            .split("\n## Reference\n")
            .nth(1)
            .expect("docs/configuration.md has no \"## Reference\" section");
        let mut lines = table.lines().skip_while(|l| !l.starts_with('|'));
        let header: Vec<&str> = cells(lines.next().expect("no table header"));
        let column = |name: &str| {
            header
                .iter()
                .position(|h| *h == name)
                .unwrap_or_else(|| panic!("no {name:?} column in {header:?}"))
        };
        let (field, default, bound) = (column("field"), column("default"), column("bound"));
        lines
            .skip(1) // the |---| line
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let c = cells(l);
                let cell = |i: usize| c[i].replace('`', "");
                Row {
                    field: cell(field),
                    default: cell(default),
                    bound: cell(bound),
                }
            })
            .collect()
    }

    fn cells(line: &str) -> Vec<&str> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect()
    }

    fn statuses(text: &str) -> Option<Vec<StatusSpec>> {
        #[derive(serde::Deserialize)]
        struct V {
            v: Vec<StatusSpec>,
        }
        toml::from_str::<V>(&format!("v = {text}"))
            .ok()
            .map(|v| v.v)
    }

    fn grpc_codes(text: &str) -> Option<Vec<StatusSpec>> {
        #[derive(serde::Deserialize)]
        struct V {
            v: Vec<crate::protocol::grpc::status::Code>,
        }
        let v = toml::from_str::<V>(&format!("v = {text}")).ok()?;
        Some(v.v.iter().map(|c| StatusSpec::Code(c.0)).collect())
    }

    fn enum_value<T: serde::de::DeserializeOwned>(text: &str) -> T {
        toml::Value::String(text.to_owned()).try_into().unwrap()
    }

    fn duration(text: &str) -> Option<Duration> {
        parse::duration_allow_zero("reference", text, Duration::MAX).ok()
    }

    fn size(text: &str) -> Option<u64> {
        parse::size("reference", text, 0, u64::MAX).ok()
    }

    fn number(text: &str) -> Option<u64> {
        text.trim_end_matches(" bytes")
            .replace(['_', ','], "")
            .parse()
            .ok()
    }

    /// Whether the reference table's `text` states the named constant's value; `None` for a field
    /// that has no named default.
    fn states_default(field: &str, text: &str) -> Option<bool> {
        let d = |v| duration(text) == Some(v);
        let s = |v| size(text) == Some(v);
        let n = |v: u64| number(text) == Some(v);
        Some(match field {
            "server.upstream_timeout" => d(DEFAULT_UPSTREAM_TIMEOUT),
            "server.connect_timeout" => d(DEFAULT_CONNECT_TIMEOUT),
            "server.upstream_http2" => {
                enum_value::<crate::config::UpstreamHttp2>(text) == DEFAULT_UPSTREAM_HTTP2
            }
            "server.max_body" => s(DEFAULT_MAX_BODY),
            "server.max_header_bytes" => s(DEFAULT_MAX_HEADER_BYTES),
            "server.header_read_timeout" => d(DEFAULT_HEADER_READ_TIMEOUT),
            "server.body_read_timeout" => d(DEFAULT_BODY_READ_TIMEOUT),
            "server.shutdown_grace" => d(DEFAULT_SHUTDOWN_GRACE),
            "server.write_timeout" => d(DEFAULT_WRITE_TIMEOUT),
            "store.max_bytes" => s(DEFAULT_MAX_BYTES),
            "store.near_cache" => s(DEFAULT_NEAR_CACHE),
            "admin.max_connections" => n(DEFAULT_ADMIN_MAX_CONNECTIONS as u64),
            "server.max_connections" => n(DEFAULT_MAX_CONNECTIONS as u64),
            "server.max_concurrent_streams" => n(u64::from(DEFAULT_MAX_CONCURRENT_STREAMS)),
            "server.max_concurrent_claims" => n(DEFAULT_MAX_CONCURRENT_CLAIMS as u64),
            "server.max_buffered_bytes" => s(DEFAULT_MAX_BUFFERED_BYTES),
            "server.admission_timeout" => d(DEFAULT_ADMISSION_TIMEOUT),
            "store.backend" => enum_value::<Backend>(text) == DEFAULT_BACKEND,
            "store.prefix" => text == DEFAULT_PREFIX,
            "telemetry.service_name" => text == DEFAULT_SERVICE_NAME,
            "telemetry.sample_ratio" => text.parse().ok() == Some(DEFAULT_SAMPLE_RATIO),
            "store.timeout" => d(DEFAULT_STORE_TIMEOUT),
            "store.on_error" => enum_value::<OnError>(text) == DEFAULT_ON_ERROR,
            "store.max_records" => n(DEFAULT_MAX_RECORDS as u64),
            "store.tls_insecure" => text.parse().ok() == Some(DEFAULT_TLS_INSECURE),
            "server.underscores_in_headers" => {
                text.parse().ok() == Some(DEFAULT_UNDERSCORES_IN_HEADERS)
            }
            "defaults.lease" => d(DEFAULT_LEASE),
            "defaults.window" => d(DEFAULT_WINDOW),
            "defaults.on_conflict" => enum_value::<OnConflict>(text) == DEFAULT_ON_CONFLICT,
            "defaults.conflict_wait" => d(DEFAULT_CONFLICT_WAIT),
            "defaults.max_cached_body" => s(DEFAULT_MAX_CACHED_BODY),
            "defaults.on_unknown" => enum_value::<OnUnknown>(text) == DEFAULT_ON_UNKNOWN,
            "defaults.retry_statuses" => statuses(text).as_deref() == Some(DEFAULT_RETRY_STATUSES),
            "defaults.unknown_statuses" => {
                statuses(text).as_deref() == Some(DEFAULT_UNKNOWN_STATUSES)
            }
            "routes[].grpc" => text.parse().ok() == Some(DEFAULT_GRPC),
            "routes[].grpc_retry_codes" => {
                grpc_codes(text).as_deref() == Some(DEFAULT_GRPC_RETRY_CODES)
            }
            "routes[].grpc_unknown_codes" => {
                grpc_codes(text).as_deref() == Some(DEFAULT_GRPC_UNKNOWN_CODES)
            }
            "defaults.errors" => enum_value::<BuiltIn>(text) == DEFAULT_ERRORS,
            "defaults.errors.content_type" => text == DEFAULT_TEMPLATE_CONTENT_TYPE,
            "routes[].key.required" => text.parse().ok() == Some(DEFAULT_KEY_REQUIRED),
            "routes[].mode" => enum_value::<Mode>(text) == DEFAULT_MODE,
            "routes[].match" => match text.split_once(" / ") {
                Some((header, fingerprint)) => {
                    enum_value::<MatchMode>(header) == DEFAULT_MATCH_HEADER
                        && enum_value::<MatchMode>(fingerprint) == DEFAULT_MATCH_FINGERPRINT
                }
                None => false,
            },
            "routes[].allow_extension_methods" => {
                text.parse().ok() == Some(DEFAULT_ALLOW_EXTENSION_METHODS)
            }
            "routes[].store_body" => text.parse().ok() == Some(DEFAULT_STORE_BODY),
            "routes[].advertise_expiry" => text.parse().ok() == Some(DEFAULT_ADVERTISE_EXPIRY),
            "routes[].verify.tolerance" => d(DEFAULT_VERIFY_TOLERANCE),
            "admin.allow_unauthenticated" => {
                text.parse().ok() == Some(DEFAULT_ADMIN_ALLOW_UNAUTHENTICATED)
            }
            "routes[].order.compare" => {
                enum_value::<crate::protocol::key::order::Compare>(text) == DEFAULT_ORDER_COMPARE
            }
            _ => return None,
        })
    }

    /// Whether the reference table's bound (`≤ MAX` or `MIN to MAX`) states the named constants;
    /// `None` for a field without a bound.
    fn states_bound(field: &str, text: &str) -> Option<bool> {
        let (min, max) = match text.split_once(" to ") {
            Some((min, max)) => (Some(min), max),
            None => (None, text.strip_prefix("≤ ").unwrap_or(text)),
        };
        let d = |v| min.is_none() && duration(max) == Some(v);
        let s = |lo: u64, hi| min.map_or(lo == 0, |m| size(m) == Some(lo)) && size(max) == Some(hi);
        let n = |hi: u64| min.and_then(number) == Some(1) && number(max) == Some(hi);
        Some(match field {
            "server.upstream_timeout"
            | "server.connect_timeout"
            | "server.header_read_timeout"
            | "server.body_read_timeout"
            | "server.shutdown_grace"
            | "server.admission_timeout"
            | "server.write_timeout"
            | "defaults.conflict_wait" => d(MAX_TIMEOUT),
            "store.timeout" => d(MAX_STORE_TIMEOUT),
            "defaults.lease" => d(MAX_LEASE),
            "defaults.window" => d(MAX_WINDOW),
            "routes[].verify.tolerance" => d(MAX_VERIFY_TOLERANCE),
            "server.max_body" | "defaults.max_cached_body" => s(0, MAX_BODY_LIMIT),
            "server.max_header_bytes" => s(MIN_HEADER_BYTES, MAX_HEADER_BYTES),
            "server.max_connections" => n(MAX_CONNECTIONS as u64),
            "server.max_concurrent_streams" => n(u64::from(MAX_CONCURRENT_STREAMS)),
            "server.max_concurrent_claims" => n(MAX_CONCURRENT_CLAIMS as u64),
            "server.max_buffered_bytes" => s(MIN_BUFFERED_BYTES, MAX_BUFFERED_BYTES),
            "server.workers" => n(MAX_WORKERS as u64),
            "store.max_records" => n(MAX_RECORDS as u64),
            "store.max_bytes" => s(MIN_STORE_BYTES, MAX_STORE_BYTES),
            "store.near_cache" => s(0, MAX_NEAR_CACHE),
            "admin.max_connections" => n(MAX_ADMIN_CONNECTIONS as u64),
            "store.prefix" => min.is_none() && number(max) == Some(MAX_PREFIX_LEN as u64),
            _ => return None,
        })
    }

    #[test]
    fn the_book_states_every_default_and_bound_as_the_constants_say() {
        let rows = reference_rows();
        assert!(rows.len() > 20, "reference table not found whole");
        let (mut defaults, mut bounds) = (0, 0);
        for Row {
            field,
            default,
            bound,
        } in &rows
        {
            match states_default(field, default) {
                Some(ok) => {
                    assert!(
                        ok,
                        "docs/configuration.md: {field} defaults to {default:?}; the constant differs"
                    );
                    defaults += 1;
                }
                // A field without a named default says so in words, never with a value.
                None => assert!(
                    ["required", "—", "off", "none", "[]", "inherited"].contains(&default.as_str()),
                    "docs/configuration.md gives {field} the default {default:?}, which no constant backs"
                ),
            }
            match states_bound(field, bound) {
                Some(ok) => {
                    assert!(
                        ok,
                        "docs/configuration.md: {field} is bounded by {bound:?}; the constants differ"
                    );
                    bounds += 1;
                }
                None => assert!(
                    bound.is_empty(),
                    "docs/configuration.md bounds {field} by {bound:?}, which no constant backs"
                ),
            }
        }
        let constants = include_str!("defaults.rs")
            .lines()
            .filter(|l| l.starts_with("pub const DEFAULT_"))
            .count()
            // `match` states both of its defaults in one row.
            - 1;
        assert_eq!(
            defaults, constants,
            "every DEFAULT_* constant has its row in docs/configuration.md"
        );
        assert_eq!(
            bounds, 25,
            "every bounded field has its bound in docs/configuration.md"
        );
    }
}
