//! Connection workers: threads that each run a single-threaded runtime, one per CPU, as
//! nginx runs a worker process per CPU. The accept loop hands each public connection to
//! the next worker, and the connection and every task it starts (a keyed request's,
//! hyper's HTTP/2 streams) run on that worker's thread to the end.
//!
//! On tokio's work-stealing runtime a request's tasks moved between threads: its wakes
//! crossed threads, its memory was freed on another thread than allocated it, and the
//! shared counters' cache lines moved between cores with it. Under `wrk` on two cores that
//! cost a memory-store new key 20.3 µs of the gateway's CPU against 14.9 on one thread
//! (docs/benchmarks.md).
//!
//! A connection is moved to its worker's reactor once, when it is handed over (two
//! `epoll_ctl` calls). A plain Redis store gives each worker a connection of its own
//! (`crate::store::RedisStore::on_runtimes`); its main connection, the log's background
//! task, the admin port, signals and the drain stay on the main runtime, and connections
//! on a worker reach them through the same channels as before.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// The workers' runtimes; none: connections are served on the runtime that accepts them.
#[derive(Default)]
pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Ends the workers' runtimes (see [`Workers::stop`]).
    stop: CancellationToken,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// Workers running on these runtimes' threads, each running until `stop` is
    /// cancelled and then shutting its runtime down.
    pub fn new(
        handles: Vec<Handle>,
        stop: CancellationToken,
        threads: Vec<JoinHandle<()>>,
    ) -> Self {
        Self {
            handles,
            next: AtomicUsize::new(0),
            stop,
            threads: Mutex::new(threads),
        }
    }

    /// Ends every worker's runtime, dropping what still runs there (as dropping the one
    /// runtime did before there were workers), and waits for their threads. Called once
    /// the drain is over, before the main runtime (the store's main connection) goes.
    pub fn stop(&self) {
        self.stop.cancel();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// No workers: every connection on the accepting runtime (tests, one CPU).
    pub fn none() -> Self {
        Self::default()
    }

    /// Their runtimes.
    pub fn runtimes(&self) -> &[Handle] {
        &self.handles
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Runs `serve` for `stream` on the next worker, or on this runtime without workers.
    pub fn spawn<F, Fut>(&self, stream: TcpStream, remote: SocketAddr, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        if self.handles.is_empty() {
            tokio::spawn(serve(stream));
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        // Off this runtime's reactor, onto the worker's there.
        let socket = match stream.into_std() {
            Ok(socket) => socket,
            Err(e) => {
                debug!(error = %e, %remote, "could not hand a connection to a worker");
                return;
            }
        };
        self.handles[i].spawn(async move {
            match TcpStream::from_std(socket) {
                Ok(stream) => serve(stream).await,
                Err(e) => debug!(error = %e, %remote, "a worker could not take a connection"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_are_served_on_the_workers_in_turn() {
        let workers = super::super::workers(2).unwrap();
        assert_eq!(workers.len(), 2);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..4 {
            let client = tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(b"ping").await.unwrap();
                let mut answer = String::new();
                s.read_to_string(&mut answer).await.unwrap();
                answer
            });
            let (stream, remote) = listener.accept().await.unwrap();
            // Each connection answers with the thread that served it, after a read and a
            // write on the worker's own reactor.
            workers.spawn(stream, remote, |mut stream| async move {
                let mut ping = [0u8; 4];
                stream.read_exact(&mut ping).await.unwrap();
                let name = std::thread::current().name().unwrap_or("").to_owned();
                stream.write_all(name.as_bytes()).await.unwrap();
            });
            clients.push(client.await.unwrap());
        }
        assert_eq!(
            clients,
            [
                "dedupe-worker-0",
                "dedupe-worker-1",
                "dedupe-worker-0",
                "dedupe-worker-1"
            ]
        );
    }

    #[test]
    fn stopped_workers_drop_what_still_runs_and_their_threads_end() {
        struct Dropped(std::sync::mpsc::Sender<()>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let workers = super::super::workers(2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for handle in &workers.handles {
            let held = Dropped(tx.clone());
            handle.spawn(async move {
                std::future::pending::<()>().await;
                drop(held);
            });
        }
        drop(tx);
        workers.stop();
        // Both tasks were dropped with their runtimes, and the threads were joined.
        assert_eq!(rx.iter().count(), 2);
        assert!(workers.threads.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn without_workers_a_connection_is_served_here() {
        let workers = Workers::none();
        assert!(workers.is_empty());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).await.unwrap();
            answer
        });
        let (stream, remote) = listener.accept().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.spawn(stream, remote, |mut stream| async move {
            stream.write_all(b"here").await.unwrap();
            let _ = tx.send(());
        });
        rx.await.unwrap();
        assert_eq!(client.await.unwrap(), b"here");
    }
}
