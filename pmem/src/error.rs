//! What can go wrong when mapping, accessing or persisting memory. Each message says what was
//! attempted and names the file where there is one.

use std::io;
use std::path::{Path, PathBuf};

#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A file operation failed: opening, sizing, mapping, `msync`, or writing the simulator's
    /// persisted image.
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The kernel refused an anonymous mapping (or the simulator's memfd).
    #[error("cannot map {len} bytes of {what}: {source}")]
    Map {
        what: &'static str,
        len: usize,
        #[source]
        source: io::Error,
    },
    /// The kernel refused a hugetlb mapping: usually too few free 2 MiB pages.
    #[error(
        "the kernel refused {len} bytes of 2 MiB hugetlb pages ({source}); {} free 2 MiB pages; \
         reserve more with `echo N | sudo tee /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`",
        free_pages_text(.free_pages)
    )]
    HugeTlb {
        len: usize,
        free_pages: Option<u64>,
        #[source]
        source: io::Error,
    },
    /// A length of zero, or one that does not fit in the address space once rounded.
    #[error(
        "cannot map {len} bytes of {what}: the length must be at least 1 and fit in the address space"
    )]
    BadLength { what: &'static str, len: u64 },
    /// `open_file` on an empty file: there is nothing to map.
    #[error("cannot map {}: the file is empty (create it with a length first)", .path.display())]
    EmptyFile { path: PathBuf },
    /// An access or persist outside the mapping.
    #[error("range at offset {offset} with length {len} is outside the {size}-byte mapping")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    /// An atomic access at an address that is not aligned to its size.
    #[error("atomic access at offset {offset} is not {align}-byte aligned")]
    Misaligned { offset: usize, align: usize },
    /// `crash()` on a mapping that is not under the power-loss simulator.
    #[error(
        "crash() needs a mapping made with MapOptions::new().simulate_power_loss(true); \
         this one is real memory, and its stores cannot be taken back"
    )]
    NotSimulated,
    /// Two options of [`crate::MapOptions`] that cannot go together.
    #[error("MapOptions: {0}")]
    Options(&'static str),
}

impl Error {
    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> Error {
        Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

fn free_pages_text(free: &Option<u64>) -> String {
    match free {
        Some(n) => n.to_string(),
        None => "an unknown number of".to_string(),
    }
}
