//! The HTTP client the tests talk to gateways with.

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A whole response, body collected.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
    /// The trailer section, when the body ended with one.
    pub trailers: Option<HeaderMap>,
}

impl Reply {
    /// Whether the gateway marked this a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The problem+json `type`; panics unless the reply is a problem.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "not a problem: {self:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        v["type"].as_str().unwrap().to_owned()
    }

    /// The body as text, for assertion messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A pooled HTTP client; clones share the pool.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(64)
                .build_http(),
        }
    }
}

impl Http {
    /// A client speaking HTTP/1.1.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client that drops a pooled connection idle for `idle`: shorter than the gateway's
    /// `header_read_timeout` (which also bounds the wait for a keep-alive connection's next
    /// request), so the client never sends on a connection the gateway is closing. Any
    /// keep-alive client has that race with a server's idle close; a POST is not retried.
    pub fn with_idle_timeout(idle: std::time::Duration) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(64)
                .pool_idle_timeout(idle)
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build_http(),
        }
    }

    /// A client speaking HTTP/2 with prior knowledge (h2c).
    pub fn h2c() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
        }
    }

    /// Sends one request; a transport error comes back as its message.
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, String> {
        self.send_bytes(method, url, headers, Bytes::from(body.to_owned()))
            .await
    }

    /// Sends one request with a body of any bytes (a compressed one, say).
    pub async fn send_bytes(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Reply, String> {
        let mut b = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(body)).unwrap();
        let resp = self.client.request(req).await.map_err(|e| chain(&e))?;
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.map_err(|e| chain(&e))?;
        let trailers = collected.trailers().cloned();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body: collected.to_bytes(),
            trailers,
        })
    }

    /// A POST that must get an answer.
    pub async fn post(&self, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        self.send("POST", url, headers, body).await.unwrap()
    }

    /// A GET that must get an answer.
    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", url, headers, "").await.unwrap()
    }
}

/// An error with its causes, so a failed request says why (a reset, a closed connection).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
