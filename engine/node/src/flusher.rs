//! The flusher: makes ranges durable off the worker loop.
//!
//! On a file in the page cache, persisting is `msync(MS_SYNC)`, a system call that waits for
//! the disk (0.15 to 0.5 ms per page on this project's VMs). A worker that waited in it would
//! stop every queue pair it serves. So the engine hands such persists to one flusher thread:
//! the worker sends [`PersistJob`]s over a bounded channel (no allocation per job), and the
//! flusher takes every job waiting, merges the ranges of each mapping, persists them with one
//! `persist_ranges` per mapping, and publishes the last ticket of the batch as the persisted
//! watermark (a release store; the worker reads it with acquire). Tickets complete in order,
//! and the more jobs wait, the more one `msync` covers: batching comes from load.
//!
//! The thread is started from a worker, whose pinning it would inherit: sharing the busy-polling
//! worker's core, it would run only when the scheduler's tick preempts the worker (every 4 ms
//! at HZ 250), and every persist would wait that long. So it moves itself to the first online
//! core outside the worker's affinity (it mostly sleeps in the kernel, so it costs that core
//! little); on a machine with no such core it stays where it is.
//!
//! DAX mappings never come here (their persist is a few cache-line write-backs, done on the
//! worker), nor does volatile memory (nothing to do).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam::channel::{self, Receiver, Sender, TrySendError};

use proto::transport::PersistJob;

/// Jobs in flight between the worker and the flusher.
const DEPTH: usize = 4096;
/// Jobs one batch takes at most.
const BATCH: usize = 512;

/// The worker's handle on its flusher thread. Dropping it lets the thread finish the jobs it
/// was given, then joins it.
pub struct Flusher {
    jobs: Option<Sender<PersistJob>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Every ticket up to this one is durable.
    done: AtomicU64,
    /// The first ticket whose persist failed (0: none). The watermark stops before it.
    failed: AtomicU64,
    /// Batches and persist calls made (for the summary).
    batches: AtomicU64,
}

impl Flusher {
    /// Starts the flusher thread, off the calling worker's cores when the machine has others.
    pub fn spawn() -> std::io::Result<Flusher> {
        let worker: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .map(|s| parse_cpu_list(&s))
            .unwrap_or_default();
        let core = online.into_iter().find(|c| !worker.contains(c));
        let (tx, rx) = channel::bounded(DEPTH);
        let shared = Arc::new(Shared {
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            batches: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("portico-flush".into())
            .spawn(move || {
                if let Some(id) = core {
                    core_affinity::set_for_current(core_affinity::CoreId { id });
                }
                run(rx, &s)
            })?;
        Ok(Flusher {
            jobs: Some(tx),
            shared,
            thread: Some(thread),
        })
    }

    /// Hands a job over; gives it back when the channel is full (the worker keeps it and
    /// tries again next iteration).
    pub fn offer(&self, job: PersistJob) -> Result<(), PersistJob> {
        match self.jobs.as_ref().map(|tx| tx.try_send(job)) {
            Some(Ok(())) => Ok(()),
            Some(Err(TrySendError::Full(job) | TrySendError::Disconnected(job))) => Err(job),
            None => unreachable!("the sender lives until drop"),
        }
    }

    /// The persisted watermark.
    pub fn done(&self) -> u64 {
        self.shared.done.load(Ordering::Acquire)
    }

    /// The first ticket that could not be made durable, if any.
    pub fn failed(&self) -> Option<u64> {
        match self.shared.failed.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Batches persisted so far.
    pub fn batches(&self) -> u64 {
        self.shared.batches.load(Ordering::Relaxed)
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The CPUs of a kernel CPU list such as `0-3,8,10-11` (as `/sys/devices/system/cpu/online`
/// gives); malformed parts are skipped.
fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',') {
        let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpus.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b && b - a < 65536 => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

fn run(rx: Receiver<PersistJob>, shared: &Shared) {
    let mut batch: Vec<PersistJob> = Vec::with_capacity(BATCH);
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(BATCH);
    while let Ok(job) = rx.recv() {
        batch.push(job);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let last = batch.last().map_or(0, |j| j.ticket);
        let first = batch[0].ticket;
        if shared.failed.load(Ordering::Relaxed) == 0 {
            match persist_batch(&mut batch, &mut ranges) {
                Ok(()) => shared.done.store(last, Ordering::Release),
                Err(e) => {
                    eprintln!("portico: persist failed (tickets {first}..={last}): {e}");
                    shared.failed.store(first, Ordering::Release);
                }
            }
            shared.batches.fetch_add(1, Ordering::Relaxed);
        }
        batch.clear();
    }
}

/// Persist every job of the batch: one `persist_ranges` per mapping.
fn persist_batch(
    batch: &mut [PersistJob],
    ranges: &mut Vec<(usize, usize)>,
) -> Result<(), pmem::Error> {
    batch.sort_by_key(|j| Arc::as_ptr(&j.map) as usize);
    let mut start = 0;
    while start < batch.len() {
        let map = &batch[start].map;
        let end = start
            + batch[start..]
                .iter()
                .take_while(|j| Arc::ptr_eq(&j.map, map))
                .count();
        ranges.clear();
        ranges.extend(batch[start..end].iter().map(|j| (j.offset, j.len)));
        map.persist_ranges(ranges)?;
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmem::MapOptions;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1\n"), [0, 1]);
        assert_eq!(parse_cpu_list("0,2-4,7"), [0, 2, 3, 4, 7]);
        assert_eq!(parse_cpu_list("5"), [5]);
        assert_eq!(parse_cpu_list("x,3-1,2"), [2]);
    }

    #[test]
    fn jobs_are_persisted_in_order_and_the_watermark_follows() {
        let dir = std::env::temp_dir().join(format!("portico-flusher-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("region");
        let map = Arc::new(
            MapOptions::new()
                .simulate_power_loss(true)
                .create_file(&path, 1 << 16)
                .unwrap(),
        );
        let f = Flusher::spawn().unwrap();
        for t in 1..=100u64 {
            let off = (t as usize - 1) * 256;
            map.write(off, &[t as u8; 256]).unwrap();
            f.offer(PersistJob {
                ticket: t,
                map: map.clone(),
                offset: off,
                len: 256,
            })
            .unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while f.done() < 100 {
            assert!(
                std::time::Instant::now() < deadline,
                "flusher stuck at {}",
                f.done()
            );
            std::thread::yield_now();
        }
        assert!(f.failed().is_none());
        assert!(f.batches() >= 1 && f.batches() <= 100);
        // Everything is in the persisted image: a crash loses nothing.
        map.crash().unwrap();
        for t in 1..=100usize {
            let mut b = [0u8; 256];
            map.read((t - 1) * 256, &mut b).unwrap();
            assert_eq!(b, [t as u8; 256]);
        }
        drop(f);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
