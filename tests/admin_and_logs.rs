//! Small operator-facing promises: admin HEAD and problem types, log number format, exit
//! codes.

use std::process::Command;

use dedupe_test_support::{GatewayConfig, GatewayProcess, Http, RouteCfg, TestGateway, Upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_head_requests_and_distinct_not_found_problems() {
    let upstream = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(upstream.url())
            .admin_with_token("s3cret")
            .route(RouteCfg::header("orders", "/orders")),
    )
    .await;
    let http = Http::new();
    let auth = [("Authorization", "Bearer s3cret")];
    let head = |path: &str, h: &'static [(&'static str, &'static str)]| {
        let http = http.clone();
        let url = gw.admin_url(path);
        async move { http.send("HEAD", &url, h, "").await.unwrap().status }
    };
    assert_eq!(head("/healthz", &[]).await, 200);
    assert_eq!(head("/readyz", &[]).await, 200);
    assert_eq!(head("/metrics", &[]).await, 401);
    assert_eq!(
        head("/metrics", &[("Authorization", "Bearer s3cret")]).await,
        200
    );

    let unknown_route = http.get(&gw.admin_url("/keys/nope/k1"), &auth).await;
    assert_eq!(unknown_route.status, 404);
    assert_eq!(
        unknown_route.problem_type(),
        "urn:dedupe-gateway:problem:unknown-route"
    );
    let missing = http.get(&gw.admin_url("/keys/orders/k1"), &auth).await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.problem_type(),
        "urn:dedupe-gateway:problem:record-not-found"
    );
    let deleted = http
        .send("DELETE", &gw.admin_url("/keys/orders/k1"), &auth, "")
        .await
        .unwrap();
    assert_eq!(
        deleted.problem_type(),
        "urn:dedupe-gateway:problem:record-not-found"
    );
    let endpoint = http.get(&gw.admin_url("/nothing"), &auth).await;
    assert_eq!(
        endpoint.problem_type(),
        "urn:dedupe-gateway:problem:not-found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_logs_round_milliseconds_and_carry_the_span_once() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(upstream.url()).route(RouteCfg::header("orders", "/orders")),
    );
    let http = Http::new();
    let r = http
        .post(&gw.url("/orders"), &[("Idempotency-Key", "k1")], "{}")
        .await;
    assert_eq!(r.status, 201);
    gw.wait_logged("request").await;
    let line = gw
        .logs
        .lock()
        .unwrap()
        .iter()
        .find(|l| l["target"] == "dedupe_gateway::access")
        .cloned()
        .expect("no access log line");
    for field in ["upstream_ms", "total_ms"] {
        let text = line[field].to_string();
        let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
        assert!(decimals <= 3, "{field} = {text}");
    }
    assert!(line.get("spans").is_none(), "{line}");
    assert_eq!(line["span"]["name"], "request", "{line}");
}

#[test]
fn a_taken_port_exits_69_and_says_so_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!("[server]\nlisten = \"{addr}\"\nupstream = \"http://127.0.0.1:9\"\n"),
    )
    .unwrap();
    for format in ["json", "text"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
            .args(["run", "--log-format", format, "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{stderr}");
        assert_eq!(
            stderr.matches("cannot listen on").count(),
            1,
            "{format}: {stderr}"
        );
    }
    let usage = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
        .args(["run", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(64));
}
