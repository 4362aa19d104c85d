//! InfiniBand Base Transport Header (BTH, 12 bytes) and the opcodes Portico speaks.
//!
//! Every RoCEv2 packet starts its InfiniBand part with a BTH: the opcode says what
//! the packet is (a SEND, a WRITE, a READ, an ACK, a FLUSH, a CNP) and which
//! extension headers follow; the destination QP and the PSN drive the reliable
//! connection state machines; FECN/BECN carry congestion notification. The opcode
//! table here is the single place that knows which headers follow which opcode.
//!
//! Portico implements the Reliable Connection opcodes it needs plus the CNP.
//! The manufacturer-specific range 0xE0-0xFF is reserved for Portico's own
//! extensions: 0xE0-0xE2 are the durable WRITE and its durable ACK (issue 9,
//! `docs/wire.md`), 0xE3 the receipt ACK of WRITEs into a durable region whose durable ACK
//! follows (issue 32); the rest parse to [`Error::VendorOpcode`].

use super::{Error, Layer, Result, be, ensure_len};

/// Mask of the 24-bit packet sequence number.
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// Mask of the 24-bit queue pair number.
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// The default partition key (full membership of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Opcodes the IBTA leaves to manufacturers (transport bits 7:5 = 111b).
/// Portico reserves this range for its own extension headers.
pub const MANUFACTURER_SPECIFIC: core::ops::RangeInclusive<u8> = 0xe0..=0xff;

/// The BTH opcodes this module can parse and emit.
///
/// All are Reliable Connection (transport bits 000b) except [`Opcode::Cnp`]
/// (0x81, transport bits 100b), the RoCEv2 Congestion Notification Packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    SendFirst = 0x00,
    SendMiddle = 0x01,
    SendLast = 0x02,
    SendLastWithImmediate = 0x03,
    SendOnly = 0x04,
    SendOnlyWithImmediate = 0x05,
    RdmaWriteFirst = 0x06,
    RdmaWriteMiddle = 0x07,
    RdmaWriteLast = 0x08,
    RdmaWriteLastWithImmediate = 0x09,
    RdmaWriteOnly = 0x0a,
    RdmaWriteOnlyWithImmediate = 0x0b,
    RdmaReadRequest = 0x0c,
    RdmaReadResponseFirst = 0x0d,
    RdmaReadResponseMiddle = 0x0e,
    RdmaReadResponseLast = 0x0f,
    RdmaReadResponseOnly = 0x10,
    Acknowledge = 0x11,
    /// The answer to an atomic: AETH and the 8-byte AtomicAckETH (the original value),
    /// carried here as an 8-byte payload until atomics are implemented.
    AtomicAcknowledge = 0x12,
    /// Atomic compare-and-swap: the 28-byte AtomicETH (virtual address, rkey, swap value,
    /// compare value) carried as the payload. Portico does not execute atomics yet; an RC
    /// responder answers it with NAK Invalid Request.
    CompareSwap = 0x13,
    /// Atomic fetch-and-add: as [`Opcode::CompareSwap`] (the compare field unused).
    FetchAdd = 0x14,
    /// IBTA 1.5 memory placement extension: make earlier WRITEs visible or
    /// persistent. Answered with a zero-length [`Opcode::RdmaReadResponseOnly`].
    Flush = 0x1c,
    /// IBTA 1.5 memory placement extension: an 8-byte atomic store.
    /// Answered like FLUSH.
    AtomicWrite = 0x1d,
    /// RoCEv2 Congestion Notification Packet (DCQCN): BTH with BECN set,
    /// followed by 16 reserved bytes.
    Cnp = 0x81,
    /// Portico extension (manufacturer-specific range, only on queue pairs that negotiated
    /// durable writes): the first packet of a WRITE the responder must make durable. Laid out
    /// as RDMA WRITE FIRST (RETH, one path MTU of payload); the message goes on with the
    /// standard WRITE MIDDLE and WRITE LAST.
    DurableWriteFirst = 0xe0,
    /// Portico extension: a durable WRITE in one packet, laid out as RDMA WRITE ONLY.
    DurableWriteOnly = 0xe1,
    /// Portico extension: the second, durable acknowledgement of a durable WRITE, laid out
    /// as ACKNOWLEDGE (AETH). Its PSN is the durable WRITE's last PSN, the same PSN the receipt
    /// ACK named, and it is cumulative: every durable WRITE up to that PSN is durable.
    DurableAcknowledge = 0xe2,
    /// Portico extension: an ACKNOWLEDGE (AETH) that also says a durable ACK through at least
    /// its PSN will follow, sent where it covers a plain WRITE into a region registered
    /// durable whose data is not durable yet (only on queue pairs that negotiated durable
    /// writes). The requester holds the WRITEs it covers until that durable ACK comes.
    ReceiptAcknowledge = 0xe3,
}

/// Which payload an opcode may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Payload {
    /// No payload bytes at all (pad count must be 0 too).
    None,
    /// Any length, including zero (e.g. a READ RESPONSE ONLY answering a FLUSH).
    Any,
    /// Exactly this many bytes.
    Exact(usize),
}

impl Payload {
    /// Whether a payload of `len` bytes (pad not counted) is allowed.
    pub const fn allows(self, len: usize) -> bool {
        match self {
            Payload::None => len == 0,
            Payload::Any => true,
            Payload::Exact(n) => len == n,
        }
    }
}

/// [`Opcode::from_u8`] by byte.
const FROM_U8: [Option<Opcode>; 256] = {
    let mut table = [None; 256];
    let mut raw = 0;
    while raw < 256 {
        table[raw] = Opcode::named(raw as u8);
        raw += 1;
    }
    table
};

/// [`Opcode::ext_len`] by opcode byte (zero where no opcode is).
const EXT_LEN: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let op = Opcode::ALL[i];
        table[op as usize] = op.headers().len() as u8;
        i += 1;
    }
    table
};

/// The extension headers that follow the BTH for one opcode, in wire order:
/// FETH, RETH, AETH, ImmDt, CNP reserved bytes; then the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExtHeaders {
    pub feth: bool,
    pub reth: bool,
    pub aeth: bool,
    pub immdt: bool,
    /// The 16 reserved bytes of a CNP.
    pub cnp: bool,
    pub payload: Payload,
}

impl ExtHeaders {
    const NONE: ExtHeaders = ExtHeaders {
        feth: false,
        reth: false,
        aeth: false,
        immdt: false,
        cnp: false,
        payload: Payload::Any,
    };

    /// Total length of the extension headers in bytes.
    pub const fn len(&self) -> usize {
        let mut len = 0;
        if self.feth {
            len += super::feth::HEADER_LEN;
        }
        if self.reth {
            len += super::reth::HEADER_LEN;
        }
        if self.aeth {
            len += super::aeth::HEADER_LEN;
        }
        if self.immdt {
            len += super::immdt::HEADER_LEN;
        }
        if self.cnp {
            len += CNP_RESERVED_LEN;
        }
        len
    }

    /// True when no extension header follows the BTH.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Length of the AtomicETH of CmpSwap and FetchAdd (carried as their payload).
pub const ATOMIC_ETH_LEN: usize = 28;
/// Length of the AtomicAckETH of an ATOMIC ACKNOWLEDGE (carried as its payload).
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

/// Length of the reserved block that follows the BTH of a CNP.
pub const CNP_RESERVED_LEN: usize = 16;

impl Opcode {
    /// Decode a raw opcode byte.
    #[inline]
    pub const fn from_u8(raw: u8) -> Result<Opcode> {
        // A table of 256 one-byte entries, built by the match in `named`, which was a call
        // twice a received frame: the table took 40 instructions out of a batched WRITE
        // (callgrind, `docs/rdma.md`).
        match FROM_U8[raw as usize] {
            Some(op) => Ok(op),
            None => Err(Self::refused(raw)),
        }
    }

    /// What a byte that is no opcode of this module is.
    const fn refused(raw: u8) -> Error {
        match raw {
            0xe4..=0xff => Error::VendorOpcode(raw),
            // UC, RD, UD and XRC (transport bits 001b, 010b, 011b, 101b): well-formed
            // packets of a service this engine's reliable-connection queue pairs never take.
            0x20..=0x7f | 0xa0..=0xbf => Error::OtherTransport(raw),
            _ => Error::UnknownOpcode(raw),
        }
    }

    /// The opcode `raw` names, for [`FROM_U8`].
    const fn named(raw: u8) -> Option<Opcode> {
        Some(match raw {
            0x00 => Opcode::SendFirst,
            0x01 => Opcode::SendMiddle,
            0x02 => Opcode::SendLast,
            0x03 => Opcode::SendLastWithImmediate,
            0x04 => Opcode::SendOnly,
            0x05 => Opcode::SendOnlyWithImmediate,
            0x06 => Opcode::RdmaWriteFirst,
            0x07 => Opcode::RdmaWriteMiddle,
            0x08 => Opcode::RdmaWriteLast,
            0x09 => Opcode::RdmaWriteLastWithImmediate,
            0x0a => Opcode::RdmaWriteOnly,
            0x0b => Opcode::RdmaWriteOnlyWithImmediate,
            0x0c => Opcode::RdmaReadRequest,
            0x0d => Opcode::RdmaReadResponseFirst,
            0x0e => Opcode::RdmaReadResponseMiddle,
            0x0f => Opcode::RdmaReadResponseLast,
            0x10 => Opcode::RdmaReadResponseOnly,
            0x11 => Opcode::Acknowledge,
            0x12 => Opcode::AtomicAcknowledge,
            0x13 => Opcode::CompareSwap,
            0x14 => Opcode::FetchAdd,
            0x1c => Opcode::Flush,
            0x1d => Opcode::AtomicWrite,
            0x81 => Opcode::Cnp,
            0xe0 => Opcode::DurableWriteFirst,
            0xe1 => Opcode::DurableWriteOnly,
            0xe2 => Opcode::DurableAcknowledge,
            0xe3 => Opcode::ReceiptAcknowledge,
            _ => return None,
        })
    }

    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Every opcode this module implements, in numeric order.
    pub const ALL: [Opcode; 28] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastWithImmediate,
        Opcode::SendOnly,
        Opcode::SendOnlyWithImmediate,
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteMiddle,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteLastWithImmediate,
        Opcode::RdmaWriteOnly,
        Opcode::RdmaWriteOnlyWithImmediate,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponseFirst,
        Opcode::RdmaReadResponseMiddle,
        Opcode::RdmaReadResponseLast,
        Opcode::RdmaReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::Flush,
        Opcode::AtomicWrite,
        Opcode::Cnp,
        Opcode::DurableWriteFirst,
        Opcode::DurableWriteOnly,
        Opcode::DurableAcknowledge,
        Opcode::ReceiptAcknowledge,
    ];

    /// The extension headers and payload rule of this opcode.
    pub const fn headers(self) -> ExtHeaders {
        let none = ExtHeaders::NONE;
        match self {
            Opcode::SendFirst
            | Opcode::SendMiddle
            | Opcode::SendLast
            | Opcode::SendOnly
            | Opcode::RdmaWriteMiddle
            | Opcode::RdmaWriteLast
            | Opcode::RdmaReadResponseMiddle => none,
            Opcode::SendLastWithImmediate
            | Opcode::SendOnlyWithImmediate
            | Opcode::RdmaWriteLastWithImmediate => ExtHeaders {
                immdt: true,
                ..none
            },
            Opcode::RdmaWriteFirst
            | Opcode::RdmaWriteOnly
            | Opcode::DurableWriteFirst
            | Opcode::DurableWriteOnly => ExtHeaders { reth: true, ..none },
            Opcode::RdmaWriteOnlyWithImmediate => ExtHeaders {
                reth: true,
                immdt: true,
                ..none
            },
            Opcode::RdmaReadRequest => ExtHeaders {
                reth: true,
                payload: Payload::None,
                ..none
            },
            Opcode::RdmaReadResponseFirst
            | Opcode::RdmaReadResponseLast
            | Opcode::RdmaReadResponseOnly => ExtHeaders { aeth: true, ..none },
            Opcode::Acknowledge | Opcode::DurableAcknowledge | Opcode::ReceiptAcknowledge => {
                ExtHeaders {
                    aeth: true,
                    payload: Payload::None,
                    ..none
                }
            }
            Opcode::AtomicAcknowledge => ExtHeaders {
                aeth: true,
                payload: Payload::Exact(ATOMIC_ACK_ETH_LEN),
                ..none
            },
            Opcode::CompareSwap | Opcode::FetchAdd => ExtHeaders {
                payload: Payload::Exact(ATOMIC_ETH_LEN),
                ..none
            },
            Opcode::Flush => ExtHeaders {
                feth: true,
                reth: true,
                payload: Payload::None,
                ..none
            },
            Opcode::AtomicWrite => ExtHeaders {
                reth: true,
                payload: Payload::Exact(8),
                ..none
            },
            Opcode::Cnp => ExtHeaders {
                cnp: true,
                payload: Payload::None,
                ..none
            },
        }
    }

    /// `f(self)`, with the opcode a constant for the seven commonest (WRITE ONLY and MIDDLE,
    /// SEND ONLY, ACKNOWLEDGE, READ request, READ RESPONSE ONLY and MIDDLE): `f`, inline,
    /// is compiled once for each of them, so that what the opcode decides (extension headers'
    /// offsets, the payload rule) folds into the code; any other opcode goes to one copy that
    /// reads it at run time. The receive decode and the template dispatch through it.
    #[inline(always)]
    pub(crate) fn with_common<R>(self, f: impl FnOnce(Opcode) -> R) -> R {
        match self {
            Opcode::RdmaWriteOnly => f(Opcode::RdmaWriteOnly),
            Opcode::SendOnly => f(Opcode::SendOnly),
            Opcode::Acknowledge => f(Opcode::Acknowledge),
            Opcode::RdmaReadRequest => f(Opcode::RdmaReadRequest),
            Opcode::RdmaReadResponseOnly => f(Opcode::RdmaReadResponseOnly),
            Opcode::RdmaWriteMiddle => f(Opcode::RdmaWriteMiddle),
            Opcode::RdmaReadResponseMiddle => f(Opcode::RdmaReadResponseMiddle),
            other => f(other),
        }
    }

    /// Bytes of extension headers after the BTH, [`ExtHeaders::len`] of
    /// [`Opcode::headers`], read from a table: every frame's length needs it, on the way out
    /// and in. With it (and `RoceRepr::header_len` inlined, which was a call of 29
    /// instructions a batched WRITE), a batched WRITE took 19 fewer (callgrind).
    #[inline]
    pub const fn ext_len(self) -> usize {
        EXT_LEN[self as usize] as usize
    }

    /// True for packets a requester sends (the responder answers them).
    pub const fn is_request(self) -> bool {
        matches!(
            self,
            Opcode::SendFirst
                | Opcode::SendMiddle
                | Opcode::SendLast
                | Opcode::SendLastWithImmediate
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImmediate
                | Opcode::RdmaWriteFirst
                | Opcode::RdmaWriteMiddle
                | Opcode::RdmaWriteLast
                | Opcode::RdmaWriteLastWithImmediate
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
                | Opcode::RdmaReadRequest
                | Opcode::CompareSwap
                | Opcode::FetchAdd
                | Opcode::Flush
                | Opcode::AtomicWrite
                | Opcode::DurableWriteFirst
                | Opcode::DurableWriteOnly
        )
    }

    /// True for the SEND, RDMA WRITE and RDMA READ request opcodes, RC's 0x00 to 0x0C: one
    /// compare, where [`Opcode::is_request`] is a set. The other requests (the atomics,
    /// FLUSH, ATOMIC WRITE, the durable WRITEs) are not among them.
    #[inline]
    pub const fn is_send_write_or_read(self) -> bool {
        (self as u8) <= Opcode::RdmaReadRequest as u8
    }

    /// The opcodes a CETH may come with (with BECN set): ACKNOWLEDGE, after its AETH, and the
    /// CNP, inside its reserved bytes (an enhanced CNP).
    pub const fn may_carry_ceth(self) -> bool {
        matches!(self, Opcode::Acknowledge | Opcode::Cnp)
    }

    /// True for the four READ RESPONSE opcodes.
    pub const fn is_read_response(self) -> bool {
        matches!(
            self,
            Opcode::RdmaReadResponseFirst
                | Opcode::RdmaReadResponseMiddle
                | Opcode::RdmaReadResponseLast
                | Opcode::RdmaReadResponseOnly
        )
    }

    /// True for packets a responder sends back (READ responses and ACKs).
    pub const fn is_response(self) -> bool {
        self.is_read_response()
            || matches!(
                self,
                Opcode::Acknowledge
                    | Opcode::AtomicAcknowledge
                    | Opcode::DurableAcknowledge
                    | Opcode::ReceiptAcknowledge
            )
    }
}

impl TryFrom<u8> for Opcode {
    type Error = Error;

    fn try_from(raw: u8) -> Result<Opcode> {
        Opcode::from_u8(raw)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

mod field {
    use crate::Field;

    pub const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5:4), TVer (bits 3:0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (bit 6), reserved (bits 5:0). Masked by the ICRC.
    pub const FECN_BECN: usize = 4;
    pub const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), reserved (bits 6:0).
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = field::PSN.end;
/// Offset of the byte the ICRC replaces with 0xFF (FECN, BECN, reserved).
pub const ICRC_MASKED_BYTE: usize = field::FECN_BECN;

const SOLICITED: u8 = 0x80;
const MIGREQ: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const RESV6_MASK: u8 = 0x3f;
const ACK_REQ: u8 = 0x80;
const RESV7_MASK: u8 = 0x7f;

fixed_header_view!(
    /// A read/write view of a BTH and what follows it.
    layer = Layer::Bth,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode byte as it is on the wire.
    pub fn opcode_raw(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }

    pub fn opcode(&self) -> Result<Opcode> {
        Opcode::from_u8(self.opcode_raw())
    }

    /// Solicited event: the receiver should raise a completion event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SOLICITED != 0
    }

    pub fn migreq(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIGREQ != 0
    }

    /// Number of pad bytes (0-3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }

    /// Transport header version; must be 0.
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }

    pub fn pkey(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::PKEY])
    }

    /// Forward ECN: set by the network on the way to the responder.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & FECN != 0
    }

    /// Backward ECN: tells the receiver that its own traffic met congestion
    /// (set on every CNP).
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & BECN != 0
    }

    /// The six reserved bits next to FECN/BECN (sent as 0, ignored on receive).
    pub fn resv6(&self) -> u8 {
        self.buffer.as_ref()[field::FECN_BECN] & RESV6_MASK
    }

    /// Destination queue pair number (24 bits).
    #[inline(always)]
    pub fn dest_qp(&self) -> u32 {
        be::read_u24(&self.buffer.as_ref()[field::DEST_QP])
    }

    /// Acknowledge request: the responder must answer this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }

    /// The seven reserved bits next to AckReq (sent as 0, ignored on receive).
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & RESV7_MASK
    }

    /// Packet sequence number (24 bits, wraps).
    #[inline(always)]
    pub fn psn(&self) -> u32 {
        be::read_u24(&self.buffer.as_ref()[field::PSN])
    }

    /// The bytes after the BTH (extension headers, payload, pad, ICRC).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_bits(&mut self, index: usize, mask: u8, value: u8) {
        let b = &mut self.buffer.as_mut()[index];
        *b = (*b & !mask) | (value & mask);
    }

    pub fn set_opcode_raw(&mut self, raw: u8) {
        self.buffer.as_mut()[field::OPCODE] = raw;
    }

    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.set_opcode_raw(opcode.as_u8());
    }

    pub fn set_solicited(&mut self, value: bool) {
        self.set_bits(field::FLAGS, SOLICITED, if value { SOLICITED } else { 0 });
    }

    pub fn set_migreq(&mut self, value: bool) {
        self.set_bits(field::FLAGS, MIGREQ, if value { MIGREQ } else { 0 });
    }

    /// Set the pad count (low two bits of `pad` are used).
    pub fn set_pad_count(&mut self, pad: u8) {
        self.set_bits(field::FLAGS, PAD_MASK, pad << PAD_SHIFT);
    }

    /// Set the transport header version (low four bits are used).
    pub fn set_tver(&mut self, tver: u8) {
        self.set_bits(field::FLAGS, TVER_MASK, tver);
    }

    pub fn set_pkey(&mut self, pkey: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::PKEY], pkey);
    }

    pub fn set_fecn(&mut self, value: bool) {
        self.set_bits(field::FECN_BECN, FECN, if value { FECN } else { 0 });
    }

    pub fn set_becn(&mut self, value: bool) {
        self.set_bits(field::FECN_BECN, BECN, if value { BECN } else { 0 });
    }

    pub fn set_resv6(&mut self, value: u8) {
        self.set_bits(field::FECN_BECN, RESV6_MASK, value);
    }

    /// Set the destination QP (low 24 bits of `qpn` are used).
    pub fn set_dest_qp(&mut self, qpn: u32) {
        be::write_u24(&mut self.buffer.as_mut()[field::DEST_QP], qpn);
    }

    pub fn set_ack_req(&mut self, value: bool) {
        self.set_bits(field::ACK_REQ, ACK_REQ, if value { ACK_REQ } else { 0 });
    }

    pub fn set_resv7(&mut self, value: u8) {
        self.set_bits(field::ACK_REQ, RESV7_MASK, value);
    }

    /// Set the PSN (low 24 bits of `psn` are used).
    pub fn set_psn(&mut self, psn: u32) {
        be::write_u24(&mut self.buffer.as_mut()[field::PSN], psn);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// The meaningful fields of a BTH. TVer is always 0 and the reserved bits are
/// written as 0 and ignored on parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub migreq: bool,
    /// 0-3 pad bytes before the ICRC. When a whole packet is emitted through
    /// [`crate::RoceRepr`], this is derived from the payload length.
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// 24-bit destination QP number.
    pub dest_qp: u32,
    pub ack_req: bool,
    /// 24-bit packet sequence number.
    pub psn: u32,
}

impl BthRepr {
    /// Parse a view: the transport version must be 0 and the opcode known.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<BthRepr> {
        packet.check_len()?;
        if packet.tver() != 0 {
            return Err(Error::BadVersion {
                layer: Layer::Bth,
                version: packet.tver(),
            });
        }
        Ok(BthRepr::with_opcode(packet, packet.opcode()?))
    }

    /// The fields of a view whose length, version and opcode were checked already (the
    /// opcode is `opcode`): what [`BthRepr::parse`] gives, without checking them again.
    #[inline(always)]
    pub(crate) fn with_opcode<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&T>,
        opcode: Opcode,
    ) -> BthRepr {
        let b = packet.buffer.as_ref();
        // Bytes 4 to 11 (FECN and BECN, the QP; AckReq, the PSN) in one load: read field by
        // field, each 24-bit number was three loads and four instructions more (callgrind).
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[field::FECN_BECN..field::PSN.end]);
        let w = u64::from_be_bytes(w);
        let (hi, lo) = ((w >> 32) as u32, w as u32);
        BthRepr {
            opcode,
            solicited: packet.solicited(),
            migreq: packet.migreq(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: hi & (u32::from(FECN) << 24) != 0,
            becn: hi & (u32::from(BECN) << 24) != 0,
            dest_qp: hi & QPN_MASK,
            ack_req: lo & (u32::from(ACK_REQ) << 24) != 0,
            psn: lo & PSN_MASK,
        }
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Check the fields that have fewer bits on the wire than in the struct.
    pub fn validate(&self) -> Result<()> {
        let check = |field: &'static str, value: u32, max: u32| {
            if value > max {
                Err(Error::BadField {
                    layer: Layer::Bth,
                    field,
                    value: u64::from(value),
                })
            } else {
                Ok(())
            }
        };
        check("pad_count", u32::from(self.pad_count), 3)?;
        check("dest_qp", self.dest_qp, QPN_MASK)?;
        check("psn", self.psn, PSN_MASK)
    }

    /// Write the header into a view of at least [`HEADER_LEN`] bytes.
    /// Out-of-range values are truncated to their wire width (see
    /// [`BthRepr::validate`]).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_opcode(self.opcode);
        packet.buffer.as_mut()[field::FLAGS] = 0;
        packet.set_solicited(self.solicited);
        packet.set_migreq(self.migreq);
        packet.set_pad_count(self.pad_count);
        packet.set_pkey(self.pkey);
        packet.buffer.as_mut()[field::FECN_BECN] = 0;
        packet.set_fecn(self.fecn);
        packet.set_becn(self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.buffer.as_mut()[field::ACK_REQ] = 0;
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// BTH of the ConnectX-4 Lx CNP in the reference note.
    static CNP_BTH: [u8; 12] = [
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
    ];

    /// A hand-built BTH exercising every flag: RDMA WRITE ONLY, SE, MigReq,
    /// pad 3, P_Key 0x8001, FECN, DestQP 0xabcdef, AckReq, PSN 0xfedcba.
    static ALL_FLAGS_BTH: [u8; 12] = [
        0x0a, 0xf0, 0x80, 0x01, 0x80, 0xab, 0xcd, 0xef, 0x80, 0xfe, 0xdc, 0xba,
    ];

    fn all_flags_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RdmaWriteOnly,
            solicited: true,
            migreq: true,
            pad_count: 3,
            pkey: 0x8001,
            fecn: true,
            becn: false,
            dest_qp: 0xabcdef,
            ack_req: true,
            psn: 0xfedcba,
        }
    }

    #[test]
    fn test_deconstruct_cnp() {
        let p = Packet::new_checked(&CNP_BTH[..]).unwrap();
        assert_eq!(p.opcode(), Ok(Opcode::Cnp));
        assert!(!p.solicited() && !p.migreq());
        assert_eq!((p.pad_count(), p.tver(), p.pkey()), (0, 0, 0xffff));
        assert!(!p.fecn() && p.becn());
        assert_eq!(p.dest_qp(), 0x118);
        assert!(!p.ack_req());
        assert_eq!(p.psn(), 0);
    }

    #[test]
    fn test_parse_emit_all_flags() {
        let p = Packet::new_checked(&ALL_FLAGS_BTH[..]).unwrap();
        assert_eq!(BthRepr::parse(&p).unwrap(), all_flags_repr());
        let mut bytes = [0xffu8; 12];
        all_flags_repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, ALL_FLAGS_BTH);
    }

    #[test]
    fn test_construct_with_setters() {
        let mut bytes = [0u8; 12];
        let mut p = Packet::new_unchecked(&mut bytes[..]);
        p.set_opcode(Opcode::Cnp);
        p.set_pkey(DEFAULT_PKEY);
        p.set_becn(true);
        p.set_dest_qp(0x118);
        assert_eq!(bytes, CNP_BTH);
    }

    #[test]
    fn test_reserved_bits_ignored() {
        let mut bytes = ALL_FLAGS_BTH;
        bytes[4] |= 0x3f;
        bytes[8] |= 0x7f;
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!((p.resv6(), p.resv7()), (0x3f, 0x7f));
        assert_eq!(BthRepr::parse(&p).unwrap(), all_flags_repr());
    }

    #[test]
    fn test_errors() {
        assert_eq!(
            Packet::new_checked(&CNP_BTH[..7]).unwrap_err(),
            Error::Truncated {
                layer: Layer::Bth,
                need: 12,
                have: 7
            }
        );
        let mut bad_version = CNP_BTH;
        bad_version[1] = 0x01;
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&bad_version[..])).unwrap_err(),
            Error::BadVersion {
                layer: Layer::Bth,
                version: 1
            }
        );
        let mut unknown = CNP_BTH;
        unknown[0] = 0x64; // UD SEND ONLY: valid IBTA, another transport service
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&unknown[..])).unwrap_err(),
            Error::OtherTransport(0x64)
        );
        unknown[0] = 0x15; // reserved in the RC range
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&unknown[..])).unwrap_err(),
            Error::UnknownOpcode(0x15)
        );
        unknown[0] = 0xc3; // transport bits 110b: reserved
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&unknown[..])).unwrap_err(),
            Error::UnknownOpcode(0xc3)
        );
        unknown[0] = 0xe5;
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&unknown[..])).unwrap_err(),
            Error::VendorOpcode(0xe5)
        );
        let mut r = all_flags_repr();
        r.psn = 0x100_0000;
        assert!(r.validate().is_err());
    }

    #[test]
    fn test_opcode_table() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op.as_u8()), Ok(op));
        }
        let known = (0..=255u8).filter(|b| Opcode::from_u8(*b).is_ok()).count();
        assert_eq!(known, Opcode::ALL.len());
        assert_eq!(Opcode::SendOnly.headers().len(), 0);
        assert_eq!(Opcode::RdmaWriteOnlyWithImmediate.headers().len(), 20);
        assert_eq!(Opcode::Flush.headers().len(), 20);
        assert_eq!(Opcode::Acknowledge.headers().len(), 4);
        assert_eq!(Opcode::Cnp.headers().len(), 16);
        assert_eq!(Opcode::RdmaReadRequest.headers().payload, Payload::None);
        assert_eq!(Opcode::AtomicWrite.headers().payload, Payload::Exact(8));
        for op in Opcode::ALL {
            assert_eq!(op.ext_len(), op.headers().len(), "{op:?}");
            // Only the CNP's headers say `cnp`, which `RoceRepr::ceth_len` relies on.
            assert_eq!(op.headers().cnp, op == Opcode::Cnp, "{op:?}");
        }
        for op in Opcode::ALL {
            assert!(
                !(op.is_request() && op.is_response()),
                "{op:?} is both request and response"
            );
        }
        // The one compare names exactly the SEND, WRITE and READ requests, all requests.
        let plain: Vec<Opcode> = Opcode::ALL
            .into_iter()
            .filter(|op| op.is_send_write_or_read())
            .collect();
        use Opcode::*;
        assert_eq!(
            plain,
            [
                SendFirst,
                SendMiddle,
                SendLast,
                SendLastWithImmediate,
                SendOnly,
                SendOnlyWithImmediate,
                RdmaWriteFirst,
                RdmaWriteMiddle,
                RdmaWriteLast,
                RdmaWriteLastWithImmediate,
                RdmaWriteOnly,
                RdmaWriteOnlyWithImmediate,
                RdmaReadRequest
            ]
        );
        assert!(plain.iter().all(|op| op.is_request()));
    }

    pub(crate) fn opcode_strategy() -> impl Strategy<Value = Opcode> {
        proptest::sample::select(&Opcode::ALL[..])
    }

    pub(crate) fn bth_strategy() -> impl Strategy<Value = BthRepr> {
        (
            opcode_strategy(),
            any::<[bool; 6]>(),
            0u8..4,
            any::<u16>(),
            0..=QPN_MASK,
            0..=PSN_MASK,
        )
            .prop_map(|(opcode, f, pad_count, pkey, dest_qp, psn)| BthRepr {
                opcode,
                solicited: f[0],
                migreq: f[1],
                pad_count,
                pkey,
                fecn: f[2],
                becn: f[3],
                dest_qp,
                ack_req: f[4],
                psn,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_round_trip(repr in bth_strategy()) {
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(BthRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }
}
