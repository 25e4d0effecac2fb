//! Claiming a key: one atomic store operation, asked again once as the same claimant when
//! its reply timed out, and, with `on_conflict = "wait"`, repeated with a growing pause
//! until the request in flight finishes or the wait budget runs out.

use std::time::{Duration, Instant};

use tracing::warn;

use super::{Env, Policy};
use crate::protocol::route::{Mode, OnUnknown};
use crate::store::{Claim, ClaimRequest, Order, RequestHash, StoreError, StoreKey};
use crate::telemetry::metrics::StoreOp;

/// The first pause between two polls of a waiting duplicate; it doubles up to
/// [`MAX_POLL_PAUSE`].
const FIRST_POLL_PAUSE: Duration = Duration::from_millis(5);
/// The longest pause between two polls of a waiting duplicate.
const MAX_POLL_PAUSE: Duration = Duration::from_millis(250);

/// Claims `key` for one request, as one claimant throughout.
pub(super) async fn claim(
    env: &Env<'_>,
    key: &StoreKey,
    request_hash: &RequestHash,
    policy: &Policy,
    order: Option<Order<'_>>,
) -> Result<Claim, StoreError> {
    let request = ClaimRequest {
        key,
        request_hash,
        lease: policy.lease,
        window: policy.window,
        claimant: env.claimants.next_id(),
        hold: policy.on_unknown == OnUnknown::Hold,
        order,
    };
    // A shadow route forwards a duplicate at once: waiting would add latency that
    // enforcement is not yet meant to cost.
    let wait_until = (policy.on_conflict.waits() && policy.mode != Mode::Shadow)
        .then(|| tokio::time::Instant::now() + policy.conflict_wait);
    let mut pause = FIRST_POLL_PAUSE;
    // While waiting, the last conflict seen: a duplicate is known to be in flight.
    let mut in_flight: Option<Duration> = None;
    loop {
        let mut claim = claim_once(env, request).await;
        if let Err(StoreError::Timeout(_)) = claim {
            // The claim may have run with only its reply lost: ask once more as the same
            // claimant, which then wins again instead of finding a stranded claim.
            claim = claim_once(env, request).await;
        }
        // Each poll is one atomic claim, never past the lease end or the wait budget.
        // Shutdown ends the wait.
        match (&claim, wait_until) {
            (Ok(Claim::Conflict { retry_after }), Some(until))
                if tokio::time::Instant::now() < until && !env.tasks.is_closed() =>
            {
                in_flight = Some(*retry_after);
                let nap = pause.min(*retry_after + Duration::from_millis(1));
                tokio::time::sleep_until(until.min(tokio::time::Instant::now() + nap)).await;
                pause = (pause * 2).min(MAX_POLL_PAUSE);
            }
            // A store error after a conflict was seen must not fail open: the first request
            // is in flight, and forwarding this one would run the write twice.
            (Err(e), _) if in_flight.is_some() => {
                warn!(error = %e, store_key = %key, "store failed while waiting on an in-flight duplicate");
                return Ok(Claim::Conflict {
                    retry_after: in_flight.unwrap_or_default(),
                });
            }
            _ => return claim,
        }
    }
}

async fn claim_once(env: &Env<'_>, request: ClaimRequest<'_>) -> Result<Claim, StoreError> {
    let started = Instant::now();
    let claim = env.store.claim(request).await;
    env.metrics
        .store_op(StoreOp::Claim, started.elapsed(), claim.is_ok());
    claim
}
