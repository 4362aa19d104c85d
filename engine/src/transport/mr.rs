//! Memory regions: registered byte ranges that RDMA operations may touch.
//!
//! A region owns its bytes (`Box<[u8]>`) and is addressed by a virtual
//! address range `[addr, addr + len)` chosen at registration, like a verbs MR.
//! Local work requests name it by lkey, remote peers by rkey; both keys carry
//! the region's slot index in their upper 24 bits so a lookup is one index and
//! one compare, with no search per packet. Access flags decide what remote
//! peers (REMOTE_READ, REMOTE_WRITE) and incoming data placement
//! (LOCAL_WRITE) may do. Every check happens before a byte is touched, which
//! is what lets the responder NAK a bad request with memory left intact.

use core::ops::BitOr;

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

/// The keys of a freshly registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
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

/// A resolved place in the region table: which slot and the byte offset in
/// it. Cheap to copy; the transport keeps these instead of keys so that the
/// per-packet path never looks a key up twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    pub region: u32,
    pub offset: usize,
}

impl Location {
    /// The location `n` bytes further on.
    pub const fn advance(self, n: usize) -> Location {
        Location {
            region: self.region,
            offset: self.offset + n,
        }
    }
}

#[derive(Debug)]
struct Region {
    addr: u64,
    bytes: Box<[u8]>,
    access: Access,
    lkey: u32,
    rkey: u32,
}

/// All regions of one engine (or one test endpoint).
#[derive(Debug, Default)]
pub struct MemoryTable {
    regions: Vec<Option<Region>>,
    generation: u8,
}

impl MemoryTable {
    pub fn new() -> MemoryTable {
        MemoryTable::default()
    }

    /// Register `len` zeroed bytes at virtual address `addr`.
    ///
    /// Keys are `slot << 8 | tag`; the tag changes with every registration so
    /// that a stale key of a re-used slot does not match.
    pub fn register(&mut self, addr: u64, len: usize, access: Access) -> MrKeys {
        let slot = self
            .regions
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.regions.len());
        self.generation = self.generation.wrapping_add(1);
        let tag = self.generation;
        let lkey = ((slot as u32) << 8) | u32::from(tag);
        let rkey = ((slot as u32) << 8) | u32::from(tag ^ 0x80);
        let region = Region {
            addr,
            bytes: vec![0u8; len].into_boxed_slice(),
            access,
            lkey,
            rkey,
        };
        if slot == self.regions.len() {
            self.regions.push(Some(region));
        } else {
            self.regions[slot] = Some(region);
        }
        MrKeys { lkey, rkey }
    }

    /// Remove the region named by `lkey`. Returns whether one was removed.
    pub fn deregister(&mut self, lkey: u32) -> bool {
        let slot = (lkey >> 8) as usize;
        match self.regions.get(slot) {
            Some(Some(r)) if r.lkey == lkey => {
                self.regions[slot] = None;
                true
            }
            _ => false,
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
        let slot = (key >> 8) as usize;
        let region = match self.regions.get(slot) {
            Some(Some(r)) if (if remote { r.rkey } else { r.lkey }) == key => r,
            _ => return Err(AccessError::BadKey(key)),
        };
        let size = region.bytes.len() as u64;
        let inside = addr
            .checked_sub(region.addr)
            .filter(|off| off.checked_add(len).is_some_and(|end| end <= size));
        let Some(offset) = inside else {
            return Err(AccessError::OutOfBounds { addr, len });
        };
        if !region.access.contains(need) {
            return Err(AccessError::Permission);
        }
        Ok(Location {
            region: slot as u32,
            offset: offset as usize,
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

    /// `len` bytes at a resolved location. Panics only if the location did not
    /// come from a check of at least that length (a transport bug).
    pub fn slice(&self, at: Location, len: usize) -> &[u8] {
        let region = self.regions[at.region as usize]
            .as_ref()
            .expect("location of a deregistered region");
        &region.bytes[at.offset..at.offset + len]
    }

    /// Mutable counterpart of [`MemoryTable::slice`].
    pub fn slice_mut(&mut self, at: Location, len: usize) -> &mut [u8] {
        let region = self.regions[at.region as usize]
            .as_mut()
            .expect("location of a deregistered region");
        &mut region.bytes[at.offset..at.offset + len]
    }

    /// The whole region named by `lkey` (for applications and tests).
    pub fn region(&self, lkey: u32) -> Option<&[u8]> {
        match self.regions.get((lkey >> 8) as usize) {
            Some(Some(r)) if r.lkey == lkey => Some(&r.bytes),
            _ => None,
        }
    }

    /// Mutable counterpart of [`MemoryTable::region`].
    pub fn region_mut(&mut self, lkey: u32) -> Option<&mut [u8]> {
        match self.regions.get_mut((lkey >> 8) as usize) {
            Some(Some(r)) if r.lkey == lkey => Some(&mut r.bytes),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_keys_bounds_and_access() {
        let mut mem = MemoryTable::new();
        let a = mem.register(0x1000, 64, Access::LOCAL_WRITE | Access::REMOTE_READ);
        let b = mem.register(0x9000, 16, Access::REMOTE_WRITE);
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
    fn stale_keys_fail_after_reregistration() {
        let mut mem = MemoryTable::new();
        let a = mem.register(0, 8, Access::ALL);
        assert!(mem.deregister(a.lkey));
        let b = mem.register(0, 8, Access::ALL);
        assert_eq!(a.lkey >> 8, b.lkey >> 8);
        assert!(mem.check_local(a.lkey, 0, 8, Access::NONE).is_err());
        assert!(mem.check_local(b.lkey, 0, 8, Access::NONE).is_ok());
    }
}
