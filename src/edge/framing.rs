//! Request smuggling guard: spots an HTTP/1 request head that carries both
//! `Content-Length` and `Transfer-Encoding`.
//!
//! hyper resolves such a request the RFC 9112 §6.3 way (chunked wins, `Content-Length` is
//! dropped, the connection closes afterwards), so by the time the request reaches the
//! gateway the evidence is gone. This wrapper watches the bytes hyper reads, finds each
//! request head with `httparse`, and raises a per-connection flag when a head has both;
//! the gateway then refuses that request with 400. It follows heads across keep-alive
//! requests framed by `Content-Length`; after a chunked request it stops watching, as
//! following chunk framing would mean a second HTTP parser. Since hyper closes the
//! connection after a request with both headers, the flag can only be about the last
//! request on a connection.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Set when a request head on this connection had both framing headers.
#[derive(Clone, Default, Debug)]
pub struct AmbiguousFraming(Arc<AtomicBool>);

impl AmbiguousFraming {
    /// Whether an ambiguous head was seen.
    pub fn seen(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

enum State {
    Head(Vec<u8>),
    Skip(u64),
    Done,
}

/// Watches one connection's request heads. Pure over the bytes fed to it.
pub struct HeadScanner {
    state: State,
    max_head: usize,
    flag: AmbiguousFraming,
}

impl HeadScanner {
    /// A scanner that gives up on a head longer than `max_head` (hyper refuses those).
    pub fn new(max_head: usize, flag: AmbiguousFraming) -> Self {
        Self {
            state: State::Head(Vec::new()),
            max_head,
            flag,
        }
    }

    /// Feeds bytes as hyper reads them. Iterative, and each byte is copied at most once
    /// into the pending head: a read full of pipelined heads costs linear time and
    /// constant stack.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match &mut self.state {
                State::Done => return,
                State::Skip(n) => {
                    let k = (*n).min(data.len() as u64) as usize;
                    data = &data[k..];
                    *n -= k as u64;
                    if *n == 0 {
                        self.state = State::Head(Vec::new());
                    }
                }
                State::Head(pending) => {
                    // Parse from the pending partial head, or straight from `data`.
                    let from_pending = !pending.is_empty();
                    if from_pending {
                        let old = pending.len();
                        pending.extend_from_slice(data);
                        // Re-parse only once the head can have ended: a head trickled in
                        // byte by byte then costs linear time, not quadratic.
                        let fresh = &pending[old.saturating_sub(3)..];
                        let ended = fresh.windows(2).any(|w| w == b"\n\n")
                            || fresh.windows(3).any(|w| w == b"\n\r\n");
                        if !ended {
                            if pending.len() > self.max_head {
                                self.state = State::Done;
                            }
                            return;
                        }
                    }
                    let buf: &[u8] = if from_pending { pending } else { data };
                    let (consumed, next) = match scan_head(buf) {
                        Scan::Head { len, framing } => (len, framing),
                        Scan::Partial if buf.len() > self.max_head => (buf.len(), Next::Stop),
                        Scan::Partial => {
                            if !from_pending {
                                *pending = data.to_vec();
                            }
                            return;
                        }
                        Scan::Invalid => (buf.len(), Next::Stop),
                    };
                    // What is left of `data` after this head.
                    data = if from_pending {
                        let before = pending.len() - data.len();
                        &data[consumed.saturating_sub(before).min(data.len())..]
                    } else {
                        &data[consumed..]
                    };
                    self.state = match next {
                        Next::Ambiguous => {
                            self.flag.0.store(true, Ordering::Relaxed);
                            State::Done
                        }
                        Next::Stop => State::Done,
                        Next::Head => State::Head(Vec::new()),
                        Next::Skip(n) => State::Skip(n),
                    };
                }
            }
        }
    }
}

enum Next {
    /// Both framing headers: raise the flag.
    Ambiguous,
    /// Chunked, unparsable, or too long: stop watching (hyper decides).
    Stop,
    /// No body: the next head follows.
    Head,
    /// A `Content-Length` body to skip.
    Skip(u64),
}

enum Scan {
    Head { len: usize, framing: Next },
    Partial,
    Invalid,
}

/// Parses one request head at the start of `buf`. hyper allows at most 100 headers.
fn scan_head(buf: &[u8]) -> Scan {
    // Left uninitialised, as hyper does: zeroing a hundred fields cost as much as the parse.
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; 100];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Scan::Partial,
        Err(_) => return Scan::Invalid,
    };
    let cl = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"));
    let te = req
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
    let length = cl
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let framing = match (cl.is_some(), te, length) {
        (true, true, _) => Next::Ambiguous,
        // Chunked: following chunk framing would be a second parser.
        (false, true, _) => Next::Stop,
        (false, false, _) | (true, false, Some(0)) => Next::Head,
        (true, false, Some(n)) => Next::Skip(n),
        // An unparsable length: hyper refuses the request.
        (true, false, None) => Next::Stop,
    };
    Scan::Head { len, framing }
}

/// A connection whose reads pass through a [`HeadScanner`].
pub struct Watched<S> {
    inner: S,
    scanner: HeadScanner,
}

impl<S> Watched<S> {
    /// Wraps a connection.
    pub fn new(inner: S, max_head: usize, flag: AmbiguousFraming) -> Self {
        Self {
            inner,
            scanner: HeadScanner::new(max_head, flag),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            this.scanner.feed(&buf.filled()[before..]);
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> bool {
        let flag = AmbiguousFraming::default();
        let mut s = HeadScanner::new(65536, flag.clone());
        for c in chunks {
            s.feed(c);
        }
        flag.seen()
    }

    #[test]
    fn spots_both_headers_in_either_order_and_split_reads() {
        assert!(scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(scan(&[
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n",
            b"content-length: 5\r\n\r\n"
        ]));
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        ]));
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ]));
    }

    #[test]
    fn follows_keep_alive_requests_framed_by_content_length() {
        let first = b"POST / HTTP/1.1\r\nContent-Length: 37\r\n\r\n";
        // The body looks like a smuggled head but is only a body.
        let body = b"X\r\nContent-Length: 1\r\nTransfer-Enc: 1";
        assert_eq!(body.len(), 37);
        let second = b"GET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(!scan(&[first, body]));
        assert!(scan(&[first, body, second]));
        let mut all = Vec::new();
        all.extend_from_slice(first);
        all.extend_from_slice(body);
        all.extend_from_slice(second);
        assert!(scan(&[&all]));
    }

    #[test]
    fn a_read_full_of_pipelined_heads_is_cheap() {
        let head = b"GET / HTTP/1.1\r\n\r\n";
        let mut all = Vec::new();
        while all.len() < 1024 * 1024 {
            all.extend_from_slice(head);
        }
        all.extend_from_slice(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        // On a small stack: recursion per head would overflow it.
        let seen = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || scan(&[&all]))
            .unwrap()
            .join()
            .unwrap();
        assert!(seen);
    }

    #[test]
    fn heads_split_across_reads_at_every_offset() {
        let text: &[u8] = b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nbodyGET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        for cut in 1..text.len() {
            assert!(scan(&[&text[..cut], &text[cut..]]), "cut at {cut}");
        }
        let clean: &[u8] =
            b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nbodyGET / HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 1..clean.len() {
            assert!(!scan(&[&clean[..cut], &clean[cut..]]), "cut at {cut}");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let seeds: [&[u8]; 3] = [
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ];
        for round in 0..3000 {
            let mut bytes = seeds[round % seeds.len()].to_vec();
            for _ in 0..(x % 16) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % (bytes.len() + 1);
                bytes.insert(at, (x >> 24) as u8);
            }
            let cut = (x as usize) % (bytes.len() + 1);
            let _ = scan(&[&bytes[..cut], &bytes[cut..]]);
        }
    }

    #[test]
    fn a_head_trickled_byte_by_byte_is_still_read() {
        let head: &[u8] = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let bytes: Vec<&[u8]> = head.chunks(1).collect();
        assert!(scan(&bytes));
        let clean: &[u8] = b"GET / HTTP/1.1\nHost: x\n\nGET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(scan(&clean.chunks(1).collect::<Vec<_>>()));
    }
}
