//! A paced generator of verifiable UDP test frames (see [`super::frame`]).
//!
//! Pacing works from the TSC: by time `t` after the first poll, `rate × t` frames are due; each
//! poll sends what is due, at most one burst. Frames the TX queue does not take are kept (the
//! output uses `KeepUnsent`), so a slow receiver slows the generator instead of losing frames.

use std::sync::Arc;

use super::frame::{self, FrameSpec};
use crate::dataplane::{Burst, Mempool, rdtsc, tsc_hz};
use crate::runtime::{Counters, Outlook, Outputs, Stage};

crate::counter_set! {
    /// What the generator counts, declared once: its worker's counter names (the summary's,
    /// the JSON's and telemetry's keys) and slots ([`GenerateSlot`]) follow this list. The
    /// generator counts straight in its worker's slots.
    pub struct GenerateCounters, slots GenerateSlot {
        /// Frames sent (handed to the output; the sequence number the next frame gets).
        generated: Sum,
        /// Times no mbufs could be had for a burst of frames.
        alloc_failures: Sum,
    }
}

pub struct Generator {
    pool: Arc<Mempool>,
    template: Vec<u8>,
    rate_pps: Option<u64>,
    count: Option<u64>,
    burst: usize,
    output: usize,
    next_seq: u64,
    start_tsc: Option<u64>,
    hz: u64,
}

impl Generator {
    /// Frames per `spec` on output `output`, `rate_pps` frames per second (None: as fast as
    /// the queue takes them), `count` frames in all (None: until stopped).
    pub fn new(
        pool: Arc<Mempool>,
        spec: &FrameSpec,
        rate_pps: Option<u64>,
        count: Option<u64>,
        burst: usize,
        output: usize,
    ) -> Self {
        let mut template = vec![0u8; spec.buffer_len()];
        frame::write_template(spec, &mut template);
        Generator {
            pool,
            template,
            rate_pps: rate_pps.filter(|&r| r > 0),
            count,
            burst: burst.clamp(1, crate::dataplane::MAX_BURST),
            output,
            next_seq: 0,
            start_tsc: None,
            hz: tsc_hz().max(1),
        }
    }

    fn due(&mut self) -> u64 {
        let Some(rate) = self.rate_pps else {
            return u64::MAX;
        };
        let now = rdtsc();
        let start = *self.start_tsc.get_or_insert(now);
        let elapsed = now.saturating_sub(start) as u128;
        (elapsed * rate as u128 / self.hz as u128) as u64
    }

    /// How long until the next frame is due (None: none will be; 0: now).
    fn next_frame_in_ns(&mut self) -> Option<u64> {
        if self.is_done() {
            return None;
        }
        let Some(rate) = self.rate_pps else {
            return Some(0);
        };
        if self.due() > self.next_seq {
            return Some(0);
        }
        // Frame next_seq is due at (next_seq + 1) / rate seconds after the start.
        let elapsed = rdtsc().saturating_sub(self.start_tsc.unwrap_or(0)) as u128;
        let at = (u128::from(self.next_seq) + 1) * u128::from(self.hz) / u128::from(rate);
        let ticks = at.saturating_sub(elapsed);
        Some((ticks * 1_000_000_000 / u128::from(self.hz)) as u64)
    }
}

impl Stage for Generator {
    fn name(&self) -> &'static str {
        "generate"
    }

    fn counter_names(&self) -> &'static [&'static str] {
        &GenerateCounters::NAMES
    }

    /// Done: nothing more, ever. Paced: the next frame's time. Unpaced: always due. It
    /// receives nothing.
    fn outlook(&mut self) -> Outlook {
        Outlook::due_in(self.next_frame_in_ns())
    }

    fn on_rx(&mut self, _: usize, _: &mut Burst, _: &mut Outputs, _: &mut Counters) {}

    #[inline]
    fn on_poll(&mut self, out: &mut Outputs, c: &mut Counters) {
        let buf = out.buffer(self.output);
        let mut want = self.burst.min(buf.spare()) as u64;
        if let Some(count) = self.count {
            want = want.min(count - self.next_seq);
        }
        if want == 0 {
            return;
        }
        want = want.min(self.due().saturating_sub(self.next_seq));
        if want == 0 {
            return;
        }
        let buf = out.buffer(self.output);
        let first = buf.len();
        if !buf.alloc(&self.pool, want as usize) {
            c.stage[GenerateSlot::alloc_failures.index()] += 1;
            return;
        }
        let len = self.template.len() as u16;
        for m in &mut buf.as_mut_slice()[first..] {
            let data = m.append(len).expect("a fresh mbuf holds a standard frame");
            data.copy_from_slice(&self.template);
            frame::stamp(data, self.next_seq);
            self.next_seq += 1;
        }
        c.stage[GenerateSlot::generated.index()] = self.next_seq;
    }

    fn is_finite(&self) -> bool {
        self.count.is_some()
    }

    fn is_done(&self) -> bool {
        self.count.is_some_and(|n| self.next_seq >= n)
    }
}
