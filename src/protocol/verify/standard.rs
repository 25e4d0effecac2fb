//! Standard Webhooks (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>):
//! `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature`, a
//! space-separated list of `<version>,<base64>`; each `v1` an HMAC-SHA256 of
//! `<id>.<timestamp>.<body>` under the secret's base64 key. Other versions (`v1a`,
//! asymmetric) are skipped. Svix sends the same as `svix-id`, `svix-timestamp` and
//! `svix-signature`; where both spellings arrive they must agree, because the key may be
//! read from either and must be the id that was signed.

use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::{HeaderMap, HeaderValue};

use super::timestamp::{self, Bound};
use super::{header, mac, Secret, SignatureError};

/// One signed header under its two names.
struct Named {
    standard: &'static str,
    svix: &'static str,
}

const ID: Named = Named {
    standard: "webhook-id",
    svix: "svix-id",
};
const TIMESTAMP: Named = Named {
    standard: "webhook-timestamp",
    svix: "svix-timestamp",
};
const SIGNATURE: Named = Named {
    standard: "webhook-signature",
    svix: "svix-signature",
};

/// The index of the secret that verifies the delivery.
pub(super) fn verify(
    secrets: &[Secret],
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<usize, SignatureError> {
    let id = read(headers, &ID)?;
    let stamp = read(headers, &TIMESTAMP)?;
    let signatures = read(headers, &SIGNATURE)?;
    let body = header::text_body(body)?;
    let t = stamp
        .trim()
        .parse::<u64>()
        .map_err(|_| SignatureError::Malformed {
            what: TIMESTAMP.standard,
            why: "is not a whole number of seconds",
        })?;
    let signatures: Vec<Vec<u8>> = signatures
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, sig)| STANDARD.decode(sig).ok())
        .collect();
    if signatures.is_empty() {
        return Err(SignatureError::Malformed {
            what: SIGNATURE.standard,
            why: "has no v1,<base64> signature",
        });
    }
    // The library signs the timestamp as the integer it parsed.
    let signed = format!("{id}.{t}.");
    let secret = mac::first_secret(secrets, &[signed.as_bytes(), body], |expected| {
        signatures.iter().any(|s| mac::equal(expected, s))
    })
    .ok_or(SignatureError::Mismatch {
        secrets: secrets.len(),
    })?;
    timestamp::check(t, now, tolerance, Bound::Both)?;
    Ok(secret)
}

/// Sets `webhook-timestamp` (now) and `webhook-signature` for `body`, and a `webhook-id`
/// when the request has no id under either name, as a Standard Webhooks sender does.
pub(super) fn sign(secret: &Secret, headers: &mut HeaderMap, body: &[u8], now: SystemTime) {
    let id = match read(headers, &ID) {
        Ok(id) => id.to_owned(),
        Err(_) => {
            let id = format!(
                "msg_{}",
                hex::encode(&mac::hmac_sha256(secret, &[body])[..8])
            );
            headers.remove(ID.svix);
            headers.insert(
                ID.standard,
                HeaderValue::from_str(&id).expect("hex is a header value"),
            );
            id
        }
    };
    let t = super::unix_secs(now);
    let mac = mac::hmac_sha256(secret, &[format!("{id}.{t}.").as_bytes(), body]);
    headers.remove(TIMESTAMP.svix);
    headers.remove(SIGNATURE.svix);
    headers.insert(TIMESTAMP.standard, HeaderValue::from(t));
    let signature = format!("v1,{}", STANDARD.encode(mac));
    headers.insert(
        SIGNATURE.standard,
        HeaderValue::from_str(&signature).expect("base64 is a header value"),
    );
}

/// A header under either of its names; both present must be equal.
fn read<'a>(headers: &'a HeaderMap, name: &Named) -> Result<&'a str, SignatureError> {
    let present = |n: &'static str| match header::one(headers, n) {
        Err(SignatureError::Missing(_)) => Ok(None),
        other => other.map(Some),
    };
    match (present(name.standard)?, present(name.svix)?) {
        (Some(a), Some(b)) if a != b => Err(SignatureError::Malformed {
            what: name.standard,
            why: "differs from its svix- twin",
        }),
        (Some(v), _) | (None, Some(v)) => Ok(v),
        (None, None) => Err(SignatureError::Missing(name.standard)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn either_spelling_is_read_and_twins_must_agree() {
        let h = headers(&[("svix-id", "msg_1")]);
        assert_eq!(read(&h, &ID).unwrap(), "msg_1");
        let h = headers(&[("svix-id", "msg_1"), ("webhook-id", "msg_1")]);
        assert_eq!(read(&h, &ID).unwrap(), "msg_1");
        let h = headers(&[("svix-id", "msg_1"), ("webhook-id", "msg_2")]);
        assert!(matches!(
            read(&h, &ID),
            Err(SignatureError::Malformed { .. })
        ));
        assert_eq!(
            read(&HeaderMap::new(), &ID),
            Err(SignatureError::Missing("webhook-id"))
        );
    }
}
