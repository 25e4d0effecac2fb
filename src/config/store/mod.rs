//! `[store]`: which backend with exactly its settings, and the settings every backend shares.
//!
//! The file keeps one flat `[store]` table (users rely on it); validation turns it into a
//! [`StoreBackend`] variant per backend, refusing any field that belongs to another one.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::defaults::{
    DEFAULT_BACKEND, DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, DEFAULT_NEAR_CACHE, DEFAULT_PREFIX,
    DEFAULT_STORE_TIMEOUT, MAX_NEAR_CACHE, MAX_PREFIX_LEN, MAX_RECORDS, MAX_STORE_BYTES,
    MAX_STORE_TIMEOUT, MIN_STORE_BYTES,
};
use super::file::FileStore;
use super::{invalid, parse, ConfigError};
use crate::protocol::seal::Keyring;

mod access;
mod keyring;

pub use access::RedisAccess;

/// The backend named by `store.backend`, as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"memory\", \"redis\", \"redis-cluster\" or \"redis-sentinel\""
)]
pub enum Backend {
    /// In-process store: protects one gateway process.
    Memory,
    /// One Redis server (or a replicated primary).
    Redis,
    /// A Redis Cluster.
    RedisCluster,
    /// A primary found through Redis Sentinel, followed across failovers.
    RedisSentinel,
}

impl Backend {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis-cluster",
            Backend::RedisSentinel => "redis-sentinel",
        }
    }
}

/// Validated `[store]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Which backend, with its own settings.
    pub backend: StoreBackend,
    /// Namespace of every stored key.
    pub prefix: String,
    /// Deadline of one store operation.
    pub timeout: Duration,
    /// The keys of `encryption_keys`, read and checked (empty: records in clear).
    pub encryption: Keyring,
}

/// A validated backend, each variant with exactly the settings it uses. Its `Debug` shows
/// URLs without their passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// `memory`: in-process; protects one gateway process.
    Memory {
        /// Most live records before new claims fail.
        max_records: usize,
        /// Most bytes of records held (keys, responses, a fixed overhead each).
        max_bytes: u64,
    },
    /// `redis`: one Redis server (or a replicated primary).
    Redis {
        /// `store.url`.
        url: String,
        /// Bytes of completed records kept locally for replays, invalidated through
        /// `CLIENT TRACKING` (0: off).
        near_cache: u64,
        /// TLS material and the password.
        access: RedisAccess,
    },
    /// `redis-cluster`: a Redis Cluster.
    Cluster {
        /// `store.urls`: the seeds, at least one.
        urls: Vec<String>,
        /// As for [`StoreBackend::Redis`], kept through every master's tracking.
        near_cache: u64,
        /// TLS material and the password.
        access: RedisAccess,
    },
    /// `redis-sentinel`: a primary found through Redis Sentinel, followed across failovers.
    Sentinel {
        /// `store.sentinels`: at least one, all `redis://` or all `rediss://`.
        sentinels: Vec<String>,
        /// `store.master_name`: the name the sentinels monitor the primary under.
        master_name: String,
        /// TLS material (for the sentinels and the primary alike) and the password.
        access: RedisAccess,
    },
}

impl StoreBackend {
    /// Which backend, as `store.backend` names it.
    pub fn kind(&self) -> Backend {
        match self {
            StoreBackend::Memory { .. } => Backend::Memory,
            StoreBackend::Redis { .. } => Backend::Redis,
            StoreBackend::Cluster { .. } => Backend::RedisCluster,
            StoreBackend::Sentinel { .. } => Backend::RedisSentinel,
        }
    }

    /// How the Redis backends reach Redis; `None` for memory.
    pub fn access(&self) -> Option<&RedisAccess> {
        match self {
            StoreBackend::Memory { .. } => None,
            StoreBackend::Redis { access, .. }
            | StoreBackend::Cluster { access, .. }
            | StoreBackend::Sentinel { access, .. } => Some(access),
        }
    }
}

impl fmt::Debug for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>();
        match self {
            StoreBackend::Memory {
                max_records,
                max_bytes,
            } => f
                .debug_struct("Memory")
                .field("max_records", max_records)
                .field("max_bytes", max_bytes)
                .finish(),
            StoreBackend::Redis {
                url,
                near_cache,
                access,
            } => f
                .debug_struct("Redis")
                .field("url", &redact_url(url))
                .field("near_cache", near_cache)
                .field("access", access)
                .finish(),
            StoreBackend::Cluster {
                urls,
                near_cache,
                access,
            } => f
                .debug_struct("Cluster")
                .field("urls", &redacted(urls))
                .field("near_cache", near_cache)
                .field("access", access)
                .finish(),
            StoreBackend::Sentinel {
                sentinels,
                master_name,
                access,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", &redacted(sentinels))
                .field("master_name", master_name)
                .field("access", access)
                .finish(),
        }
    }
}

impl StoreConfig {
    /// Whether an ordered route's records take their entity's hash tag (see
    /// [`crate::protocol::key::order::record_key`]): on a Redis Cluster, where a record and its
    /// entity's order record must share a slot for one script to touch both.
    pub fn tags_by_entity(&self) -> bool {
        matches!(self.backend, StoreBackend::Cluster { .. })
    }

    /// How this store names records, for key derivation.
    pub fn namespace(&self) -> crate::protocol::route::Namespace<'_> {
        crate::protocol::route::Namespace {
            prefix: &self.prefix,
            tags_by_entity: self.tags_by_entity(),
        }
    }
}

/// The URL with its password replaced by `***`, for every place a URL is shown (errors,
/// `Debug`, logs): `rediss://app:s3cret@host:6380/0` becomes `rediss://app:***@host:6380/0`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        // `redis://secret@host`: the crate reads a lone userinfo as a password.
        None => "***".to_owned(),
    };
    format!("{scheme}://{user}@{host}{tail}")
}

/// Validates `[store]`: the shared settings, the named backend's own (refusing the fields
/// of the others), then the encryption keys.
pub(super) fn validate(
    s: &FileStore,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<StoreConfig, ConfigError> {
    let prefix = prefix(s)?;
    let timeout = parse::opt_duration(
        "store.timeout",
        s.timeout.as_deref(),
        DEFAULT_STORE_TIMEOUT,
        MAX_STORE_TIMEOUT,
    )?;
    let backend = match s.backend.unwrap_or(DEFAULT_BACKEND) {
        Backend::Memory => memory(s)?,
        Backend::Redis => redis(s)?,
        Backend::RedisCluster => cluster(s)?,
        Backend::RedisSentinel => sentinel(s)?,
    };
    if s.record_layout.is_some() {
        return Err(invalid(
            "store.record_layout",
            "no longer a setting: Redis keeps every record in the string layout, the only one; delete the line",
        ));
    }
    let encryption = keyring::keyring(s.encryption_keys.as_deref().unwrap_or_default(), env)?;
    Ok(StoreConfig {
        backend,
        prefix,
        timeout,
        encryption,
    })
}

fn prefix(s: &FileStore) -> Result<String, ConfigError> {
    let prefix = s.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
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
    Ok(prefix.to_owned())
}

/// `backend = "memory"`: its two limits; nothing of Redis.
fn memory(s: &FileStore) -> Result<StoreBackend, ConfigError> {
    if s.url.is_some() || s.urls.is_some() {
        return Err(invalid(
            "store.url",
            "set only with backend = \"redis\" or \"redis-cluster\"",
        ));
    }
    refuse_sentinel_fields(s)?;
    let max_records = parse::count(
        "store.max_records",
        s.max_records,
        DEFAULT_MAX_RECORDS,
        MAX_RECORDS,
    )?;
    let max_bytes = parse::opt_size(
        "store.max_bytes",
        s.max_bytes.as_deref(),
        DEFAULT_MAX_BYTES,
        MIN_STORE_BYTES,
        MAX_STORE_BYTES,
    )?;
    refuse_near_cache(s)?;
    access::refuse_access(s)?;
    Ok(StoreBackend::Memory {
        max_records,
        max_bytes,
    })
}

/// `backend = "redis"`: one `store.url`.
fn redis(s: &FileStore) -> Result<StoreBackend, ConfigError> {
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
    let url = redis_url("store.url", url)?;
    refuse_sentinel_fields(s)?;
    refuse_memory_limits(s)?;
    let near_cache = near_cache(s)?;
    let access = access::access(s, std::slice::from_ref(&url))?;
    Ok(StoreBackend::Redis {
        url,
        near_cache,
        access,
    })
}

/// `backend = "redis-cluster"`: at least one seed in `store.urls`.
fn cluster(s: &FileStore) -> Result<StoreBackend, ConfigError> {
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
    let urls = redis_urls("store.urls", urls)?;
    refuse_sentinel_fields(s)?;
    refuse_memory_limits(s)?;
    let near_cache = near_cache(s)?;
    let access = access::access(s, &urls)?;
    Ok(StoreBackend::Cluster {
        urls,
        near_cache,
        access,
    })
}

/// `backend = "redis-sentinel"`: the sentinels and the name they monitor the primary under.
fn sentinel(s: &FileStore) -> Result<StoreBackend, ConfigError> {
    if s.url.is_some() || s.urls.is_some() {
        return Err(invalid(
            if s.url.is_some() {
                "store.url"
            } else {
                "store.urls"
            },
            "is not for backend = \"redis-sentinel\"; list the sentinels in store.sentinels",
        ));
    }
    let sentinels = s.sentinels.as_deref().unwrap_or_default();
    if sentinels.is_empty() {
        return Err(invalid(
            "store.sentinels",
            "at least one sentinel URL is required with backend = \"redis-sentinel\"",
        ));
    }
    // The primary speaks TLS when the sentinels do: one scheme for all of them.
    let tls = sentinels
        .iter()
        .filter(|u| u.starts_with("rediss://"))
        .count();
    if tls != 0 && tls != sentinels.len() {
        return Err(invalid(
            "store.sentinels",
            "all redis:// or all rediss:// (the primary is reached as the sentinels are)",
        ));
    }
    let sentinels = redis_urls("store.sentinels", sentinels)?;
    let master_name = master_name(s)?;
    refuse_memory_limits(s)?;
    refuse_near_cache(s)?;
    let access = access::access(s, &sentinels)?;
    Ok(StoreBackend::Sentinel {
        sentinels,
        master_name,
        access,
    })
}

/// `store.master_name`, required with `redis-sentinel`.
fn master_name(s: &FileStore) -> Result<String, ConfigError> {
    let Some(name) = s.master_name.as_deref() else {
        return Err(invalid(
            "store.master_name",
            "required with backend = \"redis-sentinel\" (the name in the sentinels' `sentinel monitor`)",
        ));
    };
    // Sentinel names are one word in `sentinel monitor NAME ...`.
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "store.master_name",
            "must be printable characters without spaces",
        ));
    }
    Ok(name.to_owned())
}

/// A URL the redis crate can use, checked now so a bad one fails here, not at start-up.
fn redis_url(at: &str, url: &str) -> Result<String, ConfigError> {
    let shown = redact_url(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("unix://"))
    {
        return Err(invalid(
            at,
            format!("{shown:?} is not a redis:// or rediss:// URL"),
        ));
    }
    // The crate reads `#insecure` as "skip certificate checks": that must be said in
    // `store.tls_insecure`, where start-up warns about it, not hidden in a URL.
    if url.contains('#') {
        return Err(invalid(
            at,
            format!(
                "{shown:?}: no #fragment; to skip certificate checks set store.tls_insecure = true"
            ),
        ));
    }
    redis::Client::open(url)
        .map(|_| url.to_owned())
        .map_err(|e| invalid(at, format!("{shown:?}: {e}")))
}

fn redis_urls(at: &str, urls: &[String]) -> Result<Vec<String>, ConfigError> {
    urls.iter().map(|u| redis_url(at, u)).collect()
}

/// The Redis backends but Sentinel: `store.sentinels` and `store.master_name` would be
/// silently ignored.
fn refuse_sentinel_fields(s: &FileStore) -> Result<(), ConfigError> {
    for (field, set) in [
        ("store.sentinels", s.sentinels.is_some()),
        ("store.master_name", s.master_name.is_some()),
    ] {
        if set {
            return Err(invalid(
                field,
                "applies to backend = \"redis-sentinel\" only",
            ));
        }
    }
    Ok(())
}

/// The Redis backends: the memory backend's limits would be silently ignored.
fn refuse_memory_limits(s: &FileStore) -> Result<(), ConfigError> {
    for (field, set) in [
        ("store.max_records", s.max_records.is_some()),
        ("store.max_bytes", s.max_bytes.is_some()),
    ] {
        if set {
            return Err(invalid(field, "applies to backend = \"memory\" only"));
        }
    }
    Ok(())
}

fn near_cache(s: &FileStore) -> Result<u64, ConfigError> {
    parse::opt_size(
        "store.near_cache",
        s.near_cache.as_deref(),
        DEFAULT_NEAR_CACHE,
        0,
        MAX_NEAR_CACHE,
    )
}

/// Memory and Sentinel keep no near-cache: a size other than 0 is refused (after its
/// syntax is checked, as on the other backends).
fn refuse_near_cache(s: &FileStore) -> Result<(), ConfigError> {
    if near_cache(s)? > 0 {
        return Err(invalid(
            "store.near_cache",
            "applies to backend = \"redis\" or \"redis-cluster\" only (not yet to redis-sentinel)",
        ));
    }
    Ok(())
}
