//! A small multiply-rotate hasher for the hashed bins of the deep lists, the
//! unexpected list and the persistent-entry cache. Keys are match bits and
//! process ids chosen by peers we already trust to be in the job, so a keyed
//! (SipHash) hasher buys nothing and costs several nanoseconds per lookup.

use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x517c_c1b7_2722_0a95;

/// Word-at-a-time multiply hasher. Each word's high bits are folded down
/// before the multiply and the product's high half is folded into the low
/// half, so that the low bits the table indexes with depend on every input
/// bit (tags often differ only in high bits, e.g. the context field of MPI
/// match bits). Exact-bin and cache keys are premixed into one word.
#[derive(Default, Clone, Copy)]
pub struct WordHasher {
    state: u64,
}

impl WordHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        // Folding high bits down first lets them reach the low product bits
        // (a multiply only carries upwards).
        let folded = word ^ (word >> 29);
        self.state = (self.state.rotate_left(5) ^ folded).wrapping_mul(K);
    }
}

/// Premixes a (match bits, nid, pid) triple into one word so that exact-bin
/// keys cost one hashing round instead of three.
#[inline]
pub(crate) fn premix(match_bits: u64, nid: u32, pid: u32) -> u64 {
    let id = (u64::from(nid) << 32) | u64::from(pid);
    match_bits ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17)
}

/// [`WordHasher`]'s hash of one word: the index of a deep list's bin is its low bits.
#[inline]
pub(crate) fn mix(word: u64) -> u64 {
    let mut h = WordHasher::default();
    h.add(word);
    h.finish()
}

impl Hasher for WordHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // The table indexes with the low bits and tags with the top seven;
        // mixing the well-mixed high half into the low half serves both.
        self.state ^ (self.state >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// `BuildHasher` for `std::collections::HashMap`.
pub type BuildWordHasher = BuildHasherDefault<WordHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(v: T) -> u64 {
        BuildWordHasher::default().hash_one(v)
    }

    #[test]
    fn high_bit_changes_reach_low_bits() {
        // Keys that differ only in the context field (top bits) must spread
        // over buckets, not pile into one.
        let buckets: std::collections::HashSet<u64> = (0..64u64)
            .map(|ctx| hash((ctx << 48) | 7) & 0x3ff)
            .collect();
        assert!(buckets.len() > 48, "{}", buckets.len());
        let tags: std::collections::HashSet<u64> =
            (0..64u64).map(|tag| hash(tag) & 0x3ff).collect();
        assert!(tags.len() > 48, "{}", tags.len());
    }

    #[test]
    fn mix_is_the_hasher_s_hash_of_one_word() {
        for word in [0, 1, 7, 1 << 48, u64::MAX, 0x1234_5678_9abc_def0] {
            assert_eq!(mix(word), hash(word));
        }
    }
}
