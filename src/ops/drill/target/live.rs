//! The drills against a live gateway: its answers, its records through the admin API and
//! its `/metrics`, and the clean-up of the records the drill made.

use std::collections::BTreeMap;

use http::{Method, StatusCode};
use serde_json::{json, Map, Value};

use super::Plan;
use crate::ops::drill::client::{Http, Race, Reply};
use crate::ops::drill::local::REPLAY_GAP;

/// How long a drill waits for a record to settle after its answer.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
use crate::edge::problem::GatewayError;
use crate::ops::drill::report::Cleanup;
use crate::ops::drill::request::DrillRequest;

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

pub(super) struct Live<'a> {
    pub(super) plan: &'a Plan,
    pub(super) http: Http,
    /// The fence of each record the drill saw under its own keys: the clean-up deletes
    /// only these, under these fences.
    pub(super) seen: std::sync::Mutex<BTreeMap<String, u64>>,
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

    /// The record once the winner's completion has landed (within [`SETTLE_WAIT`]): the
    /// answer may reach the client a moment before its record is stored, so a read right
    /// after it can still find the claim in flight.
    async fn settled(&self, req: &DrillRequest) -> Result<Record, String> {
        let until = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let r = self.record(req).await?.unwrap_or_default();
            if r.state != "in-flight" || tokio::time::Instant::now() >= until {
                return Ok(r);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub(super) async fn metrics(&self) -> Result<BTreeMap<String, f64>, String> {
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

    pub(super) async fn replay(&self) -> Result<Verdict, String> {
        let req = &self.plan.replay;
        let first = self.send(req).await?;
        tokio::time::sleep(REPLAY_GAP).await;
        let second = self.send(req).await?;
        let record = self.record(req).await?.unwrap_or_default();
        let identical = second.same_answer(&first);
        let pass = first.not_failed()
            && !first.replayed()
            && second.replayed()
            && identical
            && record.state == "completed"
            && record.status == Some(first.status.as_u16());
        Ok((
            pass,
            evidence(json!({
                "statuses": [first.shown_status(), second.shown_status()],
                "second_replayed": second.replayed(),
                "byte_identical": identical,
                "differing_headers": second.differing_headers(&first),
                "record": record.state,
                "fence": record.fence,
            })),
            (!pass).then(|| "the retry was not answered with the stored response".to_owned()),
        ))
    }

    pub(super) async fn race(&self) -> Result<Verdict, String> {
        let req = &self.plan.race_req;
        // The route's dialect decides the status of the gateway's refusals.
        let race = Race::run(
            &self.http,
            &self.plan.target,
            req,
            self.plan.race,
            &self.plan.route.errors,
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

    pub(super) async fn misuse(&self) -> Result<Verdict, String> {
        let Some(changed) = &self.plan.misuse_changed else {
            return Ok((
                true,
                Map::new(),
                Some("not applicable: the key covers every part of the request hash".into()),
            ));
        };
        let req = &self.plan.misuse;
        let first = self.send(req).await?;
        let before = self.settled(req).await?;
        let m = self.send(changed).await?;
        let after = self.record(req).await?.unwrap_or_default();
        let again = self.send(req).await?;
        let pass = first.not_failed()
            && m.refused_as(&GatewayError::Mismatch, &self.plan.route.errors)
            && before.state == "completed"
            && after.state == "completed"
            && after.fence == before.fence
            && again.replayed()
            && again.same_answer(&first);
        Ok((
            pass,
            evidence(json!({
                "first_status": first.shown_status(),
                "changed_request_status": m.shown_status(),
                "fence_before": before.fence,
                "fence_after": after.fence,
                "record_before": before.state,
                "record_after": after.state,
                "original_again_replayed": again.replayed(),
                "original_again_identical": again.same_answer(&first),
            })),
            (!pass).then(|| format!("the changed request got {}", m.status_text())),
        ))
    }

    /// Before anything reaches the upstream: the admin API answers with this token (the
    /// clean-up will need it), and none of the drill's keys has a record yet.
    pub(super) async fn preflight(&self) -> Result<(), String> {
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

    pub(super) async fn cleanup(&self) -> Cleanup {
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
