//! An endpoint's address, as `fi_getname` gives it and `fi_av_insert` takes it:
//! `FI_SOCKADDR_IN`, a `struct sockaddr_in` of 16 bytes (`docs/libfabric.md`, "Addresses"):
//!
//! ```text
//!  0..2   sin_family   AF_INET (2), host order
//!  2..4   sin_port     the endpoint's rdma_cm port, network order
//!  4..8   sin_addr     the engine's IPv4 address, network order
//!  8..10  sin_zero[0..2]  the endpoint's index in its process, network order
//! 10..16  sin_zero[2..8]  zero
//! ```
//!
//! The port is what a connection request is sent to (each endpoint listens on its own); the
//! index names the endpoint's two list-processing endpoints at the target (`2n` for tagged
//! messages, `2n + 1` for untagged ones), so a sender needs nothing but the address.

use std::net::Ipv4Addr;

/// `AF_INET`.
const AF_INET: u16 = 2;

/// Bytes of an address.
pub const LEN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EpAddr {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub index: u16,
}

impl EpAddr {
    pub fn to_bytes(self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
        b[2..4].copy_from_slice(&self.port.to_be_bytes());
        b[4..8].copy_from_slice(&self.ip.octets());
        b[8..10].copy_from_slice(&self.index.to_be_bytes());
        b
    }

    /// Reads an address; `None` for anything but an `AF_INET` address of this layout.
    pub fn parse(b: &[u8]) -> Option<EpAddr> {
        if b.len() < LEN || u16::from_ne_bytes([b[0], b[1]]) != AF_INET {
            return None;
        }
        if b[10..16].iter().any(|&x| x != 0) {
            return None;
        }
        Some(EpAddr {
            port: u16::from_be_bytes([b[2], b[3]]),
            ip: Ipv4Addr::new(b[4], b[5], b[6], b[7]),
            index: u16::from_be_bytes([b[8], b[9]]),
        })
    }

    /// As `fi_av_straddr` prints it: `fi_sockaddr_in://10.0.0.1:7471/0`.
    pub fn to_text(self) -> String {
        format!("fi_sockaddr_in://{}:{}/{}", self.ip, self.port, self.index)
    }

    /// The list-processing endpoint of this endpoint's tagged messages (`2n`) or untagged
    /// ones (`2n + 1`). A branch, not `u16::from(!tagged)`: rustc 1.95's MIR optimisations
    /// can drop a bool's integer value on a path that branches on the bool
    /// (`docs/toolchain.md`, rust-lang/rust#158206), and the callers go on to branch on
    /// `tagged`.
    pub fn lpe_endpoint(self, tagged: bool) -> u16 {
        if tagged {
            self.index * 2
        } else {
            self.index * 2 + 1
        }
    }
}

/// The sender's identity as the tag header's initiator field carries it: the engine's IPv4
/// address (one engine per process), which the receiver maps back to the address vector.
pub fn initiator(ip: Ipv4Addr) -> u32 {
    u32::from(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes() {
        let a = EpAddr {
            ip: Ipv4Addr::new(10, 9, 0, 2),
            port: 7472,
            index: 1,
        };
        let b = a.to_bytes();
        assert_eq!(
            b,
            [2, 0, 0x1d, 0x30, 10, 9, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0],
            "AF_INET little-endian as on x86, port 7472 and index 1 big-endian"
        );
        assert_eq!(EpAddr::parse(&b), Some(a));
        assert_eq!(a.to_text(), "fi_sockaddr_in://10.9.0.2:7472/1");
        assert_eq!((a.lpe_endpoint(true), a.lpe_endpoint(false)), (2, 3));
    }

    #[test]
    fn foreign_addresses_are_refused() {
        let mut b = EpAddr {
            ip: Ipv4Addr::LOCALHOST,
            port: 1,
            index: 0,
        }
        .to_bytes();
        assert!(EpAddr::parse(&b[..15]).is_none(), "short");
        b[15] = 1;
        assert!(
            EpAddr::parse(&b).is_none(),
            "sin_zero not zero past the index"
        );
        b[15] = 0;
        b[0] = 10;
        assert!(EpAddr::parse(&b).is_none(), "AF_INET6");
    }
}
