//! `drill --target`: replay, race and misuse against a live gateway (through its load
//! balancer), with drill-marked keys. The real upstream executes these requests, so the
//! effects are read from the gateway itself: the record and its fence from the admin API,
//! and `/metrics` deltas. Admin access is checked before anything is sent; afterwards the
//! drill deletes the records it made, and only those, under the fences it saw.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::client::{Http, Race, Reply};
use super::local::REPLAY_GAP;
use super::report::{Cleanup, Drill, Outcome, Report};
use super::request::{self, DrillRequest, Marks};
use super::{run_id, DrillError};
use crate::config::Config;
use crate::key::{KeyRule, RequestPart};
use crate::problem::GatewayError;
use crate::route::{Mode, Route};

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
            let _ = writeln!(out, "      body: {}", String::from_utf8_lossy(&req.body));
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

/// The admin API's view of a record.
#[derive(Debug, Clone, Default)]
struct Record {
    state: String,
    fence: u64,
    status: Option<u16>,
}

/// `dedupe_requests_total{route,outcome}` for one route, from a `/metrics` page. Pure.
pub fn requests_by_outcome(metrics: &str, route: &str) -> BTreeMap<String, f64> {
    let want = format!("route=\"{route}\"");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("dedupe_requests_total{"))
        .filter_map(|l| {
            let (labels, value) = l.split_once('}')?;
            if !labels.split(',').any(|kv| kv == want) {
                return None;
            }
            let outcome = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix("outcome=\""))?
                .trim_end_matches('"');
            Some((outcome.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

struct Live<'a> {
    plan: &'a Plan,
    http: Http,
    /// The fence of each record the drill saw under its own keys: the clean-up deletes
    /// only these, under these fences.
    seen: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Live<'_> {
    async fn send(&self, req: &DrillRequest) -> Result<Reply, String> {
        self.http
            .send(&self.plan.target, req)
            .await
            .map_err(|e| format!("{} {}: {e}", req.method, req.path_and_query()))
    }

    fn key_url(&self, req: &DrillRequest) -> String {
        let key: String =
            percent_encoding::utf8_percent_encode(&req.key, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        format!(
            "{}/keys/{}/{key}?scope={}",
            self.plan.admin, self.plan.route.name, req.scope
        )
    }

    async fn record(&self, req: &DrillRequest) -> Result<Option<Record>, String> {
        let r = self
            .http
            .admin(Method::GET, &self.key_url(req), self.plan.token.as_deref())
            .await
            .map_err(|e| format!("admin API: {e}"))?;
        match r.status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND
                if String::from_utf8_lossy(&r.body).contains("record-not-found") =>
            {
                return Ok(None)
            }
            s => {
                return Err(format!(
                    "admin API answered {s} for the record: {}",
                    String::from_utf8_lossy(&r.body)
                ))
            }
        }
        let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("admin API: {e}"))?;
        if let Some(fence) = v["fence"].as_u64() {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(req.key.clone(), fence);
        }
        Ok(Some(Record {
            state: v["state"].as_str().unwrap_or_default().to_owned(),
            fence: v["fence"].as_u64().unwrap_or_default(),
            status: v["status"].as_u64().map(|s| s as u16),
        }))
    }

    async fn metrics(&self) -> Result<BTreeMap<String, f64>, String> {
        let url = format!("{}/metrics", self.plan.admin);
        let r = self
            .http
            .admin(Method::GET, &url, self.plan.token.as_deref())
            .await
            .map_err(|e| format!("admin API: {e}"))?;
        if r.status != StatusCode::OK {
            return Err(format!("admin API answered {} for /metrics", r.status));
        }
        Ok(requests_by_outcome(
            &String::from_utf8_lossy(&r.body),
            &self.plan.route.name,
        ))
    }

    async fn replay(&self) -> Result<Verdict, String> {
        let req = &self.plan.replay;
        let first = self.send(req).await?;
        tokio::time::sleep(REPLAY_GAP).await;
        let second = self.send(req).await?;
        let record = self.record(req).await?.unwrap_or_default();
        let identical = second.same_answer(&first);
        let pass = first.status.as_u16() < 500
            && !first.replayed()
            && second.replayed()
            && identical
            && record.state == "completed"
            && record.status == Some(first.status.as_u16());
        Ok((
            pass,
            evidence(json!({
                "statuses": [first.status.as_u16(), second.status.as_u16()],
                "second_replayed": second.replayed(),
                "byte_identical": identical,
                "differing_headers": second.differing_headers(&first),
                "record": record.state,
                "fence": record.fence,
            })),
            (!pass).then(|| "the retry was not answered with the stored response".to_owned()),
        ))
    }

    async fn race(&self) -> Result<Verdict, String> {
        let req = &self.plan.race_req;
        // The route's dialect decides the status of the gateway's refusals.
        let in_flight = GatewayError::Conflict {
            retry_after: Duration::ZERO,
        }
        .status_in(&self.plan.route.errors);
        let race = Race::run(
            &self.http,
            &self.plan.target,
            req,
            self.plan.race,
            in_flight,
        )
        .await?;
        let record = self.record(req).await?.unwrap_or_default();
        let pass = race.one_winner() && record.state == "completed";
        Ok((
            pass,
            evidence(json!({
                "concurrent": race.replies.len(),
                "executed": race.executed,
                "replayed": race.replayed,
                "conflict": race.conflicts,
                "record": record.state,
                "fence": record.fence,
            })),
            (!pass).then(|| {
                format!(
                    "{} of {} concurrent requests were executed",
                    race.executed,
                    race.replies.len()
                )
            }),
        ))
    }

    async fn misuse(&self) -> Result<Verdict, String> {
        let Some(changed) = &self.plan.misuse_changed else {
            return Ok((
                true,
                Map::new(),
                Some("not applicable: the key covers every part of the request hash".into()),
            ));
        };
        let req = &self.plan.misuse;
        let first = self.send(req).await?;
        let before = self.record(req).await?.unwrap_or_default();
        let m = self.send(changed).await?;
        let after = self.record(req).await?.unwrap_or_default();
        let again = self.send(req).await?;
        let pass = first.status.as_u16() < 500
            && m.status == GatewayError::Mismatch.status_in(&self.plan.route.errors)
            && before.state == "completed"
            && after.state == "completed"
            && after.fence == before.fence
            && again.replayed()
            && again.same_answer(&first);
        Ok((
            pass,
            evidence(json!({
                "first_status": first.status.as_u16(),
                "changed_request_status": m.status.as_u16(),
                "fence_before": before.fence,
                "fence_after": after.fence,
                "original_again_replayed": again.replayed(),
            })),
            (!pass).then(|| format!("the changed request got {}", m.status)),
        ))
    }

    /// Before anything reaches the upstream: the admin API answers with this token (the
    /// clean-up will need it), and none of the drill's keys has a record yet.
    async fn preflight(&self) -> Result<(), String> {
        self.metrics().await?;
        for req in [&self.plan.replay, &self.plan.race_req, &self.plan.misuse] {
            if self.record(req).await?.is_some() {
                return Err(format!(
                    "a record already exists under the drill's key {}",
                    req.key
                ));
            }
        }
        Ok(())
    }

    async fn cleanup(&self) -> Cleanup {
        let reqs = [&self.plan.replay, &self.plan.race_req, &self.plan.misuse];
        let mut deleted = 0;
        let mut left = Vec::new();
        for req in reqs {
            let fence = self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&req.key)
                .copied();
            // Only a record the drill saw, under the fence it saw.
            let Some(fence) = fence else {
                if !matches!(self.record(req).await, Ok(None)) {
                    left.push(req.key.clone());
                }
                continue;
            };
            let url = format!("{}&fence={fence}", self.key_url(req));
            if let Ok(r) = self
                .http
                .admin(Method::DELETE, &url, self.plan.token.as_deref())
                .await
            {
                if r.status == StatusCode::NO_CONTENT {
                    deleted += 1;
                }
            }
            if !matches!(self.record(req).await, Ok(None)) {
                left.push(req.key.clone());
            }
        }
        Cleanup { deleted, left }
    }
}

type Verdict = (bool, Map<String, Value>, Option<String>);

fn evidence(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
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
