//! What `/metrics` shows of overload: the adaptive admission limit, the keyed requests it admitted
//! whose claim is not answered yet, those waiting for a place, and the bytes buffered bodies hold.
//! Set at each scrape from the gateway's own counts.

use std::sync::atomic::AtomicI64;

use prometheus_client::metrics::gauge::Gauge;

use super::Registering;

/// What the gateway's admission holds at a scrape (see [`super::Metrics::admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLoad {
    /// The adaptive admission limit now.
    pub limit: usize,
    /// Keyed requests admitted whose claim is not answered yet.
    pub claiming: usize,
    /// Keyed requests waiting for a place under the limit.
    pub waiting: usize,
    /// Bytes held by buffered bodies.
    pub buffered_bytes: u64,
}

/// `dedupe_admission_limit`, `dedupe_admission_claiming`, `dedupe_admission_waiting`,
/// `dedupe_buffered_bytes`.
pub(super) struct AdmissionGauges {
    limit: Gauge<i64, AtomicI64>,
    claiming: Gauge<i64, AtomicI64>,
    waiting: Gauge<i64, AtomicI64>,
    buffered_bytes: Gauge<i64, AtomicI64>,
}

impl AdmissionGauges {
    pub(super) fn register(reg: &mut Registering<'_>) -> Self {
        Self {
            limit: reg.add(
                "admission_limit",
                "The adaptive admission limit: keyed requests that may await their claim's answer at once (at most server.max_concurrent_claims)",
                Gauge::default(),
            ),
            claiming: reg.add(
                "admission_claiming",
                "Keyed requests admitted whose claim is not answered yet",
                Gauge::default(),
            ),
            waiting: reg.add(
                "admission_waiting",
                "Keyed requests waiting for a place under the admission limit (at most server.admission_timeout each)",
                Gauge::default(),
            ),
            buffered_bytes: reg.add(
                "buffered_bytes",
                "Bytes keyed requests hold in buffered bodies and room for their answers (at most server.max_buffered_bytes)",
                Gauge::default(),
            ),
        }
    }

    pub(super) fn set(&self, load: AdmissionLoad) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.limit.set(gauge(load.limit as u64));
        self.claiming.set(gauge(load.claiming as u64));
        self.waiting.set(gauge(load.waiting as u64));
        self.buffered_bytes.set(gauge(load.buffered_bytes));
    }
}
