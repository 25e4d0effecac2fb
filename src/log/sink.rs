//! The log's one writer: lines from every thread go into one buffer, in the order they were
//! written, and a thread of its own writes the buffer out. Access lines wait for the next
//! flush (at most [`FLUSH_EVERY`], like nginx's `access_log ... flush=`); any other line
//! wakes the writer at once. A worker thread never makes a system call to log, and one
//! wake-up carries hundreds of lines.
//!
//! Never lossy: past [`CAP`] bytes not yet written (stderr blocked), writers wait.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest a buffered line waits before it is written out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
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
    out: Mutex<Box<dyn Write + Send>>,
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    wake_asked: bool,
    waiting_for_room: usize,
    closed: bool,
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
    /// Starts the writer thread (`log-writer`) writing to `out`.
    pub fn start(out: Box<dyn Write + Send>) -> std::io::Result<(Sink, Guard)> {
        let sink = Sink(Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            room: Condvar::new(),
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
        while state.buf.len() >= CAP && !state.closed {
            state.waiting_for_room += 1;
            state = shared
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting_for_room -= 1;
        }
        if state.closed {
            // Held across the write, so a late line follows the writer's last batch.
            let _ = lock(&shared.out).write_all(bytes);
            return;
        }
        state.buf.extend_from_slice(bytes);
        if (now || state.buf.len() >= WAKE_AT) && !state.wake_asked {
            // Once per batch: a notify is a system call even when nobody waits.
            state.wake_asked = true;
            shared.wake.notify_one();
        }
    }
}

/// The writer thread: waits for a wake-up or its timer, takes the whole buffer, writes it.
fn write_out(shared: &Shared) {
    let mut batch = Vec::with_capacity(WAKE_AT);
    loop {
        let mut state = lock(&shared.state);
        if !state.wake_asked && !state.closed {
            // A spurious wake-up only writes a batch early.
            state = shared
                .wake
                .wait_timeout(state, FLUSH_EVERY)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.wake_asked = false;
        std::mem::swap(&mut state.buf, &mut batch);
        if state.waiting_for_room > 0 {
            shared.room.notify_all();
        }
        if state.closed {
            // The last batch, written under the state lock: no later line overtakes it.
            let mut out = lock(&shared.out);
            let _ = out.write_all(&batch);
            let _ = out.flush();
            return;
        }
        drop(state);
        if !batch.is_empty() {
            // Output errors (a closed stderr) have nowhere to be reported.
            let mut out = lock(&shared.out);
            let _ = out.write_all(&batch);
            let _ = out.flush();
        }
        batch.clear();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.sink.0.state);
            state.closed = true;
            self.sink.0.wake.notify_one();
            self.sink.0.room.notify_all();
        }
        if let Some(writer) = self.writer.take() {
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
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    /// An output the test can read, and hold shut to play a blocked stderr.
    #[derive(Clone, Default)]
    struct Out {
        bytes: Arc<Mutex<Vec<u8>>>,
        blocked: Arc<AtomicBool>,
    }

    impl Write for Out {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while self.blocked.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Out {
        fn text(&self) -> String {
            String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
        }
        fn wait_for(&self, want: &str) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !self.text().contains(want) {
                assert!(Instant::now() < deadline, "never written: {want:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    #[test]
    fn buffered_lines_are_written_by_the_timer_and_urgent_ones_at_once() {
        let out = Out::default();
        let (sink, _guard) = Sink::start(Box::new(out.clone())).unwrap();
        sink.append(b"buffered\n", false);
        out.wait_for("buffered\n");
        sink.append(b"urgent\n", true);
        out.wait_for("urgent\n");
    }

    #[test]
    fn dropping_the_guard_writes_out_everything_in_order() {
        let out = Out::default();
        let (sink, guard) = Sink::start(Box::new(out.clone())).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        sink.append(format!("{t} {i}\n").as_bytes(), i % 500 == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        sink.append(b"after\n", false);
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8001);
        assert_eq!(lines.last(), Some(&"after"));
        // Each thread's lines arrive whole and in its order.
        for t in 0..4 {
            let mine: Vec<usize> = lines
                .iter()
                .filter_map(|l| l.strip_prefix(&format!("{t} ")))
                .map(|i| i.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..2000).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_blocked_output_makes_writers_wait_and_loses_nothing() {
        let out = Out::default();
        out.blocked.store(true, Ordering::SeqCst);
        let (sink, guard) = Sink::start(Box::new(out.clone())).unwrap();
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
