//! What a route's upstream calls took lately, for a `Retry-After` that means something:
//! a duplicate that meets a key in flight is told to come back when such a call is
//! usually over, not when the lease would run out.

use std::sync::Mutex;
use std::time::Duration;

/// How many of a route's latest calls are kept.
const SAMPLES: usize = 64;
/// Which of them is "usually": the 90th percentile.
const PERCENTILE: usize = 90;
/// The shortest `Retry-After` worth sending (whole seconds on the wire).
const AT_LEAST: Duration = Duration::from_secs(1);

/// The latest upstream call durations of one route, in a ring.
#[derive(Default)]
pub(super) struct RecentLatency {
    ring: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    millis: Vec<u32>,
    next: usize,
}

impl RecentLatency {
    /// Notes one call's time to its response head.
    pub(super) fn record(&self, took: Duration) {
        let ms = u32::try_from(took.as_millis()).unwrap_or(u32::MAX);
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let at = ring.next;
        if ring.millis.len() < SAMPLES {
            ring.millis.push(ms);
        } else {
            ring.millis[at] = ms;
        }
        ring.next = (at + 1) % SAMPLES;
    }

    /// The 90th percentile of the calls kept, if any.
    fn typical(&self) -> Option<Duration> {
        let mut millis = self
            .ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .millis
            .clone();
        if millis.is_empty() {
            return None;
        }
        millis.sort_unstable();
        let i = (millis.len() * PERCENTILE).div_ceil(100).saturating_sub(1);
        Some(Duration::from_millis(u64::from(millis[i])))
    }

    /// When a duplicate should come back: when the route's calls are usually over, never
    /// past the lease left (by then a takeover or a settled record answers it), and at
    /// least a second. Without any call measured yet, the lease left.
    pub(super) fn retry_after(&self, lease_left: Duration) -> Duration {
        match self.typical() {
            Some(typical) => typical.max(AT_LEAST).min(lease_left.max(AT_LEAST)),
            None => lease_left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE_LEFT: Duration = Duration::from_secs(9);

    #[test]
    fn without_calls_the_lease_left_is_the_answer() {
        assert_eq!(RecentLatency::default().retry_after(LEASE_LEFT), LEASE_LEFT);
    }

    #[test]
    fn the_answer_is_the_90th_percentile_within_one_second_and_the_lease() {
        let r = RecentLatency::default();
        for ms in 1..=100 {
            r.record(Duration::from_millis(ms * 30));
        }
        // The ring keeps the last 64 (1,110 to 3,000 ms): their 90th percentile.
        assert_eq!(r.retry_after(LEASE_LEFT), Duration::from_millis(2_820));
        assert_eq!(
            r.retry_after(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        let fast = RecentLatency::default();
        fast.record(Duration::from_millis(20));
        assert_eq!(fast.retry_after(LEASE_LEFT), AT_LEAST);
        assert_eq!(fast.retry_after(Duration::from_millis(300)), AT_LEAST);
    }
}
