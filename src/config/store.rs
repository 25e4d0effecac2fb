//! `[store]`: which backend, its URLs and limits.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::defaults::{
    DEFAULT_BACKEND, DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, DEFAULT_NEAR_CACHE, DEFAULT_PREFIX,
    DEFAULT_STORE_TIMEOUT, DEFAULT_TLS_INSECURE, MAX_NEAR_CACHE, MAX_PREFIX_LEN, MAX_RECORDS,
    MAX_STORE_BYTES, MAX_STORE_TIMEOUT, MIN_STORE_BYTES,
};
use super::file::FileStore;
use super::{invalid, parse, ConfigError};
use crate::seal::{self, Keyring, KEY_LEN};
use crate::tls::{self, PemFile};

/// The store backends.
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

/// Validated `[store]`. Its `Debug` shows URLs without their passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Which backend.
    pub backend: Backend,
    /// Namespace of every stored key.
    pub prefix: String,
    /// Redis URLs: one for `redis`, the seeds for `redis-cluster`, the sentinels for
    /// `redis-sentinel`, none for memory.
    pub urls: Vec<String>,
    /// `redis-sentinel`: the name the sentinels monitor the primary under.
    pub master_name: Option<String>,
    /// Deadline of one store operation.
    pub timeout: Duration,
    /// Memory backend capacity.
    pub max_records: usize,
    /// Memory backend: most bytes of records held (keys, responses, a fixed overhead each).
    pub max_bytes: u64,
    /// Redis backend: bytes of completed records kept locally for replays, invalidated
    /// through `CLIENT TRACKING` (0: off).
    pub near_cache: u64,
    /// The keys of `encryption_keys`, read and checked (empty: records in clear).
    pub encryption: Keyring,
    /// Redis backends: TLS material and the password from the environment.
    pub access: RedisAccess,
}

impl StoreConfig {
    /// Whether an ordered route's records take their entity's hash tag (see
    /// [`crate::key::order::record_key`]): on a Redis Cluster, where a record and its
    /// entity's order record must share a slot for one script to touch both.
    pub fn tags_by_entity(&self) -> bool {
        self.backend == Backend::RedisCluster
    }

    /// How this store names records, for key derivation.
    pub fn namespace(&self) -> crate::route::Namespace<'_> {
        crate::route::Namespace {
            prefix: &self.prefix,
            tags_by_entity: self.tags_by_entity(),
        }
    }
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("StoreConfig")
            .field("backend", &self.backend)
            .field("prefix", &self.prefix)
            .field("urls", &urls)
            .field("master_name", &self.master_name)
            .field("timeout", &self.timeout)
            .field("max_records", &self.max_records)
            .field("max_bytes", &self.max_bytes)
            .field("near_cache", &self.near_cache)
            .field("encryption", &self.encryption)
            .field("access", &self.access)
            .finish()
    }
}

/// How the gateway reaches Redis beyond its URLs: the TLS files for `rediss://` and a
/// password from `DEDUPE_REDIS_PASSWORD`. Its `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisAccess {
    /// `store.tls_ca_file`: the CA Redis's certificate must chain to; the platform's roots
    /// when unset.
    pub ca: Option<PemFile>,
    /// `store.tls_cert_file` and `store.tls_key_file`: the client certificate and its key,
    /// for Redis servers that require mutual TLS.
    pub client_cert: Option<(PemFile, PemFile)>,
    /// `store.tls_insecure`: Redis's certificate is not verified at all.
    pub insecure: bool,
    /// `DEDUPE_REDIS_PASSWORD`: replaces a password in the URLs.
    pub password: Option<String>,
}

impl fmt::Debug for RedisAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAccess")
            .field("ca", &self.ca)
            .field("client_cert", &self.client_cert)
            .field("insecure", &self.insecure)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
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
        let shown = redact_url(url);
        if !(url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("unix://"))
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
                format!("{shown:?}: no #fragment; to skip certificate checks set store.tls_insecure = true"),
            ));
        }
        // The redis crate's own parser: a URL it cannot use fails here, not at start-up.
        redis::Client::open(url)
            .map(|_| url.to_owned())
            .map_err(|e| invalid(at, format!("{shown:?}: {e}")))
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
        Backend::RedisSentinel => {
            if s.url.is_some() || s.urls.is_some() {
                return Err(invalid(
                    if s.url.is_some() { "store.url" } else { "store.urls" },
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
            sentinels
                .iter()
                .map(|u| check_url("store.sentinels", u))
                .collect::<Result<Vec<_>, _>>()?
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
    if s.sentinels.is_some() && backend != Backend::RedisSentinel {
        return Err(invalid(
            "store.sentinels",
            "applies to backend = \"redis-sentinel\" only",
        ));
    }
    let master_name = match (backend, s.master_name.as_deref()) {
        (Backend::RedisSentinel, None) => {
            return Err(invalid(
                "store.master_name",
                "required with backend = \"redis-sentinel\" (the name in the sentinels' `sentinel monitor`)",
            ))
        }
        (Backend::RedisSentinel, Some(name)) => {
            // Sentinel names are one word in `sentinel monitor NAME ...`.
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    "store.master_name",
                    "must be printable characters without spaces",
                ));
            }
            Some(name.to_owned())
        }
        (_, Some(_)) => {
            return Err(invalid(
                "store.master_name",
                "applies to backend = \"redis-sentinel\" only",
            ))
        }
        (_, None) => None,
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
    let near_cache = parse::opt_size(
        "store.near_cache",
        s.near_cache.as_deref(),
        DEFAULT_NEAR_CACHE,
        0,
        MAX_NEAR_CACHE,
    )?;
    if near_cache > 0 && !matches!(backend, Backend::Redis | Backend::RedisCluster) {
        return Err(invalid(
            "store.near_cache",
            "applies to backend = \"redis\" or \"redis-cluster\" only (not yet to redis-sentinel)",
        ));
    }
    let encryption = keyring(s.encryption_keys.as_deref().unwrap_or_default(), env)?;
    let access = access(s, &urls)?;
    Ok(StoreConfig {
        backend,
        prefix,
        urls,
        master_name,
        timeout,
        max_records,
        max_bytes,
        near_cache,
        encryption,
        access,
    })
}

/// The TLS files (read and checked now, so a bad one is a config error naming its field)
/// and the password.
fn access(s: &FileStore, urls: &[String]) -> Result<RedisAccess, ConfigError> {
    let tls_fields = [
        ("store.tls_ca_file", s.tls_ca_file.is_some()),
        ("store.tls_cert_file", s.tls_cert_file.is_some()),
        ("store.tls_key_file", s.tls_key_file.is_some()),
        ("store.tls_insecure", s.tls_insecure.is_some()),
    ];
    let tls = !urls.is_empty() && urls.iter().all(|u| u.starts_with("rediss://"));
    if !tls {
        if let Some((field, _)) = tls_fields.iter().find(|(_, set)| *set) {
            return Err(invalid(
                *field,
                "applies to rediss:// URLs only (every store URL must be rediss://)",
            ));
        }
    }
    let read =
        |field: &str, path: &str| PemFile::read(path).map_err(|e| invalid(field, e.to_string()));
    let ca = match &s.tls_ca_file {
        Some(path) => {
            let ca = read("store.tls_ca_file", path)?;
            ca.trust_anchors()
                .map_err(|e| invalid("store.tls_ca_file", e.to_string()))?;
            Some(ca)
        }
        None => None,
    };
    let client_cert = match (&s.tls_cert_file, &s.tls_key_file) {
        (Some(cert), Some(key)) => {
            let cert = read("store.tls_cert_file", cert)?;
            let key = read("store.tls_key_file", key)?;
            cert.certificates()
                .map_err(|e| invalid("store.tls_cert_file", e.to_string()))?;
            tls::certified_key(&cert, &key)
                .map_err(|e| invalid("store.tls_key_file", e.to_string()))?;
            Some((cert, key))
        }
        (Some(_), None) => {
            return Err(invalid(
                "store.tls_key_file",
                "required with store.tls_cert_file (mutual TLS needs both)",
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                "store.tls_cert_file",
                "required with store.tls_key_file (mutual TLS needs both)",
            ))
        }
        (None, None) => None,
    };
    if s.password.as_deref() == Some("") {
        return Err(invalid("store.password", "must not be empty"));
    }
    if s.password.is_some() && urls.is_empty() {
        return Err(invalid(
            "store.password",
            "applies to the Redis backends only",
        ));
    }
    Ok(RedisAccess {
        ca,
        client_cert,
        insecure: s.tls_insecure.unwrap_or(DEFAULT_TLS_INSECURE),
        password: s.password.clone(),
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
