//! The drill's HTTP client: sends a [`DrillRequest`] to a gateway and keeps the whole
//! answer, so a replay can be compared with the original byte for byte.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::grpc;
use super::request::DrillRequest;
use crate::edge::problem::GatewayError;
use crate::protocol::headers::REPLAYED;
use crate::protocol::route::Dialect;

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
    /// Trailers (a gRPC answer's `grpc-status`).
    pub trailers: HeaderMap,
    /// When it was sent.
    pub sent: Instant,
    /// How long it took.
    pub took: Duration,
}

impl Reply {
    /// Marked `Idempotent-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.headers.get(&REPLAYED).is_some_and(|v| v == "true")
    }

    /// A gRPC answer (`content-type: application/grpc*`): its verdict is its `grpc-status`.
    pub fn is_grpc(&self) -> bool {
        crate::protocol::grpc::is_grpc_content(&self.headers)
    }

    /// The `grpc-status` (head or trailers).
    pub fn grpc_status(&self) -> Option<u16> {
        grpc::status_of(&self.headers, &self.trailers)
    }

    /// The problem+json `type`, when the answer is a problem.
    pub fn problem_type(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        v.get("type")?.as_str().map(str::to_owned)
    }

    /// The gateway's problem name (`request-in-flight`): from the problem `type`, or a
    /// gRPC refusal's `grpc-message`.
    pub fn problem_name(&self) -> Option<String> {
        if self.is_grpc() {
            return grpc::problem_name(&self.headers);
        }
        let t = self.problem_type()?;
        Some(t.rsplit([':', '/']).next().unwrap_or(&t).to_owned())
    }

    /// Answered with the gateway's refusal `err`: its status in `dialect`, or on a gRPC
    /// answer its gRPC code.
    pub fn refused_as(&self, err: &GatewayError, dialect: &Dialect) -> bool {
        if self.is_grpc() {
            grpc::is_refusal(self.grpc_status(), err)
        } else {
            self.status == err.status_in(dialect)
        }
    }

    /// A success: below 400, or `grpc-status: 0`.
    pub fn succeeded(&self) -> bool {
        if self.is_grpc() {
            self.grpc_status() == Some(crate::protocol::grpc::status::code::OK)
        } else {
            self.status.as_u16() < 400
        }
    }

    /// Not a failure of the gateway or upstream: below 500, or a gRPC status that is not
    /// one of their failures.
    pub fn not_failed(&self) -> bool {
        if self.is_grpc() {
            self.status == StatusCode::OK && !grpc::failed(self.grpc_status())
        } else {
            self.status.as_u16() < 500
        }
    }

    /// The status as the report shows it: the HTTP status, or on a gRPC answer its code.
    pub fn shown_status(&self) -> serde_json::Value {
        if self.is_grpc() {
            grpc::shown(self.grpc_status()).into()
        } else {
            self.status.as_u16().into()
        }
    }

    /// The status as a note names it.
    pub fn status_text(&self) -> String {
        if self.is_grpc() {
            grpc::shown(self.grpc_status())
        } else {
            self.status.to_string()
        }
    }

    /// Same status, headers (apart from the replay mark), body and trailers as `other`.
    pub fn same_answer(&self, other: &Reply) -> bool {
        self.status == other.status
            && self.body == other.body
            && self.trailers == other.trailers
            && self.differing_headers(other).is_empty()
    }

    /// The names of headers whose values differ from `other`'s, apart from the replay mark,
    /// `Set-Cookie` (a session cookie belongs to the first client: never replayed) and
    /// `Date`: where the upstream sent none (a gRPC server, often), the gateway's server
    /// dates each answer as it sends it, so two answers a second apart differ in it alone.
    pub fn differing_headers(&self, other: &Reply) -> Vec<String> {
        let mut names: Vec<String> = self
            .headers
            .keys()
            .chain(other.headers.keys())
            .filter(|n| {
                **n != REPLAYED && **n != http::header::SET_COOKIE && **n != http::header::DATE
            })
            .filter(|n| {
                let a: Vec<_> = self.headers.get_all(*n).iter().collect();
                let b: Vec<_> = other.headers.get_all(*n).iter().collect();
                a != b
            })
            .map(|n| n.as_str().to_owned())
            .collect();
        names.dedup();
        names
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The URL could not be built.
    #[error("invalid URL {0}")]
    Url(String),
    /// Connection refused, reset, closed.
    #[error("{0}")]
    Transport(String),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// A pooled plain-HTTP client, with an h2c one (prior knowledge) for gRPC calls.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    h2c: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl Http {
    /// A client giving up on an answer after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            h2c: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
            timeout,
        }
    }

    /// Sends `req` to `base` (`http://host:port`).
    pub async fn send(&self, base: &str, req: &DrillRequest) -> Result<Reply, SendError> {
        let url = format!("{base}{}", req.path_and_query());
        let mut builder = Request::builder().method(req.method.clone()).uri(&url);
        for (name, value) in &req.headers {
            builder = builder.header(name, value);
        }
        // gRPC has no HTTP/1.1 form: a gRPC call goes over h2c.
        let grpc = crate::protocol::grpc::is_grpc_content(&req.headers);
        if grpc {
            builder = builder.version(http::Version::HTTP_2);
        }
        let request = builder
            .body(Full::new(req.body.clone()))
            .map_err(|_| SendError::Url(url))?;
        self.call(request, grpc).await
    }

    /// A bodiless request (admin API); `token` as a bearer token.
    pub async fn admin(
        &self,
        method: Method,
        url: &str,
        token: Option<&str>,
    ) -> Result<Reply, SendError> {
        let mut builder = Request::builder().method(method).uri(url);
        if let Some(t) = token {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let request = builder
            .body(Full::new(Bytes::new()))
            .map_err(|_| SendError::Url(url.to_owned()))?;
        self.call(request, false).await
    }

    async fn call(&self, request: Request<Full<Bytes>>, h2c: bool) -> Result<Reply, SendError> {
        let sent = Instant::now();
        let client = if h2c { &self.h2c } else { &self.client };
        let exchange = async {
            let resp = client
                .request(request)
                .await
                .map_err(|e| SendError::Transport(format!("{e:?}")))?;
            let (parts, body) = resp.into_parts();
            let collected = body
                .collect()
                .await
                .map_err(|e| SendError::Transport(e.to_string()))?;
            let trailers = collected.trailers().cloned().unwrap_or_default();
            Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                body: collected.to_bytes(),
                trailers,
                sent,
                took: sent.elapsed(),
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SendError::Timeout(self.timeout))?
    }
}

/// What N copies of one request, sent at once, were answered.
pub struct Race {
    /// Every answer.
    pub replies: Vec<Reply>,
    /// Answered by the upstream (not replayed, below 400).
    pub executed: usize,
    /// Answered from the store.
    pub replayed: usize,
    /// Told the key was in flight (409 in problem+json, `ABORTED` in gRPC).
    pub conflicts: usize,
    /// Every replay is the executed answer, byte for byte.
    pub consistent: bool,
}

impl Race {
    /// Sends `n` copies of `req` to `base` at once; `dialect` is the route's, in which it
    /// answers a key in flight.
    pub async fn run(
        http: &Http,
        base: &str,
        req: &DrillRequest,
        n: usize,
        dialect: &Dialect,
    ) -> Result<Self, String> {
        let in_flight = GatewayError::Conflict {
            retry_after: Duration::ZERO,
        };
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (http, base, req) = (http.clone(), base.to_owned(), req.clone());
                tokio::spawn(async move { http.send(&base, &req).await })
            })
            .collect();
        let mut replies = Vec::new();
        for t in tasks {
            replies.push(
                t.await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?,
            );
        }
        let fresh: Vec<&Reply> = replies
            .iter()
            .filter(|r| !r.replayed() && r.succeeded())
            .collect();
        let replayed = replies.iter().filter(|r| r.replayed()).count();
        let conflicts = replies
            .iter()
            .filter(|r| r.refused_as(&in_flight, dialect))
            .count();
        let consistent = fresh.len() == 1
            && replies
                .iter()
                .filter(|r| r.replayed())
                .all(|r| r.same_answer(fresh[0]));
        Ok(Self {
            executed: fresh.len(),
            replayed,
            conflicts,
            consistent,
            replies,
        })
    }

    /// One executed, the rest replayed or told it was in flight, every replay the same.
    pub fn one_winner(&self) -> bool {
        self.executed == 1
            && self.consistent
            && 1 + self.replayed + self.conflicts == self.replies.len()
    }
}
