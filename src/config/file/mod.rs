//! Stage one: the file as written. Every struct rejects unknown fields, so a typo in a key
//! rule is an error instead of a route that silently does not dedupe.

use serde::Deserialize;

use super::server::UpstreamHttp2;

use super::store::Backend;
use super::{invalid, ConfigError};
use crate::protocol::route::{MatchMode, Mode, OnConflict, OnError, OnUnknown, Preset, StatusSpec};

mod errors;

pub use errors::{FileErrors, FileTemplate};

/// The TOML file, field for field.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a configuration file with a [server] table"
)]
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
    /// `[telemetry]`
    pub telemetry: Option<super::telemetry::FileTelemetry>,
    /// `[[routes]]`
    #[serde(default)]
    pub routes: Vec<FileRoute>,
    /// Which fields the environment set, so their errors name the variable.
    #[serde(skip)]
    pub(super) from_env: Vec<EnvOverride>,
}

/// A field set by a `DEDUPE_*` variable.
#[derive(Debug, Clone)]
pub(super) struct EnvOverride {
    /// The field, as errors name it (`server.listen`).
    pub(super) field: &'static str,
    /// The variable (`DEDUPE_LISTEN`).
    pub(super) var: &'static str,
}

/// `[server]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server] table")]
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
    /// How long a client may accept no response bytes before it is disconnected.
    pub write_timeout: Option<String>,
    /// How long in-flight requests may run after SIGTERM.
    pub shutdown_grace: Option<String>,
    /// Most client connections served at once; more wait in the listen backlog.
    pub max_connections: Option<usize>,
    /// Most concurrent HTTP/2 streams (requests) per connection.
    pub max_concurrent_streams: Option<u32>,
    /// Ceiling of the adaptive admission limit: most keyed requests between admission and
    /// their claim's answer.
    pub max_concurrent_claims: Option<usize>,
    /// Global budget of buffered bodies (keyed request bodies and the answers kept for the
    /// store), in bytes.
    pub max_buffered_bytes: Option<String>,
    /// How long a keyed request waits for a place under the admission limit before it is
    /// refused (`"0s"`: not at all).
    pub admission_timeout: Option<String>,
    /// Connection workers (threads, each its own runtime); absent: one per CPU.
    pub workers: Option<usize>,
    /// `https://` upstreams: PEM file of a private CA trusted besides the platform's roots.
    pub upstream_ca_file: Option<String>,
    /// `http://` upstreams: which calls go over HTTP/2 with prior knowledge (h2c):
    /// `"grpc"` (gRPC calls), `"prior-knowledge"` (every call) or `"off"`.
    pub upstream_http2: Option<UpstreamHttp2>,
    /// Request fields whose names hold `_` go upstream (absent: they are dropped).
    pub underscores_in_headers: Option<bool>,
    /// `[server.tls]`: TLS on the public listener.
    pub tls: Option<FileListenerTls>,
}

/// `[server.tls]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a [server.tls] table with cert_file and key_file"
)]
pub struct FileListenerTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: String,
    /// PEM private key of the leaf.
    pub key_file: String,
}

/// `[store]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [store] table")]
pub struct FileStore {
    /// Which backend.
    pub backend: Option<Backend>,
    /// Namespace of every stored key.
    pub prefix: Option<String>,
    /// Redis URL (`backend = "redis"`).
    pub url: Option<String>,
    /// Cluster seed URLs (`backend = "redis-cluster"`).
    pub urls: Option<Vec<String>>,
    /// Sentinel URLs (`backend = "redis-sentinel"`).
    pub sentinels: Option<Vec<String>>,
    /// The name the sentinels monitor the primary under (`backend = "redis-sentinel"`).
    pub master_name: Option<String>,
    /// Deadline of one store operation.
    pub timeout: Option<String>,
    /// Default failure behaviour.
    pub on_error: Option<OnError>,
    /// Memory backend: most records held before new claims fail.
    pub max_records: Option<usize>,
    /// Memory backend: most bytes of records held before new claims fail.
    pub max_bytes: Option<String>,
    /// Redis backend: bytes of completed records kept locally for replays (`0`: off).
    pub near_cache: Option<String>,
    /// Removed (the string layout is the only one): read only to be refused by name.
    pub record_layout: Option<serde::de::IgnoredAny>,
    /// Keys that seal stored records (`file:PATH` or `env:NAME`): the first seals, every
    /// one opens.
    pub encryption_keys: Option<Vec<String>>,
    /// `rediss://`: PEM file of the CA that signed Redis's certificate (else the
    /// platform's roots).
    pub tls_ca_file: Option<String>,
    /// `rediss://`: PEM client certificate for mutual TLS.
    pub tls_cert_file: Option<String>,
    /// `rediss://`: PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<String>,
    /// `rediss://`: accept any certificate (a warning at start).
    pub tls_insecure: Option<bool>,
    /// The Redis password from `DEDUPE_REDIS_PASSWORD`; never in the file, where it
    /// would sit beside everything else in a config map (so `store.password` in a file is
    /// an unknown field, and errors name it [`super::REDIS_PASSWORD`]).
    #[serde(skip)]
    pub password: Option<String>,
}

/// `[defaults]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [defaults] table")]
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
    /// What becomes of a claim whose outcome is unknown.
    pub on_unknown: Option<OnUnknown>,
    /// Upstream statuses that release the key.
    pub retry_statuses: Option<Vec<StatusSpec>>,
    /// Upstream statuses that leave the outcome unknown.
    pub unknown_statuses: Option<Vec<StatusSpec>>,
    /// The dialect of the gateway's own answers (a preset route keeps problem+json).
    pub errors: Option<FileErrors>,
    /// Problem types become `{problem_base_url}{name}` instead of the gateway's URN.
    pub problem_base_url: Option<String>,
}

/// `[admin]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an [admin] table")]
pub struct FileAdmin {
    /// Admin listen address.
    pub listen: String,
    /// Optional bearer token: the token itself, or `env:NAME` / `file:/path` naming where
    /// it is.
    pub token: Option<String>,
    /// Most admin connections served at once.
    pub max_connections: Option<usize>,
    /// Serve the admin API without a token on an address that is not loopback.
    pub allow_unauthenticated: Option<bool>,
}

/// `verify = { scheme, secrets, tolerance }` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { scheme = \"stripe\", secrets = [\"env:STRIPE_WEBHOOK_SECRET\"] }"
)]
pub struct FileVerify {
    /// Whose signature (optional with a preset).
    pub scheme: Option<crate::protocol::verify::Scheme>,
    /// Where the secrets are: `env:NAME` or `file:/path`; the first that verifies wins.
    pub secrets: Vec<String>,
    /// How far from now a signed timestamp may be.
    pub tolerance: Option<String>,
}

/// `key = { ... }` as written: exactly one of `header` or `fingerprint`.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { header = \"Idempotency-Key\" } or { fingerprint = [\"path\"] }"
)]
pub struct FileKey {
    /// Header carrying the client's key.
    pub header: Option<String>,
    /// Whether a request without the header is refused (400) or passed through.
    pub required: Option<bool>,
    /// Request parts hashed into the key.
    pub fingerprint: Option<Vec<String>>,
}

/// `order = { entity, version, compare }` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table like { entity = \"json:/data/id\", version = \"json:/data/version\", compare = \"integer\" }"
)]
pub struct FileOrder {
    /// The request part naming the entity.
    pub entity: String,
    /// The request part carrying its version.
    pub version: String,
    /// `integer`, `timestamp` or `string`.
    pub compare: Option<crate::protocol::key::order::Compare>,
}

/// `match = ...` as written.
#[derive(Debug, Clone)]
pub enum FileMatch {
    /// `"request"` or `"key"`.
    Mode(MatchMode),
    /// A list of request parts.
    Parts(Vec<String>),
}

impl<'de> Deserialize<'de> for FileMatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileMatch;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"request\", \"key\" or a list of request parts")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FileMatch, E> {
                MatchMode::deserialize(serde::de::value::StrDeserializer::<E>::new(v))
                    .map(FileMatch::Mode)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<FileMatch, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    parts.push(p);
                }
                Ok(FileMatch::Parts(parts))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `[[routes]]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[routes]] table")]
pub struct FileRoute {
    /// Unique route name (letters, digits, `-`, `_`).
    pub name: String,
    /// Methods deduped on this route.
    pub methods: Vec<String>,
    /// `enforce` (default), `shadow` (measure only) or `off` (pass through).
    pub mode: Option<Mode>,
    /// Exact path, or a glob such as `/v1/payments/*`.
    pub path: String,
    /// A webhook provider whose key, scope, `match` and window the route takes where it
    /// sets none of its own.
    pub preset: Option<Preset>,
    /// Key rule (optional with a preset).
    pub key: Option<FileKey>,
    /// Parts whose hash namespaces the key.
    pub scope: Option<Vec<String>>,
    /// What must be equal for a repeat to be a replay: `"request"`, `"key"` or parts.
    #[serde(rename = "match")]
    pub must_match: Option<FileMatch>,
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
    /// Overrides `[defaults] on_unknown`.
    pub on_unknown: Option<OnUnknown>,
    /// Overrides `[defaults] retry_statuses`.
    pub retry_statuses: Option<Vec<StatusSpec>>,
    /// Overrides `[defaults] unknown_statuses`.
    pub unknown_statuses: Option<Vec<StatusSpec>>,
    /// gRPC methods (`/package.Service/Method`): one request message, hashed after its
    /// `grpc-encoding`; statuses read from `grpc-status`; the gateway answers in gRPC.
    pub grpc: Option<bool>,
    /// gRPC status codes that release the key (a `grpc = true` route).
    pub grpc_retry_codes: Option<Vec<crate::protocol::grpc::status::Code>>,
    /// gRPC status codes that leave the outcome unknown (a `grpc = true` route).
    pub grpc_unknown_codes: Option<Vec<crate::protocol::grpc::status::Code>>,
    /// Whether the upstream's body and headers are stored for replay (`false`: only the
    /// outcome is).
    pub store_body: Option<bool>,
    /// Headers never stored for replay: names, or prefixes ending in `*`.
    #[serde(default)]
    pub replay_drop_headers: Vec<String>,
    /// Whether won and replayed answers carry `Idempotency-Expires`.
    pub advertise_expiry: Option<bool>,
    /// Overrides `[defaults] errors` (and a preset's problem+json).
    pub errors: Option<FileErrors>,
    /// Overrides `[defaults] problem_base_url`.
    pub problem_base_url: Option<String>,
    /// Out-of-order versions: stale writes are answered, never forwarded.
    pub order: Option<FileOrder>,
    /// Accept methods outside RFC 9110's set and PATCH (WebDAV-style APIs); without it such
    /// a method is refused as a likely typo.
    pub allow_extension_methods: Option<bool>,
    /// Webhook signatures checked before the claim.
    pub verify: Option<FileVerify>,
}

impl FileConfig {
    /// Parses TOML text. Syntax errors carry toml's line and column; a field of the wrong
    /// type or an unknown one is named by its path, with a route by its name
    /// (`routes[payments].lease: expected a duration like "30s", found integer `5``).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let deserializer = toml::Deserializer::parse(text)?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let message = e.inner().message();
            let mut at = field_path(e.path(), text);
            // The unknown name is in the message; the path stops at its table, so the
            // name is said once.
            if message.starts_with("unknown field") {
                at = at
                    .rsplit_once('.')
                    .map_or("configuration", |(table, _)| table)
                    .to_owned();
            }
            let message = plain_message(&at, message);
            invalid(at, message)
        })
    }
}

/// `routes[0].key.header` as `routes[payments].key.header`: a route is named by its name.
fn field_path(path: &serde_path_to_error::Path, text: &str) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    let mut in_routes = false;
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
                in_routes = out == "routes";
            }
            Segment::Seq { index } if in_routes => {
                out.push_str(&format!("[{}]", route_name(text, *index)));
                in_routes = false;
            }
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    if out.is_empty() {
        out.push_str("configuration");
    }
    out
}

/// The name of the `index`th route, or the index when it has none.
fn route_name(text: &str, index: usize) -> String {
    text.parse::<toml::Table>()
        .ok()
        .and_then(|t| {
            t.get("routes")?
                .get(index)?
                .get("name")?
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| index.to_string())
}

/// serde's message in the user's words: what the field expects (a duration, a size), then
/// what was found; no Rust type names.
fn plain_message(at: &str, message: &str) -> String {
    let field = at.rsplit('.').next().unwrap_or(at);
    // toml's own words for a non-string where an enum belongs.
    if message == "wanted string or table" {
        let expected = expected_for(field).unwrap_or("a string");
        return format!("expected {expected}");
    }
    let reshaped = ["invalid type: ", "invalid value: "]
        .iter()
        .find_map(|prefix| {
            let (found, expected) = message.strip_prefix(prefix)?.rsplit_once(", expected ")?;
            Some((found.to_owned(), expected.to_owned()))
        });
    let Some((found, expected)) = reshaped else {
        return message.to_owned();
    };
    let expected = expected_for(field).unwrap_or(match expected.as_str() {
        "usize" | "u32" | "u64" => "a whole number of at least 1",
        "a sequence" => "an array",
        other => other,
    });
    format!("expected {expected}, found {found}")
}

/// What a field holds, in the words of the configuration reference (docs/configuration.md),
/// where serde's would be unhelpful.
fn expected_for(field: &str) -> Option<&'static str> {
    Some(match field {
        "lease"
        | "window"
        | "conflict_wait"
        | "timeout"
        | "upstream_timeout"
        | "connect_timeout"
        | "header_read_timeout"
        | "body_read_timeout"
        | "write_timeout"
        | "shutdown_grace"
        | "admission_timeout"
        | "tolerance" => "a duration like \"30s\"",
        "max_body" | "max_cached_body" | "max_header_bytes" | "max_buffered_bytes" => {
            "a size like \"1MiB\""
        }
        "on_error" => "\"fail-closed\" or \"fail-open\"",
        "on_conflict" => "\"reject\" or \"wait\"",
        "on_unknown" => "\"retry\" or \"hold\"",
        "mode" => "\"enforce\", \"shadow\" or \"off\"",
        "preset" | "scheme" => "\"stripe\", \"github\", \"shopify\" or \"standard-webhooks\"",
        "backend" => "\"memory\", \"redis\", \"redis-cluster\" or \"redis-sentinel\"",
        "match" => "\"request\", \"key\" or a list of request parts",
        "errors" => "\"problem\", \"stripe\" or a table like { template = \"errors.json\" }",
        _ => return None,
    })
}
