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

use std::alloc::{GlobalAlloc, Layout};
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

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [usize; 14] = [
        1, 7, 8, 12, 16, 24, 40, 100, 1000, 1025, 1100, 4000, 8192, 70_000,
    ];
    const ALIGNS: [usize; 7] = [1, 4, 8, 16, 32, 128, 4096];

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
