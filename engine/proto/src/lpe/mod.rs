//! List-processing engine (LPE): the target-side matching an HPC NIC does in
//! hardware, in pure Rust for Portico's transport to call per packet.
//!
//! Per endpoint (portal index) there are four lists — priority, overflow,
//! unexpected and software request — with Portals 4 semantics as MPI uses
//! them; match shards (the seed's processing engines, each owned by one worker core) hold endpoints,
//! arbitrate between host commands and network requests, and keep a
//! persistent-entry cache. See `docs/lpe.md` for the design.
//!
//! Entry points for the transport:
//! * [`MatchShard::match_incoming`] — match one incoming header now
//!   (the owning worker's per-packet call; does not allocate);
//! * [`MatchShard::append`], [`MatchShard::unlink`],
//!   [`MatchShard::search`] — host commands on the owning core;
//! * [`Dispatcher::submit`] + [`MatchShard::poll`] / [`Worker::poll`] —
//!   the queued path across cores, with arbitration and the block bit.

mod cache;
mod deep;
mod endpoint;
mod entry;
mod events;
mod hash;
mod list;
pub mod reference;
mod reserve;
mod shard;
mod unexpected;

#[cfg(test)]
mod tests;

pub use cache::{CacheStats, DEFAULT_CACHE_ENTRIES, PersistentCache};
pub use deep::DeepList;
pub use endpoint::{
    Appended, Delivery, DropReason, Endpoint, EndpointCounters, EntryHandle, LpeError,
    MatchOutcome, SearchMode,
};
pub use entry::{
    EndpointConfig, EndpointIndex, ID_ANY, IncomingHeader, ListKind, MatchEntry, MatchId, Op,
    Options, ProcessId,
};
pub use events::{Event, EventKind, EventRing, EventSink, NiFail, NullSink, Ring};
pub use hash::{BuildWordHasher, WordHasher};
pub use list::{EntryId, LinearList, Lookup, MatchList};
pub use shard::{
    Command, Completion, CompletionKind, CompletionSink, DEFAULT_POOL_ENTRIES, Dispatcher,
    EndpointTable, EngineConfig, EngineId, EngineStats, Inbound, MatchShard, Request, RequestBody,
    TrafficClass, Worker, build_shards,
};
pub use unexpected::{SoftwareRequestList, UnexpectedHeader, UnexpectedList};
