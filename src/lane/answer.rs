//! Writing an answer to the client as an HTTP/1.1 server does: the upstream's head as the
//! relay wrote it, ended here, then its body (chunked when the upstream's had no length);
//! or a response the pipeline handed back (a keyed request's answer, a problem the
//! gateway made), framed from the response itself.

use std::io::Write as _;
use std::pin::Pin;
use std::task::Poll;
use std::time::SystemTime;

use bytes::Bytes;
use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Body as HttpBody;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::upstream::{Framing, RawHead, UpstreamBody, Written};
use crate::Body;

/// The most bytes of a body gathered behind the head for one write.
const GATHER_MAX: usize = 64 * 1024;

/// Why an answer did not reach the client whole: the connection cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// Writing to the client failed (or stalled past `server.write_timeout`).
    #[error("writing to the client failed")]
    Write(#[from] std::io::Error),
    /// The upstream's body broke off.
    #[error("the upstream body broke off")]
    Body(#[source] crate::BoxError),
    /// The client closed its connection while its answer was awaited.
    #[error("the client closed the connection")]
    ClientGone,
}

/// How the client's answer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The connection takes the next request.
    KeepAlive,
    /// It closes after this answer.
    Close,
}

/// Ends the head the relay wrote into `out` and writes it with the body: the head and what
/// the body already holds in one write, the rest as it comes. The framing is written from
/// the body's, as hyper writes it: its length; chunked when the upstream's had none
/// (trailers are not sent: the client did not ask for them); none on a `204` or `304`; on
/// an answer to `HEAD`, the length the upstream declared. An HTTP/1.0 answer without a
/// length ends with the connection. `close` adds `Connection: close`. How the connection
/// goes on comes back. Every write is flushed (a TLS stream holds what it is given until
/// then), and while the body is awaited the client is watched ([`watching`]): bytes it
/// sends go to `read`, its end ends the answer.
pub async fn relayed<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut C,
    read: &mut Inbox,
    mut out: Vec<u8>,
    head: &RawHead,
    body: UpstreamBody,
    (close, to_head): (bool, bool),
) -> Result<Ending, AnswerError> {
    if !head.dated {
        date(&mut out);
    }
    let bodiless = matches!(head.status.as_u16(), 204 | 304);
    let (length, mut chunked, close) = match head.framing {
        _ if bodiless => (None, false, close),
        _ if to_head => (head.declared, false, close),
        Framing::Length(n) => (Some(n), false, close),
        // HTTP/1.0 knows no chunks: a body without a length ends with the connection.
        _ if head.http10 => (None, false, true),
        _ => (None, true, close),
    };
    if let Some(n) = length {
        content_length(&mut out, n);
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if to_head || bodiless {
        // No body, whatever the upstream sent (the relay read none).
        chunked = false;
    }
    let ending = if close {
        Ending::Close
    } else {
        Ending::KeepAlive
    };
    send_body(client, read, out, body, chunked).await?;
    Ok(ending)
}

/// Sends `out` (an ended head) and then `body`: what the body already holds in the same
/// write, the rest as it comes, each frame in the client's framing (`chunked`: then the
/// last chunk too), the client watched meanwhile ([`watching`]). How many of the body's
/// bytes were sent comes back.
async fn send_body<C, B>(
    client: &mut C,
    read: &mut Inbox,
    mut out: Vec<u8>,
    mut body: B,
    chunked: bool,
) -> Result<u64, AnswerError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: HttpBody<Data = Bytes, Error = crate::BoxError> + Unpin,
{
    let mut sent = 0u64;
    let mut ended = false;
    // What the body holds already goes with the head.
    while out.len() < GATHER_MAX {
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        match polled {
            Poll::Pending => break,
            Poll::Ready(None) => {
                ended = true;
                break;
            }
            Poll::Ready(Some(Err(e))) => {
                send(client, &out).await?;
                return Err(AnswerError::Body(e));
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    sent += data.len() as u64;
                    put(&mut out, &data, chunked);
                }
            }
        }
    }
    if ended {
        if chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        send(client, &out).await?;
        return Ok(sent);
    }
    send(client, &out).await?;
    loop {
        let Some(frame) = watching(client, read, body.frame()).await? else {
            break;
        };
        let frame = frame.map_err(AnswerError::Body)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        sent += data.len() as u64;
        if chunked {
            out.clear();
            put(&mut out, &data, true);
            send(client, &out).await?;
        } else {
            send(client, &data).await?;
        }
    }
    if chunked {
        send(client, b"0\r\n\r\n").await?;
    }
    Ok(sent)
}

/// Writes a response the gateway handled (a problem it made, a keyed request's replay, or
/// the upstream's answer as the protocol passes it on, perhaps still streaming) as hyper's
/// HTTP/1.1 server writes it: the status line (`HTTP/1.0` for an HTTP/1.0 upstream's
/// answer), the fields but the framing and `Connection`, then the framing: the body's
/// exact size, else the response's `Content-Length` (the body cut there), else chunked
/// (an HTTP/1.0 answer's body ends with the connection instead); none on a `1xx`, `204` or
/// `304`; to a `HEAD` request the length without the body (none for an empty body without
/// a `Content-Length`). `close`, or a response that says `Connection: close`, ends the
/// connection after it. A body that ends short of its length breaks the answer off
/// ([`AnswerError::Body`]): the client sees a cut, never a misframed next answer.
pub async fn served<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut C,
    read: &mut Inbox,
    response: Response<Body>,
    (close, to_head): (bool, bool),
) -> Result<Ending, AnswerError> {
    let (mut parts, body) = response.into_parts();
    let written = parts.extensions.remove::<Written>();
    let http10 = parts.version == http::Version::HTTP_10;
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let exact = body.size_hint().exact();
    let length = match exact {
        Some(0) if to_head => declared,
        Some(n) => Some(n),
        None => declared,
    };
    let bodiless = parts.status.is_informational() || matches!(parts.status.as_u16(), 204 | 304);
    let mut close = close || asks_close(&parts.headers);
    let mut out = Vec::with_capacity(512);
    status_and_fields(&mut out, &parts, written.as_ref());
    let chunked = match length {
        _ if bodiless => false,
        Some(n) => {
            content_length(&mut out, n);
            false
        }
        None if to_head => false,
        // HTTP/1.0 knows no chunks: the body ends with the connection.
        None if http10 => {
            close = true;
            false
        }
        None => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            true
        }
    };
    let dated = written.as_ref().is_some_and(|w| w.dated) || parts.headers.contains_key(DATE);
    end_head(&mut out, dated, close);
    let ending = if close {
        Ending::Close
    } else {
        Ending::KeepAlive
    };
    if to_head || bodiless {
        send(client, &out).await?;
        return Ok(ending);
    }
    let limit = if chunked { None } else { length };
    let sent = send_body(client, read, out, Cut { body, left: limit }, chunked).await?;
    match length {
        Some(n) if n != sent => Err(AnswerError::Body(
            format!("the body ended after {sent} of its {n} bytes").into(),
        )),
        _ => Ok(ending),
    }
}

/// A body cut at `left` bytes (when set): what runs past a declared length is not sent.
struct Cut<B> {
    body: B,
    left: Option<u64>,
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Cut<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, B::Error>>> {
        if self.left == Some(0) {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        let Some(left) = self.left else {
            return polled;
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => {
                    if data.len() as u64 > left {
                        data.truncate(left as usize);
                    }
                    self.left = Some(left - data.len() as u64);
                    Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
                }
                // Trailers: HTTP/1.1 sends none to a client that did not ask.
                Err(_) => Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::new())))),
            },
            other => other,
        }
    }
}

/// The status line, the fields already `written`, and every field of the map but the
/// framing and `Connection`, which the writer sets (hyper writes a status without a reason
/// of its own as `<none>`).
fn status_and_fields(out: &mut Vec<u8>, parts: &http::response::Parts, written: Option<&Written>) {
    let version: &[u8] = if parts.version == http::Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    };
    out.extend_from_slice(version);
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    let reason = parts.status.canonical_reason().unwrap_or("<none>");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(written) = written {
        out.extend_from_slice(&written.fields);
    }
    for (name, value) in &parts.headers {
        if *name == CONTENT_LENGTH || *name == TRANSFER_ENCODING || *name == CONNECTION {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Whether a response says `Connection: close`.
fn asks_close(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

/// A `Date` unless the response has one (`dated`), `Connection: close` when it closes, the
/// blank line.
fn end_head(out: &mut Vec<u8>, dated: bool, close: bool) {
    if !dated {
        date(out);
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The most bytes kept of what a client sends while its answer is awaited (a pipelined
/// request, read ahead): past this, the client is not read until the answer is written.
pub const READ_AHEAD: usize = 64 * 1024;

/// What a client sent that is not yet handled, and whether it has ended its side.
#[derive(Debug, Default)]
pub struct Inbox {
    /// The bytes read and not yet taken as a request.
    pub bytes: BytesMut,
    /// The client ended its side (EOF) with a pipelined request still unanswered: it is
    /// answered, then the connection ends.
    pub closed: bool,
}

/// Awaits `work` while watching the client, as hyper does: what the client sends (the
/// next request of a pipeline) is kept in `read`, up to [`READ_AHEAD`]; the client's end
/// (or a failed read) drops `work` and is [`AnswerError::ClientGone`], unless a whole
/// request head it sent is still waiting in `read`: then it half-closed after pipelining,
/// and its requests are answered before the connection ends ([`Inbox::closed`]).
pub async fn watching<C: AsyncRead + Unpin, F: std::future::Future>(
    client: &mut C,
    read: &mut Inbox,
    work: F,
) -> Result<F::Output, AnswerError> {
    tokio::pin!(work);
    loop {
        let room = !read.closed && read.bytes.len() < READ_AHEAD;
        tokio::select! {
            biased;
            done = &mut work => return Ok(done),
            got = client.read_buf(&mut read.bytes), if room => match got {
                Ok(n) if n > 0 => {}
                Ok(_) if holds_a_head(&read.bytes) => read.closed = true,
                _ => return Err(AnswerError::ClientGone),
            },
        }
    }
}

/// Whether `bytes` hold a whole request head: a request the client is owed an answer to
/// (a stray line end or half a head is not one).
fn holds_a_head(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"\r\n\r\n")
}

/// Writes `bytes` and flushes them.
async fn send<W: AsyncWrite + Unpin>(client: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    client.write_all(bytes).await?;
    client.flush().await
}

/// A data frame as the client's framing carries it.
fn put(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        let _ = write!(out, "{:X}\r\n", data.len());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(data);
    }
}

/// `content-length: <n>` (through `itoa`: `write!` took a formatter's path, 350
/// instructions a request).
fn content_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `date: <IMF-fixdate>`, as hyper adds to a response that has none.
fn date(out: &mut Vec<u8>) {
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(httpdate::fmt_http_date(SystemTime::now()).as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests;
