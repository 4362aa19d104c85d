//! How a worker waits when it has nothing to do (issue 16): `busy` polls without pause, as
//! DPDK's run-to-completion loops do on dedicated cores; `adaptive` backs off in steps once it
//! has been idle for a while, as OVS-DPDK's `pmd-sleep-max` and VPP's adaptive mode do, and
//! snaps back to busy polling on the first iteration that did work.
//!
//! The back-off is a pure state machine ([`Backoff::worked`], [`Backoff::next`]): told that an
//! iteration did work, or the time and the stage's outlook after one that did not, it says
//! what to do before the next iteration. The worker then polls again, executes pause instructions, or
//! sleeps (in `ppoll` on its host paths' eventfds, so a host that posts work wakes it at
//! once: `dataplane::wake`). Its steps, timed from the last iteration that did work:
//!
//! 1. for [`SPIN_NS`]: nothing (busy polling: a reply that comes back within a few
//!    microseconds finds the worker polling);
//! 2. until [`PAUSE_NS`]: a pause burst before each iteration, doubling from 1 to
//!    [`MAX_PAUSES`] pause instructions;
//! 3. then a sleep before each iteration, doubling from [`FIRST_SLEEP_NS`] to the policy's
//!    maximum, and never past the next timer (a retransmission timeout still fires on time).
//!
//! Short first sleeps are for packets: a peer's reply or request is seen within a few
//! microseconds of its arrival. They cost CPU time (each wake-up is a timer interrupt and
//! two context switches, about 3.6 µs of CPU on this project's test VM), and they buy nothing
//! when the work comes from the host, whose posts end a sleep at once. So when the last idle
//! spell was ended by the host and the stage awaits no packet (no request of its own in
//! flight: [`Outlook::awaits_packets`]), the first sleep is the longest one.
//!
//! The steps are timed, not counted in iterations: an empty iteration costs from 50 ns (a
//! null port) to microseconds (memif), and what matters to the core's other tenants and to
//! the CPU bill is time. Every decision is counted ([`IdleCounters`]): iterations busy,
//! backed off and asleep, the time asked to sleep and the time actually slept, so the cost of
//! waking is measured, not assumed.

use std::sync::OnceLock;

use serde::Serialize;

/// Idle time polled at full speed before backing off.
pub const SPIN_NS: u64 = 2_000;
/// Idle time after which pause bursts give way to sleeps.
pub const PAUSE_NS: u64 = 5_000;
/// The longest pause burst, in pause instructions.
pub const MAX_PAUSES: u32 = 128;
/// The first sleep.
pub const FIRST_SLEEP_NS: u64 = 2_000;
/// Each sleep of an idle spell is this many times the one before (up to the maximum). 4 was
/// tried: the forwarder at 10 k packets/s used 22 % of a core instead of 27 %, and the
/// two-process memif pair took 73 µs instead of 49 µs (docs/dataplane.md).
pub const SLEEP_GROWTH: u64 = 2;
/// The default longest sleep of `adaptive`. At 10 k WRITEs/s 100 µs used 14.7 % of a core
/// against 18.6 % with 50 µs, for the same latency of the two-process memif pair
/// (docs/dataplane.md, "Polling").
pub const DEFAULT_MAX_SLEEP_NS: u64 = 100_000;
/// The longest sleep a config may ask for: 10 ms, OVS's `pmd-sleep-max` bound.
pub const MAX_MAX_SLEEP_NS: u64 = 10_000_000;

/// A worker's polling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase", tag = "policy")]
pub enum Polling {
    /// Poll without pause (dedicated cores; the benchmarks' default).
    #[default]
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

    /// The policy named `name` (`busy` or `adaptive`), with `max_sleep_us` for `adaptive`
    /// (None: [`DEFAULT_MAX_SLEEP_NS`]). The error says which of the two is wrong and why,
    /// for the caller to name its field.
    pub fn parse(name: &str, max_sleep_us: Option<u64>) -> Result<Polling, PollingError> {
        let bad = |max_sleep: bool, message: String| PollingError { max_sleep, message };
        match name {
            "busy" => match max_sleep_us {
                None => Ok(Polling::Busy),
                Some(_) => Err(bad(
                    true,
                    "a maximum sleep needs polling = \"adaptive\"".into(),
                )),
            },
            "adaptive" => {
                let ns = max_sleep_us.map_or(DEFAULT_MAX_SLEEP_NS, |us| us.saturating_mul(1000));
                if ns > MAX_MAX_SLEEP_NS {
                    return Err(bad(
                        true,
                        format!(
                            "a maximum sleep of {} µs is longer than {} µs",
                            ns / 1000,
                            MAX_MAX_SLEEP_NS / 1000
                        ),
                    ));
                }
                Ok(Polling::Adaptive { max_sleep_ns: ns })
            }
            other => Err(bad(
                false,
                format!("{other:?} is not a policy (busy or adaptive)"),
            )),
        }
    }
}

/// A policy that does not parse: `max_sleep` when the maximum sleep is what is wrong (else
/// the policy's name), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PollingError {
    pub max_sleep: bool,
    pub message: String,
}

static COMMAND_LINE: OnceLock<Polling> = OnceLock::new();

/// Records the command line's `--polling` (the binary does, once, before anything starts):
/// it overrides every config's `[runtime] polling`.
pub fn set_command_line(p: Polling) {
    let _ = COMMAND_LINE.set(p);
}

/// The policy of workers whose config (or, without one, the default) says `configured`: the
/// command line's, when it named one.
pub fn effective(configured: Polling) -> Polling {
    COMMAND_LINE.get().copied().unwrap_or(configured)
}

pub use node::Outlook;

/// What to do before the next iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Poll again at once.
    Poll,
    /// Execute this many pause instructions, then poll.
    Pause(u32),
    /// Sleep this many nanoseconds (or until a host posts work), then poll.
    Sleep(u64),
}

crate::counter_set! {
    /// What the back-off did, as counters, declared once: the names (the `idle` object of a
    /// worker's JSON and telemetry, in this order), the slots of
    /// [`super::SharedCounters`] and how they combine follow this list.
    pub struct IdleCounters, slots IdleSlot {
        /// Iterations polled at full speed: they did work, or came early in an idle spell.
        busy: Sum,
        /// Empty iterations after a pause burst.
        backed_off: Sum,
        /// Empty iterations after a sleep.
        slept: Sum,
        /// Nanoseconds of sleep asked for.
        sleep_asked_ns: Sum,
        /// Nanoseconds slept.
        sleep_taken_ns: Sum,
        /// Sleeps that ran their time out.
        timeouts: Sum,
        /// The time those sleeps overran it in all (the cost of waking up: timer and
        /// scheduler).
        oversleep_ns: Sum,
        /// The most one sleep overran its time (a high-water mark).
        max_oversleep_ns: Max,
        /// Sleeps a host ended early by posting work (its eventfd write woke the worker).
        host_wakes: Sum,
        /// Sleeps not taken: work was already posted when the worker raised its flags.
        skipped: Sum,
        /// Iterations that did work right after a sleep or a pause burst.
        wakeups: Sum,
    }
}

/// The state of an adaptive worker's back-off (see the module doc).
#[derive(Debug, Clone)]
pub struct Backoff {
    max_sleep_ns: u64,
    /// When the current idle spell began (the first empty iteration's time).
    idle_since: Option<u64>,
    /// The last decision was a pause or a sleep.
    idle: bool,
    sleep_ns: u64,
    /// The last idle spell was ended by the host's post, not by a packet found by polling.
    host_driven: bool,
    /// The worker has no RX queue: no packet can ever end a sleep early.
    deaf: bool,
    pub counters: IdleCounters,
}

impl Backoff {
    /// A back-off that sleeps at most `max_sleep_ns` at a time (0: never sleeps, only pauses).
    pub fn new(max_sleep_ns: u64) -> Backoff {
        Backoff {
            max_sleep_ns,
            idle_since: None,
            idle: false,
            sleep_ns: FIRST_SLEEP_NS,
            host_driven: false,
            deaf: false,
            counters: IdleCounters::default(),
        }
    }

    /// For a worker without RX queues (a generator): it sleeps straight to its next timer
    /// (or the maximum), as nothing but that timer or the host can give it work.
    pub fn deaf(mut self) -> Backoff {
        self.deaf = true;
        self
    }

    /// After an iteration that did work: back to busy polling.
    pub fn worked(&mut self) {
        if self.idle {
            self.counters.wakeups += 1;
            // Work found by polling after a pause or a timed-out sleep: a packet. (After a
            // host's wake-up `idle_since` is already cleared.)
            if self.idle_since.is_some() {
                self.host_driven = false;
            }
        }
        self.restart();
        self.counters.busy += 1;
    }

    /// A new idle spell starts at the next empty iteration.
    fn restart(&mut self) {
        self.idle_since = None;
        self.idle = false;
        self.sleep_ns = FIRST_SLEEP_NS;
    }

    /// After an iteration that did nothing, at `now_ns`, with the stage's `outlook`: what to
    /// do before the next iteration.
    pub fn next(&mut self, now_ns: u64, outlook: Outlook) -> Idle {
        let timer_in_ns = outlook.due_in_ns;
        if timer_in_ns == Some(0) {
            // Work the stage could not do yet: not idle.
            self.restart();
            self.counters.busy += 1;
            return Idle::Poll;
        }
        let idle_for = now_ns.saturating_sub(*self.idle_since.get_or_insert(now_ns));
        if idle_for < SPIN_NS {
            self.counters.busy += 1;
            return Idle::Poll;
        }
        if idle_for < PAUSE_NS || self.max_sleep_ns == 0 {
            // Doubling over the pause phase: 1 pause just after SPIN_NS, MAX_PAUSES at the end.
            let span = PAUSE_NS - SPIN_NS;
            let into = (idle_for - SPIN_NS).min(span);
            let steps = MAX_PAUSES.trailing_zeros() as u64;
            let step = (into * (steps + 1) / span).min(steps);
            self.idle = true;
            self.counters.backed_off += 1;
            return Idle::Pause(1 << step);
        }
        if self.sleep_ns == FIRST_SLEEP_NS
            && (self.deaf || self.host_driven && !outlook.awaits_packets)
        {
            // The host's posts wake it; no packet is awaited: no reason to wake sooner.
            self.sleep_ns = self.max_sleep_ns;
        }
        // A timer due sooner than the sleep is what the worker wakes for.
        let sleep = self
            .sleep_ns
            .min(self.max_sleep_ns)
            .min(timer_in_ns.unwrap_or(u64::MAX));
        self.sleep_ns = (self.sleep_ns * SLEEP_GROWTH).min(self.max_sleep_ns);
        self.idle = true;
        self.counters.slept += 1;
        self.counters.sleep_asked_ns += sleep;
        Idle::Sleep(sleep)
    }

    /// A sleep was not taken: the host had posted work already.
    pub fn skipped(&mut self) {
        self.counters.skipped += 1;
        self.idle_since = None;
        self.sleep_ns = FIRST_SLEEP_NS;
        self.host_driven = true;
    }

    /// Records how a sleep of `asked_ns` went: it took `taken_ns`, and a host ended it early
    /// (`by_host`) or it ran its time out.
    pub fn slept(&mut self, asked_ns: u64, taken_ns: u64, by_host: bool) {
        let c = &mut self.counters;
        c.sleep_taken_ns += taken_ns;
        if by_host {
            c.host_wakes += 1;
            // The host's work is there: back to busy polling at once.
            self.idle_since = None;
            self.sleep_ns = FIRST_SLEEP_NS;
            self.host_driven = true;
            return;
        }
        let over = taken_ns.saturating_sub(asked_ns);
        c.timeouts += 1;
        c.oversleep_ns += over;
        c.max_oversleep_ns = c.max_oversleep_ns.max(over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decisions of empty iterations every `step_ns` from time 0 up to `until_ns`.
    fn idle_run(b: &mut Backoff, from: u64, until_ns: u64, step_ns: u64) -> Vec<(u64, Idle)> {
        (from..until_ns)
            .step_by(step_ns as usize)
            .map(|t| (t, b.next(t, Outlook::PACKETS)))
            .collect()
    }

    #[test]
    fn it_polls_then_pauses_in_doubling_bursts_then_sleeps_up_to_its_maximum() {
        let mut b = Backoff::new(50_000);
        let run = idle_run(&mut b, 0, PAUSE_NS, 100);
        for &(t, i) in &run {
            match t {
                t if t < SPIN_NS => assert_eq!(i, Idle::Poll, "at {t} ns"),
                t if t < SPIN_NS + 100 => assert_eq!(i, Idle::Pause(1), "at {t} ns"),
                t if t >= PAUSE_NS - 100 => assert_eq!(i, Idle::Pause(MAX_PAUSES), "at {t} ns"),
                _ => assert!(matches!(i, Idle::Pause(1..=128)), "at {t} ns: {i:?}"),
            }
        }
        // Bursts only grow.
        let bursts: Vec<u32> = run
            .iter()
            .filter_map(|&(_, i)| {
                if let Idle::Pause(n) = i {
                    Some(n)
                } else {
                    None
                }
            })
            .collect();
        assert!(bursts.windows(2).all(|w| w[0] <= w[1]));
        let sleeps: Vec<Idle> = (0..7)
            .map(|k| b.next(PAUSE_NS + k, Outlook::PACKETS))
            .collect();
        assert_eq!(
            sleeps,
            [2_000, 4_000, 8_000, 16_000, 32_000, 50_000, 50_000].map(Idle::Sleep)
        );
        let c = b.counters;
        assert_eq!(
            (c.busy, c.backed_off, c.slept),
            (SPIN_NS / 100, (PAUSE_NS - SPIN_NS) / 100, 7)
        );
        assert_eq!(c.sleep_asked_ns, 162_000);
    }

    #[test]
    fn work_snaps_it_back_to_busy_polling_and_counts_the_wakeup() {
        let mut b = Backoff::new(50_000);
        idle_run(&mut b, 0, PAUSE_NS + 300, 100);
        assert!(matches!(
            b.next(PAUSE_NS + 400, Outlook::PACKETS),
            Idle::Sleep(_)
        ));
        b.worked();
        assert_eq!(b.counters.wakeups, 1);
        // Back at the start: busy for SPIN_NS of new idleness, then the first sleep is 2 µs.
        let t0 = 1_000_000;
        let run = idle_run(&mut b, t0, t0 + PAUSE_NS, 100);
        assert!(
            run.iter()
                .take_while(|(t, _)| *t < t0 + SPIN_NS)
                .all(|(_, i)| *i == Idle::Poll)
        );
        assert_eq!(
            b.next(t0 + PAUSE_NS, Outlook::PACKETS),
            Idle::Sleep(FIRST_SLEEP_NS)
        );
        // Work after that sleep is a wake-up; work while still spinning is not.
        b.worked();
        b.next(t0 + PAUSE_NS + 2, Outlook::PACKETS);
        b.worked();
        assert_eq!(b.counters.wakeups, 2);
    }

    #[test]
    fn a_timer_due_sooner_bounds_the_sleep_and_work_not_yet_done_means_poll() {
        let mut b = Backoff::new(1_000_000);
        idle_run(&mut b, 0, PAUSE_NS, 100);
        for _ in 0..5 {
            b.next(PAUSE_NS, Outlook::PACKETS);
        }
        assert_eq!(
            b.next(
                PAUSE_NS,
                Outlook {
                    due_in_ns: Some(3_000),
                    awaits_packets: true
                }
            ),
            Idle::Sleep(3_000)
        );
        // Some(0): the stage has work it could not do yet (a paced send): busy again.
        assert_eq!(b.next(PAUSE_NS, Outlook::BUSY), Idle::Poll);
        assert_eq!(b.next(PAUSE_NS + 1, Outlook::PACKETS), Idle::Poll);
    }

    #[test]
    fn without_a_sleep_budget_it_only_pauses() {
        let mut b = Backoff::new(0);
        let run = idle_run(&mut b, 0, 10 * PAUSE_NS, 100);
        assert!(run.iter().all(|(_, i)| !matches!(i, Idle::Sleep(_))));
        assert_eq!(run.last().map(|r| r.1), Some(Idle::Pause(MAX_PAUSES)));
    }

    #[test]
    fn sleeps_are_measured_and_a_host_wake_restarts_the_spell() {
        let mut b = Backoff::new(10_000);
        b.slept(2_000, 62_000, false);
        b.slept(4_000, 5_000, false);
        assert_eq!(b.counters.sleep_taken_ns, 67_000);
        assert_eq!(
            (
                b.counters.timeouts,
                b.counters.oversleep_ns,
                b.counters.max_oversleep_ns
            ),
            (2, 61_000, 60_000)
        );
        idle_run(&mut b, 0, PAUSE_NS + 100, 100);
        b.slept(2_000, 700, true);
        assert_eq!(b.counters.host_wakes, 1);
        assert_eq!(
            b.next(PAUSE_NS + 200, Outlook::PACKETS),
            Idle::Poll,
            "busy again"
        );
        idle_run(&mut b, PAUSE_NS + 300, 3 * PAUSE_NS, 100);
        b.skipped();
        assert_eq!(b.counters.skipped, 1);
        assert_eq!(
            b.next(3 * PAUSE_NS + 1, Outlook::PACKETS),
            Idle::Poll,
            "busy again"
        );
    }

    #[test]
    fn after_a_host_wake_with_no_packet_awaited_the_first_sleep_is_the_longest() {
        let quiet = Outlook::due_in(None);
        let mut b = Backoff::new(50_000);
        // Packets (or nothing yet) drove it: sleeps start short even with none awaited.
        idle_run(&mut b, 0, PAUSE_NS, 100);
        assert_eq!(b.next(PAUSE_NS, quiet), Idle::Sleep(FIRST_SLEEP_NS));
        // The host ended that sleep; the work is done and no reply is awaited.
        b.slept(FIRST_SLEEP_NS, 500, true);
        b.worked();
        let t0 = 1_000_000;
        idle_run(&mut b, t0, t0 + PAUSE_NS, 100);
        assert_eq!(b.next(t0 + PAUSE_NS, quiet), Idle::Sleep(50_000));
        // Host-driven, but a reply is awaited (a request in flight): short sleeps again.
        b.slept(50_000, 100, true);
        b.worked();
        let t1 = 2_000_000;
        idle_run(&mut b, t1, t1 + PAUSE_NS, 100);
        assert_eq!(
            b.next(t1 + PAUSE_NS, Outlook::PACKETS),
            Idle::Sleep(FIRST_SLEEP_NS)
        );
        // A packet found after a timed-out sleep: packet-driven, short sleeps from then on.
        b.slept(FIRST_SLEEP_NS, 2_500, false);
        b.worked();
        let t2 = 3_000_000;
        idle_run(&mut b, t2, t2 + PAUSE_NS, 100);
        assert_eq!(b.next(t2 + PAUSE_NS, quiet), Idle::Sleep(FIRST_SLEEP_NS));
    }

    #[test]
    fn a_worker_without_rx_queues_sleeps_straight_to_its_timer() {
        let mut b = Backoff::new(50_000).deaf();
        idle_run(&mut b, 0, PAUSE_NS, 100);
        let timer = |ns| Outlook::due_in(Some(ns));
        assert_eq!(b.next(PAUSE_NS, timer(37_000)), Idle::Sleep(37_000));
        assert_eq!(b.next(PAUSE_NS, timer(80_000)), Idle::Sleep(50_000));
    }

    #[test]
    fn the_parts_of_a_worker_add_up_to_the_sooner_timer_and_any_awaited_packet() {
        let o = Outlook::due_in(Some(7_000))
            .and(Outlook::due_in(None))
            .and(Outlook {
                due_in_ns: Some(9_000),
                awaits_packets: true,
            });
        assert_eq!(
            o,
            Outlook {
                due_in_ns: Some(7_000),
                awaits_packets: true
            }
        );
        assert_eq!(Outlook::due_in(None).and(Outlook::BUSY), Outlook::BUSY);
        assert!(
            !Outlook::due_in(None)
                .and(Outlook::due_in(None))
                .awaits_packets
        );
    }

    #[test]
    fn policies_parse_and_describe_themselves() {
        assert!(
            Polling::parse("adaptive", Some(20_000))
                .unwrap_err()
                .max_sleep
        );
        assert!(Polling::parse("busy", Some(5)).unwrap_err().max_sleep);
        assert!(!Polling::parse("lazy", Some(5)).unwrap_err().max_sleep);
        assert_eq!(Polling::parse("busy", None), Ok(Polling::Busy));
        assert_eq!(
            Polling::parse("adaptive", None),
            Ok(Polling::Adaptive {
                max_sleep_ns: DEFAULT_MAX_SLEEP_NS
            })
        );
        assert_eq!(
            Polling::parse("adaptive", Some(20)),
            Ok(Polling::Adaptive {
                max_sleep_ns: 20_000
            })
        );
        assert_eq!(
            Polling::parse("adaptive", Some(20_000))
                .unwrap_err()
                .to_string(),
            "a maximum sleep of 20000 µs is longer than 10000 µs"
        );
        assert_eq!(
            Polling::parse("busy", Some(5)).unwrap_err().to_string(),
            "a maximum sleep needs polling = \"adaptive\""
        );
        assert_eq!(
            Polling::parse("lazy", None).unwrap_err().to_string(),
            "\"lazy\" is not a policy (busy or adaptive)"
        );
        assert_eq!(
            Polling::Adaptive {
                max_sleep_ns: 50_000
            }
            .describe(),
            "adaptive polling (back off when idle, sleep at most 50 µs)"
        );
    }
}
