//! The task that owns an [`super::OwnConnection`]'s socket: it writes the queued
//! commands out together and hands each reply to the command waiting for it, in order.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use redis::{RedisError, RedisResult, Value};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::resp::{parse, pass, Parsed};

/// Commands already encoded, and what to do with their replies.
pub(super) struct Request {
    pub(super) bytes: Vec<u8>,
    /// Replies passed over first (a transaction's `OK` and `QUEUED`s).
    pub(super) skip: usize,
    /// Replies returned after those.
    pub(super) take: usize,
    pub(super) reply: oneshot::Sender<RedisResult<Vec<Value>>>,
}

/// A request written out, waiting for its replies.
struct Waiting {
    skip: usize,
    take: usize,
    values: Vec<Value>,
    /// The first error queued inside a transaction: the transaction's answer.
    failed: Option<RedisError>,
    reply: oneshot::Sender<RedisResult<Vec<Value>>>,
}

/// The most read into the buffer at a time.
const READ_CHUNK: usize = 16 * 1024;
/// The most bytes taken from the queue and not yet written: a server that stops reading
/// holds back the requests still queued, which are dropped unsent if their deadline passes
/// first (rather than written, and run, long after their clients were answered).
const OUT_MAX: usize = 64 * 1024;
/// The largest buffers kept between bursts.
const KEEP_MAX: usize = 64 * 1024;

/// Drives the connection; ends when it fails or every handle is gone and nothing waits.
pub(crate) struct Drive {
    stream: TcpStream,
    requests: mpsc::UnboundedReceiver<Request>,
    /// No handle is left to send more.
    closed: bool,
    out: Vec<u8>,
    /// Of `out`, written so far.
    sent: usize,
    /// The write of what `out` holds gave way once already.
    yielded: bool,
    waiting: VecDeque<Waiting>,
    input: BytesMut,
    /// The input must reach this length before a reply can be read.
    need: usize,
}

impl Drive {
    pub(super) fn new(stream: TcpStream, requests: mpsc::UnboundedReceiver<Request>) -> Self {
        Self {
            stream,
            requests,
            closed: false,
            out: Vec::new(),
            sent: 0,
            yielded: false,
            waiting: VecDeque::new(),
            input: BytesMut::new(),
            need: 0,
        }
    }

    /// Takes the queued requests while what is unsent stays under [`OUT_MAX`]; true if
    /// any came. The rest wait in the queue: one given up on there (its deadline passed)
    /// is never sent.
    fn take_requests(&mut self, cx: &mut Context<'_>) -> bool {
        let mut any = false;
        while !self.closed && self.out.len() - self.sent < OUT_MAX {
            match self.requests.poll_recv(cx) {
                Poll::Ready(Some(r)) => {
                    any = true;
                    if r.reply.is_closed() {
                        continue; // given up on before it was written: never sent
                    }
                    self.out.extend_from_slice(&r.bytes);
                    self.waiting.push_back(Waiting {
                        skip: r.skip,
                        take: r.take,
                        values: Vec::with_capacity(r.take),
                        failed: None,
                        reply: r.reply,
                    });
                }
                Poll::Ready(None) => self.closed = true,
                Poll::Pending => break,
            }
        }
        any
    }

    /// Writes out what is queued: once new commands came, the write gives way once so
    /// that those of the other requests running now join them.
    fn write(&mut self, cx: &mut Context<'_>, fresh: bool) -> io::Result<()> {
        if self.sent == self.out.len() {
            return Ok(());
        }
        if fresh && !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Ok(());
        }
        while self.sent < self.out.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.out[self.sent..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(()),
            }
        }
        self.out.clear();
        self.sent = 0;
        self.yielded = false;
        if self.out.capacity() > KEEP_MAX {
            self.out = Vec::new();
        }
        Ok(())
    }

    /// Reads what has arrived and hands out every whole reply. `Ok(false)`: Redis closed
    /// the connection.
    fn read(&mut self, cx: &mut Context<'_>) -> Result<bool, RedisError> {
        loop {
            if self.input.capacity() - self.input.len() < READ_CHUNK {
                self.input
                    .reserve(READ_CHUNK.max(self.need.saturating_sub(self.input.len())));
            }
            let filled = match tokio_util::io::poll_read_buf(
                Pin::new(&mut self.stream),
                cx,
                &mut self.input,
            ) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Err(e.into()),
                Poll::Pending => return Ok(true),
            };
            if filled == 0 {
                return Ok(false);
            }
            self.replies()?;
        }
    }

    /// Hands out the whole replies in the input.
    fn replies(&mut self) -> Result<(), RedisError> {
        while self.input.len() >= self.need && !self.input.is_empty() {
            let passing = self.waiting.front().is_some_and(|w| w.skip > 0);
            let read = if passing { pass } else { parse };
            match read(&self.input).map_err(out_of_step)? {
                Parsed::Incomplete(need) => {
                    self.need = need;
                    break;
                }
                Parsed::Reply(value, used) => {
                    self.input.advance(used);
                    self.need = 0;
                    self.deliver(value)?;
                }
            }
        }
        if self.input.is_empty() && self.input.capacity() > KEEP_MAX {
            self.input = BytesMut::new();
        }
        Ok(())
    }

    fn deliver(&mut self, value: Value) -> Result<(), RedisError> {
        let Some(front) = self.waiting.front_mut() else {
            return Err(out_of_step(
                "a reply to no command (a push is not expected here)",
            ));
        };
        if front.skip > 0 {
            front.skip -= 1;
            if let Value::ServerError(e) = value {
                front.failed.get_or_insert(e.into());
            }
            return Ok(());
        }
        front.values.push(value);
        if front.values.len() == front.take {
            let done = self.waiting.pop_front().expect("the front is there");
            let result = match done.failed {
                Some(e) => Err(e),
                None => Ok(done.values),
            };
            // The receiver may be gone (its deadline passed): the reply is dropped.
            let _ = done.reply.send(result);
        }
        Ok(())
    }

    /// Fails every command still waiting or queued: the connection is gone.
    fn fail_all(&mut self, why: &str) {
        let error = || -> RedisError {
            io::Error::new(io::ErrorKind::ConnectionReset, why.to_owned()).into()
        };
        for w in self.waiting.drain(..) {
            let _ = w.reply.send(Err(error()));
        }
        self.requests.close();
        while let Ok(r) = self.requests.try_recv() {
            let _ = r.reply.send(Err(error()));
        }
    }
}

fn out_of_step(e: impl std::fmt::Display) -> RedisError {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string()).into()
}

impl Future for Drive {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let fresh = this.take_requests(cx);
        if let Err(e) = this.write(cx, fresh) {
            // The replies the server sent before it closed (a refusal: `maxclients`) still
            // reach their commands.
            let _ = this.read(cx);
            this.fail_all(&format!("writing to Redis failed: {e}"));
            return Poll::Ready(());
        }
        match this.read(cx) {
            Ok(true) => {}
            Ok(false) => {
                this.fail_all("Redis closed the connection");
                return Poll::Ready(());
            }
            Err(e) => {
                this.fail_all(&format!("reading from Redis failed: {e}"));
                return Poll::Ready(());
            }
        }
        if this.closed && this.waiting.is_empty() && this.out.is_empty() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}
