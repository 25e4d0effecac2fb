//! A public connection (plain, or TLS once its first bytes are read) served by the HTTP/1
//! lane ([`crate::lane`]) for as long as its requests are the lane's, then by hyper
//! ([`Serving::full`]) with the bytes read so far.
//!
//! The bounds are the full path's: each request head within `server.header_read_timeout`
//! (the first from the accept), the body's arrival and the upstream's head within
//! `server.upstream_timeout`, every write within `server.write_timeout`; a client that
//! leaves while its answer is awaited drops the call, as hyper does. A
//! connection waiting for its next request closes when the drain begins; one serving a
//! request finishes it and closes, its response saying `Connection: close`.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use bytes::BytesMut;
use http::Method;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tracing::debug;

use super::connection::Serving;
use super::greeting::{FirstRequest, Prefixed};
use super::WriteDeadline;
use crate::http::{Gateway, LaneAnswer, LaneCall, LaneRoute, Live};
use crate::lane::answer::{self, Ending};
use crate::lane::head::{self, Hop, Read};

/// How much room a read asks for.
const READ_ROOM: usize = 8 * 1024;

/// Whether a new connection starts in the lane: the upstream is reached over plain
/// HTTP/1.1 and no traces are exported.
pub(super) fn open(gateway: &Gateway) -> bool {
    !crate::telemetry::on() && gateway.live().upstream.lane().is_some()
}

/// A request head the lane takes, read off the buffer.
struct Taken {
    method: Method,
    /// Where its target is in the buffer.
    target: Range<usize>,
    /// Its head's and body's lengths.
    len: usize,
    body: usize,
    close: bool,
    route: LaneRoute,
    /// The upstream's head, the body to follow.
    request: Vec<u8>,
    /// The configuration it is served under.
    live: Arc<Live>,
}

/// What the buffer's start holds.
enum Next {
    More,
    Full,
    Take(Taken),
}

/// Why the lane let a connection go.
enum Left {
    /// It ended: closed, failed, timed out or drained.
    Ended,
    /// A request the lane does not take: hyper serves the rest.
    ToFull,
}

/// A connection in the lane: the client's stream and what was read from it.
struct Lane<S> {
    io: WriteDeadline<S>,
    buf: BytesMut,
    client_ip: Vec<u8>,
    /// The client's hop is TLS.
    tls: bool,
    /// Requests answered.
    served: u64,
}

impl Serving {
    /// Serves `stream` in the lane, then with hyper from the first request the lane does
    /// not take.
    pub(super) async fn lane<S>(
        &self,
        (stream, tls): (S, bool),
        remote: SocketAddr,
        gateway: Arc<Gateway>,
        watcher: Watcher,
        deadline: Instant,
    ) where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let mut lane = Lane {
            io: WriteDeadline::new(stream, self.write_timeout),
            buf: BytesMut::with_capacity(READ_ROOM),
            client_ip: crate::upstream::client_ip(remote).as_bytes().to_vec(),
            tls,
            served: 0,
        };
        match self.run(&mut lane, &gateway, deadline).await {
            Left::Ended => {}
            Left::ToFull => {
                let first = FirstRequest::default();
                if lane.served > 0 {
                    first.mark();
                }
                let stream = Prefixed::new(lane.buf.to_vec(), lane.io.into_inner());
                self.full(stream, tls, (gateway, watcher), remote, deadline, first)
                    .await;
            }
        }
    }

    /// The lane's requests, one after another (pipelined ones from the buffer).
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        lane: &mut Lane<S>,
        gateway: &Gateway,
        first_head_by: Instant,
    ) -> Left {
        let mut head_by = first_head_by;
        loop {
            let taken = loop {
                // The configuration in force when the head is whole: a reload while the
                // connection waited applies to it.
                match self.next(&lane.buf, gateway, (&lane.client_ip, lane.tls)) {
                    Next::Take(taken) => break taken,
                    Next::Full => return Left::ToFull,
                    Next::More => {}
                }
                let idle = lane.buf.is_empty();
                let read = tokio::select! {
                    read = tokio::time::timeout_at(head_by, fill(lane)) => read,
                    // Between requests, the drain closes the connection.
                    () = self.stopping.cancelled(), if idle => return Left::Ended,
                };
                match read {
                    Ok(Ok(n)) if n > 0 => {}
                    Ok(_) => return Left::Ended,
                    Err(_) => {
                        debug!("no request began within server.header_read_timeout");
                        return Left::Ended;
                    }
                }
            };
            let started = StdInstant::now();
            // The upstream's head is due by `server.upstream_timeout` from this request's
            // head, the body's arrival included, as on the full path (which streams it).
            let deadline = taken.live.upstream.deadline();
            let whole = taken.len + taken.body;
            let to_head = taken.method == Method::HEAD;
            while lane.buf.len() < whole {
                match tokio::time::timeout_at(deadline, fill(lane)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    Ok(_) => return Left::Ended,
                    Err(_) => {
                        let target = target(&lane.buf, &taken.target);
                        let response =
                            gateway.lane_body_timeout(&taken.route, taken.method, target, started);
                        let _ = answer::made(&mut lane.io, response, (true, to_head)).await;
                        return Left::Ended;
                    }
                }
            }
            // The message leaves the buffer; what follows it (a pipelined request) stays.
            let message = lane.buf.split_to(whole).freeze();
            let Taken {
                method,
                target: at,
                close,
                route,
                request,
                len,
                live,
                ..
            } = taken;
            let call = LaneCall {
                method,
                target: target(&message, &at),
                request: [request.into(), message.slice(len..)],
                started,
                deadline,
            };
            // The client is watched while the upstream answers: one that leaves drops the
            // call, as hyper drops the service.
            let called = answer::watching(
                &mut lane.io,
                &mut lane.buf,
                gateway.lane_call(&live, route, call),
            );
            let Ok(answer) = called.await else {
                debug!("the client closed the connection before its answer");
                return Left::Ended;
            };
            let close = close || self.stopping.is_cancelled();
            let written = match answer {
                LaneAnswer::Relayed { out, head, body } => {
                    let io = &mut lane.io;
                    answer::relayed(io, &mut lane.buf, out, &head, body, (close, to_head)).await
                }
                LaneAnswer::Made(response) => {
                    answer::made(&mut lane.io, response, (close, to_head)).await
                }
            };
            match written {
                Ok(Ending::KeepAlive) => {}
                Ok(Ending::Close) => {
                    let _ = lane.io.shutdown().await;
                    return Left::Ended;
                }
                Err(e) => {
                    debug!(error = %e, "client connection ended with an error");
                    return Left::Ended;
                }
            }
            lane.served += 1;
            head_by = Instant::now() + self.header_read_timeout;
        }
    }

    /// Reads the head at the buffer's start, and whether the lane takes it.
    fn next(&self, buf: &[u8], gateway: &Gateway, (client_ip, tls): (&[u8], bool)) -> Next {
        let head = match head::read(buf, self.max_head) {
            Read::Partial => return Next::More,
            Read::Other => return Next::Full,
            Read::Lane(head) => head,
        };
        let live = gateway.live();
        let (Some(route), Some(to)) = (
            gateway.lane_route(&live, &head.method, head.path),
            live.upstream.lane(),
        ) else {
            return Next::Full;
        };
        let hop = Hop {
            host: to.host,
            base_path: to.base_path,
            client_ip,
            tls,
        };
        let start = head.target.as_ptr() as usize - buf.as_ptr() as usize;
        Next::Take(Taken {
            request: head.upstream(&hop),
            target: start..start + head.target.len(),
            len: head.len,
            body: head.body,
            close: head.close,
            method: head.method,
            route,
            live: live.clone(),
        })
    }
}

/// Reads more of the client's bytes: how many (0 at the end of the stream).
async fn fill<S: AsyncRead + Unpin>(lane: &mut Lane<S>) -> std::io::Result<usize> {
    if lane.buf.capacity() - lane.buf.len() < READ_ROOM / 4 {
        lane.buf.reserve(READ_ROOM);
    }
    lane.io.read_buf(&mut lane.buf).await
}

/// The target a head read at `at` (ASCII: the lane took it).
fn target<'b>(buf: &'b [u8], at: &Range<usize>) -> &'b str {
    std::str::from_utf8(&buf[at.clone()]).unwrap_or("/")
}
