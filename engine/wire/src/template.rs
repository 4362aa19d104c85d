//! Per-flow header templates: emitting a RoCEv2 frame by copying a prepared header and
//! patching what changes from packet to packet.
//!
//! Every packet a queue pair sends carries the same Ethernet addresses, IP addresses, TOS,
//! TTL, UDP ports, P_Key and destination QP. Only a handful of bytes change: the IPv4 total
//! length and checksum, the UDP length, and the BTH's opcode, flags, AckReq and PSN (plus the
//! extension headers and the payload). A [`HeaderTemplate`] holds the 54 bytes of Ethernet,
//! IPv4, UDP and BTH with those fields zero, prepared once per queue pair, and two sums over
//! them:
//!
//! - the IPv4 header's one's-complement sum: the checksum of a packet is that sum plus its
//!   total length, folded (RFC 1624's incremental update, from a zero field);
//! - the ICRC register after the dummy LRH and the template's covered headers (IPv4, UDP,
//!   BTH, with the fields switches may rewrite set to all-ones as the ICRC recipe says).
//!
//! CRC-32 is linear: for two messages of equal length, the register after `A xor B` equals
//! the register after `A` (from the usual initial value) xor the register after `B` from
//! zero. The varying bytes of a packet's headers are `template xor delta`, where `delta` is
//! zero except at ten byte positions; the register after the headers is therefore the
//! template's register xor ten table lookups, one per varying byte (each table gives a byte's
//! contribution followed by the zero bytes up to the end of the BTH). The CRC then continues
//! over the extension headers, payload and pad in one pass. The result is the same ICRC as
//! [`super::roce::RoceRepr::emit`] writes, byte for byte; the tests compare the two on every
//! opcode and on arbitrary field values.

use super::bth::{self, Opcode};
use super::icrc::{self, Crc32, ICRC_LEN, LRH_SEED};
use super::ipv4;
use super::roce::{BASE_HEADER_LEN, PacketFields, RoceRepr, pad_for};
use super::udp;
use super::{Error, Layer, Result, ensure_len};

const IP: usize = super::ethernet::HEADER_LEN;
const UDP: usize = IP + ipv4::HEADER_LEN;
const BTH: usize = UDP + udp::HEADER_LEN;
/// Bytes covered by the ICRC in the base headers: IPv4, UDP and BTH.
const COVERED: usize = BASE_HEADER_LEN - IP;

/// Offsets (from the IPv4 header) of the header bytes that change from packet to packet:
/// IPv4 total length, UDP length, BTH opcode, BTH flags (SE, MigReq, pad, version), BTH
/// AckReq byte, BTH PSN. The IPv4 checksum, TOS and TTL, the UDP checksum and the BTH's
/// FECN/BECN byte change too, but the ICRC covers them as all-ones, so they are absent here.
const VARYING: [usize; 10] = [
    2,
    3,
    ipv4::HEADER_LEN + 4,
    ipv4::HEADER_LEN + 5,
    ipv4::HEADER_LEN + udp::HEADER_LEN,
    ipv4::HEADER_LEN + udp::HEADER_LEN + 1,
    ipv4::HEADER_LEN + udp::HEADER_LEN + 8,
    ipv4::HEADER_LEN + udp::HEADER_LEN + 9,
    ipv4::HEADER_LEN + udp::HEADER_LEN + 10,
    ipv4::HEADER_LEN + udp::HEADER_LEN + 11,
];

/// `DELTA[j][b]`: the CRC register, from zero, after byte `b` at covered offset `VARYING[j]`
/// followed by zeros to the end of the BTH.
static DELTA: [[u32; 256]; VARYING.len()] = build_delta();

const fn build_delta() -> [[u32; 256]; VARYING.len()] {
    let mut t = [[0u32; 256]; VARYING.len()];
    let mut j = 0;
    while j < VARYING.len() {
        let zeros = COVERED - 1 - VARYING[j];
        let mut b = 0;
        while b < 256 {
            let mut reg = icrc::TABLE0[b];
            let mut k = 0;
            while k < zeros {
                reg = (reg >> 8) ^ icrc::TABLE0[(reg & 0xff) as usize];
                k += 1;
            }
            t[j][b] = reg;
            b += 1;
        }
        j += 1;
    }
    t
}

/// The fields every packet of a flow shares, and the prepared bytes and sums that follow
/// from them. Build one per queue pair with [`HeaderTemplate::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTemplate {
    /// The repr it was built from, with the per-packet fields cleared: what
    /// [`HeaderTemplate::matches`] compares.
    flow: RoceRepr,
    /// Ethernet, IPv4, UDP and BTH with the per-packet fields zero.
    bytes: [u8; BASE_HEADER_LEN],
    /// One's-complement sum of the IPv4 header with total length and checksum zero.
    ip_sum: u32,
    /// ICRC register after the LRH and the covered base headers, varying bytes zero.
    icrc_reg: u32,
    /// A plain ACKNOWLEDGE (an AETH, no CETH): `bytes` with the IPv4 total length and
    /// checksum, the UDP length and the opcode it always has ...
    ack_bytes: [u8; BASE_HEADER_LEN],
    /// ... and `icrc_reg` with those bytes in: only the flags, the AckReq byte and the PSN
    /// are left to fold per packet.
    ack_reg: u32,
}

/// A plain ACKNOWLEDGE's frame: the base headers, its AETH and the ICRC.
const ACK_FRAME_LEN: usize = BASE_HEADER_LEN + super::aeth::HEADER_LEN + ICRC_LEN;

/// The repr with every field a template leaves to the packet cleared.
fn flow_of(repr: &RoceRepr) -> RoceRepr {
    RoceRepr {
        bth: bth::BthRepr {
            opcode: Opcode::SendOnly,
            solicited: false,
            migreq: false,
            pad_count: 0,
            fecn: false,
            becn: false,
            ack_req: false,
            psn: 0,
            ..repr.bth
        },
        feth: None,
        reth: None,
        aeth: None,
        immdt: None,
        ceth: None,
        ..*repr
    }
}

impl HeaderTemplate {
    /// A template for every packet that shares `repr`'s addresses, IPv4 fields, UDP source
    /// port, P_Key and destination QP (its opcode, flags, PSN and extension headers do not
    /// matter). Fails if those fields do not fit the wire (a DSCP over 63, a QPN over 24 bits).
    pub fn new(repr: &RoceRepr) -> Result<HeaderTemplate> {
        let flow = flow_of(repr);
        flow.validate(0)?;
        let mut bytes = [0u8; BASE_HEADER_LEN];
        flow.emit_headers(&mut bytes, 0)?;
        // Clear the per-packet fields: IPv4 total length and checksum, UDP length, BTH
        // opcode, flags, FECN/BECN, AckReq and PSN (the SEND ONLY emitted above wrote 0 in
        // most of them already).
        for at in [
            IP + 2,
            IP + 3,
            IP + 10,
            IP + 11,
            UDP + 4,
            UDP + 5,
            BTH,
            BTH + 1,
        ] {
            bytes[at] = 0;
        }
        bytes[BTH + 4] = 0;
        bytes[BTH + 8..BTH + 12].fill(0);
        let ip_sum = super::checksum::sum(0, &bytes[IP..UDP]);
        let mut covered = [0u8; COVERED];
        covered.copy_from_slice(&bytes[IP..BASE_HEADER_LEN]);
        for i in super::roce::ICRC_MASKED {
            covered[i] = 0xff;
        }
        let mut crc = Crc32::from_register(LRH_SEED);
        crc.update(&covered);
        let icrc_reg = crc.register();
        // A plain ACK's length is constant, and so are the fields that follow from it.
        let ack_ip_len = (ACK_FRAME_LEN - IP) as u16;
        let [len_hi, len_lo] = ack_ip_len.to_be_bytes();
        let [udp_hi, udp_lo] = (ack_ip_len - ipv4::HEADER_LEN as u16).to_be_bytes();
        let opcode = Opcode::Acknowledge.as_u8();
        let mut ack_bytes = bytes;
        ack_bytes[IP + 2..IP + 4].copy_from_slice(&[len_hi, len_lo]);
        let checksum = !super::checksum::fold(ip_sum + u32::from(ack_ip_len));
        ack_bytes[IP + 10..IP + 12].copy_from_slice(&checksum.to_be_bytes());
        ack_bytes[UDP + 4..UDP + 6].copy_from_slice(&[udp_hi, udp_lo]);
        ack_bytes[BTH] = opcode;
        let mut ack_reg = icrc_reg;
        for (table, byte) in DELTA.iter().zip([len_hi, len_lo, udp_hi, udp_lo, opcode]) {
            ack_reg ^= table[usize::from(byte)];
        }
        Ok(HeaderTemplate {
            flow,
            bytes,
            ip_sum,
            icrc_reg,
            ack_bytes,
            ack_reg,
        })
    }

    /// The repr the template was built from, with the per-packet fields cleared (SEND ONLY,
    /// PSN 0, no flags, no extension headers): a packet made from a copy of it, its per-packet
    /// fields set, [`HeaderTemplate::matches`] the template.
    #[inline]
    pub fn flow(&self) -> &RoceRepr {
        &self.flow
    }

    /// Whether `repr` belongs to this template's flow (every field the template fixes is
    /// equal), so that [`HeaderTemplate::emit`] may build its frame.
    pub fn matches(&self, repr: &RoceRepr) -> bool {
        let f = &self.flow;
        repr.bth.dest_qp == f.bth.dest_qp
            && repr.bth.pkey == f.bth.pkey
            && repr.src_port == f.src_port
            && repr.ip == f.ip
            && repr.dst_mac == f.dst_mac
            && repr.src_mac == f.src_mac
    }

    /// Writes the frame of `repr` with `payload_len` payload bytes into `buf` (at least
    /// [`RoceRepr::buffer_len`] bytes): the template's headers patched for this packet, the
    /// extension headers, the payload (written by `fill`, given exactly `payload_len` bytes),
    /// pad and ICRC. Returns the frame length.
    ///
    /// `repr` must [`HeaderTemplate::matches`] this template (checked). The checks are the
    /// ones that concern the packet itself: the extension headers present are those of the
    /// opcode and the payload length is one the opcode allows; fields the template fixed
    /// were checked when it was built, and the PSN is taken modulo 2^24.
    pub fn emit(
        &self,
        repr: &RoceRepr,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        // One pass of the CRC over the extension headers and the payload together.
        self.emit_folded(repr, payload_len, buf, |tail, ext, reg| {
            fill(&mut tail[ext..]);
            icrc::fold_tables(reg, tail)
        })
    }

    /// [`HeaderTemplate::emit`] where `fill` continues the ICRC itself, so that it can fold
    /// the payload in while it copies it, in one pass. It is given the frame after the base
    /// headers (`ext` bytes of extension headers, already written, then the payload's bytes to
    /// write) and the ICRC register after the base headers, and returns the register after the
    /// payload. Registers are the raw ones of [`Crc32::register`].
    pub fn emit_folded(
        &self,
        repr: &RoceRepr,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8], usize, u32) -> u32,
    ) -> Result<usize> {
        if !self.matches(repr) {
            return Err(Error::BadField {
                layer: Layer::Bth,
                field: "flow (not this template's)",
                value: u64::from(repr.bth.dest_qp),
            });
        }
        self.emit_fields(&PacketFields::of(repr), payload_len, buf, fill)
    }

    /// [`HeaderTemplate::emit_folded`] of the packet of this template's flow with `fields`:
    /// what a queue pair's transport hands out (it makes no packet of another flow, and so
    /// none that could fail [`HeaderTemplate::matches`]).
    #[inline]
    pub fn emit_fields(
        &self,
        fields: &PacketFields,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8], usize, u32) -> u32,
    ) -> Result<usize> {
        // The commonest opcodes written with the opcode a constant (`Opcode::with_common`),
        // as the receive path decodes them. (Callgrind, with the queue pair's `fill` inline
        // in each arm: a batched 64 B WRITE 1 928.4 -> 1 907.1 instructions, a lone one
        // 4 011 -> 3 951, a lone READ 4 383 -> 4 312; `emit64`, this function alone with the
        // tables' fold, 381 -> 386, the builds either side counted the same day.)
        fields.opcode.with_common(
            #[inline(always)]
            |opcode| self.emit_as(opcode, fields, payload_len, buf, fill),
        )
    }

    /// [`HeaderTemplate::emit_fields`] of `fields`, whose opcode is `opcode`.
    #[inline(always)]
    fn emit_as(
        &self,
        opcode: Opcode,
        fields: &PacketFields,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8], usize, u32) -> u32,
    ) -> Result<usize> {
        let ext = opcode.headers();
        if ext.feth != fields.feth.is_some()
            || ext.reth != fields.reth.is_some()
            || ext.aeth != fields.aeth.is_some()
            || ext.immdt != fields.immdt.is_some()
            || (fields.ceth.is_some() && (!opcode.may_carry_ceth() || !fields.becn))
        {
            // The full check names the missing or extra header.
            fields.with_flow(&self.flow).validate(payload_len)?;
        }
        if !ext.payload.allows(payload_len) {
            return Err(Error::BadPayloadLen {
                opcode: opcode.as_u8(),
                len: payload_len,
            });
        }
        let header_len = BASE_HEADER_LEN + opcode.ext_len() + fields.ceth_len();
        let pad = pad_for(payload_len);
        let total = header_len + payload_len + usize::from(pad) + ICRC_LEN;
        let ip_len = total - IP;
        if ip_len > usize::from(u16::MAX) {
            return Err(Error::BadLength {
                layer: Layer::Ipv4,
                value: ip_len,
                min: ipv4::HEADER_LEN,
                max: usize::from(u16::MAX),
            });
        }
        ensure_len(Layer::Buffer, total, buf.len())?;
        let frame = &mut buf[..total];

        // The base headers: copy, then patch.
        frame[..BASE_HEADER_LEN].copy_from_slice(&self.bytes);
        let ip_len = ip_len as u16;
        let udp_len = ip_len - ipv4::HEADER_LEN as u16;
        let checksum = !super::checksum::fold(self.ip_sum + u32::from(ip_len));
        frame[IP + 2..IP + 4].copy_from_slice(&ip_len.to_be_bytes());
        frame[IP + 10..IP + 12].copy_from_slice(&checksum.to_be_bytes());
        frame[UDP + 4..UDP + 6].copy_from_slice(&udp_len.to_be_bytes());
        let b = fields;
        let flags = u8::from(b.solicited) << 7 | u8::from(b.migreq) << 6 | pad << 4;
        let psn = (b.psn & bth::PSN_MASK).to_be_bytes();
        let varying = [
            (ip_len >> 8) as u8,
            ip_len as u8,
            (udp_len >> 8) as u8,
            udp_len as u8,
            opcode.as_u8(),
            flags,
            u8::from(b.ack_req) << 7,
            psn[1],
            psn[2],
            psn[3],
        ];
        frame[BTH] = varying[4];
        frame[BTH + 1] = flags;
        frame[BTH + 4] = u8::from(b.fecn) << 7 | u8::from(b.becn) << 6;
        frame[BTH + 8..BTH + 12].copy_from_slice(&[varying[6], psn[1], psn[2], psn[3]]);
        let mut reg = self.icrc_reg;
        for (table, byte) in DELTA.iter().zip(varying) {
            reg ^= table[usize::from(byte)];
        }

        fields.write_ext_headers(&mut frame[BASE_HEADER_LEN..header_len]);

        let (covered, trailer) = frame.split_at_mut(header_len + payload_len);
        let reg = fill(
            &mut covered[BASE_HEADER_LEN..],
            header_len - BASE_HEADER_LEN,
            reg,
        );
        let mut crc = Crc32::from_register(reg);
        let pad = usize::from(pad);
        // Most payloads need no pad; a `fill` of none still called `memset`.
        if pad != 0 {
            crc.update_repeat(0, pad);
            trailer[..pad].fill(0);
        }
        trailer[pad..].copy_from_slice(&icrc::to_wire(crc.finish()));
        Ok(total)
    }

    /// [`HeaderTemplate::emit_fields`] of an ACKNOWLEDGE (`fields.opcode`), which has no
    /// payload. A plain one (its AETH, no CETH), the responder's commonest packet, is written
    /// from prepared bytes: its lengths, IPv4 checksum and opcode are constant, and five of
    /// the ten varying bytes are left to fold into the ICRC; any other goes the general way.
    /// `fill` is as `emit_fields`'s, given the AETH (or AETH and CETH) to fold.
    ///
    /// Its own entry point, not an arm of `emit_fields`: there it changed the registers of
    /// the other arms (a batched 64 B WRITE +9.4 instructions, callgrind). Through it, an ACK
    /// is 119 instructions where it was about 210 (a lone 64 B WRITE 3 312 -> 3 225).
    pub fn emit_ack(
        &self,
        fields: &PacketFields,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8], usize, u32) -> u32,
    ) -> Result<usize> {
        const AETH_END: usize = BASE_HEADER_LEN + super::aeth::HEADER_LEN;
        if fields.opcode != Opcode::Acknowledge
            || fields.aeth.is_none()
            || fields.ceth.is_some()
            || fields.feth.is_some()
            || fields.reth.is_some()
            || fields.immdt.is_some()
        {
            return self.emit_other_ack(fields, buf, fill);
        }
        ensure_len(Layer::Buffer, ACK_FRAME_LEN, buf.len())?;
        let frame = &mut buf[..ACK_FRAME_LEN];
        frame[..BASE_HEADER_LEN].copy_from_slice(&self.ack_bytes);
        let b = fields;
        let flags = u8::from(b.solicited) << 7 | u8::from(b.migreq) << 6;
        let ack_req = u8::from(b.ack_req) << 7;
        let psn = (b.psn & bth::PSN_MASK).to_be_bytes();
        frame[BTH + 1] = flags;
        frame[BTH + 4] = u8::from(b.fecn) << 7 | u8::from(b.becn) << 6;
        frame[BTH + 8..BTH + 12].copy_from_slice(&[ack_req, psn[1], psn[2], psn[3]]);
        // The flags, the AckReq byte and the PSN: `VARYING`'s last five.
        let mut reg = self.ack_reg;
        for (table, byte) in DELTA[5..]
            .iter()
            .zip([flags, ack_req, psn[1], psn[2], psn[3]])
        {
            reg ^= table[usize::from(byte)];
        }
        fields.write_ext_headers(&mut frame[BASE_HEADER_LEN..AETH_END]);
        let (covered, trailer) = frame.split_at_mut(AETH_END);
        let reg = fill(
            &mut covered[BASE_HEADER_LEN..],
            super::aeth::HEADER_LEN,
            reg,
        );
        trailer.copy_from_slice(&icrc::to_wire(Crc32::from_register(reg).finish()));
        Ok(ACK_FRAME_LEN)
    }

    /// [`HeaderTemplate::emit_ack`] of an ACK that is not plain (with a CETH), or of another
    /// opcode: the general way, out of line, so that the plain ACK's path saves no registers
    /// for it.
    #[cold]
    #[inline(never)]
    fn emit_other_ack(
        &self,
        fields: &PacketFields,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8], usize, u32) -> u32,
    ) -> Result<usize> {
        self.emit_fields(fields, 0, buf, fill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{AethRepr, Syndrome};
    use crate::bth::BthRepr;
    use crate::bth::Payload;
    use crate::immdt::ImmDtRepr;
    use crate::ipv4::Ecn;
    use crate::reth::RethRepr;
    use crate::roce::{RoceIpv4, parse_frame};
    use crate::{EthernetAddress, FethRepr, Placement, Selectivity};
    use core::net::Ipv4Addr;
    use proptest::prelude::*;

    fn flow() -> RoceRepr {
        RoceRepr {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 0xa]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 0, 0xb]),
            ip: RoceIpv4 {
                src_addr: Ipv4Addr::new(10, 9, 0, 1),
                dst_addr: Ipv4Addr::new(10, 9, 0, 2),
                dscp: 26,
                ecn: Ecn::Ect0,
                ident: 0,
                dont_frag: true,
                ttl: 64,
            },
            src_port: 0xc123,
            bth: BthRepr {
                opcode: Opcode::SendOnly,
                solicited: false,
                migreq: false,
                pad_count: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: 0x22,
                ack_req: false,
                psn: 0,
            },
            feth: None,
            reth: None,
            aeth: None,
            immdt: None,
            ceth: None,
        }
    }

    /// `repr` with the extension headers its opcode needs (fixed values).
    fn with_headers(mut repr: RoceRepr) -> RoceRepr {
        let h = repr.bth.opcode.headers();
        repr.feth = h.feth.then_some(FethRepr {
            placement: Placement {
                global_visibility: true,
                persistence: true,
            },
            selectivity: Selectivity::MemoryRegion,
        });
        repr.reth = h.reth.then_some(RethRepr {
            virtual_addr: 0x7f00_1234_5678,
            rkey: 0xabcd_ef01,
            dma_len: 4096,
        });
        repr.aeth = h.aeth.then_some(AethRepr {
            syndrome: Syndrome::Ack { credit_code: 31 },
            msn: 0x12_3456,
        });
        repr.immdt = h.immdt.then_some(ImmDtRepr {
            data: [0xde, 0xad, 0xbe, 0xef],
        });
        repr
    }

    fn payload_len_for(opcode: Opcode, len: usize) -> usize {
        match opcode.headers().payload {
            Payload::None => 0,
            Payload::Any => len,
            Payload::Exact(n) => n,
        }
    }

    /// The template's frame is the generic emitter's, byte for byte.
    fn same_as_generic(repr: &RoceRepr, payload: &[u8]) {
        let t = HeaderTemplate::new(repr).unwrap();
        let mut generic = vec![0u8; repr.buffer_len(payload.len())];
        let n = repr.emit(&mut generic, payload).unwrap();
        let mut fast = vec![0xaau8; repr.buffer_len(payload.len()) + 7];
        let m = t
            .emit(repr, payload.len(), &mut fast, |d| {
                d.copy_from_slice(payload)
            })
            .unwrap();
        assert_eq!(m, n);
        assert_eq!(&fast[..m], &generic[..n], "{:?}", repr.bth.opcode);
        assert!(fast[m..].iter().all(|&b| b == 0xaa), "wrote past the frame");
        let (parsed, body) = parse_frame(&fast[..m]).unwrap();
        assert_eq!(body, payload);
        assert_eq!(parsed.bth.psn, repr.bth.psn);

        // The folded path, with a kernel of its own (a byte at a time) and the payload folded
        // by `fill` as it is written: the same frame.
        fn bytewise(reg: u32, data: &[u8]) -> u32 {
            super::icrc::update_bytewise(reg, data)
        }
        let mut folded = vec![0x55u8; m + 7];
        let k = t
            .emit_folded(repr, payload.len(), &mut folded, |tail, ext, reg| {
                tail[ext..].copy_from_slice(payload);
                bytewise(bytewise(reg, &tail[..ext]), payload)
            })
            .unwrap();
        assert_eq!(&folded[..k], &generic[..n], "folded {:?}", repr.bth.opcode);
        assert!(
            folded[k..].iter().all(|&b| b == 0x55),
            "wrote past the frame"
        );

        // The ACK's entry point: a plain ACK from its prepared bytes, anything else the
        // general way; the same frame either way.
        if payload.is_empty() {
            let mut ack = vec![0x33u8; m + 7];
            let k = t
                .emit_ack(&PacketFields::of(repr), &mut ack, |tail, _, reg| {
                    bytewise(reg, tail)
                })
                .unwrap();
            assert_eq!(&ack[..k], &generic[..n], "emit_ack {:?}", repr.bth.opcode);
            assert!(ack[k..].iter().all(|&b| b == 0x33), "wrote past the frame");
        }
    }

    #[test]
    fn every_opcode_matches_the_generic_emitter() {
        for opcode in Opcode::ALL {
            for len in [0usize, 1, 3, 64, 200, 4096] {
                let mut r = flow();
                r.bth.opcode = opcode;
                r.bth.psn = 0xfe_dcba;
                r.bth.ack_req = len % 2 == 1;
                r.bth.solicited = len == 3;
                let r = with_headers(r);
                let payload: Vec<u8> = (0..payload_len_for(opcode, len))
                    .map(|i| (i * 7 + 1) as u8)
                    .collect();
                same_as_generic(&r, &payload);
            }
        }
    }

    #[test]
    fn frame_len_is_the_emitted_length_for_every_opcode() {
        let mut buf = vec![0u8; 8192];
        for opcode in Opcode::ALL {
            for len in (0..=70).chain([255, 256, 1024, 4096]) {
                let mut r = flow();
                r.bth.opcode = opcode;
                let r = with_headers(r);
                let payload = vec![0x5a; payload_len_for(opcode, len)];
                let emitted = r.emit(&mut buf, &payload).unwrap();
                assert_eq!(
                    crate::roce::frame_len(opcode, payload.len()),
                    emitted,
                    "{opcode:?}, {} bytes",
                    payload.len()
                );
            }
        }
    }

    #[test]
    fn each_flow_field_changed_alone_is_another_flow() {
        let t = HeaderTemplate::new(&flow()).unwrap();
        type Change = (&'static str, fn(&mut RoceRepr));
        let changes: [Change; 12] = [
            ("src_mac", |r| r.src_mac.0[5] ^= 1),
            ("dst_mac", |r| r.dst_mac.0[0] ^= 0x10),
            ("src_addr", |r| r.ip.src_addr = Ipv4Addr::new(10, 0, 0, 9)),
            ("dst_addr", |r| r.ip.dst_addr = Ipv4Addr::new(10, 0, 0, 9)),
            ("dscp", |r| r.ip.dscp ^= 1),
            ("ecn", |r| {
                r.ip.ecn = if r.ip.ecn == Ecn::Ce {
                    Ecn::Ect0
                } else {
                    Ecn::Ce
                }
            }),
            ("ident", |r| r.ip.ident ^= 0x100),
            ("dont_frag", |r| r.ip.dont_frag = !r.ip.dont_frag),
            ("ttl", |r| r.ip.ttl ^= 1),
            ("src_port", |r| r.src_port ^= 1),
            ("pkey", |r| r.bth.pkey ^= 1),
            ("dest_qp", |r| r.bth.dest_qp ^= 1),
        ];
        for (name, change) in changes {
            let mut r = flow();
            change(&mut r);
            assert_ne!(r, flow(), "{name}: the change changes nothing");
            assert!(!t.matches(&r), "{name}");
        }
        // What varies per packet does not make another flow.
        let mut r = flow();
        r.bth.opcode = Opcode::RdmaWriteOnly;
        r.bth.psn = 0x12_3456;
        r.bth.ack_req = true;
        r.bth.solicited = true;
        r.bth.becn = true;
        assert!(t.matches(&with_headers(r)));
    }

    #[test]
    fn foreign_flows_and_wrong_headers_are_refused() {
        let t = HeaderTemplate::new(&flow()).unwrap();
        let mut buf = [0u8; 256];
        let mut other = flow();
        other.bth.dest_qp = 0x23;
        assert!(!t.matches(&other));
        assert!(t.emit(&other, 0, &mut buf, |_| {}).is_err());
        let mut other = flow();
        other.ip.ttl = 63;
        assert!(t.emit(&other, 0, &mut buf, |_| {}).is_err());
        // A WRITE ONLY without its RETH, an ACK with a payload, a short buffer.
        let mut w = flow();
        w.bth.opcode = Opcode::RdmaWriteOnly;
        assert!(matches!(
            t.emit(&w, 8, &mut buf, |_| {}),
            Err(Error::HeaderMismatch { .. })
        ));
        let ack = with_headers(RoceRepr {
            bth: BthRepr {
                opcode: Opcode::Acknowledge,
                ..flow().bth
            },
            ..flow()
        });
        assert!(matches!(
            t.emit(&ack, 4, &mut buf, |_| {}),
            Err(Error::BadPayloadLen { .. })
        ));
        let mut small = [0u8; 20];
        assert!(t.emit(&flow(), 0, &mut small, |_| {}).is_err());
        // A flow whose fields do not fit the wire has no template.
        let mut bad = flow();
        bad.ip.dscp = 64;
        assert!(HeaderTemplate::new(&bad).is_err());
    }

    /// An ACK's every field that varies per packet, through `emit_ack`: the plain ACK's
    /// prepared path, and with a CETH the general one; each frame the generic emitter's.
    #[test]
    fn acks_from_the_prepared_bytes_are_the_generic_emitter_s() {
        use crate::ceth::{CethRepr, Level};
        let mut ack = flow();
        ack.bth.opcode = Opcode::Acknowledge;
        let syndromes = [
            Syndrome::Ack { credit_code: 0 },
            Syndrome::Ack { credit_code: 31 },
            Syndrome::RnrNak { timer_code: 14 },
            Syndrome::Nak(crate::aeth::NakCode::RemoteAccessError),
        ];
        for (i, syndrome) in syndromes.into_iter().enumerate() {
            for flags in 0u8..32 {
                let mut r = ack;
                r.bth.psn = [0, 1, 0x80_0000, 0xff_ffff][i] ^ u32::from(flags) << 9;
                r.bth.ack_req = flags & 1 != 0;
                r.bth.solicited = flags & 2 != 0;
                r.bth.migreq = flags & 4 != 0;
                r.bth.fecn = flags & 8 != 0;
                r.bth.becn = flags & 16 != 0;
                r.aeth = Some(AethRepr {
                    syndrome,
                    msn: 0x5a_5a5a ^ u32::from(flags),
                });
                same_as_generic(&r, &[]);
                if r.bth.becn {
                    r.ceth = Some(CethRepr {
                        level: Level::Moderate,
                        marked: flags,
                        window: 32,
                        ..CethRepr::default()
                    });
                    same_as_generic(&r, &[]);
                }
            }
        }
        // Too short a buffer: refused, nothing written.
        let t = HeaderTemplate::new(&flow()).unwrap();
        let mut r = ack;
        r.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack { credit_code: 3 },
            msn: 1,
        });
        let mut short = [0x77u8; ACK_FRAME_LEN - 1];
        let fields = PacketFields::of(&r);
        assert!(t.emit_ack(&fields, &mut short, |_, _, reg| reg).is_err());
        assert!(short.iter().all(|&b| b == 0x77));
    }

    proptest! {
        #[test]
        fn prop_template_equals_generic(
            op in 0usize..Opcode::ALL.len(),
            len in 0usize..300,
            psn in 0u32..1 << 24,
            dest_qp in 0u32..1 << 24,
            flags in any::<[bool; 5]>(),
            pkey in 1u16..,
            src_port in any::<u16>(),
            dscp in 0u8..64,
            ttl in any::<u8>(),
            ident in any::<u16>(),
            ips in any::<(u32, u32)>(),
            seed in any::<u8>(),
        ) {
            let mut r = flow();
            r.bth.opcode = Opcode::ALL[op];
            r.bth.psn = psn;
            r.bth.dest_qp = dest_qp;
            r.bth.pkey = pkey;
            [r.bth.ack_req, r.bth.solicited, r.bth.migreq, r.bth.fecn, r.bth.becn] = flags;
            r.src_port = src_port;
            r.ip.dscp = dscp;
            r.ip.ttl = ttl;
            r.ip.ident = ident;
            r.ip.src_addr = Ipv4Addr::from(ips.0);
            r.ip.dst_addr = Ipv4Addr::from(ips.1);
            let r = with_headers(r);
            let payload: Vec<u8> = (0..payload_len_for(r.bth.opcode, len))
                .map(|i| (i as u8).wrapping_mul(seed))
                .collect();
            same_as_generic(&r, &payload);
        }
    }
}
