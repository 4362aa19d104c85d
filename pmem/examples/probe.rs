//! What this machine offers for registered and persistent memory: the flush instruction CPUID
//! reports, what a file mapping in each given directory turns out to be, and whether 2 MiB
//! hugetlb pages can be mapped.
//!
//! `cargo run -p pmem --example probe [DIR ...]` (default: /tmp and /dev/shm)

use std::path::PathBuf;

use pmem::{Mapping, flush_instruction, free_2mib_hugepages};

fn main() {
    match flush_instruction() {
        Some(instr) => println!("flush instruction (CPUID): {instr}"),
        None => {
            println!("flush instruction (CPUID): none; DAX mappings would be persisted with msync")
        }
    }

    let mut dirs: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if dirs.is_empty() {
        dirs = vec!["/tmp".into(), "/dev/shm".into()];
    }
    for dir in dirs {
        let path = dir.join(format!("pmem-probe-{}", std::process::id()));
        match Mapping::create_file(&path, 4096) {
            Ok(m) => println!("{}: {}", dir.display(), m.kind()),
            Err(e) => println!("{}: {e}", dir.display()),
        }
        let _ = std::fs::remove_file(&path);
    }

    let free = free_2mib_hugepages().map_or("unknown".to_string(), |n| n.to_string());
    match Mapping::hugetlb(1) {
        Ok(m) => println!(
            "hugetlb: mapped {} bytes of {} ({free} pages were free)",
            m.len(),
            m.kind()
        ),
        Err(e) => println!("hugetlb: {e}"),
    }
    match Mapping::anonymous_prefer_huge(1) {
        Ok(m) => println!("anonymous_prefer_huge: {}", m.kind()),
        Err(e) => println!("anonymous_prefer_huge: {e}"),
    }
}
