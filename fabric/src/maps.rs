//! Which memory the application registers: `/proc/self/maps` read, pure. A registration of a
//! range that a shared mapping of a file holds whole is the target of a durable WRITE
//! (`FI_COMMIT_COMPLETE`, seed 004): its persist is an `msync` of the file's pages, where
//! other memory has nothing to persist.

use std::path::PathBuf;

/// One line of `/proc/self/maps`: the range, whether it is a writable shared mapping, and
/// the file it maps (`None`: anonymous, or a pseudo-file such as `[heap]`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line<'a> {
    start: u64,
    end: u64,
    shared_writable: bool,
    path: Option<&'a str>,
}

fn parse_line(line: &str) -> Option<Line<'_>> {
    // "start-end perms offset dev inode   path", the path (which may hold spaces) optional.
    let mut rest = line.trim_start();
    let mut field = || {
        let s = rest.trim_start();
        let end = s.find(' ').unwrap_or(s.len());
        let (f, r) = s.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field().as_bytes();
    let _offset = field();
    let _dev = field();
    let inode = field();
    let path = rest.trim();
    let (a, b) = range.split_once('-')?;
    let start = u64::from_str_radix(a, 16).ok()?;
    let end = u64::from_str_radix(b, 16).ok()?;
    if perms.len() < 4 || end <= start {
        return None;
    }
    Some(Line {
        start,
        end,
        shared_writable: perms[1] == b'w' && perms[3] == b's',
        path: (inode != "0" && path.starts_with('/')).then_some(path),
    })
}

/// The file whose shared, writable mappings hold all of `[addr, addr + len)` (in one run of
/// adjacent lines of the same file), from the text of `/proc/self/maps`; `None` for anything
/// else: private or anonymous memory, a range that leaves the file's mappings, a deleted file,
/// and files under `/dev` (devices, hugepages, `/dev/shm`: nothing there outlives the machine).
pub fn shared_file(maps: &str, addr: u64, len: u64) -> Option<PathBuf> {
    let end = addr.checked_add(len)?;
    if len == 0 {
        return None;
    }
    let mut covered = addr;
    let mut file: Option<&str> = None;
    for line in maps.lines().filter_map(parse_line) {
        if line.end <= covered {
            continue;
        }
        if line.start > covered {
            // The lines are in address order: the next byte to cover is in no mapping.
            return None;
        }
        let path = line.path.filter(|_| line.shared_writable)?;
        if path.ends_with(" (deleted)") || path.starts_with("/dev/") {
            return None;
        }
        if file.is_some_and(|f| f != path) {
            return None;
        }
        file = Some(path);
        covered = line.end;
        if covered >= end {
            return Some(PathBuf::from(path));
        }
    }
    None
}

/// [`shared_file`] of this process's mappings now.
pub fn shared_file_now(addr: u64, len: u64) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    shared_file(&maps, addr, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000200000 rw-s 00000000 08:01 131090                     /var/lib/app/log file.bin
7f0000200000-7f0000400000 rw-s 00200000 08:01 131090                     /var/lib/app/log file.bin
7f0000400000-7f0000401000 r--s 00000000 08:01 131091                     /var/lib/app/ro.bin
7f0000500000-7f0000600000 rw-p 00000000 08:01 131092                     /var/lib/app/private.bin
7f0000600000-7f0000700000 rw-s 00000000 00:05 4096                       /dev/hugepages/rtemap_0
7f0000700000-7f0000800000 rw-s 00000000 08:01 131093                     /tmp/gone (deleted)
7f0000800000-7f0000900000 rw-s 00000000 08:01 131094                     /var/lib/app/other.bin
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn a_range_inside_a_shared_file_mapping_names_the_file() {
        let f = Some(PathBuf::from("/var/lib/app/log file.bin"));
        assert_eq!(
            shared_file(MAPS, 0x7f00_0000_0100, 4096),
            f,
            "a path with a space"
        );
        // Across the two adjacent mappings of the same file.
        assert_eq!(shared_file(MAPS, 0x7f00_001f_f000, 0x2000), f);
        assert_eq!(
            shared_file(MAPS, 0x7f00_0000_0000, 0x40_0000),
            f,
            "exactly all of it"
        );
    }

    #[test]
    fn anything_else_is_not_a_file_to_persist() {
        let none =
            |addr: u64, len: u64| assert_eq!(shared_file(MAPS, addr, len), None, "{addr:#x}");
        none(0x55d0_c0a0_0000, 64); // the heap
        none(0x7f00_003f_f000, 0x2000); // runs off the file into a read-only mapping
        none(0x7f00_0040_0000, 64); // read-only
        none(0x7f00_0050_0000, 64); // private
        none(0x7f00_0060_0000, 64); // hugepages
        none(0x7f00_0070_0000, 64); // deleted
        none(0x7f00_007f_f000, 0x2000); // two files
        none(0x7f00_0000_0000, 0); // empty
        none(0x7f00_0090_0000, 64); // unmapped
        none(u64::MAX - 1, 8); // overflows
    }

    #[test]
    fn this_process_s_own_mappings_are_read() {
        // A shared mapping of a file is found, from inside it; the heap is not.
        let path = std::env::temp_dir().join(format!("portico-fi-maps-{}", std::process::id()));
        let map = pmem::Mapping::create_file(&path, 3 * 4096).unwrap();
        let at = map.as_ptr() as u64 + 100;
        assert_eq!(
            shared_file_now(at, 8000),
            Some(std::fs::canonicalize(&path).unwrap())
        );
        assert_eq!(shared_file_now(at, 3 * 4096), None, "past its end");
        let v = vec![0u8; 1 << 20];
        assert_eq!(shared_file_now(v.as_ptr() as u64, v.len() as u64), None);
        drop(map);
        std::fs::remove_file(&path).unwrap();
    }
}
