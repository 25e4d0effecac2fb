//! The HTTP/1 lane on the wire: plain requests that need no dedupe are proxied in bytes,
//! keyed requests read whole are handed to the pipeline and answered in bytes, and the
//! first request the lane does not take (a large body, a chunked upload, a keyed request
//! whose body is still coming) hands the connection to hyper with every byte already
//! read. Raw sockets send pipelined requests and read the answers in order; the counting
//! upstream says what reached it.

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
async fn pipelined_requests_cross_from_the_lane_to_hyper_and_each_is_answered_once_in_order() {
    let (up, gw) = gateway(|c| c).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let large = vec![b'l'; 100 * 1024];
    // Two for the lane, a deduped request and its retry (the lane's too), a plain one
    // after them, and a body larger than the lane buffers (hyper's from there on).
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
async fn connection_close_is_honoured_and_a_stalled_body_is_refused() {
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
    // A body that has not come by `server.upstream_timeout` (the full path's bound, which
    // streams it): 408 and the connection closed, nothing sent upstream.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /plain/s HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let refused = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(refused.status, 408);
    assert_eq!(refused.header("connection"), Some("close"));
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_is_off_stays_in_the_lane_and_is_counted_under_its_name() {
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

/// A request the lane declines, so that hyper serves the rest of its connection.
const DECLINED: &[u8] = b"GET /plain/declined HTTP/1.1\r\nHost: gw\r\nTE: trailers\r\n\r\n";

/// A request's target, fields (sorted) and body, as the upstream saw them.
type SeenForm = (String, Vec<(String, Vec<u8>)>, Vec<u8>);

/// What the upstream saw of a request, in a comparable form: target, fields (sorted) and
/// body.
fn seen_of(seen: &dedupe_test_support::upstream::Seen) -> SeenForm {
    let mut fields: Vec<_> = seen
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    fields.sort();
    (seen.path.clone(), fields, seen.body.to_vec())
}

/// A connection to `gw`, in the lane, or (`to_hyper`) served by hyper after a request the
/// lane declines; and its read buffer.
async fn connect(gw: &TestGateway, to_hyper: bool) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = Vec::new();
    if to_hyper {
        s.write_all(DECLINED).await.unwrap();
        read_answer(&mut s, &mut buf, false).await.unwrap();
    }
    (s, buf)
}

/// What the upstream saw since its `before`th request, but the requests that only set a
/// connection up (`DECLINED`) or check it is still in step (`/plain/next`).
fn seen_since(up: &Upstream, before: usize) -> Vec<SeenForm> {
    up.seen()[before..]
        .iter()
        .filter(|s| s.path != "/plain/declined" && s.path != "/plain/next")
        .map(seen_of)
        .collect()
}

/// An answer in a comparable form: status, fields but `date` (sorted, names in lower
/// case), body; the upstream's count of effects (in `x-effect` and the body) and the
/// fence it was sent (in the body) left out.
fn answer_of(a: &Answer) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut fields: Vec<_> = a
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
        .filter(|(n, _)| n != "date" && n != "x-effect")
        .collect();
    fields.sort();
    let body = match serde_json::from_slice::<serde_json::Value>(&a.body) {
        Ok(mut v) if v.get("effect").is_some() => {
            v["effect"] = 0.into();
            // A keyed request's fence grows with the clock.
            if v.get("fence").is_some() {
                v["fence"] = 0.into();
            }
            serde_json::to_vec(&v).unwrap()
        }
        _ => a.body.clone(),
    };
    (a.status, fields, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lane_and_hyper_send_and_answer_the_same() {
    let (up, gw) = gateway(|c| c.upstream_timeout("1s")).await;
    let requests: Vec<(&str, Vec<u8>)> = vec![
        (
            "fields a proxy rewrites",
            post(
                "/plain/a?b=c&d=%2F",
                "X-Forwarded-For: 198.51.100.1, 198.51.100.2\r\nx-forwarded-for: 203.0.113.5\r\n\
                 X-Forwarded-Host: api.example\r\nIdempotency-Fence: 7\r\nIdempotency-Scope: s\r\n\
                 Connection: keep-alive\r\nX-Dup: 1\r\nAccept: */*\r\nX-Dup: 2\r\n\
                 Content-Type: application/json\r\nX-Forwarded-Proto: https\r\n",
                br#"{"a":1}"#,
            ),
        ),
        (
            "an empty Host and no body",
            b"DELETE /plain/d HTTP/1.1\r\nHost:\r\n\r\n".to_vec(),
        ),
        (
            "HEAD",
            b"HEAD /plain/h HTTP/1.1\r\nHost: gw\r\nX-Test-Body-Bytes: 9\r\n\r\n".to_vec(),
        ),
        (
            "a chunked answer with a trailer",
            post("/plain/t", "X-Test-Respond-Trailer: x-sum=3\r\n", b"abc"),
        ),
        ("204", post("/plain/n", "X-Test-Status: 204\r\n", b"")),
        (
            "304",
            b"GET /plain/m HTTP/1.1\r\nHost: gw\r\nX-Test-Status: 304\r\n\r\n".to_vec(),
        ),
        (
            "a field the answer's Connection names",
            post(
                "/plain/c",
                "X-Test-Respond-Header: connection=x-private\r\n\
                 X-Test-Respond-Header: x-private=1\r\nX-Test-Respond-Header: x-public=2\r\n",
                b"",
            ),
        ),
        (
            "a status without a reason phrase of its own",
            post("/plain/s", "X-Test-Status: 299\r\n", b""),
        ),
        (
            "an upstream that does not answer",
            post("/plain/x", "X-Test-Drop: 1\r\n", b""),
        ),
    ];
    for (what, request) in requests {
        let head_only = request.starts_with(b"HEAD");
        let mut answers = Vec::new();
        let mut seen = Vec::new();
        for declined_first in [false, true] {
            let before = up.seen().len();
            let (mut s, mut buf) = connect(&gw, declined_first).await;
            s.write_all(&request).await.unwrap();
            let answer = read_answer(&mut s, &mut buf, head_only)
                .await
                .unwrap_or_else(|| panic!("{what}: no answer"));
            answers.push(answer_of(&answer));
            // The connection is still in step: a plain request after it reads as one.
            s.write_all(&post("/plain/next", "", b"")).await.unwrap();
            let next = read_answer(&mut s, &mut buf, false).await.unwrap();
            assert_eq!(next.status, 201, "{what}: {next:?}");
            seen.push(seen_since(&up, before));
        }
        assert_eq!(
            answers[0], answers[1],
            "{what}: the lane's answer, then hyper's"
        );
        assert_eq!(seen[0], seen[1], "{what}: what the upstream saw from each");
    }
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

/// `bytes` with every `from` replaced by `to`.
fn replaced(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    String::from_utf8_lossy(bytes)
        .replace(from, to)
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lane_and_hyper_handle_keyed_requests_the_same() {
    // Keyed requests the lane reads whole and hands to the full pipeline, then the same on
    // a connection hyper serves: the same answers (the key's own spelling aside) and the
    // same requests at the upstream (the fence aside: it grows with the clock).
    let (up, gw) = gateway(|c| c.upstream_timeout("1s").max_body("64B")).await;
    let key = "Idempotency-Key: {K}\r\n";
    let scenarios: Vec<(&str, Vec<Vec<u8>>)> = vec![
        (
            "a new key, its replay, then the key with another body",
            vec![
                post(
                    "/orders/a?x=1",
                    &format!("{key}Content-Type: application/json\r\n"),
                    br#"{"a":1}"#,
                ),
                post(
                    "/orders/a?x=1",
                    &format!("{key}Content-Type: application/json\r\n"),
                    br#"{"a":1}"#,
                ),
                post("/orders/a?x=1", key, br#"{"a":2}"#),
            ],
        ),
        ("no key", vec![post("/orders/b", "", b"{}")]),
        (
            "a chunked answer with a trailer, and its replay",
            vec![
                post(
                    "/orders/t",
                    &format!("{key}X-Test-Respond-Trailer: x-sum=3\r\n"),
                    b"abc",
                ),
                post(
                    "/orders/t",
                    &format!("{key}X-Test-Respond-Trailer: x-sum=3\r\n"),
                    b"abc",
                ),
            ],
        ),
        (
            "a 204, and its replay",
            vec![
                post("/orders/n", &format!("{key}X-Test-Status: 204\r\n"), b""),
                post("/orders/n", &format!("{key}X-Test-Status: 204\r\n"), b""),
            ],
        ),
        (
            "a body over server.max_body",
            vec![post("/orders/l", key, &[b'x'; 65])],
        ),
        (
            "an upstream that does not answer",
            vec![post("/orders/x", &format!("{key}X-Test-Drop: 1\r\n"), b"")],
        ),
        (
            "Connection: close",
            vec![post(
                "/orders/c",
                &format!("{key}Connection: close\r\n"),
                b"{}",
            )],
        ),
    ];
    for (what, requests) in scenarios {
        let mut answers = Vec::new();
        let mut seen = Vec::new();
        for declined_first in [false, true] {
            let k = format!("k-{}-{declined_first}", what.len());
            let before = up.seen().len();
            let (mut s, mut buf) = connect(&gw, declined_first).await;
            let mut mine = Vec::new();
            for request in &requests {
                s.write_all(&replaced(request, "{K}", &k)).await.unwrap();
                let answer = read_answer(&mut s, &mut buf, false)
                    .await
                    .unwrap_or_else(|| panic!("{what}: no answer"));
                let (status, fields, body) = answer_of(&answer);
                let fields: Vec<_> = fields
                    .into_iter()
                    .map(|(n, v)| match n.as_str() {
                        // A date a second may turn between the two runs.
                        "idempotency-expires" => (n, "E".to_owned()),
                        // The upstream's count of effects, in the body, may gain a digit.
                        "content-length" => (n, "N".to_owned()),
                        _ => (n, v.replace(&k, "K")),
                    })
                    .collect();
                mine.push((status, fields, replaced(&body, &k, "K")));
            }
            answers.push(mine);
            if requests
                .iter()
                .all(|r| !r.windows(17).any(|w| w == b"Connection: close"))
            {
                // Still in step: a plain request after them reads as one.
                s.write_all(&post("/plain/next", "", b"")).await.unwrap();
                let next = read_answer(&mut s, &mut buf, false).await.unwrap();
                assert_eq!(next.status, 201, "{what}: {next:?}");
            } else {
                let mut rest = Vec::new();
                let end = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest));
                assert!(
                    matches!(end.await, Ok(Ok(0))),
                    "{what}: the connection closed"
                );
            }
            let reached: Vec<_> = seen_since(&up, before)
                .into_iter()
                .map(|(path, fields, body)| {
                    let fields: Vec<_> = fields
                        .into_iter()
                        .map(|(n, v)| match n.as_str() {
                            "idempotency-fence" => (n, b"F".to_vec()),
                            _ => (n, replaced(&v, &k, "K")),
                        })
                        .collect();
                    (path, fields, body)
                })
                .collect();
            seen.push(reached);
        }
        assert_eq!(
            answers[0], answers[1],
            "{what}: the lane's answers, then hyper's"
        );
        assert_eq!(seen[0], seen[1], "{what}: what the upstream saw from each");
        assert!(!answers[0].is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_whose_body_is_slow_is_judged_by_its_head_as_hyper_does() {
    // The lane takes a keyed request only with its body whole; one still coming goes to
    // hyper, whose pipeline refuses a missing key at once instead of waiting for the body.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pipelines_then_half_closes_gets_every_answer() {
    let (up, gw) = gateway(|c| c).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let requests = [
        post("/orders/h", "Idempotency-Key: half-1\r\n", b"{}"),
        post("/plain/h", "", b""),
    ];
    s.write_all(&requests.concat()).await.unwrap();
    s.shutdown().await.unwrap();
    let mut buf = Vec::new();
    let first = read_answer(&mut s, &mut buf, false)
        .await
        .expect("the keyed answer");
    let second = read_answer(&mut s, &mut buf, false)
        .await
        .expect("the plain answer");
    assert_eq!((first.status, second.status), (201, 201));
    assert_eq!(up.effects(), 2);
}

/// A won key whose answer arrives whole in one poll of many upstream reads (about 127 of
/// 4 KiB: these sizes spend tokio's cooperative budget in the request's last poll, just
/// before it delivers) is answered with that answer, never a 500 beside a stored record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_spends_the_cooperative_budget_still_reaches_its_client() {
    let (up, gw) = gateway(|c| c).await;
    let (mut s, mut buf) = connect(&gw, false).await;
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
