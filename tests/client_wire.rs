//! The gateway's HTTP/1.1 connections to clients, on the wire: pipelined requests (plain
//! and keyed) answered once each and in order, the hop's fields told to the upstream,
//! chunked and `HEAD` answers and a dead upstream leaving the connection in step,
//! `Connection: close` honoured, a client that leaves freeing its slot. Raw sockets send
//! the requests and read the answers; the counting upstream says what reached it.

use std::time::Duration;

use dedupe_test_support::{GatewayConfig, Http, RouteCfg, StoreCfg, TestGateway, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn gateway(config: impl FnOnce(GatewayConfig) -> GatewayConfig) -> (Upstream, TestGateway) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&config(
        GatewayConfig::new(up.url())
            .store(StoreCfg::memory())
            .route(RouteCfg::header("orders", "/orders/**")),
    ))
    .await;
    (up, gw)
}

/// One response as the client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response off `s` (a `Content-Length` or chunked body; none after `HEAD`), or
/// `None` when the connection ends first.
async fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>, head_only: bool) -> Option<Answer> {
    loop {
        if let Some((answer, used)) = parse(buf, head_only) {
            buf.drain(..used);
            return Some(answer);
        }
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// A whole response at the start of `buf`, and its length.
fn parse(buf: &[u8], head_only: bool) -> Option<(Answer, usize)> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut fields);
    let httparse::Status::Complete(len) = resp.parse(buf).ok()? else {
        return None;
    };
    let headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let mut answer = Answer {
        status: resp.code?,
        headers,
        body: Vec::new(),
    };
    if head_only {
        return Some((answer, len));
    }
    if answer.header("transfer-encoding") == Some("chunked") {
        let mut at = len;
        loop {
            let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[at..line_end]).ok()?, 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // No trailers are sent to a client that did not ask for them.
                if buf.get(at..at + 2)? != b"\r\n" {
                    return None;
                }
                return Some((answer, at + 2));
            }
            answer.body.extend_from_slice(buf.get(at..at + size)?);
            at += size + 2;
        }
    }
    let length: usize = answer
        .header("content-length")
        .map_or(0, |v| v.parse().unwrap());
    answer.body = buf.get(len..len + length)?.to_vec();
    Some((answer, len + length))
}

fn post(target: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "POST {target} HTTP/1.1\r\nHost: gw.example\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_each_answered_once_in_order() {
    let (up, gw) = gateway(|c| c).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let large = vec![b'l'; 100 * 1024];
    // Two plain ones, a deduped request and its retry, a plain one after them, and a
    // large body.
    let requests = [
        post("/plain/1", "", b"one"),
        post("/plain/2", "", b""),
        post("/orders/1", "Idempotency-Key: k-1\r\n", b"{}"),
        post("/orders/1", "Idempotency-Key: k-1\r\n", b"{}"),
        post("/plain/3", "", b"three"),
        post("/plain/4", "", &large),
    ];
    s.write_all(&requests.concat()).await.unwrap();
    let mut buf = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..requests.len() {
        answers.push(
            read_answer(&mut s, &mut buf, false)
                .await
                .expect("an answer"),
        );
    }
    let paths: Vec<_> = answers
        .iter()
        .map(|a| {
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
            v["path"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        paths,
        [
            "/plain/1",
            "/plain/2",
            "/orders/1",
            "/orders/1",
            "/plain/3",
            "/plain/4"
        ]
    );
    assert!(answers.iter().all(|a| a.status == 201), "{answers:?}");
    // The retry was a replay: five effects for six requests, each body whole.
    assert_eq!(answers[3].header("idempotent-replayed"), Some("true"));
    assert_eq!(up.effects(), 5);
    let seen = up.seen();
    let bodies: Vec<_> = seen.iter().map(|s| s.body.len()).collect();
    assert_eq!(bodies, [3, 0, 2, 5, large.len()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_is_told_the_hop_and_never_the_clients_fence() {
    let (up, gw) = gateway(|c| c).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let extra = "X-Forwarded-For: 203.0.113.9\r\nIdempotency-Fence: 999\r\n\
                 Idempotency-Scope: forged\r\nConnection: keep-alive\r\nX-Custom: a b\r\n";
    s.write_all(&post("/plain/a?q=1", extra, b"{}"))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let answer = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(answer.status, 201);
    assert!(answer.header("date").is_some(), "{answer:?}");
    let seen = &up.seen()[0];
    assert_eq!(seen.path, "/plain/a?q=1");
    let h = |n: &str| seen.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(h("x-forwarded-for").unwrap(), "203.0.113.9, 127.0.0.1");
    assert_eq!(h("x-forwarded-proto").unwrap(), "http");
    assert_eq!(h("x-forwarded-host").unwrap(), "gw.example");
    assert_eq!(
        seen.host.as_deref(),
        Some(&*format!("127.0.0.1:{}", up.port()))
    );
    assert_eq!(h("x-custom").unwrap(), "a b");
    assert!(h("idempotency-fence").is_none() && h("idempotency-scope").is_none());
    assert!(h("connection").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_answers_head_requests_and_a_dead_upstream_keep_the_connection_in_step() {
    let (up, gw) = gateway(|c| c.upstream_timeout("2s")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    // A chunked answer with a trailer the client did not ask for: re-chunked, no trailer.
    s.write_all(&post(
        "/plain/t",
        "X-Test-Respond-Trailer: x-sum=1\r\n",
        b"",
    ))
    .await
    .unwrap();
    let chunked = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(chunked.header("transfer-encoding"), Some("chunked"));
    assert!(chunked.header("content-length").is_none());
    let v: serde_json::Value = serde_json::from_slice(&chunked.body).unwrap();
    assert_eq!(v["path"], "/plain/t");
    // HEAD: the length of the body it would have, and no body.
    s.write_all(b"HEAD /plain/h HTTP/1.1\r\nHost: gw\r\nX-Test-Body-Bytes: 7\r\n\r\n")
        .await
        .unwrap();
    let head = read_answer(&mut s, &mut buf, true).await.unwrap();
    assert_eq!(head.header("content-length"), Some("7"));
    // The next request still reads as one.
    s.write_all(&post("/plain/after", "X-Test-Status: 200\r\n", b""))
        .await
        .unwrap();
    let after = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(after.status, 200);
    assert!(buf.is_empty(), "{:?}", String::from_utf8_lossy(&buf));
    assert_eq!(up.effects(), 3);
    // An upstream that does not answer: a problem, and the connection stays usable.
    s.write_all(&post("/plain/slow", "X-Test-Drop: 1\r\n", b""))
        .await
        .unwrap();
    let problem = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(problem.status, 504);
    assert_eq!(
        problem.header("content-type"),
        Some("application/problem+json")
    );
    s.write_all(&post("/plain/again", "", b"")).await.unwrap();
    assert_eq!(
        read_answer(&mut s, &mut buf, false).await.unwrap().status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_is_honoured() {
    let (up, gw) = gateway(|c| c.upstream_timeout("300ms")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(&post("/plain/c", "Connection: close\r\n", b"x"))
        .await
        .unwrap();
    let closed = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(closed.header("connection"), Some("close"));
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(
        matches!(end, Ok(Ok(0))),
        "the gateway closed the connection"
    );
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_is_off_is_streamed_and_counted_under_its_name() {
    let (up, gw) = gateway(|c| c.route(RouteCfg::header("quiet", "/quiet/**").mode("off"))).await;
    let client = Http::new();
    for i in 0..3 {
        let url = gw.url(&format!("/quiet/{i}"));
        let reply = client
            .post(&url, &[("idempotency-key", "same")], "{}")
            .await;
        assert_eq!(reply.status, 201);
    }
    assert_eq!(up.effects(), 3);
    let text = gw.gateway.metrics().encode();
    assert!(
        text.lines().any(|l| l.contains("route=\"quiet\"")
            && l.contains("passthrough")
            && l.ends_with(" 3")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_the_upstream_thinks_gives_its_slot_back() {
    // One connection slot, and an upstream that never answers within the test.
    let (up, gw) = gateway(|c| c.max_connections(1).upstream_timeout("60s")).await;
    let mut gone = TcpStream::connect(gw.addr).await.unwrap();
    gone.write_all(&post("/plain/never", "X-Test-Drop: 1\r\n", b""))
        .await
        .unwrap();
    up.wait_for_effects(1).await;
    drop(gone);
    // The slot comes back when the client leaves, not when the upstream times out.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&post("/plain/next", "", b"")).await.unwrap();
    let mut buf = Vec::new();
    let next = read_answer(&mut s, &mut buf, false).await;
    assert_eq!(next.map(|a| a.status), Some(201));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_whose_body_is_slow_is_judged_by_its_head() {
    // The pipeline refuses a missing key at once instead of waiting for the body.
    let (up, gw) = gateway(|c| c.body_read_timeout("30s")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /orders/slow HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let refused = read_answer(&mut s, &mut buf, false)
        .await
        .expect("an answer");
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(up.effects(), 0);
}

/// A won key whose answer arrives whole in one poll of many upstream reads (about 127 of
/// 4 KiB: these sizes spend tokio's cooperative budget in the request's last poll, just
/// before it delivers) is answered with that answer, never a 500 beside a stored record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_spends_the_cooperative_budget_still_reaches_its_client() {
    let (up, gw) = gateway(|c| c).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    let sizes: Vec<usize> = (505_000..540_000).step_by(997).collect();
    for (i, size) in sizes.iter().enumerate() {
        let extra = format!("Idempotency-Key: budget-{i}\r\nX-Test-Body-Bytes: {size}\r\n");
        s.write_all(&post("/orders/budget", &extra, b"{}"))
            .await
            .unwrap();
        let answer = read_answer(&mut s, &mut buf, false)
            .await
            .expect("an answer on the same connection");
        assert_eq!(
            (answer.status, answer.body.len()),
            (201, *size),
            "a body of {size} bytes"
        );
    }
    assert_eq!(up.effects(), sizes.len() as u64, "one effect per key");
}
