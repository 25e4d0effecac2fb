//! Kept-alive HTTP/1.1 connections to a plain-`http` upstream, and sending on them.
//!
//! Lighter than a general-purpose client: one address, no TLS, no HTTP/2. A connection
//! goes back to the pool when its response body has been read to the end (the body
//! carries it home, see [`UpstreamBody`]), and the most recently used one is taken first,
//! so a quiet pool's spare connections age out. Nothing is spawned per request.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Request, Response, Uri};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::body::{Outgoing, UpstreamBody};
use super::UpstreamError;
use crate::Body;

/// The sending half of a pooled connection.
pub(super) type Sender = SendRequest<Outgoing>;

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

/// One idle connection.
struct Idle {
    sender: Sender,
    since: Instant,
}

/// The pool of one plain-`http` upstream.
pub(super) struct Pool {
    /// `host:port` to connect to.
    authority: Authority,
    /// The `Host` header every request carries (the port only when not 80).
    host: HeaderValue,
    limits: Limits,
    /// Idle connections, oldest first.
    idle: Mutex<Vec<Idle>>,
}

impl Pool {
    /// A pool for `authority`; idle connections are closed after `limits.idle_timeout`
    /// by a sweeper task (when a runtime is running) and on every check-in.
    pub(super) fn new(authority: Authority, limits: Limits) -> Arc<Self> {
        let host = match authority.port_u16() {
            Some(80) | None => authority.host().to_owned(),
            Some(_) => authority.as_str().to_owned(),
        };
        let pool = Arc::new(Self {
            host: HeaderValue::from_str(&host).unwrap_or(HeaderValue::from_static("localhost")),
            authority,
            limits,
            idle: Mutex::new(Vec::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&pool)));
        }
        pool
    }

    /// Sends `req` (its URI's path and query are used) on a kept-alive connection, or on
    /// a new one. A request a reused connection refused before writing a byte (the
    /// upstream closed it as it was taken) is sent again on another.
    pub(super) async fn send(
        self: &Arc<Self>,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::from(path);
        parts.headers.insert(header::HOST, self.host.clone());
        let (body, sent) = Outgoing::new(body);
        let mut req = Request::from_parts(parts, body);
        loop {
            let (mut sender, reused) = match self.checkout().await {
                Some(s) => (s, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(self.carry_home(resp, sender, sent)),
                Err(mut e) => match e.take_message() {
                    Some(back) if reused => req = back,
                    _ => return Err(UpstreamError::Broken(super::error_chain(e.error()))),
                },
            }
        }
    }

    /// The response, with its connection riding on the body back to the pool.
    fn carry_home(
        self: &Arc<Self>,
        resp: Response<hyper::body::Incoming>,
        sender: Sender,
        sent: Arc<AtomicBool>,
    ) -> Response<UpstreamBody> {
        let home = Arc::downgrade(self);
        resp.map(|body| UpstreamBody::pooled(body, sender, sent, home))
    }

    /// The most recently returned live connection, once it can take a request.
    async fn checkout(&self) -> Option<Sender> {
        loop {
            let mut sender = {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                let now = Instant::now();
                expire(&mut idle, now, self.limits.idle_timeout);
                idle.pop()?.sender
            };
            if sender.is_closed() {
                continue;
            }
            // Returned when its body ended: ready at once or as soon as the connection's
            // task has seen the end; an error means the upstream closed it.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// Returns a connection whose response has been read to the end.
    pub(super) fn checkin(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        expire(&mut idle, now, self.limits.idle_timeout);
        if idle.len() >= self.limits.max_idle {
            idle.remove(0);
        }
        idle.push(Idle { sender, since: now });
    }

    /// A new connection: TCP within the connect timeout, then the HTTP/1.1 handshake.
    async fn connect(&self) -> Result<Sender, UpstreamError> {
        let addr = self.authority.as_str();
        let addr = match self.authority.port_u16() {
            Some(_) => std::borrow::Cow::Borrowed(addr),
            None => std::borrow::Cow::Owned(format!("{addr}:80")),
        };
        let stream = match tokio::time::timeout(
            self.limits.connect_timeout,
            TcpStream::connect(addr.as_ref()),
        )
        .await
        {
            Err(_) => {
                return Err(UpstreamError::Connect(format!(
                    "connect to {addr}: timed out"
                )))
            }
            Ok(Err(e)) => return Err(UpstreamError::Connect(format!("connect to {addr}: {e}"))),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| UpstreamError::Connect(super::error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(sender)
    }
}

/// Drops the idle connections unused for longer than `timeout` (the oldest come first).
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
        idle.retain(|i| !i.sender.is_closed());
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

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout_with_no_traffic() {
        let (authority, closed) = counting_listener().await;
        let pool = Pool::new(authority, limits(Duration::from_millis(100), 8));
        for _ in 0..3 {
            let sender = pool.connect().await.unwrap();
            pool.checkin(sender);
        }
        assert_eq!(pool.idle.lock().unwrap().len(), 3);
        // No checkout, no checkin: only the sweeper can close them.
        until(|| closed.load(Ordering::SeqCst) == 3).await;
        assert!(pool.idle.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn past_the_idle_limit_the_oldest_connection_is_closed() {
        let (authority, closed) = counting_listener().await;
        let pool = Pool::new(authority, limits(Duration::from_secs(60), 2));
        for _ in 0..3 {
            let sender = pool.connect().await.unwrap();
            pool.checkin(sender);
        }
        until(|| closed.load(Ordering::SeqCst) == 1).await;
        assert_eq!(pool.idle.lock().unwrap().len(), 2);
        // The newest is taken first.
        assert!(pool.checkout().await.is_some());
        assert!(pool.checkout().await.is_some());
        assert!(pool.checkout().await.is_none());
    }

    #[tokio::test]
    async fn a_connection_refused_by_the_upstream_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let authority: Authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        drop(listener);
        let pool = Pool::new(authority, limits(Duration::from_secs(60), 2));
        let req = Request::new(crate::full(""));
        match pool.send(req).await {
            Err(UpstreamError::Connect(m)) => assert!(m.contains("connect to"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
