//! What a mapping is, and how a store in it is made durable.

use std::fmt;

use crate::flush::flush_instruction;

/// What a [`crate::Mapping`] is. Its `Display` says how `persist` works on it, in words an
/// operator can check against the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Private anonymous memory in base pages.
    Anonymous,
    /// Private anonymous memory in 2 MiB hugetlb pages.
    HugeTlb,
    /// A shared file mapping. `dax` is true only when the file system accepted `MAP_SYNC`, so
    /// that stores reach the media through the CPU caches without the page cache.
    File { dax: bool },
    /// Anonymous memory under the power-loss simulator.
    SimulatedAnonymous,
    /// A file under the power-loss simulator: the file holds exactly the persisted lines.
    SimulatedFile,
    /// Memory the application mapped itself and registered in place ([`crate::Mapping::borrowed`]).
    Application,
    /// A shared mapping of a file that the application made itself, registered in place
    /// ([`crate::Mapping::borrowed_file`]): persisted with `msync`, as a file mapping is.
    ApplicationFile,
    /// A file mapping treated as persistent memory though it is not
    /// ([`crate::MapOptions::emulate_pmem`], as PMDK's `PMEM_IS_PMEM_FORCE`): persisted as
    /// DAX is, by cache-line write-back and a fence, so that what a persist costs on real
    /// persistent memory can be measured here. Not durable: the page cache is never synced.
    EmulatedPmem,
}

impl Kind {
    /// How `persist` makes stores durable on a mapping of this kind.
    pub fn durability(self) -> Durability {
        match self {
            Kind::Anonymous | Kind::HugeTlb | Kind::Application => Durability::Volatile,
            Kind::File { dax: false } | Kind::ApplicationFile => Durability::Msync,
            Kind::File { dax: true } => match flush_instruction() {
                Some(instr) => Durability::CacheFlush(instr),
                None => Durability::Msync,
            },
            Kind::SimulatedAnonymous | Kind::SimulatedFile => Durability::Simulated,
            Kind::EmulatedPmem => match flush_instruction() {
                Some(instr) => Durability::CacheFlush(instr),
                // Off x86_64 there is no line write-back to emulate with: nothing is done,
                // which is what the emulation promises anyway (no durability).
                None => Durability::Volatile,
            },
        }
    }

    /// True for mappings under the power-loss simulator.
    pub fn is_simulated(self) -> bool {
        matches!(self, Kind::SimulatedAnonymous | Kind::SimulatedFile)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Anonymous => f.write_str("anonymous memory (volatile; persist does nothing)"),
            Kind::Application => f.write_str(
                "the application's own memory, registered in place (volatile; persist does nothing)",
            ),
            Kind::EmulatedPmem => write!(
                f,
                "emulated persistent memory (a file treated as DAX: persist = {}; \
                 emulated, not durable)",
                self.durability()
            ),
            Kind::ApplicationFile => f.write_str(
                "a shared file mapping the application made, registered in place (persist = msync)",
            ),
            Kind::HugeTlb => f.write_str("2 MiB hugetlb pages (volatile; persist does nothing)"),
            Kind::File { dax: true } => {
                write!(f, "file (DAX, MAP_SYNC; persist = {})", self.durability())
            }
            Kind::File { dax: false } => f.write_str(
                "file (not DAX: the file system refused MAP_SYNC; persist = msync)",
            ),
            Kind::SimulatedAnonymous => f.write_str(
                "anonymous memory under the power-loss simulator \
                 (private view of a memfd; persist = write whole cache lines to the memfd; \
                 crash() reverts to it)",
            ),
            Kind::SimulatedFile => f.write_str(
                "file under the power-loss simulator \
                 (private view; persist = write whole cache lines to the file; crash() reverts to it)",
            ),
        }
    }
}

/// How `persist` makes a range durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Nothing to make durable: the memory does not outlive the process.
    Volatile,
    /// `msync(MS_SYNC)` of the pages that cover the range.
    Msync,
    /// One flush instruction per cache line, then one `SFENCE`.
    CacheFlush(FlushInstr),
    /// The power-loss simulator's copy of whole cache lines into the persisted image.
    Simulated,
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Durability::Volatile => f.write_str("nothing (volatile memory)"),
            Durability::Msync => f.write_str("msync"),
            Durability::CacheFlush(instr) => write!(f, "{instr} + SFENCE"),
            Durability::Simulated => f.write_str("copy to the simulator's persisted image"),
        }
    }
}

/// The x86 instruction that writes a cache line back towards persistent memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushInstr {
    /// Writes the line back and may keep it in the cache (the best choice).
    Clwb,
    /// Writes the line back and evicts it; weakly ordered, so many can be in flight.
    ClflushOpt,
    /// Writes the line back and evicts it; each one is ordered after the previous.
    Clflush,
}

impl fmt::Display for FlushInstr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlushInstr::Clwb => "CLWB",
            FlushInstr::ClflushOpt => "CLFLUSHOPT",
            FlushInstr::Clflush => "CLFLUSH",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_say_how_they_persist() {
        assert_eq!(Kind::Anonymous.durability(), Durability::Volatile);
        assert_eq!(Kind::HugeTlb.durability(), Durability::Volatile);
        assert_eq!(Kind::File { dax: false }.durability(), Durability::Msync);
        assert_eq!(Kind::SimulatedFile.durability(), Durability::Simulated);
        assert_eq!(
            Kind::File { dax: false }.to_string(),
            "file (not DAX: the file system refused MAP_SYNC; persist = msync)"
        );
        assert_eq!(
            Kind::HugeTlb.to_string(),
            "2 MiB hugetlb pages (volatile; persist does nothing)"
        );
        let dax = Kind::File { dax: true }.to_string();
        match flush_instruction() {
            Some(FlushInstr::Clwb) => {
                assert_eq!(dax, "file (DAX, MAP_SYNC; persist = CLWB + SFENCE)")
            }
            Some(instr) => assert!(
                dax.contains(&format!("persist = {instr} + SFENCE")),
                "{dax}"
            ),
            None => assert!(dax.ends_with("persist = msync)"), "{dax}"),
        }
        assert_eq!(FlushInstr::ClflushOpt.to_string(), "CLFLUSHOPT");
    }
}
