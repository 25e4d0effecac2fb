//! The upstream: a real HTTP server that counts side effects.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request target as received (path and query).
    pub path: String,
    /// The request URI as received, whole: an absolute-form target keeps its scheme and
    /// authority here.
    pub uri: String,
    /// The request headers as received.
    pub headers: HeaderMap,
    /// The request body as received.
    pub body: Bytes,
    /// The HTTP version it came in (HTTP/2 when a TLS upstream's ALPN chose h2).
    pub version: http::Version,
    /// The host the request named: `Host`, or the URI's authority (HTTP/2).
    pub host: Option<String>,
}

impl Seen {
    /// The `Idempotency-Fence` the gateway sent, if any.
    pub fn fence(&self) -> Option<u64> {
        self.headers
            .get("idempotency-fence")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    }
}

#[derive(Default)]
struct UpstreamState {
    effects: AtomicU64,
    seen: Mutex<Vec<Seen>>,
}

/// A counting upstream. Every request it receives is one side effect. Test-only request
/// headers steer it: `x-test-status` (answer status), `x-test-delay-ms` (answer late),
/// `x-test-body-bytes` (answer a body of that size), `x-test-drop` (close without answering),
/// `x-test-respond-header: name=value` (add that header to the answer; may repeat),
/// `x-test-respond-trailer: name=value` (end the body with that trailer; may repeat).
#[derive(Clone)]
pub struct Upstream {
    addr: SocketAddr,
    state: Arc<UpstreamState>,
    tls: bool,
}

impl Upstream {
    /// Serves on a loopback port 0 until the test's runtime ends.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState::default());
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(st.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            tls: false,
        }
    }

    /// Serves HTTPS with `cert` (ALPN `h2` and `http/1.1`) on a loopback port 0.
    pub async fn start_tls(cert: &crate::CertFiles) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let chain = CertificateDer::pem_file_iter(&cert.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState::default());
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (st, acceptor) = (st.clone(), acceptor.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake here.
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let svc = service_fn(move |req| answer(st.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
                });
            }
        });
        Self {
            addr,
            state,
            tls: true,
        }
    }

    /// `http://127.0.0.1:PORT`, or `https://` for [`Upstream::start_tls`].
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Side effects so far.
    pub fn effects(&self) -> u64 {
        self.state.effects.load(Ordering::SeqCst)
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// How many times each `Idempotency-Key` was executed (`<none>` for requests without).
    pub fn effects_per_key(&self) -> std::collections::HashMap<String, usize> {
        let mut n = std::collections::HashMap::new();
        for seen in self.seen() {
            let key = seen
                .headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("<none>")
                .to_owned();
            *n.entry(key).or_default() += 1;
        }
        n
    }

    /// The fences the upstream received, in order; each must be present and above the
    /// one before.
    pub fn increasing_fences(&self) -> Vec<u64> {
        let fences: Vec<u64> = self
            .seen()
            .iter()
            .map(|s| {
                s.fence()
                    .expect("a deduped request without Idempotency-Fence")
            })
            .collect();
        assert!(
            fences.windows(2).all(|w| w[1] > w[0]),
            "fences not increasing: {fences:?}"
        );
        fences
    }

    /// Waits until the upstream has received `n` requests.
    pub async fn wait_for_effects(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.effects() < n {
            assert!(Instant::now() < deadline, "upstream never saw {n} requests");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn header_num(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

async fn answer(
    st: Arc<UpstreamState>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let status = header_num(&req, "x-test-status").unwrap_or(201) as u16;
    let delay = header_num(&req, "x-test-delay-ms").unwrap_or(0);
    let body_bytes = header_num(&req, "x-test-body-bytes");
    let drop_it = req.headers().contains_key("x-test-drop");
    let extra: Vec<(String, String)> = req
        .headers()
        .get_all("x-test-respond-header")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    let mut trailers = http::HeaderMap::new();
    for v in req.headers().get_all("x-test-respond-trailer") {
        if let Some((n, v)) = v.to_str().ok().and_then(|v| v.split_once('=')) {
            trailers.append(
                http::header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
    }
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let n = st.effects.fetch_add(1, Ordering::SeqCst) + 1;
    let host = parts
        .headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()));
    st.seen.lock().unwrap().push(Seen {
        version: parts.version,
        uri: parts.uri.to_string(),
        host,
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.to_string(), |pq| pq.to_string()),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if drop_it {
        // Never answer: the connection task ends when the client gives up.
        std::future::pending::<()>().await;
    }
    let payload = match body_bytes {
        Some(len) => Bytes::from(vec![b'x'; len as usize]),
        None => Bytes::from(format!(
            "{{\"effect\":{n},\"path\":\"{}\",\"fence\":{}}}",
            parts.uri.path(),
            parts
                .headers
                .get("idempotency-fence")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("null")
        )),
    };
    let announced: Vec<String> = trailers.keys().map(|n| n.to_string()).collect();
    let body = match trailers.is_empty() {
        true => Full::new(payload).boxed(),
        false => Chunked {
            data: Some(payload),
            trailers: Some(trailers),
        }
        .boxed(),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    resp.headers_mut()
        .insert("x-effect", n.to_string().parse().unwrap());
    resp.headers_mut()
        .insert("set-cookie", "session=first-client-only".parse().unwrap());
    if !announced.is_empty() {
        // hyper sends only the trailer fields the head names.
        resp.headers_mut()
            .insert("trailer", announced.join(", ").parse().unwrap());
    }
    for (name, value) in extra {
        resp.headers_mut().append(
            http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    Ok(resp)
}

/// A body of unstated length ending in trailers: HTTP/1.1 sends it chunked, the one framing
/// that carries trailers.
struct Chunked {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl hyper::body::Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        let frame = match self.data.take() {
            Some(data) => Some(hyper::body::Frame::data(data)),
            None => self.trailers.take().map(hyper::body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }
}
