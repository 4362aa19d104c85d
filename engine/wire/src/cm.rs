//! The communication manager's messages (IBTA chapter 12), carried in the data of a CM MAD
//! ([`crate::mad`], class [`crate::mad::CLASS_CM`], one attribute per message).
//!
//! Offsets here count from the start of the MAD's data (byte 24 of the MAD), as IBTA's tables
//! do. So far: the ConnectRequest (REQ, table 106), whose fields set up the new queue pair.
//! Sub-byte fields sit most significant bit first, as everywhere in the IBTA headers.

use super::mad::DATA_LEN;
use super::{Layer, Result, be, ensure_len};

/// One path of a REQ (primary or alternate), 44 bytes. On RoCEv2 the GIDs are the ports'
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`), the LIDs are 0 (the Linux CM sends the
/// permissive LID 0xffff), and the traffic class and hop limit are the IPv4 header's DSCP/ECN
/// byte and TTL.
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

    fn req_data() -> Vec<u8> {
        let h: String = REQ_DATA.concat();
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
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
}
