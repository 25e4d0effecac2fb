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

/// The answers in `bytes`, read as a client reads them (RFC 9112 §6.3: chunked, else
/// `Content-Length`, else to the end), as (status, body) pairs.
fn answers(mut bytes: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).to_lowercase();
        bytes = &bytes[end + 4..];
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
        let field = |name: &str| {
            head.lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim() == name)
                .map(|(_, v)| v.trim().to_owned())
        };
        let mut body = Vec::new();
        if field("transfer-encoding").is_some_and(|te| te.ends_with("chunked")) {
            loop {
                let line = bytes.windows(2).position(|w| w == b"\r\n").unwrap();
                let text = String::from_utf8_lossy(&bytes[..line]);
                let size =
                    usize::from_str_radix(text.split(';').next().unwrap().trim(), 16).unwrap();
                bytes = &bytes[line + 2..];
                if size == 0 {
                    let end = bytes.windows(2).position(|w| w == b"\r\n").unwrap();
                    bytes = &bytes[end + 2..];
                    break;
                }
                body.extend_from_slice(&bytes[..size]);
                bytes = &bytes[size + 2..];
            }
        } else if let Some(n) = field("content-length") {
            let n: usize = n.parse().unwrap_or_else(|_| panic!("a bad length: {head}"));
            body.extend_from_slice(&bytes[..n.min(bytes.len())]);
            bytes = &bytes[n.min(bytes.len())..];
        } else if !(status == 204 || status == 304 || (100..200).contains(&status)) {
            body.extend_from_slice(bytes);
            bytes = &[];
        }
        out.push((status, body));
    }
    out
}

/// An upstream whose answer to a keyed write carries a stale `Content-Length` beside
/// `Transfer-Encoding: chunked`, a chunked body that hides a second answer behind the
/// length's four bytes, or lengths the body does not match.
fn stale_length(_: usize, _: usize, head: &str) -> Option<Vec<u8>> {
    let line = head.lines().next().unwrap_or_default();
    let hidden = b"SAFEHTTP/1.1 418 INJECTED\r\nContent-Length: 0\r\n\r\n";
    Some(if line.contains("/v1/te") {
        let mut a = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            hidden.len()
        )
        .into_bytes();
        a.extend_from_slice(hidden);
        a.extend_from_slice(b"\r\n0\r\n\r\n");
        a
    } else if line.contains("/v1/twice") {
        b"HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\n\r\nSAFE".to_vec()
    } else {
        ok("other")
    })
}

#[tokio::test]
async fn a_stale_upstream_length_is_never_stored_nor_written_beside_another_body() {
    let (up, _) = scripted(stale_length).await;
    let gw = TestGateway::start(
        &GatewayConfig::new(format!("http://{up}"))
            .upstream_timeout("5s")
            .route(dedupe_test_support::RouteCfg::header("orders", "/v1/**")),
    )
    .await;
    for path in ["/v1/te", "/v1/twice"] {
        let key = format!("k{path}");
        let post = format!(
            "POST {path} HTTP/1.1\r\nhost: gw\r\nidempotency-key: {key}\r\ncontent-length: 2\r\n\r\n"
        );
        let after = "{}GET /other HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n";
        // The winner, then its replay, each followed on its connection by another request;
        // the body in a second segment takes hyper's path as well as the lane's.
        for (attempt, split) in [(0, false), (1, false), (2, true)] {
            let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
            if split {
                s.write_all(post.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                s.write_all(after.as_bytes()).await.unwrap();
            } else {
                s.write_all(format!("{post}{after}").as_bytes())
                    .await
                    .unwrap();
            }
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
                .await
                .expect("answered within 5 s")
                .unwrap();
            let read = answers(&got);
            let statuses: Vec<u16> = read.iter().map(|(s, _)| *s).collect();
            let text = String::from_utf8_lossy(&got);
            assert_eq!(statuses, [200, 200], "{path} #{attempt}: {text}");
            assert_eq!(read[1].1, b"other", "{path} #{attempt}: {text}");
            let body = if path == "/v1/te" {
                &b"SAFEHTTP/1.1 418 INJECTED\r\nContent-Length: 0\r\n\r\n"[..]
            } else {
                b"SAFE"
            };
            assert_eq!(read[0].1, body, "{path} #{attempt}: {text}");
        }
    }
}

/// An upstream that closes a kept-alive connection as the next request arrives, without
/// an answer (the race of a pooled connection closed just as it was lent): a safe request
/// with no body is sent once more on a new connection; a write is not, and is a 502.
#[tokio::test]
async fn a_safe_request_whose_kept_connection_closed_unanswered_is_sent_once_more() {
    let (up, conns) = scripted(|c, n, _| match (c % 2, n) {
        (0, 0) => Some(ok("first")),
        (0, _) => None,
        _ => Some(ok("fresh")),
    })
    .await;
    let gw = gateway(up).await;
    let http = Http::new();
    let r = http.get(&gw.url("/a"), &[]).await;
    assert_eq!(r.text(), "first");
    let r = http.get(&gw.url("/b"), &[]).await;
    assert_eq!((r.status, r.text()), (StatusCode::OK, "fresh".to_owned()));
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "sent again on a new connection"
    );
    // A write meets the same close: it may have executed, so it is not sent again.
    let (up, conns) = scripted(|c, n, _| match (c, n) {
        (0, 0) => Some(ok("first")),
        (0, _) => None,
        _ => Some(ok("fresh")),
    })
    .await;
    let gw = gateway(up).await;
    assert_eq!(http.get(&gw.url("/a"), &[]).await.text(), "first");
    let r = http.post(&gw.url("/w"), &[], "x").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(conns.load(Ordering::SeqCst), 1, "the write was sent once");
}
