//! Datagram Extended Transport Header (DETH, 8 bytes).
//!
//! Follows the BTH of every unreliable-datagram packet: the Q_Key the receiving queue pair
//! must hold (a datagram with another key is dropped), a reserved byte, and the source queue
//! pair, which a datagram needs because the BTH names only the destination. On a RoCEv2 port
//! the general services queue pair (QP1), which carries the communication manager's MADs,
//! takes only the well-known Q_Key [`GSI_QKEY`].

use super::{Layer, Result, be, ensure_len};

mod field {
    use crate::Field;

    pub const QKEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

/// Length of the DETH.
pub const HEADER_LEN: usize = field::SRC_QP.end;

/// The Q_Key of the general services interface: what QP1 sends with and accepts (IBTA
/// 13.5.3.1, "GSI Q_Key"; the Linux stack's `IB_QP1_QKEY`).
pub const GSI_QKEY: u32 = 0x8001_0000;

fixed_header_view!(
    /// A read/write view of a DETH.
    layer = Layer::Deth,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The Q_Key.
    pub fn qkey(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[field::QKEY])
    }

    /// The reserved byte (sent as 0, ignored on receipt).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }

    /// The sender's queue pair number (24 bits).
    pub fn src_qp(&self) -> u32 {
        be::read_u24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_qkey(&mut self, qkey: u32) {
        be::write_u32(&mut self.buffer.as_mut()[field::QKEY], qkey);
    }

    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED] = 0;
    }

    /// Sets the source QP; only its low 24 bits are sent.
    pub fn set_src_qp(&mut self, qpn: u32) {
        be::write_u24(&mut self.buffer.as_mut()[field::SRC_QP], qpn);
    }
}

/// The fields of a DETH. The reserved byte is ignored on parse and sent as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    pub qkey: u32,
    /// 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<DethRepr> {
        packet.check_len()?;
        Ok(DethRepr {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_qkey(self.qkey);
        packet.clear_reserved();
        packet.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    /// What QP1 sends: the GSI Q_Key, source QP 1. tshark (4.0) decodes these bytes, after a
    /// UD SEND ONLY BTH to QP 1, as "Queue Key: 0x80010000, Source Queue Pair: 0x00000001".
    static GSI_DETH: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&GSI_DETH[..]).unwrap();
        assert_eq!(
            DethRepr::parse(&p).unwrap(),
            DethRepr {
                qkey: GSI_QKEY,
                src_qp: 1
            }
        );
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xffu8; 8];
        DethRepr {
            qkey: GSI_QKEY,
            src_qp: 1,
        }
        .emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, GSI_DETH, "the reserved byte is written as 0");
    }

    #[test]
    fn test_reserved_byte_is_ignored() {
        let mut bytes = GSI_DETH;
        bytes[4] = 0x5a;
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(p.reserved(), 0x5a);
        assert_eq!(DethRepr::parse(&p).unwrap().src_qp, 1);
    }

    #[test]
    fn test_truncated() {
        assert_eq!(
            Packet::new_checked(&GSI_DETH[..7]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Deth,
                need: 8,
                have: 7
            }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(qkey in any::<u32>(), src_qp in 0u32..1 << 24) {
            let repr = DethRepr { qkey, src_qp };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(DethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }
}
