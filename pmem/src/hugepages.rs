//! How many 2 MiB hugetlb pages the kernel has free, from `/proc/meminfo` (or sysfs when the
//! default huge page size is not 2 MiB).

/// Free 2 MiB hugetlb pages that no mapping has reserved yet: `HugePages_Free - HugePages_Rsvd`
/// from `/proc/meminfo` when `Hugepagesize` is 2048 kB, else the same counters from
/// `/sys/kernel/mm/hugepages/hugepages-2048kB`. `None` when neither can be read.
pub fn free_2mib_hugepages() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    if let Some(n) = meminfo.as_deref().and_then(parse_meminfo) {
        return Some(n);
    }
    let dir = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("{dir}/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(read("free_hugepages")?.saturating_sub(read("resv_hugepages")?))
}

/// The number a line of `/proc/meminfo` text gives `name` (`MemTotal`, `HugePages_Free`, ...),
/// as written: kB for sizes, a count for pages. `None` when the line is missing or unreadable.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Free minus reserved default-size pages, if the default size is 2 MiB.
fn parse_meminfo(text: &str) -> Option<u64> {
    let field = |name: &str| meminfo_field(text, name);
    if field("Hugepagesize")? != 2048 {
        return None;
    }
    Some(field("HugePages_Free")?.saturating_sub(field("HugePages_Rsvd")?))
}

#[cfg(test)]
mod tests {
    use super::parse_meminfo;

    const MEMINFO: &str = "MemTotal:       16000000 kB\n\
                           HugePages_Total:      64\n\
                           HugePages_Free:       40\n\
                           HugePages_Rsvd:        8\n\
                           HugePages_Surp:        0\n\
                           Hugepagesize:       2048 kB\n";

    #[test]
    fn free_is_free_minus_reserved() {
        assert_eq!(parse_meminfo(MEMINFO), Some(32));
    }

    #[test]
    fn another_default_size_is_not_read_as_2mib() {
        let gib = MEMINFO.replace("2048 kB", "1048576 kB");
        assert_eq!(parse_meminfo(&gib), None);
    }

    #[test]
    fn missing_counters_give_none() {
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }
}
