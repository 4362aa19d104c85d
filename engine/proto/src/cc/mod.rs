//! Congestion control (seed 002, "congestion carried in ACKs"), its DCQCN baseline, and the
//! bottleneck emulator both are measured through.
//!
//! A queue pair runs one of three schemes, negotiated per queue pair as the connection manager
//! would ([`CcMode`]):
//! - `none`: no reaction; the requester sends as its window allows.
//! - `dcqcn` ([`dcqcn`]): the receiver answers CE-marked packets with CNPs (opcode 0x81), the
//!   sender cuts its rate per CNP and climbs back by timer and byte counter.
//! - `ack` ([`ack`]): the receiver puts a congestion level into its ACKs (BECN and a CETH,
//!   `wire::ceth`); the sender sets its rate from the level at once and restores it on the
//!   first clear ACK.
//!
//! Both ends are pure and driven with times in ns: the receiver's [`Notifier`] (what to tell
//! the sender, and when) and the sender's [`RateControl`] (a controller and the [`Pacer`]
//! that holds the requests to its rate). The transport calls them; the worker's clock feeds
//! them. The benchmarks' `bottleneck` (`portico-bench`) is the switch port they are measured through.

pub mod ack;
pub mod dcqcn;
pub mod negotiate;
pub mod pacer;

pub use ack::{AckParams, AckSender, EcnMonitor, EcnScope, SharedLevel};
pub use dcqcn::{CnpPacer, Dcqcn, DcqcnParams};
pub use pacer::Pacer;

use wire::ceth::{CethRepr, Level};

/// The congestion control of a queue pair.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CcMode {
    #[default]
    None,
    Dcqcn,
    Ack,
}

impl CcMode {
    pub fn name(self) -> &'static str {
        match self {
            CcMode::None => "none",
            CcMode::Dcqcn => "dcqcn",
            CcMode::Ack => "ack",
        }
    }

    /// Parses `none`, `dcqcn` or `ack`.
    pub fn parse(s: &str) -> Option<CcMode> {
        match s {
            "none" => Some(CcMode::None),
            "dcqcn" => Some(CcMode::Dcqcn),
            "ack" => Some(CcMode::Ack),
            _ => None,
        }
    }
}

/// A queue pair's congestion control configuration (both ends use the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CcConfig {
    pub mode: CcMode,
    /// The sender's preset rate: what it sends at while uncongested (its port's line rate).
    pub line_rate_bps: u64,
    /// The pacer's depth: this long at the current rate may go in one burst.
    pub burst_ns: u64,
    pub ack: AckParams,
    pub dcqcn: DcqcnParams,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            mode: CcMode::None,
            line_rate_bps: 100_000_000_000,
            burst_ns: 50_000,
            ack: AckParams::default(),
            dcqcn: DcqcnParams::vendor(),
        }
    }
}

impl CcConfig {
    /// The first field out of range, by name.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.line_rate_bps == 0 {
            return Err("line_rate");
        }
        if self.burst_ns == 0 {
            return Err("burst");
        }
        self.ack.validate()?;
        self.dcqcn.validate()
    }
}

/// What the sender side counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CcStats {
    /// ACKs with the indicator set (`ack`), CNPs received (`dcqcn`).
    pub congestion_signals: u64,
    /// ACKs without the indicator after a congested one (`ack`: each restored the rate).
    pub restores: u64,
    /// Rate changes.
    pub rate_changes: u64,
    /// Times a request waited for the pacer.
    pub paced: u64,
    /// Times a request waited for the window a queue depth set.
    pub windowed: u64,
}

#[derive(Debug, Clone, PartialEq)]
enum Controller {
    None,
    Ack(AckSender),
    Dcqcn(Dcqcn),
}

/// The sender's side: the controller and the pacer that holds requests to its rate.
#[derive(Debug, Clone, PartialEq)]
pub struct RateControl {
    ctl: Controller,
    pacer: Option<Pacer>,
    mtu_frame: u32,
    /// The pacer turned a packet away; it is ready again at this time.
    paced_until: Option<u64>,
    pub stats: CcStats,
}

impl RateControl {
    /// `mtu_frame`: the frame length of a full packet (the window's unit).
    pub fn new(cfg: &CcConfig, mtu_frame: u32) -> RateControl {
        let (ctl, pacer) = match cfg.mode {
            CcMode::None => (Controller::None, None),
            CcMode::Ack => (
                Controller::Ack(AckSender::new(&cfg.ack, cfg.line_rate_bps)),
                Some(Pacer::new(cfg.line_rate_bps, cfg.burst_ns)),
            ),
            CcMode::Dcqcn => (
                Controller::Dcqcn(Dcqcn::new(&cfg.dcqcn, cfg.line_rate_bps)),
                Some(Pacer::new(cfg.line_rate_bps, cfg.burst_ns)),
            ),
        };
        RateControl {
            ctl,
            pacer,
            mtu_frame: mtu_frame.max(1),
            paced_until: None,
            stats: CcStats::default(),
        }
    }

    /// The rate the controller sets (`None` without congestion control).
    pub fn rate_bps(&self) -> Option<u64> {
        self.pacer.as_ref().map(|p| p.rate_bps())
    }

    /// The level the last ACK reported (`ack` only).
    pub fn level(&self) -> Option<Level> {
        match &self.ctl {
            Controller::Ack(a) => Some(a.level()),
            _ => None,
        }
    }

    /// Packets the window allows in flight, when a reported queue depth set one (at least
    /// one, so that the flow keeps a clock of ACKs).
    pub fn window_packets(&self) -> Option<u32> {
        match &self.ctl {
            Controller::Ack(a) => a
                .window_bytes()
                .map(|w| (w / u64::from(self.mtu_frame)).clamp(1, u64::from(u32::MAX)) as u32),
            _ => None,
        }
    }

    /// How many full packets the pacer lets go in `ns` at its current rate (`None`: no
    /// pacer).
    pub fn packets_within(&self, ns: u64) -> Option<u32> {
        let p = self.pacer.as_ref()?;
        let bits = u128::from(p.rate_bps()) * u128::from(ns) / 1_000_000_000;
        Some((bits / (u128::from(self.mtu_frame) * 8)).min(u128::from(u32::MAX)) as u32)
    }

    /// Whether a request packet may go at `now`; if not, the pacer's ready time becomes a
    /// deadline ([`RateControl::next_deadline`]).
    pub fn may_send(&mut self, now: u64) -> bool {
        let Some(p) = &mut self.pacer else {
            return true;
        };
        if p.may_send(now) {
            return true;
        }
        if self.paced_until.is_none() {
            self.stats.paced += 1;
        }
        self.paced_until = Some(p.ready_at(now));
        false
    }

    /// Counts a wait for the window (the requester checks it).
    pub fn note_windowed(&mut self) {
        self.stats.windowed += 1;
    }

    /// A request packet of `frame_len` bytes went at `now`.
    pub fn on_sent(&mut self, now: u64, frame_len: usize) {
        let Some(p) = &mut self.pacer else {
            return;
        };
        p.charge(now, frame_len);
        self.paced_until = None;
        if let Controller::Dcqcn(d) = &mut self.ctl
            && d.on_sent(frame_len)
        {
            let rate = d.rate_bps();
            self.set_rate(now, rate);
        }
    }

    fn set_rate(&mut self, now: u64, rate: u64) {
        if let Some(p) = &mut self.pacer
            && p.rate_bps() != rate.max(1)
        {
            p.set_rate(now, rate);
            self.stats.rate_changes += 1;
        }
    }

    /// An ACK (or NAK) arrived at `now`, with its BECN bit and CETH; `rtt_ns` is the shortest
    /// round trip measured. Only `ack` listens.
    pub fn on_ack(&mut self, now: u64, becn: bool, ceth: Option<&CethRepr>, rtt_ns: Option<u64>) {
        let Controller::Ack(a) = &mut self.ctl else {
            return;
        };
        let was = a.level();
        a.on_ack(now, becn, ceth, rtt_ns);
        if becn {
            self.stats.congestion_signals += 1;
        } else if was != Level::None && a.level() == Level::None {
            self.stats.restores += 1;
        }
        let rate = a.rate_bps();
        self.set_rate(now, rate);
    }

    /// A CNP arrived at `now`. Only `dcqcn` listens (a CNP to a queue pair without it is
    /// counted and ignored by the caller).
    pub fn on_cnp(&mut self, now: u64) -> bool {
        let Controller::Dcqcn(d) = &mut self.ctl else {
            return false;
        };
        self.stats.congestion_signals += 1;
        if d.on_cnp(now) {
            let rate = d.rate_bps();
            self.set_rate(now, rate);
        }
        true
    }

    /// Whether [`RateControl::next_deadline`] has one.
    #[inline(always)]
    pub fn has_deadline(&self) -> bool {
        self.paced_until.is_some()
            || matches!(&self.ctl, Controller::Dcqcn(d) if d.next_deadline().is_some())
    }

    /// The earliest time [`RateControl::on_timer`] has work: the pacer's ready time after it
    /// turned a packet away, or DCQCN's increase timer.
    pub fn next_deadline(&self) -> Option<u64> {
        let timer = match &self.ctl {
            Controller::Dcqcn(d) => d.next_deadline(),
            _ => None,
        };
        match (self.paced_until, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs what is due at `now`. True when a paced packet may go now.
    pub fn on_timer(&mut self, now: u64) -> bool {
        if let Controller::Dcqcn(d) = &mut self.ctl
            && d.on_timer(now)
        {
            let rate = d.rate_bps();
            self.set_rate(now, rate);
        }
        match self.paced_until {
            Some(t) if t <= now => {
                self.paced_until = None;
                true
            }
            _ => false,
        }
    }
}

/// What the receiver's side asks for after a data packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Notice {
    /// `ack`: the level changed; an ACK should go now.
    pub ack_now: bool,
    /// `dcqcn`: a CNP should go now.
    pub cnp: bool,
}

/// What the receiver counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NotifierStats {
    /// Level changes (`ack`).
    pub level_changes: u64,
    /// CNPs asked for (`dcqcn`).
    pub cnps: u64,
    /// CE-marked packets that found a CNP sent within the interval (`dcqcn`).
    pub cnps_suppressed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Watch {
    None,
    Ack(Box<EcnMonitor>),
    Dcqcn(CnpPacer),
}

/// The receiver's side: turns the CE marks of arriving data packets into what the sender is
/// told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notifier {
    watch: Watch,
    /// The receiver's own ingress queue, when something told it (the bottleneck stage).
    ingress_queue: Option<u32>,
    /// ... and its queuing delay in ns, when that is known too.
    ingress_delay: Option<u32>,
    /// The CETH carries the delay (`AckParams::delay`).
    delay: bool,
    /// The port-wide window's verdict on the last packet, when the engine keeps one
    /// ([`EcnScope::Port`]): it stands in for this queue pair's own window.
    shared: Option<SharedLevel>,
    /// The level this queue pair's last ACK said (port scope).
    said: Option<Level>,
    pub stats: NotifierStats,
}

impl Notifier {
    pub fn new(cfg: &CcConfig) -> Notifier {
        let watch = match cfg.mode {
            CcMode::None => Watch::None,
            CcMode::Ack => Watch::Ack(Box::new(EcnMonitor::new(&cfg.ack))),
            CcMode::Dcqcn => Watch::Dcqcn(CnpPacer::new(cfg.dcqcn.cnp_interval_ns)),
        };
        Notifier {
            watch,
            ingress_queue: None,
            ingress_delay: None,
            delay: cfg.ack.delay,
            shared: None,
            said: None,
            stats: NotifierStats::default(),
        }
    }

    /// The receiver's ingress queue depth now (bytes), for the CETH.
    pub fn set_ingress_queue(&mut self, bytes: Option<u32>) {
        self.ingress_queue = bytes;
    }

    /// The receiver's ingress queuing delay now (ns), for the CETH where `delay` is on.
    pub fn set_ingress_delay(&mut self, ns: Option<u32>) {
        self.ingress_delay = ns;
    }

    /// The delay word of a CETH sent now.
    fn delay_word(&self) -> Option<u32> {
        if self.delay { self.ingress_delay } else { None }
    }

    /// Whether this queue pair's ACKs follow a port-wide window (`ack` with
    /// [`EcnScope::Port`]).
    pub fn port_scoped(&self) -> bool {
        matches!(&self.watch, Watch::Ack(m) if m.scope() == EcnScope::Port)
    }

    /// The port-wide window's verdict on the packet about to be handed to
    /// [`Notifier::on_packet`].
    pub fn set_shared(&mut self, shared: SharedLevel) {
        self.shared = Some(shared);
    }

    /// A data packet arrived at `now`, `ce` if it was marked.
    pub fn on_packet(&mut self, now: u64, ce: bool) -> Notice {
        match &mut self.watch {
            Watch::None => Notice::default(),
            Watch::Ack(_) if self.shared.is_some() => {
                let s = self.shared.expect("checked");
                // The port's level changed, or this queue pair's ACKs still say another.
                let said = self.said;
                let ack_now = s.changed || said != Some(s.level);
                if ack_now {
                    self.stats.level_changes += 1;
                }
                Notice {
                    ack_now,
                    cnp: false,
                }
            }
            Watch::Ack(m) => {
                let changed = m.on_packet(now, ce);
                if changed {
                    self.stats.level_changes += 1;
                }
                Notice {
                    ack_now: changed,
                    cnp: false,
                }
            }
            Watch::Dcqcn(np) => {
                let cnp = ce && np.on_marked(now);
                if cnp {
                    self.stats.cnps += 1;
                } else if ce {
                    self.stats.cnps_suppressed += 1;
                }
                Notice {
                    ack_now: false,
                    cnp,
                }
            }
        }
    }

    /// A READ response arrived at `now`, `ce` if marked (seed 002's service "RC READ
    /// response"): into the window, as a request is, except where the port's window took it
    /// already (before it reached this queue pair), and without the ACK's bookkeeping (no ACK
    /// answers a READ response). True when a CNP is owed (`dcqcn`).
    pub fn on_read_response(&mut self, now: u64, ce: bool) -> bool {
        if matches!(self.watch, Watch::Ack(_)) && self.shared.is_some() {
            return false;
        }
        self.on_packet(now, ce).cnp
    }

    /// The window's state (`ack`; `None` otherwise).
    fn window(&self) -> Option<SharedLevel> {
        match (&self.watch, &self.shared) {
            (Watch::Ack(_), Some(s)) => Some(*s),
            (Watch::Ack(m), None) => Some(m.shared(false)),
            _ => None,
        }
    }

    /// The window's level now (`ack`; `None` otherwise).
    pub fn level(&self) -> Option<Level> {
        self.window().map(|s| s.level)
    }

    /// The window's state now, as the CETH of an enhanced CNP about READ responses (`ack`;
    /// `None` otherwise): service READ responses, and level none too (the path is clear
    /// again), which an ACK says by leaving the CETH out.
    pub fn read_response_ceth(&self) -> Option<CethRepr> {
        let s = self.window()?;
        Some(CethRepr {
            service: wire::ceth::service::RC_READ_RESPONSE,
            delay_ns: self.delay_word(),
            ..s.report(self.ingress_queue)
        })
    }

    /// Whether ACKs carry the indicator (`ack`).
    pub fn carries_state(&self) -> bool {
        matches!(self.watch, Watch::Ack(_))
    }

    /// For an ACK sent now: its BECN bit and CETH.
    pub fn ack_state(&mut self) -> (bool, Option<CethRepr>) {
        let c = match (&self.watch, &self.shared) {
            (Watch::Ack(_), Some(s)) => {
                self.said = Some(s.level);
                s.ceth(self.ingress_queue)
            }
            (Watch::Ack(m), None) => m.ceth(self.ingress_queue),
            _ => return (false, None),
        };
        let delay = self.delay_word();
        let c = c.map(|c| CethRepr {
            delay_ns: delay,
            ..c
        });
        (c.is_some(), c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_congestion_control_nothing_paces_or_notifies() {
        let cfg = CcConfig::default();
        let mut rc = RateControl::new(&cfg, 1078);
        assert!(rc.may_send(0));
        rc.on_sent(0, 1 << 30);
        assert!(rc.may_send(0));
        assert_eq!(rc.rate_bps(), None);
        assert_eq!(rc.next_deadline(), None);
        assert!(!rc.on_cnp(0));
        let mut n = Notifier::new(&cfg);
        assert_eq!(n.on_packet(0, true), Notice::default());
        assert_eq!(n.ack_state(), (false, None));
        assert_eq!(n.stats, NotifierStats::default(), "nothing counted either");
    }

    #[test]
    fn the_ceth_carries_the_ingress_delay_only_where_the_delay_field_is_on() {
        let mut cfg = CcConfig {
            mode: CcMode::Ack,
            ack: AckParams {
                scope: EcnScope::QueuePair,
                ..AckParams::default()
            },
            ..CcConfig::default()
        };
        for delay in [false, true] {
            cfg.ack.delay = delay;
            let mut n = Notifier::new(&cfg);
            n.set_ingress_queue(Some(30_000));
            n.set_ingress_delay(Some(24_000));
            n.on_packet(0, true);
            let (becn, ceth) = n.ack_state();
            let c = ceth.unwrap();
            assert!(becn);
            assert_eq!(c.queue_bytes, Some(30_000));
            assert_eq!(c.delay_ns, delay.then_some(24_000));
            assert_eq!(n.read_response_ceth().unwrap().delay_ns, c.delay_ns);
        }
    }

    /// With the port's window the node counts a READ response in it before the queue pair
    /// sees it; the queue pair then only reads the verdict. No ACK answers a READ response,
    /// so it is not an ACK owed, and it counts no level change of this queue pair's ACKs
    /// (`on_packet` would count one per response while its ACKs said nothing yet).
    #[test]
    fn a_read_response_under_the_port_s_window_is_not_counted_again() {
        let cfg = CcConfig {
            mode: CcMode::Ack,
            ..CcConfig::default()
        };
        let mut n = Notifier::new(&cfg);
        assert!(n.port_scoped());
        n.set_shared(SharedLevel {
            level: Level::Light,
            marked: 1,
            window: 8,
            changed: false,
        });
        for t in 0..3 {
            assert!(!n.on_read_response(t, true));
        }
        assert_eq!(n.stats, NotifierStats::default());
        assert_eq!(n.level(), Some(Level::Light));
        let c = n.read_response_ceth().unwrap();
        assert_eq!(
            (c.level, c.service, c.marked, c.window),
            (Level::Light, wire::ceth::service::RC_READ_RESPONSE, 1, 8)
        );
    }

    #[test]
    fn ack_mode_end_to_end_in_one_object_each() {
        let cfg = CcConfig {
            mode: CcMode::Ack,
            line_rate_bps: 8_000_000_000, // 1 byte/ns
            burst_ns: 1_000,
            ack: AckParams {
                rate_permille: [1000, 500, 250, 125],
                ..AckParams::default()
            },
            ..CcConfig::default()
        };
        let mut n = Notifier::new(&cfg);
        let mut rc = RateControl::new(&cfg, 1000);
        // One marked packet in an empty window: heavy; the receiver wants an ACK now.
        assert_eq!(
            n.on_packet(0, true),
            Notice {
                ack_now: true,
                cnp: false
            }
        );
        let (becn, ceth) = n.ack_state();
        rc.on_ack(10, becn, ceth.as_ref(), None);
        assert_eq!(rc.rate_bps(), Some(1_000_000_000));
        assert_eq!(rc.level(), Some(Level::Heavy));
        // Paced: the bucket is 1 µs at 1 Gbit/s deep (125 bytes); a 1000-byte frame leaves
        // 875 bytes of debt, 7 µs at 1/8 byte per ns.
        assert!(rc.may_send(10));
        rc.on_sent(10, 1000);
        assert!(!rc.may_send(10));
        let due = rc.next_deadline().unwrap();
        assert_eq!(due, 7010);
        assert!(!rc.on_timer(due - 1));
        assert!(rc.on_timer(due));
        // At 1 Gbit/s, 1000-byte frames are 8 µs apart: 31 of them span a quarter of a
        // 1 ms timeout.
        assert_eq!(rc.packets_within(250_000), Some(31));
        // A clear ACK restores the line rate at once.
        rc.on_ack(20, false, None, None);
        assert_eq!(rc.rate_bps(), Some(8_000_000_000));
        assert_eq!(rc.stats.restores, 1);
        assert_eq!(rc.stats.congestion_signals, 1);
    }

    #[test]
    fn dcqcn_mode_cnps_cut_and_timers_restore() {
        let cfg = CcConfig {
            mode: CcMode::Dcqcn,
            line_rate_bps: 10_000_000_000,
            ..CcConfig::default()
        };
        let mut n = Notifier::new(&cfg);
        assert!(n.on_packet(0, true).cnp);
        assert!(!n.on_packet(1_000, true).cnp, "within the 4 µs interval");
        assert!(n.on_packet(4_000, true).cnp);
        assert_eq!((n.stats.cnps, n.stats.cnps_suppressed), (2, 1));
        let mut rc = RateControl::new(&cfg, 1078);
        assert!(rc.on_cnp(0));
        let cut = rc.rate_bps().unwrap();
        assert!((5_000_000_000..5_010_000_000).contains(&cut), "{cut}");
        assert_eq!(rc.next_deadline(), Some(300_000));
        rc.on_timer(300_000);
        assert!(rc.rate_bps().unwrap() > cut);
    }
    #[test]
    fn a_port_wide_window_speaks_for_every_queue_pair() {
        let cfg = CcConfig {
            mode: CcMode::Ack,
            ..CcConfig::default()
        };
        let mut port = EcnMonitor::new(&cfg.ack);
        let (mut a, mut b) = (Notifier::new(&cfg), Notifier::new(&cfg));
        assert!(a.port_scoped());
        // A mark on a packet of queue pair A moves the port's level; A's ACK goes now...
        let changed = port.on_packet(0, true);
        a.set_shared(port.shared(changed));
        assert!(a.on_packet(0, true).ack_now);
        let (becn, ceth) = a.ack_state();
        assert!(becn);
        assert_eq!(ceth.unwrap().level, Level::Heavy);
        // ... and so does B's at its next packet, though that one was not marked: its ACKs
        // have not said the port's level yet.
        let changed = port.on_packet(10, false);
        assert!(!changed, "1 of 2 is still heavy");
        b.set_shared(port.shared(changed));
        assert!(b.on_packet(10, false).ack_now);
        assert_eq!(b.ack_state().1.unwrap().marked, 1);
        // Said once, the same level does not ask for another ACK.
        b.set_shared(port.shared(false));
        assert!(!b.on_packet(20, false).ack_now);
    }
}
