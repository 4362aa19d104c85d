//! The receive path's decode: a RoCEv2 frame's structure checked and its headers decoded in
//! one pass, with the integrity checks (IPv4 checksum, UDP checksum, ICRC) left for after the
//! receiver's cheap filters (its address, a queue pair of its own).
//!
//! [`RocePacket::new_checked`] then [`RoceRepr::parse`] is the reference. The first locates
//! every layer into a layout; the second verifies the checksums and the ICRC, then slices
//! each header out of that layout again and decodes it. [`RxFrame`] does the same work for
//! the frames every peer sends in one pass of reads at offsets that follow from the opcode:
//!
//! - a plain datagram (Ethernet, a 20-byte unfragmented IPv4 header, UDP to 4791 filling it);
//! - a BTH of version 0 and a known opcode, neither a CNP nor an ACK that may carry a CETH;
//! - extension headers whose fields all decode, and a pad and payload the opcode allows;
//! - a zero UDP checksum (what RoCEv2 peers send).
//!
//! Any other frame goes to the reference, so what is refused, with which error and in which
//! order, is the reference's by construction. The tests below and the `parse_roce` fuzz
//! harness check that the two agree on every frame.
//!
//! ```text
//! RxFrame::new      structure + headers      (refusals: RocePacket::new_checked's)
//!   dst_addr(), dest_qp()                    the receiver's filters, read from the frame
//! RxFrame::verify   checksums + ICRC         (refusals: RoceRepr::parse's)
//!   -> (&RoceRepr, payload)
//! ```

use core::net::Ipv4Addr;
use core::ops::Range;

use super::bth::{self, Opcode};
use super::icrc::{self, ICRC_LEN};
use super::ipv4;
use super::roce::{
    self, BTH_OFFSET, Checks, EXT_OFFSET, IP_OFFSET, RocePacket, RoceRepr, UDP_OFFSET,
};
use super::{Result, aeth, checksum, feth, immdt, reth};

/// Where a receive path keeps the headers of the frame in hand. [`RxFrame::new`] decodes
/// into it rather than returning a 112-byte value for its caller to move again (a move of a
/// `RoceRepr` out of its `Result` was 16 to 28 instructions a frame, callgrind).
///
/// With `ENVELOPE` false ([`TransportHeaders`]) only what a RoCEv2 transport reads is
/// decoded: the fields [`RoceRepr::clear_envelope`] clears keep their defaults, on every
/// frame, whichever way it was decoded.
#[derive(Debug, Clone)]
pub struct RxHeaders<const ENVELOPE: bool = true>(RoceRepr);

/// The headers a RoCEv2 transport reads (an engine's receive path): the IPv4 source and
/// ECN, the BTH and the extension headers. Not decoding the rest (MACs, IPv4 destination,
/// DSCP, identification, DF, TTL, UDP source port) took 27 instructions out of a batched
/// 64 B WRITE and 51 out of a lone one (callgrind).
pub type TransportHeaders = RxHeaders<false>;

impl<const ENVELOPE: bool> Default for RxHeaders<ENVELOPE> {
    fn default() -> Self {
        // Read only after `RxFrame::verify` wrote it, but for the fields a transport decode
        // leaves as they are: their defaults.
        RxHeaders(RoceRepr::UNSET)
    }
}

/// A received frame whose structure is checked, on its way to the transport.
#[derive(Debug)]
pub struct RxFrame<'a, 'r, const ENVELOPE: bool = true> {
    frame: &'a [u8],
    headers: &'r mut RoceRepr,
    /// Where the payload lies and where the ICRC starts, when the headers were decoded in
    /// the one pass; `None` when [`RxFrame::verify`] hands the frame to the reference.
    decoded: Option<(Range<usize>, usize)>,
}

impl<'a, 'r, const ENVELOPE: bool> RxFrame<'a, 'r, ENVELOPE> {
    /// Checks that `frame` holds one complete RoCEv2-over-IPv4 frame, as
    /// [`RocePacket::new_checked`] does and with its errors, and decodes its headers into
    /// `headers` where the frame is of the plain kind (the module's list): all of them, or
    /// for [`TransportHeaders`] what a transport reads.
    #[inline(always)]
    pub fn new(
        frame: &'a [u8],
        headers: &'r mut RxHeaders<ENVELOPE>,
    ) -> Result<RxFrame<'a, 'r, ENVELOPE>> {
        let headers = &mut headers.0;
        let decoded = decode_plain::<ENVELOPE>(frame, headers);
        if decoded.is_none() {
            RocePacket::new_checked(frame)?;
        }
        Ok(RxFrame {
            frame,
            headers,
            decoded,
        })
    }

    /// The IPv4 destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        // The structure check saw the whole IPv4 header and the BTH.
        ipv4::Packet::new_unchecked(&self.frame[IP_OFFSET..UDP_OFFSET]).dst_addr()
    }

    /// The BTH's destination queue pair.
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        // Decoded already, where the one pass took the frame.
        match self.decoded {
            Some(_) => self.headers.bth.dest_qp,
            None => bth::Packet::new_unchecked(&self.frame[BTH_OFFSET..EXT_OFFSET]).dest_qp(),
        }
    }

    /// Verifies the IPv4 checksum, a non-zero UDP checksum and the ICRC, computed over the
    /// whole frame as [`RoceRepr::parse`] does, and hands out the headers and the payload
    /// (without pad). The same result as that function gives the frame (for
    /// [`TransportHeaders`], with [`RoceRepr::clear_envelope`] applied to it).
    pub fn verify(self) -> Result<(&'r RoceRepr, &'a [u8])> {
        self.verify_with(|covered| roce::icrc_over(covered, &[], 0))
    }

    /// [`RxFrame::verify`] with the ICRC computed by `fold` in one pass over the frame as it
    /// lies ([`roce::icrc_masked`]). The same result as [`RoceRepr::parse`] gives the frame
    /// (for [`TransportHeaders`], with [`RoceRepr::clear_envelope`] applied to it).
    #[inline(always)]
    pub fn verify_masked(self, fold: icrc::MaskedFold) -> Result<(&'r RoceRepr, &'a [u8])> {
        self.verify_with(|covered| roce::icrc_masked(covered, fold))
    }

    #[inline(always)]
    fn verify_with(
        self,
        mut icrc_of: impl FnMut(&[u8]) -> u32,
    ) -> Result<(&'r RoceRepr, &'a [u8])> {
        if let Some((payload, icrc_at)) = &self.decoded {
            let f = self.frame;
            let ip_ok = f[IP_OFFSET..UDP_OFFSET]
                .first_chunk()
                .is_some_and(checksum::ipv4_header_verifies);
            let udp_sum = f[UDP_OFFSET + 6] | f[UDP_OFFSET + 7];
            if ip_ok && udp_sum == 0 {
                let found = f[*icrc_at..*icrc_at + ICRC_LEN]
                    .first_chunk()
                    .map_or(0, |b| icrc::from_wire(*b));
                if icrc_of(&f[..*icrc_at]) == found {
                    return Ok((self.headers, &f[payload.clone()]));
                }
            }
        }
        // A frame the one pass did not take, a non-zero UDP checksum, or a failed check: the
        // reference, which names the first check that fails. Given the frame and the headers,
        // not `self`: a call that took the frame's struct made the hot path store it
        // (callgrind: a batched 64 B WRITE 1 673.0 -> 1 659.7, a lone one 3 599 -> 3 576).
        reference::<ENVELOPE>(self.frame, self.headers, icrc_of)
    }
}

#[cold]
#[inline(never)]
fn reference<'a, 'r, const ENVELOPE: bool>(
    frame: &'a [u8],
    headers: &'r mut RoceRepr,
    mut icrc_of: impl FnMut(&[u8]) -> u32,
) -> Result<(&'r RoceRepr, &'a [u8])> {
    let packet = RocePacket::new_checked(frame)?;
    *headers = RoceRepr::parse_checked(&packet, Checks::ALL, |p| icrc_of(p.covered()))?;
    if !ENVELOPE {
        headers.clear_envelope();
    }
    Ok((headers, &frame[packet.payload_range()]))
}

/// The one pass: the payload's range and the ICRC's offset, with the headers written to
/// `out`, for a frame of the plain kind (the module's list); `None` for any other.
#[inline(always)]
fn decode_plain<const ENVELOPE: bool>(
    frame: &[u8],
    out: &mut RoceRepr,
) -> Option<(Range<usize>, usize)> {
    let (ip_end, udp_end) = roce::locate_plain_datagram(frame)?;
    let bth = bth::Packet::new_checked(frame.get(BTH_OFFSET..udp_end)?).ok()?;
    if bth.tver() != 0 {
        return None;
    }
    let ends = (ip_end, udp_end);
    // The commonest opcodes decoded with the opcode a constant (`Opcode::with_common`).
    // (Callgrind: a batched 64 B WRITE 1 976.8 -> 1 928.4 instructions, a lone one 4 101 ->
    // 4 011, a lone 64 B READ 4 473 -> 4 383, a 64 KiB WRITE 90 739 -> 90 045.)
    bth.opcode().ok()?.with_common(
        #[inline(always)]
        |opcode| decode_as::<ENVELOPE>(frame, ends, &bth, opcode, out),
    )
}

/// [`decode_plain`] of a frame whose opcode is `opcode`.
#[inline(always)]
fn decode_as<const ENVELOPE: bool>(
    frame: &[u8],
    (ip_end, udp_end): (usize, usize),
    bth: &bth::Packet<&[u8]>,
    opcode: Opcode,
    out: &mut RoceRepr,
) -> Option<(Range<usize>, usize)> {
    let headers = opcode.headers();
    // A CNP's reserved bytes and an ACK's CETH are the reference's to read.
    if headers.cnp || (opcode == Opcode::Acknowledge && bth.becn()) {
        return None;
    }
    let icrc_at = udp_end.checked_sub(ICRC_LEN)?;
    let mut at = EXT_OFFSET;
    let mut next = |present: bool, len: usize| {
        let start = at;
        at += if present { len } else { 0 };
        present.then_some(start)
    };
    let ext = [
        next(headers.feth, feth::HEADER_LEN),
        next(headers.reth, reth::HEADER_LEN),
        next(headers.aeth, aeth::HEADER_LEN),
        next(headers.immdt, immdt::HEADER_LEN),
    ];
    let padded = icrc_at.checked_sub(at)?;
    let pad = usize::from(bth.pad_count());
    if pad > padded || !padded.is_multiple_of(4) {
        return None;
    }
    let payload = at..icrc_at - pad;
    if !headers.payload.allows(payload.len()) {
        return None;
    }
    RoceRepr::decode_fields::<ENVELOPE>(frame, (ip_end, udp_end), opcode, ext, None, out).ok()?;
    Some((payload, icrc_at))
}

#[cfg(test)]
mod tests;
