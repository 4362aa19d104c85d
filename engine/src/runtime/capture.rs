//! `--pcap FILE`: every packet a worker receives (before fault injection, as the port delivered
//! it) and every packet a port accepted for transmission, written to one pcapng file for the
//! run, with one interface per port. Off by default; when on, each worker copies the bytes into
//! its own staging buffer and takes the file lock once per burst.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::capture::{Direction, PcapngWriter, packet_record};
use crate::dataplane::{Burst, Mbuf, rdtsc, tsc_hz};

/// The capture file of a run.
pub struct CaptureSink {
    writer: Mutex<PcapngWriter<BufWriter<File>>>,
    /// Interface id of each DPDK port id (u32::MAX: not captured).
    interface_of_port: Vec<u32>,
    tsc0: u64,
    ns0: u64,
    hz: u64,
}

impl CaptureSink {
    /// Creates `path` with one interface per `(port id, name)`.
    pub fn create(path: &Path, ports: &[(u16, String)]) -> io::Result<Self> {
        let names: Vec<&str> = ports.iter().map(|(_, n)| n.as_str()).collect();
        let file = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let writer = PcapngWriter::new(file, &names)?;
        let mut interface_of_port = vec![
            u32::MAX;
            ports
                .iter()
                .map(|(id, _)| *id as usize + 1)
                .max()
                .unwrap_or(0)
        ];
        for (i, (id, _)) in ports.iter().enumerate() {
            interface_of_port[*id as usize] = i as u32;
        }
        let ns0 = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Ok(CaptureSink {
            writer: Mutex::new(writer),
            interface_of_port,
            tsc0: rdtsc(),
            ns0,
            hz: tsc_hz().max(1),
        })
    }

    fn now_ns(&self) -> u64 {
        let ticks = rdtsc().saturating_sub(self.tsc0) as u128;
        self.ns0 + (ticks * 1_000_000_000 / self.hz as u128) as u64
    }

    fn interface(&self, port: u16) -> Option<u32> {
        self.interface_of_port
            .get(port as usize)
            .copied()
            .filter(|&i| i != u32::MAX)
    }

    fn write(&self, records: &[u8], count: u64) {
        if count == 0 {
            return;
        }
        if let Ok(mut w) = self.writer.lock() {
            // A full disk must not stop the dataplane: the capture just ends short.
            let _ = w.write_records(records, count);
        }
    }

    /// Flushes the file; returns the number of packets written.
    pub fn finish(&self) -> io::Result<u64> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| io::Error::other("capture lock poisoned"))?;
        w.flush()?;
        Ok(w.packets)
    }
}

/// A worker's side of the capture.
pub struct WorkerCapture {
    sink: std::sync::Arc<CaptureSink>,
    staging: Vec<u8>,
    /// End offset in `staging` of each staged outbound record.
    ends: Vec<usize>,
}

impl WorkerCapture {
    pub fn new(sink: std::sync::Arc<CaptureSink>) -> Self {
        WorkerCapture {
            sink,
            staging: Vec::with_capacity(1 << 20),
            ends: Vec::with_capacity(crate::dataplane::MAX_BURST),
        }
    }

    fn record(&mut self, m: &Mbuf, port: u16, dir: Direction, ts: u64) -> bool {
        match self.sink.interface(port) {
            Some(ifc) => {
                packet_record(&mut self.staging, ifc, ts, dir, m.data());
                true
            }
            None => false,
        }
    }

    /// Captures a received burst.
    pub fn inbound(&mut self, port: u16, burst: &Burst) {
        let ts = self.sink.now_ns();
        self.staging.clear();
        let mut n = 0;
        for m in burst.as_slice() {
            n += self.record(m, port, Direction::Inbound, ts) as u64;
        }
        self.sink.write(&self.staging, n);
    }

    /// Stages a burst about to be transmitted; [`WorkerCapture::commit_outbound`] writes the part
    /// the port took.
    pub fn stage_outbound(&mut self, port: u16, burst: &Burst) {
        let ts = self.sink.now_ns();
        self.staging.clear();
        self.ends.clear();
        for m in burst.as_slice() {
            if self.record(m, port, Direction::Outbound, ts) {
                self.ends.push(self.staging.len());
            }
        }
    }

    pub fn commit_outbound(&mut self, sent: usize) {
        let n = sent.min(self.ends.len());
        if n > 0 {
            self.sink.write(&self.staging[..self.ends[n - 1]], n as u64);
        }
    }
}
