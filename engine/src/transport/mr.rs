//! Memory regions: ranges of the application's own mapped memory that RDMA operations may
//! touch.
//!
//! As with verbs, the application maps memory (a [`pmem::Mapping`]: anonymous, hugetlb pages
//! or a file) and registers a range of it with access flags. Registration returns an lkey and
//! an rkey, and the address an rkey names is the real address of the bytes
//! (`mapping.as_ptr() + offset`), as `ibv_reg_mr` gives; [`MemoryTable::register_iova`] names
//! the range by another address, as `ibv_reg_mr_iova` does (the pure transport tests use it
//! to keep their addresses readable). Both keys carry the region's slot index in their upper
//! 24 bits so a lookup is one index and one compare, with no search per packet. Access flags
//! decide what remote peers (REMOTE_READ, REMOTE_WRITE) and incoming data placement
//! (LOCAL_WRITE) may do. Every check happens before a byte is touched, which is what lets the
//! responder NAK a bad request with memory left intact.
//!
//! Bytes move in and out of a region only through [`MemoryTable::place`] and
//! [`MemoryTable::fetch`] (copies through `pmem`, never references), because the application
//! owns the same memory on another core. The contract is the verbs one: the application does
//! not touch a buffer while an operation on it is outstanding, and a completion hands it back.
//!
//! A region stays alive while registered: the table holds the mapping (`Arc`). Taking a region
//! out is two steps, so that no operation still using it loses its memory: [`MemoryTable::retire`]
//! makes its keys stop resolving (new requests are refused), and once no queue pair holds a
//! [`Location`] in it the owner calls [`MemoryTable::remove`].

use core::ops::BitOr;
use std::sync::Arc;

use pmem::Mapping;

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
    pub const ALL: Access = Access(7);

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
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
    #[error("no free region slot (at most 2^24 regions)")]
    TableFull,
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

/// All regions of one engine (or one test endpoint).
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Option<Region>>,
    generation: u8,
}

/// Slot index of a key.
pub const fn key_slot(key: u32) -> u32 {
    key >> 8
}

impl MemoryTable {
    pub fn new() -> MemoryTable {
        MemoryTable::default()
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
    /// Keys are `slot << 8 | tag`; the tag changes with every registration so that a stale key
    /// of a re-used slot does not match.
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
        if slot >= 1 << 24 {
            return Err(RegisterError::TableFull);
        }
        self.generation = self.generation.wrapping_add(1);
        let tag = self.generation;
        let lkey = ((slot as u32) << 8) | u32::from(tag);
        let rkey = ((slot as u32) << 8) | u32::from(tag ^ 0x80);
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
        if let Some(r) = self.regions.get_mut(slot as usize) {
            *r = None;
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

    fn check(
        &self,
        key: u32,
        remote: bool,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<Location, AccessError> {
        let region = match self.regions.get(key_slot(key) as usize) {
            Some(Some(r)) if !r.retired && (if remote { r.rkey } else { r.lkey }) == key => r,
            _ => return Err(AccessError::BadKey(key)),
        };
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

    fn resolved(&self, at: Location, len: usize) -> (&Mapping, usize) {
        let region = self.regions[at.region as usize]
            .as_ref()
            .expect("location of a removed region");
        debug_assert!(at.offset + len as u64 <= region.len);
        (&region.map, region.base + at.offset as usize)
    }

    /// Copy `src` into a region at a resolved location (data placement). Panics only if the
    /// location did not come from a check of at least that length (a transport bug).
    pub fn place(&self, at: Location, src: &[u8]) {
        let (map, offset) = self.resolved(at, src.len());
        map.write(offset, src)
            .expect("placement inside a checked location");
    }

    /// Copy bytes out of a region at a resolved location (payload of an outgoing packet).
    pub fn fetch(&self, at: Location, dst: &mut [u8]) {
        let (map, offset) = self.resolved(at, dst.len());
        map.read(offset, dst)
            .expect("fetch inside a checked location");
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

    /// Copy `dst.len()` bytes from `offset` of the region named by `lkey` (applications and
    /// tests). False when the key or the range is bad.
    pub fn read(&self, lkey: u32, offset: u64, dst: &mut [u8]) -> bool {
        match self.mapping(lkey) {
            Some((map, base, len))
                if offset
                    .checked_add(dst.len() as u64)
                    .is_some_and(|end| end <= len) =>
            {
                map.read(base + offset as usize, dst).is_ok()
            }
            _ => false,
        }
    }

    /// Copy `src` to `offset` of the region named by `lkey` (applications and tests).
    pub fn write(&self, lkey: u32, offset: u64, src: &[u8]) -> bool {
        match self.mapping(lkey) {
            Some((map, base, len))
                if offset
                    .checked_add(src.len() as u64)
                    .is_some_and(|end| end <= len) =>
            {
                map.write(base + offset as usize, src).is_ok()
            }
            _ => false,
        }
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
        mem.place(at, b"hello");
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
        mem.place(held, &[1; 8]);
        assert_eq!(mem.retire(a.lkey), None, "retired once");
        mem.remove(slot);
        assert!(!mem.holds(slot));
        let b = mem.register_iova(anon(8), 0, 8, 0, Access::ALL).unwrap();
        assert_eq!(key_slot(a.lkey), key_slot(b.lkey));
        assert!(mem.check_local(a.lkey, 0, 8, Access::NONE).is_err());
        assert!(mem.check_local(b.lkey, 0, 8, Access::NONE).is_ok());
    }
}
