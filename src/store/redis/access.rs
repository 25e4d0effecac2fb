//! Redis clients built from the URLs and [`RedisAccess`]: TLS through the redis crate's
//! rustls support (the CA and client certificate handed over as PEM), the password from
//! the environment in place of one in the URL, and `store.tls_insecure` as the crate's
//! `#insecure` (never taken from a URL: validation refuses fragments).

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ClientTlsConfig, IntoConnectionInfo, RedisResult, TlsCertificates, TlsMode};

use crate::config::RedisAccess;

/// The certificates to hand the crate, when any are configured; without them a
/// `rediss://` URL is verified against the platform's roots.
fn certificates(access: &RedisAccess) -> Option<TlsCertificates> {
    if access.ca.is_none() && access.client_cert.is_none() {
        return None;
    }
    Some(TlsCertificates {
        client_tls: access
            .client_cert
            .as_ref()
            .map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.bytes().to_vec(),
                client_key: key.bytes().to_vec(),
            }),
        root_cert: access.ca.as_ref().map(|ca| ca.bytes().to_vec()),
    })
}

fn with_insecure(url: &str, access: &RedisAccess) -> String {
    if access.insecure {
        format!("{url}#insecure")
    } else {
        url.to_owned()
    }
}

/// A client for one server.
pub(super) fn client(url: &str, access: &RedisAccess) -> RedisResult<redis::Client> {
    crate::tls::install_crypto_provider();
    let mut info = with_insecure(url, access).into_connection_info()?;
    if let Some(password) = &access.password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    match certificates(access) {
        Some(certs) => redis::Client::build_with_tls(info, certs),
        None => redis::Client::open(info),
    }
}

/// A cluster client builder seeded with `urls`; the caller adds its timeouts.
pub(super) fn cluster_builder(urls: &[String], access: &RedisAccess) -> ClusterClientBuilder {
    crate::tls::install_crypto_provider();
    let mut builder = ClusterClient::builder(urls.iter().map(|u| with_insecure(u, access)));
    if let Some(password) = &access.password {
        builder = builder.password(password);
    }
    if let Some(certs) = certificates(access) {
        builder = builder.certs(certs);
        if access.insecure {
            builder = builder.tls(TlsMode::Insecure);
        }
    }
    builder
}
