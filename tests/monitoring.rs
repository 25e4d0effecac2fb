//! The dashboard (`deploy/grafana/`) and the alerting rules (`deploy/prometheus/`): the
//! rules pass `promtool check rules` and their own cases under `promtool test rules`, every
//! dashboard query parses as PromQL, and every metric and label value either one reads is
//! what a running gateway exports. Then the signals only those alerts read: the store's
//! ping, the near-cache's channel, overload refusals.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::Command;
use std::time::Duration;

use dedupe_gateway::dedupe::{Finish, Outcome, Would};
use dedupe_gateway::telemetry::metrics::{ClaimEvent, StoreOp};
use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg, TestGateway,
    Upstream,
};
use strum::VariantArray;

const RULES: &str = "deploy/prometheus/dedupe-gateway.rules.yml";
const RULE_TESTS: &str = "deploy/prometheus/dedupe-gateway.rules.test.yml";
const DASHBOARD: &str = "deploy/grafana/dedupe-gateway.json";

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (Debian's prometheus package has it; scripts/test installs it)")
        })
}

fn assert_ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_rules_pass_promtool_check_and_their_tests() {
    assert_ok(
        &promtool(&["check", "rules", RULES]),
        "promtool check rules",
    );
    let out = promtool(&["test", "rules", RULE_TESTS]);
    assert_ok(&out, "promtool test rules");
    // Every alert has at least one case that fires it.
    let rules = std::fs::read_to_string(RULES).unwrap();
    let tests = std::fs::read_to_string(RULE_TESTS).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for alert in alerts {
        let fires = tests
            .split(&format!("alertname: {alert}\n"))
            .skip(1)
            .any(|case| case.trim_start().starts_with("exp_alerts:\n"));
        assert!(fires, "no case in {RULE_TESTS} fires {alert}");
    }
}

/// The dashboard's queries (panel targets and template variables).
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(DASHBOARD).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for var in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"]["query"].as_str() {
            queries.push(q.to_owned());
        }
    }
    queries
}

#[test]
fn the_dashboard_is_well_formed_and_its_queries_are_promql() {
    let text = std::fs::read_to_string(DASHBOARD).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "dedupe-gateway");
    let panels = dash["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate id: {p}");
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{} is wider than the grid", p["title"]);
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(
                !p["targets"].as_array().unwrap().is_empty(),
                "{}",
                p["title"]
            );
        }
    }
    // Each panel query as a recording rule: `promtool check rules` parses it. Grafana's
    // variables become what Grafana would put in their place.
    let mut file = tempfile::Builder::new().suffix(".yml").tempfile().unwrap();
    writeln!(file, "groups:\n  - name: dashboard\n    rules:").unwrap();
    let mut n = 0;
    for q in dashboard_queries()
        .iter()
        .filter(|q| !q.starts_with("label_values("))
    {
        n += 1;
        let expr = q.replace("$__rate_interval", "1m");
        writeln!(
            file,
            "      - record: dashboard:query_{n}\n        expr: {}",
            serde_json::to_string(&expr).unwrap()
        )
        .unwrap();
    }
    assert!(n > 15, "{n} queries");
    let path = file.path().to_str().unwrap().to_owned();
    assert_ok(
        &promtool(&["check", "rules", &path]),
        "the dashboard's queries",
    );
}

/// Every `dedupe_*` name in `text` (metric names are lower case; alert names are not).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("dedupe_") {
        let before = rest[..i].chars().next_back();
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(name.clone());
        }
        rest = &rest[i + name.len()..];
    }
    names
}

/// The values `label` is matched against in `text` (`label="v"`, `label!="v"`,
/// `label=~"a|b"`).
fn label_values(text: &str, label: &str) -> BTreeSet<String> {
    let mut values = BTreeSet::new();
    for op in ["=\"", "!=\"", "=~\"", "!~\""] {
        let needle = format!("{label}{op}");
        for (i, _) in text.match_indices(&needle) {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue; // a longer label name that ends with this one
            }
            let value = text[i + needle.len()..].split('"').next().unwrap();
            values.extend(value.split('|').map(str::to_owned));
        }
    }
    values
}

fn names_of<T: Copy + Into<&'static str>>(variants: &[T]) -> BTreeSet<String> {
    variants.iter().map(|v| (*v).into().to_owned()).collect()
}

#[test]
fn the_label_values_the_files_match_are_the_gateways() {
    let text = std::fs::read_to_string(RULES).unwrap() + &dashboard_queries().join("\n");
    let mut outcomes = names_of(Outcome::VARIANTS);
    outcomes.extend(names_of(Finish::VARIANTS));
    let known = [
        ("outcome", outcomes),
        ("event", names_of(ClaimEvent::VARIANTS)),
        ("op", names_of(StoreOp::VARIANTS)),
        ("would", names_of(Would::VARIANTS)),
    ];
    for (label, names) in known {
        for value in label_values(&text, label) {
            assert!(
                names.contains(&value),
                "{label}=\"{value}\" is no value the gateway exports: {names:?}"
            );
        }
    }
    assert!(label_values(&text, "outcome").contains("fenced_out"));
    assert!(label_values(&text, "event").contains("overloaded"));
}

#[test]
fn names_and_label_values_are_found_where_they_are() {
    let text = r#"x{event="a"} + dedupe_a_total{outcome=~"b|c",op!="d"} DedupeX my_dedupe_x"#;
    assert_eq!(
        metric_names(text).into_iter().collect::<Vec<_>>(),
        ["dedupe_a_total"]
    );
    assert_eq!(
        label_values(text, "outcome")
            .into_iter()
            .collect::<Vec<_>>(),
        ["b", "c"]
    );
    assert_eq!(
        label_values(text, "op").into_iter().collect::<Vec<_>>(),
        ["d"]
    );
    assert!(label_values(r#"my_event="z""#, "event").is_empty());
}

/// The names in a `/metrics` text: every sample's (`dedupe_requests_total`,
/// `dedupe_store_latency_seconds_bucket`), and every histogram's, as prose names one
/// (`dedupe_store_latency_seconds`). A counter's family name (`dedupe_requests`) is no
/// series a query could read, so it is not one of them.
fn exported(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(family) => family.strip_suffix(" histogram"),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_rules_read_is_exported() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    // The real binary, with everything that exports a metric of its own: Redis with a
    // near-cache, an enforcing route, a shadow route and a signed webhook route.
    let gw = GatewayProcess::start_with_env(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(redis.url()).near_cache("1MiB"))
            .admin()
            .route(RouteCfg::header("orders", "/orders/*"))
            .route(RouteCfg::header("trial", "/trial/*").mode("shadow"))
            .route(
                RouteCfg::preset("hooks", "/hooks", "github")
                    .verify(&["env:DEDUPE_TEST_HOOK_SECRET".to_owned()]),
            ),
        &[("DEDUPE_TEST_HOOK_SECRET", "s3cret")],
    );
    let http = Http::new();
    for path in ["/orders/1", "/orders/1", "/trial/1", "/trial/1"] {
        let r = http
            .post(&gw.url(path), &[("Idempotency-Key", "k")], "{}")
            .await;
        assert!(r.status.is_success(), "{path}: {r:?}");
    }
    // An unsigned delivery: refused, and counted as a signature check.
    let r = http
        .post(&gw.url("/hooks"), &[("X-GitHub-Delivery", "d-1")], "{}")
        .await;
    assert_eq!(r.status, 401, "{r:?}");
    let metrics = http.get(&gw.admin_url("/metrics"), &[]).await.text();
    let exported = exported(&metrics);

    let mut read = metric_names(&std::fs::read_to_string(RULES).unwrap());
    read.extend(metric_names(&dashboard_queries().join("\n")));
    assert!(read.len() >= 12, "{read:?}");
    assert!(read.contains("dedupe_signature_total"), "{read:?}");
    let missing: Vec<&String> = read.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "read but not exported: {missing:?}\n{metrics}"
    );
}

/// The value of the sample `series` (name and labels as exported), if exported.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(|v| v.trim().parse().unwrap())
    })
}

async fn scrape(http: &Http, gw: &TestGateway) -> String {
    http.get(&gw.admin_url("/metrics"), &[]).await.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_up_follows_the_store() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(redis.url()).timeout("300ms"))
            .admin(),
    )
    .await;
    let http = Http::new();
    let up_is = |want: f64| {
        let (http, gw) = (&http, &gw);
        async move { sample(&scrape(http, gw).await, "dedupe_store_up") == Some(want) }
    };
    assert!(up_is(1.0).await);
    redis.stop();
    assert!(eventually(Duration::from_secs(10), || up_is(0.0)).await);
    redis.restart();
    assert!(eventually(Duration::from_secs(10), || up_is(1.0)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_cache_serving_follows_its_channel() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let http = Http::new();
    let without = TestGateway::start(
        &GatewayConfig::new(up.url())
            .store(StoreCfg::redis(redis.url()))
            .admin(),
    )
    .await;
    let metrics = scrape(&http, &without).await;
    assert_eq!(
        sample(&metrics, "dedupe_near_cache_serving"),
        None,
        "no near-cache, no gauge for an alert to read as silent: {metrics}"
    );

    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .store(
                StoreCfg::redis(redis.url())
                    .timeout("300ms")
                    .near_cache("1MiB"),
            )
            .admin(),
    )
    .await;
    let serving_is = |want: f64| {
        let (http, gw) = (&http, &gw);
        async move { sample(&scrape(http, gw).await, "dedupe_near_cache_serving") == Some(want) }
    };
    let ok = eventually(Duration::from_secs(5), || serving_is(1.0)).await;
    assert!(ok, "{}", scrape(&http, &gw).await);
    redis.stop();
    assert!(eventually(Duration::from_secs(5), || serving_is(0.0)).await);
    redis.restart();
    assert!(eventually(Duration::from_secs(10), || serving_is(1.0)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_refusals_are_counted() {
    use tokio::io::AsyncWriteExt;

    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .max_connections(1)
            .admin()
            .route(RouteCfg::header("orders", "/orders/*")),
    )
    .await;
    let http = Http::new();
    let overloaded = r#"dedupe_claim_events_total{event="overloaded"}"#;
    assert_eq!(sample(&scrape(&http, &gw).await, overloaded), Some(0.0));

    // A slow request whose client hangs up once the upstream has it: its task runs on,
    // detached, and fills the one slot such requests have.
    let mut client = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    client
        .write_all(
            b"POST /orders/1 HTTP/1.1\r\nhost: x\r\nidempotency-key: slow\r\n\
              x-test-delay-ms: 3000\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || async { up.effects() == 1 }).await);
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || async {
            gw.gateway.detached() == 1
        })
        .await
    );

    let refused = http
        .post(&gw.url("/orders/2"), &[("Idempotency-Key", "next")], "{}")
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(
        refused.problem_type().ends_with("overloaded"),
        "{refused:?}"
    );
    assert_eq!(sample(&scrape(&http, &gw).await, overloaded), Some(1.0));
    assert_eq!(up.effects(), 1);
}

/// Whether every series a route counts on is exported at 0 in `metrics`: each outcome and
/// finish; what enforcement would have done only on a shadow route; each signature result
/// only on a signed one.
fn route_at_zero(metrics: &str, route: &str, shadow: bool, signed: bool) {
    let at = |name: &str, label: &str, value: &str| {
        sample(
            metrics,
            &format!(r#"{name}{{route="{route}",{label}="{value}"}}"#),
        )
    };
    let outcomes = Outcome::VARIANTS.iter().map(|o| o.as_str());
    for outcome in outcomes.chain(Finish::VARIANTS.iter().map(|f| f.as_str())) {
        assert_eq!(
            at("dedupe_requests_total", "outcome", outcome),
            Some(0.0),
            "{route} {outcome}:\n{metrics}"
        );
    }
    for would in Would::VARIANTS {
        let want = shadow.then_some(0.0);
        let got = at("dedupe_shadow_total", "would", would.as_str());
        assert_eq!(got, want, "{route} {would:?}:\n{metrics}");
    }
    for result in ["verified", "missing", "malformed", "expired", "mismatch"] {
        let want = signed.then_some(0.0);
        let got = at("dedupe_signature_total", "result", result);
        assert_eq!(got, want, "{route} {result}:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_s_series_begin_at_zero_when_the_configuration_loads_and_reloads() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dedupe_test_support::webhooks::secret_file(&dir, "hook", "s3cret");
    let config = GatewayConfig::new(up.url())
        .admin()
        .route(RouteCfg::header("orders", "/orders/*"))
        .route(RouteCfg::header("trial", "/trial/*").mode("shadow"))
        .route(RouteCfg::preset("hooks", "/hooks", "github").verify(&[secret]));
    let gw = TestGateway::start(&config).await;
    let http = Http::new();
    // Before any request: a first held refusal will be an increase from 0.
    let metrics = scrape(&http, &gw).await;
    route_at_zero(&metrics, "orders", false, false);
    route_at_zero(&metrics, "trial", true, false);
    route_at_zero(&metrics, "hooks", false, true);

    // A route a reload adds begins at 0 too; the counts of the others go on.
    let r = http
        .post(&gw.url("/orders/1"), &[("Idempotency-Key", "k")], "{}")
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let reloaded = config.route(RouteCfg::header("refunds", "/refunds/*").mode("shadow"));
    let text = reloaded.to_toml();
    let reloaded =
        dedupe_gateway::config::Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    gw.gateway.reload(reloaded);
    let metrics = scrape(&http, &gw).await;
    route_at_zero(&metrics, "refunds", true, false);
    assert_eq!(
        sample(
            &metrics,
            r#"dedupe_requests_total{route="orders",outcome="won"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
}

/// `promtool check metrics` on `text` (read from its standard input): its lint's output.
fn promtool_check_metrics(text: &str) -> std::process::Output {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_openmetrics_when_asked_and_the_text_format_promtool_checks_otherwise() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .admin()
            .route(RouteCfg::header("orders", "/orders/*")),
    )
    .await;
    let http = Http::new();
    // Every kind of series with samples: counters, histograms, gauges.
    for _ in 0..2 {
        let r = http
            .post(&gw.url("/orders/1"), &[("Idempotency-Key", "k")], "{}")
            .await;
        assert!(r.status.is_success(), "{r:?}");
    }
    let url = gw.admin_url("/metrics");
    let content_type =
        |r: &dedupe_test_support::Reply| r.headers["content-type"].to_str().unwrap().to_owned();
    for accept in [None, Some("text/plain"), Some("*/*")] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
        let r = http.get(&url, &headers).await;
        assert_eq!(
            content_type(&r),
            "text/plain; version=0.0.4; charset=utf-8",
            "{accept:?}"
        );
        let text = r.text();
        assert!(
            text.contains("# TYPE dedupe_requests_total counter\n"),
            "{text}"
        );
        let out = promtool_check_metrics(&text);
        assert_ok(&out, "promtool check metrics");
        // Its lint (names, suffixes, help) finds nothing either.
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            said.trim().is_empty(),
            "promtool check metrics: {said}\n{text}"
        );
    }
    // Prometheus's own scrape asks for OpenMetrics first.
    let r = http
        .get(
            &url,
            &[(
                "Accept",
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            )],
        )
        .await;
    assert_eq!(
        content_type(&r),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let open = r.text();
    assert!(open.ends_with("# EOF\n"), "{open}");
    assert!(open.contains("# TYPE dedupe_requests counter\n"), "{open}");
}
