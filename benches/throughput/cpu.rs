//! CPU time read from `/proc` and from Redis's `INFO`: per process (with its threads and
//! direct children), for the whole machine, and Redis's main thread and commands.

use std::collections::BTreeMap;
use std::process::Command;

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
    let text = redis_info(port)?;
    let calls = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.strip_prefix("calls="))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let reads = info_value(&text, "total_reads_processed:")?;
    Some((calls("cmdstat_evalsha:") + calls("cmdstat_eval:"), reads))
}

/// Empties the server on `port` (`FLUSHALL SYNC`: freed before it answers, so none of
/// the freeing falls into the run that follows), with `redis-cli`.
pub fn redis_flush(port: u16) {
    let flushed = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "FLUSHALL", "SYNC"])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"OK"));
    assert!(flushed, "FLUSHALL SYNC on port {port} failed");
}

/// `INFO all` of the server on `port` (with `redis-cli`), if it answers.
fn redis_info(port: u16) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "all"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()
}

/// The value of an `INFO` field, `name` with its colon.
fn info_value<T: std::str::FromStr>(text: &str, name: &str) -> Option<T> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
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

/// Busy CPU time of the whole machine so far (every core: user, nice, system, irq,
/// softirq and steal; not idle or iowait), in clock ticks, from `/proc/stat`.
pub fn machine_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum()
}

/// What `redis-server` reports of its own work so far: its main thread's CPU time, and
/// per command its calls and microseconds (`INFO cpu`, `INFO commandstats`).
#[derive(Clone, Default)]
pub struct RedisWork {
    /// `used_cpu_user_main_thread` + `used_cpu_sys_main_thread`, in seconds.
    pub main_thread: f64,
    /// Command name -> (calls, usec).
    pub commands: BTreeMap<String, (u64, u64)>,
    /// Reads from client sockets (`total_reads_processed`): each a wake-up of the server.
    pub reads: u64,
}

impl RedisWork {
    /// Read from the server on `port` (with `redis-cli`), if it answers.
    pub fn read(port: u16) -> Option<Self> {
        let text = redis_info(port)?;
        let float = |name: &str| info_value::<f64>(&text, name);
        let main_thread =
            float("used_cpu_user_main_thread:")? + float("used_cpu_sys_main_thread:")?;
        let mut commands = BTreeMap::new();
        for line in text.lines() {
            let Some((name, stats)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.trim().split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            commands.insert(name.to_owned(), (field("calls="), field("usec=")));
        }
        let reads = info_value(&text, "total_reads_processed:")?;
        Some(Self {
            main_thread,
            commands,
            reads,
        })
    }

    /// The work done since `before`, leaving out the bench's own `INFO` calls.
    pub fn since(&self, before: &RedisWork) -> RedisWork {
        let mut commands = BTreeMap::new();
        for (name, &(calls, usec)) in &self.commands {
            let (c0, u0) = before.commands.get(name).copied().unwrap_or((0, 0));
            if calls > c0 && name != "info" {
                commands.insert(name.clone(), (calls - c0, usec.saturating_sub(u0)));
            }
        }
        RedisWork {
            main_thread: self.main_thread - before.main_thread,
            commands,
            // Less the read of the `INFO` call that took this sample.
            reads: self.reads.saturating_sub(before.reads + 1),
        }
    }
}
