//! One HTTP/1.1 connection to the upstream, driven by whoever is using it.
//!
//! hyper splits a client connection into a sender and a connection future that does the
//! I/O; a general-purpose client spawns the future as a task, so every request hops from
//! the request's task to the connection's and back. Here the request's own task polls the
//! connection: while sending and waiting for the head ([`Link::exchange`]), then while
//! reading the body (`UpstreamBody`). An idle connection is polled by no one; taking it
//! out of the pool polls it once, which finds a close the upstream sent meanwhile.
//!
//! Only while the upload is still going does the connection need driving apart from the
//! response: an upstream that answers before it has the whole request body, a client still
//! sending. Then a task of its own ([`finish`]) drives it to the end, as a general-purpose
//! client would, so the upload never waits on the client reading the answer and is never
//! cut; that connection is closed after, not pooled.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::client::conn::TrySendError;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::{Body, BoxError};

/// The connection future of one upstream connection.
type Io = Connection<TokioIo<TcpStream>, Outgoing>;

/// One connection: its sender, and its I/O until the connection ends.
pub(super) struct Link {
    sender: SendRequest<Outgoing>,
    /// `None` once the connection has ended (closed by either side, or broken).
    io: Option<Pin<Box<Io>>>,
    /// Whether the current request's body has all been taken by hyper.
    uploaded: Arc<AtomicBool>,
}

impl Link {
    /// A connection fresh from its handshake.
    pub(super) fn new(sender: SendRequest<Outgoing>, io: Io) -> Self {
        Self {
            sender,
            io: Some(Box::pin(io)),
            uploaded: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Whether the current request's body has all been taken (it may still be in hyper's
    /// write buffer: the client has nothing more to send, and reads the answer, which
    /// drives the rest out).
    pub(super) fn uploaded(&self) -> bool {
        self.uploaded.load(Ordering::Acquire)
    }

    /// Moves the connection's I/O on as far as it can go now; false once it has ended.
    /// An ended connection's I/O is dropped at once, which fails a request still waiting
    /// on it instead of leaving it pending.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        drive(&mut self.io, cx)
    }

    /// Whether the connection can take a request, as of its last drive.
    pub(super) fn is_ready(&self) -> bool {
        self.io.is_some() && self.sender.is_ready()
    }

    /// Whether the connection lives and can take a request now, after moving it on once
    /// (which is when a close the upstream sent while it was idle is seen).
    pub(super) fn ready_now(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.drive(&mut cx) && self.sender.is_ready()
    }

    /// Sends `req` and waits for the response's head, driving the connection meanwhile.
    pub(super) async fn exchange(
        &mut self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, Refused> {
        let req = req.map(|body| {
            self.uploaded.store(body.is_end_stream(), Ordering::Release);
            Outgoing {
                inner: body,
                uploaded: self.uploaded.clone(),
            }
        });
        let mut response = std::pin::pin!(self.sender.try_send_request(req));
        let io = &mut self.io;
        poll_fn(|cx| {
            drive(io, cx);
            response.as_mut().poll(cx)
        })
        .await
        .map_err(|mut e: TrySendError<_>| Refused {
            unsent: e
                .take_message()
                .map(|r: Request<Outgoing>| r.map(|o| o.inner)),
            error: e.into_error(),
        })
    }
}

/// A request that got no response.
pub(super) struct Refused {
    /// Why.
    pub error: hyper::Error,
    /// The request, when hyper never took it off its queue: not a byte of it was written.
    pub unsent: Option<Request<Body>>,
}

/// Drives `link` from a task of its own until its exchange is over, then closes it. Used
/// when the answer ended, or came, before the upload did: the upload goes on whether or
/// not the answer is read, and the connection is not lent again (after an early answer
/// hyper does not reliably take the next request on it). `bound` limits the wait when only
/// the upload is left (the answer was read); `None` while the answer may still be
/// streaming to a client, whose going away ends the connection.
pub(super) fn finish(mut link: Link, bound: Option<Duration>) {
    let over = poll_fn(move |cx| {
        if !link.drive(cx) || link.is_ready() {
            return Poll::Ready(());
        }
        Poll::Pending
    });
    tokio::spawn(async move {
        match bound {
            Some(bound) => {
                let _ = tokio::time::timeout(bound, over).await;
            }
            None => over.await,
        }
    });
}

/// A request body on its way upstream, which says when hyper has taken all of it.
pub(super) struct Outgoing {
    inner: Body,
    uploaded: Arc<AtomicBool>,
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
            this.uploaded.store(true, Ordering::Release);
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

/// Polls a connection's I/O; false once it has ended (and is dropped).
fn drive(io: &mut Option<Pin<Box<Io>>>, cx: &mut Context<'_>) -> bool {
    let Some(conn) = io.as_mut() else {
        return false;
    };
    match conn.as_mut().poll(cx) {
        Poll::Pending => true,
        Poll::Ready(result) => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            *io = None;
            false
        }
    }
}
