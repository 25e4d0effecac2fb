//! A lean HTTP/1.1 client connection for the pool: the request's task writes the request
//! and reads the answer itself.
//!
//! hyper's client connection is a task of its own, fed through a channel: each exchange
//! woke it about four times (the request handed over, the write, the answer, the body's
//! end) and each of those polls ran its whole dispatcher, a third of the gateway's own
//! CPU for a streamed request. Here the exchange is polled by the task that wants it:
//! the request is encoded into the connection's write buffer (see [`crate::coalesce`]),
//! the response head is parsed in place ([`head`]), and the body ([`WireBody`]) is read
//! from the same buffer by whoever reads the response, and hands the connection back at
//! its end. Only what the pool needs is here: one request at a time, HTTP/1.1, no
//! upgrades.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use http::{Request, Response};
use hyper::body::Body as HttpBody;
use tokio::net::TcpStream;

use crate::coalesce::Coalesce;
use crate::Body;

mod body;
mod duplex;
mod head;
mod raw;
mod upload;

pub use self::body::WireBody;
pub use self::head::Framing;
use self::head::Parsed;
pub use self::raw::{
    after_status_line, has_written_field, written_fields, RawFailed, RawHead, Written,
    WrittenFields,
};
use self::upload::Upload;

/// The connection's socket, its writes coalesced.
type Io = Coalesce<TcpStream>;

/// How much room a read asks for.
const READ_ROOM: usize = 4096;

/// Why an exchange or its body failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket failed.
    #[error("the upstream connection failed")]
    Io(#[source] std::io::Error),
    /// The upstream closed the connection before the whole answer.
    #[error("the upstream closed the connection before the whole answer")]
    Truncated,
    /// The upstream's answer is not HTTP/1.1 the gateway can read.
    #[error("the upstream's answer is malformed: {0}")]
    Malformed(String),
    /// The response head is larger than the gateway takes.
    #[error("the upstream's response head is too large")]
    HeadTooLarge,
    /// The request body was longer or shorter than its `Content-Length`.
    #[error("the request body does not match its Content-Length")]
    BodyLength,
    /// The request body failed as it was read (the client's upload broke).
    #[error("the request body failed")]
    Upload(#[source] crate::BoxError),
}

/// An exchange that got no response head.
#[derive(Debug)]
pub enum Failed {
    /// No byte of the request left: the request, given back whole, and why.
    Unsent(Box<Request<Body>>, WireError),
    /// The request may have reached the upstream.
    Broken(WireError),
}

/// A kept-alive connection to the upstream, between exchanges.
pub struct Conn {
    io: Io,
    /// Bytes read and not yet taken.
    read: BytesMut,
}

impl Conn {
    /// A connection over a connected socket.
    pub fn new(stream: TcpStream) -> Self {
        Self {
            io: Coalesce::new(stream),
            read: BytesMut::new(),
        }
    }

    /// Whether an idle connection can take a request: the upstream has neither closed it
    /// nor sent anything unasked (either makes it unusable).
    pub fn is_usable(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(
            self.io.get_ref().try_read(&mut probe),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        )
    }

    /// Reads more into the buffer: the bytes read (0 at the end of the stream).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_ROOM / 4 {
            self.read.reserve(READ_ROOM);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Sends `req` (origin form, its `Host` set) and reads the response head. The body
    /// is read from the response; at its end the connection comes back through
    /// [`WireBody::take_idle`].
    pub async fn exchange(mut self, req: Request<Body>) -> Result<Response<WireBody>, Failed> {
        let (mut parts, body) = req.into_parts();
        let empty = body.is_end_stream();
        let send = head::frame_request(&mut parts, empty, body.size_hint().exact());
        let head = head::encode_request(&parts);
        let mut upload = Some(Upload::new(head, &parts.headers, body, send, empty));
        let method = parts.method.clone();
        let answered = self
            .answer(&mut upload, |read| head::parse_response(read, &method))
            .await;
        match answered {
            Ok(head) => Ok(response(self, head, upload)),
            // A failed upload is the client's, not the connection's: never sent again.
            Err(e @ (WireError::Upload(_) | WireError::BodyLength)) => Err(Failed::Broken(e)),
            Err(e) => match upload.and_then(Upload::take_back) {
                Some(body) => Err(Failed::Unsent(
                    Box::new(Request::from_parts(parts, body)),
                    e,
                )),
                None => Err(Failed::Broken(e)),
            },
        }
    }

    /// Sends `upload` while reading the final response head with `parse`: the head, or why
    /// there is none. `upload` is left `Some` while the request is not all sent (an answer
    /// the upstream gave early), `None` once it is or once writing it failed.
    async fn answer<H: Answer>(
        &mut self,
        upload: &mut Option<Upload>,
        mut parse: impl FnMut(&mut BytesMut) -> Result<Parsed<H>, WireError>,
    ) -> Result<H, WireError> {
        let before = self.io.written();
        // Kept across polls: once the upload could not be written, only the answer the
        // upstream sent before it stopped reading is awaited (the socket is broken, so the
        // read ends soon, in that answer or in an error).
        let mut write_failed = false;
        std::future::poll_fn(|cx| {
            if let (Some(up), false) = (upload.as_mut(), write_failed) {
                let sent = up.poll_send(&mut self.io, cx);
                if self.io.written() != before {
                    up.sent();
                }
                match sent {
                    Poll::Ready(Ok(())) => *upload = None,
                    Poll::Ready(Err(WireError::Io(_))) => write_failed = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            match self.poll_head(cx, &mut parse) {
                // Nothing of the request has left: no answer can be to it (a late or
                // unasked-for one on a kept-alive connection). Never taken as this one's.
                Poll::Ready(Ok(_)) if self.io.written() == before => Poll::Ready(Err(
                    WireError::Malformed("an answer before the request".into()),
                )),
                // An answer the upstream sent before it stopped reading the upload (a 413,
                // say) still counts; the connection is not kept after it.
                Poll::Ready(Ok(mut head)) if write_failed => {
                    *upload = None;
                    head.close();
                    Poll::Ready(Ok(head))
                }
                // Not yet: a read that would block, or tokio's cooperative budget spent
                // (it wakes the task again). Neither means the upstream did not answer.
                // A broken socket's read ends soon (bounded besides by the call's deadline).
                Poll::Pending => Poll::Pending,
                answered => answered,
            }
        })
        .await
    }

    /// Reads until `parse` finds the final response head (informational ones skipped).
    fn poll_head<H>(
        &mut self,
        cx: &mut Context<'_>,
        parse: &mut impl FnMut(&mut BytesMut) -> Result<Parsed<H>, WireError>,
    ) -> Poll<Result<H, WireError>> {
        loop {
            if !self.read.is_empty() {
                match parse(&mut self.read)? {
                    Parsed::Final(head) => return Poll::Ready(Ok(head)),
                    Parsed::Interim => continue,
                    Parsed::Partial => {}
                }
            }
            match std::task::ready!(self.poll_fill(cx)) {
                Ok(0) if self.read.is_empty() => {
                    return Poll::Ready(Err(WireError::Io(
                        std::io::ErrorKind::UnexpectedEof.into(),
                    )))
                }
                Ok(0) => return Poll::Ready(Err(WireError::Truncated)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(WireError::Io(e))),
            }
        }
    }
}

/// The response to `head`, its body read from `conn` (`upload` is what is left to send
/// of a request the upstream answered early).
fn response(conn: Conn, head: head::ResponseHead, upload: Option<Upload>) -> Response<WireBody> {
    let mut response = Response::new(WireBody::new(conn, head.framing, head.keep_alive, upload));
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    response
}

/// A parsed final response head, as [`Conn::answer`] reads it.
trait Answer {
    /// The connection is not kept after this answer.
    fn close(&mut self);
}

impl Answer for head::ResponseHead {
    fn close(&mut self) {
        self.keep_alive = false;
    }
}
