//! The drill's stand-in for the user's upstream: an HTTP server on a loopback port that
//! counts every request it receives per idempotency key (the side effect a duplicate would
//! repeat), notes its fence, and can hold the first call for a key to keep it in flight.
//! A gRPC call (h2c, `application/grpc`) is answered in gRPC.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::grpc::{self, AnswerBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::protocol::headers::{IDEMPOTENCY_FENCE, IDEMPOTENCY_KEY};

/// One request the upstream received: one side effect.
#[derive(Debug, Clone, Copy)]
pub struct Effect {
    /// Its fencing token.
    pub fence: Option<u64>,
    /// When it arrived.
    pub at: Instant,
}

#[derive(Default)]
struct State {
    effects: HashMap<String, Vec<Effect>>,
    hold_first: HashMap<String, Duration>,
}

/// The counting upstream; stops accepting when dropped.
pub struct CountingUpstream {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: tokio::task::JoinHandle<()>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A panic elsewhere cannot leave the counts half-written: each update is one push.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl CountingUpstream {
    /// Serves on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                let svc = service_fn(move |req| handle(st.clone(), req));
                tokio::spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds the first call for `key` for `hold` before answering (the effect counts on
    /// arrival, as a write that committed before a slow answer).
    pub fn hold_first(&self, key: &str, hold: Duration) {
        lock(&self.state).hold_first.insert(key.to_owned(), hold);
    }

    /// The calls received for `key`, in order.
    pub fn effects(&self, key: &str) -> Vec<Effect> {
        lock(&self.state)
            .effects
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (up to `within`) until `key` has had at least `n` calls.
    pub async fn wait_for(&self, key: &str, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.effects(key).len() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<AnswerBody>, Infallible> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let key = header(&IDEMPOTENCY_KEY).unwrap_or_default();
    let is_grpc = crate::protocol::grpc::is_call(req.version(), req.headers());
    if crate::protocol::grpc::is_grpc_content(req.headers()) && !is_grpc {
        // gRPC has no HTTP/1.1 form (`server.upstream_http2 = "off"`): a gRPC server would
        // not execute the call.
        let mut resp = Response::new(Full::new(Bytes::new()).boxed());
        *resp.status_mut() = StatusCode::HTTP_VERSION_NOT_SUPPORTED;
        return Ok(resp);
    }
    let fence = header(&IDEMPOTENCY_FENCE).and_then(|f| f.parse().ok());
    let (n, hold) = {
        let mut st = lock(&state);
        let list = st.effects.entry(key.clone()).or_default();
        list.push(Effect {
            fence,
            at: Instant::now(),
        });
        let n = list.len();
        let hold = if n == 1 {
            st.hold_first.get(&key).copied()
        } else {
            None
        };
        (n, hold)
    };
    let _ = req.into_body().collect().await;
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    let body = serde_json::json!({ "effect": n, "key": key, "fence": fence });
    if is_grpc {
        return Ok(grpc::answer(body.to_string().as_bytes()));
    }
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *resp.status_mut() = StatusCode::CREATED;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
