//! FLUSH Extended Transport Header (FETH, 4 bytes), IBTA 1.5 memory placement extensions.
//!
//! Carried by the FLUSH request (opcode 0x1C) between the BTH and the RETH. It is
//! how a requester asks the responder to make earlier RDMA WRITEs globally
//! visible and/or persistent before it acknowledges, which is what Portico's
//! remote-persistence path answers. Only the low byte carries fields:
//!
//! * bits 3:0, placement type: bit 0 = global visibility, bit 1 = persistence
//!   (both may be set); bits 2-3 are reserved;
//! * bits 5:4, selectivity: 0 = the memory range named by the RETH,
//!   1 = the whole memory region of the RETH's rkey (VA and length ignored);
//!   2-3 are reserved.
//!
//! Bits 31:6 are reserved (sent as 0, ignored on receive).

use super::{Error, Layer, Result, be, ensure_len};

const PLACEMENT_MASK: u32 = 0x0000_000f;
const PLACEMENT_GLOBAL: u32 = 0x1;
const PLACEMENT_PERSISTENT: u32 = 0x2;
const SELECTIVITY_MASK: u32 = 0x0000_0030;
const SELECTIVITY_SHIFT: u32 = 4;

/// Which memory a FLUSH applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Selectivity {
    /// The range given by the RETH's virtual address and DMA length.
    #[default]
    MemoryRange,
    /// The whole memory region identified by the RETH's rkey.
    MemoryRegion,
}

impl Selectivity {
    pub const fn from_bits(bits: u8) -> Option<Selectivity> {
        match bits {
            0 => Some(Selectivity::MemoryRange),
            1 => Some(Selectivity::MemoryRegion),
            _ => None,
        }
    }

    pub const fn bits(self) -> u8 {
        match self {
            Selectivity::MemoryRange => 0,
            Selectivity::MemoryRegion => 1,
        }
    }
}

/// What a FLUSH must guarantee before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Placement {
    /// Data is visible to every agent of the target (e.g. its CPUs).
    pub global_visibility: bool,
    /// Data is in the persistence domain.
    pub persistence: bool,
}

impl Placement {
    /// Encode as the four placement-type bits.
    pub const fn bits(self) -> u8 {
        (if self.global_visibility {
            PLACEMENT_GLOBAL as u8
        } else {
            0
        }) | (if self.persistence {
            PLACEMENT_PERSISTENT as u8
        } else {
            0
        })
    }
}

mod field {
    use crate::Field;

    pub const BITS: Field = 0..4;
}

/// Length of the FETH.
pub const HEADER_LEN: usize = field::BITS.end;

fixed_header_view!(
    /// A read/write view of a FETH.
    layer = Layer::Feth,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The whole 32-bit word, reserved bits included.
    pub fn raw(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[field::BITS])
    }

    /// The four placement-type bits.
    pub fn placement_bits(&self) -> u8 {
        (self.raw() & PLACEMENT_MASK) as u8
    }

    /// The two selectivity bits.
    pub fn selectivity_bits(&self) -> u8 {
        ((self.raw() & SELECTIVITY_MASK) >> SELECTIVITY_SHIFT) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_raw(&mut self, raw: u32) {
        be::write_u32(&mut self.buffer.as_mut()[field::BITS], raw);
    }

    /// Set the placement-type bits (low four bits are used).
    pub fn set_placement_bits(&mut self, bits: u8) {
        let raw = (self.raw() & !PLACEMENT_MASK) | (u32::from(bits) & PLACEMENT_MASK);
        self.set_raw(raw);
    }

    /// Set the selectivity bits (low two bits are used).
    pub fn set_selectivity_bits(&mut self, bits: u8) {
        let raw = (self.raw() & !SELECTIVITY_MASK)
            | ((u32::from(bits) << SELECTIVITY_SHIFT) & SELECTIVITY_MASK);
        self.set_raw(raw);
    }
}

/// The fields of a FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FethRepr {
    pub selectivity: Selectivity,
    pub placement: Placement,
}

impl FethRepr {
    /// Parse a view; reserved selectivity values and reserved placement bits
    /// are errors, the upper reserved bits are ignored.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<FethRepr> {
        packet.check_len()?;
        let selectivity =
            Selectivity::from_bits(packet.selectivity_bits()).ok_or(Error::BadField {
                layer: Layer::Feth,
                field: "selectivity",
                value: u64::from(packet.selectivity_bits()),
            })?;
        let plt = u32::from(packet.placement_bits());
        if plt & !(PLACEMENT_GLOBAL | PLACEMENT_PERSISTENT) != 0 {
            return Err(Error::BadField {
                layer: Layer::Feth,
                field: "placement",
                value: u64::from(plt),
            });
        }
        Ok(FethRepr {
            selectivity,
            placement: Placement {
                global_visibility: plt & PLACEMENT_GLOBAL != 0,
                persistence: plt & PLACEMENT_PERSISTENT != 0,
            },
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_raw(0);
        packet.set_selectivity_bits(self.selectivity.bits());
        packet.set_placement_bits(self.placement.bits());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_parse_emit() {
        // Whole MR, persistent + globally visible.
        let bytes = [0x00, 0x00, 0x00, 0x13];
        let repr = FethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            FethRepr {
                selectivity: Selectivity::MemoryRegion,
                placement: Placement {
                    global_visibility: true,
                    persistence: true
                }
            }
        );
        let mut out = [0xffu8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn test_reserved() {
        // Upper reserved bits are ignored.
        let bytes = [0xff, 0xff, 0xff, 0x02 | 0xc0];
        let repr = FethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.selectivity, Selectivity::MemoryRange);
        assert!(repr.placement.persistence && !repr.placement.global_visibility);
        // Reserved selectivity and placement values are rejected.
        let sel = [0, 0, 0, 0x21];
        assert_eq!(
            FethRepr::parse(&Packet::new_checked(&sel[..]).unwrap()).unwrap_err(),
            Error::BadField {
                layer: Layer::Feth,
                field: "selectivity",
                value: 2
            }
        );
        let plt = [0, 0, 0, 0x04];
        assert_eq!(
            FethRepr::parse(&Packet::new_checked(&plt[..]).unwrap()).unwrap_err(),
            Error::BadField {
                layer: Layer::Feth,
                field: "placement",
                value: 4
            }
        );
        assert_eq!(
            Packet::new_checked(&plt[..3]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Feth,
                need: 4,
                have: 3
            }
        );
    }

    pub(crate) fn feth_strategy() -> impl Strategy<Value = FethRepr> {
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(sel, g, p)| FethRepr {
            selectivity: if sel {
                Selectivity::MemoryRegion
            } else {
                Selectivity::MemoryRange
            },
            placement: Placement {
                global_visibility: g,
                persistence: p,
            },
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn prop_round_trip(repr in feth_strategy()) {
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(FethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }
}
