//! The worker's side of sleeping: the doorbell itself ([`Wake`], [`sleep`]) is the node
//! crate's (`node::wake`, where the host rings it); what is left here are the two
//! thread-level system calls a worker makes around its sleeps.

pub use node::wake::{MAX_WAKES, Wake, Woke, sleep};

use std::io;

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
    use std::time::Duration;

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
