//! Stage one: the file as written. Every struct rejects unknown fields, so a typo in a key
//! rule is an error instead of a route that silently does not dedupe.

use serde::Deserialize;

use super::store::Backend;
use super::{invalid, ConfigError};
use crate::route::{OnConflict, OnError};

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
    /// How long in-flight requests may run after SIGTERM.
    pub shutdown_grace: Option<String>,
    /// Most client connections served at once; more wait in the listen backlog.
    pub max_connections: Option<usize>,
    /// Most concurrent HTTP/2 streams (requests) per connection.
    pub max_concurrent_streams: Option<u32>,
}

/// `[store]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileStore {
    /// Which backend.
    pub backend: Option<Backend>,
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
}
