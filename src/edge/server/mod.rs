//! Listeners, connections and the process lifecycle: serve until a signal, then drain.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::defaults::DEFAULT_ADMIN_MAX_CONNECTIONS;
use crate::config::tls::ListenerCert;
use crate::config::{Config, ConfigError};
use crate::edge::Gateway;
use crate::store::health::Severity;
use crate::store::{Store, StoreError};

mod accept;
mod connection;
mod evict;
mod greeting;
mod write_deadline;

use self::accept::Listener;
use self::connection::Serving;
use self::evict::Evictable;
pub use self::write_deadline::WriteDeadline;
pub use crate::runtime::Workers;

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
    Tls(crate::config::tls::PemError),
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
        let bind =
            |addr: SocketAddr| listen(addr).map_err(|source| RunError::Bind { addr, source });
        let public = bind(config.server.listen)?;
        let admin = match &config.admin {
            Some(a) => Some(bind(a.listen)?),
            None => None,
        };
        let tls = match &config.server.tls {
            Some(t) => Some(ListenerCert::new(
                crate::config::tls::certified_key(&t.cert, &t.key).map_err(RunError::Tls)?,
            )),
            None => None,
        };
        Ok(Self { public, admin, tls })
    }
}

/// Connections the kernel may queue for `accept` (capped by `net.core.somaxconn`).
/// Tokio's `TcpListener::bind` asks for 128: a thousand clients connecting at once
/// overflowed it, and each dropped SYN waited a second for its retransmit (`nstat`:
/// `ListenOverflows`). nginx's benchmark configuration asks for 4096 as well.
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `addr` (`SO_REUSEADDR`, as `TcpListener::bind` sets it).
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Runs the gateway as a process: binds, serves (public connections on `workers`),
/// reloads on SIGHUP, drains on SIGTERM/SIGINT. `config_path` is re-read on SIGHUP.
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    workers: &Workers,
) -> Result<(), RunError> {
    for w in &config.warnings {
        warn!("{w}");
    }
    let store = Store::from_config_on(&config.store, workers.runtimes())?;
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
    serve_on(gateway, listeners, workers, shutdown).await;
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
                match crate::config::tls::certified_key(&t.cert, &t.key) {
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
    serve_on(gateway, listeners, &Workers::none(), shutdown).await;
}

/// As [`serve`], each public connection served on the next of `workers`.
pub async fn serve_on(
    gateway: Arc<Gateway>,
    listeners: Listeners,
    workers: &Workers,
    shutdown: impl Future<Output = ()>,
) {
    let live = gateway.live();
    let server = &live.config.server;
    let grace = server.shutdown_grace;
    let stopping = CancellationToken::new();
    let serving = Arc::new(Serving::new(server, stopping.clone()));
    // Each connection may buffer up to max_body per request: bound how many are served.
    let mut public = Listener::new("public", Some(listeners.public), server.max_connections);
    // The admin port has its own small cap, so probes or a flood there can never take the
    // public port's file descriptors.
    let admin_cap = live
        .config
        .admin
        .as_ref()
        .map_or(DEFAULT_ADMIN_MAX_CONNECTIONS, |a| a.max_connections);
    let mut admin = Listener::new("admin", listeners.admin, admin_cap);
    drop(live);

    if let Some(addr) = public.local_addr() {
        info!(addr = %addr, backend = gateway.store().backend_name(), tls = listeners.tls.is_some(), workers = workers.len(), "public listener ready");
    }
    if let Some(addr) = admin.local_addr() {
        info!(addr = %addr, "admin listener ready");
    }
    let tls = listeners
        .tls
        .map(|cert| TlsAcceptor::from(Arc::new(crate::config::tls::listener_config(cert))));

    let graceful = GracefulShutdown::new();
    tokio::select! {
        () = accept_public(&mut public, (&serving, workers), tls, &gateway, &graceful) => {}
        () = accept_admin(&mut admin, &serving, &gateway, &graceful) => {}
        () = shutdown => {}
    }
    drop((public, admin));
    stopping.cancel();
    drain(&gateway, graceful, grace).await;
}

/// Accepts public connections, each served in a task of its own that holds a slot.
async fn accept_public(
    listener: &mut Listener,
    (serving, workers): (&Arc<Serving>, &Workers),
    tls: Option<TlsAcceptor>,
    gateway: &Arc<Gateway>,
    graceful: &GracefulShutdown,
) {
    loop {
        let Some((slot, stream, remote)) = listener.next().await else {
            continue;
        };
        let (serving, gateway, tls) = (serving.clone(), gateway.clone(), tls.clone());
        let watcher = graceful.watcher();
        workers.spawn(stream, remote, move |stream| async move {
            serving
                .public(stream, remote, tls.as_ref(), gateway, watcher)
                .await;
            drop(slot);
        });
    }
}

/// Accepts admin connections, each served in a task of its own that holds a slot.
async fn accept_admin(
    listener: &mut Listener,
    serving: &Arc<Serving>,
    gateway: &Arc<Gateway>,
    graceful: &GracefulShutdown,
) {
    // Probes must be answered however many silent connections arrive: when every slot is
    // taken, the oldest connection that has not begun a request makes room.
    let evictable = Evictable::default();
    loop {
        let Some((slot, stream, remote)) = listener.next_evicting(&evictable).await else {
            continue;
        };
        let (serving, gateway) = (serving.clone(), gateway.clone());
        let watcher = graceful.watcher();
        let entry = evictable.register();
        tokio::spawn(async move {
            serving.admin(stream, remote, gateway, watcher, entry).await;
            drop(slot);
        });
    }
}

/// Lets open connections, then the request tasks that outlive their clients (they own
/// claims and upstream calls), finish within `grace`.
async fn drain(gateway: &Gateway, graceful: GracefulShutdown, grace: Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    let open = graceful.count();
    info!(open, grace = ?grace, "stopped accepting; draining in-flight requests");
    let tasks = gateway.tasks();
    tasks.close();
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
