//! Frames of QP1, the general services QP: RoCEv2 unreliable-datagram SEND ONLY (and SEND
//! ONLY with immediate) packets to queue pair 1, each a DETH and one 256-byte MAD.
//!
//! ```text
//!  offset  len  layer
//!       0   14  Ethernet
//!      14   20  IPv4 (no options, DF)
//!      34    8  UDP, destination port 4791
//!      42   12  BTH: opcode 0x64 (UD SEND ONLY) or 0x65 (with immediate), dest QP 1
//!      54    8  DETH: Q_Key 0x80010000, source QP 1
//!     (62    4  ImmDt, opcode 0x65 only)
//!      62  256  MAD (`wire::mad`)
//!     318    4  ICRC
//! ```
//!
//! The RC path ([`crate::RocePacket`]) refuses these opcodes as another transport; a node
//! hands them here instead. Parsing checks what `RoceRepr::parse` checks (structure, the
//! IPv4 and a non-zero UDP checksum, the ICRC) and leaves the payload's meaning (a MAD of
//! exactly 256 bytes, a GSI Q_Key) to the caller, which counts each refusal by its reason.

use super::bth::{self, QPN_MASK};
use super::deth::{self, DethRepr};
use super::ethernet::{self, EthernetAddress};
use super::icrc::{self, ICRC_LEN};
use super::immdt;
use super::ipv4;
use super::roce::{
    BTH_OFFSET, EXT_OFFSET, IP_OFFSET, RoceIpv4, UDP_OFFSET, icrc_over, locate_datagram, pad_for,
    write_datagram_headers,
};
use super::udp;
use super::{Error, Layer, Result, ensure_len, mad};

/// The general services QP's number.
pub const QPN: u32 = 1;
/// BTH opcode of a UD SEND ONLY.
pub const SEND_ONLY: u8 = 0x64;
/// BTH opcode of a UD SEND ONLY with immediate.
pub const SEND_ONLY_IMM: u8 = 0x65;
/// A QP1 frame carrying one MAD, without immediate: 322 bytes.
pub const FRAME_LEN: usize = EXT_OFFSET + deth::HEADER_LEN + mad::MAD_LEN + ICRC_LEN;

/// Everything in a QP1 frame but its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GsiRepr {
    pub src_mac: EthernetAddress,
    pub dst_mac: EthernetAddress,
    pub ip: RoceIpv4,
    /// UDP source port (the sender's flow entropy).
    pub src_port: u16,
    pub pkey: u16,
    /// The destination queue pair: 1 for what the CM sends.
    pub dest_qp: u32,
    pub psn: u32,
    pub solicited: bool,
    pub deth: DethRepr,
    /// The immediate data of a SEND ONLY with immediate (opcode 0x65).
    pub immediate: Option<[u8; 4]>,
}

impl GsiRepr {
    /// Checks, verifies and decodes a QP1 frame; returns its headers and its payload (without
    /// pad). Fails with [`Error::OtherTransport`] for a BTH opcode other than the two UD SEND
    /// ONLYs, and as `RoceRepr::parse` does for everything else.
    pub fn parse(frame: &[u8]) -> Result<(GsiRepr, &[u8])> {
        let (ip_end, udp_end) = locate_datagram(frame)?;
        let b = bth::Packet::new_checked(&frame[BTH_OFFSET..udp_end])?;
        if b.tver() != 0 {
            return Err(Error::BadVersion {
                layer: Layer::Bth,
                version: b.tver(),
            });
        }
        let opcode = b.opcode_raw();
        let imm_len = match opcode {
            SEND_ONLY => 0,
            SEND_ONLY_IMM => immdt::HEADER_LEN,
            other => return Err(Error::OtherTransport(other)),
        };
        let deth_at = EXT_OFFSET;
        let payload_at = deth_at + deth::HEADER_LEN + imm_len;
        ensure_len(
            Layer::Deth,
            payload_at + ICRC_LEN - EXT_OFFSET,
            udp_end - EXT_OFFSET,
        )?;
        let icrc_at = udp_end - ICRC_LEN;
        let padded = icrc_at - payload_at;
        let pad_count = b.pad_count();
        if usize::from(pad_count) > padded || !padded.is_multiple_of(4) {
            return Err(Error::BadPadding {
                pad_count,
                payload_len: padded.saturating_sub(usize::from(pad_count)),
            });
        }
        let ip = ipv4::Packet::new_unchecked(&frame[IP_OFFSET..ip_end]);
        if !ip.verify_checksum() {
            return Err(Error::BadChecksum {
                layer: Layer::Ipv4,
                expected: ip.compute_checksum(),
                found: ip.checksum(),
            });
        }
        let u = udp::Packet::new_unchecked(&frame[UDP_OFFSET..udp_end]);
        if !u.verify_checksum(ip.src_addr(), ip.dst_addr()) {
            return Err(Error::BadChecksum {
                layer: Layer::Udp,
                expected: u.compute_checksum(ip.src_addr(), ip.dst_addr()),
                found: u.checksum(),
            });
        }
        let t = &frame[icrc_at..udp_end];
        let found = icrc::from_wire([t[0], t[1], t[2], t[3]]);
        let expected = icrc_over(&frame[..icrc_at], &[], 0);
        if expected != found {
            return Err(Error::BadIcrc { expected, found });
        }
        let eth = ethernet::Packet::new_unchecked(&frame[..ip_end]);
        let d = deth::Packet::new_unchecked(&frame[deth_at..deth_at + deth::HEADER_LEN]);
        let immediate = (imm_len > 0).then(|| {
            let at = deth_at + deth::HEADER_LEN;
            immdt::Packet::new_unchecked(&frame[at..at + immdt::HEADER_LEN]).data()
        });
        let repr = GsiRepr {
            src_mac: eth.src_addr(),
            dst_mac: eth.dst_addr(),
            ip: RoceIpv4::read(&ip),
            src_port: u.src_port(),
            pkey: b.pkey(),
            dest_qp: b.dest_qp(),
            psn: b.psn(),
            solicited: b.solicited(),
            deth: DethRepr::parse(&d)?,
            immediate,
        };
        Ok((repr, &frame[payload_at..icrc_at - usize::from(pad_count)]))
    }

    /// Bytes of the headers, Ethernet through the DETH (and ImmDt).
    pub const fn header_len(&self) -> usize {
        EXT_OFFSET
            + deth::HEADER_LEN
            + match self.immediate {
                Some(_) => immdt::HEADER_LEN,
                None => 0,
            }
    }

    /// Bytes of the whole frame for a payload of `payload_len` bytes.
    pub const fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_for(payload_len) as usize + ICRC_LEN
    }

    /// Writes the frame carrying `payload` into `buf`; returns its length.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize> {
        let total = self.buffer_len(payload.len());
        ensure_len(Layer::Buffer, total, buf.len())?;
        if self.dest_qp > QPN_MASK || self.psn > bth::PSN_MASK || self.deth.src_qp > QPN_MASK {
            return Err(Error::BadField {
                layer: Layer::Bth,
                field: "dest_qp/psn/src_qp",
                value: u64::from(self.dest_qp.max(self.psn).max(self.deth.src_qp)),
            });
        }
        let ip_len = total - IP_OFFSET;
        if ip_len > usize::from(u16::MAX) {
            return Err(Error::BadLength {
                layer: Layer::Ipv4,
                value: ip_len,
                min: ipv4::HEADER_LEN,
                max: usize::from(u16::MAX),
            });
        }
        let buf = &mut buf[..total];
        let pad = usize::from(pad_for(payload.len()));
        write_datagram_headers(
            buf,
            self.src_mac,
            self.dst_mac,
            &self.ip,
            self.src_port,
            total - UDP_OFFSET,
        );
        {
            let mut b = bth::Packet::new_unchecked(&mut buf[BTH_OFFSET..EXT_OFFSET]);
            b.set_opcode_raw(match self.immediate {
                Some(_) => SEND_ONLY_IMM,
                None => SEND_ONLY,
            });
            b.set_solicited(self.solicited);
            b.set_migreq(false);
            b.set_pad_count(pad as u8);
            b.set_tver(0);
            b.set_pkey(self.pkey);
            b.set_fecn(false);
            b.set_becn(false);
            b.set_resv6(0);
            b.set_dest_qp(self.dest_qp);
            b.set_ack_req(false);
            b.set_resv7(0);
            b.set_psn(self.psn);
        }
        let mut at = EXT_OFFSET;
        self.deth.emit(&mut deth::Packet::new_unchecked(
            &mut buf[at..at + deth::HEADER_LEN],
        ));
        at += deth::HEADER_LEN;
        if let Some(data) = self.immediate {
            immdt::Packet::new_unchecked(&mut buf[at..at + immdt::HEADER_LEN]).set_data(data);
            at += immdt::HEADER_LEN;
        }
        buf[at..at + payload.len()].copy_from_slice(payload);
        at += payload.len();
        buf[at..at + pad].fill(0);
        at += pad;
        let crc = icrc_over(&buf[..at], &[], 0);
        buf[at..at + ICRC_LEN].copy_from_slice(&icrc::to_wire(crc));
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deth::GSI_QKEY;
    use crate::ipv4::Ecn;
    use core::net::Ipv4Addr;

    fn repr() -> GsiRepr {
        GsiRepr {
            src_mac: EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]),
            dst_mac: EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]),
            ip: RoceIpv4 {
                src_addr: Ipv4Addr::new(10, 77, 0, 1),
                dst_addr: Ipv4Addr::new(10, 77, 0, 2),
                dscp: 0,
                ecn: Ecn::NotEct,
                ident: 0,
                dont_frag: true,
                ttl: 64,
            },
            src_port: 0xc001,
            pkey: 0xffff,
            dest_qp: QPN,
            psn: 0x12,
            solicited: false,
            deth: DethRepr {
                qkey: GSI_QKEY,
                src_qp: QPN,
            },
            immediate: None,
        }
    }

    #[test]
    fn a_mad_frame_is_322_bytes_and_parses_back() {
        let mut mad = [0u8; mad::MAD_LEN];
        mad[0] = 1;
        mad[1] = 7;
        mad[255] = 0x5a;
        let mut buf = [0u8; 400];
        let n = repr().emit(&mad, &mut buf).unwrap();
        assert_eq!(n, FRAME_LEN);
        assert_eq!(n, 322);
        assert_eq!(buf[42], SEND_ONLY);
        assert_eq!(&buf[47..50], &[0, 0, 1], "dest QP 1");
        assert_eq!(&buf[54..62], &[0x80, 0x01, 0, 0, 0, 0, 0, 1], "DETH");
        let (back, payload) = GsiRepr::parse(&buf[..n]).unwrap();
        assert_eq!(back, repr());
        assert_eq!(payload, &mad[..]);
    }

    #[test]
    fn with_immediate_and_a_short_payload_it_pads_and_parses_back() {
        let r = GsiRepr {
            immediate: Some([1, 2, 3, 4]),
            ..repr()
        };
        let mut buf = [0u8; 128];
        let n = r.emit(b"abcde", &mut buf).unwrap();
        assert_eq!(n, EXT_OFFSET + 8 + 4 + 5 + 3 + 4);
        assert_eq!(buf[42], SEND_ONLY_IMM);
        assert_eq!(buf[43] >> 4 & 3, 3, "pad count");
        let (back, payload) = GsiRepr::parse(&buf[..n]).unwrap();
        assert_eq!(back, r);
        assert_eq!(payload, b"abcde");
    }

    #[test]
    fn a_flipped_bit_anywhere_covered_is_refused() {
        let mad = [0x33u8; mad::MAD_LEN];
        let mut buf = [0u8; 400];
        let n = repr().emit(&mad, &mut buf).unwrap();
        for at in [EXT_OFFSET + 3, EXT_OFFSET + 100, n - 1, BTH_OFFSET + 6] {
            let mut f = buf;
            f[at] ^= 0x10;
            assert!(
                matches!(GsiRepr::parse(&f[..n]), Err(Error::BadIcrc { .. })),
                "byte {at}"
            );
        }
        let mut f = buf;
        f[IP_OFFSET + 12] ^= 1; // source address: the IPv4 checksum catches it first
        assert!(matches!(
            GsiRepr::parse(&f[..n]),
            Err(Error::BadChecksum {
                layer: Layer::Ipv4,
                ..
            })
        ));
    }

    #[test]
    fn rc_opcodes_and_short_frames_are_refused_by_name() {
        let mad = [0u8; mad::MAD_LEN];
        let mut buf = [0u8; 400];
        let n = repr().emit(&mad, &mut buf).unwrap();
        let mut f = buf;
        f[BTH_OFFSET] = 0x04; // RC SEND ONLY
        assert_eq!(GsiRepr::parse(&f[..n]), Err(Error::OtherTransport(0x04)));
        for cut in [0, 13, 41, 53, 60] {
            assert!(GsiRepr::parse(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// The frame rxe sends for a CM REQ starts like this one: tshark (4.0) decodes these bytes
    /// as "UD Send Only", "DETH ... Queue Key: 0x80010000, Source Queue Pair: 0x00000001".
    #[test]
    fn golden_headers() {
        let mad = [0u8; mad::MAD_LEN];
        let mut buf = [0u8; 400];
        let n = repr().emit(&mad, &mut buf).unwrap();
        assert_eq!(
            &buf[BTH_OFFSET..EXT_OFFSET + 8],
            &[
                0x64, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x12, // BTH
                0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // DETH
            ]
        );
        assert_eq!(
            &buf[UDP_OFFSET + 4..UDP_OFFSET + 6],
            &[0x01, 0x20],
            "UDP length 288: BTH, DETH, MAD, ICRC"
        );
        assert_eq!(n, 322);
    }
}
