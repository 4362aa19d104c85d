//! Unmapping that waits for the threads inside a PMD call: the fix for `net_memif`'s crash when
//! its peer goes away (issue 28; `docs/dataplane.md`, "memif").
//!
//! DPDK 22.11's memif PMD tears a connection down on EAL's interrupt thread
//! (`memif_disconnect`): it clears its `CONNECTED` flag, then `munmap`s the shared rings and
//! buffers. A worker inside `eth_memif_rx` or `eth_memif_tx` that passed the flag test before
//! the clear goes on reading the ring (`ring->head`, `ring->tail`, descriptors) and takes
//! SIGSEGV (kernel: `error 4 in librte_net_memif.so.23.0[8b03,...]`). Nothing in the PMD orders
//! the two threads; upstream DPDK has the same code. A peer that exits, is killed, or stops its
//! port is enough, and the worker need only be descheduled at that load (a loaded machine).
//!
//! The fix is the classic grace period, with `munmap` as the reclamation point:
//!
//! - A worker that polls such a port brackets each RX and TX burst with `enter` and the drop
//!   of its `Inside`: its slot's sequence number is odd while it is inside the PMD. That is
//!   two stores to a cache line only that worker writes, and no fence (the fence is paid by
//!   the rare unmapping side).
//! - The process defines `munmap` itself ([`munmap`], exported to the PMDs that EAL loads by
//!   `engine/cli/build.rs`). Before making the system call it runs `before_unmap`: a
//!   process-wide memory barrier (`membarrier(PRIVATE_EXPEDITED)`), so that every worker's
//!   stores are visible and the PMD's cleared flag is visible to every burst that starts after
//!   it, then a wait until each worker that was inside a PMD call has left it. A burst that
//!   starts later sees the flag cleared and returns without touching the ring.
//!
//! Any unmapping by any thread passes through `before_unmap`; with no worker registered (no
//! memif port) it is one load. Unmapping from a worker thread skips its own slot. A thread that
//! stays inside a PMD call longer than [`MAX_WAIT`] is given up on (one line on standard
//! error): the unmap goes ahead rather than hang the process.
//!
//! `PORTICO_UNMAP_GUARD=off` in the environment turns the wait off, to show the crash it
//! prevents (`engine/cli/tests/memif_soak.rs`); nothing else should set it.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, compiler_fence};
use std::time::{Duration, Instant};

/// Threads that can be inside a guarded PMD call at once (workers of one process).
const SLOTS: usize = 128;

/// How long an unmap waits for one thread to leave its PMD call before it goes ahead.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// One polling thread's place: its sequence number is odd while it is inside a PMD call.
#[repr(align(128))]
struct Slot {
    seq: AtomicU64,
    claimed: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    seq: AtomicU64::new(0),
    claimed: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Slots claimed: 0 means no thread polls a guarded port and an unmap needs no wait.
static CLAIMED: AtomicUsize = AtomicUsize::new(0);
/// `PORTICO_UNMAP_GUARD=off`.
static DISABLED: AtomicBool = AtomicBool::new(false);
/// The process registered for `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
static EXPEDITED: AtomicBool = AtomicBool::new(false);
static REGISTER: Once = Once::new();
/// Unmaps that found a thread inside a PMD call and waited for it.
static WAITED: AtomicU64 = AtomicU64::new(0);

// linux/membarrier.h
const MEMBARRIER_CMD_GLOBAL: c_int = 1;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: c_int = 8;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: c_int = 16;

thread_local! {
    /// This thread's slot, or `usize::MAX`. No destructor: the unmap hook reads it on any
    /// thread, EAL's C threads included, at any time.
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Frees this thread's slot when the thread ends (set up only on threads that claim one).
    static RELEASE: Release = const { Release };
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let i = MINE
            .try_with(|m| m.replace(usize::MAX))
            .unwrap_or(usize::MAX);
        if let Some(slot) = TABLE.get(i) {
            slot.claimed.store(false, Ordering::Release);
            CLAIMED.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Unmaps since the process started that found a thread inside a PMD call and waited for it.
pub fn waited() -> u64 {
    WAITED.load(Ordering::Relaxed)
}

/// Reads `PORTICO_UNMAP_GUARD` and makes sure the process's own `munmap` is linked in. Called by
/// `Eal::init`, before any PMD is loaded.
pub(crate) fn install() {
    let off = std::env::var_os("PORTICO_UNMAP_GUARD").is_some_and(|v| v == "off");
    DISABLED.store(off, Ordering::Relaxed);
    // The reference keeps the definition in every binary that starts EAL.
    std::hint::black_box(munmap as unsafe extern "C" fn(*mut c_void, usize) -> c_int);
}

/// Whether ports of this driver unmap memory under a polling thread (their bursts are guarded).
pub(crate) fn driver_needs_guard(driver: &str) -> bool {
    driver == "net_memif"
}

/// A thread inside a guarded PMD call; leaving the scope ends the call.
pub(crate) struct Inside {
    seq: &'static AtomicU64,
    at: u64,
}

impl Drop for Inside {
    #[inline]
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        self.seq.store(self.at + 1, Ordering::Release);
    }
}

/// Marks the calling thread as inside a PMD call until the returned value is dropped. `None`
/// when all slots are taken (the call then goes unguarded, as before this module existed).
#[inline]
pub(crate) fn enter() -> Option<Inside> {
    let mut i = MINE.with(Cell::get);
    if i == usize::MAX {
        i = claim()?;
    }
    let seq = &TABLE[i].seq;
    let at = seq.load(Ordering::Relaxed) + 1;
    seq.store(at, Ordering::Relaxed);
    compiler_fence(Ordering::SeqCst);
    Some(Inside { seq, at })
}

#[cold]
fn claim() -> Option<usize> {
    REGISTER.call_once(|| {
        // SAFETY: membarrier takes no pointers; registration only changes how later
        // PRIVATE_EXPEDITED calls of this process are served.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
                0,
            )
        };
        EXPEDITED.store(rc == 0, Ordering::Relaxed);
    });
    let i = TABLE.iter().position(|s| {
        s.claimed
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    // Its sequence number is even: a slot is freed only by its thread, outside any call.
    MINE.with(|m| m.set(i));
    RELEASE.with(|_| {});
    CLAIMED.fetch_add(1, Ordering::AcqRel);
    Some(i)
}

/// A full memory barrier on every running thread of the process.
fn barrier() {
    let cmd = if EXPEDITED.load(Ordering::Relaxed) {
        MEMBARRIER_CMD_PRIVATE_EXPEDITED
    } else {
        MEMBARRIER_CMD_GLOBAL
    };
    // SAFETY: membarrier takes no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
    if rc != 0 {
        // No membarrier (a kernel older than DPDK 22.11 supports): a store buffer drains in
        // nanoseconds, and the PMD clears its flag microseconds before it unmaps.
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Waits until every thread that was inside a guarded PMD call has left it. Allocates nothing
/// and takes no lock, so it may run inside any `munmap` caller.
pub(crate) fn before_unmap() {
    if CLAIMED.load(Ordering::Acquire) == 0 || DISABLED.load(Ordering::Relaxed) {
        return;
    }
    let me = MINE.try_with(Cell::get).unwrap_or(usize::MAX);
    barrier();
    let mut start: Option<Instant> = None;
    for (i, slot) in TABLE.iter().enumerate() {
        if i == me || !slot.claimed.load(Ordering::Acquire) {
            continue;
        }
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 0 {
            continue;
        }
        let t0 = *start.get_or_insert_with(Instant::now);
        let mut spins = 0u32;
        while slot.seq.load(Ordering::Acquire) == seq {
            spins += 1;
            if spins < 1024 {
                std::hint::spin_loop();
            } else if t0.elapsed() > MAX_WAIT {
                // Said once per unmap that gives up, without allocating or locking.
                const GIVE_UP: &[u8] =
                    b"portico: munmap went ahead after 1 s with a worker still inside a PMD call\n";
                // SAFETY: writes a static buffer of its own length to standard error.
                unsafe { libc::write(2, GIVE_UP.as_ptr().cast(), GIVE_UP.len()) };
                break;
            } else {
                std::thread::yield_now();
            }
        }
    }
    if start.is_some() {
        WAITED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The process's `munmap`: `before_unmap`, then the system call, as libc's wrapper makes it
/// (-1 and `errno` on failure). `engine/cli/build.rs` exports it, so that the PMDs EAL loads with
/// `dlopen` bind to it rather than to libc's.
///
/// # Safety
///
/// As `munmap(2)`: the caller owns the mapping and nothing uses it afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    before_unmap();
    // SAFETY: the caller's own request, passed on unchanged to the kernel.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn an_unmap_waits_for_a_thread_inside_a_pmd_call_and_not_for_one_outside() {
        // Thread A enters and stays inside until told; an unmap from here must not finish
        // before A leaves.
        let go = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let g = go.clone();
        let a = std::thread::spawn(move || {
            let inside = enter().expect("a slot");
            tx.send(()).unwrap();
            while !g.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_millis(20));
            drop(inside);
        });
        rx.recv().unwrap();
        let before = waited();
        go.store(true, Ordering::Release);
        let t0 = Instant::now();
        before_unmap();
        assert!(
            t0.elapsed() >= Duration::from_millis(15),
            "{:?}",
            t0.elapsed()
        );
        // (Other tests' unmaps, on their own threads, may have waited for A too.)
        assert!(waited() > before);
        a.join().unwrap();
        // The thread ended: its slot is free again, and an unmap waits for nobody.
        let t0 = Instant::now();
        before_unmap();
        assert!(t0.elapsed() < Duration::from_millis(15));
    }

    #[test]
    fn the_process_munmap_unmaps() {
        // SAFETY: a fresh anonymous page, unmapped once through the process's own munmap.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(munmap(p, 4096), 0);
            // A second unmap of the same range succeeds too (nothing is mapped there).
            assert_eq!(munmap(p, 4096), 0);
            let misaligned = (p as *mut u8).wrapping_add(1).cast::<c_void>();
            assert_eq!(munmap(misaligned, 4096), -1, "misaligned: EINVAL");
        }
    }
}
