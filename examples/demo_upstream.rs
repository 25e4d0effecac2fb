//! A tiny upstream API for trying the gateway: `POST` anything and it "creates an order",
//! numbering each one, so a duplicate write is easy to see. `GET /orders` tells how many
//! orders were created. Not part of the gateway.
//!
//! `cargo run --example demo_upstream -- 127.0.0.1:9000`

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9000".into());
    let listener = TcpListener::bind(&addr).await?;
    eprintln!("demo upstream: creating orders on http://{addr}");
    let orders = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let orders = orders.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| answer(orders.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn answer(
    orders: Arc<AtomicU64>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let (status, text) = if parts.method == Method::GET {
        (
            StatusCode::OK,
            format!("{{\"orders_created\":{}}}\n", orders.load(Ordering::SeqCst)),
        )
    } else {
        let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
        eprintln!(
            "demo upstream: created order {n} for {} {} (fence {})",
            parts.method,
            parts.uri,
            parts
                .headers
                .get("idempotency-fence")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
        );
        (
            StatusCode::CREATED,
            format!(
                "{{\"order\":{n},\"request\":{}}}\n",
                serde_json::to_string(&String::from_utf8_lossy(&body)).unwrap_or_default()
            ),
        )
    };
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}
