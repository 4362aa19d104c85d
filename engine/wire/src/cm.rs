//! The communication manager's messages (IBTA chapter 12), carried in the data of a CM MAD
//! ([`crate::mad`], class [`crate::mad::CLASS_CM`], one attribute per message).
//!
//! Offsets here count from the start of the MAD's data (byte 24 of the MAD), as IBTA's tables
//! do: the ConnectRequest (REQ, table 106), whose fields set up the new queue pair, and the
//! messages that answer it and end a connection (MRA, REJ, REP, RTU, DREQ, DREP). Not here:
//! LAP/APR (alternate paths) and SIDR.
//! Sub-byte fields sit most significant bit first, as everywhere in the IBTA headers.

use super::mad::DATA_LEN;
use super::{Layer, Result, be, ensure_len};

/// One path of a REQ (primary or alternate), 44 bytes. On RoCEv2 the GIDs are the ports'
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`), the LIDs mean nothing (the unit test's REQ
/// carries the permissive LID 0xffff), and the traffic class and hop limit are the IPv4
/// header's DSCP/ECN byte and TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits (IBTA's static rate encoding).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// Service level, 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs · 2^n.
    pub local_ack_timeout: u8,
}

mod path {
    use crate::Field;

    pub const LEN: usize = 44;
    pub const LOCAL_LID: Field = 0..2;
    pub const REMOTE_LID: Field = 2..4;
    pub const LOCAL_GID: Field = 4..20;
    pub const REMOTE_GID: Field = 20..36;
    /// Flow label (20 bits), reserved (6), packet rate (6).
    pub const FLOW_RATE: Field = 36..40;
    pub const TRAFFIC_CLASS: usize = 40;
    pub const HOP_LIMIT: usize = 41;
    /// SL (4 bits), subnet local (1), reserved (3).
    pub const SL_SUBNET: usize = 42;
    /// Local ACK timeout (5 bits), reserved (3).
    pub const ACK_TIMEOUT: usize = 43;
}

impl PathRepr {
    fn parse(b: &[u8]) -> PathRepr {
        let flow_rate = be::read_u32(&b[path::FLOW_RATE]);
        let mut local_gid = [0u8; 16];
        local_gid.copy_from_slice(&b[path::LOCAL_GID]);
        let mut remote_gid = [0u8; 16];
        remote_gid.copy_from_slice(&b[path::REMOTE_GID]);
        PathRepr {
            local_lid: be::read_u16(&b[path::LOCAL_LID]),
            remote_lid: be::read_u16(&b[path::REMOTE_LID]),
            local_gid,
            remote_gid,
            flow_label: flow_rate >> 12,
            packet_rate: (flow_rate & 0x3f) as u8,
            traffic_class: b[path::TRAFFIC_CLASS],
            hop_limit: b[path::HOP_LIMIT],
            sl: b[path::SL_SUBNET] >> 4,
            subnet_local: b[path::SL_SUBNET] & 0x08 != 0,
            local_ack_timeout: b[path::ACK_TIMEOUT] >> 3,
        }
    }

    /// Writes the path; fields wider than their bits are cut to them, reserved bits are 0.
    fn emit(&self, b: &mut [u8]) {
        be::write_u16(&mut b[path::LOCAL_LID], self.local_lid);
        be::write_u16(&mut b[path::REMOTE_LID], self.remote_lid);
        b[path::LOCAL_GID].copy_from_slice(&self.local_gid);
        b[path::REMOTE_GID].copy_from_slice(&self.remote_gid);
        let flow_rate = ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f);
        be::write_u32(&mut b[path::FLOW_RATE], flow_rate);
        b[path::TRAFFIC_CLASS] = self.traffic_class;
        b[path::HOP_LIMIT] = self.hop_limit;
        b[path::SL_SUBNET] = ((self.sl & 0x0f) << 4) | (u8::from(self.subnet_local) << 3);
        b[path::ACK_TIMEOUT] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

mod req {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const SERVICE_ID: Field = 8..16;
    pub const LOCAL_CA_GUID: Field = 16..24;
    pub const LOCAL_QKEY: Field = 28..32;
    pub const LOCAL_QPN: Field = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: Field = 36..39;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: Field = 40..43;
    /// Remote CM response timeout (5 bits), transport service type (2), end-to-end flow
    /// control (1).
    pub const TIMEOUT_TST_EEFC: usize = 43;
    pub const STARTING_PSN: Field = 44..47;
    /// Local CM response timeout (5 bits), retry count (3).
    pub const TIMEOUT_RETRY: usize = 47;
    pub const PKEY: Field = 48..50;
    /// Path MTU (4 bits), RDC exists (1), RNR retry count (3).
    pub const MTU_RDC_RNR: usize = 50;
    /// Max CM retries (4 bits), SRQ (1), extended transport type (3).
    pub const RETRIES_SRQ_XT: usize = 51;
    pub const PRIMARY_PATH: usize = 52;
    pub const ALTERNATE_PATH: usize = 96;
    pub const PRIVATE_DATA: Field = 140..232;
}

/// Bytes of private data a REQ carries (rdma_cm puts its own header in the first 36).
pub const REQ_PRIVATE_DATA_LEN: usize = req::PRIVATE_DATA.end - req::PRIVATE_DATA.start;

/// A ConnectRequest, every field of IBTA's table 106. Parsing cannot fail once the data is
/// whole: every bit pattern is a value, and judging them (a service type other than RC, an MTU
/// code out of range) is the CM's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// The RDMA READ and atomic requests the sender will take at once (its responder side).
    pub responder_resources: u8,
    /// 24 bits.
    pub local_eecn: u32,
    /// The RDMA READ and atomic requests the sender will have outstanding at once.
    pub initiator_depth: u8,
    /// 24 bits.
    pub remote_eecn: u32,
    /// 5 bits: how long the receiver may take to answer, 4.096 µs · 2^n.
    pub remote_cm_response_timeout: u8,
    /// 2 bits: 0 RC, 1 UC, 2 RD.
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits: the first PSN the sender will send.
    pub starting_psn: u32,
    /// 5 bits: how long the sender takes to answer.
    pub local_cm_response_timeout: u8,
    /// 3 bits: transport retries.
    pub retry_count: u8,
    pub pkey: u16,
    /// 4 bits: 1 = 256 bytes ... 5 = 4096.
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits: RNR NAK retries (7: for ever).
    pub rnr_retry_count: u8,
    /// 4 bits: how often the CM sends a message again before it gives up.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits.
    pub extended_transport_type: u8,
    pub primary_path: PathRepr,
    /// All zero when the REQ proposes no alternate path.
    pub alternate_path: PathRepr,
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Parses the REQ in a CM MAD's data (at least [`DATA_LEN`] bytes).
    pub fn parse(data: &[u8]) -> Result<ReqRepr> {
        ensure_len(Layer::Mad, DATA_LEN, data.len())?;
        let b = data;
        let mut private_data = [0u8; REQ_PRIVATE_DATA_LEN];
        private_data.copy_from_slice(&b[req::PRIVATE_DATA]);
        Ok(ReqRepr {
            local_comm_id: be::read_u32(&b[req::LOCAL_COMM_ID]),
            service_id: be::read_u64(&b[req::SERVICE_ID]),
            local_ca_guid: be::read_u64(&b[req::LOCAL_CA_GUID]),
            local_qkey: be::read_u32(&b[req::LOCAL_QKEY]),
            local_qpn: be::read_u24(&b[req::LOCAL_QPN]),
            responder_resources: b[req::RESPONDER_RESOURCES],
            local_eecn: be::read_u24(&b[req::LOCAL_EECN]),
            initiator_depth: b[req::INITIATOR_DEPTH],
            remote_eecn: be::read_u24(&b[req::REMOTE_EECN]),
            remote_cm_response_timeout: b[req::TIMEOUT_TST_EEFC] >> 3,
            transport_service_type: (b[req::TIMEOUT_TST_EEFC] >> 1) & 0x3,
            end_to_end_flow_control: b[req::TIMEOUT_TST_EEFC] & 1 != 0,
            starting_psn: be::read_u24(&b[req::STARTING_PSN]),
            local_cm_response_timeout: b[req::TIMEOUT_RETRY] >> 3,
            retry_count: b[req::TIMEOUT_RETRY] & 0x7,
            pkey: be::read_u16(&b[req::PKEY]),
            path_mtu: b[req::MTU_RDC_RNR] >> 4,
            rdc_exists: b[req::MTU_RDC_RNR] & 0x08 != 0,
            rnr_retry_count: b[req::MTU_RDC_RNR] & 0x7,
            max_cm_retries: b[req::RETRIES_SRQ_XT] >> 4,
            srq: b[req::RETRIES_SRQ_XT] & 0x08 != 0,
            extended_transport_type: b[req::RETRIES_SRQ_XT] & 0x7,
            primary_path: PathRepr::parse(&b[req::PRIMARY_PATH..req::PRIMARY_PATH + path::LEN]),
            alternate_path: PathRepr::parse(
                &b[req::ALTERNATE_PATH..req::ALTERNATE_PATH + path::LEN],
            ),
            private_data,
        })
    }

    /// The MAD's data.
    pub const fn buffer_len(&self) -> usize {
        DATA_LEN
    }

    /// Writes the REQ into a CM MAD's data (at least [`DATA_LEN`] bytes): every field, cut to
    /// its bits; reserved bits and bytes 0.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        ensure_len(Layer::Buffer, DATA_LEN, data.len())?;
        let b = &mut data[..DATA_LEN];
        b[..req::PRIMARY_PATH].fill(0);
        be::write_u32(&mut b[req::LOCAL_COMM_ID], self.local_comm_id);
        be::write_u64(&mut b[req::SERVICE_ID], self.service_id);
        be::write_u64(&mut b[req::LOCAL_CA_GUID], self.local_ca_guid);
        be::write_u32(&mut b[req::LOCAL_QKEY], self.local_qkey);
        be::write_u24(&mut b[req::LOCAL_QPN], self.local_qpn);
        b[req::RESPONDER_RESOURCES] = self.responder_resources;
        be::write_u24(&mut b[req::LOCAL_EECN], self.local_eecn);
        b[req::INITIATOR_DEPTH] = self.initiator_depth;
        be::write_u24(&mut b[req::REMOTE_EECN], self.remote_eecn);
        b[req::TIMEOUT_TST_EEFC] = ((self.remote_cm_response_timeout & 0x1f) << 3)
            | ((self.transport_service_type & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        be::write_u24(&mut b[req::STARTING_PSN], self.starting_psn);
        b[req::TIMEOUT_RETRY] =
            ((self.local_cm_response_timeout & 0x1f) << 3) | (self.retry_count & 0x7);
        be::write_u16(&mut b[req::PKEY], self.pkey);
        b[req::MTU_RDC_RNR] = ((self.path_mtu & 0x0f) << 4)
            | (u8::from(self.rdc_exists) << 3)
            | (self.rnr_retry_count & 0x7);
        b[req::RETRIES_SRQ_XT] = ((self.max_cm_retries & 0x0f) << 4)
            | (u8::from(self.srq) << 3)
            | (self.extended_transport_type & 0x7);
        self.primary_path
            .emit(&mut b[req::PRIMARY_PATH..req::PRIMARY_PATH + path::LEN]);
        self.alternate_path
            .emit(&mut b[req::ALTERNATE_PATH..req::ALTERNATE_PATH + path::LEN]);
        b[req::PRIVATE_DATA].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// Which message an MRA or a REJ answers (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answered {
    Req,
    Rep,
    /// A LAP, or (in a REJ) a message the sender could not tell.
    Other,
    /// The reserved code 3.
    Reserved,
}

impl Answered {
    fn from_bits(v: u8) -> Answered {
        match v & 0x3 {
            0 => Answered::Req,
            1 => Answered::Rep,
            2 => Answered::Other,
            _ => Answered::Reserved,
        }
    }

    fn bits(self) -> u8 {
        match self {
            Answered::Req => 0,
            Answered::Rep => 1,
            Answered::Other => 2,
            Answered::Reserved => 3,
        }
    }
}

/// The reasons a REJ gives (IBTA table 109; the Linux CM's `ib_cm_rej_reason`), those the CM
/// sends or must tell apart; any other value is kept as it came.
pub mod rej_reason {
    pub const NO_QP: u16 = 1;
    pub const NO_RESOURCES: u16 = 3;
    pub const TIMEOUT: u16 = 4;
    pub const UNSUPPORTED: u16 = 5;
    pub const INVALID_COMM_ID: u16 = 6;
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    pub const STALE_CONN: u16 = 10;
    pub const INVALID_GID: u16 = 12;
    pub const INVALID_MTU: u16 = 26;
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    pub const CONSUMER_DEFINED: u16 = 28;
    pub const INVALID_RNR_RETRY: u16 = 29;
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    pub const INVALID_CLASS_VERSION: u16 = 31;

    /// What `reason` means, for messages (IBTA table 109's names, shortened).
    pub const fn name(reason: u16) -> &'static str {
        match reason {
            NO_QP => "no QP available",
            NO_RESOURCES => "no resources",
            TIMEOUT => "timeout",
            UNSUPPORTED => "unsupported request",
            INVALID_COMM_ID => "invalid communication ID",
            INVALID_COMM_INSTANCE => "invalid communication instance",
            INVALID_SERVICE_ID => "invalid service ID: nobody listens on that port",
            INVALID_TRANSPORT_TYPE => "invalid transport type",
            STALE_CONN => "stale connection",
            INVALID_GID => "invalid GID",
            INVALID_MTU => "invalid MTU",
            INSUFFICIENT_RESP_RESOURCES => "insufficient responder resources",
            CONSUMER_DEFINED => "rejected by the application",
            INVALID_RNR_RETRY => "invalid RNR retry count",
            DUPLICATE_LOCAL_COMM_ID => "duplicate local communication ID",
            INVALID_CLASS_VERSION => "invalid class version",
            _ => "other",
        }
    }
}

/// Copies `b[range]` into an array of its length.
fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Bytes of private data each message carries.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of additional rejection information a REJ carries.
pub const REJ_ARI_LEN: usize = 72;
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// RTU and DREP.
pub const SHORT_PRIVATE_DATA_LEN: usize = 224;
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;

/// A ConnectReply (REP, IBTA table 110). The three bytes of the vendor ID (15, 19, 23) are
/// read as reserved and sent as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    pub local_comm_id: u32,
    /// The REQ's local communication ID.
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl RepRepr {
    pub fn parse(data: &[u8]) -> Result<RepRepr> {
        ensure_len(Layer::Mad, DATA_LEN, data.len())?;
        let b = data;
        Ok(RepRepr {
            local_comm_id: be::read_u32(&b[0..4]),
            remote_comm_id: be::read_u32(&b[4..8]),
            local_qkey: be::read_u32(&b[8..12]),
            local_qpn: be::read_u24(&b[12..15]),
            local_eecn: be::read_u24(&b[16..19]),
            starting_psn: be::read_u24(&b[20..23]),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: b[26] >> 3,
            failover_accepted: (b[26] >> 1) & 0x3,
            end_to_end_flow_control: b[26] & 1 != 0,
            rnr_retry_count: b[27] >> 5,
            srq: b[27] & 0x10 != 0,
            local_ca_guid: be::read_u64(&b[28..36]),
            private_data: array(b, 36),
        })
    }

    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        ensure_len(Layer::Buffer, DATA_LEN, data.len())?;
        let b = &mut data[..DATA_LEN];
        b[..36].fill(0);
        be::write_u32(&mut b[0..4], self.local_comm_id);
        be::write_u32(&mut b[4..8], self.remote_comm_id);
        be::write_u32(&mut b[8..12], self.local_qkey);
        be::write_u24(&mut b[12..15], self.local_qpn);
        be::write_u24(&mut b[16..19], self.local_eecn);
        be::write_u24(&mut b[20..23], self.starting_psn);
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        b[26] = ((self.target_ack_delay & 0x1f) << 3)
            | ((self.failover_accepted & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        b[27] = ((self.rnr_retry_count & 0x7) << 5) | (u8::from(self.srq) << 4);
        be::write_u64(&mut b[28..36], self.local_ca_guid);
        b[36..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// A ConnectReject (REJ, IBTA table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    pub local_comm_id: u32,
    /// 0 when the rejected message's sender is unknown.
    pub remote_comm_id: u32,
    pub message_rejected: Answered,
    /// 7 bits: how many bytes of `ari` mean something.
    pub rejected_info_len: u8,
    pub reason: u16,
    /// Additional rejection information (for example, the acceptable class version).
    pub ari: [u8; REJ_ARI_LEN],
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    pub fn parse(data: &[u8]) -> Result<RejRepr> {
        ensure_len(Layer::Mad, DATA_LEN, data.len())?;
        let b = data;
        Ok(RejRepr {
            local_comm_id: be::read_u32(&b[0..4]),
            remote_comm_id: be::read_u32(&b[4..8]),
            message_rejected: Answered::from_bits(b[8] >> 6),
            rejected_info_len: b[9] >> 1,
            reason: be::read_u16(&b[10..12]),
            ari: array(b, 12),
            private_data: array(b, 84),
        })
    }

    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        ensure_len(Layer::Buffer, DATA_LEN, data.len())?;
        let b = &mut data[..DATA_LEN];
        be::write_u32(&mut b[0..4], self.local_comm_id);
        be::write_u32(&mut b[4..8], self.remote_comm_id);
        b[8] = self.message_rejected.bits() << 6;
        b[9] = (self.rejected_info_len & 0x7f) << 1;
        be::write_u16(&mut b[10..12], self.reason);
        b[12..84].copy_from_slice(&self.ari);
        b[84..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// A MessageReceiptAcknowledgement (MRA, IBTA table 107): "your message arrived; my answer
/// will take longer than you were told".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: Answered,
    /// 5 bits: the time the answer will take, 4.096 µs · 2^n.
    pub service_timeout: u8,
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    pub fn parse(data: &[u8]) -> Result<MraRepr> {
        ensure_len(Layer::Mad, DATA_LEN, data.len())?;
        let b = data;
        Ok(MraRepr {
            local_comm_id: be::read_u32(&b[0..4]),
            remote_comm_id: be::read_u32(&b[4..8]),
            message_mraed: Answered::from_bits(b[8] >> 6),
            service_timeout: b[9] >> 3,
            private_data: array(b, 10),
        })
    }

    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        ensure_len(Layer::Buffer, DATA_LEN, data.len())?;
        let b = &mut data[..DATA_LEN];
        be::write_u32(&mut b[0..4], self.local_comm_id);
        be::write_u32(&mut b[4..8], self.remote_comm_id);
        b[8] = self.message_mraed.bits() << 6;
        b[9] = (self.service_timeout & 0x1f) << 3;
        b[10..].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// The two communication IDs and private data: a ReadyToUse (RTU, table 111) or a
/// DisconnectReply (DREP, table 113); which one is the MAD's attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdsRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; SHORT_PRIVATE_DATA_LEN],
}

impl IdsRepr {
    pub fn parse(data: &[u8]) -> Result<IdsRepr> {
        ensure_len(Layer::Mad, DATA_LEN, data.len())?;
        Ok(IdsRepr {
            local_comm_id: be::read_u32(&data[0..4]),
            remote_comm_id: be::read_u32(&data[4..8]),
            private_data: array(data, 8),
        })
    }

    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        ensure_len(Layer::Buffer, DATA_LEN, data.len())?;
        be::write_u32(&mut data[0..4], self.local_comm_id);
        be::write_u32(&mut data[4..8], self.remote_comm_id);
        data[8..DATA_LEN].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// A DisconnectRequest (DREQ, table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the receiver's queue pair, to be disconnected.
    pub remote_qpn: u32,
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    pub fn parse(data: &[u8]) -> Result<DreqRepr> {
        ensure_len(Layer::Mad, DATA_LEN, data.len())?;
        Ok(DreqRepr {
            local_comm_id: be::read_u32(&data[0..4]),
            remote_comm_id: be::read_u32(&data[4..8]),
            remote_qpn: be::read_u24(&data[8..11]),
            private_data: array(data, 12),
        })
    }

    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        ensure_len(Layer::Buffer, DATA_LEN, data.len())?;
        be::write_u32(&mut data[0..4], self.local_comm_id);
        be::write_u32(&mut data[4..8], self.remote_comm_id);
        be::write_u24(&mut data[8..11], self.remote_qpn);
        data[11] = 0;
        data[12..DATA_LEN].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// rdma_cm's conventions on top of the CM: a connection to an IP port is a REQ to the service
/// ID [`rdma_cm::service_id`] of that port, and the REQ's private data starts with a
/// [`rdma_cm::CmaHeader`].
pub mod rdma_cm {
    /// rdma_cm's port space of `RDMA_PS_TCP` (reliable connections): its service IDs are
    /// `0x0000000001060000 | port` (the IP spaces are `0x0000000001000000 | space << 16`).
    pub const PS_TCP: u16 = 0x0106;
    /// The service ID of TCP-space port 0.
    const TCP_SPACE: u64 = (PS_TCP as u64) << 16;

    /// The service ID of TCP-space `port`.
    pub const fn service_id(port: u16) -> u64 {
        TCP_SPACE | port as u64
    }

    /// The TCP-space port a service ID names, if it is one.
    pub const fn tcp_port(service_id: u64) -> Option<u16> {
        if service_id & !0xffff == TCP_SPACE {
            Some(service_id as u16)
        } else {
            None
        }
    }

    /// Length of the header at the start of a REQ's private data.
    pub const HEADER_LEN: usize = 36;
    /// The header's version byte rdma_cm sends (major 0, minor 0).
    pub const VERSION: u8 = 0x00;

    /// rdma_cm's header in a REQ's private data: version, IP version (in the high nibble of
    /// byte 1), the source port, then the source and destination addresses, each 16 bytes
    /// (an IPv4 address in the last 4, after 12 zero bytes). The application's private data
    /// follows it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct CmaHeader {
        pub version: u8,
        /// 4 or 6 (4 bits).
        pub ip_version: u8,
        pub src_port: u16,
        pub src_addr: [u8; 16],
        pub dst_addr: [u8; 16],
    }

    impl CmaHeader {
        /// An IPv4 header from `src:src_port` to `dst`.
        pub fn ipv4(src: core::net::Ipv4Addr, src_port: u16, dst: core::net::Ipv4Addr) -> Self {
            let v4 = |a: core::net::Ipv4Addr| {
                let mut b = [0u8; 16];
                b[12..].copy_from_slice(&a.octets());
                b
            };
            CmaHeader {
                version: VERSION,
                ip_version: 4,
                src_port,
                src_addr: v4(src),
                dst_addr: v4(dst),
            }
        }

        /// The IPv4 addresses (source, destination) of an IPv4 header.
        pub fn ipv4_addrs(&self) -> Option<(core::net::Ipv4Addr, core::net::Ipv4Addr)> {
            let v4 = |b: &[u8; 16]| core::net::Ipv4Addr::new(b[12], b[13], b[14], b[15]);
            (self.ip_version == 4).then(|| (v4(&self.src_addr), v4(&self.dst_addr)))
        }

        /// Parses the header at the start of `private_data` (at least [`HEADER_LEN`] bytes).
        pub fn parse(private_data: &[u8]) -> crate::Result<CmaHeader> {
            crate::ensure_len(crate::Layer::Mad, HEADER_LEN, private_data.len())?;
            let b = private_data;
            Ok(CmaHeader {
                version: b[0],
                ip_version: b[1] >> 4,
                src_port: u16::from_be_bytes([b[2], b[3]]),
                src_addr: super::array(b, 4),
                dst_addr: super::array(b, 20),
            })
        }

        /// Writes the header at the start of `private_data`.
        pub fn emit(&self, private_data: &mut [u8]) -> crate::Result<()> {
            crate::ensure_len(crate::Layer::Buffer, HEADER_LEN, private_data.len())?;
            let b = private_data;
            b[0] = self.version;
            b[1] = (self.ip_version & 0x0f) << 4;
            b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
            b[4..20].copy_from_slice(&self.src_addr);
            b[20..36].copy_from_slice(&self.dst_addr);
            Ok(())
        }
    }
}

/// Portico's extension block in the tail of CM private data (`docs/wire.md` §20): the last
/// [`portico_ext::LEN`] bytes of a REQ's or a REP's private data, where a Portico end offers
/// (REQ) and settles (REP) the queue pair's congestion control and its options. A standard
/// peer sends zeros there or its own bytes, which fail the magic; a Portico end offers only
/// when the application's data leaves the tail free, answers only an offer, and hands the
/// application its private data with the block zeroed.
pub mod portico_ext {
    /// The block's length.
    pub const LEN: usize = 8;
    /// Bytes 0-1.
    pub const MAGIC: [u8; 2] = *b"PX";
    /// Byte 2.
    pub const VERSION: u8 = 1;
    /// Byte 3, the congestion-control scheme: none.
    pub const CC_NONE: u8 = 0;
    /// DCQCN (standard CNPs).
    pub const CC_DCQCN: u8 = 1;
    /// Portico's congestion state in ACKs (the CETH).
    pub const CC_ACK: u8 = 2;
    /// Byte 4, bit 0: the CETH's delay word.
    pub const FLAG_DELAY: u8 = 1;

    /// The block's fields.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ExtRepr {
        /// [`CC_NONE`], [`CC_DCQCN`] or [`CC_ACK`].
        pub cc: u8,
        /// The CETH carries the receiver's queuing delay (`cc` ack only).
        pub delay: bool,
        /// What the sender of this block asks of the other end's sender: keep its congested
        /// rate until the path has been clear this long (µs; 0: restore at once).
        pub keep_rate_us: u16,
    }

    impl ExtRepr {
        /// Writes the block into the last [`LEN`] bytes of `private_data`; `false` (nothing
        /// written) where it is shorter.
        pub fn emit_tail(&self, private_data: &mut [u8]) -> bool {
            let Some(at) = private_data.len().checked_sub(LEN) else {
                return false;
            };
            let b = &mut private_data[at..];
            b[0..2].copy_from_slice(&MAGIC);
            b[2] = VERSION;
            b[3] = self.cc;
            b[4] = if self.delay { FLAG_DELAY } else { 0 };
            b[5] = 0;
            b[6..8].copy_from_slice(&self.keep_rate_us.to_be_bytes());
            true
        }

        /// The block in the last [`LEN`] bytes of `private_data`: `None` unless the magic,
        /// the version, a known scheme, and zeros in every reserved bit are there.
        pub fn parse_tail(private_data: &[u8]) -> Option<ExtRepr> {
            let at = private_data.len().checked_sub(LEN)?;
            let b = &private_data[at..];
            let known = b[0..2] == MAGIC
                && b[2] == VERSION
                && b[3] <= CC_ACK
                && b[4] & !FLAG_DELAY == 0
                && b[5] == 0;
            known.then(|| ExtRepr {
                cc: b[3],
                delay: b[4] & FLAG_DELAY != 0,
                keep_rate_us: u16::from_be_bytes([b[6], b[7]]),
            })
        }

        /// Zeroes the block's bytes in `private_data` (what the application is handed).
        pub fn clear_tail(private_data: &mut [u8]) {
            if let Some(at) = private_data.len().checked_sub(LEN) {
                private_data[at..].fill(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The data of an rdma_cm-style REQ (written independently, with Python's `struct`, from
    /// IBTA's table 106 as the Linux CM lays it out): comm ID 0x1234abcd, service ID
    /// RDMA_PS_TCP port 20000, QPN 0x11, 16 READs each way, CM timeouts 20, RC, PSN 0xabcdef,
    /// retries 7/7, P_Key 0xffff, MTU 1024, 15 CM retries; the primary path 10.0.0.1 ->
    /// 10.0.0.2 as IPv4-mapped GIDs, permissive LIDs, flow label 0x12345, traffic class 2, hop
    /// limit 64, subnet local, ACK timeout 18; no alternate path; private data: rdma_cm's
    /// header (IPv4, source port 50000, the two addresses) and two bytes of the application's.
    /// tshark 4.0 decodes it, in a UD SEND ONLY to QP 1, as that ConnectRequest field for
    /// field, and the private data as "IP CM Private Data" with those ports and addresses, except
    /// the primary path's flow label and packet rate, which its dissector takes from other
    /// bits than the table (`docs/wire.md`, section 18).
    const REQ_DATA: [&str; 8] = [
        "1234abcd000000000000000001064e20020200fffe0000010000000000000000",
        "0000111000000010000000a0abcdefa7ffff37f0ffffffff0000000000000000",
        "0000ffff0a00000100000000000000000000ffff0a0000021234500002400890",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000040c3500000000000000000000000000a000001",
        "0000000000000000000000000a000002cafe0000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];

    fn bytes(hex: &[&str]) -> Vec<u8> {
        let h: String = hex.concat();
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }

    fn req_data() -> Vec<u8> {
        bytes(&REQ_DATA)
    }

    // The answers to that REQ and the teardown, written the same way (Python's `struct`, from
    // IBTA's tables 107-113 as the Linux CM lays them out). tshark 4.0 decodes the REP, both
    // REJs, the RTU, the DREQ and the DREP field for field as the tests below expect; it has
    // no MRA dissector ("Dissector Not Implemented").
    const REP_DATA: [&str; 8] = [
        "5678ef011234abcd00000000000022000000000012345600101079e0020200ff",
        "fe00000200007f00123400000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];
    const REJ_DATA: [&str; 8] = [
        "5678ef011234abcd000000080000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000010200000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];
    const REJ2_DATA: [&str; 8] = [
        "1234abcd5678ef014002001f0200000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];
    const MRA_DATA: [&str; 8] = [
        "5678ef011234abcd00a800000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];
    const RTU_DATA: [&str; 8] = [
        "1234abcd5678ef01000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];
    const DREQ_DATA: [&str; 8] = [
        "1234abcd5678ef01000022000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];
    const DREP_DATA: [&str; 8] = [
        "5678ef011234abcd000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000",
    ];

    /// `emit` writes exactly the golden bytes (into a buffer of 0xff, so every reserved bit
    /// and byte is written), and `parse` reads back `repr`.
    fn golden<R: PartialEq + core::fmt::Debug>(
        hex: &[&str],
        repr: R,
        parse: fn(&[u8]) -> Result<R>,
        emit: fn(&R, &mut [u8]) -> Result<()>,
    ) {
        let want = bytes(hex);
        assert_eq!(want.len(), DATA_LEN);
        assert_eq!(parse(&want).unwrap(), repr);
        let mut got = [0xffu8; DATA_LEN];
        emit(&repr, &mut got).unwrap();
        assert_eq!(got.to_vec(), want);
        assert!(parse(&want[..DATA_LEN - 1]).is_err());
        assert!(emit(&repr, &mut got[..DATA_LEN - 1]).is_err());
    }

    #[test]
    fn test_rep() {
        let mut private_data = [0u8; REP_PRIVATE_DATA_LEN];
        private_data[..8].copy_from_slice(&[0, 0, 0x7f, 0, 0x12, 0x34, 0, 0]);
        let rep = RepRepr {
            local_comm_id: 0x5678_ef01,
            remote_comm_id: 0x1234_abcd,
            local_qkey: 0,
            local_qpn: 0x22,
            local_eecn: 0,
            starting_psn: 0x12_3456,
            responder_resources: 16,
            initiator_depth: 16,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x0202_00ff_fe00_0002,
            private_data,
        };
        golden(&REP_DATA, rep, RepRepr::parse, RepRepr::emit);
    }

    #[test]
    fn test_rej() {
        let mut private_data = [0u8; REJ_PRIVATE_DATA_LEN];
        private_data[..2].copy_from_slice(&[1, 2]);
        let rej = RejRepr {
            local_comm_id: 0x5678_ef01,
            remote_comm_id: 0x1234_abcd,
            message_rejected: Answered::Req,
            rejected_info_len: 0,
            reason: rej_reason::INVALID_SERVICE_ID,
            ari: [0; REJ_ARI_LEN],
            private_data,
        };
        golden(&REJ_DATA, rej, RejRepr::parse, RejRepr::emit);
        // A REJ of a REP for its class version, naming the version it takes in the ARI.
        let mut ari = [0u8; REJ_ARI_LEN];
        ari[0] = 2;
        let rej2 = RejRepr {
            local_comm_id: 0x1234_abcd,
            remote_comm_id: 0x5678_ef01,
            message_rejected: Answered::Rep,
            rejected_info_len: 1,
            reason: rej_reason::INVALID_CLASS_VERSION,
            ari,
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        };
        golden(&REJ2_DATA, rej2, RejRepr::parse, RejRepr::emit);
    }

    #[test]
    fn test_mra() {
        let mra = MraRepr {
            local_comm_id: 0x5678_ef01,
            remote_comm_id: 0x1234_abcd,
            message_mraed: Answered::Req,
            service_timeout: 21,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        };
        golden(&MRA_DATA, mra, MraRepr::parse, MraRepr::emit);
    }

    #[test]
    fn test_rtu_dreq_drep() {
        let rtu = IdsRepr {
            local_comm_id: 0x1234_abcd,
            remote_comm_id: 0x5678_ef01,
            private_data: [0; SHORT_PRIVATE_DATA_LEN],
        };
        golden(&RTU_DATA, rtu, IdsRepr::parse, IdsRepr::emit);
        let dreq = DreqRepr {
            local_comm_id: 0x1234_abcd,
            remote_comm_id: 0x5678_ef01,
            remote_qpn: 0x22,
            private_data: [0; DREQ_PRIVATE_DATA_LEN],
        };
        golden(&DREQ_DATA, dreq, DreqRepr::parse, DreqRepr::emit);
        let drep = IdsRepr {
            local_comm_id: 0x5678_ef01,
            remote_comm_id: 0x1234_abcd,
            private_data: [0; SHORT_PRIVATE_DATA_LEN],
        };
        golden(&DREP_DATA, drep, IdsRepr::parse, IdsRepr::emit);
    }

    /// The REQ's private data holds rdma_cm's header as tshark decodes it (IPv4, source
    /// port 50000, 10.0.0.1 -> 10.0.0.2), and the service ID names TCP port 20000.
    #[test]
    fn test_rdma_cm_conventions() {
        use core::net::Ipv4Addr;
        use rdma_cm::*;
        let r = req();
        assert_eq!(tcp_port(r.service_id), Some(20000));
        assert_eq!(service_id(20000), r.service_id);
        assert_eq!(
            tcp_port(0x0000_0000_0113_4e20),
            None,
            "another port space (IB)"
        );
        let h = CmaHeader::parse(&r.private_data).unwrap();
        let want = CmaHeader::ipv4(
            Ipv4Addr::new(10, 0, 0, 1),
            50000,
            Ipv4Addr::new(10, 0, 0, 2),
        );
        assert_eq!(h, want);
        assert_eq!(
            h.ipv4_addrs(),
            Some((Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)))
        );
        let mut pd = [0xffu8; REQ_PRIVATE_DATA_LEN];
        want.emit(&mut pd).unwrap();
        assert_eq!(pd[..HEADER_LEN], r.private_data[..HEADER_LEN]);
        assert!(CmaHeader::parse(&pd[..HEADER_LEN - 1]).is_err());
    }

    #[test]
    fn test_answered_codes() {
        for (bits, a) in [
            (0, Answered::Req),
            (1, Answered::Rep),
            (2, Answered::Other),
            (3, Answered::Reserved),
        ] {
            assert_eq!(Answered::from_bits(bits), a);
            assert_eq!(a.bits(), bits);
        }
    }

    fn mapped(ip: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        g
    }

    fn req() -> ReqRepr {
        let mut private_data = [0u8; REQ_PRIVATE_DATA_LEN];
        private_data[1] = 0x40;
        private_data[2..4].copy_from_slice(&50000u16.to_be_bytes());
        private_data[16..20].copy_from_slice(&[10, 0, 0, 1]);
        private_data[32..36].copy_from_slice(&[10, 0, 0, 2]);
        private_data[36..38].copy_from_slice(&[0xca, 0xfe]);
        ReqRepr {
            local_comm_id: 0x1234_abcd,
            service_id: 0x0000_0000_0106_4e20,
            local_ca_guid: 0x0202_00ff_fe00_0001,
            local_qkey: 0,
            local_qpn: 0x11,
            responder_resources: 16,
            local_eecn: 0,
            initiator_depth: 16,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: 0xab_cdef,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary_path: PathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: mapped([10, 0, 0, 1]),
                remote_gid: mapped([10, 0, 0, 2]),
                flow_label: 0x12345,
                packet_rate: 0,
                traffic_class: 2,
                hop_limit: 64,
                sl: 0,
                subnet_local: true,
                local_ack_timeout: 18,
            },
            alternate_path: PathRepr::default(),
            private_data,
        }
    }

    #[test]
    fn test_parse() {
        let data = req_data();
        assert_eq!(data.len(), DATA_LEN);
        assert_eq!(ReqRepr::parse(&data).unwrap(), req());
    }

    #[test]
    fn test_emit() {
        let mut data = [0xffu8; DATA_LEN];
        req().emit(&mut data).unwrap();
        assert_eq!(
            data.to_vec(),
            req_data(),
            "reserved bits and bytes written as 0"
        );
    }

    #[test]
    fn test_truncated() {
        let data = req_data();
        assert_eq!(
            ReqRepr::parse(&data[..DATA_LEN - 1]).unwrap_err(),
            crate::Error::Truncated {
                layer: Layer::Mad,
                need: DATA_LEN,
                have: DATA_LEN - 1
            }
        );
        let mut short = [0u8; DATA_LEN - 1];
        assert!(req().emit(&mut short).is_err());
    }

    fn path() -> impl Strategy<Value = PathRepr> {
        (
            (
                any::<u16>(),
                any::<u16>(),
                any::<[u8; 16]>(),
                any::<[u8; 16]>(),
            ),
            (0u32..1 << 20, 0u8..64, any::<u8>(), any::<u8>()),
            (0u8..16, any::<bool>(), 0u8..32),
        )
            .prop_map(
                |((ll, rl, lg, rg), (fl, pr, tc, hl), (sl, sn, at))| PathRepr {
                    local_lid: ll,
                    remote_lid: rl,
                    local_gid: lg,
                    remote_gid: rg,
                    flow_label: fl,
                    packet_rate: pr,
                    traffic_class: tc,
                    hop_limit: hl,
                    sl,
                    subnet_local: sn,
                    local_ack_timeout: at,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any 232 bytes parse as every message (nothing panics), and what was parsed, written
        /// again, parses to the same thing (reserved bits aside, nothing is lost).
        #[test]
        fn prop_any_data_parses_and_round_trips(data in proptest::collection::vec(any::<u8>(), DATA_LEN)) {
            let mut out = [0u8; DATA_LEN];
            let req = ReqRepr::parse(&data).unwrap();
            req.emit(&mut out).unwrap();
            prop_assert_eq!(ReqRepr::parse(&out).unwrap(), req);
            let rep = RepRepr::parse(&data).unwrap();
            rep.emit(&mut out).unwrap();
            prop_assert_eq!(RepRepr::parse(&out).unwrap(), rep);
            let rej = RejRepr::parse(&data).unwrap();
            rej.emit(&mut out).unwrap();
            prop_assert_eq!(RejRepr::parse(&out).unwrap(), rej);
            let mra = MraRepr::parse(&data).unwrap();
            mra.emit(&mut out).unwrap();
            prop_assert_eq!(MraRepr::parse(&out).unwrap(), mra);
            let ids = IdsRepr::parse(&data).unwrap();
            ids.emit(&mut out).unwrap();
            prop_assert_eq!(IdsRepr::parse(&out).unwrap(), ids);
            let dreq = DreqRepr::parse(&data).unwrap();
            dreq.emit(&mut out).unwrap();
            prop_assert_eq!(DreqRepr::parse(&out).unwrap(), dreq);
        }

        /// Every field at every in-range value comes back as it was written.
        #[test]
        fn prop_round_trip(
            ids in (any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>()),
            qp in (0u32..1 << 24, any::<u8>(), 0u32..1 << 24, any::<u8>(), 0u32..1 << 24),
            bits in (0u8..32, 0u8..4, any::<bool>(), 0u32..1 << 24, 0u8..32, 0u8..8),
            more in (any::<u16>(), 0u8..16, any::<bool>(), 0u8..8, 0u8..16, any::<bool>(), 0u8..8),
            primary in path(),
            alternate in path(),
            private_data in any::<[u8; REQ_PRIVATE_DATA_LEN]>(),
        ) {
            let repr = ReqRepr {
                local_comm_id: ids.0,
                service_id: ids.1,
                local_ca_guid: ids.2,
                local_qkey: ids.3,
                local_qpn: qp.0,
                responder_resources: qp.1,
                local_eecn: qp.2,
                initiator_depth: qp.3,
                remote_eecn: qp.4,
                remote_cm_response_timeout: bits.0,
                transport_service_type: bits.1,
                end_to_end_flow_control: bits.2,
                starting_psn: bits.3,
                local_cm_response_timeout: bits.4,
                retry_count: bits.5,
                pkey: more.0,
                path_mtu: more.1,
                rdc_exists: more.2,
                rnr_retry_count: more.3,
                max_cm_retries: more.4,
                srq: more.5,
                extended_transport_type: more.6,
                primary_path: primary,
                alternate_path: alternate,
                private_data,
            };
            let mut data = [0u8; DATA_LEN];
            repr.emit(&mut data).unwrap();
            prop_assert_eq!(ReqRepr::parse(&data).unwrap(), repr);
        }
    }

    #[test]
    fn test_portico_ext_block_sits_in_the_tail_and_refuses_what_is_not_one() {
        use super::portico_ext::{self, ExtRepr};
        let mut pd = [0u8; REQ_PRIVATE_DATA_LEN];
        pd[36..40].copy_from_slice(b"app!");
        let x = ExtRepr {
            cc: portico_ext::CC_ACK,
            delay: true,
            keep_rate_us: 200,
        };
        assert!(x.emit_tail(&mut pd));
        assert_eq!(&pd[84..], &[0x50, 0x58, 0x01, 0x02, 0x01, 0x00, 0x00, 0xc8]);
        assert_eq!(&pd[36..40], b"app!");
        assert_eq!(ExtRepr::parse_tail(&pd), Some(x));
        // What a standard peer sends: zeros, or its own bytes.
        assert_eq!(ExtRepr::parse_tail(&[0u8; REP_PRIVATE_DATA_LEN]), None);
        for (at, bad) in [(0, b'Q'), (2, 2), (3, 3), (4, 0x02), (5, 1)] {
            let mut b = pd;
            b[84 + at] = bad;
            assert_eq!(ExtRepr::parse_tail(&b), None, "byte {at} = {bad:#x}");
        }
        assert_eq!(ExtRepr::parse_tail(&pd[..7]), None);
        assert!(!x.emit_tail(&mut [0u8; 7]));
        ExtRepr::clear_tail(&mut pd);
        assert_eq!(ExtRepr::parse_tail(&pd), None);
        assert!(pd[84..].iter().all(|&b| b == 0));
        assert_eq!(&pd[36..40], b"app!");
    }
}
