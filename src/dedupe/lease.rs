//! A won claim as a capability: the only way to settle the key it owns.
//!
//! Modelled on pingora-cache's `WritePermit`: a [`Lease`] is consumed by exactly one of
//! [`Lease::complete`], [`Lease::release`] or [`Lease::keep`], so completing under a fence
//! one does not hold, or forgetting to settle, cannot be written. Dropping a lease unsettled
//! (a bug, or a task cut off mid-call) is an unknown outcome and is logged as one.
//!
//! While the upstream call runs, [`Lease::renewing`] extends the lease every third of it,
//! so a slow call is never taken over while its gateway lives, and a dead gateway's claim
//! is free (or held, on a holding route) one short lease later.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, error, warn};

use super::Finish;
use crate::store::{Completion, Fence, Order, Permit, Store, StoreKey};
use crate::telemetry::metrics::{ClaimEvent, Metrics, StoreOp};

/// The right to settle one key under one fence.
#[must_use = "a lease must be settled: complete, release or keep it"]
pub struct Lease<'a> {
    store: &'a Store,
    metrics: &'a Metrics,
    permit: Permit,
    lease: Duration,
    window: Duration,
    hold: bool,
    /// On an ordered route: the entity and version this claim marked in flight, settled
    /// with the key in the same store step.
    order: Option<Order<'a>>,
    settled: bool,
    /// A renewal was sent (it may have rewritten the record, even one that failed).
    renewed: std::sync::atomic::AtomicBool,
}

/// The shortest pause between two renewals, whatever the lease.
const MIN_RENEW_EVERY: Duration = Duration::from_millis(10);

impl<'a> Lease<'a> {
    /// The lease a store granted with `permit`, for `policy.lease` at a time, its record
    /// kept for `policy.window` once settled.
    pub(super) fn new(
        store: &'a Store,
        metrics: &'a Metrics,
        permit: Permit,
        policy: &super::Policy,
        order: Option<Order<'a>>,
    ) -> Self {
        Self {
            store,
            metrics,
            permit,
            lease: policy.lease,
            window: policy.window,
            hold: policy.on_unknown == crate::protocol::route::OnUnknown::Hold,
            order,
            settled: false,
            renewed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Runs `call` (the upstream call) while renewing the lease every third of it. A
    /// renewal refused because the key was taken over stops the renewals (logged and
    /// counted); the call still runs to its end, and settling it will be refused too.
    pub async fn renewing<F: Future>(&self, call: F) -> F::Output {
        let mut call = std::pin::pin!(call);
        tokio::select! {
            out = &mut call => return out,
            () = self.keep_renewed() => {}
        }
        call.await
    }

    /// Renews until a renewal is refused. A failed renewal (store error) is retried at the
    /// next tick: two more chances before the lease runs out.
    async fn keep_renewed(&self) {
        let every = (self.lease / 3).max(MIN_RENEW_EVERY);
        loop {
            tokio::time::sleep(every).await;
            let started = Instant::now();
            self.renewed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let renewed = self.store.renew(&self.permit, self.lease, self.order).await;
            self.metrics
                .store_op(StoreOp::Renew, started.elapsed(), renewed.is_ok());
            match renewed {
                Ok(true) => {
                    debug!(store_key = %self.key(), fence = self.fence().get(), "lease renewed")
                }
                Ok(false) => {
                    warn!(store_key = %self.key(), fence = self.fence().get(),
                        "lease renewal refused: the key was taken over under a newer fence or settled; renewals stop");
                    self.metrics.event(ClaimEvent::RenewalRefused);
                    return;
                }
                Err(e) => {
                    warn!(store_key = %self.key(), fence = self.fence().get(), error = %e,
                        "could not renew the lease; trying again at the next tick");
                }
            }
        }
    }

    fn key(&self) -> &StoreKey {
        self.permit.key()
    }

    fn fence(&self) -> Fence {
        self.permit.fence()
    }

    /// Stores the final response (`record`, encoded under this key): duplicates replay it.
    ///
    /// Once the upstream has answered, this write is the most valuable one the gateway
    /// makes: unstored, a retry after the lease executes again. So a completion that
    /// times out or finds the store unavailable is tried again until one lease from now
    /// (fixed: renewals do not move it), while the lease is kept renewed. A retry is
    /// fenced like the first try, so it never overwrites a successor; one refused because
    /// an earlier try landed after all counts as stored.
    pub async fn complete(mut self, record: Bytes) -> Finish {
        self.settled = true;
        if *self.renewed.get_mut() {
            self.permit.renewed();
        }
        let deadline = tokio::time::Instant::now() + self.lease;
        let started = Instant::now();
        let mut done = self
            .store
            .complete(&self.permit, record.clone(), self.window, self.order)
            .await;
        self.metrics
            .store_op(StoreOp::Complete, started.elapsed(), done.is_ok());
        if let Err(e) = &done {
            if retryable(e) {
                warn!(store_key = %self.key(), fence = self.fence().get(), error = %e,
                    "could not store the response; trying again within one lease");
                done = self.renewing(self.complete_again(&record, deadline)).await;
            }
        }
        match done {
            Ok(Completion::Completed) => Finish::Completed,
            Ok(Completion::Fenced) => {
                warn!(store_key = %self.key(), fence = self.fence().get(),
                    "completion refused: the key was taken over under a newer fence; this response reached its client only");
                self.metrics.event(ClaimEvent::FencedOut);
                Finish::FencedOut
            }
            Err(e) => {
                error!(store_key = %self.key(), fence = self.fence().get(), error = %e,
                    "could not store the response: a retry after the lease expires will execute again");
                Finish::Unstored
            }
        }
    }

    /// The completion tried again until `deadline`, each try after a pause that doubles
    /// (from 10 ms, at most a tenth of the lease). Renewals may run meanwhile, so a try
    /// checks ownership by fence and claimant only (see [`Permit::renewed`]); a try
    /// refused because the record already holds this fence's completion (an earlier try
    /// that timed out here and landed there) is the completion.
    async fn complete_again(
        &self,
        record: &Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<Completion, crate::store::StoreError> {
        let mut permit = self.permit.clone();
        permit.renewed();
        let most = (self.lease / 10).max(MIN_RENEW_EVERY);
        let mut pause = MIN_RENEW_EVERY;
        loop {
            tokio::time::sleep(pause.min(most)).await;
            pause *= 2;
            let started = Instant::now();
            let attempt = self
                .store
                .complete(&permit, record.clone(), self.window, self.order);
            let done = match tokio::time::timeout_at(deadline, attempt).await {
                Ok(done) => done,
                Err(_) => Err(crate::store::StoreError::Timeout(self.lease)),
            };
            self.metrics
                .store_op(StoreOp::Complete, started.elapsed(), done.is_ok());
            match done {
                Ok(Completion::Fenced) if self.landed().await => return Ok(Completion::Completed),
                Err(e) if retryable(&e) && tokio::time::Instant::now() < deadline => {
                    debug!(store_key = %self.key(), fence = self.fence().get(), error = %e,
                        "completion failed again; trying again");
                }
                done => return done,
            }
        }
    }

    /// Whether the record holds this fence's completion.
    async fn landed(&self) -> bool {
        match self.store.inspect(self.key()).await {
            Ok(Some(info)) => {
                info.state == crate::store::RecordState::Completed && info.fence == self.fence()
            }
            _ => false,
        }
    }

    /// Frees the key after a failure that had no effect: the next request executes. The
    /// record keeps its fence, so the next owner's is higher.
    pub async fn release(mut self) -> Finish {
        self.settled = true;
        let started = Instant::now();
        let released = self
            .store
            .release(&self.permit, self.window, self.order)
            .await;
        self.metrics
            .store_op(StoreOp::Release, started.elapsed(), released.is_ok());
        match released {
            Ok(true) => Finish::Released,
            Ok(false) => {
                warn!(store_key = %self.key(), fence = self.fence().get(),
                    "release refused: the key was taken over under a newer fence");
                self.metrics.event(ClaimEvent::FencedOut);
                Finish::FencedOut
            }
            Err(e) => {
                error!(store_key = %self.key(), fence = self.fence().get(), error = %e,
                    "could not release the claim: retries get 409 until its lease expires");
                Finish::Unstored
            }
        }
    }

    /// Leaves the claim as it is because the outcome is unknown (the upstream may have
    /// acted without answering): duplicates get 409 until the lease ends; then, with
    /// `on_unknown = "retry"`, a retry takes over under a higher fence, and with `"hold"`
    /// the key waits for an operator.
    pub fn keep(mut self) -> Finish {
        self.settled = true;
        if self.hold {
            warn!(store_key = %self.key(), fence = self.fence().get(),
                "outcome unknown: the claim is held for an operator once its lease ends");
        } else {
            warn!(store_key = %self.key(), fence = self.fence().get(),
                "outcome unknown: the claim is kept until its lease expires, then a retry executes again");
        }
        Finish::OutcomeUnknown
    }
}

/// Whether a failed store operation may succeed if sent again: no answer in time, or no
/// connection. A reply the gateway cannot read, or a full embedded store, will not change
/// in the next moments.
fn retryable(e: &crate::store::StoreError) -> bool {
    matches!(
        e,
        crate::store::StoreError::Timeout(_) | crate::store::StoreError::Unavailable(_)
    )
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.settled {
            warn!(store_key = %self.key(), fence = self.fence().get(),
                "lease dropped before its outcome was known: the claim is kept until its lease expires");
        }
    }
}
