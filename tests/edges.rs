//! The request head at the edges (issue #23): raw bytes in paths, absolute-form targets,
//! method case, `Host`, `CONNECT`, a client's broken chunked body and an sf-string key.
//! Raw sockets write the bytes; the real upstream counts what reached it and how.

use std::time::Duration;

use bytes::Bytes;
use dedupe_test_support::{GatewayConfig, Http, RouteCfg, StoreCfg, TestGateway, Upstream};
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start() -> (Upstream, TestGateway) {
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .route(RouteCfg::header("cafe", "/v1/caf%C3%A9/**"))
        .route(RouteCfg::header("payments", "/v1/payments/**"));
    let gw = TestGateway::start(&cfg).await;
    (up, gw)
}

/// Writes `head` (and `Connection: close` is up to the caller) and reads the whole answer.
async fn raw(gw: &TestGateway, request: &[u8]) -> String {
    raw_to(gw.addr, request).await
}

async fn raw_to(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("answered within 5 s")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"))
}

fn post(target: &[u8], key: &str) -> Vec<u8> {
    let mut r = b"POST ".to_vec();
    r.extend_from_slice(target);
    r.extend_from_slice(
        format!(
            " HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: {key}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_utf8_paths_reach_the_upstream_as_sent_and_match_their_route() {
    let (up, gw) = start().await;
    let a = raw(
        &gw,
        b"GET /files/na\xc3\xafve.txt HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&a), 201, "{a}");
    assert_eq!(up.seen()[0].path, "/files/na\u{ef}ve.txt");

    // The route is written percent-encoded; the raw spelling of its path is the same path.
    let first = raw(&gw, &post(b"/v1/caf\xc3\xa9/x", "k1")).await;
    assert_eq!(status(&first), 201, "{first}");
    assert_eq!(up.seen()[1].path, "/v1/caf\u{e9}/x");
    let again = raw(&gw, &post(b"/v1/caf%C3%A9/x", "k1")).await;
    assert_eq!(status(&again), 201, "{again}");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{again}"
    );
    assert_eq!(up.effects(), 2, "one execution for both spellings");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_backslash_is_refused_like_its_escape() {
    let (up, gw) = start().await;
    for target in [
        &b"/v1\\payments"[..],
        b"/v1/payments\\..\\x",
        b"/v1/payments/a\\b",
    ] {
        let a = raw(&gw, &post(target, "k2")).await;
        assert_eq!(status(&a), 400, "{a}");
        assert!(a.contains("path-invalid"), "{a}");
    }
    assert_eq!(up.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_origin_form_and_the_gateway_s_authority() {
    let (up, gw) = start().await;
    let a = raw(
        &gw,
        b"GET http://user:pw@internal-admin.local:8443?y HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&a), 201, "{a}");
    let b = raw(
        &gw,
        b"GET http://internal-admin.local:8443/a/./b?z HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&b), 201, "{b}");
    // HTTP/2 with a `:path` of `?q=1`.
    let r = h2_get(&gw, "GET", &format!("http://{}?q=1", gw.addr)).await;
    assert_eq!(r, StatusCode::CREATED);
    let seen = up.seen();
    let targets: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(targets, ["/?y", "/a/b?z", "/?q=1"]);
    let upstream_host = format!("127.0.0.1:{}", up.port());
    for s in &seen {
        assert_eq!(s.host.as_deref(), Some(upstream_host.as_str()), "{s:?}");
    }
    assert_eq!(seen[0].headers["x-forwarded-host"], "gw");
}

/// One HTTP/2 request with prior knowledge, method and `:path` as given; its status.
async fn h2_get(gw: &TestGateway, method: &str, uri: &str) -> StatusCode {
    let io = TokioIo::new(TcpStream::connect(gw.addr).await.unwrap());
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(http::Method::from_bytes(method.as_bytes()).unwrap())
        .uri(uri)
        .header("idempotency-key", "h2-key")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_in_lower_case_is_refused_where_its_upper_case_is_deduped() {
    let (up, gw) = start().await;
    for method in ["post", "Post", "pOST"] {
        let req = post(b"/v1/payments/1", "k3");
        let req = [method.as_bytes(), &req[4..]].concat();
        let a = raw(&gw, &req).await;
        assert_eq!(status(&a), 400, "{a}");
        assert!(a.contains("method-case"), "{a}");
    }
    let r = h2_get(&gw, "post", &format!("http://{}/v1/payments/1", gw.addr)).await;
    assert_eq!(r, StatusCode::BAD_REQUEST);
    // Where no route would dedupe it, a lower-case method is the upstream's business.
    let a = raw(
        &gw,
        b"get /elsewhere HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&a), 201, "{a}");
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_connect_and_a_broken_chunked_body_are_the_client_s_errors() {
    let (up, gw) = start().await;
    for (head, want) in [
        ("GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n", "host-invalid"),
        ("GET /x HTTP/1.1\r\n", "host-invalid"),
        (
            "GET /x HTTP/1.1\r\nHost: a.example/../x\r\n",
            "host-invalid",
        ),
        (
            "CONNECT internal:443 HTTP/1.1\r\nHost: internal:443\r\n",
            "method-not-supported",
        ),
    ] {
        let a = raw(&gw, format!("{head}Connection: close\r\n\r\n").as_bytes()).await;
        assert!(a.contains(want), "{head:?}: {a}");
        let code = status(&a);
        assert!(code == 400 || code == 501, "{head:?}: {a}");
    }
    assert_eq!(up.effects(), 0);
    let a = raw(
        &gw,
        b"POST /upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\nzz\r\nmore\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status(&a), 400, "{a}");
    assert!(a.contains("body-unreadable"), "{a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_key_reaches_the_upstream_as_the_same_sf_string() {
    let (up, gw) = start().await;
    let http = Http::new();
    let url = gw.url("/v1/payments/q");
    let r = http
        .post(&url, &[("Idempotency-Key", r#""\"abc\"""#)], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = http.post(&url, &[("Idempotency-Key", "abc")], "{}").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert!(!r.replayed(), "the key abc is another key than \"abc\"");
    let seen = up.seen();
    assert_eq!(seen[0].headers["idempotency-key"], r#""\"abc\"""#);
    assert_eq!(seen[1].headers["idempotency-key"], "abc");
}

mod operator_on_a_live_claim {
    use super::*;
    use dedupe_test_support::{on_every_store, Backend};

    on_every_store!(resolve_and_delete_refuse_a_live_claim_unless_forced);

    /// A gateway with an admin port, and a 2.5 s call in flight under `key`: its fence.
    async fn live_call(
        b: Backend,
        key: &'static str,
    ) -> (
        Upstream,
        TestGateway,
        Option<dedupe_test_support::RedisServer>,
        u64,
        tokio::task::JoinHandle<dedupe_test_support::Reply>,
    ) {
        let up = Upstream::start().await;
        let (store, redis) = b.start_store();
        let cfg = GatewayConfig::new(up.url())
            .store(store)
            .admin()
            .upstream_timeout("10s")
            .route(
                RouteCfg::header("pay", "/pay/**")
                    .lease("1s")
                    .on_unknown_hold(),
            );
        let gw = TestGateway::start(&cfg).await;
        let url = gw.url("/pay/1");
        let slow = tokio::spawn(async move {
            Http::new()
                .post(
                    &url,
                    &[("Idempotency-Key", key), ("x-test-delay-ms", "2500")],
                    "{}",
                )
                .await
        });
        up.wait_for_effects(1).await;
        let r = Http::new()
            .get(&gw.admin_url(&format!("/keys/pay/{key}")), &[])
            .await;
        let rec: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(rec["state"], "in-flight", "{rec}");
        let fence = rec["fence"].as_u64().unwrap();
        (up, gw, redis, fence, slow)
    }

    async fn resolve_and_delete_refuse_a_live_claim_unless_forced(b: Backend) {
        let http = Http::new();
        let (up, gw, _redis, fence, slow) = live_call(b, "live-1").await;
        let resolve_url = gw.admin_url("/keys/pay/live-1/resolve");
        for body in [
            format!(r#"{{"fence": {fence}, "as": "retry"}}"#),
            format!(r#"{{"fence": {fence}, "as": "done", "status": 201, "body": "x"}}"#),
        ] {
            let r = http.post(&resolve_url, &[], &body).await;
            assert_eq!(r.status, StatusCode::CONFLICT, "{body}: {}", r.text());
            assert_eq!(r.problem_type(), "urn:dedupe-gateway:problem:claim-live");
            let p: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(p["fence"], fence);
            assert!(p["lease_left_ms"].as_u64().unwrap() > 0, "{p}");
        }
        let del = http
            .send("DELETE", &gw.admin_url("/keys/pay/live-1"), &[], "")
            .await
            .unwrap();
        assert_eq!(del.status, StatusCode::CONFLICT, "{}", del.text());
        assert_eq!(del.problem_type(), "urn:dedupe-gateway:problem:claim-live");
        // A retry meanwhile does not execute: the claim is still the first request's.
        let retry = http
            .post(&gw.url("/pay/1"), &[("Idempotency-Key", "live-1")], "{}")
            .await;
        assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.text());
        assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
        assert_eq!(up.effects(), 1, "one execution");

        // `force` acts on a live claim, by the operator's explicit choice.
        let (up, gw, _redis, fence, slow) = live_call(b, "live-2").await;
        let forced = http
            .post(
                &gw.admin_url("/keys/pay/live-2/resolve"),
                &[],
                &format!(r#"{{"fence": {fence}, "as": "retry", "force": true}}"#),
            )
            .await;
        assert_eq!(forced.status, StatusCode::NO_CONTENT, "{}", forced.text());
        let _ = slow.await;
        let (_up3, gw3, _redis3, _fence, slow3) = live_call(b, "live-3").await;
        let del = http
            .send(
                "DELETE",
                &gw3.admin_url("/keys/pay/live-3?force=true"),
                &[],
                "",
            )
            .await
            .unwrap();
        assert_eq!(del.status, StatusCode::NO_CONTENT, "{}", del.text());
        let _ = slow3.await;
        assert_eq!(up.effects(), 1);
        drop(gw);
    }
}

/// A held claim (its 504 outcome unknown, its lease over) resolved `done` with framing
/// headers over a 3-byte body: refused, so every replay stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_done_refuses_hop_by_hop_and_framing_headers() {
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .admin()
        .route(
            RouteCfg::header("pay", "/pay/**")
                .lease("300ms")
                .on_unknown_hold(),
        );
    let gw = TestGateway::start(&cfg).await;
    let http = Http::new();
    let key = [("Idempotency-Key", "held-1")];
    let r = http
        .post(&gw.url("/pay/1"), &[key[0], ("x-test-status", "504")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rec = http.get(&gw.admin_url("/keys/pay/held-1"), &[]).await;
    let rec: serde_json::Value = serde_json::from_slice(&rec.body).unwrap();
    assert_eq!(rec["state"], "unknown", "{rec}");
    let fence = rec["fence"].as_u64().unwrap();
    let url = gw.admin_url("/keys/pay/held-1/resolve");
    for (name, value) in [
        ("content-length", "1000"),
        ("transfer-encoding", "chunked"),
        ("connection", "close"),
    ] {
        let body = format!(
            r#"{{"fence": {fence}, "as": "done", "status": 201, "headers": {{"{name}": "{value}"}}, "body": "abc"}}"#
        );
        let r = http.post(&url, &[], &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{name}: {}", r.text());
        assert!(r.text().contains(name), "{}", r.text());
    }
    let body = format!(r#"{{"fence": {fence}, "as": "done", "status": 201, "body": "abc"}}"#);
    assert_eq!(
        http.post(&url, &[], &body).await.status,
        StatusCode::NO_CONTENT
    );
    let replay = http.post(&gw.url("/pay/1"), &key, "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.text(), "abc");
    assert_eq!(up.effects(), 1);
}

/// With the admin port's 4 slots held by silent connections, and six more arriving every
/// second, probes on fresh connections (as a kubelet sends them) are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_with_silent_connections_at_the_admin_cap() {
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .header_read_timeout("10s")
        .admin_max_connections(4);
    let gw = TestGateway::start(&cfg).await;
    let admin = gw.admin.unwrap();
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(admin).await.unwrap());
    }
    let flood = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            for _ in 0..6 {
                held.push(TcpStream::connect(admin).await);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for path in ["/healthz", "/readyz", "/healthz", "/readyz", "/healthz"] {
        let probe = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        // `raw_to` waits at most 5 s: a liveness bound, not a speed claim.
        let a = raw_to(admin, probe.as_bytes()).await;
        assert_eq!(status(&a), 200, "{path}: {a}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    flood.abort();
    drop(silent);
}

/// Issue #54, item 3: what the upstream gets of a padded length, fields named with `_`, and
/// an `Expect` the gateway has answered itself; on a keyed route and passing through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padded_lengths_underscored_names_and_expect_reach_the_upstream_as_nginx_sends_them() {
    let (up, gw) = start().await;
    let keyed = "POST /v1/payments/1 HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: u-1\r\n";
    let plain = "POST /plain HTTP/1.1\r\nHost: gw\r\n";
    for (i, line) in [keyed, plain].into_iter().enumerate() {
        let padded = format!("{line}Content-Length: 0002\r\nConnection: close\r\n\r\n{{}}");
        assert_eq!(status(&raw(&gw, padded.as_bytes()).await), 201, "{line}");
        let seen = &up.seen()[i];
        assert_eq!(seen.headers["content-length"], "2", "{line}");
        assert_eq!(seen.body, "{}");
    }
    let underscored = "POST /v1/payments/2 HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: u-2\r\n\
                       Transfer_Encoding: chunked\r\nX_User: admin\r\nX-Kept: 1\r\n\
                       Content-Length: 2\r\nConnection: close\r\n\r\n{}";
    assert_eq!(status(&raw(&gw, underscored.as_bytes()).await), 201);
    let seen = &up.seen()[2];
    assert!(
        !seen.headers.contains_key("transfer_encoding"),
        "{:?}",
        seen.headers
    );
    assert!(!seen.headers.contains_key("x_user"), "{:?}", seen.headers);
    assert_eq!(seen.headers["x-kept"], "1");
    // `Expect`: the client gets the gateway's own `100 Continue`, the upstream no question.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(
        b"POST /v1/payments/3 HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: u-3\r\n\
          Expect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut interim = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut interim))
        .await
        .expect("100 Continue within 5 s")
        .unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"{}").await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert_eq!(status(&String::from_utf8_lossy(&rest)), 201);
    let seen = &up.seen()[3];
    assert!(!seen.headers.contains_key("expect"), "{:?}", seen.headers);
    assert_eq!(up.effects(), 4);

    // Kept where the operator says so.
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url()).underscores_in_headers(true);
    let gw = TestGateway::start(&cfg).await;
    let kept = "GET /plain HTTP/1.1\r\nHost: gw\r\nX_User: admin\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&raw(&gw, kept.as_bytes()).await), 201);
    assert_eq!(up.seen()[0].headers["x_user"], "admin");
}
