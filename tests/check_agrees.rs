//! `check --request` tells what the gateway does: a table of requests over every kind of
//! route goes once through the real binary's `check --request` and once through a running
//! gateway (raw bytes on a socket, so every path spelling arrives as written), and the
//! predicted answer must be the real one: the status and problem type, whether the request
//! reached the upstream, and whether it went there under a claim.

use std::process::Command;

use dedupe_test_support::{GatewayConfig, RouteCfg, StoreCfg, TestGateway, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request of the table: request line, headers, body.
struct Row {
    line: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
}

const fn row(
    line: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
) -> Row {
    Row {
        line,
        headers,
        body,
    }
}

/// What happened to a request, or what `check --request` says will.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// Answered by the gateway with this status and problem type; never forwarded.
    Answered(u16, String),
    /// Forwarded under a claim (the upstream saw `Idempotency-Fence`).
    Claimed,
    /// Forwarded without a claim.
    Forwarded,
}

const KEY: &str = "Idempotency-Key";

/// Every route kind, each request on fresh keys (no row repeats another's key or body).
const TABLE: &[Row] = &[
    // A required header key: present, missing, quoted, invalid, over-long, duplicated.
    row("POST /orders/1", &[(KEY, "k-plain")], "{}"),
    row("POST /orders/2", &[], "{}"),
    row("POST /orders/3", &[(KEY, "\"k-quoted\"")], "{}"),
    row("POST /orders/4", &[(KEY, "\"k-bad")], "{}"),
    row("POST /orders/5", &[(KEY, "has space")], "{}"),
    row("POST /orders/6", &[(KEY, "a"), (KEY, "b")], "{}"),
    row("POST /orders/7", &[(KEY, "\"\"")], "{}"),
    // Path spellings that normalise onto the route, and ones refused.
    row("POST //orders/%38", &[(KEY, "k-norm-1")], "{}"),
    row("POST /x/../orders/9", &[(KEY, "k-norm-2")], "{}"),
    row("POST /orders/a%2Fb", &[(KEY, "k-slash")], "{}"),
    row("POST /orders/%zz", &[(KEY, "k-esc")], "{}"),
    row("GET /orders/10", &[(KEY, "k-get")], ""),
    // An optional header key: absent is forwarded without dedupe.
    row("POST /optional/1", &[], "{}"),
    row("POST /optional/2", &[(KEY, "k-opt")], "{}"),
    // A fingerprint of JSON parts: present, missing, not JSON, a duplicated JSON key.
    row("POST /fp/1", &[], r#"{"id":"fp-1","amount":1}"#),
    row("POST /fp/2", &[], r#"{"amount":2}"#),
    row("POST /fp/3", &[], "not json"),
    row("POST /fp/4", &[], r#"{"id":"fp-4","id":"fp-5"}"#),
    row("POST /fp/5", &[], ""),
    // An ordered route: good, version not a number, entity missing.
    row(
        "POST /ordered/1",
        &[(KEY, "k-ord-1")],
        r#"{"id":"e1","v":1}"#,
    ),
    row(
        "POST /ordered/2",
        &[(KEY, "k-ord-2")],
        r#"{"id":"e2","v":"x"}"#,
    ),
    row("POST /ordered/3", &[(KEY, "k-ord-3")], r#"{"v":3}"#),
    row("POST /ordered/4", &[], r#"{"id":"e4","v":4}"#),
    // A shadow route with order: what would be refused is forwarded.
    row("POST /shadow/1", &[(KEY, "k-sh-1")], r#"{"id":"s1","v":1}"#),
    row(
        "POST /shadow/2",
        &[(KEY, "k-sh-2")],
        r#"{"id":"s2","v":"x"}"#,
    ),
    row("POST /shadow/3", &[(KEY, "k-sh-3")], r#"{"v":3}"#),
    row("POST /shadow/4", &[], r#"{"id":"s4","v":4}"#),
    row("POST /shadow/5", &[(KEY, "k-sh 5")], r#"{"id":"s5","v":5}"#),
    // A route that is off, and no route at all.
    row("POST /off/1", &[(KEY, "k-off")], "{}"),
    row("POST /off/2", &[], "{}"),
    row("POST /elsewhere", &[(KEY, "k-else")], "{}"),
    row("POST /elsewhere/%zz", &[], "{}"),
];

fn config(up: &Upstream) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .route(RouteCfg::header("orders", "/orders/**"))
        .route(RouteCfg::header("optional", "/optional/**").required(false))
        .route(RouteCfg::fingerprint("fp", "/fp/**", &["json:/id"]))
        .route(RouteCfg::header("ordered", "/ordered/**").order("json:/id", "json:/v", "integer"))
        .route(
            RouteCfg::header("shadow", "/shadow/**")
                .mode("shadow")
                .order("json:/id", "json:/v", "integer"),
        )
        .route(RouteCfg::header("off", "/off/**").mode("off"))
}

/// What `check --request` predicts for `r`.
fn predicted(config_path: &std::path::Path, r: &Row) -> Fate {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"));
    cmd.arg("check")
        .arg("--config")
        .arg(config_path)
        .args(["--request", r.line]);
    for (name, value) in r.headers {
        cmd.args(["-H", &format!("{name}: {value}")]);
    }
    // Always derive (the gateway always does): a body, even an empty one.
    cmd.args(["--body", r.body]);
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}: {text}", r.line);
    let answer = text
        .lines()
        .find_map(|l| l.strip_prefix("answer: "))
        .unwrap_or_else(|| panic!("{}: no answer line in\n{text}", r.line));
    if answer.starts_with("claimed") {
        Fate::Claimed
    } else if answer.starts_with("forwarded") || answer.starts_with("no key: forwarded") {
        Fate::Forwarded
    } else {
        let mut words = answer.split([' ', ':']).filter(|w| !w.is_empty());
        let status: u16 = words.next().unwrap().parse().unwrap();
        let problem = answer.rsplit_once(":problem:").map_or("", |(_, p)| p);
        Fate::Answered(status, problem.split([':', ' ']).next().unwrap().to_owned())
    }
}

/// What the gateway does with `r`: its status and problem type, and what the upstream saw.
async fn observed(gw: &TestGateway, up: &Upstream, r: &Row) -> Fate {
    let before = up.seen().len();
    let (method, target) = r.line.split_once(' ').unwrap();
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n");
    for (name, value) in r.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\n\r\n{}",
        r.body.len(),
        r.body
    ));
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{}: no status in {text:?}", r.line));
    let seen = up.seen();
    match seen.get(before) {
        Some(s) if s.fence().is_some() => Fate::Claimed,
        Some(_) => Fate::Forwarded,
        None => {
            let problem = text
                .split("urn:dedupe-gateway:problem:")
                .nth(1)
                .map(|p| p.split('"').next().unwrap().to_owned())
                .unwrap_or_default();
            Fate::Answered(status, problem)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_request_predicts_what_the_gateway_does_on_every_row() {
    let up = Upstream::start().await;
    let config = config(&up);
    let gw = TestGateway::start(&config).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config.to_toml()).unwrap();

    let mut differ = Vec::new();
    for r in TABLE {
        let want = predicted(&path, r);
        let got = observed(&gw, &up, r).await;
        if want != got {
            differ.push(format!(
                "{}: check says {want:?}, the gateway did {got:?}",
                r.line
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    // The table exercises every fate: a test of agreement on one kind would prove little.
    let fates: Vec<Fate> = TABLE.iter().map(|r| predicted(&path, r)).collect();
    assert!(fates.contains(&Fate::Claimed));
    assert!(fates.contains(&Fate::Forwarded));
    assert!(fates.iter().any(|f| matches!(f, Fate::Answered(400, _))));
}
