//! How a worker waits when it has nothing to do (issue 16; not wired into the worker loop
//! yet): `busy` polls without pause, as DPDK's run-to-completion loops do on dedicated cores;
//! `adaptive` backs off in steps after a run of empty iterations, as OVS-DPDK's
//! `pmd-sleep-max` and VPP's adaptive mode do, and snaps back to busy polling on the first
//! iteration that did work.
//!
//! The back-off is a pure state machine ([`Backoff::next`]): told whether an iteration did
//! work and how long until the worker's next timer is due, it says what to do before the next
//! iteration. The worker then spins, executes pause instructions, or sleeps. Its steps:
//!
//! 1. up to [`SPIN_ITERATIONS`] empty iterations: nothing (busy polling);
//! 2. then [`PAUSE_ITERATIONS`] iterations with a pause burst before each, doubling from 1 to
//!    [`MAX_PAUSES`] pause instructions (tens of ns each: the sibling hyperthread and the
//!    power budget get the core, and a packet is still seen within a microsecond or so);
//! 3. then a sleep before each iteration, doubling from [`FIRST_SLEEP_NS`] to the policy's
//!    maximum, and never past the next timer (a retransmission timeout still fires on time).
//!
//! Every decision is counted ([`IdleCounters`]): iterations busy, backed off and asleep, the
//! time asked to sleep and the time actually slept, so the cost of waking is measured, not
//! assumed.

use serde::Serialize;

/// Empty iterations polled at full speed before backing off.
pub const SPIN_ITERATIONS: u32 = 256;
/// Iterations with a pause burst before the worker starts to sleep.
pub const PAUSE_ITERATIONS: u32 = 1024;
/// The longest pause burst, in pause instructions.
pub const MAX_PAUSES: u32 = 128;
/// The first sleep.
pub const FIRST_SLEEP_NS: u64 = 1_000;

/// A worker's polling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "policy")]
pub enum Polling {
    /// Poll without pause (dedicated cores; the benchmarks' default).
    Busy,
    /// Back off when idle, sleeping at most `max_sleep_ns` at a time.
    Adaptive { max_sleep_ns: u64 },
}

impl Polling {
    /// The banner's words for the policy.
    pub fn describe(&self) -> String {
        match self {
            Polling::Busy => "busy polling".into(),
            Polling::Adaptive { max_sleep_ns } => format!(
                "adaptive polling (back off when idle, sleep at most {} µs)",
                max_sleep_ns / 1000
            ),
        }
    }
}

/// What to do before the next iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Poll again at once.
    Poll,
    /// Execute this many pause instructions, then poll.
    Pause(u32),
    /// Sleep this many nanoseconds, then poll.
    Sleep(u64),
}

/// What the back-off did, as counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IdleCounters {
    /// Iterations polled at full speed: they did work, or were among the first empty ones.
    pub busy: u64,
    /// Empty iterations after a pause burst.
    pub backed_off: u64,
    /// Empty iterations after a sleep.
    pub slept: u64,
    /// Nanoseconds of sleep asked for, and slept (the excess is the cost of waking up).
    pub sleep_asked_ns: u64,
    pub sleep_taken_ns: u64,
    /// The longest a sleep overran what was asked.
    pub max_oversleep_ns: u64,
    /// Iterations that did work right after a sleep or a pause burst.
    pub wakeups: u64,
}

/// The state of an adaptive worker's back-off (see the module doc).
#[derive(Debug, Clone)]
pub struct Backoff {
    max_sleep_ns: u64,
    /// Empty iterations in a row.
    empty: u32,
    /// The last decision was a pause or a sleep.
    idle: bool,
    sleep_ns: u64,
    pub counters: IdleCounters,
}

impl Backoff {
    /// A back-off that sleeps at most `max_sleep_ns` at a time (0: never sleeps, only pauses).
    pub fn new(max_sleep_ns: u64) -> Backoff {
        Backoff {
            max_sleep_ns,
            empty: 0,
            idle: false,
            sleep_ns: FIRST_SLEEP_NS,
            counters: IdleCounters::default(),
        }
    }

    /// After an iteration that did work (`worked`) or not, with the worker's next timer due in
    /// `timer_in_ns` (None: no timer armed): what to do before the next iteration.
    pub fn next(&mut self, worked: bool, timer_in_ns: Option<u64>) -> Idle {
        if worked {
            if self.idle {
                self.counters.wakeups += 1;
            }
            self.empty = 0;
            self.idle = false;
            self.sleep_ns = FIRST_SLEEP_NS;
            self.counters.busy += 1;
            return Idle::Poll;
        }
        self.empty = self.empty.saturating_add(1);
        if self.empty <= SPIN_ITERATIONS {
            self.counters.busy += 1;
            return Idle::Poll;
        }
        let backing = self.empty - SPIN_ITERATIONS;
        if backing <= PAUSE_ITERATIONS || self.max_sleep_ns == 0 {
            // Doubling every 128 iterations: 1, 2, 4, ... MAX_PAUSES.
            let step = ((backing - 1) / 128).min(MAX_PAUSES.trailing_zeros());
            self.idle = true;
            self.counters.backed_off += 1;
            return Idle::Pause(1 << step);
        }
        // A timer due sooner than the sleep is what the worker wakes for.
        let sleep = self
            .sleep_ns
            .min(self.max_sleep_ns)
            .min(timer_in_ns.unwrap_or(u64::MAX));
        if sleep == 0 {
            self.counters.busy += 1;
            return Idle::Poll;
        }
        self.sleep_ns = (self.sleep_ns * 2).min(self.max_sleep_ns);
        self.idle = true;
        self.counters.slept += 1;
        self.counters.sleep_asked_ns += sleep;
        Idle::Sleep(sleep)
    }

    /// Records how long a sleep of `asked_ns` actually took.
    pub fn slept(&mut self, asked_ns: u64, taken_ns: u64) {
        self.counters.sleep_taken_ns += taken_ns;
        self.counters.max_oversleep_ns = self
            .counters
            .max_oversleep_ns
            .max(taken_ns.saturating_sub(asked_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decisions of `n` empty iterations in a row.
    fn idle_run(b: &mut Backoff, n: u32, timer: Option<u64>) -> Vec<Idle> {
        (0..n).map(|_| b.next(false, timer)).collect()
    }

    #[test]
    fn it_polls_then_pauses_in_doubling_bursts_then_sleeps_up_to_its_maximum() {
        let mut b = Backoff::new(50_000);
        let run = idle_run(&mut b, SPIN_ITERATIONS + PAUSE_ITERATIONS + 8, None);
        let (spin, rest) = run.split_at(SPIN_ITERATIONS as usize);
        let (pause, sleep) = rest.split_at(PAUSE_ITERATIONS as usize);
        assert!(spin.iter().all(|&i| i == Idle::Poll));
        assert_eq!(pause[0], Idle::Pause(1));
        assert_eq!(pause[127], Idle::Pause(1));
        assert_eq!(pause[128], Idle::Pause(2));
        assert_eq!(pause[1023], Idle::Pause(MAX_PAUSES));
        assert_eq!(
            sleep,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 50_000, 50_000].map(Idle::Sleep)
        );
        let c = b.counters;
        assert_eq!(
            (c.busy, c.backed_off, c.slept),
            (u64::from(SPIN_ITERATIONS), u64::from(PAUSE_ITERATIONS), 8)
        );
        assert_eq!(c.sleep_asked_ns, 163_000);
    }

    #[test]
    fn work_snaps_it_back_to_busy_polling_and_counts_the_wakeup() {
        let mut b = Backoff::new(50_000);
        idle_run(&mut b, SPIN_ITERATIONS + PAUSE_ITERATIONS + 3, None);
        assert_eq!(b.next(true, None), Idle::Poll);
        assert_eq!(b.counters.wakeups, 1);
        // Back at the start: a full spin run before the first pause, the first sleep 1 µs.
        let run = idle_run(&mut b, SPIN_ITERATIONS + PAUSE_ITERATIONS + 1, None);
        assert!(
            run[..SPIN_ITERATIONS as usize]
                .iter()
                .all(|&i| i == Idle::Poll)
        );
        assert_eq!(run.last(), Some(&Idle::Sleep(FIRST_SLEEP_NS)));
        // Work while still spinning is not a wake-up.
        b.next(true, None);
        b.next(false, None);
        b.next(true, None);
        assert_eq!(b.counters.wakeups, 2);
    }

    #[test]
    fn a_timer_due_sooner_bounds_the_sleep_and_a_due_timer_means_poll() {
        let mut b = Backoff::new(1_000_000);
        idle_run(&mut b, SPIN_ITERATIONS + PAUSE_ITERATIONS + 10, None);
        assert_eq!(b.next(false, Some(3_000)), Idle::Sleep(3_000));
        assert_eq!(b.next(false, Some(0)), Idle::Poll);
    }

    #[test]
    fn without_a_sleep_budget_it_only_pauses() {
        let mut b = Backoff::new(0);
        let run = idle_run(&mut b, SPIN_ITERATIONS + PAUSE_ITERATIONS + 100, None);
        assert!(run.iter().all(|i| !matches!(i, Idle::Sleep(_))));
        assert_eq!(run.last(), Some(&Idle::Pause(MAX_PAUSES)));
    }

    #[test]
    fn oversleep_is_measured() {
        let mut b = Backoff::new(10_000);
        b.slept(1_000, 61_000);
        b.slept(2_000, 3_000);
        assert_eq!(b.counters.sleep_taken_ns, 64_000);
        assert_eq!(b.counters.max_oversleep_ns, 60_000);
        assert_eq!(
            Polling::Adaptive {
                max_sleep_ns: 50_000
            }
            .describe(),
            "adaptive polling (back off when idle, sleep at most 50 µs)"
        );
    }
}
