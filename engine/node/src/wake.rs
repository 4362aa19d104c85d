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
//! The same doorbell serves the other direction: a host that waits for completions or tag
//! events (the libfabric provider's `fi_cq_sread`, `FI_WAIT_FD`) raises the flag of the
//! worker → host path ([`Wake::to_host`]), and the worker writes the eventfd when it
//! publishes to a host that waits ([`crate::Cq::events`], [`crate::TagPort::events`]);
//! [`prepare_external_wait`] and [`epoll_of`] are for a host that waits on the descriptors
//! itself.
//!
//! On those worker → host paths the fences are asymmetric where Linux has `membarrier`
//! (`MEMBARRIER_CMD_PRIVATE_EXPEDITED`, 4.14 on): the worker, which publishes at every
//! iteration, orders its publish before its look at the flag with a compiler fence only
//! (`publish_fence`), and a host about to sleep, which is rare, runs `membarrier`
//! (`sleeper_fence`), which makes every running thread of the process execute a full
//! barrier. Either the barrier on the worker's core comes before its look at the flag, which
//! then sees the flag raised, or after its publish, which the host then sees: the pairing of
//! two sequentially consistent fences, with the cost on the side that is about to sleep
//! anyway. A locked instruction at every iteration drained the worker's store buffer, which
//! holds the lines of the host's rings it has just written (`portico bench tagged`, eager 8 B
//! at depth 1 000: see `docs/rdma.md`). Without `membarrier` (or with `PORTICO_FENCES=
//! symmetric`), both sides fence. The host → worker paths keep their fences on both sides:
//! an adaptive worker may go to sleep often, and each `membarrier` interrupts the host's
//! cores.
//!
//! Packets cannot wake a worker this way: the virtual PMDs CI uses (memif, ring, null) have no
//! RX interrupts, so a sleeping worker sees a packet when its sleep ends. That is why sleeps
//! are short and bounded (see `runtime::polling`).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering, compiler_fence, fence};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::thread::{MembarrierCommand, membarrier};

/// One path's wake-up: host → worker ([`Wake::new`]), or worker → host ([`Wake::to_host`]).
#[derive(Debug)]
pub struct Wake {
    /// None when the process is out of descriptors: then a sleep only times out.
    fd: Option<OwnedFd>,
    /// The side that waits (the worker, or a host on a worker → host path) is about to sleep,
    /// or sleeps.
    sleeping: AtomicBool,
    /// The waiting side may sleep: only then does a post fence.
    armed: AtomicBool,
    /// A worker → host path: the worker notifies with [`publish_fence`], a host sleeps with
    /// [`sleeper_fence`].
    to_host: bool,
}

/// [`asymmetric`]'s answer: not asked yet, or which.
const UNDECIDED: u8 = 0;
const ASYMMETRIC: u8 = 1;
const SYMMETRIC: u8 = 2;
static FENCES: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Whether the worker → host paths fence asymmetrically (see the module's documentation):
/// decided by the first call (a fence of either side, or a report), and never changed, so
/// that both sides of every pairing use the same kind.
#[inline(always)]
pub fn asymmetric() -> bool {
    match FENCES.load(Ordering::Acquire) {
        ASYMMETRIC => true,
        SYMMETRIC => false,
        _ => decide(),
    }
}

/// [`asymmetric`]'s first answer. Two threads that ask at once both register (registering
/// again is harmless) and both find the same answer; the first store stands.
#[cold]
#[inline(never)]
fn decide() -> bool {
    let symmetric = std::env::var_os("PORTICO_FENCES").is_some_and(|v| v == "symmetric");
    let asymmetric = !symmetric && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok();
    let v = if asymmetric { ASYMMETRIC } else { SYMMETRIC };
    match FENCES.compare_exchange(UNDECIDED, v, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => asymmetric,
        Err(first) => first == ASYMMETRIC,
    }
}

/// The worker's fence between publishing to a host (its rings' write indices, a count of
/// events) and loading that host's sleeping flag: a compiler fence where the host's
/// [`sleeper_fence`] is `membarrier`, a sequentially consistent one otherwise. Inline, with
/// [`asymmetric`]'s load and compare: through a `OnceLock` it made `CqWriter::publish` a
/// call of its own (a lone 64 B WRITE +11 instructions, callgrind).
#[inline(always)]
pub(crate) fn publish_fence() {
    if asymmetric() {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// A host's fence between raising its sleeping flag on a worker → host path and its last look
/// for what the worker published: `membarrier`, which runs a full barrier on every running
/// thread of the process (the worker's among them), or a sequentially consistent fence
/// where the worker fences too ([`publish_fence`]). The kernel fences the caller as well.
pub(crate) fn sleeper_fence() {
    // Registered, it is not refused (the errors are an unregistered process and an unknown
    // command); were it refused, the waits it guards are bounded all the same (10 ms).
    if asymmetric() && membarrier(MembarrierCommand::PrivateExpedited).is_ok() {
        return;
    }
    fence(Ordering::SeqCst);
}

impl Wake {
    /// A new path. Should the process have no descriptor left for its eventfd, the path
    /// still works: a sleeping worker then sees posts when its (bounded) sleep ends.
    pub fn new() -> Wake {
        Wake {
            fd: rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).ok(),
            sleeping: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            to_host: false,
        }
    }

    /// A worker → host path (completions, tag events), armed: a host may sleep on it at any
    /// time, and the worker's notify fences with `publish_fence` (a compiler fence where the
    /// host's sleep runs `membarrier`; see the module's documentation).
    pub fn to_host() -> Wake {
        let w = Wake {
            to_host: true,
            ..Wake::new()
        };
        w.arm();
        w
    }

    /// Whether the path has its eventfd (see [`Wake::new`]).
    pub fn has_eventfd(&self) -> bool {
        self.fd.is_some()
    }

    /// The worker may sleep on this path from now on (adaptive polling).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Whether the worker is about to sleep, or sleeps, on this path.
    pub fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Host side, after publishing work: wakes the worker if it sleeps. Returns whether it
    /// wrote the eventfd.
    #[inline]
    pub fn notify(&self) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        // Pairs with the fence in `sleep`: the work published before it is seen by a waiter
        // that raised its flag before this load.
        if self.to_host {
            publish_fence();
        } else {
            fence(Ordering::SeqCst);
        }
        if !self.sleeping.load(Ordering::Relaxed) {
            return false;
        }
        let Some(fd) = &self.fd else {
            return false;
        };
        // A full counter (EAGAIN) already means "wake up", so the result is not needed.
        let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        true
    }

    /// The eventfd, for a caller that polls it itself ([`epoll_of`]).
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Empties the eventfd's counter.
    fn drain(&self) {
        let Some(fd) = &self.fd else {
            return;
        };
        let mut v = [0u8; 8];
        let _ = rustix::io::read(fd, &mut v);
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
/// asked once the flags are up: true (work already posted) means no sleep. Allocates nothing.
pub fn sleep(wakes: &[&Wake], ns: u64, pending: impl FnOnce() -> bool) -> Woke {
    let wakes = &wakes[..wakes.len().min(MAX_WAKES)];
    for w in wakes {
        w.sleeping.store(true, Ordering::Relaxed);
    }
    // Pairs with the fence in `Wake::notify`.
    waiter_fence(wakes);
    let woke = if pending() {
        Woke::Pending
    } else {
        // The paths that have an eventfd, in order: a path without one is skipped.
        let mut which = [0usize; MAX_WAKES];
        let mut n = 0;
        for (i, w) in wakes.iter().enumerate() {
            if w.fd.is_some() {
                which[n] = i;
                n += 1;
            }
        }
        let ts = Timespec {
            tv_sec: (ns / 1_000_000_000) as _,
            tv_nsec: (ns % 1_000_000_000) as _,
        };
        if n == 0 {
            std::thread::sleep(std::time::Duration::from_nanos(ns));
            Woke::Timeout
        } else {
            // Entries past `n` repeat the last descriptor and are not passed to ppoll.
            let mut fds: [PollFd<'_>; MAX_WAKES] = std::array::from_fn(|k| {
                let fd = wakes[which[k.min(n - 1)]]
                    .fd
                    .as_ref()
                    .expect("has an eventfd");
                PollFd::new(fd, PollFlags::IN)
            });
            match rustix::event::poll(&mut fds[..n], Some(&ts)) {
                Ok(k) if k > 0 => {
                    for (p, &i) in fds[..n].iter().zip(&which[..n]) {
                        if p.revents().contains(PollFlags::IN) {
                            wakes[i].drain();
                        }
                    }
                    Woke::Host
                }
                _ => Woke::Timeout,
            }
        }
    };
    for w in wakes {
        w.sleeping.store(false, Ordering::Relaxed);
    }
    woke
}

/// The fence of a side that has raised the flags of `wakes` and looks for work once more:
/// [`sleeper_fence`] when one of them is a worker → host path, else a sequentially consistent
/// fence (as the host → worker paths' notifies).
fn waiter_fence(wakes: &[&Wake]) {
    if wakes.iter().any(|w| w.to_host) {
        sleeper_fence();
    } else {
        fence(Ordering::SeqCst);
    }
}

/// For a host that waits on the eventfds itself (libfabric's `fi_trywait`, then `poll` of an
/// `FI_WAIT_FD`): raises the flags of `wakes` and empties their counters, then asks `pending`
/// (work already published?). True: nothing was pending, so any publish from now on writes an
/// eventfd, and the caller may block on them until [`finish_external_wait`]. False: the flags
/// are lowered again and the caller must not block.
pub fn prepare_external_wait(wakes: &[&Wake], pending: impl FnOnce() -> bool) -> bool {
    for w in wakes {
        w.sleeping.store(true, Ordering::Relaxed);
        w.drain();
    }
    // Pairs with the fence in `Wake::notify` (and the worker's publish), as in `sleep`.
    waiter_fence(wakes);
    if pending() {
        finish_external_wait(wakes);
        return false;
    }
    true
}

/// Ends a wait [`prepare_external_wait`] began: the worker stops writing the eventfds.
pub fn finish_external_wait(wakes: &[&Wake]) {
    for w in wakes {
        w.sleeping.store(false, Ordering::Relaxed);
    }
}

/// An epoll descriptor that is readable when any of the `wakes`' eventfds is: one descriptor
/// for a caller that waits on several paths (libfabric's `FI_WAIT_FD` is one file descriptor).
pub fn epoll_of(wakes: &[&Wake]) -> std::io::Result<OwnedFd> {
    use rustix::event::epoll;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    for (i, w) in wakes.iter().enumerate() {
        if let Some(fd) = w.fd() {
            epoll::add(
                &ep,
                fd,
                epoll::EventData::new_u64(i as u64),
                epoll::EventFlags::IN,
            )?;
        }
    }
    Ok(ep)
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
        assert!(!w.is_sleeping());
        // Not sleeping: a post writes nothing.
        assert!(!w.notify());
    }

    #[test]
    fn an_external_waiter_sees_a_post_on_the_epoll_descriptor_and_no_post_when_done() {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let (a, b) = (Wake::new(), Wake::new());
        a.arm();
        b.arm();
        let ep = epoll_of(&[&a, &b]).unwrap();
        let poll = |ns: i64| {
            let mut fds = [PollFd::new(&ep, PollFlags::IN)];
            let ts = Timespec {
                tv_sec: 0,
                tv_nsec: ns,
            };
            rustix::event::poll(&mut fds, Some(&ts)).unwrap()
        };
        // Something already published: no wait, flags down again.
        assert!(!prepare_external_wait(&[&a, &b], || true));
        assert!(!a.is_sleeping() && !b.notify());
        assert!(prepare_external_wait(&[&a, &b], || false));
        assert_eq!(poll(1_000_000), 0, "nothing posted: not readable");
        assert!(b.notify(), "a waiting host is written to");
        assert_eq!(poll(1_000_000), 1, "readable through the epoll descriptor");
        finish_external_wait(&[&a, &b]);
        assert!(!a.notify(), "a host done waiting is not written to");
        // The next wait starts with the counters emptied.
        assert!(prepare_external_wait(&[&a, &b], || false));
        assert_eq!(poll(1_000_000), 0);
        finish_external_wait(&[&a, &b]);
    }

    /// A worker → host path, round after round: the host raises its flag and sleeps (its
    /// fence `membarrier` where the kernel has it), the worker publishes a count and notifies
    /// (its fence a compiler fence then). Every sleep ends because the work was there or the
    /// eventfd was written, none by its timeout.
    #[test]
    fn a_host_sleeping_on_a_worker_s_path_is_woken_by_every_publish() {
        use std::sync::atomic::AtomicU64;
        const ROUNDS: u64 = 300;
        let w = Arc::new(Wake::to_host());
        let published = Arc::new(AtomicU64::new(0));
        let taken = Arc::new(AtomicU64::new(0));
        let (w2, p2, t2) = (w.clone(), published.clone(), taken.clone());
        let worker = std::thread::spawn(move || {
            for k in 1..=ROUNDS {
                // The host has taken the last round's publish and raised its flag; a moment
                // later it sleeps in `ppoll`, or is about to.
                while t2.load(Ordering::Acquire) != k - 1 || !w2.is_sleeping() {
                    std::hint::spin_loop();
                }
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(50) {
                    std::hint::spin_loop();
                }
                p2.store(k, Ordering::Release);
                w2.notify();
            }
        });
        let mut outcomes = [0u64; 3];
        for k in 1..=ROUNDS {
            loop {
                let woke = sleep(&[&w], 20_000_000_000, || {
                    published.load(Ordering::Acquire) == k
                });
                outcomes[woke as usize] += 1;
                assert_ne!(
                    woke,
                    Woke::Timeout,
                    "round {k}: a publish did not wake the host"
                );
                if published.load(Ordering::Acquire) == k {
                    break;
                }
            }
            taken.store(k, Ordering::Release);
        }
        worker.join().unwrap();
        assert_eq!(outcomes[Woke::Timeout as usize], 0);
        assert!(
            outcomes[Woke::Host as usize] > 0,
            "no sleep was ended by the eventfd: {outcomes:?}"
        );
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
        while !b.is_sleeping() {
            assert!(t0.elapsed() < Duration::from_secs(10), "never slept");
            std::thread::yield_now();
        }
        assert!(!a.notify(), "an unarmed path never writes");
        while !b.notify() {}
        assert_eq!(sleeper.join().unwrap(), Woke::Host);
        // The counter was drained: the next sleep times out.
        assert_eq!(sleep(&[&a, &b], 1_000, || false), Woke::Timeout);
    }
}
