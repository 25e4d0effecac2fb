//! Configuration in two stages: the `File*` structs mirror the TOML file and reject
//! unknown fields (a typo in a key rule must never silently switch dedupe off); then
//! [`Config::from_file`] validates them into a [`Config`] with parsed durations, sizes,
//! header names and compiled path matchers. Every error names the route and the field.
//!
//! Nothing here does I/O except [`Config::load`], which reads the file.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::header::HeaderName;
use http::uri::{Authority, Scheme};
use http::Method;
use serde::Deserialize;

use crate::key::{KeyRule, RequestPart};
use crate::route::{PathPattern, Route};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has an unknown or mistyped field.
    #[error(transparent)]
    Parse(#[from] toml::de::Error),
    /// A field has a value the gateway cannot use.
    #[error("{at}: {message}")]
    Invalid {
        /// Where: `server.listen`, `routes[payments].lease`, ...
        at: String,
        /// What is wrong with it.
        message: String,
    },
}

fn invalid(at: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        at: at.into(),
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------
// Stage one: the file as written.
// ---------------------------------------------------------------------------

/// The TOML file, field for field.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[server]`
    pub server: FileServer,
    /// `[store]`
    #[serde(default)]
    pub store: FileStore,
    /// `[defaults]`
    #[serde(default)]
    pub defaults: FileDefaults,
    /// `[admin]`
    pub admin: Option<FileAdmin>,
    /// `[[routes]]`
    #[serde(default)]
    pub routes: Vec<FileRoute>,
}

/// `[server]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    /// Public listen address.
    pub listen: String,
    /// `http://host:port[/base]`.
    pub upstream: String,
    /// Deadline for the upstream's whole answer (head and the body the gateway stores).
    pub upstream_timeout: Option<String>,
    /// Deadline for opening a TCP connection to the upstream.
    pub connect_timeout: Option<String>,
    /// Largest request body buffered for a deduped route.
    pub max_body: Option<String>,
    /// Largest request head (request line and headers) accepted.
    pub max_header_bytes: Option<String>,
    /// How long a client may take to send the request head.
    pub header_read_timeout: Option<String>,
    /// How long a client may take to send a deduped request's body.
    pub body_read_timeout: Option<String>,
    /// How long a write to a client may stall before the connection is dropped.
    pub write_timeout: Option<String>,
    /// How long in-flight requests may run after SIGTERM.
    pub shutdown_grace: Option<String>,
    /// Most client connections served at once; more wait in the listen backlog.
    pub max_connections: Option<usize>,
    /// Most concurrent HTTP/2 streams (requests) per connection.
    pub max_concurrent_streams: Option<u32>,
}

/// The store backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// In-process store: protects one gateway process.
    #[default]
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

/// What a deduped request does when the store fails or times out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnError {
    /// Answer 503 and forward nothing.
    #[default]
    FailClosed,
    /// Forward without dedupe (logged and counted).
    FailOpen,
}

/// What an in-flight duplicate gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnConflict {
    /// 409 with `Retry-After`.
    #[default]
    Reject,
    /// Hold the duplicate (up to `conflict_wait`) until the first request finishes, then
    /// answer it with the stored response; 409 if the wait runs out.
    Wait,
}

/// `[store]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileStore {
    /// Which backend.
    #[serde(default)]
    pub backend: Backend,
    /// Namespace of every stored key.
    pub prefix: Option<String>,
    /// Redis URL (`backend = "redis"`).
    pub url: Option<String>,
    /// Cluster seed URLs (`backend = "redis-cluster"`).
    pub urls: Option<Vec<String>>,
    /// Deadline of one store operation.
    pub timeout: Option<String>,
    /// Default failure behaviour.
    pub on_error: Option<OnError>,
    /// Memory backend: most records held before new claims fail.
    pub max_records: Option<usize>,
    /// Memory backend: most bytes of records held before new claims fail.
    pub max_bytes: Option<String>,
}

/// `[defaults]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDefaults {
    /// In-flight lease.
    pub lease: Option<String>,
    /// Dedupe window.
    pub window: Option<String>,
    /// In-flight duplicate behaviour.
    pub on_conflict: Option<OnConflict>,
    /// With `on_conflict = "wait"`: the longest a duplicate is held.
    pub conflict_wait: Option<String>,
    /// Largest upstream body stored for replay.
    pub max_cached_body: Option<String>,
}

/// `[admin]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAdmin {
    /// Admin listen address.
    pub listen: String,
    /// Optional bearer token.
    pub token: Option<String>,
    /// Most admin connections served at once.
    pub max_connections: Option<usize>,
}

/// `key = { ... }` as written: exactly one of `header` or `fingerprint`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    /// Header carrying the client's key.
    pub header: Option<String>,
    /// Whether a request without the header is refused (400) or passed through.
    pub required: Option<bool>,
    /// Request parts hashed into the key.
    pub fingerprint: Option<Vec<String>>,
}

/// `[[routes]]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRoute {
    /// Unique route name (letters, digits, `-`, `_`).
    pub name: String,
    /// Methods deduped on this route.
    pub methods: Vec<String>,
    /// Exact path, or a glob such as `/v1/payments/*`.
    pub path: String,
    /// Key rule.
    pub key: FileKey,
    /// Parts whose hash namespaces the key.
    #[serde(default)]
    pub scope: Vec<String>,
    /// Extra headers folded into the request hash.
    #[serde(default)]
    pub hash_headers: Vec<String>,
    /// Overrides `[defaults] lease`.
    pub lease: Option<String>,
    /// Overrides `[defaults] window`.
    pub window: Option<String>,
    /// Overrides `[defaults] on_conflict`.
    pub on_conflict: Option<OnConflict>,
    /// Overrides `[defaults] conflict_wait`.
    pub conflict_wait: Option<String>,
    /// Overrides `[defaults] max_cached_body`.
    pub max_cached_body: Option<String>,
    /// Overrides `[store] on_error`.
    pub on_error: Option<OnError>,
}

impl FileConfig {
    /// Parses TOML text. A mistake inside a `[[routes]]` entry is reported with the
    /// route's name; anything else with toml's line and column.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| Self::locate_route_error(text).unwrap_or(e.into()))
    }

    fn locate_route_error(text: &str) -> Option<ConfigError> {
        let table: toml::Table = text.parse().ok()?;
        let routes = table.get("routes")?.as_array()?;
        routes.iter().enumerate().find_map(|(i, route)| {
            let e = route.clone().try_into::<FileRoute>().err()?;
            let name = route
                .get("name")
                .and_then(toml::Value::as_str)
                .map_or_else(|| i.to_string(), str::to_owned);
            Some(invalid(format!("routes[{name}]"), e.message().trim()))
        })
    }

    /// Applies the environment overrides a container sets (`DEDUPE_LISTEN`,
    /// `DEDUPE_UPSTREAM`, `DEDUPE_REDIS_URL`, `DEDUPE_REDIS_URLS`, `DEDUPE_ADMIN_LISTEN`,
    /// `DEDUPE_ADMIN_TOKEN`). `lookup` is the environment; tests pass a map.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) {
        if let Some(v) = lookup("DEDUPE_LISTEN") {
            self.server.listen = v;
        }
        if let Some(v) = lookup("DEDUPE_UPSTREAM") {
            self.server.upstream = v;
        }
        if let Some(v) = lookup("DEDUPE_REDIS_URL") {
            self.store.url = Some(v);
        }
        if let Some(v) = lookup("DEDUPE_REDIS_URLS") {
            self.store.urls = Some(v.split(',').map(|s| s.trim().to_owned()).collect());
        }
        if let Some(v) = lookup("DEDUPE_ADMIN_LISTEN") {
            match &mut self.admin {
                Some(admin) => admin.listen = v,
                None => {
                    self.admin = Some(FileAdmin {
                        listen: v,
                        token: None,
                        max_connections: None,
                    })
                }
            }
        }
        if let Some(v) = lookup("DEDUPE_ADMIN_TOKEN") {
            if let Some(admin) = &mut self.admin {
                admin.token = Some(v);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Stage two: the validated configuration.
// ---------------------------------------------------------------------------

/// A validated configuration: everything parsed, nothing left to fail at request time.
#[derive(Debug, Clone)]
pub struct Config {
    /// Public listener and upstream.
    pub server: ServerConfig,
    /// The dedupe store.
    pub store: StoreConfig,
    /// Admin listener, when configured.
    pub admin: Option<AdminConfig>,
    /// Routes in file order; the first match wins.
    pub routes: Vec<Route>,
    /// Valid but risky settings, for `check` to print and `run` to log.
    pub warnings: Vec<String>,
}

/// Validated `[server]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Public listen address.
    pub listen: SocketAddr,
    /// Where requests go.
    pub upstream: UpstreamTarget,
    /// Deadline for the upstream's answer.
    pub upstream_timeout: Duration,
    /// Deadline for a TCP connect to the upstream.
    pub connect_timeout: Duration,
    /// Largest buffered request body on deduped routes.
    pub max_body: u64,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Deadline for receiving a request head.
    pub header_read_timeout: Duration,
    /// Deadline for receiving a deduped request's body.
    pub body_read_timeout: Duration,
    /// A client that accepts no response bytes for this long is disconnected.
    pub write_timeout: Duration,
    /// Drain time after SIGTERM.
    pub shutdown_grace: Duration,
    /// Most client connections served at once.
    pub max_connections: usize,
    /// Most concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
}

/// The upstream base URL, split for cheap per-request URI building.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTarget {
    /// Always `http`.
    pub scheme: Scheme,
    /// `host:port`.
    pub authority: Authority,
    /// Base path without a trailing slash (`""` when none).
    pub base_path: String,
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
    /// Memory backend capacity in bytes (keys, responses and a per-record overhead).
    pub max_bytes: u64,
}

/// Validated `[admin]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Admin listen address.
    pub listen: SocketAddr,
    /// Bearer token required on every admin request, when set.
    pub token: Option<String>,
    /// Most admin connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

const DEFAULT_LEASE: Duration = Duration::from_secs(60);
const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_MAX_CACHED_BODY: u64 = 1024 * 1024;
/// `store.max_bytes` when unset: sized for a sidecar.
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// `admin.max_connections` when unset: probes and scrapes need few.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// `server.write_timeout` when unset.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

impl Config {
    /// Reads, parses, applies environment overrides and validates a config file.
    pub fn load(path: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut file = FileConfig::parse(&text)?;
        file.apply_env(env);
        Self::from_file(file)
    }

    /// Parses and validates TOML text without environment overrides.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_file(FileConfig::parse(text)?)
    }

    /// Validates a parsed file.
    pub fn from_file(file: FileConfig) -> Result<Self, ConfigError> {
        let server = validate_server(&file.server)?;
        let store = validate_store(&file.store)?;
        let admin = file
            .admin
            .as_ref()
            .map(|a| {
                let listen = parse_addr("admin.listen", &a.listen)?;
                if listen == server.listen && listen.port() != 0 {
                    return Err(invalid(
                        "admin.listen",
                        "must differ from server.listen: the admin port is never the public port",
                    ));
                }
                if a.token.as_deref() == Some("") {
                    return Err(invalid("admin.token", "must not be empty"));
                }
                let max_connections = a.max_connections.unwrap_or(DEFAULT_ADMIN_MAX_CONNECTIONS);
                if !(1..=1024).contains(&max_connections) {
                    return Err(invalid(
                        "admin.max_connections",
                        "must be between 1 and 1024",
                    ));
                }
                Ok(AdminConfig {
                    listen,
                    token: a.token.clone(),
                    max_connections,
                })
            })
            .transpose()?;

        let d = &file.defaults;
        let lease = opt_duration("defaults.lease", d.lease.as_deref(), DEFAULT_LEASE)?;
        let window = opt_duration("defaults.window", d.window.as_deref(), DEFAULT_WINDOW)?;
        let max_cached_body = opt_size(
            "defaults.max_cached_body",
            d.max_cached_body.as_deref(),
            DEFAULT_MAX_CACHED_BODY,
        )?;
        let on_conflict = d.on_conflict.unwrap_or_default();
        let conflict_wait = opt_duration(
            "defaults.conflict_wait",
            d.conflict_wait.as_deref(),
            Duration::from_secs(10),
        )?;
        let on_error = file.store.on_error.unwrap_or_default();

        let mut names = HashSet::new();
        let mut routes = Vec::with_capacity(file.routes.len());
        for (i, r) in file.routes.iter().enumerate() {
            let at = if r.name.is_empty() {
                format!("routes[{i}]")
            } else {
                format!("routes[{}]", r.name)
            };
            let route = validate_route(
                &at,
                r,
                Inherited {
                    lease,
                    window,
                    max_cached_body,
                    on_conflict,
                    conflict_wait,
                    on_error,
                },
            )?;
            if !names.insert(route.name.clone()) {
                return Err(invalid(format!("{at}.name"), "duplicate route name"));
            }
            routes.push(route);
        }
        let warnings = lease_warnings(&server, &store, &routes);
        Ok(Config {
            server,
            store,
            admin,
            routes,
            warnings,
        })
    }
}

/// A winner may hold its claim for the whole upstream timeout plus its store calls. A lease
/// shorter than that lets a retry take over a healthy but slow call and run the write again.
fn lease_warnings(server: &ServerConfig, store: &StoreConfig, routes: &[Route]) -> Vec<String> {
    let needed = server.upstream_timeout + store.timeout * 2;
    routes
        .iter()
        .filter(|r| r.lease <= needed)
        .map(|r| {
            format!(
                "routes[{}].lease: {} does not exceed server.upstream_timeout ({}) plus two store operations ({}): \
                 a slow but healthy upstream call can be taken over by a retry and executed twice",
                r.name,
                humantime::format_duration(r.lease),
                humantime::format_duration(server.upstream_timeout),
                humantime::format_duration(store.timeout * 2),
            )
        })
        .collect()
}

struct Inherited {
    lease: Duration,
    window: Duration,
    max_cached_body: u64,
    on_conflict: OnConflict,
    conflict_wait: Duration,
    on_error: OnError,
}

fn validate_server(s: &FileServer) -> Result<ServerConfig, ConfigError> {
    let listen = parse_addr("server.listen", &s.listen)?;
    let upstream = parse_upstream("server.upstream", &s.upstream)?;
    let upstream_timeout = opt_duration(
        "server.upstream_timeout",
        s.upstream_timeout.as_deref(),
        Duration::from_secs(30),
    )?;
    let connect_timeout = opt_duration(
        "server.connect_timeout",
        s.connect_timeout.as_deref(),
        Duration::from_secs(5),
    )?;
    let max_body = opt_size("server.max_body", s.max_body.as_deref(), 1024 * 1024)?;
    let max_header_bytes = opt_size(
        "server.max_header_bytes",
        s.max_header_bytes.as_deref(),
        64 * 1024,
    )?;
    if !(8192..=1024 * 1024).contains(&max_header_bytes) {
        return Err(invalid(
            "server.max_header_bytes",
            "must be between 8KiB and 1MiB",
        ));
    }
    let header_read_timeout = opt_duration(
        "server.header_read_timeout",
        s.header_read_timeout.as_deref(),
        Duration::from_secs(10),
    )?;
    let body_read_timeout = opt_duration(
        "server.body_read_timeout",
        s.body_read_timeout.as_deref(),
        Duration::from_secs(30),
    )?;
    let write_timeout = opt_duration(
        "server.write_timeout",
        s.write_timeout.as_deref(),
        DEFAULT_WRITE_TIMEOUT,
    )?;
    let shutdown_grace = match s.shutdown_grace.as_deref() {
        Some(v) => parse_duration_allow_zero("server.shutdown_grace", v)?,
        None => Duration::from_secs(30),
    };
    let max_connections = s.max_connections.unwrap_or(10_000);
    if max_connections == 0 {
        return Err(invalid("server.max_connections", "must be at least 1"));
    }
    let max_concurrent_streams = s.max_concurrent_streams.unwrap_or(100);
    if max_concurrent_streams == 0 {
        return Err(invalid(
            "server.max_concurrent_streams",
            "must be at least 1",
        ));
    }
    Ok(ServerConfig {
        max_connections,
        max_concurrent_streams,
        listen,
        upstream,
        upstream_timeout,
        connect_timeout,
        max_body,
        max_header_bytes: max_header_bytes as usize,
        header_read_timeout,
        body_read_timeout,
        write_timeout,
        shutdown_grace,
    })
}

fn validate_store(s: &FileStore) -> Result<StoreConfig, ConfigError> {
    let prefix = s.prefix.clone().unwrap_or_else(|| "dedupe".to_owned());
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
    let timeout = opt_duration(
        "store.timeout",
        s.timeout.as_deref(),
        Duration::from_millis(250),
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
    let urls = match s.backend {
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
    if s.max_records.is_some() && s.backend != Backend::Memory {
        return Err(invalid(
            "store.max_records",
            "applies to backend = \"memory\" only",
        ));
    }
    let max_records = s.max_records.unwrap_or(1_000_000);
    if max_records == 0 {
        return Err(invalid("store.max_records", "must be at least 1"));
    }
    if s.max_bytes.is_some() && s.backend != Backend::Memory {
        return Err(invalid(
            "store.max_bytes",
            "applies to backend = \"memory\" only",
        ));
    }
    let max_bytes = opt_size("store.max_bytes", s.max_bytes.as_deref(), DEFAULT_MAX_BYTES)?;
    if !(64 * 1024..=1 << 40).contains(&max_bytes) {
        return Err(invalid("store.max_bytes", "must be between 64KiB and 1TiB"));
    }
    Ok(StoreConfig {
        backend: s.backend,
        prefix,
        urls,
        timeout,
        max_records,
        max_bytes,
    })
}

fn validate_route(at: &str, r: &FileRoute, inherited: Inherited) -> Result<Route, ConfigError> {
    if r.name.is_empty()
        || r.name.len() > 64
        || !r
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid(
            format!("{at}.name"),
            "must be 1 to 64 letters, digits, '-' or '_'",
        ));
    }
    if r.methods.is_empty() {
        return Err(invalid(
            format!("{at}.methods"),
            "must list at least one method",
        ));
    }
    let methods = r
        .methods
        .iter()
        .map(|m| {
            let upper = m.to_ascii_uppercase();
            Method::from_bytes(upper.as_bytes())
                .map_err(|_| invalid(format!("{at}.methods"), format!("{m:?} is not a method")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let path = PathPattern::new(&r.path).map_err(|e| invalid(format!("{at}.path"), e))?;

    let key = match (&r.key.header, &r.key.fingerprint) {
        (Some(h), None) => KeyRule::Header {
            name: parse_header_name(&format!("{at}.key.header"), h)?,
            required: r.key.required.unwrap_or(true),
        },
        (None, Some(parts)) => {
            if r.key.required.is_some() {
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
    };
    let scope = parse_parts(&format!("{at}.scope"), &r.scope)?;
    let hash_headers = r
        .hash_headers
        .iter()
        .map(|h| parse_header_name(&format!("{at}.hash_headers"), h))
        .collect::<Result<Vec<_>, _>>()?;

    let lease = match &r.lease {
        Some(v) => parse_duration(&format!("{at}.lease"), v)?,
        None => inherited.lease,
    };
    let window = match &r.window {
        Some(v) => parse_duration(&format!("{at}.window"), v)?,
        None => inherited.window,
    };
    let max_cached_body = match &r.max_cached_body {
        Some(v) => parse_size(&format!("{at}.max_cached_body"), v)?,
        None => inherited.max_cached_body,
    };
    Ok(Route {
        name: r.name.as_str().into(),
        methods,
        path,
        key,
        scope,
        hash_headers,
        lease,
        window,
        max_cached_body,
        on_conflict: r.on_conflict.unwrap_or(inherited.on_conflict),
        conflict_wait: match &r.conflict_wait {
            Some(v) => parse_duration(&format!("{at}.conflict_wait"), v)?,
            None => inherited.conflict_wait,
        },
        on_error: r.on_error.unwrap_or(inherited.on_error),
    })
}

fn parse_parts(at: &str, parts: &[String]) -> Result<Vec<RequestPart>, ConfigError> {
    parts
        .iter()
        .map(|p| RequestPart::parse(p).map_err(|e| invalid(at, e)))
        .collect()
}

fn parse_header_name(at: &str, v: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(v.as_bytes())
        .map_err(|_| invalid(at, format!("{v:?} is not a header name")))
}

fn parse_addr(at: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse()
        .map_err(|_| invalid(at, format!("{v:?} is not an address like 127.0.0.1:8080")))
}

fn parse_upstream(at: &str, v: &str) -> Result<UpstreamTarget, ConfigError> {
    let uri: http::Uri = v
        .parse()
        .map_err(|_| invalid(at, format!("{v:?} is not a URL like http://127.0.0.1:9000")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(invalid(
                at,
                "https upstreams are not supported: reach the upstream over http on a private network or a TLS sidecar",
            ))
        }
        _ => return Err(invalid(at, format!("{v:?} must start with http://"))),
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| invalid(at, format!("{v:?} has no host")))?;
    if uri.query().is_some() {
        return Err(invalid(at, "must not carry a query string"));
    }
    let base_path = uri.path().trim_end_matches('/').to_owned();
    Ok(UpstreamTarget {
        scheme: Scheme::HTTP,
        authority,
        base_path,
    })
}

/// Parses `"250ms"`, `"30s"`, `"24h"`; zero is refused.
fn parse_duration(at: &str, v: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration_allow_zero(at, v)?;
    if d.is_zero() {
        return Err(invalid(at, "must be greater than zero"));
    }
    Ok(d)
}

fn parse_duration_allow_zero(at: &str, v: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(v).map_err(|e| {
        invalid(
            at,
            format!("{v:?} is not a duration like \"250ms\", \"30s\" or \"24h\" ({e})"),
        )
    })
}

fn opt_duration(at: &str, v: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |v| parse_duration(at, v))
}

/// Parses `"64KiB"`, `"1MiB"`, `"512"` (bytes).
fn parse_size(at: &str, v: &str) -> Result<u64, ConfigError> {
    v.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| {
            invalid(
                at,
                format!("{v:?} is not a size like \"64KiB\" or \"1MiB\" ({e})"),
            )
        })
}

fn opt_size(at: &str, v: Option<&str>, default: u64) -> Result<u64, ConfigError> {
    v.map_or(Ok(default), |v| parse_size(at, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[server]
listen = "127.0.0.1:8080"
upstream = "http://127.0.0.1:9000/api/"
"#;

    fn with(extra: &str) -> Result<Config, ConfigError> {
        Config::from_toml(&format!("{BASE}{extra}"))
    }

    fn err(extra: &str) -> String {
        with(extra).unwrap_err().to_string()
    }

    #[test]
    fn the_issue_example_validates() {
        let c = Config::from_toml(include_str!("../config/example.toml")).unwrap();
        assert_eq!(c.routes.len(), 3);
        assert_eq!(c.routes[1].window, Duration::from_secs(72 * 3600));
        assert_eq!(c.routes[0].lease, Duration::from_secs(30));
        assert_eq!(c.server.max_body, 1024 * 1024);
    }

    #[test]
    fn defaults_apply_and_routes_override() {
        let c = with(
            r#"
[defaults]
lease = "2s"
window = "1h"
[[routes]]
name = "a"
methods = ["post"]
path = "/a"
key = { header = "Idempotency-Key" }
[[routes]]
name = "b"
methods = ["POST"]
path = "/b/*"
key = { header = "Idempotency-Key", required = false }
lease = "250ms"
on_error = "fail-open"
"#,
        )
        .unwrap();
        assert_eq!(c.server.upstream.base_path, "/api");
        assert_eq!(c.routes[0].lease, Duration::from_secs(2));
        assert_eq!(c.routes[0].methods, vec![Method::POST]);
        assert_eq!(c.routes[1].lease, Duration::from_millis(250));
        assert_eq!(c.routes[1].window, Duration::from_secs(3600));
        assert_eq!(c.routes[1].on_error, OnError::FailOpen);
        assert!(matches!(
            c.routes[1].key,
            KeyRule::Header {
                required: false,
                ..
            }
        ));
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_name() {
        let e = err(r#"
[[routes]]
name = "a"
methods = ["POST"]
path = "/a"
key = { header = "Idempotency-Key", requierd = true }
"#);
        assert!(e.contains("requierd"), "{e}");
        let e = err("[defaults]\nleese = \"1s\"\n");
        assert!(e.contains("leese"), "{e}");
    }

    #[test]
    fn bad_duration_names_the_route_and_field() {
        let e = err(r#"
[[routes]]
name = "payments"
methods = ["POST"]
path = "/a"
key = { header = "Idempotency-Key" }
lease = "thirty seconds"
"#);
        assert!(e.starts_with("routes[payments].lease:"), "{e}");
        let e = err("[defaults]\nwindow = \"0s\"\n");
        assert!(e.contains("defaults.window"), "{e}");
    }

    #[test]
    fn key_rules_are_checked() {
        let route = |key: &str| {
            format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {key}\n")
        };
        assert!(err(&route("{ }")).contains("routes[r].key"));
        assert!(err(&route(r#"{ header = "A", fingerprint = ["path"] }"#)).contains("exactly one"));
        assert!(err(&route(r#"{ fingerprint = [] }"#)).contains("at least one"));
        assert!(err(&route(r#"{ fingerprint = ["jsn:/a"] }"#)).contains("jsn:/a"));
        assert!(err(&route(r#"{ fingerprint = ["json:a"] }"#)).contains("JSON pointer"));
        assert!(err(&route(r#"{ header = "bad header" }"#)).contains("header name"));
    }

    #[test]
    fn routes_need_unique_safe_names_methods_and_paths() {
        let r = |name: &str, methods: &str, path: &str| {
            format!("[[routes]]\nname = \"{name}\"\nmethods = {methods}\npath = \"{path}\"\nkey = {{ header = \"K\" }}\n")
        };
        assert!(err(&r("a:b", "[\"POST\"]", "/a")).contains("routes[a:b].name"));
        assert!(err(&r("a", "[]", "/a")).contains("routes[a].methods"));
        assert!(err(&r("a", "[\"PO ST\"]", "/a")).contains("not a method"));
        assert!(err(&r("a", "[\"POST\"]", "a")).contains("routes[a].path"));
        let twice = format!(
            "{}{}",
            r("a", "[\"POST\"]", "/a"),
            r("a", "[\"POST\"]", "/b")
        );
        assert!(err(&twice).contains("duplicate route name"));
    }

    #[test]
    fn store_settings_are_checked() {
        assert!(err("[store]\nbackend = \"redis\"\n").contains("store.url"));
        assert!(err("[store]\nbackend = \"mongo\"\n").contains("mongo"));
        assert!(err("[store]\nbackend = \"redis\"\nurl = \"http://x\"\n").contains("redis://"));
        assert!(err("[store]\nbackend = \"redis\"\nurl = \"rediss://x:6380\"\n").contains("TLS"));
        assert!(
            err("[store]\nbackend = \"redis\"\nurl = \"redis://x:notaport\"\n")
                .contains("store.url")
        );
        assert!(err("[store]\nbackend = \"redis-cluster\"\nurls = []\n").contains("store.urls"));
        let c = with("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\ntimeout = \"100ms\"\non_error = \"fail-open\"\n").unwrap();
        assert_eq!(c.store.timeout, Duration::from_millis(100));
        assert_eq!(c.store.urls, vec!["redis://127.0.0.1:6379/0".to_owned()]);
    }

    #[test]
    fn server_settings_are_checked() {
        let e = Config::from_toml("[server]\nlisten = \"nope\"\nupstream = \"http://a:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.listen"), "{e}");
        let e =
            Config::from_toml("[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"https://a:1\"\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("https"), "{e}");
        assert!(err("[admin]\nlisten = \"127.0.0.1:8080\"\n").contains("admin.listen"));
        let e = Config::from_toml(
            "[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://a:1\"\nmax_body = \"lots\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("server.max_body"), "{e}");
    }

    #[test]
    fn a_lease_shorter_than_the_upstream_timeout_is_warned_about() {
        let route = |lease: &str| {
            format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\nlease = \"{lease}\"\n")
        };
        let c = with(&route("30s")).unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].starts_with("routes[r].lease"),
            "{:?}",
            c.warnings
        );
        assert!(with(&route("31s")).unwrap().warnings.is_empty());
    }

    #[test]
    fn environment_overrides_apply_before_validation() {
        let mut f = FileConfig::parse(BASE).unwrap();
        f.apply_env(|k| match k {
            "DEDUPE_LISTEN" => Some("0.0.0.0:9999".into()),
            "DEDUPE_UPSTREAM" => Some("http://app:3000".into()),
            "DEDUPE_ADMIN_LISTEN" => Some("0.0.0.0:9901".into()),
            "DEDUPE_REDIS_URL" => Some("redis://redis:6379".into()),
            _ => None,
        });
        f.store.backend = Backend::Redis;
        let c = Config::from_file(f).unwrap();
        assert_eq!(c.server.listen.port(), 9999);
        assert_eq!(c.server.upstream.authority.as_str(), "app:3000");
        assert_eq!(c.admin.unwrap().listen.port(), 9901);
        assert_eq!(c.store.urls, vec!["redis://redis:6379".to_owned()]);
    }
}
