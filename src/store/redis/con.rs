//! A connection to one server: the gateway's own over plain TCP (see [`super::own`]), or
//! the redis crate's where the store needs what only it does (TLS, Unix sockets, the
//! near-cache's RESP3 invalidation pushes). Both carry commands the crate encodes.

use std::future::Future;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::own::OwnConnection;

#[derive(Clone)]
pub(crate) enum Con {
    Own(OwnConnection),
    Crate(MultiplexedConnection),
}

impl ConnectionLike for Con {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Con::Own(c) => c.req_packed_command(cmd),
            Con::Crate(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Con::Own(c) => c.req_packed_commands(pipeline, offset, count),
            Con::Crate(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Own(c) => c.get_db(),
            Con::Crate(c) => c.get_db(),
        }
    }
}

/// A `MULTI` of a few commands, each kept with errors as values (`ignore_errors`): built
/// as a pipeline for the crate's connections, or written as bytes by the gateway for its
/// own (the claim's, on every keyed request: the crate's encoding of it was about 4,000
/// instructions, more than the rest of the connection's round trip).
pub(crate) trait Transaction: Sync {
    /// The crate's pipeline (`atomic`, `ignore_errors`).
    fn pipeline(&self) -> Pipeline;
    /// `MULTI`, the commands and `EXEC` encoded, and how many commands there are.
    fn packed(&self) -> (Vec<u8>, usize);
}

impl Transaction for Pipeline {
    fn pipeline(&self) -> Pipeline {
        self.clone()
    }

    fn packed(&self) -> (Vec<u8>, usize) {
        (self.get_packed_pipeline(), self.len())
    }
}

/// A connection that runs a [`Transaction`]: the `EXEC` reply, or nil.
pub(crate) trait Transact: Send {
    fn transact<'a>(
        &'a mut self,
        t: &'a (dyn Transaction + 'a),
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a;
}

impl Transact for Con {
    async fn transact<'a>(&'a mut self, t: &'a (dyn Transaction + 'a)) -> RedisResult<Value> {
        match self {
            Con::Own(c) => {
                let (bytes, commands) = t.packed();
                // `MULTI`'s `OK` and each command's `QUEUED` passed over, then `EXEC`'s.
                let mut replies = c.send_packed(bytes, commands + 1, 1).await?;
                Ok(replies.pop().unwrap_or(Value::Nil))
            }
            Con::Crate(c) => t.pipeline().query_async(c).await,
        }
    }
}

impl Transact for ClusterConnection {
    async fn transact<'a>(&'a mut self, t: &'a (dyn Transaction + 'a)) -> RedisResult<Value> {
        t.pipeline().query_async(self).await
    }
}
