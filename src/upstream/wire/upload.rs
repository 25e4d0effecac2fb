//! Sending a request: its head, then its body as the framing says, written through the
//! connection's coalescing buffer and flushed when the body has nothing more ready.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderMap, HeaderName, TRAILER};

use hyper::body::{Body as HttpBody, Frame};
use tokio::io::AsyncWrite;

use super::head::{encode_fields, Send};
use super::{Io, WireError};
use crate::Body;

/// A request on its way out.
pub(super) struct Upload {
    body: Body,
    /// `Length`: the bytes the body still owes.
    send: Send,
    /// Encoded bytes not yet taken by the connection.
    queue: VecDeque<Bytes>,
    /// The body's end is queued.
    ended: bool,
    /// What was taken from the body while nothing had left yet, to give the request back
    /// whole if the connection turns out closed (`None` once a byte has left).
    kept: Option<Vec<Kept>>,
    /// The trailer fields the request's `Trailer` header announced: only those are sent.
    announced: Vec<HeaderName>,
}

/// A frame taken from the body before the first byte left.
enum Kept {
    Data(Bytes),
    Trailers(HeaderMap),
}

impl Upload {
    /// `head` and then `body`, framed by `send`; `empty` is a body already at its end.
    /// `headers` are the request's, for the trailer fields its `Trailer` announces.
    pub(super) fn new(
        head: Vec<u8>,
        headers: &HeaderMap,
        body: Body,
        send: Send,
        empty: bool,
    ) -> Self {
        let mut queue = VecDeque::with_capacity(4);
        queue.push_back(Bytes::from(head));
        let announced = match headers.contains_key(TRAILER) {
            false => Vec::new(),
            true => headers
                .get_all(TRAILER)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
                .collect(),
        };
        Self {
            body,
            send,
            queue,
            ended: empty || send == Send::Length(0),
            kept: Some(Vec::new()),
            announced,
        }
    }

    /// A whole message already encoded: its head, then its body.
    pub(super) fn bytes(message: [Bytes; 2]) -> Self {
        let queue = message.into_iter().filter(|b| !b.is_empty()).collect();
        Self {
            body: crate::full(Bytes::new()),
            send: Send::Length(0),
            queue,
            ended: true,
            kept: Some(Vec::new()),
            announced: Vec::new(),
        }
    }

    /// Whether no byte has left yet.
    pub(super) fn unsent(&self) -> bool {
        self.kept.is_some()
    }

    /// Writes what it can. Ready once the whole request is written and flushed.
    pub(super) fn poll_send(
        &mut self,
        io: &mut Io,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), WireError>> {
        loop {
            while let Some(front) = self.queue.front_mut() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, front)).map_err(WireError::Io)?;
                if n == 0 {
                    return Poll::Ready(Err(WireError::Io(std::io::ErrorKind::WriteZero.into())));
                }
                front.advance(n);
                if front.is_empty() {
                    self.queue.pop_front();
                }
            }
            if self.ended {
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(WireError::Io)?;
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => self.encode(frame)?,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(WireError::Upload(e))),
                Poll::Ready(None) => self.end(None)?,
                Poll::Pending => {
                    // Nothing more ready from the client: what is queued goes now.
                    ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(WireError::Io)?;
                    return Poll::Pending;
                }
            }
        }
    }

    /// A byte has left: the request can no longer be given back.
    pub(super) fn sent(&mut self) {
        self.kept = None;
    }

    /// The body as it was, if no byte of the request has left.
    pub(super) fn take_back(self) -> Option<Body> {
        let kept = self.kept?;
        let rest = if self.ended { None } else { Some(self.body) };
        Some(http_body_util::BodyExt::boxed(Resumed {
            kept: kept.into(),
            rest,
        }))
    }

    fn encode(&mut self, frame: Frame<Bytes>) -> Result<(), WireError> {
        let frame = match frame.into_data() {
            Ok(data) => {
                if let Some(kept) = &mut self.kept {
                    kept.push(Kept::Data(data.clone()));
                }
                return self.data(data);
            }
            Err(frame) => frame,
        };
        if let Ok(trailers) = frame.into_trailers() {
            if let Some(kept) = &mut self.kept {
                kept.push(Kept::Trailers(trailers.clone()));
            }
            self.end(Some(&trailers))?;
        }
        Ok(())
    }

    fn data(&mut self, data: Bytes) -> Result<(), WireError> {
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.send {
            Send::Length(owed) => {
                let len = data.len() as u64;
                if len > *owed {
                    return Err(WireError::BodyLength);
                }
                *owed -= len;
                self.queue.push_back(data);
                if *owed == 0 {
                    self.ended = true;
                }
            }
            Send::Chunked => {
                self.queue
                    .push_back(Bytes::from(format!("{:X}\r\n", data.len())));
                self.queue.push_back(data);
                self.queue.push_back(Bytes::from_static(b"\r\n"));
            }
        }
        Ok(())
    }

    /// The body's end (with its trailers): the last chunk, or a check that the length
    /// declared was sent. A length-framed message cannot carry trailers: they are dropped.
    fn end(&mut self, trailers: Option<&HeaderMap>) -> Result<(), WireError> {
        self.ended = true;
        match self.send {
            Send::Length(0) => Ok(()),
            Send::Length(_) => Err(WireError::BodyLength),
            Send::Chunked => {
                let mut last = b"0\r\n".to_vec();
                if let Some(trailers) = trailers {
                    encode_fields(&self.sendable(trailers), &mut last);
                }
                last.extend_from_slice(b"\r\n");
                self.queue.push_back(Bytes::from(last));
                Ok(())
            }
        }
    }
}

impl Upload {
    /// The trailer fields that may go (as hyper's client sends them): those the request's
    /// `Trailer` announced, none that frames, routes or authorises a message, and never the
    /// gateway's own `Idempotency-Fence` or `Idempotency-Scope`, which a client must not
    /// forge.
    fn sendable(&self, trailers: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        for (name, value) in trailers {
            let forbidden = matches!(
                *name,
                header::AUTHORIZATION
                    | header::CACHE_CONTROL
                    | header::CONTENT_ENCODING
                    | header::CONTENT_LENGTH
                    | header::CONTENT_RANGE
                    | header::CONTENT_TYPE
                    | header::HOST
                    | header::MAX_FORWARDS
                    | header::SET_COOKIE
                    | header::TRAILER
                    | header::TRANSFER_ENCODING
                    | header::TE
            ) || *name == crate::headers::IDEMPOTENCY_FENCE
                || *name == crate::headers::IDEMPOTENCY_SCOPE;
            if !forbidden && self.announced.contains(name) {
                out.append(name, value.clone());
            }
        }
        out
    }
}

/// A body given back: what was taken from it, then the rest.
struct Resumed {
    kept: VecDeque<Kept>,
    rest: Option<Body>,
}

impl HttpBody for Resumed {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.kept.pop_front() {
            Some(Kept::Data(d)) => Poll::Ready(Some(Ok(Frame::data(d)))),
            Some(Kept::Trailers(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            None => match &mut self.rest {
                Some(rest) => Pin::new(rest).poll_frame(cx),
                None => Poll::Ready(None),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.kept.is_empty() && self.rest.as_ref().is_none_or(HttpBody::is_end_stream)
    }
}
