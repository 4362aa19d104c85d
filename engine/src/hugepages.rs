//! Whether this machine has hugepages EAL can use: free pages of the default size and a
//! hugetlbfs mount. Read from `/proc`; the parsers are pure and tested on sample text.

/// Hugepage availability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HugepageStatus {
    pub page_kb: u64,
    pub total: u64,
    pub free: u64,
    pub mounted: bool,
}

/// Less than this much free hugepage memory is not worth running on.
pub const MIN_USEFUL_BYTES: u64 = 64 << 20;

impl HugepageStatus {
    /// Reads `/proc/meminfo` and `/proc/mounts`.
    pub fn read() -> HugepageStatus {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        Self::parse(&meminfo, &mounts)
    }

    pub fn parse(meminfo: &str, mounts: &str) -> HugepageStatus {
        let field = |name: &str| pmem::meminfo_field(meminfo, name).unwrap_or(0);
        HugepageStatus {
            page_kb: field("Hugepagesize"),
            total: field("HugePages_Total"),
            free: field("HugePages_Free"),
            mounted: mounts
                .lines()
                .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs")),
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free * self.page_kb * 1024
    }

    /// True when EAL can run on hugepages here.
    pub fn usable(&self) -> bool {
        self.mounted && self.free_bytes() >= MIN_USEFUL_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24000000 kB\nHugePages_Total:     512\nHugePages_Free:      500\nHugePages_Rsvd:        0\nHugepagesize:       2048 kB\n";

    #[test]
    fn parses_meminfo_and_mounts() {
        let s = HugepageStatus::parse(
            MEMINFO,
            "proc /proc proc rw 0 0\nnodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n",
        );
        assert_eq!(
            s,
            HugepageStatus {
                page_kb: 2048,
                total: 512,
                free: 500,
                mounted: true
            }
        );
        assert_eq!(s.free_bytes(), 500 * 2 * 1024 * 1024);
        assert!(s.usable());
    }

    #[test]
    fn unmounted_or_empty_is_not_usable() {
        assert!(!HugepageStatus::parse(MEMINFO, "proc /proc proc rw 0 0\n").usable());
        let none = HugepageStatus::parse(
            "HugePages_Total: 0\nHugePages_Free: 0\nHugepagesize: 2048 kB\n",
            "x /dev/hugepages hugetlbfs rw 0 0",
        );
        assert!(!none.usable());
    }
}
