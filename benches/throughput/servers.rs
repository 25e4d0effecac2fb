//! The servers measured as child processes: nginx `proxy_pass` as the baseline, and the
//! gateway's real release binary, whose resident memory is read from `/proc`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// CPU time used so far by `root` and its direct children (the gateway's threads, or
/// nginx's master and workers), in clock ticks: user-space, and in the kernel.
#[derive(Clone, Copy)]
pub struct Ticks {
    pub user: u64,
    pub system: u64,
}

impl Ticks {
    pub fn total(self) -> u64 {
        self.user + self.system
    }

    pub fn since(self, before: Ticks) -> Ticks {
        Ticks {
            // A child that exits during a pass takes its ticks with it.
            user: self.user.saturating_sub(before.user),
            system: self.system.saturating_sub(before.system),
        }
    }
}

/// [`Ticks`] of `root` and its direct children.
pub fn cpu_ticks(root: u32) -> Ticks {
    // Fields after the command name (which may hold spaces, so split after its `)`):
    // state is the first, ppid the second, utime the 12th, stime the 13th.
    let read = |stat: &str| -> Option<(u32, Ticks)> {
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        Some((
            f[1].parse().ok()?,
            Ticks {
                user: f[11].parse().ok()?,
                system: f[12].parse().ok()?,
            },
        ))
    };
    let mut total = Ticks { user: 0, system: 0 };
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if let Some((ppid, ticks)) = read(&stat) {
            if pid == root || ppid == root {
                total.user += ticks.user;
                total.system += ticks.system;
            }
        }
    }
    total
}

/// The process id of the `redis-server` on `port` (from `INFO server`), if `redis-cli`
/// is installed.
pub fn redis_pid(port: u16) -> Option<u32> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "server"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `redis-server`'s counts so far: the gateway's commands (its scripts: `EVALSHA` and
/// `EVAL` calls in `INFO commandstats`; `total_commands_processed` would also count the
/// commands the scripts run), and reads from client sockets (`total_reads_processed`).
/// Commands per read over a pass is how deep the gateway's connection pipelines under
/// load (1.0: every command took a read of its own).
pub fn redis_io(port: u16) -> Option<(u64, u64)> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "all"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let calls = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.strip_prefix("calls="))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let reads = text
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|v| v.trim().parse::<u64>().ok())?;
    Some((calls("cmdstat_evalsha:") + calls("cmdstat_eval:"), reads))
}

/// Clock ticks per second, as `/proc` counts CPU time.
pub fn ticks_per_second() -> f64 {
    // `getconf` rather than a libc call; 100 on every Linux this runs on.
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
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

/// nginx as a plain reverse proxy in front of the same upstream: one worker per core,
/// upstream keep-alive (as many idle connections as the gateway's pool keeps), one
/// access-log line per request to a file, as the gateway logs one per request.
pub struct Nginx {
    pub addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    pub fn start(upstream: SocketAddr) -> Option<Self> {
        let binary = nginx_binary()?;
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let d = dir.path().display();
        let conf = format!(
            "daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile 16384;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream app {{
        server {upstream};
        keepalive {keepalive};
    }}
    server {{
        listen {addr} backlog=4096;
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
",
            workers = std::thread::available_parallelism().map_or(1, |n| n.get()),
            keepalive = 256 / std::thread::available_parallelism().map_or(1, |n| n.get()),
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

/// The gateway's release binary as a child process: its own process, so its memory can be
/// read and it shares the cores with the load generator as nginx does. Logs go to a file.
pub struct GatewayChild {
    pub addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl GatewayChild {
    /// Starts `binary` (this build's, or another's to compare) with `config`.
    pub fn start(binary: &Path, config: GatewayConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, config.listen(&addr.to_string()).to_toml()).unwrap();
        let log = dir.path().join("gateway.log");
        let mut child = Command::new(binary)
            .args(["run", "--log-format", "json", "--config"])
            .arg(&config_path)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_listening(addr, &mut child, &log);
        Self {
            addr,
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

impl Drop for GatewayChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
