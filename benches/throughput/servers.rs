//! The servers measured as child processes: nginx `proxy_pass` as the baseline, and the
//! gateway's real release binary, whose resident memory is read from `/proc`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dedupe_test_support::tls::CertFiles;
use dedupe_test_support::GatewayConfig;

/// A free loopback port (the tiny race until the child binds it is harmless here).
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Waits until `addr` accepts connections, or panics with the child's log.
fn wait_listening(addr: SocketAddr, child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        let exited = child.try_wait().unwrap();
        if exited.is_some() || Instant::now() > deadline {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{addr} never listened (exit {exited:?}):\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// `nginx` on PATH or where Debian puts it, if installed.
fn nginx_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("nginx"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()))
}

/// nginx as a plain reverse proxy in front of the same upstream, or as the origin itself:
/// one worker per core; as a proxy with upstream keep-alive and one access-log line per
/// request to a file, as the gateway logs one per request.
pub struct Nginx {
    pub addr: SocketAddr,
    /// The origin's TLS listener, when it has one.
    pub tls_addr: Option<SocketAddr>,
    child: Child,
    _dir: tempfile::TempDir,
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Nginx {
    /// The built-in generator's baseline: as many idle upstream connections kept as the
    /// gateway's pool keeps (256 in all).
    pub fn start(upstream: SocketAddr) -> Option<Self> {
        Self::proxy(upstream, 256 / cores(), false)
    }

    /// `proxy_pass` to `upstream`, keeping `keepalive` idle connections per worker, the
    /// listener with `reuseport` if asked (one accept queue per worker).
    pub fn proxy(upstream: SocketAddr, keepalive: usize, reuseport: bool) -> Option<Self> {
        let reuseport = if reuseport { " reuseport" } else { "" };
        Self::serve(|d, addr| {
            format!(
                "access_log {d}/access.log;
    upstream app {{
        server {upstream};
        keepalive {keepalive};
        keepalive_requests 1000000;
    }}
    keepalive_requests 1000000;
    server {{
        listen {addr} backlog=4096{reuseport};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}"
            )
        })
    }

    /// The origin `wrk`'s scenarios end at: every request answered `201` with a small JSON
    /// body, as the counting upstream answers, and no log; with `tls`, the same on a second
    /// listener over TLS (the `*-tls` rows' origin, in the same process so that its CPU is
    /// counted alike).
    pub fn origin(tls: Option<&CertFiles>) -> Option<Self> {
        let tls_addr = tls.map(|_| free_addr());
        let mut origin = Self::serve(|_, addr| {
            let answer = "location / {
            default_type application/json;
            return 201 '{\"effect\":1}';
        }";
            let tls_server = match (tls, tls_addr) {
                (Some(files), Some(tls_addr)) => format!(
                    "server {{
        listen {tls_addr} ssl backlog=4096 reuseport;
        ssl_certificate {};
        ssl_certificate_key {};
        {answer}
    }}",
                    files.cert.display(),
                    files.key.display()
                ),
                _ => String::new(),
            };
            format!(
                "access_log off;
    keepalive_requests 1000000;
    server {{
        listen {addr} backlog=4096 reuseport;
        {answer}
    }}
    {tls_server}"
            )
        })?;
        origin.tls_addr = tls_addr;
        Some(origin)
    }

    /// `proxy_pass` over TLS to the origin's TLS listener `upstream`, verifying its
    /// certificate against `ca` (as the gateway does), sessions and connections kept.
    pub fn proxy_tls(upstream: SocketAddr, ca: &Path) -> Option<Self> {
        Self::serve(|d, addr| {
            format!(
                "access_log {d}/access.log;
    upstream app {{
        server {upstream};
        keepalive 1024;
        keepalive_requests 1000000;
    }}
    keepalive_requests 1000000;
    server {{
        listen {addr} backlog=4096 reuseport;
        location / {{
            proxy_pass https://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_ssl_server_name on;
            proxy_ssl_name localhost;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {};
            proxy_ssl_session_reuse on;
        }}
    }}",
                ca.display()
            )
        })
    }

    /// Starts nginx with `http` (given its directory and listening address) as the body of
    /// its `http` block.
    fn serve(http: impl FnOnce(&str, SocketAddr) -> String) -> Option<Self> {
        let binary = nginx_binary()?;
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let d = dir.path().display().to_string();
        let conf = format!(
            "daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile 16384;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    {http}
}}
",
            workers = cores(),
            http = http(&d, addr),
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let log = dir.path().join("stderr.log");
        let mut child = Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_listening(addr, &mut child, &log);
        Some(Self {
            addr,
            tls_addr: None,
            child,
            _dir: dir,
        })
    }
}

impl Nginx {
    /// The master's process id (its workers are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the master stops its workers too; SIGKILL would orphan them.
        signal(self.child.id(), "TERM");
        let _ = self.child.wait();
    }
}

/// A proxy this bench started as a child process, in a directory of its own for its files
/// and its log (stderr), listening on `addr`; killed on drop. The gateway's release binary
/// runs so ([`Spawned::gateway`]): its own process, so its memory can be read and it shares
/// the cores with the load generator as nginx does; and `examples/floor_proxy.rs`
/// (`BENCH_FLOOR`, [`Spawned::floor`]): the floor a tokio proxy reaches on this machine,
/// measured in the same rounds as nginx and the gateway.
pub struct Spawned {
    pub addr: SocketAddr,
    /// The gateway's admin listener (its `/metrics`); none for the floor proxy.
    pub admin: Option<SocketAddr>,
    child: Child,
    _dir: tempfile::TempDir,
}

/// The path the peer forwards to on the origin (the path the gateway's rows use).
const PEER_ORIGIN_PATH: &str = "/v1/payments/x";

/// The gateway as a child process.
pub type GatewayChild = Spawned;
/// The floor proxy as a child process.
pub type FloorChild = Spawned;

impl Spawned {
    /// Starts the gateway's `binary` (this build's, or another's to compare) with `config`.
    pub fn gateway(binary: &Path, config: GatewayConfig) -> Self {
        let admin = free_addr();
        let config = config.admin_listen(&admin.to_string());
        let mut gw = Self::spawn(binary, "gateway.log", |command, addr, dir| {
            let config_path = dir.join("gateway.toml");
            std::fs::write(&config_path, config.listen(&addr.to_string()).to_toml()).unwrap();
            command
                .args(["run", "--log-format", "json", "--config"])
                .arg(&config_path)
                .env_remove("RUST_LOG");
        });
        gw.admin = Some(admin);
        gw
    }

    /// Starts the floor proxy's `binary` in front of `upstream`.
    pub fn floor(binary: &Path, upstream: SocketAddr) -> Self {
        Self::spawn(binary, "floor.log", |command, addr, _| {
            command.arg(addr.to_string()).arg(upstream.to_string());
        })
    }

    /// Starts the peer, idempotent-proxy's `idempotent-proxy-server` (`BENCH_PEER`), on
    /// the Redis at `redis_url`, forwarding its path `/URL_ORIGIN` to `upstream`: it locks
    /// a key with `SET NX PX` for `REQUEST_TIMEOUT` (30 s here, so that a replay's stored
    /// answer outlives a run), forwards, stores the answer for as long, and answers a
    /// duplicate by polling for it. It reads a `.env` from its working directory (empty
    /// here: every setting is in its environment).
    pub fn peer(binary: &Path, upstream: SocketAddr, redis_url: &str) -> Self {
        Self::spawn(binary, "peer.log", |command, addr, dir| {
            std::fs::write(dir.join(".env"), "").unwrap();
            command
                .current_dir(dir)
                .env("SERVER_ADDR", addr.to_string())
                .env("REDIS_URL", redis_url)
                .env("URL_ORIGIN", format!("http://{upstream}{PEER_ORIGIN_PATH}"))
                .env("REQUEST_TIMEOUT", "30000")
                .env("LOG_LEVEL", "warn");
        })
    }

    /// Runs `binary` with the arguments `args` gives it for a free address and a directory
    /// of its own, and waits until it listens.
    fn spawn(
        binary: &Path,
        log_name: &str,
        args: impl FnOnce(&mut Command, SocketAddr, &Path),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let log = dir.path().join(log_name);
        let mut command = Command::new(binary);
        args(&mut command, addr, dir.path());
        let mut child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        wait_listening(addr, &mut child, &log);
        Self {
            addr,
            admin: None,
            child,
            _dir: dir,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now, in bytes (`VmRSS`).
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
