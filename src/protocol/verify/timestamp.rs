//! How far a signed timestamp may lie from now.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::SignatureError;

/// Which side of now a scheme's libraries bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    /// Too old only (Stripe's libraries accept a timestamp ahead of their clock).
    Past,
    /// Too old or too new (Standard Webhooks).
    Both,
}

/// Checks a timestamp in Unix seconds against `now` and the tolerance, to the nanosecond
/// of `now` as the libraries compare it with their float clocks.
pub(super) fn check(
    signed_at: u64,
    now: SystemTime,
    tolerance: Duration,
    bound: Bound,
) -> Result<(), SignatureError> {
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let signed = Duration::from_secs(signed_at);
    let expired = |age_secs: i64| SignatureError::Expired {
        age_secs,
        tolerance,
    };
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    // `None`: beyond any clock, so never too old.
    if signed.checked_add(tolerance).is_some_and(|end| end < now) {
        return Err(expired(secs(now - signed)));
    }
    if bound == Bound::Both && now.checked_add(tolerance).is_none_or(|end| signed > end) {
        return Err(expired(-secs(signed.saturating_sub(now))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_700_000_000;
    const FIVE_MINUTES: Duration = Duration::from_secs(300);

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn the_tolerance_is_inclusive_to_the_nanosecond() {
        assert!(check(T, at(T + 300, 0), FIVE_MINUTES, Bound::Past).is_ok());
        let e = check(T, at(T + 300, 1), FIVE_MINUTES, Bound::Past).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the signed timestamp is 300 seconds old, outside the tolerance of 300s"
        );
    }

    #[test]
    fn the_future_is_refused_only_where_the_scheme_bounds_it() {
        assert!(check(T + 3600, at(T, 0), FIVE_MINUTES, Bound::Past).is_ok());
        assert!(check(T + 300, at(T, 0), FIVE_MINUTES, Bound::Both).is_ok());
        let e = check(T + 301, at(T, 0), FIVE_MINUTES, Bound::Both).unwrap_err();
        assert!(e.to_string().contains("301 seconds in the future"), "{e}");
        assert!(check(u64::MAX, at(T, 0), FIVE_MINUTES, Bound::Both).is_err());
        assert!(check(u64::MAX, at(T, 0), FIVE_MINUTES, Bound::Past).is_ok());
    }
}
