//! The dedupe protocol, apart from any transport: claim a key, forward the one winner,
//! settle its lease, and answer everyone else from the store.
//!
//! [`run`] is the one entry (the HTTP edge's keyed request task calls it). It knows the store, the route's [`Policy`] and a forwarder
//! (a closure that performs the upstream call and classifies what came back as an
//! [`Attempt`]); it knows nothing of HTTP. The HTTP edge ([`crate::edge`]) builds the
//! forwarder and turns the [`Settled`] result into a response.
//!
//! ```text
//!            claim ──▶ Won(lease) ──▶ forward(Owned(fence)) ──▶ Final    ─▶ lease.complete
//!              │         (renewed every lease/3 while it runs) ├─▶ NotExecuted ─▶ lease.release
//!              │                                             └─▶ Unknown  ─▶ lease.keep
//!              ├─▶ Replay (opened with the keyring) / Conflict / Mismatch / Held
//!              └─▶ store error, or a record no key opens ─▶ on_error: fail-closed 503,
//!                  or forward(Unguarded)
//! ```
//!
//! On a route in `shadow` [`Mode`], everything up to the claim is the same, and a won
//! claim is forwarded and settled the same (so later duplicates are recognised); but every
//! other answer (replay, conflict, mismatch, held, a fail-closed store error) becomes
//! forward(Unguarded), with what enforcement would have done recorded as a [`Would`].
//!
//! Records are sealed ([`crate::protocol::seal`]) on their way into the store and opened on their
//! way out here, above the store contract, so every backend stores them alike and the
//! HTTP edge only ever sees records in clear.
//!
//! ```text
//! ```

mod claim;
mod lease;
mod outcome;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, warn, Instrument};

pub use self::lease::Lease;
pub use self::outcome::{Finish, Outcome, Would};
use crate::protocol::route::{Mode, OnConflict, OnError, OnUnknown};
use crate::protocol::seal::Keyring;
use crate::runtime::boxed;
use crate::store::{Claim, Claimants, Fence, Order, RequestHash, Store, StoreError, StoreKey};
use crate::telemetry::metrics::{ClaimEvent, Metrics};
use crate::telemetry::traces;

/// What the protocol needs from the gateway around it.
pub struct Env<'a> {
    /// The dedupe store.
    pub store: &'a Store,
    /// Where store latencies and errors are counted.
    pub metrics: &'a Metrics,
    /// Claimant ids, unique per request attempt.
    pub claimants: &'a Claimants,
    /// The gateway's request tasks: once closed (shutdown), duplicates stop waiting.
    pub tasks: &'a TaskTracker,
    /// Seals records before they are stored and opens them when they are read.
    pub keyring: &'a Keyring,
}

/// A route's dedupe settings, as the protocol uses them.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// How long a claim is honoured before a retry may take over.
    pub lease: Duration,
    /// How long a settled record is remembered.
    pub window: Duration,
    /// What an in-flight duplicate gets.
    pub on_conflict: OnConflict,
    /// With [`OnConflict::Wait`]: the longest a duplicate is held.
    pub conflict_wait: Duration,
    /// What happens when the store fails.
    pub on_error: OnError,
    /// What becomes of a claim whose outcome is unknown once its lease ends.
    pub on_unknown: OnUnknown,
    /// `Shadow`: forward every request and only record what enforcement would have done.
    /// (`Off` routes never reach the protocol; it treats them as `Enforce`.)
    pub mode: Mode,
}

/// What the forwarder is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// Forward as the owner of the key under this fence.
    Owned(Fence),
    /// Forward without dedupe: the store failed and the route fails open, or a shadow
    /// route forwards a request that enforcement would have answered itself.
    Unguarded,
}

/// How an upstream call ended, as the protocol needs to know it. `R` is whatever the
/// transport answers its client with.
pub enum Attempt<R> {
    /// A final answer: store `record` (encoded under the store key) for replay.
    Final {
        /// The encoded [`crate::protocol::record::StoredResponse`].
        record: Bytes,
        /// What the client gets.
        response: R,
    },
    /// The upstream did not act (unreachable, or it said it failed): free the key.
    NotExecuted(R),
    /// The upstream may have acted without answering: keep the claim until its lease ends.
    Unknown(R),
}

impl<R> Attempt<R> {
    fn into_response(self) -> R {
        match self {
            Attempt::Final { response, .. }
            | Attempt::NotExecuted(response)
            | Attempt::Unknown(response) => response,
        }
    }
}

/// What the client gets.
#[derive(Debug)]
pub enum Answer<R> {
    /// The forwarder's response (the winner's, or a failed-open request's).
    Forwarded(R),
    /// The stored response, encoded (opened, in clear), to replay.
    Replay(Bytes),
    /// Another request holds the key: 409, or the wait ran out.
    Conflict {
        /// Lease time left.
        retry_after: Duration,
    },
    /// The key was used with a different request: 422.
    Mismatch,
    /// An earlier claim's outcome is unknown and the route holds it for an operator: 409
    /// `outcome-unknown`.
    OutcomeUnknown {
        /// The fence of the claim whose outcome is unknown (what `resolve` takes).
        fence: Fence,
        /// Whether this request is the first told so: it logs the case at error.
        first: bool,
    },
    /// Ordered route: a newer version of the entity was already completed; this one was
    /// never forwarded (200 `Dedupe-Stale: true`).
    Stale,
    /// The store failed and the route fails closed: 503.
    StoreUnavailable,
    /// The key holds a record this gateway cannot read, whatever the route's `on_error`:
    /// the request may have run, so it is never forwarded.
    RecordUnreadable,
}

/// The end of one request's part in the protocol: built once, read by the access log.
#[derive(Debug)]
pub struct Settled<R> {
    /// What the client gets.
    pub answer: Answer<R>,
    /// What the gateway did with the key.
    pub outcome: Outcome,
    /// What became of a won claim.
    pub finish: Option<Finish>,
    /// The fence a won claim held.
    pub fence: Option<Fence>,
    /// On a shadow route: what enforcement would have done instead of forwarding.
    pub would: Option<Would>,
}

impl<R> Settled<R> {
    fn answered(answer: Answer<R>, outcome: Outcome) -> Self {
        Self {
            answer,
            outcome,
            finish: None,
            fence: None,
            would: None,
        }
    }
}

/// Runs one deduped request: claims `key`, forwards through `forward` if it wins (or if
/// the store failed on a fail-open route), settles the lease by what the call returned.
///
/// On an ordered route (`order`), the claim also checks the version against its entity (a
/// stale version is answered [`Answer::Stale`], another version in flight is a conflict),
/// and settling the lease settles the entity's marker in the same store step.
pub async fn run<R, F, Fut>(
    env: &Env<'_>,
    key: &StoreKey,
    request_hash: &RequestHash,
    policy: &Policy,
    order: Option<Order<'_>>,
    forward: F,
) -> Settled<R>
where
    F: FnOnce(Forward) -> Fut,
    Fut: Future<Output = Attempt<R>>,
{
    // The claim, the forwarder's call and the lease's end are boxed: each is a large
    // future (a store round trip; an upstream call with its body capture), and held
    // inline they made every request's task several KiB, copied whole on each move and
    // on spawn. Built in their boxes (see `boxed`), before a span wraps them, or the
    // wrapper copies them once more on their way in.
    let claimed = boxed::pinned(|| claim::claim(env, key, request_hash, policy, order))
        .instrument(traces::claim())
        .await;
    if policy.mode == Mode::Shadow {
        let would = match &claimed {
            Ok(Claim::Replay(_)) => Some(Would::Replay),
            Ok(Claim::Conflict { .. }) => Some(Would::Conflict),
            Ok(Claim::Mismatch) => Some(Would::Mismatch),
            Ok(Claim::Stale) => Some(Would::Stale),
            Ok(Claim::Held { first, .. }) => {
                if *first {
                    env.metrics.event(ClaimEvent::OutcomeHeld);
                }
                Some(Would::Held)
            }
            Ok(Claim::Won { .. }) | Err(_) => None,
        };
        if let Some(would) = would {
            return shadowed(would, key, forward).await;
        }
    }
    let (permit, takeover) = match claimed {
        Ok(Claim::Won { permit, takeover }) => (permit, takeover),
        Ok(Claim::Replay(stored)) => match env.keyring.open(key, stored) {
            Ok(record) => return Settled::answered(Answer::Replay(record), Outcome::Replayed),
            // The request did execute once, so even a fail-open route must not forward it
            // again; and bytes no key opens are never replayed: a store error, fail-closed.
            Err(e) => {
                error!(error = %e, store_key = %key,
                    "stored record does not open (wrong or missing encryption key?); answering 503, never executing again");
                return Settled::answered(Answer::StoreUnavailable, Outcome::StoreError);
            }
        },
        Ok(Claim::Conflict { retry_after }) => {
            return Settled::answered(Answer::Conflict { retry_after }, Outcome::Conflict)
        }
        Ok(Claim::Mismatch) => return Settled::answered(Answer::Mismatch, Outcome::Mismatch),
        // Logged by the edge, which knows the version as the request spelled it.
        Ok(Claim::Stale) => return Settled::answered(Answer::Stale, Outcome::Stale),
        Ok(Claim::Held { fence, first }) => {
            if first {
                env.metrics.event(ClaimEvent::OutcomeHeld);
            }
            let mut settled =
                Settled::answered(Answer::OutcomeUnknown { fence, first }, Outcome::Held);
            settled.fence = Some(fence);
            return settled;
        }
        // Not the store's failure but the key's: the request may have run (the record is
        // there), so even a fail-open route must not forward it.
        Err(StoreError::Unreadable(e)) if policy.mode != Mode::Shadow => {
            error!(error = %e, store_key = %key,
                "the key holds a record this gateway cannot read (a pre-release build's, or not a gateway's); answering 500, never executing it");
            return Settled::answered(Answer::RecordUnreadable, Outcome::StoreError);
        }
        Err(e) => return store_failed("store claim failed", &e, key, policy, forward).await,
    };
    let fence = permit.fence();
    if let Some(old) = takeover {
        warn!(store_key = %key, old_fence = old.get(), new_fence = fence.get(),
            "previous lease expired without an outcome; taking over under a new fence: the write may execute twice");
        env.metrics.event(ClaimEvent::Takeover);
    }
    let _held = env.metrics.claim_held();
    let lease = Lease::new(env.store, env.metrics, permit, policy, order);
    let (finish, response) = match lease
        .renewing(boxed::pinned(|| forward(Forward::Owned(fence))))
        .await
    {
        Attempt::Final { record, response } => {
            let sealed = env.keyring.seal(key, record);
            let completing = boxed::pinned(|| lease.complete(sealed));
            let span = traces::completion();
            (completing.instrument(span).await, response)
        }
        Attempt::NotExecuted(response) => {
            let span = traces::completion();
            let releasing = boxed::pinned(|| lease.release());
            (releasing.instrument(span).await, response)
        }
        Attempt::Unknown(response) => (lease.keep(), response),
    };
    Settled {
        answer: Answer::Forwarded(response),
        outcome: if takeover.is_some() {
            Outcome::Takeover
        } else {
            Outcome::Won
        },
        finish: Some(finish),
        fence: Some(fence),
        would: None,
    }
}

/// A shadow route's duplicate: forwarded as if dedupe were off, and what enforcement would
/// have answered recorded instead.
async fn shadowed<R, F, Fut>(would: Would, key: &StoreKey, forward: F) -> Settled<R>
where
    F: FnOnce(Forward) -> Fut,
    Fut: Future<Output = Attempt<R>>,
{
    debug!(store_key = %key, would = would.as_str(), "shadow mode: forwarding a request enforcement would have answered");
    let response = boxed::pinned(|| forward(Forward::Unguarded))
        .await
        .into_response();
    let mut settled = Settled::answered(Answer::Forwarded(response), Outcome::Shadowed);
    settled.would = Some(would);
    settled
}

/// A store that failed: what the route's `on_error` says.
async fn store_failed<R, F, Fut>(
    what: &str,
    e: &(dyn std::fmt::Display + Sync),
    key: &StoreKey,
    policy: &Policy,
    forward: F,
) -> Settled<R>
where
    F: FnOnce(Forward) -> Fut,
    Fut: Future<Output = Attempt<R>>,
{
    match policy.on_error {
        // Shadow mode never refuses a request: it forwards, and a fail-closed route counts
        // the 503 it would have answered.
        OnError::FailClosed if policy.mode == Mode::Shadow => {
            warn!(error = %e, store_key = %key, "{what}; shadow mode: forwarding without dedupe (enforce would answer 503)");
            let mut settled = shadowed(Would::StoreError, key, forward).await;
            settled.outcome = Outcome::FailOpen;
            settled
        }
        OnError::FailClosed => {
            error!(error = %e, store_key = %key, "{what}; failing closed (503)");
            Settled::answered(Answer::StoreUnavailable, Outcome::StoreError)
        }
        OnError::FailOpen => {
            warn!(error = %e, store_key = %key,
                "{what}; failing open: forwarding without dedupe");
            let response = boxed::pinned(|| forward(Forward::Unguarded))
                .await
                .into_response();
            Settled::answered(Answer::Forwarded(response), Outcome::FailOpen)
        }
    }
}
