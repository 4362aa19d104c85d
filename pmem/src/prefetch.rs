//! A hint that brings memory toward the core before it is used: the worker's look ahead at
//! ring slots the host's core has just written (the tag shard's host commands), whose cache
//! lines would otherwise come over one at a time, each as its slot is read.

use crate::CACHE_LINE;

/// Asks the core to fetch every cache line `items` touches into its caches, and returns at
/// once. A hint: it reads nothing into a register, writes nothing and cannot fault. Off
/// x86_64 it does nothing.
#[inline]
pub fn prefetch<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = items.as_ptr().cast::<i8>();
        let (lead, lines) = lines(start as usize, size_of_val(items));
        let first = start.wrapping_sub(lead);
        for i in 0..lines {
            // SAFETY: PREFETCHT0 needs SSE, which every x86_64 CPU has. It is a hint that
            // loads nothing into a register and never faults, whatever the address; the
            // addresses are the lines `items` touches anyway (`wrapping_*` computes them
            // without claiming they lie in one allocation).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(i * CACHE_LINE)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}

/// The cache lines `len` bytes at address `start` touch: how far `start` lies into the first
/// of them, and how many there are.
fn lines(start: usize, len: usize) -> (usize, usize) {
    let lead = start % CACHE_LINE;
    if len == 0 {
        return (lead, 0);
    }
    (lead, (lead + len).div_ceil(CACHE_LINE))
}

#[cfg(test)]
mod tests {
    use super::lines;

    #[test]
    fn the_lines_are_every_line_the_bytes_touch() {
        // (start, len) -> (lead, lines)
        for (start, len, want) in [
            (0, 0, (0, 0)),
            (100, 0, (36, 0)),
            (0, 1, (0, 1)),
            (0, 64, (0, 1)),
            (0, 65, (0, 2)),
            (63, 1, (63, 1)),
            (63, 2, (63, 2)),
            (64, 64, (0, 1)),
            // A 72-byte tag command 60 bytes into a line reaches into the third.
            (60, 72, (60, 3)),
            (1, 127, (1, 2)),
            (1, 128, (1, 3)),
            (4096 + 8, 32 * 72, (8, 37)),
        ] {
            assert_eq!(lines(start, len), want, "{start} + {len}");
        }
    }
}
