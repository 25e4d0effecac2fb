//! Write coalescing (automatic pipelining): what the tasks runnable in the same turn of
//! the scheduler write leaves in fewer writes, and the peer wakes fewer times.
//!
//! A connection's writes are held until it flushes, and its first flush gives way once:
//! the task wakes itself and goes to the back of the run queue, and writes out when it
//! comes round again. With nothing else to run it is polled again at once, so an idle
//! gateway adds no delay; under load the wait is one pass over the tasks that were
//! already runnable.
//!
//! Used for Redis (`store::redis::link`): the redis crate's connection task wrote as soon
//! as it was woken, and tokio runs a task woken by the running one next (its LIFO slot),
//! so each command of a burst of requests went out in a write of its own and Redis woke
//! for each (a context switch, a `read`, a `write` of the reply: most of what Redis spent
//! per request under load). Now the burst's commands leave in one write.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most held back: a write that would take it past this goes out at once, after what
/// is held (so a connection holds at most this, whatever the size of its messages).
const HOLD_MAX: usize = 64 * 1024;
/// The largest buffer kept between bursts.
const KEEP_MAX: usize = 16 * 1024;

/// A stream whose writes are held until a flush, and whose flush gives way once.
pub(crate) struct Coalesce<S> {
    inner: S,
    buf: Vec<u8>,
    /// The flush already gave way once for what `buf` holds.
    yielded: bool,
}

impl<S> Coalesce<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            yielded: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes out what is held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut sent = 0;
        while sent < self.buf.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.buf[sent..]) {
                Poll::Ready(Ok(0)) => {
                    self.buf.drain(..sent);
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => sent += n,
                Poll::Ready(Err(e)) => {
                    self.buf.drain(..sent);
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {
                    self.buf.drain(..sent);
                    return Poll::Pending;
                }
            }
        }
        self.buf.clear();
        if self.buf.capacity() > KEEP_MAX {
            // A large burst's buffer is not kept for the connection's life.
            self.buf = Vec::new();
        }
        self.yielded = false;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.buf.len() + data.len() > HOLD_MAX {
            // Too much to hold: what is held goes first, then this, straight through.
            std::task::ready!(self.poll_drain(cx))?;
            return Pin::new(&mut self.inner).poll_write(cx, data);
        }
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.buf.is_empty() {
            return Pin::new(&mut self.inner).poll_flush(cx);
        }
        if !self.yielded {
            // Give way once: back of the run queue, behind the requests already runnable.
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        std::task::ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};
    use tokio::io::AsyncReadExt;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn writes_wait_for_a_flush_that_gives_way_once() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let mut c = Coalesce::new(near);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut write = |c: &mut Coalesce<_>, b: &[u8]| {
            assert!(
                matches!(Pin::new(c).poll_write(&mut cx, b), Poll::Ready(Ok(n)) if n == b.len())
            );
        };
        write(&mut c, b"*1\r\n$4\r\nPING\r\n");
        write(&mut c, b"*1\r\n$4\r\nTIME\r\n");
        let mut cx = Context::from_waker(&waker);
        // The first flush gives way, waking its task to come back.
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // What arrives meanwhile joins the same write.
        assert!(Pin::new(&mut c).poll_write(&mut cx, b"+x\r\n").is_ready());
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_ready());
        let mut got = vec![0; 32];
        let n = far.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nTIME\r\n+x\r\n");
        // An empty flush passes straight through; the next write gives way again.
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_ready());
        assert!(Pin::new(&mut c).poll_write(&mut cx, b"+y\r\n").is_ready());
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_pending());
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_ready());
        assert_eq!(far.read(&mut got).await.unwrap(), 4);
    }

    #[tokio::test]
    async fn a_write_too_large_to_hold_goes_out_at_once_after_what_is_held() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let mut c = Coalesce::new(near);
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut c).poll_write(&mut cx, b"head").is_ready());
        let big = vec![b'a'; HOLD_MAX];
        assert!(matches!(
            Pin::new(&mut c).poll_write(&mut cx, &big),
            Poll::Ready(Ok(n)) if n == HOLD_MAX
        ));
        assert!(c.buf.is_empty(), "nothing held");
        let mut got = vec![0; 4 + HOLD_MAX];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..], &big[..]);
        // Nothing held: the flush does not give way.
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_ready());
        // A large burst's buffer is let go once it is out.
        let burst = vec![b'b'; HOLD_MAX - 1];
        assert!(Pin::new(&mut c).poll_write(&mut cx, &burst).is_ready());
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_pending());
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_ready());
        assert_eq!(c.buf.capacity(), 0);
        let mut got = vec![0; HOLD_MAX - 1];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, burst);
    }
}
