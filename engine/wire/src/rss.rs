//! Receive-side scaling: which RX queue a NIC gives a RoCEv2 packet, and the UDP source port
//! that makes it the queue a queue pair is homed on.
//!
//! A NIC with RSS for IPv4 UDP hashes each packet's (source address, destination address,
//! source port, destination port), in that order and in network byte order, with the Toeplitz
//! function under a 40-byte secret key, and takes the queue from its redirection table (RETA):
//! `reta[hash % reta_size]`. With the default spread (`reta[j] = j % queues`) and a table whose
//! size is a multiple of the queue count (any power-of-two count on the usual NICs) that is
//! `hash % queues`.
//!
//! For a RoCEv2 packet three of the four fields are fixed per queue pair (the two addresses and
//! the destination port, 4791); the source port is the sender's choice (IBTA Annex A17 makes it
//! entropy, conventionally 0xC000..=0xFFFF). So the sender of a queue pair picks, once, a
//! source port whose hash lands on the peer's home queue ([`source_port`]), and every packet
//! of that queue pair reaches the worker that holds it, as eRPC does for its sessions.
//!
//! Pure code: no EAL, no allocation.

use core::net::Ipv4Addr;

use super::udp::{ROCEV2_ENTROPY_PORTS, ROCEV2_PORT};

/// The Toeplitz key length every RSS NIC of interest takes (320 bits).
pub const KEY_LEN: usize = 40;

/// The default RSS key of DPDK's mlx5 driver (`rss_hash_default_key` in
/// `drivers/net/mlx5/mlx5_rxq.c`, "also used for ConnectX-3"). Portico sets it explicitly on
/// every port it configures with more than one queue, so that a peer can compute its hash
/// whatever the driver's own default is.
pub const MLX5_DEFAULT_KEY: [u8; KEY_LEN] = [
    0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2, 0x83, 0x19, 0xdb, 0x1a, 0x3e, 0x94,
    0x6b, 0x9e, 0x38, 0xd9, 0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56, 0x3d, 0x59,
    0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a,
];

/// The Toeplitz hash of `input` under `key`: for every set bit of the input, left to right
/// (most significant bit of byte 0 first), the 32 key bits that start at that bit position are
/// XORed into the result. Inputs longer than 36 bytes run past the key and see zero bits.
pub fn toeplitz(key: &[u8; KEY_LEN], input: &[u8]) -> u32 {
    let mut hash = 0u32;
    // The 32 key bits aligned with the current input bit.
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, &byte) in input.iter().enumerate() {
        // The key byte whose bits shift into the window while this input byte is consumed.
        let next = key.get(i + 4).copied().unwrap_or(0);
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                hash ^= window;
            }
            window = (window << 1) | u32::from((next >> (7 - bit)) & 1);
        }
    }
    hash
}

/// The 12-byte input of the IPv4-with-ports hash types (TCP and UDP alike).
pub fn ipv4_ports_input(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&src.octets());
    b[4..8].copy_from_slice(&dst.octets());
    b[8..10].copy_from_slice(&sport.to_be_bytes());
    b[10..].copy_from_slice(&dport.to_be_bytes());
    b
}

/// How a receiving port spreads IPv4 UDP over its RX queues: key, queue count, and the size of
/// its redirection table filled with the default spread `reta[j] = j % queues`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rss {
    pub key: [u8; KEY_LEN],
    /// RX queues (one per worker core of the engine); at least 1.
    pub queues: u16,
    /// Entries of the redirection table; 0 means "a multiple of `queues`", which makes the
    /// queue `hash % queues` (what every power-of-two queue count gives on mlx5, i40e, ice
    /// and ixgbe with their default tables).
    pub reta_size: u16,
}

impl Rss {
    /// `queues` queues with DPDK's mlx5 default key and the default spread.
    pub const fn spread(queues: u16) -> Rss {
        Rss {
            key: MLX5_DEFAULT_KEY,
            queues,
            reta_size: 0,
        }
    }

    /// The RSS hash of a RoCEv2 packet from `src`:`sport` to `dst`:4791.
    pub fn hash_roce(&self, src: Ipv4Addr, dst: Ipv4Addr, sport: u16) -> u32 {
        toeplitz(&self.key, &ipv4_ports_input(src, dst, sport, ROCEV2_PORT))
    }

    /// The queue a packet with RSS hash `hash` goes to (queue 0 for a port with no queues).
    pub fn queue_of(&self, hash: u32) -> u16 {
        let queues = u32::from(self.queues.max(1));
        let entry = match self.reta_size {
            0 => hash,
            n => hash % u32::from(n),
        };
        (entry % queues) as u16
    }

    /// The queue a RoCEv2 packet from `src`:`sport` to `dst` goes to.
    pub fn queue_of_roce(&self, src: Ipv4Addr, dst: Ipv4Addr, sport: u16) -> u16 {
        self.queue_of(self.hash_roce(src, dst, sport))
    }
}

/// A UDP source port in [`ROCEV2_ENTROPY_PORTS`] that makes the receiver's RSS (`rss`) deliver RoCEv2
/// packets from `src` to `dst` to `queue`. The search starts at `ROCEV2_ENTROPY_PORTS` offset `start`
/// (modulo its size) so that queue pairs homed on the same queue still use different ports
/// (ECMP entropy), and takes the first port that lands on `queue`. `None` when `queue` is not
/// one of the receiver's queues, or (for a key that never reaches it) no port does.
pub fn source_port(rss: &Rss, src: Ipv4Addr, dst: Ipv4Addr, queue: u16, start: u16) -> Option<u16> {
    if queue >= rss.queues.max(1) {
        return None;
    }
    let first = *ROCEV2_ENTROPY_PORTS.start();
    let span = u32::from(*ROCEV2_ENTROPY_PORTS.end() - first) + 1;
    (0..span)
        .map(|i| first + ((u32::from(start) + i) % span) as u16)
        .find(|&sport| rss.queue_of_roce(src, dst, sport) == queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of Microsoft's "Verifying the RSS Hash Calculation" page
    /// (learn.microsoft.com/windows-hardware/drivers/network/verifying-the-rss-hash-calculation),
    /// also the verification suite of Intel's 82599 datasheet (§7.1.2.8.3) that DPDK's
    /// `app/test/test_thash.c` checks `rte_thash` against.
    const VERIFICATION_KEY: [u8; KEY_LEN] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    /// The IPv4 rows of that table: source, source port, destination, destination port, the
    /// hash of the addresses only, and the hash with the ports ("IPv4 with TCP"; UDP hashes the
    /// same 12 bytes).
    type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);
    const VECTORS: [Vector; 5] = [
        (
            [66, 9, 149, 187],
            2794,
            [161, 142, 100, 80],
            1766,
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            [199, 92, 111, 2],
            14230,
            [65, 69, 140, 83],
            4739,
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            [24, 19, 198, 95],
            12898,
            [12, 22, 207, 184],
            38024,
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
        (
            [38, 27, 205, 30],
            48228,
            [209, 142, 163, 6],
            2217,
            0x8298_9176,
            0xafc7_327f,
        ),
        (
            [153, 39, 163, 191],
            44251,
            [202, 188, 127, 2],
            1303,
            0x5d18_09c5,
            0x10e8_28a2,
        ),
    ];

    #[test]
    fn the_published_ipv4_verification_vectors() {
        for (src, sport, dst, dport, l3, l4) in VECTORS {
            let (s, d) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let input = ipv4_ports_input(s, d, sport, dport);
            assert_eq!(toeplitz(&VERIFICATION_KEY, &input[..8]), l3, "{s} -> {d}");
            assert_eq!(
                toeplitz(&VERIFICATION_KEY, &input),
                l4,
                "{s}:{sport} -> {d}:{dport}"
            );
        }
    }

    #[test]
    fn the_hash_is_linear_in_its_input() {
        // Toeplitz is XOR-linear: h(a ^ b) = h(a) ^ h(b). A shift or byte-order slip breaks it
        // for most inputs; checked over the vectors' inputs taken pairwise.
        let inputs: Vec<[u8; 12]> = VECTORS
            .iter()
            .map(|&(s, sp, d, dp, _, _)| ipv4_ports_input(s.into(), d.into(), sp, dp))
            .collect();
        for a in &inputs {
            for b in &inputs {
                let x: Vec<u8> = a.iter().zip(b).map(|(p, q)| p ^ q).collect();
                assert_eq!(
                    toeplitz(&MLX5_DEFAULT_KEY, &x),
                    toeplitz(&MLX5_DEFAULT_KEY, a) ^ toeplitz(&MLX5_DEFAULT_KEY, b)
                );
            }
        }
        assert_eq!(toeplitz(&MLX5_DEFAULT_KEY, &[0; 12]), 0);
    }

    #[test]
    fn a_12_byte_input_reads_only_the_first_16_key_bytes() {
        // 96 input bits slide a 32-bit window over key bits 0..=126: a driver's longer key
        // (52 bytes on i40e) hashes IPv4 with ports as its first 40 bytes do.
        let input = ipv4_ports_input([10, 9, 0, 1].into(), [10, 9, 0, 2].into(), 0xc123, 4791);
        let mut key = MLX5_DEFAULT_KEY;
        let h = toeplitz(&key, &input);
        key[16..].fill(0xa5);
        assert_eq!(toeplitz(&key, &input), h);
        key[15] ^= 0x01;
        assert_eq!(toeplitz(&key, &input), h, "bit 127 is never read");
        key[15] ^= 0x02;
        assert_ne!(
            toeplitz(&key, &input),
            h,
            "bit 126 is, by the last input bit"
        );
    }

    #[test]
    fn queues_follow_the_redirection_table() {
        let mut rss = Rss::spread(4);
        assert_eq!(rss.queue_of(0x51cc_c178), (0x51cc_c178u32 % 4) as u16);
        // 128 entries spread over 3 queues: entry 0x78 (120) holds queue 120 % 3 = 0.
        rss.queues = 3;
        rss.reta_size = 128;
        assert_eq!(rss.queue_of(0x51cc_c178), 0);
        assert_eq!(rss.queue_of(0x51cc_c179), 1);
        // Without a table size the queue is hash % queues (here 1 372 373 368 % 3 = 1): not
        // what a 128-entry table gives for 3 queues, which is why the size is configurable.
        rss.reta_size = 0;
        assert_eq!(rss.queue_of(0x51cc_c178), 1);
        assert_eq!(Rss::spread(1).queue_of(u32::MAX), 0);
        assert_eq!(
            Rss::spread(0).queue_of(7),
            0,
            "no queues: queue 0, no division by 0"
        );
    }

    #[test]
    fn a_chosen_source_port_lands_on_its_queue() {
        let (a, b) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
        for queues in [1u16, 2, 3, 4, 8, 16, 64] {
            for reta_size in [0u16, 128, 512] {
                let rss = Rss {
                    reta_size,
                    ..Rss::spread(queues)
                };
                for queue in 0..queues {
                    for start in [0u16, 0x11, 0x3fff, 0xffff] {
                        let sport = source_port(&rss, a, b, queue, start).expect("a port exists");
                        assert!(ROCEV2_ENTROPY_PORTS.contains(&sport));
                        assert_eq!(rss.queue_of_roce(a, b, sport), queue, "{queues} queues");
                    }
                }
                assert_eq!(source_port(&rss, a, b, queues, 0), None, "no such queue");
            }
        }
    }

    #[test]
    fn source_ports_differ_per_start_and_direction_matters() {
        let (a, b) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
        let rss = Rss::spread(2);
        let ports: Vec<u16> = (0..8u16)
            .map(|i| source_port(&rss, a, b, 1, i * 0x100).unwrap())
            .collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        // The first port from 0xC000 that the hash sends to queue 1, found the slow way.
        let first = (0xc000..=0xffffu16)
            .find(|&p| toeplitz(&MLX5_DEFAULT_KEY, &ipv4_ports_input(a, b, p, 4791)) % 2 == 1)
            .unwrap();
        assert_eq!(source_port(&rss, a, b, 1, 0), Some(first));
        // The hash is not symmetric: the reverse direction is hashed on its own.
        assert_ne!(rss.hash_roce(a, b, first), rss.hash_roce(b, a, first));
    }
}
