//! The one pooled upstream client, and the header rules of a proxy hop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use crate::config::{ServerConfig, UpstreamHttp2, UpstreamTarget};
use crate::runtime::{PerRuntime, Timers};
use crate::{Body, BoxError};

mod clients;

use self::clients::{h2c_client, plain_client, tls_client, tls_connector};

/// An upstream answer's body, streamed as it arrives; its connection goes back to its
/// client's pool once the body has been read to its end.
pub type UpstreamBody = Incoming;

/// How long an unused upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// At most this many unused upstream connections are kept: as many as nginx's
/// `keepalive 1024`. With 256, a thousand concurrent requests closed and reopened an
/// upstream connection for one request in twenty (the upstream's `accept` and `close`
/// paid per request, and the gateway's connect).
const MAX_IDLE: usize = 1024;

/// Why an upstream call got no response head, and so whether it may have executed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamFailure {
    /// No connection could be made, or a new one closed before a byte of the request was
    /// written: the upstream never saw the request.
    #[error("could not reach the upstream")]
    Connect(#[source] BoxError),
    /// No response head within `server.upstream_timeout`: the upstream may have acted.
    #[error("the upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection broke after the request may have been sent, or the response broke
    /// off: the upstream may have acted.
    #[error("the upstream connection broke before a whole answer")]
    Broken(#[source] BoxError),
}

impl UpstreamFailure {
    /// Whether the upstream may have executed the request: only a failed connect is
    /// known not to have.
    pub fn may_have_executed(&self) -> bool {
        !matches!(self, Self::Connect(_))
    }

    /// The failure with its whole cause chain, for the log.
    pub fn chain(&self) -> String {
        error_chain(self)
    }
}

/// The upstream: target URL and hyper-util's pooled clients, built once at start-up.
///
/// An `http` upstream gets kept-alive HTTP/1.1 connections from hyper-util's pooled
/// client, one client per connection worker (see [`PerRuntime`]). An `https` upstream is
/// reached through rustls: its certificate is checked against the platform's roots plus
/// `server.upstream_ca_file`, for the host named in the URL (SNI and `Host` both come from
/// it); ALPN offers `h2` and `http/1.1`, so an upstream that speaks HTTP/2 gets one
/// multiplexed connection per connection worker, otherwise HTTP/1.1 connections are pooled
/// per worker.
///
/// A plain-`http` upstream also gets HTTP/2 with prior knowledge (h2c) for the calls
/// `server.upstream_http2` names (gRPC calls by default): one multiplexed connection per
/// connection worker, beside the HTTP/1.1 client. Which one a call takes is its version
/// after [`Upstream::prepare`].
#[derive(Clone)]
pub struct Upstream {
    transport: Transport,
    /// `http` upstream: the h2c client, unless `server.upstream_http2 = "off"`.
    h2c: Option<H2c>,
    target: UpstreamTarget,
    /// `server.upstream_timeout`: from a call's start to its response head.
    timeout: Duration,
    /// The calls' deadlines, on timers kept for the next call.
    timers: Arc<Timers>,
    /// `server.underscores_in_headers`: request fields named with `_` go upstream.
    underscores: bool,
}

/// The h2c clients (one per runtime) and which calls take them.
#[derive(Clone)]
struct H2c {
    clients: Arc<PerRuntime<Client<HttpConnector, Body>>>,
    every_call: bool,
}

/// One client per runtime (see [`PerRuntime`]).
#[derive(Clone)]
enum Transport {
    Plain(Arc<PerRuntime<Client<HttpConnector, Body>>>),
    Tls(Arc<PerRuntime<Client<HttpsConnector<HttpConnector>, Body>>>),
}

/// The client's IP address as the upstream is told it (`X-Forwarded-For`), rendered once
/// per connection rather than per request.
pub fn client_ip(remote: SocketAddr) -> HeaderValue {
    HeaderValue::try_from(remote.ip().to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

/// Whether a request may be sent again after its connection broke: a safe method (RFC 9110
/// §9.2.1) with no body.
fn resendable(req: &Request<Body>) -> bool {
    use hyper::body::Body as _;
    matches!(
        *req.method(),
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS | http::Method::TRACE
    ) && req.body().size_hint().exact() == Some(0)
}

/// Whether the client's `TE` lists `trailers`.
fn accepts_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("trailers")
        })
}

impl Upstream {
    /// Builds the pooled client. The connect timeout never exceeds the upstream timeout,
    /// so "could not connect" (nothing sent, the claim is released) is told apart from
    /// "no answer" (outcome unknown, the claim is kept).
    pub fn new(cfg: &ServerConfig) -> Self {
        let connect_timeout = cfg.connect_timeout.min(cfg.upstream_timeout);
        let transport = if cfg.upstream.scheme == http::uri::Scheme::HTTPS {
            let connector = tls_connector(cfg, connect_timeout);
            Transport::Tls(Arc::new(PerRuntime::lazy(move || {
                tls_client(connector.clone())
            })))
        } else {
            Transport::Plain(Arc::new(PerRuntime::lazy(move || {
                plain_client(connect_timeout)
            })))
        };
        let plain = cfg.upstream.scheme != http::uri::Scheme::HTTPS;
        let h2c = match cfg.upstream_http2 {
            UpstreamHttp2::Off => None,
            _ if !plain => None,
            mode => Some(H2c {
                clients: Arc::new(PerRuntime::lazy(move || h2c_client(connect_timeout))),
                every_call: mode == UpstreamHttp2::PriorKnowledge,
            }),
        };
        Self {
            transport,
            h2c,
            target: cfg.upstream.clone(),
            timeout: cfg.upstream_timeout,
            timers: Arc::new(Timers::new()),
            underscores: cfg.underscores_in_headers,
        }
    }

    /// A call starting now must have its response head by then (`server.upstream_timeout`).
    pub fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.timeout
    }

    /// Rewrites a client request for the upstream: path and query under the base path,
    /// HTTP/1.1 (HTTP/2 when it goes over h2c, with `te: trailers` for a gRPC call),
    /// hop-by-hop headers stripped, `X-Forwarded-*` set. A gRPC call keeps its caller's
    /// `grpc-timeout`; a winner's is then bounded by the gateway ([`own_grpc_deadline`]).
    pub fn prepare(&self, mut req: Request<Body>, client_ip: &HeaderValue) -> Request<Body> {
        let grpc = crate::protocol::grpc::is_call(req.version(), req.headers());
        let trailers = grpc || accepts_trailers(req.headers());
        let h2 = self.h2c.as_ref().is_some_and(|h2c| h2c.every_call || grpc);
        let original_host = req.headers().get(header::HOST).cloned().or_else(|| {
            req.uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        // Origin form under the base path; the client is given the absolute form in
        // `send`. The parts are valid on their own (a path hyper accepted under a
        // validated base); should the join still fail, the client's URI stays and the send
        // fails cleanly. Already origin form with no base path to add: kept as it is.
        let origin_form = req.uri().scheme().is_none() && req.uri().path_and_query().is_some();
        if !(origin_form && self.target.base_path.is_empty()) {
            let path_and_query = req
                .uri()
                .path_and_query()
                .map(PathAndQuery::as_str)
                .unwrap_or("/");
            let pq = format!("{}{}", self.target.base_path, path_and_query);
            if let Ok(uri) = Uri::try_from(pq) {
                *req.uri_mut() = uri;
            }
        }
        *req.version_mut() = if h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let headers = req.headers_mut();
        crate::protocol::hop_by_hop::request_head(headers, self.underscores);
        if trailers {
            // The client takes trailers, so the gateway does: the one `TE` HTTP/2 allows,
            // which gRPC servers look for and without which an HTTP/1.1 server sends none.
            // The hop-by-hop rules stripped the client's.
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
            if !h2 {
                headers.insert(header::CONNECTION, HeaderValue::from_static("te"));
            }
        }
        headers.remove(header::HOST);
        // The fence and the scope are the gateway's word to the upstream; a client must not
        // forge them. A winner sets its own after `prepare`.
        headers.remove(&crate::protocol::headers::IDEMPOTENCY_FENCE);
        headers.remove(&crate::protocol::headers::IDEMPOTENCY_SCOPE);
        let xff = &crate::protocol::headers::X_FORWARDED_FOR;
        // Every prior hop, from every X-Forwarded-For line, then the client.
        let mut prior = headers.get_all(xff).iter().peekable();
        if prior.peek().is_none() {
            headers.insert(xff.clone(), client_ip.clone());
        } else {
            let mut forwarded_for = String::new();
            for hop in prior.filter_map(|v| v.to_str().ok()) {
                forwarded_for.push_str(hop);
                forwarded_for.push_str(", ");
            }
            forwarded_for.push_str(client_ip.to_str().unwrap_or_default());
            if let Ok(v) = HeaderValue::from_str(&forwarded_for) {
                headers.insert(xff.clone(), v);
            }
        }
        headers
            .entry(crate::protocol::headers::X_FORWARDED_PROTO.clone())
            .or_insert(HeaderValue::from_static("http"));
        if let Some(host) = original_host {
            headers
                .entry(crate::protocol::headers::X_FORWARDED_HOST.clone())
                .or_insert(host);
        }
        req
    }

    /// The one upstream call: sends a prepared request and returns the response head
    /// (without its hop-by-hop fields) with a streaming body, or why there is none, by
    /// `deadline` (`server.upstream_timeout` from the call's start; the body is bounded by
    /// its reader). It runs in `span`: wrapped in it by the caller, this future (2.3 KiB)
    /// was copied whole into the wrapper and again into the caller's state.
    pub async fn call(
        &self,
        req: Request<Body>,
        deadline: tokio::time::Instant,
        span: tracing::Span,
    ) -> Result<Response<UpstreamBody>, UpstreamFailure> {
        let sending = tracing::Instrument::instrument(self.send(req), span);
        self.within(deadline, sending).await
    }

    async fn send(&self, req: Request<Body>) -> Result<Response<UpstreamBody>, UpstreamFailure> {
        // A request safe to send twice (a safe method, no body) is sent once more when its
        // connection broke before any answer: an upstream may close a kept-alive
        // connection just as the pool lends it, the race every pooled proxy meets (nginx's
        // `proxy_next_upstream` sends such requests again too). Nothing else is: it may
        // have executed.
        let again = resendable(&req).then(|| {
            let mut copy = Request::new(crate::full(bytes::Bytes::new()));
            *copy.method_mut() = req.method().clone();
            *copy.uri_mut() = req.uri().clone();
            *copy.version_mut() = req.version();
            *copy.headers_mut() = req.headers().clone();
            copy
        });
        match (self.send_once(req).await, again) {
            (Err(UpstreamFailure::Broken(e)), Some(req)) => {
                tracing::debug!(error = %error_chain(&*e), "the upstream connection broke before an answer to a safe request: sending it once more");
                self.send_once(req).await
            }
            (sent, _) => sent,
        }
    }

    async fn send_once(
        &self,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamFailure> {
        let req = self.absolute(req);
        let sent = match (&self.h2c, req.version(), &self.transport) {
            (Some(h2c), Version::HTTP_2, _) => h2c.clients.here().request(req).await,
            (_, _, Transport::Plain(clients)) => clients.here().request(req).await,
            (_, _, Transport::Tls(clients)) => clients.here().request(req).await,
        };
        match sent {
            Ok(resp) => from_hyper(resp),
            // Only a failed connect is known to have sent nothing: hyper-util sends a
            // request a reused connection refused before writing it again on another.
            Err(e) if e.is_connect() => Err(UpstreamFailure::Connect(e.into())),
            Err(e) => Err(UpstreamFailure::Broken(e.into())),
        }
    }
}

impl Upstream {
    /// `sending`, or a timeout (`server.upstream_timeout`) once `deadline` has passed.
    async fn within<T>(
        &self,
        deadline: tokio::time::Instant,
        sending: impl std::future::Future<Output = Result<T, UpstreamFailure>>,
    ) -> Result<T, UpstreamFailure> {
        let sent = self.timers.within(deadline, sending).await;
        sent.unwrap_or_else(|| Err(UpstreamFailure::Timeout(self.timeout)))
    }
}

/// Sets a winner's gRPC call's `grpc-timeout` to what is left until `deadline` (its
/// `server.upstream_timeout`), in place of its caller's. The winner's call outlives its
/// caller (see `http::inline`) so that its answer is stored and a retry replays it; under
/// the caller's deadline the upstream would give up with it, answering
/// `DEADLINE_EXCEEDED`, which leaves the outcome unknown though the handler may have run
/// to its end, and a retry would take the key over and run the call again.
pub fn own_grpc_deadline(headers: &mut HeaderMap, deadline: tokio::time::Instant) {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    headers.insert(
        crate::protocol::grpc::timeout::GRPC_TIMEOUT,
        crate::protocol::grpc::timeout::encode(left),
    );
}

/// A response from hyper's client, made fit to cross ([`crate::protocol::hop_by_hop::response_head`]):
/// hyper keeps a `Content-Length` beside the `Transfer-Encoding` it decoded, and a list of
/// lengths as it came. Two different lengths are no answer.
fn from_hyper(resp: Response<Incoming>) -> Result<Response<UpstreamBody>, UpstreamFailure> {
    // The gateway never asks for an upgrade (`Upgrade` is hop-by-hop): a `101` answers no
    // request of its, and what follows it on the connection is no longer HTTP. hyper's
    // client hands it over as a response (other `1xx` heads it skips).
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(UpstreamFailure::Broken(
            "the upstream switched protocols unasked (101)".into(),
        ));
    }
    let (mut head, body) = resp.into_parts();
    crate::protocol::hop_by_hop::response_head(&mut head.headers)
        .map_err(|e| UpstreamFailure::Broken(e.into()))?;
    Ok(Response::from_parts(head, body))
}

impl Upstream {
    /// `req` with the upstream's scheme and authority on its URI, as hyper's client wants.
    fn absolute(&self, mut req: Request<Body>) -> Request<Body> {
        let mut parts = req.uri().clone().into_parts();
        parts.scheme = Some(self.target.scheme.clone());
        parts.authority = Some(self.target.authority.clone());
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
        req
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(extra: &str) -> Upstream {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n{extra}"
        );
        Upstream::new(&crate::config::Config::from_toml(&toml).unwrap().server)
    }

    fn request(version: Version, headers: &[(&'static str, &'static str)]) -> Request<Body> {
        let mut req = Request::new(crate::full(""));
        *req.version_mut() = version;
        *req.uri_mut() = Uri::from_static("/pkg.Svc/Method");
        for (n, v) in headers {
            req.headers_mut().append(*n, HeaderValue::from_static(v));
        }
        req
    }

    #[test]
    fn x_forwarded_for_names_every_prior_hop_then_the_client() {
        let up = upstream("");
        let v4 = &client_ip("10.0.0.1:5000".parse().unwrap());
        let alone = up.prepare(request(Version::HTTP_11, &[]), v4);
        assert_eq!(alone.headers()["x-forwarded-for"], "10.0.0.1");
        let hops = [
            ("x-forwarded-for", "1.1.1.1, 2.2.2.2"),
            ("x-forwarded-for", "3.3.3.3"),
        ];
        let behind = up.prepare(request(Version::HTTP_11, &hops), v4);
        let all: Vec<_> = behind.headers().get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.1"]);
        let v6 = &client_ip("[2001:db8::7]:443".parse().unwrap());
        let alone = up.prepare(request(Version::HTTP_11, &[]), v6);
        assert_eq!(alone.headers()["x-forwarded-for"], "2001:db8::7");
    }

    #[test]
    fn grpc_calls_go_over_h2c_with_te_trailers_and_the_rest_over_http1() {
        let remote = &client_ip("10.0.0.1:5000".parse().unwrap());
        let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
        let up = upstream("");
        let call = up.prepare(request(Version::HTTP_2, &grpc), remote);
        assert_eq!(call.version(), Version::HTTP_2);
        assert_eq!(call.headers()[header::TE], "trailers");
        assert!(!call.headers().contains_key(header::CONNECTION));
        // gRPC's content type over HTTP/1.1 is no gRPC call.
        let http1 = up.prepare(request(Version::HTTP_11, &grpc[..1]), remote);
        assert_eq!(http1.version(), Version::HTTP_11);
        assert!(!http1.headers().contains_key(header::TE));
        // A client taking trailers over HTTP/1.1: asked for them, hop by hop.
        let takes = up.prepare(
            request(Version::HTTP_11, &[("te", "gzip, trailers")]),
            remote,
        );
        assert_eq!(takes.version(), Version::HTTP_11);
        assert_eq!(takes.headers()[header::TE], "trailers");
        assert_eq!(takes.headers()[header::CONNECTION], "te");
        let off = upstream("upstream_http2 = \"off\"\n");
        let call = off.prepare(request(Version::HTTP_2, &grpc), remote);
        assert_eq!(call.version(), Version::HTTP_11);
        let every = upstream("upstream_http2 = \"prior-knowledge\"\n");
        let plain = every.prepare(request(Version::HTTP_11, &[]), remote);
        assert_eq!(plain.version(), Version::HTTP_2);
    }

    /// A passthrough gRPC call keeps its caller's deadline; a winner's gets what is left
    /// of `server.upstream_timeout`, longer or shorter than its caller's, or none.
    #[tokio::test(start_paused = true)]
    async fn a_winner_s_grpc_timeout_is_what_is_left_of_upstream_timeout_not_its_caller_s() {
        let remote = &client_ip("10.0.0.1:5000".parse().unwrap());
        let up = upstream("upstream_timeout = \"20s\"\n");
        let short = [
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", "500m"),
        ];
        let passthrough = up.prepare(request(Version::HTTP_2, &short), remote);
        assert_eq!(passthrough.headers()["grpc-timeout"], "500m");
        let deadline = up.deadline();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let mut won = up.prepare(request(Version::HTTP_2, &short), remote);
        own_grpc_deadline(won.headers_mut(), deadline);
        let sent: Vec<_> = won.headers().get_all("grpc-timeout").iter().collect();
        assert_eq!(sent, ["18500000u"], "20 s less the 1.5 s gone, one value");
        // Longer than what is left, or no deadline at all: what is left still.
        for caller in [&[("grpc-timeout", "1H")][..], &[]] {
            let mut won = up.prepare(request(Version::HTTP_2, caller), remote);
            own_grpc_deadline(won.headers_mut(), deadline);
            assert_eq!(won.headers()["grpc-timeout"], "18500000u", "{caller:?}");
        }
        // Past the deadline: none left (the gateway times the call out itself).
        tokio::time::advance(Duration::from_secs(30)).await;
        let mut late = up.prepare(request(Version::HTTP_2, &short), remote);
        own_grpc_deadline(late.headers_mut(), deadline);
        assert_eq!(late.headers()["grpc-timeout"], "0n");
    }
}
