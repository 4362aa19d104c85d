//! RDMA Extended Transport Header (RETH, 16 bytes).
//!
//! Names the remote memory a one-sided operation touches: the first packet of an
//! RDMA WRITE, a READ request, a FLUSH (after the FETH) and an ATOMIC WRITE carry
//! the target virtual address, the rkey that authorises access, and the total DMA
//! length of the whole message. For a READ request the DMA length is also the
//! size of the response the responder will stream back.

use super::{Layer, Result, be, ensure_len};

mod field {
    use crate::Field;

    pub const VIRTUAL_ADDR: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

/// Length of the RETH.
pub const HEADER_LEN: usize = field::DMA_LEN.end;

fixed_header_view!(
    /// A read/write view of a RETH.
    layer = Layer::Reth,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote virtual address (for FLUSH with whole-MR selectivity: ignored).
    pub fn virtual_addr(&self) -> u64 {
        be::read_u64(&self.buffer.as_ref()[field::VIRTUAL_ADDR])
    }

    /// Remote key of the memory region.
    pub fn rkey(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[field::RKEY])
    }

    /// Length in bytes of the whole message (not just this packet).
    pub fn dma_len(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[field::DMA_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_virtual_addr(&mut self, va: u64) {
        be::write_u64(&mut self.buffer.as_mut()[field::VIRTUAL_ADDR], va);
    }

    pub fn set_rkey(&mut self, rkey: u32) {
        be::write_u32(&mut self.buffer.as_mut()[field::RKEY], rkey);
    }

    pub fn set_dma_len(&mut self, len: u32) {
        be::write_u32(&mut self.buffer.as_mut()[field::DMA_LEN], len);
    }
}

/// The fields of a RETH; every bit is meaningful, so parsing cannot fail once
/// the length is right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    pub virtual_addr: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl RethRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<RethRepr> {
        packet.check_len()?;
        Ok(RethRepr {
            virtual_addr: packet.virtual_addr(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_virtual_addr(self.virtual_addr);
        packet.set_rkey(self.rkey);
        packet.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use proptest::prelude::*;

    static RETH_BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, // VA
        0xca, 0xfe, 0xf0, 0x0d, // rkey
        0x00, 0x01, 0x00, 0x00, // 64 KiB
    ];

    fn repr() -> RethRepr {
        RethRepr {
            virtual_addr: 0x0000_7f12_3456_7800,
            rkey: 0xcafe_f00d,
            dma_len: 65536,
        }
    }

    #[test]
    fn test_parse() {
        let p = Packet::new_checked(&RETH_BYTES[..]).unwrap();
        assert_eq!(RethRepr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0u8; 16];
        repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, RETH_BYTES);
    }

    #[test]
    fn test_truncated() {
        assert_eq!(
            Packet::new_checked(&RETH_BYTES[..15]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Reth,
                need: 16,
                have: 15
            }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(virtual_addr in any::<u64>(), rkey in any::<u32>(), dma_len in any::<u32>()) {
            let repr = RethRepr { virtual_addr, rkey, dma_len };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(RethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }
}
