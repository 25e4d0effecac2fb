//! How a fresh claim's completion is sent, decided in one place ([`Strategy::form`]): by
//! `SET ... IFEQ` where the server compares and sets natively (see [`super::compare`]),
//! else staged where the record is large and the server lets this user stage (see
//! [`super::staged`]), else by the finish script in its compare form.
//!
//! What the server supports is learnt per connection: from the first completion sent on
//! it (`IFEQ` answered, or refused as a syntax error; a staged transaction refused for the
//! user's permissions), and forgotten when the connection is replaced ([`Strategy::forget`]:
//! a reconnect, a failover), so a new primary is asked again. A form the server turns out
//! not to support (a failover to an older primary) has written nothing, and the same
//! completion is sent in the next form. [`refusal`] is the one place that reads a
//! refusal's text.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use redis::RedisError;

// Not yet known is 0 (`Default`).
const NATIVE: u8 = 1;
const SCRIPTED: u8 = 2;

/// How one completion is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// `SET key <completed> IFEQ <claimed> PX <window>`: no Lua.
    Native,
    /// One `MULTI`: the record staged under a second key, renamed by the script.
    Staged,
    /// The finish script, the record among its arguments.
    Script,
}

/// What a refusal says of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// It cannot parse `SET ... IFEQ`.
    NoCompare,
    /// The user may not run a command of the staged transaction (`RENAME`, or a queued one).
    Denied,
}

/// What the server behind one connection was found to support.
#[derive(Debug, Default)]
pub(super) struct Strategy {
    compare: AtomicU8,
    staging_refused: AtomicBool,
}

impl Strategy {
    /// The form for a completion that could be staged (`stageable`: a record large enough
    /// to pay, on a key that can take a staged key).
    pub(super) fn form(&self, stageable: bool) -> Form {
        if self.compare.load(Ordering::Relaxed) != SCRIPTED {
            Form::Native
        } else if stageable && !self.staging_refused.load(Ordering::Relaxed) {
            Form::Staged
        } else {
            Form::Script
        }
    }

    /// The server answered `IFEQ` (written or not): it compares natively.
    pub(super) fn compared(&self) {
        if self
            .compare
            .compare_exchange(0, NATIVE, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::info!("the Redis server compares and sets natively (SET ... IFEQ): completions run without Lua");
        }
    }

    /// Learns from a refusal of `form`; `Some` when it says what the server lacks (the
    /// completion then goes in the next form, nothing having been written).
    pub(super) fn refused(&self, form: Form, e: &RedisError) -> Option<Refusal> {
        let refusal = refusal(e)?;
        match (form, refusal) {
            (Form::Native, Refusal::NoCompare) => {
                if self.compare.swap(SCRIPTED, Ordering::Relaxed) != SCRIPTED {
                    tracing::info!("the Redis server has no SET ... IFEQ (Valkey 8.1 or Redis 8.4 and later have it): completions run a script");
                }
            }
            (Form::Staged, Refusal::Denied) => {
                if !self.staging_refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "Redis refused a staged completion; large completions carry their response in the script on this connection (grant the gateway's ACL user RENAME to stage them)");
                }
            }
            _ => return None,
        }
        Some(refusal)
    }

    /// A new connection (a reconnect, a failover): what was learnt is asked again.
    pub(super) fn forget(&self) {
        self.compare.store(0, Ordering::Relaxed);
        self.staging_refused.store(false, Ordering::Relaxed);
    }
}

/// What a refusal says of the server: a syntax error is a server that cannot parse
/// `IFEQ` (any other, say a response over `proto-max-bulk-len`, says nothing of its
/// commands); a permission refusal is a queued command (`NOPERM`, among the reasons of
/// a transaction the crate reports aborted, `EXECABORT`; or as itself) or
/// the script's `RENAME` (an `ERR` naming the refusal: Redis 7.0 says the user "can't run
/// this command", 7.2 and later "ACL failure in script ... no permissions").
pub(super) fn refusal(e: &RedisError) -> Option<Refusal> {
    let one = |code: &str, detail: Option<&str>| match code {
        "NOPERM" => Some(Refusal::Denied),
        "ERR" => detail.and_then(|d| {
            if d.starts_with("syntax error") {
                Some(Refusal::NoCompare)
            } else if d.contains("can't run this command") || d.contains("ACL failure in script") {
                Some(Refusal::Denied)
            } else {
                None
            }
        }),
        _ => None,
    };
    match e.code() {
        Some("EXECABORT") => e
            .clone()
            .into_server_errors()?
            .iter()
            .find_map(|(_, s)| one(s.code(), s.details())),
        Some(code) => one(code, e.detail()),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn server(text: &[u8]) -> RedisError {
        match redis::parse_redis_value(text).unwrap() {
            Value::ServerError(e) => e.into(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_are_read_once_here() {
        // Redis 7.0's and 7.2's words for a script's refused command.
        let denied = [
            &b"-ERR The user executing the script can't run this command or subcommand script: 1cd4, on @user_script:1.\r\n"[..],
            b"-ERR ACL failure in script: User app has no permissions to run the 'rename' command script: 1cd4, on @user_script:1.\r\n",
            b"-NOPERM this user has no permissions to run the 'del' command\r\n",
        ];
        for text in denied {
            assert_eq!(refusal(&server(text)), Some(Refusal::Denied));
        }
        assert_eq!(
            refusal(&server(b"-ERR syntax error\r\n")),
            Some(Refusal::NoCompare)
        );
        assert_eq!(refusal(&server(b"-OOM command not allowed\r\n")), None);
        assert_eq!(
            refusal(&server(b"-ERR Protocol error: invalid bulk length\r\n")),
            None
        );
        let client = RedisError::from((redis::ErrorKind::Client, "x", "y".to_owned()));
        assert_eq!(refusal(&client), None);
    }

    #[test]
    fn the_form_follows_what_was_learnt_until_the_connection_is_replaced() {
        let s = Strategy::default();
        assert_eq!(s.form(true), Form::Native);
        s.compared();
        assert_eq!(s.form(true), Form::Native);
        let syntax = server(b"-ERR syntax error\r\n");
        assert_eq!(s.refused(Form::Native, &syntax), Some(Refusal::NoCompare));
        assert_eq!(s.form(true), Form::Staged);
        assert_eq!(s.form(false), Form::Script);
        // Found without `IFEQ`, a server stays so for this connection (a cluster
        // mid-upgrade: the script suits every node).
        s.compared();
        assert_eq!(s.form(true), Form::Staged);
        // A refusal that says nothing of the server teaches nothing.
        let oom = server(b"-OOM command not allowed\r\n");
        assert_eq!(s.refused(Form::Staged, &oom), None);
        assert_eq!(s.form(true), Form::Staged);
        let noperm = server(b"-NOPERM no permissions to run the 'rename' command\r\n");
        assert_eq!(s.refused(Form::Staged, &noperm), Some(Refusal::Denied));
        assert_eq!(s.form(true), Form::Script);
        // A new connection (a failover to another primary) is asked again.
        s.forget();
        assert_eq!(s.form(true), Form::Native);
    }
}
