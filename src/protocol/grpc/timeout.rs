//! `grpc-timeout`: how long a call may take, as the gRPC over HTTP/2 protocol writes it
//! (at most eight ASCII digits and a unit: `H`, `M`, `S`, `m`, `u` or `n`). Pure.

use std::time::Duration;

use http::HeaderValue;

/// `grpc-timeout`: the caller's deadline, relative to the call's start.
pub const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// The largest value eight digits hold.
const MAX_DIGITS: u128 = 99_999_999;

/// The units, finest first, with their length in nanoseconds.
const UNITS: [(u128, u8); 6] = [
    (1, b'n'),
    (1_000, b'u'),
    (1_000_000, b'm'),
    (1_000_000_000, b'S'),
    (60 * 1_000_000_000, b'M'),
    (3_600 * 1_000_000_000, b'H'),
];

/// `timeout` as a `grpc-timeout` value: in the finest unit whose digits fit in eight,
/// rounded up (a server never gets less time than it was given), as grpc-go encodes it;
/// past 99,999,999 hours, that many hours.
pub fn encode(timeout: Duration) -> HeaderValue {
    let nanos = timeout.as_nanos();
    let (count, unit) = UNITS
        .iter()
        .map(|&(size, unit)| (nanos.div_ceil(size), unit))
        .find(|&(count, _)| count <= MAX_DIGITS)
        .unwrap_or((MAX_DIGITS, b'H'));
    let mut value = count.to_string().into_bytes();
    value.push(unit);
    HeaderValue::from_bytes(&value).expect("digits and a letter are a valid field value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(d: Duration) -> String {
        encode(d).to_str().unwrap().to_owned()
    }

    #[test]
    fn the_finest_unit_that_fits_in_eight_digits_rounded_up() {
        let cases = [
            (Duration::ZERO, "0n"),
            (Duration::from_nanos(1), "1n"),
            (Duration::from_nanos(99_999_999), "99999999n"),
            (Duration::from_nanos(100_000_000), "100000u"),
            // Rounded up, never down.
            (Duration::from_nanos(100_000_001), "100001u"),
            (Duration::from_millis(500), "500000u"),
            (Duration::from_secs(30), "30000000u"),
            (Duration::from_secs(100), "100000m"),
            (Duration::from_secs(86_400), "86400000m"),
            (Duration::from_secs(100_000), "100000S"),
            (Duration::from_secs(100_000_000), "1666667M"),
            (Duration::from_secs(6_000_000_000), "1666667H"),
            (Duration::MAX, "99999999H"),
        ];
        for (d, want) in cases {
            assert_eq!(encoded(d), want, "{d:?}");
        }
    }

    #[test]
    fn every_value_is_at_most_eight_digits_and_a_unit() {
        for secs in (0..40).map(|p| 1u64 << p) {
            let v = encoded(Duration::from_secs(secs) + Duration::from_nanos(7));
            let (digits, unit) = v.split_at(v.len() - 1);
            assert!(
                (1..=8).contains(&digits.len()),
                "{v}: {} digits",
                digits.len()
            );
            assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{v}");
            assert!("HMSmun".contains(unit), "{v}");
        }
    }
}
