//! How the gateway reaches Redis beyond its URLs: `store.tls_*` and the password.

use std::fmt;

use super::super::defaults::DEFAULT_TLS_INSECURE;
use super::super::file::FileStore;
use super::super::{invalid, ConfigError, REDIS_PASSWORD};
use crate::config::tls::{self, PemFile};

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

/// A Redis backend's access for its `urls` (never empty): the TLS files read and checked
/// now, so a bad one is a config error naming its field, and the password.
pub(super) fn access(s: &FileStore, urls: &[String]) -> Result<RedisAccess, ConfigError> {
    if !urls.iter().all(|u| u.starts_with("rediss://")) {
        refuse_tls_fields(s)?;
    }
    Ok(RedisAccess {
        ca: ca(s)?,
        client_cert: client_cert(s)?,
        insecure: s.tls_insecure.unwrap_or(DEFAULT_TLS_INSECURE),
        password: password(s)?,
    })
}

/// The memory backend: no TLS file and no password, which would otherwise be ignored.
pub(super) fn refuse_access(s: &FileStore) -> Result<(), ConfigError> {
    refuse_tls_fields(s)?;
    match password(s)? {
        Some(_) => Err(invalid(
            REDIS_PASSWORD,
            "applies to the Redis backends only",
        )),
        None => Ok(()),
    }
}

fn refuse_tls_fields(s: &FileStore) -> Result<(), ConfigError> {
    let tls_fields = [
        ("store.tls_ca_file", s.tls_ca_file.is_some()),
        ("store.tls_cert_file", s.tls_cert_file.is_some()),
        ("store.tls_key_file", s.tls_key_file.is_some()),
        ("store.tls_insecure", s.tls_insecure.is_some()),
    ];
    match tls_fields.iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(invalid(
            *field,
            "applies to rediss:// URLs only (every store URL must be rediss://)",
        )),
        None => Ok(()),
    }
}

fn read(field: &str, path: &str) -> Result<PemFile, ConfigError> {
    PemFile::read(path).map_err(|e| invalid(field, e.to_string()))
}

/// `store.tls_ca_file`, holding at least one usable trust anchor.
fn ca(s: &FileStore) -> Result<Option<PemFile>, ConfigError> {
    let Some(path) = &s.tls_ca_file else {
        return Ok(None);
    };
    let ca = read("store.tls_ca_file", path)?;
    ca.trust_anchors()
        .map_err(|e| invalid("store.tls_ca_file", e.to_string()))?;
    Ok(Some(ca))
}

/// `store.tls_cert_file` and `store.tls_key_file`: both or neither, the key matching the
/// certificate.
fn client_cert(s: &FileStore) -> Result<Option<(PemFile, PemFile)>, ConfigError> {
    match (&s.tls_cert_file, &s.tls_key_file) {
        (Some(cert), Some(key)) => {
            let cert = read("store.tls_cert_file", cert)?;
            let key = read("store.tls_key_file", key)?;
            cert.certificates()
                .map_err(|e| invalid("store.tls_cert_file", e.to_string()))?;
            tls::certified_key(&cert, &key)
                .map_err(|e| invalid("store.tls_key_file", e.to_string()))?;
            Ok(Some((cert, key)))
        }
        (Some(_), None) => Err(invalid(
            "store.tls_key_file",
            "required with store.tls_cert_file (mutual TLS needs both)",
        )),
        (None, Some(_)) => Err(invalid(
            "store.tls_cert_file",
            "required with store.tls_key_file (mutual TLS needs both)",
        )),
        (None, None) => Ok(None),
    }
}

fn password(s: &FileStore) -> Result<Option<String>, ConfigError> {
    if s.password.as_deref() == Some("") {
        return Err(invalid(REDIS_PASSWORD, "must not be empty"));
    }
    Ok(s.password.clone())
}
