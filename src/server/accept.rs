//! Accepting connections, with a back-off while accepts fail.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

/// First pause after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause between accepts while they keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts on one listener, backing off while accepts fail. Out of file descriptors
/// (EMFILE), a listener is readable again at once and every accept fails: without a pause
/// the loop spins and floods the log. The pause doubles from 10ms to 1s and is kept as a
/// deadline, so a select that drops the accept future does not restart it.
pub(super) struct Acceptor {
    listener: &'static str,
    delay: Duration,
    resume_at: Option<tokio::time::Instant>,
    failures: u64,
}

impl Acceptor {
    pub(super) fn new(listener: &'static str) -> Self {
        Self {
            listener,
            delay: ACCEPT_BACKOFF_MIN,
            resume_at: None,
            failures: 0,
        }
    }

    /// The next connection, or `None` after a failed accept (logged once per run of
    /// failures). Pending forever without a listener. Cancel-safe.
    pub(super) async fn accept(
        &mut self,
        listener: Option<&TcpListener>,
    ) -> Option<(TcpStream, SocketAddr)> {
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
