//! IEEE 802.1Qbb priority-based flow control (PFC) frames: the MAC control frame a link
//! partner sends to pause some of the eight priorities of the link (seed 000's arbitration
//! takes it as an input; `docs/wire.md`, section 19).
//!
//! ```text
//!  offset  len  field
//!       0    6  destination 01:80:C2:00:00:01 (the MAC control multicast address)
//!       6    6  source
//!      12    2  EtherType 0x8808 (MAC control)
//!      14    2  opcode 0x0101 (PFC; 0x0001 is 802.3x PAUSE, all traffic)
//!      16    2  priority-enable vector: bit i (of the low byte) says time[i] is valid
//!      18   16  time[0..8]: per priority, in quanta of 512 bit times at the link's speed
//!      34   26  zero padding to the minimum frame (60 bytes before the FCS)
//! ```
//!
//! A time of 0 for an enabled priority resumes it at once. Parsing takes frames of at least
//! 34 bytes to the MAC control address (shorter or other addresses, EtherTypes and opcodes are
//! refused by name); emission writes the 60 bytes.

use super::ethernet::{self, EtherType, EthernetAddress};
use super::{Error, Layer, Result, be, ensure_len};

/// The MAC control multicast address PFC and PAUSE frames go to.
pub const MAC_CONTROL_ADDRESS: EthernetAddress = EthernetAddress([0x01, 0x80, 0xc2, 0, 0, 0x01]);
/// EtherType of MAC control frames.
pub const ETHERTYPE: u16 = 0x8808;
/// The PFC opcode.
pub const OPCODE_PFC: u16 = 0x0101;
/// The 802.3x PAUSE opcode (every priority at once); refused by [`PfcRepr::parse`], named.
pub const OPCODE_PAUSE: u16 = 0x0001;
/// Bytes through the last time field.
pub const LEN: usize = ethernet::HEADER_LEN + 2 + 2 + 16;
/// The frame as sent: padded to Ethernet's 60-byte minimum (the FCS is the port's).
pub const FRAME_LEN: usize = 60;
/// Bit times per pause quantum.
pub const QUANTUM_BITS: u64 = 512;

/// A PFC frame's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PfcRepr {
    pub src_mac: EthernetAddress,
    /// Bit `i`: `quanta[i]` is valid (priority `i` paused for it, or resumed at 0).
    pub enabled: u8,
    /// Per priority, the pause time in quanta of 512 bit times.
    pub quanta: [u16; 8],
}

impl PfcRepr {
    /// Checks and decodes a PFC frame. Bytes after [`LEN`] (padding, a retained FCS) are
    /// ignored; the enable vector's high byte is reserved and ignored.
    pub fn parse(frame: &[u8]) -> Result<PfcRepr> {
        let eth = ethernet::Packet::new_checked(frame)?;
        let ethertype = u16::from(eth.ethertype());
        if ethertype != ETHERTYPE {
            return Err(Error::NotRoce {
                layer: Layer::Ethernet,
                what: "ethertype (not MAC control)",
                value: u64::from(ethertype),
            });
        }
        ensure_len(Layer::Ethernet, LEN, frame.len())?;
        if eth.dst_addr() != MAC_CONTROL_ADDRESS {
            return Err(Error::BadField {
                layer: Layer::Ethernet,
                field: "MAC control destination",
                value: frame[..6].iter().fold(0u64, |v, &b| v << 8 | u64::from(b)),
            });
        }
        let b = &frame[ethernet::HEADER_LEN..LEN];
        let opcode = be::read_u16(&b[0..2]);
        if opcode != OPCODE_PFC {
            return Err(Error::BadField {
                layer: Layer::Ethernet,
                field: "MAC control opcode (0x0101 PFC; 0x0001 is PAUSE)",
                value: u64::from(opcode),
            });
        }
        let mut quanta = [0u16; 8];
        for (i, q) in quanta.iter_mut().enumerate() {
            *q = be::read_u16(&b[4 + 2 * i..6 + 2 * i]);
        }
        Ok(PfcRepr {
            src_mac: eth.src_addr(),
            enabled: b[3],
            quanta,
        })
    }

    /// Writes the 60-byte frame into `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        ensure_len(Layer::Buffer, FRAME_LEN, buf.len())?;
        let buf = &mut buf[..FRAME_LEN];
        ethernet::EthernetRepr {
            src_addr: self.src_mac,
            dst_addr: MAC_CONTROL_ADDRESS,
            ethertype: EtherType::from(ETHERTYPE),
        }
        .emit(&mut ethernet::Packet::new_unchecked(&mut buf[..]));
        let b = &mut buf[ethernet::HEADER_LEN..];
        be::write_u16(&mut b[0..2], OPCODE_PFC);
        b[2] = 0;
        b[3] = self.enabled;
        for (i, q) in self.quanta.iter().enumerate() {
            be::write_u16(&mut b[4 + 2 * i..6 + 2 * i], *q);
        }
        b[LEN - ethernet::HEADER_LEN..].fill(0);
        Ok(FRAME_LEN)
    }

    /// How long priority `p` is paused, in nanoseconds on a link of `link_bps`: `None` when
    /// the frame says nothing of it, `Some(0)` when it resumes it.
    pub fn pause_ns(&self, p: usize, link_bps: u64) -> Option<u64> {
        if p >= 8 || self.enabled & (1 << p) == 0 {
            return None;
        }
        let bits = u64::from(self.quanta[p]) * QUANTUM_BITS;
        Some((u128::from(bits) * 1_000_000_000 / u128::from(link_bps.max(1))) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Priority 3 paused for 0xffff quanta, priority 5 resumed, from 02:00:00:00:00:0a.
    /// Written by hand from IEEE 802.1Qbb's layout; tshark 4.0 decodes these bytes as "MAC
    /// Control, Opcode: Class Based Flow Control [CBFC] Pause (0x0101)", "CBFC Class Enable
    /// Vector: 0x0028, C3, C5", "CBFC Class Pause Times ... C3: 65535 ... C5: 0".
    #[rustfmt::skip]
    const GOLDEN: [u8; 60] = [
        0x01, 0x80, 0xc2, 0x00, 0x00, 0x01,  0x02, 0x00, 0x00, 0x00, 0x00, 0x0a,  0x88, 0x08,
        0x01, 0x01,  0x00, 0x28,
        0x00, 0x00,  0x00, 0x00,  0x00, 0x00,  0xff, 0xff,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00,  0x00, 0x00,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    fn golden() -> PfcRepr {
        let mut quanta = [0u16; 8];
        quanta[3] = 0xffff;
        PfcRepr {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 0x0a]),
            enabled: 0x28,
            quanta,
        }
    }

    #[test]
    fn the_golden_frame_parses_and_emits_byte_for_byte() {
        assert_eq!(PfcRepr::parse(&GOLDEN).unwrap(), golden());
        let mut buf = [0xaau8; 64];
        assert_eq!(golden().emit(&mut buf).unwrap(), FRAME_LEN);
        assert_eq!(&buf[..FRAME_LEN], &GOLDEN[..]);
        // Without its padding it still parses (34 bytes).
        assert_eq!(PfcRepr::parse(&GOLDEN[..LEN]).unwrap(), golden());
    }

    #[test]
    fn pause_times_follow_the_quanta_and_the_link_speed() {
        let g = golden();
        // 65535 quanta of 512 bits at 100 Gbit/s: 335.5 µs.
        assert_eq!(g.pause_ns(3, 100_000_000_000), Some(335_539));
        assert_eq!(g.pause_ns(3, 25_000_000_000), Some(1_342_156));
        assert_eq!(g.pause_ns(5, 100_000_000_000), Some(0), "resumed");
        assert_eq!(g.pause_ns(0, 100_000_000_000), None, "not named");
        assert_eq!(g.pause_ns(8, 100_000_000_000), None);
    }

    #[test]
    fn other_frames_are_refused_by_name() {
        let mut pause = GOLDEN;
        pause[15] = 0x01; // opcode 0x0001: 802.3x PAUSE
        pause[14] = 0x00;
        assert!(matches!(
            PfcRepr::parse(&pause),
            Err(Error::BadField { value: 1, .. })
        ));
        let mut unicast = GOLDEN;
        unicast[0] = 0x02;
        assert!(matches!(
            PfcRepr::parse(&unicast),
            Err(Error::BadField { .. })
        ));
        let mut ipv4 = GOLDEN;
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert!(matches!(
            PfcRepr::parse(&ipv4),
            Err(Error::NotRoce { value: 0x0800, .. })
        ));
        assert!(PfcRepr::parse(&GOLDEN[..LEN - 1]).is_err());
        assert!(PfcRepr::parse(&GOLDEN[..10]).is_err());
    }
}
