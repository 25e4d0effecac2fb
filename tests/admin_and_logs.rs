//! Small operator-facing promises: admin HEAD and problem types, the admin door beyond
//! loopback, log number format, exit codes.

use std::process::Command;
use std::time::{Duration, Instant};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_lines_keep_their_place_among_other_lines_and_turn_off_by_target() {
    let upstream = Upstream::start().await;
    let config = GatewayConfig::new(upstream.url()).route(RouteCfg::header("orders", "/orders"));
    let http = Http::new();
    for (rust_log, want) in [("info", 1), ("info,dedupe_gateway::access=warn", 0)] {
        let mut gw = GatewayProcess::start_with_env(&config, &[("RUST_LOG", rust_log)]);
        let r = http
            .post(&gw.url("/orders"), &[("Idempotency-Key", rust_log)], "{}")
            .await;
        assert_eq!(r.status, 201);
        // An access line waits for its batch; the drain's lines are written at once, after it.
        gw.signal("TERM");
        assert_eq!(gw.wait_exit(Duration::from_secs(10)), Some(0));
        gw.wait_logged("drained").await;
        let logs = gw.logs.lock().unwrap().clone();
        let at = |pred: &dyn Fn(&serde_json::Value) -> bool| logs.iter().position(pred);
        let access = at(&|l| l["target"] == "dedupe_gateway::access");
        let draining = at(&|l| l["message"] == "SIGTERM: draining").unwrap();
        assert_eq!(
            access.is_some() as usize,
            want,
            "RUST_LOG={rust_log}: {logs:#?}"
        );
        if let Some(access) = access {
            assert!(access < draining, "{logs:#?}");
            assert_eq!(logs[access]["key"], rust_log);
        }
    }
}

/// A child process killed when dropped, so a failed assertion leaves nothing running.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_access_lines_have_tracings_text_shape() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let config = GatewayConfig::new(upstream.url())
        .listen("127.0.0.1:0")
        .route(RouteCfg::header("orders", "/orders"));
    std::fs::write(&path, config.to_toml()).unwrap();
    let log = dir.path().join("gateway.log");
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
            .args(["run", "--log-format", "text", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = loop {
        let text = read();
        if let Some(addr) = text
            .lines()
            .find(|l| l.contains("public listener ready"))
            .and_then(|l| l.split("addr=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
        {
            break addr.to_owned();
        }
        assert!(Instant::now() < deadline, "never ready: {text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let r = Http::new()
        .post(
            &format!("http://{addr}/orders"),
            &[("Idempotency-Key", "t\"1")],
            "{}",
        )
        .await;
    assert_eq!(r.status, 201);
    let _ = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(status.code(), Some(0));
    let text = read();
    let line = text
        .lines()
        .find(|l| l.contains("dedupe_gateway::access"))
        .unwrap_or_else(|| panic!("no access line: {text}"));
    // `2026-11-30T18:36:27.509289Z  INFO request{...}: target: message fields`, as the
    // `tracing` lines beside it.
    let (stamp, rest) = line.split_once("  ").unwrap();
    assert!(stamp.len() == 27 && stamp.ends_with('Z'), "{line}");
    assert!(
        rest.starts_with(
            "INFO request{method=POST path=/orders}: dedupe_gateway::access: request \
             route=\"orders\" outcome=\"won\" finish=\"completed\" status=201 fence="
        ),
        "{line}"
    );
    assert!(rest.contains(r#" key="t\"1" scope="-""#), "{line}");
    let ready = text
        .lines()
        .find(|l| l.contains("public listener ready"))
        .unwrap();
    assert!(
        ready.starts_with(&stamp[..11])
            && ready[27..].starts_with("  INFO dedupe_gateway::edge::server: "),
        "{ready}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_inside_a_request_carry_its_span_when_asked_for() {
    // Nothing listens on port 9: every request is a 502 with a warning logged inside it.
    let config = GatewayConfig::new("http://127.0.0.1:9");
    let http = Http::new();
    for (rust_log, spanned) in [("info", false), ("info,dedupe_gateway::edge=debug", true)] {
        let gw = GatewayProcess::start_with_env(&config, &[("RUST_LOG", rust_log)]);
        let r = http.get(&gw.url("/where"), &[]).await;
        assert_eq!(r.status, 502);
        gw.wait_logged("upstream request failed").await;
        let logs = gw.logs.lock().unwrap().clone();
        let warned = logs
            .iter()
            .find(|l| l["message"] == "upstream request failed")
            .unwrap();
        assert_eq!(warned["route"], "-", "{warned}");
        if spanned {
            assert_eq!(warned["span"]["path"], "/where", "{warned}");
        } else {
            assert!(warned.get("span").is_none(), "{warned}");
        }
    }
}

#[test]
fn an_admin_port_beyond_loopback_without_a_token_refuses_to_start() {
    let config = GatewayConfig::new("http://127.0.0.1:9").admin_listen("0.0.0.0:9901");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config.to_toml()).unwrap();
    for command in ["run", "check"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
            .args([command, "--config"])
            .arg(&path)
            .env_remove("DEDUPE_ADMIN_TOKEN")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command}: {stderr}");
        assert!(
            stderr.contains(
                "admin.token: required: admin.listen 0.0.0.0:9901 is not a loopback address"
            ),
            "{command}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_port_allowed_without_a_token_starts_and_warns() {
    let upstream = Upstream::start().await;
    let config = GatewayConfig::new(upstream.url())
        .admin_listen("0.0.0.0:0")
        .admin_allow_unauthenticated(true);
    let gw = GatewayProcess::start(&config);
    gw.wait_logged("admin.allow_unauthenticated = true").await;
    let warned = gw.logs.lock().unwrap().iter().any(|l| {
        l["level"] == "WARN"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("needs no token"))
    });
    assert!(warned);
    let metrics = Http::new().get(&gw.admin_url("/metrics"), &[]).await;
    assert_eq!(metrics.status, 200);
    // check says so too.
    let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
        .args(["check", "--config"])
        .arg(&gw.config_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("warning: admin.allow_unauthenticated = true"),
        "{stdout}"
    );
}
