//! Every scheme against its provider's own published example (or one its library made),
//! then forgeries, tampering, age and rotation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};

use super::*;

const FIVE_MINUTES: Duration = Duration::from_secs(300);

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn verifier(scheme: Scheme, secrets: &[&str]) -> Verifier {
    let secrets = secrets
        .iter()
        .map(|s| scheme.secret(s.as_bytes()).unwrap())
        .collect();
    Verifier::new(scheme, secrets, FIVE_MINUTES)
}

// Svix's and Standard Webhooks' published test vector.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_T: u64 = 1_614_265_330;
const SW_BODY: &str = r#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn sw_headers(sig: &str, t: &str) -> HeaderMap {
    headers(&[
        ("webhook-id", SW_ID),
        ("webhook-timestamp", t),
        ("webhook-signature", sig),
    ])
}

#[test]
fn standard_webhooks_verifies_its_published_example() {
    let v = verifier(Scheme::StandardWebhooks, &[SW_SECRET]);
    let h = sw_headers(SW_SIG, "1614265330");
    assert_eq!(
        v.verify(&h, SW_BODY.as_bytes(), at(SW_T)),
        Ok(Verified { secret: 0 })
    );
    // Among other entries, in any order, and under Svix's header names.
    let several = format!("v1a,ZmFrZQ== v1,Zm9yZ2Vk {SW_SIG}");
    let h = sw_headers(&several, "1614265330");
    assert!(v.verify(&h, SW_BODY.as_bytes(), at(SW_T)).is_ok());
    let svix = headers(&[
        ("svix-id", SW_ID),
        ("svix-timestamp", "1614265330"),
        ("svix-signature", SW_SIG),
    ]);
    assert!(v.verify(&svix, SW_BODY.as_bytes(), at(SW_T)).is_ok());
}

#[test]
fn standard_webhooks_refuses_forgeries_tampering_and_age() {
    let v = verifier(Scheme::StandardWebhooks, &[SW_SECRET]);
    let body = SW_BODY.as_bytes();
    let mismatch = Err(SignatureError::Mismatch { secrets: 1 });
    let forged = sw_headers(
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=",
        "1614265330",
    );
    assert_eq!(v.verify(&forged, body, at(SW_T)), mismatch);
    let tampered = br#"{"test": 2432232315}"#;
    assert_eq!(
        v.verify(&sw_headers(SW_SIG, "1614265330"), tampered, at(SW_T)),
        mismatch
    );
    // The id and the timestamp are signed too.
    let mut other_id = sw_headers(SW_SIG, "1614265330");
    other_id.insert("webhook-id", HeaderValue::from_static("msg_other"));
    assert_eq!(v.verify(&other_id, body, at(SW_T)), mismatch);
    assert_eq!(
        v.verify(&sw_headers(SW_SIG, "1614265331"), body, at(SW_T)),
        mismatch
    );
    let old = v.verify(&sw_headers(SW_SIG, "1614265330"), body, at(SW_T + 301));
    assert_eq!(old.unwrap_err().result(), "expired");
    let early = v.verify(&sw_headers(SW_SIG, "1614265330"), body, at(SW_T - 301));
    assert_eq!(early.unwrap_err().result(), "expired");
    let none = headers(&[("webhook-id", SW_ID), ("webhook-timestamp", "1")]);
    assert_eq!(
        v.verify(&none, body, at(SW_T)),
        Err(SignatureError::Missing("webhook-signature"))
    );
    let unsigned = v.verify(&sw_headers("v1a,Zm9v", "1614265330"), body, at(SW_T));
    assert_eq!(unsigned.unwrap_err().result(), "malformed");
}

#[test]
fn github_verifies_its_documented_example() {
    // docs.github.com, "Validating webhook deliveries": its test values.
    let v = verifier(Scheme::Github, &["It's a Secret to Everybody"]);
    let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let h = headers(&[("x-hub-signature-256", sig)]);
    assert!(v.verify(&h, b"Hello, World!", at(0)).is_ok());
    assert_eq!(
        v.verify(&h, b"Hello, World?", at(0)),
        Err(SignatureError::Mismatch { secrets: 1 })
    );
    let upper = headers(&[("x-hub-signature-256", &sig.to_uppercase())]);
    assert!(v.verify(&upper, b"Hello, World!", at(0)).is_err());
    assert_eq!(
        v.verify(&HeaderMap::new(), b"Hello, World!", at(0)),
        Err(SignatureError::Missing("x-hub-signature-256"))
    );
    let twice = headers(&[("x-hub-signature-256", sig), ("x-hub-signature-256", sig)]);
    assert_eq!(
        v.verify(&twice, b"Hello, World!", at(0))
            .unwrap_err()
            .result(),
        "malformed"
    );
}

#[test]
fn shopify_verifies_a_base64_hmac_of_the_body() {
    let body = br#"{"id":820982911946154508}"#;
    let h = headers(&[(
        "x-shopify-hmac-sha256",
        "jqbalbO3Z8mDmrF2/+wzM3KYvbgqzVBF969vgiIy80I=",
    )]);
    assert!(verifier(Scheme::Shopify, &["shpss_secret"])
        .verify(&h, body, at(0))
        .is_ok());
    assert!(verifier(Scheme::Shopify, &["shpss_other"])
        .verify(&h, body, at(0))
        .is_err());
}

#[test]
fn stripe_verifies_what_its_library_signed_and_only_refuses_the_past() {
    // stripe-python's `WebhookSignature.generate_signature_header`.
    let body = br#"{"id":"evt_1","object":"event"}"#;
    let value = "t=1700000000,v1=0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd";
    let h = headers(&[("stripe-signature", value)]);
    let v = verifier(Scheme::Stripe, &["whsec_test_secret"]);
    assert!(v.verify(&h, body, at(1_700_000_000)).is_ok());
    assert!(v.verify(&h, body, at(1_700_000_000 - 3600)).is_ok());
    let old = v.verify(&h, body, at(1_700_000_301)).unwrap_err();
    assert_eq!(old.result(), "expired");
    assert_eq!(
        v.verify(&h, br#"{"id":"evt_2","object":"event"}"#, at(1_700_000_000)),
        Err(SignatureError::Mismatch { secrets: 1 })
    );
    let not_text = v.verify(&h, b"\xff", at(1_700_000_000)).unwrap_err();
    assert_eq!(not_text.result(), "malformed");
}

#[test]
fn rotation_tries_every_secret_and_tells_which_verified() {
    let v = verifier(Scheme::Github, &["new", "It's a Secret to Everybody"]);
    let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let h = headers(&[("x-hub-signature-256", sig)]);
    assert_eq!(
        v.verify(&h, b"Hello, World!", at(0)),
        Ok(Verified { secret: 1 })
    );
    let none = verifier(Scheme::Github, &["a", "b"]).verify(&h, b"Hello, World!", at(0));
    assert_eq!(none, Err(SignatureError::Mismatch { secrets: 2 }));
}

#[test]
fn debug_shows_no_secret_and_delivery_ids_are_bounded() {
    let v = verifier(Scheme::Github, &["hunter2-hunter2"]);
    let shown = format!("{v:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("secrets: 1"), "{shown}");
    let long = "x".repeat(1000);
    let h = headers(&[("x-github-delivery", &long)]);
    assert_eq!(
        Scheme::Github.delivery_id(&h, b"").unwrap().len(),
        MAX_LOGGED_ID
    );
    let h = headers(&[("svix-id", "msg_1")]);
    assert_eq!(
        Scheme::StandardWebhooks.delivery_id(&h, b"").as_deref(),
        Some("msg_1")
    );
    let body = br#"{"id":"evt_1\nWARN forged line"}"#;
    assert_eq!(
        Scheme::Stripe
            .delivery_id(&HeaderMap::new(), body)
            .as_deref(),
        Some("evt_1?WARN forged line")
    );
}

#[test]
fn what_a_verifier_signs_it_verifies_for_every_scheme() {
    let now = at(1_700_000_000);
    let secrets = [
        (Scheme::Stripe, "whsec_test_secret"),
        (Scheme::Github, "s3cret"),
        (Scheme::Shopify, "s3cret"),
        (Scheme::StandardWebhooks, SW_SECRET),
    ];
    for (scheme, secret) in secrets {
        let v = verifier(scheme, &[secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]);
        let mut h = headers(&[("webhook-id", "msg_1")]);
        v.sign(&mut h, SW_BODY.as_bytes(), now);
        assert_eq!(
            v.verify(&h, SW_BODY.as_bytes(), now),
            Ok(Verified { secret: 0 }),
            "{scheme:?}"
        );
        assert!(v.verify(&h, b"{}", now).is_err(), "{scheme:?}");
    }
    // Stripe's library signed this header for this body and secret at this time.
    let mut h = HeaderMap::new();
    verifier(Scheme::Stripe, &["whsec_test_secret"]).sign(
        &mut h,
        br#"{"id":"evt_1","object":"event"}"#,
        now,
    );
    assert_eq!(
        h["stripe-signature"],
        "t=1700000000,v1=0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd"
    );
    // And the Standard Webhooks example's signature, with an id where there was none.
    let mut h = headers(&[("webhook-id", SW_ID)]);
    verifier(Scheme::StandardWebhooks, &[SW_SECRET]).sign(&mut h, SW_BODY.as_bytes(), at(SW_T));
    assert_eq!(h["webhook-signature"], SW_SIG);
    let mut h = HeaderMap::new();
    let v = verifier(Scheme::StandardWebhooks, &[SW_SECRET]);
    v.sign(&mut h, SW_BODY.as_bytes(), now);
    assert!(h["webhook-id"].to_str().unwrap().starts_with("msg_"));
    assert!(v.verify(&h, SW_BODY.as_bytes(), now).is_ok());
}
