//! The multi-threaded runtime the gateway serves on, and `server.idle_poll`: a worker
//! thread that runs out of work keeps its CPU for a moment before it sleeps.
//!
//! A sleeping worker is woken by the kernel when its next event comes, and where idle CPUs
//! halt (virtual machines) that wake-up is dear: on two shared cores, with tokio's workers
//! sleeping as soon as they ran out of work, the cores stood idle 8-12% of the time under
//! load against nginx's 3-4% (docs/benchmarks.md, run 10). So before it sleeps a worker
//! yields its CPU to any other thread that can run there, again and again, until
//! `idle_poll` has passed. tokio looks for events only as it sleeps: one that came
//! meanwhile waits for the poll to end (at most `idle_poll`), and then finds the sleep
//! returning at once, without the CPU halting and being woken.
//!
//! Public connections are served on connection workers, one single-threaded runtime per
//! CPU ([`workers`]); the multi-threaded runtime runs the rest.

use std::time::{Duration, Instant};

use crate::server::Workers;

/// The runtime `run` serves on, its workers polling for `idle_poll` before they sleep
/// (`Duration::ZERO`: they sleep at once, as tokio's do), and running `on_start` first on
/// each of its threads (the binary keeps its allocator's pages there).
pub fn multi_thread(
    idle_poll: Duration,
    on_start: fn(),
) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().on_thread_start(on_start);
    if !idle_poll.is_zero() {
        builder.on_thread_park(move || poll_for(idle_poll));
    }
    builder.build()
}

/// How long a stopped worker waits for its blocking tasks (reading a file, say).
const WORKER_SHUTDOWN: Duration = Duration::from_secs(1);

/// `count` connection workers (see [`crate::server::Workers`]): threads that each run a
/// single-threaded runtime, polling for `idle_poll` before they sleep, for as long as the
/// process runs, each running `on_start` first. Fewer than two: none (connections stay on
/// the runtime that accepts them).
pub fn workers(count: usize, idle_poll: Duration, on_start: fn()) -> std::io::Result<Workers> {
    if count < 2 {
        return Ok(Workers::none());
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let mut handles = Vec::with_capacity(count);
    let mut threads = Vec::with_capacity(count);
    for i in 0..count {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_all();
        if !idle_poll.is_zero() {
            builder.on_thread_park(move || poll_for(idle_poll));
        }
        let runtime = builder.build()?;
        handles.push(runtime.handle().clone());
        let stop = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dedupe-worker-{i}"))
                .spawn(move || {
                    on_start();
                    runtime.block_on(stop.cancelled());
                    runtime.shutdown_timeout(WORKER_SHUTDOWN);
                })?,
        );
    }
    Ok(Workers::new(handles, stop, threads))
}

/// Yields the CPU to whatever else can run on it until `idle_poll` has passed. A yield
/// with nothing else to run returns at once, so this keeps the CPU from halting without
/// keeping any other thread from it.
fn poll_for(idle_poll: Duration) {
    let until = Instant::now() + idle_poll;
    while Instant::now() < until {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{multi_thread, workers};

    static STARTED: AtomicUsize = AtomicUsize::new(0);
    static WORKERS_STARTED: AtomicUsize = AtomicUsize::new(0);

    fn started() {
        STARTED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn each_connection_worker_runs_on_start_first() {
        let workers = workers(3, Duration::ZERO, || {
            WORKERS_STARTED.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while WORKERS_STARTED.load(Ordering::SeqCst) < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(WORKERS_STARTED.load(Ordering::SeqCst), 3);
        workers.stop();
    }

    #[test]
    fn a_polling_runtime_runs_tasks_and_timers_as_a_sleeping_one() {
        for idle_poll in [
            Duration::ZERO,
            Duration::from_micros(15),
            Duration::from_micros(100),
        ] {
            let runtime = multi_thread(idle_poll, started).unwrap();
            let sum = runtime.block_on(async {
                let tasks: Vec<_> = (0..64u64)
                    .map(|i| {
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(i % 4)).await;
                            i
                        })
                    })
                    .collect();
                let mut sum = 0;
                for t in tasks {
                    sum += t.await.unwrap();
                }
                sum
            });
            assert_eq!(sum, (0..64).sum::<u64>(), "idle_poll {idle_poll:?}");
            assert!(STARTED.load(Ordering::SeqCst) > 0, "on_start never ran");
        }
    }
}
