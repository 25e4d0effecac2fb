//! The limit on tokio's paused clock: time moves only when a test advances it, so each
//! sample's latency is exactly what the test says.

use super::limiter::{INITIAL_LIMIT, MIN_LIMIT, WINDOW_SAMPLES, WINDOW_TIME};
use super::*;

const CEILING: usize = 1_000;
const STORE_TIMEOUT: Duration = Duration::from_millis(250);

fn bounds(ceiling: usize) -> Bounds {
    Bounds {
        ceiling,
        timeout: STORE_TIMEOUT,
        wait: Duration::ZERO,
    }
}

/// The limit and how many it admitted.
fn limit_and_claiming(admission: &Admission, ceiling: usize) -> (usize, usize) {
    let load = admission.load(ceiling);
    (load.limit, load.claiming)
}

/// One window: `n` claims admitted together, each answered after `latency`; then, a
/// window's time later, a place given back unmeasured, which closes the window with
/// exactly these answers in it.
async fn window(admission: &Arc<Admission>, n: usize, latency: Duration) -> usize {
    let permits: Vec<Permit> = (0..n)
        .map_while(|_| admission.try_admit(bounds(CEILING), true))
        .collect();
    let admitted = permits.len();
    tokio::time::advance(latency).await;
    // The window's answers all took `latency`: admitted `latency` ago.
    for mut p in permits {
        p.admitted = Instant::now() - latency;
        drop(p);
    }
    tokio::time::advance(WINDOW_TIME).await;
    if let Some(p) = admission.try_admit(bounds(CEILING), true) {
        p.unmeasured();
    }
    admitted
}

fn limit(admission: &Admission) -> usize {
    admission.load(CEILING).limit
}

#[tokio::test(start_paused = true)]
async fn past_the_limit_a_claim_is_refused_until_a_place_is_given_back() {
    let admission = Arc::new(Admission::default());
    let permits: Vec<Permit> = (0..INITIAL_LIMIT)
        .map(|_| admission.try_admit(bounds(CEILING), true).unwrap())
        .collect();
    assert!(admission.try_admit(bounds(CEILING), true).is_none());
    assert_eq!(
        limit_and_claiming(&admission, CEILING),
        (INITIAL_LIMIT, INITIAL_LIMIT)
    );
    drop(permits);
    assert_eq!(admission.load(CEILING).claiming, 0);
    assert!(admission.try_admit(bounds(CEILING), true).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_ceiling_below_the_floor_holds_through_every_window() {
    let admission = Arc::new(Admission::default());
    for latency in [1, 200, 1, 1] {
        let permits: Vec<Permit> = (0..20)
            .filter_map(|_| admission.try_admit(bounds(2), true))
            .collect();
        assert_eq!(permits.len(), 2);
        tokio::time::advance(Duration::from_millis(latency)).await;
        drop(permits);
        // Enough answers to close a window, each measured.
        for _ in 0..WINDOW_SAMPLES {
            admission.try_admit(bounds(2), true).unwrap().claimed();
        }
        tokio::time::advance(WINDOW_TIME).await;
        admission.try_admit(bounds(2), true).unwrap().claimed();
        assert_eq!(limit_and_claiming(&admission, 2), (2, 0));
    }
}

#[tokio::test(start_paused = true)]
async fn a_lower_ceiling_bounds_the_limit_at_once() {
    let admission = Arc::new(Admission::default());
    let held: Vec<Permit> = (0..3)
        .map(|_| admission.try_admit(bounds(3), true).unwrap())
        .collect();
    assert!(admission.try_admit(bounds(3), true).is_none());
    assert_eq!(limit_and_claiming(&admission, 3), (3, 3));
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn steady_latency_with_the_limit_in_use_grows_it_up_to_the_ceiling() {
    let admission = Arc::new(Admission::default());
    let mut last = limit(&admission);
    for _ in 0..20 {
        window(&admission, last, Duration::from_millis(1)).await;
        let now = limit(&admission);
        assert!(now >= last, "{now} < {last}");
        last = now;
    }
    assert!(last > INITIAL_LIMIT, "{last}");
    for _ in 0..400 {
        window(&admission, CEILING, Duration::from_millis(1)).await;
    }
    assert_eq!(limit(&admission), CEILING);
}

#[tokio::test(start_paused = true)]
async fn an_idle_gateway_does_not_raise_its_limit() {
    let admission = Arc::new(Admission::default());
    for _ in 0..50 {
        // A few claims at a time, far below half the limit.
        window(
            &admission,
            WINDOW_SAMPLES as usize,
            Duration::from_millis(1),
        )
        .await;
    }
    assert_eq!(limit(&admission), INITIAL_LIMIT);
}

#[tokio::test(start_paused = true)]
async fn latency_rising_holds_the_limit_and_past_half_the_timeout_brings_it_to_its_floor() {
    let admission = Arc::new(Admission::default());
    for _ in 0..30 {
        window(&admission, 64, Duration::from_millis(1)).await;
    }
    let healthy = limit(&admission);
    // Claims queue, each window slower than the last but below half the timeout: the
    // gradient stops the limit growing.
    let mut latency = Duration::from_millis(2);
    while latency < STORE_TIMEOUT / 2 {
        window(&admission, limit(&admission), latency).await;
        assert_eq!(limit(&admission), healthy);
        latency = latency * 3 / 2;
    }
    // Past it, down in proportion, window after window.
    let mut last = healthy;
    for _ in 0..30 {
        window(&admission, last, STORE_TIMEOUT).await;
        let now = limit(&admission);
        assert!(now < last || now == MIN_LIMIT, "{now} >= {last}");
        last = now;
    }
    assert_eq!(limit(&admission), MIN_LIMIT);
}

#[tokio::test(start_paused = true)]
async fn latency_past_half_the_store_timeout_lowers_the_limit_even_when_it_is_usual() {
    let admission = Arc::new(Admission::default());
    // Slow from the start: the long average is as slow as every window, so the gradient
    // alone sees nothing wrong.
    let slow = STORE_TIMEOUT * 2 / 3;
    let mut last = limit(&admission);
    for _ in 0..3 {
        window(&admission, last, slow).await;
        let now = limit(&admission);
        assert!(now < last, "{now} >= {last}");
        last = now;
    }
    // Below half the timeout, a steady latency is left alone.
    let fine = STORE_TIMEOUT / 3;
    let admission = Arc::new(Admission::default());
    for _ in 0..3 {
        window(&admission, 64, fine).await;
    }
    assert!(limit(&admission) >= INITIAL_LIMIT);
}

#[tokio::test(start_paused = true)]
async fn the_limit_recovers_once_the_store_is_fast_again() {
    let admission = Arc::new(Admission::default());
    for _ in 0..30 {
        window(&admission, 64, Duration::from_millis(1)).await;
    }
    for _ in 0..20 {
        window(&admission, 64, Duration::from_millis(200)).await;
    }
    let low = limit(&admission);
    assert_eq!(low, MIN_LIMIT);
    for _ in 0..200 {
        let n = limit(&admission);
        window(&admission, n, Duration::from_millis(1)).await;
    }
    assert!(limit(&admission) > INITIAL_LIMIT, "{}", limit(&admission));
}

#[tokio::test(start_paused = true)]
async fn places_given_back_without_a_measure_move_nothing() {
    let admission = Arc::new(Admission::default());
    for _ in 0..20 {
        let permits: Vec<Permit> = (0..64)
            .map(|_| admission.try_admit(bounds(CEILING), true).unwrap())
            .collect();
        tokio::time::advance(Duration::from_secs(1)).await;
        permits.into_iter().for_each(Permit::unmeasured);
    }
    assert_eq!(limit_and_claiming(&admission, CEILING), (INITIAL_LIMIT, 0));
    // A duplicate that waited on purpose, on a route that waits: not a measure either.
    let waited = admission.try_admit(bounds(CEILING), false).unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    drop(waited);
    // A claim won after its answer: measured, whatever the route.
    let won = admission.try_admit(bounds(CEILING), false).unwrap();
    won.claimed();
    assert_eq!(admission.lock().limiter.window.samples, 1);
}

fn waiting(ceiling: usize, wait: Duration) -> Bounds {
    Bounds {
        wait,
        ..bounds(ceiling)
    }
}

/// A waiter that holds the place it gets until told to let go, and says when it got one.
fn hold_when_admitted(
    admission: &Arc<Admission>,
    bounds: Bounds,
) -> (
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<bool>,
) {
    let (admitted_tx, admitted_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let a = admission.clone();
    let task = tokio::spawn(async move {
        let Some(permit) = a.admit(bounds, true).await else {
            return false;
        };
        let _ = admitted_tx.send(());
        let _ = release_rx.await;
        permit.unmeasured();
        true
    });
    (admitted_rx, release_tx, task)
}

#[tokio::test(start_paused = true)]
async fn waiters_get_places_in_the_order_they_came_and_a_newcomer_passes_none() {
    let admission = Arc::new(Admission::default());
    let held = admission.try_admit(bounds(1), true).unwrap();
    let wait = waiting(1, Duration::from_secs(5));
    let (mut first, let_first_go, first_task) = hold_when_admitted(&admission, wait);
    tokio::task::yield_now().await;
    let (mut second, let_second_go, second_task) = hold_when_admitted(&admission, wait);
    tokio::task::yield_now().await;
    assert_eq!(admission.load(1).waiting, 2);
    // One place comes back: the first waiter has it, the second still waits.
    held.unmeasured();
    tokio::task::yield_now().await;
    assert!(first.try_recv().is_ok(), "the first waiter has no place");
    assert!(
        second.try_recv().is_err(),
        "the second waiter passed the first"
    );
    assert_eq!(admission.load(1).waiting, 1);
    // A reload raises the ceiling to 2: the place it makes goes to the waiter, not to a
    // newcomer.
    assert!(admission.try_admit(bounds(2), true).is_none());
    tokio::task::yield_now().await;
    assert!(second.try_recv().is_ok(), "the second waiter has no place");
    let load = admission.load(2);
    assert_eq!((load.claiming, load.waiting), (2, 0));
    let_first_go.send(()).unwrap();
    let_second_go.send(()).unwrap();
    assert!(first_task.await.unwrap() && second_task.await.unwrap());
    assert_eq!(admission.load(2).claiming, 0);
}

#[tokio::test(start_paused = true)]
async fn a_lower_ceiling_applies_to_places_handed_over_after_a_reload() {
    let admission = Arc::new(Admission::default());
    let held: Vec<Permit> = (0..4)
        .map(|_| admission.try_admit(bounds(4), true).unwrap())
        .collect();
    let wait = waiting(4, Duration::from_secs(5));
    let (mut waiter, let_go, task) = hold_when_admitted(&admission, wait);
    tokio::task::yield_now().await;
    // The ceiling comes down to 2 (read by the next request to arrive, or a scrape).
    assert_eq!(admission.load(2).waiting, 1);
    let mut held = held.into_iter();
    // 4, 3 and then 2 admitted: no place for the waiter until fewer than 2 are.
    for _ in 0..2 {
        held.next().unwrap().unmeasured();
        tokio::task::yield_now().await;
        assert!(waiter.try_recv().is_err(), "a place past the new ceiling");
    }
    held.next().unwrap().unmeasured();
    tokio::task::yield_now().await;
    assert!(waiter.try_recv().is_ok(), "no place within the new ceiling");
    let_go.send(()).unwrap();
    assert!(task.await.unwrap());
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_runs_out_of_time_is_refused_and_leaves_no_place_taken() {
    let admission = Arc::new(Admission::default());
    let held = admission.try_admit(bounds(1), true).unwrap();
    let wait = Duration::from_millis(300);
    let refused = admission.admit(waiting(1, wait), true).await;
    assert!(refused.is_none());
    assert_eq!(admission.load(1).waiting, 0);
    drop(held);
    assert_eq!(admission.load(1).claiming, 0);
    // The place is free for the next, who waits for nothing.
    assert!(admission.admit(waiting(1, wait), true).await.is_some());
}

#[tokio::test(start_paused = true)]
async fn without_a_wait_a_request_past_the_limit_is_refused_at_once() {
    let admission = Arc::new(Admission::default());
    let _held = admission.try_admit(bounds(1), true).unwrap();
    let started = Instant::now();
    assert!(admission.admit(bounds(1), true).await.is_none());
    assert_eq!(Instant::now(), started);
}

#[tokio::test(start_paused = true)]
async fn time_spent_waiting_is_not_measured_as_the_claims_latency() {
    let admission = Arc::new(Admission::default());
    let held = admission.try_admit(bounds(1), true).unwrap();
    let waiter = tokio::spawn({
        let a = admission.clone();
        async move { a.admit(waiting(1, Duration::from_secs(5)), true).await }
    });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(2)).await;
    held.unmeasured();
    let permit = waiter.await.unwrap().unwrap();
    tokio::time::advance(Duration::from_millis(3)).await;
    permit.claimed();
    let state = admission.lock();
    assert_eq!(state.limiter.window.samples, 1);
    assert_eq!(state.limiter.window.total, Duration::from_millis(3));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_after_its_place_was_given_gives_it_back() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let admission = Arc::new(Admission::default());
    let held = admission.try_admit(bounds(1), true).unwrap();
    let mut waiter = Box::pin(admission.admit(waiting(1, Duration::from_secs(5)), true));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(waiter.as_mut().poll(&mut cx), Poll::Pending));
    assert_eq!(admission.load(1).waiting, 1);
    // The place goes to the waiter, whose client leaves before it runs again.
    held.unmeasured();
    assert_eq!(admission.load(1).claiming, 1);
    drop(waiter);
    let load = admission.load(1);
    assert_eq!((load.claiming, load.waiting), (0, 0));
    assert!(admission.try_admit(bounds(1), true).is_some());
}
