//! ACK Extended Transport Header (AETH, 4 bytes): syndrome and MSN.
//!
//! The responder's verdict on a request stream. It rides on ACKNOWLEDGE and on
//! the READ RESPONSE packets that carry one (first, last, only). The syndrome says
//! whether the PSN was accepted (ACK, with an end-to-end credit count), refused
//! for lack of a receive buffer (RNR NAK, with the time to wait before retrying),
//! or rejected (NAK, with a reason that drives go-back-N or a fatal completion).
//! The MSN counts the messages the responder has completed.

use super::{Error, Layer, Result, be, ensure_len};

/// Mask of the 24-bit message sequence number.
pub const MSN_MASK: u32 = 0x00ff_ffff;

/// Credit code meaning "no end-to-end flow control" (e.g. the QP uses an SRQ).
pub const CREDIT_UNLIMITED: u8 = 0x1f;

const TYPE_MASK: u8 = 0x60;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1f;
const RESERVED_BIT: u8 = 0x80;

/// Why a responder refused a request (the low five bits of a NAK syndrome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// The PSN was ahead of the expected one: retransmit from the expected PSN.
    PsnSequenceError = 0,
    /// Malformed or unsupported request.
    InvalidRequest = 1,
    /// Bad rkey, bounds or access rights.
    RemoteAccessError = 2,
    /// The responder failed for a reason of its own.
    RemoteOperationalError = 3,
    /// Reliable Datagram only; parsed for completeness.
    InvalidRdRequest = 4,
}

impl NakCode {
    pub const fn from_u8(code: u8) -> Option<NakCode> {
        Some(match code {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement; `credit_code` (0-31) encodes the number of
    /// receive buffers the requester may consume, see [`credit_count`].
    Ack { credit_code: u8 },
    /// Receiver not ready; retry after the delay encoded by `timer_code` (0-31),
    /// see [`rnr_timer_usec`].
    RnrNak { timer_code: u8 },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// Decode a syndrome byte; the reserved bit and the reserved type `10b`
    /// and NAK codes above 4 are errors.
    pub const fn from_byte(byte: u8) -> Result<Syndrome> {
        let bad = Err(Error::BadField {
            layer: Layer::Aeth,
            field: "syndrome",
            value: byte as u64,
        });
        if byte & RESERVED_BIT != 0 {
            return bad;
        }
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => Ok(Syndrome::Ack { credit_code: value }),
            TYPE_RNR_NAK => Ok(Syndrome::RnrNak { timer_code: value }),
            TYPE_NAK => match NakCode::from_u8(value) {
                Some(code) => Ok(Syndrome::Nak(code)),
                None => bad,
            },
            _ => bad,
        }
    }

    /// Encode to a syndrome byte; codes are truncated to five bits.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => TYPE_ACK | (credit_code & VALUE_MASK),
            Syndrome::RnrNak { timer_code } => TYPE_RNR_NAK | (timer_code & VALUE_MASK),
            Syndrome::Nak(code) => TYPE_NAK | code as u8,
        }
    }

    /// An ACK that grants no flow-control credits limit.
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack {
        credit_code: CREDIT_UNLIMITED,
    };
}

/// Receive buffers granted by each ACK credit code 0..=30 (IBTA end-to-end
/// flow control); code 31 means "unlimited / not used".
const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// The number of credits an ACK credit code grants; `None` for
/// [`CREDIT_UNLIMITED`] and for values that do not fit in five bits.
pub const fn credit_count(credit_code: u8) -> Option<u32> {
    if (credit_code as usize) < CREDIT_TABLE.len() {
        Some(CREDIT_TABLE[credit_code as usize])
    } else {
        None
    }
}

/// RNR NAK delay in microseconds for timer codes 0..=31. Code 0 is the longest
/// (655.36 ms), codes 1.. grow from 10 µs.
const RNR_TIMER_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The delay a requester waits after an RNR NAK with this timer code
/// (only the low five bits are used).
pub const fn rnr_timer_usec(timer_code: u8) -> u32 {
    RNR_TIMER_USEC[(timer_code & VALUE_MASK) as usize]
}

mod field {
    use crate::Field;

    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

/// Length of the AETH.
pub const HEADER_LEN: usize = field::MSN.end;

fixed_header_view!(
    /// A read/write view of an AETH.
    layer = Layer::Aeth,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The syndrome byte as it is on the wire.
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    pub fn syndrome(&self) -> Result<Syndrome> {
        Syndrome::from_byte(self.syndrome_raw())
    }

    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be::read_u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_syndrome_raw(&mut self, byte: u8) {
        self.buffer.as_mut()[field::SYNDROME] = byte;
    }

    pub fn set_syndrome(&mut self, syndrome: Syndrome) {
        self.set_syndrome_raw(syndrome.to_byte());
    }

    /// Set the MSN (low 24 bits are used).
    pub fn set_msn(&mut self, msn: u32) {
        be::write_u24(&mut self.buffer.as_mut()[field::MSN], msn);
    }
}

/// The fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    /// 24-bit message sequence number.
    pub msn: u32,
}

impl AethRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<AethRepr> {
        packet.check_len()?;
        Ok(AethRepr {
            syndrome: packet.syndrome()?,
            msn: packet.msn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Check the fields that have fewer bits on the wire than in the struct.
    pub fn validate(&self) -> Result<()> {
        let (field, value) = match self.syndrome {
            Syndrome::Ack { credit_code } => ("credit_code", credit_code),
            Syndrome::RnrNak { timer_code } => ("timer_code", timer_code),
            Syndrome::Nak(_) => ("", 0),
        };
        if value > VALUE_MASK {
            return Err(Error::BadField {
                layer: Layer::Aeth,
                field,
                value: u64::from(value),
            });
        }
        if self.msn > MSN_MASK {
            return Err(Error::BadField {
                layer: Layer::Aeth,
                field: "msn",
                value: u64::from(self.msn),
            });
        }
        Ok(())
    }

    /// Write the header into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_syndrome_bytes() {
        let cases = [
            (0x1f, Syndrome::ACK_UNLIMITED),
            (0x00, Syndrome::Ack { credit_code: 0 }),
            (0x2e, Syndrome::RnrNak { timer_code: 14 }),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
        ];
        for (byte, syndrome) in cases {
            assert_eq!(Syndrome::from_byte(byte), Ok(syndrome), "{byte:#x}");
            assert_eq!(syndrome.to_byte(), byte);
        }
        for bad in [0x40u8, 0x5f, 0x65, 0x7f, 0x80, 0xff] {
            assert_eq!(
                Syndrome::from_byte(bad),
                Err(Error::BadField {
                    layer: Layer::Aeth,
                    field: "syndrome",
                    value: u64::from(bad)
                })
            );
        }
    }

    #[test]
    fn test_parse_emit() {
        // NAK "remote access error", MSN 0x010203.
        let bytes = [0x62, 0x01, 0x02, 0x03];
        let repr = AethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            AethRepr {
                syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                msn: 0x010203
            }
        );
        let mut out = [0u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(
            Packet::new_checked(&bytes[..2]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Aeth,
                need: 4,
                have: 2
            }
        );
    }

    #[test]
    fn test_tables() {
        assert_eq!(credit_count(0), Some(0));
        assert_eq!(credit_count(5), Some(6));
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(credit_count(CREDIT_UNLIMITED), None);
        assert_eq!(rnr_timer_usec(0), 655_360);
        assert_eq!(rnr_timer_usec(1), 10);
        assert_eq!(rnr_timer_usec(25), 61_440);
        assert_eq!(rnr_timer_usec(31), 491_520);
        // Codes 1..=31 are increasing.
        assert!(RNR_TIMER_USEC[1..].windows(2).all(|w| w[0] < w[1]));
        assert!(CREDIT_TABLE.windows(2).all(|w| w[0] < w[1]));
    }

    pub(crate) fn aeth_strategy() -> impl Strategy<Value = AethRepr> {
        let syndrome = prop_oneof![
            (0u8..32).prop_map(|credit_code| Syndrome::Ack { credit_code }),
            (0u8..32).prop_map(|timer_code| Syndrome::RnrNak { timer_code }),
            (0u8..5).prop_map(|c| Syndrome::Nak(NakCode::from_u8(c).unwrap())),
        ];
        (syndrome, 0..=MSN_MASK).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(repr in aeth_strategy()) {
            prop_assert!(repr.validate().is_ok());
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(AethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }

        #[test]
        fn prop_any_syndrome_byte(byte in any::<u8>()) {
            // Every byte decodes or is rejected, and decoded ones re-encode exactly.
            if let Ok(s) = Syndrome::from_byte(byte) {
                prop_assert_eq!(s.to_byte(), byte);
            }
        }
    }
}
