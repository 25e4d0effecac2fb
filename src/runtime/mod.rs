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

/// The runtime `run` serves on.
pub fn multi_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
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
/// runtime for as long as the process runs. Fewer than
/// two: none (connections stay on the runtime that accepts them).
pub fn workers(count: usize) -> std::io::Result<Workers> {
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
                    runtime.block_on(stop.cancelled());
                    runtime.shutdown_timeout(WORKER_SHUTDOWN);
                })?,
        );
    }
    Ok(Workers::new(handles, stop, threads))
}

#[cfg(test)]
mod tests {
    use super::{multi_thread, workers};

    #[test]
    fn each_connection_worker_runs_on_a_thread_of_its_own() {
        let workers = workers(3).unwrap();
        assert_eq!(workers.len(), 3);
        let names: Vec<String> = workers
            .runtimes()
            .iter()
            .map(|h| {
                h.block_on(async {
                    tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                        .await
                        .unwrap()
                        .unwrap_or_default()
                })
            })
            .collect();
        workers.stop();
        let mut names = names;
        names.sort();
        assert_eq!(
            names,
            ["dedupe-worker-0", "dedupe-worker-1", "dedupe-worker-2"]
        );
    }

    #[test]
    fn fewer_than_two_workers_are_none() {
        assert!(workers(1).unwrap().is_empty());
        assert!(workers(0).unwrap().is_empty());
    }

    #[test]
    fn the_multi_threaded_runtime_runs_tasks() {
        let runtime = multi_thread().unwrap();
        let sum = runtime.block_on(async {
            let tasks: Vec<_> = (0..64u64).map(|i| tokio::spawn(async move { i })).collect();
            let mut sum = 0;
            for t in tasks {
                sum += t.await.unwrap();
            }
            sum
        });
        assert_eq!(sum, (0..64).sum::<u64>());
    }
}
