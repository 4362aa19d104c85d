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
//! worker → host path, and the worker writes the eventfd when it publishes to a host that
//! waits ([`crate::Cq::events`], [`crate::TagPort::events`]); [`prepare_external_wait`] and
//! [`epoll_of`] are for a host that waits on the descriptors itself.
//!
//! Packets cannot wake a worker this way: the virtual PMDs CI uses (memif, ring, null) have no
//! RX interrupts, so a sleeping worker sees a packet when its sleep ends. That is why sleeps
//! are short and bounded (see `runtime::polling`).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering, fence};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

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
        Wake {
            fd: rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).ok(),
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
        // Pairs with the fence in `sleep`: the work published before it is seen by a worker
        // that raised its flag before this load.
        fence(Ordering::SeqCst);
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
    fence(Ordering::SeqCst);
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
    fence(Ordering::SeqCst);
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
