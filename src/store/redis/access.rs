//! Redis clients built from the URLs and [`RedisAccess`]: TLS through the redis crate's
//! rustls support (the CA and client certificate handed over as PEM), the password from
//! the environment in place of one in the URL, and `store.tls_insecure` as the crate's
//! `#insecure` (never taken from a URL: validation refuses fragments).

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisResult, TlsCertificates,
    TlsMode,
};

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
pub(super) fn client(url: &str, access: &RedisAccess, resp3: bool) -> RedisResult<redis::Client> {
    crate::config::tls::install_crypto_provider();
    let info = with_insecure(url, access).into_connection_info()?;
    build(info, access, resp3)
}

/// A client for `host:port`, a node that a cluster names, reached as the seed `url` is
/// (plain or TLS, user, password, CA): the cluster client does the same for the nodes it
/// finds.
pub(super) fn node_client(
    url: &str,
    host: &str,
    port: u16,
    access: &RedisAccess,
    resp3: bool,
) -> RedisResult<redis::Client> {
    crate::config::tls::install_crypto_provider();
    let info = with_insecure(url, access).into_connection_info()?;
    let addr = match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    build(info.set_addr(addr), access, resp3)
}

fn build(
    mut info: redis::ConnectionInfo,
    access: &RedisAccess,
    resp3: bool,
) -> RedisResult<redis::Client> {
    if let Some(password) = &access.password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    if resp3 {
        // Invalidation messages of client-side caching arrive as RESP3 pushes.
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        info = info.set_redis_settings(settings);
    }
    match certificates(access) {
        Some(certs) => redis::Client::build_with_tls(info, certs),
        None => redis::Client::open(info),
    }
}

/// A cluster client builder seeded with `urls`; the caller adds its timeouts.
pub(super) fn cluster_builder(urls: &[String], access: &RedisAccess) -> ClusterClientBuilder {
    crate::config::tls::install_crypto_provider();
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

/// A client that asks the sentinels at `urls` for the primary they monitor as
/// `master_name`, each time it is asked for a connection.
///
/// The user, password and database in the sentinel URLs serve the sentinels and the primary
/// alike (the usual deployment: one password); `DEDUPE_REDIS_PASSWORD` replaces the
/// primary's only, for sentinels run without one. `rediss://` sentinels mean a TLS primary
/// too, verified with the same CA and shown the same client certificate.
pub(super) fn sentinel(
    urls: &[String],
    master_name: &str,
    access: &RedisAccess,
) -> RedisResult<SentinelClient> {
    crate::config::tls::install_crypto_provider();
    let infos = urls
        .iter()
        .map(|u| u.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()?;
    let tls = infos
        .iter()
        .any(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }));
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        master_name,
        SentinelServerType::Master,
    )?;
    // The sentinels' credentials and database serve the primary too; the config never
    // holds an empty list, but a caller of the store's own constructor could pass one.
    let Some(first) = infos.first().map(|i| i.redis_settings()) else {
        return Err((ErrorKind::InvalidClientConfig, "no sentinel URL").into());
    };
    if let Some(user) = first.username() {
        builder = builder
            .set_client_to_sentinel_username(user)
            .set_client_to_redis_username(user);
    }
    if let Some(password) = first.password() {
        builder = builder
            .set_client_to_sentinel_password(password)
            .set_client_to_redis_password(password);
    }
    if let Some(password) = &access.password {
        builder = builder.set_client_to_redis_password(password);
    }
    builder = builder.set_client_to_redis_db(first.db());
    if tls {
        let mode = if access.insecure {
            TlsMode::Insecure
        } else {
            TlsMode::Secure
        };
        builder = builder
            .set_client_to_sentinel_tls_mode(mode)
            .set_client_to_redis_tls_mode(mode);
        if let Some(certs) = certificates(access) {
            builder = builder
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_certificates(certs);
        }
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The config never holds an empty list, but the store's own constructors take slices:
    // an empty one is an error, never an index out of bounds.
    #[test]
    fn an_empty_list_of_urls_is_refused_not_indexed() {
        assert!(sentinel(&[], "m", &RedisAccess::default()).is_err());
        assert!(cluster_builder(&[], &RedisAccess::default())
            .build()
            .is_err());
    }
}
