//! The upstream's response body, which takes its connection back to the pool at its end.

use std::pin::Pin;
use std::sync::Weak;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use super::pool::{Pool, Sender};

/// Where a pooled connection goes when its exchange is over.
struct Home {
    sender: Sender,
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
    /// `Content-Length: 0`) returns it at once.
    pub(super) fn pooled(inner: Incoming, sender: Sender, pool: Weak<Pool>) -> Self {
        let mut body = Self {
            inner,
            home: Some(Home { sender, pool }),
        };
        if body.inner.is_end_stream() {
            body.go_home();
        }
        body
    }

    /// The exchange is over on the response's side. A connection ready for the next
    /// request goes back (the common case: its task has seen the end before this body
    /// does). One that is not is never lent: it may still be sending an upload the
    /// upstream answered early, and hyper does not reliably make such a connection ready
    /// again, so a request given it could wait until its timeout. Its sender is dropped:
    /// the connection's task finishes the exchange under way (the upload goes out whole,
    /// whether or not the client reads the answer) and then closes it.
    fn go_home(&mut self) {
        let Some(Home { sender, pool }) = self.home.take() else {
            return;
        };
        // `checkin` keeps only a connection ready for a request.
        if let Some(pool) = pool.upgrade() {
            pool.checkin(sender);
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
            // Trailers come last; a server may not poll for the end after them.
            Some(Ok(f)) if f.is_trailers() || this.inner.is_end_stream() => this.go_home(),
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
