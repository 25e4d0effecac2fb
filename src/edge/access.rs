//! The access record: built once from what a request ended as, then counted and logged.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{Method, StatusCode, Uri};
use tracing::Instrument;

use crate::dedupe::{Finish, Outcome, Would};
use crate::store::Fence;
use crate::telemetry::log::{self, AccessLine};
use crate::telemetry::metrics::{millis, Metrics};
use crate::telemetry::traces;

/// The request as it arrived, for its access line; and its span, for every other event.
#[derive(Clone)]
pub(super) struct Origin {
    pub span: tracing::Span,
    /// The request's trace span, when traces are exported ([`crate::telemetry::traces`]).
    pub trace: tracing::Span,
    pub method: Method,
    /// The target as sent, before normalisation: the line shows what the client asked.
    pub uri: Uri,
}

impl Origin {
    /// Runs `work` in the request's spans: the trace's (entered, so that the claim, upstream
    /// and completion spans hang under it) and the log's within it. Off, both are
    /// [`tracing::Span::none`], whose enter and exit are a branch each.
    pub fn run_in<F: std::future::Future>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        work.instrument(self.span.clone())
            .instrument(self.trace.clone())
    }

    pub fn of<B>(req: &http::Request<B>) -> Self {
        // At debug: a span at info cost 1-2 µs per request (the registry's slot and the
        // fields formatted as JSON when it opens, whether or not any line is logged in it),
        // 4-8% of a streamed request (`benches/throughput`, same rounds). Lines logged
        // inside a request say what they are about (route, store key, fence), and the
        // request's access line follows with method and path;
        // `RUST_LOG=info,dedupe_gateway::edge=debug` puts the span back on them.
        let trace = traces::request(req.method(), req.uri().path(), req.headers());
        // Under the trace span, so that spans made inside either have it as their root.
        let span = trace.in_scope(
            || tracing::debug_span!("request", method = %req.method(), path = %req.uri().path()),
        );
        Self {
            span,
            trace,
            method: req.method().clone(),
            uri: req.uri().clone(),
        }
    }
}

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
    pub fn account(&self, metrics: &Metrics, status: StatusCode, origin: &Origin) {
        metrics.outcome(&self.route, self.outcome.as_str());
        if let Some(finish) = self.finish.filter(|f| *f != Finish::Completed) {
            metrics.outcome(&self.route, finish.as_str());
        }
        if let Some(would) = self.would {
            metrics.shadow(&self.route, would.as_str());
        }
        if !origin.trace.is_none() {
            let ending = traces::Ending {
                route: &self.route,
                outcome: self.outcome.as_str(),
                finish: self.finish.map(Finish::as_str),
                fence: self.fence.map(Fence::get),
                key: self.key.as_ref().map(|(k, s)| (k.as_str(), s.as_str())),
                status: status.as_u16(),
            };
            traces::end(&origin.trace, &origin.method, &ending);
        }
        log::access(|| AccessLine {
            at: SystemTime::now(),
            method: origin.method.as_str(),
            path: origin.uri.path(),
            route: &self.route,
            outcome: self.outcome.as_str(),
            finish: self.finish.map(Finish::as_str),
            would: self.would.map(Would::as_str),
            status: status.as_u16(),
            fence: self.fence.map(Fence::get),
            upstream_ms: self.upstream.map(millis),
            total_ms: millis(self.started.elapsed()),
            key: self.key.as_ref().map(|(key, _)| key.as_str()),
            scope: self.key.as_ref().map(|(_, scope)| scope.as_str()),
        });
    }
}
