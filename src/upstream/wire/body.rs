//! A response body read off its connection as its framing says, zero-copy from the read
//! buffer; at its end the connection is handed back for the next request, if it can take
//! one.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use super::head::{Framing, MAX_HEAD, MAX_HEADERS};
use super::upload::Upload;
use super::{Conn, WireError};

/// The longest chunk-size line taken (extensions included).
const MAX_CHUNK_LINE: usize = 4096;
/// How long the rest of an upload answered early may make no progress.
const UPLOAD_STALL: std::time::Duration = std::time::Duration::from_secs(60);
/// How long the rest of an upload answered early may take in all.
const UPLOAD_REST: std::time::Duration = std::time::Duration::from_secs(300);

/// Where the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decode {
    /// This many bytes still to come.
    Length(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Inside a chunk, this many bytes still to come.
    ChunkData(u64),
    /// After a chunk's data: its CRLF.
    ChunkEnd,
    /// After the last chunk: the trailer section.
    Trailers,
    /// Until the upstream closes.
    UntilClose,
    /// At the end.
    Done,
}

/// One step of decoding what is buffered.
enum Step {
    Frame(Frame<Bytes>),
    /// Nothing to give until more is read.
    More,
    /// The state moved on; step again.
    Again,
}

/// An upstream response body on an HTTP/1.1 connection of the pool.
pub struct WireBody {
    /// The connection: `None` once closed or taken back.
    conn: Option<Conn>,
    decode: Decode,
    /// The rest of a request the upstream answered before it was all sent, sent alongside
    /// (boxed: seldom there).
    upload: Option<Box<Upload>>,
    keep_alive: bool,
    /// The body has ended and `conn` can take the next request.
    idle: bool,
    /// Where the frames come from instead, when a task of its own reads them
    /// ([`duplex`](super::duplex)).
    relay: Option<super::duplex::Frames>,
}

impl WireBody {
    pub(super) fn new(
        conn: Conn,
        framing: Framing,
        keep_alive: bool,
        upload: Option<Upload>,
    ) -> Self {
        let decode = match framing {
            Framing::Length(n) => Decode::Length(n),
            Framing::Chunked => Decode::ChunkSize,
            Framing::UntilClose => Decode::UntilClose,
        };
        let mut body = Self {
            conn: Some(conn),
            decode,
            upload: upload.map(Box::new),
            keep_alive,
            idle: false,
            relay: None,
        };
        if decode == Decode::Length(0) {
            body.finish();
        }
        if body.upload.is_some() {
            // The rest of the upload must not wait for whoever reads the answer.
            return Self::relayed(super::duplex::spawn(body));
        }
        body
    }

    /// A body whose frames a task of its own reads.
    fn relayed(frames: super::duplex::Frames) -> Self {
        Self {
            conn: None,
            decode: Decode::UntilClose,
            upload: None,
            keep_alive: false,
            idle: false,
            relay: Some(frames),
        }
    }

    /// Sends more of an upload the upstream answered early, if there is one; its end or
    /// its failure (the upstream may have stopped reading: its answer still counts) ends
    /// it. Registers for a wake-up while more is to go.
    pub(super) fn poll_upload(&mut self, cx: &mut Context<'_>) {
        let (Some(upload), Some(conn)) = (self.upload.as_mut(), self.conn.as_mut()) else {
            return;
        };
        match upload.poll_send(&mut conn.io, cx) {
            Poll::Ready(Ok(())) => self.upload = None,
            Poll::Ready(Err(_)) => {
                self.upload = None;
                self.keep_alive = false;
            }
            Poll::Pending => {}
        }
    }

    /// The connection, once the body has ended on a connection that can take another
    /// request; taken once.
    pub fn take_idle(&mut self) -> Option<Conn> {
        if !self.idle {
            return None;
        }
        self.idle = false;
        self.conn.take()
    }

    /// At the end: the connection is kept only if its exchange is over (the whole request
    /// sent, nothing read past the response) and the response did not close it.
    fn finish(&mut self) {
        self.decode = Decode::Done;
        if let Some(upload) = self.upload.take() {
            // A request the upstream answered before it was all sent: the upload goes
            // out whole, whether or not anyone reads the answer, and the connection is
            // closed after it.
            if let Some(conn) = self.conn.take() {
                tokio::spawn(finish_upload(conn, upload));
            }
            return;
        }
        let reusable = self.keep_alive && self.conn.as_ref().is_some_and(|c| c.read.is_empty());
        if reusable {
            self.idle = true;
        } else {
            self.conn = None;
        }
    }

    /// Decodes one step from the read buffer.
    fn step(&mut self, read: &mut BytesMut) -> Result<Step, WireError> {
        match self.decode {
            Decode::Length(n) | Decode::ChunkData(n) => {
                if read.is_empty() {
                    return Ok(Step::More);
                }
                let take = n.min(read.len() as u64);
                let data = read.split_to(take as usize).freeze();
                let left = n - take;
                self.decode = match (self.decode, left) {
                    (Decode::Length(_), 0) => Decode::Done,
                    (Decode::Length(_), left) => Decode::Length(left),
                    (_, 0) => Decode::ChunkEnd,
                    (_, left) => Decode::ChunkData(left),
                };
                Ok(Step::Frame(Frame::data(data)))
            }
            Decode::UntilClose => {
                if read.is_empty() {
                    return Ok(Step::More);
                }
                Ok(Step::Frame(Frame::data(read.split().freeze())))
            }
            Decode::ChunkSize => {
                let end = read.windows(2).position(|w| w == b"\r\n");
                if end.unwrap_or(read.len()) > MAX_CHUNK_LINE {
                    return Err(WireError::Malformed("a chunk-size line too long".into()));
                }
                let Some(end) = end else {
                    return Ok(Step::More);
                };
                let size = chunk_size(&read[..end])?;
                let _ = read.split_to(end + 2);
                self.decode = if size == 0 {
                    Decode::Trailers
                } else {
                    Decode::ChunkData(size)
                };
                Ok(Step::Again)
            }
            Decode::ChunkEnd => {
                if read.len() < 2 {
                    return Ok(Step::More);
                }
                if &read[..2] != b"\r\n" {
                    return Err(WireError::Malformed("no CRLF after a chunk".into()));
                }
                let _ = read.split_to(2);
                self.decode = Decode::ChunkSize;
                Ok(Step::Again)
            }
            Decode::Trailers => {
                if read.starts_with(b"\r\n") {
                    let _ = read.split_to(2);
                    self.decode = Decode::Done;
                    return Ok(Step::Again);
                }
                let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(read, &mut fields) {
                    Ok(httparse::Status::Complete((len, fields))) => {
                        let trailers = trailer_map(fields)?;
                        let _ = read.split_to(len);
                        self.decode = Decode::Done;
                        Ok(Step::Frame(Frame::trailers(trailers)))
                    }
                    Ok(httparse::Status::Partial) if read.len() > MAX_HEAD => {
                        Err(WireError::HeadTooLarge)
                    }
                    Ok(httparse::Status::Partial) => Ok(Step::More),
                    Err(e) => Err(WireError::Malformed(format!("trailers: {e}"))),
                }
            }
            Decode::Done => Ok(Step::Again),
        }
    }
}

impl HttpBody for WireBody {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        let this = &mut *self;
        if let Some(frames) = this.relay.as_mut() {
            return frames.poll_recv(cx);
        }
        loop {
            if this.decode == Decode::Done {
                if !this.idle {
                    this.finish();
                }
                return Poll::Ready(None);
            }
            if this.conn.is_none() {
                return Poll::Ready(None);
            }
            this.poll_upload(cx);
            let conn = this.conn.as_mut().expect("still here");
            let mut read = std::mem::take(&mut conn.read);
            let step = this.step(&mut read);
            let conn = this.conn.as_mut().expect("still here");
            conn.read = read;
            match step {
                Err(e) => return this.fail(e),
                Ok(Step::Frame(frame)) => {
                    if this.decode == Decode::Done {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(Step::Again) => continue,
                Ok(Step::More) => match conn.poll_fill(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(0)) if this.decode == Decode::UntilClose => {
                        this.decode = Decode::Done;
                    }
                    Poll::Ready(Ok(0)) => return this.fail(WireError::Truncated),
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => return this.fail(WireError::Io(e)),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.relay.is_none() && self.decode == Decode::Done
    }

    fn size_hint(&self) -> SizeHint {
        if self.relay.is_some() {
            return SizeHint::default();
        }
        match self.decode {
            Decode::Length(n) => SizeHint::with_exact(n),
            Decode::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl WireBody {
    /// The body broke: the connection is closed, the error given once.
    fn fail(&mut self, e: WireError) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        self.conn = None;
        self.upload = None;
        self.decode = Decode::Done;
        Poll::Ready(Some(Err(e)))
    }
}

impl std::fmt::Debug for WireBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireBody")
            .field("decode", &self.decode)
            .finish()
    }
}

/// Sends the rest of an upload the upstream answered early, then closes the connection.
/// Given up once nothing has moved for [`UPLOAD_STALL`] (an upstream or a client that no
/// longer sends), or after [`UPLOAD_REST`] in all (a trickle).
async fn finish_upload(mut conn: Conn, mut upload: Box<Upload>) {
    let rest = async {
        loop {
            let before = conn.io.written();
            let step = std::future::poll_fn(|cx| match upload.poll_send(&mut conn.io, cx) {
                Poll::Ready(_) => Poll::Ready(true),
                Poll::Pending if conn.io.written() != before => Poll::Ready(false),
                Poll::Pending => Poll::Pending,
            });
            match tokio::time::timeout(UPLOAD_STALL, step).await {
                Ok(false) => continue,
                Ok(true) | Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(UPLOAD_REST, rest).await;
}

/// A chunk-size line's size: hex digits, then nothing but blanks or `;` extensions (no
/// control characters in them but HTAB), as strictly as hyper reads it.
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let bad = || WireError::Malformed("a chunk size".into());
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(bad());
    }
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count()..];
    let control = |b: &u8| (*b < 0x20 && *b != b'\t') || *b == 0x7f;
    if !rest.is_empty() && (rest[0] != b';' || rest.iter().any(control)) {
        return Err(bad());
    }
    Ok(line[..digits].iter().fold(0u64, |size, b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        (size << 4) | u64::from(digit)
    }))
}

fn trailer_map(fields: &[httparse::Header<'_>]) -> Result<HeaderMap, WireError> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = http::HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| WireError::Malformed("a trailer name".into()))?;
        let value = http::HeaderValue::from_bytes(field.value)
            .map_err(|_| WireError::Malformed("a trailer value".into()))?;
        map.append(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in pieces of `step` bytes; the frames' data and the trailers.
    fn decode(
        framing: Decode,
        wire: &[u8],
        piece: usize,
    ) -> Result<(Vec<u8>, Option<HeaderMap>, usize), WireError> {
        let mut body = WireBody {
            conn: None,
            decode: framing,
            upload: None,
            keep_alive: true,
            idle: false,
            relay: None,
        };
        let mut read = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), None);
        let mut fed = 0;
        while body.decode != Decode::Done {
            match body.step(&mut read)? {
                Step::Frame(f) => match f.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(f) => trailers = f.into_trailers().ok(),
                },
                Step::Again => {}
                Step::More if fed == wire.len() => return Err(WireError::Truncated),
                Step::More => {
                    let end = (fed + piece).min(wire.len());
                    read.extend_from_slice(&wire[fed..end]);
                    fed = end;
                }
            }
        }
        Ok((data, trailers, read.len() + wire.len() - fed))
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_reads() {
        let wire = b"5;ext=1\r\nhello\r\nA\r\n, world!!!\r\n0\r\nx-sum: 9\r\n\r\nNEXT";
        for piece in [1, 2, 3, 7, 100] {
            let (data, trailers, left) = decode(Decode::ChunkSize, wire, piece).unwrap();
            assert_eq!(data, b"hello, world!!!");
            assert_eq!(trailers.unwrap()["x-sum"], "9");
            assert_eq!(left, 4, "what follows the body is not taken");
        }
        let (data, trailers, _) = decode(Decode::ChunkSize, b"3\r\nabc\r\n0\r\n\r\n", 4).unwrap();
        assert_eq!((data.as_slice(), trailers), (&b"abc"[..], None));
    }

    #[test]
    fn broken_chunked_bodies_are_errors() {
        for wire in [
            &b"zz\r\nabc\r\n0\r\n\r\n"[..],
            b"3\r\nabcX\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"3\r\nab",
            b"+3\r\nabc\r\n0\r\n\r\n",
            b" 3\r\nabc\r\n0\r\n\r\n",
            b"0x3\r\nabc\r\n0\r\n\r\n",
            b"3;a\nb\r\nabc\r\n0\r\n\r\n",
            b"3 x\r\nabc\r\n0\r\n\r\n",
        ] {
            assert!(decode(Decode::ChunkSize, wire, 64).is_err(), "{wire:?}");
        }
        let endless = vec![b'1'; MAX_CHUNK_LINE + 10];
        assert!(decode(Decode::ChunkSize, &endless, 64).is_err());
        let mut long = b"3;".to_vec();
        long.extend(vec![b'x'; MAX_CHUNK_LINE]);
        long.extend_from_slice(b"\r\nabc\r\n0\r\n\r\n");
        assert!(
            decode(Decode::ChunkSize, &long, long.len()).is_err(),
            "a long line read at once"
        );
        let (data, _, _) =
            decode(Decode::ChunkSize, b"3 \t;x=\"y\"\r\nabc\r\n0\r\n\r\n", 64).unwrap();
        assert_eq!(data, b"abc");
    }

    #[test]
    fn a_length_body_takes_its_length_and_no_more() {
        let (data, _, left) = decode(Decode::Length(5), b"helloHTTP", 2).unwrap();
        assert_eq!((data.as_slice(), left), (&b"hello"[..], 4));
        assert!(matches!(
            decode(Decode::Length(5), b"hel", 2),
            Err(WireError::Truncated)
        ));
    }
}
