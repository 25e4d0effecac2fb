//! The access record: built once from what a request ended as, then counted and logged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use tracing::info;

use crate::dedupe::{Finish, Outcome, Would};
use crate::metrics::{millis, Metrics};
use crate::store::Fence;

/// What one request did, for its access-log line and metrics.
pub(super) struct Access {
    pub started: Instant,
    pub route: Arc<str>,
    pub outcome: Outcome,
    pub finish: Option<Finish>,
    pub fence: Option<Fence>,
    pub upstream: Option<Duration>,
    /// The client's idempotency key (or fingerprint) and its scope hash.
    pub key: Option<(String, String)>,
    /// On a shadow route: what enforcement would have done instead of forwarding.
    pub would: Option<Would>,
}

impl Access {
    /// A request answered without a key: no claim, no fence.
    pub fn keyless(started: Instant, route: Arc<str>, outcome: Outcome) -> Self {
        Self {
            started,
            route,
            outcome,
            finish: None,
            fence: None,
            upstream: None,
            key: None,
            would: None,
        }
    }

    /// Counts the request and writes its access-log line: once per request.
    pub fn account(&self, metrics: &Metrics, status: StatusCode, span: &tracing::Span) {
        metrics.outcome(&self.route, self.outcome.as_str());
        if let Some(finish) = self.finish.filter(|f| *f != Finish::Completed) {
            metrics.outcome(&self.route, finish.as_str());
        }
        if let Some(would) = self.would {
            metrics.shadow(&self.route, would.as_str());
        }
        let route: &str = &self.route;
        let outcome = self.outcome.as_str();
        let (key, scope) = match &self.key {
            Some((key, scope)) => (Some(key.as_str()), Some(scope.as_str())),
            None => (None, None),
        };
        span.in_scope(|| {
            info!(
                target: "dedupe_gateway::access",
                route,
                outcome,
                finish = self.finish.map(Finish::as_str),
                would = self.would.map(Would::as_str),
                status = status.as_u16(),
                fence = self.fence.map(Fence::get),
                upstream_ms = self.upstream.map(millis),
                total_ms = millis(self.started.elapsed()),
                key,
                scope,
                "request"
            )
        });
    }
}
