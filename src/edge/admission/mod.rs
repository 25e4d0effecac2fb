//! Admission before the claim: how many keyed requests may be between admission and their
//! claim's answer at once, a limit that follows the latency those claims measure.
//!
//! Shedding at the door costs nothing: a request refused here was neither claimed nor sent
//! upstream, and its retry is as good as new. Queueing instead costs twice: a claim that
//! waits behind the gateway's own work times out (a 503 after the body was read), and a
//! completion queued behind it may time out after the upstream ran. So the limit keeps
//! the queue short rather than full.
//!
//! A keyed request that finds the limit reached waits for a place, first come first
//! served, up to `server.admission_timeout` (the HAProxy `timeout queue` of this gateway),
//! and only then is refused. Waiting costs nothing but the connection and its body (counted
//! in the byte budget), while a refusal costs a retry: a client that retries at once (as a
//! closed-loop load generator does) would otherwise turn the gateway's CPU into refusals,
//! and the claims it did admit would queue behind them. The time spent waiting is not part
//! of the claim's latency: the claim's `store.timeout` starts once it is admitted.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

use self::limiter::Limiter;
use super::budget::Held;
use super::{Gateway, Live};
use crate::protocol::route::Route;
use crate::telemetry::metrics::ClaimEvent;

mod limiter;

/// The gateway's one admission limit, shared by every request, and the requests waiting
/// for a place under it.
#[derive(Debug)]
pub(super) struct Admission {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limiter: Limiter,
    /// Waiting requests, oldest first; each is sent the moment its place was given. A
    /// waiter that gave up has dropped its receiver, and is skipped.
    waiters: VecDeque<oneshot::Sender<Instant>>,
    /// How many of `waiters` still wait (those that gave up are still queued until they
    /// reach the front).
    waiting: usize,
    /// `server.max_concurrent_claims` as the last request to arrive read it: a reload
    /// applies to places handed over from then on.
    ceiling: usize,
}

impl State {
    /// Gives places to waiters, oldest first, while the limit has room.
    fn hand_over(&mut self) {
        while !self.waiters.is_empty() && self.limiter.try_acquire(self.ceiling) {
            let given = self
                .waiters
                .pop_front()
                .is_some_and(|waiter| waiter.send(Instant::now()).is_ok());
            if given {
                self.waiting -= 1;
            } else {
                self.limiter.cancel();
            }
        }
        // Waiters that gave up behind a live one leave when they reach the front.
        while self.waiters.front().is_some_and(|w| w.is_closed()) {
            self.waiters.pop_front();
        }
    }

    /// Reads the ceiling a request brings, then gives waiters the places it allows.
    fn arrive(&mut self, ceiling: usize) {
        self.ceiling = ceiling;
        self.hand_over();
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                limiter: Limiter::new(Instant::now()),
                waiters: VecDeque::new(),
                waiting: 0,
                ceiling: usize::MAX,
            }),
        }
    }
}

/// What the limit admits against: `server.max_concurrent_claims`, `store.timeout` and
/// `server.admission_timeout`, read from the live configuration so that a reload applies
/// them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub ceiling: usize,
    pub timeout: Duration,
    /// How long a request may wait for a place (zero: not at all).
    pub wait: Duration,
}

/// The limit, how many it admitted, and how many wait for a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Load {
    pub limit: usize,
    pub claiming: usize,
    pub waiting: usize,
}

impl Admission {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one claim now, or `None` when the limit is reached (or others wait for
    /// one). `measure_unclaimed`: whether the time to an answer that forwards nothing (a
    /// replay, a conflict) measures the store; not on routes whose duplicates wait on
    /// purpose.
    #[cfg(test)]
    pub(super) fn try_admit(
        self: &Arc<Self>,
        bounds: Bounds,
        measure_unclaimed: bool,
    ) -> Option<Permit> {
        let mut state = self.lock();
        state.arrive(bounds.ceiling);
        let admitted = state.waiters.is_empty() && state.limiter.try_acquire(bounds.ceiling);
        drop(state);
        admitted.then(|| self.permit(bounds, measure_unclaimed, Instant::now()))
    }

    /// A place for one claim, waiting for it up to `bounds.wait` behind those that came
    /// first; `None` when none came in that time.
    pub(super) async fn admit(
        self: &Arc<Self>,
        bounds: Bounds,
        measure_unclaimed: bool,
    ) -> Option<Permit> {
        let rx = {
            let mut state = self.lock();
            state.arrive(bounds.ceiling);
            if state.waiters.is_empty() && state.limiter.try_acquire(bounds.ceiling) {
                drop(state);
                return Some(self.permit(bounds, measure_unclaimed, Instant::now()));
            }
            if bounds.wait.is_zero() {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            state.waiters.push_back(tx);
            state.waiting += 1;
            rx
        };
        let mut waiting = Waiting {
            admission: self,
            rx: Some(rx),
        };
        let given = match tokio::time::timeout(bounds.wait, waiting.rx.as_mut()?).await {
            Ok(given) => {
                waiting.rx = None;
                given.ok()
            }
            Err(_) => waiting.settle(),
        };
        given.map(|at| self.permit(bounds, measure_unclaimed, at))
    }

    fn permit(self: &Arc<Self>, bounds: Bounds, measure_unclaimed: bool, at: Instant) -> Permit {
        Permit {
            admission: self.clone(),
            bounds,
            admitted: at,
            measure_unclaimed,
            claimed: false,
        }
    }

    /// The limit now, how many are admitted, and how many wait.
    pub(super) fn load(&self, ceiling: usize) -> Load {
        let mut state = self.lock();
        state.arrive(ceiling);
        Load {
            limit: state.limiter.limit(ceiling),
            claiming: state.limiter.inflight(),
            waiting: state.waiting,
        }
    }
}

/// A request waiting for a place. Places are given under the lock, so a look under it
/// sees every place given so far, and a receiver dropped under it gets none after: a wait
/// that runs out, or a request dropped while it waits (its client gone), takes what was
/// given, or gives it back.
struct Waiting<'a> {
    admission: &'a Arc<Admission>,
    rx: Option<oneshot::Receiver<Instant>>,
}

impl Waiting<'_> {
    /// When the place was given, if it was; no place can come after.
    fn settle(&mut self) -> Option<Instant> {
        let mut rx = self.rx.take()?;
        let mut state = self.admission.lock();
        let given = rx.try_recv().ok();
        drop(rx);
        if given.is_none() {
            state.waiting -= 1;
        }
        given
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.settle().is_some() {
            let mut state = self.admission.lock();
            state.limiter.cancel();
            state.hand_over();
        }
    }
}

/// One admitted claim's place: given back, with its latency, when dropped (to the oldest
/// waiter, if any).
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
        let mut state = self.admission.lock();
        state.limiter.release(took, now, bounds);
        state.hand_over();
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
    /// `server.max_connections` of them, no new claim is made), the admission limit
    /// (waiting for a place up to `server.admission_timeout`), and the room its answer may
    /// take in the byte budget.
    pub(super) async fn admit_claim(
        &self,
        live: &Live,
        route: &Route,
        mut held: Held,
    ) -> Result<Admitted, Shed> {
        let server = &live.config.server;
        if self.detached() >= server.max_connections {
            return Err(Shed::Detached);
        }
        let bounds = Bounds {
            ceiling: server.max_concurrent_claims,
            timeout: live.config.store.timeout,
            wait: server.admission_timeout,
        };
        let permit = self
            .admission
            .admit(bounds, !route.on_conflict.waits())
            .await
            .ok_or(Shed::Limit)?;
        // A streamed answer is kept for the store (and for joiners) up to this much: room
        // taken once admitted, so that requests waiting for a place hold only their bodies.
        let answer_room = if route.store_body || route.grpc {
            route.max_cached_body
        } else {
            0
        };
        if !held.grow(answer_room, server.max_buffered_bytes) {
            permit.unmeasured();
            return Err(Shed::Memory);
        }
        Ok(Admitted { permit, held })
    }

    /// Counts a refusal before the claim; logs it at `warn` at most once a second (a
    /// gateway at its limit refuses thousands a second), at `debug` otherwise.
    pub(super) fn shed(&self, shed: Shed, live: &Live) {
        self.metrics.event(ClaimEvent::Overloaded);
        let server = &live.config.server;
        let Load {
            limit,
            claiming,
            waiting,
        } = self.admission.load(server.max_concurrent_claims);
        let second = self.started.elapsed().as_secs() + 1;
        let last = self.shed_logged.load(Ordering::Relaxed);
        let due = last < second
            && self
                .shed_logged
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        let why = match shed {
            Shed::Limit => {
                "no place under the admission limit came within server.admission_timeout"
            }
            Shed::Memory => "buffered bodies fill server.max_buffered_bytes",
            Shed::Detached => "too many requests whose clients left are still running",
        };
        let buffered = self.budget.held();
        if due {
            warn!(
                limit,
                claiming,
                waiting,
                buffered,
                "{why}: refusing keyed requests before their claim (503 overloaded)"
            );
        } else {
            debug!(
                limit,
                claiming, waiting, buffered, "{why}: refused before the claim"
            );
        }
    }
}

#[cfg(test)]
mod tests;
