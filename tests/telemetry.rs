//! Traces (`[telemetry]`): the real binary exports to an OTLP/HTTP receiver that decodes
//! what it gets; the counting upstream shows the `traceparent` it was sent.

use std::process::Command;
use std::time::{Duration, Instant};

use dedupe_test_support::{
    GatewayConfig, GatewayProcess, Http, OtlpReceiver, ReceivedSpan, RouteCfg, Upstream,
};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";
const SECRET: &str = "Bearer tok-7f3a-not-for-traces";

/// Stops the gateway with SIGTERM and waits for it to exit: the exporter sends what is
/// still queued on the way out.
async fn stop(gw: &mut GatewayProcess) {
    gw.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    while gw.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "gateway did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every attribute a span of the gateway carries, with its type: OpenTelemetry's semantic
/// conventions for HTTP spans (`http.request.method` and `url.path` strings,
/// `http.response.status_code` an int: a query like `>= 500` reads it only as one), the
/// gateway's own `dedupe.*` (the fence a number, the rest text). `tracing-opentelemetry`'s
/// `busy_ns` and `idle_ns` are off (`with_tracked_inactivity(false)`).
const ATTRIBUTE_TYPES: &[(&str, &str)] = &[
    ("http.request.method", "string"),
    ("url.path", "string"),
    ("http.response.status_code", "int"),
    ("dedupe.route", "string"),
    ("dedupe.outcome", "string"),
    ("dedupe.finish", "string"),
    ("dedupe.fence", "int"),
    ("dedupe.key", "string"),
    ("dedupe.scope", "string"),
];

/// Every attribute of every span is one [`ATTRIBUTE_TYPES`] names (a new one is given its
/// type there), of that type.
fn assert_attribute_types(spans: &[ReceivedSpan]) {
    assert!(!spans.is_empty());
    for span in spans {
        for (name, kind) in &span.types {
            let want = ATTRIBUTE_TYPES
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{}: {name} has no type in ATTRIBUTE_TYPES", span.name))
                .1;
            assert_eq!(
                *kind, want,
                "{}: {name} = {:?}",
                span.name, span.attributes[name]
            );
        }
    }
}

/// The first log line that `matches`, waiting for the harness to read it.
async fn logged(
    gw: &GatewayProcess,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let find = || gw.logs.lock().unwrap().iter().find(|l| matches(l)).cloned();
    let found = dedupe_test_support::eventually(Duration::from_secs(10), || {
        let seen = find().is_some();
        async move { seen }
    })
    .await;
    let logs = gw.logs.lock().unwrap().clone();
    assert!(found, "no such log line: {logs:#?}");
    find().unwrap()
}

fn traced_gateway(
    upstream: &Upstream,
    receiver: &OtlpReceiver,
    env: &[(&str, &str)],
) -> GatewayProcess {
    GatewayProcess::start_with_env(
        &GatewayConfig::new(upstream.url())
            .telemetry(&receiver.url(), Some("edge-under-test"))
            .route(RouteCfg::header("orders", "/orders").scope(&["header:Authorization"])),
        env,
    )
}

fn children_of<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    let mut children: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect();
    children.sort_by(|a, b| a.name.cmp(&b.name));
    children
}

fn root<'a>(spans: &'a [ReceivedSpan], outcome: &str) -> &'a ReceivedSpan {
    let roots: Vec<_> = spans
        .iter()
        .filter(|s| s.kind == "SPAN_KIND_SERVER" && s.attr("dedupe.outcome") == Some(outcome))
        .collect();
    assert_eq!(roots.len(), 1, "one {outcome} request span: {spans:#?}");
    roots[0]
}

fn names(spans: &[&ReceivedSpan]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

/// The `traceparent` the upstream received on its `n`th request.
fn sent_traceparent(upstream: &Upstream, n: usize) -> String {
    let seen = upstream.seen();
    let header = seen[n].headers.get("traceparent").expect("a traceparent");
    header.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduped_request_is_traced_under_the_callers_trace_and_forwards_it() {
    let upstream = Upstream::start().await;
    let receiver = OtlpReceiver::start().await;
    let mut gw = traced_gateway(&upstream, &receiver, &[]);
    let http = Http::new();
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let headers = [
        ("Idempotency-Key", "order-1"),
        ("Authorization", SECRET),
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=abc"),
    ];
    let first = http.post(&gw.url("/orders"), &headers, "{}").await;
    assert_eq!(first.status, 201);
    stop(&mut gw).await;
    assert!(receiver.refused().is_empty(), "{:?}", receiver.refused());

    let spans = receiver.spans();
    let request = root(&spans, "won");
    assert_eq!(request.trace_id, TRACE, "joined to the caller's trace");
    assert_eq!(
        request.parent_span_id, CALLER,
        "the caller's span is the parent"
    );
    assert_eq!(request.name, "POST orders");
    assert_eq!(request.service, "edge-under-test");
    assert_eq!(request.attr("dedupe.route"), Some("orders"));
    assert_eq!(request.attr("dedupe.finish"), Some("completed"));
    assert_eq!(request.attr("http.response.status_code"), Some("201"));
    let fence = upstream.seen()[0].fence().expect("a fence");
    assert_eq!(
        request.attr("dedupe.fence"),
        Some(fence.to_string().as_str())
    );
    // The scope's hash, as the access line and the upstream's Idempotency-Scope show it.
    let scope = upstream.seen()[0].headers["idempotency-scope"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        scope.len() == 32 && scope.bytes().all(|b| b.is_ascii_hexdigit()),
        "a hash, not the input: {scope}"
    );
    assert_eq!(request.attr("dedupe.scope"), Some(scope.as_str()));
    // The access line, once the harness has read it from the exited process's stderr.
    let access = logged(&gw, |l| l["key"] == "order-1").await;
    assert_eq!(access["scope"], scope.as_str());
    assert_eq!(request.attr("dedupe.key"), Some("order-1"));

    let children = children_of(&spans, request);
    assert_eq!(names(&children), ["claim", "completion", "upstream"]);
    let call = children[2];
    assert_eq!(call.kind, "SPAN_KIND_CLIENT");
    assert_eq!(call.attr("http.response.status_code"), Some("201"));
    // The upstream joins the same trace, under the gateway's upstream-call span.
    assert_eq!(
        sent_traceparent(&upstream, 0),
        format!("00-{TRACE}-{}-01", call.span_id)
    );
    assert_eq!(upstream.seen()[0].headers["tracestate"], "vendor=abc");
    // Each attribute of the conventions' type: the status an int, on both spans.
    assert_eq!(request.types["http.response.status_code"], "int");
    assert_eq!(call.types["http.response.status_code"], "int");
    assert_attribute_types(&spans);
    // Never a scope input: no attribute carries the Authorization value or its name.
    for span in &spans {
        for (name, value) in &span.attributes {
            assert!(
                !value.contains("tok-7f3a"),
                "{}: {name} = {value}",
                span.name
            );
            assert!(!name.to_ascii_lowercase().contains("authorization"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_a_request_span_with_no_upstream_call_and_passthrough_is_traced() {
    let upstream = Upstream::start().await;
    let receiver = OtlpReceiver::start().await;
    // With the log's own request span on (at debug), between the trace spans.
    let debug = [("RUST_LOG", "info,dedupe_gateway::edge=debug")];
    let mut gw = traced_gateway(&upstream, &receiver, &debug);
    let http = Http::new();
    let key = [("Idempotency-Key", "order-2"), ("Authorization", SECRET)];
    assert_eq!(http.post(&gw.url("/orders"), &key, "{}").await.status, 201);
    let replayed = http.post(&gw.url("/orders"), &key, "{}").await;
    assert!(replayed.replayed());
    // No route: streamed, and traced the same way (here without a caller's trace).
    assert_eq!(http.get(&gw.url("/health"), &[]).await.status, 201);
    stop(&mut gw).await;
    assert_eq!(upstream.effects(), 2);

    let spans = receiver.spans();
    let replay = root(&spans, "replayed");
    assert_eq!(replay.parent_span_id, "", "no caller's trace: a root");
    assert_eq!(names(&children_of(&spans, replay)), ["claim"]);
    let won = root(&spans, "won");
    assert_ne!(won.trace_id, replay.trace_id, "two requests, two traces");

    let passthrough = root(&spans, "passthrough");
    let children = children_of(&spans, passthrough);
    assert_eq!(names(&children), ["upstream"]);
    assert_eq!(children[0].types["http.response.status_code"], "int");
    assert_attribute_types(&spans);
    let get = upstream
        .seen()
        .into_iter()
        .position(|s| s.path == "/health")
        .unwrap();
    assert_eq!(
        sent_traceparent(&upstream, get),
        format!("00-{}-{}-01", passthrough.trace_id, children[0].span_id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_telemetry_nothing_is_exported_and_traceparent_passes_unchanged() {
    let upstream = Upstream::start().await;
    let receiver = OtlpReceiver::start().await;
    // The SDK's own variable names the receiver: still nothing without `[telemetry]`.
    let mut gw = GatewayProcess::start_with_env(
        &GatewayConfig::new(upstream.url()).route(RouteCfg::header("orders", "/orders")),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url())],
    );
    let http = Http::new();
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let headers = [
        ("Idempotency-Key", "order-3"),
        ("traceparent", traceparent.as_str()),
    ];
    assert_eq!(
        http.post(&gw.url("/orders"), &headers, "{}").await.status,
        201
    );
    let passthrough = [("traceparent", traceparent.as_str()), ("tracestate", "v=1")];
    assert_eq!(http.get(&gw.url("/health"), &passthrough).await.status, 201);
    stop(&mut gw).await;
    assert_eq!(sent_traceparent(&upstream, 0), traceparent);
    assert_eq!(sent_traceparent(&upstream, 1), traceparent);
    assert_eq!(upstream.seen()[1].headers["tracestate"], "v=1");
    assert_eq!(receiver.posts(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_ratio_zero_exports_only_what_a_caller_sampled() {
    let upstream = Upstream::start().await;
    let receiver = OtlpReceiver::start().await;
    let mut gw = GatewayProcess::start(
        &GatewayConfig::new(upstream.url())
            .telemetry(&receiver.url(), None)
            .telemetry_sample_ratio(0.0)
            .route(RouteCfg::header("orders", "/orders")),
    );
    let http = Http::new();
    // Begun here: not sampled, and the upstream is told so.
    let own = [("Idempotency-Key", "order-5")];
    assert_eq!(http.post(&gw.url("/orders"), &own, "{}").await.status, 201);
    // The caller sampled its trace: exported all the same.
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let sampled = [
        ("Idempotency-Key", "order-6"),
        ("traceparent", &traceparent),
    ];
    assert_eq!(
        http.post(&gw.url("/orders"), &sampled, "{}").await.status,
        201
    );
    stop(&mut gw).await;
    let unsampled = sent_traceparent(&upstream, 0);
    assert!(unsampled.ends_with("-00"), "{unsampled}");
    assert!(!unsampled.contains(TRACE));
    let spans = receiver.spans();
    let request = root(&spans, "won");
    assert_eq!(request.trace_id, TRACE);
    assert!(spans.iter().all(|s| s.trace_id == TRACE), "{spans:#?}");
    assert_eq!(
        names(&children_of(&spans, request)),
        ["claim", "completion", "upstream"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_no_request_and_is_logged() {
    let upstream = Upstream::start().await;
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut gw = GatewayProcess::start(
        &GatewayConfig::new(upstream.url())
            .telemetry(&endpoint, None)
            .route(RouteCfg::header("orders", "/orders")),
    );
    let http = Http::new();
    let key = [("Idempotency-Key", "order-4")];
    assert_eq!(http.post(&gw.url("/orders"), &key, "{}").await.status, 201);
    assert!(http.post(&gw.url("/orders"), &key, "{}").await.replayed());
    stop(&mut gw).await;
    assert_eq!(gw.child.try_wait().unwrap().and_then(|s| s.code()), Some(0));
    let export = logged(&gw, |l| {
        l.to_string().contains("Export") && l["level"] != "INFO"
    })
    .await;
    assert!(
        ["WARN", "ERROR"].contains(&export["level"].as_str().unwrap()),
        "{export}"
    );
}

#[test]
fn check_says_where_traces_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let config = GatewayConfig::new("http://127.0.0.1:9").telemetry("http://collector:4318", None);
    std::fs::write(&path, config.to_toml()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("traces exported to http://collector:4318/v1/traces (OTLP/HTTP) as service dedupe-gateway"),
        "{stdout}"
    );
}

#[test]
fn a_bad_endpoint_is_refused_at_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let config = GatewayConfig::new("http://127.0.0.1:9").telemetry("grpc://collector:4317", None);
    std::fs::write(&path, config.to_toml()).unwrap();
    for command in ["run", "check"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
            .args([command, "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("telemetry.otlp_endpoint"),
            "{command}: {stderr}"
        );
    }
}
