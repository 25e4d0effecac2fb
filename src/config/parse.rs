//! Parsers for the value syntaxes the file uses: durations, sizes, counts, addresses,
//! header names. Each takes the field's location so its error names it, and every number
//! is held to an upper bound here, so no later `Instant + d`, multiplication or allocation
//! sized by config can overflow or panic at run time.

use std::net::SocketAddr;
use std::time::Duration;

use http::header::HeaderName;

use super::{invalid, ConfigError};

const DURATION_SYNTAX: &str = "a duration like \"250ms\", \"30s\", \"24h\" or \"1h 30m\" \
     (whole numbers; units ns, us, ms, s, m, h, d, w)";
const SIZE_SYNTAX: &str =
    "a size like \"512\", \"64KiB\" or \"1MiB\" (bytes, or KiB, MiB, GiB, TiB)";

/// The size units a config may use: binary only. `1MB`, `1Mb`, `1M` and `1 MiB` are
/// refused rather than guessed at (`1Mb` would be a million bytes to some readers, a
/// megabit to others).
const SIZE_UNITS: [(&str, u64); 5] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// A whole number of bytes, with an optional binary unit straight after it.
fn size_bytes(v: &str) -> Option<u64> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = v.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let scale = match unit {
        "" => 1,
        unit => SIZE_UNITS.iter().find(|(u, _)| *u == unit)?.1,
    };
    // Past u64, still a size: out of any range, and said so.
    Some(n.saturating_mul(scale))
}

/// Parses `"250ms"`, `"30s"`, `"24h"`; zero is refused, and so is anything over `max`.
pub(super) fn duration(at: &str, v: &str, max: Duration) -> Result<Duration, ConfigError> {
    let d = duration_allow_zero(at, v, max)?;
    if d.is_zero() {
        return Err(invalid(at, "must be greater than zero"));
    }
    Ok(d)
}

/// A duration in the file's own units, largest first: `365d`, `1h 30m`, `250ms`, so that
/// what `check` prints can be pasted back into the file.
pub fn format_duration(d: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let mut left = d.as_nanos();
    if left == 0 {
        return "0s".to_owned();
    }
    let mut parts = Vec::new();
    for (unit, size) in UNITS {
        if left >= size {
            parts.push(format!("{}{unit}", left / size));
            left %= size;
        }
    }
    parts.join(" ")
}

/// Parses a duration that may be zero, up to `max`.
pub(super) fn duration_allow_zero(
    at: &str,
    v: &str,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let too_long = || {
        invalid(
            at,
            format!("{v:?} is too long: at most {}", format_duration(max)),
        )
    };
    match duration_nanos(v) {
        Some(Some(nanos)) if nanos <= max.as_nanos() => Ok(Duration::new(
            (nanos / 1_000_000_000) as u64,
            (nanos % 1_000_000_000) as u32,
        )),
        Some(_) => Err(too_long()),
        None => Err(invalid(at, format!("{v:?} is not {DURATION_SYNTAX}"))),
    }
}

/// A duration field that may be absent.
pub(super) fn opt_duration(
    at: &str,
    v: Option<&str>,
    default: Duration,
    max: Duration,
) -> Result<Duration, ConfigError> {
    v.map_or(Ok(default), |v| duration(at, v, max))
}

/// The nanoseconds a duration text denotes: `None` when it is not a duration, `Some(None)`
/// when it is one too large to count. Our own parser rather than humantime's, which
/// panics on some sums of huge parts (`"18446744073709551615s 999999999ns 1ns"`).
fn duration_nanos(v: &str) -> Option<Option<u128>> {
    let mut rest = v.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total: Option<u128> = Some(0);
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let (number, after) = rest.split_at(digits);
        let unit_end = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        // Exactly the units docs/configuration.md lists: the reference promises nothing is
        // guessed, and a spelling accepted here but not listed there is one a reader of
        // the file cannot check (`10mins` next to `10ms`).
        let scale: u128 = match unit {
            "ns" => 1,
            "us" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "w" => 604_800_000_000_000,
            _ => return None,
        };
        // More digits than any u128 holds is still a duration, just one too large.
        let part = number
            .parse::<u128>()
            .ok()
            .and_then(|n| n.checked_mul(scale));
        total = total.zip(part).and_then(|(t, p)| t.checked_add(p));
        rest = after.trim_start();
    }
    Some(total)
}

/// Parses `"64KiB"`, `"1MiB"`, `"512"` (bytes), between `min` and `max`.
pub(super) fn size(at: &str, v: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n = size_bytes(v).ok_or_else(|| invalid(at, format!("{v:?} is not {SIZE_SYNTAX}")))?;
    if !(min..=max).contains(&n) {
        return Err(invalid(
            at,
            format!(
                "{v:?} is out of range: between {} and {}",
                bytesize::ByteSize(min).display().iec(),
                bytesize::ByteSize(max).display().iec(),
            ),
        ));
    }
    Ok(n)
}

/// A size field that may be absent.
pub(super) fn opt_size(
    at: &str,
    v: Option<&str>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    v.map_or(Ok(default), |v| size(at, v, min, max))
}

/// A count that may be absent: at least 1, at most `max`.
pub(super) fn count<T: Copy + PartialOrd + From<u8> + std::fmt::Display>(
    at: &str,
    v: Option<T>,
    default: T,
    max: T,
) -> Result<T, ConfigError> {
    let n = v.unwrap_or(default);
    if n < T::from(1) || n > max {
        return Err(invalid(at, format!("must be between 1 and {max}")));
    }
    Ok(n)
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

#[cfg(test)]
mod tests {
    use super::*;

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    #[test]
    fn durations_parse_in_the_documented_units() {
        let d = |v| duration_allow_zero("x", v, YEAR).unwrap();
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("1h 30m"), Duration::from_secs(5400));
        assert_eq!(d("24h"), Duration::from_secs(86_400));
        assert_eq!(d("3d"), Duration::from_secs(3 * 86_400));
        assert_eq!(d("2w"), Duration::from_secs(14 * 86_400));
        assert_eq!(d("1us 1ns"), Duration::from_nanos(1_001));
        assert_eq!(d("0s"), Duration::ZERO);
    }

    #[test]
    fn only_the_documented_units_are_read() {
        for v in [
            "10sec", "10secs", "10min", "10mins", "1hr", "2days", "1week", "5nsec", "5µs",
            "5millis", "1S", "1H", "10 s",
        ] {
            let e = duration("x", v, YEAR).unwrap_err().to_string();
            assert!(
                e.contains("is not a duration like")
                    && e.contains("units ns, us, ms, s, m, h, d, w"),
                "{v}: {e}"
            );
        }
    }

    #[test]
    fn huge_or_malformed_durations_are_errors_not_panics() {
        for v in [
            "500000000000y",
            "500000000000d",
            "18446744073709551615s 999999999ns 1ns",
            "99999999999999999999999999999999999999999999h",
            "366d",
        ] {
            let e = duration("x", v, YEAR).unwrap_err().to_string();
            assert!(e.starts_with("x: "), "{v}: {e}");
            assert!(!e.contains("overflow") && !e.contains("parse"), "{v}: {e}");
        }
        for v in ["", "s", "30", "30 parsecs", "1.5h", "-1s"] {
            let e = duration("x", v, YEAR).unwrap_err().to_string();
            assert!(e.contains("is not a duration like"), "{v}: {e}");
        }
    }

    #[test]
    fn sizes_are_bounded_and_errors_hide_the_parser() {
        assert_eq!(size("x", "64KiB", 1, 1 << 20).unwrap(), 65_536);
        assert_eq!(size("x", "512", 1, 1 << 20).unwrap(), 512);
        assert_eq!(size("x", "512B", 1, 1 << 20).unwrap(), 512);
        assert_eq!(size("x", "2GiB", 1, u64::MAX).unwrap(), 2 << 30);
        let e = size("x", "", 1, 1 << 20).unwrap_err().to_string();
        assert_eq!(
            e,
            "x: \"\" is not a size like \"512\", \"64KiB\" or \"1MiB\" (bytes, or KiB, MiB, GiB, TiB)"
        );
        // Decimal, bit and bare-letter units, spaces and fractions are refused, not guessed.
        for v in [
            "1Mb", "1MB", "1M", "1 MiB", "1kB", "1.5MiB", "1mib", "-1", "MiB", "1MiBs",
        ] {
            assert!(size("x", v, 0, u64::MAX).is_err(), "{v} was accepted");
        }
        let e = size("x", "99999999TiB", 1, 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("between 1 B and 1.0 MiB"), "{e}");
    }
}
