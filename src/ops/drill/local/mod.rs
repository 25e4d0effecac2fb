//! `drill --config`: the five drills per route against the real gateway code served in
//! this process, on the user's own store (under a key prefix of the drill's own), with
//! the counting upstream in place of theirs.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::client::{Http, Race, Reply};
use super::report::{Cleanup, Drill, Outcome, Report, StoreCheck};
use super::request::{self, DrillRequest, Marks};
use super::upstream::CountingUpstream;
use super::{run_id, DrillError};
use crate::config::{Config, StoreBackend, UpstreamHttp2, UpstreamTarget};
use crate::edge::problem::GatewayError;
use crate::edge::server::{serve, Listeners};
use crate::edge::Gateway;
use crate::protocol::route::{Dialect, Mode, OnConflict, OnUnknown, Route};
use crate::store::{Fence, Resolution, Store, StoreKey};

mod crash;

/// The pause between a request and its retry in the replay drill: a sender retrying at
/// once, not a dedupe window of a few milliseconds.
pub const REPLAY_GAP: Duration = Duration::from_millis(100);
/// How long the race drill's winner stays in flight, so its duplicates overlap it.
pub const RACE_HOLD: Duration = Duration::from_millis(300);

/// What `drill --config` runs.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Only these routes (empty: every route).
    pub routes: Vec<String>,
    /// The lease every route gets for the drill, so the crash drill takes seconds.
    pub lease: Duration,
    /// Concurrent requests in the race drill.
    pub race: usize,
}

/// Runs the store checks and the drills. `Err` only when the drill cannot start (an
/// unknown route, a port it cannot bind); a failed check or drill is in the report.
pub async fn run(config: Config, opts: &LocalOptions) -> Result<Report, DrillError> {
    let selected = super::select_routes(&config.routes, &opts.routes)?;
    let run = run_id();
    let upstream = CountingUpstream::start().await.map_err(DrillError::Bind)?;
    let cfg = drill_config(config, &run, opts.lease, upstream.addr())?;
    let store = Store::from_config(&cfg.store).map_err(|e| DrillError::Store(e.to_string()))?;

    let mut setup = Map::new();
    setup.insert("backend".into(), cfg.store.backend.kind().as_str().into());
    setup.insert("prefix".into(), cfg.store.prefix.clone().into());
    setup.insert(
        "lease".into(),
        crate::config::format_duration(opts.lease)
            .to_string()
            .into(),
    );
    setup.insert("race".into(), opts.race.into());
    let mut report = Report {
        mode: "config",
        setup,
        store: None,
        drills: Vec::new(),
        cleanup: None,
        pass: false,
    };

    let patience = (cfg.store.timeout * 4).max(Duration::from_secs(2));
    let checked = match tokio::time::timeout(patience, store.health_findings()).await {
        Ok(Ok(f)) => Ok(f),
        Ok(Err(e)) => Err(format!("the store does not answer: {e}")),
        Err(_) => Err(format!("the store does not answer within {patience:?}")),
    };
    let reachable = checked.is_ok();
    report.store = Some(StoreCheck::new(store.backend_name(), checked));
    if !reachable {
        return Ok(report.finish());
    }

    let (addr, stop, served) = start_gateway(&cfg, &store).await?;
    let longest_wait = cfg
        .routes
        .iter()
        .map(|r| r.conflict_wait)
        .max()
        .unwrap_or_default();
    let rig = Rig {
        http: Http::new(longest_wait + opts.lease + Duration::from_secs(30)),
        base: format!("http://{addr}"),
        upstream,
        config: &cfg,
        store: &store,
        run: &run,
        lease: opts.lease,
        race: opts.race.max(2),
        made: Mutex::new(Vec::new()),
    };
    for &i in &selected {
        report.drills.extend(rig.drill_route(i).await);
    }
    report.cleanup = Some(rig.cleanup().await);
    let _ = stop.send(());
    let _ = served.await;
    Ok(report.finish())
}

/// Serves `cfg` in this process on a loopback port: its address, the sender that stops
/// it, and its task.
async fn start_gateway(
    cfg: &Config,
    store: &Store,
) -> Result<
    (
        std::net::SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    DrillError,
> {
    let gateway = Gateway::new(cfg.clone(), store.clone());
    let public = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(DrillError::Bind)?;
    let addr = public.local_addr().map_err(DrillError::Bind)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(serve(
        gateway,
        // The drill talks plain HTTP on loopback, whatever the user's listener speaks.
        Listeners {
            public,
            admin: None,
            tls: None,
        },
        async move {
            let _ = stopped.await;
        },
    ));
    Ok((addr, stop, served))
}

/// The user's configuration, pointed at the counting upstream, under a key prefix of the
/// drill's own and with the drill's lease on every route.
fn drill_config(
    mut cfg: Config,
    run: &str,
    lease: Duration,
    upstream: SocketAddr,
) -> Result<Config, DrillError> {
    cfg.store.prefix = format!("{}-drill-{run}", cfg.store.prefix);
    if cfg.server.upstream.scheme == http::uri::Scheme::HTTPS {
        // ALPN offers h2 to an https:// upstream; the h2c stand-in needs it said.
        cfg.server.upstream_http2 = UpstreamHttp2::Grpc;
    }
    cfg.server.upstream = UpstreamTarget {
        scheme: http::uri::Scheme::HTTP,
        authority: upstream
            .to_string()
            .parse()
            .map_err(|e| DrillError::Bind(std::io::Error::other(format!("{e}"))))?,
        base_path: String::new(),
    };
    cfg.server.shutdown_grace = Duration::from_secs(1);
    cfg.admin = None;
    cfg.warnings.clear();
    for r in &mut cfg.routes {
        r.lease = lease;
        // The drill reads the gateway's own answers as problem+json (or, on a gRPC route,
        // as gRPC statuses); their envelope is no part of what it proves.
        if !r.grpc {
            r.errors = Dialect::default();
        }
    }
    Ok(cfg)
}

struct Rig<'a> {
    http: Http,
    base: String,
    upstream: CountingUpstream,
    config: &'a Config,
    store: &'a Store,
    run: &'a str,
    lease: Duration,
    race: usize,
    made: Mutex<Vec<StoreKey>>,
}

fn evidence(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn fence_of(e: Option<&super::upstream::Effect>) -> Value {
    e.and_then(|e| e.fence).map_or(Value::Null, Value::from)
}

impl Rig<'_> {
    /// Every drill on route `i`, each started clean; none on a route that does not
    /// enforce (a shadow route forwards every duplicate and an off route dedupes nothing:
    /// each drill would fail by design).
    async fn drill_route(&self, i: usize) -> Vec<Outcome> {
        let route = &self.config.routes[i];
        if route.mode != Mode::Enforce {
            return Drill::ALL
                .iter()
                .map(|&d| Outcome::skipped(&route.name, d, route.mode.as_str()))
                .collect();
        }
        let mut outcomes = Vec::new();
        for drill in Drill::ALL {
            let started = Instant::now();
            let mut outcome = match self.drill(i, drill).await {
                Ok(o) => o,
                Err(note) => Outcome {
                    route: route.name.to_string(),
                    drill,
                    pass: false,
                    evidence: Map::new(),
                    note: Some(note),
                    millis: 0,
                    skipped: false,
                },
            };
            outcome.millis = started.elapsed().as_millis() as u64;
            // Drills on a route whose key ignores the marks share a key: start each clean.
            self.forget_made().await;
            outcomes.push(outcome);
        }
        outcomes
    }

    fn request(&self, i: usize, drill: Drill) -> Result<DrillRequest, String> {
        let key = format!(
            "drill-{}-{}-{}",
            self.run,
            self.config.routes[i].name,
            drill.as_str()
        );
        let tenant = format!("drill-{}", self.run);
        let none = http::HeaderMap::new();
        let req = request::for_route(
            &self.config.routes,
            i,
            &Marks {
                key: &key,
                tenant: &tenant,
                headers: &none,
            },
        )?;
        let store_key = req.store_key(self.config.store.namespace(), &self.config.routes[i].name);
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if !made.contains(&store_key) {
            made.push(store_key);
        }
        Ok(req)
    }

    async fn send(&self, req: &DrillRequest) -> Result<Reply, String> {
        self.send_to(&self.base, req).await
    }

    async fn send_to(&self, base: &str, req: &DrillRequest) -> Result<Reply, String> {
        self.http
            .send(base, req)
            .await
            .map_err(|e| format!("{} {}: {e}", req.method, req.path_and_query()))
    }

    async fn drill(&self, i: usize, drill: Drill) -> Result<Outcome, String> {
        let route = &self.config.routes[i];
        let req = self.request(i, drill)?;
        let (pass, evidence, note) = match drill {
            Drill::Replay => self.replay(&req).await?,
            Drill::Lease => self.lease_drill(route, &req).await?,
            Drill::Crash => self.crash(route, &req).await?,
            Drill::Race => self.race_drill(route, &req).await?,
            Drill::Misuse => self.misuse(route, &req).await?,
        };
        Ok(Outcome {
            route: route.name.to_string(),
            drill,
            pass,
            evidence,
            note,
            millis: 0,
            skipped: false,
        })
    }

    async fn replay(&self, req: &DrillRequest) -> Result<Verdict, String> {
        let first = self.send(req).await?;
        tokio::time::sleep(REPLAY_GAP).await;
        let second = self.send(req).await?;
        let effects = self.upstream.effects(&req.key);
        let identical = second.same_answer(&first);
        let pass = effects.len() == 1
            && first.not_failed()
            && !first.replayed()
            && second.replayed()
            && identical;
        let note = (!pass).then(|| {
            if effects.is_empty() {
                let why = match first.status {
                    StatusCode::HTTP_VERSION_NOT_SUPPORTED => ": a gRPC call reached it over HTTP/1.1 (server.upstream_http2 = \"off\")",
                    _ => "",
                };
                format!("the upstream never executed the request{why}; answered {}", first.status_text())
            } else if effects.len() > 1 {
                format!(
                    "the upstream executed the request {} times: the record was gone (or never stored) when the retry came {} ms later; is the window shorter than your senders' retries?",
                    effects.len(),
                    REPLAY_GAP.as_millis()
                )
            } else {
                "the retry was not answered with the stored response".to_owned()
            }
        });
        Ok((
            pass,
            evidence(json!({
                "effects": effects.len(),
                "statuses": [first.shown_status(), second.shown_status()],
                "second_replayed": second.replayed(),
                "byte_identical": identical,
                "differing_headers": second.differing_headers(&first),
                "fence": fence_of(effects.first()),
                "gap_ms": REPLAY_GAP.as_millis() as u64,
            })),
            note,
        ))
    }

    async fn lease_drill(&self, route: &Route, req: &DrillRequest) -> Result<Verdict, String> {
        let hold = self.lease / 4;
        self.upstream.hold_first(&req.key, hold);
        let first = {
            let (http, base, req) = (self.http.clone(), self.base.clone(), req.clone());
            tokio::spawn(async move { http.send(&base, &req).await })
        };
        if !self
            .upstream
            .wait_for(&req.key, 1, Duration::from_secs(5))
            .await
        {
            return Err("the first request never reached the upstream".into());
        }
        let dup = self.send(req).await?;
        let first = first
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the first request: {e}"))?;
        let effects = self.upstream.effects(&req.key);
        let in_flight = GatewayError::Conflict {
            retry_after: Duration::ZERO,
        };
        let conflict = dup.refused_as(&in_flight, &route.errors);
        let answered = match route.on_conflict {
            OnConflict::Reject => conflict,
            // A held duplicate gets the stored answer, or 409 when conflict_wait ran out.
            OnConflict::Wait | OnConflict::Join => {
                (dup.replayed() && dup.same_answer(&first)) || conflict
            }
        };
        let pass = effects.len() == 1 && first.not_failed() && answered;
        let note = (!pass).then(|| match effects.len() {
            1 => format!(
                "the duplicate got {} instead of 409 (ABORTED) or the stored answer",
                dup.status_text()
            ),
            n => format!("the duplicate executed: {n} effects"),
        });
        let retry_after = dup
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map_or(Value::Null, |v| v.into());
        let on_conflict = match route.on_conflict {
            OnConflict::Reject => "reject",
            OnConflict::Wait => "wait",
            OnConflict::Join => "join",
        };
        Ok((
            pass,
            evidence(json!({
                "effects": effects.len(),
                "on_conflict": on_conflict,
                "first_status": first.shown_status(),
                "duplicate_status": dup.shown_status(),
                "duplicate_replayed": dup.replayed(),
                "retry_after": retry_after,
                "held_ms": hold.as_millis() as u64,
                "duplicate_ms": dup.took.as_millis() as u64,
            })),
            note,
        ))
    }

    async fn race_drill(&self, route: &Route, req: &DrillRequest) -> Result<Verdict, String> {
        self.upstream.hold_first(&req.key, RACE_HOLD);
        let race = Race::run(&self.http, &self.base, req, self.race, &route.errors).await?;
        let effects = self.upstream.effects(&req.key);
        let pass = effects.len() == 1 && race.one_winner();
        let note = (!pass).then(|| {
            format!(
                "{} concurrent requests caused {} effects",
                race.replies.len(),
                effects.len()
            )
        });
        Ok((
            pass,
            evidence(json!({
                "concurrent": race.replies.len(),
                "effects": effects.len(),
                "won": race.executed,
                "replayed": race.replayed,
                "conflict": race.conflicts,
                "fence": fence_of(effects.first()),
            })),
            note,
        ))
    }

    async fn misuse(&self, route: &Route, req: &DrillRequest) -> Result<Verdict, String> {
        let Some(other) = request::misuse(route, req) else {
            return Ok((
                true,
                Map::new(),
                Some("not applicable: the key covers every part of the request hash, so the same key cannot come with a different request".into()),
            ));
        };
        let first = self.send(req).await?;
        let m = self.send(&other).await?;
        let again = self.send(req).await?;
        let effects = self.upstream.effects(&req.key);
        let pass = first.not_failed()
            && m.refused_as(&GatewayError::Mismatch, &route.errors)
            && effects.len() == 1
            && again.replayed()
            && again.same_answer(&first);
        let note = (!pass).then(|| {
            format!(
                "the changed request got {} with {} effects",
                m.status_text(),
                effects.len()
            )
        });
        Ok((
            pass,
            evidence(json!({
                "effects": effects.len(),
                "first_status": first.shown_status(),
                "changed_request_status": m.shown_status(),
                "original_again_replayed": again.replayed(),
            })),
            note,
        ))
    }

    async fn forget_made(&self) -> usize {
        let made: Vec<StoreKey> = self.made.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut n = 0;
        for k in &made {
            if matches!(self.store.forget(k).await, Ok(true)) {
                n += 1;
            }
        }
        n
    }

    async fn cleanup(&self) -> Cleanup {
        self.forget_made().await;
        let made: Vec<StoreKey> = self.made.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut left = Vec::new();
        for k in &made {
            if !matches!(self.store.inspect(k).await, Ok(None)) {
                left.push(k.as_str().to_owned());
            }
        }
        Cleanup {
            deleted: made.len() - left.len(),
            left,
        }
    }
}

/// Pass, evidence, note.
type Verdict = (bool, Map<String, Value>, Option<String>);
