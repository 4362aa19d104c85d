//! The project's one seeded pseudo-random generator: SplitMix64 (Steele, Lea and Flood,
//! "Fast splittable pseudorandom number generators", OOPSLA 2014). A 64-bit counter advanced
//! by a fixed odd gamma and passed through a mixing function: small, fast, reproducible for a
//! seed, and good enough for everything Portico draws (seeded memory keys, fault plans, ECN
//! marking, test data, benchmark workloads). Keys that must not be guessed come from the OS
//! (`transport::random_psn`, `getrandom`), never from here.

/// The golden-ratio gamma the counter advances by.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function applied to `x + gamma`: the first value a generator seeded
/// with `x` returns. A stateless, well-mixed hash of `x`.
#[inline]
pub const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A SplitMix64 generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let v = splitmix64(self.state);
        self.state = self.state.wrapping_add(GAMMA);
        v
    }

    /// Uniform in `0..n` (`n > 0`), by modulo: the bias is below 2^-32 for the `n` drawn here.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`, from the top 53 bits (an f64 mantissa).
    #[inline]
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `ppm` parts per million.
    #[inline]
    pub fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.below(1_000_000) < u64::from(ppm)
    }

    /// Fills `buf` with the next bytes of the sequence (eight per draw, little-endian).
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_reference_one() {
        // The first outputs for seed 0, from the authors' reference implementation (also
        // those of Java's SplittableRandom and of Vigna's splitmix64.c).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn draws_stay_in_range_and_a_seed_repeats_its_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = a.clone();
        for n in 1..1000 {
            let x = a.below(n);
            assert!(x < n);
            assert_eq!(x, b.below(n));
            let u = a.next_unit();
            assert!((0.0..1.0).contains(&u));
            b.next_unit();
        }
        assert!(!a.chance(0));
        assert!(a.chance(1_000_000));
        let (mut x, mut y) = ([0u8; 13], [0u8; 13]);
        a.fill(&mut x);
        b.chance(0);
        b.chance(1_000_000);
        b.fill(&mut y);
        assert_eq!(x, y);
        assert_ne!(x, [0; 13]);
    }
}
