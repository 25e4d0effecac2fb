//! The protocol on the embedded store with tokio's paused clock: no upstream, no sleeps.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::task::TaskTracker;

use super::*;
use crate::store::{ClaimRequest, MemoryStore, RequestHash};

struct Harness {
    store: Store,
    metrics: Metrics,
    claimants: Claimants,
    tasks: TaskTracker,
    keyring: Keyring,
    calls: AtomicU32,
}

impl Harness {
    fn new(max_records: usize) -> Self {
        Self::sealed(max_records, Keyring::default())
    }

    /// A harness whose records are sealed with `keyring`.
    fn sealed(max_records: usize, keyring: Keyring) -> Self {
        Self {
            store: Store::Memory(MemoryStore::new(max_records)),
            metrics: Metrics::new(),
            claimants: Claimants::new(),
            tasks: TaskTracker::new(),
            keyring,
            calls: AtomicU32::new(0),
        }
    }

    fn env(&self) -> Env<'_> {
        Env {
            store: &self.store,
            metrics: &self.metrics,
            claimants: &self.claimants,
            tasks: &self.tasks,
            keyring: &self.keyring,
        }
    }

    /// Runs a request whose upstream call takes `takes` and then ends as `end` says.
    async fn request(
        &self,
        key: &StoreKey,
        hash: u8,
        policy: &Policy,
        takes: Duration,
        end: fn(&'static str) -> Attempt<&'static str>,
    ) -> Settled<&'static str> {
        run(
            &self.env(),
            key,
            &RequestHash::new([hash; 32]),
            policy,
            None,
            |_| async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(takes).await;
                end("upstream")
            },
        )
        .await
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

fn policy(on_conflict: OnConflict) -> Policy {
    Policy {
        lease: Duration::from_secs(10),
        window: Duration::from_secs(3600),
        on_conflict,
        conflict_wait: Duration::from_secs(5),
        on_error: OnError::FailOpen,
        on_unknown: OnUnknown::Retry,
        mode: Mode::Enforce,
    }
}

fn done(response: &'static str) -> Attempt<&'static str> {
    Attempt::Final {
        record: Bytes::from_static(b"record"),
        response,
    }
}

fn unknown(response: &'static str) -> Attempt<&'static str> {
    Attempt::Unknown(response)
}

fn not_executed(response: &'static str) -> Attempt<&'static str> {
    Attempt::NotExecuted(response)
}

fn key(name: &str) -> StoreKey {
    StoreKey::from_raw(format!("t:{{x}}:r:-:{name}"))
}

const NOW: Duration = Duration::ZERO;

#[tokio::test(start_paused = true)]
async fn a_won_claim_completes_and_a_repeat_replays() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let first = h.request(&key("a"), 1, &p, NOW, done).await;
    assert_eq!(first.outcome, Outcome::Won);
    assert_eq!(first.finish, Some(Finish::Completed));
    assert!(matches!(first.answer, Answer::Forwarded("upstream")));
    let again = h.request(&key("a"), 1, &p, NOW, done).await;
    assert_eq!(again.outcome, Outcome::Replayed);
    assert!(matches!(again.answer, Answer::Replay(ref r) if r == "record"));
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_different_request_under_the_key_is_a_mismatch() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    h.request(&key("a"), 1, &p, NOW, done).await;
    let other = h.request(&key("a"), 2, &p, NOW, done).await;
    assert_eq!(other.outcome, Outcome::Mismatch);
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_in_flight_conflicts_with_the_lease_left() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    let (first, second) = tokio::join!(h.request(&k, 1, &p, Duration::from_secs(2), done), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        h.request(&k, 1, &p, NOW, done).await
    });
    assert_eq!(first.outcome, Outcome::Won);
    assert_eq!(second.outcome, Outcome::Conflict);
    match second.answer {
        Answer::Conflict { retry_after } => {
            assert!(retry_after > Duration::from_secs(9) && retry_after <= p.lease)
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_replays_once_the_first_completes() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Wait);
    let k = key("a");
    let (first, second) = tokio::join!(h.request(&k, 1, &p, Duration::from_secs(2), done), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.request(&k, 1, &p, NOW, done).await
    });
    assert_eq!(first.outcome, Outcome::Won);
    assert_eq!(second.outcome, Outcome::Replayed);
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_runs_out_is_a_conflict() {
    let h = Harness::new(100);
    let p = Policy {
        conflict_wait: Duration::from_secs(1),
        ..policy(OnConflict::Wait)
    };
    let k = key("a");
    let started = tokio::time::Instant::now();
    let (_, second) = tokio::join!(h.request(&k, 1, &p, Duration::from_secs(5), done), async {
        let settled = h.request(&k, 1, &p, NOW, done).await;
        (settled, started.elapsed())
    });
    let (second, waited) = second;
    assert_eq!(second.outcome, Outcome::Conflict);
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_is_kept_and_taken_over_after_the_lease() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    let first = h.request(&k, 1, &p, NOW, unknown).await;
    assert_eq!(first.finish, Some(Finish::OutcomeUnknown));
    let during = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(during.outcome, Outcome::Conflict);
    tokio::time::advance(p.lease).await;
    let after = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(after.outcome, Outcome::Takeover);
    assert!(
        after.fence > first.fence,
        "{:?} > {:?}",
        after.fence,
        first.fence
    );
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_released_key_executes_again_under_a_higher_fence() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    let first = h.request(&k, 1, &p, NOW, not_executed).await;
    assert_eq!(first.finish, Some(Finish::Released));
    let second = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(second.outcome, Outcome::Won);
    assert!(second.fence > first.fence);
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_frozen_owner_is_taken_over_and_fenced_out() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    let mut first = std::pin::pin!(h.request(&k, 1, &p, Duration::from_secs(2), done));
    // Polled until its call is under way, then frozen (a SIGSTOPped gateway): neither its
    // call nor its renewals run while the lease passes.
    assert!(tokio::time::timeout(Duration::from_secs(1), &mut first)
        .await
        .is_err());
    tokio::time::advance(p.lease + Duration::from_secs(1)).await;
    let second = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(second.outcome, Outcome::Takeover);
    assert_eq!(second.finish, Some(Finish::Completed));
    // Thawed: its renewal and its completion are refused.
    let first = first.await;
    assert_eq!(first.finish, Some(Finish::FencedOut));
    assert_eq!(h.calls(), 2);
    let metrics = h.metrics.encode();
    for counted in [
        r#"dedupe_claim_events_total{event="takeover"} 1"#,
        r#"dedupe_claim_events_total{event="fenced_out"} 1"#,
    ] {
        assert!(metrics.contains(counted), "{metrics}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_asked_again_by_its_claimant_wins_again() {
    // What the retry of a timed-out claim relies on: the same claimant gets the same fence.
    let h = Harness::new(100);
    let k = key("a");
    let hash = RequestHash::new([1; 32]);
    let request = ClaimRequest {
        key: &k,
        request_hash: &hash,
        lease: Duration::from_secs(10),
        window: Duration::from_secs(60),
        claimant: h.claimants.next_id(),
        hold: false,
        order: None,
    };
    let first = h.store.claim(request).await.unwrap();
    let again = h.store.claim(request).await.unwrap();
    assert!(matches!(first, Claim::Won { takeover: None, .. }));
    assert_eq!(first, again);
    let other = ClaimRequest {
        claimant: h.claimants.next_id(),
        ..request
    };
    assert!(matches!(
        h.store.claim(other).await.unwrap(),
        Claim::Conflict { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_after_a_conflict_never_fails_open() {
    // One record fits. While the duplicate waits on the first request, the record is
    // deleted and another key fills the store: the duplicate's next poll fails, and since
    // a request is known to be in flight it must answer 409, not forward.
    let h = Harness::new(1);
    let p = policy(OnConflict::Wait);
    assert_eq!(p.on_error, OnError::FailOpen);
    let k = key("a");
    let (_, second) = tokio::join!(
        async {
            run(
                &h.env(),
                &k,
                &RequestHash::new([1; 32]),
                &p,
                None,
                |_| async {
                    h.calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    h.store.forget(&k).await.unwrap();
                    let filler = key("b");
                    let hash = RequestHash::new([9; 32]);
                    let won = h
                        .store
                        .claim(ClaimRequest {
                            key: &filler,
                            request_hash: &hash,
                            lease: p.lease,
                            window: p.window,
                            claimant: h.claimants.next_id(),
                            hold: false,
                            order: None,
                        })
                        .await;
                    assert!(matches!(won, Ok(Claim::Won { .. })));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    done("upstream")
                },
            )
            .await
        },
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            h.request(&k, 1, &p, NOW, done).await
        }
    );
    assert_eq!(second.outcome, Outcome::Conflict);
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_before_any_conflict_follows_on_error() {
    let h = Harness::new(0);
    let open = policy(OnConflict::Reject);
    let settled = h.request(&key("a"), 1, &open, NOW, done).await;
    assert_eq!(settled.outcome, Outcome::FailOpen);
    assert!(matches!(settled.answer, Answer::Forwarded("upstream")));
    let closed = Policy {
        on_error: OnError::FailClosed,
        ..open
    };
    let settled = h.request(&key("b"), 1, &closed, NOW, done).await;
    assert_eq!(settled.outcome, Outcome::StoreError);
    assert!(matches!(settled.answer, Answer::StoreUnavailable));
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_a_wait() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Wait);
    let k = key("a");
    let (_, second) = tokio::join!(h.request(&k, 1, &p, Duration::from_secs(4), done), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.tasks.close();
        h.request(&k, 1, &p, NOW, done).await
    });
    assert_eq!(second.outcome, Outcome::Conflict);
}

#[tokio::test(start_paused = true)]
async fn a_call_longer_than_the_lease_is_never_taken_over_while_renewing() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    let long = p.lease * 3 + Duration::from_secs(1);
    let (first, duplicates) = tokio::join!(h.request(&k, 1, &p, long, done), async {
        let mut outcomes = Vec::new();
        // A duplicate every 1.5s, well past the first lease's end.
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            outcomes.push(h.request(&k, 1, &p, NOW, done).await.outcome);
        }
        outcomes
    });
    assert_eq!(first.outcome, Outcome::Won);
    assert_eq!(first.finish, Some(Finish::Completed));
    // 20 × 1.5s = 30s: in flight until 31s.
    assert!(
        duplicates.iter().all(|o| *o == Outcome::Conflict),
        "{duplicates:?}"
    );
    assert_eq!(h.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_renewal_lets_a_retry_take_over_one_lease_later() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    // The owner's task dies at 25s (its future is dropped mid-call): renewals stop with it.
    let cut = tokio::time::timeout(
        Duration::from_secs(25),
        h.request(&k, 1, &p, Duration::from_secs(3600), done),
    )
    .await;
    assert!(cut.is_err());
    let during = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(during.outcome, Outcome::Conflict, "renewed until it died");
    tokio::time::advance(p.lease).await;
    let after = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(after.outcome, Outcome::Takeover);
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_owner_taken_over_stops_renewing_and_is_fenced_out() {
    let h = Harness::new(100);
    let p = policy(OnConflict::Reject);
    let k = key("a");
    let (first, second) =
        tokio::join!(h.request(&k, 1, &p, Duration::from_secs(40), done), async {
            // Another gateway's view: the record is deleted and claimed afresh meanwhile.
            tokio::time::sleep(Duration::from_secs(1)).await;
            h.store.forget(&k).await.unwrap();
            h.request(&k, 1, &p, NOW, done).await
        });
    assert_eq!(second.outcome, Outcome::Won);
    assert_eq!(first.finish, Some(Finish::FencedOut));
    assert!(h
        .metrics
        .encode()
        .contains(r#"dedupe_claim_events_total{event="renewal_refused"} 1"#));
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_on_a_holding_route_is_held_not_taken_over() {
    let h = Harness::new(100);
    let p = Policy {
        on_unknown: OnUnknown::Hold,
        ..policy(OnConflict::Reject)
    };
    let k = key("a");
    let first = h.request(&k, 1, &p, NOW, unknown).await;
    assert_eq!(first.finish, Some(Finish::OutcomeUnknown));
    assert_eq!(
        h.request(&k, 1, &p, NOW, done).await.outcome,
        Outcome::Conflict
    );
    tokio::time::advance(p.lease).await;
    let held = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(held.outcome, Outcome::Held);
    assert!(
        matches!(held.answer, Answer::OutcomeUnknown { first: true, fence } if Some(fence) == first.fence)
    );
    tokio::time::advance(p.lease * 10).await;
    let again = h.request(&k, 1, &p, NOW, done).await;
    assert!(matches!(
        again.answer,
        Answer::OutcomeUnknown { first: false, .. }
    ));
    assert_eq!(h.calls(), 1);
    assert!(h
        .metrics
        .encode()
        .contains(r#"dedupe_claim_events_total{event="outcome_held"} 1"#));
}

#[tokio::test(start_paused = true)]
async fn a_dead_owner_on_a_holding_route_is_held() {
    let h = Harness::new(100);
    let p = Policy {
        on_unknown: OnUnknown::Hold,
        ..policy(OnConflict::Reject)
    };
    let k = key("a");
    let cut = tokio::time::timeout(
        Duration::from_secs(1),
        h.request(&k, 1, &p, Duration::from_secs(3600), done),
    )
    .await;
    assert!(cut.is_err());
    tokio::time::advance(p.lease).await;
    assert_eq!(h.request(&k, 1, &p, NOW, done).await.outcome, Outcome::Held);
    assert_eq!(h.calls(), 1);
}

mod sealed;
mod shadow;
