//! `Mapping`: one range of mapped memory that the application owns and registers with the
//! engine, with bounds-checked raw copies in and out and `persist` as its kind allows.
//!
//! Under the power-loss simulator, the mapping is a private (copy-on-write) view of a file: the
//! file itself, or a memfd for anonymous memory. Stores land in private pages and never reach the
//! file by themselves. `persist` writes the whole cache lines it covers from the view into the
//! file, so the file always holds exactly the persisted image. `crash` drops the private pages
//! (`MADV_DONTNEED`), and the view reads the file again. A process killed with `SIGKILL` leaves
//! the same image behind.

use std::ffi::CStr;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};

use crate::error::Error;
use crate::hugepages::free_2mib_hugepages;
use crate::kind::{Durability, Kind};
use crate::sys::{self, SyncMap};
use crate::{CACHE_LINE, HUGE_PAGE, flush};

/// log2 of 2 MiB: the page size that `MAP_HUGE_2MB` encodes in mmap's flags.
const HUGE_PAGE_SHIFT: u8 = 21;

/// What the simulator's memfd is called in `/proc/<pid>/maps` and in error messages.
const SIM_MEMFD: &CStr = c"portico-pmem-simulator";

/// Mapped memory: anonymous, hugetlb or a file, optionally under the power-loss simulator.
///
/// It is `Send` and `Sync`: the engine's worker and the application's thread share it, under the
/// contract in the crate documentation. Dropping it unmaps the memory.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    kind: Kind,
    /// The mapped file, for error messages.
    path: Option<PathBuf>,
    /// Under the simulator: the persisted image (the mapped file, or a memfd).
    image: Option<File>,
    /// Owns the mapping; unmaps it on drop.
    _region: Region,
}

enum Region {
    Memmap(MmapRaw),
    Sync(SyncMap),
    /// Memory the application mapped and owns ([`Mapping::borrowed`]): never unmapped here.
    Borrowed(NonNull<u8>),
}

impl Region {
    fn ptr(&self) -> NonNull<u8> {
        match self {
            // A successful mmap never returns NULL; memmap2 keeps a dangling pointer only for
            // empty maps, which this crate never makes.
            Region::Memmap(m) => NonNull::new(m.as_mut_ptr()).expect("mmap returned NULL"),
            Region::Sync(m) => m.ptr(),
            Region::Borrowed(p) => *p,
        }
    }
}

// SAFETY: a Mapping owns its memory and a file descriptor, neither of which is tied to a thread.
// Its methods reach the memory only through raw copies, never through references that could alias
// across threads; `slice` and `slice_mut`, which do make references, are `unsafe` and leave the
// exclusion to the caller (see the crate documentation).
unsafe impl Send for Mapping {}
// SAFETY: as for Send. Concurrent `read`, `write`, `fill` and `persist` calls on disjoint ranges
// touch disjoint bytes (persist covers whole lines, whose other bytes the caller leaves alone while
// it runs). The simulator's image is a file written with `pwrite`: the kernel does that copy, and
// no Rust reference to either side exists.
unsafe impl Sync for Mapping {}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("kind", &self.kind)
            .field("path", &self.path)
            .finish()
    }
}

/// How to map: with or without the power-loss simulator.
///
/// `MapOptions::new().simulate_power_loss(true).create_file(path, len)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MapOptions {
    simulate: bool,
    emulate_pmem: bool,
}

impl MapOptions {
    pub fn new() -> MapOptions {
        MapOptions::default()
    }

    /// Keeps the image of each cache line as of its last persist, so that
    /// [`Mapping::crash`] can throw away every store made since.
    pub fn simulate_power_loss(mut self, on: bool) -> MapOptions {
        self.simulate = on;
        self
    }

    /// Treats the file mappings made with these options as persistent memory, as PMDK's
    /// `PMEM_IS_PMEM_FORCE=1` does: `persist` writes the range's cache lines back and fences
    /// (what it costs on DAX), and never calls `msync`, so nothing is durable. The mapping's
    /// [`Kind::EmulatedPmem`] says so wherever it is reported. For measuring the persistence
    /// protocols where a persist is a few line write-backs (the seeds' setting) on a machine
    /// without a DAX device. A file on a real DAX mapping stays real; anonymous memory is
    /// unaffected; not with [`MapOptions::simulate_power_loss`].
    pub fn emulate_pmem(mut self, on: bool) -> MapOptions {
        self.emulate_pmem = on;
        self
    }

    /// Private anonymous memory, zeroed, of exactly `len` bytes.
    pub fn anonymous(&self, len: usize) -> Result<Mapping, Error> {
        if len == 0 {
            return Err(Error::BadLength {
                what: "anonymous memory",
                len: 0,
            });
        }
        if self.simulate {
            let what = "the power-loss simulator's memfd";
            let map_err = |source| Error::Map { what, len, source };
            let memfd = sys::memfd(SIM_MEMFD).map_err(map_err)?;
            memfd.set_len(len as u64).map_err(map_err)?;
            return Mapping::private_view(memfd, None, len, Kind::SimulatedAnonymous)
                .map_err(map_err);
        }
        let map = MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|source| Error::Map {
                what: "anonymous memory",
                len,
                source,
            })?;
        Ok(Mapping::new(
            Region::Memmap(map.into()),
            len,
            Kind::Anonymous,
            None,
            None,
        ))
    }

    /// Creates `path` (or truncates it), sizes it to `len` zero bytes and maps it shared.
    pub fn create_file(&self, path: &Path, len: usize) -> Result<Mapping, Error> {
        if len == 0 {
            return Err(Error::BadLength {
                what: "a file",
                len: 0,
            });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| Error::io("create", path, e))?;
        file.set_len(len as u64)
            .map_err(|e| Error::io("set the length of", path, e))?;
        self.map_file(file, path, len)
    }

    /// Maps all of an existing file, shared.
    pub fn open_file(&self, path: &Path) -> Result<Mapping, Error> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io("open", path, e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io("read the length of", path, e))?
            .len();
        if size == 0 {
            return Err(Error::EmptyFile {
                path: path.to_path_buf(),
            });
        }
        let len = usize::try_from(size).map_err(|_| Error::BadLength {
            what: "a file",
            len: size,
        })?;
        self.map_file(file, path, len)
    }

    fn map_file(&self, file: File, path: &Path, len: usize) -> Result<Mapping, Error> {
        let path_buf = Some(path.to_path_buf());
        if self.simulate && self.emulate_pmem {
            return Err(Error::Options(
                "simulate_power_loss and emulate_pmem: the simulator decides what a persist \
                 keeps, the emulation that a persist is a line write-back; choose one",
            ));
        }
        if self.simulate {
            return Mapping::private_view(file, path_buf, len, Kind::SimulatedFile)
                .map_err(|e| Error::io("map", path, e));
        }
        let sync = sys::map_sync(&file, len).map_err(|e| Error::io("map (MAP_SYNC)", path, e))?;
        if let Some(map) = sync {
            return Ok(Mapping::new(
                Region::Sync(map),
                len,
                Kind::File { dax: true },
                path_buf,
                None,
            ));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| Error::io("map", path, e))?;
        let kind = if self.emulate_pmem {
            Kind::EmulatedPmem
        } else {
            Kind::File { dax: false }
        };
        Ok(Mapping::new(Region::Memmap(map), len, kind, path_buf, None))
    }
}

impl Mapping {
    /// Private anonymous memory, zeroed, of exactly `len` bytes.
    pub fn anonymous(len: usize) -> Result<Mapping, Error> {
        MapOptions::new().anonymous(len)
    }

    /// Private anonymous memory in 2 MiB hugetlb pages, `len` rounded up to a whole page.
    /// An error when the kernel refuses, usually because too few pages are reserved.
    pub fn hugetlb(len: usize) -> Result<Mapping, Error> {
        let rounded = round_up_huge(len)?;
        let map = MmapOptions::new()
            .len(rounded)
            .huge(Some(HUGE_PAGE_SHIFT))
            .map_anon()
            .map_err(|source| Error::HugeTlb {
                len: rounded,
                free_pages: free_2mib_hugepages(),
                source,
            })?;
        Ok(Mapping::new(
            Region::Memmap(map.into()),
            rounded,
            Kind::HugeTlb,
            None,
            None,
        ))
    }

    /// Hugetlb pages when `/proc/meminfo` shows enough free 2 MiB pages and the kernel grants
    /// them (the length is then rounded up to 2 MiB), else anonymous memory of exactly `len`
    /// bytes. [`Mapping::kind`] says which.
    pub fn anonymous_prefer_huge(len: usize) -> Result<Mapping, Error> {
        let rounded = round_up_huge(len)?;
        let needed = (rounded / HUGE_PAGE) as u64;
        if free_2mib_hugepages().is_some_and(|free| free >= needed)
            && let Ok(map) = Mapping::hugetlb(len)
        {
            return Ok(map);
        }
        Mapping::anonymous(len)
    }

    /// Creates `path` (or truncates it) to `len` zero bytes and maps it shared: DAX with
    /// `MAP_SYNC` when the file system allows, a plain shared mapping otherwise.
    pub fn create_file(path: &Path, len: usize) -> Result<Mapping, Error> {
        MapOptions::new().create_file(path, len)
    }

    /// Maps all of an existing file, shared, DAX when the file system allows.
    pub fn open_file(path: &Path) -> Result<Mapping, Error> {
        MapOptions::new().open_file(path)
    }

    /// `len` bytes of memory the application mapped itself, from `ptr`: registered in place,
    /// as `ibv_reg_mr` registers any buffer (the libfabric provider's `fi_mr_reg`). Dropping
    /// the `Mapping` leaves the memory alone; `persist` does nothing (volatile).
    ///
    /// # Safety
    ///
    /// The range must stay mapped, readable and writable, for as long as this `Mapping` (or a
    /// region registered from it) lives: the caller's promise, as verbs asks of an application
    /// until `ibv_dereg_mr`. The application may store into the range while the engine uses it
    /// only as the crate documentation allows for any mapping.
    pub unsafe fn borrowed(ptr: *mut u8, len: usize) -> Result<Mapping, Error> {
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(Error::BadLength {
                what: "application memory at address 0",
                len: len as u64,
            });
        };
        if len == 0 || (ptr.as_ptr() as usize).checked_add(len).is_none() {
            return Err(Error::BadLength {
                what: "application memory",
                len: len as u64,
            });
        }
        Ok(Mapping::new(
            Region::Borrowed(ptr),
            len,
            Kind::Application,
            None,
            None,
        ))
    }

    /// `len` bytes at `ptr` of a shared file mapping the application made itself (`path`, for
    /// messages), registered in place as [`Mapping::borrowed`] registers any memory, but
    /// persisted as a file mapping is: `msync` of the pages that cover a range (the
    /// application's mapping holds them whole even when the registered range starts inside
    /// one).
    ///
    /// # Safety
    ///
    /// As [`Mapping::borrowed`]; moreover the range must be a `MAP_SHARED` mapping of `path`
    /// for as long as this `Mapping` lives (else `persist` fails, as `msync` does on it).
    pub unsafe fn borrowed_file(ptr: *mut u8, len: usize, path: PathBuf) -> Result<Mapping, Error> {
        // SAFETY: the caller's promise, which includes `borrowed`'s.
        let mut m = unsafe { Mapping::borrowed(ptr, len) }?;
        m.kind = Kind::ApplicationFile;
        m.path = Some(path);
        Ok(m)
    }

    fn new(
        region: Region,
        len: usize,
        kind: Kind,
        path: Option<PathBuf>,
        image: Option<File>,
    ) -> Mapping {
        Mapping {
            ptr: region.ptr(),
            len,
            kind,
            path,
            image,
            _region: region,
        }
    }

    /// The simulator's live view: a private mapping of `image`, whose stores never reach it.
    fn private_view(
        image: File,
        path: Option<PathBuf>,
        len: usize,
        kind: Kind,
    ) -> std::io::Result<Mapping> {
        // SAFETY: memmap2 marks file maps unsafe because a `&[u8]` into one would change under
        // it if the file changed. This map is reached only through raw pointers (and through
        // `slice`, whose caller promises that nothing writes the range meanwhile), so a change
        // to the file cannot invalidate a reference.
        let map = unsafe { MmapOptions::new().len(len).map_copy(&image)? };
        Ok(Mapping::new(
            Region::Memmap(map.into()),
            len,
            kind,
            path,
            Some(image),
        ))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping's real address. The engine names `as_ptr() as u64 + offset` in rkeys.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// True when the file system granted `MAP_SYNC`, so cache flushes make stores durable.
    pub fn is_dax(&self) -> bool {
        self.kind == Kind::File { dax: true }
    }

    /// How `persist` makes stores durable on this mapping.
    pub fn durability(&self) -> Durability {
        self.kind.durability()
    }

    /// The mapped file, if this is a file mapping.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the mapping.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.check(offset, dst.len())?;
        // SAFETY: the range is inside the mapping (checked above), and `dst` is a Rust buffer
        // that cannot overlap it. The copy makes no reference into the mapping.
        unsafe { copy(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// [`Mapping::read`] with the bytes folded into a CRC-32 register as they are copied, in
    /// one pass: the ICRC of a frame continued over the payload it carries ([`crate::crc`]).
    /// Returns the register after the bytes.
    pub fn read_crc(&self, offset: usize, dst: &mut [u8], reg: u32) -> Result<u32, Error> {
        self.check(offset, dst.len())?;
        // SAFETY: the range is inside the mapping (checked above), and `dst` is a Rust buffer
        // that cannot overlap it. The kernel reads through the raw pointer and makes no
        // reference into the mapping.
        Ok(unsafe { crate::crc::copy_raw(reg, self.ptr.as_ptr().add(offset), dst) })
    }

    /// Copies `src` into the mapping at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.check(offset, src.len())?;
        // SAFETY: as for `read`. `src` cannot be a reference into this mapping made by safe code,
        // and the `unsafe` `slice` contract forbids holding one while the range is written.
        unsafe { copy(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Stores the 8 bytes `value` (in memory order) at `offset` as one atomic store with
    /// release ordering, as IBTA ATOMIC WRITE asks: a reader of the location sees all of the
    /// old or all of the new value, and every store before this one. `offset` must be a
    /// multiple of 8 from a page-aligned base, so the address is aligned.
    pub fn store_u64_release(&self, offset: usize, value: [u8; 8]) -> Result<(), Error> {
        self.check(offset, 8)?;
        let addr = self.ptr.as_ptr() as usize + offset;
        if !addr.is_multiple_of(8) {
            return Err(Error::Misaligned { offset, align: 8 });
        }
        // SAFETY: the 8 bytes are inside the mapping (checked above) and the address is 8-byte
        // aligned (checked above), as `AtomicU64` requires. The mapping lives as long as
        // `self`, and every access to registered memory from Rust is a raw copy or an atomic
        // like this one, so the reference made here aliases no `&mut`.
        let cell = unsafe { &*(addr as *const std::sync::atomic::AtomicU64) };
        cell.store(
            u64::from_ne_bytes(value),
            std::sync::atomic::Ordering::Release,
        );
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), Error> {
        self.check(offset, len)?;
        // SAFETY: the range is inside the mapping (checked above); no reference is made.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// The bytes `[offset, offset + len)` as a slice.
    ///
    /// # Safety
    ///
    /// Nobody (no thread, no RDMA operation) may write the range while the slice lives.
    ///
    /// # Panics
    ///
    /// When the range is outside the mapping.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        if let Err(e) = self.check(offset, len) {
            panic!("{e}");
        }
        // SAFETY: the range is inside the mapping, which lives as long as `self`; the caller
        // guarantees nobody writes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// The bytes `[offset, offset + len)` as a mutable slice.
    ///
    /// # Safety
    ///
    /// Nobody else may read or write the range while the slice lives: no other slice, no
    /// `read`/`write`/`persist` of it, no RDMA operation on it.
    ///
    /// # Panics
    ///
    /// When the range is outside the mapping.
    // Handing out `&mut` from `&self` is the point: the mapping is shared memory, and exclusive
    // access is the caller's promise in `# Safety`, not something the borrow checker can see.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        if let Err(e) = self.check(offset, len) {
            panic!("{e}");
        }
        // SAFETY: the range is inside the mapping, which lives as long as `self`; the caller
        // guarantees exclusive access meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }

    /// Makes `[offset, offset + len)` durable, whole cache lines at a time: CLWB (or
    /// CLFLUSHOPT, CLFLUSH) and one SFENCE on DAX, `msync` on other files, a copy into the
    /// persisted image under the simulator, nothing on anonymous memory.
    pub fn persist(&self, offset: usize, len: usize) -> Result<(), Error> {
        self.persist_ranges(&[(offset, len)])
    }

    /// Makes every `(offset, len)` range durable, as [`Mapping::persist`] does, with one fence
    /// on DAX and one `msync` (or simulator write) per run of adjacent pages (lines). Every
    /// range is checked first: on `OutOfBounds`, nothing was persisted.
    pub fn persist_ranges(&self, ranges: &[(usize, usize)]) -> Result<(), Error> {
        for &(offset, len) in ranges {
            self.check(offset, len)?;
        }
        match self.durability() {
            Durability::Volatile => Ok(()),
            Durability::CacheFlush(instr) => {
                for &(offset, len) in ranges {
                    // SAFETY: the range is inside this live mapping (checked above), and `instr`
                    // came from CPUID.
                    unsafe { flush::write_back_lines(instr, self.ptr.as_ptr().add(offset), len) };
                }
                flush::store_fence();
                Ok(())
            }
            Durability::Msync => {
                for (start, end) in self.runs(ranges, sys::page_size()) {
                    // SAFETY: `[start, end)` is inside this live file mapping.
                    unsafe { sys::msync(self.ptr.as_ptr().add(start), end - start) }
                        .map_err(|e| Error::io("msync", self.name(), e))?;
                }
                Ok(())
            }
            Durability::Simulated => {
                let image = self
                    .image
                    .as_ref()
                    .expect("a simulated mapping has an image");
                for (start, end) in self.runs(ranges, CACHE_LINE) {
                    // SAFETY: `[start, end)` is inside this live mapping; the kernel reads it.
                    unsafe {
                        sys::pwrite_all(
                            image,
                            self.ptr.as_ptr().add(start),
                            end - start,
                            start as u64,
                        )
                    }
                    .map_err(|e| Error::io("write the persisted lines to", self.name(), e))?;
                }
                Ok(())
            }
        }
    }

    /// The ranges widened to whole `granule`s (clamped to the mapping), sorted, with touching
    /// or overlapping runs merged.
    fn runs(&self, ranges: &[(usize, usize)], granule: usize) -> Vec<(usize, usize)> {
        merge_runs(ranges, granule, self.len)
    }

    fn name(&self) -> &Path {
        self.path
            .as_deref()
            .unwrap_or(Path::new("the power-loss simulator's memfd"))
    }

    /// Power loss, simulated: every store not yet persisted is thrown away, and the mapping reads
    /// as the persisted image. `Error::NotSimulated` on real memory.
    ///
    /// Stores that race with `crash` may or may not survive it, as on real hardware.
    pub fn crash(&self) -> Result<(), Error> {
        if !self.kind.is_simulated() {
            return Err(Error::NotSimulated);
        }
        // SAFETY: the whole mapping is a private file view, and Rust references into it exist
        // only under the `unsafe` slice contract, which forbids writes (and this is one) while
        // they live.
        unsafe { sys::madvise_dontneed(self.ptr.as_ptr(), self.len) }
            .map_err(|e| Error::io("discard the unpersisted stores to", self.name(), e))
    }

    /// Under the simulator: whether every cache line that overlaps the range equals its
    /// persisted image. On real memory: true. Outside the mapping: false.
    pub fn is_persisted(&self, offset: usize, len: usize) -> bool {
        if self.check(offset, len).is_err() {
            return false;
        }
        let Some(image) = self.image.as_ref() else {
            return true;
        };
        let Some(&(start, end)) = merge_runs(&[(offset, len)], CACHE_LINE, self.len).first() else {
            return true;
        };
        let mut live = [0u8; 4096];
        let mut kept = [0u8; 4096];
        let mut at = start;
        while at < end {
            let n = (end - at).min(live.len());
            if self.read(at, &mut live[..n]).is_err()
                || image.read_exact_at(&mut kept[..n], at as u64).is_err()
            {
                return false;
            }
            if live[..n] != kept[..n] {
                return false;
            }
            at += n;
        }
        true
    }
}

fn round_up_huge(len: usize) -> Result<usize, Error> {
    let bad = Error::BadLength {
        what: "2 MiB hugetlb pages",
        len: len as u64,
    };
    if len == 0 {
        return Err(bad);
    }
    len.checked_next_multiple_of(HUGE_PAGE).ok_or(bad)
}

/// `ranges` widened to whole `granule`s, clamped to `limit`, sorted and merged where they touch
/// or overlap. Empty ranges are dropped.
pub(crate) fn merge_runs(
    ranges: &[(usize, usize)],
    granule: usize,
    limit: usize,
) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|&&(_, len)| len > 0)
        .map(|&(offset, len)| {
            let start = offset - offset % granule;
            let end = (offset + len)
                .div_ceil(granule)
                .saturating_mul(granule)
                .min(limit);
            (start, end)
        })
        .collect();
    runs.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
    for (start, end) in runs {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Copies `len` bytes from `src` to `dst`. A run of 8 to 64 bytes (a small payload, a
/// header) is two copies of a constant length, which overlap where `len` is not a power of
/// two: moves inline, where a copy of a length the compiler does not know is a call to
/// `memcpy` (callgrind, a 64 B WRITE fetched and placed: batched 1 614.3 -> 1 607.3, lone
/// 3 492 -> 3 485; 8 to 15 bytes, a tagged message's 8 fetched and placed: `tagged8x32`
/// 2 976.5 -> 2 965.5).
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and the two do not overlap.
#[inline(always)]
unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY (every copy): the caller's ranges; each copy lies inside them (`len` is at
    // least the constant, so `len - N` does not wrap and `len - N + N == len`).
    unsafe {
        match len {
            32..=64 => {
                std::ptr::copy_nonoverlapping(src, dst, 32);
                std::ptr::copy_nonoverlapping(src.add(len - 32), dst.add(len - 32), 32);
            }
            16..=31 => {
                std::ptr::copy_nonoverlapping(src, dst, 16);
                std::ptr::copy_nonoverlapping(src.add(len - 16), dst.add(len - 16), 16);
            }
            8..=15 => {
                std::ptr::copy_nonoverlapping(src, dst, 8);
                std::ptr::copy_nonoverlapping(src.add(len - 8), dst.add(len - 8), 8);
            }
            _ => std::ptr::copy_nonoverlapping(src, dst, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<Mapping>();
    }

    #[test]
    fn runs_widen_to_lines_and_merge_touching_ones() {
        // 1 byte at 70 is line [64, 128); [128, 130) touches it; [300, 301) stands alone.
        let runs = merge_runs(&[(300, 1), (128, 2), (70, 1), (5, 0)], 64, 1000);
        assert_eq!(runs, vec![(64, 192), (256, 320)]);
    }

    #[test]
    fn runs_clamp_to_the_mapping() {
        assert_eq!(merge_runs(&[(90, 10)], 64, 100), vec![(64, 100)]);
        assert_eq!(
            merge_runs(&[(0, 1), (4095, 2)], 4096, 10_000),
            vec![(0, 8192)]
        );
    }

    #[test]
    fn out_of_bounds_is_an_error_everywhere() {
        let m = Mapping::anonymous(100).unwrap();
        let oob = |r: Result<(), Error>| {
            assert!(
                matches!(r, Err(Error::OutOfBounds { size: 100, .. })),
                "expected OutOfBounds, got {r:?}"
            )
        };
        oob(m.read(99, &mut [0; 2]));
        oob(m.write(100, &[1]));
        oob(m.fill(50, 51, 0));
        oob(m.persist(0, 101));
        oob(m.persist_ranges(&[(0, 1), (usize::MAX, 2)]));
        oob(m.read(usize::MAX, &mut [0; 1]));
        // The edges themselves are fine.
        m.read(99, &mut [0; 1]).unwrap();
        m.write(100, &[]).unwrap();
        m.persist(100, 0).unwrap();
        assert!(!m.is_persisted(0, 101));
    }

    #[test]
    #[should_panic(expected = "outside the 64-byte mapping")]
    fn slice_out_of_bounds_panics() {
        let m = Mapping::anonymous(64).unwrap();
        // SAFETY: nobody else uses the mapping; the call panics before making a slice.
        let _ = unsafe { m.slice(60, 5) };
    }

    #[test]
    fn slices_see_what_write_wrote() {
        let m = Mapping::anonymous(256).unwrap();
        m.write(10, b"abc").unwrap();
        // SAFETY: this thread is the mapping's only user, and each slice ends before the next
        // access.
        unsafe {
            assert_eq!(m.slice(10, 3), b"abc");
            m.slice_mut(11, 1)[0] = b'X';
        }
        let mut out = [0u8; 3];
        m.read(10, &mut out).unwrap();
        assert_eq!(&out, b"aXc");
    }

    #[test]
    fn zero_lengths_are_refused() {
        assert!(matches!(
            Mapping::anonymous(0),
            Err(Error::BadLength { .. })
        ));
        assert!(matches!(Mapping::hugetlb(0), Err(Error::BadLength { .. })));
        assert!(matches!(
            Mapping::hugetlb(usize::MAX),
            Err(Error::BadLength { .. })
        ));
    }

    #[test]
    fn crash_needs_the_simulator() {
        let m = Mapping::anonymous(64).unwrap();
        assert!(matches!(m.crash(), Err(Error::NotSimulated)));
        assert!(m.is_persisted(0, 64));
    }

    #[test]
    fn anonymous_is_volatile_and_zeroed() {
        let m = Mapping::anonymous(10_000).unwrap();
        assert_eq!(m.kind(), Kind::Anonymous);
        assert_eq!(m.durability(), Durability::Volatile);
        assert!(!m.is_dax());
        let mut out = vec![0xAAu8; 10_000];
        m.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        assert_eq!(m.as_ptr() as usize % sys::page_size(), 0);
    }

    /// Every length to 130 (the short copies' two overlapping moves, and `memcpy` past them)
    /// at several offsets: what `write` stores and `read` gives back is the bytes, and
    /// nothing beside them changes.
    #[test]
    fn reads_and_writes_of_every_short_length_copy_exactly_their_bytes() {
        let m = Mapping::anonymous(4096).unwrap();
        let pattern: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..=130 {
            for offset in [0, 1, 7, 64, 1000 - len % 3] {
                m.write(0, &[0xee; 1200]).unwrap();
                m.write(offset, &pattern[..len]).unwrap();
                let mut all = vec![0u8; 1200];
                m.read(0, &mut all).unwrap();
                assert_eq!(
                    &all[offset..offset + len],
                    &pattern[..len],
                    "{len} at {offset}"
                );
                assert!(
                    all[..offset].iter().all(|&b| b == 0xee),
                    "before, {len} at {offset}"
                );
                let after = &all[offset + len..];
                assert!(after.iter().all(|&b| b == 0xee), "after, {len} at {offset}");
                let mut back = vec![0x11u8; len + 2];
                m.read(offset, &mut back[1..=len]).unwrap();
                assert_eq!(&back[1..=len], &pattern[..len]);
                assert_eq!((back[0], back[len + 1]), (0x11, 0x11), "{len} at {offset}");
            }
        }
    }
}
