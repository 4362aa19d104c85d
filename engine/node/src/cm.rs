//! The connection manager on a node: QP1 (the MADs in and out), address resolution, and the
//! queue pairs the CM's exchanges create and destroy (`docs/cm.md`).
//!
//! [`proto::cm::Cm`] decides; this module carries its MADs in QP1 frames
//! ([`wire::gsi`]), resolves the MAC of a peer the application connects to (ARP requests from
//! a bounded cache, [`crate::arp`]), creates the queue pair a REP or an accept describes and
//! destroys it when the connection ends, and hands the application its events on a channel it
//! polls or waits on ([`CmEvents`]), like `rdma_get_cm_event`.
//!
//! None of it is on the per-packet path: a QP1 frame is recognised only after the RC parser
//! refused it (another transport), an ARP reply only after it refused the EtherType.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use proto::cc::negotiate;
use proto::cm::{
    Accept, Cm, CmConfig, CmCounters, CmError, CmEvent, Connect, Outgoing, Peer, QpParams, Request,
};
use proto::transport::{Mtu, QpConfig, QpState};
use wire::deth::DethRepr;
use wire::gsi::{self, GsiRepr};
use wire::{EthernetAddress, RoceIpv4};

use super::arp::{ArpCache, ArpConfig, Due, Resolve};
use super::node::{AddQpError, RdmaNode};
use super::rings::Qp;

/// How a node's CM is set up ([`RdmaNode::enable_cm`]).
#[derive(Debug, Clone)]
pub struct CmSetup {
    /// The CM's times and bounds; its address is the node's.
    pub cm: CmConfig,
    pub arp: ArpConfig,
    /// What every queue pair the CM creates starts from (queue depths, timers, congestion
    /// control); the QPNs, PSNs, addresses and negotiated limits come from the exchange.
    pub qp: QpConfig,
    /// Their completion queues (ids of the node's), unless a connect or accept names others.
    pub send_cq: u32,
    pub recv_cq: u32,
    /// The QPNs the CM gives out: from `first_qpn` up, skipping those in use.
    pub first_qpn: u32,
    /// Events the application has not taken, at most; the CM rejects requests beyond it.
    pub event_depth: usize,
}

impl CmSetup {
    pub fn new(qp: QpConfig, send_cq: u32, recv_cq: u32) -> CmSetup {
        // Communication IDs, PSNs and transaction IDs drawn from the system's generator: a
        // second process (or a restarted one) must not repeat the first one's IDs, which its
        // peer may still hold in time-wait (and refuse as a stale connection).
        let seed = u64::from(proto::transport::random_u32()) << 32
            | u64::from(proto::transport::random_u32());
        CmSetup {
            cm: CmConfig {
                seed,
                ..CmConfig::new(qp.local_ip, qp.local_mac)
            },
            arp: ArpConfig::default(),
            qp,
            send_cq,
            recv_cq,
            first_qpn: 0x100,
            event_depth: 1024,
        }
    }
}

/// What the application learns about its connections.
#[derive(Debug)]
pub enum ConnEvent {
    /// A REQ to a port this node listens on: accept or reject it.
    Request(Request),
    /// The connection is up. On the active side it brings the queue pair; the passive side
    /// got its queue pair from the accept. `private_data`: the REP's (active side).
    Established {
        id: u32,
        qp: Option<Qp>,
        private_data: Vec<u8>,
    },
    /// The peer rejected the connection (its reason, IBTA table 109, and private data).
    Rejected {
        id: u32,
        reason: u16,
        private_data: Vec<u8>,
    },
    /// The connection ended; its queue pair is gone (its work flushed).
    Disconnected { id: u32 },
    /// The peer never answered (REQ or REP retries spent); its queue pair is gone.
    TimedOut { id: u32 },
    /// Nobody answered the ARP requests for the peer's address.
    Unreachable { id: u32 },
}

/// The application's end of a node's CM events.
#[derive(Clone)]
pub struct CmEvents {
    rx: Receiver<ConnEvent>,
}

impl CmEvents {
    /// The next event, if one is waiting.
    pub fn poll(&self) -> Option<ConnEvent> {
        self.rx.try_recv().ok()
    }

    /// The next event, waiting for it at most `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<ConnEvent> {
        self.rx.recv_timeout(timeout).ok()
    }
}

/// What the application asks of the CM on the control path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmControl {
    Listen(u16),
    Unlisten(u16),
    Connect {
        ip: Ipv4Addr,
        port: u16,
        private_data: Vec<u8>,
        /// Send and receive completion queues, else the CM's.
        cqs: Option<(u32, u32)>,
        /// What the queue pair does otherwise than the CM's template.
        tweak: QpTweak,
    },
    Accept {
        id: u32,
        private_data: Vec<u8>,
        cqs: Option<(u32, u32)>,
        tweak: QpTweak,
    },
    Reject {
        id: u32,
        private_data: Vec<u8>,
    },
    Disconnect {
        id: u32,
    },
}

/// The answer to a [`CmControl`].
#[derive(Debug)]
pub enum CmReply {
    Done,
    /// The connection's ID; its outcome comes as an event.
    Connecting(u32),
    /// The accepted connection's queue pair (established once the RTU comes).
    Accepted(Qp),
}

/// Why a [`CmControl`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmCallError {
    #[error("this engine has no connection manager (it runs on worker 0 of the engine)")]
    NoCm,
    #[error(transparent)]
    Cm(#[from] CmError),
    #[error("creating the queue pair: {0}")]
    AddQp(#[from] AddQpError),
    #[error("the ARP cache is full of pending resolutions")]
    ArpFull,
}

portico_counters::counter_set! {
    /// QP1 and address resolution, besides the CM's own counters.
    pub struct Qp1Counters, slots Qp1Slot {
        /// QP1 frames received (UD SEND ONLY to QP 1 that parsed).
        qp1_frames: Sum,
        /// UD frames refused: not to QP 1 (Portico has no other UD queue pair).
        qp1_wrong_qp: Sum,
        /// QP1 frames refused: a Q_Key other than 0x80010000 or a source QP other than 1.
        qp1_bad_deth: Sum,
        /// QP1 frames refused: a bad checksum or ICRC, or a malformed frame.
        qp1_malformed: Sum,
        /// QP1 frames sent.
        qp1_sent: Sum,
        /// MADs dropped because the frame queue was full.
        qp1_tx_dropped: Sum,
        /// ARP requests sent.
        arp_requests: Sum,
        /// ARP answers learned.
        arp_learned: Sum,
        /// Resolutions given up.
        arp_failures: Sum,
        /// Events dropped because the application's event ring was full (the request they
        /// carried was rejected).
        cm_events_dropped: Sum,
        /// Queue pairs the CM created.
        cm_qps_created: Sum,
        /// Queue pairs the CM destroyed.
        cm_qps_destroyed: Sum,
        /// Queue pairs whose congestion control the Portico extension block settled with
        /// the peer (`docs/wire.md` §20).
        cm_cc_negotiated: Sum,
        /// Queue pairs configured `ack` whose peer offered or answered nothing (a standard
        /// peer, or private data that left no room): they run `dcqcn`.
        cm_cc_fallbacks: Sum,
    }
}

/// What Portico's target puts in its REP's private data, and its initiator reads from it: the
/// region a connection may WRITE and READ (`docs/wire.md`, "The REP's private data"). 24
/// bytes: version (1), flags (bit 0: the target takes durable WRITEs), two zero bytes, the
/// rkey, the address, the length, each big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionAd {
    pub flags: u8,
    pub rkey: u32,
    pub addr: u64,
    pub len: u64,
}

impl RegionAd {
    pub const VERSION: u8 = 1;
    pub const LEN: usize = 24;
    /// Flag: the target negotiated durable WRITEs.
    pub const DURABLE: u8 = 1;

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = Self::VERSION;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.rkey.to_be_bytes());
        b[8..16].copy_from_slice(&self.addr.to_be_bytes());
        b[16..24].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// The region in a REP's private data; `None` unless it starts with version 1.
    pub fn parse(private_data: &[u8]) -> Option<RegionAd> {
        let b = private_data.get(..Self::LEN)?;
        (b[0] == Self::VERSION).then(|| RegionAd {
            flags: b[1],
            rkey: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            addr: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            len: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// Frames waiting to go out at most.
const FRAME_QUEUE: usize = 1024;
/// How often, at least, established connections are checked for a queue pair in the error
/// state (a peer that vanished: the transport's retries ran out); they are also checked after
/// every iteration in which a queue pair's timer fired.
const SCAN_NS: u64 = 1_000_000;

/// A frame to send (the queue is the CM's, off the per-packet path: its MADs stay inline).
#[allow(clippy::large_enum_variant)]
enum OutFrame {
    Mad(Outgoing),
    ArpRequest(Ipv4Addr),
}

/// What one connection's queue pair does otherwise than the CM's template (`None`: as the
/// template says). The libfabric provider's message endpoints want plain SENDs on an engine
/// whose other connections are tagged; its endpoints' traffic classes put their connections in
/// shaper classes and DSCPs of their own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpTweak {
    /// [`QpConfig::tagged`].
    pub tagged: Option<bool>,
    /// [`QpConfig::traffic_class`]: the shaper class of the queue pair's requests.
    pub traffic_class: Option<u8>,
    /// [`QpConfig::dscp`] of the queue pair's packets (after the path's traffic class).
    pub dscp: Option<u8>,
}

impl QpTweak {
    /// The tweak of a queue pair tagged (or not) as `tagged` says, otherwise the template's.
    pub fn tagged(tagged: bool) -> QpTweak {
        QpTweak {
            tagged: Some(tagged),
            ..QpTweak::default()
        }
    }

    fn apply(&self, cfg: &mut QpConfig) {
        if let Some(t) = self.tagged {
            cfg.tagged = t;
        }
        if let Some(c) = self.traffic_class {
            cfg.traffic_class = c;
        }
        if let Some(d) = self.dscp {
            cfg.dscp = d;
        }
    }
}

/// A connection with a queue pair (or one to come).
struct ConnQp {
    qpn: Option<u32>,
    cqs: (u32, u32),
    tweak: QpTweak,
}

/// The CM's state on a node.
pub(crate) struct NodeCm {
    pub(crate) cm: Cm,
    pub(crate) arp: ArpCache,
    template: QpConfig,
    cqs: (u32, u32),
    next_qpn: u32,
    events: Sender<ConnEvent>,
    out: VecDeque<OutFrame>,
    /// MADs to peers whose MAC is being resolved.
    parked: Vec<Outgoing>,
    conns: HashMap<u32, ConnQp>,
    /// Accepted connections still waiting for their RTU, and their queue pairs: the first
    /// packet on the queue pair establishes them as well ([`Cm::traffic`]).
    awaiting_rtu: Vec<(u32, u32)>,
    /// Connections whose queue pair the error scan found in the error state, and when it
    /// first did (they are disconnected a scan period later).
    failed_since: HashMap<u32, u64>,
    pub(crate) counters: Qp1Counters,
    /// The node's time at its last receive or service (control calls carry none).
    pub(crate) now: u64,
    scanned_at: u64,
    psn: u32,
}

const NO_MAC: EthernetAddress = EthernetAddress([0; 6]);

impl RdmaNode {
    /// Gives this node a connection manager on QP1; returns the application's end of its
    /// events. The CM's own queue pairs use `setup.qp` as their template and the completion
    /// queues `setup.send_cq`/`recv_cq` (ids from [`crate::Cq::id`]).
    pub fn enable_cm(&mut self, mut setup: CmSetup) -> CmEvents {
        setup.cm.ip = self.ip;
        setup.cm.mac = self.mac;
        let (tx, rx) = channel::bounded(setup.event_depth.max(1));
        let mut cm = Cm::new(setup.cm);
        let psn = cm.draw_psn();
        self.cm = Some(Box::new(NodeCm {
            cm,
            arp: ArpCache::new(setup.arp),
            template: setup.qp,
            cqs: (setup.send_cq, setup.recv_cq),
            next_qpn: setup.first_qpn,
            events: tx,
            out: VecDeque::new(),
            parked: Vec::new(),
            conns: HashMap::new(),
            awaiting_rtu: Vec::new(),
            failed_since: HashMap::new(),
            counters: Qp1Counters::default(),
            now: 0,
            scanned_at: 0,
            psn,
        }));
        CmEvents { rx }
    }

    /// The CM's counters and QP1's, when the node has a CM.
    pub fn cm_counters(&self) -> Option<(CmCounters, Qp1Counters)> {
        self.cm.as_ref().map(|c| (c.cm.counters, c.counters))
    }

    /// The CM has a frame to send ([`RdmaNode::poll_cm_frame`]).
    #[inline]
    pub fn has_cm_frame(&self) -> bool {
        self.cm
            .as_ref()
            .is_some_and(|c| !c.out.is_empty() || c.cm.has_outgoing())
    }

    /// Connections the CM holds (time-wait included) and its queue pairs.
    pub fn cm_connections(&self) -> Option<(usize, usize)> {
        self.cm.as_ref().map(|c| {
            (
                c.cm.connections(),
                c.conns.values().filter(|q| q.qpn.is_some()).count(),
            )
        })
    }

    /// A frame the RC parser refused with `error`: QP1's, or an ARP packet the CM learns
    /// from. True when the CM took it (counted by the CM); false to count it as before.
    pub(crate) fn cm_take(&mut self, now: u64, frame: &[u8], error: wire::Error) -> bool {
        let Some(cm) = self.cm.as_mut() else {
            return false;
        };
        cm.now = now;
        match error {
            wire::Error::OtherTransport(gsi::SEND_ONLY | gsi::SEND_ONLY_IMM) => {}
            wire::Error::NotRoce { .. } => {
                let Some(arp) = wire::arp::parse_frame(frame) else {
                    return false;
                };
                if arp.target_ip == self.ip && cm.arp.learn(now, arp.sender_ip, arp.sender_hw) {
                    cm.counters.arp_learned += 1;
                    cm.release_parked(arp.sender_ip, arp.sender_hw);
                }
                return true;
            }
            _ => return false,
        }
        let (repr, payload) = match GsiRepr::parse(frame) {
            Ok(p) => p,
            Err(_) => {
                cm.counters.qp1_malformed += 1;
                return true;
            }
        };
        if repr.ip.dst_addr != self.ip {
            return false;
        }
        if repr.dest_qp != gsi::QPN {
            cm.counters.qp1_wrong_qp += 1;
            return true;
        }
        if repr.deth.qkey != wire::deth::GSI_QKEY || repr.deth.src_qp != gsi::QPN {
            cm.counters.qp1_bad_deth += 1;
            return true;
        }
        cm.counters.qp1_frames += 1;
        let from = Peer {
            ip: repr.ip.src_addr,
            mac: repr.src_mac,
        };
        // Refusals are counted by the CM, per reason.
        let _ = cm.cm.on_mad(now, from, payload);
        self.cm_events();
        true
    }

    /// An ARP request for our address: its sender is known now.
    pub(crate) fn cm_learn(&mut self, now: u64, frame: &[u8]) {
        if let Some(cm) = self.cm.as_mut()
            && let Some(arp) = wire::arp::parse_frame(frame)
            && cm.arp.learn(now, arp.sender_ip, arp.sender_hw)
        {
            cm.counters.arp_learned += 1;
            cm.release_parked(arp.sender_ip, arp.sender_hw);
        }
    }

    /// The CM's part of an iteration: timers, ARP retries, the error scan, events.
    pub(crate) fn cm_service(&mut self, now: u64) {
        let Some(cm) = self.cm.as_mut() else {
            return;
        };
        cm.now = now;
        cm.cm.on_timer(now);
        while let Some(due) = cm.arp.poll(now) {
            match due {
                Due::Request(ip) => cm.push(OutFrame::ArpRequest(ip)),
                Due::Failed(ip) => {
                    cm.counters.arp_failures += 1;
                    cm.parked.retain(|o| o.to.ip != ip);
                    for id in cm.cm.abandon_peer(ip) {
                        cm.conns.remove(&id);
                        let _ = cm.events.try_send(ConnEvent::Unreachable { id });
                    }
                }
            }
        }
        // An accepted connection whose queue pair has heard from the peer is up, RTU or not.
        let qps = &self.qps;
        let heard = |qpn: u32| {
            qps.lookup(qpn)
                .is_some_and(|i| qps.entries[i].qp.rx_packets() > 0)
        };
        let (waiting, cm) = (&mut cm.awaiting_rtu, &mut cm.cm);
        waiting.retain(|&(id, qpn)| cm.awaits_rtu(id) && !(heard(qpn) && cm.traffic(id)));
        let cm = self.cm.as_mut().expect("checked");
        // Only a timer puts a queue pair in the error state without the application knowing
        // (its retries ran out); look when one fired, and every SCAN_NS besides.
        let fired = std::mem::take(&mut self.timer_fired);
        if (fired || now.saturating_sub(cm.scanned_at) >= SCAN_NS) && !cm.conns.is_empty() {
            cm.scanned_at = now;
            let failed_since = &mut cm.failed_since;
            for (&id, c) in &cm.conns {
                let failed = c
                    .qpn
                    .and_then(|q| qps.lookup(q))
                    .is_some_and(|i| qps.entries[i].qp.state() == QpState::Error);
                if !failed {
                    continue;
                }
                // The peer stopped answering the transport (or broke its rules): end the
                // connection the CM way (its DREQ is resent until it times out, then the
                // connection is gone). Not at the first sight: a responder that NAKs goes
                // to the error state with its NAK still to send, and the CM's frames leave
                // before the queue pairs' in an iteration; a DREQ that overtook the NAK
                // would flush the peer's request instead of failing it with the NAK's
                // status. A queue pair in error for a whole scan period has sent it.
                let since = *failed_since.entry(id).or_insert(now);
                if now.saturating_sub(since) >= SCAN_NS {
                    failed_since.remove(&id);
                    let _ = cm.cm.disconnect(now, id);
                }
            }
        }
        self.cm_events();
    }

    /// When the CM next needs a poll (its timers, ARP retries), if it has anything to do;
    /// its last time seen while it has frames to send.
    pub fn cm_deadline(&mut self) -> Option<u64> {
        let cm = self.cm.as_mut()?;
        if !cm.out.is_empty() {
            return Some(cm.now);
        }
        [cm.cm.next_deadline(), cm.arp.next_due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Writes the next frame the CM sends (a MAD in a QP1 frame, or an ARP request) into
    /// `buf` (at least [`gsi::FRAME_LEN`] bytes); returns its length.
    pub fn poll_cm_frame(&mut self, buf: &mut [u8]) -> Option<usize> {
        let (mac, ip) = (self.mac, self.ip);
        let cm = self.cm.as_mut()?;
        loop {
            if let Some(o) = cm.cm.poll_send() {
                cm.route(o);
                continue;
            }
            break;
        }
        match cm.out.pop_front()? {
            OutFrame::ArpRequest(target) => {
                cm.counters.arp_requests += 1;
                wire::arp::request(mac, ip, target, buf).ok()
            }
            OutFrame::Mad(o) => {
                cm.psn = (cm.psn + 1) & wire::bth::PSN_MASK;
                let repr = GsiRepr {
                    src_mac: mac,
                    dst_mac: o.to.mac,
                    ip: RoceIpv4 {
                        src_addr: ip,
                        dst_addr: o.to.ip,
                        dscp: 0,
                        ecn: wire::Ecn::NotEct,
                        ident: 0,
                        dont_frag: true,
                        ttl: 64,
                    },
                    // QP1's flow: one source port, so that the peer's QP1 packets keep their
                    // order through ECMP.
                    src_port: 0xc001,
                    pkey: 0xffff,
                    dest_qp: gsi::QPN,
                    psn: cm.psn,
                    solicited: false,
                    deth: DethRepr {
                        qkey: wire::deth::GSI_QKEY,
                        src_qp: gsi::QPN,
                    },
                    immediate: None,
                };
                let n = repr.emit(&o.mad, buf).ok()?;
                cm.counters.qp1_sent += 1;
                Some(n)
            }
        }
    }

    /// Carries out an application's CM call.
    pub(crate) fn cm_control(&mut self, c: CmControl) -> Result<CmReply, CmCallError> {
        let Some(cm) = self.cm.as_mut() else {
            return Err(CmCallError::NoCm);
        };
        let now = cm.now;
        let reply = match c {
            CmControl::Listen(port) => {
                cm.cm.listen(port)?;
                CmReply::Done
            }
            CmControl::Unlisten(port) => {
                cm.cm.unlisten(port);
                CmReply::Done
            }
            CmControl::Connect {
                ip,
                port,
                private_data,
                cqs,
                tweak,
            } => {
                let mac = match cm.arp.resolve(now, ip) {
                    Resolve::Known(mac) => mac,
                    Resolve::Pending => NO_MAC,
                    Resolve::Full => return Err(CmCallError::ArpFull),
                };
                let qpn = self.free_qpn();
                let cm = self.cm.as_mut().expect("checked");
                let t = &cm.template;
                let psn = cm.cm.draw_psn();
                let connect = Connect {
                    peer: Peer { ip, mac },
                    port,
                    local_qpn: qpn,
                    send_psn: psn,
                    path_mtu: t.pmtu.code(),
                    initiator_depth: t.max_rd_atomic.min(255) as u8,
                    responder_resources: t.max_rd_atomic.min(255) as u8,
                    retry_count: t.retry_limit.min(7) as u8,
                    rnr_retry_count: t.rnr_retry_limit.min(7) as u8,
                    traffic_class: 0,
                    hop_limit: t.ttl,
                    private_data,
                    ext: negotiate::offer(&t.cc),
                };
                let id = cm.cm.connect(now, &connect)?;
                cm.conns.insert(
                    id,
                    ConnQp {
                        qpn: None,
                        cqs: cqs.unwrap_or(cm.cqs),
                        tweak,
                    },
                );
                cm.next_qpn = qpn + 1;
                CmReply::Connecting(id)
            }
            CmControl::Accept {
                id,
                private_data,
                cqs,
                tweak,
            } => {
                let qpn = self.free_qpn();
                let cm = self.cm.as_mut().expect("checked");
                let t = &cm.template;
                let (_, answer) = negotiate::accept(&t.cc, cm.cm.request_ext(id).as_ref());
                let accept = Accept {
                    local_qpn: qpn,
                    send_psn: cm.cm.draw_psn(),
                    initiator_depth: t.max_rd_atomic.min(255) as u8,
                    responder_resources: t.max_rd_atomic.min(255) as u8,
                    path_mtu: t.pmtu.code(),
                    rnr_retry_count: t.rnr_retry_limit.min(7) as u8,
                    private_data,
                    ext: answer,
                };
                let params = cm.cm.accept(now, id, &accept)?;
                let cqs = cqs.unwrap_or(cm.cqs);
                cm.next_qpn = qpn + 1;
                match self.cm_create_qp(id, &params, false, cqs, tweak) {
                    Ok(qp) => {
                        let cm = self.cm.as_mut().expect("checked");
                        cm.awaiting_rtu.push((id, params.local_qpn));
                        CmReply::Accepted(qp)
                    }
                    Err(e) => {
                        // No queue pair: withdraw the REP.
                        let cm = self.cm.as_mut().expect("checked");
                        let _ = cm.cm.disconnect(now, id);
                        cm.conns.remove(&id);
                        return Err(e.into());
                    }
                }
            }
            CmControl::Reject { id, private_data } => {
                cm.cm.reject(id, &private_data)?;
                CmReply::Done
            }
            CmControl::Disconnect { id } => {
                cm.cm.disconnect(now, id)?;
                CmReply::Done
            }
        };
        self.cm_events();
        Ok(reply)
    }

    /// A QPN no queue pair of this node has, from the CM's counter up (wrapping within the
    /// 24 bits, skipping 0 and 1).
    fn free_qpn(&self) -> u32 {
        let cm = self.cm.as_ref().expect("a CM");
        let mut q = cm.next_qpn;
        loop {
            q &= wire::bth::QPN_MASK;
            if q > 1 && self.qp(q).is_none() {
                return q;
            }
            q += 1;
        }
    }

    /// Creates connection `id`'s queue pair from the template and what the exchange agreed
    /// (`active`: this side sent the REQ).
    fn cm_create_qp(
        &mut self,
        id: u32,
        p: &QpParams,
        active: bool,
        cqs: (u32, u32),
        tweak: QpTweak,
    ) -> Result<Qp, AddQpError> {
        let cm = self.cm.as_mut().expect("a CM");
        let mut cfg = cm.template.clone();
        cfg.local_qpn = p.local_qpn;
        cfg.remote_qpn = p.remote_qpn;
        cfg.remote_ip = p.peer.ip;
        cfg.remote_mac = match p.peer.mac {
            NO_MAC => cm.arp.known(p.peer.ip).unwrap_or(NO_MAC),
            mac => mac,
        };
        cfg.send_psn = p.send_psn;
        cfg.recv_psn = p.recv_psn;
        // The smaller of the negotiated MTU and the template's (the CM refused codes no MTU
        // has).
        if let Some(m) = Mtu::from_code(p.path_mtu).filter(|m| m.bytes() < cfg.pmtu.bytes()) {
            cfg.pmtu = m;
        }
        cfg.max_rd_atomic = u32::from(p.initiator_depth.max(p.responder_resources).max(1));
        cfg.retry_limit = u32::from(p.retry_count);
        // 7 is "retry for ever" in the IBTA's encoding.
        cfg.rnr_retry_limit = match p.rnr_retry_count {
            7 => u32::MAX,
            n => u32::from(n),
        };
        cfg.pkey = p.pkey;
        if p.traffic_class != 0 {
            cfg.dscp = p.traffic_class >> 2;
            cfg.ecn = wire::Ecn::from_bits(p.traffic_class & 3);
        }
        if p.hop_limit != 0 {
            cfg.ttl = p.hop_limit;
        }
        cfg.cc = if active {
            negotiate::connected(&cfg.cc, p.peer_ext.as_ref())
        } else {
            negotiate::accept(&cfg.cc, p.peer_ext.as_ref()).0
        };
        let asked_ack = cm.template.cc.mode == proto::cc::CcMode::Ack;
        if asked_ack && p.peer_ext.is_none() {
            cm.counters.cm_cc_fallbacks += 1;
        } else if asked_ack || (!active && p.peer_ext.is_some()) {
            cm.counters.cm_cc_negotiated += 1;
        }
        tweak.apply(&mut cfg);
        cfg.udp_src_port = 0xc000 | (p.local_qpn as u16 & 0x3fff);
        let qp = self.add_qp_by_id(cfg, cqs.0, cqs.1)?;
        let cm = self.cm.as_mut().expect("a CM");
        cm.counters.cm_qps_created += 1;
        cm.conns.insert(
            id,
            ConnQp {
                qpn: Some(p.local_qpn),
                cqs,
                tweak,
            },
        );
        Ok(qp)
    }

    /// Hands the CM's events on: creates the queue pair of a connection the peer accepted,
    /// destroys those of connections that ended, and passes each to the application.
    fn cm_events(&mut self) {
        loop {
            let Some(cm) = self.cm.as_mut() else { return };
            let Some(ev) = cm.cm.poll_event() else { return };
            let now = cm.now;
            let out = match ev {
                CmEvent::ConnectRequest(r) => {
                    if cm.events.is_full() {
                        cm.counters.cm_events_dropped += 1;
                        let _ = cm.cm.reject(r.id, &[]);
                        continue;
                    }
                    ConnEvent::Request(r)
                }
                CmEvent::Connected { id, params } => {
                    let (cqs, tweak) = cm
                        .conns
                        .get(&id)
                        .map_or((cm.cqs, QpTweak::default()), |c| (c.cqs, c.tweak));
                    match self.cm_create_qp(id, &params, true, cqs, tweak) {
                        Ok(qp) => {
                            // The Established event that follows carries it.
                            let cm = self.cm.as_mut().expect("a CM");
                            let ev = cm.cm.poll_event();
                            let private_data = match ev {
                                Some(CmEvent::Established { private_data, .. }) => private_data,
                                _ => Vec::new(),
                            };
                            ConnEvent::Established {
                                id,
                                qp: Some(qp),
                                private_data,
                            }
                        }
                        Err(_) => {
                            let cm = self.cm.as_mut().expect("a CM");
                            let _ = cm.cm.poll_event();
                            let _ = cm.cm.disconnect(now, id);
                            continue;
                        }
                    }
                }
                CmEvent::Established { id, private_data } => ConnEvent::Established {
                    id,
                    qp: None,
                    private_data,
                },
                CmEvent::Rejected {
                    id,
                    reason,
                    private_data,
                } => {
                    self.cm_destroy(id);
                    ConnEvent::Rejected {
                        id,
                        reason,
                        private_data,
                    }
                }
                CmEvent::Disconnected { id } => {
                    self.cm_destroy(id);
                    ConnEvent::Disconnected { id }
                }
                CmEvent::TimedOut { id } => {
                    self.cm_destroy(id);
                    ConnEvent::TimedOut { id }
                }
            };
            let cm = self.cm.as_mut().expect("a CM");
            if cm.events.try_send(out).is_err() {
                cm.counters.cm_events_dropped += 1;
            }
        }
    }

    /// Destroys the queue pair of connection `id`, if it has one.
    fn cm_destroy(&mut self, id: u32) {
        let Some(cm) = self.cm.as_mut() else { return };
        let Some(c) = cm.conns.remove(&id) else {
            return;
        };
        if let Some(qpn) = c.qpn {
            cm.counters.cm_qps_destroyed += 1;
            self.destroy_qp(qpn);
        }
    }
}

impl NodeCm {
    fn push(&mut self, f: OutFrame) {
        if self.out.len() >= FRAME_QUEUE {
            self.counters.qp1_tx_dropped += 1;
            return;
        }
        self.out.push_back(f);
    }

    /// A MAD from the CM: out now when its peer's MAC is known, else parked until ARP
    /// answers (and the peer's address resolved).
    fn route(&mut self, mut o: Outgoing) {
        if o.to.mac == NO_MAC {
            match self.arp.known(o.to.ip) {
                Some(mac) => o.to.mac = mac,
                None => {
                    if self.parked.len() >= FRAME_QUEUE {
                        self.counters.qp1_tx_dropped += 1;
                    } else {
                        self.parked.push(o);
                    }
                    return;
                }
            }
        }
        self.push(OutFrame::Mad(o));
    }

    /// ARP answered for `ip`: its parked MADs go out.
    fn release_parked(&mut self, ip: Ipv4Addr, mac: EthernetAddress) {
        let mut k = 0;
        while k < self.parked.len() {
            if self.parked[k].to.ip == ip {
                let mut o = self.parked.remove(k);
                o.to.mac = mac;
                self.push(OutFrame::Mad(o));
            } else {
                k += 1;
            }
        }
        self.cm.learn_mac(ip, mac);
    }
}
