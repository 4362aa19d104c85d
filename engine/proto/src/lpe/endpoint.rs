//! One physical endpoint (Portals portal-table entry) and its four lists:
//! priority, overflow, unexpected and software request. This is where the
//! Portals 4 target-side rules live: priority-then-overflow search,
//! unexpected headers on overflow hits, drop or flow-control disable on no
//! match, permission drops, atomic "search unexpected, else link" on priority
//! append, search-only and search-and-delete probes, use-once / persistent /
//! manage-local min-free unlinks, AUTO_FREE, non-matching endpoints and the
//! hand-over to host matching through the software request list.
//!
//! Nothing here allocates after [`Endpoint::new`]: lists, header slots and
//! accounting records are preallocated to the configured limits.

use thiserror::Error;

use super::deep::DeepList;
use super::entry::{
    EndpointConfig, EndpointIndex, IncomingHeader, ListKind, MatchEntry, MatchId, Op, Options,
};
use super::events::{Event, EventKind, EventSink, NiFail};
use super::list::{EntryId, MatchList};
use super::reserve::Reserve;
use super::unexpected::{SoftwareRequestList, UnexpectedHeader, UnexpectedList};

/// Errors of host commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum LpeError {
    #[error("{0}: list is out of entries")]
    ListFull(EndpointIndex),
    #[error("{0}: entry handle is stale or unknown")]
    StaleHandle(EndpointIndex),
    #[error("{0}: no such endpoint on this processing engine")]
    NoSuchEndpoint(EndpointIndex),
    #[error("{0}: endpoint already exists")]
    EndpointExists(EndpointIndex),
    #[error("{0}: {1} headers still on the software request list")]
    SoftwareRequestsPending(EndpointIndex, usize),
    #[error("{0}: request queue is full")]
    QueueFull(EndpointIndex),
}

/// Handle of a linked entry, used to unlink it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryHandle {
    pub ep: EndpointIndex,
    pub list: ListKind,
    pub id: EntryId,
}

/// Where an incoming message's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub list: ListKind,
    pub cookie: u64,
    /// Buffer address: entry start + offset.
    pub address: u64,
    pub offset: u64,
    /// Bytes that land (the message is truncated to the room left).
    pub mlength: u64,
    /// The entry unlinked itself with this match.
    pub unlinked: bool,
}

/// Why a message was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Matched nothing and flow control is off.
    NoMatch,
    /// The first matching entry does not allow the operation.
    PermissionViolation,
    /// The endpoint is disabled (flow control or host).
    EndpointDisabled,
    /// An overflow hit found no free unexpected-header slot.
    UnexpectedListFull,
    /// Software mode and the software request list is full.
    SoftwareListFull,
    /// The endpoint does not exist on this engine.
    NoSuchEndpoint,
}

/// Result of matching one incoming message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchOutcome {
    Delivered(Delivery),
    /// Stored on the software request list for host-managed matching.
    QueuedToSoftware,
    Dropped(DropReason),
    /// This message made flow control disable the endpoint (a PT_DISABLED
    /// event was written); the message itself is not consumed.
    Disabled,
}

/// Result of a successful append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// Linked (after claiming `unexpected_matched` headers, persistent entries only).
    Linked {
        handle: EntryHandle,
        unexpected_matched: u32,
    },
    /// A use-once priority entry claimed an unexpected header and was never linked.
    ConsumedUnexpected,
}

/// Search probes on the unexpected list (`PtlMESearch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SearchMode {
    /// Report matching headers, leave them (MPI_Probe).
    SearchOnly,
    /// Report and remove matching headers (MPI_Mprobe, onload).
    SearchDelete,
}

/// Per-endpoint counters (Portals status registers and drop causes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointCounters {
    pub delivered: u64,
    pub dropped_no_match: u64,
    pub permission_violations: u64,
    pub dropped_disabled: u64,
    pub dropped_unexpected_full: u64,
    pub dropped_software_full: u64,
    pub queued_to_software: u64,
}

/// What the endpoint reports back to the processing engine besides the
/// outcome, so the engine can maintain its persistent-entry cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatchReport {
    pub outcome: MatchOutcome,
    /// A persistent priority entry was the first match and may be cached.
    pub cacheable: Option<EntryId>,
    /// A priority entry unlinked itself (its cache slots must be freed).
    pub unlinked_priority: Option<EntryId>,
}

const NO_ACCOUNT: u32 = u32::MAX;

/// Overflow-entry accounting kept apart from the list slot, because the
/// headers that point at an overflow buffer outlive the entry's link.
#[derive(Clone, Copy, Debug)]
struct Account {
    cookie: u64,
    refs: u32,
    unlinked: bool,
    auto_unlinked: bool,
}

/// An endpoint generic over the entry-list structure (deep or linear).
#[derive(Debug, Clone)]
pub struct Endpoint<L: MatchList = DeepList> {
    index: EndpointIndex,
    config: EndpointConfig,
    enabled: bool,
    software: bool,
    priority: L,
    overflow: L,
    /// Per overflow slot, its account (grown within its reservation as slots are first
    /// used).
    overflow_account: Vec<u32>,
    /// One per overflow entry and unexpected header (`max_overflow + max_unexpected`).
    accounts: Reserve<Account>,
    unexpected: UnexpectedList,
    software_requests: SoftwareRequestList,
    counters: EndpointCounters,
    /// The engine's shared entry pool has room for one more entry (priority, overflow or
    /// unexpected header); set by the engine before each call that may add one
    /// ([`super::MatchShard`]). Always true for an endpoint used on its own.
    pool_room: bool,
    /// Entries held ([`Endpoint::entries`]), kept as they are linked and removed: what
    /// the engine's pool reads around each call.
    held: usize,
}

impl<L: MatchList> Endpoint<L> {
    pub fn new(index: EndpointIndex, config: EndpointConfig) -> Self {
        let accounts = config.max_overflow + config.max_unexpected;
        Self {
            index,
            config,
            enabled: !config.start_disabled,
            software: false,
            priority: L::with_capacity(config.max_priority),
            overflow: L::with_capacity(config.max_overflow),
            overflow_account: Vec::with_capacity(config.max_overflow),
            accounts: Reserve::with_capacity(accounts),
            unexpected: UnexpectedList::with_capacity(config.max_unexpected),
            software_requests: SoftwareRequestList::with_capacity(config.max_software_requests),
            counters: EndpointCounters::default(),
            pool_room: true,
            held: 0,
        }
    }

    /// Entries held: priority and overflow entries and unexpected headers (what the
    /// engine's shared pool counts), summed over the lists.
    pub fn entries(&self) -> usize {
        self.priority.len() + self.overflow.len() + self.unexpected.len()
    }

    /// [`Endpoint::entries`] as counted on the way (one load; the per-packet path's).
    #[inline]
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Whether the engine's pool has room for one more entry (see `pool_room`).
    #[inline]
    pub(crate) fn set_pool_room(&mut self, room: bool) {
        self.pool_room = room;
    }

    pub fn index(&self) -> EndpointIndex {
        self.index
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_software_mode(&self) -> bool {
        self.software
    }

    pub fn counters(&self) -> &EndpointCounters {
        &self.counters
    }

    pub fn list(&self, list: ListKind) -> &L {
        match list {
            ListKind::Priority => &self.priority,
            ListKind::Overflow => &self.overflow,
        }
    }

    pub fn unexpected(&self) -> &UnexpectedList {
        &self.unexpected
    }

    pub fn software_request_len(&self) -> usize {
        self.software_requests.len()
    }

    /// Non-matching endpoints ignore match bits and source: every entry is a
    /// wildcard, so the first usable one takes the message.
    fn normalize(&self, mut entry: MatchEntry) -> MatchEntry {
        if !self.config.matching {
            entry.ignore_bits = u64::MAX;
            entry.source = MatchId::ANY;
        }
        entry
    }

    fn event_for(&self, kind: EventKind, list: ListKind, cookie: u64) -> Event {
        Event::bare(kind, self.index, list, cookie)
    }

    /// Writes `entry`'s `Link` or `AutoUnlink` on `list`, unless the entry disables it
    /// (`Options::EVENT_LINK_DISABLE`, `Options::EVENT_UNLINK_DISABLE`).
    #[inline]
    fn entry_event(
        &self,
        kind: EventKind,
        list: ListKind,
        entry: &MatchEntry,
        events: &mut impl EventSink,
    ) {
        let disable = match kind {
            EventKind::Link => Options::EVENT_LINK_DISABLE,
            _ => Options::EVENT_UNLINK_DISABLE,
        };
        if !entry.options.contains(disable) {
            events.push_event(self.event_for(kind, list, entry.cookie));
        }
    }

    fn header_event(
        &self,
        kind: EventKind,
        list: ListKind,
        cookie: u64,
        hdr: &IncomingHeader,
    ) -> Event {
        Event {
            match_bits: hdr.match_bits,
            rlength: hdr.rlength,
            remote_offset: hdr.remote_offset,
            initiator: hdr.initiator,
            hdr_data: hdr.hdr_data,
            token: hdr.token,
            ..self.event_for(kind, list, cookie)
        }
    }

    fn overflow_event(&self, cookie: u64, uh: &UnexpectedHeader) -> Event {
        let kind = match uh.header.op {
            Op::Put => EventKind::PutOverflow,
            Op::Get => EventKind::GetOverflow,
        };
        Event {
            start: uh.start,
            mlength: uh.mlength,
            ..self.header_event(kind, ListKind::Overflow, cookie, &uh.header)
        }
    }

    /// Drops one header's reference on its overflow entry; the last one after
    /// an auto-unlink produces AUTO_FREE.
    fn release_account(&mut self, account: u32, events: &mut impl EventSink) {
        let acc = &mut self.accounts[account as usize];
        acc.refs -= 1;
        if acc.refs == 0 && acc.unlinked {
            if acc.auto_unlinked {
                let cookie = acc.cookie;
                events.push_event(self.event_for(EventKind::AutoFree, ListKind::Overflow, cookie));
            }
            self.accounts.give(account);
        }
    }

    fn unlink_overflow_account(&mut self, slot: u32, auto: bool, events: &mut impl EventSink) {
        let account = std::mem::replace(&mut self.overflow_account[slot as usize], NO_ACCOUNT);
        if account == NO_ACCOUNT {
            return;
        }
        let acc = &mut self.accounts[account as usize];
        acc.unlinked = true;
        acc.auto_unlinked = auto;
        if acc.refs == 0 {
            if auto {
                let cookie = acc.cookie;
                events.push_event(self.event_for(EventKind::AutoFree, ListKind::Overflow, cookie));
            }
            self.accounts.give(account);
        }
    }

    fn disable_for_flow_control(&mut self, hdr: &IncomingHeader, events: &mut impl EventSink) {
        self.enabled = false;
        let mut ev = self.header_event(EventKind::PtDisabled, ListKind::Priority, 0, hdr);
        ev.fail = NiFail::PtDisabled;
        events.push_event(ev);
    }

    /// Matches one incoming message (the per-packet path).
    pub fn match_incoming(
        &mut self,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        self.match_report(hdr, events).outcome
    }

    #[inline(always)]
    pub(crate) fn match_report(
        &mut self,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchReport {
        let plain = |outcome| MatchReport {
            outcome,
            cacheable: None,
            unlinked_priority: None,
        };
        if !self.enabled {
            self.counters.dropped_disabled += 1;
            return plain(MatchOutcome::Dropped(DropReason::EndpointDisabled));
        }
        if self.software {
            return plain(self.queue_to_software(hdr, events));
        }
        let found = self.priority.find(hdr);
        if let Some(id) = found.hit {
            let mut report = self.deliver(ListKind::Priority, id, hdr, events);
            if found.length_skip_before_hit {
                report.cacheable = None;
            }
            return report;
        }
        if let Some(id) = self.overflow.find(hdr).hit {
            return self.deliver(ListKind::Overflow, id, hdr, events);
        }
        if self.config.flow_control {
            self.disable_for_flow_control(hdr, events);
            plain(MatchOutcome::Disabled)
        } else {
            self.counters.dropped_no_match += 1;
            plain(MatchOutcome::Dropped(DropReason::NoMatch))
        }
    }

    /// The persistent-entry cache's fast path: `id` was cached as the first
    /// match for this header's (match bits, initiator). Returns `None` when
    /// the entry no longer takes this message (stale, or too small under
    /// no-truncate), in which case the caller does the full search.
    pub(crate) fn match_cached(
        &mut self,
        id: EntryId,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> Option<MatchReport> {
        if !self.enabled || self.software {
            return None;
        }
        let entry = self.priority.get(id)?;
        if !entry.matches(hdr) {
            return None;
        }
        Some(self.deliver(ListKind::Priority, id, hdr, events))
    }

    fn queue_to_software(
        &mut self,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        if self.software_requests.push(*hdr) {
            self.counters.queued_to_software += 1;
            MatchOutcome::QueuedToSoftware
        } else if self.config.flow_control {
            self.disable_for_flow_control(hdr, events);
            MatchOutcome::Disabled
        } else {
            self.counters.dropped_software_full += 1;
            MatchOutcome::Dropped(DropReason::SoftwareListFull)
        }
    }

    fn list_mut(&mut self, list: ListKind) -> &mut L {
        match list {
            ListKind::Priority => &mut self.priority,
            ListKind::Overflow => &mut self.overflow,
        }
    }

    /// Places the message in entry `id` (already known to be the first match).
    #[inline(always)]
    fn deliver(
        &mut self,
        list: ListKind,
        id: EntryId,
        hdr: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchReport {
        let mut report = MatchReport {
            outcome: MatchOutcome::Dropped(DropReason::NoMatch),
            cacheable: None,
            unlinked_priority: None,
        };
        let Some(entry) = self.list(list).get(id).copied() else {
            return report;
        };
        if !entry.permits(hdr.op) {
            // Portals drops on the first matching entry; it does not look further.
            self.counters.permission_violations += 1;
            report.outcome = MatchOutcome::Dropped(DropReason::PermissionViolation);
            return report;
        }
        if list == ListKind::Overflow && (self.unexpected.is_full() || !self.pool_room) {
            if self.config.flow_control {
                self.disable_for_flow_control(hdr, events);
                report.outcome = MatchOutcome::Disabled;
            } else {
                self.counters.dropped_unexpected_full += 1;
                report.outcome = MatchOutcome::Dropped(DropReason::UnexpectedListFull);
            }
            return report;
        }

        let offset = entry.landing_offset(hdr.remote_offset);
        let mlength = entry.mlength(offset, hdr.rlength);
        let address = entry.start.wrapping_add(offset);
        let manage_local = entry.options.contains(Options::MANAGE_LOCAL);
        let new_offset = offset.saturating_add(mlength);
        if manage_local {
            self.list_mut(list).set_offset(id, new_offset);
        }

        events.push_event(Event {
            kind: match hdr.op {
                Op::Put => EventKind::Put,
                Op::Get => EventKind::Get,
            },
            fail: NiFail::Ok,
            ep: self.index,
            list,
            cookie: entry.cookie,
            start: address,
            match_bits: hdr.match_bits,
            rlength: hdr.rlength,
            mlength,
            remote_offset: hdr.remote_offset,
            initiator: hdr.initiator,
            hdr_data: hdr.hdr_data,
            token: hdr.token,
        });

        if list == ListKind::Overflow {
            let account = self.overflow_account[id.slot as usize];
            self.accounts[account as usize].refs += 1;
            let stored = self.unexpected.push(UnexpectedHeader {
                header: *hdr,
                start: address,
                mlength,
                overflow_cookie: entry.cookie,
                account,
            });
            debug_assert!(stored.is_some(), "unexpected list checked for room above");
            self.held += 1;
        }

        let min_free_tripped = manage_local
            && entry.min_free > 0
            && entry.length.saturating_sub(new_offset) < entry.min_free;
        let unlinked = entry.is_use_once() || min_free_tripped;
        if unlinked {
            self.list_mut(list).unlink(id);
            self.held -= 1;
            self.entry_event(EventKind::AutoUnlink, list, &entry, events);
            match list {
                ListKind::Overflow => self.unlink_overflow_account(id.slot, true, events),
                ListKind::Priority => report.unlinked_priority = Some(id),
            }
        } else if list == ListKind::Priority {
            // Still linked and persistent: the first match for this key may
            // be cached (the caller withdraws this if length mattered).
            report.cacheable = Some(id);
        }
        self.counters.delivered += 1;
        report.outcome = MatchOutcome::Delivered(Delivery {
            list,
            cookie: entry.cookie,
            address,
            offset,
            mlength,
            unlinked,
        });
        report
    }

    /// Appends an entry. A priority append first claims matching unexpected
    /// headers (atomically: nothing else runs on this endpoint meanwhile).
    /// Running out of priority entries switches the endpoint to software mode.
    pub fn append(
        &mut self,
        list: ListKind,
        entry: MatchEntry,
        events: &mut impl EventSink,
    ) -> Result<Appended, LpeError> {
        let entry = self.normalize(entry);
        match list {
            ListKind::Priority => self.append_priority(entry, events),
            ListKind::Overflow => self.append_overflow(entry, events),
        }
    }

    fn append_priority(
        &mut self,
        entry: MatchEntry,
        events: &mut impl EventSink,
    ) -> Result<Appended, LpeError> {
        let use_once = entry.is_use_once();
        // A persistent entry is linked whatever it claims, so check for room
        // before it consumes anything (in a full pool, a header it claims makes room).
        let mut cursor = self.unexpected.first_match(&entry);
        let pool_room = self.pool_room || cursor.is_some();
        if !use_once && (self.priority.len() >= self.priority.capacity() || !pool_room) {
            return Err(self.out_of_entries(events));
        }
        let mut matched = 0u32;
        while let Some(slot) = cursor {
            cursor = if use_once {
                None
            } else {
                self.unexpected.next_match(&entry, slot)
            };
            let uh = self.unexpected.remove(slot);
            self.held -= 1;
            events.push_event(self.overflow_event(entry.cookie, &uh));
            self.release_account(uh.account, events);
            matched += 1;
            if use_once {
                self.entry_event(EventKind::AutoUnlink, ListKind::Priority, &entry, events);
                return Ok(Appended::ConsumedUnexpected);
            }
        }
        if !pool_room {
            return Err(self.out_of_entries(events));
        }
        let Some(id) = self.priority.push(&entry) else {
            return Err(self.out_of_entries(events));
        };
        self.held += 1;
        self.entry_event(EventKind::Link, ListKind::Priority, &entry, events);
        Ok(Appended::Linked {
            handle: EntryHandle {
                ep: self.index,
                list: ListKind::Priority,
                id,
            },
            unexpected_matched: matched,
        })
    }

    /// The priority list ran out: hand matching to the host (as a NIC does
    /// when its list resources are exhausted).
    fn out_of_entries(&mut self, events: &mut impl EventSink) -> LpeError {
        if !self.software {
            self.software = true;
            let mut ev = self.event_for(EventKind::SoftwareMode, ListKind::Priority, 0);
            ev.fail = NiFail::ListFull;
            events.push_event(ev);
        }
        LpeError::ListFull(self.index)
    }

    fn append_overflow(
        &mut self,
        entry: MatchEntry,
        events: &mut impl EventSink,
    ) -> Result<Appended, LpeError> {
        if self.accounts.is_full() || !self.pool_room {
            return Err(LpeError::ListFull(self.index));
        }
        let Some(id) = self.overflow.push(&entry) else {
            return Err(LpeError::ListFull(self.index));
        };
        self.held += 1;
        let fresh = Account {
            cookie: entry.cookie,
            refs: 0,
            unlinked: false,
            auto_unlinked: false,
        };
        let account = self.accounts.take(fresh).expect("checked above");
        self.accounts[account as usize] = fresh;
        let slot = id.slot as usize;
        if self.overflow_account.len() <= slot {
            // Within the reservation (a slot is below `max_overflow`): no allocation.
            self.overflow_account.resize(slot + 1, NO_ACCOUNT);
        }
        self.overflow_account[slot] = account;
        self.entry_event(EventKind::Link, ListKind::Overflow, &entry, events);
        Ok(Appended::Linked {
            handle: EntryHandle {
                ep: self.index,
                list: ListKind::Overflow,
                id,
            },
            unexpected_matched: 0,
        })
    }

    /// Host unlink (no event, as `PtlMEUnlink`).
    pub fn unlink(&mut self, handle: EntryHandle) -> Result<MatchEntry, LpeError> {
        if handle.ep != self.index {
            return Err(LpeError::StaleHandle(self.index));
        }
        let removed = self
            .list_mut(handle.list)
            .remove(handle.id)
            .ok_or(LpeError::StaleHandle(self.index))?;
        self.held -= 1;
        if handle.list == ListKind::Overflow {
            self.unlink_overflow_account(handle.id.slot, false, &mut super::events::NullSink);
        }
        Ok(removed)
    }

    /// Probes the unexpected list with a receive-like entry (`PtlMESearch`).
    /// Returns how many headers matched. Search-only writes one SEARCH event
    /// per matching header (only the first for a use-once probe);
    /// search-and-delete removes them and writes overflow events; no match
    /// writes one SEARCH event with `NiFail::NoMatch`.
    pub fn search(
        &mut self,
        probe: MatchEntry,
        mode: SearchMode,
        events: &mut impl EventSink,
    ) -> u32 {
        let probe = self.normalize(probe);
        let use_once = probe.is_use_once();
        let mut found = 0u32;
        let mut cursor = self.unexpected.first_match(&probe);
        while let Some(slot) = cursor {
            cursor = if use_once {
                None
            } else {
                self.unexpected.next_match(&probe, slot)
            };
            found += 1;
            match mode {
                SearchMode::SearchOnly => {
                    let uh = *self.unexpected.get(slot);
                    let mut ev = self.overflow_event(probe.cookie, &uh);
                    ev.kind = EventKind::Search;
                    events.push_event(ev);
                }
                SearchMode::SearchDelete => {
                    let uh = self.unexpected.remove(slot);
                    self.held -= 1;
                    events.push_event(self.overflow_event(probe.cookie, &uh));
                    self.release_account(uh.account, events);
                }
            }
        }
        if found == 0 {
            let mut ev = self.event_for(EventKind::Search, ListKind::Overflow, probe.cookie);
            ev.fail = NiFail::NoMatch;
            events.push_event(ev);
        }
        found
    }

    /// Re-enables after flow control or a host disable (`PtlPTEnable`).
    pub fn enable(&mut self) {
        self.enabled = true;
    }

    /// `PtlPTDisable`: later messages are dropped until enabled.
    pub fn disable(&mut self) {
        self.enabled = false;
    }

    /// Host hands matching to software: from now on incoming headers are
    /// queued on the software request list. Lists stay as they are.
    pub fn enter_software_mode(&mut self, events: &mut impl EventSink) {
        if !self.software {
            self.software = true;
            events.push_event(self.event_for(EventKind::SoftwareMode, ListKind::Priority, 0));
        }
    }

    /// Switch back to matching. Refused while headers are still queued for
    /// the host, so nothing queued during software mode can be lost or
    /// overtaken by a later message.
    pub fn resume_matching(&mut self) -> Result<(), LpeError> {
        let pending = self.software_requests.len();
        if pending > 0 {
            return Err(LpeError::SoftwareRequestsPending(self.index, pending));
        }
        self.software = false;
        Ok(())
    }

    /// Host takes the oldest header from the software request list.
    pub fn pop_software_request(&mut self) -> Option<IncomingHeader> {
        self.software_requests.pop()
    }

    /// Host reads the list's entries in posting order (onload to software).
    pub fn for_each_entry(&self, list: ListKind, f: &mut dyn FnMut(EntryHandle, &MatchEntry)) {
        let ep = self.index;
        self.list(list).for_each_in_order(&mut |id, e| {
            f(EntryHandle { ep, list, id }, e);
        });
    }
}
