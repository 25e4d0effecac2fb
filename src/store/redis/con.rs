//! A connection to one server: the gateway's own over plain TCP (see [`super::own`]), or
//! the redis crate's where the store needs what only it does (TLS, Unix sockets, the
//! near-cache's RESP3 invalidation pushes). Both carry commands the crate encodes.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};

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
