//! A refusal keeps the connection usable: a request the gateway refuses before reading its
//! body (a missing key, a bad path) has its body drained, so the client's next request on
//! the same keep-alive connection is read as one. Raw sockets send the next request at
//! once; a pooled client alternates refused and valid requests a thousand times.
//!
//! Each request on a keep-alive connection has `server.header_read_timeout` from the
//! previous answer, not from the connection's start; a client silent for longer is cut.

use std::time::Duration;

use dedupe_test_support::{GatewayConfig, Http, RouteCfg, StoreCfg, TestGateway, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn gateway() -> (Upstream, TestGateway) {
    gateway_with(|c| c).await
}

async fn gateway_with(f: impl FnOnce(GatewayConfig) -> GatewayConfig) -> (Upstream, TestGateway) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&f(GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .route(RouteCfg::header("orders", "/orders/**"))))
    .await;
    (up, gw)
}

/// Reads one response (head and a Content-Length body) off `s`; its status, or `None` when
/// the connection ended first.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(head_len)) = resp.parse(buf) {
            let status = resp.code?;
            let length: usize = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                .unwrap_or(0);
            if buf.len() >= head_len + length {
                buf.drain(..head_len + length);
                return Some(status);
            }
        }
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

fn request(target: &str, key: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "POST {target} HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(k) = key {
        head.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_request_after_a_refusal_is_served_on_the_same_connection() {
    let (up, gw) = gateway().await;
    let body = vec![b'x'; 64 * 1024];
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    for round in 0..20 {
        // Refused before its body is read (no key; a path that cannot be normalised),
        // then a valid request at once, on the same connection.
        let refused = if round % 2 == 0 {
            request("/orders/1", None, &body)
        } else {
            request("/orders/a%2Fb", Some("k"), &body)
        };
        let key = format!("k-{round}");
        let valid = request("/orders/1", Some(&key), b"{}");
        s.write_all(&[refused, valid].concat()).await.unwrap();
        assert_eq!(
            read_response(&mut s, &mut buf).await,
            Some(400),
            "round {round}"
        );
        assert_eq!(
            read_response(&mut s, &mut buf).await,
            Some(201),
            "round {round}: the request after a refusal was lost"
        );
    }
    assert_eq!(up.effects(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_keep_alive_requests_alternating_refused_and_valid_all_succeed() {
    let (up, gw) = gateway().await;
    let http = Http::new();
    let url = gw.url("/orders/1");
    let body = "x".repeat(16 * 1024);
    for i in 0..500 {
        let refused = http.send("POST", &url, &[], &body).await;
        assert_eq!(
            refused.map(|r| r.status.as_u16()),
            Ok(400),
            "request {}",
            2 * i
        );
        let key = format!("k-{i}");
        let valid = http
            .send("POST", &url, &[("Idempotency-Key", &key)], "{}")
            .await;
        assert_eq!(
            valid.map(|r| r.status.as_u16()),
            Ok(201),
            "request {}",
            2 * i + 1
        );
    }
    assert_eq!(up.effects(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_has_the_header_read_timeout_from_the_last_answer() {
    let (up, gw) = gateway_with(|c| c.header_read_timeout("1s")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    // Six requests 400 ms apart: 2.4 s on one connection, each within 1 s of the last
    // answer. A deadline not moved on with each request would cut the connection.
    for round in 0..6 {
        let key = format!("k-{round}");
        s.write_all(&request("/orders/1", Some(&key), b"{}"))
            .await
            .unwrap();
        assert_eq!(
            read_response(&mut s, &mut buf).await,
            Some(201),
            "round {round}: the connection was cut before its deadline"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Then silent: the gateway closes it.
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a silent keep-alive connection must be closed: {read:?}"
    );
    assert_eq!(up.effects(), 6);
}
