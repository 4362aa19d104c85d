//! CRC-32 (IEEE 802.3, the RoCEv2 ICRC's polynomial) folded over bytes while they are copied.
//!
//! The engine sends a payload by copying it out of registered memory into a frame and then
//! running the ICRC over the frame: two passes over the same bytes. [`Mapping::read_crc`]
//! does both in one: each 16-byte block is loaded once, stored into the frame and folded into
//! the CRC register. The register is the raw one (before the final inversion), the same value
//! `portico_wire::icrc::Crc32::register` holds, so a caller continues the ICRC it started over
//! the headers and finishes it after the pad.
//!
//! Three kernels, the widest the CPU runs chosen once per process:
//!
//! - **`pclmul`** (x86-64 with PCLMULQDQ and SSE4.1): carry-less multiplication folds 128
//!   bytes per step with eight accumulators (from 128 bytes on), then 16 bytes per step, then
//!   reduces the 128-bit remainder to the 32-bit register by Barrett reduction. Runs of 16
//!   bytes or more take it; their last 1-15 bytes are one more block (the run's last 16
//!   bytes loaded again, the folded part shuffled out).
//! - **`vpclmul`** (VPCLMULQDQ and AVX2 as well): the same with eight 256-bit accumulators,
//!   256 bytes per step, for runs of 256 bytes or more. Valgrind does not decode it and hides
//!   it from the CPU's feature bits, so under valgrind the process runs `pclmul`.
//! - **`portable`**: slicing by 8 (eight 256-entry tables built at compile time), eight bytes
//!   per step. Any CPU, and runs shorter than 16 bytes.
//!
//! [`update`] (no copy) hands runs of 128 bytes or more to `crc32fast`, which folds 512 bits
//! at a time where the CPU has AVX-512; below that `crc32fast` uses tables, and `pclmul` is
//! faster.
//!
//! [`update_masked`] continues the register over bytes whose first 48 are or-ed with a mask
//! as they are loaded: a received RoCEv2 frame's ICRC (a dummy LRH and header fields taken as
//! all-ones) in one pass over the frame as it lies, with no copy.
//!
//! `PORTICO_CRC=portable` or `=pclmul` in the environment narrows the choice (for
//! comparisons); [`kernel`] says which one runs. The tests compare every kernel the CPU runs
//! with a bit-at-a-time CRC for every length up to 300 (and longer ones) at several
//! alignments of source and destination.
//!
//! [`Mapping::read_crc`]: crate::Mapping::read_crc

use std::sync::atomic::{AtomicU8, Ordering};

/// The reflected IEEE 802.3 polynomial.
const POLY: u32 = 0xedb8_8320;

/// `TABLES[0]` is the byte-at-a-time table; `TABLES[k][b]` is the CRC of byte `b` followed by
/// `k` zero bytes, so eight bytes fold with eight lookups.
static TABLES: [[u32; 256]; 8] = build_tables();

const fn build_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = (crc >> 1) ^ (POLY & 0u32.wrapping_sub(crc & 1));
            bit += 1;
        }
        t[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
}

/// The kernel a process folds with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Slicing by 8, any CPU.
    Portable,
    /// PCLMULQDQ folding (x86-64).
    Pclmul,
    /// VPCLMULQDQ folding, 256 bits at a time, for runs of 256 bytes or more (x86-64 with
    /// AVX2); shorter runs as `Pclmul`.
    Vpclmul,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Pclmul => "pclmul",
            Kernel::Vpclmul => "vpclmul",
        }
    }

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            Kernel::Portable => true,
            Kernel::Pclmul => pclmul::available(),
            Kernel::Vpclmul => pclmul::wide_available(),
        }
    }
}

/// 0 until the first call decides, then the chosen kernel's code below. The PCLMULQDQ
/// kernels have the highest codes, so [`clmul_chosen`] is one compare.
static CHOSEN: AtomicU8 = AtomicU8::new(0);
const CHOSEN_PORTABLE: u8 = 1;
const CHOSEN_PCLMUL: u8 = 2;
const CHOSEN_VPCLMUL: u8 = 3;

/// The kernel this process uses: the widest the CPU has, unless `PORTICO_CRC` names a
/// narrower one (`portable`, `pclmul`).
#[inline]
pub fn kernel() -> Kernel {
    chosen().unwrap_or_else(choose)
}

/// Whether the kernel chosen is one of the PCLMULQDQ ones: one compare of the choice, where
/// [`chosen`]'s `Option` took two (callgrind, a lone 64 B WRITE 3 007.3 -> 2 993.3, a
/// batched one 1 573.7 -> 1 561.6, a lone READ 3 637.3 -> 3 628.3).
#[inline(always)]
fn clmul_chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed) >= CHOSEN_PCLMUL
}

/// The kernel, once the first call has chosen it.
#[inline(always)]
fn chosen() -> Option<Kernel> {
    match CHOSEN.load(Ordering::Relaxed) {
        CHOSEN_PORTABLE => Some(Kernel::Portable),
        CHOSEN_PCLMUL => Some(Kernel::Pclmul),
        CHOSEN_VPCLMUL => Some(Kernel::Vpclmul),
        _ => None,
    }
}

#[cold]
fn choose() -> Kernel {
    let asked = std::env::var("PORTICO_CRC").unwrap_or_default();
    let k = if asked == "portable" || !pclmul::available() {
        Kernel::Portable
    } else if asked == "pclmul" || !pclmul::wide_available() {
        Kernel::Pclmul
    } else {
        Kernel::Vpclmul
    };
    CHOSEN.store(
        match k {
            Kernel::Portable => CHOSEN_PORTABLE,
            Kernel::Pclmul => CHOSEN_PCLMUL,
            Kernel::Vpclmul => CHOSEN_VPCLMUL,
        },
        Ordering::Relaxed,
    );
    k
}

/// Runs at least this long take the PCLMULQDQ kernel...
const FOLD_FROM: usize = 16;
/// ... and at least this long the VPCLMULQDQ one, where the CPU has it.
const WIDE_FROM: usize = 256;
/// Runs at least this long that are not copied go to `crc32fast` ([`update`]), which uses
/// PCLMULQDQ (or AVX-512) from 128 bytes on and tables below.
const LONG_FROM: usize = 128;

/// Continue the raw CRC-32 register `reg` over `data`.
///
/// Always inline, as [`update_masked`]: the choice of kernel is a load and two compares,
/// and as a call of its own (`#[inline]` left it one in the template's opcode arms, and the
/// receive path passes `update_masked` as a function) it was 11 to 12 instructions a frame
/// more. Callgrind: a batched 64 B WRITE 1 752.1 -> 1 740.5, a lone one 3 722 -> 3 694, a
/// lone READ 4 217 -> 4 198, 4 KiB 7 766 -> 7 738, 64 KiB 88 292 -> 88 092.
#[inline(always)]
pub fn update(reg: u32, data: &[u8]) -> u32 {
    let (src, len) = (data.as_ptr(), data.len());
    if clmul_chosen() {
        // Long runs without a copy: `crc32fast`, which folds 512 bits at a time where the CPU
        // has AVX-512 (this crate's widest kernel folds 256).
        if len >= LONG_FROM {
            return update_long(reg, data);
        }
        if len >= FOLD_FROM {
            // SAFETY: `Pclmul` and `Vpclmul` are chosen only where `pclmul::available()`
            // found the CPU features the kernel is compiled for; `data` is valid for `len`
            // reads, and the kernel writes nothing when `COPY` is false.
            return unsafe { pclmul::fold::<false>(reg, src, std::ptr::null_mut(), len) };
        }
        return short_update(reg, data);
    }
    // The first call chooses, out of line and in tail position: a choice inline here made
    // every call save and restore three registers around it (6 instructions a call, on
    // frames of a few dozen bytes).
    if chosen().is_none() {
        return update_first(reg, data);
    }
    short_update(reg, data)
}

/// [`portable_update`] with a run of four bytes (an ACK's AETH, sent, and the four bytes
/// after a received ACK's masked prefix) folded inline: the call and its set-up were 30
/// instructions for them (callgrind: a lone 64 B WRITE 3 751 -> 3 722, a READ 4 245 -> 4 217).
#[inline(always)]
fn short_update(reg: u32, data: &[u8]) -> u32 {
    match data.first_chunk::<4>() {
        Some(w) if data.len() == 4 => step4(reg, *w),
        _ => portable_update(reg, data),
    }
}

/// Length of the prefix [`update_masked`] covers as masked: a RoCEv2 frame's dummy LRH (8
/// bytes) and base headers (IPv4, UDP, BTH: 40).
pub const MASKED_PREFIX: usize = 48;

/// [`update`] over `data` as if its first [`MASKED_PREFIX`] bytes were or-ed with `mask`: the
/// bytes a CRC covers as all-ones (a RoCEv2 ICRC's dummy LRH and variant header fields) taken
/// from the frame as it is, with no copy. A run of a short frame's length is folded in one
/// pass, the masked blocks or-ed as they are loaded; a longer one (or a shorter `data`, masked
/// as far as it goes) in two. Always inline, as [`update`].
#[inline(always)]
pub fn update_masked(reg: u32, data: &[u8], mask: &[u8; MASKED_PREFIX]) -> u32 {
    let len = data.len();
    if clmul_chosen() && len >= MASKED_PREFIX {
        if len < MASKED_PREFIX + LONG_FROM {
            // SAFETY: `Pclmul` and `Vpclmul` are chosen only where `pclmul::available()`
            // found the CPU features the kernel is compiled for; `data` is valid for `len`
            // reads, `len` is at least the prefix.
            return unsafe { pclmul::fold_masked(reg, data.as_ptr(), len, mask) };
        }
        return update_masked_long(reg, data, mask);
    }
    update_masked_split(reg, data, mask)
}

/// [`update_masked`] of a long run: the prefix by the kernel, the rest by `crc32fast`
/// ([`update`]'s long runs). Out of line, as `update_long`.
#[inline(never)]
fn update_masked_long(reg: u32, data: &[u8], mask: &[u8; MASKED_PREFIX]) -> u32 {
    let (head, rest) = data.split_at(MASKED_PREFIX);
    // SAFETY: only called with the PCLMULQDQ kernel chosen (`update_masked`), which is only
    // where `pclmul::available()` found its CPU features; `head` is 48 readable bytes.
    let reg = unsafe { pclmul::fold_masked(reg, head.as_ptr(), MASKED_PREFIX, mask) };
    update_long(reg, rest)
}

/// [`update_masked`] in two runs: the masked prefix from a copy, then the rest.
#[inline(never)]
fn update_masked_split(reg: u32, data: &[u8], mask: &[u8; MASKED_PREFIX]) -> u32 {
    let n = data.len().min(MASKED_PREFIX);
    let mut head = [0u8; MASKED_PREFIX];
    for ((h, d), m) in head.iter_mut().zip(&data[..n]).zip(mask) {
        *h = d | m;
    }
    update(update(reg, &head[..n]), &data[n..])
}

/// [`update`] when no kernel is chosen yet.
#[cold]
#[inline(never)]
fn update_first(reg: u32, data: &[u8]) -> u32 {
    choose();
    update(reg, data)
}

/// [`update`]'s long runs, out of line: the short ones (frame headers) keep a lean call.
#[inline(never)]
fn update_long(reg: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!reg);
    h.update(data);
    !h.finalize()
}

/// Copy `src` into `dst` (of the same length) and continue `reg` over the bytes, in one pass.
///
/// # Panics
/// If the lengths differ.
#[inline]
pub fn copy(reg: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    assert_eq!(src.len(), dst.len(), "crc::copy: lengths differ");
    // SAFETY: `src` is a slice of `dst.len()` bytes, and a `&[u8]` and a `&mut [u8]` cannot
    // overlap.
    unsafe { copy_raw(reg, src.as_ptr(), dst) }
}

/// [`copy`] with the kernel `k` rather than the process's (to compare them).
///
/// # Panics
/// If the lengths differ, or this CPU does not run `k` ([`Kernel::available`]).
pub fn copy_with(k: Kernel, reg: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    assert_eq!(src.len(), dst.len(), "crc::copy_with: lengths differ");
    assert!(
        k.available(),
        "crc::copy_with: this CPU does not run {}",
        k.name()
    );
    // SAFETY: the CPU runs `k` (checked above); `src` is a slice of `dst.len()` bytes, and a
    // `&[u8]` and a `&mut [u8]` cannot overlap.
    unsafe { copy_raw_with(k, reg, src.as_ptr(), dst) }
}

/// [`copy`] from a raw source.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and must not overlap `dst`.
#[inline]
pub(crate) unsafe fn copy_raw(reg: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    // SAFETY: `kernel()` is only ever a kernel the CPU runs; the caller vouches for `src`.
    unsafe { copy_raw_with(kernel(), reg, src, dst) }
}

/// [`copy_raw`] with the kernel `k`.
///
/// # Safety
/// As [`copy_raw`], and the CPU must run `k` ([`Kernel::available`]).
#[inline]
unsafe fn copy_raw_with(k: Kernel, reg: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    let len = dst.len();
    match k {
        // SAFETY: the caller vouches for the CPU's features, for `src`, and `dst` is a slice of
        // the same length.
        Kernel::Vpclmul if len >= WIDE_FROM => unsafe {
            pclmul::copy_wide(reg, src, dst.as_mut_ptr(), len)
        },
        // SAFETY: as above.
        Kernel::Pclmul | Kernel::Vpclmul if len >= FOLD_FROM => unsafe {
            pclmul::fold::<true>(reg, src, dst.as_mut_ptr(), len)
        },
        // SAFETY: the caller vouches for `src`.
        _ => unsafe { portable_copy(reg, src, dst) },
    }
}

#[inline]
fn step8(reg: u32, w: [u8; 8]) -> u32 {
    let lo = reg ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    TABLES[7][(lo & 0xff) as usize]
        ^ TABLES[6][((lo >> 8) & 0xff) as usize]
        ^ TABLES[5][((lo >> 16) & 0xff) as usize]
        ^ TABLES[4][(lo >> 24) as usize]
        ^ TABLES[3][w[4] as usize]
        ^ TABLES[2][w[5] as usize]
        ^ TABLES[1][w[6] as usize]
        ^ TABLES[0][w[7] as usize]
}

/// Four bytes at once (the first half of [`step8`]'s tables): an ACK's AETH, and any run's
/// tail of four or more.
#[inline]
fn step4(reg: u32, w: [u8; 4]) -> u32 {
    let lo = reg ^ u32::from_le_bytes(w);
    TABLES[3][(lo & 0xff) as usize]
        ^ TABLES[2][((lo >> 8) & 0xff) as usize]
        ^ TABLES[1][((lo >> 16) & 0xff) as usize]
        ^ TABLES[0][(lo >> 24) as usize]
}

#[inline]
fn step1(reg: u32, b: u8) -> u32 {
    (reg >> 8) ^ TABLES[0][((reg ^ u32::from(b)) & 0xff) as usize]
}

/// The portable kernel without a copy.
pub(crate) fn portable_update(mut reg: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        reg = step8(reg, w);
    }
    tail_update(reg, chunks.remainder())
}

/// The last 0 to 7 bytes of a run: four at once where there are four.
#[inline]
fn tail_update(reg: u32, tail: &[u8]) -> u32 {
    match tail.split_first_chunk::<4>() {
        Some((w, rest)) => rest.iter().fold(step4(reg, *w), |r, &b| step1(r, b)),
        None => tail.iter().fold(reg, |r, &b| step1(r, b)),
    }
}

/// The portable kernel with a copy.
///
/// # Safety
/// As [`copy_raw`].
pub(crate) unsafe fn portable_copy(mut reg: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    let whole = dst.len() & !7;
    let (body, tail) = dst.split_at_mut(whole);
    for (i, chunk) in body.chunks_exact_mut(8).enumerate() {
        // SAFETY: `i * 8 + 8 <= dst.len()`, within what the caller vouches for; unaligned
        // reads are allowed by `read_unaligned`.
        let w = unsafe { std::ptr::read_unaligned(src.add(i * 8).cast::<[u8; 8]>()) };
        chunk.copy_from_slice(&w);
        reg = step8(reg, w);
    }
    for (i, b) in tail.iter_mut().enumerate() {
        // SAFETY: `whole + i < dst.len()`.
        *b = unsafe { src.add(whole + i).read() };
        reg = step1(reg, *b);
    }
    reg
}

#[cfg(target_arch = "x86_64")]
mod pclmul {
    use std::arch::x86_64::*;

    /// Fold constants for the reflected polynomial, each `x^n mod P(x)` bit-reflected and
    /// shifted left by one (the values of the Intel white paper "Fast CRC Computation for
    /// Generic Polynomials Using PCLMULQDQ"; [`fold_constant`] makes the others, and a test
    /// checks it against these): 16-byte folds use (`K128_LO`, `K128_HI`).
    pub(super) const K128_LO: i64 = 0x1_7519_97d0;
    pub(super) const K128_HI: i64 = 0x0_ccaa_009e;
    /// 64 → 32 bits.
    pub(super) const K64: i64 = 0x1_63cd_6124;
    /// Barrett reduction: P(x) reflected and μ = x^64 / P(x) reflected.
    const P_X: i64 = 0x1_db71_0641;
    const MU: i64 = 0x1_f701_1641;

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("sse4.1")
            && is_x86_feature_detected!("avx")
    }

    /// `x`'s two halves carried forward by the distance `k` encodes, xored into `next`.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1,avx")]
    fn carry(x: __m128i, k: __m128i, next: __m128i) -> __m128i {
        let lo = _mm_clmulepi64_si128::<0x00>(x, k);
        let hi = _mm_clmulepi64_si128::<0x11>(x, k);
        _mm_xor_si128(_mm_xor_si128(lo, hi), next)
    }

    /// Load the 16 bytes at `src + at`, storing them at `dst + at` when copying.
    ///
    /// # Safety
    /// `src + at .. + 16` readable; when `COPY`, `dst + at .. + 16` writable.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1,avx")]
    unsafe fn load<const COPY: bool>(src: *const u8, dst: *mut u8, at: usize) -> __m128i {
        // SAFETY: the caller's range; `loadu`/`storeu` take unaligned addresses.
        unsafe {
            let v = _mm_loadu_si128(src.add(at).cast());
            if COPY {
                _mm_storeu_si128(dst.add(at).cast(), v);
            }
            v
        }
    }

    /// Continue `reg` over the `len` bytes at `src` (copying them to `dst` when `COPY`).
    ///
    /// # Safety
    /// The CPU has PCLMULQDQ and SSE4.1; `len >= 16`; `src` is readable for `len` bytes; when
    /// `COPY`, `dst` is writable for `len` bytes and does not overlap `src`.
    #[target_feature(enable = "pclmulqdq,sse4.1,avx")]
    pub(super) unsafe fn fold<const COPY: bool>(
        reg: u32,
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) -> u32 {
        debug_assert!(len >= 16);
        // SAFETY (every `load` below): `at + 16 <= len` at each call, inside the caller's
        // ranges.
        let (x, at) = if len >= 128 {
            // Eight accumulators, 128 bytes a step: a carry-less multiplication takes several
            // cycles, and eight independent chains keep the multiplier busy.
            let mut acc = [_mm_setzero_si128(); 8];
            for (i, a) in acc.iter_mut().enumerate() {
                *a = unsafe { load::<COPY>(src, dst, 16 * i) };
            }
            acc[0] = _mm_xor_si128(acc[0], _mm_cvtsi32_si128(reg as i32));
            let k = _mm_set_epi64x(K1024_HI, K1024_LO);
            let mut at = 128;
            while len - at >= 128 {
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = carry(*a, k, unsafe { load::<COPY>(src, dst, at + 16 * i) });
                }
                at += 128;
            }
            let k = _mm_set_epi64x(K128_HI, K128_LO);
            let x = acc[1..].iter().fold(acc[0], |x, &next| carry(x, k, next));
            (x, at)
        } else {
            let x = unsafe { load::<COPY>(src, dst, 0) };
            (_mm_xor_si128(x, _mm_cvtsi32_si128(reg as i32)), 16)
        };
        // SAFETY: the caller's ranges; `at <= len`.
        unsafe { finish::<COPY>(x, at, src, dst, len) }
    }

    /// [`super::update_masked`]'s one pass: the three masked blocks or-ed with `mask` as they
    /// are loaded and carried over each other, then the rest as [`fold`] does.
    ///
    /// # Safety
    /// The CPU has PCLMULQDQ and SSE4.1; `len >= 48`; `src` is readable for `len` bytes.
    #[target_feature(enable = "pclmulqdq,sse4.1,avx")]
    pub(super) unsafe fn fold_masked(
        reg: u32,
        src: *const u8,
        len: usize,
        mask: &[u8; super::MASKED_PREFIX],
    ) -> u32 {
        debug_assert!(len >= super::MASKED_PREFIX);
        let m = mask.as_ptr();
        // SAFETY: `len >= 48`, so the three blocks lie in `src`'s range; `mask` is 48 bytes;
        // `loadu` takes unaligned addresses.
        let [b0, b1, b2] = unsafe {
            [0, 16, 32].map(|at| {
                _mm_or_si128(
                    _mm_loadu_si128(src.add(at).cast()),
                    _mm_loadu_si128(m.add(at).cast()),
                )
            })
        };
        let k = _mm_set_epi64x(K128_HI, K128_LO);
        let x = _mm_xor_si128(b0, _mm_cvtsi32_si128(reg as i32));
        let x = carry(carry(x, k, b1), k, b2);
        // SAFETY: the caller's range; `16 <= 48 <= len`; nothing is written without `COPY`.
        unsafe { finish::<false>(x, super::MASKED_PREFIX, src, std::ptr::null_mut(), len) }
    }

    /// [`finish`]'s shuffle controls for a tail of `r` bytes: 16 bytes from offset `16 + r`
    /// move a register's bytes down by `r` (byte `i` takes byte `i + r`; the top `r` are
    /// zeroed, their control's high bit set); from offset `r`, up by `16 - r` (byte `i` takes
    /// byte `i - (16 - r)`; the bottom `16 - r` zeroed).
    const SHIFTS: [u8; 48] = {
        let mut t = [0x80u8; 48];
        let mut i = 0;
        while i < 16 {
            t[16 + i] = i as u8;
            i += 1;
        }
        t
    };

    /// The 128-bit remainder `x` of the first `at` bytes carried over the rest of the run:
    /// 16 bytes a step, then the last 1-15 bytes as one more block, then reduced to the
    /// 32-bit register.
    ///
    /// # Safety
    /// As [`fold`], with `16 <= at <= len`.
    #[target_feature(enable = "pclmulqdq,sse4.1,avx")]
    unsafe fn finish<const COPY: bool>(
        mut x: __m128i,
        mut at: usize,
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) -> u32 {
        let k = _mm_set_epi64x(K128_HI, K128_LO);
        while len - at >= 16 {
            // SAFETY: `at + 16 <= len`.
            x = carry(x, k, unsafe { load::<COPY>(src, dst, at) });
            at += 16;
        }
        // The last `r` bytes without the tables (they cost a call and a loop, about 50
        // instructions for a tagged message's frame; callgrind, `tagged8x32`): the stream
        // `x`, tail is the block of `16 - r` zero bytes and `x`'s first `r` bytes (leading
        // zeros change no remainder), then the block of `x`'s last `16 - r` bytes and the
        // tail. The first is carried over the second. The tail is the top of the run's last
        // 16 bytes, loaded again (`len >= 16`; the rest of them were folded already).
        let r = len - at;
        if r != 0 {
            // SAFETY: `16 <= len`, so `len - 16 .. len` lies in the caller's ranges; when
            // copying, the 16 bytes stored are `src`'s, over `dst` bytes that already hold
            // the same values but for the tail's; `16 + r + 16 <= 48`, inside `SHIFTS`.
            unsafe {
                let last = _mm_loadu_si128(src.add(len - 16).cast());
                if COPY {
                    _mm_storeu_si128(dst.add(len - 16).cast(), last);
                }
                let shifts = SHIFTS.as_ptr();
                let down = _mm_loadu_si128(shifts.add(16 + r).cast());
                let up = _mm_loadu_si128(shifts.add(r).cast());
                let second = _mm_blendv_epi8(_mm_shuffle_epi8(x, down), last, down);
                x = carry(_mm_shuffle_epi8(x, up), k, second);
            }
        }

        // 128 → 64 bits: the low half carried over the high half.
        let x = _mm_xor_si128(_mm_clmulepi64_si128::<0x10>(x, k), _mm_srli_si128::<8>(x));
        // 64 → 32 bits.
        let low32 = _mm_set_epi32(0, 0, 0, -1);
        let x = _mm_xor_si128(
            _mm_clmulepi64_si128::<0x00>(_mm_and_si128(x, low32), _mm_set_epi64x(0, K64)),
            _mm_srli_si128::<4>(x),
        );
        // Barrett reduction to the 32-bit register.
        let pu = _mm_set_epi64x(MU, P_X);
        let t1 = _mm_clmulepi64_si128::<0x10>(_mm_and_si128(x, low32), pu);
        let t2 = _mm_clmulepi64_si128::<0x00>(_mm_and_si128(t1, low32), pu);
        _mm_extract_epi32::<1>(_mm_xor_si128(x, t2)) as u32
    }

    /// Fold constants: 128 bytes a step (eight 128-bit registers), 256 bytes (eight 256-bit
    /// ones), and 32 bytes (one 256-bit register) while the eight are brought together.
    const K1024_LO: i64 = fold_constant(1024 + 32);
    const K1024_HI: i64 = fold_constant(1024 - 32);
    const K2048_LO: i64 = fold_constant(2048 + 32);
    const K2048_HI: i64 = fold_constant(2048 - 32);
    const K256_LO: i64 = fold_constant(256 + 32);
    const K256_HI: i64 = fold_constant(256 - 32);

    /// `x^n mod P(x)` bit-reflected and shifted left by one: the multiplier that carries a
    /// 64-bit half `n - 32` bits forward (the tests check it against the white paper's
    /// constants above).
    pub(super) const fn fold_constant(n: u32) -> i64 {
        // x^n mod P, P = x^32 + 0x04c11db7, in the normal bit order.
        let mut r: u64 = 1;
        let mut i = 0;
        while i < n {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= 0x1_04c1_1db7;
            }
            i += 1;
        }
        ((r as u32).reverse_bits() as i64) << 1
    }

    pub(super) fn wide_available() -> bool {
        available() && is_x86_feature_detected!("vpclmulqdq") && is_x86_feature_detected!("avx2")
    }

    #[inline]
    #[target_feature(enable = "vpclmulqdq,avx2,pclmulqdq,sse4.1")]
    fn carry_wide(x: __m256i, k: __m256i, next: __m256i) -> __m256i {
        let lo = _mm256_clmulepi64_epi128::<0x00>(x, k);
        let hi = _mm256_clmulepi64_epi128::<0x11>(x, k);
        _mm256_xor_si256(_mm256_xor_si256(lo, hi), next)
    }

    /// The 32 bytes at `src + at`, stored at `dst + at`.
    ///
    /// # Safety
    /// `src + at .. + 32` readable, `dst + at .. + 32` writable.
    #[inline]
    #[target_feature(enable = "vpclmulqdq,avx2,pclmulqdq,sse4.1")]
    unsafe fn load_wide(src: *const u8, dst: *mut u8, at: usize) -> __m256i {
        // SAFETY: the caller's range; `loadu`/`storeu` take unaligned addresses.
        unsafe {
            let v = _mm256_loadu_si256(src.add(at).cast());
            _mm256_storeu_si256(dst.add(at).cast(), v);
            v
        }
    }

    /// [`fold`] copying, with eight 256-bit accumulators: 256 bytes a step. Only copies take
    /// it (`update` hands long runs to `crc32fast`).
    ///
    /// # Safety
    /// As [`fold`] with `COPY`, on a CPU with VPCLMULQDQ and AVX2 as well, and `len >= 256`.
    #[target_feature(enable = "vpclmulqdq,avx2,pclmulqdq,sse4.1")]
    pub(super) unsafe fn copy_wide(reg: u32, src: *const u8, dst: *mut u8, len: usize) -> u32 {
        debug_assert!(len >= 256);
        // SAFETY (every `load_wide`): `at + 32 <= len` at each call.
        let mut acc = [_mm256_setzero_si256(); 8];
        for (i, a) in acc.iter_mut().enumerate() {
            *a = unsafe { load_wide(src, dst, 32 * i) };
        }
        acc[0] = _mm256_xor_si256(
            acc[0],
            _mm256_zextsi128_si256(_mm_cvtsi32_si128(reg as i32)),
        );
        let k = _mm256_set_epi64x(K2048_HI, K2048_LO, K2048_HI, K2048_LO);
        let mut at = 256;
        while len - at >= 256 {
            for (i, a) in acc.iter_mut().enumerate() {
                *a = carry_wide(*a, k, unsafe { load_wide(src, dst, at + 32 * i) });
            }
            at += 256;
        }
        let k = _mm256_set_epi64x(K256_HI, K256_LO, K256_HI, K256_LO);
        let x = acc[1..]
            .iter()
            .fold(acc[0], |x, &next| carry_wide(x, k, next));
        // The register's low lane comes 16 bytes before its high one.
        let k = _mm_set_epi64x(K128_HI, K128_LO);
        let x = carry(
            _mm256_castsi256_si128(x),
            k,
            _mm256_extracti128_si256::<1>(x),
        );
        // SAFETY: the caller's ranges; `16 <= at <= len`.
        unsafe { finish::<true>(x, at, src, dst, len) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod pclmul {
    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn wide_available() -> bool {
        false
    }

    /// Never called: `wide_available` is false.
    pub(super) unsafe fn copy_wide(_reg: u32, _src: *const u8, _dst: *mut u8, _len: usize) -> u32 {
        unreachable!("no VPCLMULQDQ kernel on this architecture")
    }

    /// Never called: `available` is false.
    pub(super) unsafe fn fold<const COPY: bool>(
        _reg: u32,
        _src: *const u8,
        _dst: *mut u8,
        _len: usize,
    ) -> u32 {
        unreachable!("no PCLMULQDQ kernel on this architecture")
    }

    /// Never called: `available` is false.
    pub(super) unsafe fn fold_masked(
        _reg: u32,
        _src: *const u8,
        _len: usize,
        _mask: &[u8; super::MASKED_PREFIX],
    ) -> u32 {
        unreachable!("no PCLMULQDQ kernel on this architecture")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC register continued one bit at a time: the definition, no tables.
    fn bitwise(mut reg: u32, data: &[u8]) -> u32 {
        for &b in data {
            reg ^= u32::from(b);
            for _ in 0..8 {
                reg = if reg & 1 != 0 {
                    (reg >> 1) ^ POLY
                } else {
                    reg >> 1
                };
            }
        }
        reg
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect()
    }

    #[test]
    fn the_check_value_and_zlib_s_fox() {
        assert_eq!(!update(!0, b"123456789"), 0xcbf4_3926);
        let fox = b"The quick brown fox jumps over the lazy dog";
        assert_eq!(!update(!0, fox), 0x414f_a339);
        let mut out = [0u8; 43];
        assert_eq!(!copy(!0, fox, &mut out), 0x414f_a339);
        assert_eq!(&out, fox);
    }

    /// Both kernels, with and without the copy, for every length to 300 and a few long ones,
    /// every source and destination alignment in a 16-byte block, from several registers.
    #[test]
    fn every_kernel_equals_the_bitwise_crc_for_every_length_and_alignment() {
        let src = data(4096 + 64);
        let mut dst = vec![0u8; 4096 + 64];
        let lens = (0..=300).chain([383, 384, 385, 511, 512, 1023, 1500, 4095, 4096]);
        let pclmul = cfg!(target_arch = "x86_64") && pclmul::available();
        let wide = cfg!(target_arch = "x86_64") && pclmul::wide_available();
        if !wide {
            eprintln!("no VPCLMULQDQ on this CPU (or under valgrind): its kernel is not tested");
        }
        for len in lens {
            let aligns: &[usize] = if len <= 300 {
                &[0, 1, 3, 7, 8, 13, 15]
            } else {
                &[0, 5]
            };
            for &sa in aligns {
                for &da in aligns {
                    for reg in [0xffff_ffff, 0, 0xdebb_20e3] {
                        let s = &src[sa..sa + len];
                        let want = bitwise(reg, s);
                        assert_eq!(portable_update(reg, s), want, "portable len {len}");
                        dst.fill(0xa5);
                        // SAFETY: `s` is a slice of `len` bytes, apart from `dst`.
                        let got = unsafe { portable_copy(reg, s.as_ptr(), &mut dst[da..da + len]) };
                        assert_eq!(got, want, "portable copy len {len} align {sa}/{da}");
                        assert_eq!(&dst[da..da + len], s);
                        if pclmul && len >= 16 {
                            // SAFETY: the CPU has the features; ranges as above.
                            let got = unsafe {
                                pclmul::fold::<false>(reg, s.as_ptr(), std::ptr::null_mut(), len)
                            };
                            assert_eq!(got, want, "pclmul len {len} align {sa}");
                            dst.fill(0x5a);
                            // SAFETY: as above; `dst[da..da + len]` is writable and apart.
                            let got = unsafe {
                                pclmul::fold::<true>(reg, s.as_ptr(), dst[da..].as_mut_ptr(), len)
                            };
                            assert_eq!(got, want, "pclmul copy len {len} align {sa}/{da}");
                            assert_eq!(&dst[da..da + len], s);
                            assert!(dst[..da].iter().all(|&b| b == 0x5a), "wrote before dst");
                            assert!(dst[da + len..].iter().all(|&b| b == 0x5a), "wrote past dst");
                        }
                        if wide && len >= WIDE_FROM {
                            dst.fill(0x5a);
                            // SAFETY: the CPU has the features; ranges as above.
                            let got = unsafe {
                                pclmul::copy_wide(reg, s.as_ptr(), dst[da..].as_mut_ptr(), len)
                            };
                            assert_eq!(got, want, "vpclmul copy len {len} align {sa}/{da}");
                            assert_eq!(&dst[da..da + len], s);
                            assert!(dst[..da].iter().all(|&b| b == 0x5a), "wrote before dst");
                            assert!(dst[da + len..].iter().all(|&b| b == 0x5a), "wrote past dst");
                        }
                        assert_eq!(update(reg, s), want);
                    }
                }
            }
        }
    }

    /// The masked update against the bitwise CRC of a copy with the prefix or-ed in: every
    /// length to 300 and a few long ones (each of `update_masked`'s three ways), several
    /// alignments and registers, a RoCEv2-like mask and a random one, the kernel and the
    /// split path both.
    #[test]
    fn the_masked_update_equals_the_bitwise_crc_of_the_masked_bytes() {
        let src = data(4096 + 64);
        let mut roce = [0u8; MASKED_PREFIX];
        for i in [0, 1, 2, 3, 4, 5, 6, 7, 9, 16, 18, 19, 34, 35, 40] {
            roce[i] = 0xff;
        }
        let random: [u8; MASKED_PREFIX] =
            std::array::from_fn(|i| (i as u8).wrapping_mul(73) ^ 0x3c);
        let pclmul = cfg!(target_arch = "x86_64") && pclmul::available();
        let lens = (0..=300).chain([
            MASKED_PREFIX + LONG_FROM - 1,
            MASKED_PREFIX + LONG_FROM,
            1500,
            4096,
        ]);
        for len in lens {
            for sa in [0, 1, 6, 15] {
                for mask in [&roce, &random] {
                    for reg in [0xffff_ffff, 0, 0xdebb_20e3] {
                        let s = &src[sa..sa + len];
                        let mut masked = s.to_vec();
                        for (b, m) in masked.iter_mut().zip(mask) {
                            *b |= m;
                        }
                        let want = bitwise(reg, &masked);
                        assert_eq!(update_masked(reg, s, mask), want, "len {len} align {sa}");
                        assert_eq!(update_masked_split(reg, s, mask), want, "split len {len}");
                        if pclmul && len >= MASKED_PREFIX {
                            // SAFETY: the CPU has the features; `s` is `len >= 48` bytes.
                            let got = unsafe { pclmul::fold_masked(reg, s.as_ptr(), len, mask) };
                            assert_eq!(got, want, "pclmul len {len} align {sa}");
                        }
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fold_constants_are_the_white_paper_s() {
        use pclmul::fold_constant as k;
        assert_eq!(
            [k(512 + 32), k(512 - 32), k(128 + 32), k(128 - 32), k(64)],
            [
                0x1_5444_2bd4,
                0x1_c6e4_1596,
                0x1_7519_97d0,
                0x0_ccaa_009e,
                0x1_63cd_6124
            ]
        );
    }

    #[test]
    fn a_run_split_anywhere_continues_the_same_register() {
        let d = data(700);
        let whole = update(!0, &d);
        for split in [0, 1, 15, 16, 17, 63, 64, 65, 128, 256, 333, 443, 699, 700] {
            let r = update(update(!0, &d[..split]), &d[split..]);
            assert_eq!(r, whole, "split {split}");
        }
    }

    #[test]
    fn the_kernel_is_named_and_pclmul_where_the_cpu_has_it() {
        let k = kernel();
        assert_eq!(kernel(), k, "chosen once");
        if std::env::var("PORTICO_CRC").is_err() {
            let want = if pclmul::wide_available() {
                Kernel::Vpclmul
            } else if pclmul::available() {
                Kernel::Pclmul
            } else {
                Kernel::Portable
            };
            assert_eq!(k, want);
        }
        assert!(["portable", "pclmul", "vpclmul"].contains(&k.name()));
    }
}
