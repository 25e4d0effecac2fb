//! `[store]`: which backend, its URLs and limits.

use std::time::Duration;

use serde::Deserialize;

use super::defaults::{
    DEFAULT_BACKEND, DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, DEFAULT_PREFIX, DEFAULT_STORE_TIMEOUT,
    MAX_PREFIX_LEN, MAX_RECORDS, MAX_STORE_BYTES, MAX_STORE_TIMEOUT, MIN_STORE_BYTES,
};
use super::file::FileStore;
use super::{invalid, parse, ConfigError};
use crate::seal::{self, Keyring, KEY_LEN};

/// The store backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"memory\", \"redis\" or \"redis-cluster\""
)]
pub enum Backend {
    /// In-process store: protects one gateway process.
    Memory,
    /// One Redis server (or a replicated primary).
    Redis,
    /// A Redis Cluster.
    RedisCluster,
}

impl Backend {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis-cluster",
        }
    }
}

/// Validated `[store]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Which backend.
    pub backend: Backend,
    /// Namespace of every stored key.
    pub prefix: String,
    /// Redis URLs: one for `redis`, the seeds for `redis-cluster`, none for memory.
    pub urls: Vec<String>,
    /// Deadline of one store operation.
    pub timeout: Duration,
    /// Memory backend capacity.
    pub max_records: usize,
    /// Memory backend: most bytes of records held (keys, responses, a fixed overhead each).
    pub max_bytes: u64,
    /// The keys of `encryption_keys`, read and checked (empty: records in clear).
    pub encryption: Keyring,
}

pub(super) fn validate(
    s: &FileStore,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<StoreConfig, ConfigError> {
    let prefix = s.prefix.as_deref().unwrap_or(DEFAULT_PREFIX).to_owned();
    if prefix.is_empty()
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(invalid(
            "store.prefix",
            "must be non-empty letters, digits, '-', '_' or '.'",
        ));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(invalid(
            "store.prefix",
            format!("is {} bytes long: at most {MAX_PREFIX_LEN}", prefix.len()),
        ));
    }
    let timeout = parse::opt_duration(
        "store.timeout",
        s.timeout.as_deref(),
        DEFAULT_STORE_TIMEOUT,
        MAX_STORE_TIMEOUT,
    )?;
    let check_url = |at: &str, url: &str| -> Result<String, ConfigError> {
        if url.starts_with("rediss://") {
            return Err(invalid(
                at,
                "TLS (rediss://) is not built in: reach Redis over a private network or a TLS sidecar",
            ));
        }
        if !(url.starts_with("redis://") || url.starts_with("unix://")) {
            return Err(invalid(at, format!("{url:?} is not a redis:// URL")));
        }
        // The redis crate's own parser: a URL it cannot use fails here, not at start-up.
        redis::Client::open(url)
            .map(|_| url.to_owned())
            .map_err(|e| invalid(at, format!("{url:?}: {e}")))
    };
    let backend = s.backend.unwrap_or(DEFAULT_BACKEND);
    let urls = match backend {
        Backend::Memory => {
            if s.url.is_some() || s.urls.is_some() {
                return Err(invalid(
                    "store.url",
                    "set only with backend = \"redis\" or \"redis-cluster\"",
                ));
            }
            Vec::new()
        }
        Backend::Redis => {
            if s.urls.is_some() {
                return Err(invalid(
                    "store.urls",
                    "is for backend = \"redis-cluster\"; use store.url",
                ));
            }
            let url = s
                .url
                .as_deref()
                .ok_or_else(|| invalid("store.url", "required with backend = \"redis\""))?;
            vec![check_url("store.url", url)?]
        }
        Backend::RedisCluster => {
            if s.url.is_some() {
                return Err(invalid(
                    "store.url",
                    "is for backend = \"redis\"; use store.urls",
                ));
            }
            let urls = s.urls.as_deref().unwrap_or_default();
            if urls.is_empty() {
                return Err(invalid(
                    "store.urls",
                    "at least one seed URL is required with backend = \"redis-cluster\"",
                ));
            }
            urls.iter()
                .map(|u| check_url("store.urls", u))
                .collect::<Result<_, _>>()?
        }
    };
    if s.max_records.is_some() && backend != Backend::Memory {
        return Err(invalid(
            "store.max_records",
            "applies to backend = \"memory\" only",
        ));
    }
    let max_records = parse::count(
        "store.max_records",
        s.max_records,
        DEFAULT_MAX_RECORDS,
        MAX_RECORDS,
    )?;
    if s.max_bytes.is_some() && backend != Backend::Memory {
        return Err(invalid(
            "store.max_bytes",
            "applies to backend = \"memory\" only",
        ));
    }
    let max_bytes = parse::opt_size(
        "store.max_bytes",
        s.max_bytes.as_deref(),
        DEFAULT_MAX_BYTES,
        MIN_STORE_BYTES,
        MAX_STORE_BYTES,
    )?;
    let encryption = keyring(s.encryption_keys.as_deref().unwrap_or_default(), env)?;
    Ok(StoreConfig {
        backend,
        prefix,
        urls,
        timeout,
        max_records,
        max_bytes,
        encryption,
    })
}

/// Reads and checks every `encryption_keys` entry. Errors name the entry and its source,
/// never a byte of the material.
fn keyring(
    sources: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Keyring, ConfigError> {
    let at = |i: usize| format!("store.encryption_keys[{i}]");
    let mut keys: Vec<[u8; KEY_LEN]> = Vec::with_capacity(sources.len());
    for (i, source) in sources.iter().enumerate() {
        let (material, origin) = if let Some(path) = source.strip_prefix("file:") {
            let bytes = std::fs::read(path).map_err(|e| {
                invalid(
                    at(i),
                    format!("cannot read the key file {path:?}: {}", e.kind()),
                )
            })?;
            (bytes, format!("the key file {path:?}"))
        } else if let Some(name) = source.strip_prefix("env:") {
            let value = env(name).ok_or_else(|| {
                invalid(at(i), format!("the environment variable {name} is not set"))
            })?;
            // Raw bytes cannot travel in a variable: there, a key is 64 hex digits.
            if value.len() == KEY_LEN {
                return Err(invalid(
                    at(i),
                    format!("the environment variable {name} must hold 64 hex digits"),
                ));
            }
            (
                value.into_bytes(),
                format!("the environment variable {name}"),
            )
        } else {
            return Err(invalid(
                at(i),
                "must be \"file:/path/to/key\" or \"env:VARIABLE\"",
            ));
        };
        let key =
            seal::parse_key(&material).map_err(|e| invalid(at(i), format!("{origin} {e}")))?;
        keys.push(key);
    }
    Keyring::new(&keys).map_err(|(i, e)| invalid(at(i), e.to_string()))
}
