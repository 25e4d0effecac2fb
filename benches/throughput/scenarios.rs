//! The scenarios: which server each sends to, with which key, and the gateways behind
//! them. Built once for the bench's own generator (in front of its counting upstream) and
//! once for `wrk` (in front of an nginx origin).

use std::net::SocketAddr;
use std::path::PathBuf;

use dedupe_test_support::{GatewayConfig, RouteCfg, StoreCfg};

use crate::servers::{GatewayChild, Nginx};

pub const DEDUPED: &str = "/v1/payments/charge";

/// The name of [`Scenario::nginx_keyed`]'s row.
pub const NGINX_KEYED: &str = "nginx-keyed";

/// The row scenario `i`'s ratios are taken against, in the same round: nginx carrying the
/// same kind of requests. A gateway's new keys are compared with [`Scenario::nginx_keyed`]
/// where it runs; every other row, that one included, with nginx (row 0).
pub fn baseline(scenarios: &[Scenario], i: usize) -> usize {
    let tls = scenarios.iter().position(|s| s.name == NGINX_TLS);
    if let (Some(t), true) = (tls, scenarios[i].gateway.is_some()) {
        if scenarios[i].name.contains("-tls") {
            return t;
        }
    }
    let keyed = scenarios.iter().position(|s| s.name == NGINX_KEYED);
    let proxy = scenarios[i].gateway.is_some() || scenarios[i].name.starts_with("peer");
    match (proxy, scenarios[i].kind, keyed) {
        (true, Kind::Won, Some(k)) => k,
        _ => 0,
    }
}

/// nginx `proxy_pass` to the origin's TLS listener: the `*-tls` rows' baseline.
pub const NGINX_TLS: &str = "nginx-tls";

/// Whether `BENCH_ONLY` (when set) names scenario `name`.
pub fn wanted(name: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |only| only.split(',').any(|o| o.trim() == name))
}

/// The gateway in front of the origin's TLS listener (`https://localhost:PORT`, its CA in
/// `server.upstream_ca_file`), streaming requests no route matches: `passthrough-tls`.
pub fn tls_passthrough(
    bin: &std::path::Path,
    tls_origin: SocketAddr,
    ca: &std::path::Path,
    idx: usize,
) -> (GatewayChild, Scenario) {
    let config = GatewayConfig::new(format!("https://localhost:{}", tls_origin.port()))
        .upstream_ca_file(ca)
        .max_body("64KiB")
        .upstream_timeout("5s")
        .store(StoreCfg::memory());
    let gw = GatewayChild::gateway(bin, config);
    let s = Scenario::on(&gw, "passthrough-tls".into(), "/other", Kind::Plain, idx);
    (gw, s)
}

/// The collector of the traced rows: nothing listens there, and nothing is sent to it
/// (`sample_ratio = 0`).
const UNSAMPLED_COLLECTOR: &str = "http://127.0.0.1:9";

/// The gateway under test, in front of `upstream`, on `store`.
fn config(upstream: SocketAddr, store: StoreCfg) -> GatewayConfig {
    GatewayConfig::new(format!("http://{upstream}"))
        .max_body("64KiB")
        .upstream_timeout("5s")
        .store(store)
        .default_lease("5s")
        .default_window("1h")
        .route(RouteCfg::header("payments", "/v1/payments/*").required(true))
}

/// What a scenario sends, and what the upstream and the replies must show afterwards.
#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    /// No deduplication: every request is one upstream effect, none replayed.
    Plain,
    /// A fresh key per request: every request is one upstream effect, none replayed.
    Won,
    /// One key, primed by one request first: no further effect, every reply replayed.
    Replay,
}

/// One scenario: where it sends, and which gateway (if any) serves it.
pub struct Scenario {
    pub name: String,
    pub addr: SocketAddr,
    pub path: &'static str,
    pub kind: Kind,
    pub gateway: Option<usize>,
    /// The serving process's id (nginx's master, or the gateway), for a profiler and for
    /// the CPU time it spends per request.
    pub pid: Option<u32>,
    /// The `redis-server` the gateway stores in (process id, port), for the CPU time it
    /// spends per request and how many commands it gets per read.
    pub store_pid: Option<(u32, u16)>,
    /// The gateway's admin listener, for its `unstored` count.
    pub admin: Option<SocketAddr>,
}

/// What the gateways are built from.
pub struct Setup<'a> {
    /// `memory` and, when installed, `redis`, with their store settings.
    pub stores: &'a [(&'static str, StoreCfg)],
    /// This build's binary, and `BENCH_COMPARE`'s with its suffix.
    pub binaries: &'a [(PathBuf, String)],
    /// The Redis server's URL (for the near-cache scenario) and `(pid, port)`.
    pub redis: Option<(String, Option<(u32, u16)>)>,
    /// The encryption key setting for the `*-sealed-*` scenarios.
    pub sealed: &'a [String],
}

impl Scenario {
    /// A server with no deduplication in front of it (nginx, the floor, the upstream).
    pub fn plain(name: &str, addr: SocketAddr, pid: Option<u32>) -> Self {
        Self {
            name: name.into(),
            addr,
            path: DEDUPED,
            kind: Kind::Plain,
            gateway: None,
            pid,
            store_pid: None,
            admin: None,
        }
    }

    /// nginx `proxy_pass` sent what the new-key scenarios send (a key never sent before on
    /// every request): their baseline, so that what `wrk` spends building each request in
    /// Lua counts on both sides of their ratio.
    pub fn nginx_keyed(nginx: &Nginx) -> Self {
        Self {
            kind: Kind::Won,
            ..Self::plain(NGINX_KEYED, nginx.addr, Some(nginx.pid()))
        }
    }

    /// The peer (`BENCH_PEER`) on the gateway's Redis: its path `/URL_ORIGIN`, which it
    /// forwards to the origin.
    pub fn peer(name: &str, peer: &GatewayChild, kind: Kind, redis: Option<(u32, u16)>) -> Self {
        Self {
            path: "/URL_ORIGIN",
            kind,
            store_pid: redis,
            ..Self::plain(name, peer.addr, Some(peer.pid()))
        }
    }

    fn on(gw: &GatewayChild, name: String, path: &'static str, kind: Kind, idx: usize) -> Self {
        Self {
            name,
            addr: gw.addr,
            path,
            kind,
            gateway: Some(idx),
            pid: Some(gw.pid()),
            store_pid: None,
            admin: gw.admin,
        }
    }
}

/// The baseline (nginx, else `direct`), then every gateway scenario in front of
/// `upstream`, filtered by `BENCH_ONLY`. The gateways are kept alive by the caller.
pub fn build(
    upstream: SocketAddr,
    nginx: Option<&Nginx>,
    direct: bool,
    setup: &Setup,
) -> (Vec<GatewayChild>, Vec<Scenario>) {
    let mut gateways: Vec<GatewayChild> = Vec::new();
    let mut scenarios = Vec::new();
    let plain = Scenario::plain;
    if let Some(n) = nginx {
        scenarios.push(plain("nginx", n.addr, Some(n.pid())));
    }
    if direct || nginx.is_none() {
        scenarios.push(plain("direct", upstream, None));
    }
    let redis_pid = setup.redis.as_ref().and_then(|(_, pid)| *pid);
    // This build's gateway, and with `BENCH_COMPARE` another build's binary beside it: the
    // same scenarios, suffixed `@compare`, interleaved in the same rounds, so a change is
    // measured against what it changed on the same machine at the same moments.
    for (bin, suffix) in setup.binaries {
        let first = gateways.len();
        for (name, store) in setup.stores {
            let store_pid = if name.starts_with("redis") {
                redis_pid
            } else {
                None
            };
            for encrypted in [false, true] {
                let (store, name) = match encrypted {
                    false => (store.clone(), (*name).to_owned()),
                    true => (
                        store.clone().encryption_keys(setup.sealed),
                        format!("{name}-sealed"),
                    ),
                };
                if gateways.len() == first {
                    // A gateway of its own, so its memory is that of streaming with nothing
                    // stored.
                    let gw = GatewayChild::gateway(bin, config(upstream, store.clone()));
                    let name = format!("passthrough{suffix}");
                    scenarios.push(Scenario::on(&gw, name, "/other", Kind::Plain, first));
                    gateways.push(gw);
                    // The same with traces on (`telemetry.otlp_endpoint`, `sample_ratio = 0`):
                    // every request goes through the tracing layer, none is exported, so the
                    // row measures what turning traces on costs the request path.
                    let traced = config(upstream, store.clone())
                        .telemetry(UNSAMPLED_COLLECTOR, None)
                        .telemetry_sample_ratio(0.0);
                    let gw = GatewayChild::gateway(bin, traced);
                    let name = format!("passthrough-traced{suffix}");
                    let idx = gateways.len();
                    scenarios.push(Scenario::on(&gw, name, "/other", Kind::Plain, idx));
                    gateways.push(gw);
                }
                let gw = GatewayChild::gateway(bin, config(upstream, store));
                let idx = gateways.len();
                for (kind, what) in [(Kind::Won, "won"), (Kind::Replay, "replay")] {
                    let name = format!("{name}-{what}{suffix}");
                    let mut s = Scenario::on(&gw, name, DEDUPED, kind, idx);
                    s.store_pid = store_pid;
                    scenarios.push(s);
                }
                gateways.push(gw);
            }
        }
        if let Some((url, _)) = &setup.redis {
            // Replays on Redis with the near-cache on (`store.near_cache`): served from the
            // gateway's copy, proved fresh by Redis's invalidations.
            let store = StoreCfg::redis(url.clone())
                .timeout("500ms")
                .near_cache("64MiB");
            let gw = GatewayChild::gateway(bin, config(upstream, store));
            let name = format!("redis-cached-replay{suffix}");
            let mut s = Scenario::on(&gw, name, DEDUPED, Kind::Replay, gateways.len());
            s.store_pid = redis_pid;
            scenarios.push(s);
            gateways.push(gw);
        }
    }
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        // The baselines (nginx, `direct`) stay: every ratio is taken against them.
        scenarios
            .retain(|s| s.gateway.is_none() || only.contains(&s.name.trim_end_matches("@compare")));
    }
    (gateways, scenarios)
}
