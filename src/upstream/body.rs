//! The upstream's response body, which takes its connection back to the pool at its end.

use std::pin::Pin;
use std::sync::Weak;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use super::pool::Pool;
use super::wire::WireBody;
use crate::BoxError;

/// A response body from the upstream, streamed as it arrives.
///
/// When it came over a pooled connection, the connection goes back to the pool once the
/// body has been read to its end (and the exchange left it able to take another
/// request); a body dropped before its end closes the connection.
pub struct UpstreamBody {
    inner: Inner,
}

enum Inner {
    /// From hyper's client (TLS, HTTP/2): it pools its own connections.
    Plain(Incoming),
    /// From the pool of plain HTTP/1.1 connections.
    Pooled { body: WireBody, home: Weak<Pool> },
}

impl UpstreamBody {
    /// A body that owns no connection (the TLS/HTTP/2 client pools its own).
    pub(super) fn plain(inner: Incoming) -> Self {
        Self {
            inner: Inner::Plain(inner),
        }
    }

    /// A body whose connection goes back to `home` at its end; one already at its end
    /// (no body, `Content-Length: 0`) sends it back at once.
    pub(super) fn pooled(body: WireBody, home: Weak<Pool>) -> Self {
        let mut body = Self {
            inner: Inner::Pooled { body, home },
        };
        body.go_home();
        body
    }

    /// Hands a connection the body is done with back to the pool.
    fn go_home(&mut self) {
        if let Inner::Pooled { body, home } = &mut self.inner {
            if let Some(conn) = body.take_idle() {
                if let Some(pool) = home.upgrade() {
                    pool.checkin(conn);
                }
            }
        }
    }
}

impl HttpBody for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = match &mut this.inner {
            Inner::Plain(body) => {
                ready!(Pin::new(body).poll_frame(cx)).map(|f| f.map_err(Into::into))
            }
            Inner::Pooled { body, .. } => {
                ready!(Pin::new(body).poll_frame(cx)).map(|f| f.map_err(Into::into))
            }
        };
        this.go_home();
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Plain(body) => body.is_end_stream(),
            Inner::Pooled { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Plain(body) => body.size_hint(),
            Inner::Pooled { body, .. } => body.size_hint(),
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("pooled", &matches!(self.inner, Inner::Pooled { .. }))
            .finish()
    }
}
