//! The budget of buffered bodies (`server.max_buffered_bytes`): one count, for the whole
//! gateway, of the bytes that keyed requests hold in memory. Without it they are bounded
//! only by connections × streams × `max_body`, and a gateway killed for memory loses every
//! claim in flight: each of those retries runs again once its lease ends.
//!
//! A keyed request counts its body as it is read, and before its claim the room its answer
//! may take while it is kept for the store (its route's `max_cached_body`); it gives both
//! back when its task ends. Past the budget, it is refused `overloaded` before its claim.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The bytes held now, against a budget each caller passes (the live configuration's, so
/// that a reload applies it).
#[derive(Debug, Default)]
pub(super) struct Budget {
    held: AtomicU64,
}

impl Budget {
    /// The bytes held now.
    pub(super) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// Bytes one request holds against the budget, given back when dropped.
#[derive(Debug)]
pub(super) struct Held {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Held {
    /// Nothing held yet.
    pub(super) fn none(budget: &Arc<Budget>) -> Self {
        Self {
            budget: budget.clone(),
            bytes: 0,
        }
    }

    /// Holds `more` bytes besides, if they fit within `limit` with everything held; false
    /// (and nothing taken) if they do not.
    pub(super) fn grow(&mut self, more: u64, limit: u64) -> bool {
        let taken = self
            .budget
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|&after| after <= limit)
            });
        if taken.is_ok() {
            self.bytes += more;
        }
        taken.is_ok()
    }

    /// The bytes this request holds.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_past_the_budget_are_refused_and_given_back_when_dropped() {
        let budget = Arc::new(Budget::default());
        let mut a = Held::none(&budget);
        assert!(a.grow(600, 1_000));
        let mut b = Held::none(&budget);
        assert!(!b.grow(500, 1_000), "600 + 500 > 1,000");
        assert_eq!((budget.held(), b.bytes()), (600, 0));
        assert!(b.grow(400, 1_000));
        assert!(!a.grow(1, 1_000));
        drop(a);
        assert_eq!(budget.held(), 400);
        assert!(b.grow(600, 1_000));
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_lower_budget_after_a_reload_refuses_until_enough_is_given_back() {
        let budget = Arc::new(Budget::default());
        let mut a = Held::none(&budget);
        assert!(a.grow(800, 1_000));
        let mut b = Held::none(&budget);
        assert!(!b.grow(1, 500));
        drop(a);
        assert!(b.grow(1, 500));
    }
}
