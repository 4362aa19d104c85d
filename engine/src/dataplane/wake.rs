//! How an idle worker sleeps and how the host wakes it (adaptive polling, issue 16).
//!
//! A [`Wake`] is one host → worker path's doorbell for a sleeping worker: an `eventfd` and a
//! flag. The worker raises the flag, checks its rings once more, and sleeps in `ppoll` on the
//! eventfds of all its paths with a timeout; a host that has just published work and sees the
//! flag writes the eventfd. The flag is read and written around a sequentially consistent
//! fence on both sides (the host's after its ring commit, the worker's after raising it), so
//! either the worker sees the work before it sleeps or the host sees that it sleeps: a wake-up
//! is never lost, and a busy worker costs the host one relaxed load per post.
//!
//! Packets cannot wake a worker this way: the virtual PMDs CI uses (memif, ring, null) have no
//! RX interrupts, so a sleeping worker sees a packet when its sleep ends. That is why sleeps
//! are short and bounded (see `runtime::polling`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering, fence};

/// One host → worker path's wake-up.
#[derive(Debug)]
pub struct Wake {
    /// None when the process is out of descriptors: then a sleep only times out.
    fd: Option<OwnedFd>,
    /// The worker is about to sleep, or sleeps.
    sleeping: AtomicBool,
    /// The worker runs an adaptive policy (it may sleep): only then does a post fence.
    armed: AtomicBool,
}

impl Wake {
    /// A new path. Should the process have no descriptor left for its eventfd, the path
    /// still works: a sleeping worker then sees posts when its (bounded) sleep ends.
    pub fn new() -> Wake {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor that
        // nothing else owns, so OwnedFd may own (and close) it.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        Wake {
            // SAFETY: see above: fd is a fresh descriptor owned by nobody else.
            fd: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
            sleeping: AtomicBool::new(false),
            armed: AtomicBool::new(false),
        }
    }

    /// Whether the path has its eventfd (see [`Wake::new`]).
    pub fn has_eventfd(&self) -> bool {
        self.fd.is_some()
    }

    /// The worker may sleep on this path from now on (adaptive polling).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Host side, after publishing work: wakes the worker if it sleeps. Returns whether it
    /// wrote the eventfd.
    #[inline]
    pub fn notify(&self) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        // Pairs with the fence in `sleep`: the work published before it is seen by a worker
        // that raised its flag before this load.
        fence(Ordering::SeqCst);
        if !self.sleeping.load(Ordering::Relaxed) {
            return false;
        }
        let Some(fd) = &self.fd else {
            return false;
        };
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (EAGAIN)
        // already means "wake up", so the result is not needed.
        let _ = unsafe {
            libc::write(
                fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        true
    }

    /// Empties the eventfd's counter.
    fn drain(&self) {
        let Some(fd) = &self.fd else {
            return;
        };
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

impl Default for Wake {
    fn default() -> Self {
        Wake::new()
    }
}

/// How a sleep ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// The timeout passed.
    Timeout,
    /// A host posted work (an eventfd was written).
    Host,
    /// Work was already there when the flags were up: no sleep at all.
    Pending,
}

/// The most paths one worker sleeps on (each engine of a stage has a few).
pub const MAX_WAKES: usize = 32;

/// Sleeps up to `ns` nanoseconds, or until a host notifies one of `wakes`. `pending` is
/// asked once the flags are up: true (work already posted) means no sleep.
pub fn sleep(wakes: &[&Wake], ns: u64, pending: impl FnOnce() -> bool) -> Woke {
    let wakes = &wakes[..wakes.len().min(MAX_WAKES)];
    for w in wakes {
        w.sleeping.store(true, Ordering::Relaxed);
    }
    // Pairs with the fence in `Wake::notify`.
    fence(Ordering::SeqCst);
    let woke = if pending() {
        Woke::Pending
    } else {
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; MAX_WAKES];
        for (p, w) in fds.iter_mut().zip(wakes) {
            // A path without its eventfd is skipped (ppoll ignores negative descriptors).
            p.fd = w.fd.as_ref().map_or(-1, |fd| fd.as_raw_fd());
            p.events = libc::POLLIN;
        }
        let ts = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `fds` holds `wakes.len()` initialised pollfds that live across the call,
        // `ts` is a live timespec, and a null signal mask leaves the mask as it is.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                wakes.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n > 0 {
            for (p, w) in fds.iter().zip(wakes) {
                if p.revents & libc::POLLIN != 0 {
                    w.drain();
                }
            }
            Woke::Host
        } else {
            Woke::Timeout
        }
    };
    for w in wakes {
        w.sleeping.store(false, Ordering::Relaxed);
    }
    woke
}

/// Sets the calling thread's timer slack: how late the kernel may end its sleeps to batch
/// wake-ups. Linux's default is 50 µs, longer than the sleeps an adaptive worker takes.
pub fn set_timer_slack_ns(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects only the calling thread.
    let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPU time the calling thread has used, in nanoseconds (0 if the clock cannot be read).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a live local.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_sleep_without_a_post_times_out_and_one_with_work_pending_does_not_sleep() {
        let w = Wake::new();
        assert!(w.has_eventfd());
        w.arm();
        assert_eq!(sleep(&[&w], 1_000, || false), Woke::Timeout);
        assert_eq!(sleep(&[&w], 10_000_000_000, || true), Woke::Pending);
        assert!(!w.sleeping.load(Ordering::Relaxed));
        // Not sleeping: a post writes nothing.
        assert!(!w.notify());
    }

    #[test]
    fn a_post_wakes_a_sleeping_worker_and_only_an_armed_path_fences() {
        let a = Arc::new(Wake::new());
        let b = Arc::new(Wake::new());
        b.arm();
        let (a2, b2) = (a.clone(), b.clone());
        let sleeper = std::thread::spawn(move || sleep(&[&a2, &b2], 30_000_000_000, || false));
        // Wait until it sleeps, then post on the second path.
        let t0 = Instant::now();
        while !b.sleeping.load(Ordering::Relaxed) {
            assert!(t0.elapsed() < Duration::from_secs(10), "never slept");
            std::thread::yield_now();
        }
        assert!(!a.notify(), "an unarmed path never writes");
        while !b.notify() {}
        assert_eq!(sleeper.join().unwrap(), Woke::Host);
        // The counter was drained: the next sleep times out.
        assert_eq!(sleep(&[&a, &b], 1_000, || false), Woke::Timeout);
    }

    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        let t0 = thread_cpu_ns();
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu_ns() - t0;
        let t1 = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() - t1 < 5_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(slept < 5_000_000, "30 ms asleep cost {slept} ns of CPU");
        assert!(thread_cpu_ns() - t1 >= 5_000_000);
    }

    #[test]
    fn timer_slack_can_be_set() {
        set_timer_slack_ns(1).unwrap();
        // SAFETY: PR_GET_TIMERSLACK takes no pointers.
        let slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        assert_eq!(slack, 1);
    }
}
