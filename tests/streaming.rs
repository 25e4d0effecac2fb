//! A winner's answer that streams (server-sent events, one per 200 ms) reaches its client
//! through a deduped route event by event, while a copy is stored: a retry afterwards is
//! the whole stream replayed, and the upstream saw one call.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dedupe_test_support::{GatewayConfig, RouteCfg, StoreCfg, TestGateway};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const EVENTS: usize = 5;
const EVERY: Duration = Duration::from_millis(200);

/// An upstream that answers every request with `EVENTS` server-sent events, one per
/// `EVERY`, and counts the requests (its side effects).
async fn sse_upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let (tx, rx) =
                        tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
                    tokio::spawn(async move {
                        for n in 0..EVENTS {
                            let event = Bytes::from(format!("id: {n}\ndata: event {n}\n\n"));
                            if tx.send(Ok(Frame::data(event))).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(EVERY).await;
                        }
                    });
                    let body = Events(rx);
                    let resp = http::Response::builder()
                        .status(200)
                        .header("content-type", "text/event-stream")
                        .header("cache-control", "no-cache")
                        .body(body)
                        .unwrap();
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, calls)
}

/// The events as a response body, each frame as it is sent.
struct Events(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl hyper::body::Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx)
    }
}

/// Posts to `url` and reads the answer frame by frame: each data frame with when it came.
async fn read_events(url: &str, key: &str) -> (http::response::Parts, Vec<(Duration, Bytes)>) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = http::Request::post(url)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let sent = Instant::now();
    let resp = client.request(req).await.unwrap();
    let (head, mut body) = resp.into_parts();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push((sent.elapsed(), data));
        }
    }
    (head, frames)
}

fn concat(frames: &[(Duration, Bytes)]) -> Vec<u8> {
    frames.iter().flat_map(|(_, b)| b.iter().copied()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_reach_the_client_event_by_event_and_are_stored_whole() {
    let (upstream, calls) = sse_upstream().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(format!("http://{upstream}"))
            .store(StoreCfg::memory())
            .route(RouteCfg::header("events", "/v1/agent/**")),
    )
    .await;
    let url = gw.url("/v1/agent/run");

    let (head, frames) = read_events(&url, "run-1").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.headers["content-type"], "text/event-stream");
    let whole = concat(&frames);
    let text = String::from_utf8_lossy(&whole);
    assert_eq!(text.matches("data: event").count(), EVENTS, "{text}");
    // The first event came long before the stream ended: not held back until the end.
    let (first, last) = (frames[0].0, frames[frames.len() - 1].0);
    assert!(
        frames.len() >= 3 && last - first >= EVERY * 2,
        "events arrived together: {:?}",
        frames.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert!(!head.headers.contains_key("idempotent-replayed"));

    // The record was stored at the stream's end: a retry replays every event at once.
    let (again, replayed) = read_events(&url, "run-1").await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(concat(&replayed), whole);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_joins_the_stream_and_receives_the_same_events_from_one_call() {
    let (upstream, calls) = sse_upstream().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(format!("http://{upstream}"))
            .store(StoreCfg::memory())
            .route(RouteCfg::header("events", "/v1/agent/**").on_conflict_join("10s")),
    )
    .await;
    let url = gw.url("/v1/agent/run");
    let first = {
        let url = url.clone();
        tokio::spawn(async move { read_events(&url, "run-2").await })
    };
    // Join once the winner's answer is streaming (its first event is out).
    let started = Instant::now();
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the winner never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(EVERY + EVERY / 2).await;
    let (head, joined) = read_events(&url, "run-2").await;
    let (winner_head, winner) = first.await.unwrap();
    assert_eq!(head.status, winner_head.status);
    assert_eq!(head.headers["idempotent-replayed"], "true");
    assert_eq!(head.headers["content-type"], "text/event-stream");
    assert_eq!(concat(&joined), concat(&winner), "the same events");
    // The events sent before the join came at once; the rest live, as they were sent.
    let (first_at, last_at) = (joined[0].0, joined[joined.len() - 1].0);
    assert!(
        last_at - first_at >= EVERY * 2,
        "the joiner got the rest only at the end: {:?}",
        joined.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one upstream call served both"
    );
}
