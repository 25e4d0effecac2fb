//! The upstream every scenario ends at: a plain HTTP/1.1 server that counts side effects
//! and keeps nothing else, so its own cost stays flat over hundreds of thousands of requests
//! (the integration tests' upstream records every request it sees).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A counting upstream on a loopback port, served until the runtime ends.
#[derive(Clone)]
pub struct Counting {
    pub addr: SocketAddr,
    effects: Arc<AtomicU64>,
}

impl Counting {
    pub async fn start() -> Self {
        // A deep accept queue: at 1,000 client connections nginx and the gateway open
        // upstream connections beyond the ones they keep idle, in bursts. With tokio's
        // default backlog (1024) the queue overflowed, SYNs were dropped, and the
        // retransmit after 1s stalled whole rounds (seen as `ListenOverflows` in `nstat`).
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener: TcpListener = socket.listen(4096).unwrap();
        let addr = listener.local_addr().unwrap();
        let effects = Arc::new(AtomicU64::new(0));
        let counter = effects.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let counter = counter.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(counter.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, effects }
    }

    /// Requests received so far: each one is a side effect.
    pub fn effects(&self) -> u64 {
        self.effects.load(Ordering::SeqCst)
    }
}

async fn answer(
    effects: Arc<AtomicU64>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // The effect happens once the whole request has arrived, as a real handler's would.
    let _ = req.into_body().collect().await;
    let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
    let mut resp = Response::new(Full::new(Bytes::from(format!("{{\"effect\":{n}}}"))));
    *resp.status_mut() = StatusCode::CREATED;
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}
