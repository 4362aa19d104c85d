//! Immediate Data Extended Transport Header (ImmDt, 4 bytes).
//!
//! The 32 bits a SEND or RDMA WRITE "with immediate" hands to the receiver's
//! completion queue entry. The value is opaque: Portico passes the four bytes
//! through in wire order and never byte-swaps them, exactly as verbs does.

use super::{Layer, Result, ensure_len};

mod field {
    use crate::Field;

    pub const DATA: Field = 0..4;
}

/// Length of the ImmDt header.
pub const HEADER_LEN: usize = field::DATA.end;

fixed_header_view!(
    /// A read/write view of an ImmDt header.
    layer = Layer::ImmDt,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate data, bytes in wire order.
    pub fn data(&self) -> [u8; 4] {
        let d = self.buffer.as_ref();
        [d[0], d[1], d[2], d[3]]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_data(&mut self, data: [u8; 4]) {
        self.buffer.as_mut()[field::DATA].copy_from_slice(&data);
    }
}

/// Immediate data as four opaque bytes in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDtRepr {
    pub data: [u8; 4],
}

impl ImmDtRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<ImmDtRepr> {
        packet.check_len()?;
        Ok(ImmDtRepr {
            data: packet.data(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_data(self.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    static IMM_BYTES: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

    #[test]
    fn test_parse_emit() {
        let p = Packet::new_checked(&IMM_BYTES[..]).unwrap();
        let repr = ImmDtRepr::parse(&p).unwrap();
        assert_eq!(repr.data, [0x12, 0x34, 0x56, 0x78]);
        let mut bytes = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, IMM_BYTES);
        assert_eq!(
            Packet::new_checked(&IMM_BYTES[..3]).unwrap_err(),
            Error::Truncated {
                layer: Layer::ImmDt,
                need: 4,
                have: 3
            }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn prop_round_trip(data in any::<[u8; 4]>()) {
            let repr = ImmDtRepr { data };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(ImmDtRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }
}
