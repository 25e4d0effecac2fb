//! Reading the winner's upstream body for the store, within a size limit and a deadline.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use crate::upstream::UpstreamBody;

/// What reading the body came to.
pub(super) enum Captured {
    /// The whole body.
    Whole(Bytes),
    /// Past the limit: what was read, and the rest still to stream.
    TooLarge(Bytes, UpstreamBody),
    /// The body broke off or the deadline passed.
    Broken(String),
}

/// Reads the upstream body until it ends, passes `limit`, breaks, or the deadline passes.
/// A body that arrives in one frame (the common case) is kept without a copy.
pub(super) async fn capture(
    mut body: UpstreamBody,
    limit: u64,
    deadline: tokio::time::Instant,
) -> Captured {
    let mut gathered = Gathered::default();
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Captured::Broken("timed out reading the body".to_owned()),
            Ok(None) => return Captured::Whole(gathered.into_bytes()),
            Ok(Some(Err(e))) => return Captured::Broken(e.to_string()),
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if gathered.push(data) as u64 > limit {
                    return Captured::TooLarge(gathered.into_bytes(), body);
                }
            }
        }
    }
}

/// A body read frame by frame. One that arrives in a single frame (the common case) is
/// kept as it came, without a copy; more frames are gathered into one buffer.
#[derive(Default)]
pub(super) struct Gathered {
    first: Option<Bytes>,
    buf: BytesMut,
}

impl Gathered {
    /// Adds a frame; returns the bytes held so far.
    pub fn push(&mut self, data: Bytes) -> usize {
        match self.first.take() {
            None if self.buf.is_empty() => {
                let held = data.len();
                self.first = Some(data);
                held
            }
            earlier => {
                if let Some(earlier) = earlier {
                    self.buf.extend_from_slice(&earlier);
                }
                self.buf.extend_from_slice(&data);
                self.buf.len()
            }
        }
    }

    /// Everything gathered, as one buffer.
    pub fn into_bytes(self) -> Bytes {
        self.first.unwrap_or_else(|| self.buf.freeze())
    }
}

/// A body that yields an already-read prefix, then the rest of the upstream's stream.
pub(super) struct Prefixed {
    pub prefix: Option<Bytes>,
    pub rest: UpstreamBody,
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let n = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + n);
        }
        hint.set_lower(rest.lower() + n);
        hint
    }
}
