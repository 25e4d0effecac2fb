//! The floor a tokio proxy can reach on a machine, for the benchmarks (docs/benchmarks.md,
//! run 14): an HTTP/1 proxy that parses each head with httparse and forwards it as the
//! bytes it came in (no header maps, no routing, no logs, no deadlines, no dedupe), one
//! upstream connection per client connection, each message written in one call. It only
//! proxies what a benchmark sends (`Content-Length` bodies, keep-alive) and is not part of
//! the gateway: what the gateway spends above it is what its HTTP/1 handling, routing,
//! access log and limits cost.
//!
//! `cargo run --release --example floor_proxy -- 127.0.0.1:9720 127.0.0.1:9700`

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Headers a head may carry.
const MAX_HEADERS: usize = 64;

#[tokio::main]
async fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:9720".into());
    let upstream: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9700".into())
        .parse()
        .map_err(io::Error::other)?;
    let listener = TcpListener::bind(&listen).await?;
    eprintln!("floor proxy: http://{listen} -> http://{upstream}");
    loop {
        let (client, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Err(e) = serve(client, upstream).await {
                eprintln!("floor proxy: {e}");
            }
        });
    }
}

/// Relays requests and responses one at a time until either side closes.
async fn serve(mut client: TcpStream, upstream: SocketAddr) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut origin = TcpStream::connect(upstream).await?;
    origin.set_nodelay(true)?;
    let mut requests = Buffer::default();
    let mut responses = Buffer::default();
    loop {
        let Some(n) = requests.message(&mut client, Side::Request).await? else {
            return Ok(());
        };
        origin.write_all(&requests.bytes[..n]).await?;
        requests.consume(n);
        let Some(n) = responses.message(&mut origin, Side::Response).await? else {
            return Ok(());
        };
        client.write_all(&responses.bytes[..n]).await?;
        responses.consume(n);
    }
}

#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

/// Bytes read from one socket, `filled` of them so far.
struct Buffer {
    bytes: Vec<u8>,
    filled: usize,
}

impl Default for Buffer {
    fn default() -> Self {
        Self {
            bytes: vec![0; 8192],
            filled: 0,
        }
    }
}

impl Buffer {
    /// Reads until one whole message (head and `Content-Length` body) is buffered; its
    /// length, or `None` when the peer closed first.
    async fn message(&mut self, from: &mut TcpStream, side: Side) -> io::Result<Option<usize>> {
        loop {
            if let Some(len) = message_len(&self.bytes[..self.filled], side)? {
                if self.bytes.len() < len {
                    self.bytes.resize(len, 0);
                }
                while self.filled < len {
                    if !self.fill(from).await? {
                        return Ok(None);
                    }
                }
                return Ok(Some(len));
            }
            if self.filled == self.bytes.len() {
                self.bytes.resize(self.bytes.len() * 2, 0);
            }
            if !self.fill(from).await? {
                return Ok(None);
            }
        }
    }

    /// One read; false at the end of the stream.
    async fn fill(&mut self, from: &mut TcpStream) -> io::Result<bool> {
        let n = from.read(&mut self.bytes[self.filled..]).await?;
        self.filled += n;
        Ok(n > 0)
    }

    /// Drops the first `n` bytes (a message relayed), keeping what followed it.
    fn consume(&mut self, n: usize) {
        self.bytes.copy_within(n..self.filled, 0);
        self.filled -= n;
    }
}

/// The length of the message at the start of `buf` (head and body), once its head is whole.
fn message_len(buf: &[u8], side: Side) -> io::Result<Option<usize>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let parsed = match side {
        Side::Request => httparse::Request::new(&mut headers).parse(buf),
        Side::Response => httparse::Response::new(&mut headers).parse(buf),
    };
    match parsed.map_err(io::Error::other)? {
        httparse::Status::Complete(head) => Ok(Some(head + content_length(&headers)?)),
        httparse::Status::Partial => Ok(None),
    }
}

fn content_length(headers: &[httparse::Header<'_>]) -> io::Result<usize> {
    let Some(h) = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
    else {
        return Ok(0);
    };
    std::str::from_utf8(h.value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("a bad Content-Length"))
}
