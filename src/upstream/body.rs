//! The upstream's response body, which takes its connection back to the pool at its end.

use std::pin::Pin;
use std::sync::Weak;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use super::link::{self, Link};
use super::pool::Pool;

/// Where a pooled connection goes when its exchange is over.
struct Home {
    link: Link,
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

    /// A body that returns `link` to `pool` at its end; one already at its end (no body,
    /// `Content-Length: 0`) returns it at once.
    pub(super) fn pooled(inner: Incoming, link: Link, pool: Weak<Pool>) -> Self {
        let mut body = Self {
            inner,
            home: Some(Home { link, pool }),
        };
        if body.inner.is_end_stream() {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            body.go_home(&mut cx);
        }
        body
    }

    /// The exchange is over on the response's side. The connection is moved on once more
    /// (to see the end itself), and if it can take the next request it goes back. One that
    /// cannot (hyper still writing out a request body the upstream answered early) is
    /// finished by a task of its own, at most the pool's idle timeout, and closed: a
    /// request is never given a connection that is not idle.
    fn go_home(&mut self, cx: &mut Context<'_>) {
        let Some(Home { mut link, pool }) = self.home.take() else {
            return;
        };
        if !link.drive(cx) {
            return;
        }
        let Some(home) = pool.upgrade() else { return };
        if link.is_ready() {
            home.checkin(link);
        } else {
            link::finish(link, Some(home.upload_wait()));
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
        // The response's bytes come in through its connection, which this body drives.
        if let Some(home) = this.home.as_mut() {
            home.link.drive(cx);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            None => this.go_home(cx),
            // Trailers come last; a server may not poll for the end after them.
            Some(Ok(f)) if f.is_trailers() || this.inner.is_end_stream() => this.go_home(cx),
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
