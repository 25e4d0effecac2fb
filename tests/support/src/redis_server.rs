//! redis-server processes on loopback ports.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server child process on a loopback port, killed on drop, and also when the
/// test binary exits without dropping it (a server held in a `static`, a test killed by a
/// timeout): a watchdog `sh` reading our end of a pipe kills it when that pipe closes.
pub struct RedisServer {
    /// The server's port on 127.0.0.1 (plaintext: the harness's own connections).
    pub port: u16,
    /// The TLS port, for a server started with [`RedisServer::start_tls`].
    pub tls_port: Option<u16>,
    process: Option<Process>,
    /// The server binary: `redis-server`, or Valkey's (see [`RedisServer::start_valkey`]).
    program: std::ffi::OsString,
    extra: Vec<String>,
    /// A sentinel's config file (in `dir`).
    sentinel_conf: Option<std::path::PathBuf>,
    dir: tempfile::TempDir,
}

/// A running redis-server and its watchdog.
struct Process {
    redis: Child,
    watchdog: Child,
}

impl Process {
    fn spawn(
        program: &std::ffi::OsStr,
        port: u16,
        dir: &std::path::Path,
        conf: Option<&std::path::Path>,
        extra: &[String],
    ) -> Result<Self, String> {
        let mut command = Command::new(program);
        // A config file must come first; a sentinel needs one it can rewrite.
        if let Some(conf) = conf {
            command.arg(conf).arg("--sentinel");
        }
        let redis = command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{program:?} not installed? {e}"))?;
        // The pipe's write end stays with us (close-on-exec, so no other child inherits
        // it); `read` returns when this process closes it, by drop or by exiting.
        let watchdog = Command::new("sh")
            .args(["-c", "read line; kill -9 \"$1\"", "sh"])
            .arg(redis.id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match watchdog {
            Ok(watchdog) => Ok(Self { redis, watchdog }),
            Err(e) => {
                let mut process = redis;
                let _ = process.kill();
                let _ = process.wait();
                Err(format!("could not start the watchdog: {e}"))
            }
        }
    }

    /// SIGKILLs the server. The watchdog goes first, so it can never signal a pid that
    /// was reaped and reused.
    fn kill(mut self) {
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = self.redis.kill();
        let _ = self.redis.wait();
    }
}

impl RedisServer {
    /// A plain server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra command-line arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_inner(None, extra)
    }

    /// A server that also serves TLS on [`RedisServer::tls_port`] with `tls`'s certificate.
    /// The plaintext port stays for the harness's own commands (`ACL SETUSER`, `INFO`);
    /// a gateway under test is given only the TLS port.
    pub fn start_tls(tls: &RedisTls, extra: &[&str]) -> Self {
        Self::start_inner(Some(tls), extra)
    }

    /// A Redis Sentinel (`redis-server sentinel.conf --sentinel`) monitoring the primary at
    /// `127.0.0.1:primary_port` as `name` with a quorum of one, quick to act: down after
    /// 500ms of silence, a failover retried after 2s. `conf` adds lines to its file
    /// (TLS settings). [`RedisServer::url`] is the sentinel's own address.
    pub fn start_sentinel(name: &str, primary_port: u16, conf: &[String]) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("sentinel.conf");
            let mut text = format!(
                "sentinel monitor {name} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {name} 500\n\
                 sentinel failover-timeout {name} 2000\n"
            );
            for line in conf {
                text.push_str(line);
                text.push('\n');
            }
            std::fs::write(&path, text).unwrap();
            let mut s = Self {
                port: free_port(),
                tls_port: None,
                process: None,
                program: "redis-server".into(),
                extra: Vec::new(),
                sentinel_conf: Some(path),
                dir,
            };
            match s.spawn() {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server --sentinel: {last}");
    }

    /// A Valkey server (`valkey-server`, 8.1 or later: it has `SET ... IFEQ`), the binary
    /// named by `DEDUPE_TEST_VALKEY`, which `scripts/test` builds from Debian's source and
    /// sets.
    pub fn start_valkey(extra: &[&str]) -> Self {
        let program = std::env::var_os("DEDUPE_TEST_VALKEY").expect(
            "DEDUPE_TEST_VALKEY names no valkey-server: run scripts/test, which builds one",
        );
        Self::start_program(program, None, extra)
    }

    fn start_inner(tls: Option<&RedisTls>, extra: &[&str]) -> Self {
        Self::start_program("redis-server".into(), tls, extra)
    }

    fn start_program(program: std::ffi::OsString, tls: Option<&RedisTls>, extra: &[&str]) -> Self {
        let mut last = String::new();
        for attempt in 0..5 {
            let tls_port = tls.map(|_| free_port());
            let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            // A cluster node's bus port was free when it was chosen, as the port was: one
            // taken since fails the start as surely, so a new attempt takes a new one too.
            if let Some(bus) = args.iter().position(|a| a == "--cluster-port") {
                if attempt > 0 && bus + 1 < args.len() {
                    args[bus + 1] = free_port().to_string();
                }
            }
            if let (Some(tls), Some(port)) = (tls, tls_port) {
                args.extend(tls.args(port));
            }
            let mut s = Self {
                port: free_port(),
                tls_port,
                process: None,
                program: program.clone(),
                extra: args,
                sentinel_conf: None,
                dir: tempfile::tempdir().unwrap(),
            };
            match s.spawn() {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        panic!("could not start {program:?}: {last}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        self.process = Some(Process::spawn(
            &self.program,
            self.port,
            self.dir.path(),
            self.sentinel_conf.as_deref(),
            &self.extra,
        )?);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(mut c) = self.connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            let process = self.process.as_mut().unwrap();
            if let Some(status) = process.redis.try_wait().unwrap() {
                self.process.take().unwrap().kill();
                return Err(format!("redis-server exited: {status}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("redis-server did not answer".into())
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:TLS_PORT`.
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://127.0.0.1:{}",
            self.tls_port.expect("a server started with start_tls")
        )
    }

    /// A new blocking connection.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    /// Runs one command on a new connection; panics on an error. Patient (5 s): a node
    /// busy with a failover on a loaded 2-core machine answers late, not never.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).unwrap()
    }

    /// Freezes the server with SIGSTOP until the guard is dropped (SIGCONT, even when the
    /// test fails): TCP stays up, nothing is answered.
    pub fn freeze(&self) -> Frozen {
        let info: String = self.cmd(&["INFO", "server"]);
        let pid: u32 = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("no process_id in INFO server");
        signal("STOP", pid);
        Frozen(pid)
    }

    /// Ids of the clients connected other than the one asking (`CLIENT LIST`).
    pub fn other_client_ids(&self) -> Vec<String> {
        let list: String = self.cmd(&["CLIENT", "LIST"]);
        list.lines()
            .filter(|l| !l.contains("cmd=client|list"))
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_owned)
            .collect()
    }

    /// The clients named `name` (`CLIENT SETNAME`; the gateway names its connections
    /// `dedupe-gateway-claims` and `dedupe-gateway-leases`): each one's `CLIENT LIST`
    /// fields, by name (`id`, `addr`, ...).
    pub fn clients_named(&self, name: &str) -> Vec<HashMap<String, String>> {
        let list: String = self.cmd(&["CLIENT", "LIST"]);
        list.lines()
            .map(|l| {
                l.split(' ')
                    .filter_map(|f| f.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect::<HashMap<_, _>>()
            })
            .filter(|fields| fields.get("name").is_some_and(|n| n == name))
            .collect()
    }

    /// Stops the server (SIGKILL): the store is gone until `restart`.
    pub fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill();
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

/// How a TLS redis-server is set up: its certificate, the CA it trusts for client
/// certificates, and whether it requires one.
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// The server's certificate.
    pub server: crate::CertFiles,
    /// The CA file (`--tls-ca-cert-file`): verifies client certificates.
    pub ca_file: std::path::PathBuf,
    /// `--tls-auth-clients yes`: a client must present a certificate signed by the CA.
    pub require_client_cert: bool,
}

impl RedisTls {
    fn args(&self, port: u16) -> Vec<String> {
        let p = |p: &std::path::Path| p.to_str().unwrap().to_owned();
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            p(&self.server.cert),
            "--tls-key-file".into(),
            p(&self.server.key),
            "--tls-ca-cert-file".into(),
            p(&self.ca_file),
            "--tls-auth-clients".into(),
            if self.require_client_cert {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]
    }
}

/// A server frozen by [`RedisServer::freeze`]; SIGCONT on drop.
pub struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        signal("CONT", self.0);
    }
}

fn signal(sig: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid} failed");
}
