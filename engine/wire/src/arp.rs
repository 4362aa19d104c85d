//! ARP for IPv4 over Ethernet (RFC 826), 28 bytes after the Ethernet header.
//!
//! Portico answers ARP requests for its own IPv4 address, so that a kernel-side peer on a tap
//! (or any host on a real link) can resolve the engine's MAC and send it RoCEv2 traffic.
//! Only the Ethernet/IPv4 form is accepted; anything else is an error, never a panic.

use super::ethernet::{self, EtherType, EthernetAddress, EthernetRepr};
use super::{Error, Layer, Result, be, ensure_len};
use std::net::Ipv4Addr;

mod field {
    use crate::Field;

    pub const HTYPE: Field = 0..2;
    pub const PTYPE: Field = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Field = 6..8;
    pub const SHA: Field = 8..14;
    pub const SPA: Field = 14..18;
    pub const THA: Field = 18..24;
    pub const TPA: Field = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const HEADER_LEN: usize = field::TPA.end;

const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;

fixed_header_view!(
    /// A read/write view of an ARP packet.
    layer = Layer::Arp,
    len = HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn hardware_type(&self) -> u16 {
        be::read_u16(&self.b()[field::HTYPE])
    }

    pub fn protocol_type(&self) -> u16 {
        be::read_u16(&self.b()[field::PTYPE])
    }

    pub fn hardware_len(&self) -> u8 {
        self.b()[field::HLEN]
    }

    pub fn protocol_len(&self) -> u8 {
        self.b()[field::PLEN]
    }

    pub fn operation(&self) -> u16 {
        be::read_u16(&self.b()[field::OPER])
    }

    pub fn sender_hw(&self) -> EthernetAddress {
        EthernetAddress::from_bytes(&self.b()[field::SHA]).expect("6 bytes")
    }

    pub fn sender_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(be::read_u32(&self.b()[field::SPA]))
    }

    pub fn target_hw(&self) -> EthernetAddress {
        EthernetAddress::from_bytes(&self.b()[field::THA]).expect("6 bytes")
    }

    pub fn target_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(be::read_u32(&self.b()[field::TPA]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_fixed(&mut self) {
        be::write_u16(&mut self.bm()[field::HTYPE], HTYPE_ETHERNET);
        be::write_u16(&mut self.bm()[field::PTYPE], PTYPE_IPV4);
        self.bm()[field::HLEN] = 6;
        self.bm()[field::PLEN] = 4;
    }
}

/// An ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOp {
    Request,
    Reply,
}

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub op: ArpOp,
    pub sender_hw: EthernetAddress,
    pub sender_ip: Ipv4Addr,
    pub target_hw: EthernetAddress,
    pub target_ip: Ipv4Addr,
}

impl ArpRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<ArpRepr> {
        p.check_len()?;
        if p.hardware_type() != HTYPE_ETHERNET || p.hardware_len() != 6 {
            return Err(Error::BadField {
                layer: Layer::Arp,
                field: "hardware type",
                value: p.hardware_type() as u64,
            });
        }
        if p.protocol_type() != PTYPE_IPV4 || p.protocol_len() != 4 {
            return Err(Error::BadField {
                layer: Layer::Arp,
                field: "protocol type",
                value: p.protocol_type() as u64,
            });
        }
        let op = match p.operation() {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            other => {
                return Err(Error::BadField {
                    layer: Layer::Arp,
                    field: "operation",
                    value: other as u64,
                });
            }
        };
        Ok(ArpRepr {
            op,
            sender_hw: p.sender_hw(),
            sender_ip: p.sender_ip(),
            target_hw: p.target_hw(),
            target_ip: p.target_ip(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Packet<&mut T>) {
        p.set_fixed();
        let b = p.bm();
        be::write_u16(
            &mut b[field::OPER],
            match self.op {
                ArpOp::Request => 1,
                ArpOp::Reply => 2,
            },
        );
        b[field::SHA].copy_from_slice(self.sender_hw.as_bytes());
        b[field::SPA].copy_from_slice(&self.sender_ip.octets());
        b[field::THA].copy_from_slice(self.target_hw.as_bytes());
        b[field::TPA].copy_from_slice(&self.target_ip.octets());
    }
}

/// If `frame` is an ARP request for `my_ip`, writes the Ethernet frame of the reply into
/// `out` (at least 42 bytes) and returns its length. Anything else — another protocol, a
/// reply, a request for another address, a malformed packet — returns `None`.
pub fn answer(
    frame: &[u8],
    my_mac: EthernetAddress,
    my_ip: Ipv4Addr,
    out: &mut [u8],
) -> Option<usize> {
    let req = parse_frame(frame)?;
    if req.op != ArpOp::Request || req.target_ip != my_ip {
        return None;
    }
    let reply = ArpRepr {
        op: ArpOp::Reply,
        sender_hw: my_mac,
        sender_ip: my_ip,
        target_hw: req.sender_hw,
        target_ip: req.sender_ip,
    };
    write_frame(req.sender_hw, &reply, out).ok()
}

/// Writes into `out` (at least 42 bytes) the broadcast ARP request of `my_mac`/`my_ip` for
/// `target_ip`; returns its length.
pub fn request(
    my_mac: EthernetAddress,
    my_ip: Ipv4Addr,
    target_ip: Ipv4Addr,
    out: &mut [u8],
) -> Result<usize> {
    let req = ArpRepr {
        op: ArpOp::Request,
        sender_hw: my_mac,
        sender_ip: my_ip,
        target_hw: EthernetAddress([0; 6]),
        target_ip,
    };
    write_frame(EthernetAddress([0xff; 6]), &req, out)
}

/// Writes `arp` from its sender's MAC to `dst` into `out`; returns the frame's length (42).
fn write_frame(dst: EthernetAddress, arp: &ArpRepr, out: &mut [u8]) -> Result<usize> {
    let len = ethernet::HEADER_LEN + HEADER_LEN;
    ensure_len(Layer::Buffer, len, out.len())?;
    let (eth_out, arp_out) = out[..len].split_at_mut(ethernet::HEADER_LEN);
    EthernetRepr {
        src_addr: arp.sender_hw,
        dst_addr: dst,
        ethertype: EtherType::Arp,
    }
    .emit(&mut ethernet::Packet::new_unchecked(eth_out));
    arp.emit(&mut Packet::new_unchecked(arp_out));
    Ok(len)
}

/// The ARP packet in `frame`, if it is one (any operation).
pub fn parse_frame(frame: &[u8]) -> Option<ArpRepr> {
    let eth = ethernet::Packet::new_checked(frame).ok()?;
    if EthernetRepr::parse(&eth).ok()?.ethertype != EtherType::Arp {
        return None;
    }
    ArpRepr::parse(&Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // A request from 10.0.0.1 (02:00:00:00:00:01) for 10.0.0.2, and the reply; both vectors
    // were cross-checked byte for byte with scapy 2.8.0 (Ether()/ARP()).
    #[rustfmt::skip]
    const REQUEST: [u8; 42] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x06,
        0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01,
        0x02, 0, 0, 0, 0, 0x01, 10, 0, 0, 1,
        0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ];

    #[rustfmt::skip]
    const REPLY: [u8; 42] = [
        0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02, 0x08, 0x06,
        0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x02,
        0x02, 0, 0, 0, 0, 0x02, 10, 0, 0, 2,
        0x02, 0, 0, 0, 0, 0x01, 10, 0, 0, 1,
    ];

    const ME: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x02]);

    #[test]
    fn answers_a_request_for_its_address_with_golden_bytes() {
        let mut out = [0u8; 64];
        let n = answer(&REQUEST, ME, Ipv4Addr::new(10, 0, 0, 2), &mut out).unwrap();
        assert_eq!(&out[..n], &REPLY[..]);
    }

    #[test]
    fn ignores_what_is_not_a_request_for_it() {
        let mut out = [0u8; 64];
        assert_eq!(
            answer(&REQUEST, ME, Ipv4Addr::new(10, 0, 0, 3), &mut out),
            None
        );
        assert_eq!(
            answer(&REPLY, ME, Ipv4Addr::new(10, 0, 0, 2), &mut out),
            None
        );
        let mut not_arp = REQUEST;
        not_arp[13] = 0x00;
        assert_eq!(
            answer(&not_arp, ME, Ipv4Addr::new(10, 0, 0, 2), &mut out),
            None
        );
        let mut bad_op = REQUEST;
        bad_op[21] = 9;
        assert_eq!(
            answer(&bad_op, ME, Ipv4Addr::new(10, 0, 0, 2), &mut out),
            None
        );
        assert_eq!(
            answer(&REQUEST, ME, Ipv4Addr::new(10, 0, 0, 2), &mut [0u8; 41]),
            None
        );
        for cut in 0..REQUEST.len() {
            assert_eq!(
                answer(&REQUEST[..cut], ME, Ipv4Addr::new(10, 0, 0, 2), &mut out),
                None
            );
        }
    }

    #[test]
    fn parse_emit_round_trip() {
        let p = Packet::new_checked(&REQUEST[14..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(r.op, ArpOp::Request);
        assert_eq!(r.sender_ip, Ipv4Addr::new(10, 0, 0, 1));
        let mut buf = [0u8; HEADER_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(&buf[..], &REQUEST[14..]);
    }

    #[test]
    fn a_request_is_the_golden_request_and_parses_back() {
        let mut out = [0u8; 64];
        let n = request(
            EthernetAddress([0x02, 0, 0, 0, 0, 0x01]),
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            &mut out,
        )
        .unwrap();
        assert_eq!(&out[..n], &REQUEST[..]);
        let r = parse_frame(&out[..n]).unwrap();
        assert_eq!(r.op, ArpOp::Request);
        assert_eq!(r.target_ip, Ipv4Addr::new(10, 0, 0, 2));
        assert!(parse_frame(&out[..20]).is_none());
    }
}
