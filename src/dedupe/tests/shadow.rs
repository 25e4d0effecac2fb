//! Shadow mode: every request is forwarded; the claim and the record are made as under
//! enforcement, and what enforcement would have answered is recorded as a `Would`.

use super::*;

fn shadow(on_conflict: OnConflict) -> Policy {
    Policy {
        mode: Mode::Shadow,
        ..policy(on_conflict)
    }
}

#[tokio::test(start_paused = true)]
async fn a_shadow_duplicate_is_forwarded_and_counted_as_a_would_be_replay() {
    let h = Harness::new(100);
    let p = shadow(OnConflict::Reject);
    let first = h.request(&key("a"), 1, &p, NOW, done).await;
    assert_eq!(first.outcome, Outcome::Won);
    assert_eq!(
        first.finish,
        Some(Finish::Completed),
        "the winner's record is kept"
    );
    assert_eq!(first.would, None);
    let again = h.request(&key("a"), 1, &p, NOW, done).await;
    assert_eq!(again.outcome, Outcome::Shadowed);
    assert_eq!(again.would, Some(Would::Replay));
    assert!(matches!(again.answer, Answer::Forwarded("upstream")));
    assert_eq!(again.finish, None, "a forwarded duplicate settles no claim");
    assert_eq!(h.calls(), 2, "both copies reached the upstream");
    // The record is the winner's: switched to enforce, the next duplicate replays it.
    let enforced = h
        .request(&key("a"), 1, &policy(OnConflict::Reject), NOW, done)
        .await;
    assert_eq!(enforced.outcome, Outcome::Replayed);
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_shadow_mismatch_is_forwarded() {
    let h = Harness::new(100);
    let p = shadow(OnConflict::Reject);
    h.request(&key("a"), 1, &p, NOW, done).await;
    let other = h.request(&key("a"), 2, &p, NOW, done).await;
    assert_eq!(other.outcome, Outcome::Shadowed);
    assert_eq!(other.would, Some(Would::Mismatch));
    assert!(matches!(other.answer, Answer::Forwarded("upstream")));
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_shadow_duplicate_in_flight_is_forwarded_at_once_even_on_a_waiting_route() {
    let h = Harness::new(100);
    let p = shadow(OnConflict::Wait);
    let k = key("a");
    let (first, second) = tokio::join!(h.request(&k, 1, &p, Duration::from_secs(2), done), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = tokio::time::Instant::now();
        let settled = h.request(&k, 1, &p, NOW, done).await;
        (settled, sent.elapsed())
    });
    assert_eq!(first.outcome, Outcome::Won);
    let (second, took) = second;
    assert_eq!(second.outcome, Outcome::Shadowed);
    assert_eq!(second.would, Some(Would::Conflict));
    assert_eq!(took, Duration::ZERO, "a shadow duplicate never waits");
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_shadow_route_forwards_a_held_key_instead_of_409() {
    let h = Harness::new(100);
    let p = Policy {
        on_unknown: OnUnknown::Hold,
        ..shadow(OnConflict::Reject)
    };
    let k = key("a");
    let first = h.request(&k, 1, &p, NOW, unknown).await;
    assert_eq!(first.finish, Some(Finish::OutcomeUnknown));
    tokio::time::sleep(p.lease + Duration::from_millis(1)).await;
    let held = h.request(&k, 1, &p, NOW, done).await;
    assert_eq!(held.outcome, Outcome::Shadowed);
    assert_eq!(held.would, Some(Would::Held));
    assert_eq!(h.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_shadow_route_forwards_when_the_store_fails_and_counts_the_would_be_503() {
    // A store that holds no record: every claim fails as a store error.
    let h = Harness::new(0);
    let p = Policy {
        on_error: OnError::FailClosed,
        ..shadow(OnConflict::Reject)
    };
    let failed = h.request(&key("b"), 1, &p, NOW, done).await;
    assert_eq!(failed.outcome, Outcome::FailOpen);
    assert_eq!(failed.would, Some(Would::StoreError));
    assert!(matches!(failed.answer, Answer::Forwarded("upstream")));
    // Under enforcement the same failure is a 503 with nothing forwarded.
    let closed = Policy {
        mode: Mode::Enforce,
        ..p
    };
    let refused = h.request(&key("c"), 1, &closed, NOW, done).await;
    assert_eq!(refused.outcome, Outcome::StoreError);
    assert_eq!(h.calls(), 1);
}
