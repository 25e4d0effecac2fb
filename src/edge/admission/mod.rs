//! Admission before the claim: how many keyed requests may be between admission and their
//! claim's answer at once, a limit that follows the latency those claims measure.
//!
//! Shedding at the door costs nothing: a request refused here was neither claimed nor sent
//! upstream, and its retry is as good as new. Queueing instead costs twice: a claim that
//! waits behind the gateway's own work times out (a 503 after the body was read), and a
//! completion queued behind it may time out after the upstream ran. So the limit keeps
//! the queue short rather than full.
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

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::budget::Held;
use super::{Gateway, Live};
use crate::protocol::route::Route;
use crate::telemetry::metrics::ClaimEvent;

/// The lowest the limit goes: a store that is merely slow still gets claims to measure.
pub(super) const MIN_LIMIT: usize = 8;
/// Where the limit starts (within the ceiling): a healthy store's claims take about a
/// millisecond, so this carries tens of thousands of claims a second before it grows.
const INITIAL_LIMIT: usize = 128;
/// How much slower than the long-run average a window may be before the limit stops
/// growing.
const TOLERANCE: f64 = 1.5;
/// A window closes after at least this long ...
const WINDOW_TIME: Duration = Duration::from_millis(100);
/// ... and at least this many samples.
const WINDOW_SAMPLES: u32 = 16;
/// The long-run average's memory, in windows (an exponential average).
const LONG_WINDOWS: f64 = 50.0;
/// The share of the way to `limit × gradient + √limit` a rising limit moves in one window.
const SMOOTHING: f64 = 0.5;

/// The limit's state: what is admitted now, and what the current window measured.
#[derive(Debug)]
pub(super) struct Limiter {
    limit: f64,
    inflight: usize,
    window: Window,
    /// The long-run average latency, in seconds, once a window has closed.
    long: Option<f64>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    samples: u32,
    total: Duration,
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

/// The gateway's one admission limit, shared by every request.
#[derive(Debug)]
pub(super) struct Admission {
    limiter: Mutex<Limiter>,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            limiter: Mutex::new(Limiter::new(Instant::now())),
        }
    }
}

/// What the limit admits against: `server.max_concurrent_claims` and `store.timeout`, read
/// from the live configuration so that a reload applies them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub ceiling: usize,
    pub timeout: Duration,
}

impl Admission {
    fn lock(&self) -> std::sync::MutexGuard<'_, Limiter> {
        self.limiter.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one claim, or `None` when the limit is reached. `measure_unclaimed`:
    /// whether the time to an answer that forwards nothing (a replay, a conflict) measures
    /// the store; not on routes whose duplicates wait on purpose.
    pub(super) fn try_admit(
        self: &Arc<Self>,
        bounds: Bounds,
        measure_unclaimed: bool,
    ) -> Option<Permit> {
        self.lock().try_acquire(bounds.ceiling).then(|| Permit {
            admission: self.clone(),
            bounds,
            admitted: Instant::now(),
            measure_unclaimed,
            claimed: false,
        })
    }

    /// The limit now, and how many are admitted.
    pub(super) fn load(&self, ceiling: usize) -> (usize, usize) {
        let limiter = self.lock();
        (limiter.limit(ceiling), limiter.inflight())
    }
}

/// One admitted claim's place: given back, with its latency, when dropped.
pub(super) struct Permit {
    admission: Arc<Admission>,
    bounds: Bounds,
    admitted: Instant,
    measure_unclaimed: bool,
    claimed: bool,
}

impl Permit {
    /// The claim was won (or the store failed and the request goes on unguarded): its
    /// answer came now, and it measures the store.
    pub(super) fn claimed(mut self) {
        self.claimed = true;
    }

    /// Gives the place back without a measure (no claim was made).
    pub(super) fn unmeasured(mut self) {
        self.measure_unclaimed = false;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let now = Instant::now();
        let took =
            (self.claimed || self.measure_unclaimed).then(|| now.duration_since(self.admitted));
        let bounds = (self.bounds.ceiling, self.bounds.timeout);
        self.admission.lock().release(took, now, bounds);
    }
}

/// Why a keyed request was refused before its claim (each a 503 `overloaded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shed {
    /// The admission limit was reached.
    Limit,
    /// Buffered bodies filled `server.max_buffered_bytes`.
    Memory,
    /// As many requests whose clients left still run as `server.max_connections`.
    Detached,
}

/// What an admitted keyed request holds: its place until its claim is answered, and its
/// buffered bytes until its task ends.
pub(super) struct Admitted {
    pub permit: Permit,
    pub held: Held,
}

impl Gateway {
    /// Admits a keyed request whose body is read (and counted in `held`) to its claim, or
    /// says why not. The one check before the claim: requests whose clients left (past
    /// `server.max_connections` of them, no new claim is made), the room its answer may
    /// take in the byte budget, and the admission limit.
    pub(super) fn admit_claim(
        &self,
        live: &Live,
        route: &Route,
        mut held: Held,
    ) -> Result<Admitted, Shed> {
        let server = &live.config.server;
        if self.detached() >= server.max_connections {
            return Err(Shed::Detached);
        }
        // A streamed answer is kept for the store (and for joiners) up to this much.
        let answer_room = if route.store_body || route.grpc {
            route.max_cached_body
        } else {
            0
        };
        if !held.grow(answer_room, server.max_buffered_bytes) {
            return Err(Shed::Memory);
        }
        let bounds = Bounds {
            ceiling: server.max_concurrent_claims,
            timeout: live.config.store.timeout,
        };
        let permit = self
            .admission
            .try_admit(bounds, !route.on_conflict.waits())
            .ok_or(Shed::Limit)?;
        Ok(Admitted { permit, held })
    }

    /// Counts a refusal before the claim; logs it at `warn` at most once a second (a
    /// gateway at its limit refuses thousands a second), at `debug` otherwise.
    pub(super) fn shed(&self, shed: Shed, live: &Live) {
        self.metrics.event(ClaimEvent::Overloaded);
        let server = &live.config.server;
        let (limit, claiming) = self.admission.load(server.max_concurrent_claims);
        let second = self.started.elapsed().as_secs() + 1;
        let last = self.shed_logged.load(Ordering::Relaxed);
        let due = last < second
            && self
                .shed_logged
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        let why = match shed {
            Shed::Limit => "the admission limit is reached",
            Shed::Memory => "buffered bodies fill server.max_buffered_bytes",
            Shed::Detached => "too many requests whose clients left are still running",
        };
        let buffered = self.budget.held();
        if due {
            warn!(
                limit,
                claiming,
                buffered,
                "{why}: refusing keyed requests before their claim (503 overloaded)"
            );
        } else {
            debug!(limit, claiming, buffered, "{why}: refused before the claim");
        }
    }
}

#[cfg(test)]
mod tests;
