//! Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`, each `v1` an
//! HMAC-SHA256 of `<t>.<body>` under the endpoint secret, compared as lower-case hex
//! (<https://docs.stripe.com/webhooks#verify-manually>). Read as `stripe-python`'s
//! `WebhookSignature.verify_header` reads it: items split at `,`, each at `=`; the first
//! `t` counts; other schemes (`v0`) are ignored; the signature is checked before the age,
//! and only an old timestamp is refused.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

use super::timestamp::{self, Bound};
use super::{header, mac, Secret, SignatureError};

const HEADER: &str = "stripe-signature";

/// The index of the secret that verifies the delivery.
pub(super) fn verify(
    secrets: &[Secret],
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<usize, SignatureError> {
    let value = header::one(headers, HEADER)?;
    let body = header::text_body(body)?;
    let (t, signatures) = parse(value)?;
    // The integer as Stripe's library formats it, whatever zeros the header had.
    let prefix = format!("{t}.");
    let secret = mac::first_secret(secrets, &[prefix.as_bytes(), body], |expected| {
        let expected = hex::encode(expected);
        signatures
            .iter()
            .any(|s| mac::equal(expected.as_bytes(), s.as_bytes()))
    })
    .ok_or(SignatureError::Mismatch {
        secrets: secrets.len(),
    })?;
    timestamp::check(t, now, tolerance, Bound::Past)?;
    Ok(secret)
}

/// Sets `Stripe-Signature` for `body` at `now`, as Stripe signs.
pub(super) fn sign(secret: &Secret, headers: &mut HeaderMap, body: &[u8], now: SystemTime) {
    let t = super::unix_secs(now);
    let mac = mac::hmac_sha256(secret, &[format!("{t}.").as_bytes(), body]);
    let value = format!("t={t},v1={}", hex::encode(mac));
    // Digits, letters, `=` and `,`: always a header value.
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HEADER, v);
    }
}

/// The timestamp and the `v1` signatures of a `Stripe-Signature` value.
fn parse(value: &str) -> Result<(u64, Vec<&str>), SignatureError> {
    let malformed = |why| SignatureError::Malformed { what: HEADER, why };
    let mut t = None;
    let mut signatures = Vec::new();
    for item in value.split(',') {
        let mut kv = item.split('=');
        let key = kv.next().unwrap_or_default();
        if key != "t" && key != "v1" {
            continue;
        }
        let Some(v) = kv.next() else {
            return Err(malformed("has an item without a value"));
        };
        if key == "v1" {
            signatures.push(v);
        } else if t.is_none() {
            let secs = v.trim().parse::<u64>();
            t = Some(secs.map_err(|_| malformed("t= is not a whole number of seconds"))?);
        }
    }
    let t = t.ok_or_else(|| malformed("has no t= timestamp"))?;
    if signatures.is_empty() {
        return Err(malformed("has no v1= signature"));
    }
    Ok((t, signatures))
}

/// The event's `id`, for a log line.
pub(super) fn event_id(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Event {
        id: String,
    }
    serde_json::from_slice::<Event>(body).ok().map(|e| e.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_stripes_library_does() {
        let (t, sigs) = parse("t=0001700000000,v1=aa,v0=bb,v1=cc=dd,x").unwrap();
        assert_eq!(t, 1_700_000_000);
        // `split("=", 2)` then `[1]`: what follows a second `=` is dropped.
        assert_eq!(sigs, ["aa", "cc"]);
        assert_eq!(parse("t=1,t=2,v1=a").unwrap().0, 1);
        for bad in ["v1=aa", "t=1,v0=bb", "t=x,v1=aa", "t,v1=a", "t=1,v1"] {
            assert!(
                matches!(parse(bad), Err(SignatureError::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn event_ids_come_from_the_body() {
        assert_eq!(
            event_id(br#"{"id":"evt_1","object":"event"}"#).as_deref(),
            Some("evt_1")
        );
        assert_eq!(event_id(b"not json"), None);
    }
}
