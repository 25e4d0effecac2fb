//! The gateway's state: the live configuration (swapped whole on reload), the store, the
//! metrics and the tracked request tasks.

use http::HeaderValue;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::task::TaskTracker;

use super::admission::Admission;
use super::budget::Budget;
use super::join::Streams;
use super::recent::RecentLatency;
use crate::config::Config;
use crate::dedupe::Env;
use crate::protocol::seal::Keyring;
use crate::store::{Claimants, Store};
use crate::telemetry::metrics::Metrics;
use crate::upstream::Upstream;

/// What the gateway knows about the client connection a request came on.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The client's IP address as `X-Forwarded-For` names it, rendered once per
    /// connection ([`crate::upstream::client_ip`]).
    pub client_ip: HeaderValue,
    /// Raised when a request head on this connection had both framing headers.
    pub framing: crate::edge::framing::AmbiguousFraming,
}

/// What a reload swaps: the configuration and the upstream client built from it.
pub struct Live {
    /// The validated configuration.
    pub config: Config,
    /// The pooled upstream client.
    pub upstream: Upstream,
    /// What each route's upstream calls took lately (by route index), for `Retry-After`.
    pub(super) recent: Vec<RecentLatency>,
}

impl Live {
    fn new(config: Config) -> Self {
        let upstream = Upstream::new(&config.server);
        let recent = config
            .routes
            .iter()
            .map(|_| RecentLatency::default())
            .collect();
        Self {
            config,
            upstream,
            recent,
        }
    }
}

/// The gateway: reloadable configuration, the store, the metrics.
pub struct Gateway {
    // A request loads the snapshot once and keeps it to its end: a reload never changes
    // the rules under a request half-way.
    live: ArcSwap<Live>,
    pub(super) store: Store,
    // Like the store, fixed at start: a reload that changes the keys waits for a restart.
    keyring: Keyring,
    pub(super) metrics: Metrics,
    pub(super) tasks: TaskTracker,
    pub(super) claimants: Claimants,
    /// The route label of requests that match no route.
    pub(super) no_route: Arc<str>,
    /// Requests whose client hung up while their task still runs.
    pub(super) detached: Arc<AtomicUsize>,
    /// Winners' answers streaming now, for duplicates on `on_conflict = "join"` routes.
    pub(super) streams: Arc<Streams>,
    /// The admission limit: keyed requests between admission and their claim's answer.
    pub(super) admission: Arc<Admission>,
    /// The bytes keyed requests hold in buffered bodies (`server.max_buffered_bytes`).
    pub(super) budget: Arc<Budget>,
    /// When a refusal before the claim was last logged at `warn` (seconds since start):
    /// at most one such line a second, however many are refused.
    pub(super) shed_logged: std::sync::atomic::AtomicU64,
    /// When the gateway was made.
    pub(super) started: std::time::Instant,
}

impl Gateway {
    /// A gateway over a validated config and a store.
    pub fn new(config: Config, store: Store) -> Arc<Self> {
        let keyring = config.store.encryption.clone();
        let metrics = Metrics::new();
        series_at_zero(&metrics, &config.routes);
        Arc::new(Self {
            live: ArcSwap::from_pointee(Live::new(config)),
            store,
            keyring,
            metrics,
            tasks: TaskTracker::new(),
            claimants: Claimants::new(),
            no_route: Arc::from("-"),
            detached: Arc::default(),
            streams: Arc::default(),
            admission: Arc::default(),
            budget: Arc::default(),
            shed_logged: Default::default(),
            started: std::time::Instant::now(),
        })
    }

    /// The configuration in force now.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Applies a new configuration to new requests. Returns the settings that changed but
    /// only take effect after a restart (listeners and store).
    pub fn reload(&self, config: Config) -> Vec<&'static str> {
        let (config, restart) = crate::config::reload::merge(&self.live().config, config);
        series_at_zero(&self.metrics, &config.routes);
        self.live.store(Arc::new(Live::new(config)));
        restart
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The keys that seal and open stored records.
    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Requests past their claim, which shutdown waits for (within the grace period)
    /// even when their clients have hung up.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Requests whose client hung up while their claim's work still runs.
    pub fn detached(&self) -> usize {
        self.detached.load(Ordering::Relaxed)
    }

    /// The admission limit now, the keyed requests it admitted that await their claim's
    /// answer, those waiting for a place, and the bytes held in buffered bodies: what
    /// `/metrics` shows of overload.
    pub fn admission_load(&self) -> crate::telemetry::metrics::AdmissionLoad {
        let ceiling = self.live().config.server.max_concurrent_claims;
        let load = self.admission.load(ceiling);
        crate::telemetry::metrics::AdmissionLoad {
            limit: load.limit,
            claiming: load.claiming,
            waiting: load.waiting,
            buffered_bytes: self.budget.held(),
        }
    }

    /// What the dedupe protocol runs against.
    pub(super) fn env(&self) -> Env<'_> {
        Env {
            store: &self.store,
            metrics: &self.metrics,
            claimants: &self.claimants,
            tasks: &self.tasks,
            keyring: &self.keyring,
        }
    }
}

/// Every route's series at 0 (see [`Metrics::routes_at_zero`]), labelled with the
/// protocol's names.
fn series_at_zero(metrics: &Metrics, routes: &[crate::protocol::route::Route]) {
    use crate::dedupe::{Finish, Outcome, Would};
    use strum::VariantArray;
    let outcomes = Outcome::VARIANTS.iter().map(|o| o.as_str());
    let finishes = Finish::VARIANTS.iter().map(|f| f.as_str());
    let labels: Vec<&'static str> = outcomes.chain(finishes).collect();
    let woulds: Vec<&'static str> = Would::VARIANTS.iter().map(|w| w.as_str()).collect();
    metrics.routes_at_zero(routes, &labels, &woulds);
}
