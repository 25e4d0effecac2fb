//! Schemes that sign the body alone, with an HMAC-SHA256 in one header, compared as the
//! text the provider's own examples compare: GitHub
//! (<https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries>)
//! and Shopify (<https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-5-verify-the-webhook>).
//! Neither signs a timestamp or the delivery id, so a captured delivery verifies forever
//! and under any id header (docs/routing.md says what follows).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::{HeaderMap, HeaderValue};

use super::{header, mac, Secret, SignatureError};

/// Where a body-only scheme puts its MAC, and how it writes it.
pub(super) struct BodyOnly {
    header: &'static str,
    encode: fn(&[u8; 32]) -> String,
}

/// `X-Hub-Signature-256: sha256=<lower-case hex>`.
pub(super) const GITHUB: BodyOnly = BodyOnly {
    header: "x-hub-signature-256",
    encode: |mac| format!("sha256={}", hex::encode(mac)),
};

/// `X-Shopify-Hmac-Sha256: <base64>`.
pub(super) const SHOPIFY: BodyOnly = BodyOnly {
    header: "x-shopify-hmac-sha256",
    encode: |mac| STANDARD.encode(mac),
};

/// Sets the scheme's signature header for `body`, as the provider signs.
pub(super) fn sign(scheme: &BodyOnly, secret: &Secret, headers: &mut HeaderMap, body: &[u8]) {
    let value = (scheme.encode)(&mac::hmac_sha256(secret, &[body]));
    // Hex or base64: always a header value.
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(scheme.header, v);
    }
}

/// The index of the secret that verifies the delivery.
pub(super) fn verify(
    scheme: &BodyOnly,
    secrets: &[Secret],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<usize, SignatureError> {
    let given = header::one(headers, scheme.header)?;
    mac::first_secret(secrets, &[body], |expected| {
        mac::equal((scheme.encode)(expected).as_bytes(), given.as_bytes())
    })
    .ok_or(SignatureError::Mismatch {
        secrets: secrets.len(),
    })
}
