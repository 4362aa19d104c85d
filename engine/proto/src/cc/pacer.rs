//! The sender's pacer: a token bucket in bytes that holds a queue pair's requests to the rate its
//! congestion controller sets.
//!
//! Tokens accrue at the rate up to a depth of `burst_ns` worth of it, and a packet may go
//! whenever the bucket is not in debt: it takes its whole length, so the bucket may go negative
//! by up to one frame, and the next packet waits until the debt is paid. This sends frames of
//! any size at exactly the rate over time without splitting them, and lets a worker whose loop
//! visits the queue pair every few microseconds send what accrued meanwhile, in one burst of at
//! most `burst_ns` of the rate.

/// A token bucket; times in ns, sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacer {
    rate_bps: u64,
    /// Bytes per ns at `rate_bps`.
    bytes_per_ns: f64,
    /// Tokens in bytes; negative while a sent frame is being paid for.
    tokens: f64,
    depth: f64,
    burst_ns: u64,
    last: u64,
}

impl Pacer {
    /// A full bucket at `rate_bps`, `burst_ns` deep.
    pub fn new(rate_bps: u64, burst_ns: u64) -> Pacer {
        let mut p = Pacer {
            rate_bps: 0,
            bytes_per_ns: 0.0,
            tokens: 0.0,
            depth: 0.0,
            burst_ns,
            last: 0,
        };
        p.set_rate(0, rate_bps);
        p.tokens = p.depth;
        p
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// Changes the rate from `now` on: tokens accrued so far count at the old rate.
    pub fn set_rate(&mut self, now: u64, rate_bps: u64) {
        self.refill(now);
        self.rate_bps = rate_bps.max(1);
        self.bytes_per_ns = self.rate_bps as f64 / 8e9;
        self.depth = (self.bytes_per_ns * self.burst_ns as f64).max(1.0);
        self.tokens = self.tokens.min(self.depth);
    }

    fn refill(&mut self, now: u64) {
        if now > self.last {
            let gained = (now - self.last) as f64 * self.bytes_per_ns;
            self.tokens = (self.tokens + gained).min(self.depth);
            self.last = now;
        }
    }

    /// Whether a packet may go at `now` (the bucket is not in debt).
    pub fn may_send(&mut self, now: u64) -> bool {
        self.refill(now);
        self.tokens >= 0.0
    }

    /// Charges a packet of `bytes` sent at `now`.
    pub fn charge(&mut self, now: u64, bytes: usize) {
        self.refill(now);
        self.tokens -= bytes as f64;
    }

    /// When the bucket will be out of debt (`now` if it is not in debt).
    pub fn ready_at(&self, now: u64) -> u64 {
        let t = now.max(self.last);
        if self.tokens >= 0.0 {
            return t;
        }
        self.last + (-self.tokens / self.bytes_per_ns).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_go_at_exactly_the_rate() {
        // 8 Gbit/s = 1 byte/ns; 1000-byte frames every 1000 ns once the burst is spent.
        let mut p = Pacer::new(8_000_000_000, 2_000);
        let mut now = 0;
        let mut sent = Vec::new();
        while sent.len() < 10 {
            if p.may_send(now) {
                p.charge(now, 1000);
                sent.push(now);
            } else {
                now = p.ready_at(now);
            }
        }
        // The full 2000-byte bucket lets three go at once (the third into debt), then one per µs.
        assert_eq!(sent, [0, 0, 0, 1000, 2000, 3000, 4000, 5000, 6000, 7000]);
    }

    #[test]
    fn idle_time_accrues_no_more_than_the_depth() {
        let mut p = Pacer::new(8_000_000_000, 1_000);
        p.charge(0, 1000);
        assert!(p.may_send(0), "not in debt at 0 tokens");
        p.charge(0, 1);
        assert!(!p.may_send(0));
        assert_eq!(p.ready_at(0), 1);
        // A second of idleness is worth 1000 bytes, not 1e9.
        assert!(p.may_send(1_000_000_000));
        p.charge(1_000_000_000, 1000);
        p.charge(1_000_000_000, 1);
        assert!(!p.may_send(1_000_000_000));
    }

    #[test]
    fn a_rate_change_applies_from_then_on() {
        let mut p = Pacer::new(8_000_000_000, 1_000);
        p.charge(0, 2000); // 1000 in debt
        assert_eq!(p.ready_at(0), 1000);
        p.set_rate(500, 1_000_000_000); // 1/8 byte/ns from 500 ns: 500 of debt left
        assert_eq!(p.ready_at(500), 4500);
    }
}
