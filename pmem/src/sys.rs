//! The system calls memmap2 does not offer: `MAP_SHARED_VALIDATE | MAP_SYNC`, `msync` of a
//! sub-range, `madvise(MADV_DONTNEED)`, `memfd_create` and `pwrite` from a raw pointer.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The base page size, which `msync` and `madvise` addresses must be aligned to.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf only reads a configuration value.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 { n as usize } else { 4096 }
    })
}

/// A `MAP_SHARED_VALIDATE | MAP_SYNC` mapping made with libc; unmapped on drop.
pub(crate) struct SyncMap {
    ptr: NonNull<u8>,
    len: usize,
}

impl SyncMap {
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for SyncMap {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly what mmap returned and was asked for, and the
        // mapping is unmapped only here, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Maps the first `len` bytes of `file` shared with `MAP_SYNC`, which the kernel grants only on a
/// DAX file system. `Ok(None)` when the file system does not support it (`EOPNOTSUPP`; `EINVAL`
/// from kernels that predate `MAP_SHARED_VALIDATE`).
pub(crate) fn map_sync(file: &File, len: usize) -> io::Result<Option<SyncMap>> {
    // SAFETY: a fresh mapping at an address of the kernel's choosing cannot overlap anything
    // Rust owns; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Ok(None),
            _ => Err(err),
        };
    }
    let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
    Ok(Some(SyncMap { ptr, len }))
}

/// `msync(MS_SYNC)` of the pages covering `[start, start + len)`.
///
/// # Safety
///
/// The range must lie inside one live file mapping.
pub(crate) unsafe fn msync(start: *const u8, len: usize) -> io::Result<()> {
    let page = page_size();
    let offset_in_page = start as usize % page;
    // SAFETY: moving back to the start of the page stays inside the mapping, which is
    // page-aligned.
    let aligned = unsafe { start.sub(offset_in_page) };
    // SAFETY: the caller guarantees the range is mapped; msync does not touch memory.
    let rc = unsafe {
        libc::msync(
            aligned as *mut libc::c_void,
            len + offset_in_page,
            libc::MS_SYNC,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Drops the pages of `[start, start + len)`. On a private file mapping this throws away the
/// private copies, so the next access reads the file again.
///
/// # Safety
///
/// The range must be a whole private mapping (or a page-aligned part of one) that no Rust
/// reference points into.
pub(crate) unsafe fn madvise_dontneed(start: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range is a private mapping with no references into it;
    // the pages stay mapped and read back as the file's content.
    let rc = unsafe { libc::madvise(start.cast(), len, libc::MADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An anonymous in-memory file, closed on exec.
pub(crate) fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: `name` is a valid C string; the call creates a new descriptor.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Writes `[src, src + len)` to `file` at `offset`, all of it.
///
/// The kernel copies from `src`, so no Rust reference to the (possibly shared) source memory is
/// ever made.
///
/// # Safety
///
/// `[src, src + len)` must be mapped and readable for the whole call.
pub(crate) unsafe fn pwrite_all(
    file: &File,
    src: *const u8,
    len: usize,
    offset: u64,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: `src + done .. src + len` is inside the readable range the caller vouches for.
        let n = unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                src.add(done).cast(),
                len - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwrite wrote nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}
