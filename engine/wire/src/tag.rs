//! The tag header (Portico's extension): the envelope of a tagged message, carried at the start
//! of the payload of a standard SEND FIRST / SEND ONLY on queue pairs that negotiated tagged
//! messaging (`QpConfig::tagged`). The BTH, the opcodes and the ICRC stay standard, so any
//! RoCEv2 decoder shows a SEND; only the first bytes of its payload mean more. `docs/wire.md`
//! §16 has the layout and the reasons.
//!
//! ```text
//!  0      kind: 1 eager, 2 rendezvous request, 3 rendezvous done
//!  1      version (1)
//!  2..4   endpoint (portal index)
//!  4..8   initiator (the sender's rank)
//!  8..16  match bits
//! 16..24  header data
//! 24..28  message length (eager, rendezvous: the whole message; done: bytes the target took)
//! 28..32  cookie (rendezvous: the sender's; done: echoes it; eager: 0)
//! -- rendezvous request only --
//! 32..40  source address (where the target READs the message from)
//! 40..44  rkey of the source
//! 44..48  reserved, 0
//! ```
//!
//! All fields are big-endian. Eager and done headers are 32 bytes, a rendezvous request 48.

use super::{Error, Layer, Result, ensure_len};

/// Length of an eager or rendezvous-done tag header.
pub const SHORT_LEN: usize = 32;
/// Length of a rendezvous-request tag header.
pub const RNDV_LEN: usize = 48;
/// The version this module speaks.
pub const VERSION: u8 = 1;

/// What a tagged SEND carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagKind {
    /// The envelope and the whole message.
    Eager,
    /// The envelope, where the target may READ the message from, and its first bytes.
    Rendezvous { addr: u64, rkey: u32 },
    /// The target has taken (or discarded) the rendezvous message `cookie` names: the
    /// sender's request completes.
    Done,
}

impl TagKind {
    const fn code(&self) -> u8 {
        match self {
            TagKind::Eager => 1,
            TagKind::Rendezvous { .. } => 2,
            TagKind::Done => 3,
        }
    }
}

/// A parsed tag header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TagHeader {
    pub kind: TagKind,
    pub endpoint: u16,
    pub initiator: u32,
    pub match_bits: u64,
    pub hdr_data: u64,
    pub length: u32,
    pub cookie: u32,
}

#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn be64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(w)
}

impl TagHeader {
    /// Bytes this header takes at the start of the payload.
    pub const fn buffer_len(&self) -> usize {
        match self.kind {
            TagKind::Rendezvous { .. } => RNDV_LEN,
            _ => SHORT_LEN,
        }
    }

    /// Parses the header at the start of `payload`; the bytes after it are message data.
    ///
    /// Always inline, and its helpers too: out of line, it wrote the header to the caller's
    /// stack field by field, and the caller copied it on at once 16 bytes at a time, loads
    /// the core cannot forward from those stores. Each waited until the stores, and every
    /// store before them, had reached the cache: with the host's core far (this VM's slow
    /// level) it was 40 % of the worker's samples in `portico bench tagged` (see
    /// `docs/rdma.md`, "Stores the core cannot forward").
    #[inline(always)]
    pub fn parse(payload: &[u8]) -> Result<TagHeader> {
        ensure_len(Layer::Tag, SHORT_LEN, payload.len())?;
        let b = payload;
        if b[1] != VERSION {
            return Err(Error::BadVersion {
                layer: Layer::Tag,
                version: b[1],
            });
        }
        let kind = match b[0] {
            1 => TagKind::Eager,
            2 => {
                ensure_len(Layer::Tag, RNDV_LEN, payload.len())?;
                if be32(b, 44) != 0 {
                    return Err(Error::BadField {
                        layer: Layer::Tag,
                        field: "reserved",
                        value: u64::from(be32(b, 44)),
                    });
                }
                TagKind::Rendezvous {
                    addr: be64(b, 32),
                    rkey: be32(b, 40),
                }
            }
            3 => TagKind::Done,
            k => {
                return Err(Error::BadField {
                    layer: Layer::Tag,
                    field: "kind",
                    value: u64::from(k),
                });
            }
        };
        Ok(TagHeader {
            kind,
            endpoint: u16::from_be_bytes([b[2], b[3]]),
            initiator: be32(b, 4),
            match_bits: be64(b, 8),
            hdr_data: be64(b, 16),
            length: be32(b, 24),
            cookie: be32(b, 28),
        })
    }

    /// Writes the header into the first [`TagHeader::buffer_len`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let len = self.buffer_len();
        let Some(b) = buf.get_mut(..len) else {
            return Err(Error::Truncated {
                layer: Layer::Buffer,
                need: len,
                have: buf.len(),
            });
        };
        b[0] = self.kind.code();
        b[1] = VERSION;
        b[2..4].copy_from_slice(&self.endpoint.to_be_bytes());
        b[4..8].copy_from_slice(&self.initiator.to_be_bytes());
        b[8..16].copy_from_slice(&self.match_bits.to_be_bytes());
        b[16..24].copy_from_slice(&self.hdr_data.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b[28..32].copy_from_slice(&self.cookie.to_be_bytes());
        if let TagKind::Rendezvous { addr, rkey } = self.kind {
            b[32..40].copy_from_slice(&addr.to_be_bytes());
            b[40..44].copy_from_slice(&rkey.to_be_bytes());
            b[44..48].fill(0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RNDV: TagHeader = TagHeader {
        kind: TagKind::Rendezvous {
            addr: 0x0000_7f00_1234_5000,
            rkey: 0x0040_1a2b,
        },
        endpoint: 3,
        initiator: 7,
        match_bits: 0x0102_0304_0506_0708,
        hdr_data: 0xdead_beef_0000_0001,
        length: 4 << 20,
        cookie: 0x00ab_cdef,
    };

    #[test]
    fn rendezvous_header_golden_bytes() {
        let mut b = [0xffu8; RNDV_LEN];
        RNDV.emit(&mut b).unwrap();
        let want: [u8; RNDV_LEN] = [
            2, 1, 0, 3, 0, 0, 0, 7, //
            1, 2, 3, 4, 5, 6, 7, 8, //
            0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1, //
            0, 0x40, 0, 0, 0, 0xab, 0xcd, 0xef, //
            0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, //
            0, 0x40, 0x1a, 0x2b, 0, 0, 0, 0,
        ];
        assert_eq!(b, want);
        assert_eq!(TagHeader::parse(&b).unwrap(), RNDV);
    }

    #[test]
    fn eager_and_done_are_32_bytes_and_round_trip() {
        for kind in [TagKind::Eager, TagKind::Done] {
            let h = TagHeader { kind, ..RNDV };
            assert_eq!(h.buffer_len(), SHORT_LEN);
            let mut b = [0u8; SHORT_LEN];
            h.emit(&mut b).unwrap();
            assert_eq!(b[0], if kind == TagKind::Eager { 1 } else { 3 });
            assert_eq!(TagHeader::parse(&b).unwrap(), h);
        }
    }

    #[test]
    fn bad_headers_are_refused_without_panic() {
        let mut b = [0u8; RNDV_LEN];
        RNDV.emit(&mut b).unwrap();
        assert!(matches!(
            TagHeader::parse(&b[..31]),
            Err(Error::Truncated { .. })
        ));
        assert!(matches!(
            TagHeader::parse(&b[..40]),
            Err(Error::Truncated { .. })
        ));
        let mut v = b;
        v[1] = 2;
        assert!(matches!(
            TagHeader::parse(&v),
            Err(Error::BadVersion { .. })
        ));
        let mut k = b;
        k[0] = 9;
        assert!(matches!(
            TagHeader::parse(&k),
            Err(Error::BadField { field: "kind", .. })
        ));
        let mut r = b;
        r[47] = 1;
        assert!(matches!(
            TagHeader::parse(&r),
            Err(Error::BadField {
                field: "reserved",
                ..
            })
        ));
        assert!(RNDV.emit(&mut [0u8; 47]).is_err());
        for n in 0..RNDV_LEN {
            let _ = TagHeader::parse(&b[..n]);
        }
    }
}
