//! The gateway's own connection to one Redis server over plain TCP, for the store's
//! commands when no near-cache needs RESP3's invalidation pushes.
//!
//! The redis crate's multiplexed connection carries every command through a general
//! machinery: a sink and a stream over a codec, a parser built from combinators, and
//! bookkeeping for pushes and subscriptions the store never makes. Under a profile that
//! was a third of what a Redis round trip cost the gateway. This one does only what the
//! store needs: commands are encoded by the crate as before (so every command and script
//! reads its reply as before), queued to one task that owns the socket, written out
//! together, and their replies read by a small RESP2 parser ([`resp`]) and handed back in
//! order.
//!
//! What it keeps from the crate's connection, because the store relies on it:
//! - the set-up: `AUTH` (with the ACL user when the URL names one, and without it for a
//!   server older than ACLs) and `SELECT`, or a `PING` when neither is needed, so that a
//!   server that accepts TCP but does not answer (SIGSTOP) is no connection;
//! - a transaction's reply: the `EXEC` array only; a command refused while queued makes
//!   the first such refusal the transaction's error (the crate lists them all in one
//!   `EXECABORT` error; the store reads neither);
//! - an empty command is refused, never queued (no reply would end it);
//! - a connection that fails (reset, closed, a reply out of step) fails every command
//!   waiting on it with an error that says the connection is gone
//!   ([`redis::RedisError::is_connection_dropped`]), so the store dials again and sends
//!   once more (see [`super::RedisStore::query`]);
//! - a command given up on (its deadline passed) leaves its reply to be read and dropped:
//!   the replies stay in step.
//!
//! At most 64 KiB are taken from the queue and left unsent: a server that stops reading
//! holds the rest back, and a command given up on while queued is never sent.
//!
//! Writes coalesce as [`crate::store::coalesce`] does for the crate's connection: the first
//! write of a burst gives way once, so the commands of the requests that run in the same
//! scheduler turn leave in one write and Redis wakes once for them.

mod drive;
mod resp;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::Poll;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use self::drive::{Drive, Request};

/// A handle on the connection; cheap to clone. The task that drives it ends when the
/// last handle goes (or is aborted with the store's [`super::dial::Driver`]).
#[derive(Clone)]
pub(crate) struct OwnConnection {
    requests: mpsc::UnboundedSender<Request>,
    db: i64,
}

fn gone(what: &'static str) -> RedisError {
    io::Error::new(io::ErrorKind::ConnectionReset, what).into()
}

impl OwnConnection {
    /// Sets up the connection on `stream` (`AUTH`, `SELECT`); returns it and the task
    /// to spawn that drives it.
    pub(super) async fn new(
        settings: &redis::RedisConnectionInfo,
        stream: TcpStream,
    ) -> RedisResult<(Self, Drive)> {
        let (requests, rx) = mpsc::unbounded_channel();
        let drive = Drive::new(stream, rx);
        let con = Self {
            requests,
            db: settings.db(),
        };
        // The set-up's replies arrive only while the task runs: drive it here until they
        // have, then hand it over.
        let mut setup = std::pin::pin!(con.clone().setup(settings));
        let mut drive = drive;
        let answered = std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = setup.as_mut().poll(cx) {
                return Poll::Ready(done);
            }
            match Pin::new(&mut drive).poll(cx) {
                // What the server said before it closed (a refusal: `maxclients`) has
                // reached the set-up's command, if it said anything.
                Poll::Ready(()) => match setup.as_mut().poll(cx) {
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    _ => Poll::Ready(Err(gone("the connection closed during set-up"))),
                },
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        answered?;
        Ok((con, drive))
    }

    async fn setup(mut self, settings: &redis::RedisConnectionInfo) -> RedisResult<()> {
        if let Some(password) = settings.password() {
            let auth = |user: Option<&str>| {
                let mut auth = redis::cmd("AUTH");
                if let Some(user) = user {
                    auth.arg(user);
                }
                auth.arg(password);
                auth
            };
            let mut answer = auth(settings.username()).exec_async(&mut self).await;
            // A server older than ACLs (Redis 5) takes a password alone, as the crate's
            // own set-up retries.
            if matches!(&answer, Err(e) if settings.username().is_some()
                && e.detail().is_some_and(|d| d.contains("wrong number of arguments for 'auth'")))
            {
                answer = auth(None).exec_async(&mut self).await;
            }
            answer.map_err(refused)?;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .exec_async(&mut self)
                .await?;
        }
        if settings.password().is_none() && settings.db() == 0 {
            // Something must answer before the connection counts as made: a frozen
            // server (SIGSTOP) still accepts TCP.
            redis::cmd("PING").exec_async(&mut self).await?;
        }
        Ok(())
    }

    /// Queues `bytes` (commands already encoded), whose replies are `skip` to pass over
    /// and then `take` to return.
    fn send(
        &self,
        bytes: Vec<u8>,
        skip: usize,
        take: usize,
    ) -> oneshot::Receiver<RedisResult<Vec<Value>>> {
        let (reply, rx) = oneshot::channel();
        if bytes.is_empty() || take == 0 {
            // No reply would ever end it: refused as the crate refuses an empty command.
            let _ = reply.send(Err(RedisError::from((
                redis::ErrorKind::Client,
                "empty command",
            ))));
            return rx;
        }
        // A closed channel drops the request, and with it `reply`: the receiver reports
        // the connection gone.
        let _ = self.requests.send(Request {
            bytes,
            skip,
            take,
            reply,
        });
        rx
    }
}

/// A refused `AUTH`, said as the crate's own dial says it, with Redis's error code only:
/// the detail of some refusals (an unknown command) repeats the arguments, the password
/// among them. A server with no room for another client (`maxclients`) answers every
/// command so, `AUTH` included: that is said as it is (the message names no argument).
fn refused(e: RedisError) -> RedisError {
    const FULL: &str = "max number of clients reached";
    if e.is_io_error() || e.detail().is_some_and(|d| d.starts_with(FULL)) {
        return e;
    }
    let code = e.code().unwrap_or("refused").to_owned();
    RedisError::from((
        redis::ErrorKind::AuthenticationFailed,
        "Password authentication failed",
        code,
    ))
}

impl OwnConnection {
    /// Sends commands the gateway encoded itself: `skip` replies passed
    /// over, then `take` returned.
    pub(crate) async fn send_packed(
        &self,
        bytes: Vec<u8>,
        skip: usize,
        take: usize,
    ) -> RedisResult<Vec<Value>> {
        answer(self.send(bytes, skip, take)).await
    }
}

async fn answer(rx: oneshot::Receiver<RedisResult<Vec<Value>>>) -> RedisResult<Vec<Value>> {
    rx.await
        .unwrap_or_else(|_| Err(gone("the Redis connection closed")))
}

impl ConnectionLike for OwnConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let rx = self.send(cmd.get_packed_command(), 0, 1);
        Box::pin(async move {
            let mut values = answer(rx).await?;
            values.pop().ok_or_else(|| gone("no reply"))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let rx = self.send(pipeline.get_packed_pipeline(), offset, count);
        Box::pin(answer(rx))
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
