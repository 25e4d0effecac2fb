//! The adaptive limit itself: how many keyed requests may await their claim's answer at once.
//!
//! The limit follows a gradient, as in Netflix's concurrency-limits (`Gradient2Limit`) and
//! Envoy's adaptive concurrency filter: each window of samples compares their average
//! latency (`short`) with a long-run average (`long`), and
//!
//! ```text
//! gradient = clamp(TOLERANCE × long / short, 0.5, 1)
//! new      = limit × gradient + √limit        (√limit: room for the queue to probe)
//! ```
//!
//! While the gradient is 1 (claims no slower than usual) and the window used at least
//! half the limit (an idle gateway learns nothing about a higher one), the limit moves
//! halfway to `new`; while claims get slower than usual it holds. It comes down only
//! against a target: a window whose average passes half of `store.timeout` lowers it at
//! once, in proportion to how far past it is (by half at most per window): past
//! that, claims and completions start to time out, the very failure the limit exists to
//! prevent. The gradient alone never cuts, because the gateway's own CPU is part of what it
//! measures: refusals cost CPU too, and on a busy two-core machine a limit cut while the
//! queue was mostly other requests (reading, refusing) only turned claims into refusals
//! and retries (`tests/overload.rs`: 17% to 31% of first attempts admitted, against 45%
//! to 70% without the cut). The limit never leaves [`MIN_LIMIT`]..=
//! `server.max_concurrent_claims`.
//!
//! A sample is the time from admission to the claim's answer: the store's round trip with
//! the gateway's own queue in front of it (its connection's queue, and its CPU).

use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

/// The lowest the limit goes: a store that is merely slow still gets claims to measure.
pub(super) const MIN_LIMIT: usize = 8;
/// Where the limit starts (within the ceiling): a healthy store's claims take about a
/// millisecond, so this carries tens of thousands of claims a second before it grows.
pub(super) const INITIAL_LIMIT: usize = 128;
/// How much slower than the long-run average a window may be before the limit stops
/// growing.
const TOLERANCE: f64 = 1.5;
/// A window closes after at least this long ...
pub(super) const WINDOW_TIME: Duration = Duration::from_millis(100);
/// ... and at least this many samples.
pub(super) const WINDOW_SAMPLES: u32 = 16;
/// The long-run average's memory, in windows (an exponential average).
const LONG_WINDOWS: f64 = 50.0;
/// The share of the way to `limit × gradient + √limit` a rising limit moves in one window.
const SMOOTHING: f64 = 0.5;

/// The limit's state: what is admitted now, and what the current window measured.
#[derive(Debug)]
pub(super) struct Limiter {
    limit: f64,
    inflight: usize,
    pub(super) window: Window,
    /// The long-run average latency, in seconds, once a window has closed.
    long: Option<f64>,
}

#[derive(Debug)]
pub(super) struct Window {
    started: Instant,
    pub(super) samples: u32,
    pub(super) total: Duration,
    /// The most admitted at once during the window.
    peak: usize,
}

impl Window {
    fn new(now: Instant) -> Self {
        Self {
            started: now,
            samples: 0,
            total: Duration::ZERO,
            peak: 0,
        }
    }
}

/// What a closed window saw: its average latency and the most admitted at once.
struct Measured {
    short: f64,
    peak: usize,
}

impl Limiter {
    /// A limiter starting at [`INITIAL_LIMIT`], its first window opening `now`.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            limit: INITIAL_LIMIT as f64,
            inflight: 0,
            window: Window::new(now),
            long: None,
        }
    }

    /// The limit now, within `ceiling` (`server.max_concurrent_claims`, which a reload
    /// may change).
    pub(super) fn limit(&self, ceiling: usize) -> usize {
        (self.limit.round() as usize).clamp(MIN_LIMIT.min(ceiling), ceiling)
    }

    /// How many are admitted now.
    pub(super) fn inflight(&self) -> usize {
        self.inflight
    }

    /// Admits one more if the limit allows.
    pub(super) fn try_acquire(&mut self, ceiling: usize) -> bool {
        if self.inflight >= self.limit(ceiling) {
            return false;
        }
        self.inflight += 1;
        self.window.peak = self.window.peak.max(self.inflight);
        true
    }

    /// Takes back a place [`Self::try_acquire`] gave, as if never given (its waiter had
    /// left).
    pub(super) fn cancel(&mut self) {
        self.inflight = self.inflight.saturating_sub(1);
    }

    /// One admitted request's claim answered after `took` (`None`: not a measure of the
    /// store, such as a duplicate that waited on purpose); the window closes and the limit
    /// moves when it is due. `timeout` is `store.timeout`.
    pub(super) fn release(
        &mut self,
        took: Option<Duration>,
        now: Instant,
        (ceiling, timeout): (usize, Duration),
    ) {
        self.inflight = self.inflight.saturating_sub(1);
        if let Some(took) = took {
            self.window.samples += 1;
            self.window.total += took;
        }
        let due = now.duration_since(self.window.started) >= WINDOW_TIME
            && self.window.samples >= WINDOW_SAMPLES;
        if due {
            let measured = Measured {
                short: (self.window.total / self.window.samples).as_secs_f64(),
                peak: self.window.peak,
            };
            self.window = Window::new(now);
            self.window.peak = self.inflight;
            self.adapt(&measured, ceiling, timeout);
        }
    }

    /// The gradient step at a window's end.
    fn adapt(&mut self, m: &Measured, ceiling: usize, timeout: Duration) {
        let short = m.short.max(1e-6);
        let mut long = match self.long {
            None => short,
            Some(long) => long + (short - long) / LONG_WINDOWS,
        };
        // After a burst the long average lags above what the store does again: let it
        // come down faster, or the limit grows into the next burst unchecked.
        if long / short > 2.0 {
            long *= 0.95;
        }
        self.long = Some(long);
        let gradient = (TOLERANCE * long / short).clamp(0.5, 1.0);
        // A ceiling below the floor is the ceiling (`clamp` needs its bounds in order).
        let floor = MIN_LIMIT.min(ceiling) as f64;
        let ceiling = ceiling as f64;
        let limit = self.limit.min(ceiling);
        let target = timeout.as_secs_f64() / 2.0;
        let new = (limit * gradient + limit.sqrt()).clamp(floor, ceiling);
        self.limit = if short > target {
            // Past the target, claims and completions are near their timeout: the limit
            // comes down at once, in proportion (by half at most a window).
            (limit * (target / short).max(0.5)).max(floor)
        } else if new >= limit && (m.peak as f64) >= limit / 2.0 {
            limit + (new - limit) * SMOOTHING
        } else {
            limit
        };
        debug!(
            short_ms = short * 1e3,
            long_ms = long * 1e3,
            peak = m.peak,
            gradient,
            limit = self.limit,
            "admission window closed"
        );
    }
}
