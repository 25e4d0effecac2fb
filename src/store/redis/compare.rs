//! A completion without Lua, where the server compares and sets natively: `SET key
//! completed IFEQ claim PX window` (Valkey 8.1 and later, Redis 8.4 and later) writes the
//! completed record only while the key still holds, byte for byte, the value this claim
//! wrote. That value names its claimant, so the key is then the claim's own fresh record
//! (no renewal, hold, takeover or expiry since: each of those rewrites or removes it),
//! and the completed record is the one the completion script writes from it (see
//! [`super::string_record::completed_header`]). Any other answer leaves the key as it was
//! and the script decides, as on a server without `IFEQ`.
//!
//! Whether the server knows `IFEQ` is learnt on each connection (see [`super::completion`]):
//! a server that does not answers it with a syntax error, having written nothing.

use std::io::Write;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, RedisWrite, ToRedisArgs, Value};

use super::completion::{Form, Strategy};
use super::millis;
use super::string_record::{completed_header, HEADER_LEN};

/// The completed record as one argument: the header, then the response, written into
/// the command's buffer without joining them first.
pub(super) struct CompletedValue<'a> {
    pub(super) header: [u8; HEADER_LEN],
    pub(super) response: &'a [u8],
}

impl ToRedisArgs for CompletedValue<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        // The writer appends to the command's own buffer: it cannot fail.
        let _ = w.write_all(&self.header);
        let _ = w.write_all(self.response);
    }
}

/// The native completion of a fresh claim (`claimed`, the value it wrote) under `fence`,
/// or `None` when `claimed` is not a fresh claim's header.
pub(super) fn completion(
    key: &str,
    claimed: &[u8],
    fence: u64,
    response: &[u8],
    window: Duration,
) -> Option<redis::Cmd> {
    let window = millis(window);
    let header = completed_header(claimed, fence, window)?;
    // Sized once: growing the command's buffer arg by arg cost more than encoding it.
    let data = 3 + key.len() + header.len() + response.len() + 4 + claimed.len() + 2 + 20;
    let mut cmd = redis::Cmd::with_capacity(7, data);
    cmd.arg("SET")
        .arg(key)
        .arg(CompletedValue { header, response })
        .arg("IFEQ")
        .arg(claimed)
        .arg("PX")
        .arg(window);
    Some(cmd)
}

/// What a native completion found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compared {
    /// Completed.
    Written,
    /// The key holds something else (or nothing): the script decides.
    Differs,
    /// The server has no `IFEQ`, or the key is not a string: the script decides.
    NotNative,
}

/// Sends a native completion, `strategy` learning from its answer whether the server has
/// `IFEQ`.
pub(super) async fn send(
    cmd: &redis::Cmd,
    strategy: &Strategy,
    con: &mut impl ConnectionLike,
) -> RedisResult<Compared> {
    let answer: RedisResult<Value> = cmd.query_async(con).await;
    let compared = judge(&answer)?;
    match (&answer, compared) {
        (_, Compared::Written | Compared::Differs) => strategy.compared(),
        (Err(e), Compared::NotNative) => {
            strategy.refused(Form::Native, e);
        }
        (Ok(_), Compared::NotNative) => {}
    }
    Ok(compared)
}

/// Reads the answer: `OK` written, nil not; `ERR` (no `IFEQ` here) and `WRONGTYPE` (a key
/// that holds no string: the script then refuses it as unreadable) changed nothing; any
/// other failure is the connection's.
fn judge(answer: &RedisResult<Value>) -> RedisResult<Compared> {
    match answer {
        Ok(Value::Okay) => Ok(Compared::Written),
        Ok(Value::SimpleString(s)) if s == "OK" => Ok(Compared::Written),
        Ok(Value::Nil) => Ok(Compared::Differs),
        Ok(other) => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "SET ... IFEQ answered",
            format!("{other:?}"),
        ))),
        Err(e) if matches!(e.code(), Some("ERR" | "WRONGTYPE")) => Ok(Compared::NotNative),
        Err(e) => Err(e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_written_or_differs() {
        // Errors (`ERR` on Redis 7, `WRONGTYPE`) are read from real servers in
        // tests/native_compare.rs.
        assert_eq!(judge(&Ok(Value::Okay)).unwrap(), Compared::Written);
        assert_eq!(judge(&Ok(Value::Nil)).unwrap(), Compared::Differs);
        assert!(judge(&Ok(Value::Int(1))).is_err());
    }
}
