//! Cache-line write-back for DAX mappings: which instruction the CPU offers, chosen once by
//! CPUID, and the loop that issues it over a range before one store fence.

use std::sync::OnceLock;

use crate::CACHE_LINE;
use crate::kind::FlushInstr;

/// The instruction `persist` uses on a DAX mapping: CLWB if the CPU has it, else CLFLUSHOPT,
/// else CLFLUSH. `None` off x86_64, where DAX mappings are persisted with `msync`. CPUID is
/// read once and the answer cached.
pub fn flush_instruction() -> Option<FlushInstr> {
    static CHOSEN: OnceLock<Option<FlushInstr>> = OnceLock::new();
    *CHOSEN.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<FlushInstr> {
    use core::arch::x86_64::{__cpuid, __cpuid_count};

    const LEAF7_EBX_CLFLUSHOPT: u32 = 1 << 23;
    const LEAF7_EBX_CLWB: u32 = 1 << 24;
    const LEAF1_EDX_CLFLUSH: u32 = 1 << 19;

    let max_leaf = __cpuid(0).eax;
    if max_leaf >= 7 {
        let ebx = __cpuid_count(7, 0).ebx;
        if ebx & LEAF7_EBX_CLWB != 0 {
            return Some(FlushInstr::Clwb);
        }
        if ebx & LEAF7_EBX_CLFLUSHOPT != 0 {
            return Some(FlushInstr::ClflushOpt);
        }
    }
    (__cpuid(1).edx & LEAF1_EDX_CLFLUSH != 0).then_some(FlushInstr::Clflush)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Option<FlushInstr> {
    None
}

/// Writes back every cache line that overlaps `[start, start + len)` with `instr`. The caller
/// issues [`store_fence`] afterwards, once for all the ranges it flushed.
///
/// # Safety
///
/// `[start, start + len)` must lie inside one live mapping, and `instr` must be one the CPU
/// supports (as [`flush_instruction`] reports; CLFLUSH is on every x86_64 CPU).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn write_back_lines(instr: FlushInstr, start: *const u8, len: usize) {
    use core::arch::asm;
    use core::arch::x86_64::_mm_clflush;

    if len == 0 {
        return;
    }
    let first = start as usize & !(CACHE_LINE - 1);
    let end = start as usize + len;
    let lines = (first..end).step_by(CACHE_LINE).map(|a| a as *const u8);
    match instr {
        FlushInstr::Clwb => {
            for line in lines {
                // SAFETY: `line` is inside the mapping (the caller's contract), so the write-back
                // cannot fault, and the CPU has CLWB; it changes no register, flag or stack.
                unsafe { asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)) };
            }
        }
        FlushInstr::ClflushOpt => {
            for line in lines {
                // SAFETY: as for CLWB above.
                unsafe {
                    asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
                };
            }
        }
        FlushInstr::Clflush => {
            for line in lines {
                // SAFETY: `line` is inside the mapping; CLFLUSH is part of SSE2, which every
                // x86_64 CPU has.
                unsafe { _mm_clflush(line) };
            }
        }
    }
}

/// Orders every write-back issued before it ahead of any later store: after it, the flushed
/// lines are durable.
#[cfg(target_arch = "x86_64")]
pub(crate) fn store_fence() {
    // SAFETY: SFENCE is part of SSE, which every x86_64 CPU has; it touches no memory.
    unsafe { core::arch::x86_64::_mm_sfence() };
}

// Off x86_64 `flush_instruction()` is `None`, so DAX mappings are persisted with msync and these
// are never reached.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn write_back_lines(_instr: FlushInstr, _start: *const u8, _len: usize) {
    unreachable!("no cache-line write-back instruction off x86_64");
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn store_fence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::Mapping;

    /// Runs each instruction this CPU has over a real mapping, so an encoding the CPU rejects
    /// (SIGILL) or a wrong line walk (SIGSEGV past the end) shows up here rather than on a
    /// DAX machine.
    #[test]
    fn every_supported_instruction_runs() {
        let chosen = flush_instruction().expect("every x86_64 CPU has at least CLFLUSH");
        let usable: &[FlushInstr] = match chosen {
            FlushInstr::Clwb => &[
                FlushInstr::Clwb,
                FlushInstr::ClflushOpt,
                FlushInstr::Clflush,
            ],
            FlushInstr::ClflushOpt => &[FlushInstr::ClflushOpt, FlushInstr::Clflush],
            FlushInstr::Clflush => &[FlushInstr::Clflush],
        };
        let m = Mapping::anonymous(8192).unwrap();
        m.fill(0, 8192, 0x5A).unwrap();
        for &instr in usable {
            // SAFETY: the ranges are inside `m`, and `instr` is one CPUID reported.
            unsafe {
                write_back_lines(instr, m.as_ptr(), 8192);
                write_back_lines(instr, m.as_ptr().add(8191), 1);
                write_back_lines(instr, m.as_ptr().add(100), 0);
            }
            store_fence();
        }
        let mut out = [0u8; 8192];
        m.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0x5A));
    }

    #[test]
    fn the_choice_is_cached() {
        assert_eq!(flush_instruction(), flush_instruction());
    }
}
