//! gRPC status codes: their names, how they are read from `grpc-status`, and how a
//! `grpc-message` is percent-encoded (gRPC over HTTP/2: every byte outside printable
//! ASCII, and `%`). Pure.

use http::HeaderMap;

/// The status codes the gateway answers with or reads by name.
pub mod code {
    /// Success.
    pub const OK: u16 = 0;
    /// The client sent a request that cannot be right.
    pub const INVALID_ARGUMENT: u16 = 3;
    /// The deadline passed: the call may or may not have taken effect.
    pub const DEADLINE_EXCEEDED: u16 = 4;
    /// A quota or a size was exceeded.
    pub const RESOURCE_EXHAUSTED: u16 = 8;
    /// The system is not in a state the call needs.
    pub const FAILED_PRECONDITION: u16 = 9;
    /// A concurrency conflict: the client may retry higher up.
    pub const ABORTED: u16 = 10;
    /// The gateway failed.
    pub const INTERNAL: u16 = 13;
    /// Transient: the call did not take effect and may be retried.
    pub const UNAVAILABLE: u16 = 14;
    /// Unauthenticated.
    pub const UNAUTHENTICATED: u16 = 16;
}

/// Every code's name, by number (gRPC's `Code` enum).
const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A code's name (`UNAVAILABLE`), or `None` past the defined codes.
pub fn name(code: u16) -> Option<&'static str> {
    NAMES.get(code as usize).copied()
}

/// A code by number (`14`, any: services may define their own) or name (`"UNAVAILABLE"`, any case), as config writes it.
pub fn parse(text: &str) -> Option<u16> {
    if let Ok(n) = text.parse::<u16>() {
        return Some(n);
    }
    let upper = text.trim().to_ascii_uppercase();
    NAMES.iter().position(|n| *n == upper).map(|i| i as u16)
}

/// A status code as config writes it: a number (`14`) or a name (`"UNAVAILABLE"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code(pub u16);

impl<'de> serde::Deserialize<'de> for Code {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Code;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a gRPC status code: a number such as 14 or a name such as \"UNAVAILABLE\"",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Code, E> {
                u16::try_from(v)
                    .map(Code)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Code, E> {
                u16::try_from(v)
                    .map(Code)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Code, E> {
                parse(v)
                    .map(Code)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The `grpc-status` in `headers` (a trailer section, or a trailers-only head).
pub fn of(headers: &HeaderMap) -> Option<u16> {
    headers
        .get(super::GRPC_STATUS)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `message` as a `grpc-message` value: UTF-8, with every byte outside `0x20..=0x7E`
/// and `%` itself written `%XX`.
pub fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_agree() {
        assert_eq!(name(code::UNAVAILABLE), Some("UNAVAILABLE"));
        assert_eq!(name(code::ABORTED), Some("ABORTED"));
        assert_eq!(name(17), None);
        assert_eq!(parse("14"), Some(14));
        assert_eq!(parse("resource_exhausted"), Some(8));
        assert_eq!(parse("DEADLINE_EXCEEDED"), Some(4));
        assert_eq!(parse("NOPE"), None);
    }

    #[test]
    fn status_is_read_from_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(of(&h), None);
        h.insert(
            super::super::GRPC_STATUS,
            http::HeaderValue::from_static("9"),
        );
        assert_eq!(of(&h), Some(9));
    }

    #[test]
    fn messages_are_percent_encoded_as_grpc_says() {
        assert_eq!(percent_encode("in flight: retry"), "in flight: retry");
        assert_eq!(percent_encode("100% über"), "100%25 %C3%BCber");
        assert_eq!(percent_encode("a\nb"), "a%0Ab");
    }
}
