//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under `std::env::temp_dir()`, removed with its contents on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("pmem-test-{}-{n}-{label}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A byte pattern that differs from line to line and from seed to seed.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i * 7 + i / 64) as u8) | 1)
        .collect()
}

/// Free minus reserved 2 MiB hugetlb pages, read from /proc/meminfo by the test itself, or
/// `None` when the default huge page size is not 2 MiB.
pub fn meminfo_free_2mib_pages() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let get = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    (get("Hugepagesize:")? == 2048)
        .then(|| get("HugePages_Free:").unwrap() - get("HugePages_Rsvd:").unwrap())
}

/// The mount options of the file system that holds `path` (longest mount point prefix in
/// /proc/self/mountinfo), joined with the super-block options.
pub fn mount_options(path: &Path) -> String {
    let path = std::fs::canonicalize(path).unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(sep) = fields.iter().position(|&f| f == "-") else {
            continue;
        };
        let (mount_point, opts) = (fields[4], fields[5]);
        let super_opts = fields.get(sep + 3).copied().unwrap_or("");
        if path.starts_with(mount_point)
            && best.as_ref().is_none_or(|(n, _)| mount_point.len() >= *n)
        {
            best = Some((mount_point.len(), format!("{opts},{super_opts}")));
        }
    }
    best.map(|(_, o)| o).unwrap_or_default()
}
