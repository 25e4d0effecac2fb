//! `drill --target`: replay, race and misuse against a live gateway (through its load
//! balancer), with drill-marked keys. The real upstream executes these requests, so the
//! effects are read from the gateway itself: the record and its fence from the admin API,
//! and `/metrics` deltas. Admin access is checked before anything is sent; afterwards the
//! drill deletes the records it made, and only those, under the fences it saw.

use std::fmt::Write as _;
use std::time::Duration;

use http::HeaderMap;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::client::Http;
use super::local::REPLAY_GAP;
use super::report::{Drill, Outcome, Report};
use super::request::{self, DrillRequest, Marks};
use super::{run_id, DrillError};
use crate::config::Config;
use crate::protocol::key::{KeyRule, RequestPart};
use crate::protocol::route::{Mode, Route};

mod live;

pub use self::live::requests_by_outcome;
use self::live::Live;

/// What `drill --target` runs.
#[derive(Debug, Clone)]
pub struct TargetOptions {
    /// The gateway's public base URL (`http://host:port`).
    pub target: String,
    /// Its admin base URL.
    pub admin: String,
    /// The admin bearer token.
    pub token: Option<String>,
    /// The route to drill.
    pub route: String,
    /// Headers sent with every request (`--header`), over the generated ones.
    pub headers: HeaderMap,
    /// Concurrent requests in the race drill.
    pub race: usize,
}

/// The requests a target run will send, decided before anything is sent.
#[derive(Debug, Clone)]
pub struct Plan {
    route: Route,
    target: String,
    admin: String,
    token: Option<String>,
    race: usize,
    replay: DrillRequest,
    race_req: DrillRequest,
    misuse: DrillRequest,
    misuse_changed: Option<DrillRequest>,
}

/// `http://host[:port]` without a trailing slash; anything else is refused.
fn base_url(flag: &str, url: &str) -> Result<String, DrillError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| DrillError::Usage(format!("{flag}: {url:?} is not a URL")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(DrillError::Usage(format!(
                "{flag}: https is not built in; drill a plain-HTTP address of the gateway (inside the network, or a port-forward)"
            )))
        }
        _ => {
            return Err(DrillError::Usage(format!(
                "{flag}: {url:?} is not an http:// URL"
            )))
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| DrillError::Usage(format!("{flag}: {url:?} has no host")))?;
    Ok(format!("http://{authority}"))
}

impl Plan {
    /// Builds the requests for `opts.route` of `config` (the configuration the target
    /// runs: its key rule and scope decide what the requests look like).
    pub fn new(config: &Config, opts: &TargetOptions) -> Result<Self, DrillError> {
        let i = super::select_routes(&config.routes, std::slice::from_ref(&opts.route))?[0];
        let route = config.routes[i].clone();
        if route.mode != Mode::Enforce {
            return Err(DrillError::Usage(format!(
                "--route {}: skipped: mode = {}: the route does not enforce dedupe, so every drill \
                 would fail by design; drill it once it runs with mode = \"enforce\"",
                route.name,
                route.mode.as_str()
            )));
        }
        refuse_key_headers(&route, &opts.headers)?;
        let run = run_id();
        let tenant = format!("drill-{run}");
        let gen = |drill: Drill| {
            request::for_route(
                &config.routes,
                i,
                &Marks {
                    key: &format!("drill-{run}-{}-{}", route.name, drill.as_str()),
                    tenant: &tenant,
                    headers: &opts.headers,
                },
            )
            .map_err(|message| DrillError::Request {
                route: route.name.to_string(),
                message,
            })
        };
        let misuse = gen(Drill::Misuse)?;
        Ok(Self {
            target: base_url("--target", &opts.target)?,
            admin: base_url("--admin", &opts.admin)?,
            token: opts.token.clone(),
            race: opts.race.max(2),
            replay: gen(Drill::Replay)?,
            race_req: gen(Drill::Race)?,
            misuse_changed: request::misuse(&route, &misuse),
            misuse,
            route,
        })
    }

    /// Exactly what will be sent, for a person to read before `--yes`.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let show = |out: &mut String, what: &str, req: &DrillRequest| {
            let _ = writeln!(
                out,
                "  {what}: {} {}{}",
                req.method,
                self.target,
                req.path_and_query()
            );
            for (name, value) in &req.headers {
                let _ = writeln!(
                    out,
                    "      {name}: {}",
                    value.to_str().unwrap_or("<binary>")
                );
            }
            // A gRPC call's message is shown without its 5-byte prefix.
            let body = match self.route.grpc {
                true => super::grpc::message(&req.body).unwrap_or_default(),
                false => &req.body[..],
            };
            let grpc = if self.route.grpc {
                " (gRPC message)"
            } else {
                ""
            };
            let _ = writeln!(out, "      body{grpc}: {}", String::from_utf8_lossy(body));
        };
        let _ = writeln!(
            out,
            "drill --target will send these requests to the real upstream behind route {}:",
            self.route.name
        );
        show(
            &mut out,
            &format!("replay: twice, {} ms apart", REPLAY_GAP.as_millis()),
            &self.replay,
        );
        show(
            &mut out,
            &format!("race: {} at once", self.race),
            &self.race_req,
        );
        show(
            &mut out,
            "misuse: once, then again at the end",
            &self.misuse,
        );
        match &self.misuse_changed {
            Some(m) => show(
                &mut out,
                "misuse: the same key with a changed request (expects 422)",
                m,
            ),
            None => {
                let _ = writeln!(
                    out,
                    "  misuse: not applicable (the key covers the whole request)"
                );
            }
        }
        let _ = writeln!(
            out,
            "and read and then delete these records on {}: GET /metrics, GET and DELETE /keys/{}/{{key}}?scope=... for the keys {}, {}, {}",
            self.admin,
            self.route.name,
            self.replay.key,
            self.race_req.key,
            self.misuse.key
        );
        out
    }
}

/// Refuses a `--header` that would replace what the drill generates to make its keys its
/// own: the key header, a fingerprinted header, an ordered route's entity or version. The
/// drill never sends a key it did not generate: a real client's key would make the drill's
/// clean-up delete that client's record, and its retry execute again.
fn refuse_key_headers(route: &Route, headers: &HeaderMap) -> Result<(), DrillError> {
    let mut generated: Vec<&RequestPart> = match &route.key {
        KeyRule::Header { .. } => Vec::new(),
        KeyRule::Fingerprint(parts) => parts.iter().collect(),
    };
    if let Some(order) = &route.order {
        generated.extend([&order.entity, &order.version]);
    }
    let key_headers: Vec<&http::HeaderName> = match &route.key {
        KeyRule::Header { name, alias, .. } => std::iter::once(name).chain(alias).collect(),
        KeyRule::Fingerprint(_) => Vec::new(),
    };
    let named = generated
        .into_iter()
        .filter_map(|p| match p {
            RequestPart::Header(name) => Some(name),
            _ => None,
        })
        .chain(key_headers);
    for name in named {
        if headers.contains_key(name) {
            return Err(DrillError::Usage(format!(
                "--header {name}: route {} derives its key (or order) from this header; the drill \
                 sends only keys it generated, so it never touches a real client's record",
                route.name
            )));
        }
    }
    Ok(())
}

/// Runs the plan against the live gateway and deletes its records. Refused before any
/// request is sent when the admin API does not answer with the token (the clean-up could
/// not run) or a drill key already has a record.
pub async fn run(plan: &Plan) -> Result<Report, DrillError> {
    let live = Live {
        plan,
        http: Http::new(Duration::from_secs(60)),
        seen: Default::default(),
    };
    live.preflight().await.map_err(DrillError::Preflight)?;
    let mut setup = Map::new();
    setup.insert("target".into(), plan.target.clone().into());
    setup.insert("admin".into(), plan.admin.clone().into());
    setup.insert("route".into(), plan.route.name.to_string().into());
    let mut report = Report {
        mode: "target",
        setup,
        store: None,
        drills: Vec::new(),
        cleanup: None,
        pass: false,
    };
    let before = live.metrics().await;
    for drill in [Drill::Replay, Drill::Race, Drill::Misuse] {
        let started = Instant::now();
        let result = match drill {
            Drill::Replay => live.replay().await,
            Drill::Race => live.race().await,
            _ => live.misuse().await,
        };
        let (pass, evidence, note) = result.unwrap_or_else(|e| (false, Map::new(), Some(e)));
        report.drills.push(Outcome {
            route: plan.route.name.to_string(),
            drill,
            pass,
            evidence,
            note,
            millis: started.elapsed().as_millis() as u64,
            skipped: false,
        });
    }
    let after = live.metrics().await;
    // Informational: a pool behind a load balancer has one set of counters per gateway,
    // and real traffic counts too.
    let delta = match (before, after) {
        (Ok(b), Ok(a)) => Value::Object(
            a.iter()
                .map(|(k, v)| (k.clone(), json!(v - b.get(k).copied().unwrap_or(0.0))))
                .filter(|(_, d)| d.as_f64() != Some(0.0))
                .collect(),
        ),
        (Err(e), _) | (_, Err(e)) => Value::String(e),
    };
    report.setup.insert("metrics_delta".into(), delta);
    report.cleanup = Some(live.cleanup().await);
    Ok(report.finish())
}

#[cfg(test)]
mod tests;
