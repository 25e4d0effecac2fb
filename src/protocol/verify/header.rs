//! Reading the headers a signature depends on: exactly one value each, so the gateway and
//! the receiver behind it cannot read two different ones.

use http::HeaderMap;

use super::SignatureError;

/// The one value of `name` (lower case), as text. Absent or empty is `Missing`; twice, or
/// bytes outside visible ASCII, is `Malformed`.
pub(super) fn one<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<&'a str, SignatureError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Err(SignatureError::Missing(name));
    };
    if values.next().is_some() {
        return Err(SignatureError::Malformed {
            what: name,
            why: "appears more than once",
        });
    }
    let text = value.to_str().map_err(|_| SignatureError::Malformed {
        what: name,
        why: "is not visible ASCII",
    })?;
    if text.trim().is_empty() {
        return Err(SignatureError::Missing(name));
    }
    Ok(text)
}

/// The first value of `name`, if it is text: for log lines only.
pub(super) fn first(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The body as text, for schemes whose libraries sign the body as a string.
pub(super) fn text_body(body: &[u8]) -> Result<&[u8], SignatureError> {
    std::str::from_utf8(body)
        .map(str::as_bytes)
        .map_err(|_| SignatureError::Malformed {
            what: "body",
            why: "is not UTF-8, and the scheme signs the body as text",
        })
}
