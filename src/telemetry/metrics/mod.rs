//! Prometheus metrics: counters per route and key outcome, store and upstream figures.
//!
//! The names are a stable interface (`docs/stability.md`): the dashboard in
//! `deploy/grafana/` and the alerts in `deploy/prometheus/` query them, and a test holds
//! both to what a running gateway exports.

mod exposition;
mod handles;

pub use self::exposition::Exposition;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

// Route labels are the routes' own `Arc<str>` names: a label costs a reference count,
// not an allocation, on every request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteOutcome {
    route: Arc<str>,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteWould {
    route: Arc<str>,
    would: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteResult {
    route: Arc<str>,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabel {
    route: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteClass {
    route: Arc<str>,
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventLabel {
    event: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

/// A gauge exported only once it has been set: a gateway without a near-cache exports no
/// `dedupe_near_cache_serving` that an alert would read as "not serving".
#[derive(Debug, Clone, Default)]
struct GaugeOnceSet {
    set: Arc<AtomicBool>,
    gauge: Gauge<i64, AtomicI64>,
}

impl GaugeOnceSet {
    fn set(&self, value: i64) {
        self.gauge.set(value);
        self.set.store(true, Ordering::Relaxed);
    }
}

impl EncodeMetric for GaugeOnceSet {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.gauge.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        !self.set.load(Ordering::Relaxed)
    }
}

/// A claim event an operator watches (`dedupe_claim_events_total{event}`). Every event is
/// exported from the start at 0, so an alert's `increase()` sees the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum ClaimEvent {
    /// A claim took over an expired lease: the write may execute twice.
    Takeover,
    /// A lease renewal was refused: the key was taken over meanwhile.
    RenewalRefused,
    /// A key's outcome is held for an operator (`on_unknown = "hold"`), counted once per
    /// held key.
    OutcomeHeld,
    /// A completion or release was refused: the key was taken over under a newer fence,
    /// so the response reached its client only.
    FencedOut,
    /// A new claim was refused (503 `overloaded`): too many requests whose clients left
    /// are still running.
    Overloaded,
}

impl ClaimEvent {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A store operation (`op` of `dedupe_store_latency_seconds` and
/// `dedupe_store_errors_total`). The errors of every operation are exported from the
/// start at 0, so an alert's `rate()` sees the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum StoreOp {
    /// Claiming a key (or reading its record for a replay).
    Claim,
    /// Renewing a lease while the upstream call runs.
    Renew,
    /// Storing the response.
    Complete,
    /// Freeing the key after a call that had no effect.
    Release,
}

/// How many [`StoreOp`]s there are.
const STORE_OPS: usize = <StoreOp as strum::VariantArray>::VARIANTS.len();

impl StoreOp {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// A duration in milliseconds with at most three decimals (whole microseconds), so log
/// lines read `1.058`, not the float noise `1.0576780000000001`.
pub fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// Every metric the gateway exports, registered once.
pub struct Metrics {
    registry: Registry,
    outcomes: Family<RouteOutcome, Counter>,
    shadow: Family<RouteWould, Counter>,
    signatures: Family<RouteResult, Counter>,
    store_errors: Family<OpLabel, Counter>,
    events: Family<EventLabel, Counter>,
    upstream_responses: Family<RouteClass, Counter>,
    upstream_latency: Family<RouteLabel, Histogram, fn() -> Histogram>,
    store_latency: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// The metrics above that every request touches, each looked up once.
    kept: handles::Kept,
    inflight: Gauge<i64, AtomicI64>,
    near_cache: Family<NearLabel, Counter>,
    near_cache_bytes: Gauge<i64, AtomicI64>,
    near_cache_serving: GaugeOnceSet,
    store_up: Gauge<i64, AtomicI64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NearLabel {
    result: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers metrics, each as a handle kept by the registry and returned to the caller.
struct Registering<'a>(&'a mut Registry);

impl Registering<'_> {
    fn add<M: prometheus_client::registry::Metric + Clone>(
        &mut self,
        name: &str,
        help: &str,
        metric: M,
    ) -> M {
        self.0.register(name, help, metric.clone());
        metric
    }
}

/// Every claim event and store operation created at 0: the first event or error is then
/// an increase a rule can see.
fn at_zero(events: &Family<EventLabel, Counter>, store_errors: &Family<OpLabel, Counter>) {
    for event in <ClaimEvent as strum::VariantArray>::VARIANTS {
        let _ = events.get_or_create(&EventLabel {
            event: event.as_str(),
        });
    }
    for op in <StoreOp as strum::VariantArray>::VARIANTS {
        let _ = store_errors.get_or_create(&OpLabel { op: op.as_str() });
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dedupe");
        let mut reg = Registering(&mut registry);
        // Fields in the order the metrics are exposed; the registry last, once filled.
        let metrics = Self {
            outcomes: reg.add(
                "requests",
                "Requests by route and key outcome",
                Family::default(),
            ),
            shadow: reg.add(
                "shadow",
                "Requests a shadow route forwarded, by what enforcement would have done",
                Family::default(),
            ),
            signatures: reg.add(
                "signature",
                "Webhook signatures checked on signed routes, by result (verified, missing, malformed, expired, mismatch)",
                Family::default(),
            ),
            store_errors: reg.add(
                "store_errors",
                "Store operations that failed or timed out",
                Family::default(),
            ),
            events: reg.add(
                "claim_events",
                "Claim events an operator watches: takeover, renewal_refused, outcome_held (once per held key), fenced_out, overloaded",
                Family::default(),
            ),
            upstream_responses: reg.add(
                "upstream_responses",
                "Upstream responses by route and status class",
                Family::default(),
            ),
            upstream_latency: reg.add(
                "upstream_latency_seconds",
                "Time until the upstream's response head",
                Family::new_with_constructor(latency_histogram),
            ),
            store_latency: reg.add(
                "store_latency_seconds",
                "Store operation latency",
                Family::new_with_constructor(latency_histogram),
            ),
            inflight: reg.add(
                "inflight_claims",
                "Claims this process holds while their upstream call runs",
                Gauge::default(),
            ),
            near_cache: reg.add(
                "near_cache",
                "Near-cache lookups by result (hit, miss) and entries dropped (invalidated)",
                Family::default(),
            ),
            near_cache_bytes: reg.add(
                "near_cache_bytes",
                "Bytes of completed records the near-cache holds",
                Gauge::default(),
            ),
            near_cache_serving: reg.add(
                "near_cache_serving",
                "1 while the near-cache's invalidation channel has proved it delivers within the last second (copies are served), 0 while it is silent or lost (replays read Redis); absent without a near-cache",
                GaugeOnceSet::default(),
            ),
            store_up: reg.add(
                "store_up",
                "1 when the store answered a ping at this scrape (as /readyz asks), 0 when it did not",
                Gauge::default(),
            ),
            kept: handles::Kept::default(),
            registry,
        };
        at_zero(&metrics.events, &metrics.store_errors);
        metrics
    }

    /// Creates every series a route counts on at 0 (each outcome and finish; what
    /// enforcement would have done on a shadow route; each signature result on a signed
    /// route), so the first event on a route is an increase a rule can see rather than a
    /// series that begins at 1. At start and after each reload; a route a reload removed
    /// keeps its series (they hold what it counted).
    ///
    /// `outcomes` are every request outcome and finish, `woulds` every name of what
    /// enforcement would have done: the protocol's names, which the caller (above the
    /// protocol in the module order) hands down.
    pub fn routes_at_zero(
        &self,
        routes: &[crate::protocol::route::Route],
        outcomes: &[&'static str],
        woulds: &[&'static str],
    ) {
        for route in routes {
            for &outcome in outcomes {
                let _ = self.outcomes.get_or_create(&RouteOutcome {
                    route: route.name.clone(),
                    outcome,
                });
            }
            if route.mode == crate::protocol::route::Mode::Shadow {
                for &would in woulds {
                    let _ = self.shadow.get_or_create(&RouteWould {
                        route: route.name.clone(),
                        would,
                    });
                }
            }
            if route.verify.is_some() {
                let results = ["verified"].into_iter();
                for result in results.chain(crate::protocol::verify::SignatureError::RESULTS) {
                    let _ = self.signatures.get_or_create(&RouteResult {
                        route: route.name.clone(),
                        result,
                    });
                }
            }
        }
    }

    /// Counts one request outcome, or what became of a won claim, on a route (`-` for no
    /// route). The labels are the names of [`crate::dedupe::Outcome`] and
    /// [`crate::dedupe::Finish`].
    pub fn outcome(&self, route: &Arc<str>, outcome: &'static str) {
        let find = || {
            let label = RouteOutcome {
                route: route.clone(),
                outcome,
            };
            self.outcomes.get_or_create(&label).clone()
        };
        self.kept.outcomes.with(route, outcome, find, |c| {
            c.inc();
        });
    }

    /// Counts a request a shadow route forwarded, by what enforcement would have done (the
    /// names of [`crate::dedupe::Would`]).
    pub fn shadow(&self, route: &Arc<str>, would: &'static str) {
        self.shadow
            .get_or_create(&RouteWould {
                route: route.clone(),
                would,
            })
            .inc();
    }

    /// Counts a webhook signature check on a signed route: `verified`, or why not (the
    /// names of [`crate::protocol::verify::SignatureError::result`]).
    pub fn signature(&self, route: &Arc<str>, result: &'static str) {
        self.signatures
            .get_or_create(&RouteResult {
                route: route.clone(),
                result,
            })
            .inc();
    }

    /// Records a store operation's latency, and counts it when it failed.
    pub fn store_op(&self, op: StoreOp, took: Duration, ok: bool) {
        let latency = self.kept.op_latency[op as usize].get_or_init(|| {
            let label = OpLabel { op: op.as_str() };
            self.store_latency.get_or_create(&label).clone()
        });
        latency.observe(took.as_secs_f64());
        let op = op.as_str();
        if !ok {
            self.store_errors.get_or_create(&OpLabel { op }).inc();
        }
    }

    /// Counts a claim event.
    pub fn event(&self, event: ClaimEvent) {
        self.events
            .get_or_create(&EventLabel {
                event: event.as_str(),
            })
            .inc();
    }

    /// Whether the store answered the ping made for this scrape.
    pub fn store_up(&self, up: bool) {
        self.store_up.set(i64::from(up));
    }

    /// Records an upstream response head.
    pub fn upstream(&self, route: &Arc<str>, status: u16, took: Duration) {
        let class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        let responses = || {
            let label = RouteClass {
                route: route.clone(),
                class,
            };
            self.upstream_responses.get_or_create(&label).clone()
        };
        self.kept.responses.with(route, class, responses, |c| {
            c.inc();
        });
        let latency = || {
            let label = RouteLabel {
                route: route.clone(),
            };
            self.upstream_latency.get_or_create(&label).clone()
        };
        self.kept
            .latency
            .with(route, "", latency, |h| h.observe(took.as_secs_f64()));
    }

    /// A claim is now held by this process.
    pub fn claim_held(&self) -> InflightGuard<'_> {
        self.inflight.inc();
        InflightGuard(&self.inflight)
    }

    /// Takes the near-cache's counters (kept by the store, read at each scrape).
    pub fn near_cache(&self, stats: crate::store::near_cache::NearCacheStats) {
        for (result, n) in [
            ("hit", stats.hits),
            ("miss", stats.misses),
            ("invalidated", stats.invalidations),
        ] {
            self.near_cache
                .get_or_create(&NearLabel { result })
                .inner()
                .store(n, Ordering::Relaxed);
        }
        self.near_cache_bytes
            .set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
        self.near_cache_serving.set(i64::from(stats.serving));
    }

    /// The OpenMetrics exposition.
    pub fn encode(&self) -> String {
        self.exposition(Exposition::OpenMetrics)
    }

    /// The exposition in `format`.
    pub fn exposition(&self, format: Exposition) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        match format {
            Exposition::OpenMetrics => out,
            Exposition::PrometheusText => exposition::prometheus_text(&out),
        }
    }
}

/// Decrements the in-flight gauge when the claim's work ends, however it ends.
pub struct InflightGuard<'a>(&'a Gauge<i64, AtomicI64>);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_counters_by_their_samples_and_has_no_eof() {
        let m = Metrics::new();
        m.outcome(&Arc::from("orders"), "won");
        m.upstream(&Arc::from("orders"), 201, Duration::from_millis(3));
        let open = m.encode();
        assert!(open.contains("# TYPE dedupe_requests counter\n"), "{open}");
        assert!(open.ends_with("# EOF\n"), "{open}");
        let text = m.exposition(Exposition::PrometheusText);
        assert!(
            text.contains("# HELP dedupe_requests_total Requests by route and key outcome.\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE dedupe_requests_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("dedupe_requests_total{route=\"orders\",outcome=\"won\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE dedupe_upstream_latency_seconds histogram\n"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        // Every sample line of one is in the other.
        let samples = |t: &str| {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(samples(&open), samples(&text));
    }

    #[test]
    fn millis_print_without_float_noise() {
        assert_eq!(millis(Duration::from_nanos(1_057_678)).to_string(), "1.057");
        assert_eq!(millis(Duration::from_micros(2_500)).to_string(), "2.5");
        assert_eq!(millis(Duration::from_secs(3)).to_string(), "3000");
    }
}
