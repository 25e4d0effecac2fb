//! Parsers for the value syntaxes the file uses: durations, sizes, addresses, header names.
//! Each takes the field's location so its error names it.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::HeaderName;

use super::{invalid, ConfigError};

/// Parses `"250ms"`, `"30s"`, `"24h"`; zero is refused.
pub(super) fn duration(at: &str, v: &str) -> Result<Duration, ConfigError> {
    let d = duration_allow_zero(at, v)?;
    if d.is_zero() {
        return Err(invalid(at, "must be greater than zero"));
    }
    Ok(d)
}

/// Parses a duration that may be zero.
pub(super) fn duration_allow_zero(at: &str, v: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(v).map_err(|e| {
        invalid(
            at,
            format!("{v:?} is not a duration like \"250ms\", \"30s\" or \"24h\" ({e})"),
        )
    })
}

/// A duration field that may be absent.
pub(super) fn opt_duration(
    at: &str,
    v: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |v| duration(at, v))
}

/// Parses `"64KiB"`, `"1MiB"`, `"512"` (bytes).
pub(super) fn size(at: &str, v: &str) -> Result<u64, ConfigError> {
    v.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| {
            invalid(
                at,
                format!("{v:?} is not a size like \"64KiB\" or \"1MiB\" ({e})"),
            )
        })
}

/// A size field that may be absent.
pub(super) fn opt_size(at: &str, v: Option<&str>, default: u64) -> Result<u64, ConfigError> {
    v.map_or(Ok(default), |v| size(at, v))
}

/// Parses a socket address such as `127.0.0.1:8080`.
pub(super) fn addr(at: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse()
        .map_err(|_| invalid(at, format!("{v:?} is not an address like 127.0.0.1:8080")))
}

/// Parses an HTTP header name.
pub(super) fn header_name(at: &str, v: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(v.as_bytes())
        .map_err(|_| invalid(at, format!("{v:?} is not a header name")))
}
