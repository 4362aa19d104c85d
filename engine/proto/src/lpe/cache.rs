//! The persistent list-entry cache of a processing engine (default 256
//! entries). A slot is allocated when a network request's first match is a
//! persistent priority entry; it is freed when that entry unlinks, and when the
//! cache is full the next slot in round-robin order is evicted. A hit lets a
//! request bypass the list search and the per-endpoint block bit (see the
//! engine module).
//!
//! The key is the seed's on a non-matching endpoint: the endpoint alone (every
//! entry there takes any message, so one slot answers every initiator). On a
//! matching endpoint, which the seed's cache leaves out, it is (endpoint, match
//! bits, initiator): MPI's persistent receives hit there too.
//!
//! A cached answer stays right while the entry is linked: entries posted
//! earlier that did not match the key can never start to (match bits and
//! source do not change), and entries posted later come after it. Results
//! that depended on the message length (an earlier no-truncate entry was too
//! small) are never inserted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::entry::{EndpointIndex, IncomingHeader};
use super::hash::{BuildWordHasher, premix};
use super::list::EntryId;

/// Default number of cache slots, as in the NIC.
pub const DEFAULT_CACHE_ENTRIES: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CacheKey {
    ep: u16,
    match_bits: u64,
    nid: u32,
    pid: u32,
}

impl Hash for CacheKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        let ep = u64::from(self.ep).rotate_right(16);
        state.write_u64(premix(self.match_bits ^ ep, self.nid, self.pid));
    }
}

impl CacheKey {
    /// `matching`: the endpoint's entries carry match bits (otherwise the key is the
    /// endpoint alone).
    #[inline]
    fn new(ep: EndpointIndex, hdr: &IncomingHeader, matching: bool) -> Self {
        if matching {
            Self {
                ep: ep.0,
                match_bits: hdr.match_bits,
                nid: hdr.initiator.nid,
                pid: hdr.initiator.pid,
            }
        } else {
            Self {
                ep: ep.0,
                match_bits: 0,
                nid: 0,
                pid: 0,
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    key: CacheKey,
    entry: EntryId,
    live: bool,
}

/// Hit/miss/eviction counts, summed when read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    pub frees: u64,
}

/// Fixed-size cache with round-robin eviction.
#[derive(Debug, Clone)]
pub struct PersistentCache {
    slots: Vec<Slot>,
    index: HashMap<CacheKey, u32, BuildWordHasher>,
    free: Vec<u32>,
    next_victim: usize,
    stats: CacheStats,
}

impl PersistentCache {
    /// `capacity` 0 disables the cache.
    pub fn new(capacity: usize) -> Self {
        let blank = Slot {
            key: CacheKey {
                ep: 0,
                match_bits: 0,
                nid: 0,
                pid: 0,
            },
            entry: EntryId {
                slot: 0,
                generation: 0,
            },
            live: false,
        };
        Self {
            slots: vec![blank; capacity],
            index: HashMap::with_capacity_and_hasher(capacity * 2, BuildWordHasher::default()),
            free: (0..capacity as u32).rev().collect(),
            next_victim: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Looks up without counting (used by the arbiter to decide whether a
    /// blocked request may proceed). `matching`: the endpoint is a matching one.
    #[inline]
    pub fn peek(&self, ep: EndpointIndex, hdr: &IncomingHeader, matching: bool) -> Option<EntryId> {
        if self.index.is_empty() {
            return None;
        }
        self.index
            .get(&CacheKey::new(ep, hdr, matching))
            .map(|&s| self.slots[s as usize].entry)
    }

    /// Counts one request's answer: a slot found and its entry taken the message (a hit),
    /// or not (a miss: no slot, or the cached entry refused the message, which was then
    /// searched for).
    #[inline]
    pub fn count(&mut self, hit: bool) {
        if hit {
            self.stats.hits += 1;
        } else {
            self.stats.misses += 1;
        }
    }

    pub fn insert(
        &mut self,
        ep: EndpointIndex,
        hdr: &IncomingHeader,
        matching: bool,
        entry: EntryId,
    ) {
        if self.slots.is_empty() {
            return;
        }
        let key = CacheKey::new(ep, hdr, matching);
        if let Some(&s) = self.index.get(&key) {
            self.slots[s as usize].entry = entry;
            return;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let victim = self.next_victim;
                self.next_victim = (victim + 1) % self.slots.len();
                let old = self.slots[victim].key;
                self.index.remove(&old);
                self.stats.evictions += 1;
                victim as u32
            }
        };
        self.slots[slot as usize] = Slot {
            key,
            entry,
            live: true,
        };
        self.index.insert(key, slot);
        self.stats.inserts += 1;
    }

    /// Frees every slot that names `entry` on `ep` (the entry unlinked).
    pub fn free_entry(&mut self, ep: EndpointIndex, entry: EntryId) {
        if self.index.is_empty() {
            return;
        }
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.live && slot.key.ep == ep.0 && slot.entry == entry {
                slot.live = false;
                self.index.remove(&slot.key);
                self.free.push(i as u32);
                self.stats.frees += 1;
            }
        }
    }
}
