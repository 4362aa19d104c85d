//! UDP header (RFC 768).
//!
//! RoCEv2 packets are UDP datagrams to port 4791. The source port carries ECMP
//! entropy (switches hash on it to spread queue pairs over paths), and the
//! checksum is normally zero ("none") because the ICRC already protects the
//! transport headers and payload. A non-zero checksum is still verified, since
//! a receiving IP stack would drop a datagram whose checksum is wrong.

use core::net::Ipv4Addr;

use super::ipv4::PROTOCOL_UDP;
use super::{Error, Layer, Result, be, checksum, ensure_len};

/// The IANA port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;

/// The source-port range Linux uses for RoCEv2 flow entropy
/// (`IB_ROCE_UDP_ENCAP_VALID_PORT_MIN..=MAX`).
pub const ROCEV2_ENTROPY_PORTS: core::ops::RangeInclusive<u16> = 0xc000..=0xffff;

mod field {
    use crate::Field;

    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

/// A read/write view of a UDP datagram.
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

    /// Ensure the header is present, the length field covers at least the
    /// header, and the buffer holds the whole datagram it announces.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        ensure_len(Layer::Udp, HEADER_LEN, len)?;
        let declared = usize::from(self.len());
        if declared < HEADER_LEN {
            return Err(Error::BadLength {
                layer: Layer::Udp,
                value: declared,
                min: HEADER_LEN,
                max: usize::from(u16::MAX),
            });
        }
        ensure_len(Layer::Udp, declared, len)
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn src_port(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::SRC_PORT])
    }

    pub fn dst_port(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::DST_PORT])
    }

    /// The length field: header plus payload, in bytes.
    pub fn len(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::LENGTH])
    }

    /// True if the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    pub fn checksum(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    /// The datagram as delimited by the length field, clamped to the buffer.
    fn datagram(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        &data[..usize::from(self.len()).min(data.len())]
    }

    /// The payload as delimited by the length field, clamped to the buffer.
    pub fn payload(&self) -> &[u8] {
        let datagram = self.datagram();
        &datagram[HEADER_LEN.min(datagram.len())..]
    }

    /// The checksum the datagram should carry between `src` and `dst`.
    /// Never returns 0: a computed zero is sent as 0xffff (RFC 768).
    pub fn compute_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u16 {
        let datagram = self.datagram();
        let mut acc = pseudo_header_sum(src, dst, datagram.len());
        acc = checksum::sum(acc, &datagram[..field::CHECKSUM.start.min(datagram.len())]);
        acc = checksum::sum(acc, &datagram[HEADER_LEN.min(datagram.len())..]);
        match !checksum::fold(acc) {
            0 => 0xffff,
            sum => sum,
        }
    }

    /// True if the checksum is absent (zero) or correct.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        self.checksum() == 0 || self.checksum() == self.compute_checksum(src, dst)
    }
}

fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: usize) -> u32 {
    let mut acc = checksum::sum(0, &src.octets());
    acc = checksum::sum(acc, &dst.octets());
    acc = acc.wrapping_add(u32::from(PROTOCOL_UDP));
    acc.wrapping_add(udp_len as u32 & 0xffff)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_port(&mut self, port: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::SRC_PORT], port);
    }

    pub fn set_dst_port(&mut self, port: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::DST_PORT], port);
    }

    pub fn set_len(&mut self, len: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::LENGTH], len);
    }

    pub fn set_checksum(&mut self, checksum: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::CHECKSUM], checksum);
    }

    /// Compute and store the checksum; the payload must already be in place.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        let checksum = self.compute_checksum(src, dst);
        self.set_checksum(checksum);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.buffer.as_ref().len();
        let end = usize::from(self.len()).min(len);
        &mut self.buffer.as_mut()[HEADER_LEN.min(end)..end]
    }
}

/// The meaningful fields of a UDP header. The length is derived from
/// `payload_len`; [`UdpRepr::emit`] writes a zero checksum, as RoCEv2 senders do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload_len: usize,
}

impl UdpRepr {
    /// Parse a view, verifying a non-zero checksum against the IPv4 addresses.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&T>,
        src_addr: Ipv4Addr,
        dst_addr: Ipv4Addr,
    ) -> Result<UdpRepr> {
        packet.check_len()?;
        if !packet.verify_checksum(src_addr, dst_addr) {
            return Err(Error::BadChecksum {
                layer: Layer::Udp,
                expected: packet.compute_checksum(src_addr, dst_addr),
                found: packet.checksum(),
            });
        }
        Ok(Self::parse_ignoring_checksum(packet))
    }

    /// Read the fields of a view whose `check_len` succeeded, ignoring the checksum.
    pub fn parse_ignoring_checksum<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> UdpRepr {
        UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: packet.payload().len(),
        }
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn validate(&self) -> Result<()> {
        let max = usize::from(u16::MAX) - HEADER_LEN;
        if self.payload_len > max {
            return Err(Error::BadLength {
                layer: Layer::Udp,
                value: self.payload_len,
                min: 0,
                max,
            });
        }
        Ok(())
    }

    /// Write the header with a zero checksum. The view must hold at least
    /// [`HEADER_LEN`] bytes; call [`Packet::fill_checksum`] afterwards if a
    /// checksum is wanted.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len((HEADER_LEN + self.payload_len).min(usize::from(u16::MAX)) as u16);
        packet.set_checksum(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 17, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 18, 1);

    /// UDP header of the CNP in the reference note plus 4 of its 32 payload bytes
    /// (the length field says 40; the view below is cut to match).
    static CNP_UDP: [u8; 12] = [
        0x00, 0x00, 0x12, 0xb7, 0x00, 0x0c, 0x00, 0x00, // sport 0, dport 4791, len 12, csum 0
        0x81, 0x00, 0xff, 0xff,
    ];

    /// A datagram with a real checksum, computed independently with Python
    /// (one's-complement sum over pseudo-header 10.0.17.1 > 10.0.18.1 proto 17).
    static WITH_CHECKSUM: [u8; 12] = [
        0xc0, 0x01, 0x12, 0xb7, 0x00, 0x0c, 0x58, 0x7e, 0xde, 0xad, 0xbe, 0xef,
    ];

    #[test]
    fn test_deconstruct() {
        let p = Packet::new_checked(&CNP_UDP[..]).unwrap();
        assert_eq!(p.src_port(), 0);
        assert_eq!(p.dst_port(), ROCEV2_PORT);
        assert_eq!(p.len(), 12);
        assert_eq!(p.checksum(), 0);
        assert!(p.verify_checksum(SRC, DST), "zero means no checksum");
        assert_eq!(p.payload(), &[0x81, 0x00, 0xff, 0xff]);
    }

    #[test]
    fn test_parse_emit() {
        let p = Packet::new_checked(&CNP_UDP[..]).unwrap();
        let repr = UdpRepr::parse(&p, SRC, DST).unwrap();
        assert_eq!(
            repr,
            UdpRepr {
                src_port: 0,
                dst_port: 4791,
                payload_len: 4
            }
        );
        let mut bytes = [0u8; 12];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        bytes[8..].copy_from_slice(&CNP_UDP[8..]);
        assert_eq!(bytes, CNP_UDP);
    }

    #[test]
    fn test_checksum() {
        let p = Packet::new_checked(&WITH_CHECKSUM[..]).unwrap();
        assert_eq!(p.compute_checksum(SRC, DST), 0x587e);
        assert!(p.verify_checksum(SRC, DST));
        assert!(!p.verify_checksum(SRC, Ipv4Addr::new(10, 0, 18, 2)));
        // Swapping the addresses keeps the sum: one's-complement addition commutes.
        assert!(UdpRepr::parse(&p, DST, SRC).is_ok());
        assert_eq!(
            UdpRepr::parse(&p, SRC, Ipv4Addr::new(10, 0, 18, 2)).unwrap_err(),
            Error::BadChecksum {
                layer: Layer::Udp,
                expected: 0x587d,
                found: 0x587e
            }
        );
        let mut bytes = WITH_CHECKSUM;
        let mut p = Packet::new_checked(&mut bytes[..]).unwrap();
        p.set_checksum(0);
        p.fill_checksum(SRC, DST);
        assert_eq!(bytes, WITH_CHECKSUM);
    }

    #[test]
    fn test_length_errors() {
        assert_eq!(
            Packet::new_checked(&CNP_UDP[..7]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Udp,
                need: 8,
                have: 7
            }
        );
        assert_eq!(
            Packet::new_checked(&CNP_UDP[..11]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Udp,
                need: 12,
                have: 11
            }
        );
        let mut short = CNP_UDP;
        short[5] = 7;
        assert!(matches!(
            Packet::new_checked(&short[..]).unwrap_err(),
            Error::BadLength {
                layer: Layer::Udp,
                value: 7,
                ..
            }
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(src_port in any::<u16>(), dst_port in any::<u16>(),
                           payload in proptest::collection::vec(any::<u8>(), 0..32)) {
            let repr = UdpRepr { src_port, dst_port, payload_len: payload.len() };
            let mut bytes = vec![0u8; HEADER_LEN + payload.len()];
            let mut p = Packet::new_unchecked(&mut bytes[..]);
            repr.emit(&mut p);
            p.payload_mut().copy_from_slice(&payload);
            p.fill_checksum(SRC, DST);
            let p = Packet::new_checked(&bytes[..]).unwrap();
            prop_assert!(p.checksum() != 0);
            prop_assert_eq!(UdpRepr::parse(&p, SRC, DST).unwrap(), repr);
        }
    }
}
