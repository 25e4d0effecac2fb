//! Large values boxed where they are built.
//!
//! `Box::new(value)` and `Box::pin(value)` build `value` first and then copy it into the
//! allocation. A future is as large as its largest state, several KiB for a request's, so
//! each box of one copied it whole, mostly bytes not yet written, into memory no cache
//! held. These allocate first and build the value in the allocation: once the closure is
//! inlined, the compiler writes the value's fields there directly.

use std::future::Future;
use std::pin::Pin;

/// The value `make` builds, built in a new box.
#[inline(always)]
pub fn boxed<T>(make: impl FnOnce() -> T) -> Box<T> {
    Box::write(Box::new_uninit(), make())
}

/// The future `make` builds, built in a new pinned box.
#[inline(always)]
pub fn pinned<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(boxed(make))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boxed_value_is_the_value_built() {
        let b = boxed(|| {
            let mut a = [0u8; 8192];
            a[8191] = 7;
            a
        });
        assert_eq!((b[0], b[8191], b.len()), (0, 7, 8192));
    }

    #[tokio::test]
    async fn a_pinned_future_runs_to_its_output() {
        let v = String::from("123");
        let f = pinned(move || async move {
            tokio::task::yield_now().await;
            v.bytes().map(|b| u64::from(b - b'0')).sum::<u64>()
        });
        assert_eq!(f.await, 6);
    }
}
