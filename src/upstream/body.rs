//! The bodies of a pooled exchange: the request's, which tells when it has all been sent,
//! and the response's, which takes its connection back to the pool at its end.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use super::pool::{Pool, Sender};
use crate::{Body, BoxError};

/// A request body on its way to the upstream; `sent` turns true once hyper has taken all
/// of it.
pub(super) struct Outgoing {
    inner: Body,
    sent: Arc<AtomicBool>,
}

impl Outgoing {
    /// Wraps `inner`; the flag it returns is shared with the response's body.
    pub(super) fn new(inner: Body) -> (Self, Arc<AtomicBool>) {
        let sent = Arc::new(AtomicBool::new(inner.is_end_stream()));
        let flag = sent.clone();
        (Self { inner, sent }, flag)
    }
}

impl HttpBody for Outgoing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if frame.is_none() || this.inner.is_end_stream() {
            this.sent.store(true, Ordering::Release);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a pooled connection goes when its exchange is over.
struct Home {
    sender: Sender,
    /// Whether the request body has all been sent (a response may end before it has: an
    /// upstream that answers early).
    sent: Arc<AtomicBool>,
    pool: Weak<Pool>,
}

/// A response body from the upstream, streamed as it arrives.
///
/// When it came over a pooled connection, the connection goes back to the pool once the
/// body has been read to its end; a body dropped before its end takes the connection with
/// it (hyper closes a connection whose response was not read out).
pub struct UpstreamBody {
    inner: Incoming,
    home: Option<Home>,
}

impl UpstreamBody {
    /// A body that owns no connection (the TLS/HTTP/2 client pools its own).
    pub(super) fn plain(inner: Incoming) -> Self {
        Self { inner, home: None }
    }

    /// A body that returns `sender` to `pool` at its end; one already at its end (no body,
    /// `Content-Length: 0`) returns it at once. `sent` tells whether the request's body
    /// has all been sent.
    pub(super) fn pooled(
        inner: Incoming,
        sender: Sender,
        sent: Arc<AtomicBool>,
        pool: Weak<Pool>,
    ) -> Self {
        let mut body = Self {
            inner,
            home: Some(Home { sender, sent, pool }),
        };
        if body.inner.is_end_stream() {
            body.go_home();
        }
        body
    }

    /// The exchange is over on the response's side. With the request sent too, the
    /// connection is ready as soon as its task has seen the end, and goes back now. An
    /// early answer's connection is still sending: it goes back once it is done, from a
    /// task of its own (rare), so that no request ever waits on another's upload.
    fn go_home(&mut self) {
        let Some(Home { sender, sent, pool }) = self.home.take() else {
            return;
        };
        let Some(pool) = pool.upgrade() else { return };
        if sent.load(Ordering::Acquire) {
            pool.checkin(sender);
        } else {
            tokio::spawn(async move {
                let mut sender = sender;
                if sender.ready().await.is_ok() {
                    pool.checkin(sender);
                }
            });
        }
    }
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            None => this.go_home(),
            Some(Ok(_)) if this.inner.is_end_stream() => this.go_home(),
            Some(Ok(_)) => {}
            Some(Err(_)) => this.home = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("pooled", &self.home.is_some())
            .finish()
    }
}
