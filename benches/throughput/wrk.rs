//! `wrk -t1 --latency` as a load generator: a POST with the bench's small JSON body, keyed
//! by a Lua script, and what it reports (requests, rate, percentiles), with the CPU time
//! `wrk` itself spent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::load::BODY;

/// How each request of a `wrk` run is keyed.
pub enum WrkKeys {
    /// No `Idempotency-Key`.
    None,
    /// `{prefix}{n}` with `n` counting from 1 in this run: never sent before, as long as
    /// the prefix is unique to the run.
    Unique(String),
    /// The same key on every request.
    Same(String),
}

/// One `wrk` run's figures.
pub struct WrkRun {
    pub requests: u64,
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Responses other than 2xx/3xx, and socket errors.
    pub errors: u64,
    /// Socket errors alone (connect, read, write, timeout).
    pub socket_errors: u64,
    /// Every response by status, when the run counted them (see [`run`]'s `statuses`).
    pub statuses: BTreeMap<u16, u64>,
    /// `wrk`'s own CPU time over the run, in clock ticks (user + system).
    pub ticks: u64,
}

/// What the script adds to count the answers by status: each thread counts its own, and
/// `done` prints every thread's counts as `status CODE COUNT` lines.
const COUNT_STATUSES: &str = "local threads = {}\n\
function setup(thread) table.insert(threads, thread) end\n\
statuses = {}\n\
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end\n\
function done(summary, latency, requests)\n\
  for _, t in ipairs(threads) do\n\
    for code, n in pairs(t:get(\"statuses\")) do io.write(string.format(\"status %d %d\\n\", code, n)) end\n\
  end\n\
end\n";

/// The Lua script that makes `wrk`'s requests.
fn script(path: &str, keys: &WrkKeys, statuses: bool) -> String {
    let mut lua = format!(
        "wrk.method = \"POST\"\nwrk.path = \"{path}\"\nwrk.body = '{BODY}'\n\
         wrk.headers[\"Content-Type\"] = \"application/json\"\n"
    );
    match keys {
        WrkKeys::None => {}
        WrkKeys::Same(key) => {
            lua.push_str(&format!("wrk.headers[\"Idempotency-Key\"] = \"{key}\"\n"))
        }
        // A `request` function makes wrk format every request anew: only where the key
        // changes.
        WrkKeys::Unique(prefix) => lua.push_str(&format!(
            "local n = 0\nrequest = function()\n  n = n + 1\n  \
             wrk.headers[\"Idempotency-Key\"] = \"{prefix}\" .. n\n  \
             return wrk.format()\nend\n"
        )),
    }
    if statuses {
        lua.push_str(COUNT_STATUSES);
    }
    lua
}

/// Runs `wrk` for `seconds` with `conns` connections on one thread against `addr`; with
/// `statuses`, counting every answer by its status (a Lua call per response: only where
/// answers other than 2xx are expected).
pub fn run(
    addr: SocketAddr,
    path: &str,
    keys: &WrkKeys,
    (conns, seconds): (usize, f64),
    statuses: bool,
) -> WrkRun {
    let dir = tempfile::tempdir().unwrap();
    let lua = dir.path().join("keys.lua");
    std::fs::write(&lua, script(path, keys, statuses)).unwrap();
    // Through a shell that prints its own `/proc/self/stat` after `wrk` ended: its
    // children's CPU time (`cutime`, `cstime`) is then `wrk`'s.
    let out = Command::new("sh")
        .arg("-c")
        .arg("wrk \"$@\" || exit 1; cat /proc/$$/stat")
        .arg("sh")
        .args(["-t1", "--latency", "--timeout", "10s"])
        .arg(format!("-c{conns}"))
        .arg(format!("-d{seconds}s"))
        .arg("-s")
        .arg(&lua)
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&text).unwrap_or_else(|| panic!("cannot read wrk's report:\n{text}"))
}

/// A latency as `wrk` prints it: `812.00us`, `1.20ms`, `2.00s`.
fn duration(v: &str) -> Option<Duration> {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v.strip_suffix('s')?, 1.0)
    };
    Some(Duration::from_secs_f64(num.parse::<f64>().ok()? * scale))
}

fn parse(text: &str) -> Option<WrkRun> {
    let word = |line: &str, i: usize| line.split_whitespace().nth(i).map(str::to_owned);
    let find = |prefix: &str| text.lines().map(str::trim).find(|l| l.starts_with(prefix));
    let percentile = |p: &str| duration(&word(find(p)?, 1)?);
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| word(l, 0)?.parse().ok())?;
    let non_2xx: u64 = find("Non-2xx or 3xx responses:")
        .and_then(|l| word(l, 4)?.parse().ok())
        .unwrap_or(0);
    // "Socket errors: connect 0, read 0, write 0, timeout 0"
    let socket: u64 = find("Socket errors:").map_or(0, |l| {
        l.split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    });
    let stat = text.lines().last()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let statuses = text
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("status ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .fold(BTreeMap::new(), |mut m, (code, n): (u16, u64)| {
            *m.entry(code).or_default() += n;
            m
        });
    Some(WrkRun {
        socket_errors: socket,
        statuses,
        requests,
        rate: find("Requests/sec:").and_then(|l| word(l, 1)?.parse().ok())?,
        p50: percentile("50%")?,
        p99: percentile("99%")?,
        errors: non_2xx + socket,
        ticks: f[13].parse::<u64>().ok()? + f[14].parse::<u64>().ok()?,
    })
}
