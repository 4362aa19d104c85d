//! Management datagrams (MADs): the 256-byte messages the general services queue pair (QP1)
//! carries, each one a SEND ONLY on an unreliable-datagram queue pair (BTH, [`crate::deth`],
//! then the MAD as the whole payload).
//!
//! A MAD starts with a 24-byte common header (IBTA 13.4.3): the base version (1), the
//! management class (the communication manager's is [`CLASS_CM`]) and its version, the method
//! with the response bit on top, a status, a class-specific field, the transaction ID that
//! pairs a request with its answer, the attribute (which message of the class), and its
//! modifier. The 232 bytes after it are the class's; for the CM each attribute is one message
//! (REQ, REP, ...). This module reads and writes the common header; validating the class,
//! version, method and attribute is the receiving class's job, which counts what it refuses.

use super::{Error, Layer, Result, be, ensure_len};

mod field {
    use crate::Field;

    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    /// The response bit (bit 7) and the method (bits 6-0).
    pub const R_METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TRANSACTION_ID: Field = 8..16;
    pub const ATTRIBUTE_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
}

/// Length of the common header.
pub const HEADER_LEN: usize = field::ATTRIBUTE_MODIFIER.end;
/// Length of every MAD on QP1: the header and the class's data.
pub const MAD_LEN: usize = 256;
/// Length of the class's data after the common header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// The only base version there is.
pub const BASE_VERSION: u8 = 1;
/// The communication manager's management class.
pub const CLASS_CM: u8 = 0x07;
/// The CM class version of IBTA 1.2 and later, what rdma_cm speaks.
pub const CM_CLASS_VERSION: u8 = 2;

/// The methods of the common header that the CM uses (it sends every message with
/// [`Method::SEND`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Method(pub u8);

impl Method {
    pub const GET: Method = Method(0x01);
    pub const SET: Method = Method(0x02);
    pub const SEND: Method = Method(0x03);
    /// A response to a GET or SET: GET with the response bit.
    pub const GET_RESP: Method = Method(0x81);
}

/// The CM's attributes: one per message (IBTA 12.6; `ClassPortInfo` is common to every
/// class). SIDR, LAP and APR are listed so they can be named when refused.
pub mod cm_attr {
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001a;
}

fixed_header_view!(
    /// A read/write view of a whole MAD ([`MAD_LEN`] bytes: a MAD is never shorter, and the
    /// bytes of a datagram after it are not its).
    layer = Layer::Mad,
    len = MAD_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }

    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }

    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }

    /// The method, with the response bit: what the byte holds.
    pub fn method(&self) -> Method {
        Method(self.buffer.as_ref()[field::R_METHOD])
    }

    pub fn status(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::STATUS])
    }

    pub fn class_specific(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::CLASS_SPECIFIC])
    }

    pub fn transaction_id(&self) -> u64 {
        be::read_u64(&self.buffer.as_ref()[field::TRANSACTION_ID])
    }

    pub fn attribute_id(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::ATTRIBUTE_ID])
    }

    pub fn attribute_modifier(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[field::ATTRIBUTE_MODIFIER])
    }

    /// The class's data: the [`DATA_LEN`] bytes after the common header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_base_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = v;
    }

    pub fn set_mgmt_class(&mut self, v: u8) {
        self.buffer.as_mut()[field::MGMT_CLASS] = v;
    }

    pub fn set_class_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = v;
    }

    pub fn set_method(&mut self, m: Method) {
        self.buffer.as_mut()[field::R_METHOD] = m.0;
    }

    pub fn set_status(&mut self, v: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::STATUS], v);
    }

    pub fn set_class_specific(&mut self, v: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::CLASS_SPECIFIC], v);
    }

    pub fn set_transaction_id(&mut self, v: u64) {
        be::write_u64(&mut self.buffer.as_mut()[field::TRANSACTION_ID], v);
    }

    pub fn set_attribute_id(&mut self, v: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::ATTRIBUTE_ID], v);
    }

    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }

    pub fn set_attribute_modifier(&mut self, v: u32) {
        be::write_u32(&mut self.buffer.as_mut()[field::ATTRIBUTE_MODIFIER], v);
    }

    /// The class's data, to write a message into.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..MAD_LEN]
    }
}

/// The common header of a MAD. Parsing refuses another base version (nothing else is
/// defined); every other field is reported as it is, for the class to judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadRepr {
    pub mgmt_class: u8,
    pub class_version: u8,
    /// With the response bit.
    pub method: Method,
    pub status: u16,
    pub class_specific: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

impl MadRepr {
    /// The header of a CM message: class, version and method as the CM sends them.
    pub const fn cm(attribute_id: u16, transaction_id: u64) -> MadRepr {
        MadRepr {
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: Method::SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<MadRepr> {
        packet.check_len()?;
        if packet.base_version() != BASE_VERSION {
            return Err(Error::BadVersion {
                layer: Layer::Mad,
                version: packet.base_version(),
            });
        }
        Ok(MadRepr {
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// The whole MAD: the header and the class's data.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Write the common header (base version 1, reserved bytes 0) into a view of at least
    /// [`MAD_LEN`] bytes; the class's data is left as it is.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_base_version(BASE_VERSION);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.clear_reserved();
        packet.set_attribute_modifier(self.attribute_modifier);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The common header of a CM REQ, transaction 0x1_2345_6789. tshark (4.0) decodes these
    /// bytes, after a UD SEND ONLY BTH to QP 1 and a DETH, as "Base Version: 0x01, Management
    /// Class: 0x07, Class Version: 0x02, Method: Send() (0x03), Status: 0x0000, Class
    /// Specific: 0x0000, Transaction ID: 0x0000000123456789, Attribute ID: 0x0010, Attribute
    /// Modifier: 0x00000000", then the data as a "CM ConnectRequest".
    static REQ_HEADER: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, // base version, class, class version, method
        0x00, 0x00, 0x00, 0x00, // status, class specific
        0x00, 0x00, 0x00, 0x01, 0x23, 0x45, 0x67, 0x89, // transaction ID
        0x00, 0x10, 0x00, 0x00, // attribute ID (REQ), reserved
        0x00, 0x00, 0x00, 0x00, // attribute modifier
    ];

    fn req_mad() -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        mad[..HEADER_LEN].copy_from_slice(&REQ_HEADER);
        mad[HEADER_LEN] = 0xab; // the first byte of the data
        mad
    }

    #[test]
    fn test_parse() {
        let mad = req_mad();
        let p = Packet::new_checked(&mad[..]).unwrap();
        assert_eq!(
            MadRepr::parse(&p).unwrap(),
            MadRepr::cm(cm_attr::REQ, 0x1_2345_6789)
        );
        assert_eq!(p.data().len(), DATA_LEN);
        assert_eq!(p.data()[0], 0xab);
    }

    #[test]
    fn test_emit() {
        let mut mad = [0xffu8; MAD_LEN];
        MadRepr::cm(cm_attr::REQ, 0x1_2345_6789).emit(&mut Packet::new_unchecked(&mut mad[..]));
        assert_eq!(mad[..HEADER_LEN], REQ_HEADER, "reserved bytes written as 0");
        assert!(
            mad[HEADER_LEN..].iter().all(|&b| b == 0xff),
            "data untouched"
        );
    }

    #[test]
    fn test_a_mad_is_256_bytes() {
        let mad = req_mad();
        assert_eq!(
            Packet::new_checked(&mad[..255]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Mad,
                need: 256,
                have: 255
            }
        );
        // A longer buffer (a datagram's padding) holds a MAD; the data stops at 256.
        let mut long = [0u8; 300];
        long[..MAD_LEN].copy_from_slice(&mad);
        let p = Packet::new_checked(&long[..]).unwrap();
        assert_eq!(p.data().len(), DATA_LEN);
    }

    #[test]
    fn test_other_base_version_refused() {
        let mut mad = req_mad();
        mad[0] = 2;
        assert_eq!(
            MadRepr::parse(&Packet::new_checked(&mad[..]).unwrap()).unwrap_err(),
            Error::BadVersion {
                layer: Layer::Mad,
                version: 2
            }
        );
    }

    #[test]
    fn test_response_bit_is_part_of_the_method() {
        let mut mad = req_mad();
        mad[3] = 0x81;
        let r = MadRepr::parse(&Packet::new_checked(&mad[..]).unwrap()).unwrap();
        assert_eq!(r.method, Method::GET_RESP);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(
            mgmt_class in any::<u8>(), class_version in any::<u8>(), method in any::<u8>(),
            status in any::<u16>(), class_specific in any::<u16>(), transaction_id in any::<u64>(),
            attribute_id in any::<u16>(), attribute_modifier in any::<u32>(),
        ) {
            let repr = MadRepr {
                mgmt_class, class_version, method: Method(method), status, class_specific,
                transaction_id, attribute_id, attribute_modifier,
            };
            let mut mad = [0u8; MAD_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut mad[..]));
            prop_assert_eq!(MadRepr::parse(&Packet::new_checked(&mad[..]).unwrap()).unwrap(), repr);
        }

        #[test]
        fn prop_any_bytes_parse_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = MadRepr::parse(&p);
                prop_assert_eq!(p.data().len(), DATA_LEN);
            }
        }
    }
}
