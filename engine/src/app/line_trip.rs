//! How far apart two cores are, as the host ↔ worker rings feel it: the time a cache line
//! takes to go from one core to the other and back.
//!
//! Every work request, completion, tag command and tag event crosses from the host's core to
//! a worker's or back in cache lines, so that time bounds what a worker does per iteration.
//! It depends on where the two cores sit: a few tens of nanoseconds between cores that share
//! a cache, several hundred across sockets, or across the dies of a large CPU. A virtual
//! machine's vCPUs can move between such places while it runs, so one build measured twice
//! on the same VM can give two different figures (`docs/benchmarking.md`, "What the figures
//! mean"): a benchmark measures this beside its figures, so that each says where it ran.
//!
//! Two threads, one pinned to each core, pass a counter back and forth through one line:
//! each waits for the other's value, then writes the next. A round trip is two transfers of
//! the line. The figure is the median over a few batches, after a warm-up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Round trips timed per batch.
const TRIPS: u64 = 2_000;
/// Batches timed (the median is the figure); one more before them warms up.
const BATCHES: usize = 5;
/// A measurement gives up after this long: a core the other thread cannot get (a busy
/// worker's, or one the process may not run on) answers in scheduler slices, not lines.
const DEADLINE: Duration = Duration::from_millis(200);

/// One measured pair of cores, as a benchmark reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LineTrip {
    /// The host thread's core.
    pub from_cpu: u32,
    /// A worker's core, and the worker threads that ran on it.
    pub to_cpu: u32,
    pub workers: Vec<String>,
    /// Nanoseconds a round trip (`None`: not measured, `error` says why).
    pub round_trip_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a pair of cores was not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TripError {
    #[error("the same core")]
    SameCore,
    #[error("a thread could not be pinned to core {0}")]
    Pin(usize),
    #[error("no answer within {} ms (the core is busy)", DEADLINE.as_millis())]
    NoAnswer,
}

/// Cores a Linux CPU set names (`CPU_SETSIZE`).
const CPU_SET_CORES: usize = 1024;

/// The line the two threads share, on a cache line (and the next, which the adjacent-line
/// prefetcher pulls with it) of its own.
#[repr(align(128))]
struct Line(AtomicU64);

/// Nanoseconds a cache line takes from core `a` to core `b` and back (the median of 5
/// batches of 2 000 trips). Takes a few milliseconds; run it while neither core is
/// busy, or it answers [`TripError::NoAnswer`].
pub fn line_round_trip(a: usize, b: usize) -> Result<f64, TripError> {
    if a == b {
        return Err(TripError::SameCore);
    }
    // A CPU set holds this many; a core beyond it is none of this process's.
    for core in [a, b] {
        if core >= CPU_SET_CORES {
            return Err(TripError::Pin(core));
        }
    }
    let line = Line(AtomicU64::new(0));
    let give_up = AtomicBool::new(false);
    let start = Instant::now();
    // Waits until the line holds `want`; false once either side gave up.
    let wait = |want: u64| -> bool {
        let mut spins = 0u32;
        loop {
            if line.0.load(Ordering::Acquire) == want {
                return true;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096)
                && (give_up.load(Ordering::Relaxed) || start.elapsed() > DEADLINE)
            {
                give_up.store(true, Ordering::Relaxed);
                return false;
            }
            std::hint::spin_loop();
        }
    };
    let total = TRIPS * (BATCHES as u64 + 1);
    std::thread::scope(|s| {
        let answerer = s.spawn(|| {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: b }) {
                give_up.store(true, Ordering::Relaxed);
                return Err(TripError::Pin(b));
            }
            for i in 0..total {
                if !wait(2 * i + 1) {
                    return Err(TripError::NoAnswer);
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
            Ok(())
        });
        let asker = s.spawn(|| {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: a }) {
                give_up.store(true, Ordering::Relaxed);
                return Err(TripError::Pin(a));
            }
            let mut batches = [0f64; BATCHES];
            for k in 0..=BATCHES {
                let t = Instant::now();
                for j in 0..TRIPS {
                    let i = k as u64 * TRIPS + j;
                    line.0.store(2 * i + 1, Ordering::Release);
                    if !wait(2 * i + 2) {
                        return Err(TripError::NoAnswer);
                    }
                }
                // The first batch warms up (the threads reach their cores, the line its
                // place); it is not counted.
                if k > 0 {
                    batches[k - 1] = t.elapsed().as_nanos() as f64 / TRIPS as f64;
                }
            }
            batches.sort_by(f64::total_cmp);
            Ok(batches[BATCHES / 2])
        });
        let asked = asker.join().unwrap_or(Err(TripError::NoAnswer));
        let answered = answerer.join().unwrap_or(Err(TripError::NoAnswer));
        // A side that could not be pinned says so, rather than the other's wait for it.
        match (asked, answered) {
            (_, Err(e @ TripError::Pin(_))) => Err(e),
            (Ok(ns), _) => Ok(ns),
            (Err(e), _) => Err(e),
        }
    })
}

/// [`line_round_trip`] from `host` to each distinct core of `cores`, in core order (the
/// caller names the workers on each).
pub fn line_trips(host: u32, cores: &[u32]) -> Vec<LineTrip> {
    let mut cores = cores.to_vec();
    cores.sort_unstable();
    cores.dedup();
    cores
        .into_iter()
        .map(|cpu| {
            let r = line_round_trip(host as usize, cpu as usize);
            LineTrip {
                from_cpu: host,
                to_cpu: cpu,
                workers: Vec::new(),
                round_trip_ns: r.ok(),
                error: r.err().map(|e| e.to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cores this process may run on.
    fn cores() -> Vec<usize> {
        core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect()
    }

    #[test]
    fn two_cores_pass_a_line_back_and_forth() {
        let cores = cores();
        let [a, b, ..] = cores[..] else {
            eprintln!("one core: nothing to measure");
            return;
        };
        // Other tests of this binary run beside it and may hold a core for a while: a few
        // tries, each of which gives up after `DEADLINE`.
        let ns = (0..5)
            .find_map(|_| match line_round_trip(a, b) {
                Ok(ns) => Some(ns),
                Err(TripError::NoAnswer) => {
                    std::thread::sleep(Duration::from_millis(50));
                    None
                }
                Err(e) => panic!("{e}"),
            })
            .expect("two cores answer within five tries");
        // Two transfers of a line and the loop around them: more than a few nanoseconds,
        // far less than a scheduler slice. (A figure, not a timing target.)
        assert!(ns > 5.0 && ns < 100_000.0, "{ns} ns");
    }

    #[test]
    fn the_same_core_and_a_core_not_ours_are_refused() {
        assert_eq!(line_round_trip(0, 0), Err(TripError::SameCore));
        // A core past the machine's (the kernel refuses it), and one past any CPU set.
        let outside = cores().into_iter().max().unwrap_or(0) + 1;
        assert_eq!(line_round_trip(0, outside), Err(TripError::Pin(outside)));
        assert_eq!(line_round_trip(outside, 0), Err(TripError::Pin(outside)));
        assert_eq!(line_round_trip(0, 5000), Err(TripError::Pin(5000)));
    }

    #[test]
    fn one_trip_per_distinct_core() {
        let cores = cores();
        let [a, b, ..] = cores[..] else {
            return;
        };
        let (a, b) = (a as u32, b as u32);
        let t = line_trips(a, &[b, a, b]);
        let to: Vec<u32> = t.iter().map(|t| t.to_cpu).collect();
        let mut want = vec![a, b];
        want.sort_unstable();
        assert_eq!(to, want, "{t:?}");
        let host_core = t.iter().find(|t| t.to_cpu == a).unwrap();
        assert_eq!(host_core.round_trip_ns, None);
        assert_eq!(host_core.error.as_deref(), Some("the same core"));
        let other = t.iter().find(|t| t.to_cpu == b).unwrap();
        assert_eq!(other.from_cpu, a);
        // A figure, or (a core held by a test beside this one) why not.
        assert!(
            other.round_trip_ns.is_some() != other.error.is_some(),
            "{other:?}"
        );
    }
}
