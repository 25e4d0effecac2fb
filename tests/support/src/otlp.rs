//! An OTLP/HTTP receiver: what a collector would get from the gateway, decoded. It takes
//! `POST /v1/traces` (protobuf), keeps every span and answers the empty success body.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::net::TcpListener;

/// One span as the receiver decoded it; ids in lowercase hex, as in `traceparent`.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The span's name.
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, empty for a root.
    pub parent_span_id: String,
    /// `SPAN_KIND_SERVER`, `SPAN_KIND_CLIENT`, `SPAN_KIND_INTERNAL`, ...
    pub kind: String,
    /// Every attribute, its value as text.
    pub attributes: BTreeMap<String, String>,
    /// Every attribute's type as OTLP sent it: `string`, `int`, `double`, `bool`, `array`,
    /// `kvlist`, `bytes`, or `empty`.
    pub types: BTreeMap<String, &'static str>,
    /// The resource's `service.name`.
    pub service: String,
}

impl ReceivedSpan {
    /// An attribute's value as text.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    posts: usize,
    /// Requests that were not `POST /v1/traces` with a protobuf body that decodes.
    refused: Vec<String>,
}

/// The receiver, on a loopback port 0 until the test's runtime ends.
#[derive(Clone)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
}

impl OtlpReceiver {
    /// Starts serving.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Received::default()));
        let state = received.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| receive(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, received }
    }

    /// The collector's base URL, as `telemetry.otlp_endpoint` takes it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().spans.clone()
    }

    /// How many export requests arrived (decoded or not).
    pub fn posts(&self) -> usize {
        self.received.lock().unwrap().posts
    }

    /// The requests that were refused, each as "METHOD path: why".
    pub fn refused(&self) -> Vec<String> {
        self.received.lock().unwrap().refused.clone()
    }
}

async fn receive(
    state: Arc<Mutex<Received>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let decoded = match (
        parts.method.as_str(),
        parts.uri.path(),
        content_type.as_str(),
    ) {
        ("POST", "/v1/traces", "application/x-protobuf") => {
            ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string())
        }
        _ => Err(format!("unexpected content type {content_type:?}")),
    };
    let mut received = state.lock().unwrap();
    received.posts += 1;
    let export = match decoded {
        Ok(export) => export,
        Err(why) => {
            let what = format!("{} {}: {why}", parts.method, parts.uri.path());
            received.refused.push(what);
            let mut resp = Response::new(Full::new(Bytes::new()));
            *resp.status_mut() = StatusCode::BAD_REQUEST;
            return Ok(resp);
        }
    };
    received.spans.extend(spans_of(export));
    let body = ExportTraceServiceResponse::default().encode_to_vec();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(resp)
}

fn spans_of(export: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in export.resource_spans {
        let resource = resource_spans.resource.unwrap_or_default();
        let service = text_attributes(&resource.attributes)
            .remove("service.name")
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let kind = span.kind().as_str_name().to_owned();
                out.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex::encode(span.trace_id),
                    span_id: hex::encode(span.span_id),
                    parent_span_id: hex::encode(span.parent_span_id),
                    kind,
                    attributes: text_attributes(&span.attributes),
                    types: attribute_types(&span.attributes),
                    service: service.clone(),
                });
            }
        }
    }
    out
}

fn text_attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn attribute_types(attributes: &[KeyValue]) -> BTreeMap<String, &'static str> {
    attributes
        .iter()
        .map(|kv| {
            let kind = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(_)) => "string",
                Some(Value::IntValue(_)) => "int",
                Some(Value::BoolValue(_)) => "bool",
                Some(Value::DoubleValue(_)) => "double",
                Some(Value::ArrayValue(_)) => "array",
                Some(Value::KvlistValue(_)) => "kvlist",
                Some(Value::BytesValue(_)) => "bytes",
                Some(Value::StringValueStrindex(_)) => "string",
                None => "empty",
            };
            (kv.key.clone(), kind)
        })
        .collect()
}
