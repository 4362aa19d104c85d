//! The communication manager (IBTA chapter 12) as rdma_cm speaks it over RoCEv2: the
//! connection state machine of both sides, pure and in the caller's time.
//!
//! A node gives it the MADs QP1 received ([`Cm::on_mad`]) and the application's calls
//! ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`], [`Cm::disconnect`]); it
//! hands back MADs to send ([`Cm::poll_send`]) and events ([`Cm::poll_event`]): a connection
//! request to accept or reject, the parameters of a queue pair to create
//! ([`CmEvent::Connected`] on the active side, the accept's own on the passive side), a
//! connection established, rejected, disconnected or timed out. Timers ([`Cm::on_timer`],
//! [`Cm::next_deadline`]) resend the last message as the messages negotiate (the REQ's CM
//! response timeouts and Max CM Retries, an MRA's service timeout) and end a connection whose
//! peer stopped answering.
//!
//! ```text
//!  active                                   passive
//!  connect ──REQ──────────────────────────► ReqRcvd ─ event ConnectRequest
//!  ReqSent   ◄──────────────────MRA (dup REQ while the application decides)
//!  MraRcvd   ◄──────────────────REP──────── accept: RepSent
//!  Established ─RTU───────────────────────► Established
//!  disconnect ─DREQ──────────────────────►  (DREP) TimeWait
//!  DreqSent  ◄──────────────────DREP
//!  TimeWait ─ (time) ─ gone
//! ```
//!
//! What it refuses, counted in [`CmCounters`]: MADs that are not well-formed CM messages
//! ([`MadRefusal`]), REQs to a port nobody listens on (REJ "invalid service ID"), REQs of
//! another transport or an impossible MTU, REQs beyond the half-open bound (REJ "no
//! resources": a REQ flood ends there, before any queue pair or much memory), messages that
//! name a communication ID this CM does not have (REJ "invalid communication ID" for a REP,
//! DREP for a DREQ: the peer may have missed ours; dropped otherwise), and REQs that repeat a
//! connection in time-wait (REJ "stale connection"). Not supported: alternate paths, LAP/APR,
//! SIDR, peer-to-peer REQs (`docs/cm.md`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::Ipv4Addr;

use wire::EthernetAddress;
use wire::cm::portico_ext::{self, ExtRepr};
use wire::cm::{
    self, Answered, DreqRepr, IdsRepr, MraRepr, PathRepr, RejRepr, RepRepr, ReqRepr, rdma_cm,
    rej_reason,
};
use wire::mad::{self, MadRepr, Method, cm_attr};

use crate::rng::SplitMix64;

#[cfg(test)]
mod tests;

/// 4.096 µs · 2^`exp`, the IBTA's time code (CM response timeouts, MRA service timeouts,
/// packet life times), in nanoseconds; codes above 31 are taken as 31.
pub const fn time_code_ns(exp: u8) -> u64 {
    let e = if exp > 31 { 31 } else { exp };
    4096u64 << e
}

/// How a CM behaves: its address and the times and bounds it negotiates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    pub ip: Ipv4Addr,
    pub mac: EthernetAddress,
    /// This CA's GUID, in REQs and REPs (any value; rdma_cm does not check it over RoCE).
    pub ca_guid: u64,
    /// This CM's response time, the time code it sends as its CM response timeout (20:
    /// 4.3 s, rdma_cm's default): how long a peer waits for this CM's answer before it
    /// resends. Also the wait for a peer's answer to a REQ, REP or DREQ of ours, unless the
    /// peer's REQ said otherwise.
    pub response_timeout: u8,
    /// How many times a REQ, REP or DREQ is resent before the connection times out (15,
    /// rdma_cm's default; at most 15, the field's 4 bits).
    pub max_retries: u8,
    /// Passive connections not yet established (a REQ waiting for the application, or a REP
    /// waiting for the RTU) at most; a REQ beyond them is rejected with "no resources".
    pub max_half_open: usize,
    /// Connections of every state at most (the queue pairs they hold, or will).
    pub max_connections: usize,
    /// How long a connection stays in time-wait after it ended, answering a repeated DREQ
    /// with DREP and a repeated REQ with REJ "stale connection".
    pub time_wait_ns: u64,
    /// Seed for communication IDs, starting PSNs and transaction IDs.
    pub seed: u64,
}

impl CmConfig {
    pub fn new(ip: Ipv4Addr, mac: EthernetAddress) -> CmConfig {
        CmConfig {
            ip,
            mac,
            ca_guid: u64::from_be_bytes([
                mac.0[0] ^ 0x02,
                mac.0[1],
                mac.0[2],
                0xff,
                0xfe,
                mac.0[3],
                mac.0[4],
                mac.0[5],
            ]),
            response_timeout: 20,
            max_retries: 15,
            max_half_open: 256,
            max_connections: 4096,
            time_wait_ns: 1_000_000_000,
            seed: 0x5eed_c0de,
        }
    }
}

/// Where a peer CM is: the address its MADs come from and ours go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    pub ip: Ipv4Addr,
    pub mac: EthernetAddress,
}

/// What a connected queue pair needs from the exchange: both QPNs and starting PSNs, and
/// what the two sides agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    pub local_qpn: u32,
    pub remote_qpn: u32,
    /// The PSN of this side's first request.
    pub send_psn: u32,
    /// The PSN this side expects first.
    pub recv_psn: u32,
    /// The path MTU, an IBTA code (1: 256 ... 5: 4096).
    pub path_mtu: u8,
    /// READs this side may have outstanding at the peer (its initiator depth).
    pub initiator_depth: u8,
    /// READs of the peer's this side answers at once (its responder resources).
    pub responder_resources: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub pkey: u16,
    pub peer: Peer,
    /// The path's traffic class (the IPv4 TOS byte) and hop limit (TTL).
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// The peer's Portico extension block (`wire::cm::portico_ext`): the REQ's on the
    /// passive side, the REP's on the active side; `None` from a standard peer.
    pub peer_ext: Option<ExtRepr>,
}

/// What the application asks of a connection to a listener ([`Cm::connect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub peer: Peer,
    pub port: u16,
    /// The queue pair this side will use, and its first PSN.
    pub local_qpn: u32,
    pub send_psn: u32,
    pub path_mtu: u8,
    pub initiator_depth: u8,
    pub responder_resources: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// The application's private data, after rdma_cm's header (at most
    /// [`CONNECT_PRIVATE_LEN`] bytes).
    pub private_data: Vec<u8>,
    /// Portico's extension block, in the private data's last bytes; left out where the
    /// application's data reaches into them.
    pub ext: Option<ExtRepr>,
}

/// What the application answers to a connection request ([`Cm::accept`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accept {
    pub local_qpn: u32,
    pub send_psn: u32,
    /// This side's limits; the REP carries the smaller of each and the REQ's.
    pub initiator_depth: u8,
    pub responder_resources: u8,
    /// The largest path MTU this side takes.
    pub path_mtu: u8,
    /// The RNR retry count the peer should use (what this side's receive queue needs).
    pub rnr_retry_count: u8,
    /// At most [`cm::REP_PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
    /// Portico's extension block, in the private data's last bytes (as [`Connect::ext`]).
    pub ext: Option<ExtRepr>,
}

/// Private data as the application is handed it: a Portico extension block in its tail
/// zeroed (what a standard peer's zeros would have been).
fn app_private_data(private_data: &[u8]) -> Vec<u8> {
    let mut v = private_data.to_vec();
    if ExtRepr::parse_tail(&v).is_some() {
        ExtRepr::clear_tail(&mut v);
    }
    v
}

/// Bytes of the application's private data a REQ carries after rdma_cm's header.
pub const CONNECT_PRIVATE_LEN: usize = cm::REQ_PRIVATE_DATA_LEN - rdma_cm::HEADER_LEN;

/// A connection request as the passive application sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: u32,
    pub port: u16,
    pub peer: Peer,
    /// The peer's rdma_cm source port.
    pub peer_port: u16,
    pub remote_qpn: u32,
    pub initiator_depth: u8,
    pub responder_resources: u8,
    pub path_mtu: u8,
    /// The application's bytes after rdma_cm's header ([`CONNECT_PRIVATE_LEN`] of them),
    /// with a Portico extension block zeroed.
    pub private_data: Vec<u8>,
    /// The peer's Portico extension block, if its REQ carried one.
    pub ext: Option<ExtRepr>,
}

/// What happened, for the node (which creates and destroys queue pairs) and the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ to a listening port: accept or reject it.
    ConnectRequest(Request),
    /// Active side: the REP came; create the queue pair with these parameters (the RTU is on
    /// its way). Followed by [`CmEvent::Established`].
    Connected { id: u32, params: QpParams },
    /// The connection is up: the active side sent its RTU, the passive side received it.
    /// `private_data` is the REP's (active side) or the RTU's (passive side).
    Established { id: u32, private_data: Vec<u8> },
    /// The peer rejected our REQ (or our REP): its reason and private data.
    Rejected {
        id: u32,
        reason: u16,
        private_data: Vec<u8>,
    },
    /// The connection ended (either side's DREQ, or ours unanswered).
    Disconnected { id: u32 },
    /// No answer after every retry: a REQ without a REP, a REP without an RTU.
    TimedOut { id: u32 },
}

/// A MAD to send on QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: Peer,
    pub mad: [u8; mad::MAD_LEN],
}

/// Why a MAD was not taken, before the CM looked at its message; each counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadRefusal {
    /// Not 256 bytes.
    Length,
    /// Base version other than 1.
    BaseVersion,
    /// A class other than the CM's.
    Class,
    /// A CM class version other than 2.
    ClassVersion,
    /// A method other than Send.
    Method,
    /// An attribute this CM does not take (LAP, APR, SIDR, ClassPortInfo, unknown).
    Attribute,
}

portico_counters::counter_set! {
    /// What a CM counts, declared once (the names are the JSON keys a node publishes).
    pub struct CmCounters, slots CmSlot {
        /// MADs QP1 handed to the CM.
        mads_received: Sum,
        /// MADs the CM sent (first sends, resends and answers).
        mads_sent: Sum,
        /// MADs refused: not 256 bytes.
        mad_bad_length: Sum,
        /// MADs refused: base version other than 1.
        mad_bad_base_version: Sum,
        /// MADs refused: a management class other than the CM's.
        mad_bad_class: Sum,
        /// MADs refused: a CM class version other than 2.
        mad_bad_class_version: Sum,
        /// MADs refused: a method other than Send.
        mad_bad_method: Sum,
        /// MADs refused: an attribute this CM does not take (LAP, APR, SIDR, ClassPortInfo,
        /// unknown ones).
        mad_unsupported_attribute: Sum,
        /// CM messages naming a communication ID this CM does not have.
        cm_unknown_comm_id: Sum,
        /// Repeated CM messages (answered again or ignored).
        cm_duplicates: Sum,
        /// REQs rejected: nobody listens on their port.
        cm_rej_no_listener: Sum,
        /// REQs rejected: the half-open or the connection bound was reached.
        cm_rej_no_resources: Sum,
        /// REQs rejected for their content (transport, MTU, addresses, a stale connection).
        cm_rej_invalid: Sum,
        /// MADs resent by a CM timer.
        cm_resends: Sum,
        /// Connections that timed out (no answer after every retry, or a request the
        /// application never answered).
        cm_timeouts: Sum,
        /// Connections established.
        cm_established: Sum,
        /// Connections ended.
        cm_disconnected: Sum,
        /// Connections the peer rejected.
        cm_rejected: Sum,
    }
}

/// Why an application's call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    #[error("port {0} is already listened on")]
    PortInUse(u16),
    #[error("no connection {0:#x}")]
    NoConnection(u32),
    #[error("connection {0:#x} is not in a state that allows this")]
    WrongState(u32),
    #[error("private data of {len} bytes, at most {max}")]
    PrivateDataTooLong { len: usize, max: usize },
    #[error("{0} connections already: the bound")]
    TooMany(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for the REP.
    ReqSent,
    /// Active: the peer sent an MRA for our REQ; waiting longer.
    MraRcvd,
    /// Passive: the REQ went to the application.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    Established,
    DreqSent,
    TimeWait,
}

/// One connection, either side.
#[derive(Debug, Clone)]
struct Conn {
    state: State,
    active: bool,
    local_id: u32,
    remote_id: u32,
    peer: Peer,
    tid: u64,
    /// Active: the REQ as sent. Passive: the REQ as received.
    req: ReqRepr,
    params: Option<QpParams>,
    /// The last message this side sent in the exchange, resent by the timer or on a repeat.
    last: Option<[u8; mad::MAD_LEN]>,
    deadline: Option<u64>,
    /// Resends left for `last`.
    tries_left: u8,
    /// Wait per try.
    wait_ns: u64,
}

/// The communication manager of one port.
pub struct Cm {
    cfg: CmConfig,
    rng: SplitMix64,
    conns: HashMap<u32, Conn>,
    /// Passive connections by the peer's communication ID and address: repeated REQs.
    by_remote: HashMap<(u32, Ipv4Addr), u32>,
    listeners: Vec<u16>,
    timers: BinaryHeap<Reverse<(u64, u32)>>,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    half_open: usize,
    next_id: u32,
    pub counters: CmCounters,
}

impl Cm {
    pub fn new(cfg: CmConfig) -> Cm {
        let mut rng = SplitMix64::new(cfg.seed);
        let next_id = rng.next_u64() as u32;
        Cm {
            cfg,
            rng,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: Vec::new(),
            timers: BinaryHeap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            half_open: 0,
            next_id,
            counters: CmCounters::default(),
        }
    }

    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// Connections held, of every state (time-wait included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Passive connections not yet established.
    pub fn half_open(&self) -> usize {
        self.half_open
    }

    /// A fresh 24-bit starting PSN.
    pub fn draw_psn(&mut self) -> u32 {
        self.rng.next_u64() as u32 & 0x00ff_ffff
    }

    pub fn listen(&mut self, port: u16) -> Result<(), CmError> {
        if self.listeners.contains(&port) {
            return Err(CmError::PortInUse(port));
        }
        self.listeners.push(port);
        Ok(())
    }

    pub fn unlisten(&mut self, port: u16) -> bool {
        let before = self.listeners.len();
        self.listeners.retain(|&p| p != port);
        before != self.listeners.len()
    }

    fn fresh_id(&mut self) -> u32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let id = self.next_id;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Sends a REQ for `c`; returns the connection's (local communication) ID.
    pub fn connect(&mut self, now: u64, c: &Connect) -> Result<u32, CmError> {
        if c.private_data.len() > CONNECT_PRIVATE_LEN {
            return Err(CmError::PrivateDataTooLong {
                len: c.private_data.len(),
                max: CONNECT_PRIVATE_LEN,
            });
        }
        if self.conns.len() >= self.cfg.max_connections {
            return Err(CmError::TooMany(self.conns.len()));
        }
        let id = self.fresh_id();
        let mut private_data = [0u8; cm::REQ_PRIVATE_DATA_LEN];
        // rdma_cm's source port: ours is the communication ID's low half (any port will do;
        // the passive side only reports it).
        rdma_cm::CmaHeader::ipv4(self.cfg.ip, id as u16 | 0x8000, c.peer.ip)
            .emit(&mut private_data)
            .expect("92 bytes hold the header");
        private_data[rdma_cm::HEADER_LEN..][..c.private_data.len()]
            .copy_from_slice(&c.private_data);
        if let Some(ext) = c.ext
            && c.private_data.len() <= CONNECT_PRIVATE_LEN - portico_ext::LEN
        {
            ext.emit_tail(&mut private_data);
        }
        let path = PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: mapped(self.cfg.ip),
            remote_gid: mapped(c.peer.ip),
            flow_label: 0,
            packet_rate: 0,
            traffic_class: c.traffic_class,
            hop_limit: c.hop_limit,
            sl: 0,
            // The Linux CM sets it only for a hop limit of 1 or less.
            subnet_local: c.hop_limit <= 1,
            local_ack_timeout: 14,
        };
        let req = ReqRepr {
            local_comm_id: id,
            service_id: rdma_cm::service_id(c.port),
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: c.local_qpn,
            responder_resources: c.responder_resources,
            local_eecn: 0,
            initiator_depth: c.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.response_timeout,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: c.send_psn & 0x00ff_ffff,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: c.retry_count.min(7),
            pkey: 0xffff,
            path_mtu: c.path_mtu,
            rdc_exists: false,
            rnr_retry_count: c.rnr_retry_count.min(7),
            max_cm_retries: self.cfg.max_retries.min(15),
            srq: false,
            extended_transport_type: 0,
            primary_path: path,
            alternate_path: PathRepr::default(),
            private_data,
        };
        let tid = self.rng.next_u64();
        let mut m = [0u8; mad::MAD_LEN];
        write_mad(&mut m, cm_attr::REQ, tid, |d| req.emit(d));
        let wait_ns = Self::wait_ns(self.cfg.response_timeout);
        let conn = Conn {
            state: State::ReqSent,
            active: true,
            local_id: id,
            remote_id: 0,
            peer: c.peer,
            tid,
            req,
            params: None,
            last: Some(m),
            deadline: None,
            tries_left: self.cfg.max_retries,
            wait_ns,
        };
        self.conns.insert(id, conn);
        self.send(c.peer, m);
        self.arm(id, now + wait_ns);
        Ok(id)
    }

    /// Accepts connection request `id` (a [`CmEvent::ConnectRequest`]); returns the
    /// parameters of the queue pair to create, which the REP announces.
    pub fn accept(&mut self, now: u64, id: u32, a: &Accept) -> Result<QpParams, CmError> {
        if a.private_data.len() > cm::REP_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                len: a.private_data.len(),
                max: cm::REP_PRIVATE_DATA_LEN,
            });
        }
        let rt = self.cfg.response_timeout;
        let ca_guid = self.cfg.ca_guid;
        let max_retries = self.cfg.max_retries;
        let c = self.conns.get_mut(&id).ok_or(CmError::NoConnection(id))?;
        if c.state != State::ReqRcvd {
            return Err(CmError::WrongState(id));
        }
        let r = &c.req;
        // An answer the application's bytes leave no room for is not sent: then no block was
        // exchanged, and this side settles as the peer will, without one.
        let answered = a.private_data.len() <= cm::REP_PRIVATE_DATA_LEN - portico_ext::LEN;
        let params = QpParams {
            local_qpn: a.local_qpn,
            remote_qpn: r.local_qpn,
            send_psn: a.send_psn & 0x00ff_ffff,
            recv_psn: r.starting_psn,
            path_mtu: r.path_mtu.min(a.path_mtu),
            // Our READs go to the peer's responder resources, and we answer as many of its
            // READs as it will send (its initiator depth), each within our own limits.
            initiator_depth: a.initiator_depth.min(r.responder_resources),
            responder_resources: a.responder_resources.min(r.initiator_depth),
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            pkey: r.pkey,
            peer: c.peer,
            traffic_class: r.primary_path.traffic_class,
            hop_limit: r.primary_path.hop_limit,
            peer_ext: ExtRepr::parse_tail(&r.private_data).filter(|_| answered),
        };
        let mut private_data = [0u8; cm::REP_PRIVATE_DATA_LEN];
        private_data[..a.private_data.len()].copy_from_slice(&a.private_data);
        if let Some(ext) = a.ext
            && answered
        {
            ext.emit_tail(&mut private_data);
        }
        let rep = RepRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: params.local_qpn,
            local_eecn: 0,
            starting_psn: params.send_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: a.rnr_retry_count.min(7),
            srq: false,
            local_ca_guid: ca_guid,
            private_data,
        };
        let mut m = [0u8; mad::MAD_LEN];
        write_mad(&mut m, cm_attr::REP, c.tid, |d| rep.emit(d));
        // The peer said how long it takes to answer (its local CM response timeout), and
        // how often we may resend.
        let wait = Self::wait_ns(c.req.local_cm_response_timeout.max(rt));
        c.state = State::RepSent;
        c.params = Some(params);
        c.last = Some(m);
        c.tries_left = c.req.max_cm_retries.min(max_retries);
        c.wait_ns = wait;
        let peer = c.peer;
        self.send(peer, m);
        self.arm(id, now + wait);
        Ok(params)
    }

    /// Rejects connection request `id` with reason "consumer defined" and `private_data`.
    pub fn reject(&mut self, id: u32, private_data: &[u8]) -> Result<(), CmError> {
        if private_data.len() > cm::REJ_PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong {
                len: private_data.len(),
                max: cm::REJ_PRIVATE_DATA_LEN,
            });
        }
        let c = self.conns.get(&id).ok_or(CmError::NoConnection(id))?;
        if c.state != State::ReqRcvd {
            return Err(CmError::WrongState(id));
        }
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_id);
        self.send_rej(
            peer,
            tid,
            id,
            remote,
            Answered::Req,
            rej_reason::CONSUMER_DEFINED,
            private_data,
        );
        self.forget(id);
        Ok(())
    }

    /// Ends connection `id`: a DREQ, answered by DREP (or resent until it times out); the
    /// [`CmEvent::Disconnected`] comes then. A connection not yet established is ended at
    /// once: a REQ or a REP of ours is withdrawn with REJ "timeout".
    pub fn disconnect(&mut self, now: u64, id: u32) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoConnection(id))?;
        match c.state {
            State::Established => {
                let dreq = DreqRepr {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    remote_qpn: c.params.map_or(0, |p| p.remote_qpn),
                    private_data: [0; cm::DREQ_PRIVATE_DATA_LEN],
                };
                let tid = self.rng.next_u64();
                let mut m = [0u8; mad::MAD_LEN];
                write_mad(&mut m, cm_attr::DREQ, tid, |d| dreq.emit(d));
                let wait = Self::wait_ns(self.cfg.response_timeout);
                let tries = self.cfg.max_retries;
                let c = self.conns.get_mut(&id).expect("looked up above");
                let peer = c.peer;
                c.state = State::DreqSent;
                c.last = Some(m);
                c.tries_left = tries;
                c.wait_ns = wait;
                self.send(peer, m);
                self.arm(id, now + wait);
                Ok(())
            }
            State::ReqSent | State::MraRcvd | State::RepSent | State::ReqRcvd => {
                let (peer, tid, remote, active) = (c.peer, c.tid, c.remote_id, c.active);
                let answered = if active { Answered::Req } else { Answered::Rep };
                self.send_rej(peer, tid, id, remote, answered, rej_reason::TIMEOUT, &[]);
                self.forget(id);
                self.events.push_back(CmEvent::Disconnected { id });
                self.counters.cm_disconnected += 1;
                Ok(())
            }
            State::DreqSent | State::TimeWait => Err(CmError::WrongState(id)),
        }
    }

    /// The peer at `ip` is at `mac` (address resolution answered): every connection to it
    /// that did not know its MAC yet takes it, for its later MADs and its queue pair.
    pub fn learn_mac(&mut self, ip: Ipv4Addr, mac: EthernetAddress) {
        for c in self.conns.values_mut() {
            if c.peer.ip == ip && c.peer.mac == EthernetAddress([0; 6]) {
                c.peer.mac = mac;
            }
        }
    }

    /// The peer at `ip` cannot be reached (address resolution failed): the active
    /// connections to it that still wait for an answer to their REQ are forgotten, without a
    /// message or an event; returns their IDs.
    pub fn abandon_peer(&mut self, ip: Ipv4Addr) -> Vec<u32> {
        let ids: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.active && c.peer.ip == ip && matches!(c.state, State::ReqSent))
            .map(|c| c.local_id)
            .collect();
        for &id in &ids {
            self.forget(id);
        }
        ids
    }

    /// A MAD waits to be sent.
    pub fn has_outgoing(&self) -> bool {
        !self.out.is_empty()
    }

    /// The next MAD to send.
    pub fn poll_send(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`Cm::on_timer`] has something to do.
    pub fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((due, id))) = self.timers.peek() {
            if self.conns.get(&id).and_then(|c| c.deadline) == Some(due) {
                return Some(due);
            }
            self.timers.pop();
        }
        None
    }

    /// Resends, times out and forgets what is due by `now`.
    pub fn on_timer(&mut self, now: u64) {
        while let Some(&Reverse((due, id))) = self.timers.peek() {
            if due > now {
                break;
            }
            self.timers.pop();
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.deadline != Some(due) {
                continue;
            }
            c.deadline = None;
            match c.state {
                State::TimeWait => self.forget(id),
                State::ReqRcvd => {
                    // The application never answered, and the peer has given up by now.
                    self.counters.cm_timeouts += 1;
                    self.forget(id);
                }
                State::Established => {}
                State::ReqSent | State::MraRcvd | State::RepSent | State::DreqSent => {
                    if c.tries_left > 0 {
                        c.tries_left -= 1;
                        let (peer, m, wait) = (c.peer, c.last.expect("a sent message"), c.wait_ns);
                        self.counters.cm_resends += 1;
                        self.send(peer, m);
                        self.arm(id, now + wait);
                    } else if c.state == State::DreqSent {
                        // No DREP: the peer is gone; the connection ends all the same.
                        self.enter_time_wait(now, id);
                        self.events.push_back(CmEvent::Disconnected { id });
                        self.counters.cm_disconnected += 1;
                    } else {
                        let (peer, tid, remote, active) = (c.peer, c.tid, c.remote_id, c.active);
                        let answered = if active { Answered::Req } else { Answered::Rep };
                        self.send_rej(peer, tid, id, remote, answered, rej_reason::TIMEOUT, &[]);
                        self.counters.cm_timeouts += 1;
                        self.forget(id);
                        self.events.push_back(CmEvent::TimedOut { id });
                    }
                }
            }
        }
    }

    /// Takes one MAD that QP1 received from `from`. A MAD that is not a well-formed CM message
    /// is refused (and counted) without an answer.
    pub fn on_mad(&mut self, now: u64, from: Peer, m: &[u8]) -> Result<(), MadRefusal> {
        self.counters.mads_received += 1;
        let refusal = match check_mad(m) {
            Ok(hdr) => {
                self.on_message(now, from, &hdr, &m[mad::HEADER_LEN..]);
                return Ok(());
            }
            Err(r) => r,
        };
        *match refusal {
            MadRefusal::Length => &mut self.counters.mad_bad_length,
            MadRefusal::BaseVersion => &mut self.counters.mad_bad_base_version,
            MadRefusal::Class => &mut self.counters.mad_bad_class,
            MadRefusal::ClassVersion => &mut self.counters.mad_bad_class_version,
            MadRefusal::Method => &mut self.counters.mad_bad_method,
            MadRefusal::Attribute => &mut self.counters.mad_unsupported_attribute,
        } += 1;
        Err(refusal)
    }

    fn on_message(&mut self, now: u64, from: Peer, hdr: &MadRepr, data: &[u8]) {
        // Every parse below is of exactly DATA_LEN bytes, which check_mad ensured.
        match hdr.attribute_id {
            cm_attr::REQ => self.on_req(now, from, hdr.transaction_id, data),
            cm_attr::REP => self.on_rep(from, hdr.transaction_id, data),
            cm_attr::RTU => self.on_rtu(data),
            cm_attr::MRA => self.on_mra(now, data),
            cm_attr::REJ => self.on_rej(data),
            cm_attr::DREQ => self.on_dreq(now, from, hdr.transaction_id, data),
            cm_attr::DREP => self.on_drep(now, data),
            _ => unreachable!("check_mad takes only these"),
        }
    }

    fn on_req(&mut self, now: u64, from: Peer, tid: u64, data: &[u8]) {
        let Ok(req) = ReqRepr::parse(data) else {
            return;
        };
        // A repeated REQ: answer it as the connection stands.
        if let Some(&id) = self.by_remote.get(&(req.local_comm_id, from.ip)) {
            self.counters.cm_duplicates += 1;
            let c = &self.conns[&id];
            match c.state {
                State::ReqRcvd => {
                    // The application is still deciding: tell the peer to wait longer.
                    let mra = MraRepr {
                        local_comm_id: id,
                        remote_comm_id: c.remote_id,
                        message_mraed: Answered::Req,
                        service_timeout: self.cfg.response_timeout,
                        private_data: [0; cm::MRA_PRIVATE_DATA_LEN],
                    };
                    let mut m = [0u8; mad::MAD_LEN];
                    write_mad(&mut m, cm_attr::MRA, c.tid, |d| mra.emit(d));
                    self.send(from, m);
                }
                State::RepSent => {
                    let m = c.last.expect("the REP");
                    self.send(from, m);
                }
                State::TimeWait => {
                    let (tid, remote) = (c.tid, c.remote_id);
                    self.counters.cm_rej_invalid += 1;
                    self.send_rej(
                        from,
                        tid,
                        id,
                        remote,
                        Answered::Req,
                        rej_reason::STALE_CONN,
                        &[],
                    );
                }
                _ => {}
            }
            return;
        }
        let reject = |cm: &mut Cm, reason: u16| {
            cm.send_rej(from, tid, 0, req.local_comm_id, Answered::Req, reason, &[]);
        };
        let Some(port) = rdma_cm::tcp_port(req.service_id).filter(|p| self.listeners.contains(p))
        else {
            self.counters.cm_rej_no_listener += 1;
            return reject(self, rej_reason::INVALID_SERVICE_ID);
        };
        if req.transport_service_type != 0 {
            self.counters.cm_rej_invalid += 1;
            return reject(self, rej_reason::INVALID_TRANSPORT_TYPE);
        }
        if crate::transport::Mtu::from_code(req.path_mtu).is_none() {
            self.counters.cm_rej_invalid += 1;
            return reject(self, rej_reason::INVALID_MTU);
        }
        let cma = rdma_cm::CmaHeader::parse(&req.private_data)
            .ok()
            .filter(|h| h.version == rdma_cm::VERSION)
            .and_then(|h| h.ipv4_addrs().map(|a| (h.src_port, a)));
        let Some((peer_port, (src, dst))) = cma else {
            self.counters.cm_rej_invalid += 1;
            return reject(self, rej_reason::CONSUMER_DEFINED);
        };
        if dst != self.cfg.ip
            || src != from.ip
            || req.primary_path.remote_gid != mapped(self.cfg.ip)
        {
            self.counters.cm_rej_invalid += 1;
            return reject(self, rej_reason::INVALID_GID);
        }
        if self.half_open >= self.cfg.max_half_open || self.conns.len() >= self.cfg.max_connections
        {
            self.counters.cm_rej_no_resources += 1;
            return reject(self, rej_reason::NO_RESOURCES);
        }
        let id = self.fresh_id();
        // The peer waits for our answer this long per try, and tries this often; an
        // application that has not answered by then will find the request gone.
        let give_up =
            Self::wait_ns(req.remote_cm_response_timeout) * (u64::from(req.max_cm_retries) + 2);
        let request = Request {
            id,
            port,
            peer: from,
            peer_port,
            remote_qpn: req.local_qpn,
            initiator_depth: req.initiator_depth,
            responder_resources: req.responder_resources,
            path_mtu: req.path_mtu,
            private_data: app_private_data(&req.private_data[rdma_cm::HEADER_LEN..]),
            ext: ExtRepr::parse_tail(&req.private_data),
        };
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                active: false,
                local_id: id,
                remote_id: req.local_comm_id,
                peer: from,
                tid,
                req,
                params: None,
                last: None,
                deadline: None,
                tries_left: 0,
                wait_ns: 0,
            },
        );
        self.by_remote.insert((req.local_comm_id, from.ip), id);
        self.half_open += 1;
        self.arm(id, now + give_up);
        self.events.push_back(CmEvent::ConnectRequest(request));
    }

    fn on_rep(&mut self, from: Peer, tid: u64, data: &[u8]) {
        let Ok(rep) = RepRepr::parse(data) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&rep.remote_comm_id).filter(|c| c.active) else {
            self.counters.cm_unknown_comm_id += 1;
            // The REJ echoes the REP's transaction ID, as the Linux CM's does.
            self.send_rej(
                from,
                tid,
                0,
                rep.local_comm_id,
                Answered::Rep,
                rej_reason::INVALID_COMM_ID,
                &[],
            );
            return;
        };
        let id = c.local_id;
        match c.state {
            State::ReqSent | State::MraRcvd => {}
            State::Established => {
                // Our RTU was lost: the peer resent its REP.
                self.counters.cm_duplicates += 1;
                if let Some(m) = c.last {
                    let peer = c.peer;
                    self.send(peer, m);
                }
                return;
            }
            _ => {
                self.counters.cm_duplicates += 1;
                return;
            }
        }
        let params = QpParams {
            local_qpn: c.req.local_qpn,
            remote_qpn: rep.local_qpn,
            send_psn: c.req.starting_psn,
            recv_psn: rep.starting_psn,
            path_mtu: c.req.path_mtu,
            // Our READs go to the peer's responder resources; we answer at most as many as
            // the peer will send (its initiator depth).
            initiator_depth: rep.responder_resources.min(c.req.initiator_depth),
            responder_resources: rep.initiator_depth.min(c.req.responder_resources),
            retry_count: c.req.retry_count,
            rnr_retry_count: rep.rnr_retry_count,
            pkey: c.req.pkey,
            peer: c.peer,
            traffic_class: c.req.primary_path.traffic_class,
            hop_limit: c.req.primary_path.hop_limit,
            peer_ext: ExtRepr::parse_tail(&rep.private_data),
        };
        c.remote_id = rep.local_comm_id;
        c.params = Some(params);
        c.state = State::Established;
        c.deadline = None;
        let rtu = IdsRepr {
            local_comm_id: id,
            remote_comm_id: rep.local_comm_id,
            private_data: [0; cm::SHORT_PRIVATE_DATA_LEN],
        };
        let mut m = [0u8; mad::MAD_LEN];
        write_mad(&mut m, cm_attr::RTU, c.tid, |d| rtu.emit(d));
        c.last = Some(m);
        let peer = c.peer;
        self.send(peer, m);
        self.counters.cm_established += 1;
        self.events.push_back(CmEvent::Connected { id, params });
        self.events.push_back(CmEvent::Established {
            id,
            private_data: app_private_data(&rep.private_data),
        });
    }

    /// The Portico extension block of the REQ of passive connection `id` (`None`: no such
    /// connection, an active one, or a REQ without one).
    pub fn request_ext(&self, id: u32) -> Option<ExtRepr> {
        let c = self.conns.get(&id).filter(|c| !c.active)?;
        ExtRepr::parse_tail(&c.req.private_data)
    }

    /// Whether connection `id` is a passive one waiting for its RTU.
    pub fn awaits_rtu(&self, id: u32) -> bool {
        self.conns
            .get(&id)
            .is_some_and(|c| !c.active && c.state == State::RepSent)
    }

    /// The queue pair of connection `id` received a packet from the peer: as the IBTA's
    /// "communication established" has it (the event verbs reports as `IB_EVENT_COMM_EST`), a
    /// passive connection still waiting for its RTU is established as if the RTU had come (the active side only sends on its queue
    /// pair once it has the REP, so the RTU was sent, and lost or overtaken). True when that
    /// established it.
    pub fn traffic(&mut self, id: u32) -> bool {
        if !self.awaits_rtu(id) {
            return false;
        }
        let c = self.conns.get_mut(&id).expect("checked above");
        c.state = State::Established;
        c.deadline = None;
        self.half_open -= 1;
        self.counters.cm_established += 1;
        self.events.push_back(CmEvent::Established {
            id,
            private_data: Vec::new(),
        });
        true
    }

    fn on_rtu(&mut self, data: &[u8]) {
        let Ok(rtu) = IdsRepr::parse(data) else {
            return;
        };
        let Some(c) = self
            .conns
            .get_mut(&rtu.remote_comm_id)
            .filter(|c| !c.active)
        else {
            self.counters.cm_unknown_comm_id += 1;
            return;
        };
        if c.state != State::RepSent || c.remote_id != rtu.local_comm_id {
            self.counters.cm_duplicates += 1;
            return;
        }
        c.state = State::Established;
        c.deadline = None;
        let id = c.local_id;
        self.half_open -= 1;
        self.counters.cm_established += 1;
        self.events.push_back(CmEvent::Established {
            id,
            private_data: rtu.private_data.to_vec(),
        });
    }

    fn on_mra(&mut self, now: u64, data: &[u8]) {
        let Ok(mra) = MraRepr::parse(data) else {
            return;
        };
        let plt = Self::wait_ns(0);
        let Some(c) = self.conns.get_mut(&mra.remote_comm_id) else {
            self.counters.cm_unknown_comm_id += 1;
            return;
        };
        let waits = matches!(
            (c.state, mra.message_mraed),
            (State::ReqSent | State::MraRcvd, Answered::Req) | (State::RepSent, Answered::Rep)
        );
        if !waits {
            self.counters.cm_duplicates += 1;
            return;
        }
        if c.state == State::ReqSent {
            c.state = State::MraRcvd;
        }
        // The answer comes within the peer's service timeout: wait that long, without
        // resending (the peer has the message).
        let wait = time_code_ns(mra.service_timeout) + plt;
        c.wait_ns = c.wait_ns.max(wait);
        let id = c.local_id;
        self.arm(id, now + wait);
    }

    fn on_rej(&mut self, data: &[u8]) {
        let Ok(rej) = RejRepr::parse(data) else {
            return;
        };
        let Some(c) = self.conns.get(&rej.remote_comm_id) else {
            self.counters.cm_unknown_comm_id += 1;
            return;
        };
        if !matches!(
            c.state,
            State::ReqSent | State::MraRcvd | State::RepSent | State::ReqRcvd
        ) {
            self.counters.cm_duplicates += 1;
            return;
        }
        let id = c.local_id;
        self.counters.cm_rejected += 1;
        self.forget(id);
        self.events.push_back(CmEvent::Rejected {
            id,
            reason: rej.reason,
            private_data: rej.private_data.to_vec(),
        });
    }

    fn on_dreq(&mut self, now: u64, from: Peer, tid: u64, data: &[u8]) {
        let Ok(dreq) = DreqRepr::parse(data) else {
            return;
        };
        let drep = |cm: &mut Cm, local: u32, remote: u32| {
            let d = IdsRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: [0; cm::SHORT_PRIVATE_DATA_LEN],
            };
            let mut m = [0u8; mad::MAD_LEN];
            write_mad(&mut m, cm_attr::DREP, tid, |b| d.emit(b));
            cm.send(from, m);
        };
        let Some(c) = self
            .conns
            .get(&dreq.remote_comm_id)
            .filter(|c| c.remote_id == dreq.local_comm_id)
        else {
            // Perhaps ours went away after a DREQ whose DREP was lost: answer all the same.
            self.counters.cm_unknown_comm_id += 1;
            return drep(self, dreq.remote_comm_id, dreq.local_comm_id);
        };
        let id = c.local_id;
        match c.state {
            State::Established | State::DreqSent | State::RepSent => {
                if c.state == State::RepSent {
                    self.half_open -= 1;
                }
                drep(self, id, dreq.local_comm_id);
                self.enter_time_wait(now, id);
                self.counters.cm_disconnected += 1;
                self.events.push_back(CmEvent::Disconnected { id });
            }
            State::TimeWait => {
                self.counters.cm_duplicates += 1;
                drep(self, id, dreq.local_comm_id);
            }
            _ => self.counters.cm_unknown_comm_id += 1,
        }
    }

    fn on_drep(&mut self, now: u64, data: &[u8]) {
        let Ok(drep) = IdsRepr::parse(data) else {
            return;
        };
        let Some(c) = self.conns.get(&drep.remote_comm_id) else {
            self.counters.cm_unknown_comm_id += 1;
            return;
        };
        if c.state != State::DreqSent {
            self.counters.cm_duplicates += 1;
            return;
        }
        let id = c.local_id;
        self.enter_time_wait(now, id);
        self.counters.cm_disconnected += 1;
        self.events.push_back(CmEvent::Disconnected { id });
    }

    fn enter_time_wait(&mut self, now: u64, id: u32) {
        let wait = self.cfg.time_wait_ns;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.last = None;
            self.arm(id, now + wait);
        }
    }

    /// Removes a connection and everything that names it.
    fn forget(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id)
            && !c.active
        {
            self.by_remote.remove(&(c.remote_id, c.peer.ip));
            if matches!(c.state, State::ReqRcvd | State::RepSent) {
                self.half_open -= 1;
            }
        }
    }

    fn arm(&mut self, id: u32, at: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.deadline = Some(at);
            self.timers.push(Reverse((at, id)));
        }
    }

    /// The wait for a peer's answer: its response time `code` and a round trip (twice
    /// [`PACKET_LIFE_TIME`]).
    fn wait_ns(code: u8) -> u64 {
        let code_ns = if code == 0 { 0 } else { time_code_ns(code) };
        code_ns + 2 * time_code_ns(PACKET_LIFE_TIME)
    }

    #[allow(clippy::too_many_arguments)]
    fn send_rej(
        &mut self,
        to: Peer,
        tid: u64,
        local: u32,
        remote: u32,
        answered: Answered,
        reason: u16,
        private: &[u8],
    ) {
        let mut private_data = [0u8; cm::REJ_PRIVATE_DATA_LEN];
        private_data[..private.len()].copy_from_slice(private);
        let rej = RejRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: answered,
            rejected_info_len: 0,
            reason,
            ari: [0; cm::REJ_ARI_LEN],
            private_data,
        };
        let mut m = [0u8; mad::MAD_LEN];
        write_mad(&mut m, cm_attr::REJ, tid, |d| rej.emit(d));
        self.send(to, m);
    }

    fn send(&mut self, to: Peer, mad: [u8; mad::MAD_LEN]) {
        self.counters.mads_sent += 1;
        self.out.push_back(Outgoing { to, mad });
    }
}

/// The packet life time assumed for one Ethernet segment, as a time code: 2^10 · 4.096 µs,
/// about 4 ms each way.
const PACKET_LIFE_TIME: u8 = 10;

/// `::ffff:a.b.c.d`, the GID of an IPv4 address on RoCEv2.
pub fn mapped(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// Writes a CM MAD: the header, then the message through `body`.
fn write_mad(
    m: &mut [u8; mad::MAD_LEN],
    attr: u16,
    tid: u64,
    body: impl FnOnce(&mut [u8]) -> wire::Result<()>,
) {
    MadRepr::cm(attr, tid).emit(&mut mad::Packet::new_unchecked(&mut m[..]));
    body(&mut m[mad::HEADER_LEN..]).expect("a MAD's data holds every CM message");
}

/// The checks of a MAD before its message: length, base version, class, class version,
/// method, attribute.
pub fn check_mad(m: &[u8]) -> Result<MadRepr, MadRefusal> {
    if m.len() != mad::MAD_LEN {
        return Err(MadRefusal::Length);
    }
    let hdr =
        MadRepr::parse(&mad::Packet::new_unchecked(m)).map_err(|_| MadRefusal::BaseVersion)?;
    if hdr.mgmt_class != mad::CLASS_CM {
        return Err(MadRefusal::Class);
    }
    if hdr.class_version != mad::CM_CLASS_VERSION {
        return Err(MadRefusal::ClassVersion);
    }
    if hdr.method != Method::SEND {
        return Err(MadRefusal::Method);
    }
    match hdr.attribute_id {
        cm_attr::REQ
        | cm_attr::MRA
        | cm_attr::REJ
        | cm_attr::REP
        | cm_attr::RTU
        | cm_attr::DREQ
        | cm_attr::DREP => Ok(hdr),
        _ => Err(MadRefusal::Attribute),
    }
}
