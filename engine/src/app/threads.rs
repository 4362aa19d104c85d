//! Where this process's threads run: the host thread, the pinned workers and the threads EAL
//! starts for itself (its interrupt thread, the multi-process channel, telemetry), read from
//! `/proc/self/task`. A benchmark reports it, so that a figure says which cores its threads
//! shared: on a small machine EAL's service threads may sit on a worker's core.
//!
//! Each thread's allowed CPUs come from `Cpus_allowed_list` in its `status` and the CPU it
//! last ran on from field 39 (`processor`) of its `stat`.

use serde::Serialize;

use super::line_trip::{LineTrip, line_trips};

/// One thread: its name (`comm`, at most 15 bytes), its allowed CPUs as the kernel lists them
/// (`0-1`, `3`), and the CPU it last ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadPlace {
    pub name: String,
    pub tid: u32,
    pub cpus: String,
    pub last_cpu: Option<u32>,
}

/// The threads of a run by role.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CoresReport {
    /// The thread that called [`CoresReport::sample`] (the bench's host loop, EAL's main lcore).
    pub host: Option<ThreadPlace>,
    /// Threads named `portico-*`: the workers (and a flusher, when one runs).
    pub workers: Vec<ThreadPlace>,
    /// Every other thread: EAL's (`eal-intr-thread`, `rte_mp_handle`, `telemetry-v2`, ...), and
    /// the `ctrl-c` crate's signal thread, which sleeps.
    pub eal_threads: Vec<ThreadPlace>,
    /// A cache line's round trip from the host's core to each worker's, measured once the
    /// workers stopped ([`CoresReport::measure_line_trips`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub line_trips: Vec<LineTrip>,
    /// The same from the host's core to the cores the workers were about to start on,
    /// measured just before they started (their threads not named yet). A virtual machine
    /// can move its vCPUs while a run goes on: two figures far apart say it did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub line_trips_before: Vec<LineTrip>,
}

/// The allowed-CPU list of a `/proc/<pid>/task/<tid>/status` text.
pub fn cpus_allowed(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// The CPU a thread last ran on, from its `stat` text: field 39, counted after the command
/// name (which may hold spaces and parentheses, so the fields start after the last `)`).
pub fn last_cpu(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (state); field 39 is the 37th from there.
    rest.split_whitespace().nth(36)?.parse().ok()
}

fn read_place(task: &std::path::Path, tid: u32) -> Option<ThreadPlace> {
    let name = std::fs::read_to_string(task.join("comm")).ok()?;
    let status = std::fs::read_to_string(task.join("status")).ok()?;
    let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
    Some(ThreadPlace {
        name: name.trim_end().to_string(),
        tid,
        cpus: cpus_allowed(&status).unwrap_or_default(),
        last_cpu: last_cpu(&stat),
    })
}

/// The CPU the calling thread runs on (as `/proc/thread-self/stat` last saw it).
pub fn current_cpu() -> Option<u32> {
    last_cpu(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// The calling thread's id.
fn own_tid() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

impl CoresReport {
    /// Reads every thread of this process now (while the workers run). Threads that end
    /// while they are read are left out; no `/proc` (not Linux) gives an empty report.
    pub fn sample() -> CoresReport {
        let me = own_tid();
        let mut report = CoresReport::default();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return report;
        };
        let mut places: Vec<ThreadPlace> = dir
            .flatten()
            .filter_map(|e| {
                let tid = e.file_name().to_str()?.parse().ok()?;
                read_place(&e.path(), tid)
            })
            .collect();
        places.sort_by_key(|p| p.tid);
        for p in places {
            if Some(p.tid) == me {
                report.host = Some(p);
            } else if p.name.starts_with("portico-") {
                report.workers.push(p);
            } else {
                report.eal_threads.push(p);
            }
        }
        // Listing /proc/self/task while other threads start and end can skip entries (the
        // directory is walked by thread id): the calling thread is read by its own path.
        if report.host.is_none()
            && let Some(tid) = me
        {
            report.host = read_place(std::path::Path::new("/proc/thread-self"), tid);
        }
        report
    }

    /// Measures a cache line's round trip from the core the host thread last ran on to each
    /// core a worker last ran on ([`super::line_round_trip`]), into `line_trips`. Call it once
    /// the workers stopped: a busy worker's core does not answer. A few milliseconds a core.
    pub fn measure_line_trips(&mut self) {
        let Some(host) = self.host.as_ref().and_then(|h| h.last_cpu) else {
            return;
        };
        let cores: Vec<u32> = self.workers.iter().filter_map(|w| w.last_cpu).collect();
        self.line_trips = line_trips(host, &cores);
        for t in &mut self.line_trips {
            t.workers = self
                .workers
                .iter()
                .filter(|w| w.last_cpu == Some(t.to_cpu))
                .map(|w| w.name.clone())
                .collect();
        }
    }

    /// The measured round trips, one line: `cache-line round trip from the host's core 0:
    /// core 1 (portico-tag) 50 ns (52 ns before the run)`, or `None` when none was measured.
    /// A figure more than twice the other's, before against after, is pointed out.
    pub fn trips_line(&self) -> Option<String> {
        let first = self.line_trips.first()?;
        let figure = |t: &LineTrip| match (t.round_trip_ns, &t.error) {
            (Some(ns), _) => format!("{ns:.0} ns"),
            (None, Some(e)) => format!("not measured ({e})"),
            (None, None) => "not measured".into(),
        };
        let one = |t: &LineTrip| {
            let mut s = format!("core {} ({}) {}", t.to_cpu, t.workers.join(", "), figure(t));
            if let Some(b) = self.line_trips_before.iter().find(|b| b.to_cpu == t.to_cpu) {
                s += &format!(" ({} before the run", figure(b));
                if let (Some(x), Some(y)) = (b.round_trip_ns, t.round_trip_ns)
                    && x.max(y) > 2.0 * x.min(y)
                {
                    s += ": the cores moved during the run";
                }
                s += ")";
            }
            s
        };
        let all: Vec<String> = self.line_trips.iter().map(one).collect();
        Some(format!(
            "cache-line round trip from the host's core {}: {}",
            first.from_cpu,
            all.join("; ")
        ))
    }

    /// One line: `host 0, workers portico-rdma0 0 (last 0), ...; EAL threads eal-intr-thread 0-1 ...`.
    pub fn line(&self) -> String {
        let place = |p: &ThreadPlace| match p.last_cpu {
            Some(c) => format!("{} on {} (last {c})", p.name, p.cpus),
            None => format!("{} on {}", p.name, p.cpus),
        };
        let list = |v: &[ThreadPlace]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter().map(place).collect::<Vec<_>>().join(", ")
            }
        };
        format!(
            "host {}; workers {}; EAL threads {}",
            self.host.as_ref().map(place).unwrap_or_else(|| "?".into()),
            list(&self.workers),
            list(&self.eal_threads)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_stat_are_read() {
        let status =
            "Name:\tportico-rdma0\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed:\t1\n";
        assert_eq!(cpus_allowed(status).as_deref(), Some("0-1"));
        assert_eq!(cpus_allowed("Name:\tx\n"), None);
        // A command name with a space and a parenthesis; processor (field 39) is 1.
        let stat = "4242 (eal (intr) x) S 1 4242 4242 0 -1 4194368 100 0 0 0 5 6 0 0 20 0 4 0 \
                    12345 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(last_cpu(stat), Some(1));
        assert_eq!(last_cpu("4242 (x) S 1 2"), None);
        assert_eq!(last_cpu("no parenthesis"), None);
    }

    fn place(name: &str, cpu: u32) -> ThreadPlace {
        ThreadPlace {
            name: name.into(),
            tid: 1,
            cpus: cpu.to_string(),
            last_cpu: Some(cpu),
        }
    }

    #[test]
    fn the_round_trips_are_one_line() {
        let mut r = CoresReport::default();
        assert_eq!(r.trips_line(), None, "none measured: no line");
        r.line_trips = vec![
            LineTrip {
                from_cpu: 0,
                to_cpu: 1,
                workers: vec!["portico-tag".into(), "portico-plain".into()],
                round_trip_ns: Some(50.4),
                error: None,
            },
            LineTrip {
                from_cpu: 0,
                to_cpu: 0,
                workers: vec!["portico-x".into()],
                round_trip_ns: None,
                error: Some("the same core".into()),
            },
        ];
        assert_eq!(
            r.trips_line().unwrap(),
            "cache-line round trip from the host's core 0: core 1 (portico-tag, portico-plain) \
             50 ns; core 0 (portico-x) not measured (the same core)"
        );
        // Measured before the run too: beside each core's figure; one more than twice the
        // other is pointed out.
        let before = |ns: f64| LineTrip {
            from_cpu: 0,
            to_cpu: 1,
            workers: vec![],
            round_trip_ns: Some(ns),
            error: None,
        };
        r.line_trips_before = vec![before(90.0)];
        assert!(
            r.trips_line()
                .unwrap()
                .contains("core 1 (portico-tag, portico-plain) 50 ns (90 ns before the run); "),
            "{:?}",
            r.trips_line()
        );
        r.line_trips_before = vec![before(390.0)];
        assert!(
            r.trips_line()
                .unwrap()
                .contains("50 ns (390 ns before the run: the cores moved during the run); core 0"),
            "{:?}",
            r.trips_line()
        );
    }

    #[test]
    fn a_report_measures_from_the_host_s_core_to_its_workers() {
        let ids: Vec<u32> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .iter()
            .map(|c| c.id as u32)
            .collect();
        let [a, b, ..] = ids[..] else {
            return;
        };
        let mut r = CoresReport {
            host: Some(place("portico", a)),
            workers: vec![place("portico-rdma", b), place("portico-tag", b)],
            ..CoresReport::default()
        };
        r.measure_line_trips();
        assert_eq!(r.line_trips.len(), 1, "{:?}", r.line_trips);
        let t = &r.line_trips[0];
        assert_eq!((t.from_cpu, t.to_cpu), (a, b));
        assert_eq!(t.workers, ["portico-rdma", "portico-tag"]);
        // A figure, or (a core held by a test beside this one) why not.
        assert!(t.round_trip_ns.is_some() != t.error.is_some(), "{t:?}");
        // No host core known: nothing measured.
        r.host = None;
        r.line_trips.clear();
        r.measure_line_trips();
        assert!(r.line_trips.is_empty());
    }

    #[test]
    fn this_process_is_sampled() {
        let r = CoresReport::sample();
        let host = r.host.clone().expect("the calling thread");
        assert!(!host.cpus.is_empty());
        assert!(host.last_cpu.is_some());
        assert!(r.line().starts_with("host "));
    }
}
