//! Accepting connections: a listener with its connection slots, backing off while
//! accepts fail.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use super::evict::Evictable;

/// First pause after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause between accepts while they keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A bound socket and the slots of the connections it serves at once.
pub(super) struct Listener {
    socket: Option<TcpListener>,
    slots: Arc<Semaphore>,
    acceptor: Acceptor,
}

impl Listener {
    /// A listener of `name` serving at most `max_connections` at once; pending forever
    /// without a socket.
    pub(super) fn new(
        name: &'static str,
        socket: Option<TcpListener>,
        max_connections: usize,
    ) -> Self {
        Self {
            socket,
            slots: Arc::new(Semaphore::new(max_connections)),
            acceptor: Acceptor::new(name),
        }
    }

    /// The bound address.
    pub(super) fn local_addr(&self) -> Option<SocketAddr> {
        self.socket.as_ref().and_then(|s| s.local_addr().ok())
    }

    /// The next connection with the slot it holds until it ends; `None` after a failed
    /// accept. A slot is taken before accepting: at the limit, new connections queue in
    /// the kernel's backlog instead of being served.
    pub(super) async fn next(&mut self) -> Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)> {
        let slot = self.slots.clone().acquire_owned().await.ok()?;
        let (stream, remote) = self.acceptor.accept(self.socket.as_ref()).await?;
        Some((slot, stream, remote))
    }

    /// As [`Listener::next`], for a listener that makes room rather than queueing: the
    /// connection is accepted first, and when every slot is taken the oldest connection of
    /// `evictable` that has not begun a request is closed to free one. When every slot is
    /// serving requests, the new connection waits for one to end.
    pub(super) async fn next_evicting(
        &mut self,
        evictable: &Evictable,
    ) -> Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)> {
        let (stream, remote) = self.acceptor.accept(self.socket.as_ref()).await?;
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if evictable.evict_oldest() {
                    debug!(
                        listener = self.acceptor.listener,
                        "every slot taken: closed the oldest connection that sent no request"
                    );
                }
                self.slots.clone().acquire_owned().await.ok()?
            }
        };
        Some((slot, stream, remote))
    }
}

/// Accepts on one listener, backing off while accepts fail. Out of file descriptors
/// (EMFILE), a listener is readable again at once and every accept fails: without a pause
/// the loop spins and floods the log. The pause doubles from 10ms to 1s and is kept as a
/// deadline, so a select that drops the accept future does not restart it.
struct Acceptor {
    listener: &'static str,
    delay: Duration,
    resume_at: Option<tokio::time::Instant>,
    failures: u64,
}

impl Acceptor {
    fn new(listener: &'static str) -> Self {
        Self {
            listener,
            delay: ACCEPT_BACKOFF_MIN,
            resume_at: None,
            failures: 0,
        }
    }

    /// The next connection, or `None` after a failed accept (logged once per run of
    /// failures). Pending forever without a listener. Cancel-safe.
    async fn accept(&mut self, listener: Option<&TcpListener>) -> Option<(TcpStream, SocketAddr)> {
        let Some(listener) = listener else {
            return std::future::pending().await;
        };
        if let Some(at) = self.resume_at {
            tokio::time::sleep_until(at).await;
            self.resume_at = None;
        }
        match listener.accept().await {
            Ok((stream, remote)) => {
                if self.failures > 0 {
                    info!(
                        listener = self.listener,
                        failures = self.failures,
                        "accepting connections again"
                    );
                }
                self.failures = 0;
                self.delay = ACCEPT_BACKOFF_MIN;
                let _ = stream.set_nodelay(true);
                Some((stream, remote))
            }
            Err(e) => {
                if self.failures == 0 {
                    warn!(
                        listener = self.listener,
                        error = %e,
                        "accept failed; pausing accepts (10ms doubling to 1s) until one succeeds"
                    );
                } else {
                    debug!(listener = self.listener, error = %e, "accept failed again");
                }
                self.failures += 1;
                self.resume_at = Some(tokio::time::Instant::now() + self.delay);
                self.delay = (self.delay * 2).min(ACCEPT_BACKOFF_MAX);
                None
            }
        }
    }
}
