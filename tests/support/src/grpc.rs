//! Real gRPC on both sides: a `grpcio` server that counts executions and a `grpcio` client
//! making one call as an application would (python/grpc_server.py, python/grpc_client.py,
//! run with the python `scripts/test` names in `DEDUPE_TEST_PYTHON`).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::stripe_client::PYTHON_VAR;

fn python() -> PathBuf {
    PathBuf::from(std::env::var_os(PYTHON_VAR).unwrap_or_else(|| {
        panic!(
            "{PYTHON_VAR} is not set: run the tests with scripts/test, which makes \
             target/pyenv with grpcio and exports {PYTHON_VAR} (or set it to a python that \
             has grpcio installed)"
        )
    }))
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(name)
}

/// The counting gRPC server, until dropped (its stdin closes and it stops).
pub struct GrpcServer {
    /// `127.0.0.1:port`.
    pub addr: String,
    _child: Child,
}

impl GrpcServer {
    /// Starts the server and waits until it listens.
    pub async fn start() -> Self {
        let mut child = Command::new(python())
            .arg(script("grpc_server.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the gRPC server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("the gRPC server's port");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("the gRPC server said {line:?}"));
        Self {
            addr: format!("127.0.0.1:{port}"),
            _child: child,
        }
    }

    /// `http://127.0.0.1:port`, the gateway's upstream.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How often each method executed, asked directly (not through a gateway).
    pub async fn executions(&self, method: &str) -> u64 {
        let seen = GrpcCall::unary("/test.Counter/Get", "")
            .send(&self.addr)
            .await;
        let counts: Value = serde_json::from_str(seen["responses"][0].as_str().unwrap())
            .unwrap_or_else(|_| panic!("{seen}"));
        counts[method].as_u64().unwrap()
    }
}

/// One call as the client script makes it.
#[derive(Clone)]
pub struct GrpcCall {
    spec: Value,
}

impl GrpcCall {
    /// A unary call of `method` (`/test.Payments/Create`) with one message.
    pub fn unary(method: &str, message: &str) -> Self {
        Self {
            spec: json!({"method": method, "kind": "unary", "messages": [message], "metadata": []}),
        }
    }

    /// A server-streaming call with one message.
    pub fn server_streaming(method: &str, message: &str) -> Self {
        let mut call = Self::unary(method, message);
        call.spec["kind"] = "stream".into();
        call
    }

    /// A bidi-streaming call sending `messages`.
    pub fn bidi(method: &str, messages: &[&str]) -> Self {
        let mut call = Self::unary(method, "");
        call.spec["kind"] = "bidi".into();
        call.spec["messages"] = json!(messages);
        call
    }

    /// A metadata header.
    pub fn metadata(mut self, name: &str, value: &str) -> Self {
        self.spec["metadata"]
            .as_array_mut()
            .unwrap()
            .push(json!([name, value]));
        self
    }

    /// `idempotency-key` metadata.
    pub fn key(self, key: &str) -> Self {
        self.metadata("idempotency-key", key)
    }

    /// The client's deadline, in seconds (the client script's default is 10): sent as
    /// `grpc-timeout`, and the client gives up with `DEADLINE_EXCEEDED` once it passes.
    pub fn deadline(mut self, seconds: f64) -> Self {
        self.spec["timeout"] = seconds.into();
        self
    }

    /// The client's own retry policy: a service config retrying ABORTED and UNAVAILABLE.
    pub fn retrying(mut self) -> Self {
        self.spec["retry"] = true.into();
        self
    }

    /// Makes the call against `target` (`127.0.0.1:port`) and returns what the application
    /// saw: `{"code", "details", "responses", "initial_metadata", "trailing_metadata"}`.
    pub async fn send(&self, target: &str) -> Value {
        let mut spec = self.spec.clone();
        spec["target"] = target.into();
        let mut child = Command::new(python())
            .arg(script("grpc_client.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the gRPC client");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(spec.to_string().as_bytes()).await.unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "the gRPC client said {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

/// The value of metadata `name` in a list of pairs the client printed.
pub fn metadata<'a>(pairs: &'a Value, name: &str) -> Option<&'a str> {
    pairs
        .as_array()?
        .iter()
        .find(|p| p[0] == name)
        .and_then(|p| p[1].as_str())
}
