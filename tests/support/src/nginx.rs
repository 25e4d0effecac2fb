//! nginx as a reference proxy: one process, one `server` per upstream on a loopback port
//! of its own, each `proxy_pass`ing to its upstream. Killed on drop, and by a watchdog when
//! the test binary exits without dropping it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nginx binary: `DEDUPE_TEST_NGINX`, else `nginx` on `PATH`, else where Debian and
/// source builds put it (`/usr/sbin` is not on a normal user's `PATH`).
pub fn nginx_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DEDUPE_TEST_NGINX") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(
            ["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"]
                .into_iter()
                .map(PathBuf::from),
        )
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

/// A running nginx.
pub struct Nginx {
    /// Where each server listens, in the order of the upstreams given.
    pub addrs: Vec<SocketAddr>,
    nginx: Child,
    watchdog: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// One nginx in front of `upstreams`; `None` (and a note on stdout) when no nginx
    /// binary is installed.
    pub fn start(upstreams: &[SocketAddr]) -> Option<Self> {
        let Some(bin) = nginx_binary() else {
            println!(
                "NOTE: nginx not found (PATH, /usr/sbin, DEDUPE_TEST_NGINX): the comparison with nginx is skipped; scripts/test installs nginx-light"
            );
            return None;
        };
        let mut last = String::new();
        // A port picked free may be taken before nginx binds it: try again.
        for _ in 0..5 {
            match Self::try_start(&bin, upstreams) {
                Ok(n) => return Some(n),
                Err(e) => last = e,
            }
        }
        panic!("nginx ({}) did not start: {last}", bin.display());
    }

    fn try_start(bin: &PathBuf, upstreams: &[SocketAddr]) -> Result<Self, String> {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let addrs: Vec<SocketAddr> = upstreams
            .iter()
            .map(|_| SocketAddr::from(([127, 0, 0, 1], crate::free_port())))
            .collect();
        let servers: String = addrs
            .iter()
            .zip(upstreams)
            .map(|(a, u)| {
                format!("  server {{ listen {a}; location / {{ proxy_pass http://{u}; }} }}\n")
            })
            .collect();
        // master_process off: one process, no change of user, nothing to reap.
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             proxy_read_timeout 5s;\n  client_header_timeout 5s;\n  client_body_timeout 5s;\n{servers}}}\n"
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let nginx = Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{e}"))?;
        let watchdog = Command::new("sh")
            .args(["-c", "read line; kill -9 \"$1\"", "sh"])
            .arg(nginx.id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut me = Self {
            addrs,
            nginx,
            watchdog,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        for a in me.addrs.clone() {
            while std::net::TcpStream::connect(a).is_err() {
                if let Ok(Some(status)) = me.nginx.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = me.nginx.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    let log = std::fs::read_to_string(me._dir.path().join("error.log"))
                        .unwrap_or_default();
                    return Err(format!("exited {status}: {err}{log}"));
                }
                if Instant::now() > deadline {
                    return Err(format!("{a} never accepted"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(me)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The watchdog first, so it can never signal a pid that was reaped and reused.
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = self.nginx.kill();
        let _ = self.nginx.wait();
    }
}
