//! The admin API as `dedupe-gateway keys` calls it: one request on a plain-HTTP client,
//! the bearer token, and a problem+json answer turned into [`KeysError::Refused`].

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::KeysError;

/// How long a `keys` command waits for the admin API's whole answer.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A gateway's admin API.
pub struct Admin {
    base: String,
    token: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Admin {
    /// The admin API at `base` (`http://host:port`), with `token` as its bearer token.
    /// Call from within the Tokio runtime.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, KeysError> {
        if !base.starts_with("http://") {
            return Err(KeysError::Usage(format!(
                "--admin {base:?}: expected http://host:port (the admin listener speaks plain HTTP)"
            )));
        }
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            token,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// Sends `method` to `path_and_query` with an optional JSON body; the body of a 2xx
    /// answer, or the problem it answered.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        json: Option<Vec<u8>>,
    ) -> Result<Bytes, KeysError> {
        let url = format!("{}{path_and_query}", self.base);
        let unreachable = |reason: String| KeysError::Unreachable {
            url: url.clone(),
            reason,
        };
        let mut builder = Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if json.is_some() {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(json.unwrap_or_default())))
            .map_err(|e| KeysError::Usage(format!("--admin {url:?}: {e}")))?;
        let exchange = async {
            let resp = self.client.request(request).await.map_err(|e| {
                let cause =
                    std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
                unreachable(format!("{e}{cause}"))
            })?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, KeysError>((status, body))
        };
        let (status, body) = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| unreachable(format!("no answer within {TIMEOUT:?}")))??;
        if status.is_success() {
            Ok(body)
        } else {
            Err(refused(status, &body))
        }
    }
}

/// A problem+json answer (or any other) as a [`KeysError::Refused`].
fn refused(status: StatusCode, body: &[u8]) -> KeysError {
    let problem: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |k: &str| problem.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    KeysError::Refused {
        status: status.as_u16(),
        problem_type: text("type"),
        title: text("title")
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned()),
        detail: text("detail"),
    }
}
