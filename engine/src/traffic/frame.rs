//! Test frames for the built-in generator and checker: Ethernet + IPv4 + UDP carrying a magic
//! tag, a sequence number and a payload pattern derived from it, so the receiver can prove
//! that every byte arrived intact and in order. Pure code: no DPDK.
//!
//! Payload layout (after the 42 bytes of Ethernet/IPv4/UDP headers):
//!
//! | offset | size | field                                          |
//! |-------:|-----:|------------------------------------------------|
//! | 0      | 4    | magic `"PRTC"`                                 |
//! | 4      | 4    | stream id (big endian)                         |
//! | 8      | 8    | sequence number (big endian)                   |
//! | 16     | rest | byte `i` = `(seq + i) mod 251` (a prime, so the pattern never aligns with powers of two) |

use std::net::Ipv4Addr;

pub const ETH_LEN: usize = 14;
pub const IPV4_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
pub const HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
pub const TAG_LEN: usize = 16;
pub const MAGIC: [u8; 4] = *b"PRTC";
/// Ethernet frame check sequence, added by the NIC and not present in the buffer.
pub const FCS_LEN: usize = 4;
/// Smallest frame size (with FCS) that holds the headers and the tag.
pub const MIN_FRAME: usize = 64;
/// Largest frame size (with FCS) a single standard mbuf holds.
pub const MAX_FRAME: usize = 1518;

/// Addresses and size of the generated frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    /// Ethernet frame size including the FCS, as in RFC 2544 (64 ..= 1518).
    pub frame_size: usize,
    pub stream: u32,
}

impl Default for FrameSpec {
    fn default() -> Self {
        FrameSpec {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            // RFC 2544 benchmarking range; these frames never leave the machine anyway.
            src_ip: Ipv4Addr::new(198, 18, 0, 1),
            dst_ip: Ipv4Addr::new(198, 18, 0, 2),
            src_port: 49152,
            dst_port: 9000,
            frame_size: 64,
            stream: 0,
        }
    }
}

impl FrameSpec {
    /// Bytes in the buffer (the frame without its FCS).
    pub fn buffer_len(&self) -> usize {
        self.frame_size - FCS_LEN
    }
}

/// Why a received frame is not a valid test frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is shorter than the test headers")]
    TooShort(usize),
    #[error("not IPv4/UDP")]
    NotUdp,
    #[error("IPv4 header checksum is wrong")]
    BadIpChecksum,
    #[error("IPv4 or UDP length disagrees with the frame length")]
    BadLength,
    #[error("no Portico tag")]
    NoMagic,
    #[error("payload byte {offset} is wrong")]
    BadPayload { offset: usize },
}

/// A verified test frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub stream: u32,
    pub seq: u64,
}

/// The standard Internet checksum over `data` (RFC 1071).
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The payload pattern of frame `seq`: `(seq + i) mod 251`, one division per frame.
#[inline]
fn pattern(seq: u64) -> impl Iterator<Item = u8> {
    let start = (seq % 251) as u8;
    (0u8..251).cycle().skip(start as usize)
}

/// Writes the headers that do not depend on the sequence number into `buf`
/// (`spec.buffer_len()` bytes). Frames are then stamped with [`stamp`].
pub fn write_template(spec: &FrameSpec, buf: &mut [u8]) {
    let len = spec.buffer_len();
    let buf = &mut buf[..len];
    buf[0..6].copy_from_slice(&spec.dst_mac);
    buf[6..12].copy_from_slice(&spec.src_mac);
    buf[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut buf[ETH_LEN..ETH_LEN + IPV4_LEN];
    ip[0] = 0x45; // version 4, 5 words
    ip[1] = 0; // DSCP 0, not ECN-capable
    ip[2..4].copy_from_slice(&((len - ETH_LEN) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // don't fragment
    ip[8] = 64;
    ip[9] = 17; // UDP
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&spec.src_ip.octets());
    ip[16..20].copy_from_slice(&spec.dst_ip.octets());
    let csum = internet_checksum(ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let udp = &mut buf[ETH_LEN + IPV4_LEN..HEADERS_LEN];
    udp[0..2].copy_from_slice(&spec.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&spec.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&((len - ETH_LEN - IPV4_LEN) as u16).to_be_bytes());
    udp[6..8].fill(0); // no UDP checksum (allowed over IPv4); the payload pattern is checked instead
    buf[HEADERS_LEN..HEADERS_LEN + 4].copy_from_slice(&MAGIC);
    buf[HEADERS_LEN + 4..HEADERS_LEN + 8].copy_from_slice(&spec.stream.to_be_bytes());
}

/// Writes the sequence number and the payload pattern into a frame made by [`write_template`].
#[inline]
pub fn stamp(buf: &mut [u8], seq: u64) {
    buf[HEADERS_LEN + 8..HEADERS_LEN + TAG_LEN].copy_from_slice(&seq.to_be_bytes());
    for (b, p) in buf[HEADERS_LEN + TAG_LEN..].iter_mut().zip(pattern(seq)) {
        *b = p;
    }
}

/// Checks every header field the generator sets, the IPv4 checksum, the lengths and every
/// payload byte. Never panics, whatever `buf` holds.
pub fn verify(buf: &[u8]) -> Result<Received, FrameError> {
    if buf.len() < HEADERS_LEN + TAG_LEN {
        return Err(FrameError::TooShort(buf.len()));
    }
    let ip = &buf[ETH_LEN..ETH_LEN + IPV4_LEN];
    if buf[12..14] != [0x08, 0x00] || ip[0] != 0x45 || ip[9] != 17 {
        return Err(FrameError::NotUdp);
    }
    if internet_checksum(ip) != 0 {
        return Err(FrameError::BadIpChecksum);
    }
    let ip_len = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let udp_len =
        u16::from_be_bytes([buf[ETH_LEN + IPV4_LEN + 4], buf[ETH_LEN + IPV4_LEN + 5]]) as usize;
    if ip_len != buf.len() - ETH_LEN || udp_len != ip_len - IPV4_LEN {
        return Err(FrameError::BadLength);
    }
    let tag = &buf[HEADERS_LEN..HEADERS_LEN + TAG_LEN];
    if tag[0..4] != MAGIC {
        return Err(FrameError::NoMagic);
    }
    let stream = u32::from_be_bytes([tag[4], tag[5], tag[6], tag[7]]);
    let seq = u64::from_be_bytes(tag[8..16].try_into().expect("8 bytes"));
    if let Some(offset) = buf[HEADERS_LEN + TAG_LEN..]
        .iter()
        .zip(pattern(seq))
        .position(|(&b, p)| b != p)
    {
        return Err(FrameError::BadPayload {
            offset: HEADERS_LEN + TAG_LEN + offset,
        });
    }
    Ok(Received { stream, seq })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(spec: &FrameSpec, seq: u64) -> Vec<u8> {
        let mut buf = vec![0u8; spec.buffer_len()];
        write_template(spec, &mut buf);
        stamp(&mut buf, seq);
        buf
    }

    #[test]
    fn golden_64_byte_frame() {
        let buf = frame(&FrameSpec::default(), 0x0102);
        #[rustfmt::skip]
        let expect: [u8; 60] = [
            // Ethernet: dst, src, IPv4
            0x02, 0, 0, 0, 0, 0x02,  0x02, 0, 0, 0, 0, 0x01,  0x08, 0x00,
            // IPv4: len 46, DF, TTL 64, UDP, checksum 0xae97, 198.18.0.1 -> 198.18.0.2
            0x45, 0x00, 0x00, 0x2e, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xae, 0x97,
            198, 18, 0, 1, 198, 18, 0, 2,
            // UDP 49152 -> 9000, len 26, no checksum
            0xc0, 0x00, 0x23, 0x28, 0x00, 0x1a, 0x00, 0x00,
            // tag: magic, stream 0, seq 0x0102
            b'P', b'R', b'T', b'C', 0, 0, 0, 0,  0, 0, 0, 0, 0, 0, 0x01, 0x02,
            // pattern (0x0102 + i) mod 251 = 7 + i
            7, 8,
        ];
        assert_eq!(buf.as_slice(), &expect[..]);
        assert_eq!(
            verify(&buf),
            Ok(Received {
                stream: 0,
                seq: 0x0102
            })
        );
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 section 3 example bytes sum to 0xddf2, checksum is its complement.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&data), !0xddf2);
    }

    #[test]
    fn every_size_round_trips() {
        for size in [MIN_FRAME, 65, 128, 511, 1024, MAX_FRAME] {
            let spec = FrameSpec {
                frame_size: size,
                stream: 7,
                ..Default::default()
            };
            let buf = frame(&spec, u64::MAX - 3);
            assert_eq!(buf.len(), size - FCS_LEN);
            assert_eq!(
                verify(&buf),
                Ok(Received {
                    stream: 7,
                    seq: u64::MAX - 3
                })
            );
        }
    }

    #[test]
    fn corruption_is_detected_where_it_happened() {
        let spec = FrameSpec {
            frame_size: 256,
            ..Default::default()
        };
        let good = frame(&spec, 42);
        let mut bad = good.clone();
        bad[200] ^= 0x10;
        assert_eq!(verify(&bad), Err(FrameError::BadPayload { offset: 200 }));
        let mut bad = good.clone();
        bad[ETH_LEN + 8] ^= 1; // TTL: breaks the IPv4 checksum
        assert_eq!(verify(&bad), Err(FrameError::BadIpChecksum));
        let mut bad = good.clone();
        bad[HEADERS_LEN] = b'X';
        assert_eq!(verify(&bad), Err(FrameError::NoMagic));
        assert_eq!(verify(&good[..good.len() - 1]), Err(FrameError::BadLength));
        assert_eq!(verify(&good[..20]), Err(FrameError::TooShort(20)));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A bounded, deterministic sweep of lengths and contents.
        let mut rng = crate::rng::SplitMix64::new(1);
        for len in 0..400 {
            let mut buf = vec![0u8; len];
            rng.fill(&mut buf);
            let _ = verify(&buf);
        }
    }
}
