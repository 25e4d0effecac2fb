//! gRPC through the gateway (#28), with real gRPC on both sides: a `grpcio` server that
//! counts executions and `grpcio` clients. Unary and server-streaming calls on
//! `grpc = true` routes execute once and replay with their status, message and trailers;
//! the gateway's own answers are gRPC statuses; an unrouted bidi stream passes through.

use dedupe_test_support::grpc::metadata;
use std::time::Duration;

use dedupe_test_support::fault_proxy::FaultProxy;
use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, GrpcCall, GrpcServer, RouteCfg, TestGateway,
};
use serde_json::Value;

const CREATE: &str = "/test.Payments/Create";
const LIST: &str = "/test.Payments/List";
const CHAT: &str = "/test.Payments/Chat";

/// The server, and a gateway in front of it deduping Create and List (Chat is unrouted).
async fn setup() -> (GrpcServer, TestGateway) {
    let server = GrpcServer::start().await;
    let config = GatewayConfig::new(server.url())
        .route(RouteCfg::grpc("create", CREATE))
        .route(RouteCfg::grpc("list", LIST));
    let gateway = TestGateway::start(&config).await;
    (server, gateway)
}

fn target(gw: &TestGateway) -> String {
    gw.addr.to_string()
}

fn replayed(seen: &Value) -> bool {
    // A trailers-only answer's head reaches the client as trailing metadata.
    metadata(&seen["initial_metadata"], "idempotent-replayed") == Some("true")
        || metadata(&seen["trailing_metadata"], "idempotent-replayed") == Some("true")
}

/// `again` is a replay of `first`: the same messages, the server's trailer, marked replayed.
fn assert_replays(first: &Value, again: &Value) {
    assert_eq!(again["responses"], first["responses"], "{again}");
    assert_eq!(
        metadata(&again["trailing_metadata"], "x-test-trailer"),
        Some("t1"),
        "{again}"
    );
    assert!(replayed(again), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_call_retried_with_its_key_executes_once_and_replays_message_status_and_trailers() {
    let (server, gw) = setup().await;
    let call = GrpcCall::unary(CREATE, "pay 10").key("u-1");
    let first = call.send(&target(&gw)).await;
    assert_eq!(first["code"], "OK", "{first}");
    assert_eq!(first["responses"][0], "created 1: pay 10", "{first}");
    assert!(!replayed(&first), "{first}");
    let again = call.send(&target(&gw)).await;
    assert_eq!(again["code"], "OK", "{again}");
    assert_replays(&first, &again);
    assert_eq!(server.executions("Create").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_is_replayed_with_its_status_and_message() {
    let (server, gw) = setup().await;
    let call = GrpcCall::unary(CREATE, "pay -1")
        .key("e-1")
        .metadata("x-test-status", "INVALID_ARGUMENT");
    let first = call.send(&target(&gw)).await;
    assert_eq!(first["code"], "INVALID_ARGUMENT", "{first}");
    assert_eq!(
        first["details"], "server says INVALID_ARGUMENT #1",
        "{first}"
    );
    let again = call.send(&target(&gw)).await;
    assert_eq!(again["code"], "INVALID_ARGUMENT", "{again}");
    assert_eq!(again["details"], first["details"], "{again}");
    assert!(replayed(&again), "{again}");
    assert_eq!(server.executions("Create").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_releases_the_key_and_the_next_call_executes() {
    let (server, gw) = setup().await;
    let failing = GrpcCall::unary(CREATE, "pay 5")
        .key("r-1")
        .metadata("x-test-status", "UNAVAILABLE");
    let first = failing.send(&target(&gw)).await;
    assert_eq!(first["code"], "UNAVAILABLE", "{first}");
    let retry = GrpcCall::unary(CREATE, "pay 5").key("r-1");
    let second = retry.send(&target(&gw)).await;
    assert_eq!(second["code"], "OK", "{second}");
    assert_eq!(second["responses"][0], "created 2: pay 5", "{second}");
    assert!(!replayed(&second), "{second}");
    assert_eq!(server.executions("Create").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_execute_once_and_the_others_are_aborted_with_a_retry_hint() {
    let (server, gw) = setup().await;
    let call = GrpcCall::unary(CREATE, "pay 7")
        .key("c-1")
        .metadata("x-test-delay-ms", "2000");
    let t = target(&gw);
    let seen = futures_all(4, || call.send(&t)).await;
    let ok: Vec<&Value> = seen.iter().filter(|s| s["code"] == "OK").collect();
    let aborted: Vec<&Value> = seen.iter().filter(|s| s["code"] == "ABORTED").collect();
    assert_eq!(ok.len() + aborted.len(), 4, "{seen:?}");
    assert!(!aborted.is_empty(), "{seen:?}");
    for a in &aborted {
        let details = a["details"].as_str().unwrap();
        assert!(details.contains("in flight"), "{a}");
        assert!(
            metadata(&a["trailing_metadata"], "retry-after").is_some(),
            "{a}"
        );
        assert!(
            metadata(&a["trailing_metadata"], "grpc-retry-pushback-ms").is_some(),
            "{a}"
        );
    }
    for o in &ok {
        assert_eq!(o["responses"][0], "created 1: pay 7", "{o}");
    }
    assert_eq!(server.executions("Create").await, 1);
}

/// Runs `n` calls at once.
async fn futures_all<F, Fut>(n: usize, mut make: F) -> Vec<Value>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let mut set = Vec::new();
    for _ in 0..n {
        set.push(make());
    }
    futures_join(set).await
}

async fn futures_join<Fut: std::future::Future<Output = Value>>(futs: Vec<Fut>) -> Vec<Value> {
    let mut pinned: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut results = vec![Value::Null; pinned.len()];
    let mut done = vec![false; pinned.len()];
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (i, f) in pinned.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            match f.as_mut().poll(cx) {
                std::task::Poll::Ready(v) => {
                    results[i] = v;
                    done[i] = true;
                }
                std::task::Poll::Pending => all = false,
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_message_under_the_same_key_fails_its_precondition() {
    let (server, gw) = setup().await;
    let first = GrpcCall::unary(CREATE, "pay 10").key("m-1");
    assert_eq!(first.send(&target(&gw)).await["code"], "OK");
    let other = GrpcCall::unary(CREATE, "pay 99").key("m-1");
    let seen = other.send(&target(&gw)).await;
    assert_eq!(seen["code"], "FAILED_PRECONDITION", "{seen}");
    assert!(
        seen["details"].as_str().unwrap().contains("reused"),
        "{seen}"
    );
    assert_eq!(server.executions("Create").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_s_own_refusals_are_invalid_argument() {
    let (server, gw) = setup().await;
    let keyless = GrpcCall::unary(CREATE, "pay 1").send(&target(&gw)).await;
    assert_eq!(keyless["code"], "INVALID_ARGUMENT", "{keyless}");
    assert!(
        keyless["details"]
            .as_str()
            .unwrap()
            .contains("idempotency-key"),
        "{keyless}"
    );
    // A streaming client on a deduped method: two messages, refused loudly.
    let streamed = GrpcCall::bidi(CREATE, &["a", "b"])
        .key("s-1")
        .send(&target(&gw))
        .await;
    assert_eq!(streamed["code"], "INVALID_ARGUMENT", "{streamed}");
    assert!(
        streamed["details"]
            .as_str()
            .unwrap()
            .contains("exactly one"),
        "{streamed}"
    );
    assert_eq!(server.executions("Create").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_streaming_call_is_deduped_and_replayed_message_by_message() {
    let (server, gw) = setup().await;
    let call = GrpcCall::server_streaming(LIST, "orders").key("l-1");
    let first = call.send(&target(&gw)).await;
    assert_eq!(first["code"], "OK", "{first}");
    let items: Vec<String> = (0..3).map(|i| format!("item {i} of orders #1")).collect();
    assert_eq!(first["responses"], serde_json::json!(items), "{first}");
    let again = call.send(&target(&gw)).await;
    assert_eq!(again["code"], "OK", "{again}");
    assert_eq!(again["responses"], first["responses"], "{again}");
    assert!(replayed(&again), "{again}");
    assert_eq!(server.executions("List").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bidi_stream_on_no_route_passes_through_untouched() {
    let (server, gw) = setup().await;
    let call = GrpcCall::bidi(CHAT, &["a", "b", "c"]).key("b-1");
    for n in 1..=2 {
        let seen = call.send(&target(&gw)).await;
        assert_eq!(seen["code"], "OK", "{seen}");
        assert_eq!(
            seen["responses"],
            serde_json::json!(["echo a", "echo b", "echo c"]),
            "{seen}"
        );
        assert_eq!(
            metadata(&seen["trailing_metadata"], "x-chat"),
            Some("done"),
            "{seen}"
        );
        assert!(!replayed(&seen), "{seen}");
        assert_eq!(server.executions("Chat").await, n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_s_own_retry_policy_ends_with_one_execution() {
    let (server, gw) = setup().await;
    let slow = GrpcCall::unary(CREATE, "pay 3")
        .key("p-1")
        .metadata("x-test-delay-ms", "2500");
    let t = target(&gw);
    let first = tokio::spawn({
        let (slow, t) = (slow.clone(), t.clone());
        async move { slow.send(&t).await }
    });
    // The first call is executing: the retrying client meets its key in flight (ABORTED,
    // with a pushback), retries by its service config and ends with the replay.
    let executing = eventually(Duration::from_secs(10), || async {
        server.executions("Create").await == 1
    })
    .await;
    assert!(executing);
    let retrying = slow.clone().retrying().send(&t).await;
    assert_eq!(retrying["code"], "OK", "{retrying}");
    assert_eq!(retrying["responses"][0], "created 1: pay 3", "{retrying}");
    assert!(replayed(&retrying), "{retrying}");
    let first = first.await.unwrap();
    assert_eq!(first["responses"][0], "created 1: pay 3", "{first}");
    assert_eq!(server.executions("Create").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_trailers_on_a_plain_route_are_stored_and_replayed() {
    let server = GrpcServer::start().await;
    // Not `grpc = true`: an HTTP route whose answers happen to end in trailers.
    let plain = RouteCfg::header("plain", CREATE).key_header("idempotency-key");
    let gw = TestGateway::start(&GatewayConfig::new(server.url()).route(plain)).await;
    let call = GrpcCall::unary(CREATE, "pay 4").key("h-1");
    let first = call.send(&target(&gw)).await;
    assert_eq!(first["code"], "OK", "{first}");
    let again = call.send(&target(&gw)).await;
    assert_replays(&first, &again);
    assert_eq!(server.executions("Create").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_exceeded_keeps_the_claim_and_an_unreachable_upstream_is_unavailable() {
    let (server, gw) = setup().await;
    let call = GrpcCall::unary(CREATE, "pay 8")
        .key("d-1")
        .metadata("x-test-status", "DEADLINE_EXCEEDED");
    let first = call.send(&target(&gw)).await;
    assert_eq!(first["code"], "DEADLINE_EXCEEDED", "{first}");
    // The outcome is unknown: the claim stays for its lease, and a retry is aborted.
    let retry = GrpcCall::unary(CREATE, "pay 8").key("d-1");
    let seen = retry.send(&target(&gw)).await;
    assert_eq!(seen["code"], "ABORTED", "{seen}");
    assert_eq!(server.executions("Create").await, 1);
    // No upstream at all: nothing was sent, UNAVAILABLE.
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", socket.local_addr().unwrap());
    drop(socket);
    let gw =
        TestGateway::start(&GatewayConfig::new(dead).route(RouteCfg::grpc("create", CREATE))).await;
    let seen = GrpcCall::unary(CREATE, "pay 9")
        .key("d-2")
        .send(&target(&gw))
        .await;
    assert_eq!(seen["code"], "UNAVAILABLE", "{seen}");
    assert!(
        seen["details"]
            .as_str()
            .unwrap()
            .contains("upstream-unreachable"),
        "{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_max_cached_body_is_streamed_once_and_then_refused_as_not_stored() {
    let server = GrpcServer::start().await;
    let list = RouteCfg::grpc("list", LIST).max_cached_body("20");
    let gw = TestGateway::start(&GatewayConfig::new(server.url()).route(list)).await;
    let call = GrpcCall::server_streaming(LIST, "orders").key("big-1");
    let first = call.send(&target(&gw)).await;
    // The first caller gets every message and the status, streamed.
    assert_eq!(first["code"], "OK", "{first}");
    assert_eq!(first["responses"].as_array().unwrap().len(), 3, "{first}");
    let again = call.send(&target(&gw)).await;
    assert_eq!(again["code"], "ALREADY_EXISTS", "{again}");
    assert!(
        again["details"]
            .as_str()
            .unwrap()
            .contains("response-not-stored"),
        "{again}"
    );
    assert_eq!(server.executions("List").await, 1);
}

/// On connection workers each worker has its own h2c client: calls served on two workers
/// reach the server over two HTTP/2 connections, one per worker, each reused by its
/// worker's later calls. Counted by a TCP proxy in front of the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_calls_the_server_over_its_own_h2c_connection() {
    const WORKERS: usize = 2;
    let server = GrpcServer::start().await;
    let proxy = FaultProxy::start(server.addr.parse().unwrap()).await;
    let config = GatewayConfig::new(format!("http://{}", proxy.addr))
        .workers(WORKERS)
        .route(RouteCfg::grpc("create", CREATE));
    let gw = GatewayProcess::start(&config);
    // Each call is a client of its own: a new connection, dealt to the workers in turn.
    for i in 0..2 * WORKERS {
        let seen = GrpcCall::unary(CREATE, "pay")
            .key(&format!("w-{i}"))
            .send(&gw.addr.to_string())
            .await;
        assert_eq!(seen["code"], "OK", "{seen}");
    }
    assert_eq!(server.executions("Create").await, 2 * WORKERS as u64);
    assert_eq!(
        proxy.accepted(),
        WORKERS as u64,
        "one h2c connection per worker"
    );
}

/// A client deadline shorter than the call (#54): the caller gives up with
/// `DEADLINE_EXCEEDED`, but the winner's call runs to its end under the gateway's own
/// `grpc-timeout` (what is left of `server.upstream_timeout`, not the caller's 0.5 s), so
/// its answer is stored and the retry replays it: one execution. (Had the upstream given
/// up with the caller, the claim would be kept unknown: retries `ABORTED` for the 3 s lease,
/// then a takeover executing again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_deadline_shorter_than_the_call_still_executes_once_and_the_retry_replays() {
    let server = GrpcServer::start().await;
    let create = RouteCfg::grpc("create", CREATE).lease("3s");
    let gw = TestGateway::start(&GatewayConfig::new(server.url()).route(create)).await;
    let slow = GrpcCall::unary(CREATE, "pay 12")
        .key("t-1")
        .metadata("x-test-delay-ms", "1500");
    let first = slow.clone().deadline(0.5).send(&target(&gw)).await;
    assert_eq!(first["code"], "DEADLINE_EXCEEDED", "{first}");
    // The handler has finished, and the gateway has stored its answer, once the retry
    // finds the key settled rather than in flight.
    let settled = eventually(Duration::from_secs(10), || async {
        let seen = GrpcCall::unary(CREATE, "pay 12")
            .key("t-1")
            .send(&target(&gw))
            .await;
        seen["code"] != "ABORTED"
    })
    .await;
    assert!(settled, "the key stayed in flight");
    let again = GrpcCall::unary(CREATE, "pay 12")
        .key("t-1")
        .send(&target(&gw))
        .await;
    assert_eq!(again["code"], "OK", "{again}");
    assert_eq!(again["responses"][0], "created 1: pay 12", "{again}");
    assert!(replayed(&again), "{again}");
    assert_eq!(server.executions("Create").await, 1);
}
