//! Errors in the API's dialect (#24 item 6): Stripe's official Python client in front of an
//! `errors = "stripe"` route raises `IdempotencyError` on a key in flight and on a reused
//! key, retries a key in flight by itself into the replay, and reads the replay as the same
//! object; a JSON:API client parses a template's answers; problem types link under
//! `problem_base_url`; a preset keeps problem+json; a broken template is refused at load.

use std::io::Write;
use std::process::Command;

use dedupe_test_support::{
    CustomerCreate, GatewayConfig, GatewayProcess, Http, RouteCfg, StripeClient, TestGateway,
    Upstream,
};
use serde::Deserialize;
use serde_json::{json, Value};

/// A Stripe-compatible API's customers, keyed as Stripe keys them, per API key.
fn customers() -> RouteCfg {
    RouteCfg::header("customers", "/v1/customers").scope(&["header:Authorization"])
}

fn assert_idempotency_error(seen: &Value, code: &str, should_retry: &str) {
    assert_eq!(seen["raised"], "IdempotencyError", "{seen}");
    assert_eq!(seen["is_idempotency_error"], true, "{seen}");
    assert_eq!(seen["is_error_module_idempotency_error"], true, "{seen}");
    assert_eq!(seen["http_status"], 400, "{seen}");
    assert_eq!(seen["type"], "idempotency_error", "{seen}");
    assert_eq!(seen["code"], code, "{seen}");
    assert_eq!(seen["should_retry"], should_retry, "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_s_python_client_raises_idempotency_error_and_reads_the_replay() {
    let up = Upstream::start().await;
    let gw =
        GatewayProcess::start(&GatewayConfig::new(up.url()).route(customers().errors("stripe")));
    let stripe = StripeClient::new(gw.url(""));
    let create = CustomerCreate::new("cus-create-1", json!({"email": "ada@example.com"}))
        .header("x-test-delay-ms", "3000");

    // The first call is slow at the upstream; the same call meanwhile is told the key is in
    // flight, as an IdempotencyError the application can tell apart, and to retry it.
    let first = tokio::spawn({
        let (stripe, create) = (stripe.clone(), create.clone());
        async move { stripe.create_customer(&create).await }
    });
    up.wait_for_effects(1).await;
    let in_flight = stripe.create_customer(&create).await;
    assert_idempotency_error(&in_flight, "idempotency_key_in_use", "true");
    assert_eq!(
        in_flight["message"],
        "A request with this idempotency key is still in flight"
    );
    assert!(in_flight["retry_after"].as_str().is_some(), "{in_flight}");

    let first = first.await.unwrap();
    assert_eq!(first["http_status"], 201, "{first}");
    assert_eq!(first["object"]["effect"], 1, "{first}");
    assert_eq!(first["replayed"], Value::Null, "{first}");

    // The retry gets the stored answer: the same object.
    let replay = stripe.create_customer(&create).await;
    assert_eq!(replay["object"], first["object"], "{replay}");
    assert_eq!(replay["http_status"], 201, "{replay}");
    assert_eq!(replay["replayed"], "true", "{replay}");

    // The key with other parameters: an IdempotencyError not to be retried.
    let other = CustomerCreate::new("cus-create-1", json!({"email": "grace@example.com"}));
    let reused = stripe.create_customer(&other).await;
    assert_idempotency_error(&reused, "idempotency_key_reused", "false");
    assert_eq!(
        reused["message"],
        "Idempotency key reused with a different request"
    );
    // Even with the client's own retries on, it is not sent again.
    let reused = stripe.create_customer(&other.retries(2)).await;
    assert_idempotency_error(&reused, "idempotency_key_reused", "false");

    assert_eq!(up.effects(), 1);
}

/// Without the dialect, the client cannot read the gateway's refusal (the issue's finding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dialect_stripe_s_client_cannot_read_a_refusal() {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&GatewayConfig::new(up.url()).route(customers())).await;
    let stripe = StripeClient::new(gw.url(""));
    let first = CustomerCreate::new("cus-create-3", json!({"email": "ada@example.com"}));
    assert_eq!(stripe.create_customer(&first).await["http_status"], 201);
    let other = CustomerCreate::new("cus-create-3", json!({"email": "grace@example.com"}));
    let seen = stripe.create_customer(&other).await;
    assert_eq!(seen["raised"], "APIError", "{seen}");
    assert_eq!(seen["http_status"], 422, "{seen}");
    assert!(
        seen["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Invalid response object from API")),
        "{seen}"
    );
}

/// With its automatic retries on (the library's default is 2), the client obeys
/// `Stripe-Should-Retry: true` on the key in flight and ends with the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_s_python_client_retries_a_key_in_flight_into_the_replay() {
    let up = Upstream::start().await;
    let gw =
        TestGateway::start(&GatewayConfig::new(up.url()).route(customers().errors("stripe"))).await;
    let stripe = StripeClient::new(gw.url(""));
    let create = CustomerCreate::new("cus-create-2", json!({"email": "ada@example.com"}))
        .header("x-test-delay-ms", "3500");
    let first = tokio::spawn({
        let (stripe, create) = (stripe.clone(), create.clone());
        async move { stripe.create_customer(&create).await }
    });
    up.wait_for_effects(1).await;
    // Backing off 0.5 s, 1 s, 2 s, 4 s (halved at random, never under 0.5 s): past the
    // 3.5 s call, which outlasts the Python client's start on a busy machine.
    let retried = stripe.create_customer(&create.retries(4)).await;
    let first = first.await.unwrap();
    assert_eq!(retried["object"], first["object"], "{retried}");
    assert_eq!(retried["replayed"], "true", "{retried}");
    assert_eq!(up.effects(), 1);
    // It was told the key was in flight first: counted as ever, whatever the dialect.
    let metrics = gw.gateway.metrics().encode();
    assert!(
        metrics.lines().any(|l| l
            .starts_with(r#"dedupe_requests_total{route="customers",outcome="conflict"}"#)
            && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// A JSON:API client's reading of an error document: it refuses anything else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonApiDocument {
    errors: Vec<JsonApiError>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonApiError {
    status: String,
    code: String,
    title: String,
    detail: String,
    links: JsonApiLinks,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonApiLinks {
    #[serde(rename = "type")]
    kind: String,
}

fn json_api(reply: &dedupe_test_support::Reply) -> JsonApiError {
    assert_eq!(
        reply.headers["content-type"], "application/vnd.api+json",
        "{reply:?}"
    );
    let mut doc: JsonApiDocument = serde_json::from_slice(&reply.body)
        .unwrap_or_else(|e| panic!("not a JSON:API error document ({e}): {}", reply.text()));
    assert_eq!(doc.errors.len(), 1);
    let error = doc.errors.remove(0);
    assert_eq!(error.status, reply.status.as_str());
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_api_client_parses_the_template_s_answers() {
    let mut template = tempfile::NamedTempFile::new().unwrap();
    template
        .write_all(
            br#"{"errors": [{
                "status": "{{status}}", "code": "{{name}}", "title": "{{title}}",
                "detail": "{{detail}}", "links": {"type": "{{type}}"}
            }]}"#,
        )
        .unwrap();
    let up = Upstream::start().await;
    let route = RouteCfg::header("orders", "/v1/orders")
        .errors_template(template.path(), "application/vnd.api+json")
        .problem_base_url("https://docs.example.com/problems/");
    let gw = TestGateway::start(&GatewayConfig::new(up.url()).route(route)).await;
    let http = Http::new();
    let url = gw.url("/v1/orders");

    let missing = http.post(&url, &[], r#"{"n":1}"#).await;
    assert_eq!(missing.status, 400);
    let e = json_api(&missing);
    assert_eq!(e.code, "idempotency-key-missing");
    assert_eq!(e.title, "Idempotency key missing");
    assert!(e.detail.contains("idempotency-key"), "{e:?}");
    assert_eq!(
        e.links.kind,
        "https://docs.example.com/problems/idempotency-key-missing"
    );

    let slow = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move {
            let h = [("idempotency-key", "o-1"), ("x-test-delay-ms", "1500")];
            http.post(&url, &h, r#"{"n":1}"#).await
        }
    });
    up.wait_for_effects(1).await;
    let in_flight = http
        .post(&url, &[("idempotency-key", "o-1")], r#"{"n":1}"#)
        .await;
    assert_eq!(in_flight.status, 409);
    assert!(
        in_flight.headers.contains_key("retry-after"),
        "{in_flight:?}"
    );
    let e = json_api(&in_flight);
    assert_eq!(e.code, "request-in-flight");
    assert_eq!(e.detail, "");
    assert_eq!(slow.await.unwrap().status, 201);

    let reused = http
        .post(&url, &[("idempotency-key", "o-1")], r#"{"n":2}"#)
        .await;
    assert_eq!(reused.status, 422);
    assert_eq!(json_api(&reused).code, "idempotency-key-reused");
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_reach_routes_and_unrouted_answers_but_a_preset_keeps_problem_json() {
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url())
        .default_errors("stripe")
        .default_problem_base_url("https://docs.example.com/problems/")
        .route(customers())
        .route(RouteCfg::preset("github", "/webhooks/github", "github"));
    let gw = TestGateway::start(&cfg).await;
    let http = Http::new();

    // The route inherits Stripe's envelope, its 400 stays a 400.
    let missing = http.post(&gw.url("/v1/customers"), &[], "email=a").await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.headers["content-type"], "application/json");
    let v: Value = serde_json::from_slice(&missing.body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["code"], "idempotency_key_missing", "{v}");
    assert_eq!(
        v["error"]["doc_url"],
        "https://docs.example.com/problems/idempotency-key-missing"
    );

    // Refused before any route is known: the defaults' dialect.
    let bad_path = http.post(&gw.url("/v1/a%2Fb"), &[], "").await;
    assert_eq!(bad_path.status, 400);
    let v: Value = serde_json::from_slice(&bad_path.body).unwrap();
    assert_eq!(v["error"]["code"], "path_invalid", "{v}");

    // A webhook sender does not read bodies: the preset keeps problem+json, linked.
    let delivery = http.post(&gw.url("/webhooks/github"), &[], "{}").await;
    assert_eq!(delivery.status, 400);
    assert_eq!(
        delivery.problem_type(),
        "https://docs.example.com/problems/idempotency-key-missing"
    );

    // The access record and metrics count the refusals as ever.
    let metrics = gw.gateway.metrics().encode();
    for line in [
        r#"dedupe_requests_total{route="customers",outcome="missing_key"} 1"#,
        r#"dedupe_requests_total{route="github",outcome="missing_key"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[test]
fn a_template_that_is_not_json_once_filled_is_refused_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("errors.json");
    // `{{title}}` outside quotes: JSON only for a title that happens to be a number.
    std::fs::write(&template, r#"{"error": {"message": {{title}}}}"#).unwrap();
    let config = dir.path().join("gateway.toml");
    let cfg = GatewayConfig::new("http://127.0.0.1:9")
        .route(customers().errors_template(&template, "application/json"));
    std::fs::write(&config, cfg.to_toml()).unwrap();
    for command in ["check", "run"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
            .args([command, "--config"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "routes[customers].errors.template: {}: not valid JSON once filled",
                template.display()
            )),
            "{command}: {stderr}"
        );
    }
}

/// `drill` proves dedupe on a route whatever its dialect: `--config` reads the answers as
/// problem+json, `--target` expects the statuses of the route's dialect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_passes_on_a_stripe_route_locally_and_against_a_running_gateway() {
    let up = Upstream::start().await;
    let cfg = GatewayConfig::new(up.url())
        .admin_with_token("s3cret")
        .default_problem_base_url("https://docs.example.com/problems/")
        .route(customers().errors("stripe"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, cfg.to_toml()).unwrap();
    let drill = move |args: Vec<String>| {
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
                .arg("drill")
                .arg("--config")
                .arg(&config)
                .args(args)
                .env_remove("DEDUPE_ADMIN_TOKEN")
                .output()
                .unwrap()
        })
    };
    let out = drill(vec!["--lease".into(), "1s".into()]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("all drills passed"), "{text}");

    let gw = GatewayProcess::start(&cfg);
    let args = [
        "--target",
        &gw.url(""),
        "--admin",
        &gw.admin_url(""),
        "--token",
        "s3cret",
        "--route",
        "customers",
        "--yes",
    ];
    let out = drill(args.iter().map(|a| a.to_string()).collect())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for d in ["replay", "race", "misuse"] {
        assert!(text.contains(&format!("PASS customers/{d}")), "{text}");
    }
}

/// SIGHUP reads the template again; a template broken meanwhile is refused and the one in
/// force keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_template_again_and_refuses_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("errors.json");
    std::fs::write(&template, r#"{"v": 1, "code": "{{name}}"}"#).unwrap();
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(up.url())
            .route(customers().errors_template(&template, "application/json")),
    );
    let http = Http::new();
    let url = gw.url("/v1/customers");
    let answer = |reply: dedupe_test_support::Reply| -> Value {
        assert_eq!(reply.status, 400);
        serde_json::from_slice(&reply.body).unwrap()
    };
    assert_eq!(
        answer(http.post(&url, &[], "").await),
        json!({"v": 1, "code": "idempotency-key-missing"})
    );

    std::fs::write(&template, r#"{"v": 2, "code": "{{name}}"}"#).unwrap();
    gw.signal("HUP");
    gw.wait_logged("SIGHUP: configuration reloaded").await;
    assert_eq!(answer(http.post(&url, &[], "").await)["v"], 2);

    std::fs::write(&template, r#"{"v": 3, "code": {{name}}}"#).unwrap();
    gw.signal("HUP");
    gw.wait_logged("SIGHUP: configuration refused").await;
    assert_eq!(answer(http.post(&url, &[], "").await)["v"], 2);
}
