//! Signed webhooks: deliveries signed as the providers sign them (Standard Webhooks by its
//! own library; Stripe as Stripe documents it, every verdict held to Stripe's library;
//! GitHub's and Shopify's HMACs computed here). On every preset with `verify`, a forged
//! delivery sent first does not suppress the genuine one (which executes once), a tampered
//! copy sent after it gets 401 and never the stored answer, an expired timestamp is 401, and
//! a rotation's old and new secrets both verify. Without `verify`, the receiver's refusal
//! of a forgery releases the key. The upstream counts every side effect.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dedupe_test_support::webhooks::{
    github_signature, secret_file, shopify_signature, stripe_signature, unix_now,
};
use dedupe_test_support::{
    Delivery, GatewayConfig, GatewayProcess, Http, Providers, Reply, RouteCfg, TestGateway,
    Upstream,
};
use http::StatusCode;

const SIGNATURE_INVALID: &str = "urn:dedupe-gateway:problem:signature-invalid";

async fn post(http: &Http, url: &str, d: &Delivery) -> Reply {
    http.post(url, &d.header_pairs(), &d.body).await
}

/// A 401 `signature-invalid` of the gateway's own: not the upstream's answer, not a replay.
fn assert_refused(r: &Reply, what: &str) {
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {}", r.text());
    assert_eq!(r.problem_type(), SIGNATURE_INVALID, "{what}");
    assert!(!r.replayed(), "{what}");
    assert!(
        r.headers.get("x-effect").is_none(),
        "{what}: reached the upstream"
    );
}

/// The admin's `dedupe_signature_total` for `route` and `result`.
async fn signatures(http: &Http, metrics_url: &str, route: &str, result: &str) -> u64 {
    let text = http.get(metrics_url, &[]).await.text();
    let series = format!("dedupe_signature_total{{route=\"{route}\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_signed_by_its_library_a_forgery_neither_suppresses_nor_reads() {
    let providers = Providers::new();
    let new = format!(
        "whsec_{}",
        STANDARD.encode("the new signing key of the test")
    );
    let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let forger = format!("whsec_{}", STANDARD.encode("a key the sender never had"));
    let dir = tempfile::tempdir().unwrap();
    let secrets = [
        secret_file(&dir, "new", &new),
        secret_file(&dir, "old", old),
    ];
    let up = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(up.url())
            .admin()
            .route(RouteCfg::preset("std", "/hooks", "standard-webhooks").verify(&secrets)),
    )
    .await;
    let (http, url) = (Http::new(), gw.url("/hooks"));
    let signed = |secret: &str, id: &str, t: u64, body: &str| {
        let signature = providers.sign_standard(secret, id, t, body);
        Delivery::new(
            &[
                ("webhook-id", id),
                ("webhook-timestamp", &t.to_string()),
                ("webhook-signature", &signature),
                ("content-type", "application/json"),
            ],
            body,
        )
    };
    let body = r#"{"type":"invoice.paid","data":{"id":"in_1","amount":2000}}"#;
    let now = unix_now();
    let mut sent = Vec::new();

    // A forgery with the genuine delivery's id arrives first: refused, never claimed.
    let forged = signed(&forger, "msg_1", now, body);
    assert_refused(&post(&http, &url, &forged).await, "forged");
    assert_eq!(up.effects(), 0);
    sent.push((forged, false));

    // The genuine delivery executes once; its redelivery (signed anew) replays.
    let genuine = signed(&new, "msg_1", now, body);
    let first = post(&http, &url, &genuine).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(!first.replayed());
    let again = signed(&new, "msg_1", now + 1, body);
    let replay = post(&http, &url, &again).await;
    assert!(replay.replayed(), "{}", replay.text());
    assert_eq!(replay.body, first.body);
    assert_eq!(up.effects(), 1);
    sent.extend([(genuine.clone(), true), (again, true)]);

    // A tampered copy after it: 401, never the genuine delivery's stored answer.
    let tampered = genuine.with_body(&body.replace("2000", "1"));
    let r = post(&http, &url, &tampered).await;
    assert_refused(&r, "tampered");
    assert_ne!(r.body, first.body);
    sent.push((tampered, false));

    // Signed ten minutes ago, by the right key: outside the tolerance.
    let expired = signed(&new, "msg_2", now - 600, body);
    assert_refused(&post(&http, &url, &expired).await, "expired");
    sent.push((expired, false));

    // Rotation: the old secret and the new both verify.
    for (id, secret) in [("msg_3", old), ("msg_4", new.as_str())] {
        let d = signed(secret, id, now, body);
        assert_eq!(
            post(&http, &url, &d).await.status,
            StatusCode::CREATED,
            "{id}"
        );
        sent.push((d, true));
    }
    assert_eq!(up.effects(), 3);

    // The library itself agrees with every verdict.
    let (deliveries, verdicts): (Vec<Delivery>, Vec<bool>) = sent.into_iter().unzip();
    assert_eq!(
        providers.standard_accepts(&[&new, old], &deliveries),
        verdicts
    );
    let metrics = gw.admin_url("/metrics");
    assert_eq!(signatures(&http, &metrics, "std", "verified").await, 4);
    assert_eq!(signatures(&http, &metrics, "std", "mismatch").await, 2);
    assert_eq!(signatures(&http, &metrics, "std", "expired").await, 1);
}

/// A Stripe event as Stripe sends it.
fn stripe_event(id: &str, amount: u32) -> String {
    format!(
        r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","type":"payment_intent.succeeded","data":{{"object":{{"id":"pi_3","object":"payment_intent","amount":{amount}}}}}}}"#
    )
}

fn stripe_delivery(signature: &str, body: &str) -> Delivery {
    Delivery::new(
        &[
            ("Stripe-Signature", signature),
            ("Content-Type", "application/json; charset=utf-8"),
        ],
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_events_are_accepted_exactly_as_stripes_own_library_accepts_them() {
    let providers = Providers::new();
    let (new, old) = ("whsec_new_endpoint_secret", "whsec_old_endpoint_secret");
    let up = Upstream::start().await;
    // The real binary, its secrets from the environment.
    let config = GatewayConfig::new(up.url()).admin().route(
        RouteCfg::preset("stripe", "/webhooks/stripe", "stripe").verify(&[
            "env:STRIPE_WEBHOOK_SECRET".to_owned(),
            "env:STRIPE_WEBHOOK_SECRET_OLD".to_owned(),
        ]),
    );
    let gw = GatewayProcess::start_with_env(
        &config,
        &[
            ("STRIPE_WEBHOOK_SECRET", new),
            ("STRIPE_WEBHOOK_SECRET_OLD", old),
        ],
    );
    let (http, url) = (Http::new(), gw.url("/webhooks/stripe"));
    let now = unix_now();
    let event = stripe_event("evt_1NG8Du2eZvKYlo2CUI79vXWy", 2000);
    let mut sent = Vec::new();
    let mut send = async |d: Delivery| {
        let r = post(&http, &url, &d).await;
        sent.push((d, r.status != StatusCode::UNAUTHORIZED));
        r
    };

    let forged = stripe_delivery(&stripe_signature("whsec_forger", now, &event), &event);
    assert_refused(&send(forged).await, "forged");
    assert_eq!(up.effects(), 0);

    let genuine = stripe_delivery(&stripe_signature(new, now, &event), &event);
    let first = send(genuine.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    // Stripe's retry: the same event, signed anew.
    let retry = stripe_delivery(&stripe_signature(new, now + 2, &event), &event);
    let replay = send(retry).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(up.effects(), 1);

    let tampered = genuine.with_body(&stripe_event("evt_1NG8Du2eZvKYlo2CUI79vXWy", 1));
    let r = send(tampered).await;
    assert_refused(&r, "tampered");
    assert_ne!(r.body, first.body);

    let e2 = stripe_event("evt_2", 2000);
    let expired = stripe_delivery(&stripe_signature(new, now - 600, &e2), &e2);
    assert_refused(&send(expired).await, "expired");

    // What Stripe's library accepts beyond the obvious: a timestamp ahead of the clock,
    // the old secret, and a header carrying one signature per secret during a roll.
    let e3 = stripe_event("evt_3", 2000);
    let ahead = stripe_delivery(&stripe_signature(new, now + 600, &e3), &e3);
    assert_eq!(send(ahead).await.status, StatusCode::CREATED);
    let e4 = stripe_event("evt_4", 2000);
    let rotated = stripe_delivery(&stripe_signature(old, now, &e4), &e4);
    assert_eq!(send(rotated).await.status, StatusCode::CREATED);
    let e5 = stripe_event("evt_5", 2000);
    let both = format!(
        "{},{}",
        stripe_signature("whsec_unrelated", now, &e5),
        stripe_signature(old, now, &e5).split_once(',').unwrap().1
    );
    assert_eq!(send(stripe_delivery(&both, &e5)).await.status, 201);
    assert_eq!(up.effects(), 4);

    // And what it refuses: only a v0 signature, upper-case hex, no header at all.
    let e6 = stripe_event("evt_6", 2000);
    let v0 = stripe_signature(new, now, &e6).replace("v1=", "v0=");
    let upper = {
        let s = stripe_signature(new, now, &e6);
        let (t, v1) = s.split_once(",v1=").unwrap();
        format!("{t},v1={}", v1.to_uppercase())
    };
    for header in [v0, upper, String::new()] {
        assert_refused(&send(stripe_delivery(&header, &e6)).await, &header);
    }
    assert_eq!(up.effects(), 4);

    let (deliveries, verdicts): (Vec<Delivery>, Vec<bool>) = sent.into_iter().unzip();
    assert_eq!(
        providers.stripe_accepts(&[new, old], 300, &deliveries),
        verdicts,
        "stripe.Webhook.construct_event and the gateway disagree"
    );

    // Each refusal is logged at warn with the delivery's event id.
    gw.wait_logged("webhook signature refused").await;
    let refused = gw.logs.lock().unwrap().clone();
    let forged_line = refused
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("webhook signature refused"))
        })
        .expect("no refusal logged");
    assert_eq!(forged_line["level"], "WARN", "{forged_line}");
    assert_eq!(forged_line["delivery"], "evt_1NG8Du2eZvKYlo2CUI79vXWy");
    assert_eq!(forged_line["result"], "mismatch");
    let all = refused.iter().map(ToString::to_string).collect::<String>();
    assert!(
        !all.contains(new) && !all.contains(old),
        "a secret was logged"
    );
}

/// Where a body-only scheme's route expects its delivery id and signature.
struct BodyOnly {
    preset: &'static str,
    headers: fn(id: &str, signature: &str) -> Vec<(&'static str, String)>,
    sign: fn(secret: &str, body: &str) -> String,
}

const GITHUB: BodyOnly = BodyOnly {
    preset: "github",
    headers: |id, signature| {
        vec![
            ("X-GitHub-Delivery", id.to_owned()),
            ("X-GitHub-Event", "push".to_owned()),
            ("X-GitHub-Hook-ID", "292093033".to_owned()),
            ("X-Hub-Signature-256", signature.to_owned()),
        ]
    },
    sign: github_signature,
};

const SHOPIFY: BodyOnly = BodyOnly {
    preset: "shopify",
    headers: |id, signature| {
        vec![
            ("X-Shopify-Webhook-Id", id.to_owned()),
            ("X-Shopify-Shop-Domain", "tea.myshopify.com".to_owned()),
            ("X-Shopify-Topic", "orders/create".to_owned()),
            ("X-Shopify-Hmac-Sha256", signature.to_owned()),
        ]
    },
    sign: shopify_signature,
};

impl BodyOnly {
    fn delivery(&self, secret: &str, id: &str, body: &str) -> Delivery {
        let headers = (self.headers)(id, &(self.sign)(secret, body));
        let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Delivery::new(&pairs, body)
    }

    /// Forged first, genuine once, redelivered, tampered after, then the old secret.
    async fn check(&self) {
        let (new, old) = ("the-new-webhook-secret", "the-old-webhook-secret");
        let dir = tempfile::tempdir().unwrap();
        let secrets = [secret_file(&dir, "new", new), secret_file(&dir, "old", old)];
        let up = Upstream::start().await;
        let route = RouteCfg::preset("hooks", "/hooks", self.preset).verify(&secrets);
        let gw = TestGateway::start(&GatewayConfig::new(up.url()).route(route)).await;
        let (http, url) = (Http::new(), gw.url("/hooks"));
        let body = r#"{"id":820982911946154508,"total_price":"12.50"}"#;

        let forged = self.delivery("a-guessed-secret", "d-1", body);
        assert_refused(&post(&http, &url, &forged).await, self.preset);
        assert_eq!(up.effects(), 0, "{}", self.preset);

        let genuine = self.delivery(new, "d-1", body);
        let first = post(&http, &url, &genuine).await;
        assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
        assert!(post(&http, &url, &genuine).await.replayed());
        assert_eq!(up.effects(), 1, "{}", self.preset);

        let tampered = genuine.with_body(&body.replace("12.50", "0.01"));
        let r = post(&http, &url, &tampered).await;
        assert_refused(&r, self.preset);
        assert_ne!(r.body, first.body);

        let rotated = self.delivery(old, "d-2", body);
        assert_eq!(post(&http, &url, &rotated).await.status, 201);
        assert_eq!(up.effects(), 2, "{}", self.preset);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_hmacs_a_forgery_neither_suppresses_nor_reads_the_genuine_delivery() {
    GITHUB.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify_hmacs_a_forgery_neither_suppresses_nor_reads_the_genuine_delivery() {
    SHOPIFY.check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_verify_the_receivers_refusal_of_a_forgery_releases_the_key() {
    for (preset, refusal) in [(&GITHUB, "401"), (&SHOPIFY, "403")] {
        let up = Upstream::start().await;
        let route = RouteCfg::preset("hooks", "/hooks", preset.preset);
        let gw = TestGateway::start(&GatewayConfig::new(up.url()).route(route)).await;
        let (http, url) = (Http::new(), gw.url("/hooks"));
        let body = r#"{"id":1}"#;
        // The forgery reaches the receiver, which checks signatures and refuses it
        // (the test upstream refuses when asked to).
        let forged = preset.delivery("a-guessed-secret", "d-1", body);
        let mut refused = forged.header_pairs();
        refused.push(("x-test-status", refusal));
        let r = http.post(&url, &refused, body).await;
        assert_eq!(r.status.as_str(), refusal);
        // The refusal released the key: the genuine delivery executes, then replays.
        let genuine = preset.delivery("the-secret", "d-1", body);
        let first = post(&http, &url, &genuine).await;
        assert_eq!(
            first.status,
            StatusCode::CREATED,
            "{preset_name}",
            preset_name = preset.preset
        );
        assert!(!first.replayed());
        assert!(post(&http, &url, &genuine).await.replayed());
        assert_eq!(
            up.effects(),
            2,
            "the forgery and the genuine delivery, once each"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_rotated_on_disk_applies_at_the_next_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(&dir, "secret", "first-secret");
    let up = Upstream::start().await;
    let route = RouteCfg::preset("hooks", "/hooks", "github").verify(&[secret]);
    let gw = GatewayProcess::start(&GatewayConfig::new(up.url()).route(route));
    let http = Http::new();
    let url = gw.url("/hooks");
    let under = |secret: &str, id: &str| GITHUB.delivery(secret, id, r#"{"id":1}"#);
    assert_eq!(
        post(&http, &url, &under("first-secret", "d-1"))
            .await
            .status,
        201
    );
    std::fs::write(dir.path().join("secret"), "second-secret\n").unwrap();
    gw.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = post(&http, &url, &under("second-secret", "d-2")).await;
        if r.status == StatusCode::CREATED {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_refused(
        &post(&http, &url, &under("first-secret", "d-3")).await,
        "old",
    );
}
