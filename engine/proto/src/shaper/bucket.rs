//! A token bucket in bytes, refilled at a rate in bit/s from times in ns, capped at a burst.
//!
//! Tokens are kept in integer units of 1/8e9 byte, so that `rate_bps * dt_ns` adds exactly
//! what accrued: no rounding drifts over a long run, and tests can assert exact byte counts.
//! Like a pacer, a bucket that is not in debt may send a packet of any size and go negative by
//! it ([`TokenBucket::conforms`]); the inbound (absorb) bucket instead asks for the whole
//! charge up front ([`TokenBucket::fits`]), since it promises room for data not yet arrived.

/// Token units per byte: one byte is 8 bits, and a rate in bit/s times ns is bits * 1e9.
const UNITS_PER_BYTE: u128 = 8_000_000_000;

/// A byte token bucket; times in ns (monotonic, starting at the time given to `new`).
///
/// It keeps what it lacks to be full (`depth - tokens`, never negative) rather than the
/// tokens: a full bucket is one test, and a refill takes the gain off with no cap to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    rate_bps: u64,
    depth: u128,
    lack: u128,
    last: u64,
}

impl TokenBucket {
    /// A full bucket at `now`: `burst_bytes` of tokens, refilled at `rate_bps`.
    pub fn new(rate_bps: u64, burst_bytes: u64, now: u64) -> TokenBucket {
        TokenBucket {
            rate_bps,
            depth: Self::units(burst_bytes),
            lack: 0,
            last: now,
        }
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// From `now` on, refills at `rate_bps` (what accrued until `now` at the old rate stays).
    pub fn set_rate(&mut self, now: u64, rate_bps: u64) {
        self.refill(now);
        self.rate_bps = rate_bps;
    }

    pub fn burst_bytes(&self) -> u64 {
        (self.depth / UNITS_PER_BYTE) as u64
    }

    /// What the bucket lacks (in units) at `t >= last`, without moving `last`.
    #[inline]
    fn lack_at(&self, t: u64) -> u128 {
        if self.lack == 0 {
            return 0;
        }
        // Exact in u128: a u64 rate times a u64 span cannot overflow it.
        let gained = self.rate_bps as u128 * (t - self.last) as u128;
        self.lack.saturating_sub(gained)
    }

    #[inline]
    fn refill(&mut self, now: u64) {
        // A time before the last one (a caller's clocks disagreeing) adds nothing.
        if now > self.last {
            self.lack = self.lack_at(now);
            self.last = now;
        }
    }

    /// Whole bytes of tokens at `now`, rounded down (negative while in debt).
    pub fn tokens(&mut self, now: u64) -> i64 {
        self.refill(now);
        (self.depth as i128 - self.lack as i128).div_euclid(UNITS_PER_BYTE as i128) as i64
    }

    /// Whether a packet may go at `now`: the bucket is not in debt.
    #[inline]
    pub fn conforms(&mut self, now: u64) -> bool {
        self.refill(now);
        self.lack <= self.depth
    }

    /// Whether `bytes` can be charged at `now` without going into debt.
    pub fn fits(&mut self, now: u64, bytes: u64) -> bool {
        self.refill(now);
        self.lack + Self::units(bytes) <= self.depth
    }

    /// Whether a charge of `bytes` is admitted at `now`: it fits, or it is larger than the
    /// whole burst and the bucket is full (such a charge goes alone and leaves the bucket in
    /// debt, which then holds everything back until it is repaid).
    #[inline]
    pub fn admits(&mut self, now: u64, bytes: u64) -> bool {
        self.refill(now);
        self.lack + Self::units(bytes).min(self.depth) <= self.depth
    }

    /// Takes `bytes` at `now`; the bucket may go into debt.
    #[inline]
    pub fn charge(&mut self, now: u64, bytes: u64) {
        self.charge_units(now, Self::units(bytes));
    }

    /// `bytes` in token units (for [`TokenBucket::charge_units`]).
    #[inline]
    pub(crate) fn units(bytes: u64) -> u128 {
        bytes as u128 * UNITS_PER_BYTE
    }

    /// [`TokenBucket::charge`] of `units` already worked out (one charge to two buckets).
    #[inline]
    pub(crate) fn charge_units(&mut self, now: u64, units: u128) {
        self.refill(now);
        self.lack += units;
    }

    /// The first time `>= now` at which the bucket holds `bytes` of tokens (0 for "not in
    /// debt"); `None` if it never will (no rate, or more than the burst).
    pub fn ready_at(&self, now: u64, bytes: u64) -> Option<u64> {
        let t = now.max(self.last);
        let need = Self::units(bytes);
        let lack = self.lack_at(t);
        if lack + need <= self.depth {
            return Some(t);
        }
        if self.rate_bps == 0 || need > self.depth {
            return None;
        }
        // Tokens to gain: need - (depth - lack), positive here.
        let short = lack + need - self.depth;
        let rate = self.rate_bps as u128;
        let wait = short.div_ceil(rate);
        u64::try_from(wait).ok().map(|w| t.saturating_add(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_at_the_rate_up_to_the_burst() {
        // 8 Gbit/s is one byte per ns.
        let mut b = TokenBucket::new(8_000_000_000, 1000, 0);
        assert_eq!(b.tokens(0), 1000);
        b.charge(0, 1000);
        assert_eq!(b.tokens(0), 0);
        assert_eq!(b.tokens(250), 250);
        assert_eq!(b.tokens(999), 999);
        assert_eq!(b.tokens(5000), 1000, "capped at the burst");
    }

    #[test]
    fn goes_into_debt_by_one_packet_and_waits_it_out() {
        let mut b = TokenBucket::new(8_000_000_000, 1000, 0);
        assert!(b.conforms(0));
        b.charge(0, 1500);
        assert_eq!(b.tokens(0), -500);
        assert!(!b.conforms(499));
        assert_eq!(b.ready_at(0, 0), Some(500));
        assert!(b.conforms(500));
        assert_eq!(b.ready_at(500, 0), Some(500));
        assert_eq!(b.ready_at(500, 1000), Some(1500));
        assert!(!b.fits(1499, 1000));
        assert!(b.fits(1500, 1000));
        assert_eq!(b.ready_at(1500, 1001), None, "beyond the burst");
    }

    #[test]
    fn fractional_rates_are_exact_over_time() {
        // 1 Mbit/s: 1 byte per 8000 ns; 3 bytes accrue over 24 000 ns, not 2.999.
        let mut b = TokenBucket::new(1_000_000, 100, 0);
        b.charge(0, 100);
        assert_eq!(b.tokens(7999), 0);
        assert_eq!(b.tokens(8000), 1);
        assert_eq!(b.tokens(24_000), 3);
        assert_eq!(b.ready_at(24_000, 10), Some(80_000));
        let mut z = TokenBucket::new(0, 100, 0);
        assert!(
            z.admits(0, 100) && z.admits(0, 5000),
            "full: more than the burst goes alone"
        );
        let mut d = TokenBucket::new(8_000_000_000, 100, 0);
        d.charge(0, 1);
        assert!(!d.admits(0, 101), "not full: the large charge waits");
        assert!(d.admits(1, 101));
        d.charge(1, 101);
        assert_eq!(d.tokens(1), -1);
        assert_eq!(z.ready_at(0, 100), Some(0));
        assert_eq!(z.ready_at(0, 101), None);
    }

    #[test]
    fn a_million_small_refills_add_up_to_one_large_one() {
        // Each 7 ns step accrues a fraction of a byte; nothing may be lost or gained over a
        // long run against one refill over the whole span.
        let rate = 1_000_003;
        let mut many = TokenBucket::new(rate, 1 << 30, 0);
        // In debt by 1 MiB: 7 ms at 1 Mbit/s repays only some 875 bytes of it.
        many.charge(0, (1 << 30) + (1 << 20));
        let mut one = many;
        let end = 7 * 1_000_000;
        for t in (7..=end).step_by(7) {
            assert!(!many.conforms(t));
        }
        assert!(!one.conforms(end));
        assert_eq!(many, one);
        let level = rate as i128 * end as i128 - (1 << 20) * 8_000_000_000;
        assert_eq!(many.tokens(end), level.div_euclid(8_000_000_000) as i64);
        assert_eq!(many.tokens(end), 875 - (1 << 20));
    }
}
