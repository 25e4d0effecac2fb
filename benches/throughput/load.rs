//! The load generator: keep-alive HTTP/1.1 connections, each a task with one request in
//! flight, until a request count or a deadline is reached. Requests are written from a
//! prepared buffer and responses read with `httparse`, so the generator costs about what
//! `wrk` does and the servers under test get the cores.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const BODY: &str = r#"{"amount":100}"#;

/// How each request of a pass is keyed.
#[derive(Clone)]
pub enum Keys {
    /// No `Idempotency-Key` header.
    None,
    /// `{prefix}-{i}`: a fresh key per request.
    Unique(String),
    /// The same key on every request.
    Same(String),
}

/// One measured pass.
pub struct Pass {
    pub elapsed: Duration,
    /// Per-request latencies, sorted.
    pub latencies: Vec<Duration>,
    /// Responses marked `Idempotent-Replayed: true`.
    pub replayed: usize,
}

impl Pass {
    pub fn requests(&self) -> usize {
        self.latencies.len()
    }

    pub fn rate(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64()
    }

    /// Nearest-rank percentile, `p` in (0, 100].
    pub fn percentile(&self, p: f64) -> Duration {
        let n = self.latencies.len();
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        self.latencies[rank.clamp(1, n) - 1]
    }
}

/// Open connections to one server.
pub struct Load {
    addr: SocketAddr,
    conns: Vec<TcpStream>,
}

impl Load {
    /// Opens `n` connections, a few at a time so no listen backlog overflows.
    pub async fn connect(addr: SocketAddr, n: usize) -> Self {
        let mut conns = Vec::with_capacity(n);
        while conns.len() < n {
            let batch = (n - conns.len()).min(64);
            let opened = futures_join(batch, addr).await;
            conns.extend(opened);
        }
        Self { addr, conns }
    }

    /// Sends up to `requests` POSTs to `path`, stopping early at `limit`; every connection
    /// finishes the request it has in flight, so the count of answers is exact.
    pub async fn run(&mut self, path: &str, keys: &Keys, requests: usize, limit: Duration) -> Pass {
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let deadline = start + limit;
        let per_conn = requests / self.conns.len().max(1) + 1;
        let tasks: Vec<_> = std::mem::take(&mut self.conns)
            .into_iter()
            .map(|stream| {
                let (next, keys, path, addr) =
                    (next.clone(), keys.clone(), path.to_owned(), self.addr);
                tokio::spawn(async move {
                    let mut conn = Conn {
                        stream,
                        addr,
                        buf: BytesMut::with_capacity(4096),
                    };
                    let mut latencies = Vec::with_capacity(per_conn);
                    let mut replayed = 0;
                    let mut req = Vec::with_capacity(256);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= requests || Instant::now() >= deadline {
                            break;
                        }
                        write_request(&mut req, &addr, &path, &keys, i);
                        let sent = Instant::now();
                        let answer = conn.exchange(&req).await;
                        latencies.push(sent.elapsed());
                        assert!(
                            (200..300).contains(&answer.status),
                            "POST {path} on {addr} answered {}",
                            answer.status
                        );
                        replayed += usize::from(answer.replayed);
                        if answer.close {
                            conn.reconnect().await;
                        }
                    }
                    (conn.stream, latencies, replayed)
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(requests);
        let mut replayed = 0;
        for task in tasks {
            let (stream, l, r) = task.await.expect("a connection failed");
            self.conns.push(stream);
            latencies.extend(l);
            replayed += r;
        }
        let elapsed = start.elapsed();
        latencies.sort_unstable();
        Pass {
            elapsed,
            latencies,
            replayed,
        }
    }
}

impl Load {
    /// Sends `rate` POSTs a second to `path` for `limit`, open-loop: request `i` is due at
    /// `i / rate` seconds from the start, whenever the previous ones are answered. A
    /// connection takes the next request due; its latency counts from when it was due if a
    /// busy server kept every connection from sending it on time (queueing is the server's
    /// cost), else from when it was sent (a timer waking late is not).
    pub async fn run_paced(&mut self, path: &str, keys: &Keys, rate: f64, limit: Duration) -> Pass {
        let requests = (rate * limit.as_secs_f64()).ceil() as usize;
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = std::mem::take(&mut self.conns)
            .into_iter()
            .map(|stream| {
                let (next, keys, path, addr) =
                    (next.clone(), keys.clone(), path.to_owned(), self.addr);
                tokio::spawn(async move {
                    let mut conn = Conn {
                        stream,
                        addr,
                        buf: BytesMut::with_capacity(4096),
                    };
                    let (mut latencies, mut replayed) = (Vec::new(), 0);
                    let mut req = Vec::with_capacity(256);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= requests {
                            break;
                        }
                        let due = start + Duration::from_secs_f64(i as f64 / rate);
                        write_request(&mut req, &addr, &path, &keys, i);
                        let from = if Instant::now() < due {
                            tokio::time::sleep_until(due.into()).await;
                            Instant::now()
                        } else {
                            due
                        };
                        let answer = conn.exchange(&req).await;
                        latencies.push(from.elapsed());
                        assert!(
                            (200..300).contains(&answer.status),
                            "{path}: {}",
                            answer.status
                        );
                        replayed += usize::from(answer.replayed);
                        if answer.close {
                            conn.reconnect().await;
                        }
                    }
                    (conn.stream, latencies, replayed)
                })
            })
            .collect();
        let (mut latencies, mut replayed) = (Vec::with_capacity(requests), 0);
        for task in tasks {
            let (stream, l, r) = task.await.expect("a connection failed");
            self.conns.push(stream);
            latencies.extend(l);
            replayed += r;
        }
        let elapsed = start.elapsed();
        latencies.sort_unstable();
        Pass {
            elapsed,
            latencies,
            replayed,
        }
    }
}

async fn open(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_nodelay(true).unwrap();
    stream
}

async fn futures_join(n: usize, addr: SocketAddr) -> Vec<TcpStream> {
    let tasks: Vec<_> = (0..n).map(|_| tokio::spawn(open(addr))).collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn write_request(req: &mut Vec<u8>, addr: &SocketAddr, path: &str, keys: &Keys, i: usize) {
    use std::io::Write;
    req.clear();
    write!(
        req,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        BODY.len()
    )
    .unwrap();
    match keys {
        Keys::None => {}
        Keys::Unique(prefix) => write!(req, "Idempotency-Key: {prefix}-{i}\r\n").unwrap(),
        Keys::Same(key) => write!(req, "Idempotency-Key: {key}\r\n").unwrap(),
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(BODY.as_bytes());
}

/// What the generator reads from a response.
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    close: bool,
}

struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    buf: BytesMut,
}

impl Conn {
    async fn reconnect(&mut self) {
        self.stream = open(self.addr).await;
        self.buf.clear();
    }

    async fn fill(&mut self) {
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .unwrap_or_else(|e| panic!("read from {}: {e}", self.addr));
        assert!(n > 0, "{} closed the connection mid-response", self.addr);
    }

    /// Writes one request and reads its whole response.
    async fn exchange(&mut self, req: &[u8]) -> Answer {
        self.stream
            .write_all(req)
            .await
            .unwrap_or_else(|e| panic!("write to {}: {e}", self.addr));
        let (head, answer, body) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf).expect("a malformed response head") {
                httparse::Status::Partial => self.fill().await,
                httparse::Status::Complete(head) => {
                    let mut answer = Answer {
                        status: resp.code.unwrap_or(0),
                        replayed: false,
                        close: false,
                    };
                    let mut body = Body::Empty;
                    for h in resp.headers.iter() {
                        let v = h.value;
                        if h.name.eq_ignore_ascii_case("content-length") {
                            let n = std::str::from_utf8(v).unwrap().trim().parse().unwrap();
                            body = Body::Length(n);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            body = Body::Chunked;
                        } else if h.name.eq_ignore_ascii_case("idempotent-replayed") {
                            answer.replayed = v == b"true";
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            answer.close = v.eq_ignore_ascii_case(b"close");
                        }
                    }
                    break (head, answer, body);
                }
            }
        };
        self.buf.advance(head);
        match body {
            Body::Empty => {}
            Body::Length(n) => {
                while self.buf.len() < n {
                    self.fill().await;
                }
                self.buf.advance(n);
            }
            Body::Chunked => loop {
                let (skip, size) = loop {
                    match httparse::parse_chunk_size(&self.buf).expect("a malformed chunk size") {
                        httparse::Status::Partial => self.fill().await,
                        httparse::Status::Complete((skip, size)) => break (skip, size as usize),
                    }
                };
                // The chunk and its CRLF; the last chunk has no trailers here.
                while self.buf.len() < skip + size + 2 {
                    self.fill().await;
                }
                self.buf.advance(skip + size + 2);
                if size == 0 {
                    break;
                }
            },
        }
        answer
    }
}

enum Body {
    Empty,
    Length(usize),
    Chunked,
}
