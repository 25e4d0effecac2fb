//! Webhook presets: each dedupes its provider's realistic redelivery (same delivery id,
//! new signature and timestamp headers) to one upstream effect; a field set on the route
//! overrides the preset; `check` warns when a window is shorter than the provider retries.

use std::time::Duration;

use dedupe_gateway::config::Config;
use dedupe_gateway::protocol::key::KeyRule;
use dedupe_test_support::{GatewayConfig, Http, RouteCfg, TestGateway, Upstream};
use http::StatusCode;

async fn gateway(route: RouteCfg) -> (Upstream, TestGateway, Http) {
    let up = Upstream::start().await;
    let gw = TestGateway::start(&GatewayConfig::new(up.url()).route(route)).await;
    (up, gw, Http::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_redelivers_the_same_event_with_a_new_signature_and_it_replays() {
    let (up, gw, http) = gateway(RouteCfg::preset("stripe", "/webhooks/stripe", "stripe")).await;
    let url = gw.url("/webhooks/stripe");
    let event = r#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_3","amount":2000}}}"#;
    let first = http
        .post(
            &url,
            &[
                (
                    "Stripe-Signature",
                    "t=1700000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e7",
                ),
                ("Content-Type", "application/json"),
            ],
            event,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    // The retry: the same event, signed anew at a later time, its JSON laid out afresh.
    let again = http
        .post(
            &url,
            &[
                (
                    "Stripe-Signature",
                    "t=1700003600,v1=6ffbb59b2300aae63f272406069a9788598b792a",
                ),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            &event.replace(",\"", ", \""),
        )
        .await;
    assert!(again.replayed(), "{:?}", again.text());
    assert_eq!(again.body, first.body);
    assert_eq!(up.effects(), 1);
    // Another event is new work.
    let other = http
        .post(&url, &[], &event.replace("evt_1NG8", "evt_2XX8"))
        .await;
    assert!(!other.replayed());
    assert_eq!(up.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_redelivers_with_the_same_delivery_guid_and_it_replays_per_webhook() {
    let (up, gw, http) = gateway(RouteCfg::preset("github", "/webhooks/github", "github")).await;
    let url = gw.url("/webhooks/github");
    let delivery = |hook: &'static str| {
        [
            ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            ("X-GitHub-Event", "push"),
            ("X-GitHub-Hook-ID", hook),
            (
                "X-Hub-Signature-256",
                "sha256=d57c68ca6f92289e6987922ff26938930f6e66a2d161ef06abdf1859230aa23c",
            ),
        ]
    };
    let body = r#"{"ref":"refs/heads/main","after":"0d1a26e6"}"#;
    http.post(&url, &delivery("292093033"), body).await;
    let redelivered = http.post(&url, &delivery("292093033"), body).await;
    assert!(redelivered.replayed());
    assert_eq!(up.effects(), 1);
    // GitHub shares the GUID among every webhook subscribed to the event: another
    // webhook's delivery is its own.
    let other_hook = http.post(&url, &delivery("417018772"), body).await;
    assert!(!other_hook.replayed());
    assert_eq!(up.effects(), 2);
    // The key is required: a request without it is refused, never executed.
    let r = http.post(&url, &[("X-GitHub-Event", "push")], body).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(up.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify_retries_with_the_same_webhook_id_and_it_replays() {
    let (up, gw, http) = gateway(RouteCfg::preset("shop", "/webhooks/shopify", "shopify")).await;
    let url = gw.url("/webhooks/shopify");
    let headers = [
        (
            "X-Shopify-Webhook-Id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        ),
        ("X-Shopify-Shop-Domain", "tea.myshopify.com"),
        ("X-Shopify-Topic", "orders/create"),
        ("X-Shopify-Triggered-At", "2024-09-10T15:14:00.000Z"),
        (
            "X-Shopify-Hmac-Sha256",
            "XWmrwMey6OsLMeiZKwP4FppHH3cmAiiJJAweH5Jo4bM=",
        ),
    ];
    let body = r#"{"id":820982911946154508,"total_price":"12.50"}"#;
    http.post(&url, &headers, body).await;
    let retried = http.post(&url, &headers, body).await;
    assert!(retried.replayed());
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_retry_with_a_new_timestamp_and_signature_replays() {
    let (up, gw, http) = gateway(RouteCfg::preset("std", "/hooks", "standard-webhooks")).await;
    let url = gw.url("/hooks");
    let body =
        r#"{"type":"invoice.paid","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"in_1"}}"#;
    let attempt = |ts: &'static str, sig: &'static str| {
        [
            ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
            ("webhook-timestamp", ts),
            ("webhook-signature", sig),
        ]
    };
    http.post(
        &url,
        &attempt(
            "1674087231",
            "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        ),
        body,
    )
    .await;
    let retried = http
        .post(
            &url,
            &attempt(
                "1674087536",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
            body,
        )
        .await;
    assert!(retried.replayed());
    assert_eq!(up.effects(), 1);
}

/// Svix sends its Standard Webhooks deliveries under `svix-id`, `svix-timestamp` and
/// `svix-signature` by default: the preset keys them by `svix-id` when there is no
/// `webhook-id` (it answered 400 `idempotency-key-missing` to all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn svix_deliveries_are_keyed_by_svix_id() {
    let (up, gw, http) = gateway(RouteCfg::preset("svix", "/hooks", "standard-webhooks")).await;
    let url = gw.url("/hooks");
    let body = r#"{"type":"invoice.paid","data":{"id":"in_2"}}"#;
    let attempt = |ts: &'static str| {
        [
            ("svix-id", "msg_svix_1"),
            ("svix-timestamp", ts),
            ("svix-signature", "v1,c2lnbmVk"),
        ]
    };
    let first = http.post(&url, &attempt("1674087231"), body).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let retried = http.post(&url, &attempt("1674087536"), body).await;
    assert!(retried.replayed(), "{}", retried.text());
    let other = [("svix-id", "msg_svix_2"), ("svix-timestamp", "1674087231")];
    assert_eq!(http.post(&url, &other, body).await.status, 201);
    assert_eq!(up.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_set_on_the_route_overrides_the_presets() {
    // One Shopify event delivered by two subscriptions: two webhook ids, one event id.
    let route =
        RouteCfg::preset("shop", "/webhooks/shopify", "shopify").key_header("X-Shopify-Event-Id");
    let (up, gw, http) = gateway(route).await;
    let url = gw.url("/webhooks/shopify");
    let delivery = |webhook_id: &'static str| {
        [
            ("X-Shopify-Webhook-Id", webhook_id),
            ("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
            ("X-Shopify-Shop-Domain", "tea.myshopify.com"),
        ]
    };
    http.post(&url, &delivery("b54557e4"), "{}").await;
    let second = http.post(&url, &delivery("0e6f3ef1"), "{}").await;
    assert!(
        second.replayed(),
        "keyed by the event id, not the preset's webhook id"
    );
    assert_eq!(up.effects(), 1);
}

fn route(extra: &str) -> Config {
    Config::from_toml(&format!(
        "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n\
         [[routes]]\nname = \"hooks\"\nmethods = [\"POST\"]\npath = \"/hooks\"\n{extra}"
    ))
    .unwrap()
}

#[test]
fn a_preset_sets_key_scope_match_and_window_and_explicit_fields_win() {
    let c = route("preset = \"github\"\n");
    let r = &c.routes[0];
    assert!(
        matches!(&r.key, KeyRule::Header { name, required: true, .. } if name == "x-github-delivery")
    );
    assert_eq!(r.scope.len(), 1);
    assert_eq!(r.window, Duration::from_secs(4 * 24 * 3600));
    // Its one warning: signatures are not checked before the claim.
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("without verify"), "{:?}", c.warnings);

    let c = route("preset = \"github\"\nscope = []\nwindow = \"5d\"\nmatch = \"request\"\n");
    let r = &c.routes[0];
    assert!(r.scope.is_empty());
    assert_eq!(r.window, Duration::from_secs(5 * 24 * 3600));
    assert_eq!(
        r.must_match,
        dedupe_gateway::protocol::key::MatchRule::Request
    );

    // A longer window in [defaults] is kept.
    let c = Config::from_toml(
        "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n\
         [defaults]\nwindow = \"30d\"\n\
         [[routes]]\nname = \"s\"\nmethods = [\"POST\"]\npath = \"/s\"\npreset = \"stripe\"\n",
    )
    .unwrap();
    assert_eq!(c.routes[0].window, Duration::from_secs(30 * 24 * 3600));
}

#[test]
fn check_warns_when_the_window_is_shorter_than_the_providers_retries() {
    let c = route("preset = \"stripe\"\nwindow = \"24h\"\n");
    let warning = c
        .warnings
        .iter()
        .find(|w| w.contains("routes[hooks].window"))
        .unwrap_or_else(|| panic!("no window warning in {:?}", c.warnings));
    assert!(warning.contains("stripe's retry horizon (3d,"), "{warning}");
    assert!(warning.contains("https://docs.stripe.com/"), "{warning}");
    let windows = |c: &Config| c.warnings.iter().filter(|w| w.contains(".window")).count();
    let shopify = route("preset = \"shopify\"\nwindow = \"4h\"\n");
    assert_eq!(windows(&shopify), 0, "{:?}", shopify.warnings);
    let short = route("preset = \"shopify\"\nwindow = \"3h\"\n");
    assert_eq!(windows(&short), 1, "{:?}", short.warnings);
}

#[test]
fn a_route_without_key_or_preset_names_both() {
    let e = Config::from_toml(
        "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n\
         [[routes]]\nname = \"h\"\nmethods = [\"POST\"]\npath = \"/h\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("routes[h].key") && e.contains("preset"), "{e}");
    let e = Config::from_toml(
        "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n\
         [[routes]]\nname = \"h\"\nmethods = [\"POST\"]\npath = \"/h\"\npreset = \"paypal\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("routes[h].preset") && e.contains("standard-webhooks"),
        "{e}"
    );
}
