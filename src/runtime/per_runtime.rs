//! A value kept per runtime: the upstream clients, the Redis links and the kept timers
//! each hold one of these, so that what a runtime's reactor or timer wheel drives is used
//! from that runtime only. A connection opened on a worker is driven by a task on that
//! worker; a call from another runtime would wait for that worker's thread to turn to it.
//!
//! Looking a value up takes no lock: the values filled so far are scanned by runtime id
//! (a handful: the main runtime and one per connection worker). A value is added under a
//! lock, once per runtime.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tokio::runtime::{Handle, Id};

use super::here;
use crate::config::defaults::MAX_WORKERS;

/// The most runtimes given a value of their own: every worker (`server.workers` is
/// bounded by [`MAX_WORKERS`]) and the main runtime. Any further runtime (only seen when
/// a process makes runtimes over and over, as tests do) shares the first value.
const SLOTS: usize = MAX_WORKERS + 1;

/// The runtime a value belongs to; `None`: any runtime without a value of its own (and
/// code outside a runtime).
type Owner = Option<Id>;

/// A `T` per runtime.
pub struct PerRuntime<T> {
    slots: Box<[OnceLock<(Owner, T)>]>,
    filled: AtomicUsize,
    /// Makes the value for a runtime that has none yet; without it, such a runtime uses
    /// the first value.
    make: Option<Box<dyn Fn() -> T + Send + Sync>>,
    adding: Mutex<()>,
}

impl<T> PerRuntime<T> {
    /// None yet: each runtime's value is made by `make` when it first asks.
    pub fn lazy(make: impl Fn() -> T + Send + Sync + 'static) -> Self {
        Self::empty(Some(Box::new(make)))
    }

    /// `first` for any runtime not in `runtimes`, and one made by `make` on each of them
    /// (given its index and handle): made now, none later.
    pub fn made_on(first: T, runtimes: &[Handle], make: impl Fn(usize, &Handle) -> T) -> Self {
        let this = Self::empty(None);
        this.push(None, first);
        for (i, runtime) in runtimes.iter().enumerate() {
            this.push(Some(runtime.id()), make(i, runtime));
        }
        this
    }

    fn empty(make: Option<Box<dyn Fn() -> T + Send + Sync>>) -> Self {
        Self {
            slots: (0..SLOTS).map(|_| OnceLock::new()).collect(),
            filled: AtomicUsize::new(0),
            make,
            adding: Mutex::new(()),
        }
    }

    /// The value for the runtime this runs on.
    pub fn here(&self) -> &T {
        let runtime = here();
        if let Some(value) = self.find(runtime) {
            return value;
        }
        let Some(make) = &self.make else {
            return self.first();
        };
        let _adding = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(value) = self.find(runtime) {
            return value;
        }
        if self.filled.load(Ordering::Acquire) >= SLOTS {
            return self.first();
        }
        self.push(runtime, make())
    }

    /// Every value made so far, the first one first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.filled_slots().map(|(_, value)| value)
    }

    /// The first value made; `made_on`'s `first`.
    pub fn first(&self) -> &T {
        match self.slots[0].get() {
            Some((_, value)) => value,
            // Only `lazy` starts empty, and it fills a slot before it answers.
            None => unreachable!("a PerRuntime answers only once it holds a value"),
        }
    }

    fn find(&self, runtime: Owner) -> Option<&T> {
        let mut fallback = None;
        for (owner, value) in self.filled_slots() {
            if *owner == runtime {
                return Some(value);
            }
            if owner.is_none() && self.make.is_none() {
                fallback = Some(value);
            }
        }
        fallback
    }

    fn filled_slots(&self) -> impl Iterator<Item = &(Owner, T)> {
        let filled = self.filled.load(Ordering::Acquire);
        self.slots[..filled].iter().filter_map(OnceLock::get)
    }

    /// Fills the next slot; the caller holds `adding` (or owns `self` alone).
    fn push(&self, owner: Owner, value: T) -> &T {
        let at = self.filled.load(Ordering::Acquire);
        let slot = &self.slots[at];
        let _ = slot.set((owner, value));
        self.filled.store(at + 1, Ordering::Release);
        match slot.get() {
            Some((_, value)) => value,
            None => unreachable!("the slot was just set"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn each_runtime_gets_its_own_value_made_once() {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let values = PerRuntime::lazy(|| MADE.fetch_add(1, Ordering::SeqCst));
        let (a, b) = (current_thread(), current_thread());
        let on_a = a.block_on(async { *values.here() });
        let on_b = b.block_on(async { *values.here() });
        assert_ne!(on_a, on_b, "two runtimes, two values");
        assert_eq!(a.block_on(async { *values.here() }), on_a, "kept");
        assert_eq!(b.block_on(async { *values.here() }), on_b, "kept");
        assert_eq!(*values.here(), 2, "outside a runtime: one of its own");
        assert_eq!(MADE.load(Ordering::SeqCst), 3);
        assert_eq!(values.iter().count(), 3);
    }

    #[test]
    fn past_the_bound_runtimes_share_the_first_value() {
        let made = Arc::new(AtomicUsize::new(0));
        let count = made.clone();
        let values = PerRuntime::lazy(move || count.fetch_add(1, Ordering::SeqCst));
        let first = *values.here();
        for _ in 0..SLOTS + 5 {
            let rt = current_thread();
            rt.block_on(async { values.here() });
        }
        assert_eq!(values.iter().count(), SLOTS);
        assert_eq!(made.load(Ordering::SeqCst), SLOTS);
        let rt = current_thread();
        assert_eq!(rt.block_on(async { *values.here() }), first);
    }

    #[test]
    fn values_made_on_runtimes_serve_those_and_the_first_serves_every_other() {
        let (a, b, other) = (current_thread(), current_thread(), current_thread());
        let handles = [a.handle().clone(), b.handle().clone()];
        let values = PerRuntime::made_on("main".to_owned(), &handles, |i, h| {
            assert_eq!(h.id(), handles[i].id());
            format!("worker {i}")
        });
        assert_eq!(a.block_on(async { values.here().clone() }), "worker 0");
        assert_eq!(b.block_on(async { values.here().clone() }), "worker 1");
        assert_eq!(other.block_on(async { values.here().clone() }), "main");
        assert_eq!(values.here(), "main", "outside a runtime");
        let all: Vec<_> = values.iter().cloned().collect();
        assert_eq!(all, ["main", "worker 0", "worker 1"]);
        assert_eq!(values.first(), "main");
    }
}
