//! The runtimes the gateway runs on, and what is kept per runtime.
//!
//! Public connections are served on connection workers, one single-threaded runtime per
//! CPU ([`Workers`]); the multi-threaded runtime runs the rest (the admin port, signals,
//! the drain, the store's main connection). What a runtime's reactor or timer wheel
//! drives is kept per runtime ([`PerRuntime`]): the upstream clients, the Redis links and
//! the kept timers ([`Timers`]).

pub mod boxed;
mod per_runtime;
mod timers;
mod workers;

use std::time::Duration;

pub use self::per_runtime::PerRuntime;
pub use self::timers::{Timers, Within};
pub use self::workers::Workers;

use crate::config::defaults::MAX_WORKERS;

/// The runtime this runs on, if any.
pub fn here() -> Option<tokio::runtime::Id> {
    tokio::runtime::Handle::try_current().ok().map(|h| h.id())
}

/// The runtime `run` serves on, running `on_start` first on each of its threads (the
/// binary keeps its allocator's pages there).
pub fn multi_thread(on_start: fn()) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(on_start)
        .build()
}

/// How long a stopped worker waits for its blocking tasks (reading a file, say).
const WORKER_SHUTDOWN: Duration = Duration::from_secs(1);

/// How many connection workers `server.workers` asks for: the number set, else one per
/// CPU the process may use (at most [`MAX_WORKERS`]).
pub fn worker_count(configured: Option<usize>) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    configured.unwrap_or(cpus.min(MAX_WORKERS))
}

/// `count` connection workers (see [`Workers`]): threads that each run a single-threaded
/// runtime for as long as the process runs, each running `on_start` first. Fewer than
/// two: none (connections stay on the runtime that accepts them).
pub fn workers(count: usize, on_start: fn()) -> std::io::Result<Workers> {
    if count < 2 {
        return Ok(Workers::none());
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let mut handles = Vec::with_capacity(count);
    let mut threads = Vec::with_capacity(count);
    for i in 0..count {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::{multi_thread, workers};

    static STARTED: AtomicUsize = AtomicUsize::new(0);
    static WORKERS_STARTED: AtomicUsize = AtomicUsize::new(0);

    fn started() {
        STARTED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn each_connection_worker_runs_on_start_first() {
        let workers = workers(3, || {
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
    fn the_multi_threaded_runtime_runs_on_start_on_its_threads() {
        let runtime = multi_thread(started).unwrap();
        let sum = runtime.block_on(async {
            let tasks: Vec<_> = (0..64u64).map(|i| tokio::spawn(async move { i })).collect();
            let mut sum = 0;
            for t in tasks {
                sum += t.await.unwrap();
            }
            sum
        });
        assert_eq!(sum, (0..64).sum::<u64>());
        assert!(STARTED.load(Ordering::SeqCst) > 0, "on_start never ran");
    }
}
