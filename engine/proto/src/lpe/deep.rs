//! The deep-queue structure: an entry list that stays fast with thousands of
//! posted entries and wildcards while keeping Portals/MPI posting order.
//!
//! Entries are split by what they can match:
//! * exact bins: no ignore bits and an exact source, hashed on
//!   (match bits, nid, pid) — the common MPI receive;
//! * bits bins: no ignore bits but a wildcard source, hashed on match bits;
//! * mask classes: entries with ignore bits, grouped by their ignore mask
//!   (MPI uses few: ANY_SOURCE, ANY_TAG, both) and hashed on the bits the
//!   mask keeps, so a wildcard receive costs one probe per mask in use;
//! * the wildcard chain: entries whose mask did not get a class (more than
//!   [`MAX_MASK_CLASSES`] distinct masks live at once), walked in order.
//!
//! Each part is a FIFO chain in posting order and every entry carries the
//! list's posting sequence number. While the list holds at most
//! [`SHORT_LIST`] entries (the common case in real MPI runs), a plain walk of
//! a posting-order chain through all entries is cheaper than hashing and is
//! used instead. A lookup takes the first fitting entry of
//! the exact bin, then walks each other candidate chain only while its
//! entries are older than the best candidate so far: the earliest posted
//! matching entry wins, exactly as in a linear walk.

use super::entry::{IncomingHeader, MatchEntry};
use super::hash::{mix, premix};
use super::list::{Chain, EntryId, Lookup, MatchList, NIL, Node, Slab};

const HOME_EXACT: u8 = 0;
const HOME_BITS: u8 = 1;
const HOME_WILD: u8 = 2;
/// Homes from here on name mask class `home - HOME_MASK`.
const HOME_MASK: u8 = 3;

/// Up to this many entries the list is searched by a plain posting-order walk.
pub const SHORT_LIST: usize = 6;

/// Distinct ignore masks that get their own hashed class per list.
pub const MAX_MASK_CLASSES: usize = 4;

/// A part's bins: a fixed power-of-two table of chain ends, indexed by a hash of the part's
/// key, with the chains threaded through the nodes' own `prev`/`next` links. Entries whose
/// keys share a bin share its chain, in posting order, so a lookup skips the other keys'
/// entries on the way; with at least as many bins as the list holds entries, a chain is short.
///
/// Linking and unlinking an entry touch its bin and its neighbours and nothing else: no probe
/// sequence, no tombstones, never a rehash (a `HashMap` of chains was three probes a
/// use-once match and re-post).
#[derive(Debug, Clone)]
struct Bins {
    /// Per bin, its chain's first and last slot, each stored plus one (0: none), so that a new
    /// table is zeroed memory, which the system maps as it is first written: an endpoint
    /// sized for 16 K entries holds in memory the bins it has used.
    ends: Box<[[u32; 2]]>,
    mask: usize,
}

impl Bins {
    fn with_capacity(entries: usize) -> Self {
        let n = entries.max(1).next_power_of_two();
        Self {
            ends: vec![[0u32; 2]; n].into_boxed_slice(),
            mask: n - 1,
        }
    }

    #[inline(always)]
    fn bin(&self, key: u64) -> usize {
        mix(key) as usize & self.mask
    }

    /// The first slot of the chain `key`'s bin holds (`NIL` when empty).
    #[inline(always)]
    fn head(&self, key: u64) -> u32 {
        self.ends[self.bin(key)][0].wrapping_sub(1)
    }

    /// Runs `f` on the chain of bin `bin`.
    #[inline(always)]
    fn on_chain(&mut self, bin: usize, f: impl FnOnce(&mut Chain)) {
        let ends = &mut self.ends[bin];
        let mut chain = Chain {
            head: ends[0].wrapping_sub(1),
            tail: ends[1].wrapping_sub(1),
        };
        f(&mut chain);
        *ends = [chain.head.wrapping_add(1), chain.tail.wrapping_add(1)];
    }

    /// Links `slot` at the end of `key`'s bin, and notes the bin in its node for
    /// [`Bins::unlink`].
    #[inline(always)]
    fn push_back(&mut self, key: u64, nodes: &mut [Node], slot: u32) {
        let bin = self.bin(key);
        nodes[slot as usize].bin = bin as u32;
        self.on_chain(bin, |chain| chain.push_back(nodes, slot));
    }

    /// Unlinks `slot` from the bin its node notes: the key is not hashed again (callgrind,
    /// `tagged8x32`: 2 791.3 -> 2 775.3, `lpe_repost1000` 767.7 -> 752.0).
    #[inline(always)]
    fn unlink(&mut self, nodes: &mut [Node], slot: u32) {
        let bin = nodes[slot as usize].bin as usize;
        self.on_chain(bin, |chain| chain.unlink(nodes, slot));
    }
}

/// Entries sharing one ignore mask, binned on the bits the mask keeps.
#[derive(Debug, Clone)]
struct MaskClass {
    ignore: u64,
    bins: Bins,
    len: usize,
}

/// Hashed bins on exact fields plus a sequence-merged wildcard chain.
#[derive(Debug, Clone)]
pub struct DeepList {
    slab: Slab,
    exact: Bins,
    by_bits: Bins,
    masks: Vec<MaskClass>,
    wild: Chain,
    /// Every entry in posting order, for the short-list walk.
    order: Chain,
    exact_len: usize,
    by_bits_len: usize,
    wild_len: usize,
}

impl DeepList {
    /// Where a new entry goes; may create a mask class (allocates its table
    /// once, on the command path, never while matching).
    fn home_for(&mut self, entry: &MatchEntry) -> u8 {
        if entry.ignore_bits == 0 {
            return if entry.source.is_exact() {
                HOME_EXACT
            } else {
                HOME_BITS
            };
        }
        if let Some(i) = self
            .masks
            .iter()
            .position(|m| m.ignore == entry.ignore_bits)
        {
            return HOME_MASK + i as u8;
        }
        // Reuse an emptied class before adding one.
        if let Some(i) = self.masks.iter().position(|m| m.len == 0) {
            self.masks[i].ignore = entry.ignore_bits;
            return HOME_MASK + i as u8;
        }
        if self.masks.len() < MAX_MASK_CLASSES {
            self.masks.push(MaskClass {
                ignore: entry.ignore_bits,
                bins: Bins::with_capacity(self.slab.capacity()),
                len: 0,
            });
            return HOME_MASK + (self.masks.len() - 1) as u8;
        }
        HOME_WILD
    }

    /// Entries that need the ordered wildcard walk (for diagnostics).
    pub fn wildcard_len(&self) -> usize {
        self.wild_len
    }

    /// Walks `slot`'s chain while entries are older than `best_seq` (a chain is in posting
    /// order), for the first that accepts the header and fits it. A bin's chain also holds
    /// the entries of other keys that share the bin, so each entry's key is checked.
    #[inline]
    fn walk_older(
        nodes: &[Node],
        mut slot: u32,
        hdr: &IncomingHeader,
        best: &mut u32,
        best_seq: &mut u64,
        skip_seq: &mut u64,
    ) {
        while slot != NIL {
            let node = &nodes[slot as usize];
            if node.seq >= *best_seq {
                return;
            }
            if node.entry.accepts_key(hdr.match_bits, hdr.initiator) {
                if node.entry.fits(hdr.rlength, hdr.remote_offset) {
                    *best = slot;
                    *best_seq = node.seq;
                    return;
                }
                *skip_seq = (*skip_seq).min(node.seq);
            }
            slot = node.next;
        }
    }
}

impl MatchList for DeepList {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            slab: Slab::with_capacity(capacity),
            exact: Bins::with_capacity(capacity),
            by_bits: Bins::with_capacity(capacity),
            masks: Vec::with_capacity(MAX_MASK_CLASSES),
            wild: Chain::EMPTY,
            order: Chain::EMPTY,
            exact_len: 0,
            by_bits_len: 0,
            wild_len: 0,
        }
    }

    fn capacity(&self) -> usize {
        self.slab.capacity()
    }

    fn len(&self) -> usize {
        self.slab.len()
    }

    fn push(&mut self, entry: &MatchEntry) -> Option<EntryId> {
        if self.slab.len() >= self.slab.capacity() {
            return None;
        }
        let home = self.home_for(entry);
        let id = self.slab.alloc(entry, home)?;
        let nodes = &mut self.slab.nodes;
        self.order.push_back_order(nodes, id.slot);
        match home {
            HOME_EXACT => {
                let key = premix(entry.match_bits, entry.source.nid, entry.source.pid);
                self.exact.push_back(key, nodes, id.slot);
                self.exact_len += 1;
            }
            HOME_BITS => {
                self.by_bits.push_back(entry.match_bits, nodes, id.slot);
                self.by_bits_len += 1;
            }
            HOME_WILD => {
                self.wild.push_back(nodes, id.slot);
                self.wild_len += 1;
            }
            class => {
                let class = &mut self.masks[usize::from(class - HOME_MASK)];
                class
                    .bins
                    .push_back(entry.match_bits & !class.ignore, nodes, id.slot);
                class.len += 1;
            }
        }
        Some(id)
    }

    fn remove(&mut self, id: EntryId) -> Option<MatchEntry> {
        let entry = *self.get(id)?;
        self.unlink(id);
        Some(entry)
    }

    /// The entry is not copied out: a use-once match discarded the copy (callgrind,
    /// `tagged8x32`: 21 instructions a message).
    fn unlink(&mut self, id: EntryId) -> bool {
        if !self.slab.valid(id) {
            return false;
        }
        let home = self.slab.nodes[id.slot as usize].home;
        let nodes = &mut self.slab.nodes;
        self.order.unlink_order(nodes, id.slot);
        match home {
            HOME_EXACT => {
                self.exact.unlink(nodes, id.slot);
                self.exact_len -= 1;
            }
            HOME_BITS => {
                self.by_bits.unlink(nodes, id.slot);
                self.by_bits_len -= 1;
            }
            HOME_WILD => {
                self.wild.unlink(nodes, id.slot);
                self.wild_len -= 1;
            }
            class => {
                let class = &mut self.masks[usize::from(class - HOME_MASK)];
                class.bins.unlink(nodes, id.slot);
                class.len -= 1;
            }
        }
        self.slab.release(id.slot);
        true
    }

    #[inline]
    fn get(&self, id: EntryId) -> Option<&MatchEntry> {
        self.slab.get(id).map(|n| &n.entry)
    }

    #[inline]
    fn set_offset(&mut self, id: EntryId, offset: u64) {
        self.slab.set_offset(id, offset);
    }

    #[inline(always)]
    fn find(&self, hdr: &IncomingHeader) -> Lookup {
        if self.slab.len() <= SHORT_LIST {
            self.find_short(hdr)
        } else if self.exact_len == self.slab.len() {
            self.find_exact(hdr)
        } else {
            self.find_hashed(hdr)
        }
    }

    fn for_each_in_order(&self, f: &mut dyn FnMut(EntryId, &MatchEntry)) {
        self.slab.for_each_in_order(f);
    }
}

impl DeepList {
    #[inline(always)]
    fn find_short(&self, hdr: &IncomingHeader) -> Lookup {
        self.slab
            .first_match(self.order.head, |n| n.order_next, hdr)
    }

    /// A deep list of exact entries only (the common MPI receive: a tag and a source each):
    /// the key's bin is the only candidate chain, and nothing is merged with it by sequence.
    /// Inline; the other parts' look (`find_hashed`) is out of line. As a call of its own,
    /// with the other parts' set-up and its six saved registers, the lookup was 118
    /// instructions a message, against 43 inline (callgrind, `tagged8x32`: 2 964.4 ->
    /// 2 889.5).
    #[inline(always)]
    fn find_exact(&self, hdr: &IncomingHeader) -> Lookup {
        let (best, best_seq, skip_seq) = self.exact_first(hdr);
        self.lookup(best, best_seq, skip_seq)
    }

    /// The exact bin's first entry of `hdr`'s key that fits it, and its sequence number
    /// (`NIL`, `u64::MAX` when none); an entry of the key before it that does not fit is a
    /// length skip (the third value: the earliest such entry's sequence number).
    #[inline(always)]
    fn exact_first(&self, hdr: &IncomingHeader) -> (u32, u64, u64) {
        let nodes = &self.slab.nodes;
        let mut skip_seq = u64::MAX;
        let key = premix(hdr.match_bits, hdr.initiator.nid, hdr.initiator.pid);
        let mut slot = self.exact.head(key);
        while slot != NIL {
            let node = &nodes[slot as usize];
            if node.entry.accepts_key(hdr.match_bits, hdr.initiator) {
                if node.entry.fits(hdr.rlength, hdr.remote_offset) {
                    return (slot, node.seq, skip_seq);
                }
                skip_seq = skip_seq.min(node.seq);
            }
            slot = node.next;
        }
        (NIL, u64::MAX, skip_seq)
    }

    #[inline(always)]
    fn lookup(&self, best: u32, best_seq: u64, skip_seq: u64) -> Lookup {
        if best == NIL {
            Lookup {
                hit: None,
                length_skip_before_hit: false,
            }
        } else {
            Lookup {
                hit: Some(self.slab.id_of(best)),
                length_skip_before_hit: skip_seq < best_seq,
            }
        }
    }

    #[inline(never)]
    fn find_hashed(&self, hdr: &IncomingHeader) -> Lookup {
        let nodes = &self.slab.nodes;
        let (mut best, mut best_seq, mut skip_seq) = if self.exact_len > 0 {
            self.exact_first(hdr)
        } else {
            (NIL, u64::MAX, u64::MAX)
        };

        if self.by_bits_len > 0 {
            let head = self.by_bits.head(hdr.match_bits);
            Self::walk_older(nodes, head, hdr, &mut best, &mut best_seq, &mut skip_seq);
        }

        for class in &self.masks {
            if class.len == 0 {
                continue;
            }
            let head = class.bins.head(hdr.match_bits & !class.ignore);
            Self::walk_older(nodes, head, hdr, &mut best, &mut best_seq, &mut skip_seq);
        }

        if self.wild_len > 0 {
            let head = self.wild.head;
            Self::walk_older(nodes, head, hdr, &mut best, &mut best_seq, &mut skip_seq);
        }

        self.lookup(best, best_seq, skip_seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lpe::entry::{MatchId, ProcessId};

    #[test]
    fn keys_that_share_a_bin_are_told_apart_and_keep_posting_order() {
        let from = ProcessId::rank(1);
        let exact = |tag: u64, cookie: u64| {
            MatchEntry::new(tag, 0, 64, cookie).with_source(MatchId::exact(from))
        };
        let mut list = DeepList::with_capacity(8);
        let bins = Bins::with_capacity(8);
        let bin = |tag: u64| bins.bin(premix(tag, from.nid, from.pid));
        // A second tag in tag 1's bin (8 bins), and four in others.
        let other = (2..).find(|&t| bin(t) == bin(1)).unwrap();
        let fillers: Vec<u64> = (2..).filter(|&t| bin(t) != bin(1)).take(4).collect();
        let first = list.push(&exact(1, 10)).unwrap();
        list.push(&exact(other, 20)).unwrap();
        list.push(&exact(1, 30)).unwrap();
        for t in fillers {
            list.push(&exact(t, t)).unwrap();
        }
        assert!(
            list.len() > SHORT_LIST,
            "the hashed lookup, not the short walk"
        );
        let cookie = |list: &DeepList, tag: u64| {
            let hit = list.find(&IncomingHeader::put(from, tag, 8)).hit?;
            list.get(hit).map(|e| e.cookie)
        };
        assert_eq!(cookie(&list, 1), Some(10));
        assert_eq!(cookie(&list, other), Some(20));
        list.remove(first).unwrap();
        assert_eq!(cookie(&list, 1), Some(30));
        assert_eq!(cookie(&list, other), Some(20));
    }
}
