//! Kept-alive HTTP/1.1 connections to a plain-`http` upstream, and sending on them.
//!
//! Lighter than a general-purpose client: one upstream, no TLS, no HTTP/2. A connection
//! goes back to the pool when its response body has been read to the end and it can take
//! the next request (the body carries it home, see [`UpstreamBody`]); the most recently
//! used one is taken first, so a quiet pool's spare connections age out. Only a connection
//! whose exchange is over is ever lent, so no request waits on another's exchange. Nothing
//! is spawned, per request or per connection: the exchange runs in the request's task
//! ([`super::wire`]).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::Authority;
use http::{Method, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use super::body::UpstreamBody;
use super::wire::{Conn, Failed, RawFailed, RawHead, WireBody};
use super::UpstreamFailure;
use crate::Body;

/// The pool's limits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// How long a TCP connect may take.
    pub connect_timeout: Duration,
    /// How long a connection may sit unused before it is closed.
    pub idle_timeout: Duration,
    /// At most this many unused connections are kept.
    pub max_idle: usize,
}

/// One idle connection, and the runtime whose reactor its socket is on (on connection
/// workers, each worker's; see [`crate::timers::runtime`]).
struct Idle {
    conn: Conn,
    since: Instant,
    runtime: Option<tokio::runtime::Id>,
}

/// The pool of one plain-`http` upstream.
pub(super) struct Pool {
    /// Dials the upstream's host: every address it resolves to, each within its share of
    /// the connect timeout, IPv6 and IPv4 raced (hyper-util's connector).
    dialer: HttpConnector,
    /// `http://host:port/`, what the dialer is given.
    target: Uri,
    /// The `Host` header every request carries (the port only when not 80).
    host: HeaderValue,
    limits: Limits,
    /// Idle connections, oldest first.
    idle: Mutex<Vec<Idle>>,
}

impl Pool {
    /// A pool for `authority`; idle connections are closed after `limits.idle_timeout`
    /// by a sweeper task (when a runtime is running) and on every check-in.
    pub(super) fn new(authority: &Authority, limits: Limits) -> Arc<Self> {
        // Host and port only: never a userinfo part, and no port when it is the default.
        let host_port = match authority.port_u16() {
            Some(port) if port != 80 => format!("{}:{port}", authority.host()),
            _ => authority.host().to_owned(),
        };
        let target = Uri::try_from(format!("http://{host_port}/"))
            .unwrap_or_else(|_| Uri::from_static("http://localhost/"));
        let mut dialer = HttpConnector::new();
        dialer.set_connect_timeout(Some(limits.connect_timeout));
        dialer.set_nodelay(true);
        let pool = Arc::new(Self {
            host: HeaderValue::from_str(&host_port)
                .unwrap_or(HeaderValue::from_static("localhost")),
            dialer,
            target,
            limits,
            idle: Mutex::new(Vec::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&pool)));
        }
        pool
    }

    /// Sends `req` (its URI in origin form, as `Upstream::prepare` leaves it) on a
    /// kept-alive connection, or on a new one. A request a reused connection refused before
    /// a byte of it was written (the upstream closed it as it was taken) is sent again on
    /// another; one a new connection refused so is a connect error: the upstream never saw
    /// it.
    pub(super) async fn send(
        self: &Arc<Self>,
        mut req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamFailure> {
        req.headers_mut().insert(header::HOST, self.host.clone());
        loop {
            let (conn, reused) = self.lend().await?;
            match conn.exchange(req).await {
                Ok(resp) => return Ok(resp.map(|body| self.pooled(body))),
                Err(Failed::Unsent(back, _)) if reused => req = *back,
                Err(Failed::Unsent(_, e)) => {
                    return Err(UpstreamFailure::Connect(Box::new(ClosedUnsent(e))))
                }
                Err(Failed::Broken(e)) => return Err(UpstreamFailure::Broken(e.into())),
            }
        }
    }

    /// As [`Pool::send`], for a request already encoded, head and body (its `Host` this
    /// pool's, see [`Pool::host`]): the response head comes written for the client into
    /// `out`.
    pub(super) async fn relay(
        self: &Arc<Self>,
        request: [Bytes; 2],
        method: &Method,
        out: &mut Vec<u8>,
    ) -> Result<(RawHead, UpstreamBody), UpstreamFailure> {
        loop {
            // A head parsed off a connection whose answer was not this request's (and the
            // request sent again) leaves nothing behind.
            out.clear();
            let (conn, reused) = self.lend().await?;
            match conn.relay(request.clone(), method, out).await {
                Ok((head, body)) => return Ok((head, self.pooled(body))),
                Err(failed) => self.unsent_again(failed, reused)?,
            }
        }
    }

    /// A connection for one exchange: the most recent idle one (`true`: reused), or a new one.
    async fn lend(&self) -> Result<(Conn, bool), UpstreamFailure> {
        match self.checkout() {
            Some(c) => Ok((c, true)),
            None => Ok((self.connect().await?, false)),
        }
    }

    /// An answer's body that takes its connection home to this pool at its end.
    fn pooled(self: &Arc<Self>, body: WireBody) -> UpstreamBody {
        UpstreamBody::pooled(body, Arc::downgrade(self))
    }

    /// Whether an encoded request whose exchange got no head goes out again: `Ok` when a
    /// reused connection refused it before a byte left (the upstream closed it as it was
    /// taken); a new connection that did so is a connect error (the upstream never saw it),
    /// and one that may have reached the upstream is broken.
    fn unsent_again(&self, failed: RawFailed, reused: bool) -> Result<(), UpstreamFailure> {
        match failed {
            RawFailed::Unsent(_) if reused => Ok(()),
            RawFailed::Unsent(e) => Err(UpstreamFailure::Connect(Box::new(ClosedUnsent(e)))),
            RawFailed::Broken(e) => Err(UpstreamFailure::Broken(e.into())),
        }
    }

    /// The `Host` every request to this upstream carries.
    pub(super) fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// The most recently returned connection of this runtime that can take a request
    /// now. Another runtime's is left alone: its socket's events come from that runtime's
    /// reactor, which a busy worker turns to only between its tasks (a new connection is
    /// dialled instead, once per connection a worker needs at its busiest).
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        expire(&mut idle, Instant::now(), self.limits.idle_timeout);
        let here = crate::timers::runtime();
        loop {
            let at = idle.iter().rposition(|i| i.runtime == here)?;
            let Idle { conn, .. } = idle.remove(at);
            // One the upstream closed since it came back is dropped.
            if conn.is_usable() {
                return Some(conn);
            }
        }
    }

    /// Returns a connection whose exchange is over.
    pub(super) fn checkin(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        expire(&mut idle, now, self.limits.idle_timeout);
        if idle.len() >= self.limits.max_idle && !idle.is_empty() {
            idle.remove(0);
        }
        idle.push(Idle {
            conn,
            since: now,
            runtime: crate::timers::runtime(),
        });
    }

    /// A new connection: TCP within the connect timeout.
    async fn connect(&self) -> Result<Conn, UpstreamFailure> {
        let mut dialer = self.dialer.clone();
        let stream = dialer.call(self.target.clone()).await.map_err(|e| {
            UpstreamFailure::Connect(Box::new(Dial {
                host: self.host_str().to_owned(),
                source: e.into(),
            }))
        })?;
        Ok(Conn::new(stream.into_inner()))
    }

    fn host_str(&self) -> &str {
        self.host.to_str().unwrap_or("upstream")
    }
}

/// Drops the idle connections unused for longer than `timeout` (the oldest come first).
/// A connection to the upstream could not be dialled.
#[derive(Debug, thiserror::Error)]
#[error("connect to {host}")]
struct Dial {
    host: String,
    source: crate::BoxError,
}

/// A new connection closed before the request's first byte was written: never sent.
#[derive(Debug, thiserror::Error)]
#[error("the new connection closed before the request was sent")]
struct ClosedUnsent(#[source] super::wire::WireError);

fn expire(idle: &mut Vec<Idle>, now: Instant, timeout: Duration) {
    let stale = idle
        .iter()
        .take_while(|i| now.duration_since(i.since) > timeout)
        .count();
    if stale > 0 {
        idle.drain(..stale);
    }
}

/// Closes idle connections past their time while the pool lives, even with no traffic.
async fn sweep(pool: Weak<Pool>) {
    let every = match pool.upgrade() {
        Some(p) => (p.limits.idle_timeout / 2).max(Duration::from_millis(100)),
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        expire(&mut idle, Instant::now(), pool.limits.idle_timeout);
        idle.retain(|i| i.conn.is_usable());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;

    /// A listener that accepts connections and counts the ones its peer closed.
    async fn counting_listener() -> (Authority, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        let closed = Arc::new(AtomicUsize::new(0));
        let c = closed.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (authority, closed)
    }

    fn limits(idle_timeout: Duration, max_idle: usize) -> Limits {
        Limits {
            connect_timeout: Duration::from_secs(1),
            idle_timeout,
            max_idle,
        }
    }

    async fn until(what: impl Fn() -> bool) {
        for _ in 0..200 {
            if what() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out");
    }

    /// Dials `n` connections and checks each in, ready and idle.
    async fn park(pool: &Pool, n: usize) {
        for _ in 0..n {
            let conn = pool.connect().await.unwrap();
            pool.checkin(conn);
        }
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout_with_no_traffic() {
        let (authority, closed) = counting_listener().await;
        let pool = Pool::new(&authority, limits(Duration::from_millis(100), 8));
        park(&pool, 3).await;
        assert_eq!(pool.idle.lock().unwrap().len(), 3);
        // No checkout, no checkin: only the sweeper can close them.
        until(|| closed.load(Ordering::SeqCst) == 3).await;
        assert!(pool.idle.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn past_the_idle_limit_the_oldest_connection_is_closed() {
        let (authority, closed) = counting_listener().await;
        let pool = Pool::new(&authority, limits(Duration::from_secs(60), 2));
        park(&pool, 3).await;
        until(|| closed.load(Ordering::SeqCst) == 1).await;
        assert_eq!(pool.idle.lock().unwrap().len(), 2);
        // The newest is taken first.
        assert!(pool.checkout().is_some());
        assert!(pool.checkout().is_some());
        assert!(pool.checkout().is_none());
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_or_wrote_on_while_idle_is_never_lent() {
        for stray in [&b""[..], b"HTTP/1.1 200 OK\r\n"] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let (mut s, _) = listener.accept().await.unwrap();
                s.write_all(stray).await.unwrap();
                if stray.is_empty() {
                    drop(s);
                } else {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            });
            let pool = Pool::new(&authority, limits(Duration::from_secs(60), 8));
            park(&pool, 1).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                pool.checkout().is_none(),
                "{stray:?}: a spoilt connection was lent"
            );
            assert!(pool.idle.lock().unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn a_connection_refused_by_the_upstream_is_a_connect_error() {
        // Bound, never listening: the port is refused and no other test can take it.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let authority: Authority = socket.local_addr().unwrap().to_string().parse().unwrap();
        let pool = Pool::new(&authority, limits(Duration::from_secs(60), 2));
        let req = Request::new(crate::full(""));
        match pool.send(req).await {
            Err(e @ UpstreamFailure::Connect(_)) => {
                assert!(!e.may_have_executed());
                assert!(e.chain().contains("connect to"), "{}", e.chain());
            }
            other => panic!("{other:?}"),
        }
    }
}
