//! For the log's tests: an output they can read, and hold shut to play a blocked stderr.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes written, kept for the test; `blocked` makes writes wait.
#[derive(Clone, Default)]
pub struct Out {
    pub bytes: Arc<Mutex<Vec<u8>>>,
    pub blocked: Arc<AtomicBool>,
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
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
    }

    /// Waits (10s at most) until `want` was written.
    pub fn wait_for(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.text().contains(want) {
            assert!(Instant::now() < deadline, "never written: {want:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
