//! Registered memory for Portico: the application's own memory, which the engine reads and
//! writes on a worker thread, and a target's persistent region.
//!
//! As in verbs, the application maps the memory and registers a range of it. A [`Mapping`] is
//! private anonymous memory, 2 MiB hugetlb pages, or a shared file mapping (DAX with
//! `MAP_SYNC` when the file system allows it). [`Mapping::persist`] makes a range durable in the
//! way the mapping's [`Kind`] allows: cache-line write-back and a fence on DAX, `msync` on
//! any other file, nothing on anonymous memory. With [`MapOptions::simulate_power_loss`], a
//! mapping keeps the image of every 64-byte line as of its last persist, and
//! [`Mapping::crash`] throws away every store made since. So persistence code can be tested on a
//! machine without persistent memory, and even across a `SIGKILL`.
//!
//! This crate is the only place where Portico touches mapped memory with `unsafe`. Every
//! `unsafe` block says why it is sound in a `SAFETY:` comment. It also holds the engine's
//! other uses of CPU instructions that Rust reaches only through `unsafe`: the CRC kernels
//! ([`crc`]) and two prefetch hints ([`prefetch()`], [`prefetch_write()`]).
//!
//! # The contract
//!
//! Memory registered with the engine is shared by two threads: the application's (the host) and
//! the worker that places incoming RDMA data into it and sends from it. The rules are those of
//! verbs:
//!
//! - While an RDMA operation on a buffer is outstanding, the application leaves that buffer
//!   alone: it neither reads nor writes it.
//! - A completion hands the buffer back. The worker publishes completions with release
//!   ordering and the host polls them with acquire ordering, so the data the worker placed is
//!   visible to the host once it has seen the completion (and the host's stores to a buffer are
//!   visible to the worker once it has seen the work request).
//! - The engine touches the memory only through [`Mapping::read`], [`Mapping::read_crc`],
//!   [`Mapping::write`] and [`Mapping::fill`]. These are raw copies (`ptr::copy_nonoverlapping`, `ptr::write_bytes`)
//!   through the mapping's base pointer. They never create a Rust reference to the memory, so
//!   memory that another thread may be using is never aliased by a `&[u8]` or `&mut [u8]`.
//! - [`Mapping::slice`] and [`Mapping::slice_mut`] do create references. They are `unsafe`
//!   because the caller must guarantee that nobody writes the range while the shared slice
//!   lives, and that nobody else reads or writes it while the mutable slice lives.
//!
//! Persistence works on whole 64-byte cache lines ([`CACHE_LINE`]), as the hardware does: persisting
//! one byte persists the line that holds it. A range that is being persisted should not be
//! written at the same time, and neither should the rest of its first and last lines.
//!
//! Linux only: it relies on `MAP_SYNC`, `MAP_HUGETLB`, `memfd_create` and the way
//! `MADV_DONTNEED` drops the private pages of a file mapping.

#[cfg(not(target_os = "linux"))]
compile_error!("pmem supports Linux only (MAP_SYNC, MAP_HUGETLB, memfd_create, MADV_DONTNEED)");

pub mod crc;
mod error;
mod flush;
mod hugepages;
mod kind;
mod mapping;
mod prefetch;
mod room;
mod sys;

pub use error::Error;
pub use flush::flush_instruction;
pub use hugepages::{free_2mib_hugepages, meminfo_field};
pub use kind::{Durability, FlushInstr, Kind};
pub use mapping::{MapOptions, Mapping};
pub use prefetch::{prefetch, prefetch_write};
pub use room::{address_space_limit, fs_free_bytes};

/// The unit of persistence: a store becomes durable one whole cache line at a time.
pub const CACHE_LINE: usize = 64;

/// The hugetlb page size that [`Mapping::hugetlb`] asks for.
pub const HUGE_PAGE: usize = 2 << 20;
