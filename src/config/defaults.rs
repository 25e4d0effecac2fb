//! Every default the configuration applies, named once. Validation reads these and nothing
//! else; a test in this crate holds the README's reference table to them.

use std::time::Duration;

use super::store::Backend;
use crate::route::{OnConflict, OnError};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// `server.upstream_timeout`.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
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
/// `server.shutdown_grace`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// `server.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// `server.max_concurrent_streams`.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;

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

/// `defaults.lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// `defaults.window`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// `defaults.on_conflict`.
pub const DEFAULT_ON_CONFLICT: OnConflict = OnConflict::Reject;
/// `defaults.conflict_wait`.
pub const DEFAULT_CONFLICT_WAIT: Duration = Duration::from_secs(10);
/// `defaults.max_cached_body`.
pub const DEFAULT_MAX_CACHED_BODY: u64 = MIB;

/// `routes[].key.required`.
pub const DEFAULT_KEY_REQUIRED: bool = true;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    /// The README's reference table: (field, default) for every row, backticks removed.
    fn readme_defaults() -> Vec<(String, String)> {
        let readme = include_str!("../../README.md");
        let table = readme
            .split("### Reference")
            .nth(1)
            .expect("README has no \"### Reference\" section");
        let mut rows = table.lines().skip_while(|l| !l.starts_with('|'));
        let header: Vec<&str> = cells(rows.next().expect("no table header"));
        let column = |name: &str| {
            header
                .iter()
                .position(|h| *h == name)
                .unwrap_or_else(|| panic!("no {name:?} column in {header:?}"))
        };
        let (field, default) = (column("field"), column("default"));
        rows.skip(1) // the |---| line
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let c = cells(l);
                (c[field].replace('`', ""), c[default].replace('`', ""))
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

    fn enum_value<T: serde::de::DeserializeOwned>(text: &str) -> T {
        toml::Value::String(text.to_owned()).try_into().unwrap()
    }

    /// Whether the README's `text` states the named constant's value; `None` for a field
    /// that has no named default.
    fn states_default(field: &str, text: &str) -> Option<bool> {
        let d = |v| parse::duration_allow_zero(field, text).ok() == Some(v);
        let s = |v| parse::size(field, text).ok() == Some(v);
        let n = |v: u64| text.replace(['_', ','], "").parse::<u64>().ok() == Some(v);
        Some(match field {
            "server.upstream_timeout" => d(DEFAULT_UPSTREAM_TIMEOUT),
            "server.connect_timeout" => d(DEFAULT_CONNECT_TIMEOUT),
            "server.max_body" => s(DEFAULT_MAX_BODY),
            "server.max_header_bytes" => s(DEFAULT_MAX_HEADER_BYTES),
            "server.header_read_timeout" => d(DEFAULT_HEADER_READ_TIMEOUT),
            "server.body_read_timeout" => d(DEFAULT_BODY_READ_TIMEOUT),
            "server.shutdown_grace" => d(DEFAULT_SHUTDOWN_GRACE),
            "server.max_connections" => n(DEFAULT_MAX_CONNECTIONS as u64),
            "server.max_concurrent_streams" => n(u64::from(DEFAULT_MAX_CONCURRENT_STREAMS)),
            "store.backend" => enum_value::<Backend>(text) == DEFAULT_BACKEND,
            "store.prefix" => text == DEFAULT_PREFIX,
            "store.timeout" => d(DEFAULT_STORE_TIMEOUT),
            "store.on_error" => enum_value::<OnError>(text) == DEFAULT_ON_ERROR,
            "store.max_records" => n(DEFAULT_MAX_RECORDS as u64),
            "defaults.lease" => d(DEFAULT_LEASE),
            "defaults.window" => d(DEFAULT_WINDOW),
            "defaults.on_conflict" => enum_value::<OnConflict>(text) == DEFAULT_ON_CONFLICT,
            "defaults.conflict_wait" => d(DEFAULT_CONFLICT_WAIT),
            "defaults.max_cached_body" => s(DEFAULT_MAX_CACHED_BODY),
            "routes[].key.required" => text.parse().ok() == Some(DEFAULT_KEY_REQUIRED),
            _ => return None,
        })
    }

    #[test]
    fn the_readme_states_every_default_as_the_constants_say() {
        let rows = readme_defaults();
        assert!(rows.len() > 20, "README table not found whole: {rows:?}");
        let mut checked = 0;
        for (field, text) in &rows {
            match states_default(field, text) {
                Some(ok) => {
                    assert!(
                        ok,
                        "README says {field} defaults to {text:?}; the constant differs"
                    );
                    checked += 1;
                }
                // A field without a named default says so in words, never with a value.
                None => assert!(
                    ["required", "—", "off", "none", "[]", "inherited"].contains(&text.as_str()),
                    "README gives {field} the default {text:?}, which no DEFAULT_* constant backs"
                ),
            }
        }
        assert_eq!(checked, 20, "every DEFAULT_* constant has its README row");
    }
}
