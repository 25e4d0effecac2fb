//! Gateways under test: served in this process, or the real binary as a child process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedupe_gateway::config::Config;
use dedupe_gateway::edge::server::{serve_on, Listeners};
use dedupe_gateway::edge::Gateway;
use dedupe_gateway::runtime::{self, Workers};
use dedupe_gateway::store::Store;
use tokio::net::TcpListener;

use crate::config::{GatewayConfig, StoreCfg};
use crate::redis_server::RedisServer;

/// Which store a behaviour test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded store.
    Memory,
    /// A redis-server of the test's own.
    Redis,
}

impl Backend {
    /// The `[store]` section for this backend, and the redis-server it started if any
    /// (keep it alive for the test).
    pub fn start_store(self) -> (StoreCfg, Option<RedisServer>) {
        match self {
            Backend::Memory => (StoreCfg::memory(), None),
            Backend::Redis => {
                let r = RedisServer::start();
                (StoreCfg::redis(r.url()).timeout("500ms"), Some(r))
            }
        }
    }
}

/// A gateway served in this process on port 0 (and an admin port 0 if the config has
/// `[admin]`), until dropped: on connection workers as `run` serves (one per CPU unless
/// `server.workers` says otherwise), each with its own Redis connection.
pub struct TestGateway {
    /// The public listener's address.
    pub addr: SocketAddr,
    /// The admin listener's address, when there is one.
    pub admin: Option<SocketAddr>,
    /// The gateway, for its metrics.
    pub gateway: Arc<Gateway>,
    // Dropping the sender starts the graceful shutdown.
    _stop: tokio::sync::oneshot::Sender<()>,
    workers: Arc<Workers>,
}

impl Drop for TestGateway {
    /// The workers end with the gateway, as `run` stops them after its drain.
    fn drop(&mut self) {
        self.workers.stop();
    }
}

impl TestGateway {
    /// Loads `config` through the real loader and serves it; the listen addresses in the
    /// file are replaced by loopback port 0.
    pub async fn start(config: &GatewayConfig) -> Self {
        Self::serve(config, None).await
    }

    /// As `start`, on a store another gateway already uses (an embedded store shared
    /// between two gateways, as two replicas share a Redis).
    pub async fn start_on(config: &GatewayConfig, store: Store) -> Self {
        Self::serve(config, Some(store)).await
    }

    async fn serve(config: &GatewayConfig, store: Option<Store>) -> Self {
        let text = config.to_toml();
        let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let count = runtime::worker_count(config.server.workers);
        let workers = Arc::new(runtime::workers(count).unwrap());
        let store = store
            .unwrap_or_else(|| Store::from_config_on(&config.store, workers.runtimes()).unwrap());
        let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = match &config.admin {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let addr = public.local_addr().unwrap();
        let admin_addr = admin.as_ref().map(|l| l.local_addr().unwrap());
        let gateway = Gateway::new(config, store);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let serving = (gateway.clone(), workers.clone());
        tokio::spawn(async move {
            let (gateway, workers) = serving;
            let listeners = Listeners {
                public,
                admin,
                tls: None,
            };
            serve_on(gateway, listeners, &workers, async move {
                let _ = rx.await;
            })
            .await;
        });
        Self {
            addr,
            admin: admin_addr,
            gateway,
            _stop: tx,
            workers,
        }
    }

    /// A URL on the public listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin.expect("no admin listener"))
    }
}

/// A gateway as a child process of the real binary, killed on drop.
pub struct GatewayProcess {
    /// The process.
    pub child: Child,
    /// The public listener's address, from its start-up log line.
    pub addr: SocketAddr,
    /// The admin listener's address, when there is one.
    pub admin: Option<SocketAddr>,
    /// Every JSON log line so far.
    pub logs: Arc<Mutex<Vec<serde_json::Value>>>,
    /// The config file, to rewrite before a SIGHUP.
    pub config_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl GatewayProcess {
    /// Writes `config` to a file and runs `dedupe-gateway run --config FILE --log-format json`.
    pub fn start(config: &GatewayConfig) -> Self {
        Self::start_with_env(config, &[])
    }

    /// As `start`, with extra environment variables for the process.
    pub fn start_with_env(config: &GatewayConfig, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, config.to_toml()).unwrap();
        let mut child = Command::new(binary())
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
        let has_admin = config.has_admin() || env.iter().any(|(k, _)| *k == "DEDUPE_ADMIN_LISTEN");
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

    /// A URL on the public listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin.expect("no admin listener"))
    }

    /// Sends a signal by name (`TERM`, `HUP`).
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

    /// Every log line printed so far, as JSON text.
    pub fn log_lines(&self) -> Vec<String> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.to_string())
            .collect()
    }

    /// Asserts that a log line says `said` and that none shows `secret`.
    pub fn assert_logged_without(&self, said: &str, secret: &str) {
        let lines = self.log_lines();
        assert!(lines.iter().any(|l| l.contains(said)), "{lines:#?}");
        assert!(!lines.iter().any(|l| l.contains(secret)), "{lines:#?}");
    }

    /// Whether a log line with this message has been printed.
    fn logged(&self, message: &str) -> bool {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l["message"].as_str().is_some_and(|m| m.contains(message)))
    }

    /// Waits until a log line with this message has been printed.
    pub async fn wait_logged(&self, message: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.logged(message) {
            assert!(Instant::now() < deadline, "never logged {message:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The gateway binary Cargo built beside the running test: `target/PROFILE/deps/TEST`
/// runs `target/PROFILE/dedupe-gateway`. (`CARGO_BIN_EXE_*` is set only while the gateway's
/// own test targets compile, not for this crate.)
fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join(format!("dedupe-gateway{}", std::env::consts::EXE_SUFFIX)))
        .unwrap();
    assert!(bin.is_file(), "no gateway binary at {}", bin.display());
    bin
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
