//! `[server]`: the public listener, the upstream and their limits.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::{Authority, Scheme};

use super::defaults::{
    DEFAULT_ADMISSION_TIMEOUT, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_BODY, DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONCURRENT_CLAIMS, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_HEADER_BYTES, DEFAULT_SHUTDOWN_GRACE, DEFAULT_UNDERSCORES_IN_HEADERS,
    DEFAULT_UPSTREAM_HTTP2, DEFAULT_UPSTREAM_TIMEOUT, DEFAULT_WRITE_TIMEOUT, MAX_BODY_LIMIT,
    MAX_BUFFERED_BYTES, MAX_CONCURRENT_CLAIMS, MAX_CONCURRENT_STREAMS, MAX_CONNECTIONS,
    MAX_HEADER_BYTES, MAX_TIMEOUT, MAX_WORKERS, MIN_BUFFERED_BYTES, MIN_HEADER_BYTES,
};
use super::file::{FileListenerTls, FileServer};
use super::{invalid, parse, ConfigError};
use crate::config::tls::PemFile;

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
    /// Drain time after SIGTERM.
    pub shutdown_grace: Duration,
    /// A client that accepts no response bytes for this long is disconnected.
    pub write_timeout: Duration,
    /// Most client connections served at once.
    pub max_connections: usize,
    /// Most concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// The ceiling of the adaptive admission limit: most keyed requests between admission
    /// and their claim's answer.
    pub max_concurrent_claims: usize,
    /// The budget of buffered bodies: keyed request bodies, and the room their answers may
    /// take while kept for the store.
    pub max_buffered_bytes: u64,
    /// How long a keyed request waits for a place under the admission limit (zero: it is
    /// refused at once).
    pub admission_timeout: Duration,
    /// Connection workers; `None`: one per CPU the process may use.
    pub workers: Option<usize>,
    /// `https` upstreams: a private CA trusted besides the platform's roots.
    pub upstream_ca: Option<PemFile>,
    /// `[server.tls]`: the public listener's certificate and key, when it speaks TLS.
    pub tls: Option<ListenerTls>,
    /// `server.upstream_http2`: which calls to an `http://` upstream go over h2c.
    pub upstream_http2: UpstreamHttp2,
    /// `server.underscores_in_headers`: request fields whose names hold `_` go upstream
    /// (otherwise they are dropped, as nginx drops them).
    pub underscores_in_headers: bool,
}

/// `server.upstream_http2`: which calls to a plain-`http` upstream go over HTTP/2 with
/// prior knowledge (h2c) instead of the pooled HTTP/1.1 connections. An `https` upstream
/// negotiates with ALPN instead, whatever this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(
    rename_all = "kebab-case",
    expecting = "\"grpc\", \"prior-knowledge\" or \"off\""
)]
pub enum UpstreamHttp2 {
    /// gRPC calls (HTTP/2 from the client, `content-type: application/grpc*`): gRPC has no
    /// HTTP/1.1 form, so no other choice can work for them.
    #[default]
    Grpc,
    /// Every call: an upstream that speaks only h2c.
    PriorKnowledge,
    /// None: HTTP/1.1 only (a gRPC call then fails upstream).
    Off,
}

/// Validated `[server.tls]`: files read, the key checked against the certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The certificate chain, leaf first.
    pub cert: PemFile,
    /// The leaf's private key.
    pub key: PemFile,
}

/// The upstream base URL, split for cheap per-request URI building.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTarget {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// `host:port`.
    pub authority: Authority,
    /// Base path without a trailing slash (`""` when none).
    pub base_path: String,
}

pub(super) fn validate(s: &FileServer) -> Result<ServerConfig, ConfigError> {
    let timeout = |field: &str, value: &Option<String>, default| {
        parse::opt_duration(field, value.as_deref(), default, MAX_TIMEOUT)
    };
    let listen = parse::addr("server.listen", &s.listen)?;
    let upstream = upstream("server.upstream", &s.upstream)?;
    // Fields are read in the file's order: the first bad one is the one reported.
    let upstream_timeout = timeout(
        "server.upstream_timeout",
        &s.upstream_timeout,
        DEFAULT_UPSTREAM_TIMEOUT,
    )?;
    let connect_timeout = timeout(
        "server.connect_timeout",
        &s.connect_timeout,
        DEFAULT_CONNECT_TIMEOUT,
    )?;
    let (max_body, max_header_bytes) = sizes(s)?;
    let (max_concurrent_claims, max_buffered_bytes) = admission(s)?;
    let admission_timeout = match s.admission_timeout.as_deref() {
        Some(v) => parse::duration_allow_zero("server.admission_timeout", v, MAX_TIMEOUT)?,
        None => DEFAULT_ADMISSION_TIMEOUT,
    };
    let header_read_timeout = timeout(
        "server.header_read_timeout",
        &s.header_read_timeout,
        DEFAULT_HEADER_READ_TIMEOUT,
    )?;
    let body_read_timeout = timeout(
        "server.body_read_timeout",
        &s.body_read_timeout,
        DEFAULT_BODY_READ_TIMEOUT,
    )?;
    let shutdown_grace = match s.shutdown_grace.as_deref() {
        Some(v) => parse::duration_allow_zero("server.shutdown_grace", v, MAX_TIMEOUT)?,
        None => DEFAULT_SHUTDOWN_GRACE,
    };
    let write_timeout = timeout(
        "server.write_timeout",
        &s.write_timeout,
        DEFAULT_WRITE_TIMEOUT,
    )?;
    Ok(ServerConfig {
        max_connections: parse::count(
            "server.max_connections",
            s.max_connections,
            DEFAULT_MAX_CONNECTIONS,
            MAX_CONNECTIONS,
        )?,
        max_concurrent_streams: parse::count(
            "server.max_concurrent_streams",
            s.max_concurrent_streams,
            DEFAULT_MAX_CONCURRENT_STREAMS,
            MAX_CONCURRENT_STREAMS,
        )?,
        max_concurrent_claims,
        max_buffered_bytes,
        admission_timeout,
        workers: workers(s)?,
        upstream_ca: upstream_ca(s, &upstream)?,
        tls: s.tls.as_ref().map(listener_tls).transpose()?,
        upstream_http2: s.upstream_http2.unwrap_or(DEFAULT_UPSTREAM_HTTP2),
        underscores_in_headers: s
            .underscores_in_headers
            .unwrap_or(DEFAULT_UNDERSCORES_IN_HEADERS),
        listen,
        upstream,
        upstream_timeout,
        connect_timeout,
        max_body,
        max_header_bytes: max_header_bytes as usize,
        header_read_timeout,
        body_read_timeout,
        shutdown_grace,
        write_timeout,
    })
}

/// `server.max_body` and `server.max_header_bytes`, each within its bounds.
fn sizes(s: &FileServer) -> Result<(u64, u64), ConfigError> {
    let max_body = parse::opt_size(
        "server.max_body",
        s.max_body.as_deref(),
        DEFAULT_MAX_BODY,
        0,
        MAX_BODY_LIMIT,
    )?;
    let max_header_bytes = parse::opt_size(
        "server.max_header_bytes",
        s.max_header_bytes.as_deref(),
        DEFAULT_MAX_HEADER_BYTES,
        MIN_HEADER_BYTES,
        MAX_HEADER_BYTES,
    )?;
    Ok((max_body, max_header_bytes))
}

/// `server.max_concurrent_claims` and `server.max_buffered_bytes`, each within its bounds.
fn admission(s: &FileServer) -> Result<(usize, u64), ConfigError> {
    let claims = parse::count(
        "server.max_concurrent_claims",
        s.max_concurrent_claims,
        DEFAULT_MAX_CONCURRENT_CLAIMS,
        MAX_CONCURRENT_CLAIMS,
    )?;
    let buffered = parse::opt_size(
        "server.max_buffered_bytes",
        s.max_buffered_bytes.as_deref(),
        DEFAULT_MAX_BUFFERED_BYTES,
        MIN_BUFFERED_BYTES,
        MAX_BUFFERED_BYTES,
    )?;
    Ok((claims, buffered))
}

/// `server.workers`: 1 to [`MAX_WORKERS`] when set.
fn workers(s: &FileServer) -> Result<Option<usize>, ConfigError> {
    s.workers
        .map(|n| parse::count("server.workers", Some(n), 1, MAX_WORKERS))
        .transpose()
}

/// `server.upstream_ca_file`: only for an `https` upstream, holding a usable trust anchor.
fn upstream_ca(s: &FileServer, upstream: &UpstreamTarget) -> Result<Option<PemFile>, ConfigError> {
    let Some(path) = &s.upstream_ca_file else {
        return Ok(None);
    };
    if upstream.scheme != Scheme::HTTPS {
        return Err(invalid(
            "server.upstream_ca_file",
            "applies to an https:// server.upstream only",
        ));
    }
    PemFile::read(path)
        .and_then(|ca| ca.trust_anchors().map(|_| ca))
        .map(Some)
        .map_err(|e| invalid("server.upstream_ca_file", e.to_string()))
}

/// `[server.tls]`: both files read, the key checked against the certificate.
fn listener_tls(t: &FileListenerTls) -> Result<ListenerTls, ConfigError> {
    let cert = PemFile::read(&t.cert_file)
        .and_then(|c| c.certificates().map(|_| c))
        .map_err(|e| invalid("server.tls.cert_file", e.to_string()))?;
    let key =
        PemFile::read(&t.key_file).map_err(|e| invalid("server.tls.key_file", e.to_string()))?;
    crate::config::tls::certified_key(&cert, &key)
        .map_err(|e| invalid("server.tls.key_file", e.to_string()))?;
    Ok(ListenerTls { cert, key })
}

fn upstream(at: &str, v: &str) -> Result<UpstreamTarget, ConfigError> {
    let uri: http::Uri = v
        .parse()
        .map_err(|_| invalid(at, format!("{v:?} is not a URL like http://127.0.0.1:9000")))?;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::HTTP,
        Some("https") => Scheme::HTTPS,
        _ => {
            return Err(invalid(
                at,
                format!("{v:?} must start with http:// or https://"),
            ))
        }
    };
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| invalid(at, format!("{v:?} has no host")))?;
    if uri.query().is_some() {
        return Err(invalid(at, "must not carry a query string"));
    }
    let base_path = uri.path().trim_end_matches('/').to_owned();
    Ok(UpstreamTarget {
        scheme,
        authority,
        base_path,
    })
}
