//! A new connection's first moments, all within one deadline from its accept
//! (`server.header_read_timeout`): the TLS handshake, the first bytes that show whether it
//! speaks HTTP/1 or HTTP/2, and its first request's head.
//!
//! Each phase waits on the client, and a client that sends nothing must never hold a
//! connection slot past the deadline: not before the handshake, not while its first bytes
//! are awaited (they pick hyper's HTTP/1 or HTTP/2 connection), and not after an HTTP/2 preface
//! (hyper's `header_read_timeout` is HTTP/1's; an HTTP/2 connection waits for its first
//! stream for as long as the client answers pings).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::service::Service;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The HTTP/2 connection preface: a connection that starts with it speaks HTTP/2.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection's first bytes say it speaks: hyper's HTTP/1 or HTTP/2 connection
/// serves it, with no detection layer of its own on the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

/// How long to pause before peeking again at a partial preface (peek returns the same bytes
/// at once).
const PEEK_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// The protocol `seen` decides: HTTP/2 once the whole preface came, HTTP/1 at a byte that
/// differs from it (as hyper-util decides); `None` while it could still be either.
fn protocol_of(seen: &[u8]) -> Option<Protocol> {
    if seen.len() >= PREFACE.len() && seen[..PREFACE.len()] == PREFACE[..] {
        Some(Protocol::Http2)
    } else if seen.len() >= PREFACE.len() || seen[..] != PREFACE[..seen.len()] {
        Some(Protocol::Http1)
    } else {
        None
    }
}

/// Waits, by peeking, until a plain TCP connection's first bytes decide its protocol.
/// `None` on EOF, on an error, or when `deadline` passes first.
pub(super) async fn tcp_shows_protocol(stream: &TcpStream, deadline: Instant) -> Option<Protocol> {
    let peek = async {
        let mut buf = [0u8; PREFACE.len()];
        loop {
            let n = stream.peek(&mut buf).await?;
            if n == 0 {
                return Ok::<_, io::Error>(None);
            }
            if let Some(protocol) = protocol_of(&buf[..n]) {
                return Ok(Some(protocol));
            }
            tokio::time::sleep(PEEK_PAUSE).await;
        }
    };
    tokio::time::timeout_at(deadline, peek).await.ok()?.ok()?
}

/// Reads a stream's first bytes until they decide its protocol, for a stream that cannot
/// be peeked (TLS: the plaintext exists only once read). The bytes come back in a
/// [`Prefixed`] stream, so hyper reads them again. `None` on EOF or an error; the caller
/// bounds the wait.
pub(super) async fn read_protocol<S: AsyncRead + Unpin>(
    mut stream: S,
) -> Option<(Prefixed<S>, Protocol)> {
    let mut seen = Vec::with_capacity(PREFACE.len());
    let mut buf = [0u8; PREFACE.len()];
    let protocol = loop {
        if let Some(protocol) = protocol_of(&seen) {
            break protocol;
        }
        let want = PREFACE.len() - seen.len();
        match stream.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    };
    let prefixed = Prefixed {
        prefix: seen,
        at: 0,
        inner: stream,
    };
    Some((prefixed, protocol))
}

/// A stream whose first bytes were already read: they are read again, then the stream.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether a connection has begun its first request: set by [`Marked`], awaited by
/// [`FirstRequest::missed`].
#[derive(Clone, Default)]
pub(super) struct FirstRequest(Arc<FirstRequestState>);

#[derive(Default)]
struct FirstRequestState {
    seen: AtomicBool,
    notify: Notify,
}

impl FirstRequest {
    /// Whether the connection's first request has begun.
    pub(super) fn begun(&self) -> bool {
        self.0.seen.load(Ordering::Relaxed)
    }

    pub(super) fn mark(&self) {
        // One relaxed load per request once seen: the notification is sent only once.
        if !self.0.seen.load(Ordering::Relaxed) {
            self.0.seen.store(true, Ordering::Relaxed);
            self.0.notify.notify_one();
        }
    }

    /// Resolves when `deadline` passes before the first request began; pending forever
    /// once it has begun.
    pub(super) async fn missed(&self, deadline: Instant) {
        tokio::select! {
            () = self.0.notify.notified() => std::future::pending().await,
            () = tokio::time::sleep_until(deadline) => {
                if self.0.seen.load(Ordering::Relaxed) {
                    std::future::pending().await
                }
            }
        }
    }
}

/// A connection's service, marking its first request as begun.
#[derive(Clone)]
pub(super) struct Marked<S> {
    pub(super) inner: S,
    pub(super) first: FirstRequest,
}

impl<S: Service<hyper::Request<Incoming>>> Service<hyper::Request<Incoming>> for Marked<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        self.first.mark();
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn the_protocol_is_decided_by_the_preface_or_a_byte_off_it() {
        assert_eq!(protocol_of(b"G"), Some(Protocol::Http1));
        assert_eq!(protocol_of(b"POST / HTTP/1.1"), Some(Protocol::Http1));
        assert_eq!(protocol_of(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(protocol_of(b"PRI * HTTP/1.1"), Some(Protocol::Http1));
        assert_eq!(protocol_of(PREFACE), Some(Protocol::Http2));
    }

    #[tokio::test]
    async fn bytes_read_to_decide_the_protocol_are_read_again() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let reading = tokio::spawn(read_protocol(server));
        client.write_all(b"\r\nSM\r\n\r\nmore").await.unwrap();
        let (mut prefixed, protocol) = reading.await.unwrap().expect("decided");
        assert_eq!(protocol, Protocol::Http2);
        drop(client);
        let mut all = Vec::new();
        prefixed.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nmore");
    }

    #[tokio::test]
    async fn a_stream_that_ends_early_decides_nothing() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"PRI *").await.unwrap();
        drop(client);
        assert!(read_protocol(server).await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_request_is_missed_only_when_none_began_by_the_deadline() {
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        let first = FirstRequest::default();
        first.missed(deadline).await;
        let served = FirstRequest::default();
        served.mark();
        let waited = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            served.missed(Instant::now() + std::time::Duration::from_secs(1)),
        )
        .await;
        assert!(waited.is_err(), "a connection that began a request is kept");
    }
}
