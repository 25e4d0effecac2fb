//! Compressed request bodies (`Content-Encoding: gzip, deflate, br, zstd`) against a real
//! gateway and a counting upstream: the same content compressed twice is the same request,
//! the upstream gets the bytes the client sent, and bombs, garbage and unknown codings get
//! their problem before anything is claimed or forwarded.

use std::io::Write;

use bytes::Bytes;
use dedupe_test_support::{GatewayConfig, Http, Reply, RouteCfg, StoreCfg, TestGateway, Upstream};

const ORDER: &[u8] = br#"{"order_id":"o-1","amount":1200}"#;

fn gzip(data: &[u8], mtime: u32) -> Bytes {
    let mut e = flate2::GzBuilder::new()
        .mtime(mtime)
        .write(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap().into()
}

fn brotli(data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    brotli::BrotliCompress(&mut &data[..], &mut out, &Default::default()).unwrap();
    out.into()
}

fn zstd(data: &[u8]) -> Bytes {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest).into()
}

struct Env {
    up: Upstream,
    gw: TestGateway,
    http: Http,
}

async fn env() -> Env {
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::memory())
            .max_body("64KiB")
            .route(RouteCfg::fingerprint("fp", "/fp/**", &["json:/order_id"]))
            .route(RouteCfg::header("orders", "/orders/**"))
            .route(RouteCfg::header("keyonly", "/keyonly/**").match_mode("key")),
    )
    .await;
    Env {
        up,
        gw,
        http: Http::new(),
    }
}

impl Env {
    async fn post(&self, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
        self.http
            .send_bytes("POST", &self.gw.url(path), headers, body)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_json_in_any_coding_is_one_request_and_reaches_the_upstream_as_sent() {
    let e = env().await;
    let first = gzip(ORDER, 1);
    let r = e
        .post("/fp/o", &[("content-encoding", "gzip")], first.clone())
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let seen = &e.up.seen()[0];
    assert_eq!(
        seen.body, first,
        "the upstream gets the bytes the client sent"
    );
    assert_eq!(seen.headers["content-encoding"], "gzip");
    // Compressed again (another gzip time), or in another coding: the same request.
    for (coding, body) in [
        ("gzip", gzip(ORDER, 2)),
        ("br", brotli(ORDER)),
        ("zstd", zstd(ORDER)),
        ("identity", Bytes::from_static(ORDER)),
    ] {
        let again = e.post("/fp/o", &[("content-encoding", coding)], body).await;
        assert!(again.replayed(), "{coding}: {}", again.text());
        assert_eq!(again.body, r.body);
    }
    assert_eq!(e.up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_keyed_retry_recompressed_is_a_replay_not_a_mismatch() {
    let e = env().await;
    let h = [("idempotency-key", "k-1"), ("content-encoding", "gzip")];
    let first = e.post("/orders/1", &h, gzip(ORDER, 10)).await;
    assert_eq!(first.status, 201);
    let again = e.post("/orders/1", &h, gzip(ORDER, 20)).await;
    assert!(again.replayed(), "{}", again.text());
    let other = e
        .post("/orders/1", &h, gzip(br#"{"order_id":"o-2"}"#, 20))
        .await;
    assert_eq!(
        other.status, 422,
        "different content is still a different request"
    );
    assert_eq!(e.up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_garbage_and_unknown_codings_are_refused_before_any_claim() {
    let e = env().await;
    // 4 MiB of JSON-ish bytes in a few KiB of gzip: over max_body once decoded.
    let mut big = b"{\"order_id\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'a', 4 << 20));
    big.extend(b"\"}");
    let bomb = gzip(&big, 0);
    assert!(bomb.len() < 64 << 10);
    let r = e
        .post("/fp/bomb", &[("content-encoding", "gzip")], bomb)
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:body-too-large"
    );

    let r = e
        .post(
            "/fp/garbage",
            &[("content-encoding", "gzip")],
            Bytes::from_static(b"nope"),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:content-encoding-invalid"
    );

    let r = e
        .post(
            "/fp/lzw",
            &[("content-encoding", "compress")],
            Bytes::from_static(ORDER),
        )
        .await;
    assert_eq!(r.status, 415);
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:content-encoding-unsupported"
    );
    assert_eq!(e.up.effects(), 0, "nothing refused reached the upstream");

    // A route that never reads the body keys a compressed request by its header alone.
    let h = [("idempotency-key", "k-2"), ("content-encoding", "compress")];
    let r = e
        .post("/keyonly/1", &h, Bytes::from_static(b"\x1f\x9d..."))
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(e.up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_codings_past_two_are_refused_and_every_layer_shares_the_body_limit() {
    let e = env().await;
    // A thousand layers of `br` on a header-keyed route whose `match = "request"` reads
    // the body: refused with their count, before anything is decoded or claimed, while a
    // passthrough request beside it is answered.
    let layers = vec!["br"; 1000].join(", ");
    let h = [
        ("idempotency-key", "n-1"),
        ("content-encoding", &layers[..]),
    ];
    // (The body need not be coded at all: nothing is decoded.)
    let nested = brotli(ORDER);
    let plain = e.gw.url("/plain");
    let (r, beside) = tokio::join!(e.post("/orders/n", &h, nested), e.http.get(&plain, &[]));
    assert_eq!(r.status, 415, "{}", r.text());
    assert_eq!(
        r.problem_type(),
        "urn:dedupe-gateway:problem:content-encoding-unsupported"
    );
    assert!(
        r.text().contains("names 1000 content codings"),
        "the refusal says how many were sent: {}",
        r.text()
    );
    assert_eq!(beside.status, 201, "{}", beside.text());
    // Three are too many too; two are decoded.
    let twice = gzip(&gzip(ORDER, 1), 2);
    let h3 = [
        ("idempotency-key", "n-3"),
        ("content-encoding", "gzip, gzip, gzip"),
    ];
    let r = e.post("/orders/n", &h3, gzip(&twice, 3)).await;
    assert_eq!(r.status, 415, "{}", r.text());
    let h2 = [
        ("idempotency-key", "n-2"),
        ("content-encoding", "gzip, gzip"),
    ];
    let r = e.post("/orders/n", &h2, twice).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        e.up.effects(),
        2,
        "the passthrough and the two-coding request"
    );

    // Two layers, each under max_body (64 KiB) alone, over it together: 413.
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..40 << 10)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let inner = gzip(&noise, 0);
    assert!(inner.len() + noise.len() > 64 << 10);
    let h = [
        ("idempotency-key", "n-4"),
        ("content-encoding", "gzip, gzip"),
    ];
    let r = e.post("/orders/n", &h, gzip(&inner, 0)).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(e.up.effects(), 2, "nothing refused reached the upstream");
}
