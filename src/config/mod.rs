//! Configuration in two stages: the `File*` structs ([`file`]) mirror the TOML file and
//! reject unknown fields (a typo in a key rule must never silently switch dedupe off); then
//! [`Config::from_file`] validates them into a [`Config`] with parsed durations, sizes,
//! header names and compiled path matchers. Every error names the route and the field.
//!
//! - [`file`]: the file as written; [`env`]: the `DEDUPE_*` overrides applied to it;
//! - [`defaults`]: every default, named;
//! - `server`, `store`, `routes`, `admin`, `telemetry`: validation of each section; `verify`: a route's
//!   webhook signatures; `errors`: the dialect of the gateway's own answers; `parse`: value
//!   syntaxes; `secrets`: `env:` and `file:` sources.
//!
//! Validation reads files but opens no socket: [`Config::load`] reads the config file, and
//! validation reads every file the config names (the PEM files of `server.tls`,
//! `server.upstream_ca_file` and `store.tls_*`, the key files of `store.encryption_keys`,
//! the `file:` secrets of `routes[].verify.secrets` and `admin.token`, the `errors`
//! templates) and the `env:` ones,
//! so a missing or unusable one is refused here, naming its field, before any port is bound.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

mod admin;
pub mod defaults;
mod env;
mod errors;
mod file;
pub mod files;
mod grpc;
mod lints;
mod parse;
pub mod reload;
mod routes;
mod secrets;
mod server;
mod store;
mod telemetry;
#[cfg(test)]
mod tests;
pub mod tls;
mod verify;

pub use crate::protocol::route::{OnConflict, OnError};
pub use env::{ENV_OVERRIDES, REDIS_PASSWORD};
pub use file::{
    FileAdmin, FileConfig, FileDefaults, FileKey, FileListenerTls, FileMatch, FileRoute,
    FileServer, FileStore, FileVerify,
};
pub use parse::format_duration;
pub use server::{ListenerTls, ServerConfig, UpstreamHttp2, UpstreamTarget};
pub use store::{redact_url, Backend, RedisAccess, StoreBackend, StoreConfig};
pub use telemetry::{FileTelemetry, TelemetryConfig};

use crate::protocol::route::{Dialect, Route};

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
    /// The file is not valid TOML.
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
    /// A `DEDUPE_*` environment variable set a field to a value the gateway cannot use.
    #[error("{var}: {message} (it sets {at})")]
    Env {
        /// The variable: `DEDUPE_LISTEN`, ...
        var: &'static str,
        /// The field it sets: `server.listen`, ...
        at: String,
        /// What is wrong with the value.
        message: String,
    },
}

pub(crate) fn invalid(at: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        at: at.into(),
        message: message.into(),
    }
}

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
    /// How the gateway's answers made before a request has a route are written
    /// (`[defaults] errors` and `problem_base_url`).
    pub errors: Dialect,
    /// Where traces go, when they are exported (`[telemetry]`).
    pub telemetry: Option<TelemetryConfig>,
    /// Valid but risky settings, for `check` to print and `run` to log.
    pub warnings: Vec<String>,
}

/// Validated `[admin]`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Admin listen address.
    pub listen: SocketAddr,
    /// Bearer token required on every admin request, when set.
    pub token: Option<String>,
    /// Most admin connections served at once.
    pub max_connections: usize,
    /// The file allows an admin API without a token beyond loopback.
    pub allow_unauthenticated: bool,
}

impl AdminConfig {
    /// Whether anyone beyond this host who reaches the admin port may use it: no token,
    /// and an address that is not loopback (only ever with `allow_unauthenticated`).
    pub fn is_open(&self) -> bool {
        self.token.is_none() && !self.listen.ip().is_loopback()
    }
}

impl std::fmt::Debug for AdminConfig {
    // Never the token: a `Debug` of the configuration ends up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("max_connections", &self.max_connections)
            .field("allow_unauthenticated", &self.allow_unauthenticated)
            .finish()
    }
}

impl Config {
    /// Reads, parses, applies environment overrides and validates a config file.
    pub fn load(path: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let read = |path: &Path| {
            let bytes =
                crate::config::files::read_bounded(path, crate::config::files::MAX_CONFIG_FILE)?;
            String::from_utf8(bytes)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
        };
        let text = read(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut file = FileConfig::parse(&text)?;
        file.apply_env(&env);
        Self::from_file_in(file, &env)
    }

    /// Parses and validates TOML text without environment overrides.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_file(FileConfig::parse(text)?)
    }

    /// Validates a parsed file. An `env:` secret finds no variable here: only
    /// [`Config::load`] and [`Config::from_file_in`] see an environment.
    pub fn from_file(file: FileConfig) -> Result<Self, ConfigError> {
        Self::from_file_in(file, &|_| None)
    }

    /// Validates a parsed file, reading `env:` secrets from `env`.
    pub fn from_file_in(
        file: FileConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        Self::validate(&file, env).map_err(|e| match e {
            ConfigError::Invalid { at, message } => match file.env_var_for(&at) {
                Some(var) => ConfigError::Env { var, at, message },
                None => ConfigError::Invalid { at, message },
            },
            e => e,
        })
    }

    fn validate(
        file: &FileConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let server = server::validate(&file.server)?;
        let store = store::validate(&file.store, env)?;
        let admin = file
            .admin
            .as_ref()
            .map(|a| {
                let listen = parse::addr("admin.listen", &a.listen)?;
                if listen == server.listen && listen.port() != 0 {
                    return Err(invalid(
                        "admin.listen",
                        "must differ from server.listen: the admin port is never the public port",
                    ));
                }
                let token = admin::token(a, listen, env)?;
                let max_connections = parse::count(
                    "admin.max_connections",
                    a.max_connections,
                    defaults::DEFAULT_ADMIN_MAX_CONNECTIONS,
                    defaults::MAX_ADMIN_CONNECTIONS,
                )?;
                Ok(AdminConfig {
                    listen,
                    token,
                    max_connections,
                    allow_unauthenticated: admin::allow_unauthenticated(a),
                })
            })
            .transpose()?;

        let telemetry = telemetry::validate(file.telemetry.as_ref())?;
        let inherited = routes::Inherited::from_file(&file.defaults, file.store.on_error)?;

        let mut names = HashSet::new();
        let mut routes = Vec::with_capacity(file.routes.len());
        for (i, r) in file.routes.iter().enumerate() {
            let at = if r.name.is_empty() {
                format!("routes[{i}]")
            } else {
                format!("routes[{}]", r.name)
            };
            let route = routes::validate(&at, r, &inherited, env)?;
            if !names.insert(route.name.clone()) {
                return Err(invalid(format!("{at}.name"), "duplicate route name"));
            }
            routes.push(route);
        }
        let mut warnings = lints::lease_warnings(&store, &routes);
        warnings.extend(lints::lints(&server, &routes));
        warnings.extend(verify::lints(&routes));
        warnings.extend(admin.iter().flat_map(admin::warnings));
        if store.backend.access().is_some_and(|a| a.insecure) {
            warnings.push(
                "store.tls_insecure = true: Redis's certificate is not verified; anyone on the path can read and forge dedupe records".to_owned(),
            );
        }
        Ok(Config {
            server,
            store,
            admin,
            routes,
            errors: inherited.errors,
            telemetry,
            warnings,
        })
    }
}
