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

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};

use super::entry::{IncomingHeader, MatchEntry};
use super::hash::{BuildWordHasher, premix};
use super::list::{Chain, EntryId, Lookup, MatchList, NIL, Slab};

const HOME_EXACT: u8 = 0;
const HOME_BITS: u8 = 1;
const HOME_WILD: u8 = 2;
/// Homes from here on name mask class `home - HOME_MASK`.
const HOME_MASK: u8 = 3;

/// Up to this many entries the list is searched by a plain posting-order walk.
pub const SHORT_LIST: usize = 6;

/// Distinct ignore masks that get their own hashed class per list.
pub const MAX_MASK_CLASSES: usize = 4;

/// Entries sharing one ignore mask, binned on the bits the mask keeps.
#[derive(Debug, Clone)]
struct MaskClass {
    ignore: u64,
    bins: HashMap<u64, Chain, BuildWordHasher>,
    len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExactKey {
    match_bits: u64,
    nid: u32,
    pid: u32,
}

impl Hash for ExactKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(premix(self.match_bits, self.nid, self.pid));
    }
}

/// Hashed bins on exact fields plus a sequence-merged wildcard chain.
#[derive(Debug, Clone)]
pub struct DeepList {
    slab: Slab,
    exact: HashMap<ExactKey, Chain, BuildWordHasher>,
    by_bits: HashMap<u64, Chain, BuildWordHasher>,
    masks: Vec<MaskClass>,
    wild: Chain,
    /// Every entry in posting order, for the short-list walk.
    order: Chain,
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
            let table = self.slab.capacity().saturating_mul(2);
            self.masks.push(MaskClass {
                ignore: entry.ignore_bits,
                bins: HashMap::with_capacity_and_hasher(table, BuildWordHasher::default()),
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

    /// Walks `slot`'s chain while entries are older than `best_seq`; every
    /// entry on it already agrees with the header's match bits.
    #[inline]
    fn walk_older(
        nodes: &[super::list::Node],
        mut slot: u32,
        hdr: &IncomingHeader,
        best: &mut u32,
        best_seq: &mut u64,
        skip_seq: &mut u64,
        check_bits: bool,
    ) {
        while slot != NIL {
            let node = &nodes[slot as usize];
            if node.seq >= *best_seq {
                return;
            }
            let key_ok = if check_bits {
                node.entry.accepts_key(hdr.match_bits, hdr.initiator)
            } else {
                node.entry.source.accepts(hdr.initiator)
            };
            if key_ok {
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
        // Twice the entries so that tombstones left by removals are cleaned
        // up in place and a later insert never has to grow the table.
        let table = capacity.saturating_mul(2);
        Self {
            slab: Slab::with_capacity(capacity),
            exact: HashMap::with_capacity_and_hasher(table, BuildWordHasher::default()),
            by_bits: HashMap::with_capacity_and_hasher(table, BuildWordHasher::default()),
            masks: Vec::with_capacity(MAX_MASK_CLASSES),
            wild: Chain::EMPTY,
            order: Chain::EMPTY,
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

    fn push(&mut self, entry: MatchEntry) -> Option<EntryId> {
        if self.slab.len() >= self.slab.capacity() {
            return None;
        }
        let home = self.home_for(&entry);
        let id = self.slab.alloc(entry, home)?;
        let nodes = &mut self.slab.nodes;
        self.order.push_back_order(nodes, id.slot);
        match home {
            HOME_EXACT => {
                let key = ExactKey {
                    match_bits: entry.match_bits,
                    nid: entry.source.nid,
                    pid: entry.source.pid,
                };
                self.exact
                    .entry(key)
                    .or_insert(Chain::EMPTY)
                    .push_back(nodes, id.slot);
            }
            HOME_BITS => {
                self.by_bits
                    .entry(entry.match_bits)
                    .or_insert(Chain::EMPTY)
                    .push_back(nodes, id.slot);
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
                    .entry(entry.match_bits & !class.ignore)
                    .or_insert(Chain::EMPTY)
                    .push_back(nodes, id.slot);
                class.len += 1;
            }
        }
        Some(id)
    }

    fn remove(&mut self, id: EntryId) -> Option<MatchEntry> {
        if !self.slab.valid(id) {
            return None;
        }
        let node = &self.slab.nodes[id.slot as usize];
        let (home, match_bits, source) = (node.home, node.entry.match_bits, node.entry.source);
        let nodes = &mut self.slab.nodes;
        self.order.unlink_order(nodes, id.slot);
        match home {
            HOME_EXACT => {
                let key = ExactKey {
                    match_bits,
                    nid: source.nid,
                    pid: source.pid,
                };
                unlink_from_bin(&mut self.exact, key, nodes, id.slot);
            }
            HOME_BITS => {
                unlink_from_bin(&mut self.by_bits, match_bits, nodes, id.slot);
                self.by_bits_len -= 1;
            }
            HOME_WILD => {
                self.wild.unlink(nodes, id.slot);
                self.wild_len -= 1;
            }
            class => {
                let class = &mut self.masks[usize::from(class - HOME_MASK)];
                unlink_from_bin(&mut class.bins, match_bits & !class.ignore, nodes, id.slot);
                class.len -= 1;
            }
        }
        Some(self.slab.release(id.slot))
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
        } else {
            self.find_hashed(hdr)
        }
    }

    fn for_each_in_order(&self, f: &mut dyn FnMut(EntryId, &MatchEntry)) {
        self.slab.for_each_in_order(f);
    }
}

/// Unlinks `slot` from the chain of `bins` under `key`, and drops the bin if that empties it:
/// with one probe of the table (a lookup, then a removal by key, were two; with the node no
/// longer copied whole, callgrind: `tagged8x32` 3 650.1 -> 3 566.0 a message,
/// `lpe_repost1000` 1 024.1 -> 944.1).
#[inline]
fn unlink_from_bin<K: Hash + Eq>(
    bins: &mut HashMap<K, Chain, BuildWordHasher>,
    key: K,
    nodes: &mut [super::list::Node],
    slot: u32,
) {
    if let Entry::Occupied(mut bin) = bins.entry(key) {
        bin.get_mut().unlink(nodes, slot);
        if bin.get().is_empty() {
            bin.remove();
        }
    }
}

impl DeepList {
    #[inline(always)]
    fn find_short(&self, hdr: &IncomingHeader) -> Lookup {
        self.slab
            .first_match(self.order.head, |n| n.order_next, hdr)
    }

    #[inline(never)]
    fn find_hashed(&self, hdr: &IncomingHeader) -> Lookup {
        let nodes = &self.slab.nodes;
        let mut best = NIL;
        let mut best_seq = u64::MAX;
        let mut skip_seq = u64::MAX;

        if !self.exact.is_empty() {
            let key = ExactKey {
                match_bits: hdr.match_bits,
                nid: hdr.initiator.nid,
                pid: hdr.initiator.pid,
            };
            if let Some(chain) = self.exact.get(&key) {
                // Every entry in the bin accepts the key; only length can skip.
                let mut slot = chain.head;
                while slot != NIL {
                    let node = &nodes[slot as usize];
                    if node.entry.fits(hdr.rlength, hdr.remote_offset) {
                        best = slot;
                        best_seq = node.seq;
                        break;
                    }
                    skip_seq = skip_seq.min(node.seq);
                    slot = node.next;
                }
            }
        }

        if self.by_bits_len > 0
            && let Some(chain) = self.by_bits.get(&hdr.match_bits)
        {
            Self::walk_older(
                nodes,
                chain.head,
                hdr,
                &mut best,
                &mut best_seq,
                &mut skip_seq,
                false,
            );
        }

        for class in &self.masks {
            if class.len == 0 {
                continue;
            }
            if let Some(chain) = class.bins.get(&(hdr.match_bits & !class.ignore)) {
                Self::walk_older(
                    nodes,
                    chain.head,
                    hdr,
                    &mut best,
                    &mut best_seq,
                    &mut skip_seq,
                    false,
                );
            }
        }

        if self.wild_len > 0 {
            Self::walk_older(
                nodes,
                self.wild.head,
                hdr,
                &mut best,
                &mut best_seq,
                &mut skip_seq,
                true,
            );
        }

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
}
