//! Serving one accepted connection of either surface: its greeting within the deadline,
//! then hyper's HTTP/1 or HTTP/2 connection (as its first bytes say: no detection layer
//! on the path), watched for the graceful drain.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::{service_fn, Service};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::evict::Entry;
use super::greeting::{self, FirstRequest, Marked, Prefixed, Protocol};
use super::WriteDeadline;
use crate::config::ServerConfig;
use crate::edge::framing::{AmbiguousFraming, Watched};
use crate::edge::{ConnInfo, Gateway};
use crate::protocol::headers::X_FORWARDED_PROTO;
use crate::Body;

/// How often an HTTP/2 connection is pinged: a dead peer is found and its slot freed.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long an admin connection may take to send its first byte: probes send at once,
/// and a silent connection must not hold one of the admin port's few slots for the whole
/// `server.header_read_timeout`.
pub(super) const ADMIN_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an HTTP/2 ping may go unanswered before the connection is closed.
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection of both surfaces is served with.
#[derive(Clone)]
pub(super) struct Serving {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    /// From accept to the first request's head: handshake, protocol, head.
    pub(super) header_read_timeout: Duration,
    pub(super) write_timeout: Duration,
    pub(super) max_head: usize,
    /// Cancelled when the drain begins: connections still in their greeting close.
    pub(super) stopping: CancellationToken,
}

impl Serving {
    pub(super) fn new(server: &ServerConfig, stopping: CancellationToken) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(server.header_read_timeout)
            // The head's own bound: the buffer's alone let a head that came in one large
            // read through.
            .max_header_size(server.max_header_bytes)
            .max_buf_size(server.max_header_bytes)
            // Head and body copied into one buffer, one `write`: cheaper for the small
            // responses an API sends than queueing them for `writev` (measured in benches/).
            .writev(false);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(server.max_header_bytes as u32)
            .max_concurrent_streams(server.max_concurrent_streams)
            .keep_alive_interval(Some(H2_KEEP_ALIVE_INTERVAL))
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
        Self {
            http1,
            http2,
            header_read_timeout: server.header_read_timeout,
            write_timeout: server.write_timeout,
            max_head: server.max_header_bytes,
            stopping,
        }
    }

    /// Serves a public connection: TLS when the listener has it, the request-smuggling
    /// guard on the raw bytes, and the gateway's pipeline.
    pub(super) async fn public(
        &self,
        stream: TcpStream,
        remote: SocketAddr,
        tls: Option<&TlsAcceptor>,
        gateway: Arc<Gateway>,
        watcher: Watcher,
    ) {
        let deadline = Instant::now() + self.header_read_timeout;
        let Some((stream, protocol)) = self.greet(stream, tls, deadline, remote).await else {
            return;
        };
        let over_tls = tls.is_some();
        let framing = AmbiguousFraming::default();
        let conn_info = ConnInfo {
            client_ip: crate::upstream::client_ip(remote),
            framing: framing.clone(),
        };
        let svc = service_fn(move |mut req: Request<Incoming>| {
            let gw = gateway.clone();
            let conn_info = conn_info.clone();
            // The client's hop was TLS: the upstream learns it, whatever the client
            // claimed (a plain hop keeps the client's value, as before).
            if over_tls {
                req.headers_mut().insert(
                    X_FORWARDED_PROTO.clone(),
                    http::HeaderValue::from_static("https"),
                );
            }
            async move { Ok::<_, Infallible>(gw.handle(req, conn_info).await) }
        });
        let io = Watched::new(
            WriteDeadline::new(stream, self.write_timeout),
            self.max_head,
            framing,
        );
        let first = FirstRequest::default();
        self.http((io, protocol), svc, deadline, watcher, remote, first)
            .await;
    }

    /// Serves an admin connection: plain TCP, metrics, health and key operations. Its first
    /// byte is due within [`ADMIN_FIRST_BYTE_TIMEOUT`] (probes send at once), and until its
    /// first request begins it may be closed to make room (`entry`).
    pub(super) async fn admin(
        &self,
        stream: TcpStream,
        remote: SocketAddr,
        gateway: Arc<Gateway>,
        watcher: Watcher,
        entry: Entry,
    ) {
        let now = Instant::now();
        let deadline = now + self.header_read_timeout;
        let first_byte = deadline.min(now + ADMIN_FIRST_BYTE_TIMEOUT);
        let greeted = tokio::select! {
            greeted = self.greet(stream, None, first_byte, remote) => greeted,
            () = entry.closed_for_room() => None,
        };
        let Some((stream, protocol)) = greeted else {
            return;
        };
        let svc = service_fn(move |req| {
            let gw = gateway.clone();
            async move { Ok::<_, Infallible>(crate::edge::admin::handle(gw, req).await) }
        });
        let io = WriteDeadline::new(stream, self.write_timeout);
        let first = entry.first.clone();
        let served = self.http((io, protocol), svc, deadline, watcher, remote, first);
        tokio::select! {
            () = served => {}
            () = entry.closed_for_room() => {
                debug!(%remote, "admin connection closed to make room: it sent no request");
            }
        }
    }

    /// The connection's TLS handshake and first bytes, by `deadline`; `None` when the
    /// client does not get that far in time, or the drain began first (logged at debug:
    /// scanners and clients that distrust the certificate do this all day).
    async fn greet(
        &self,
        stream: TcpStream,
        tls: Option<&TlsAcceptor>,
        deadline: Instant,
        remote: SocketAddr,
    ) -> Option<(ClientStream, Protocol)> {
        let greeted = async {
            let Some(acceptor) = tls else {
                let protocol = greeting::tcp_shows_protocol(&stream, deadline).await?;
                return Some((Either::Left(stream), protocol));
            };
            match acceptor.accept(stream).await {
                Ok(tls) => {
                    let (tls, protocol) = greeting::read_protocol(tls).await?;
                    Some((Either::Right(tls), protocol))
                }
                Err(e) => {
                    debug!(error = %e, %remote, "TLS handshake failed");
                    None
                }
            }
        };
        tokio::select! {
            greeted = tokio::time::timeout_at(deadline, greeted) => greeted.unwrap_or_else(|_| {
                debug!(%remote, "no request began within server.header_read_timeout");
                None
            }),
            () = self.stopping.cancelled() => None,
        }
    }

    /// Serves HTTP on a greeted connection, in the protocol its first bytes showed, until
    /// it ends; closed at once when its first request has not begun by `deadline` (an
    /// HTTP/2 preface and nothing more).
    async fn http<I, S>(
        &self,
        (io, protocol): (I, Protocol),
        svc: S,
        deadline: Instant,
        watcher: Watcher,
        remote: SocketAddr,
        first: FirstRequest,
    ) where
        I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
        S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>
            + Send
            + Clone
            + 'static,
        S::Future: Send + 'static,
    {
        let svc = Marked {
            inner: svc,
            first: first.clone(),
        };
        let io = TokioIo::new(io);
        match protocol {
            Protocol::Http1 => {
                let conn = watcher.watch(self.http1.serve_connection(io, svc));
                served(conn, &first, deadline, remote).await;
            }
            Protocol::Http2 => {
                let conn = watcher.watch(self.http2.serve_connection(io, svc));
                served(conn, &first, deadline, remote).await;
            }
        }
    }
}

/// Waits for a connection `conn` to end, or for its first request to miss `deadline`.
async fn served<E: std::fmt::Display>(
    conn: impl std::future::Future<Output = Result<(), E>>,
    first: &FirstRequest,
    deadline: Instant,
    remote: SocketAddr,
) {
    tokio::select! {
        ended = conn => if let Err(e) = ended {
            debug!(error = %e, %remote, "client connection ended with an error");
        },
        () = first.missed(deadline) => {
            debug!(%remote, "no request began within server.header_read_timeout");
        }
    }
}

/// A client connection: plain TCP, or TLS (its first bytes already read to pick the
/// protocol).
type ClientStream = Either<TcpStream, Prefixed<tokio_rustls::server::TlsStream<TcpStream>>>;
