//! Real components for the integration tests: a counting upstream, redis-server processes,
//! gateways in-process and as child processes. Everything binds loopback port 0.
#![allow(dead_code)]

pub mod contract;
pub mod fault_proxy;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dedupe_gateway::config::Config;
use dedupe_gateway::proxy::Gateway;
use dedupe_gateway::server::{serve, Listeners};
use dedupe_gateway::store::Store;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

// ---------------------------------------------------------------------------
// The upstream: a real HTTP server that counts side effects.
// ---------------------------------------------------------------------------

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Seen {
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
/// `x-test-body-bytes` (answer a body of that size), `x-test-drop` (close without answering).
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
}

impl Upstream {
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
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Side effects so far.
    pub fn effects(&self) -> u64 {
        self.state.effects.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
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
) -> Result<Response<Full<Bytes>>, Infallible> {
    let status = header_num(&req, "x-test-status").unwrap_or(201) as u16;
    let delay = header_num(&req, "x-test-delay-ms").unwrap_or(0);
    let body_bytes = header_num(&req, "x-test-body-bytes");
    let drop_it = req.headers().contains_key("x-test-drop");
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let n = st.effects.fetch_add(1, Ordering::SeqCst) + 1;
    st.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts.uri.to_string(),
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
    let mut resp = Response::new(Full::new(payload));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    resp.headers_mut()
        .insert("x-effect", n.to_string().parse().unwrap());
    resp.headers_mut()
        .insert("set-cookie", "session=first-client-only".parse().unwrap());
    Ok(resp)
}

// ---------------------------------------------------------------------------
// HTTP client.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
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
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(64)
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

    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, String> {
        let mut b = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn post(&self, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        self.send("POST", url, headers, body).await.unwrap()
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", url, headers, "").await.unwrap()
    }
}

// ---------------------------------------------------------------------------
// redis-server processes.
// ---------------------------------------------------------------------------

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server child process on a loopback port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut last = String::new();
        for _ in 0..5 {
            let mut s = Self {
                port: free_port(),
                child: None,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                dir: tempfile::tempdir().unwrap(),
            };
            match s.spawn() {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        drop(dir);
        panic!("could not start redis-server: {last}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server not installed? {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(mut c) = self.connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("redis-server exited: {status}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("redis-server did not answer".into())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = self.connection().unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).unwrap()
    }

    /// Stops the server (SIGKILL): the store is gone until `restart`.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("redis restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Calls per command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
    pub fn command_calls(&self) -> HashMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------
// Gateways.
// ---------------------------------------------------------------------------

/// Which store a behaviour test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
}

/// The `[store]` section for a backend; starts redis-server when needed.
pub fn store_section(backend: Backend) -> (String, Option<RedisServer>) {
    match backend {
        Backend::Memory => ("[store]\nbackend = \"memory\"\n".to_owned(), None),
        Backend::Redis => {
            let r = RedisServer::start();
            (
                format!(
                    "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"500ms\"\n",
                    r.url()
                ),
                Some(r),
            )
        }
    }
}

/// A gateway served in this process on port 0.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub gateway: Arc<Gateway>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl TestGateway {
    /// `toml` holds everything but `[server]`'s listen and upstream, which are filled in.
    pub async fn start(upstream: &Upstream, server_extra: &str, rest: &str) -> Self {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n{server_extra}\n{rest}",
            upstream.url()
        );
        let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let store = Store::from_config(&config.store).unwrap();
        let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = match &config.admin {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let addr = public.local_addr().unwrap();
        let admin_addr = admin.as_ref().map(|l| l.local_addr().unwrap());
        let gateway = Gateway::new(config, store);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = tokio::spawn(serve(
            gateway.clone(),
            Listeners { public, admin },
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            admin: admin_addr,
            gateway,
            stop: Some(tx),
            done: Some(done),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin.expect("no admin listener"))
    }

    /// Signals shutdown and waits for the drain to finish.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

/// A gateway as a child process of the real binary.
pub struct GatewayProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub logs: Arc<Mutex<Vec<serde_json::Value>>>,
    pub config_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl GatewayProcess {
    /// Writes `toml` to a file and runs `dedupe-gateway run --config FILE --log-format json`.
    pub fn start(toml: &str) -> Self {
        Self::start_with_env(toml, &[])
    }

    /// As `start`, with extra environment variables for the process.
    pub fn start_with_env(toml: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, toml).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
            .args(["run", "--log-format", "json", "--config"])
            .arg(&config_path)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    eprintln!("gateway: {line}");
                    continue;
                };
                if let (Some(msg), Some(addr)) = (v["message"].as_str(), v["addr"].as_str()) {
                    let _ = tx.send((msg.to_owned(), addr.to_owned()));
                }
                sink.lock().unwrap().push(v);
            }
        });
        let mut addr = None;
        let mut admin = None;
        let has_admin =
            toml.contains("[admin]") || env.iter().any(|(k, _)| *k == "DEDUPE_ADMIN_LISTEN");
        let deadline = Instant::now() + Duration::from_secs(10);
        while addr.is_none() || (has_admin && admin.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let (msg, a) = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("gateway did not start; status {:?}", child.try_wait()));
            let a: SocketAddr = a.parse().unwrap();
            if msg.starts_with("public") {
                addr = Some(a);
            } else {
                admin = Some(a);
            }
        }
        Self {
            child,
            addr: addr.unwrap(),
            admin,
            logs,
            config_path,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin.expect("no admin listener"))
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether a log line with this message has been printed.
    pub fn logged(&self, message: &str) -> bool {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l["message"].as_str().is_some_and(|m| m.contains(message)))
    }

    pub async fn wait_logged(&self, message: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.logged(message) {
            assert!(Instant::now() < deadline, "never logged {message:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
