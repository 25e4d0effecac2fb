//! The kept-alive connections to a plain-`http` upstream: reused when a response was read
//! out, never reused when it was not, and replaced when the upstream or the network
//! closed them. A TCP proxy between gateway and upstream counts the connections and cuts
//! them; the upstream counts the side effects.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{eventually, GatewayConfig, Http, RouteCfg, TestGateway, Upstream};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Env {
    up: Upstream,
    hop: FaultProxy,
    gw: TestGateway,
    http: Http,
}

async fn env() -> Env {
    let up = Upstream::start().await;
    let hop = FaultProxy::start(([127, 0, 0, 1], up.port()).into()).await;
    let gw = TestGateway::start(
        &GatewayConfig::new(format!("http://{}", hop.addr))
            .upstream_timeout("5s")
            .route(RouteCfg::header("payments", "/pay/*").required(true)),
    )
    .await;
    Env {
        up,
        hop,
        gw,
        http: Http::new(),
    }
}

#[tokio::test]
async fn one_connection_carries_every_request_in_turn_streamed_or_stored() {
    let e = env().await;
    for i in 0..20 {
        let r = e.http.post(&e.gw.url("/stream"), &[], "x").await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        let key = format!("k-{i}");
        let r = e
            .http
            .post(&e.gw.url("/pay/1"), &[("Idempotency-Key", &key)], "x")
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        // An empty body ends with its head: the connection goes back at once.
        let r = e
            .http
            .post(&e.gw.url("/stream"), &[("x-test-status", "204")], "")
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }
    assert_eq!(e.up.effects(), 60);
    assert_eq!(
        e.hop.accepted(),
        1,
        "every request reused the one connection"
    );
    let host = e.hop.addr.to_string();
    assert!(
        e.up.seen()
            .iter()
            .all(|s| s.host.as_deref() == Some(host.as_str())),
        "every request named the upstream's host and port"
    );
}

#[tokio::test]
async fn a_connection_the_upstream_closes_is_replaced_without_losing_a_request() {
    let e = env().await;
    for _ in 0..5 {
        let r = e
            .http
            .post(
                &e.gw.url("/stream"),
                &[("x-test-respond-header", "connection=close")],
                "x",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        assert!(r.headers.get("connection").is_none(), "hop-by-hop stripped");
    }
    assert_eq!(e.up.effects(), 5);
    assert_eq!(
        e.hop.accepted(),
        5,
        "a closed connection is never taken again"
    );
}

#[tokio::test]
async fn idle_connections_cut_by_the_network_are_replaced() {
    let e = env().await;
    let r = e.http.post(&e.gw.url("/stream"), &[], "x").await;
    assert_eq!(r.status, StatusCode::CREATED);
    // A load balancer's idle cut: the pooled connection is closed from the far side.
    e.hop.cut();
    // The connection's task sees the FIN at once; leave it ample time on a loaded machine.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        let key = format!("after-cut-{i}");
        let r = e
            .http
            .post(&e.gw.url("/pay/1"), &[("Idempotency-Key", &key)], "x")
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    }
    assert_eq!(e.up.effects(), 4, "each request reached the upstream once");
    assert_eq!(e.hop.accepted(), 2, "one new connection after the cut");
}

#[tokio::test]
async fn a_response_the_client_stopped_reading_never_lends_its_connection() {
    let e = env().await;
    // A client takes the head of a large streamed answer and goes away.
    let mut raw = tokio::net::TcpStream::connect(e.gw.addr).await.unwrap();
    raw.write_all(b"GET /big HTTP/1.1\r\nhost: gw\r\nx-test-body-bytes: 8000000\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 1024];
    let n = raw.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 201"), "{:?}", &head[..n]);
    drop(raw);
    assert!(eventually(Duration::from_secs(5), || async { e.up.effects() == 1 }).await);

    // The next requests get whole, correct answers: a half-read connection would hand
    // them the rest of the old body. (hyper itself closes a connection whose response
    // was dropped unread; this holds the pool to the same.)
    for i in 0..3 {
        let body = format!("next-{i}");
        let r = e
            .http
            .post(&e.gw.url("/echo"), &[("x-test-body-bytes", "5")], &body)
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        assert_eq!(r.body.len(), 5, "{}", r.text());
    }
    assert_eq!(e.up.effects(), 4);
    assert_eq!(
        e.hop.accepted(),
        2,
        "the abandoned connection was closed, its successor reused"
    );
}

/// A gateway with no routes in front of `upstream`: every request streams through. The
/// upstream timeout is long, so a request held up shows as a hang, not a 504.
async fn streaming_gateway(upstream: std::net::SocketAddr) -> TestGateway {
    TestGateway::start(&GatewayConfig::new(format!("http://{upstream}")).upstream_timeout("60s"))
        .await
}

/// An upstream that answers `/early` as soon as it has the head, then goes on reading the
/// request body (chunked or `Content-Length`) after a pause; anything else once its
/// `Content-Length` body is in. Keeps connections
/// alive and counts them.
async fn early_answering_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    counted_upstream(|mut s| async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Some((end, head, len)) = read_head(&mut s, &mut buf).await {
            if head.contains(" /early ") {
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly";
                if s.write_all(answer).await.is_err() {
                    return;
                }
                // Read the rest of the upload, after a pause, however long it
                // takes: chunked to its last chunk, or its `Content-Length`.
                tokio::time::sleep(Duration::from_millis(500)).await;
                buf.drain(..end + 4);
                let done = |buf: &[u8]| match len {
                    0 => buf.windows(5).any(|w| w == b"0\r\n\r\n"),
                    len => buf.len() >= len,
                };
                while !done(&buf) {
                    match s.read(&mut chunk).await {
                        Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                // What follows the upload is the connection's next request: hyper-util's
                // pool lends a connection again once its exchange is over, the upload
                // included.
                let upload_end = match len {
                    0 => buf
                        .windows(5)
                        .position(|w| w == b"0\r\n\r\n")
                        .map_or(0, |i| i + 5),
                    len => len,
                };
                buf.drain(..upload_end.min(buf.len()));
                continue;
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if !answer_request(&mut s, &mut buf, end + 4 + len, answer).await {
                return;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_connection_still_uploading_after_an_early_answer_keeps_no_one_waiting() {
    let (upstream, conns) = early_answering_upstream().await;
    let gw = streaming_gateway(upstream).await;
    let http = Http::new();
    let r = http.post(&gw.url("/warm"), &[], "x").await;
    assert_eq!(r.body, "ok");

    // A slow client's upload: the upstream answers after its first chunk; the rest has not
    // been sent, so the connection cannot take another request yet.
    let mut raw = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    raw.write_all(
        b"POST /early HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !got.ends_with(b"early") {
        let n = raw.read(&mut chunk).await.unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }

    // Other requests are not held behind that upload (the upstream timeout is 60s).
    for _ in 0..3 {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            http.post(&gw.url("/next"), &[], "x"),
        )
        .await
        .expect("a request waited on another's upload");
        assert_eq!(r.body, "ok");
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "the uploading connection was not lent"
    );

    // The upload ends; requests after it are answered as promptly.
    raw.write_all(b"0\r\n\r\n").await.unwrap();
    for _ in 0..3 {
        let (url_a, url_b) = (gw.url("/after"), gw.url("/after"));
        let (a, b) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(http.post(&url_a, &[], "x"), http.post(&url_b, &[], "x"))
        })
        .await
        .expect("a request after the upload waited");
        assert_eq!((a.body.as_ref(), b.body.as_ref()), (&b"ok"[..], &b"ok"[..]));
    }
}

#[tokio::test]
async fn a_large_stored_request_answered_early_keeps_no_one_waiting() {
    let (upstream, _conns) = early_answering_upstream().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(format!("http://{upstream}"))
            .upstream_timeout("60s")
            .max_body("16MiB")
            .route(RouteCfg::header("early", "/early").required(true))
            .route(RouteCfg::header("next", "/next").required(true)),
    )
    .await;
    let http = Http::new();
    // A keyed request's body is buffered and handed to the connection whole; megabytes
    // of it are still in flight when the upstream answers.
    let big = "x".repeat(8 << 20);
    let r = http
        .post(&gw.url("/early"), &[("Idempotency-Key", "big")], &big)
        .await;
    assert_eq!(r.body, "early");
    for i in 0..3 {
        let key = format!("next-{i}");
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            http.post(&gw.url("/next"), &[("Idempotency-Key", &key)], "x"),
        )
        .await
        .expect("a request waited on another's upload");
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.body, "ok");
    }
}

#[tokio::test]
async fn the_upstream_url_s_userinfo_is_neither_dialled_nor_sent() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&GatewayConfig::new(format!(
        "http://user:secret@127.0.0.1:{}",
        up.port()
    )))
    .await;
    let r = Http::new().post(&gw.url("/a"), &[], "x").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let host = format!("127.0.0.1:{}", up.port());
    assert_eq!(up.seen()[0].host.as_deref(), Some(host.as_str()));
}

/// An upstream that answers as soon as it has a request's head (`early`, then `extra`
/// more bytes) while it goes on reading the upload; counts the body bytes it received.
async fn answering_while_reading(extra: usize) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let g = g.clone();
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let mut buf = Vec::new();
                let mut chunk = vec![0u8; 65536];
                let end = loop {
                    if let Some(end) = buf.windows(4).position(|x| x == b"\r\n\r\n") {
                        break end;
                    }
                    match r.read(&mut chunk).await {
                        Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                };
                g.fetch_add(buf.len() - (end + 4), Ordering::SeqCst);
                let writer = tokio::spawn(async move {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\nearly",
                        5 + extra
                    );
                    let _ = w.write_all(head.as_bytes()).await;
                    let block = vec![b'r'; 65536];
                    let mut left = extra;
                    while left > 0 {
                        let n = left.min(block.len());
                        if w.write_all(&block[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    std::future::pending::<()>().await;
                });
                while let Ok(n @ 1..) = r.read(&mut chunk).await {
                    g.fetch_add(n, Ordering::SeqCst);
                }
                writer.abort();
            });
        }
    });
    (addr, got)
}

/// Sends `len` body bytes on `raw` before reading anything, as many HTTP clients do.
async fn upload(raw: &mut tokio::net::TcpStream, len: usize) {
    let head = format!("POST /up HTTP/1.1\r\nhost: gw\r\ncontent-length: {len}\r\n\r\n");
    raw.write_all(head.as_bytes()).await.unwrap();
    let block = vec![b'u'; 65536];
    let mut sent = 0;
    while sent < len {
        let n = (len - sent).min(block.len());
        tokio::time::timeout(Duration::from_secs(20), raw.write_all(&block[..n]))
            .await
            .unwrap_or_else(|_| panic!("the upload stalled after {sent} bytes"))
            .unwrap_or_else(|e| panic!("the upload was cut after {sent} bytes: {e}"));
        sent += n;
    }
}

#[tokio::test]
async fn an_upload_answered_early_reaches_the_upstream_whole_and_the_client_its_answer() {
    let (upstream, got) = answering_while_reading(0).await;
    let gw = streaming_gateway(upstream).await;
    const LEN: usize = 8 << 20;
    let mut raw = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    upload(&mut raw, LEN).await;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while !reply.ends_with(b"early") {
        let n = raw.read(&mut chunk).await.unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&chunk[..n]);
    }
    assert!(reply.starts_with(b"HTTP/1.1 200"));
    assert!(
        eventually(Duration::from_secs(10), || async {
            got.load(Ordering::SeqCst) == LEN
        })
        .await,
        "the upstream got {} of {LEN} bytes",
        got.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn an_upload_goes_on_while_its_client_does_not_yet_read_the_answer() {
    // Full duplex: the upstream streams 32 MiB back while it reads 32 MiB; the client
    // sends everything before it reads, and takes little of the answer into its socket
    // (so the gateway cannot write the answer ahead while it sends the upload).
    let (upstream, got) = answering_while_reading(32 << 20).await;
    let gw = streaming_gateway(upstream).await;
    const LEN: usize = 32 << 20;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut raw = socket.connect(gw.addr).await.unwrap();
    upload(&mut raw, LEN).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            got.load(Ordering::SeqCst) == LEN
        })
        .await
    );
}

/// An upstream that answers every request with a chunked body followed by trailers, and
/// counts its connections.
async fn trailing_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    counted_upstream(|mut s| async move {
        let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: 1234\r\n\r\n";
        let mut buf = Vec::new();
        while let Some((end, _, len)) = read_head(&mut s, &mut buf).await {
            if !answer_request(&mut s, &mut buf, end + 4 + len, answer).await {
                return;
            }
        }
    })
    .await
}

/// A body that ends with trailers hands its connection back like any other: streamed or
/// stored, clients asking for trailers or not.
#[tokio::test]
async fn a_body_that_ends_with_trailers_gives_its_connection_back() {
    let (upstream, conns) = trailing_upstream().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(format!("http://{upstream}"))
            .upstream_timeout("5s")
            .route(RouteCfg::header("payments", "/pay/*").required(true)),
    )
    .await;
    let http = Http::new();
    for i in 0..10 {
        let te: &[(&str, &str)] = if i % 2 == 0 {
            &[("TE", "trailers")]
        } else {
            &[]
        };
        let r = http.post(&gw.url("/stream"), te, "x").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text(), "hello");
        let key = format!("t-{i}");
        let mut headers = vec![("Idempotency-Key", key.as_str())];
        headers.extend_from_slice(te);
        let r = http.post(&gw.url("/pay/1"), &headers, "x").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.text(), "hello");
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "every request reused the one connection"
    );
}

/// Reads from `s` into `buf` until `buf` holds a whole request head: the offset of its
/// blank line, the head in lower case and its `Content-Length` (0 without one). `None`
/// when the connection ends first.
async fn read_head(
    s: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(usize, String, usize)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            return Some((end, head, len));
        }
        let len = buf.len();
        if !read_to(s, buf, len + 1).await {
            return None;
        }
    }
}

/// Reads from `s` until `buf` holds at least `n` bytes; false when the connection ends
/// first.
async fn read_to(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, n: usize) -> bool {
    let mut chunk = [0u8; 4096];
    while buf.len() < n {
        match s.read(&mut chunk).await {
            Ok(k) if k > 0 => buf.extend_from_slice(&chunk[..k]),
            _ => return false,
        }
    }
    true
}

/// Reads the rest of a request of `size` bytes (head included) into `buf`, drops it from
/// `buf` and writes `answer`; false when the connection ends first.
async fn answer_request(
    s: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
    size: usize,
    answer: &[u8],
) -> bool {
    if !read_to(s, buf, size).await {
        return false;
    }
    buf.drain(..size);
    s.write_all(answer).await.is_ok()
}

/// A loopback upstream that counts its connections and serves each with `serve`.
async fn counted_upstream<F, Fut>(serve: F) -> (std::net::SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s));
        }
    });
    (addr, conns)
}
