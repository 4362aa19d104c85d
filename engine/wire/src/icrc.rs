//! CRC-32 and the RoCEv2 invariant CRC (ICRC).
//!
//! Every RoCEv2 packet ends with a 4-byte ICRC that protects the fields no
//! router or switch may change. It is the receiver's only end-to-end integrity
//! check (the UDP checksum is normally 0), so Portico checks it on every received
//! packet and computes it on every sent one.
//!
//! Recipe (the same as Linux rxe and scapy, checked against a ConnectX-4 Lx
//! capture): standard CRC-32 (IEEE 802.3: reflected polynomial 0xEDB88320,
//! initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF, i.e. zlib's `crc32`) over
//!
//! 1. eight 0xFF bytes standing in for the InfiniBand LRH that RoCEv2 lacks;
//! 2. the IPv4 header with TOS (DSCP+ECN), TTL and header checksum replaced by
//!    all-ones bytes;
//! 3. the UDP header with the checksum replaced by 0xFFFF;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) replaced by 0xFF;
//! 5. everything after the BTH up to the ICRC: extension headers, payload, pad.
//!
//! Masking the fields that switches rewrite (ECN marking, DSCP remarking, TTL,
//! the recomputed IP checksum, FECN/BECN) is what lets congestion marking happen
//! in flight without invalidating the packet. The result is stored
//! little-endian: the low byte of the CRC value is the first ICRC byte on the wire.
//!
//! Runs shorter than 64 bytes go through a table-driven CRC (slicing by 8, tables
//! built at compile time); longer ones go to `crc32fast`, which folds with PCLMULQDQ
//! where the CPU has it. Whole frames are fed in one pass with their masked bytes
//! already set (`roce::icrc_over`), so most of a frame takes the fast road. The tests
//! compare both paths with each other and with the golden frames.

/// The reflected IEEE 802.3 polynomial.
const POLY: u32 = 0xedb8_8320;

/// `TABLES[0]` is the classic byte-at-a-time table; `TABLES[k][b]` is the CRC
/// of byte `b` followed by `k` zero bytes, which lets eight bytes be folded at once.
static TABLES: [[u32; 256]; 8] = build_tables();

/// The byte-at-a-time table (`TABLES[0]`), for `const` builders elsewhere in `wire`.
pub(crate) const TABLE0: [u32; 256] = build_tables()[0];

const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
}

/// Feed one byte into a CRC register.
const fn step(state: u32, byte: u8) -> u32 {
    (state >> 8) ^ TABLES[0][((state ^ byte as u32) & 0xff) as usize]
}

/// Feed bytes one at a time (usable in `const` context).
pub(crate) const fn update_bytewise(mut state: u32, data: &[u8]) -> u32 {
    let mut i = 0;
    while i < data.len() {
        state = step(state, data[i]);
        i += 1;
    }
    state
}

/// From this many bytes on, `Crc32::update` hands the work to `crc32fast`.
const FAST_FROM: usize = 64;

/// A running CRC-32 (IEEE 802.3 / zlib).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32 {
    /// The CRC register before the final inversion.
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    pub const fn new() -> Crc32 {
        Crc32 { state: 0xffff_ffff }
    }

    /// Continue from a raw register value (as Linux rxe seeds with 0xDEBB20E3).
    pub const fn from_register(state: u32) -> Crc32 {
        Crc32 { state }
    }

    /// The raw register value (not yet inverted).
    pub const fn register(&self) -> u32 {
        self.state
    }

    pub fn update(&mut self, data: &[u8]) {
        if data.len() >= FAST_FROM {
            // Payloads: crc32fast folds with PCLMULQDQ where the CPU has it, several times
            // faster than the tables (it keeps the finished value, hence the inversions).
            let mut h = crc32fast::Hasher::new_with_initial(!self.state);
            h.update(data);
            self.state = !h.finalize();
            return;
        }
        let mut state = self.state;
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let lo = state ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            state = TABLES[7][(lo & 0xff) as usize]
                ^ TABLES[6][((lo >> 8) & 0xff) as usize]
                ^ TABLES[5][((lo >> 16) & 0xff) as usize]
                ^ TABLES[4][(lo >> 24) as usize]
                ^ TABLES[3][c[4] as usize]
                ^ TABLES[2][c[5] as usize]
                ^ TABLES[1][c[6] as usize]
                ^ TABLES[0][c[7] as usize];
        }
        self.state = update_bytewise(state, chunks.remainder());
    }

    /// Feed `count` copies of `byte` (used for masked fields and pad bytes).
    pub fn update_repeat(&mut self, byte: u8, count: usize) {
        for _ in 0..count {
            self.state = step(self.state, byte);
        }
    }

    /// The CRC value (register inverted).
    pub const fn finish(&self) -> u32 {
        !self.state
    }
}

/// A kernel that continues a raw CRC-32 register (as [`Crc32::register`]) over bytes; the
/// engine passes a faster one than [`fold_tables`] where its CPU has one (`pmem::crc`).
pub type Fold = fn(u32, &[u8]) -> u32;

/// [`Fold`] by this module's tables (and `crc32fast` for long runs).
pub fn fold_tables(reg: u32, data: &[u8]) -> u32 {
    let mut crc = Crc32::from_register(reg);
    crc.update(data);
    crc.register()
}

/// CRC-32 of `data` in one call; equals zlib's `crc32(data)`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = Crc32::new();
    crc.update(data);
    crc.finish()
}

/// Length of the dummy LRH the recipe prepends.
pub const LRH_LEN: usize = 8;

/// The CRC register after the eight 0xFF bytes of the dummy LRH. Linux rxe
/// starts from this constant instead of feeding the bytes.
pub const LRH_SEED: u32 = update_bytewise(0xffff_ffff, &[0xff; LRH_LEN]);

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// IPv4 header offsets the ICRC replaces with 0xFF: TOS, TTL, checksum.
const IPV4_MASKED: [usize; 4] = [1, 8, 10, 11];
/// UDP header offsets the ICRC replaces with 0xFF: checksum.
const UDP_MASKED: [usize; 2] = [6, 7];
/// BTH offset the ICRC replaces with 0xFF: FECN, BECN, reserved.
const BTH_MASKED: [usize; 1] = [super::bth::ICRC_MASKED_BYTE];

/// Length of the prefix a [`MaskedFold`] masks: the dummy LRH and the base headers (IPv4,
/// UDP, BTH) after it. A frame's bytes from [`LRH_LEN`] before its IPv4 header stand in for
/// the LRH, all of them masked.
pub const MASKED_PREFIX_LEN: usize = LRH_LEN + 20 + 8 + 12;

/// Ones at the bytes of the prefix the ICRC covers as all-ones: the whole dummy LRH, and the
/// variant fields of the IPv4 header, the UDP header and the BTH.
pub const PREFIX_MASK: [u8; MASKED_PREFIX_LEN] = prefix_mask();

const fn prefix_mask() -> [u8; MASKED_PREFIX_LEN] {
    let mut m = [0u8; MASKED_PREFIX_LEN];
    let mut i = 0;
    while i < LRH_LEN {
        m[i] = 0xff;
        i += 1;
    }
    let layers: [(usize, &[usize]); 3] = [
        (LRH_LEN, &IPV4_MASKED),
        (LRH_LEN + 20, &UDP_MASKED),
        (LRH_LEN + 28, &BTH_MASKED),
    ];
    let mut l = 0;
    while l < layers.len() {
        let (at, masked) = layers[l];
        let mut j = 0;
        while j < masked.len() {
            m[at + masked[j]] = 0xff;
            j += 1;
        }
        l += 1;
    }
    m
}

/// A kernel that continues a raw CRC-32 register over bytes whose first
/// [`MASKED_PREFIX_LEN`] are or-ed with a mask ([`PREFIX_MASK`]): a received frame's ICRC in
/// one pass over the frame as it lies (`pmem::crc::update_masked` where the CPU has
/// PCLMULQDQ).
pub type MaskedFold = fn(u32, &[u8], &[u8; MASKED_PREFIX_LEN]) -> u32;

/// [`MaskedFold`] by this module's tables: the prefix masked in a copy, then the rest.
pub fn fold_masked_tables(reg: u32, data: &[u8], mask: &[u8; MASKED_PREFIX_LEN]) -> u32 {
    let n = data.len().min(MASKED_PREFIX_LEN);
    let mut head = [0u8; MASKED_PREFIX_LEN];
    for ((h, d), m) in head.iter_mut().zip(&data[..n]).zip(mask) {
        *h = d | m;
    }
    fold_tables(fold_tables(reg, &head[..n]), &data[n..])
}

/// An ICRC under construction. Feed the layers in wire order:
/// [`Icrc::ipv4_header`], [`Icrc::udp_header`], [`Icrc::bth`], then
/// [`Icrc::update`] for everything up to the ICRC (possibly in several
/// segments, e.g. one per mbuf), then [`Icrc::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Icrc {
    crc: Crc32,
}

impl Default for Icrc {
    fn default() -> Self {
        Self::new()
    }
}

impl Icrc {
    /// Start with the dummy LRH already accounted for.
    pub const fn new() -> Icrc {
        Icrc {
            crc: Crc32::from_register(LRH_SEED),
        }
    }

    fn update_masked(&mut self, data: &[u8], masked: &[usize]) {
        let mut start = 0;
        for &offset in masked {
            if offset >= data.len() {
                break;
            }
            self.crc.update(&data[start..offset]);
            self.crc.update_repeat(0xff, 1);
            start = offset + 1;
        }
        self.crc.update(&data[start.min(data.len())..]);
    }

    /// Feed the IPv4 header (options included, if any) with its variant fields masked.
    pub fn ipv4_header(&mut self, header: &[u8]) {
        self.update_masked(header, &IPV4_MASKED);
    }

    /// Feed the 8-byte UDP header with its checksum masked.
    pub fn udp_header(&mut self, header: &[u8]) {
        self.update_masked(header, &UDP_MASKED);
    }

    /// Feed the 12-byte BTH with its FECN/BECN byte masked.
    pub fn bth(&mut self, header: &[u8]) {
        self.update_masked(header, &BTH_MASKED);
    }

    /// Feed bytes covered as they are: extension headers, payload, pad.
    pub fn update(&mut self, data: &[u8]) {
        self.crc.update(data);
    }

    /// Feed `count` zero pad bytes without materialising them.
    pub fn update_zeros(&mut self, count: usize) {
        self.crc.update_repeat(0, count);
    }

    /// The ICRC value; write it with [`to_wire`].
    pub const fn finish(&self) -> u32 {
        self.crc.finish()
    }
}

/// The four ICRC bytes as they appear on the wire (little-endian).
pub const fn to_wire(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

/// Read an ICRC from its four wire bytes.
pub const fn from_wire(bytes: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_crc32_check_value() {
        // The standard CRC-32 check value.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        // zlib.crc32(b"The quick brown fox jumps over the lazy dog")
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414f_a339
        );
    }

    #[test]
    fn test_fast_and_table_paths_agree() {
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..300).chain([1023, 1024, 4096, 4999]) {
            for split in [0, 1, 63, 64, 65] {
                let split = split.min(len);
                let mut crc = Crc32::new();
                crc.update(&data[..split]);
                crc.update(&data[split..len]);
                let table = !update_bytewise(0xffff_ffff, &data[..len]);
                assert_eq!(crc.finish(), table, "len {len} split {split}");
            }
        }
    }

    /// The mask byte by byte: the dummy LRH, then IPv4 TOS (9), TTL (16) and checksum (18,
    /// 19), the UDP checksum (34, 35) and the BTH's FECN/BECN byte (40), counted from the
    /// LRH's first byte.
    #[test]
    fn the_prefix_mask_covers_the_lrh_and_the_variant_fields() {
        let ones: Vec<usize> = (0..MASKED_PREFIX_LEN)
            .filter(|&i| PREFIX_MASK[i] != 0)
            .collect();
        assert_eq!(ones, [0, 1, 2, 3, 4, 5, 6, 7, 9, 16, 18, 19, 34, 35, 40]);
        assert!(PREFIX_MASK.iter().all(|&b| b == 0 || b == 0xff));
        // Over the LRH alone, from the usual start: the register rxe starts from.
        assert_eq!(
            fold_masked_tables(0xffff_ffff, &[0; 8], &PREFIX_MASK),
            LRH_SEED
        );
    }

    #[test]
    fn test_lrh_seed_matches_rxe() {
        assert_eq!(LRH_SEED, 0xdebb_20e3);
        let mut crc = Crc32::new();
        crc.update(&[0xff; 8]);
        assert_eq!(crc.register(), LRH_SEED);
    }

    #[test]
    fn test_wire_order() {
        assert_eq!(to_wire(0x2a00_fd82), [0x82, 0xfd, 0x00, 0x2a]);
        assert_eq!(from_wire([0x82, 0xfd, 0x00, 0x2a]), 0x2a00_fd82);
    }

    #[test]
    fn test_masking_equals_explicit_ffs() {
        let ip: [u8; 20] = core::array::from_fn(|i| i as u8 * 7);
        let udp: [u8; 8] = core::array::from_fn(|i| 0x40 + i as u8);
        let bth: [u8; 12] = core::array::from_fn(|i| 0x80 + i as u8);
        let mut icrc = Icrc::new();
        icrc.ipv4_header(&ip);
        icrc.udp_header(&udp);
        icrc.bth(&bth);
        icrc.update(b"payload");

        let mut explicit = vec![0xffu8; 8];
        let mut ip_m = ip;
        for i in [1, 8, 10, 11] {
            ip_m[i] = 0xff;
        }
        let mut udp_m = udp;
        udp_m[6] = 0xff;
        udp_m[7] = 0xff;
        let mut bth_m = bth;
        bth_m[4] = 0xff;
        explicit.extend_from_slice(&ip_m);
        explicit.extend_from_slice(&udp_m);
        explicit.extend_from_slice(&bth_m);
        explicit.extend_from_slice(b"payload");
        assert_eq!(icrc.finish(), crc32(&explicit));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn prop_sliced_equals_bytewise(data in proptest::collection::vec(any::<u8>(), 0..100),
                                       split in 0usize..100) {
            let bytewise = !update_bytewise(0xffff_ffff, &data);
            prop_assert_eq!(crc32(&data), bytewise);
            let split = split.min(data.len());
            let mut crc = Crc32::new();
            crc.update(&data[..split]);
            crc.update(&data[split..]);
            prop_assert_eq!(crc.finish(), bytewise);
        }
    }
}
