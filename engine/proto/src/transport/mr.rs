//! Memory regions: ranges of the application's own mapped memory that RDMA operations may
//! touch.
//!
//! As with verbs, the application maps memory (a [`pmem::Mapping`]: anonymous, hugetlb pages
//! or a file) and registers a range of it with access flags. Registration returns an lkey and
//! an rkey, and the address an rkey names is the real address of the bytes
//! (`mapping.as_ptr() + offset`), as `ibv_reg_mr` gives; [`MemoryTable::register_iova`] names
//! the range by another address, as `ibv_reg_mr_iova` does (the pure transport tests use it
//! to keep their addresses readable). Both keys carry the region's slot index in their upper
//! [`SLOT_BITS`] bits, so a lookup is one index and one compare with no search per packet, and
//! a [`KEY_BITS`]-bit key drawn at random per registration in the rest: a peer cannot guess
//! an rkey it was not given, and a slot registered again never gets the keys it had before,
//! so a stale key never names the new region. Access flags
//! decide what remote peers (REMOTE_READ, REMOTE_WRITE) and incoming data placement
//! (LOCAL_WRITE) may do. Every check happens before a byte is touched, which is what lets the
//! responder NAK a bad request with memory left intact.
//!
//! Bytes move in and out of a region only through [`MemoryTable::store`] and
//! [`MemoryTable::fetch`] (copies through `pmem`, never references), because the application
//! owns the same memory on another core. The contract is the verbs one: the application does
//! not touch a buffer while an operation on it is outstanding, and a completion hands it back.
//!
//! A region stays alive while registered: the table holds the mapping (`Arc`). Taking a region
//! out is two steps, so that no operation still using it loses its memory: [`MemoryTable::retire`]
//! makes its keys stop resolving (new requests are refused), and once no queue pair holds a
//! [`Location`] in it the owner calls [`MemoryTable::remove`].

use core::ops::BitOr;
use std::collections::VecDeque;
use std::sync::Arc;

use pmem::{Durability, Mapping};

use super::persist::{Persist, PersistJob};

/// What a region allows. Combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No access beyond being the source of local SENDs/WRITEs.
    pub const NONE: Access = Access(0);
    /// Incoming data (RECV scatter, READ response) may be placed here.
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may RDMA READ from this region.
    pub const REMOTE_READ: Access = Access(2);
    /// Remote peers may RDMA WRITE into this region.
    pub const REMOTE_WRITE: Access = Access(4);
    /// Local write and both remote rights (not the flush and durability flags below).
    pub const ALL: Access = Access(7);
    /// IBTA FLUSH with the global-visibility placement type may name this region
    /// (`IBV_ACCESS_FLUSH_GLOBAL`).
    pub const FLUSH_GLOBAL: Access = Access(8);
    /// IBTA FLUSH with the persistence placement type may name this region, and so may
    /// Portico's durable WRITE (`IBV_ACCESS_FLUSH_PERSISTENT`). Every WRITE landing here is
    /// persisted as soon as it is placed, and READ and FLUSH responses wait for it.
    pub const FLUSH_PERSISTENT: Access = Access(16);
    /// Portico: every WRITE landing here is durable before any ACK names it, so that a
    /// requester that knows nothing of persistence completes a WRITE only once it is durable.
    /// Implies the persisting of [`Access::FLUSH_PERSISTENT`].
    pub const DURABLE: Access = Access(32);

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set.
    pub const fn intersects(self, other: Access) -> bool {
        self.0 & other.0 != 0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// The keys of a freshly registered region, and the address range they name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
    /// The address of the region's first byte, as keys and work requests name it.
    pub addr: u64,
    pub len: u64,
}

/// Why a (key, address, length, access) tuple was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("key {0:#010x} names no registered region")]
    BadKey(u32),
    #[error("range {addr:#x}+{len} is outside the region")]
    OutOfBounds { addr: u64, len: u64 },
    #[error("region does not allow the requested access")]
    Permission,
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("range {offset}+{len} is outside the {size}-byte mapping")]
    OutOfMapping {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("region of {0} bytes: a region holds at most 2^48 bytes")]
    TooLarge(usize),
    #[error("no free region slot (at most {MAX_REGIONS} regions)")]
    TableFull,
    /// [`MemoryTable::install`]: the keys' slot is taken here, or the two keys name different
    /// slots (the replicas of an engine's table went out of step).
    #[error("region slot {0} is not free in this replica of the region table")]
    SlotTaken(u32),
}

/// A resolved place in the region table: which slot and the byte offset in the region.
/// Cheap to copy; the transport keeps these instead of keys so that the per-packet path never
/// looks a key up twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    pub offset: u64,
    pub region: u32,
}

impl Location {
    /// Where a zero-length remote access points: no region (IBTA C9-88: a READ or WRITE of
    /// DMA length 0 is not checked against its rkey and address, and touches nothing).
    pub const NOWHERE: Location = Location {
        offset: 0,
        region: u32::MAX,
    };

    /// The location `n` bytes further on.
    pub const fn advance(self, n: u64) -> Location {
        Location {
            region: self.region,
            offset: self.offset + n,
        }
    }
}

#[derive(Debug)]
struct Region {
    map: Arc<Mapping>,
    /// Where the region starts inside the mapping.
    base: usize,
    addr: u64,
    len: u64,
    access: Access,
    lkey: u32,
    rkey: u32,
    /// Deregistration asked for: the keys no longer resolve, the bytes stay until removal.
    retired: bool,
}

/// Bits of a key that name its region's slot.
pub const SLOT_BITS: u32 = 12;
/// Bits of a key drawn at random per registration.
pub const KEY_BITS: u32 = 32 - SLOT_BITS;
/// Regions one table holds at once.
pub const MAX_REGIONS: usize = 1 << SLOT_BITS;
const KEY_MASK: u32 = (1 << KEY_BITS) - 1;

/// Where the random part of keys comes from.
#[derive(Debug)]
enum KeySource {
    /// The operating system's generator, one draw per key.
    Os,
    /// A fixed sequence (SplitMix64 from a seed), for reproducible tests and fuzzing.
    Seeded(crate::rng::SplitMix64),
    /// Exactly these values, in turn (tests of what happens when the generator repeats).
    #[cfg(test)]
    Script(Vec<u32>),
}

impl KeySource {
    fn next(&mut self) -> u32 {
        match self {
            KeySource::Os => random_u32(),
            KeySource::Seeded(rng) => rng.next_u64() as u32,
            #[cfg(test)]
            KeySource::Script(values) => values.remove(0),
        }
    }
}

/// 32 bits from the operating system's random generator.
///
/// # Panics
/// When the system has no random source at all (getrandom(2) fails), which no supported
/// Linux does; an engine must not hand out predictable keys instead.
pub fn random_u32() -> u32 {
    getrandom::u32().expect("the operating system's random generator (getrandom) works")
}

/// Persist jobs the table holds before the engine hands them to its flusher; beyond this the
/// queue grows (an allocation, only while the flusher is this far behind).
const PERSIST_JOBS: usize = 1024;

/// All regions of one engine (or one test endpoint).
#[derive(Debug)]
pub struct MemoryTable {
    regions: Vec<Option<Region>>,
    /// The random parts of the keys each slot had last (lkey, rkey), kept after the region
    /// is removed so that the slot's next registration draws different ones.
    last_keys: Vec<(u32, u32)>,
    keys: KeySource,
    /// Persists waiting to be handed to the flusher, in ticket order.
    jobs: VecDeque<PersistJob>,
    /// The last ticket handed out (0: none yet).
    last_ticket: u64,
    /// Every ticket up to this one is durable.
    persisted: u64,
    /// How many regions (live or retired) persist the WRITEs placed in them
    /// ([`MemoryTable::persists_writes`]): none on most engines, which then answer without a
    /// lookup.
    persisting: u32,
}

/// The access flags of a region that persists what is written into it.
const PERSISTS: Access = Access(Access::FLUSH_PERSISTENT.0 | Access::DURABLE.0);

impl Default for MemoryTable {
    fn default() -> Self {
        MemoryTable::new()
    }
}

/// Slot index of a key.
pub const fn key_slot(key: u32) -> u32 {
    key >> KEY_BITS
}

impl MemoryTable {
    /// A table whose keys come from the operating system's random generator.
    pub fn new() -> MemoryTable {
        MemoryTable {
            regions: Vec::new(),
            last_keys: Vec::new(),
            keys: KeySource::Os,
            jobs: VecDeque::new(),
            last_ticket: 0,
            persisted: 0,
            persisting: 0,
        }
    }

    /// A table whose keys are a fixed function of `seed` (tests and fuzzing only: keys a peer
    /// can predict are keys a peer can forge).
    pub fn seeded(seed: u64) -> MemoryTable {
        MemoryTable {
            keys: KeySource::Seeded(crate::rng::SplitMix64::new(seed)),
            ..MemoryTable::new()
        }
    }

    /// A random key part for `slot` that differs from `previous`.
    fn draw(&mut self, previous: u32) -> u32 {
        loop {
            let k = self.keys.next() & KEY_MASK;
            if k != previous {
                return k;
            }
        }
    }

    /// Register `len` bytes of `map` from `offset`; the keys name the bytes by their real
    /// address.
    pub fn register(
        &mut self,
        map: Arc<Mapping>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MrKeys, RegisterError> {
        let addr = map.as_ptr() as u64 + offset as u64;
        self.register_iova(map, offset, len, addr, access)
    }

    /// Register `len` bytes of `map` from `offset`, named by the address `iova` instead of
    /// their real address (as `ibv_reg_mr_iova`).
    ///
    /// Keys are `slot << KEY_BITS | random`; the random part is drawn again for every
    /// registration and never repeats the slot's previous one, so a stale key of a re-used
    /// slot does not match.
    pub fn register_iova(
        &mut self,
        map: Arc<Mapping>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegisterError> {
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(RegisterError::OutOfMapping {
                offset,
                len,
                size: map.len(),
            });
        }
        if len as u64 >= 1 << 48 {
            return Err(RegisterError::TooLarge(len));
        }
        let slot = self
            .regions
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.regions.len());
        if slot >= MAX_REGIONS {
            return Err(RegisterError::TableFull);
        }
        if slot == self.last_keys.len() {
            // A fresh slot: no key of it was ever handed out. A draw of 0 would still be a
            // valid key; the sentinel only has to differ from what `draw` avoids next time.
            self.last_keys.push((u32::MAX, u32::MAX));
        }
        let (last_l, last_r) = self.last_keys[slot];
        let (l, r) = (self.draw(last_l), self.draw(last_r));
        self.last_keys[slot] = (l, r);
        let lkey = ((slot as u32) << KEY_BITS) | l;
        let rkey = ((slot as u32) << KEY_BITS) | r;
        let region = Region {
            map,
            base: offset,
            addr: iova,
            len: len as u64,
            access,
            lkey,
            rkey,
            retired: false,
        };
        self.persisting += u32::from(access.intersects(PERSISTS));
        if slot == self.regions.len() {
            self.regions.push(Some(region));
        } else {
            self.regions[slot] = Some(region);
        }
        Ok(MrKeys {
            lkey,
            rkey,
            addr: iova,
            len: len as u64,
        })
    }

    /// Registers `keys.len` bytes of `map` from `offset` under exactly `keys` (named by
    /// `keys.addr`): how an engine that runs on several workers gives every worker's replica of
    /// its region table the region another replica registered, so that an rkey resolves the
    /// same on every core. The keys' slot must be free here.
    pub fn install(
        &mut self,
        map: Arc<Mapping>,
        offset: usize,
        keys: MrKeys,
        access: Access,
    ) -> Result<MrKeys, RegisterError> {
        let len = usize::try_from(keys.len).unwrap_or(usize::MAX);
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(RegisterError::OutOfMapping {
                offset,
                len,
                size: map.len(),
            });
        }
        let slot = key_slot(keys.lkey);
        if slot != key_slot(keys.rkey) {
            return Err(RegisterError::SlotTaken(slot));
        }
        let at = slot as usize;
        if at >= MAX_REGIONS {
            return Err(RegisterError::TableFull);
        }
        if self.regions.get(at).is_some_and(Option::is_some) {
            return Err(RegisterError::SlotTaken(slot));
        }
        while self.regions.len() <= at {
            self.regions.push(None);
        }
        while self.last_keys.len() <= at {
            self.last_keys.push((u32::MAX, u32::MAX));
        }
        self.last_keys[at] = (keys.lkey & KEY_MASK, keys.rkey & KEY_MASK);
        self.persisting += u32::from(access.intersects(PERSISTS));
        self.regions[at] = Some(Region {
            map,
            base: offset,
            addr: keys.addr,
            len: keys.len,
            access,
            lkey: keys.lkey,
            rkey: keys.rkey,
            retired: false,
        });
        Ok(keys)
    }

    /// First step of deregistration: the region's keys stop resolving, so no new request can
    /// reach it; its bytes stay until [`MemoryTable::remove`]. Returns the slot, or `None` when
    /// `lkey` names no live region.
    pub fn retire(&mut self, lkey: u32) -> Option<u32> {
        let slot = key_slot(lkey);
        match self.regions.get_mut(slot as usize) {
            Some(Some(r)) if r.lkey == lkey && !r.retired => {
                r.retired = true;
                Some(slot)
            }
            _ => None,
        }
    }

    /// Second step: drop the region in `slot` (its mapping is released when nothing else
    /// holds it). The caller makes sure no [`Location`] in it is still in use.
    pub fn remove(&mut self, slot: u32) {
        if let Some(r) = self.regions.get_mut(slot as usize)
            && let Some(region) = r.take()
        {
            self.persisting -= u32::from(region.access.intersects(PERSISTS));
        }
    }

    /// Retire and remove at once (nothing may use the region).
    pub fn deregister(&mut self, lkey: u32) -> bool {
        match self.retire(lkey) {
            Some(slot) => {
                self.remove(slot);
                true
            }
            None => false,
        }
    }

    /// The live (not retired) region a key names, as an lkey or as an rkey.
    fn live(&self, key: u32, remote: bool) -> Result<&Region, AccessError> {
        match self.regions.get(key_slot(key) as usize) {
            Some(Some(r)) if !r.retired && (if remote { r.rkey } else { r.lkey }) == key => Ok(r),
            _ => Err(AccessError::BadKey(key)),
        }
    }

    fn check(
        &self,
        key: u32,
        remote: bool,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<Location, AccessError> {
        let region = self.live(key, remote)?;
        let inside = addr
            .checked_sub(region.addr)
            .filter(|off| off.checked_add(len).is_some_and(|end| end <= region.len));
        let Some(offset) = inside else {
            return Err(AccessError::OutOfBounds { addr, len });
        };
        if !region.access.contains(need) {
            return Err(AccessError::Permission);
        }
        Ok(Location {
            region: key_slot(key),
            offset,
        })
    }

    /// How a peer names `at`: its address and the region's rkey, if the region is live and
    /// allows `need`.
    pub fn remote_name(&self, at: Location, need: Access) -> Option<(u64, u32)> {
        match self.regions.get(at.region as usize) {
            Some(Some(r)) if !r.retired && r.access.contains(need) => {
                Some((r.addr.wrapping_add(at.offset), r.rkey))
            }
            _ => None,
        }
    }

    /// How a peer names `at` (its address and the region's rkey) for as long as the region
    /// holds the slot: while it is retired too, which [`MemoryTable::remote_name`] refuses.
    /// For what was named when its region was live (a queued rendezvous send's buffer).
    pub(crate) fn name_of(&self, at: Location) -> Option<(u64, u32)> {
        match self.regions.get(at.region as usize) {
            Some(Some(r)) => Some((r.addr.wrapping_add(at.offset), r.rkey)),
            _ => None,
        }
    }

    /// The address the application knows `at` by (its region's address plus the offset), or
    /// 0 for a location in no region.
    pub fn address_of(&self, at: Location) -> u64 {
        match self.regions.get(at.region as usize) {
            Some(Some(r)) => r.addr.wrapping_add(at.offset),
            _ => 0,
        }
    }

    /// Resolve a range named by a local key (lkey), checking bounds and `need`.
    pub fn check_local(
        &self,
        lkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<Location, AccessError> {
        self.check(lkey, false, addr, len, need)
    }

    /// Resolve a range named by a remote key (rkey), checking bounds and `need`.
    pub fn check_remote(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<Location, AccessError> {
        self.check(rkey, true, addr, len, need)
    }

    /// [`MemoryTable::check_remote`] as a responder applies it to a READ or WRITE: a DMA
    /// length of 0 is not checked at all (IBTA C9-88, as rxe does) and resolves to
    /// [`Location::NOWHERE`].
    pub fn check_remote_dma(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<Location, AccessError> {
        if len == 0 {
            return Ok(Location::NOWHERE);
        }
        self.check(rkey, true, addr, len, need)
    }

    /// Resolve the whole region an rkey names (a FLUSH of selectivity "memory region"),
    /// checking `need`: its slot and length.
    pub fn check_remote_region(&self, rkey: u32, need: Access) -> Result<(u32, u64), AccessError> {
        let region = self.live(rkey, true)?;
        if !region.access.contains(need) {
            return Err(AccessError::Permission);
        }
        Ok((key_slot(rkey), region.len))
    }

    /// Store 8 bytes at a resolved location as one atomic store with release ordering (IBTA
    /// ATOMIC WRITE). False, with nothing stored, when the real address is not 8-byte aligned.
    pub fn store_u64(&self, at: Location, value: [u8; 8]) -> bool {
        let (map, offset) = self.resolved(at, 8);
        map.store_u64_release(offset, value).is_ok()
    }

    fn resolved(&self, at: Location, len: usize) -> (&Mapping, usize) {
        let region = self.regions[at.region as usize]
            .as_ref()
            .expect("location of a removed region");
        debug_assert!(at.offset + len as u64 <= region.len);
        (&region.map, region.base + at.offset as usize)
    }

    /// Copy `src` into a region at a resolved location. Panics only if the
    /// location did not come from a check of at least that length (a transport bug).
    pub fn store(&self, at: Location, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        let (map, offset) = self.resolved(at, src.len());
        map.write(offset, src)
            .expect("placement inside a checked location");
    }

    /// Copy bytes out of a region at a resolved location (payload of an outgoing packet).
    pub fn fetch(&self, at: Location, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        let (map, offset) = self.resolved(at, dst.len());
        map.read(offset, dst)
            .expect("fetch inside a checked location");
    }

    /// [`MemoryTable::fetch`] folding the bytes into the CRC register `reg` as they are copied
    /// (one pass: `pmem::Mapping::read_crc`); returns the register after them.
    pub fn fetch_crc(&self, at: Location, dst: &mut [u8], reg: u32) -> u32 {
        if dst.is_empty() {
            return reg;
        }
        let (map, offset) = self.resolved(at, dst.len());
        map.read_crc(offset, dst, reg)
            .expect("fetch inside a checked location")
    }

    /// The access flags of the region holding `at` (none for [`Location::NOWHERE`]).
    pub fn access_at(&self, at: Location) -> Access {
        match self.regions.get(at.region as usize) {
            Some(Some(r)) => r.access,
            _ => Access::NONE,
        }
    }

    /// Whether WRITEs landing at `at` are persisted as soon as they are placed (the region
    /// allows persistent FLUSH or is durable).
    ///
    /// Answered from a count where no region persists (most engines): a WRITE asked it twice
    /// with a lookup each (callgrind: a batched 64 B WRITE 1 727.3 -> 1 717.3, a lone one
    /// 3 676 -> 3 666).
    #[inline]
    pub fn persists_writes(&self, at: Location) -> bool {
        self.persisting != 0 && self.access_at(at).intersects(PERSISTS)
    }

    /// Make `len` bytes at `at` durable: at once on volatile memory (nothing to do) and on DAX
    /// (cache-line write-back and a fence, here on the caller's thread); otherwise a
    /// [`PersistJob`] for the flusher, whose ticket says when it is done.
    pub fn persist(&mut self, at: Location, len: u64) -> Persist {
        if len == 0 {
            return Persist::Done;
        }
        let Some(Some(region)) = self.regions.get(at.region as usize) else {
            return Persist::Done;
        };
        debug_assert!(at.offset + len <= region.len);
        let (map, offset) = (&region.map, region.base + at.offset as usize);
        match map.durability() {
            Durability::Volatile => Persist::Done,
            Durability::CacheFlush(_) => {
                map.persist(offset, len as usize)
                    .expect("persist inside a checked location");
                Persist::Done
            }
            Durability::Msync | Durability::Simulated => {
                self.last_ticket += 1;
                if self.jobs.capacity() == 0 {
                    self.jobs.reserve(PERSIST_JOBS);
                }
                self.jobs.push_back(PersistJob {
                    ticket: self.last_ticket,
                    map: map.clone(),
                    offset,
                    len: len as usize,
                });
                Persist::Ticket(self.last_ticket)
            }
        }
    }

    /// [`MemoryTable::persist`] of the whole region in `slot`.
    pub fn persist_region(&mut self, slot: u32) -> Persist {
        let len = match self.regions.get(slot as usize) {
            Some(Some(r)) => r.len,
            _ => 0,
        };
        self.persist(
            Location {
                region: slot,
                offset: 0,
            },
            len,
        )
    }

    /// The oldest persist job not yet handed to the flusher.
    pub fn take_persist_job(&mut self) -> Option<PersistJob> {
        self.jobs.pop_front()
    }

    /// Whether persist jobs wait to be handed out.
    pub fn has_persist_jobs(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// Every ticket up to `ticket` is durable (the flusher finishes them in order).
    pub fn mark_persisted(&mut self, ticket: u64) {
        self.persisted = self.persisted.max(ticket.min(self.last_ticket));
    }

    /// The persisted watermark: every ticket up to it is durable.
    pub fn persisted(&self) -> u64 {
        self.persisted
    }

    /// Whether some live or retired region occupies `slot`.
    pub fn holds(&self, slot: u32) -> bool {
        matches!(self.regions.get(slot as usize), Some(Some(_)))
    }

    /// The mapping, offset and length behind `lkey` (for applications and tests).
    pub fn mapping(&self, lkey: u32) -> Option<(&Arc<Mapping>, usize, u64)> {
        match self.regions.get(key_slot(lkey) as usize) {
            Some(Some(r)) if r.lkey == lkey => Some((&r.map, r.base, r.len)),
            _ => None,
        }
    }

    /// The mapping and the offset in it of `len` bytes at `offset` of the region named by
    /// `lkey`, when the key and the whole range are good.
    fn range(&self, lkey: u32, offset: u64, len: usize) -> Option<(&Arc<Mapping>, usize)> {
        let (map, base, region_len) = self.mapping(lkey)?;
        let end = offset.checked_add(len as u64)?;
        (end <= region_len).then_some((map, base + offset as usize))
    }

    /// Copy `dst.len()` bytes from `offset` of the region named by `lkey` (applications and
    /// tests). False when the key or the range is bad.
    pub fn read(&self, lkey: u32, offset: u64, dst: &mut [u8]) -> bool {
        self.range(lkey, offset, dst.len())
            .is_some_and(|(map, at)| map.read(at, dst).is_ok())
    }

    /// Copy `src` to `offset` of the region named by `lkey` (applications and tests).
    pub fn write(&self, lkey: u32, offset: u64, src: &[u8]) -> bool {
        self.range(lkey, offset, src.len())
            .is_some_and(|(map, at)| map.write(at, src).is_ok())
    }

    /// The whole region named by `lkey`, copied out (tests).
    pub fn to_vec(&self, lkey: u32) -> Option<Vec<u8>> {
        let (_, _, len) = self.mapping(lkey)?;
        let mut v = vec![0u8; len as usize];
        self.read(lkey, 0, &mut v).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(len: usize) -> Arc<Mapping> {
        Arc::new(Mapping::anonymous(len).expect("anonymous mapping"))
    }

    #[test]
    fn keys_are_random_per_table_and_reproducible_only_when_seeded() {
        // Two engines (two runs) registering the same thing: the OS draws their keys.
        //
        // A `fn`, not a closure: rustc 1.95 at opt-level 2 and 3 miscompiles a closure that
        // takes a `MemoryTable` by value and is called twice with equal `MemoryTable::new()`
        // arguments (MIR GVN merges the two values, so the second call gets the first,
        // already dropped, table: a double free under `cargo test --release`).
        // rust-lang/rust#155241; docs/toolchain.md.
        fn keys(mut mem: MemoryTable) -> (u32, u32) {
            let k = mem
                .register_iova(anon(64), 0, 64, 0x1000, Access::ALL)
                .unwrap();
            (k.lkey, k.rkey)
        }
        let (l1, r1) = keys(MemoryTable::new());
        let (l2, r2) = keys(MemoryTable::new());
        assert_ne!(r1, r2, "a second run's rkey differs");
        assert_ne!(l1, l2);
        assert_ne!(l1, r1, "the lkey does not give the rkey away");
        assert_eq!(key_slot(r1), 0);
        assert_eq!(key_slot(r2), 0);
        assert_eq!(
            keys(MemoryTable::seeded(7)),
            keys(MemoryTable::seeded(7)),
            "a seeded table is reproducible"
        );
        assert_ne!(keys(MemoryTable::seeded(7)), keys(MemoryTable::seeded(8)));
    }

    #[test]
    fn an_installed_region_resolves_as_in_the_table_that_registered_it() {
        // Two replicas of one engine's table: the first registers, the second installs.
        let mut first = MemoryTable::new();
        let mut second = MemoryTable::new();
        let map = anon(8192);
        first.register(anon(64), 0, 64, Access::ALL).unwrap();
        let keys = first
            .register_iova(map.clone(), 4096, 4096, 0x9000, Access::ALL)
            .unwrap();
        assert_eq!(key_slot(keys.rkey), 1);
        assert_eq!(
            second.install(map.clone(), 4096, keys, Access::ALL),
            Ok(keys)
        );
        for mem in [&first, &second] {
            let at = mem
                .check_remote(keys.rkey, 0x9000 + 10, 100, Access::REMOTE_WRITE)
                .unwrap();
            assert_eq!(
                at,
                Location {
                    region: 1,
                    offset: 10
                }
            );
            mem.store(at, b"shared");
        }
        let mut got = [0u8; 6];
        map.read(4096 + 10, &mut got).unwrap();
        assert_eq!(&got, b"shared");
        assert_eq!(
            second.install(map.clone(), 4096, keys, Access::ALL),
            Err(RegisterError::SlotTaken(1)),
            "the slot is taken now"
        );
        let mixed = MrKeys {
            rkey: keys.rkey & KEY_MASK,
            ..keys
        };
        assert_eq!(
            MemoryTable::new().install(map.clone(), 0, mixed, Access::ALL),
            Err(RegisterError::SlotTaken(1)),
            "keys of two slots"
        );
        assert!(matches!(
            MemoryTable::new().install(map, 8000, keys, Access::ALL),
            Err(RegisterError::OutOfMapping { .. })
        ));
        // Removed from both, the slot takes new keys in the first and they install again.
        assert!(first.deregister(keys.lkey) && second.deregister(keys.lkey));
        let again = first.register(anon(64), 0, 64, Access::ALL).unwrap();
        assert_eq!(key_slot(again.lkey), 1);
        assert_ne!(again.rkey, keys.rkey);
        assert!(second.install(anon(64), 0, again, Access::ALL).is_ok());
    }

    #[test]
    fn a_slot_registered_again_never_gets_its_previous_keys() {
        // The generator repeats itself on purpose: 5 and 6 again for the re-registration.
        let mut mem = MemoryTable {
            keys: KeySource::Script(vec![5, 6, 5, 9, 6, 10]),
            ..MemoryTable::new()
        };
        let first = mem
            .register_iova(anon(64), 0, 64, 0x1000, Access::ALL)
            .unwrap();
        assert_eq!((first.lkey, first.rkey), (5, 6));
        assert!(mem.deregister(first.lkey));
        let again = mem
            .register_iova(anon(64), 0, 64, 0x1000, Access::ALL)
            .unwrap();
        assert_eq!(key_slot(again.lkey), 0, "the same slot");
        assert_eq!(
            (again.lkey, again.rkey),
            (9, 10),
            "the repeats were skipped"
        );
        assert!(
            mem.check_remote(first.rkey, 0x1000, 8, Access::NONE)
                .is_err()
        );
    }

    #[test]
    fn a_table_holds_at_most_max_regions() {
        let mut mem = MemoryTable::seeded(1);
        let map = anon(4096);
        for _ in 0..MAX_REGIONS {
            mem.register(map.clone(), 0, 64, Access::ALL).unwrap();
        }
        assert_eq!(
            mem.register(map, 0, 64, Access::ALL),
            Err(RegisterError::TableFull)
        );
    }

    #[test]
    fn checks_keys_bounds_and_access() {
        let mut mem = MemoryTable::new();
        let a = mem
            .register_iova(
                anon(64),
                0,
                64,
                0x1000,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let b = mem
            .register_iova(anon(16), 0, 16, 0x9000, Access::REMOTE_WRITE)
            .unwrap();
        assert_ne!(a.lkey, a.rkey);
        let loc = mem
            .check_remote(a.rkey, 0x1010, 16, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(loc.offset, 0x10);
        // The lkey is not an rkey.
        assert_eq!(
            mem.check_remote(a.lkey, 0x1000, 1, Access::NONE),
            Err(AccessError::BadKey(a.lkey))
        );
        assert!(matches!(
            mem.check_remote(a.rkey, 0x0fff, 1, Access::NONE),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            mem.check_remote(a.rkey, 0x1030, 17, Access::NONE),
            Err(AccessError::OutOfBounds { .. })
        ));
        // Whole region and an empty range at its end are fine.
        assert!(mem.check_remote(a.rkey, 0x1000, 64, Access::NONE).is_ok());
        assert!(mem.check_remote(a.rkey, 0x1040, 0, Access::NONE).is_ok());
        assert!(matches!(
            mem.check_remote(a.rkey, u64::MAX, 2, Access::NONE),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert_eq!(
            mem.check_remote(a.rkey, 0x1000, 4, Access::REMOTE_WRITE),
            Err(AccessError::Permission)
        );
        assert!(
            mem.check_remote(b.rkey, 0x9000, 16, Access::REMOTE_WRITE)
                .is_ok()
        );
        assert!(mem.check_local(b.lkey, 0x9000, 16, Access::NONE).is_ok());
    }

    #[test]
    fn keys_name_real_addresses_and_placement_lands_in_the_mapping() {
        let map = anon(8192);
        let mut mem = MemoryTable::new();
        let k = mem
            .register(map.clone(), 4096, 100, Access::ALL)
            .expect("inside the mapping");
        assert_eq!(k.addr, map.as_ptr() as u64 + 4096);
        let at = mem
            .check_remote(k.rkey, k.addr + 10, 5, Access::REMOTE_WRITE)
            .unwrap();
        mem.store(at, b"hello");
        let mut seen = [0u8; 5];
        map.read(4096 + 10, &mut seen).unwrap();
        assert_eq!(
            &seen, b"hello",
            "the application sees the bytes in its own mapping"
        );
        map.write(4096 + 20, b"world").unwrap();
        let mut out = [0u8; 5];
        mem.fetch(at.advance(10), &mut out);
        assert_eq!(
            &out, b"world",
            "and the engine sends what the application wrote"
        );
        assert_eq!(
            mem.register(map.clone(), 8000, 193, Access::ALL),
            Err(RegisterError::OutOfMapping {
                offset: 8000,
                len: 193,
                size: 8192
            })
        );
    }

    #[test]
    fn retired_regions_refuse_new_requests_and_stale_keys_fail_after_reregistration() {
        let mut mem = MemoryTable::new();
        let a = mem.register_iova(anon(8), 0, 8, 0, Access::ALL).unwrap();
        let held = mem.check_local(a.lkey, 0, 8, Access::NONE).unwrap();
        let slot = mem.retire(a.lkey).expect("live region");
        assert!(mem.check_local(a.lkey, 0, 8, Access::NONE).is_err());
        assert!(mem.check_remote(a.rkey, 0, 8, Access::NONE).is_err());
        // What was resolved before retirement still works until removal.
        mem.store(held, &[1; 8]);
        assert_eq!(mem.retire(a.lkey), None, "retired once");
        mem.remove(slot);
        assert!(!mem.holds(slot));
        let b = mem.register_iova(anon(8), 0, 8, 0, Access::ALL).unwrap();
        assert_eq!(key_slot(a.lkey), key_slot(b.lkey));
        assert!(mem.check_local(a.lkey, 0, 8, Access::NONE).is_err());
        assert!(mem.check_local(b.lkey, 0, 8, Access::NONE).is_ok());
    }

    /// `persists_writes` answers from a count of the regions that persist, kept through
    /// registration, installation and removal: each persisting region is seen as one while
    /// others come and go, and a plain region in a slot a persisting one left is not.
    #[test]
    fn the_regions_that_persist_writes_are_known_through_registration_and_removal() {
        let mut mem = MemoryTable::new();
        let at = |mem: &MemoryTable, keys: MrKeys| {
            mem.check_local(keys.lkey, keys.addr, 8, Access::NONE)
                .unwrap()
        };
        let plain = mem.register(anon(64), 0, 64, Access::ALL).unwrap();
        assert!(!mem.persists_writes(at(&mem, plain)));
        let flushed = Access::ALL | Access::FLUSH_PERSISTENT;
        let durable = Access::ALL | Access::DURABLE;
        let p1 = mem.register(anon(64), 0, 64, flushed).unwrap();
        let p2 = mem.register(anon(64), 0, 64, durable).unwrap();
        assert!(!mem.persists_writes(at(&mem, plain)));
        assert!(mem.persists_writes(at(&mem, p1)));
        assert!(mem.persists_writes(at(&mem, p2)));
        // A retired region still persists what was placed before its removal.
        let slot = mem.retire(p1.lkey).unwrap();
        let held = Location {
            region: slot,
            offset: 0,
        };
        assert!(mem.persists_writes(held));
        mem.remove(slot);
        assert!(!mem.persists_writes(held), "removed");
        assert!(
            mem.persists_writes(at(&mem, p2)),
            "the other one still does"
        );
        // A plain region in the slot the persisting one left.
        let again = mem.register(anon(64), 0, 64, Access::ALL).unwrap();
        assert_eq!(key_slot(again.lkey), slot);
        assert!(!mem.persists_writes(at(&mem, again)));
        assert!(mem.deregister(p2.lkey));
        assert_eq!(mem.persisting, 0);
        // A region installed from another replica's table counts as one registered here.
        let mut other = MemoryTable::new();
        let keys = other.register(anon(64), 0, 64, durable).unwrap();
        let mut replica = MemoryTable::new();
        replica.install(anon(64), 0, keys, durable).unwrap();
        assert!(replica.persists_writes(at(&replica, keys)));
    }
}
