//! A won claim as a capability: the only way to settle the key it owns.
//!
//! Modelled on pingora-cache's `WritePermit`: a [`Lease`] is consumed by exactly one of
//! [`Lease::complete`], [`Lease::release`] or [`Lease::keep`], so completing under a fence
//! one does not hold, or forgetting to settle, cannot be written. Dropping a lease unsettled
//! (a bug, or a task cut off mid-call) is an unknown outcome and is logged as one.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{error, warn};

use super::Finish;
use crate::metrics::Metrics;
use crate::store::{Completion, Fence, Store, StoreKey};

/// The right to settle one key under one fence.
#[must_use = "a lease must be settled: complete, release or keep it"]
pub struct Lease<'a> {
    store: &'a Store,
    metrics: &'a Metrics,
    key: &'a StoreKey,
    fence: Fence,
    window: Duration,
    settled: bool,
}

impl<'a> Lease<'a> {
    /// The lease a store granted: `fence` over `key`, its record kept for `window` once
    /// settled.
    pub(super) fn new(
        store: &'a Store,
        metrics: &'a Metrics,
        key: &'a StoreKey,
        fence: Fence,
        window: Duration,
    ) -> Self {
        Self {
            store,
            metrics,
            key,
            fence,
            window,
            settled: false,
        }
    }

    /// The fencing token, forwarded upstream.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The key this lease owns.
    pub fn key(&self) -> &StoreKey {
        self.key
    }

    /// Stores the final response (`record`, encoded under this key): duplicates replay it.
    pub async fn complete(mut self, record: Bytes) -> Finish {
        self.settled = true;
        let started = Instant::now();
        let done = self
            .store
            .complete(self.key, self.fence, record, self.window)
            .await;
        self.metrics
            .store_op("complete", started.elapsed(), done.is_ok());
        match done {
            Ok(Completion::Completed) => Finish::Completed,
            Ok(Completion::Fenced) => {
                warn!(store_key = %self.key, fence = self.fence.get(),
                    "completion refused: the key was taken over under a newer fence; this response reached its client only");
                Finish::FencedOut
            }
            Err(e) => {
                error!(store_key = %self.key, fence = self.fence.get(), error = %e,
                    "could not store the response: a retry after the lease expires will execute again");
                Finish::Unstored
            }
        }
    }

    /// Frees the key after a failure that had no effect: the next request executes. The
    /// record keeps its fence, so the next owner's is higher.
    pub async fn release(mut self) -> Finish {
        self.settled = true;
        let started = Instant::now();
        let released = self.store.release(self.key, self.fence, self.window).await;
        self.metrics
            .store_op("release", started.elapsed(), released.is_ok());
        match released {
            Ok(true) => Finish::Released,
            Ok(false) => {
                warn!(store_key = %self.key, fence = self.fence.get(),
                    "release refused: the key was taken over under a newer fence");
                Finish::FencedOut
            }
            Err(e) => {
                error!(store_key = %self.key, fence = self.fence.get(), error = %e,
                    "could not release the claim: retries get 409 until its lease expires");
                Finish::Unstored
            }
        }
    }

    /// Leaves the claim as it is because the outcome is unknown (the upstream may have
    /// acted without answering): duplicates get 409 until the lease ends, then a retry
    /// takes over under a higher fence.
    pub fn keep(mut self) -> Finish {
        self.settled = true;
        warn!(store_key = %self.key, fence = self.fence.get(),
            "outcome unknown: the claim is kept until its lease expires");
        Finish::OutcomeUnknown
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.settled {
            warn!(store_key = %self.key, fence = self.fence.get(),
                "lease dropped before its outcome was known: the claim is kept until its lease expires");
        }
    }
}
