//! gRPC's length-prefixed messages: one byte of flags (bit 0: compressed with the call's
//! `grpc-encoding`), a big-endian u32 length, then the message. Pure.

use bytes::{BufMut, Bytes, BytesMut};

/// The prefix before each message.
pub const PREFIX: usize = 5;

/// One message of a request or response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// Compressed with the call's `grpc-encoding`.
    pub compressed: bool,
    /// The message bytes as sent.
    pub payload: &'a [u8],
}

/// Why a body is not the one message a deduped gRPC call carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// No message at all.
    #[error("the request carries no gRPC message")]
    Empty,
    /// A prefix or message cut short, or a flags byte gRPC does not define.
    #[error("the request's gRPC framing is malformed")]
    Malformed,
    /// More than one message: a client- or bidi-streaming call, which is not deduped.
    #[error("the request carries {0} gRPC messages; a deduped method takes exactly one")]
    Several(usize),
}

/// Splits a body into its messages, in order.
pub fn messages(mut body: &[u8]) -> Result<Vec<Message<'_>>, FrameError> {
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < PREFIX {
            return Err(FrameError::Malformed);
        }
        let flags = body[0];
        if flags > 1 {
            return Err(FrameError::Malformed);
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let rest = &body[PREFIX..];
        if rest.len() < len {
            return Err(FrameError::Malformed);
        }
        out.push(Message {
            compressed: flags == 1,
            payload: &rest[..len],
        });
        body = &rest[len..];
    }
    Ok(out)
}

/// The one message of a unary or server-streaming request.
pub fn single(body: &[u8]) -> Result<Message<'_>, FrameError> {
    let mut all = messages(body)?;
    match all.len() {
        0 => Err(FrameError::Empty),
        1 => Ok(all.remove(0)),
        n => Err(FrameError::Several(n)),
    }
}

/// `payload` framed as one uncompressed message.
pub fn encode(payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(PREFIX + payload.len());
    out.put_u8(0);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_round_trips() {
        let framed = encode(b"hello");
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 5]);
        let m = single(&framed).unwrap();
        assert_eq!(m.payload, b"hello");
        assert!(!m.compressed);
        assert_eq!(single(&encode(b"")).unwrap().payload, b"");
    }

    #[test]
    fn compressed_flag_is_read() {
        let mut framed = encode(b"zz").to_vec();
        framed[0] = 1;
        assert!(single(&framed).unwrap().compressed);
    }

    #[test]
    fn several_messages_are_counted_and_refused_as_one() {
        let mut two = encode(b"a").to_vec();
        two.extend_from_slice(&encode(b"bc"));
        let all = messages(&two).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].payload, b"bc");
        assert_eq!(single(&two), Err(FrameError::Several(2)));
    }

    #[test]
    fn empty_truncated_and_bad_flags_are_errors() {
        assert_eq!(single(b""), Err(FrameError::Empty));
        let framed = encode(b"hello");
        for cut in 1..framed.len() {
            assert_eq!(single(&framed[..cut]), Err(FrameError::Malformed), "{cut}");
        }
        let mut bad = framed.to_vec();
        bad[0] = 2;
        assert_eq!(single(&bad), Err(FrameError::Malformed));
    }
}
