//! How the gateway reads an HTTP/1.1 upstream's answers on its pooled connections: the
//! framings of RFC 9112, informational heads, and answers that are wrong on the wire. A
//! scripted upstream writes exact bytes and counts its connections; what a client gets,
//! and which connection carried it, is the truth.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dedupe_test_support::{GatewayConfig, Http, TestGateway};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the scripted upstream writes for the `n`th request (from 0) on its `c`th
/// connection (from 0), given the request head (lowercased); `None` closes the connection,
/// and so does the answer to a request whose line names `/close`.
type Script = fn(c: usize, n: usize, head: &str) -> Option<Vec<u8>>;

/// An upstream that answers each request with its script's bytes, and counts connections.
async fn scripted(script: Script) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let c = counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                for n in 0.. {
                    let (end, head) = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break (end, String::from_utf8_lossy(&buf[..end]).to_lowercase());
                        }
                        match s.read(&mut chunk).await {
                            Ok(k) if k > 0 => buf.extend_from_slice(&chunk[..k]),
                            _ => return,
                        }
                    };
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk).await {
                            Ok(k) if k > 0 => buf.extend_from_slice(&chunk[..k]),
                            _ => return,
                        }
                    }
                    buf.drain(..end + 4 + len);
                    let Some(answer) = script(c, n, &head) else {
                        return;
                    };
                    let close = head.lines().next().is_some_and(|l| l.contains("/close"));
                    if s.write_all(&answer).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns)
}

async fn gateway(upstream: std::net::SocketAddr) -> TestGateway {
    TestGateway::start(&GatewayConfig::new(format!("http://{upstream}")).upstream_timeout("5s"))
        .await
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn informational_heads_are_skipped_and_the_final_answer_forwarded() {
    let (up, conns) = scripted(|_, _, _| {
        Some(
            [
                &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
                b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
                &ok("final"),
            ]
            .concat(),
        )
    })
    .await;
    let gw = gateway(up).await;
    let http = Http::new();
    for _ in 0..3 {
        let r = http.post(&gw.url("/a"), &[], "x").await;
        assert_eq!((r.status, r.text()), (StatusCode::OK, "final".to_owned()));
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "one connection carried all three"
    );
}

#[tokio::test]
async fn bytes_past_an_answer_never_reach_another_request() {
    // The first connection's first answer carries a second, forged one behind it.
    let (up, conns) = scripted(|c, n, _| match (c, n) {
        (0, 0) => Some([ok("first"), ok("forged")].concat()),
        _ => Some(ok("fresh")),
    })
    .await;
    let gw = gateway(up).await;
    let http = Http::new();
    let r = http.post(&gw.url("/a"), &[], "x").await;
    assert_eq!(r.text(), "first");
    for _ in 0..3 {
        let r = http.post(&gw.url("/b"), &[], "x").await;
        assert_eq!(
            r.text(),
            "fresh",
            "an answer was taken from another exchange"
        );
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "the spoilt connection was reused"
    );
}

#[tokio::test]
async fn answers_framed_every_way_are_read_whole_and_reused_only_when_they_can_be() {
    let (up, conns) = scripted(|_, _, head| {
        let line = head.lines().next().unwrap_or_default();
        Some(if line.starts_with("head ") {
            // A HEAD answer's length describes a body that is not sent.
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_vec()
        } else if line.contains("/chunked") {
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                .to_vec()
        } else if line.contains("/close") {
            // Delimited by the connection's end.
            b"HTTP/1.1 200 OK\r\n\r\nuntil the end".to_vec()
        } else if line.contains("/gone") {
            return None;
        } else {
            ok("plain")
        })
    })
    .await;
    let gw = gateway(up).await;
    let http = Http::new();
    let r = http.send("HEAD", &gw.url("/h"), &[], "").await.unwrap();
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, 0));
    let r = http.post(&gw.url("/chunked"), &[], "x").await;
    assert_eq!(r.text(), "abcde");
    let r = http.post(&gw.url("/p"), &[], "x").await;
    assert_eq!(r.text(), "plain");
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "HEAD, chunked and plain share one"
    );
    let r = http.post(&gw.url("/close"), &[], "x").await;
    assert_eq!(r.text(), "until the end");
    let r = http.post(&gw.url("/p"), &[], "x").await;
    assert_eq!(r.text(), "plain");
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "a close-delimited answer's was reused"
    );
}

#[tokio::test]
async fn a_malformed_answer_is_a_bad_gateway_and_its_connection_is_dropped() {
    let (up, conns) = scripted(|_, _, head| {
        Some(if head.contains("/twice") {
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!".to_vec()
        } else if head.contains("/chunks") {
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".to_vec()
        } else if head.contains("/upgrade") {
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n".to_vec()
        } else {
            ok("plain")
        })
    })
    .await;
    let gw = gateway(up).await;
    let http = Http::new();
    for path in ["/twice", "/upgrade"] {
        let r = http.post(&gw.url(path), &[], "x").await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{path}: {}", r.text());
    }
    // A broken chunked body: the head went out, so the client's answer breaks off.
    let broke = tokio::time::timeout(
        Duration::from_secs(5),
        raw_exchange(
            gw.addr,
            "POST /chunks HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\n\r\n",
        ),
    )
    .await
    .expect("the broken answer hung");
    assert!(
        !broke.ends_with(b"0\r\n\r\n"),
        "a broken body was ended as if whole"
    );
    let r = http.post(&gw.url("/p"), &[], "x").await;
    assert_eq!(r.text(), "plain");
    assert_eq!(
        conns.load(Ordering::SeqCst),
        4,
        "a connection with a broken answer was reused"
    );
}

/// Sends `request` on a raw connection and reads until the gateway closes it or stops.
async fn raw_exchange(addr: std::net::SocketAddr, request: &str) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(Ok(n @ 1..)) =
        tokio::time::timeout(Duration::from_secs(2), s.read(&mut chunk)).await
    {
        got.extend_from_slice(&chunk[..n]);
    }
    got
}
