//! Ethernet II frame header (14 bytes, no VLAN tag, no FCS).
//!
//! The outermost layer of every RoCEv2 frame Portico sends and receives. The NIC
//! strips the FCS, and Portico does not tag frames, so a frame is
//! destination MAC, source MAC, EtherType, then the IPv4 packet.

use super::{Layer, Result, be, ensure_len};

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Build an address from the first six bytes of `data`, if there are six.
    pub fn from_bytes(data: &[u8]) -> Option<EthernetAddress> {
        let bytes: [u8; 6] = data.get(..6)?.try_into().ok()?;
        Some(EthernetAddress(bytes))
    }

    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// Group addresses have the least significant bit of the first octet set.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }
}

impl core::fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// The EtherTypes Portico cares about; anything else is kept as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    Ipv4,
    Arp,
    /// An 802.1Q tag. Portico does not parse tagged frames.
    Vlan,
    Ipv6,
    /// RoCE v1 (InfiniBand GRH directly over Ethernet); not supported.
    RoceV1,
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(value: u16) -> Self {
        match value {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x8100 => EtherType::Vlan,
            0x86dd => EtherType::Ipv6,
            0x8915 => EtherType::RoceV1,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(value: EtherType) -> Self {
        match value {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Vlan => 0x8100,
            EtherType::Ipv6 => 0x86dd,
            EtherType::RoceV1 => 0x8915,
            EtherType::Unknown(other) => other,
        }
    }
}

mod field {
    use crate::Field;

    pub const DESTINATION: Field = 0..6;
    pub const SOURCE: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    pub const PAYLOAD: usize = 14;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = field::PAYLOAD;

fixed_header_view!(
    /// A read/write view of an Ethernet II frame.
    layer = Layer::Ethernet,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn dst_addr(&self) -> EthernetAddress {
        let d = self.buffer.as_ref();
        let mut a = [0u8; 6];
        a.copy_from_slice(&d[field::DESTINATION]);
        EthernetAddress(a)
    }

    pub fn src_addr(&self) -> EthernetAddress {
        let d = self.buffer.as_ref();
        let mut a = [0u8; 6];
        a.copy_from_slice(&d[field::SOURCE]);
        EthernetAddress(a)
    }

    pub fn ethertype(&self) -> EtherType {
        EtherType::from(be::read_u16(&self.buffer.as_ref()[field::ETHERTYPE]))
    }

    /// Everything after the header (the IPv4 packet, possibly followed by
    /// Ethernet minimum-size padding).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_dst_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&addr.0);
    }

    pub fn set_src_addr(&mut self, addr: EthernetAddress) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&addr.0);
    }

    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        be::write_u16(
            &mut self.buffer.as_mut()[field::ETHERTYPE],
            ethertype.into(),
        );
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..]
    }
}

/// The meaningful fields of an Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    pub src_addr: EthernetAddress,
    pub dst_addr: EthernetAddress,
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Read the header of a view. Fails only if the buffer is too short.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<EthernetRepr> {
        packet.check_len()?;
        Ok(EthernetRepr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            ethertype: packet.ethertype(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header. The view must be at least [`HEADER_LEN`] bytes long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_dst_addr(self.dst_addr);
        packet.set_src_addr(self.src_addr);
        packet.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    static FRAME_BYTES: [u8; 18] = [
        0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, // destination
        0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, // source
        0x08, 0x00, // IPv4
        0xaa, 0xbb, 0xcc, 0xdd, // payload
    ];

    fn repr() -> EthernetRepr {
        EthernetRepr {
            dst_addr: EthernetAddress([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]),
            src_addr: EthernetAddress([0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32]),
            ethertype: EtherType::Ipv4,
        }
    }

    #[test]
    fn test_deconstruct() {
        let p = Packet::new_checked(&FRAME_BYTES[..]).unwrap();
        assert_eq!(p.dst_addr().to_string(), "e4:1d:2d:ab:2b:c2");
        assert_eq!(p.src_addr().to_string(), "7c:fe:90:64:3b:32");
        assert_eq!(p.ethertype(), EtherType::Ipv4);
        assert_eq!(p.payload(), &[0xaa, 0xbb, 0xcc, 0xdd]);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0u8; 18];
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_dst_addr(EthernetAddress([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]));
        p.set_src_addr(EthernetAddress([0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32]));
        p.set_ethertype(EtherType::Ipv4);
        p.payload_mut().copy_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(bytes, FRAME_BYTES);
    }

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&FRAME_BYTES[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0u8; 14];
        repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[..], FRAME_BYTES[..14]);
    }

    #[test]
    fn test_truncated() {
        assert_eq!(
            Packet::new_checked(&FRAME_BYTES[..13]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Ethernet,
                need: 14,
                have: 13
            }
        );
    }

    #[test]
    fn test_ethertype_values() {
        for v in [0x0800u16, 0x0806, 0x8100, 0x86dd, 0x8915, 0x1234] {
            assert_eq!(u16::from(EtherType::from(v)), v);
        }
        assert_eq!(EtherType::from(0x1234), EtherType::Unknown(0x1234));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(), ty in any::<u16>()) {
            let repr = EthernetRepr {
                src_addr: EthernetAddress(src),
                dst_addr: EthernetAddress(dst),
                ethertype: EtherType::from(ty),
            };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(EthernetRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }
}
