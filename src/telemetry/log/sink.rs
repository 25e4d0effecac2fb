//! The log's one writer: lines from every thread go into one buffer, in the order they were
//! written, and a thread of its own writes the buffer out. Access lines wait for the next
//! flush (at most [`FLUSH_EVERY`], like nginx's `access_log ... flush=`); any other line
//! wakes the writer at once. A worker thread never makes a system call to log, and one
//! wake-up carries hundreds of lines.
//!
//! Never lossy while the writer runs: past [`CAP`] bytes waiting (stderr blocked), writers
//! wait. Closing writes out every line buffered, waiting at most [`CLOSE_WAIT`] for a
//! blocked output; lines logged after the writer finished go straight to the output.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest a buffered line waits before it is written out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How long closing waits for the writer to write out what is buffered: a blocked stderr
/// must not keep a stopping process alive.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Buffered bytes that wake the writer before its timer.
const WAKE_AT: usize = 64 * 1024;
/// Buffered bytes past which writers wait for the writer to catch up.
pub const CAP: usize = 1024 * 1024;

/// A handle to the log's buffer; cheap to clone.
#[derive(Clone)]
pub struct Sink(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// Signals the writer: a line to write now, a full buffer, or closing.
    wake: Condvar,
    /// Signals writers waiting for room.
    room: Condvar,
    /// Signals the closing guard that the writer wrote its last batch.
    finished: Condvar,
    flush_every: Duration,
    out: Mutex<Box<dyn Write + Send>>,
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    wake_asked: bool,
    waiting_for_room: usize,
    /// The guard asked the writer to write out everything and stop.
    closed: bool,
    /// The writer wrote its last batch: lines go straight to the output from now on.
    done: bool,
}

/// Stops the writer when dropped, after it wrote out every line buffered; lines written
/// after that go straight to the output.
#[must_use = "dropping the guard stops the log's writer"]
pub struct Guard {
    sink: Sink,
    writer: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; should it, the bytes are still good.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sink {
    /// Starts the writer thread (`log-writer`) writing to `out`; a buffered line waits at
    /// most `flush_every` ([`FLUSH_EVERY`] for the process's log).
    pub fn start(
        out: Box<dyn Write + Send>,
        flush_every: Duration,
    ) -> std::io::Result<(Sink, Guard)> {
        let sink = Sink(Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            room: Condvar::new(),
            finished: Condvar::new(),
            flush_every,
            out: Mutex::new(out),
        }));
        let shared = sink.0.clone();
        let writer = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || write_out(&shared))?;
        let guard = Guard {
            sink: sink.clone(),
            writer: Some(writer),
        };
        Ok((sink, guard))
    }

    /// Adds `bytes` (whole lines) to the buffer. `now`: wake the writer instead of waiting
    /// for its timer.
    pub fn append(&self, bytes: &[u8], now: bool) {
        let shared = &*self.0;
        let mut state = lock(&shared.state);
        while state.buf.len() >= CAP && !state.done {
            state.waiting_for_room += 1;
            state = shared
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting_for_room -= 1;
        }
        if state.done {
            // After the writer's last batch, and in order: the state lock is held across.
            let _ = lock(&shared.out).write_all(bytes);
            return;
        }
        let was_empty = state.buf.is_empty();
        state.buf.extend_from_slice(bytes);
        if state.wake_asked {
            return;
        }
        if now || state.buf.len() >= WAKE_AT {
            state.wake_asked = true;
            shared.wake.notify_one();
        } else if was_empty {
            // Starts the writer's timer; an idle writer sleeps until a line comes.
            shared.wake.notify_one();
        }
    }
}

/// The writer thread: sleeps until a line comes, gives it company until its timer or a
/// wake-up, takes the whole buffer, writes it out; after closing, until nothing is left.
fn write_out(shared: &Shared) {
    let mut batch = Vec::with_capacity(WAKE_AT);
    loop {
        let mut state = lock(&shared.state);
        while state.buf.is_empty() && !state.wake_asked && !state.closed {
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if !state.wake_asked && !state.closed {
            state = shared
                .wake
                .wait_timeout_while(state, shared.flush_every, |s| !s.wake_asked && !s.closed)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.wake_asked = false;
        std::mem::swap(&mut state.buf, &mut batch);
        if state.waiting_for_room > 0 {
            shared.room.notify_all();
        }
        if state.closed && batch.is_empty() {
            state.done = true;
            shared.room.notify_all();
            shared.finished.notify_all();
            return;
        }
        drop(state);
        // Output errors (a closed stderr) have nowhere to be reported.
        let mut out = lock(&shared.out);
        let _ = out.write_all(&batch);
        let _ = out.flush();
        drop(out);
        batch.clear();
        // A burst's buffers are not kept: the two buffers take turns here.
        if batch.capacity() > 4 * WAKE_AT {
            batch = Vec::with_capacity(WAKE_AT);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let shared = &*self.sink.0;
        let mut state = lock(&shared.state);
        state.closed = true;
        shared.wake.notify_one();
        let (state, _) = shared
            .finished
            .wait_timeout_while(state, CLOSE_WAIT, |s| !s.done)
            .unwrap_or_else(PoisonError::into_inner);
        let done = state.done;
        drop(state);
        if let Some(writer) = self.writer.take().filter(|_| done) {
            let _ = writer.join();
        }
    }
}

/// `tracing-subscriber` writes each formatted event with one `write_all`: one whole line.
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(self)
    }
}

/// One event's bytes, written to the sink at once.
pub struct LineWriter<'a>(&'a Sink);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.append(buf, true);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::captured::Out;
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn a_buffered_line_waits_for_the_timer_and_an_urgent_one_takes_it_along() {
        let out = Out::default();
        let (sink, _guard) = Sink::start(Box::new(out.clone()), Duration::from_secs(3600)).unwrap();
        sink.append(b"buffered\n", false);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(out.text(), "", "written before its timer or a wake-up");
        sink.append(b"urgent\n", true);
        out.wait_for("buffered\nurgent\n");

        let out = Out::default();
        let (sink, _guard) = Sink::start(Box::new(out.clone()), Duration::from_millis(10)).unwrap();
        sink.append(b"by the timer\n", false);
        out.wait_for("by the timer\n");
    }

    #[test]
    fn closing_while_threads_log_keeps_every_line_in_order() {
        let out = Out::default();
        let (sink, guard) = Sink::start(Box::new(out.clone()), FLUSH_EVERY).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        sink.append(format!("{t} {i}\n").as_bytes(), i % 5000 == 0);
                    }
                })
            })
            .collect();
        // Closed while the threads are still logging: their later lines go straight out.
        while out.text().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(guard);
        for t in threads {
            t.join().unwrap();
        }
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 80_000);
        // Each thread's lines arrive whole and in its order.
        for t in 0..4 {
            let mine: Vec<usize> = lines
                .iter()
                .filter_map(|l| l.strip_prefix(&format!("{t} ")))
                .map(|i| i.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..20_000).collect::<Vec<_>>());
        }
    }

    #[test]
    fn closing_gives_up_on_an_output_that_never_takes_the_lines() {
        let out = Out::default();
        out.blocked.store(true, Ordering::SeqCst);
        let (sink, guard) = Sink::start(Box::new(out.clone()), FLUSH_EVERY).unwrap();
        sink.append(b"stuck\n", true);
        // Returns (after CLOSE_WAIT) instead of waiting for the output forever.
        drop(guard);
        assert!(!lock(&sink.0.state).done);
        out.blocked.store(false, Ordering::SeqCst);
        out.wait_for("stuck\n");
    }

    #[test]
    fn a_blocked_output_makes_writers_wait_and_loses_nothing() {
        let out = Out::default();
        out.blocked.store(true, Ordering::SeqCst);
        let (sink, guard) = Sink::start(Box::new(out.clone()), FLUSH_EVERY).unwrap();
        let line = vec![b'x'; 1023];
        let writer = {
            let sink = sink.clone();
            let line = line.clone();
            std::thread::spawn(move || {
                for _ in 0..(3 * CAP / 1024) {
                    let mut l = line.clone();
                    l.push(b'\n');
                    sink.append(&l, false);
                }
            })
        };
        // The writer fills the buffer and then waits: at most CAP (plus a line) held.
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&sink.0.state).waiting_for_room == 0 {
            assert!(Instant::now() < deadline, "the writer never waited");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(lock(&sink.0.state).buf.len() < CAP + 1024);
        out.blocked.store(false, Ordering::SeqCst);
        writer.join().unwrap();
        drop(guard);
        assert_eq!(out.bytes.lock().unwrap().len(), 3 * CAP);
    }
}
