//! Value types shared by every list: endpoints, process ids with wildcards,
//! list-entry options, match entries and incoming headers, plus the Portals 4
//! match rule (`((incoming ^ match_bits) & !ignore_bits) == 0`, source check,
//! no-truncate fit) that every structure in this module must apply the same way.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Physical endpoint (Portals portal-table index) that owns one set of lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointIndex(pub u16);

impl fmt::Display for EndpointIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pt{}", self.0)
    }
}

/// Value reserved as the wildcard in [`MatchId`]; no real nid or pid may use it.
pub const ID_ANY: u32 = u32::MAX;

/// The sender of a message (Portals `ptl_process_t`). With logical addressing
/// the rank is carried in `nid` and `pid` is 0 (see [`ProcessId::rank`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ProcessId {
    pub nid: u32,
    pub pid: u32,
}

impl ProcessId {
    pub const fn new(nid: u32, pid: u32) -> Self {
        Self { nid, pid }
    }

    /// Logical (rank) addressing, as MPI uses it.
    pub const fn rank(rank: u32) -> Self {
        Self { nid: rank, pid: 0 }
    }
}

/// The source an entry accepts (Portals `match_id`); either field may be
/// [`ID_ANY`], which is how MPI_ANY_SOURCE reaches the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatchId {
    pub nid: u32,
    pub pid: u32,
}

impl MatchId {
    /// Accepts every sender.
    pub const ANY: MatchId = MatchId {
        nid: ID_ANY,
        pid: ID_ANY,
    };

    pub const fn exact(p: ProcessId) -> Self {
        Self {
            nid: p.nid,
            pid: p.pid,
        }
    }

    pub const fn rank(rank: u32) -> Self {
        Self::exact(ProcessId::rank(rank))
    }

    /// True when neither field is a wildcard, so the entry can live in a hashed bin.
    #[inline]
    pub const fn is_exact(&self) -> bool {
        self.nid != ID_ANY && self.pid != ID_ANY
    }

    #[inline]
    pub const fn accepts(&self, p: ProcessId) -> bool {
        (self.nid == ID_ANY || self.nid == p.nid) && (self.pid == ID_ANY || self.pid == p.pid)
    }
}

/// Per-entry options (a subset of Portals `PTL_ME_*`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Options(u32);

impl Options {
    pub const NONE: Options = Options(0);
    /// Put operations may target the entry.
    pub const OP_PUT: Options = Options(1);
    /// Get operations may target the entry.
    pub const OP_GET: Options = Options(1 << 1);
    /// Unlink after the first match; without it the entry is persistent.
    pub const USE_ONCE: Options = Options(1 << 2);
    /// The entry keeps its own offset and advances it by mlength per match;
    /// with `min_free` it unlinks itself when less than that remains.
    pub const MANAGE_LOCAL: Options = Options(1 << 3);
    /// A message that does not fit is not truncated: the entry is skipped.
    pub const NO_TRUNCATE: Options = Options(1 << 4);
    /// No `Link` event when the entry is linked (Portals' `PTL_ME_EVENT_LINK_DISABLE`).
    pub const EVENT_LINK_DISABLE: Options = Options(1 << 5);
    /// No `AutoUnlink` event when the entry unlinks itself (`PTL_ME_EVENT_UNLINK_DISABLE`):
    /// an MPI library that posts use-once receives learns all it needs from their puts.
    pub const EVENT_UNLINK_DISABLE: Options = Options(1 << 6);

    #[inline]
    pub const fn contains(self, other: Options) -> bool {
        self.0 & other.0 == other.0
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    pub const fn from_bits(bits: u32) -> Self {
        Options(bits & 0x7f)
    }
}

impl BitOr for Options {
    type Output = Options;
    fn bitor(self, rhs: Options) -> Options {
        Options(self.0 | rhs.0)
    }
}

impl BitOrAssign for Options {
    fn bitor_assign(&mut self, rhs: Options) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(Options, &str); 7] = [
            (Options::OP_PUT, "OP_PUT"),
            (Options::OP_GET, "OP_GET"),
            (Options::USE_ONCE, "USE_ONCE"),
            (Options::MANAGE_LOCAL, "MANAGE_LOCAL"),
            (Options::NO_TRUNCATE, "NO_TRUNCATE"),
            (Options::EVENT_LINK_DISABLE, "EVENT_LINK_DISABLE"),
            (Options::EVENT_UNLINK_DISABLE, "EVENT_UNLINK_DISABLE"),
        ];
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("NONE")?;
        }
        Ok(())
    }
}

/// Which entry list of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListKind {
    Priority,
    Overflow,
}

/// A list entry as the host posts it (Portals `ptl_me_t`; on a non-matching
/// endpoint the match fields are ignored and it behaves as a `ptl_le_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchEntry {
    pub match_bits: u64,
    pub ignore_bits: u64,
    pub source: MatchId,
    /// Buffer start address; data for a match lands at `start + offset`.
    pub start: u64,
    pub length: u64,
    /// Local offset, used and advanced only with [`Options::MANAGE_LOCAL`].
    pub offset: u64,
    /// With `MANAGE_LOCAL`: unlink once `length - offset < min_free` (0 = never).
    pub min_free: u64,
    pub options: Options,
    /// Opaque value returned in every event about this entry (Portals `user_ptr`).
    pub cookie: u64,
}

impl MatchEntry {
    /// A persistent put entry that accepts any source and only `match_bits` exactly.
    pub const fn new(match_bits: u64, start: u64, length: u64, cookie: u64) -> Self {
        Self {
            match_bits,
            ignore_bits: 0,
            source: MatchId::ANY,
            start,
            length,
            offset: 0,
            min_free: 0,
            options: Options::OP_PUT,
            cookie,
        }
    }

    pub const fn with_ignore(mut self, ignore_bits: u64) -> Self {
        self.ignore_bits = ignore_bits;
        self
    }

    pub const fn with_source(mut self, source: MatchId) -> Self {
        self.source = source;
        self
    }

    pub const fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    pub const fn with_min_free(mut self, min_free: u64) -> Self {
        self.min_free = min_free;
        self
    }

    #[inline]
    pub const fn is_use_once(&self) -> bool {
        self.options.contains(Options::USE_ONCE)
    }

    /// Match bits and source agree (the part of the rule that never changes
    /// while the entry is linked).
    #[inline]
    pub const fn accepts_key(&self, match_bits: u64, initiator: ProcessId) -> bool {
        (match_bits ^ self.match_bits) & !self.ignore_bits == 0 && self.source.accepts(initiator)
    }

    /// Offset at which a message with remote offset `remote_offset` lands.
    #[inline]
    pub const fn landing_offset(&self, remote_offset: u64) -> u64 {
        if self.options.contains(Options::MANAGE_LOCAL) {
            self.offset
        } else {
            remote_offset
        }
    }

    /// False when a no-truncate entry is too small for the message, which
    /// makes the entry not match at all (the search goes on).
    #[inline]
    pub const fn fits(&self, rlength: u64, remote_offset: u64) -> bool {
        if !self.options.contains(Options::NO_TRUNCATE) {
            return true;
        }
        let off = self.landing_offset(remote_offset);
        match off.checked_add(rlength) {
            Some(end) => end <= self.length,
            None => false,
        }
    }

    /// Full match rule for an incoming message.
    #[inline]
    pub const fn matches(&self, hdr: &IncomingHeader) -> bool {
        self.accepts_key(hdr.match_bits, hdr.initiator) && self.fits(hdr.rlength, hdr.remote_offset)
    }

    /// Bytes that actually land: the message is truncated to what is left.
    #[inline]
    pub const fn mlength(&self, offset: u64, rlength: u64) -> u64 {
        if offset >= self.length {
            0
        } else {
            let room = self.length - offset;
            if rlength < room { rlength } else { room }
        }
    }

    /// The entry allows this operation (a failure drops the message).
    #[inline]
    pub const fn permits(&self, op: Op) -> bool {
        match op {
            Op::Put => self.options.contains(Options::OP_PUT),
            Op::Get => self.options.contains(Options::OP_GET),
        }
    }
}

/// Remote operation carried by the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Put,
    Get,
}

/// What the transport parsed from an incoming packet's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IncomingHeader {
    pub initiator: ProcessId,
    pub match_bits: u64,
    /// Requested length.
    pub rlength: u64,
    pub remote_offset: u64,
    pub op: Op,
    /// 64 bits of out-of-band data (MPI puts the sender's envelope extras here).
    pub hdr_data: u64,
    /// The transport's own handle for the message (0 when unused): carried unchanged onto
    /// the unexpected list and into every event about the message, never looked at here.
    pub token: u64,
}

impl IncomingHeader {
    pub const fn put(initiator: ProcessId, match_bits: u64, rlength: u64) -> Self {
        Self {
            initiator,
            match_bits,
            rlength,
            remote_offset: 0,
            op: Op::Put,
            hdr_data: 0,
            token: 0,
        }
    }

    pub const fn get(initiator: ProcessId, match_bits: u64, rlength: u64) -> Self {
        Self {
            op: Op::Get,
            ..Self::put(initiator, match_bits, rlength)
        }
    }

    pub const fn with_remote_offset(mut self, remote_offset: u64) -> Self {
        self.remote_offset = remote_offset;
        self
    }

    pub const fn with_token(mut self, token: u64) -> Self {
        self.token = token;
        self
    }

    pub const fn with_hdr_data(mut self, hdr_data: u64) -> Self {
        self.hdr_data = hdr_data;
        self
    }
}

/// Per-endpoint behaviour chosen when the endpoint is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Matching endpoint (entries carry match bits) or non-matching (first
    /// usable entry takes the message).
    pub matching: bool,
    /// A message that matches nothing disables the endpoint instead of being dropped.
    pub flow_control: bool,
    pub max_priority: usize,
    pub max_overflow: usize,
    pub max_unexpected: usize,
    pub max_software_requests: usize,
    /// Created disabled (the seed's endpoints stay disabled until software enables them,
    /// `PtlPTEnable`): messages are dropped and counted until then. Off by default: an
    /// endpoint made by a libfabric or MPI endpoint is enabled with it.
    pub start_disabled: bool,
}

/// Entries a list may hold by default: the whole of its engine's default pool
/// ([`super::DEFAULT_POOL_ENTRIES`], the seed's 16 K per processing engine), so one
/// endpoint's list may take what the others leave, as in the seed. Memory is spent on the
/// entries held, not on the bound.
pub const DEFAULT_LIST_ENTRIES: usize = 16 * 1024;

impl Default for EndpointConfig {
    /// The seed's sizes: every list bounded by the engine's shared pool
    /// (`DEFAULT_LIST_ENTRIES`); the software request list keeps the Portals reference
    /// implementation's 1 024 (headers waiting for the host, outside the pool).
    fn default() -> Self {
        Self {
            matching: true,
            flow_control: false,
            max_priority: DEFAULT_LIST_ENTRIES,
            max_overflow: DEFAULT_LIST_ENTRIES,
            max_unexpected: DEFAULT_LIST_ENTRIES,
            max_software_requests: 1024,
            start_disabled: false,
        }
    }
}
