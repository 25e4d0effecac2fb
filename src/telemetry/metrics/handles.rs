//! Route-labelled metrics found by address, not by their labels' text.
//!
//! A family finds a metric by hashing its label set (the route's name and a label's
//! text, SipHash) under its lock: three lookups, about 1,000 instructions of a streamed
//! request's 42,000. Here each metric is looked up in its family once and kept, by the
//! addresses of the route's name and of the static label: hashing two words. The entry
//! holds the name, so its address names it while the entry lives; a name that was never
//! seen (a new route after a reload) is looked up once more, and the cache is emptied at
//! [`MOST`] entries (reloads leave old names in it). The metric kept is the family's own
//! (a counter or histogram shares its value with its clones), so what is exported never
//! depends on the cache.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::STORE_OPS;

/// The most entries kept before the cache starts over: every label of a few thousand
/// routes (about 20 outcome labels a route), a few MiB.
const MOST: usize = 1 << 16;

/// The addresses and length that name an entry: the route's name, the label's text.
type Key = (usize, usize, usize);

/// Each entry's metric, with the route name whose address its key holds.
type Entries<M> = HashMap<Key, (Arc<str>, M), BuildHasherDefault<AddressHasher>>;

/// The metrics every request touches, each found in its family once.
#[derive(Default)]
pub(super) struct Kept {
    /// `requests` by route and outcome.
    pub outcomes: ByRoute<Counter>,
    /// `upstream_responses` by route and status class.
    pub responses: ByRoute<Counter>,
    /// `upstream_latency_seconds` by route (the label is empty).
    pub latency: ByRoute<Histogram>,
    /// `store_latency_seconds` by [`super::StoreOp`] (its discriminant).
    pub op_latency: [OnceLock<Histogram>; STORE_OPS],
}

/// One family's metrics by route and static label.
pub(super) struct ByRoute<M> {
    map: RwLock<Entries<M>>,
}

impl<M> Default for ByRoute<M> {
    fn default() -> Self {
        Self {
            map: RwLock::default(),
        }
    }
}

impl<M: Clone> ByRoute<M> {
    /// Runs `act` on the metric for `route` and `label`, found in its family by `find`
    /// the first time.
    pub fn with(
        &self,
        route: &Arc<str>,
        label: &'static str,
        find: impl FnOnce() -> M,
        act: impl FnOnce(&M),
    ) {
        let key = (
            Arc::as_ptr(route).cast::<u8>() as usize,
            label.as_ptr() as usize,
            label.len(),
        );
        if let Some((_, metric)) = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return act(metric);
        }
        let metric = find();
        act(&metric);
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MOST {
            map.clear();
        }
        map.insert(key, (route.clone(), metric));
    }
}

/// Hashes words the way `FxHash` does: addresses need no protection against chosen
/// collisions (no client chooses them), only spreading.
#[derive(Default)]
pub(super) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::family::Family;

    use super::*;

    #[test]
    fn each_route_and_label_counts_on_its_family_s_own_counter() {
        let family = Family::<(String, String), Counter>::default();
        let cache = ByRoute::<Counter>::default();
        let count = |route: &Arc<str>, label: &'static str| {
            cache.with(
                route,
                label,
                || {
                    family
                        .get_or_create(&(route.to_string(), label.to_owned()))
                        .clone()
                },
                |c| {
                    c.inc();
                },
            );
        };
        let a: Arc<str> = Arc::from("a");
        // The same name in another allocation (a reloaded route) counts on the same series.
        let a_again: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        for _ in 0..3 {
            count(&a, "won");
            count(&a_again, "won");
            count(&b, "won");
            count(&a, "replayed");
        }
        let got = |route: &str, label: &str| {
            family
                .get_or_create(&(route.to_owned(), label.to_owned()))
                .get()
        };
        assert_eq!(got("a", "won"), 6);
        assert_eq!(got("b", "won"), 3);
        assert_eq!(got("a", "replayed"), 3);
        assert_eq!(cache.map.read().unwrap().len(), 4);
    }

    #[test]
    fn the_cache_starts_over_when_full_and_still_counts_right() {
        let total = Counter::<u64>::default();
        let cache = ByRoute::<Counter>::default();
        let names: Vec<Arc<str>> = (0..MOST + 10).map(|i| Arc::from(i.to_string())).collect();
        for name in &names {
            cache.with(
                name,
                "won",
                || total.clone(),
                |c| {
                    c.inc();
                },
            );
        }
        assert_eq!(total.get(), (MOST + 10) as u64);
        assert!(cache.map.read().unwrap().len() <= MOST);
    }
}
