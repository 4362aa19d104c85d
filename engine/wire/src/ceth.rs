//! CETH, the congestion extended transport header (seed 002): Portico's extension that an ACK
//! carries after its AETH when the path is congested.
//!
//! A receiver with congestion control `ack` (negotiated per queue pair) answers ECN-marked
//! traffic with the congestion state inside its ACKs instead of with separate CNPs. The ACK's
//! BTH BECN bit is the indicator: clear, the path is not congested and nothing follows the
//! AETH; set, a CETH follows. The CETH opens with the seed's standard part (a 4-bit version and
//! a 4-bit length in 4-byte words, so a receiver can skip what it does not understand), then
//! vendor-defined fields: the congestion level (none, light, moderate, heavy), where the
//! congestion is, the ECN ratio it was judged from, and, where known, the queue depth and the
//! queuing delay.
//!
//! ```text
//!  byte 0   ver (7:4) = 1 | len (3:0) = words, 1..=4
//!  byte 1   level (7:6) | location (5:4) | service (3:0)
//!  byte 2   CE-marked packets in the receiver's window
//!  byte 3   packets in the receiver's window
//!  word 2   queue depth in bytes (len >= 2; 0xFFFF_FFFF = unknown)
//!  word 3   queuing delay in ns (len >= 3; 0xFFFF_FFFF = unknown)
//!  word 4   reserved (len = 4): zero on send, ignored on receipt
//! ```
//!
//! The ICRC covers the CETH like any other extension header. An ACK with BECN set and no
//! bytes after the AETH (as an InfiniBand congestion-control responder sends) parses with no
//! CETH; `docs/wire.md` §17 has the byte layout and golden frames.

use super::{Error, Layer, Result, ensure_len};

/// The only CETH version Portico writes and reads (the seed reserves 0 for "a standard CNP
/// notification with nothing else").
pub const VERSION: u8 = 1;

/// The shortest CETH: one word.
pub const MIN_LEN: usize = 4;

/// The longest CETH: four words.
pub const MAX_LEN: usize = 16;

/// A queue depth or delay word holding this value is "not known".
pub const UNKNOWN: u32 = u32::MAX;

/// How congested the path is, as the receiver judged it from the share of ECN-marked packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    #[default]
    None = 0,
    Light = 1,
    Moderate = 2,
    Heavy = 3,
}

impl Level {
    pub const ALL: [Level; 4] = [Level::None, Level::Light, Level::Moderate, Level::Heavy];

    pub const fn from_bits(bits: u8) -> Level {
        match bits & 3 {
            0 => Level::None,
            1 => Level::Light,
            2 => Level::Moderate,
            _ => Level::Heavy,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Light => "light",
            Level::Moderate => "moderate",
            Level::Heavy => "heavy",
        }
    }
}

/// Where the congestion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Location {
    #[default]
    Unknown = 0,
    /// The receiver's own ingress (its absorb queue): the receiver knows its depth.
    Receiver = 1,
    /// Somewhere in the network (a switch that marked the packets).
    Network = 2,
    /// Reserved code 3 (parsed, never written).
    Reserved = 3,
}

impl Location {
    pub const fn from_bits(bits: u8) -> Location {
        match bits & 3 {
            0 => Location::Unknown,
            1 => Location::Receiver,
            2 => Location::Network,
            _ => Location::Reserved,
        }
    }
}

/// The traffic the congestion was seen on (the seed's "service scenario", 4 bits).
pub mod service {
    /// RC WRITE and SEND.
    pub const RC_WRITE_SEND: u8 = 0;
    /// RC READ responses.
    pub const RC_READ_RESPONSE: u8 = 1;
    /// UD SEND.
    pub const UD_SEND: u8 = 2;
}

/// A read/write view of a CETH: at least the one-word standard part; `check_len` also checks
/// that the buffer holds the whole header its length field announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// The buffer holds the first word, the length field is 1..=4, and the buffer holds
    /// that many words. Afterwards no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        ensure_len(Layer::Ceth, MIN_LEN, b.len())?;
        let words = usize::from(b[0] & 0x0f);
        if !(1..=4).contains(&words) {
            return Err(Error::BadLength {
                layer: Layer::Ceth,
                value: words * 4,
                min: MIN_LEN,
                max: MAX_LEN,
            });
        }
        ensure_len(Layer::Ceth, words * 4, b.len())
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// The header's length in bytes, from its length field.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[0] & 0x0f) * 4
    }

    pub fn level(&self) -> Level {
        Level::from_bits(self.buffer.as_ref()[1] >> 6)
    }

    pub fn location(&self) -> Location {
        Location::from_bits(self.buffer.as_ref()[1] >> 4)
    }

    pub fn service(&self) -> u8 {
        self.buffer.as_ref()[1] & 0x0f
    }

    pub fn marked(&self) -> u8 {
        self.buffer.as_ref()[2]
    }

    pub fn window(&self) -> u8 {
        self.buffer.as_ref()[3]
    }

    fn word(&self, i: usize) -> Option<u32> {
        let b = self.buffer.as_ref();
        if self.header_len() < 4 * (i + 1) {
            return None;
        }
        let w = u32::from_be_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        (w != UNKNOWN).then_some(w)
    }

    /// The queue depth in bytes, when the header carries one.
    pub fn queue_bytes(&self) -> Option<u32> {
        self.word(1)
    }

    /// The queuing delay in ns, when the header carries one.
    pub fn delay_ns(&self) -> Option<u32> {
        self.word(2)
    }
}

/// A parsed CETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CethRepr {
    pub level: Level,
    pub location: Location,
    /// One of [`service`]'s codes.
    pub service: u8,
    /// CE-marked packets among the last `window` the receiver saw.
    pub marked: u8,
    pub window: u8,
    pub queue_bytes: Option<u32>,
    pub delay_ns: Option<u32>,
}

impl CethRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<CethRepr> {
        packet.check_len()?;
        if packet.version() != VERSION {
            return Err(Error::BadVersion {
                layer: Layer::Ceth,
                version: packet.version(),
            });
        }
        Ok(CethRepr {
            level: packet.level(),
            location: packet.location(),
            service: packet.service(),
            marked: packet.marked(),
            window: packet.window(),
            queue_bytes: packet.queue_bytes(),
            delay_ns: packet.delay_ns(),
        })
    }

    /// Words written: the standard word, then a queue word if a depth or a delay is known,
    /// then a delay word if a delay is known.
    const fn words(&self) -> usize {
        if self.delay_ns.is_some() {
            3
        } else if self.queue_bytes.is_some() {
            2
        } else {
            1
        }
    }

    pub const fn buffer_len(&self) -> usize {
        self.words() * 4
    }

    /// Fields that do not fit their bits.
    pub fn validate(&self) -> Result<()> {
        if self.service > 0x0f {
            return Err(Error::BadField {
                layer: Layer::Ceth,
                field: "service",
                value: u64::from(self.service),
            });
        }
        for (field, v) in [
            ("queue_bytes", self.queue_bytes),
            ("delay_ns", self.delay_ns),
        ] {
            if v == Some(UNKNOWN) {
                return Err(Error::BadField {
                    layer: Layer::Ceth,
                    field,
                    value: u64::from(UNKNOWN),
                });
            }
        }
        Ok(())
    }

    /// Writes the header into `buf` (at least [`CethRepr::buffer_len`] bytes).
    pub fn emit(&self, buf: &mut [u8]) {
        let words = self.words();
        buf[0] = VERSION << 4 | words as u8;
        buf[1] = (self.level as u8) << 6 | (self.location as u8) << 4 | (self.service & 0x0f);
        buf[2] = self.marked;
        buf[3] = self.window;
        if words >= 2 {
            buf[4..8].copy_from_slice(&self.queue_bytes.unwrap_or(UNKNOWN).to_be_bytes());
        }
        if words >= 3 {
            buf[8..12].copy_from_slice(&self.delay_ns.unwrap_or(UNKNOWN).to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Version 1, three words: heavy at the receiver, WRITE/SEND traffic, 12 of 32 marked,
    /// 150 000 bytes queued, 12 µs of queuing delay.
    static CETH3: [u8; 12] = [
        0x13, 0xd0, 0x0c, 0x20, 0x00, 0x02, 0x49, 0xf0, 0x00, 0x00, 0x2e, 0xe0,
    ];

    #[test]
    fn test_parse_emit_golden() {
        let p = Packet::new_checked(&CETH3[..]).unwrap();
        let r = CethRepr::parse(&p).unwrap();
        assert_eq!(
            r,
            CethRepr {
                level: Level::Heavy,
                location: Location::Receiver,
                service: service::RC_WRITE_SEND,
                marked: 12,
                window: 32,
                queue_bytes: Some(150_000),
                delay_ns: Some(12_000),
            }
        );
        let mut out = [0u8; 12];
        assert_eq!(r.buffer_len(), 12);
        r.emit(&mut out);
        assert_eq!(out, CETH3);
    }

    #[test]
    fn one_word_and_unknown_depth() {
        let r = CethRepr {
            level: Level::Light,
            marked: 1,
            window: 32,
            ..CethRepr::default()
        };
        let mut out = [0u8; 4];
        r.emit(&mut out);
        assert_eq!(out, [0x11, 0x40, 0x01, 0x20]);
        // A delay without a depth writes the depth word as unknown.
        let r = CethRepr {
            delay_ns: Some(5),
            ..r
        };
        let mut out = [0u8; 12];
        r.emit(&mut out);
        assert_eq!(&out[4..8], &[0xff; 4]);
        let back = CethRepr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn bad_headers_are_refused_by_name() {
        assert_eq!(
            Packet::new_checked(&CETH3[..3]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Ceth,
                need: 4,
                have: 3
            }
        );
        // The length field says 3 words; only 2 are there.
        assert_eq!(
            Packet::new_checked(&CETH3[..8]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Ceth,
                need: 12,
                have: 8
            }
        );
        let mut zero_len = CETH3;
        zero_len[0] = 0x10;
        assert!(matches!(
            Packet::new_checked(&zero_len[..]).unwrap_err(),
            Error::BadLength {
                layer: Layer::Ceth,
                ..
            }
        ));
        let mut v0 = CETH3;
        v0[0] = 0x03;
        assert_eq!(
            CethRepr::parse(&Packet::new_checked(&v0[..]).unwrap()).unwrap_err(),
            Error::BadVersion {
                layer: Layer::Ceth,
                version: 0
            }
        );
        let r = CethRepr {
            queue_bytes: Some(UNKNOWN),
            ..CethRepr::default()
        };
        assert!(r.validate().is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..20)) {
            if let Ok(p) = Packet::new_checked(&bytes[..]) {
                let _ = CethRepr::parse(&p);
            }
        }

        #[test]
        fn round_trip(level in 0u8..4, loc in 0u8..3, svc in 0u8..16, marked: u8, window: u8,
                      q in proptest::option::of(0u32..u32::MAX),
                      d in proptest::option::of(0u32..u32::MAX)) {
            let r = CethRepr {
                level: Level::from_bits(level),
                location: Location::from_bits(loc),
                service: svc,
                marked,
                window,
                queue_bytes: q.or(d.map(|_| 7)),
                delay_ns: d,
            };
            let mut out = [0u8; MAX_LEN];
            r.emit(&mut out);
            let back = CethRepr::parse(&Packet::new_checked(&out[..r.buffer_len()]).unwrap()).unwrap();
            prop_assert_eq!(back, r);
        }
    }
}
