//! The requester's retransmission timeout: an estimate of the round trip time from the timing
//! of acknowledgements, in the manner of RFC 6298, and a judge of retransmissions that were
//! not needed.
//!
//! * A sample is the time from sending a request packet to the first acknowledgement (ACK,
//!   NAK or READ response) that covers its PSN. Only a packet sent once may be timed (Karn's
//!   rule): a retransmission, a go-back-N or an RNR wait abandons the sample in progress.
//! * The first sample `r` sets `SRTT = r`, `RTTVAR = r / 2`; every later one
//!   `RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - r|`, then `SRTT = 7/8 SRTT + 1/8 r`.
//! * `RTO = SRTT + 4 RTTVAR`, clamped to `[timeout_ns, max_timeout_ns]` of the queue pair's
//!   configuration; before the first sample it is `timeout_ns`. Each expiry doubles it (up to
//!   `max_backoff_shift` doublings) and the doubling stays until a new sample is taken, so a
//!   path that got slower than the estimate is measured again instead of timing out forever.
//! * A retransmission is *spurious* when the acknowledgement that covers it comes back sooner
//!   after it was sent than half the shortest round trip ever measured on the queue pair: too
//!   soon for the copy to have made the trip, so the responder had the original.
//!
//! Times are nanoseconds of whatever clock drives the queue pair (`now`).

use super::QpConfig;
use super::psn;

/// Smoothed round trip time, its variation, and the timer's backoff.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RttEstimator {
    /// `None` until the first sample.
    srtt: Option<u64>,
    rttvar: u64,
    /// The shortest sample so far.
    min_rtt: Option<u64>,
    /// Doublings of the timeout: expiries since the last sample.
    backoff: u32,
}

impl RttEstimator {
    /// Takes one round trip sample; the backoff ends (the path answers in `rtt`).
    pub fn sample(&mut self, rtt: u64) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                self.rttvar = (3 * self.rttvar + srtt.abs_diff(rtt)) / 4;
                self.srtt = Some((7 * srtt + rtt) / 8);
            }
        }
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        self.backoff = 0;
    }

    /// The timer expired: the next timeout is twice as long (up to `max_backoff_shift`).
    pub fn back_off(&mut self, cfg: &QpConfig) {
        self.backoff = (self.backoff + 1).min(cfg.max_backoff_shift);
    }

    pub fn srtt(&self) -> Option<u64> {
        self.srtt
    }

    pub fn rttvar(&self) -> u64 {
        self.rttvar
    }

    pub fn min_rtt(&self) -> Option<u64> {
        self.min_rtt
    }

    /// The timeout before backoff: `SRTT + 4 RTTVAR` within the configured bounds.
    pub fn base(&self, cfg: &QpConfig) -> u64 {
        let lo = cfg.timeout_ns;
        let hi = cfg.max_timeout_ns.max(lo);
        match self.srtt {
            None => lo,
            Some(srtt) => srtt.saturating_add(4 * self.rttvar).clamp(lo, hi),
        }
    }

    /// The timeout to arm now.
    pub fn rto(&self, cfg: &QpConfig) -> u64 {
        self.base(cfg)
            .saturating_mul(1 << self.backoff.min(cfg.max_backoff_shift))
    }

    /// Whether an acknowledgement `elapsed` ns after a retransmission was for the original:
    /// sooner than half the shortest round trip measured. Unknown (false) before any sample.
    pub fn too_soon(&self, elapsed: u64) -> bool {
        self.min_rtt.is_some_and(|m| elapsed < m / 2)
    }
}

/// Retransmitted packets not judged yet: go-back-N resends PSNs in order, so they are a run
/// `[from, end)` sent from time `at` on.
///
/// A packet of the run is spurious when (a) an ACK that acknowledges nothing new names a PSN
/// at or after it: the responder answered a copy of a packet it already had, so it had
/// accepted every PSN up to that one before the copies came; or (b) the acknowledgement that
/// covers it comes back too soon after it was resent ([`RttEstimator::too_soon`]). Judging
/// ends at the next go-back-N or timeout, and when a packet sent after the run is
/// acknowledged (in order, the answers to the copies came before).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Resent {
    at: u64,
    from: u32,
    end: u32,
    packets: u32,
}

impl Resent {
    /// A packet holding PSNs `[psn, psn + n)` was sent again at `now`.
    pub(crate) fn note(&mut self, now: u64, psn: u32, n: u32) {
        if self.packets == 0 {
            *self = Resent {
                at: now,
                from: psn,
                end: psn,
                packets: 0,
            };
        }
        self.packets += 1;
        let end = psn::add(psn, n);
        if psn::before(self.end, end) {
            self.end = end;
        }
    }

    /// Forget the run (the cursor went back: what follows is a new run).
    pub(crate) fn clear(&mut self) {
        self.packets = 0;
    }

    /// Takes the packets of the run before `psn` out of it; returns how many there were.
    fn take_before(&mut self, psn: u32) -> u64 {
        if self.packets == 0 || !psn::before(self.from, psn) {
            return 0;
        }
        let n = if psn::before(psn, self.end) {
            // One PSN per packet, except a READ request, which holds its whole response.
            (psn::diff(psn, self.from) as u32).min(self.packets)
        } else {
            self.packets
        };
        self.packets -= n;
        self.from = psn;
        u64::from(n)
    }

    /// Everything before `una` is acknowledged at `now`: returns the packets of the run found
    /// spurious by rule (b). The others stay, for rule (a).
    pub(crate) fn acknowledged(&mut self, now: u64, una: u32, rtt: &RttEstimator) -> u64 {
        if self.packets > 0 && rtt.too_soon(now.saturating_sub(self.at)) {
            self.take_before(una)
        } else {
            0
        }
    }

    /// An ACK for `psn` acknowledged nothing new: returns the packets of the run found
    /// spurious by rule (a).
    pub(crate) fn repeated(&mut self, psn: u32) -> u64 {
        self.take_before(psn::add(psn, 1))
    }
}
