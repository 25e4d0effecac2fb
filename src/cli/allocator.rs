//! The process's allocator: mimalloc, called as C's `malloc` wherever the alignment asked
//! for is one `malloc` gives anyway.
//!
//! The `mimalloc` crate's allocator sends every allocation through `mi_malloc_aligned`,
//! whose fast path serves only blocks up to 1 KiB. A larger block (a connection's read
//! buffer, a response's bytes) took the generic aligned path, which over-allocates by the
//! alignment and aligns within: about 180 instructions instead of about 30, five times per
//! request (callgrind; docs/benchmarks.md, run 24). Every block `mi_malloc` returns is
//! aligned to 16 bytes when it is at least 16 bytes long (mimalloc's `MI_MAX_ALIGN_SIZE`;
//! smaller blocks to a multiple of 8), so an alignment of at most 16 and at most the size
//! goes to `mi_malloc`, as std's allocator does with `malloc`; only a larger one (tokio's
//! cache-padded task cells) goes to the aligned call.
//!
//! Built without transparent huge pages (`no_thp`), which would otherwise raise the idle
//! RSS from about 10 to 16 MiB.
//!
//! Each thread that serves requests keeps a block of every size class from 1 KiB to
//! 16 KiB ([`keep_pages`]). A request's largest blocks (its boxed futures: about 2.6, 5.3
//! and 8 KiB) often had pages of their own: a replay is over before the next request
//! starts, its page emptied, mimalloc retired it and soon gave it back to its arena, and
//! the next request took a fresh page (a search of the arena's bitmap, the page set up
//! again). A uprobe counted about one fresh page a request, and the allocator's page and
//! arena calls were about a twentieth of a replay's CPU (docs/benchmarks.md, run 26). A
//! page holding a kept block is never empty, so it stays. One block a size class (mimalloc
//! has four classes a doubling), 17 blocks, 130 KiB: the pages they hold are 13 of 64 KiB
//! and 4 of 512 KiB (the classes above 10 KiB), about 2.4 MiB of address space a thread,
//! mostly untouched (the idle RSS rose by 1.5 MiB). The multi-threaded runtime's blocking
//! threads keep them too, and free them when they end.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::RefCell;
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every `mi_malloc` block of at least that size has.
const MALLOC_ALIGN: usize = 16;

/// mimalloc, through its plain calls where they align enough.
pub struct Allocator;

/// Whether `mi_malloc` of `size` bytes is aligned to `align`.
fn plain(align: usize, size: usize) -> bool {
    align <= MALLOC_ALIGN && align <= size
}

// SAFETY: every call hands mimalloc a size and an alignment it accepts (a power of two,
// from a `Layout`), and a block is freed or resized only as one mimalloc returned; each
// block `plain` sends to the unaligned calls is aligned as the layout asks (above).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// The sizes kept: mimalloc's size classes from 1 KiB to 16 KiB, four a doubling (each
/// block is the largest its class holds, so it lands in that class and no other).
fn kept_sizes() -> impl Iterator<Item = usize> {
    [1024, 2048, 4096, 8192]
        .into_iter()
        .flat_map(|d| [d, d * 5 / 4, d * 6 / 4, d * 7 / 4])
        .chain([16 * 1024])
}

/// Blocks held so that their pages are never empty; freed with the thread.
struct KeptPages(Vec<*mut c_void>);

impl Drop for KeptPages {
    fn drop(&mut self) {
        for &block in &self.0 {
            // SAFETY: each block came from `mi_malloc` and is freed once, here.
            unsafe { mi::mi_free(block) };
        }
    }
}

thread_local! {
    static KEPT: RefCell<Option<KeptPages>> = const { RefCell::new(None) };
}

/// Keeps, for as long as this thread runs, a block of every size class from 1 KiB to
/// 16 KiB (see the module's notes). Run first on each thread of the gateway's runtimes.
pub fn keep_pages() {
    KEPT.with(|kept| {
        kept.borrow_mut().get_or_insert_with(|| {
            // SAFETY: `mi_malloc` takes any size; a null block (out of memory) is kept
            // as it is and freed as one (`mi_free` ignores null).
            let blocks = kept_sizes()
                .map(|size| unsafe { mi::mi_malloc(size) })
                .collect();
            KeptPages(blocks)
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [usize; 14] = [
        1, 7, 8, 12, 16, 24, 40, 100, 1000, 1025, 1100, 4000, 8192, 70_000,
    ];
    const ALIGNS: [usize; 7] = [1, 4, 8, 16, 32, 128, 4096];

    fn kept_here() -> Vec<*mut c_void> {
        KEPT.with(|kept| {
            kept.borrow()
                .as_ref()
                .map(|k| k.0.clone())
                .unwrap_or_default()
        })
    }

    #[test]
    fn the_kept_sizes_are_mimallocs_classes_from_1_to_16_kib() {
        let sizes: Vec<usize> = kept_sizes().collect();
        assert_eq!(
            sizes,
            [
                1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192,
                10240, 12288, 14336, 16384
            ]
        );
    }

    #[test]
    fn a_thread_keeps_its_blocks_once_and_frees_them_with_it() {
        std::thread::spawn(|| {
            assert!(kept_here().is_empty());
            keep_pages();
            let first = kept_here();
            assert_eq!(first.len(), kept_sizes().count());
            for (&block, size) in first.iter().zip(kept_sizes()) {
                assert!(!block.is_null());
                unsafe { std::ptr::write_bytes(block.cast::<u8>(), 0xab, size) };
            }
            // Asked again: the same blocks, none taken anew.
            keep_pages();
            assert_eq!(kept_here(), first);
        })
        .join()
        .unwrap();
        // Another thread has none until it asks.
        assert!(kept_here().is_empty());
    }

    #[test]
    fn every_block_is_aligned_as_asked_and_keeps_its_bytes_when_resized() {
        let a = Allocator;
        for size in SIZES {
            for align in ALIGNS {
                let layout = Layout::from_size_align(size, align).unwrap();
                // Several of each, so that a lucky first block proves nothing.
                let blocks: Vec<*mut u8> = (0..16).map(|_| unsafe { a.alloc(layout) }).collect();
                for (i, &p) in blocks.iter().enumerate() {
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    unsafe { std::ptr::write_bytes(p, i as u8, size) };
                }
                for (i, &p) in blocks.iter().enumerate() {
                    let grown = size * 3 + 5;
                    let q = unsafe { a.realloc(p, layout, grown) };
                    assert_eq!(q as usize % align, 0, "resized: size {size}, align {align}");
                    let kept = unsafe { std::slice::from_raw_parts(q, size) };
                    assert!(
                        kept.iter().all(|&b| b == i as u8),
                        "size {size}, align {align}"
                    );
                    let grown_layout = Layout::from_size_align(grown, align).unwrap();
                    unsafe { a.dealloc(q, grown_layout) };
                }
                let z = unsafe { a.alloc_zeroed(layout) };
                assert_eq!(z as usize % align, 0);
                assert!(unsafe { std::slice::from_raw_parts(z, size) }
                    .iter()
                    .all(|&b| b == 0));
                unsafe { a.dealloc(z, layout) };
            }
        }
    }
}
