//! Seed 002: the congestion state carried in ACKs (`cc = ack`).
//!
//! **Receiver** ([`EcnMonitor`]): per port by default (per queue pair with
//! [`EcnScope::QueuePair`]), a sliding window over the last data packets
//! (at most `window_packets`, none older than `window_ns`) counts the CE-marked ones; their
//! share gives a level: none (no mark), light (up to `light_permille`), moderate (up to
//! `moderate_permille`), heavy (above). Every ACK says the level: BECN clear for none, BECN set
//! and a CETH for the others. A change of level is sent at once, in an ACK of its own, rather
//! than waiting for the next coalesced one: that bounds the reaction to one path delay.
//!
//! **Sender** ([`AckSender`]): a pure rate controller. The level sets the rate at once from a
//! table (a share of the preset line rate per level); the first ACK without the indicator puts
//! it straight back to the line rate. Where the CETH carries the queue depth, the window of the
//! next round trip is what the path holds beyond that queue (one bandwidth-delay product at the
//! line rate, less the bytes already queued), so that a flow stops adding to a queue it has
//! been told about; an uncongested ACK lifts the window with the rate.

use wire::ceth::{CethRepr, Level, Location};

/// The knobs of both ends of `cc = ack`. Integers (per-mille, ns), so that a queue pair's
/// configuration stays comparable and hashable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct AckParams {
    /// Receiver: the window holds at most this many packets (1..=64).
    pub window_packets: u32,
    /// Receiver: ... and none older than this.
    pub window_ns: u64,
    /// Receiver: a marked share up to this (per mille) is light, above it moderate...
    pub light_permille: u32,
    /// ... and above this heavy.
    pub moderate_permille: u32,
    /// Sender: the rate per level, per mille of the line rate (none, light, moderate, heavy).
    pub rate_permille: [u32; 4],
    /// Sender: size the window from the queue depth a CETH reports.
    pub queue_window: bool,
    /// Receiver: one window per queue pair, or one for the whole port (every queue pair's
    /// ACKs then carry the port's level: flows through the same congested ingress are told
    /// at once, not each when a mark happens to hit one of its own packets).
    pub scope: EcnScope,
    /// Both ends: the CETH carries the queuing delay where the receiver knows it (a
    /// bottleneck in front of its ingress that knows its rate), and the sender, told a delay
    /// and no queue depth, sizes its window from it (seed 002: the rate or the packets of the
    /// next window from the network delay). Off: the delay word is never sent.
    pub delay: bool,
    /// Sender: on a clear ACK, keep the rate the last level set until the path has been clear
    /// this long (ns), then go back to the line rate (the seed's "maintain" beside "restore";
    /// flows that all restore at once overfill the queue again). 0: restore at once, the
    /// preset rate of the seed.
    pub keep_rate_ns: u64,
}

/// What the receiver's ECN window covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EcnScope {
    QueuePair,
    Port,
}

impl Default for AckParams {
    /// The values `docs/congestion.md` tunes in simulation: a 32-packet window of at most
    /// 50 µs, light up to 1 mark in 16, moderate up to 1 in 4, rates of 1, 1/4, 1/8 and 1/16
    /// of the line rate, the window sized from the reported queue, and one ECN window per
    /// port.
    fn default() -> Self {
        AckParams {
            window_packets: 32,
            window_ns: 50_000,
            light_permille: 62,
            moderate_permille: 250,
            rate_permille: [1000, 250, 125, 62],
            queue_window: true,
            scope: EcnScope::Port,
            delay: false,
            keep_rate_ns: 0,
        }
    }
}

impl AckParams {
    /// The first field out of range, by name.
    pub fn validate(&self) -> Result<(), &'static str> {
        if !(1..=64).contains(&self.window_packets) {
            return Err("window_packets");
        }
        if self.window_ns == 0 {
            return Err("window_ns");
        }
        if self.light_permille > self.moderate_permille || self.moderate_permille > 1000 {
            return Err("light_permille/moderate_permille");
        }
        if self.rate_permille.iter().any(|&r| r == 0 || r > 1000)
            || self.rate_permille.windows(2).any(|w| w[1] > w[0])
        {
            return Err("rate_permille");
        }
        Ok(())
    }
}

/// The receiver's sliding window of CE marks for one queue pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EcnMonitor {
    p: AckParams,
    /// Arrival times of the packets in the window, oldest at `head`.
    times: [u64; 64],
    /// Bit i: the packet in slot i was marked.
    marks: u64,
    head: u32,
    len: u32,
    marked: u32,
    level: Level,
}

impl EcnMonitor {
    pub fn new(p: &AckParams) -> EcnMonitor {
        EcnMonitor {
            p: *p,
            times: [0; 64],
            marks: 0,
            head: 0,
            len: 0,
            marked: 0,
            level: Level::None,
        }
    }

    fn pop_front(&mut self) {
        let h = self.head as usize;
        if self.marks >> h & 1 == 1 {
            self.marked -= 1;
            self.marks &= !(1 << h);
        }
        self.head = (self.head + 1) % self.p.window_packets;
        self.len -= 1;
    }

    /// Forgets packets older than the window.
    fn age(&mut self, now: u64) {
        while self.len > 0 && now.saturating_sub(self.times[self.head as usize]) > self.p.window_ns
        {
            self.pop_front();
        }
    }

    fn judge(&mut self) -> bool {
        let level = if self.marked == 0 {
            Level::None
        } else {
            let permille = self.marked * 1000 / self.len.max(1);
            if permille <= self.p.light_permille {
                Level::Light
            } else if permille <= self.p.moderate_permille {
                Level::Moderate
            } else {
                Level::Heavy
            }
        };
        let changed = level != self.level;
        self.level = level;
        changed
    }

    /// Records a data packet that arrived at `now`, marked or not. True when the level
    /// changed (an ACK should go now).
    pub fn on_packet(&mut self, now: u64, ce: bool) -> bool {
        self.age(now);
        if self.len == self.p.window_packets {
            self.pop_front();
        }
        let slot = (self.head + self.len) % self.p.window_packets;
        self.times[slot as usize] = now;
        if ce {
            self.marks |= 1 << slot;
            self.marked += 1;
        }
        self.len += 1;
        self.judge()
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// Whether the window is the queue pair's or the port's.
    pub fn scope(&self) -> EcnScope {
        self.p.scope
    }

    /// (marked, packets) in the window.
    pub fn ratio(&self) -> (u32, u32) {
        (self.marked, self.len)
    }

    /// The window's state, to hand to a queue pair that uses a port-wide window.
    pub fn shared(&self, changed: bool) -> SharedLevel {
        SharedLevel {
            level: self.level,
            marked: self.marked,
            window: self.len,
            changed,
        }
    }

    /// The CETH an ACK sent now carries: `None` when the level is none (the ACK goes without
    /// the indicator). `queue_bytes` is the receiver's own ingress queue, when it has one.
    pub fn ceth(&self, queue_bytes: Option<u32>) -> Option<CethRepr> {
        self.shared(false).ceth(queue_bytes)
    }
}

/// A port-wide window's verdict on the packet a queue pair just received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedLevel {
    pub level: Level,
    pub marked: u32,
    pub window: u32,
    /// The level changed with this packet.
    pub changed: bool,
}

impl SharedLevel {
    /// The CETH an ACK sent now carries (see [`EcnMonitor::ceth`]).
    pub fn ceth(&self, queue_bytes: Option<u32>) -> Option<CethRepr> {
        (self.level != Level::None).then(|| self.report(queue_bytes))
    }

    /// The window's state as a CETH about requests (service RC WRITE/SEND), whatever the
    /// level: an ACK leaves it out at level none ([`SharedLevel::ceth`]), an enhanced CNP does
    /// not.
    pub fn report(&self, queue_bytes: Option<u32>) -> CethRepr {
        CethRepr {
            level: self.level,
            location: if queue_bytes.is_some() {
                Location::Receiver
            } else {
                Location::Unknown
            },
            service: wire::ceth::service::RC_WRITE_SEND,
            marked: self.marked.min(255) as u8,
            window: self.window.min(255) as u8,
            queue_bytes,
            delay_ns: None,
        }
    }
}

/// The sender's rate controller for one queue pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckSender {
    p: AckParams,
    line_bps: u64,
    level: Level,
    rate_bps: u64,
    window_bytes: Option<u64>,
    /// With `keep_rate_ns`: when the first clear ACK after congestion came.
    clear_since: Option<u64>,
}

impl AckSender {
    pub fn new(p: &AckParams, line_bps: u64) -> AckSender {
        AckSender {
            p: *p,
            line_bps,
            level: Level::None,
            rate_bps: line_bps,
            window_bytes: None,
            clear_since: None,
        }
    }

    /// An ACK arrived: `ceth` is its CETH (`None`: the ACK came without the indicator, or with
    /// BECN and nothing more, which counts as light). `becn` is the indicator bit; `rtt_ns` the
    /// shortest round trip measured so far (for the window), `now` the time (for
    /// `keep_rate_ns`). True when the rate changed.
    pub fn on_ack(
        &mut self,
        now: u64,
        becn: bool,
        ceth: Option<&CethRepr>,
        rtt_ns: Option<u64>,
    ) -> bool {
        let level = match (becn, ceth) {
            (false, _) => Level::None,
            (true, Some(c)) => c.level.max(Level::Light),
            (true, None) => Level::Light,
        };
        // Bytes that `ns` are at the line rate.
        let at_line = |ns: u64| (u128::from(self.line_bps) * u128::from(ns) / 8_000_000_000) as u64;
        // The bytes queued on the path: the depth reported, else (with `delay`) the delay
        // reported at the line rate, which is at least the bottleneck's, so the estimate errs
        // toward a smaller window.
        let queued = ceth.and_then(|c| match (c.queue_bytes, c.delay_ns) {
            (Some(q), _) => Some(u64::from(q)),
            (None, Some(d)) if self.p.delay => Some(at_line(u64::from(d))),
            _ => None,
        });
        self.window_bytes = match (self.p.queue_window, queued, rtt_ns) {
            (true, Some(q), Some(rtt)) if level != Level::None => {
                Some(at_line(rtt).saturating_sub(q))
            }
            _ => None,
        };
        let rate = (u128::from(self.line_bps) * u128::from(self.p.rate_permille[level as usize])
            / 1000) as u64;
        if level == Level::None && self.p.keep_rate_ns > 0 && self.level != Level::None {
            // Clear again: keep the congested rate for a while before the line rate.
            let since = *self.clear_since.get_or_insert(now);
            if now.saturating_sub(since) < self.p.keep_rate_ns {
                self.window_bytes = None;
                return false;
            }
        }
        self.clear_since = None;
        self.level = level;
        let changed = rate != self.rate_bps;
        self.rate_bps = rate;
        changed
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// Bytes the next round trip may have in flight, when a reported queue depth set it.
    pub fn window_bytes(&self) -> Option<u64> {
        self.window_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> AckParams {
        AckParams {
            window_packets: 8,
            window_ns: 1_000,
            light_permille: 125,
            moderate_permille: 375,
            ..AckParams::default()
        }
    }

    #[test]
    fn the_level_follows_the_marked_share_of_the_window() {
        let mut m = EcnMonitor::new(&params());
        // Eight clean packets 10 ns apart: none, nothing changes.
        for t in 0..8 {
            assert!(!m.on_packet(t * 10, false));
        }
        assert_eq!(m.level(), Level::None);
        // 1 of 8 marked (125 per mille): light, at once.
        assert!(m.on_packet(80, true));
        assert_eq!((m.level(), m.ratio()), (Level::Light, (1, 8)));
        // 2 of 8: moderate; 3 of 8 (375): still moderate; 4 of 8: heavy.
        assert!(m.on_packet(90, true));
        assert_eq!(m.level(), Level::Moderate);
        assert!(!m.on_packet(100, true));
        assert!(m.on_packet(110, true));
        assert_eq!((m.level(), m.ratio()), (Level::Heavy, (4, 8)));
        // Clean packets push the marks out of the 8-packet window, one by one.
        let levels: Vec<_> = (0..4)
            .map(|k| {
                m.on_packet(120 + 10 * k, false);
                m.level()
            })
            .collect();
        assert_eq!(
            levels,
            [Level::Heavy, Level::Heavy, Level::Heavy, Level::Heavy]
        );
        let levels: Vec<_> = (4..8)
            .map(|k| {
                m.on_packet(120 + 10 * k, false);
                m.level()
            })
            .collect();
        assert_eq!(
            levels,
            [Level::Moderate, Level::Moderate, Level::Light, Level::None]
        );
    }

    #[test]
    fn marks_older_than_the_window_time_are_forgotten() {
        let mut m = EcnMonitor::new(&params());
        m.on_packet(0, true);
        m.on_packet(10, true);
        assert_eq!(m.level(), Level::Heavy);
        // A slow flow: the next packet comes 2 µs later, past the 1 µs window; the marks age out.
        assert!(m.on_packet(2_010, false));
        assert_eq!((m.level(), m.ratio()), (Level::None, (0, 1)));
    }

    #[test]
    fn the_ceth_says_the_level_and_where_the_queue_is() {
        let mut m = EcnMonitor::new(&params());
        assert_eq!(m.ceth(Some(10)), None, "no CETH while uncongested");
        m.on_packet(0, true);
        let c = m.ceth(Some(48_000)).unwrap();
        assert_eq!(
            (c.level, c.location, c.marked, c.window, c.queue_bytes),
            (Level::Heavy, Location::Receiver, 1, 1, Some(48_000))
        );
        assert_eq!(m.ceth(None).unwrap().location, Location::Unknown);
    }

    #[test]
    fn the_sender_sets_its_rate_from_the_level_and_restores_at_once() {
        let p = AckParams {
            rate_permille: [1000, 500, 250, 125],
            ..AckParams::default()
        };
        let mut s = AckSender::new(&p, 10_000_000_000);
        let ceth = |level| CethRepr {
            level,
            ..CethRepr::default()
        };
        assert!(s.on_ack(0, true, Some(&ceth(Level::Moderate)), None));
        assert_eq!(s.rate_bps(), 2_500_000_000);
        assert!(s.on_ack(0, true, Some(&ceth(Level::Heavy)), None));
        assert_eq!(s.rate_bps(), 1_250_000_000);
        assert!(!s.on_ack(0, true, Some(&ceth(Level::Heavy)), None));
        // BECN without a CETH (an InfiniBand-style responder): light.
        assert!(s.on_ack(0, true, None, None));
        assert_eq!(s.rate_bps(), 5_000_000_000);
        // The first ACK without the indicator: straight back to the line rate.
        assert!(s.on_ack(0, false, None, None));
        assert_eq!((s.rate_bps(), s.level()), (10_000_000_000, Level::None));
    }

    #[test]
    fn a_reported_queue_depth_sizes_the_next_window() {
        let mut s = AckSender::new(&AckParams::default(), 10_000_000_000);
        let c = CethRepr {
            level: Level::Light,
            queue_bytes: Some(10_000),
            ..CethRepr::default()
        };
        // 10 Gbit/s x 20 µs = 25 000 bytes of path, 10 000 of them already queued.
        s.on_ack(0, true, Some(&c), Some(20_000));
        assert_eq!(s.window_bytes(), Some(15_000));
        let deep = CethRepr {
            queue_bytes: Some(90_000),
            ..c
        };
        s.on_ack(0, true, Some(&deep), Some(20_000));
        assert_eq!(s.window_bytes(), Some(0));
        s.on_ack(0, false, None, Some(20_000));
        assert_eq!(s.window_bytes(), None);
    }

    #[test]
    fn a_reported_delay_sizes_the_window_only_where_both_ends_use_it() {
        let c = CethRepr {
            level: Level::Light,
            delay_ns: Some(8_000),
            ..CethRepr::default()
        };
        // Off (the default): a delay word changes nothing.
        let mut off = AckSender::new(&AckParams::default(), 10_000_000_000);
        off.on_ack(0, true, Some(&c), Some(20_000));
        assert_eq!(off.window_bytes(), None);
        // On: 8 µs of queue at the 10 Gbit/s line rate is 10 000 bytes of the 25 000 the
        // 20 µs path holds; a depth, when given too, is what counts.
        let p = AckParams {
            delay: true,
            ..AckParams::default()
        };
        let mut s = AckSender::new(&p, 10_000_000_000);
        s.on_ack(0, true, Some(&c), Some(20_000));
        assert_eq!(s.window_bytes(), Some(15_000));
        let both = CethRepr {
            queue_bytes: Some(20_000),
            ..c
        };
        s.on_ack(0, true, Some(&both), Some(20_000));
        assert_eq!(s.window_bytes(), Some(5_000));
    }

    #[test]
    fn keep_rate_holds_the_congested_rate_for_a_while_after_the_path_clears() {
        let p = AckParams {
            rate_permille: [1000, 500, 250, 125],
            keep_rate_ns: 100_000,
            ..AckParams::default()
        };
        let mut s = AckSender::new(&p, 10_000_000_000);
        let heavy = CethRepr {
            level: Level::Heavy,
            ..CethRepr::default()
        };
        assert!(s.on_ack(0, true, Some(&heavy), None));
        // Clear ACKs from 1 µs: the rate stays until 100 µs of clear path.
        assert!(!s.on_ack(1_000, false, None, None));
        assert!(!s.on_ack(60_000, false, None, None));
        assert_eq!(s.rate_bps(), 1_250_000_000);
        // A congested ACK in between starts the wait over.
        assert!(!s.on_ack(80_000, true, Some(&heavy), None));
        assert!(!s.on_ack(150_000, false, None, None));
        assert_eq!(s.rate_bps(), 1_250_000_000);
        assert!(s.on_ack(250_000, false, None, None));
        assert_eq!((s.rate_bps(), s.level()), (10_000_000_000, Level::None));
        // Uncongested all along: nothing to keep.
        assert!(!s.on_ack(260_000, false, None, None));
    }

    #[test]
    fn parameters_are_checked_by_name() {
        assert_eq!(AckParams::default().validate(), Ok(()));
        let bad = AckParams {
            window_packets: 65,
            ..AckParams::default()
        };
        assert_eq!(bad.validate(), Err("window_packets"));
        let bad = AckParams {
            rate_permille: [1000, 250, 500, 125],
            ..AckParams::default()
        };
        assert_eq!(bad.validate(), Err("rate_permille"));
    }
}
