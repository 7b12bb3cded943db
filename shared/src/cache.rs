//! Cache hints: asking the CPU for memory a few steps before it is read or written, so that
//! the misses of a batch of lookups (the maps keyed by code) or of the ring's next cell
//! overlap with other work.

/// Asks the CPU to bring `value` in, to be read or written soon: every cache line it spans
/// (an entry of a few words may straddle two, a ring cell takes three or four). A hint only:
/// it neither reads nor faults.
pub fn prefetch<T>(value: &T) {
    const LINE: usize = 64;
    let first = (value as *const T).cast::<i8>();
    hint(first);
    // Steps of a line from the first byte land in every line between the first byte's and
    // the last's. The size is a constant: for a value within a line or two (the collector's
    // entries) this loop compiles away, leaving the two hints.
    let mut step = LINE;
    while step < size_of::<T>() {
        hint(first.wrapping_add(step));
        step += LINE;
    }
    hint(first.wrapping_add(size_of::<T>().saturating_sub(1)));
}

/// The CPU's prefetch of the cache line holding `at`, where there is one.
#[inline(always)]
fn hint(at: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints at an address (here within a valid reference's
    // value); it does not dereference it.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
