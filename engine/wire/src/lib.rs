//! Packet formats Portico speaks on the wire: RoCEv2 over IPv4.
//!
//! This crate is the byte-level half of the software RDMA NIC, at the bottom of Portico's
//! crate graph: it depends on no other Portico crate. It turns raw frames
//! into typed values and back, and nothing else: no I/O, no DPDK, no allocation,
//! no `unsafe`. The transport state machines consume and produce the `Repr`s defined
//! here, the data plane hands it byte slices taken from mbufs.
//!
//! Every protocol has two levels, following smoltcp's `wire` module:
//!
//! * `Packet<T: AsRef<[u8]>>`, a zero-copy view over a buffer. `new_unchecked` wraps
//!   any buffer; `new_checked` also calls `check_len`, and after a successful
//!   `check_len` no getter or setter of that view can panic. Use `new_checked` for
//!   anything that came from the network. Setters live in an
//!   `impl<T: AsRef<[u8]> + AsMut<[u8]>>` block.
//! * `Repr`, a plain struct of the header's meaningful fields with
//!   `parse(&Packet<&T>) -> Result<Repr>`, `buffer_len()` and
//!   `emit(&mut Packet<&mut T>)`. `emit` writes into a caller-provided buffer that
//!   must be at least `buffer_len()` bytes; it never allocates.
//!
//! [`roce`] ties the layers together: Ethernet / IPv4 / UDP (4791) / BTH /
//! extension headers / payload / pad / ICRC, with the ICRC checked on parse and
//! computed on emit. The byte-by-byte layouts are documented in `docs/wire.md`.
//!
//! Untrusted input never panics: any byte string yields either a value or an
//! [`Error`] that names the layer and what was wrong.

#![forbid(unsafe_code)]

/// The part every fixed-length header view shares: the zero-copy `Packet<T>` type, its
/// constructors, and the length check after which no accessor of that header can panic.
macro_rules! fixed_header_view {
    ($(#[$doc:meta])* layer = $layer:expr, len = $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length (for emission into a sized buffer).
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wraps a buffer and checks that it holds the whole header (for untrusted input).
            pub fn new_checked(buffer: T) -> Result<Packet<T>> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Ensures the buffer holds the header; afterwards no accessor or setter panics.
            pub fn check_len(&self) -> Result<()> {
                ensure_len($layer, $len, self.buffer.as_ref().len())
            }

            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

pub mod aeth;
pub mod arp;
pub mod bth;
pub mod ceth;
pub mod cm;
pub mod deth;
pub mod ethernet;
pub mod feth;
pub mod golden;
pub mod gsi;
pub mod icrc;
pub mod immdt;
pub mod ipv4;
pub mod mad;
pub mod pfc;
pub mod reth;
pub mod roce;
pub mod rss;
pub mod rx;
pub mod tag;
pub mod template;
pub mod udp;

pub use aeth::{AethRepr, NakCode, Syndrome};
pub use arp::{ArpOp, ArpRepr};
pub use bth::{BthRepr, ExtHeaders, Opcode, Payload};
pub use ceth::{CethRepr, Level};
pub use ethernet::{EtherType, EthernetAddress, EthernetRepr};
pub use feth::{FethRepr, Placement, Selectivity};
pub use immdt::ImmDtRepr;
pub use ipv4::{Ecn, Ipv4Repr};
pub use reth::RethRepr;
pub use roce::{
    Checks, PacketFields, RoceIpv4, RocePacket, RoceRepr, emit_trailer, frame_len, pad_for,
    parse_frame,
};
pub use rx::{RxFrame, RxHeaders, TransportHeaders};
pub use tag::{TagHeader, TagKind};
pub use udp::UdpRepr;

/// A range of bytes inside a header, as used by the private `field` modules.
pub(crate) type Field = core::ops::Range<usize>;

/// The protocol layer an [`Error`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Ethernet,
    Arp,
    Ipv4,
    Udp,
    Bth,
    Reth,
    Aeth,
    ImmDt,
    Feth,
    /// The 16 reserved bytes that follow the BTH of a CNP.
    Cnp,
    /// The congestion extension header after an ACK's AETH (Portico's extension).
    Ceth,
    /// The tag header at the start of a tagged SEND's payload (Portico's extension).
    Tag,
    /// The datagram extended transport header of an unreliable-datagram packet (QP1's).
    Deth,
    /// A management datagram, as QP1 carries them.
    Mad,
    Icrc,
    /// A caller-provided output buffer (emission only).
    Buffer,
}

impl core::fmt::Display for Layer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let name = match self {
            Layer::Ethernet => "Ethernet",
            Layer::Arp => "ARP",
            Layer::Ipv4 => "IPv4",
            Layer::Udp => "UDP",
            Layer::Bth => "BTH",
            Layer::Reth => "RETH",
            Layer::Aeth => "AETH",
            Layer::ImmDt => "ImmDt",
            Layer::Feth => "FETH",
            Layer::Cnp => "CNP",
            Layer::Ceth => "CETH",
            Layer::Tag => "tag header",
            Layer::Deth => "DETH",
            Layer::Mad => "MAD",
            Layer::Icrc => "ICRC",
            Layer::Buffer => "output buffer",
        };
        f.write_str(name)
    }
}

/// Why a buffer could not be parsed, or a `Repr` could not be emitted.
///
/// Each variant says which layer is at fault and carries the numbers needed to
/// understand the failure without a debugger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the layer does.
    #[error("{layer}: truncated, need {need} bytes, have {have}")]
    Truncated {
        layer: Layer,
        need: usize,
        have: usize,
    },

    /// A length field disagrees with the header itself or with its container.
    #[error("{layer}: bad length field {value} (allowed {min}..={max})")]
    BadLength {
        layer: Layer,
        value: usize,
        min: usize,
        max: usize,
    },

    /// A version field is not the one this module speaks (IPv4 version,
    /// BTH transport header version).
    #[error("{layer}: unsupported version {version}")]
    BadVersion { layer: Layer, version: u8 },

    /// An Internet checksum (IPv4 header, or a non-zero UDP checksum) is wrong.
    #[error("{layer}: bad checksum, computed {expected:#06x}, found {found:#06x}")]
    BadChecksum {
        layer: Layer,
        expected: u16,
        found: u16,
    },

    /// An engine's handle of a packet to write that no longer stands for it: another packet
    /// was handed out since (`portico_node::Tx`). Nothing is written.
    #[error("stale transmit handle: another packet was handed out since")]
    StaleHandle,

    /// The RoCEv2 invariant CRC does not match the packet contents.
    #[error("bad ICRC, computed {expected:#010x}, found {found:#010x}")]
    BadIcrc { expected: u32, found: u32 },

    /// A BTH opcode that is reserved or that this module does not implement.
    #[error("unknown or unsupported BTH opcode {0:#04x}")]
    UnknownOpcode(u8),

    /// A well-formed opcode of another transport service (UC, RD, UD, XRC): nothing this
    /// engine's reliable-connection queue pairs take.
    #[error("BTH opcode {0:#04x} belongs to another transport service than RC")]
    OtherTransport(u8),

    /// A frame that may be meant for this host but uses a feature the RoCEv2 path does not
    /// take (a VLAN tag, IPv4 options, a fragment).
    #[error("{0}")]
    Unsupported(Unsupported),

    /// A manufacturer-specific opcode (0xE0-0xFF), reserved for Portico's own
    /// extensions but not implemented by this module yet.
    #[error("manufacturer-specific BTH opcode {0:#04x} is not implemented")]
    VendorOpcode(u8),

    /// A field holds a value that is reserved or out of range for it.
    #[error("{layer}: field `{field}` has invalid value {value:#x}")]
    BadField {
        layer: Layer,
        field: &'static str,
        value: u64,
    },

    /// The frame is not RoCEv2 over IPv4 (wrong EtherType, IP protocol, UDP
    /// port, fragmented or with IPv4 options).
    #[error("{layer}: not RoCEv2: {what} is {value:#x}")]
    NotRoce {
        layer: Layer,
        what: &'static str,
        value: u64,
    },

    /// An extension header that the opcode requires is missing from a `Repr`,
    /// or one is present that the opcode does not carry.
    #[error("opcode {opcode:#04x}: {layer} header {}", if *.present { "not allowed" } else { "missing" })]
    HeaderMismatch {
        opcode: u8,
        layer: Layer,
        present: bool,
    },

    /// The payload length is not allowed for this opcode (e.g. a payload on an
    /// ACK, or anything but 8 bytes on an ATOMIC WRITE).
    #[error("opcode {opcode:#04x}: payload of {len} bytes not allowed")]
    BadPayloadLen { opcode: u8, len: usize },

    /// BTH pad count and payload length do not add up to a multiple of 4 bytes.
    #[error("pad count {pad_count} with {payload_len} payload bytes is not 4-byte aligned")]
    BadPadding { pad_count: u8, payload_len: usize },
}

/// Features of Ethernet and IPv4 the RoCEv2 path refuses, each counted on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Unsupported {
    /// An 802.1Q or 802.1ad tag (EtherType 0x8100, 0x88a8 or 0x9100).
    #[error("Ethernet: VLAN tag (EtherType {0:#06x}) not supported")]
    VlanTag(u16),
    /// An IPv4 header longer than 20 bytes: rxe and hardware compute the ICRC over a
    /// 20-byte header, so RoCEv2 never carries options.
    #[error("IPv4: header of {0} bytes (options) not supported")]
    IpOptions(usize),
    /// A fragment (MF set or a non-zero offset): RoCEv2 packets are never fragmented.
    #[error("IPv4: fragment (offset {offset}, more fragments {more}) not supported")]
    IpFragment { offset: u16, more: bool },
}

/// The result type of every fallible function in `wire`.
pub type Result<T> = core::result::Result<T, Error>;

/// Fail with [`Error::Truncated`] unless `have >= need`.
pub(crate) fn ensure_len(layer: Layer, need: usize, have: usize) -> Result<()> {
    if have < need {
        Err(Error::Truncated { layer, need, have })
    } else {
        Ok(())
    }
}

/// Big-endian readers and writers.
///
/// Callers pass slices cut with a `field` range of a view whose `check_len`
/// succeeded, so the slices are always long enough; that is what makes the
/// getters and setters of every `Packet` panic-free.
pub(crate) mod be {
    pub fn read_u16(b: &[u8]) -> u16 {
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn read_u24(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    pub fn read_u32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub fn read_u64(b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        u64::from_be_bytes(a)
    }
    pub fn write_u16(b: &mut [u8], v: u16) {
        b[..2].copy_from_slice(&v.to_be_bytes());
    }
    /// Writes the low 24 bits of `v`.
    pub fn write_u24(b: &mut [u8], v: u32) {
        b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    pub fn write_u32(b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&v.to_be_bytes());
    }
    pub fn write_u64(b: &mut [u8], v: u64) {
        b[..8].copy_from_slice(&v.to_be_bytes());
    }
}

/// The Internet checksum (RFC 1071) used by the IPv4 header and UDP.
pub mod checksum {
    /// Sum `data` as big-endian 16-bit words into a 32-bit accumulator.
    /// An odd trailing byte is padded with a zero byte, as RFC 1071 says.
    ///
    /// The words are added four bytes at a time in the machine's byte order into 64 bits, and
    /// the folded sum is swapped once at the end: a one's-complement sum does not depend on
    /// byte order beyond that swap (RFC 1071, 2(B)). A 20-byte IPv4 header takes five loads
    /// instead of ten (callgrind: 53 fewer instructions in the receive path of a batched WRITE,
    /// `docs/rdma.md`). The result may differ from a word-by-word sum by a multiple of
    /// 0xffff, which [`fold`] removes; it is zero only where that sum is.
    #[inline]
    pub fn sum(acc: u32, data: &[u8]) -> u32 {
        let mut wide = 0u64;
        let mut quads = data.chunks_exact(4);
        for q in &mut quads {
            wide += u64::from(u32::from_ne_bytes([q[0], q[1], q[2], q[3]]));
        }
        let mut s = (wide & 0xffff_ffff) + (wide >> 32);
        s = (s & 0xffff) + (s >> 16);
        s = (s & 0xffff) + (s >> 16);
        s = (s & 0xffff) + (s >> 16);
        // `s` is now at most 0xffff, zero only when every quad was.
        let native = s as u16;
        let words = if cfg!(target_endian = "little") {
            native.swap_bytes()
        } else {
            native
        };
        let tail = match *quads.remainder() {
            [] => 0,
            [a] => u32::from(a) << 8,
            [a, b] => u32::from(u16::from_be_bytes([a, b])),
            [a, b, c, ..] => u32::from(u16::from_be_bytes([a, b])) + (u32::from(c) << 8),
        };
        acc.wrapping_add(u32::from(words)).wrapping_add(tail)
    }

    /// Whether a 20-byte IPv4 header's checksum verifies: `fold(sum(0, header)) == 0xffff`,
    /// computed without the folds.
    ///
    /// A 32-bit word `h * 2^16 + l` is `h + l` modulo 0xffff, and a one's-complement sum is
    /// the plain sum modulo 0xffff (with 0xffff for a non-zero multiple of it); swapping a
    /// word's bytes multiplies it by 2^8, which is prime to 0xffff. So the header verifies
    /// exactly when the plain sum of its five words, in either byte order, is a non-zero
    /// multiple of 0xffff: a remainder by a constant, which the compiler makes a multiply.
    /// (Callgrind, against folding: a batched 64 B WRITE 1 740.5 -> 1 735.3, a lone one
    /// 3 694 -> 3 684.)
    #[inline]
    pub fn ipv4_header_verifies(header: &[u8; 20]) -> bool {
        let sum: u64 = header
            .chunks_exact(4)
            .map(|q| u64::from(u32::from_ne_bytes([q[0], q[1], q[2], q[3]])))
            .sum();
        sum != 0 && sum.is_multiple_of(0xffff)
    }

    /// Fold the carries of a 32-bit accumulator into a 16-bit one's-complement sum.
    pub fn fold(mut acc: u32) -> u16 {
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    /// The checksum field value for `data` (one's complement of the folded sum).
    pub fn of(data: &[u8]) -> u16 {
        !fold(sum(0, data))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use proptest::prelude::*;

        /// RFC 1071's definition, one big-endian word at a time.
        fn word_by_word(mut acc: u32, data: &[u8]) -> u32 {
            for w in data.chunks(2) {
                let hi = u32::from(w[0]) << 8;
                acc = acc.wrapping_add(hi | w.get(1).map_or(0, |&lo| u32::from(lo)));
            }
            acc
        }

        #[test]
        fn rfc_1071_s_example_and_an_ipv4_header() {
            // RFC 1071, 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
            let rfc = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
            assert_eq!(fold(sum(0, &rfc)), 0xddf2);
            // A header whose checksum field (b861) makes the whole sum ffff.
            let ip = [
                0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
                0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
            ];
            assert_eq!(fold(sum(0, &ip)), 0xffff);
            let mut zeroed = ip;
            zeroed[10..12].fill(0);
            assert_eq!(of(&zeroed), 0xb861);
            assert_eq!(fold(sum(0, &[0; 20])), 0);
            assert_eq!(fold(sum(0, &[])), 0);
            // The same header through the verifier, and every one-bit change of it refused.
            assert!(ipv4_header_verifies(&ip));
            for bit in 0..160 {
                let mut bad = ip;
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(!ipv4_header_verifies(&bad), "bit {bit} flipped");
            }
            // All zeros sums to zero, not to the other zero: no checksum verifies it. All
            // ones is a sum of 0xffff words: it does.
            assert!(!ipv4_header_verifies(&[0; 20]));
            assert!(ipv4_header_verifies(&[0xff; 20]));
        }

        proptest! {
            /// Every length and starting offset, and a running accumulator, as the UDP
            /// pseudo-header and the split around a checksum field use it.
            #[test]
            fn folds_to_the_word_by_word_sum(
                data in proptest::collection::vec(any::<u8>(), 0..300),
                skip in 0usize..8,
                acc in 0u32..0x0100_0000,
            ) {
                let data = &data[skip.min(data.len())..];
                prop_assert_eq!(fold(sum(acc, data)), fold(word_by_word(acc, data)));
            }

            /// The verifier against the fold: random headers, and the same headers with the
            /// checksum field filled in (which verify), then with one 16-bit word moved by a
            /// multiple of 0xffff or by anything else.
            #[test]
            fn the_header_verifier_agrees_with_the_fold(
                header in proptest::array::uniform20(any::<u8>()),
                word in 0usize..10,
                delta in any::<u16>(),
            ) {
                let verifies = |h: &[u8; 20]| fold(sum(0, h)) == 0xffff;
                prop_assert_eq!(ipv4_header_verifies(&header), verifies(&header));
                let mut filled = header;
                filled[10..12].fill(0);
                let c = of(&filled);
                filled[10..12].copy_from_slice(&c.to_be_bytes());
                prop_assert!(ipv4_header_verifies(&filled));
                let mut moved = filled;
                let w = u16::from_be_bytes([moved[2 * word], moved[2 * word + 1]]);
                moved[2 * word..2 * word + 2].copy_from_slice(&w.wrapping_add(delta).to_be_bytes());
                prop_assert_eq!(ipv4_header_verifies(&moved), verifies(&moved));
            }

            /// Sums of 0xffff multiples: all-ones words, where the two forms of zero differ.
            #[test]
            fn keeps_ones_complement_zero_apart_from_nothing(len in 0usize..80, acc in 0u32..3) {
                let ones = vec![0xff; len];
                prop_assert_eq!(fold(sum(acc, &ones)), fold(word_by_word(acc, &ones)));
            }
        }
    }
}
