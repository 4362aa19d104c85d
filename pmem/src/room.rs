//! How much room there is before a mapping is made: the free space of the file system a region
//! file would be created on, and the address-space limit of this process. Portico checks a
//! region's size against both before it starts, so that a region too large ends with a message
//! instead of a failed `mmap` or, worse, a `SIGBUS` when a write lands in a sparse file that the
//! file system cannot back.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Bytes an unprivileged process may still write to the file system holding `dir`
/// (`statvfs`: available blocks times the fragment size).
pub fn fs_free_bytes(dir: &Path) -> io::Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid C string and `st` points to writable memory of the struct's size;
    // statvfs fills it in whole when it returns 0.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// This process's address-space limit in bytes (`RLIMIT_AS`, `ulimit -v`); `None` when it is
/// unlimited or cannot be read.
pub fn address_space_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit; getrlimit only writes it.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temp_dir_has_some_room_and_a_missing_dir_is_an_error() {
        assert!(fs_free_bytes(&std::env::temp_dir()).unwrap() > 0);
        let e = fs_free_bytes(Path::new("/nonexistent/portico")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn the_address_space_limit_is_none_or_positive() {
        assert_ne!(address_space_limit(), Some(0));
    }
}
