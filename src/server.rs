//! Listeners, connections and the process lifecycle: serve until a signal, then drain.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tracing::{debug, error, info, warn};

use crate::config::defaults::DEFAULT_ADMIN_MAX_CONNECTIONS;
use crate::config::{Config, ConfigError};
use crate::framing::{AmbiguousFraming, Watched};
use crate::http::{ConnInfo, Gateway};
use crate::store::health::Severity;
use crate::store::{Store, StoreError};
use crate::tls::ListenerCert;

mod accept;
mod write_deadline;

use self::accept::Acceptor;
pub use self::write_deadline::WriteDeadline;

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The store could not be set up.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A signal handler could not be installed.
    #[error("signal handler: {0}")]
    Signal(io::Error),
    /// The listener's certificate could not be used (it changed since validation).
    #[error("server.tls: {0}")]
    Tls(crate::tls::PemError),
}

/// The bound sockets.
pub struct Listeners {
    /// The public port.
    pub public: TcpListener,
    /// The admin port, when configured.
    pub admin: Option<TcpListener>,
    /// The public port's certificate when it speaks TLS (`[server.tls]`); replaced on
    /// SIGHUP.
    pub tls: Option<Arc<ListenerCert>>,
}

impl Listeners {
    /// Binds what the config asks for.
    pub async fn bind(config: &Config) -> Result<Self, RunError> {
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Bind { addr, source })
        };
        let public = bind(config.server.listen).await?;
        let admin = match &config.admin {
            Some(a) => Some(bind(a.listen).await?),
            None => None,
        };
        let tls = match &config.server.tls {
            Some(t) => Some(ListenerCert::new(
                crate::tls::certified_key(&t.cert, &t.key).map_err(RunError::Tls)?,
            )),
            None => None,
        };
        Ok(Self { public, admin, tls })
    }
}

/// Runs the gateway as a process: binds, serves, reloads on SIGHUP, drains on
/// SIGTERM/SIGINT. `config_path` is re-read on SIGHUP.
pub async fn run(config: Config, config_path: Option<PathBuf>) -> Result<(), RunError> {
    for w in &config.warnings {
        warn!("{w}");
    }
    let store = Store::from_config(&config.store)?;
    warn_store_findings(store.clone());
    let listeners = Listeners::bind(&config).await?;
    let gateway = Gateway::new(config, store);

    if let Some(path) = config_path {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(RunError::Signal)?;
        let gw = gateway.clone();
        let cert = listeners.tls.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reload(&gw, &path, cert.as_deref());
            }
        });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: draining"),
            _ = tokio::signal::ctrl_c() => info!("SIGINT: draining"),
        }
    };
    serve(gateway, listeners, shutdown).await;
    Ok(())
}

/// Logs the store checks' findings as warnings, in the background: a Redis that is not
/// up yet must not delay start-up (the connection task warns about that itself).
fn warn_store_findings(store: Store) {
    tokio::spawn(async move {
        match store.health_findings().await {
            Ok(findings) => {
                for f in findings {
                    if f.severity == Severity::Notice {
                        info!(node = %f.node, check = f.check, "store check: {}", f.message);
                    } else {
                        warn!(node = %f.node, check = f.check, "store check: {}", f.message);
                    }
                }
            }
            Err(e) => debug!(error = %e, "store checks skipped: the store does not answer"),
        }
    });
}

fn reload(gateway: &Gateway, path: &std::path::Path, cert: Option<&ListenerCert>) {
    match Config::load(path, |k| std::env::var(k).ok()) {
        Ok(config) => {
            for w in &config.warnings {
                warn!("{w}");
            }
            // Validation read the files and matched the key: the new certificate is
            // presented from the next handshake on; open connections keep theirs.
            if let (Some(cert), Some(t)) = (cert, &config.server.tls) {
                match crate::tls::certified_key(&t.cert, &t.key) {
                    Ok(key) => {
                        cert.replace(key);
                        info!(cert_file = %t.cert.path().display(), "SIGHUP: listener certificate reloaded");
                    }
                    Err(e) => {
                        error!(error = %e, "SIGHUP: listener certificate refused; the old one stays")
                    }
                }
            }
            let routes = config.routes.len();
            let restart = gateway.reload(config);
            info!(routes, "SIGHUP: configuration reloaded");
            for setting in restart {
                warn!(setting, "changed setting takes effect only after a restart");
            }
        }
        Err(e) => report_reload_error(&e),
    }
}

fn report_reload_error(e: &ConfigError) {
    error!(error = %e, "SIGHUP: configuration refused; the old configuration stays in force");
}

/// Serves both listeners until `shutdown` resolves, then stops accepting and lets in-flight
/// requests finish within `server.shutdown_grace`. Tests call this with port-0 listeners.
pub async fn serve(
    gateway: Arc<Gateway>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) {
    let live = gateway.live();
    let server = &live.config.server;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .max_buf_size(server.max_header_bytes)
        // Head and body copied into one buffer, one `write`: cheaper for the small
        // responses an API sends than queueing them for `writev` (measured in benches/).
        .writev(false);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(server.max_header_bytes as u32)
        .max_concurrent_streams(server.max_concurrent_streams)
        // Dead HTTP/2 peers are found by pings and their slots freed.
        .keep_alive_interval(Some(std::time::Duration::from_secs(20)))
        .keep_alive_timeout(std::time::Duration::from_secs(10));
    let grace = server.shutdown_grace;
    let header_read_timeout = server.header_read_timeout;
    let max_head = server.max_header_bytes;
    let write_timeout = server.write_timeout;
    // Each connection may buffer up to max_body per request: bound how many are served.
    let slots = Arc::new(tokio::sync::Semaphore::new(server.max_connections));
    // The admin port has its own small cap, so probes or a flood there can never take the
    // public port's file descriptors.
    let admin_slots = Arc::new(tokio::sync::Semaphore::new(
        live.config
            .admin
            .as_ref()
            .map_or(DEFAULT_ADMIN_MAX_CONNECTIONS, |a| a.max_connections),
    ));
    drop(live);

    if let Ok(addr) = listeners.public.local_addr() {
        info!(addr = %addr, backend = gateway.store().backend_name(), tls = listeners.tls.is_some(), "public listener ready");
    }
    let tls = listeners
        .tls
        .clone()
        .map(|cert| TlsAcceptor::from(Arc::new(crate::tls::listener_config(cert))));
    if let Some(Ok(addr)) = listeners.admin.as_ref().map(TcpListener::local_addr) {
        info!(addr = %addr, "admin listener ready");
    }

    let graceful = GracefulShutdown::new();
    let stopping = tokio_util::sync::CancellationToken::new();
    let mut public_accept = Acceptor::new("public");
    let mut admin_accept = Acceptor::new("admin");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (slot, accepted) = async {
                // Wait for a free slot before accepting: at the limit, new connections
                // queue in the kernel's backlog instead of being served.
                let slot = slots.clone().acquire_owned().await;
                (slot, public_accept.accept(Some(&listeners.public)).await)
            } => {
                let Some((stream, remote)) = accepted else { continue };
                let Ok(slot) = slot else { continue };
                let gw = gateway.clone();
                let framing = AmbiguousFraming::default();
                let conn_info = ConnInfo { remote, framing: framing.clone() };
                let over_tls = tls.is_some();
                let svc = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    let gw = gw.clone();
                    let conn_info = conn_info.clone();
                    // The client's hop was TLS: the upstream learns it, whatever the client
                    // claimed (a plain hop keeps the client's value, as before).
                    if over_tls {
                        req.headers_mut().insert(
                            http::header::HeaderName::from_static("x-forwarded-proto"),
                            http::HeaderValue::from_static("https"),
                        );
                    }
                    async move { Ok::<_, Infallible>(gw.handle(req, conn_info).await) }
                });
                let builder = builder.clone();
                let watcher = graceful.watcher();
                let stopping = stopping.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    if !shows_protocol(&stream, header_read_timeout, &stopping).await {
                        return drop(slot);
                    }
                    let Some(stream) = handshake(tls.as_ref(), stream, header_read_timeout, remote).await else {
                        return drop(slot);
                    };
                    let stream = WriteDeadline::new(stream, write_timeout);
                    let io = TokioIo::new(Watched::new(stream, max_head, framing));
                    let conn = watcher.watch(builder.serve_connection(io, svc).into_owned());
                    if let Err(e) = conn.await {
                        debug!(error = %e, %remote, "client connection ended with an error");
                    }
                    drop(slot);
                });
            }
            (slot, accepted) = async {
                let slot = admin_slots.clone().acquire_owned().await;
                (slot, admin_accept.accept(listeners.admin.as_ref()).await)
            } => {
                let Some((stream, _)) = accepted else { continue };
                let Ok(slot) = slot else { continue };
                let gw = gateway.clone();
                let svc = service_fn(move |req| {
                    let gw = gw.clone();
                    async move { Ok::<_, Infallible>(crate::admin::handle(gw, req).await) }
                });
                let builder = builder.clone();
                let watcher = graceful.watcher();
                let stopping = stopping.clone();
                tokio::spawn(async move {
                    if !shows_protocol(&stream, header_read_timeout, &stopping).await {
                        return drop(slot);
                    }
                    let io = TokioIo::new(WriteDeadline::new(stream, write_timeout));
                    let _ = watcher.watch(builder.serve_connection(io, svc).into_owned()).await;
                    drop(slot);
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listeners);
    stopping.cancel();
    let deadline = tokio::time::Instant::now() + grace;
    let open = graceful.count();
    info!(open, grace = ?grace, "stopped accepting; draining in-flight requests");
    let tasks = gateway.tasks();
    tasks.close();
    // Connections drain first; requests whose clients already hung up still own claims
    // and upstream calls, so they are waited for too, within the same grace period.
    let drained = tokio::time::timeout_at(deadline, async {
        graceful.shutdown().await;
        tasks.wait().await;
    })
    .await;
    match drained {
        Ok(()) => info!("drained"),
        Err(_) => warn!(
            left = tasks.len(),
            "shutdown grace elapsed: cutting off requests still in flight; their claims stay until their leases expire"
        ),
    }
}

/// A public connection: plain TCP, or TLS on `[server.tls]`.
type PublicStream = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// The TLS handshake on a public connection, within `within` (as a request head must
/// arrive); plain TCP when the listener has no TLS. `None` when it fails: logged at debug,
/// since scanners and clients that distrust the certificate do this all day.
async fn handshake(
    tls: Option<&TlsAcceptor>,
    stream: TcpStream,
    within: Duration,
    remote: SocketAddr,
) -> Option<PublicStream> {
    let Some(acceptor) = tls else {
        return Some(Either::Left(stream));
    };
    match tokio::time::timeout(within, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(Either::Right(tls)),
        Ok(Err(e)) => {
            debug!(error = %e, %remote, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(%remote, "TLS handshake did not finish within server.header_read_timeout");
            None
        }
    }
}

/// Waits until a new connection's first bytes show its protocol: 24 bytes, or an early
/// byte that differs from the HTTP/2 preface (hyper waits for as much before it picks
/// HTTP/1 or HTTP/2). False on EOF.
async fn protocol_decided(stream: &TcpStream) -> io::Result<bool> {
    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut buf = [0u8; 24];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Ok(false);
        }
        if n == buf.len() || buf[..n] != PREFACE[..n] {
            return Ok(true);
        }
        // A partial preface: peek returns the same bytes at once, so pause for more.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Whether a new connection shows which protocol it speaks within `within` (hyper's own
/// header timeout only starts once it has picked HTTP/1 or HTTP/2). A connection that does
/// not, or is still silent when shutdown begins, is closed and frees its slot.
async fn shows_protocol(
    stream: &TcpStream,
    within: Duration,
    stopping: &tokio_util::sync::CancellationToken,
) -> bool {
    tokio::select! {
        d = tokio::time::timeout(within, protocol_decided(stream)) => matches!(d, Ok(Ok(true))),
        _ = stopping.cancelled() => false,
    }
}
