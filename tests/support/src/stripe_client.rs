//! Stripe's official Python client (`stripe` from PyPI, in the virtual environment
//! `scripts/test` makes under `target/pyenv` and names in `DEDUPE_TEST_PYTHON`) making one
//! `stripe.Customer.create` call against a gateway, as an application would; the test reads
//! what the application saw: the object, or the exception and what it carried.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// The variable `scripts/test` sets to its virtual environment's python.
pub const PYTHON_VAR: &str = "DEDUPE_TEST_PYTHON";

/// Stripe's Python client pointed at a gateway (`stripe.api_base`).
#[derive(Clone)]
pub struct StripeClient {
    python: PathBuf,
    api_base: String,
}

/// One `stripe.Customer.create(**params, idempotency_key=..., headers=...)`.
#[derive(Clone)]
pub struct CustomerCreate {
    idempotency_key: String,
    params: Value,
    headers: Value,
    max_network_retries: u32,
}

impl CustomerCreate {
    /// A create with `params` under `idempotency_key`, without the client's own retries.
    pub fn new(idempotency_key: &str, params: Value) -> Self {
        Self {
            idempotency_key: idempotency_key.to_owned(),
            params,
            headers: json!({}),
            max_network_retries: 0,
        }
    }

    /// An extra request header (the counting upstream's `x-test-delay-ms`, say).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers[name] = value.into();
        self
    }

    /// `stripe.max_network_retries`: how often the client retries by itself.
    pub fn retries(mut self, n: u32) -> Self {
        self.max_network_retries = n;
        self
    }
}

impl StripeClient {
    /// Panics, saying what to run, when `scripts/test` did not set [`PYTHON_VAR`]: these
    /// tests never pass by skipping.
    pub fn new(api_base: impl Into<String>) -> Self {
        let python = std::env::var_os(PYTHON_VAR).unwrap_or_else(|| {
            panic!(
                "{PYTHON_VAR} is not set: run the tests with scripts/test, which makes \
                 target/pyenv with Stripe's Python client (stripe) and exports {PYTHON_VAR} \
                 (or set it to a python that has stripe installed)"
            )
        });
        Self {
            python: PathBuf::from(python),
            api_base: api_base.into(),
        }
    }

    /// Makes the call and returns what the application saw: `{"object", "http_status",
    /// "replayed"}`, or `{"raised", "is_idempotency_error", "http_status", "code", "type",
    /// "message", "retry_after", "should_retry"}`.
    pub async fn create_customer(&self, call: &CustomerCreate) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/stripe_client.py");
        let mut child = tokio::process::Command::new(&self.python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.python.display()));
        let request = json!({
            "api_base": self.api_base,
            "idempotency_key": call.idempotency_key,
            "params": call.params,
            "headers": call.headers,
            "max_network_retries": call.max_network_retries,
        });
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(request.to_string().as_bytes())
            .await
            .unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        assert!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{}: not JSON ({e}): {}",
                script.display(),
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}
