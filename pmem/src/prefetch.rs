//! Hints that bring memory toward the core before it is used: the worker's look ahead at
//! ring slots the host's core has just written (the tag shard's host commands), whose cache
//! lines would otherwise come over one at a time, each as its slot is read ([`prefetch`]);
//! and at ring slots it is about to write that the host's core read last (the tag shard's
//! events), whose lines it must own before its stores can leave the store buffer
//! ([`prefetch_write`]).

use crate::CACHE_LINE;

/// Asks the core to fetch every cache line `items` touches into its caches, and returns at
/// once. A hint: it reads nothing into a register, writes nothing and cannot fault. Off
/// x86_64 it does nothing.
#[inline]
pub fn prefetch<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    each_line(items, |line| {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: PREFETCHT0 needs SSE, which every x86_64 CPU has. It is a hint that loads
        // nothing into a register and never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast()) };
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}

/// Asks the core to fetch every cache line `items` touches in the state a write needs
/// (PREFETCHW: owned, the other cores' copies invalidated), and returns at once: the lines of
/// slots about to be written that another core read last come over together, rather than one
/// at a time as each store reaches the head of the store buffer and waits for its line. A
/// hint, as [`prefetch`]: it changes no byte and cannot fault. Where the CPU lacks PREFETCHW
/// (CPUID `0x8000_0001`, ECX bit 8), and off x86_64, it does nothing.
#[inline]
pub fn prefetch_write<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if has_prefetchw() {
        each_line(items, |line| {
            // SAFETY: PREFETCHW exists on this CPU (checked above). It is a hint: it writes
            // nothing, reads nothing into a register, touches no flag or stack and never
            // faults, whatever the address. Inline assembly, as Rust's `prfchw` target
            // feature is not stable.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) line,
                    options(nostack, preserves_flags, readonly)
                );
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}

/// Runs `hint` on the address of every cache line `items` touches (`wrapping_*` computes
/// them without claiming they lie in one allocation; a hint never dereferences them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn each_line<T>(items: &[T], mut hint: impl FnMut(*const u8)) {
    let start = items.as_ptr().cast::<u8>();
    let (lead, lines) = lines(start as usize, size_of_val(items));
    let first = start.wrapping_sub(lead);
    for i in 0..lines {
        hint(first.wrapping_add(i * CACHE_LINE));
    }
}

/// Whether the CPU has PREFETCHW (AMD's since the K6-2, Intel's since Broadwell): asked of
/// CPUID once.
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_prefetchw() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    })
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
