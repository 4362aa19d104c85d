//! Bounds that depend on the machine rather than on the file: how much memory this process can
//! map, how much room a file system has for a region file, and how long a duration may be.
//!
//! They are checked before EAL starts, like every other config error, so that a size too large
//! ends with one line naming its field and exit status 2 instead of a failed `mmap`, an
//! allocation abort, or a `SIGBUS` when a write lands in a sparse file the disk cannot back.

use std::path::Path;
use std::time::Duration;

use super::{ConfigError, err};

const MIB: u64 = 1 << 20;

/// The least memory EAL is given under `--no-huge` (`eal.memory_mb`, `--memory-mb`).
pub const MIN_MEMORY_MB: u32 = 64;

/// The longest duration or period accepted, in seconds (about 31 years): long enough to mean
/// "for ever", short enough that adding it to a clock reading cannot overflow.
pub const MAX_SECONDS: f64 = 1e9;

/// How much memory this process can map: the smallest of the machine's memory, its cgroup's
/// memory limit and its address-space limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    /// Which of the three it is.
    pub source: &'static str,
}

impl std::fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} MiB, {}", self.bytes / MIB, self.source)
    }
}

impl MemoryLimit {
    /// Reads the three limits; `None` when none of them can be read (nothing is checked then).
    pub fn read() -> Option<MemoryLimit> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
        MemoryLimit::smallest(&[
            (
                meminfo.as_deref().and_then(mem_total),
                "MemTotal in /proc/meminfo",
            ),
            (cgroup_limit(), "the cgroup's memory limit"),
            (pmem::address_space_limit(), "RLIMIT_AS (ulimit -v)"),
        ])
    }

    /// The smallest of the limits that are known.
    fn smallest(limits: &[(Option<u64>, &'static str)]) -> Option<MemoryLimit> {
        limits
            .iter()
            .filter_map(|&(bytes, source)| {
                Some(MemoryLimit {
                    bytes: bytes?,
                    source,
                })
            })
            .min_by_key(|l| l.bytes)
    }
}

/// `MemTotal` from the text of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    pmem::meminfo_field(meminfo, "MemTotal")?.checked_mul(1024)
}

/// The memory limit of this process's cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`),
/// in bytes; `None` when there is none or it cannot be read.
fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = cgroup_paths(&own);
    let read = |candidates: &[String]| {
        candidates
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| parse_cgroup_limit(&text))
    };
    // In a cgroup namespace the path in /proc/self/cgroup is "/" and the mount's root is the
    // process's own cgroup, so the root is the fallback.
    let v2_files = v2.map(|p| {
        [
            format!("/sys/fs/cgroup{p}/memory.max"),
            "/sys/fs/cgroup/memory.max".to_string(),
        ]
    });
    let v1_files = v1.map(|p| {
        [
            format!("/sys/fs/cgroup/memory{p}/memory.limit_in_bytes"),
            "/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string(),
        ]
    });
    v2_files
        .and_then(|f| read(&f))
        .or_else(|| v1_files.and_then(|f| read(&f)))
}

/// The v2 path (`0::/path`) and the v1 memory controller's path (`N:memory:/path`) in the text
/// of `/proc/self/cgroup`.
fn cgroup_paths(text: &str) -> (Option<&str>, Option<&str>) {
    let mut v2 = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path.trim_end_matches('/'));
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.trim_end_matches('/'));
        }
    }
    (v2, v1)
}

/// A cgroup memory limit file's value: `max`, or v1's "unlimited" (a page-rounded
/// `i64::MAX`), is no limit.
fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// `bytes` of `what` fit in the memory this process can map.
pub fn check_memory(
    field: &str,
    what: &str,
    bytes: u64,
    limit: Option<&MemoryLimit>,
) -> Result<(), ConfigError> {
    match limit {
        Some(l) if bytes > l.bytes => Err(err(
            field,
            format!("{what} of {bytes} bytes is more memory than this process can map ({l})"),
        )),
        _ => Ok(()),
    }
}

/// EAL's memory under `--no-huge`, in MiB: at least [`MIN_MEMORY_MB`] and no more than this
/// process can map.
pub fn check_memory_mb(
    field: &str,
    mb: u32,
    limit: Option<&MemoryLimit>,
) -> Result<(), ConfigError> {
    if mb < MIN_MEMORY_MB {
        return Err(err(field, format!("must be at least {MIN_MEMORY_MB}")));
    }
    match limit {
        Some(l) if mb as u64 * MIB > l.bytes => Err(err(
            field,
            format!("{mb} MiB is more memory than this process can map ({l})"),
        )),
        _ => Ok(()),
    }
}

/// Room on the file system for a file of `len` bytes at `path`, which does not exist yet: its
/// directory must exist and have `len` bytes free.
pub fn check_file_room(field: &str, path: &Path, len: u64) -> Result<(), ConfigError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let free = pmem::fs_free_bytes(dir).map_err(|e| {
        err(
            field,
            format!(
                "cannot create {}: directory {}: {e}",
                path.display(),
                dir.display()
            ),
        )
    })?;
    if len > free {
        return Err(err(
            field,
            format!(
                "{} would hold {len} bytes, more than the {free} bytes free on its file system",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// A number of seconds from a config or the command line: 0 (returned as `None`, "until
/// stopped") up to [`MAX_SECONDS`].
pub fn seconds(field: &str, v: f64) -> Result<Option<Duration>, ConfigError> {
    if !(0.0..=MAX_SECONDS).contains(&v) {
        return Err(err(
            field,
            format!("must be a number of seconds, 0..={MAX_SECONDS:e}"),
        ));
    }
    Ok((v > 0.0).then(|| Duration::from_secs_f64(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemFree:  100 kB\nMemTotal:       24684096 kB\n";
        assert_eq!(mem_total(text), Some(24684096 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn the_smallest_known_limit_wins() {
        let l = MemoryLimit::smallest(&[(Some(8 << 30), "a"), (None, "b"), (Some(1 << 30), "c")])
            .unwrap();
        assert_eq!(
            l,
            MemoryLimit {
                bytes: 1 << 30,
                source: "c"
            }
        );
        assert_eq!(l.to_string(), "1024 MiB, c");
        assert_eq!(MemoryLimit::smallest(&[(None, "a")]), None);
    }

    #[test]
    fn cgroup_files_are_parsed() {
        let v1 = "9:name=systemd:/\n4:memory:/x/y\n0::/\n";
        assert_eq!(cgroup_paths(v1), (Some(""), Some("/x/y")));
        let v2 = "0::/user.slice/a.scope\n";
        assert_eq!(cgroup_paths(v2), (Some("/user.slice/a.scope"), None));
        assert_eq!(cgroup_paths("3:cpu,memory:/m/\n").1, Some("/m"));
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_limit("1073741824\n"), Some(1 << 30));
    }

    #[test]
    fn memory_beyond_the_limit_names_the_field() {
        let limit = MemoryLimit {
            bytes: 1 << 30,
            source: "MemTotal in /proc/meminfo",
        };
        assert!(check_memory("rdma.region_len", "a region", 1 << 30, Some(&limit)).is_ok());
        let e =
            check_memory("rdma.region_len", "a region", (1 << 30) + 1, Some(&limit)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma.region_len: a region of 1073741825 bytes is more memory than this process can map (1024 MiB, MemTotal in /proc/meminfo)"
        );
        assert!(
            check_memory("x", "y", u64::MAX, None).is_ok(),
            "no limit known"
        );
    }

    #[test]
    fn eal_memory_is_bounded_both_ways() {
        let limit = MemoryLimit {
            bytes: 1 << 30,
            source: "RLIMIT_AS (ulimit -v)",
        };
        assert!(check_memory_mb("eal.memory_mb", 1024, Some(&limit)).is_ok());
        assert_eq!(
            check_memory_mb("eal.memory_mb", 16, Some(&limit))
                .unwrap_err()
                .to_string(),
            "eal.memory_mb: must be at least 64"
        );
        assert_eq!(
            check_memory_mb("--memory-mb", 2048, Some(&limit))
                .unwrap_err()
                .to_string(),
            "--memory-mb: 2048 MiB is more memory than this process can map (1024 MiB, RLIMIT_AS (ulimit -v))"
        );
    }

    #[test]
    fn a_file_needs_an_existing_directory_with_room() {
        let tmp = std::env::temp_dir().join("portico-room-test.bin");
        assert!(check_file_room("rdma.region_file", &tmp, 4096).is_ok());
        let e = check_file_room("rdma.region_file", &tmp, u64::MAX).unwrap_err();
        assert_eq!(e.field, "rdma.region_file");
        assert!(e.message.contains("more than the"), "{e}");
        let e =
            check_file_room("--region-file", Path::new("/nonexistent/dir/r.bin"), 1).unwrap_err();
        assert_eq!(e.field, "--region-file");
        assert!(e.message.contains("directory /nonexistent/dir"), "{e}");
        assert!(
            check_file_room("f", Path::new("relative.bin"), 1).is_ok(),
            "the working directory"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(
            seconds("--duration", 0.0).unwrap(),
            None,
            "0: until stopped"
        );
        assert_eq!(
            seconds("--duration", 1.5).unwrap(),
            Some(Duration::from_millis(1500))
        );
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e300] {
            let e = seconds("run.duration_s", bad).unwrap_err();
            assert_eq!(e.field, "run.duration_s", "{bad}");
            assert_eq!(e.message, "must be a number of seconds, 0..=1e9");
        }
    }
}
