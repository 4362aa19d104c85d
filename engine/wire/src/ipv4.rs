//! IPv4 header (RFC 791), with the DSCP/ECN split of the old TOS byte (RFC 2474, RFC 3168).
//!
//! RoCEv2 rides on IPv4/UDP. Two behaviours of Portico live in this header:
//! congestion control reads the ECN field (a switch marks CE, the receiver answers
//! with a CNP), and traffic classes are chosen by DSCP. Both sit in the byte that
//! the ICRC masks out, so switches may rewrite them without breaking the packet;
//! the header checksum, which does cover them, is recomputed hop by hop.

use core::net::Ipv4Addr;

use super::{Error, Layer, Result, be, checksum, ensure_len};

/// Explicit Congestion Notification codepoints (the low two bits of byte 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct,
    /// ECN-capable transport, codepoint ECT(1).
    Ect1,
    /// ECN-capable transport, codepoint ECT(0); what RoCE senders normally use.
    Ect0,
    /// Congestion experienced, set by a switch instead of dropping.
    Ce,
}

impl Ecn {
    /// Decode the two low bits of `bits`.
    pub const fn from_bits(bits: u8) -> Ecn {
        match bits & 0b11 {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0b00,
            Ecn::Ect1 => 0b01,
            Ecn::Ect0 => 0b10,
            Ecn::Ce => 0b11,
        }
    }

    /// True for ECT(0), ECT(1) and CE: the sender declared it reacts to marks.
    pub const fn is_ect(self) -> bool {
        !matches!(self, Ecn::NotEct)
    }
}

/// IP protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

mod field {
    use crate::Field;

    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC_ADDR: Field = 12..16;
    pub const DST_ADDR: Field = 16..20;
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;
/// Largest header length the IHL field can express (15 words).
pub const MAX_HEADER_LEN: usize = 60;

const FLAG_DONT_FRAG: u16 = 0x4000;
const FLAG_MORE_FRAGS: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A read/write view of an IPv4 packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Ensure the fixed header, the options announced by IHL and the whole
    /// packet announced by the total length are present, and that IHL and total
    /// length agree with each other.
    ///
    /// Bytes after the total length (Ethernet padding) are allowed and ignored.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        ensure_len(Layer::Ipv4, HEADER_LEN, len)?;
        let header_len = self.header_len();
        if header_len < HEADER_LEN {
            return Err(Error::BadLength {
                layer: Layer::Ipv4,
                value: header_len,
                min: HEADER_LEN,
                max: MAX_HEADER_LEN,
            });
        }
        ensure_len(Layer::Ipv4, header_len, len)?;
        let total_len = usize::from(self.total_len());
        if total_len < header_len {
            return Err(Error::BadLength {
                layer: Layer::Ipv4,
                value: total_len,
                min: header_len,
                max: usize::from(u16::MAX),
            });
        }
        ensure_len(Layer::Ipv4, total_len, len)
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// Differentiated Services codepoint (upper six bits of byte 1).
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.buffer.as_ref()[field::DSCP_ECN])
    }

    /// The whole byte 1 (the former TOS), as the ICRC mask sees it.
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    /// Total length of header and payload in bytes.
    pub fn total_len(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::LENGTH])
    }

    pub fn ident(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::IDENT])
    }

    pub fn dont_frag(&self) -> bool {
        be::read_u16(&self.buffer.as_ref()[field::FLG_OFF]) & FLAG_DONT_FRAG != 0
    }

    pub fn more_frags(&self) -> bool {
        be::read_u16(&self.buffer.as_ref()[field::FLG_OFF]) & FLAG_MORE_FRAGS != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    pub fn frag_offset(&self) -> u16 {
        (be::read_u16(&self.buffer.as_ref()[field::FLG_OFF]) & FRAG_OFFSET_MASK) << 3
    }

    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be::read_u32(&self.buffer.as_ref()[field::SRC_ADDR]))
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(be::read_u32(&self.buffer.as_ref()[field::DST_ADDR]))
    }

    /// The header bytes including options, clamped to the buffer so that it
    /// cannot panic even if a setter changed IHL after `check_len`.
    pub fn header(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        &data[..self.header_len().min(data.len())]
    }

    /// The checksum the header should carry (computed with the field as zero).
    pub fn compute_checksum(&self) -> u16 {
        let header = self.header();
        let acc = checksum::sum(0, &header[..field::CHECKSUM.start]);
        let acc = checksum::sum(acc, &header[field::CHECKSUM.end..]);
        !checksum::fold(acc)
    }

    /// True if the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(0, self.header())) == 0xffff
    }

    /// The payload as delimited by IHL and total length, clamped to the buffer.
    pub fn payload(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(data.len());
        let start = self.header_len().min(end);
        &data[start..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_version(&mut self, version: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0x0f) | (version << 4);
    }

    /// Set IHL from a length in bytes (rounded down to whole words, at most 60).
    pub fn set_header_len(&mut self, len: usize) {
        let words = (len / 4).min(15) as u8;
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0xf0) | words;
    }

    /// Set the DSCP (low six bits of `dscp` are used).
    pub fn set_dscp(&mut self, dscp: u8) {
        let b = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *b = (*b & 0b11) | (dscp << 2);
    }

    pub fn set_ecn(&mut self, ecn: Ecn) {
        let b = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *b = (*b & !0b11) | ecn.bits();
    }

    pub fn set_total_len(&mut self, len: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::LENGTH], len);
    }

    pub fn set_ident(&mut self, ident: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::IDENT], ident);
    }

    /// Clear the flags and the fragment offset.
    pub fn clear_flags(&mut self) {
        be::write_u16(&mut self.buffer.as_mut()[field::FLG_OFF], 0);
    }

    fn update_flg_off(&mut self, f: impl FnOnce(u16) -> u16) {
        let raw = be::read_u16(&self.buffer.as_ref()[field::FLG_OFF]);
        be::write_u16(&mut self.buffer.as_mut()[field::FLG_OFF], f(raw));
    }

    pub fn set_dont_frag(&mut self, value: bool) {
        self.update_flg_off(|raw| {
            if value {
                raw | FLAG_DONT_FRAG
            } else {
                raw & !FLAG_DONT_FRAG
            }
        });
    }

    pub fn set_more_frags(&mut self, value: bool) {
        self.update_flg_off(|raw| {
            if value {
                raw | FLAG_MORE_FRAGS
            } else {
                raw & !FLAG_MORE_FRAGS
            }
        });
    }

    /// Set the fragment offset in bytes (rounded down to 8-byte units).
    pub fn set_frag_offset(&mut self, offset: u16) {
        self.update_flg_off(|raw| (raw & !FRAG_OFFSET_MASK) | (offset >> 3));
    }

    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    pub fn set_protocol(&mut self, protocol: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = protocol;
    }

    pub fn set_checksum(&mut self, checksum: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::CHECKSUM], checksum);
    }

    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        be::write_u32(&mut self.buffer.as_mut()[field::SRC_ADDR], addr.to_bits());
    }

    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        be::write_u32(&mut self.buffer.as_mut()[field::DST_ADDR], addr.to_bits());
    }

    /// Compute and store the header checksum; call after every other setter.
    pub fn fill_checksum(&mut self) {
        let checksum = self.compute_checksum();
        self.set_checksum(checksum);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.buffer.as_ref().len();
        let end = usize::from(self.total_len()).min(len);
        let start = self.header_len().min(end);
        &mut self.buffer.as_mut()[start..end]
    }
}

/// The meaningful fields of an option-less, unfragmented IPv4 header.
///
/// Version, IHL, total length and checksum are derived; the MF flag and the
/// fragment offset are always zero (RoCE never fragments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: u8,
    /// Six-bit DSCP.
    pub dscp: u8,
    pub ecn: Ecn,
    pub ident: u16,
    pub dont_frag: bool,
    pub ttl: u8,
    /// Bytes after the header; total length is `HEADER_LEN + payload_len`.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Parse a checked view, verifying the header checksum.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Ipv4Repr> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(Error::BadChecksum {
                layer: Layer::Ipv4,
                expected: packet.compute_checksum(),
                found: packet.checksum(),
            });
        }
        Self::parse_ignoring_checksum(packet)
    }

    /// Parse a view without looking at the header checksum, for buffers whose
    /// checksum the NIC already verified.
    pub fn parse_ignoring_checksum<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&T>,
    ) -> Result<Ipv4Repr> {
        packet.check_len()?;
        if packet.version() != 4 {
            return Err(Error::BadVersion {
                layer: Layer::Ipv4,
                version: packet.version(),
            });
        }
        if packet.header_len() != HEADER_LEN {
            return Err(Error::BadField {
                layer: Layer::Ipv4,
                field: "header_len (options are not supported)",
                value: packet.header_len() as u64,
            });
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(Error::BadField {
                layer: Layer::Ipv4,
                field: "flags/frag_offset (fragments are not supported)",
                value: u64::from(be::read_u16(&packet.buffer.as_ref()[field::FLG_OFF])),
            });
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            dscp: packet.dscp(),
            ecn: packet.ecn(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
            ttl: packet.ttl(),
            payload_len: packet.payload().len(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Check the fields that have fewer bits on the wire than in the struct.
    pub fn validate(&self) -> Result<()> {
        if self.dscp > 0x3f {
            return Err(Error::BadField {
                layer: Layer::Ipv4,
                field: "dscp",
                value: u64::from(self.dscp),
            });
        }
        let max = usize::from(u16::MAX) - HEADER_LEN;
        if self.payload_len > max {
            return Err(Error::BadLength {
                layer: Layer::Ipv4,
                value: self.payload_len,
                min: 0,
                max,
            });
        }
        Ok(())
    }

    /// Write the header, checksum included. The view must hold at least
    /// [`HEADER_LEN`] bytes; the payload is the caller's business. Out-of-range
    /// values are truncated to their wire width (see [`Ipv4Repr::validate`]).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_version(4);
        packet.set_header_len(HEADER_LEN);
        packet.set_dscp(self.dscp);
        packet.set_ecn(self.ecn);
        packet.set_total_len((HEADER_LEN + self.payload_len).min(usize::from(u16::MAX)) as u16);
        packet.set_ident(self.ident);
        packet.clear_flags();
        packet.set_dont_frag(self.dont_frag);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The IPv4 header of the ConnectX-4 Lx CNP in the reference note, followed
    /// by 40 bytes of its UDP datagram (zeroed here; only the length matters).
    fn cnp_ip() -> [u8; 60] {
        let mut b = [0u8; 60];
        b[..20].copy_from_slice(&[
            0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00,
            0x11, 0x01, 0x0a, 0x00, 0x12, 0x01,
        ]);
        b
    }

    fn cnp_repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 0, 17, 1),
            dst_addr: Ipv4Addr::new(10, 0, 18, 1),
            protocol: PROTOCOL_UDP,
            dscp: 48,
            ecn: Ecn::Ect0,
            ident: 0x718c,
            dont_frag: true,
            ttl: 64,
            payload_len: 40,
        }
    }

    #[test]
    fn test_deconstruct() {
        let bytes = cnp_ip();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.dscp(), 48);
        assert_eq!(p.ecn(), Ecn::Ect0);
        assert_eq!(p.total_len(), 60);
        assert_eq!(p.ident(), 0x718c);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert_eq!(p.frag_offset(), 0);
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), 17);
        assert_eq!(p.checksum(), 0x9161);
        assert!(p.verify_checksum());
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 0, 17, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(10, 0, 18, 1));
        assert_eq!(p.payload().len(), 40);
    }

    #[test]
    fn test_parse() {
        let bytes = cnp_ip();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), cnp_repr());
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0u8; 60];
        cnp_repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, cnp_ip());
    }

    #[test]
    fn test_ce_marking_changes_only_ecn_and_checksum() {
        let mut bytes = cnp_ip();
        let mut p = Packet::new_checked(&mut bytes[..]).unwrap();
        p.set_ecn(Ecn::Ce);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_eq!(p.dscp(), 48);
        assert_eq!(p.tos(), 0xc3);
    }

    #[test]
    fn test_bad_checksum() {
        let mut bytes = cnp_ip();
        bytes[8] = 63; // a router decremented TTL without fixing the checksum
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(
            Ipv4Repr::parse(&p).unwrap_err(),
            Error::BadChecksum {
                layer: Layer::Ipv4,
                expected: 0x9261,
                found: 0x9161
            }
        );
    }

    #[test]
    fn test_length_errors() {
        let bytes = cnp_ip();
        assert_eq!(
            Packet::new_checked(&bytes[..19]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Ipv4,
                need: 20,
                have: 19
            }
        );
        assert_eq!(
            Packet::new_checked(&bytes[..59]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Ipv4,
                need: 60,
                have: 59
            }
        );
        // IHL of 4 words is shorter than the fixed header.
        let mut short_ihl = bytes;
        short_ihl[0] = 0x44;
        assert!(matches!(
            Packet::new_checked(&short_ihl[..]).unwrap_err(),
            Error::BadLength {
                layer: Layer::Ipv4,
                value: 16,
                ..
            }
        ));
        // IHL announces 24 bytes of header but total length says 22.
        let mut mismatch = bytes;
        mismatch[0] = 0x46;
        mismatch[2..4].copy_from_slice(&22u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&mismatch[..]).unwrap_err(),
            Error::BadLength {
                layer: Layer::Ipv4,
                value: 22,
                min: 24,
                max: 65535
            }
        );
        // IHL of 15 words does not fit in a 40-byte buffer.
        let mut long_ihl = bytes;
        long_ihl[0] = 0x4f;
        assert_eq!(
            Packet::new_checked(&long_ihl[..40]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Ipv4,
                need: 60,
                have: 40
            }
        );
    }

    #[test]
    fn test_options_and_fragments_rejected() {
        let mut with_options = [0u8; 64];
        with_options[0] = 0x46;
        with_options[2..4].copy_from_slice(&64u16.to_be_bytes());
        let mut p = Packet::new_checked(&mut with_options[..]).unwrap();
        p.fill_checksum();
        let p = Packet::new_checked(&with_options[..]).unwrap();
        assert_eq!(p.payload().len(), 40);
        assert!(matches!(
            Ipv4Repr::parse(&p).unwrap_err(),
            Error::BadField {
                layer: Layer::Ipv4,
                value: 24,
                ..
            }
        ));

        let mut frag = cnp_ip();
        let mut p = Packet::new_checked(&mut frag[..]).unwrap();
        p.set_more_frags(true);
        p.fill_checksum();
        let p = Packet::new_checked(&frag[..]).unwrap();
        assert!(matches!(
            Ipv4Repr::parse(&p).unwrap_err(),
            Error::BadField {
                layer: Layer::Ipv4,
                ..
            }
        ));
    }

    #[test]
    fn test_trailing_padding_ignored() {
        let mut bytes = [0u8; 80];
        bytes[..60].copy_from_slice(&cnp_ip());
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(p.payload().len(), 40);
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), cnp_repr());
    }

    #[test]
    fn test_validate() {
        let mut r = cnp_repr();
        assert_eq!(r.validate(), Ok(()));
        r.dscp = 64;
        assert!(r.validate().is_err());
        r.dscp = 0;
        r.payload_len = 65516;
        assert!(r.validate().is_err());
    }

    fn ecn_strategy() -> impl Strategy<Value = Ecn> {
        (0u8..4).prop_map(Ecn::from_bits)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(
            src in any::<u32>(), dst in any::<u32>(), protocol in any::<u8>(),
            dscp in 0u8..64, ecn in ecn_strategy(), ident in any::<u16>(),
            dont_frag in any::<bool>(), ttl in any::<u8>(), payload_len in 0usize..64,
        ) {
            let repr = Ipv4Repr {
                src_addr: Ipv4Addr::from(src), dst_addr: Ipv4Addr::from(dst), protocol, dscp, ecn,
                ident, dont_frag, ttl, payload_len,
            };
            let mut bytes = [0u8; HEADER_LEN + 64];
            let buf = &mut bytes[..HEADER_LEN + payload_len];
            repr.emit(&mut Packet::new_unchecked(&mut *buf));
            let p = Packet::new_checked(&*buf).unwrap();
            prop_assert!(p.verify_checksum());
            prop_assert_eq!(Ipv4Repr::parse(&p).unwrap(), repr);
        }

        #[test]
        fn prop_any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = Ipv4Repr::parse(&p);
                let _ = (p.payload(), p.header(), p.verify_checksum(), p.frag_offset());
            }
        }
    }
}
