//! A public connection (plain, or TLS once its first bytes are read) served by the HTTP/1
//! lane ([`crate::lane`]) for as long as its requests are the lane's, then by hyper
//! ([`Serving::full`]) with the bytes read so far.
//!
//! The bounds are the full path's: each request head within `server.header_read_timeout`
//! (the first from the accept), the body's arrival and the upstream's head within
//! `server.upstream_timeout` (a keyed request is taken only with its body whole), every
//! write within `server.write_timeout`; a client that leaves while its answer is
//! awaited drops the call (a keyed request's task runs on), as hyper does. A
//! connection waiting for its next request closes when the drain begins; one serving a
//! request finishes it and closes, its response saying `Connection: close`.

use std::net::SocketAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use bytes::BytesMut;
use http::{HeaderValue, Method};
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::connection::Serving;
use super::greeting::{FirstRequest, Prefixed};
use super::WriteDeadline;
use crate::framing::AmbiguousFraming;
use crate::http::{ConnInfo, Gateway, LaneAnswer, LaneCall, LaneRoute, Live};
use crate::lane::answer::{self, AnswerError, Ending, Inbox};
use crate::lane::head::{self, Hop, Read};
use crate::upstream::sent::{SentHead, SentLayout};

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
    /// Where it goes on to, the body to follow.
    onward: Onward,
    /// The configuration it is served under.
    live: Arc<Live>,
}

/// Where a request the lane takes goes on to.
enum Onward {
    /// The upstream, with this head written from the client's.
    Upstream(Vec<u8>),
    /// The full pipeline (a keyed request), with this head, and where its fields are for
    /// the head its winner sends upstream (see [`SentHead::keyed_upstream`]).
    Pipeline(Box<(http::request::Parts, SentLayout)>),
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
    inbox: Inbox,
    client_ip: HeaderValue,
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
            inbox: Inbox {
                bytes: BytesMut::with_capacity(READ_ROOM),
                closed: false,
            },
            client_ip: crate::upstream::client_ip(remote),
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
                let stream = Prefixed::new(lane.inbox.bytes.to_vec(), lane.io.into_inner());
                self.full(stream, tls, (gateway, watcher), remote, deadline, first)
                    .await;
            }
        }
    }

    /// The lane's requests, one after another (pipelined ones from the buffer).
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        lane: &mut Lane<S>,
        gateway: &Arc<Gateway>,
        first_head_by: Instant,
    ) -> Left {
        let mut head_by = first_head_by;
        // One timer for every head the connection waits for, moved on to each new
        // deadline: a later deadline is one atomic store, where a timer armed and dropped
        // per request took the timer wheel's lock twice.
        let mut head_timer = std::pin::pin!(tokio::time::sleep_until(head_by));
        loop {
            // The drain lets no new request begin, pipelined or not (hyper's graceful
            // shutdown ends keep-alive the same way).
            if self.stopping.is_cancelled() {
                return Left::Ended;
            }
            head_timer.as_mut().reset(head_by);
            let taken = match self.head(lane, gateway, head_timer.as_mut()).await {
                Ok(taken) => taken,
                Err(left) => return left,
            };
            let started = StdInstant::now();
            // The upstream's head is due by `server.upstream_timeout` from this request's
            // head, the body's arrival included, as on the full path (which streams it). (A
            // keyed request's body is whole already: see `next`.)
            let deadline = taken.live.upstream.deadline();
            let whole = taken.len + taken.body;
            let to_head = taken.method == Method::HEAD;
            // Most bodies came with their heads: no wait to build.
            if lane.inbox.bytes.len() < whole {
                if let Err(left) = self.body(lane, gateway, &taken, (deadline, started)).await {
                    return left;
                }
            }
            // The message leaves the buffer; what follows it (a pipelined request) stays.
            let message = lane.inbox.bytes.split_to(whole).freeze();
            let Taken {
                method,
                target: at,
                close,
                route,
                onward,
                len,
                live,
                ..
            } = taken;
            let ends = (close, to_head);
            let written = match onward {
                Onward::Pipeline(keyed) => {
                    let (parts, layout) = *keyed;
                    let req = http::Request::from_parts(parts, message.slice(len..));
                    let sent = layout.sent(message.slice(..len));
                    self.keyed(lane, gateway, (req, sent), ends).await
                }
                Onward::Upstream(request) => {
                    let call = LaneCall {
                        method,
                        target: target(&message, &at),
                        request: [request.into(), message.slice(len..)],
                        started,
                        deadline,
                    };
                    self.plain(lane, gateway, (&live, route), call, ends).await
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

    /// Reads until `taken`'s body is whole, by `deadline`: one that has not come by then is
    /// answered 408 (`body-timeout`) and the connection ends.
    async fn body<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        lane: &mut Lane<S>,
        gateway: &Gateway,
        taken: &Taken,
        (deadline, started): (Instant, StdInstant),
    ) -> Result<(), Left> {
        while lane.inbox.bytes.len() < taken.len + taken.body {
            match tokio::time::timeout_at(deadline, fill(lane)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return Err(Left::Ended),
                Err(_) => {
                    let target = target(&lane.inbox.bytes, &taken.target);
                    let method = taken.method.clone();
                    let response = gateway.lane_body_timeout(&taken.route, method, target, started);
                    let to_head = taken.method == Method::HEAD;
                    let ends = (true, to_head);
                    let _ = answer::served(&mut lane.io, &mut lane.inbox, response, ends).await;
                    return Err(Left::Ended);
                }
            }
        }
        Ok(())
    }

    /// The next request head the lane takes, read before `head_by` ends; or why the lane
    /// lets the connection go (it ended, timed out or drained while idle; or hyper takes
    /// it on).
    async fn head<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        lane: &mut Lane<S>,
        gateway: &Gateway,
        mut head_by: Pin<&mut Sleep>,
    ) -> Result<Taken, Left> {
        loop {
            // The configuration in force when the head is whole: a reload while the
            // connection waited applies to it.
            let hop = (lane.client_ip.as_bytes(), lane.tls);
            match self.next(&lane.inbox.bytes, gateway, hop) {
                Next::Take(taken) => return Ok(taken),
                Next::Full => return Err(Left::ToFull),
                Next::More => {}
            }
            let idle = lane.inbox.bytes.is_empty();
            // What has arrived is read before the deadline is looked at, as a timeout
            // would.
            let read = tokio::select! {
                biased;
                read = fill(lane) => read,
                () = head_by.as_mut() => {
                    debug!("no request began within server.header_read_timeout");
                    return Err(Left::Ended);
                }
                // Between requests, the drain closes the connection.
                () = self.stopping.cancelled(), if idle => return Err(Left::Ended),
            };
            match read {
                Ok(n) if n > 0 => {}
                _ => return Err(Left::Ended),
            }
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
        let onward = if route.keyed() {
            // Taken only with its body whole: one still on its way goes to hyper, whose
            // pipeline judges the head (a missing key, a body over `server.max_body`) before
            // the body has come, within `server.body_read_timeout`.
            let whole = buf.len() >= head.len + head.body;
            let Some(parts) = head.request(tls).filter(|_| whole) else {
                return Next::Full;
            };
            Onward::Pipeline(Box::new((parts, head.layout(buf, tls))))
        } else {
            Onward::Upstream(head.upstream(&hop))
        };
        Next::Take(Taken {
            onward,
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

impl Serving {
    /// A request without a key: its upstream call in bytes, the client watched meanwhile
    /// (one that leaves drops the call, as hyper drops the service), and the answer
    /// relayed (or the problem the gateway made).
    async fn plain<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        lane: &mut Lane<S>,
        gateway: &Gateway,
        (live, route): (&Live, LaneRoute),
        call: LaneCall<'_>,
        (close, to_head): (bool, bool),
    ) -> Result<Ending, AnswerError> {
        let called = gateway.lane_call(live, route, call);
        let answer = answer::watching(&mut lane.io, &mut lane.inbox, called).await?;
        let close = close || self.stopping.is_cancelled();
        match answer {
            LaneAnswer::Relayed { out, head, body } => {
                let io = &mut lane.io;
                answer::relayed(io, &mut lane.inbox, out, &head, body, (close, to_head)).await
            }
            LaneAnswer::Made(response) => {
                answer::served(&mut lane.io, &mut lane.inbox, response, (close, to_head)).await
            }
        }
    }

    /// A keyed request, read whole: the full pipeline handles it, the client watched
    /// meanwhile (one that leaves drops the wait, not the request's task), and its answer
    /// is written as hyper would write it.
    async fn keyed<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        lane: &mut Lane<S>,
        gateway: &Arc<Gateway>,
        (req, sent): (http::Request<bytes::Bytes>, SentHead),
        (close, to_head): (bool, bool),
    ) -> Result<Ending, AnswerError> {
        let conn = ConnInfo {
            client_ip: lane.client_ip.clone(),
            framing: AmbiguousFraming::default(),
        };
        let handled = gateway.clone().handle_read(req, sent, conn);
        let response = answer::watching(&mut lane.io, &mut lane.inbox, handled).await?;
        let close = close || self.stopping.is_cancelled();
        answer::served(&mut lane.io, &mut lane.inbox, response, (close, to_head)).await
    }
}

/// Reads more of the client's bytes: how many (0 at the end of the stream).
async fn fill<S: AsyncRead + Unpin>(lane: &mut Lane<S>) -> std::io::Result<usize> {
    if lane.inbox.closed {
        return Ok(0);
    }
    if lane.inbox.bytes.capacity() - lane.inbox.bytes.len() < READ_ROOM / 4 {
        lane.inbox.bytes.reserve(READ_ROOM);
    }
    lane.io.read_buf(&mut lane.inbox.bytes).await
}

/// The target a head read at `at` (ASCII: the lane took it).
fn target<'b>(buf: &'b [u8], at: &Range<usize>) -> &'b str {
    std::str::from_utf8(&buf[at.clone()]).unwrap_or("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::{MemoryStore, Store};
    use tokio_util::sync::CancellationToken;

    const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:8080"
upstream = "http://127.0.0.1:9000"

[[routes]]
name = "orders"
methods = ["POST"]
path = "/orders/**"
key = { header = "Idempotency-Key", required = true }
scope = []

[[routes]]
name = "calls"
methods = ["POST"]
path = "/pkg.Svc/**"
grpc = true
key = { header = "Idempotency-Key", required = true }
scope = []
"#;

    fn taken(raw: &[u8], tls: bool) -> Option<Taken> {
        let config = Config::from_toml(CONFIG).unwrap();
        let serving = Serving::new(&config.server, CancellationToken::new());
        let gateway = Gateway::new(config, Store::Memory(MemoryStore::new(16)));
        match serving.next(raw, &gateway, (b"10.0.0.1", tls)) {
            Next::Take(taken) => Some(taken),
            Next::Full => None,
            Next::More => panic!("a whole head"),
        }
    }

    #[test]
    fn a_deduping_route_s_request_is_taken_whole_for_the_full_pipeline() {
        let raw = b"POST /orders/1?x=1 HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: k-1\r\n\
                    X-Dup: 1\r\nX-Dup: 2\r\nX-Forwarded-Proto: http\r\nContent-Length: 2\r\n\r\n{}";
        let keyed = taken(raw, false).expect("the lane takes it");
        assert!(keyed.route.keyed());
        assert_eq!((keyed.len, keyed.body), (raw.len() - 2, 2));
        let Onward::Pipeline(pipeline) = keyed.onward else {
            panic!("a keyed request goes to the pipeline");
        };
        let (parts, layout) = *pipeline;
        // The winner's head, but for the owner's fields and the blank line its call adds.
        let to = crate::upstream::LaneTarget {
            host: b"127.0.0.1:9000",
            base_path: b"",
        };
        let sent = layout.sent(bytes::Bytes::copy_from_slice(raw));
        let upstream = String::from_utf8(sent.keyed_upstream(to, b"10.0.0.1")).unwrap();
        assert!(
            upstream.starts_with("POST /orders/1?x=1 HTTP/1.1\r\n")
                && upstream.ends_with("\r\nhost: 127.0.0.1:9000\r\n"),
            "{upstream:?}"
        );
        assert!(!upstream.contains("idempotency-key") && !upstream.ends_with("\r\n\r\n"));
        assert!(
            upstream.contains("\r\nx-dup: 1\r\nx-dup: 2\r\n"),
            "{upstream:?}"
        );
        assert_eq!(
            (&parts.method, parts.uri.to_string().as_str()),
            (&Method::POST, "/orders/1?x=1")
        );
        assert_eq!(parts.version, http::Version::HTTP_11);
        assert_eq!(parts.headers["idempotency-key"], "k-1");
        let dups: Vec<_> = parts.headers.get_all("x-dup").iter().collect();
        assert_eq!(dups, ["1", "2"]);
        assert_eq!(parts.headers["x-forwarded-proto"], "http");
        // Over TLS the upstream is told so, whatever the client said, as on hyper's path.
        let Onward::Pipeline(pipeline) = taken(raw, true).unwrap().onward else {
            panic!("a keyed request goes to the pipeline");
        };
        let (parts, _) = *pipeline;
        let protos: Vec<_> = parts.headers.get_all("x-forwarded-proto").iter().collect();
        assert_eq!(protos, ["https"]);
    }

    #[test]
    fn plain_requests_stay_bytes_and_grpc_routes_go_to_hyper() {
        let plain = taken(
            b"POST /plain HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .expect("the lane takes it");
        assert!(!plain.route.keyed());
        assert!(matches!(plain.onward, Onward::Upstream(head) if !head.is_empty()));
        let grpc = b"POST /pkg.Svc/Call HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: k\r\n\r\n";
        assert!(taken(grpc, false).is_none());
        // A keyed request whose body is still on its way: hyper's pipeline judges its head
        // while the body comes.
        let partial = b"POST /orders/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 9\r\n\r\nabc";
        assert!(taken(partial, false).is_none());
    }
}
