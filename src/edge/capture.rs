//! Gathering a body read frame by frame: the winner's answer for the store, a deduped
//! request's body.

use bytes::{Bytes, BytesMut};

/// A body read frame by frame. One that arrives in a single frame (the common case) is
/// kept as it came, without a copy; more frames are gathered into one buffer.
#[derive(Default)]
pub(super) struct Gathered {
    first: Option<Bytes>,
    buf: BytesMut,
}

impl Gathered {
    /// Adds a frame; returns the bytes held so far.
    pub fn push(&mut self, data: Bytes) -> usize {
        match self.first.take() {
            None if self.buf.is_empty() => {
                let held = data.len();
                self.first = Some(data);
                held
            }
            earlier => {
                if let Some(earlier) = earlier {
                    self.buf.extend_from_slice(&earlier);
                }
                self.buf.extend_from_slice(&data);
                self.buf.len()
            }
        }
    }

    /// Everything gathered, as one buffer.
    pub fn into_bytes(self) -> Bytes {
        self.first.unwrap_or_else(|| self.buf.freeze())
    }
}
