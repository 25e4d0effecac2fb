//! Webhook deliveries signed as the providers sign them, and the providers' own libraries
//! (Python: `standardwebhooks` and `stripe`, in the virtual environment `scripts/test`
//! makes under `target/pyenv`) to sign deliveries and to say whether they accept them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

/// The variable `scripts/test` sets to its virtual environment's python.
pub const PYTHON_VAR: &str = "DEDUPE_TEST_PYTHON";

/// The providers' libraries, run by the python `scripts/test` installed them for.
pub struct Providers {
    python: PathBuf,
}

impl Providers {
    /// Panics, saying what to run, when `scripts/test` did not set [`PYTHON_VAR`]: these
    /// tests never pass by skipping.
    pub fn new() -> Self {
        let python = std::env::var_os(PYTHON_VAR).unwrap_or_else(|| {
            panic!(
                "{PYTHON_VAR} is not set: run the tests with scripts/test, which makes \
                 target/pyenv with the standardwebhooks and stripe libraries and exports \
                 {PYTHON_VAR} (or set it to a python that has both)"
            )
        });
        Self {
            python: PathBuf::from(python),
        }
    }

    fn run(&self, request: Value) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/webhooks.py");
        let mut child = Command::new(&self.python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.python.display()));
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(request.to_string().as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The `webhook-signature` the `standardwebhooks` library makes.
    pub fn sign_standard(&self, secret: &str, id: &str, timestamp: u64, body: &str) -> String {
        let signed = self.run(json!({
            "op": "sign-standard", "secret": secret, "id": id,
            "timestamp": timestamp, "body": body,
        }));
        signed.as_str().unwrap().to_owned()
    }

    /// For each delivery (its headers and body), whether the `standardwebhooks` library
    /// accepts it under any of `secrets` (at its fixed tolerance of 5 minutes).
    pub fn standard_accepts(&self, secrets: &[&str], deliveries: &[Delivery]) -> Vec<bool> {
        let deliveries: Vec<Value> = deliveries
            .iter()
            .map(|d| json!({ "headers": d.header_map(), "body": d.body }))
            .collect();
        let verdicts = self.run(json!({
            "op": "verify-standard", "secrets": secrets, "deliveries": deliveries,
        }));
        serde_json::from_value(verdicts).unwrap()
    }

    /// For each delivery, whether `stripe.Webhook.construct_event` accepts it under any of
    /// `secrets` with `tolerance` seconds.
    pub fn stripe_accepts(
        &self,
        secrets: &[&str],
        tolerance: u64,
        deliveries: &[Delivery],
    ) -> Vec<bool> {
        let deliveries: Vec<Value> = deliveries
            .iter()
            .map(|d| json!({ "header": d.header("Stripe-Signature"), "body": d.body }))
            .collect();
        let verdicts = self.run(json!({
            "op": "verify-stripe", "secrets": secrets, "tolerance": tolerance,
            "deliveries": deliveries,
        }));
        serde_json::from_value(verdicts).unwrap()
    }
}

impl Default for Providers {
    fn default() -> Self {
        Self::new()
    }
}

/// One webhook delivery: its headers and body.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: String,
}

impl Delivery {
    /// A delivery of `body` with `headers`.
    pub fn new(headers: &[(&str, &str)], body: &str) -> Self {
        Self {
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_owned(),
        }
    }

    /// The headers, for [`crate::Http::post`].
    pub fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// The value of a header (case-insensitive), or `""`.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    }

    /// The same delivery with `body` in place of its own: a tampered copy.
    pub fn with_body(&self, body: &str) -> Self {
        Self {
            headers: self.headers.clone(),
            body: body.to_owned(),
        }
    }

    fn header_map(&self) -> serde_json::Map<String, Value> {
        self.headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect()
    }
}

fn hmac_sha256(secret: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

/// `Stripe-Signature` as Stripe documents it: `t=<t>,v1=<hex HMAC-SHA256 of "t.body">`
/// under the endpoint secret as written (<https://docs.stripe.com/webhooks#verify-manually>).
pub fn stripe_signature(secret: &str, t: u64, body: &str) -> String {
    let mac = hmac_sha256(
        secret.as_bytes(),
        &[t.to_string().as_bytes(), b".", body.as_bytes()],
    );
    format!("t={t},v1={}", hex::encode(mac))
}

/// `X-Hub-Signature-256` as GitHub documents it: `sha256=<hex HMAC-SHA256 of the body>`.
pub fn github_signature(secret: &str, body: &str) -> String {
    format!(
        "sha256={}",
        hex::encode(hmac_sha256(secret.as_bytes(), &[body.as_bytes()]))
    )
}

/// `X-Shopify-Hmac-Sha256` as Shopify documents it: base64 of the HMAC-SHA256 of the body.
pub fn shopify_signature(secret: &str, body: &str) -> String {
    STANDARD.encode(hmac_sha256(secret.as_bytes(), &[body.as_bytes()]))
}

/// Now, in Unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Writes `secret` to a file in `dir` and returns its `file:` source for `verify.secrets`.
pub fn secret_file(dir: &tempfile::TempDir, name: &str, secret: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    format!("file:{}", path.display())
}
