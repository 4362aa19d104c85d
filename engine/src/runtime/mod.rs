//! Pinned run-to-completion workers.
//!
//! Each worker is a thread pinned to one core (and registered with EAL so mempool caches
//! work). It owns its RX and TX queues and one [`Stage`], and runs one loop until told to stop:
//!
//! ```text
//! loop {
//!     for each RX queue:  burst in  → stage.on_rx(...)      (moves packets to TX buffers)
//!     stage.on_poll(...)                                    (generators, timers; not while draining)
//!     for each TX buffer: burst out → drop or keep the unsent tail
//!     publish counters
//!     adaptive polling, when nothing was received or sent: poll on, pause, or sleep
//! }
//! ```
//!
//! A worker's [`Polling`] policy says how it waits when idle: `busy` polls on (dedicated
//! cores), `adaptive` backs off and sleeps, woken early by a host that posts work
//! ([`polling`], `dataplane::wake`).
//!
//! A panicking worker stops the whole engine, and its message is what the engine reports.

mod capture;
pub mod counter_set;
mod counters;
mod fault;
pub mod polling;

pub use capture::{CaptureSink, WorkerCapture};
pub use counter_set::{Combine, CounterDecl};
pub use counters::{
    Counters, LoopCounters, LoopSlot, STAGE_COUNTERS, SharedCounters, WorkerReport,
};
pub use fault::{
    CORRUPT_FROM, Fault, FaultConfig, FaultCounts, FaultInjector, FaultPlan, FaultSlot,
};
pub use polling::{IdleCounters, IdleSlot, Outlook, Polling};

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::dataplane::wake::{self, Wake, Woke};
use crate::dataplane::{Burst, Eal, RxQueue, ThreadRegistration, TxQueue};
use polling::{Backoff, Idle};

/// The work a worker does with the packets it receives, and any packets it makes itself.
pub trait Stage: Send {
    /// Short name shown in stats ("io", "generate", ...).
    fn name(&self) -> &'static str;

    /// Names of the stage counters (`Counters::stage[i]`), at most [`STAGE_COUNTERS`].
    fn counter_names(&self) -> &'static [&'static str] {
        &[]
    }

    /// Handles a burst received on input `input`. Whatever is left in `burst` afterwards is
    /// freed and counted as dropped.
    fn on_rx(&mut self, input: usize, burst: &mut Burst, out: &mut Outputs, c: &mut Counters);

    /// Called once per loop iteration, after RX; may fill TX buffers.
    fn on_poll(&mut self, _out: &mut Outputs, _c: &mut Counters) {}

    /// Called once when the loop ends, before the final counters are published.
    fn on_stop(&mut self, _c: &mut Counters) {}

    /// True once a stage with a finite job (a generator with a count, a checker with an
    /// expected count) has finished it. The engine stops when every finite stage is done.
    fn is_finite(&self) -> bool {
        false
    }

    fn is_done(&self) -> bool {
        false
    }

    /// Told once, before the first iteration, which policy the worker runs.
    fn start(&mut self, _polling: Polling) {}

    /// Adaptive polling, on an iteration that received and sent nothing: when the stage next
    /// needs a poll if nothing arrives, and whether it awaits packets ([`Outlook`]). The
    /// default, [`Outlook::BUSY`], keeps a stage that does not say polling busily.
    fn outlook(&mut self) -> Outlook {
        Outlook::BUSY
    }

    /// Adaptive polling: the host → worker paths whose posts end this worker's sleeps.
    fn wakes(&self) -> Vec<Arc<Wake>> {
        Vec::new()
    }

    /// Adaptive polling, asked once the worker raised its sleep flags: whether a host posted
    /// work since the last iteration (then the worker does not sleep).
    fn host_work_pending(&self) -> bool {
        false
    }

    /// The worker slept `ns` on purpose (a stage's clock may count it as time that passed,
    /// not as a stall).
    fn slept(&mut self, _ns: u64) {}
}

/// What happens to packets a TX queue does not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxPolicy {
    /// Free them and count drops (forwarding: never stall RX behind a full TX ring).
    DropUnsent,
    /// Keep them for the next iteration (generators: back-pressure, no loss).
    KeepUnsent,
}

struct TxPath {
    queue: TxQueue,
    buf: Burst,
    policy: TxPolicy,
}

/// The TX side of a worker: one buffer per TX queue, flushed every loop iteration.
pub struct Outputs {
    paths: Vec<TxPath>,
}

impl Outputs {
    /// Number of TX queues.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// The buffer that output `i` transmits at the end of this iteration.
    #[inline]
    pub fn buffer(&mut self, i: usize) -> &mut Burst {
        &mut self.paths[i].buf
    }

    /// Sends what every buffer holds; applies each path's policy to the unsent rest.
    #[inline]
    fn flush(&mut self, c: &mut Counters, mut capture: Option<&mut WorkerCapture>) -> usize {
        let mut total = 0;
        for p in &mut self.paths {
            if p.buf.is_empty() {
                continue;
            }
            if let Some(t) = capture.as_deref_mut() {
                t.stage_outbound(p.queue.port_id(), &p.buf);
            }
            let (sent, bytes) = p.buf.tx(&mut p.queue);
            if let Some(t) = capture.as_deref_mut() {
                t.commit_outbound(sent);
            }
            total += sent;
            c.io.tx_packets += sent as u64;
            c.io.tx_bytes += bytes;
            if p.policy == TxPolicy::DropUnsent && !p.buf.is_empty() {
                c.io.drops += p.buf.len() as u64;
                p.buf.clear();
            }
        }
        total
    }

    fn holds_packets(&self) -> bool {
        self.paths.iter().any(|p| !p.buf.is_empty())
    }
}

/// Loop iterations between two readings of the worker's CPU time (a power of two, a multiple
/// of the counters' publishing period).
const CPU_EVERY: u64 = 1 << 16;

type LoopFn = dyn FnOnce(&WorkerCtx, LoopParts) + Send;

/// What the loop owns besides its stage.
struct LoopParts {
    rx: Vec<RxQueue>,
    tx: Vec<(TxQueue, TxPolicy)>,
    burst: usize,
    faults: Option<FaultInjector>,
    capture: Option<WorkerCapture>,
    polling: Polling,
}

/// A stage, ready to run on a worker. The type is erased only at the thread boundary: the loop
/// that runs the stage is compiled for its concrete type, so `on_rx`/`on_poll` are inlined
/// into the loop instead of called through a vtable once per burst.
pub struct StageBox {
    name: &'static str,
    counter_names: &'static [&'static str],
    finite: bool,
    run: Box<LoopFn>,
}

impl StageBox {
    pub fn new<S: Stage + 'static>(stage: S) -> Self {
        StageBox {
            name: stage.name(),
            counter_names: stage.counter_names(),
            finite: stage.is_finite(),
            run: Box::new(move |ctx: &WorkerCtx, parts| ctx.run_loop(stage, parts)),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// Everything one worker needs; moved into its thread.
pub struct WorkerSpec {
    pub name: String,
    /// Core to pin to; `None` leaves the thread unpinned (tests).
    pub core: Option<usize>,
    pub rx: Vec<RxQueue>,
    pub tx: Vec<(TxQueue, TxPolicy)>,
    /// Packets asked for per RX burst (1..=256).
    pub burst: usize,
    pub stage: StageBox,
    /// Faults to inject into what this worker receives, before its stage sees it.
    pub faults: Option<FaultInjector>,
    /// Capture of what this worker's ports receive and send (`--pcap`).
    pub capture: Option<WorkerCapture>,
    /// How the worker waits when idle.
    pub polling: Polling,
}

/// Why the engine stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    WorkerPanicked(String),
    #[error("worker {worker}: {reason}")]
    Setup { worker: String, reason: String },
    #[error("could not start worker thread {worker}: {source}")]
    Spawn {
        worker: String,
        source: std::io::Error,
    },
}

/// What a reader needs of one worker's counters: its names and the block it publishes into.
#[derive(Clone)]
struct WorkerView {
    name: String,
    core: Option<usize>,
    stage: &'static str,
    counter_names: &'static [&'static str],
    counters: Arc<SharedCounters>,
}

impl WorkerView {
    fn report(&self) -> WorkerReport {
        WorkerReport::new(
            &self.name,
            self.core,
            self.stage,
            self.counter_names,
            &self.counters.read(),
        )
    }
}

/// The workers' counters as they last published them, readable from any thread while the
/// engine runs and after it stopped (it shares the counter blocks, nothing else): what
/// telemetry reads.
#[derive(Clone)]
pub struct CounterReader {
    workers: Vec<WorkerView>,
}

impl CounterReader {
    /// The same as [`Runtime::reports`].
    pub fn reports(&self) -> Vec<WorkerReport> {
        self.workers.iter().map(WorkerView::report).collect()
    }
}

struct WorkerHandle {
    view: WorkerView,
    finite: bool,
    done: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

/// A running set of workers.
pub struct Runtime {
    stop: Arc<AtomicBool>,
    drain: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<RuntimeError>>>,
    workers: Vec<WorkerHandle>,
}

impl Runtime {
    /// Starts one thread per spec. Threads are pinned to their core and, when EAL runs,
    /// registered as EAL threads.
    pub fn start(specs: Vec<WorkerSpec>) -> Result<Runtime, RuntimeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let drain = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let mut rt = Runtime {
            stop: stop.clone(),
            drain: drain.clone(),
            failure: failure.clone(),
            workers: Vec::new(),
        };
        for spec in specs {
            let counters = Arc::new(SharedCounters::default());
            let done = Arc::new(AtomicBool::new(false));
            let mut handle = WorkerHandle {
                view: WorkerView {
                    name: spec.name.clone(),
                    core: spec.core,
                    stage: spec.stage.name,
                    counter_names: spec.stage.counter_names,
                    counters: counters.clone(),
                },
                finite: spec.stage.finite,
                done: done.clone(),
                join: None,
            };
            let ctx = WorkerCtx {
                stop: stop.clone(),
                drain: drain.clone(),
                failure: failure.clone(),
                counters,
                done,
            };
            let name = spec.name.clone();
            let join = std::thread::Builder::new()
                .name(format!("portico-{name}"))
                .spawn(move || ctx.run(spec))
                .map_err(|source| RuntimeError::Spawn {
                    worker: name,
                    source,
                });
            match join {
                Ok(j) => handle.join = Some(j),
                Err(e) => {
                    rt.stop();
                    rt.join_all();
                    return Err(e);
                }
            }
            rt.workers.push(handle);
        }
        Ok(rt)
    }

    /// Stops `on_poll` (so generators send nothing new) while RX and TX go on: what is in
    /// flight still arrives and is counted before [`Runtime::stop`].
    pub fn drain(&self) {
        self.drain.store(true, Ordering::Relaxed);
    }

    /// Asks every worker to stop after its current iteration.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn is_stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// True when there is at least one finite stage and all of them are done.
    pub fn finite_work_done(&self) -> bool {
        let mut finite = self.workers.iter().filter(|w| w.finite).peekable();
        finite.peek().is_some() && finite.all(|w| w.done.load(Ordering::Acquire))
    }

    /// True when a worker has failed (panicked or could not set itself up).
    pub fn has_failed(&self) -> bool {
        self.failure.lock().map(|f| f.is_some()).unwrap_or(true)
    }

    /// The counters every worker last published.
    pub fn reports(&self) -> Vec<WorkerReport> {
        self.workers.iter().map(|w| w.view.report()).collect()
    }

    /// A reader of the counters that [`Runtime::reports`] reads, for another thread.
    pub fn counter_reader(&self) -> CounterReader {
        CounterReader {
            workers: self.workers.iter().map(|w| w.view.clone()).collect(),
        }
    }

    fn join_all(&mut self) {
        for w in &mut self.workers {
            if let Some(j) = w.join.take() {
                // Worker bodies catch their own panics; a join error cannot carry more.
                let _ = j.join();
            }
        }
    }

    /// Stops and joins every worker; returns their final counters, or the first failure.
    pub fn join(mut self) -> Result<Vec<WorkerReport>, RuntimeError> {
        self.stop();
        self.join_all();
        let reports = self.reports();
        match self.failure.lock().ok().and_then(|mut f| f.take()) {
            Some(e) => Err(e),
            None => Ok(reports),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
        self.join_all();
    }
}

struct WorkerCtx {
    stop: Arc<AtomicBool>,
    drain: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<RuntimeError>>>,
    counters: Arc<SharedCounters>,
    done: Arc<AtomicBool>,
}

impl WorkerCtx {
    fn fail(&self, e: RuntimeError) {
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(e);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    fn run(self, spec: WorkerSpec) {
        let name = spec.name.clone();
        let core = spec.core;
        if let Some(core) = core
            && !core_affinity::set_for_current(core_affinity::CoreId { id: core })
        {
            self.fail(RuntimeError::Setup {
                worker: name,
                reason: format!("cannot pin to core {core}"),
            });
            return;
        }
        let _registration = if Eal::get().is_some() {
            match ThreadRegistration::register() {
                Ok(r) => Some(r),
                Err(e) => {
                    self.fail(RuntimeError::Setup {
                        worker: name,
                        reason: e.to_string(),
                    });
                    return;
                }
            }
        } else {
            None
        };
        let WorkerSpec {
            rx,
            tx,
            burst,
            stage,
            faults,
            capture,
            polling,
            ..
        } = spec;
        let parts = LoopParts {
            rx,
            tx,
            burst,
            faults,
            capture,
            polling,
        };
        let result = catch_unwind(AssertUnwindSafe(|| (stage.run)(&self, parts)));
        if let Err(payload) = result {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_string());
            let at = core.map(|c| format!(" (core {c})")).unwrap_or_default();
            self.fail(RuntimeError::WorkerPanicked(format!(
                "worker {name}{at} panicked: {msg}"
            )));
        }
    }

    fn run_loop<S: Stage>(&self, mut stage: S, parts: LoopParts) {
        let LoopParts {
            mut rx,
            tx,
            burst: burst_size,
            mut faults,
            mut capture,
            polling,
        } = parts;
        // With faults on, a burst must have room for a duplicate of every packet.
        let max = if faults.is_some() {
            crate::dataplane::MAX_BURST / 2
        } else {
            crate::dataplane::MAX_BURST
        };
        let burst_size = burst_size.clamp(1, max);
        let mut out = Outputs {
            paths: tx
                .into_iter()
                .map(|(queue, policy)| TxPath {
                    queue,
                    buf: Burst::new(),
                    policy,
                })
                .collect(),
        };
        let mut burst = Burst::new();
        let mut c = Counters::default();
        // Only stages with a finite job are asked whether it is done.
        let mut watch_done = stage.is_finite();
        stage.start(polling);
        let mut backoff = match polling {
            Polling::Busy => None,
            Polling::Adaptive { max_sleep_ns } if rx.is_empty() => {
                Some(Backoff::new(max_sleep_ns).deaf())
            }
            Polling::Adaptive { max_sleep_ns } => Some(Backoff::new(max_sleep_ns)),
        };
        let wakes = stage.wakes();
        if backoff.is_some() {
            for w in &wakes {
                w.arm();
            }
            // Linux ends sleeps up to 50 µs late by default, longer than most sleeps here.
            // Without the setting, sleeps are longer; nothing else changes.
            let _ = wake::set_timer_slack_ns(1);
        }
        let wakes: Vec<&Wake> = wakes.iter().map(|w| &**w).collect();
        let epoch = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let mut received = 0;
            for (i, q) in rx.iter_mut().enumerate() {
                let n = burst.rx(q, burst_size);
                if n == 0 {
                    continue;
                }
                received += n;
                c.io.rx_packets += n as u64;
                c.io.rx_bytes += burst.bytes();
                if let Some(t) = capture.as_mut() {
                    t.inbound(q.port_id(), &burst);
                }
                if let Some(f) = faults.as_mut() {
                    f.apply(&mut burst, &mut c.faults);
                }
                stage.on_rx(i, &mut burst, &mut out, &mut c);
                if !burst.is_empty() {
                    c.io.drops += burst.len() as u64;
                    burst.clear();
                }
            }
            if !self.drain.load(Ordering::Relaxed) {
                stage.on_poll(&mut out, &mut c);
            }
            let sent = out.flush(&mut c, capture.as_mut());
            let worked = received > 0 || sent > 0;
            if !worked {
                c.io.empty_polls += 1;
            }
            c.io.loops += 1;
            if let Some(b) = backoff.as_mut() {
                let idle = if worked {
                    b.worked();
                    Idle::Poll
                } else {
                    // Packets a full TX queue did not take are work not done yet.
                    let outlook = if out.holds_packets() {
                        Outlook::BUSY
                    } else {
                        stage.outlook()
                    };
                    b.next(epoch.elapsed().as_nanos() as u64, outlook)
                };
                match idle {
                    Idle::Poll => {}
                    Idle::Pause(n) => {
                        for _ in 0..n {
                            std::hint::spin_loop();
                        }
                    }
                    Idle::Sleep(ns) => {
                        let t0 = Instant::now();
                        let woke = wake::sleep(&wakes, ns, || {
                            stage.host_work_pending() || self.stop.load(Ordering::Relaxed)
                        });
                        let taken = t0.elapsed().as_nanos() as u64;
                        match woke {
                            Woke::Pending => b.skipped(),
                            _ => {
                                b.slept(ns, taken, woke == Woke::Host);
                                stage.slept(taken);
                            }
                        }
                    }
                }
            }
            // Every 8th iteration is fresh enough for a once-a-second reader; the final values
            // are published when the loop ends.
            if c.io.loops % 8 == 0 {
                if let Some(b) = &backoff {
                    c.idle = b.counters;
                }
                // A clock read costs a system call: about once a second when busy.
                if c.io.loops % CPU_EVERY == 0 {
                    c.cpu_ns = wake::thread_cpu_ns();
                    c.wall_ns = epoch.elapsed().as_nanos() as u64;
                }
                self.counters.publish(&c);
            }
            if watch_done && stage.is_done() && !out.holds_packets() {
                watch_done = false;
                self.done.store(true, Ordering::Release);
            }
        }
        stage.on_stop(&mut c);
        if let Some(b) = &backoff {
            c.idle = b.counters;
        }
        c.cpu_ns = wake::thread_cpu_ns();
        c.wall_ns = epoch.elapsed().as_nanos() as u64;
        self.counters.publish(&c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    struct Ticker {
        polls: u64,
        panic_at: Option<u64>,
        finish_at: Option<u64>,
    }

    impl Stage for Ticker {
        fn name(&self) -> &'static str {
            "ticker"
        }
        fn counter_names(&self) -> &'static [&'static str] {
            &["polls"]
        }
        fn on_rx(&mut self, _: usize, _: &mut Burst, _: &mut Outputs, _: &mut Counters) {}
        fn on_poll(&mut self, _: &mut Outputs, c: &mut Counters) {
            self.polls += 1;
            c.stage[0] = self.polls;
            if Some(self.polls) == self.panic_at {
                panic!("injected failure after {} polls", self.polls);
            }
        }
        fn is_finite(&self) -> bool {
            self.finish_at.is_some()
        }
        fn is_done(&self) -> bool {
            self.finish_at.is_some_and(|n| self.polls >= n)
        }
    }

    fn spec(name: &str, t: Ticker) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            core: None,
            rx: vec![],
            tx: vec![],
            burst: 32,
            stage: StageBox::new(t),
            faults: None,
            capture: None,
            polling: Polling::Busy,
        }
    }

    fn wait_until(deadline: Duration, f: impl Fn() -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn a_panicking_worker_stops_the_engine_with_its_message() {
        let rt = Runtime::start(vec![
            spec(
                "steady",
                Ticker {
                    polls: 0,
                    panic_at: None,
                    finish_at: None,
                },
            ),
            spec(
                "faulty",
                Ticker {
                    polls: 0,
                    panic_at: Some(1000),
                    finish_at: None,
                },
            ),
        ])
        .unwrap();
        assert!(wait_until(Duration::from_secs(10), || rt.is_stopping()));
        let err = rt.join().unwrap_err().to_string();
        assert!(err.contains("worker faulty panicked"), "{err}");
        assert!(err.contains("injected failure after 1000 polls"), "{err}");
    }

    #[test]
    fn finite_stages_report_done_and_counters_are_published() {
        let rt = Runtime::start(vec![
            spec(
                "forever",
                Ticker {
                    polls: 0,
                    panic_at: None,
                    finish_at: None,
                },
            ),
            spec(
                "job",
                Ticker {
                    polls: 0,
                    panic_at: None,
                    finish_at: Some(500),
                },
            ),
        ])
        .unwrap();
        assert!(wait_until(Duration::from_secs(10), || rt.finite_work_done()));
        let reports = rt.join().unwrap();
        let job = reports.iter().find(|r| r.worker == "job").unwrap();
        assert!(job.counter("polls").unwrap() >= 500);
        assert_eq!(job.io.loops, job.counter("polls").unwrap());
        assert_eq!(
            job.io.empty_polls, job.io.loops,
            "no RX queues: every poll is empty"
        );
    }

    /// A stage with work only when the test posts some, woken by the test's posts.
    struct Idler {
        posted: Arc<std::sync::atomic::AtomicU64>,
        taken: Arc<std::sync::atomic::AtomicU64>,
        wake: Arc<Wake>,
    }

    impl Stage for Idler {
        fn name(&self) -> &'static str {
            "idler"
        }
        fn on_rx(&mut self, _: usize, _: &mut Burst, _: &mut Outputs, _: &mut Counters) {}
        fn on_poll(&mut self, _: &mut Outputs, _: &mut Counters) {
            let n = self.posted.swap(0, Ordering::Acquire);
            self.taken.fetch_add(n, Ordering::Release);
        }
        fn outlook(&mut self) -> Outlook {
            Outlook::PACKETS
        }
        fn wakes(&self) -> Vec<Arc<Wake>> {
            vec![self.wake.clone()]
        }
        fn host_work_pending(&self) -> bool {
            self.posted.load(Ordering::Acquire) > 0
        }
    }

    #[test]
    fn an_adaptive_worker_sleeps_when_idle_and_a_post_wakes_it() {
        use std::sync::atomic::AtomicU64;
        let posted = Arc::new(AtomicU64::new(0));
        let taken = Arc::new(AtomicU64::new(0));
        let wake = Arc::new(Wake::new());
        let mut s = spec(
            "idler",
            Ticker {
                polls: 0,
                panic_at: None,
                finish_at: None,
            },
        );
        s.stage = StageBox::new(Idler {
            posted: posted.clone(),
            taken: taken.clone(),
            wake: wake.clone(),
        });
        // Sleeps of up to 10 ms: a post that had to wait for one to end would be slow, but
        // only the counters are asserted.
        s.polling = Polling::Adaptive {
            max_sleep_ns: 10_000_000,
        };
        let rt = Runtime::start(vec![s]).unwrap();
        assert!(wait_until(Duration::from_secs(10), || {
            rt.reports()[0].idle.slept >= 10
        }));
        for k in 1..=20 {
            // Let it fall asleep again, then post.
            std::thread::sleep(Duration::from_millis(3));
            posted.fetch_add(1, Ordering::Release);
            wake.notify();
            assert!(wait_until(Duration::from_secs(10), || {
                taken.load(Ordering::Acquire) == k
            }));
        }
        let r = rt.join().unwrap();
        let i = r[0].idle;
        assert_eq!(taken.load(Ordering::Acquire), 20);
        assert!(i.host_wakes >= 1, "{i:?}");
        assert_eq!(i.timeouts + i.host_wakes + i.skipped, i.slept, "{i:?}");
        assert!(i.sleep_taken_ns > 0 && r[0].io.empty_polls > 0);
        // Asleep most of the time: far less CPU than time.
        assert!(r[0].cpu_ns < r[0].wall_ns, "{:?}", r[0]);
    }

    #[test]
    fn without_finite_stages_work_is_never_done() {
        let rt = Runtime::start(vec![spec(
            "forever",
            Ticker {
                polls: 0,
                panic_at: None,
                finish_at: None,
            },
        )])
        .unwrap();
        assert!(!rt.finite_work_done());
        rt.join().unwrap();
    }
}
