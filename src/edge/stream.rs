//! The winner's answer, streamed to its client as it arrives while a copy is kept for the
//! store: server-sent events and long chunked answers reach the client event by event,
//! and the record is stored once the body ends.
//!
//! A body that is already whole when its head arrives (the common small answer) takes no
//! detour: it is read at once and answered from memory, as a replay would be.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{mpsc, oneshot};

use super::capture::Gathered;
use super::detach::ClientSide;
use super::join::Opened;
use crate::protocol::record::StoredBody;
use crate::upstream::UpstreamBody;
use crate::{Body, BoxError};

/// Frames a streamed answer buffers between the upstream and a slow client.
const CHANNEL_FRAMES: usize = 8;

/// What the winner's body holds without waiting.
pub(super) enum Ready {
    /// All of it: the body ended, with its trailer section (empty when none).
    Whole(Bytes, HeaderMap),
    /// It broke off.
    Broken(String),
    /// Not all of it yet.
    More(Partial),
}

/// A body not whole yet: what was read (over the limit already when `over`), and the rest.
pub(super) struct Partial {
    pub(super) read: Gathered,
    pub(super) over: bool,
    pub(super) rest: UpstreamBody,
}

/// What the pump kept of a streamed answer for the store.
pub(super) struct Pumped {
    /// The body as the store keeps it.
    pub(super) body: StoredBody,
    /// Its trailer section (empty when none, or when the body broke off).
    pub(super) trailers: HeaderMap,
    /// Why the body broke off or stalled.
    pub(super) broke: Option<String>,
    /// The stream's end, sent once the record is stored.
    pub(super) tail: Tail,
}

/// Reads the frames the body already holds, without waiting for more.
pub(super) async fn read_ready(mut body: UpstreamBody, limit: u64) -> Ready {
    let mut read = Gathered::default();
    let mut trailers = HeaderMap::new();
    loop {
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        match polled {
            Poll::Pending => {
                return Ready::More(Partial {
                    read,
                    over: false,
                    rest: body,
                })
            }
            Poll::Ready(None) => return Ready::Whole(read.into_bytes(), trailers),
            Poll::Ready(Some(Err(e))) => return Ready::Broken(e.to_string()),
            Poll::Ready(Some(Ok(frame))) => {
                let data = match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            trailers.extend(t);
                        }
                        continue;
                    }
                };
                if read.push(data) as u64 > limit {
                    return Ready::More(Partial {
                        read,
                        over: true,
                        rest: body,
                    });
                }
            }
        }
    }
}

/// The end of a streamed answer, held back until its record is stored: a client that has
/// read the whole answer and retries at once must find the record (the same order as an
/// answer from memory, which goes out after its record is stored). On a body of known
/// length its last frame is held back too, since the client counts bytes instead of
/// waiting for the end; so is a trailer section, which ends a gRPC call. Dropped
/// unfinished, it still sends what it holds.
pub(super) struct Tail {
    tx: Frames,
    held: Vec<Frame<Bytes>>,
    /// The body arrived whole: the client's stream ends cleanly once the held frames are
    /// sent (else it ends in an error).
    whole: bool,
    /// The offer to joiners, closed with the stream (whole, or broken off).
    offer: Option<(Opened, bool)>,
}

impl Tail {
    /// Sends what was held back and ends the client's stream, and the joiners' (as the
    /// tail is dropped). A frame leaves `held` only once it is sent: cancelled while it
    /// waits for room, the rest stays for the drop, which ends the stream whole only if
    /// it can send all of it.
    pub(super) async fn finish(mut self) {
        while !self.held.is_empty() {
            if !self.tx.send_first(&mut self.held).await {
                // The client has gone: nothing more reaches it.
                self.held.clear();
                self.whole = false;
            }
        }
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let mut sent = true;
        for frame in std::mem::take(&mut self.held) {
            sent &= self.tx.try_send(Ok(frame));
        }
        // A frame the full channel refused is lost: then the stream did not end whole.
        if self.whole && sent {
            self.tx.end();
        }
        if let Some((offer, whole)) = self.offer.take() {
            offer.close(whole);
        }
    }
}

/// Sends what was read, then every frame of `rest` as it arrives, to the client's end of
/// `tx`, keeping a copy of at most `limit` bytes; waits at most `idle` for each frame.
/// What the store keeps: the whole body, none past the limit, or none when the body broke
/// off or stalled (the client's stream then ends in an error), and the trailer section. A
/// client that leaves does not stop the copy: the record is still stored. The stream's end
/// (the trailers, and when `length` is known, the frame that completes it) comes back as
/// the [`Tail`].
pub(super) async fn pump(
    partial: Partial,
    limit: u64,
    idle: Duration,
    length: Option<u64>,
    tx: Frames,
    offer: Option<Opened>,
) -> Pumped {
    let Partial {
        read,
        over,
        mut rest,
    } = partial;
    let prefix = read.into_bytes();
    let mut kept = (!over).then(|| {
        let mut g = Gathered::default();
        g.push(prefix.clone());
        g
    });
    let mut out = Outgoing::default();
    let mut next = (!prefix.is_empty()).then(|| Frame::data(prefix));
    let tail = |tx, held, offer: Option<Opened>, whole| Tail {
        tx,
        held,
        whole,
        offer: offer.map(|o| (o, whole)),
    };
    let broken = |why: String, tail: Tail| Pumped {
        body: StoredBody::Incomplete,
        trailers: HeaderMap::new(),
        broke: Some(why),
        tail,
    };
    loop {
        if let Some(frame) = next.take() {
            out.pass(frame, length, offer.as_ref(), &tx).await;
        }
        let frame = match tokio::time::timeout(idle, rest.frame()).await {
            Err(_) => {
                let why = "the upstream body stalled for server.upstream_timeout";
                let _ = tx.send(Err(why.into())).await;
                return broken(why.to_owned(), tail(tx, Vec::new(), offer, false));
            }
            Ok(None) => {
                let body = match kept {
                    Some(g) => StoredBody::Stored(g.into_bytes()),
                    None => StoredBody::TooLarge,
                };
                let tail = tail(tx, out.held, offer, true);
                return Pumped {
                    body,
                    trailers: out.trailers,
                    broke: None,
                    tail,
                };
            }
            Ok(Some(Err(e))) => {
                let why = e.to_string();
                let _ = tx.send(Err(e.into())).await;
                return broken(why, tail(tx, Vec::new(), offer, false));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let (Some(data), Some(g)) = (frame.data_ref(), kept.as_mut()) {
            if g.push(data.clone()) as u64 > limit {
                kept = None;
            }
        }
        next = Some(frame);
    }
}

/// What the pump has passed on, and the stream's end it holds back.
#[derive(Default)]
struct Outgoing {
    /// Data bytes passed on.
    sent: u64,
    /// The trailers, and the frame that completes a known length: sent by the [`Tail`].
    held: Vec<Frame<Bytes>>,
    trailers: HeaderMap,
}

impl Outgoing {
    /// Offers `frame` to the joined duplicates, then sends it to the client, or holds it
    /// when it ends the stream (its trailers, or the last data of a body of `length`).
    async fn pass(
        &mut self,
        frame: Frame<Bytes>,
        length: Option<u64>,
        offer: Option<&Opened>,
        tx: &Frames,
    ) {
        if let (Some(data), Some(offer)) = (frame.data_ref(), offer) {
            offer.push(data);
        }
        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
        self.sent += n;
        if let Some(t) = frame.trailers_ref() {
            self.trailers.extend(t.clone());
            self.held.push(frame);
        } else if n > 0 && length == Some(self.sent) {
            self.held.push(frame);
        } else {
            // A client that left: keep reading for the record.
            let _ = tx.send(Ok(frame)).await;
        }
    }
}

/// A streamed answer's body: the frames the pump sends.
pub(super) struct Streamed {
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    /// Set by [`Frames::end`]: the sender is gone because the body is whole.
    whole: Arc<AtomicBool>,
    /// An error was passed on (the stream is over for the client already).
    failed: bool,
}

/// The sending end of a streamed body. Dropped without [`Frames::end`] (its task ended or
/// was dropped mid-body), the client's body ends in an error, never as if whole: a chunked
/// answer cut short must not look complete.
pub(super) struct Frames {
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    whole: Arc<AtomicBool>,
}

impl Frames {
    /// Sends a frame (or the error the stream ends in); `Err` once the client has gone.
    pub(super) async fn send(&self, frame: Result<Frame<Bytes>, BoxError>) -> Result<(), ()> {
        self.tx.send(frame).await.map_err(|_| ())
    }

    /// Sends the first of `held` once there is room, taking it out of `held` only then
    /// (cancel-safe); `false` once the client has gone.
    async fn send_first(&self, held: &mut Vec<Frame<Bytes>>) -> bool {
        match self.tx.reserve().await {
            Ok(permit) => {
                permit.send(Ok(held.remove(0)));
                true
            }
            Err(_) => false,
        }
    }

    /// Sends a frame if there is room now; whether it went.
    fn try_send(&self, frame: Result<Frame<Bytes>, BoxError>) -> bool {
        self.tx.try_send(frame).is_ok()
    }

    /// Marks the body whole: once this end is dropped, the client's body ends cleanly.
    pub(super) fn end(&self) {
        self.whole.store(true, Ordering::SeqCst);
    }
}

/// Marks a response whose head went to the client before its body was read.
#[derive(Debug, Clone, Copy)]
pub(super) struct StreamedMark;

/// A channel for a streamed answer: the pump's end and the client's body.
pub(super) fn channel() -> (Frames, Streamed) {
    let (tx, rx) = mpsc::channel(CHANNEL_FRAMES);
    let whole = Arc::new(AtomicBool::new(false));
    let body = Streamed {
        rx,
        whole: whole.clone(),
        failed: false,
    };
    (Frames { tx, whole }, body)
}

impl HttpBody for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Err(e))) => {
                this.failed = true;
                Poll::Ready(Some(Err(e)))
            }
            // Every sender is gone: whole only if the last one said so.
            Poll::Ready(None) if !this.failed && !this.whole.load(Ordering::SeqCst) => {
                this.failed = true;
                Poll::Ready(Some(Err("the answer ended before its body did".into())))
            }
            polled => polled,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The hand-off of a keyed request's response to its client: early, by the forwarder,
/// when the answer streams; otherwise by the request's task at its end. Whichever comes
/// first delivers; the other finds it done.
#[derive(Clone)]
pub(super) struct Delivery(Arc<Mutex<Option<oneshot::Sender<Response<Body>>>>>);

impl Delivery {
    /// A delivery and the client's end of it.
    pub(super) fn new() -> (Self, oneshot::Receiver<Response<Body>>) {
        let (tx, rx) = oneshot::channel();
        (Self(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// Hands `response` to the client, unless one was handed already.
    pub(super) fn deliver(&self, response: Response<Body>) {
        let sender = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = sender {
            let _ = tx.send(response);
        }
    }
}

/// A streamed body that keeps its request counted as attached while the client reads it.
pub(super) struct Tethered {
    pub(super) body: Body,
    pub(super) _client: ClientSide,
}

impl HttpBody for Tethered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(bytes: &'static [u8]) -> Result<Frame<Bytes>, BoxError> {
        Ok(Frame::data(Bytes::from_static(bytes)))
    }

    /// The sender dropped mid-body (its task panicked or was dropped): the client's body
    /// ends in an error, so a chunked answer cut short does not look complete.
    #[tokio::test]
    async fn a_body_whose_sender_is_dropped_unended_ends_in_an_error() {
        let (tx, mut body) = channel();
        tx.send(data(b"half")).await.unwrap();
        drop(tx);
        assert!(body.frame().await.unwrap().is_ok());
        assert!(matches!(body.frame().await, Some(Err(_))));
        assert!(body.frame().await.is_none(), "one error, then the end");
    }

    #[tokio::test]
    async fn a_body_marked_whole_ends_cleanly() {
        let (tx, mut body) = channel();
        tx.send(data(b"all")).await.unwrap();
        tx.end();
        drop(tx);
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.is_none());
    }

    /// An error the pump sent is the body's only error.
    #[tokio::test]
    async fn a_body_that_broke_off_ends_in_its_own_error() {
        let (tx, mut body) = channel();
        tx.send(Err("stalled".into())).await.unwrap();
        drop(tx);
        let e = body.frame().await.unwrap().unwrap_err();
        assert_eq!(e.to_string(), "stalled");
        assert!(body.frame().await.is_none());
    }

    /// A tail cancelled while it waits for room (a slow client, its task dropped): the
    /// frame it could not send is not passed off as the end of a whole body.
    #[tokio::test]
    async fn a_tail_cancelled_before_it_sent_its_last_frame_does_not_end_whole() {
        let (tx, mut body) = channel();
        for _ in 0..CHANNEL_FRAMES {
            tx.send(data(b"x")).await.unwrap();
        }
        let tail = Tail {
            tx,
            held: vec![Frame::data(Bytes::from_static(b"last"))],
            whole: true,
            offer: None,
        };
        let waited = tokio::time::timeout(Duration::from_millis(50), tail.finish()).await;
        assert!(waited.is_err(), "the channel is full");
        for _ in 0..CHANNEL_FRAMES {
            assert!(body.frame().await.unwrap().is_ok());
        }
        assert!(
            matches!(body.frame().await, Some(Err(_))),
            "cut off, not whole"
        );
    }

    /// A tail that sends its held frames ends the body whole.
    #[tokio::test]
    async fn a_finished_tail_ends_the_body_whole() {
        let (tx, mut body) = channel();
        let tail = Tail {
            tx,
            held: vec![Frame::data(Bytes::from_static(b"last"))],
            whole: true,
            offer: None,
        };
        tail.finish().await;
        let last = body.frame().await.unwrap().unwrap();
        assert_eq!(last.into_data().unwrap(), "last");
        assert!(body.frame().await.is_none());
    }
}
