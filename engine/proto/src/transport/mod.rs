//! The reliable-connection (RC) transport of the software RDMA NIC.
//!
//! A [`QueuePair`] is two state machines sharing one configuration: the
//! requester (SEND, RDMA WRITE, RDMA READ; PSN assignment, AckReq, in-flight
//! cap, go-back-N, retransmission timer with backoff, RNR wait) and the
//! responder (PSN checking, NAK once per sequence error, duplicate handling,
//! MSN, ACK coalescing, READ response segmentation, receive queue, rkey and
//! bounds checks). Both are pure: they consume parsed [`RoceRepr`]s plus
//! payload slices and produce [`OutPacket`]s (a packet's `PacketFields` plus a reference to
//! payload bytes in the application's registered memory, [`MemoryTable`]); time is the `now` argument in
//! nanoseconds. No I/O, no threads, no clock, no `unsafe`.
//!
//! The dataplane drives a QP with three calls:
//! * per received packet: [`QueuePair::on_packet`];
//! * per transmit opportunity: [`QueuePair::poll_response`] (ACKs, NAKs, READ
//!   responses) and [`QueuePair::poll_request`] (requests, within a [`Budget`])
//!   until `None`, each packet then written with [`QueuePair::emit`] (headers,
//!   payload copied from the application's memory, pad, ICRC);
//! * per timer tick: [`QueuePair::on_timer`] once `now` reaches
//!   [`QueuePair::next_deadline`].
//!
//! `docs/transport.md` describes the state machines in prose.

pub mod cq;
pub mod mr;
pub mod persist;
pub mod psn;
pub mod qp;
pub mod requester;
pub mod responder;
pub mod rto;
pub mod sge;
pub mod tagged;

#[cfg(test)]
mod tests;

use core::net::Ipv4Addr;

use crate::cc::CcConfig;

use wire::bth::DEFAULT_PKEY;
use wire::feth::{Placement, Selectivity};
use wire::{BthRepr, Ecn, EthernetAddress, Opcode, PacketFields, RoceIpv4, RoceRepr};

pub use cq::{StagedCompletions, WcOpcode, WcStatus, WorkCompletion};
pub use mr::{Access, AccessError, Location, MemoryTable, MrKeys, RegisterError, random_u32};
pub use persist::{Persist, PersistJob};
pub use qp::{QpState, QpStats, QueuePair};
pub use sge::{Gather, LocalError, MAX_SGE, SgList, Sge, Spill, TooManySges};
pub use tagged::{Delivery, Landing, Next, NoTags, Pull, TagTarget, deliver_in_two};

/// Path MTU: the largest payload of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mtu {
    M256,
    M512,
    M1024,
    M2048,
    M4096,
}

impl Mtu {
    pub const fn bytes(self) -> u32 {
        match self {
            Mtu::M256 => 256,
            Mtu::M512 => 512,
            Mtu::M1024 => 1024,
            Mtu::M2048 => 2048,
            Mtu::M4096 => 4096,
        }
    }

    /// The IBTA's code of the MTU, as the CM's messages carry it (1: 256 ... 5: 4096).
    pub const fn code(self) -> u8 {
        (self.bytes().trailing_zeros() - 7) as u8
    }

    /// The MTU of an IBTA code; `None` for a code no MTU has (0, 6 and up).
    pub fn from_code(code: u8) -> Option<Mtu> {
        if !(1..=5).contains(&code) {
            return None;
        }
        Mtu::try_from(128u32 << code).ok()
    }

    /// Packets (and PSNs) a message of `len` bytes needs: at least one, so a
    /// zero-length message still travels as an ONLY packet.
    pub const fn packets(self, len: u32) -> u32 {
        let n = len.div_ceil(self.bytes());
        if n == 0 { 1 } else { n }
    }
}

/// A path MTU that IBTA does not define (anything but 256, 512, 1024, 2048 and 4096 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not 256, 512, 1024, 2048 or 4096")]
pub struct BadMtu(pub u32);

impl TryFrom<u32> for Mtu {
    type Error = BadMtu;

    /// The MTU of `bytes`, the one place a number becomes an `Mtu` (config files and flags).
    fn try_from(bytes: u32) -> Result<Mtu, BadMtu> {
        Ok(match bytes {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return Err(BadMtu(bytes)),
        })
    }
}

/// Everything a QP needs to know about itself and its peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpConfig {
    pub local_qpn: u32,
    pub remote_qpn: u32,
    pub local_mac: EthernetAddress,
    pub remote_mac: EthernetAddress,
    pub local_ip: Ipv4Addr,
    pub remote_ip: Ipv4Addr,
    /// UDP source port (ECMP entropy), conventionally 0xC000..=0xFFFF.
    pub udp_src_port: u16,
    /// The partition key both ends use: sent in every BTH, and a received packet whose P_Key
    /// does not match it (see [`pkey_matches`]) is dropped.
    pub pkey: u16,
    pub dscp: u8,
    pub ecn: Ecn,
    pub ttl: u8,
    /// First PSN the requester sends.
    pub send_psn: u32,
    /// First PSN the responder expects (the peer's `send_psn`).
    pub recv_psn: u32,
    pub pmtu: Mtu,
    /// Send queue depth (posted, not yet completed work requests).
    pub max_send_wr: usize,
    /// Receive queue depth.
    pub max_recv_wr: usize,
    /// Cap on unacknowledged PSNs (packets) the requester keeps in flight.
    pub max_in_flight: u32,
    /// RDMA READs outstanding at once; also the responder's READ queue depth.
    pub max_rd_atomic: u32,
    /// The requester sets AckReq at least every this many packets.
    pub ack_req_every: u32,
    /// The responder ACKs after this many unacknowledged packets even
    /// without AckReq.
    pub ack_coalesce: u32,
    /// The shortest retransmission timeout, and the one used until the first round trip has
    /// been measured. The timeout adapts to the measured round trip time (`SRTT + 4 RTTVAR`,
    /// see [`rto`]) but never goes below this.
    pub timeout_ns: u64,
    /// The longest timeout the round trip estimate may ask for (before backoff); set it to
    /// `timeout_ns` for a fixed timer.
    pub max_timeout_ns: u64,
    /// The timeout doubles per consecutive expiry, at most this many times.
    pub max_backoff_shift: u32,
    /// Consecutive timeouts without progress tolerated before RetryExceeded.
    pub retry_limit: u32,
    /// Consecutive RNR NAKs tolerated before RnrRetryExceeded.
    pub rnr_retry_limit: u32,
    /// RNR timer code this responder advertises in its RNR NAKs.
    pub rnr_timer_code: u8,
    /// Both ends speak Portico's durable-write extension (negotiated per queue pair, as the
    /// connection manager would): the requester may post [`WrKind::DurableWrite`], and the
    /// responder takes the durable opcodes (0xE0, 0xE1) and sends durable ACKs (0xE2). Off, a
    /// durable opcode is an invalid request, as it is to any standard peer.
    pub durable_writes: bool,
    /// How long the requester waits for a durable ACK before it probes (re-sends the last
    /// packet of the oldest write still waiting), doubling per probe as the retransmission
    /// timer does. Longer than `timeout_ns`: the responder's flush (an `msync`) is in it.
    pub durable_timeout_ns: u64,
    /// Both ends speak Portico's tagged messaging (negotiated per queue pair): every SEND
    /// starts with a tag header (`docs/wire.md` §16) and is matched by the target's
    /// list-processing engine instead of consuming a posted receive. Off, SENDs are standard.
    pub tagged: bool,
    /// This end's rank, sent as the initiator in the tag header of its tagged sends.
    pub tag_rank: u32,
    /// Tagged sends longer than this go by rendezvous (envelope and first chunk, the target
    /// READs the rest); up to it, eagerly.
    pub rndv_threshold: u32,
    /// Congestion control, negotiated per queue pair (both ends the same mode): `none`,
    /// `dcqcn` (CNPs) or `ack` (the congestion state in ACKs, Portico's extension: a standard
    /// peer is only ever given `none` or `dcqcn`).
    pub cc: CcConfig,
    /// The traffic-shaper class this queue pair's requests are arbitrated in, when its engine
    /// has a shaper (`docs/shaper.md`); local only (the DSCP is what the wire carries).
    pub traffic_class: u8,
    /// A READ longer than this many packets of response goes as several READ requests
    /// (sub-requests) of at most this many, each one its own request to the responder and
    /// its own charge to a traffic shaper's absorb bucket (seed 000's GET split); the work
    /// request completes when the last has been answered. 0: one request for the whole
    /// READ (what a standard requester sends). A node with a shaper sets it from
    /// `ShaperConfig::read_split_packets` where it is 0.
    pub read_split_packets: u32,
}

impl QpConfig {
    /// A configuration with conservative defaults: MTU 1024, 128-deep queues,
    /// 64 packets in flight, AckReq every 16 packets, a retransmission timeout that adapts to
    /// the round trip between 250 µs and 100 ms, 7 retries.
    pub fn new(local_qpn: u32, remote_qpn: u32) -> QpConfig {
        QpConfig {
            local_qpn,
            remote_qpn,
            local_mac: EthernetAddress([0x02, 0, 0, 0, 0, 1]),
            remote_mac: EthernetAddress([0x02, 0, 0, 0, 0, 2]),
            local_ip: Ipv4Addr::new(10, 0, 0, 1),
            remote_ip: Ipv4Addr::new(10, 0, 0, 2),
            udp_src_port: 0xc000,
            pkey: DEFAULT_PKEY,
            dscp: 26,
            ecn: Ecn::Ect0,
            ttl: 64,
            send_psn: 0,
            recv_psn: 0,
            pmtu: Mtu::M1024,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_in_flight: 64,
            max_rd_atomic: 16,
            ack_req_every: 16,
            ack_coalesce: 32,
            timeout_ns: 250_000,
            max_timeout_ns: 100_000_000,
            max_backoff_shift: 6,
            retry_limit: 7,
            rnr_retry_limit: 7,
            rnr_timer_code: 1,
            durable_writes: false,
            durable_timeout_ns: 10_000_000,
            tagged: false,
            tag_rank: 0,
            rndv_threshold: 16 * 1024,
            cc: CcConfig::default(),
            traffic_class: 0,
            read_split_packets: 0,
        }
    }

    /// The configuration of the peer QP: addresses, QPNs and PSNs swapped.
    pub fn mirrored(&self) -> QpConfig {
        QpConfig {
            local_qpn: self.remote_qpn,
            remote_qpn: self.local_qpn,
            local_mac: self.remote_mac,
            remote_mac: self.local_mac,
            local_ip: self.remote_ip,
            remote_ip: self.local_ip,
            send_psn: self.recv_psn,
            recv_psn: self.send_psn,
            ..self.clone()
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str| Err(ConfigError { field });
        if self.local_qpn > psn::PSN_MASK || self.remote_qpn > psn::PSN_MASK {
            return bad("qpn");
        }
        if self.send_psn > psn::PSN_MASK || self.recv_psn > psn::PSN_MASK {
            return bad("psn");
        }
        if self.max_send_wr == 0 || self.max_recv_wr == 0 {
            return bad("queue depth");
        }
        if self.max_in_flight == 0 || self.max_in_flight >= psn::PSN_HALF {
            return bad("max_in_flight");
        }
        if self.max_rd_atomic == 0 {
            return bad("max_rd_atomic");
        }
        if self.ack_req_every == 0 {
            return bad("ack_req_every");
        }
        if self.ack_coalesce == 0 {
            return bad("ack_coalesce");
        }
        if self.timeout_ns == 0 || self.durable_timeout_ns == 0 || self.max_backoff_shift > 20 {
            return bad("timeout");
        }
        if self.max_timeout_ns < self.timeout_ns {
            return bad("max_timeout");
        }
        if self.rnr_timer_code > 31 || self.dscp > 0x3f {
            return bad("rnr_timer_code/dscp");
        }
        if self.pkey & 0x7fff == 0 {
            return bad("pkey");
        }
        self.cc.validate().map_err(|field| ConfigError { field })?;
        Ok(())
    }

    /// Headers of one packet to the peer; the caller fills the extension
    /// headers. Pad count is derived by `wire` on emit. The engine's own packets copy one of
    /// these, made once per queue pair (its header template's flow), instead of calling this.
    pub fn header(&self, opcode: Opcode, psn: u32, ack_req: bool) -> RoceRepr {
        RoceRepr {
            src_mac: self.local_mac,
            dst_mac: self.remote_mac,
            ip: RoceIpv4 {
                src_addr: self.local_ip,
                dst_addr: self.remote_ip,
                dscp: self.dscp,
                ecn: self.ecn,
                ident: 0,
                dont_frag: true,
                ttl: self.ttl,
            },
            src_port: self.udp_src_port,
            bth: BthRepr {
                opcode,
                solicited: false,
                migreq: false,
                pad_count: 0,
                pkey: self.pkey,
                fecn: false,
                becn: false,
                dest_qp: self.remote_qpn,
                ack_req,
                psn,
            },
            feth: None,
            reth: None,
            aeth: None,
            immdt: None,
            ceth: None,
        }
    }
}

/// Whether a packet's P_Key `received` is accepted by a queue pair whose P_Key is `own`
/// (IBTA 10.9.3): the 15-bit keys must be equal and not the invalid key 0, and at least one
/// of the two must be a full member (bit 15 set); two limited members do not talk.
///
/// The commonest case first: a key equal to our own is accepted exactly when our own is a
/// full member's valid key, above 0x8000 (callgrind: a batched 64 B WRITE 1 617.4 -> 1 614.3,
/// a lone one 3 498 -> 3 492).
#[inline]
pub const fn pkey_matches(received: u16, own: u16) -> bool {
    if received == own {
        return own > 0x8000;
    }
    let key = received & 0x7fff;
    key != 0 && key == own & 0x7fff && (received | own) & 0x8000 != 0
}

/// A first PSN drawn from the operating system's random generator (24 bits), as verbs
/// applications choose `sq_psn`: a packet that arrives out of the blue does not land on the
/// expected PSN by knowing the convention of starting at 0.
pub fn random_psn() -> u32 {
    mr::random_u32() & psn::PSN_MASK
}

/// Why a queue pair refused a packet before its state machines saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inadmissible {
    /// The P_Key does not match the queue pair's, or is the invalid key.
    PKey,
    /// The source IP address is not the connected peer's.
    Source,
}

/// A configuration field out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid QP configuration: {field}")]
pub struct ConfigError {
    pub field: &'static str,
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrKind {
    Send {
        imm: Option<u32>,
    },
    Write {
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    /// A WRITE the responder makes durable (Portico's extension, on queue pairs with
    /// [`QpConfig::durable_writes`]): it completes when the durable ACK arrives, and with
    /// `placed` it also completes once before that, as [`WcOpcode::DurablePlaced`], when the
    /// receipt ACK arrives.
    DurableWrite {
        remote_addr: u64,
        rkey: u32,
        placed: bool,
    },
    /// IBTA FLUSH: make earlier WRITEs to the range (or the whole region) visible and/or
    /// persistent. No local buffer; one PSN; answered by an empty READ RESPONSE ONLY.
    Flush {
        remote_addr: u64,
        rkey: u32,
        len: u32,
        placement: Placement,
        selectivity: Selectivity,
    },
    /// IBTA ATOMIC WRITE: an 8-byte store at an 8-byte aligned remote address; the local
    /// buffer holds exactly the 8 bytes.
    AtomicWrite {
        remote_addr: u64,
        rkey: u32,
    },
    /// A tagged send (queue pairs with [`QpConfig::tagged`]): matched at the target against
    /// `endpoint`'s lists by `match_bits`. Eager up to [`QpConfig::rndv_threshold`] bytes;
    /// longer, by rendezvous: the local buffer (one piece, in a region with REMOTE_READ)
    /// must stay as it is until the request completes, which is when the target says it has
    /// taken the message.
    TaggedSend {
        endpoint: u16,
        match_bits: u64,
        hdr_data: u64,
    },
    /// Internal (the engine posts it, never the host): the READ of the rest of a rendezvous
    /// message into the buffer it matched.
    TagPull {
        remote_addr: u64,
        rkey: u32,
        token: u64,
    },
    /// Internal: the done message of a rendezvous (`cookie`: the sender's).
    TagDone {
        cookie: u32,
        length: u32,
    },
}

impl WrKind {
    /// The completion opcode of a request of this kind.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrKind::Send { .. } => WcOpcode::Send,
            WrKind::Write { .. } => WcOpcode::RdmaWrite,
            WrKind::Read { .. } => WcOpcode::RdmaRead,
            WrKind::DurableWrite { .. } => WcOpcode::DurableWrite,
            WrKind::Flush { .. } => WcOpcode::Flush,
            WrKind::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            WrKind::TaggedSend { .. } => WcOpcode::TaggedSend,
            WrKind::TagPull { .. } => WcOpcode::RdmaRead,
            WrKind::TagDone { .. } => WcOpcode::Send,
        }
    }

    /// Completions a request of this kind produces: two for a durable WRITE that reports
    /// placement too, one for everything else.
    pub fn completions(&self) -> usize {
        match self {
            WrKind::DurableWrite { placed: true, .. } => 2,
            _ => 1,
        }
    }
}

/// Why the requester or the responder did not take a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No room: the caller keeps the request and offers it again later.
    Full,
    /// The local buffer failed its checks: the request completes in error.
    Local(LocalError),
}

/// A send work request: what to do, and the local buffer it reads from (SEND, WRITE) or
/// places into (READ), as a scatter/gather list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkRequest {
    pub wr_id: u64,
    pub kind: WrKind,
    pub sgl: SgList,
}

impl WorkRequest {
    /// A SEND (with immediate when `imm` is given) of the bytes `sgl` names.
    pub fn send(wr_id: u64, sgl: SgList, imm: Option<u32>) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::Send { imm },
            sgl,
        }
    }

    /// An RDMA WRITE of the bytes `sgl` names to `remote_addr` under `rkey`.
    pub fn write(
        wr_id: u64,
        sgl: SgList,
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
    ) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::Write {
                remote_addr,
                rkey,
                imm,
            },
            sgl,
        }
    }

    /// An RDMA READ of `sgl.total_len()` bytes at `remote_addr` under `rkey`, landing in `sgl`.
    pub fn read(wr_id: u64, sgl: SgList, remote_addr: u64, rkey: u32) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::Read { remote_addr, rkey },
            sgl,
        }
    }

    /// A durable WRITE (Portico's extension) of the bytes `sgl` names; `placed` asks for a
    /// first completion on receipt as well.
    pub fn durable_write(
        wr_id: u64,
        sgl: SgList,
        remote_addr: u64,
        rkey: u32,
        placed: bool,
    ) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::DurableWrite {
                remote_addr,
                rkey,
                placed,
            },
            sgl,
        }
    }

    /// An IBTA FLUSH of `len` bytes at `remote_addr` (or of the whole region of `rkey` with
    /// [`Selectivity::MemoryRegion`]).
    pub fn flush(
        wr_id: u64,
        remote_addr: u64,
        rkey: u32,
        len: u32,
        placement: Placement,
        selectivity: Selectivity,
    ) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::Flush {
                remote_addr,
                rkey,
                len,
                placement,
                selectivity,
            },
            sgl: SgList::new(),
        }
    }

    /// A tagged send of the bytes `sgl` names, to `endpoint` with `match_bits` and
    /// `hdr_data` (queue pairs with [`QpConfig::tagged`]).
    pub fn tagged_send(
        wr_id: u64,
        sgl: SgList,
        endpoint: u16,
        match_bits: u64,
        hdr_data: u64,
    ) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::TaggedSend {
                endpoint,
                match_bits,
                hdr_data,
            },
            sgl,
        }
    }

    /// An IBTA ATOMIC WRITE of the 8 bytes `sgl` names to `remote_addr`.
    pub fn atomic_write(wr_id: u64, sgl: SgList, remote_addr: u64, rkey: u32) -> WorkRequest {
        WorkRequest {
            wr_id,
            kind: WrKind::AtomicWrite { remote_addr, rkey },
            sgl,
        }
    }

    /// The completion opcode this request ends with.
    pub fn wc_opcode(&self) -> WcOpcode {
        self.kind.wc_opcode()
    }
}

/// A receive work request: the local buffer an incoming SEND scatters into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvRequest {
    pub wr_id: u64,
    pub sgl: SgList,
}

impl RecvRequest {
    pub fn new(wr_id: u64, sgl: SgList) -> RecvRequest {
        RecvRequest { wr_id, sgl }
    }
}

/// Why a post was refused (nothing was queued and no completion will come). A bad local buffer
/// is not refused here: as in verbs, it completes with a local protection error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    #[error("send queue full")]
    SendQueueFull,
    #[error("receive queue full")]
    RecvQueueFull,
}

/// Payload bytes of an outgoing packet, still in the application's memory. The dataplane
/// copies them straight from there into the mbuf ([`QueuePair::emit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadRef {
    /// A contiguous range of one region (READ responses).
    Region { at: Location, len: u32 },
    /// Message bytes `offset..offset + len` of the send work request at position `wqe` of the
    /// send queue. Valid until the next call that changes the queue pair.
    SendQueue { wqe: u32, offset: u32, len: u32 },
}

impl PayloadRef {
    pub fn len(&self) -> usize {
        match *self {
            PayloadRef::Region { len, .. } | PayloadRef::SendQueue { len, .. } => len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One packet to transmit: its headers' [`PacketFields`] (the flow's fields are the queue
/// pair's template's, [`wire::template::HeaderTemplate`]) and where its payload lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutPacket {
    pub fields: PacketFields,
    pub payload: Option<PayloadRef>,
}

impl OutPacket {
    /// A placeholder for a slot [`QueuePair::poll_request_into`] writes: an empty SEND ONLY
    /// of PSN 0, never handed out as it is.
    pub const UNSET: OutPacket = OutPacket {
        fields: PacketFields::new(wire::bth::Opcode::SendOnly, 0, false),
        payload: None,
    };

    pub fn payload_len(&self) -> usize {
        self.payload.map_or(0, |p| p.len())
    }

    /// Length of the whole frame.
    pub fn frame_len(&self) -> usize {
        self.fields.frame_len(self.payload_len())
    }
}

/// Budget of one pull of requests ([`QueuePair::poll_request`]): a packet is handed out only
/// when both its count and its frame bytes fit, and whatever is handed out is charged here.
/// The last packet offered that did not fit is remembered: a budget of no packets
/// ([`Budget::peek`]), which no packet fits, asks what would go next without sending it (the
/// traffic shaper's view of a queue pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub packets: u32,
    pub bytes: u64,
    /// The last packet offered that did not fit: (frame bytes out, frame bytes its
    /// responses bring back).
    pub offered: Option<(u32, u32)>,
}

impl Budget {
    /// As many packets as `packets`, bytes unlimited.
    pub const fn packets(packets: u32) -> Budget {
        Budget {
            packets,
            bytes: u64::MAX,
            offered: None,
        }
    }

    /// A budget nothing fits, to learn the next packet from [`Budget::offered`].
    pub const fn peek() -> Budget {
        Budget::packets(0)
    }

    /// Whether a packet of `frame_len` bytes fits.
    pub fn fits(&self, frame_len: usize) -> bool {
        self.packets > 0 && self.bytes >= frame_len as u64
    }

    /// [`Budget::fits`], remembering a packet that does not fit (and the response frame
    /// bytes `back` it will pull in) as the one offered. One that fits is not written down:
    /// only a peek reads what was offered, and a peek fits nothing (callgrind: a batched 64 B
    /// WRITE 1 607.3 -> 1 603.4, a lone one 3 485 -> 3 483).
    #[inline]
    pub fn offer(&mut self, frame_len: usize, back: u32) -> bool {
        let fits = self.fits(frame_len);
        if !fits {
            self.offered = Some((frame_len as u32, back));
        }
        fits
    }

    pub fn charge(&mut self, frame_len: usize) {
        self.packets -= 1;
        self.bytes -= frame_len as u64;
    }
}

#[cfg(test)]
mod pkey_tests {
    use super::pkey_matches;

    /// IBTA 10.9.3's rule as it reads, for the fast path's answer to be checked against.
    fn rule(received: u16, own: u16) -> bool {
        let key = received & 0x7fff;
        key != 0 && key == own & 0x7fff && (received & 0x8000 != 0 || own & 0x8000 != 0)
    }

    /// Every received key against own keys of every kind (full and limited members, the
    /// invalid keys, the default), and the cases by name.
    #[test]
    fn a_pkey_matches_as_ibta_says_for_every_received_key() {
        for own in [
            0xffff, 0x7fff, 0x8000, 0x0000, 0x8001, 0x0001, 0x9234, 0x1234, 0xc0de,
        ] {
            for received in 0..=u16::MAX {
                assert_eq!(
                    pkey_matches(received, own),
                    rule(received, own),
                    "received {received:#06x}, own {own:#06x}"
                );
            }
        }
        assert!(
            pkey_matches(0xffff, 0xffff),
            "the default key, full members both"
        );
        assert!(
            pkey_matches(0x1234, 0x9234),
            "a limited member to a full one"
        );
        assert!(!pkey_matches(0x1234, 0x1234), "two limited members");
        assert!(!pkey_matches(0x8000, 0x8000), "the invalid key");
    }
}
