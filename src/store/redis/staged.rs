//! A large completion whose response never becomes a Lua string, for a server without
//! `SET ... IFEQ` (Redis before 8.4; see [`super::compare`] for the servers that have it).
//!
//! Redis's Lua hashes every byte of each string a script is given or reads (Redis 7.0
//! hashes the whole string; Lua 5.1 itself sampled long ones): the compare form of the
//! finish script cost Redis's main thread 13 µs a new key with a 4 KiB record and 121 µs
//! with a 64 KiB one, against 6 and 38 for the same writes as plain `SET`s (raw socket,
//! pipelined, Redis 7.0.15). A completion whose record is at least [`STAGE_FROM`] bytes is
//! therefore one `MULTI`:
//!
//! ```text
//! SET <staged> <completed record> PX <window>
//! EVALSHA <finish> 2 <key> <staged> <claim's value> <window>
//! DEL <staged>
//! ```
//!
//! The script renames the staged record onto the key where the key still holds the
//! claim's value, and otherwise decides as the compare form does, reading the staged
//! record (the rare path). The `DEL` removes the staged record whatever the script did,
//! `NOSCRIPT` included (the call is then sent again with `EVAL`). A transaction runs
//! whole or not at all: no other client ever sees the staged key, and a connection lost
//! before `EXEC` leaves nothing. The same record costs Redis 10 µs instead of 13 at 4 KiB
//! and 42 instead of 121 at 64 KiB; below about 1.5 KiB the transaction costs more than
//! the bytes it keeps out of Lua.
//!
//! A transaction Redis refuses or discards runs nothing, and that completion is sent
//! unstaged, as one script: one refused for the ACL user's permissions (after which this
//! connection stages no more, see [`super::completion`]),
//! and one discarded, as on Redis Cluster while the slot migrates (the source answers
//! `ASK` for the staged key it lacks, and the redis crate follows no redirect inside a
//! transaction; a script follows it).
//!
//! The staged key is the record's key with `~` after the prefix (`dedupe:~{tag}:...`): no
//! record's key has it (the prefix is followed by the hash tag), it is in the record's
//! slot (the same hash tag), and an ACL granting `~dedupe:*` covers it. Two completions
//! may share it: each transaction writes, uses and removes it before any other runs.

use redis::aio::ConnectionLike;
use redis::{Pipeline, RedisResult, Value};
use std::time::Duration;

use super::compare::CompletedValue;
use super::completion::{Form, Refusal, Strategy};
use super::millis;
use super::scripts::{no_script, Call, Script};
use super::string_record::HEADER_LEN;
use super::strings;

/// The completed record's length from which a completion is staged.
pub(super) const STAGE_FROM: usize = 2048;

/// The `MULTI` of a staged completion.
pub(super) struct StagedCompletion<'a> {
    script: &'a Script,
    key: &'a str,
    staged: String,
    claimed: &'a [u8],
    header: [u8; HEADER_LEN],
    response: &'a [u8],
    window: u64,
}

/// The staged completion of `key`'s fresh claim (`claimed`, the value its `SET` wrote) with
/// the completed record `header` and `response`, or `None` where it would not pay (a
/// record under [`STAGE_FROM`]) or the key has no hash tag after its prefix (its staged
/// key could fall in another slot).
pub(super) fn staged_completion<'a>(
    script: &'a Script,
    key: &'a str,
    claimed: &'a [u8],
    header: [u8; HEADER_LEN],
    response: &'a [u8],
    window: Duration,
) -> Option<StagedCompletion<'a>> {
    if header.len() + response.len() < STAGE_FROM {
        return None;
    }
    Some(StagedCompletion {
        script,
        key,
        staged: staged_key(key)?,
        claimed,
        header,
        response,
        window: millis(window),
    })
}

/// `prefix:~{tag}...` for `prefix:{tag}...` (a tag of at least one byte, as Redis Cluster
/// reads one); `None` for any other key.
fn staged_key(key: &str) -> Option<String> {
    let (prefix, rest) = key.split_once(':')?;
    let tag_len = rest.strip_prefix('{')?.find('}')?;
    (tag_len > 0).then(|| format!("{prefix}:~{rest}"))
}

impl StagedCompletion<'_> {
    /// The transaction, its script called by `EVAL` (`eval`) or `EVALSHA`.
    fn sent(&self, eval: bool) -> Sent<'_> {
        Sent { staged: self, eval }
    }

    /// Runs the transaction, or where Redis refuses it, `unstaged` (see [`Strategy`]); a
    /// transaction discarded for another error (`EXECABORT`: a queued command refused,
    /// say for memory) runs nothing either, and that completion is sent unstaged.
    pub(super) async fn send_or<'s, C: ConnectionLike + Send>(
        &self,
        strategy: &Strategy,
        con: &mut C,
        unstaged: impl FnOnce() -> Call<'s>,
    ) -> RedisResult<Value> {
        let e = match self.send(con).await {
            Err(e) => e,
            reply => return reply,
        };
        let refused = strategy.refused(Form::Staged, &e) == Some(Refusal::Denied);
        if !refused && e.code() != Some("EXECABORT") {
            return Err(e);
        }
        unstaged().invoke(con).await
    }

    /// Runs the transaction (again with `EVAL` where the node lacks the script): the
    /// script's reply.
    async fn send(&self, con: &mut (impl ConnectionLike + Send)) -> RedisResult<Value> {
        let reply = match strings::send(&self.sent(false).pipeline(), con).await {
            Err(e) if no_script(&e) => {
                tracing::debug!("a Redis node lacks the script; sending it with EVAL");
                strings::send(&self.sent(true).pipeline(), con).await
            }
            reply => reply,
        }?;
        match reply {
            Value::Array(mut items) if items.len() == 3 => Ok(items.swap_remove(1)),
            other => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "a staged completion's EXEC answered",
                format!("{other:?}"),
            ))),
        }
    }
}

/// A staged completion as sent.
struct Sent<'a> {
    staged: &'a StagedCompletion<'a>,
    eval: bool,
}

impl Sent<'_> {
    fn pipeline(&self) -> Pipeline {
        let s = self.staged;
        let mut call = s.script.call(s.key, Some(&s.staged), s.claimed.len() + 20);
        call.arg(s.claimed).arg(s.window);
        let completed = CompletedValue {
            header: s.header,
            response: s.response,
        };
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.atomic()
            .ignore_errors()
            .cmd("SET")
            .arg(&s.staged)
            .arg(completed)
            .arg("PX")
            .arg(s.window)
            .add_command(call.command(self.eval))
            .cmd("DEL")
            .arg(&s.staged);
        pipe
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::scripts::tests::words;

    #[test]
    fn the_staged_key_keeps_the_hash_tag_and_leaves_the_records_names() {
        assert_eq!(
            staged_key("dedupe:{0a1b}:payments:-:k:1").as_deref(),
            Some("dedupe:~{0a1b}:payments:-:k:1")
        );
        // No tag right after the prefix, or an empty one: not staged.
        for key in [
            "dedupe:payments:{a}",
            "dedupe:{}:x",
            "dedupe",
            "dedupe:{open",
        ] {
            assert_eq!(staged_key(key), None, "{key}");
        }
    }

    #[test]
    fn only_a_record_from_the_threshold_is_staged() {
        let script = Script::new("return 1".into());
        let header = [1u8; HEADER_LEN];
        let small = vec![0u8; STAGE_FROM - HEADER_LEN - 1];
        let large = vec![0u8; STAGE_FROM - HEADER_LEN];
        let key = "dedupe:{0a1b}:r:-:k";
        let window = Duration::from_secs(60);
        assert!(staged_completion(&script, key, b"c", header, &small, window).is_none());
        let staged = staged_completion(&script, key, b"c", header, &large, window).unwrap();
        let pipe = staged.sent(false).pipeline();
        assert!(pipe.is_transaction());
        let words: Vec<_> = pipe.cmd_iter().map(words).collect();
        assert_eq!(words[0][0], b"SET");
        assert_eq!(words[0][1], b"dedupe:~{0a1b}:r:-:k");
        assert_eq!(words[0][2].len(), STAGE_FROM);
        assert_eq!(&words[0][3..], [b"PX".to_vec(), b"60000".to_vec()]);
        assert_eq!(words[1][0], b"EVALSHA");
        assert_eq!(
            &words[1][2..],
            [
                b"2".to_vec(),
                key.as_bytes().to_vec(),
                b"dedupe:~{0a1b}:r:-:k".to_vec(),
                b"c".to_vec(),
                b"60000".to_vec()
            ]
        );
        assert_eq!(
            words[2],
            [b"DEL".to_vec(), b"dedupe:~{0a1b}:r:-:k".to_vec()]
        );
        let eval = staged.sent(true).pipeline();
        assert_eq!(eval.cmd_iter().nth(1).unwrap().args_iter().count(), 7);
    }
}
