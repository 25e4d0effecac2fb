//! `drill --overload`: a gateway built from the configuration, with an admission limit of
//! its own set low ([`OVERLOAD_LIMIT`]), driven past it at a capped rate for a few
//! seconds (so a store that live gateways share is never saturated): every request it
//! refuses must have been refused before its claim (no record, no upstream call), every
//! request it admits executed once, nothing may be left unstored, and a refused request's
//! retry must execute once. Only on request, and only with the drill's own upstream.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::super::client::Reply;
use super::super::request::{self, DrillRequest, Marks};
use super::{evidence, start_gateway, Rig, Verdict};
use crate::edge::problem::GatewayError;
use crate::edge::Gateway;
use crate::protocol::route::Route;

/// The drill gateway's `server.max_concurrent_claims`: low, so that a burst passes it.
pub const OVERLOAD_LIMIT: usize = 2;
/// Requests sent at once, each with a key of its own.
pub const OVERLOAD_BURST: usize = 16;
/// One burst at most this often: at most 320 requests a second.
pub const OVERLOAD_EVERY: Duration = Duration::from_millis(50);
/// How long bursts are sent.
pub const OVERLOAD_FOR: Duration = Duration::from_secs(2);
/// How many refused requests are sent again, one at a time.
const RETRIED: usize = 20;

/// What the bursts were answered.
#[derive(Default)]
struct Tally {
    admitted: Vec<DrillRequest>,
    refused: Vec<DrillRequest>,
    /// Neither executed nor refused `overloaded`: their statuses.
    other: Vec<String>,
}

impl Rig<'_> {
    /// The overload drill on route `i`.
    pub(super) async fn overload(&self, route: &Route, i: usize) -> Result<Verdict, String> {
        let mut cfg = self.config.clone();
        cfg.server.max_concurrent_claims = OVERLOAD_LIMIT;
        // Refused at once past the limit, not queued: the drill is about refusals.
        cfg.server.admission_timeout = Duration::ZERO;
        let gateway = Gateway::new(cfg, self.store.clone());
        let (addr, stop, served) = start_gateway(gateway.clone())
            .await
            .map_err(|e| e.to_string())?;
        let base = format!("http://{addr}");
        let tally = self.bursts(&base, route, i).await;
        let mut misplaced = Vec::new();
        for req in &tally.refused {
            let store_key = req.store_key(self.config.store.namespace(), &route.name);
            let claimed = !matches!(self.store.inspect(&store_key).await, Ok(None));
            let called = !self.upstream.effects(&req.key).is_empty();
            if claimed || called {
                misplaced.push(req.key.clone());
            }
        }
        let twice: Vec<String> = (tally.admitted.iter())
            .filter(|r| self.upstream.effects(&r.key).len() != 1)
            .map(|r| r.key.clone())
            .collect();
        let mut retries_failed = Vec::new();
        for req in tally.refused.iter().take(RETRIED) {
            let again = self.send_to(&base, req).await?;
            if !again.not_failed() || self.upstream.effects(&req.key).len() != 1 {
                retries_failed.push(format!("{}: {}", req.key, again.status_text()));
            }
        }
        let unstored = unstored(&gateway, &route.name);
        let _ = stop.send(());
        let _ = served.await;
        let pass = misplaced.is_empty()
            && twice.is_empty()
            && retries_failed.is_empty()
            && tally.other.is_empty()
            && unstored == 0;
        let note = match (pass, tally.refused.is_empty()) {
            (true, true) => Some(format!(
                "the limit of {OVERLOAD_LIMIT} was never passed: the store answered each burst's claims before the next came; nothing was refused"
            )),
            (true, false) => None,
            (false, _) => Some(format!(
                "refused after a claim or a call: {misplaced:?}; admitted but not executed once: {twice:?}; \
                 retries that failed: {retries_failed:?}; other answers: {:?}; unstored: {unstored}",
                tally.other
            )),
        };
        let found = json!({
            "limit": OVERLOAD_LIMIT,
            "sent": tally.admitted.len() + tally.refused.len() + tally.other.len(),
            "admitted": tally.admitted.len(),
            "refused_overloaded": tally.refused.len(),
            "refused_after_claim": misplaced.len(),
            "retried": tally.refused.len().min(RETRIED),
            "unstored": unstored,
        });
        Ok((pass, evidence(found), note))
    }

    /// Bursts of [`OVERLOAD_BURST`] new keys every [`OVERLOAD_EVERY`] for [`OVERLOAD_FOR`].
    async fn bursts(&self, base: &str, route: &Route, i: usize) -> Tally {
        let mut tally = Tally::default();
        let until = Instant::now() + OVERLOAD_FOR;
        let mut n = 0;
        let overloaded = GatewayError::Overloaded;
        while Instant::now() < until {
            let next = Instant::now() + OVERLOAD_EVERY;
            let mut sent = Vec::new();
            for _ in 0..OVERLOAD_BURST {
                let Ok(req) = self.overload_request(i, n) else {
                    continue;
                };
                n += 1;
                let (http, base, r) = (self.http.clone(), base.to_owned(), req.clone());
                sent.push((req, tokio::spawn(async move { http.send(&base, &r).await })));
            }
            for (req, task) in sent {
                match task
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                {
                    Ok(reply) if reply.refused_as(&overloaded, &route.errors) => {
                        tally.refused.push(req)
                    }
                    Ok(reply) if reply.not_failed() => tally.admitted.push(req),
                    Ok(reply) => tally.other.push(shown(&reply)),
                    Err(e) => tally.other.push(e),
                }
            }
            tokio::time::sleep_until(next).await;
        }
        tally
    }

    /// The `n`th request of the drill: a key of its own, noted for the clean-up.
    fn overload_request(&self, i: usize, n: usize) -> Result<DrillRequest, String> {
        let route = &self.config.routes[i];
        let key = format!("drill-{}-{}-overload-{n}", self.run, route.name);
        let tenant = format!("drill-{}", self.run);
        let none = http::HeaderMap::new();
        let marks = Marks {
            key: &key,
            tenant: &tenant,
            headers: &none,
        };
        let req = request::for_route(&self.config.routes, i, &marks)?;
        let store_key = req.store_key(self.config.store.namespace(), &route.name);
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(store_key);
        Ok(req)
    }
}

fn shown(reply: &Reply) -> String {
    reply.status_text()
}

/// The route's `unstored` count on `gateway`.
fn unstored(gateway: &Gateway, route: &str) -> u64 {
    let series = format!("dedupe_requests_total{{route=\"{route}\",outcome=\"unstored\"}} ");
    gateway
        .metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
