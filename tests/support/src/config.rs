//! A typed builder for gateway config files.
//!
//! Tests describe the config they need in code; `to_toml` renders it as the file text the
//! real loader then parses (`Config::from_toml` in process, a file for the binary), so the
//! parser is exercised on every test. Durations and sizes stay strings in the file's own
//! vocabulary ("2s", "64KiB"). Tests of the parser's handling of particular text (typos,
//! bad values) keep that text literally instead.

use serde::Serialize;

/// A whole config file. Listens on `127.0.0.1:0`; everything left unset is left out of
/// the file, so the gateway's defaults apply.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayConfig {
    server: Server,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<StoreCfg>,
    #[serde(skip_serializing_if = "Defaults::is_empty")]
    defaults: Defaults,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<Admin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    telemetry: Option<Telemetry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<RouteCfg>,
}

#[derive(Debug, Clone, Serialize)]
struct Telemetry {
    otlp_endpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sample_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Server {
    listen: String,
    upstream: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    header_read_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_read_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shutdown_grace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    write_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_concurrent_claims: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_buffered_bytes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admission_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    underscores_in_headers: Option<bool>,
    // Last: a table follows the plain values.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<ListenerTls>,
}

#[derive(Debug, Clone, Serialize)]
struct ListenerTls {
    cert_file: String,
    key_file: String,
}

#[derive(Debug, Clone, Default, Serialize)]
struct Defaults {
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem_base_url: Option<String>,
    // Last: it may be a table.
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<toml::Value>,
}

impl Defaults {
    fn is_empty(&self) -> bool {
        self.lease.is_none()
            && self.window.is_none()
            && self.errors.is_none()
            && self.problem_base_url.is_none()
    }
}

#[derive(Debug, Clone, Serialize)]
struct Admin {
    listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_unauthenticated: Option<bool>,
}

impl GatewayConfig {
    /// A gateway on `127.0.0.1:0` in front of `upstream`, with no routes.
    pub fn new(upstream: impl Into<String>) -> Self {
        Self {
            server: Server {
                listen: "127.0.0.1:0".to_owned(),
                upstream: upstream.into(),
                upstream_timeout: None,
                max_body: None,
                header_read_timeout: None,
                body_read_timeout: None,
                shutdown_grace: None,
                write_timeout: None,
                max_connections: None,
                max_concurrent_claims: None,
                max_buffered_bytes: None,
                admission_timeout: None,
                workers: None,
                upstream_ca_file: None,
                underscores_in_headers: None,
                tls: None,
            },
            store: None,
            defaults: Defaults::default(),
            admin: None,
            telemetry: None,
            routes: Vec::new(),
        }
    }

    /// `server.underscores_in_headers`.
    pub fn underscores_in_headers(mut self, keep: bool) -> Self {
        self.server.underscores_in_headers = Some(keep);
        self
    }

    /// `server.upstream_ca_file`.
    pub fn upstream_ca_file(mut self, path: &std::path::Path) -> Self {
        self.server.upstream_ca_file = Some(crate::tls::path_str(path));
        self
    }

    /// `[server.tls]`: TLS on the public listener with `files`.
    pub fn listener_tls(mut self, files: &crate::CertFiles) -> Self {
        self.server.tls = Some(ListenerTls {
            cert_file: crate::tls::path_str(&files.cert),
            key_file: crate::tls::path_str(&files.key),
        });
        self
    }

    /// `server.listen`.
    pub fn listen(mut self, addr: &str) -> Self {
        self.server.listen = addr.to_owned();
        self
    }

    /// `server.upstream_timeout`.
    pub fn upstream_timeout(mut self, d: &str) -> Self {
        self.server.upstream_timeout = Some(d.to_owned());
        self
    }

    /// `server.max_body`.
    pub fn max_body(mut self, size: &str) -> Self {
        self.server.max_body = Some(size.to_owned());
        self
    }

    /// `server.header_read_timeout`.
    pub fn header_read_timeout(mut self, d: &str) -> Self {
        self.server.header_read_timeout = Some(d.to_owned());
        self
    }

    /// `server.body_read_timeout`.
    pub fn body_read_timeout(mut self, d: &str) -> Self {
        self.server.body_read_timeout = Some(d.to_owned());
        self
    }

    /// `server.shutdown_grace`.
    pub fn shutdown_grace(mut self, d: &str) -> Self {
        self.server.shutdown_grace = Some(d.to_owned());
        self
    }

    /// `server.max_connections`.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.server.max_connections = Some(n);
        self
    }

    /// `server.max_concurrent_claims`: the admission limit's ceiling.
    pub fn max_concurrent_claims(mut self, n: usize) -> Self {
        self.server.max_concurrent_claims = Some(n);
        self
    }

    /// `server.max_buffered_bytes`: the budget of buffered bodies.
    pub fn max_buffered_bytes(mut self, size: &str) -> Self {
        self.server.max_buffered_bytes = Some(size.to_owned());
        self
    }

    /// `server.admission_timeout`: how long a keyed request waits for a place.
    pub fn admission_timeout(mut self, wait: &str) -> Self {
        self.server.admission_timeout = Some(wait.to_owned());
        self
    }

    /// `server.workers`.
    pub fn workers(mut self, n: usize) -> Self {
        self.server.workers = Some(n);
        self
    }

    /// The `[store]` section.
    pub fn store(mut self, store: StoreCfg) -> Self {
        self.store = Some(store);
        self
    }

    /// `defaults.lease`.
    pub fn default_lease(mut self, d: &str) -> Self {
        self.defaults.lease = Some(d.to_owned());
        self
    }

    /// `defaults.window`.
    pub fn default_window(mut self, d: &str) -> Self {
        self.defaults.window = Some(d.to_owned());
        self
    }

    /// `defaults.errors = name` (`"problem"`, `"stripe"`).
    pub fn default_errors(mut self, name: &str) -> Self {
        self.defaults.errors = Some(toml::Value::String(name.to_owned()));
        self
    }

    /// `defaults.problem_base_url`.
    pub fn default_problem_base_url(mut self, url: &str) -> Self {
        self.defaults.problem_base_url = Some(url.to_owned());
        self
    }

    /// An admin listener on `127.0.0.1:0` without a token.
    pub fn admin(self) -> Self {
        self.admin_listen("127.0.0.1:0")
    }

    /// An admin listener on `addr` without a token (beyond loopback, the gateway refuses
    /// that unless [`GatewayConfig::admin_allow_unauthenticated`]).
    pub fn admin_listen(mut self, addr: &str) -> Self {
        self.admin = Some(Admin {
            listen: addr.to_owned(),
            token: None,
            max_connections: None,
            allow_unauthenticated: None,
        });
        self
    }

    /// `admin.allow_unauthenticated` (adds an admin listener if there is none).
    pub fn admin_allow_unauthenticated(mut self, allow: bool) -> Self {
        if self.admin.is_none() {
            self = self.admin();
        }
        if let Some(a) = self.admin.as_mut() {
            a.allow_unauthenticated = Some(allow);
        }
        self
    }

    /// `admin.max_connections` (adds an admin listener if there is none).
    pub fn admin_max_connections(mut self, n: usize) -> Self {
        if self.admin.is_none() {
            self = self.admin();
        }
        if let Some(a) = self.admin.as_mut() {
            a.max_connections = Some(n);
        }
        self
    }

    /// `server.write_timeout`.
    pub fn write_timeout(mut self, d: &str) -> Self {
        self.server.write_timeout = Some(d.to_owned());
        self
    }

    /// An admin listener on `127.0.0.1:0` behind `token`.
    pub fn admin_with_token(mut self, token: &str) -> Self {
        self.admin = Some(Admin {
            listen: "127.0.0.1:0".to_owned(),
            token: Some(token.to_owned()),
            max_connections: None,
            allow_unauthenticated: None,
        });
        self
    }

    /// Adds a route after those already added (the first match wins).
    pub fn route(mut self, route: RouteCfg) -> Self {
        self.routes.push(route);
        self
    }

    /// `[telemetry] otlp_endpoint` (and `service_name` when given): spans are exported.
    pub fn telemetry(mut self, otlp_endpoint: &str, service_name: Option<&str>) -> Self {
        self.telemetry = Some(Telemetry {
            otlp_endpoint: otlp_endpoint.to_owned(),
            service_name: service_name.map(str::to_owned),
            sample_ratio: None,
        });
        self
    }

    /// `telemetry.sample_ratio` (after [`GatewayConfig::telemetry`]).
    pub fn telemetry_sample_ratio(mut self, ratio: f64) -> Self {
        if let Some(t) = self.telemetry.as_mut() {
            t.sample_ratio = Some(ratio);
        }
        self
    }

    /// Whether the file has an `[admin]` section.
    pub(crate) fn has_admin(&self) -> bool {
        self.admin.is_some()
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a test config renders as TOML")
    }
}

/// The `[store]` section.
#[derive(Debug, Clone, Serialize)]
pub struct StoreCfg {
    backend: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    urls: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sentinels: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    master_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_bytes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_records: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    near_cache: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    encryption_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_insecure: Option<bool>,
}

impl StoreCfg {
    fn backend(backend: &'static str) -> Self {
        Self {
            backend,
            url: None,
            urls: None,
            sentinels: None,
            master_name: None,
            timeout: None,
            prefix: None,
            max_bytes: None,
            max_records: None,
            near_cache: None,
            encryption_keys: Vec::new(),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_insecure: None,
        }
    }

    /// `backend = "memory"`: the embedded store.
    pub fn memory() -> Self {
        Self::backend("memory")
    }

    /// `backend = "redis"` at `url`.
    pub fn redis(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::backend("redis")
        }
    }

    /// `backend = "redis-cluster"` seeded with `urls`.
    pub fn cluster(urls: Vec<String>) -> Self {
        Self {
            urls: Some(urls),
            ..Self::backend("redis-cluster")
        }
    }

    /// `backend = "redis-sentinel"`: the primary `sentinels` monitor as `master_name`.
    pub fn sentinel(sentinels: Vec<String>, master_name: &str) -> Self {
        Self {
            sentinels: Some(sentinels),
            master_name: Some(master_name.to_owned()),
            ..Self::backend("redis-sentinel")
        }
    }

    /// `store.timeout`.
    pub fn timeout(mut self, d: &str) -> Self {
        self.timeout = Some(d.to_owned());
        self
    }

    /// `store.max_bytes` (memory backend).
    pub fn max_bytes(mut self, size: &str) -> Self {
        self.max_bytes = Some(size.to_owned());
        self
    }

    /// `store.max_records` (memory backend).
    pub fn max_records(mut self, records: u64) -> Self {
        self.max_records = Some(records);
        self
    }

    /// `store.near_cache` (redis backend).
    pub fn near_cache(mut self, size: &str) -> Self {
        self.near_cache = Some(size.to_owned());
        self
    }

    /// `store.prefix`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.to_owned());
        self
    }

    /// `store.encryption_keys` (`"file:PATH"` or `"env:NAME"`), the first encrypting.
    pub fn encryption_keys(mut self, sources: &[String]) -> Self {
        self.encryption_keys = sources.to_vec();
        self
    }

    /// `store.tls_ca_file`.
    pub fn tls_ca_file(mut self, path: &std::path::Path) -> Self {
        self.tls_ca_file = Some(crate::tls::path_str(path));
        self
    }

    /// `store.tls_cert_file` and `store.tls_key_file`.
    pub fn tls_client_cert(mut self, files: &crate::CertFiles) -> Self {
        self.tls_cert_file = Some(crate::tls::path_str(&files.cert));
        self.tls_key_file = Some(crate::tls::path_str(&files.key));
        self
    }

    /// `store.tls_insecure`.
    pub fn tls_insecure(mut self, insecure: bool) -> Self {
        self.tls_insecure = Some(insecure);
        self
    }
}

/// One `[[routes]]` entry; `methods = ["POST"]` unless set.
#[derive(Debug, Clone, Serialize)]
pub struct RouteCfg {
    name: String,
    methods: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preset: Option<&'static str>,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<Key>,
    /// `None` leaves `scope` out of the file; a header route the test gives no scope gets
    /// `scope = []` written, as the gateway requires of a header key (one caller).
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_conflict: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conflict_wait: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_cached_body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_unknown: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_statuses: Option<Vec<Status>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unknown_statuses: Option<Vec<Status>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store_body: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    replay_drop_headers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise_expiry: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<toml::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem_base_url: Option<String>,
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    must_match: Option<toml::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    order: Option<Order>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verify: Option<Verify>,
}

/// `verify = { scheme, secrets, tolerance }`.
#[derive(Debug, Clone, Serialize)]
struct Verify {
    #[serde(skip_serializing_if = "Option::is_none")]
    scheme: Option<String>,
    secrets: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tolerance: Option<String>,
}

/// `order = { entity, version, compare }`.
#[derive(Debug, Clone, Serialize)]
struct Order {
    entity: String,
    version: String,
    compare: String,
}

/// A status list entry: a number, or a class such as `"5xx"`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
enum Status {
    Code(u16),
    Class(String),
}

fn statuses(list: &[&str]) -> Vec<Status> {
    list.iter()
        .map(|s| match s.parse() {
            Ok(code) => Status::Code(code),
            Err(_) => Status::Class(s.to_string()),
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
struct Key {
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    required: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fingerprint: Option<Vec<String>>,
}

impl RouteCfg {
    fn keyed(name: &str, path: &str, key: Option<Key>) -> Self {
        Self {
            name: name.to_owned(),
            methods: vec!["POST".to_owned()],
            mode: None,
            preset: None,
            path: path.to_owned(),
            // A header key needs a scope written; a test that sets none means one caller.
            scope: key
                .as_ref()
                .filter(|k| k.header.is_some())
                .map(|_| Vec::new()),
            key,
            lease: None,
            window: None,
            on_conflict: None,
            conflict_wait: None,
            max_cached_body: None,
            on_error: None,
            on_unknown: None,
            retry_statuses: None,
            unknown_statuses: None,
            grpc: None,
            store_body: None,
            replay_drop_headers: Vec::new(),
            advertise_expiry: None,
            errors: None,
            problem_base_url: None,
            must_match: None,
            order: None,
            verify: None,
        }
    }

    /// A route keyed by the `Idempotency-Key` header.
    pub fn header(name: &str, path: &str) -> Self {
        let key = Key {
            header: Some("Idempotency-Key".to_owned()),
            required: None,
            fingerprint: None,
        };
        Self::keyed(name, path, Some(key))
    }

    /// A route whose key, `match` and window come from a webhook preset (`"stripe"`,
    /// `"github"`, `"shopify"`, `"standard-webhooks"`).
    pub fn preset(name: &str, path: &str, preset: &'static str) -> Self {
        Self {
            preset: Some(preset),
            ..Self::keyed(name, path, None)
        }
    }

    /// `key = { header = name }` (on a preset route: overrides the preset's key).
    pub fn key_header(mut self, name: &str) -> Self {
        self.key = Some(Key {
            header: Some(name.to_owned()),
            required: None,
            fingerprint: None,
        });
        // A preset route keeps its preset's scope; any other header route needs one written.
        if self.preset.is_none() && self.scope.is_none() {
            self.scope = Some(Vec::new());
        }
        self
    }

    /// `grpc = true`: gRPC methods, keyed by the `idempotency-key` metadata header.
    pub fn grpc(name: &str, path: &str) -> Self {
        Self {
            grpc: Some(true),
            ..Self::header(name, path).key_header("idempotency-key")
        }
    }

    /// `mode = "enforce" | "shadow" | "off"`.
    pub fn mode(mut self, mode: &'static str) -> Self {
        self.mode = Some(mode);
        self
    }

    /// A route keyed by a fingerprint of `fields` (`method`, `path`, `json:/ptr`,
    /// `header:Name`, ...).
    pub fn fingerprint(name: &str, path: &str, fields: &[&str]) -> Self {
        let key = Key {
            header: None,
            required: None,
            fingerprint: Some(fields.iter().map(|f| f.to_string()).collect()),
        };
        Self::keyed(name, path, Some(key))
    }

    /// `methods`.
    pub fn methods(mut self, methods: &[&str]) -> Self {
        self.methods = methods.iter().map(|m| m.to_string()).collect();
        self
    }

    /// `key.required`.
    pub fn required(mut self, required: bool) -> Self {
        if let Some(key) = self.key.as_mut() {
            key.required = Some(required);
        }
        self
    }

    /// `scope`.
    pub fn scope(mut self, fields: &[&str]) -> Self {
        self.scope = Some(fields.iter().map(|f| f.to_string()).collect());
        self
    }

    /// `lease`.
    pub fn lease(mut self, d: &str) -> Self {
        self.lease = Some(d.to_owned());
        self
    }

    /// `window`.
    pub fn window(mut self, d: &str) -> Self {
        self.window = Some(d.to_owned());
        self
    }

    /// `on_conflict = "wait"` with `conflict_wait = d`.
    pub fn on_conflict_wait(mut self, d: &str) -> Self {
        self.on_conflict = Some("wait");
        self.conflict_wait = Some(d.to_owned());
        self
    }

    /// `on_conflict = "join"` with `conflict_wait = d` (the wait where there is nothing
    /// to join).
    pub fn on_conflict_join(mut self, d: &str) -> Self {
        self.on_conflict = Some("join");
        self.conflict_wait = Some(d.to_owned());
        self
    }

    /// `max_cached_body`.
    pub fn max_cached_body(mut self, size: &str) -> Self {
        self.max_cached_body = Some(size.to_owned());
        self
    }

    /// `on_unknown = "hold"`.
    pub fn on_unknown_hold(mut self) -> Self {
        self.on_unknown = Some("hold");
        self
    }

    /// `retry_statuses`: numbers (`"429"`) or classes (`"5xx"`).
    pub fn retry_statuses(mut self, list: &[&str]) -> Self {
        self.retry_statuses = Some(statuses(list));
        self
    }

    /// `unknown_statuses`: numbers (`"504"`) or classes (`"5xx"`).
    pub fn unknown_statuses(mut self, list: &[&str]) -> Self {
        self.unknown_statuses = Some(statuses(list));
        self
    }

    /// `match = "request"` or `match = "key"`.
    pub fn match_mode(mut self, mode: &str) -> Self {
        self.must_match = Some(toml::Value::String(mode.to_owned()));
        self
    }

    /// `match = [parts]`.
    pub fn match_parts(mut self, parts: &[&str]) -> Self {
        self.must_match = Some(toml::Value::Array(
            parts
                .iter()
                .map(|p| toml::Value::String(p.to_string()))
                .collect(),
        ));
        self
    }

    /// `on_error = "fail-open"`.
    pub fn fail_open(mut self) -> Self {
        self.on_error = Some("fail-open");
        self
    }

    /// `store_body`.
    pub fn store_body(mut self, store: bool) -> Self {
        self.store_body = Some(store);
        self
    }

    /// `replay_drop_headers`.
    pub fn replay_drop_headers(mut self, patterns: &[&str]) -> Self {
        self.replay_drop_headers = patterns.iter().map(|p| p.to_string()).collect();
        self
    }

    /// `advertise_expiry`.
    pub fn advertise_expiry(mut self, advertise: bool) -> Self {
        self.advertise_expiry = Some(advertise);
        self
    }

    /// `verify = { secrets }`: webhook signatures checked before the claim, the scheme the
    /// preset's; `secrets` are sources (`"file:/path"`, `"env:NAME"`).
    pub fn verify(mut self, secrets: &[String]) -> Self {
        self.verify = Some(Verify {
            scheme: None,
            secrets: secrets.to_vec(),
            tolerance: None,
        });
        self
    }

    /// `verify.scheme` (after [`RouteCfg::verify`]).
    pub fn verify_scheme(mut self, scheme: &str) -> Self {
        if let Some(v) = self.verify.as_mut() {
            v.scheme = Some(scheme.to_owned());
        }
        self
    }

    /// `verify.tolerance` (after [`RouteCfg::verify`]).
    pub fn verify_tolerance(mut self, tolerance: &str) -> Self {
        if let Some(v) = self.verify.as_mut() {
            v.tolerance = Some(tolerance.to_owned());
        }
        self
    }

    /// `errors = name`: `"problem"` or `"stripe"`.
    pub fn errors(mut self, name: &str) -> Self {
        self.errors = Some(toml::Value::String(name.to_owned()));
        self
    }

    /// `errors = { template = path, content_type }`.
    pub fn errors_template(mut self, path: &std::path::Path, content_type: &str) -> Self {
        let mut t = toml::Table::new();
        t.insert("template".into(), crate::tls::path_str(path).into());
        t.insert("content_type".into(), content_type.into());
        self.errors = Some(toml::Value::Table(t));
        self
    }

    /// `problem_base_url`.
    pub fn problem_base_url(mut self, url: &str) -> Self {
        self.problem_base_url = Some(url.to_owned());
        self
    }

    /// `order = { entity, version, compare }`: out-of-order versions.
    pub fn order(mut self, entity: &str, version: &str, compare: &str) -> Self {
        self.order = Some(Order {
            entity: entity.to_owned(),
            version: version.to_owned(),
            compare: compare.to_owned(),
        });
        self
    }
}
