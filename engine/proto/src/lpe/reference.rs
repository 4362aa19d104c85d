//! The obviously-correct model of one endpoint, written straight from the
//! Portals 4 / MPI rules with plain vectors and linear scans, and with its
//! own copy of the match rule. Tests run the same operations on it and on the
//! real engines and require identical outcomes and events. Public so that
//! benchmarks and other crates' tests can use it; never use it on the data path.

use std::collections::VecDeque;

use super::endpoint::{Delivery, DropReason, LpeError, MatchOutcome, SearchMode};
use super::entry::{
    EndpointConfig, EndpointIndex, ID_ANY, IncomingHeader, ListKind, MatchEntry, MatchId, Op,
    Options,
};
use super::events::{Event, EventKind, EventSink, NiFail};

/// Result of [`ReferenceEndpoint::append`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefAppended {
    Linked { id: u64, unexpected_matched: u32 },
    ConsumedUnexpected,
}

#[derive(Clone, Copy, Debug)]
struct Stored {
    header: IncomingHeader,
    start: u64,
    mlength: u64,
    overflow_id: u64,
    overflow_cookie: u64,
}

/// One endpoint, modelled naively.
#[derive(Clone, Debug)]
pub struct ReferenceEndpoint {
    index: EndpointIndex,
    config: EndpointConfig,
    enabled: bool,
    software: bool,
    priority: Vec<(u64, MatchEntry)>,
    overflow: Vec<(u64, MatchEntry)>,
    unexpected: Vec<Stored>,
    /// Overflow entries that unlinked themselves while headers still point at them.
    awaiting_free: Vec<(u64, u64)>,
    software_requests: VecDeque<IncomingHeader>,
    next_id: u64,
}

fn source_ok(want: MatchId, nid: u32, pid: u32) -> bool {
    (want.nid == ID_ANY || want.nid == nid) && (want.pid == ID_ANY || want.pid == pid)
}

fn local(e: &MatchEntry) -> bool {
    e.options.contains(Options::MANAGE_LOCAL)
}

/// The match rule, written out again on purpose.
fn takes(e: &MatchEntry, h: &IncomingHeader) -> bool {
    let bits_ok = ((h.match_bits ^ e.match_bits) & !e.ignore_bits) == 0;
    let src_ok = source_ok(e.source, h.initiator.nid, h.initiator.pid);
    let offset = if local(e) { e.offset } else { h.remote_offset };
    let size_ok = !e.options.contains(Options::NO_TRUNCATE)
        || (offset as u128 + h.rlength as u128) <= e.length as u128;
    bits_ok && src_ok && size_ok
}

impl ReferenceEndpoint {
    pub fn new(index: EndpointIndex, config: EndpointConfig) -> Self {
        Self {
            index,
            config,
            enabled: true,
            software: false,
            priority: Vec::new(),
            overflow: Vec::new(),
            unexpected: Vec::new(),
            awaiting_free: Vec::new(),
            software_requests: VecDeque::new(),
            next_id: 0,
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub fn is_software_mode(&self) -> bool {
        self.software
    }

    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    pub fn list_len(&self, list: ListKind) -> usize {
        match list {
            ListKind::Priority => self.priority.len(),
            ListKind::Overflow => self.overflow.len(),
        }
    }

    fn ev(&self, kind: EventKind, list: ListKind, cookie: u64) -> Event {
        Event::bare(kind, self.index, list, cookie)
    }

    fn ev_hdr(&self, kind: EventKind, list: ListKind, cookie: u64, h: &IncomingHeader) -> Event {
        let mut e = self.ev(kind, list, cookie);
        e.match_bits = h.match_bits;
        e.rlength = h.rlength;
        e.remote_offset = h.remote_offset;
        e.initiator = h.initiator;
        e.hdr_data = h.hdr_data;
        e.token = h.token;
        e
    }

    fn ev_overflow(&self, cookie: u64, s: &Stored) -> Event {
        let kind = if s.header.op == Op::Put {
            EventKind::PutOverflow
        } else {
            EventKind::GetOverflow
        };
        let mut e = self.ev_hdr(kind, ListKind::Overflow, cookie, &s.header);
        e.start = s.start;
        e.mlength = s.mlength;
        e
    }

    fn disable(&mut self, h: &IncomingHeader, events: &mut impl EventSink) -> MatchOutcome {
        self.enabled = false;
        let mut e = self.ev_hdr(EventKind::PtDisabled, ListKind::Priority, 0, h);
        e.fail = NiFail::PtDisabled;
        events.push_event(e);
        MatchOutcome::Disabled
    }

    /// Removes unexpected header `i`, then frees its overflow entry if that
    /// was the last header of an auto-unlinked one.
    fn take_unexpected(&mut self, i: usize, events: &mut impl EventSink) -> Stored {
        let s = self.unexpected.remove(i);
        let still_used = self
            .unexpected
            .iter()
            .any(|o| o.overflow_id == s.overflow_id);
        if !still_used
            && let Some(pos) = self
                .awaiting_free
                .iter()
                .position(|&(id, _)| id == s.overflow_id)
        {
            let (_, cookie) = self.awaiting_free.remove(pos);
            events.push_event(self.ev(EventKind::AutoFree, ListKind::Overflow, cookie));
        }
        s
    }

    pub fn match_incoming(
        &mut self,
        h: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        if !self.enabled {
            return MatchOutcome::Dropped(DropReason::EndpointDisabled);
        }
        if self.software {
            if self.software_requests.len() < self.config.max_software_requests {
                self.software_requests.push_back(*h);
                return MatchOutcome::QueuedToSoftware;
            }
            if self.config.flow_control {
                return self.disable(h, events);
            }
            return MatchOutcome::Dropped(DropReason::SoftwareListFull);
        }
        if let Some(pos) = self.priority.iter().position(|(_, e)| takes(e, h)) {
            return self.deliver(ListKind::Priority, pos, h, events);
        }
        if let Some(pos) = self.overflow.iter().position(|(_, e)| takes(e, h)) {
            return self.deliver(ListKind::Overflow, pos, h, events);
        }
        if self.config.flow_control {
            self.disable(h, events)
        } else {
            MatchOutcome::Dropped(DropReason::NoMatch)
        }
    }

    fn deliver(
        &mut self,
        list: ListKind,
        pos: usize,
        h: &IncomingHeader,
        events: &mut impl EventSink,
    ) -> MatchOutcome {
        let (id, e) = match list {
            ListKind::Priority => self.priority[pos],
            ListKind::Overflow => self.overflow[pos],
        };
        let allowed = match h.op {
            Op::Put => e.options.contains(Options::OP_PUT),
            Op::Get => e.options.contains(Options::OP_GET),
        };
        if !allowed {
            return MatchOutcome::Dropped(DropReason::PermissionViolation);
        }
        if list == ListKind::Overflow && self.unexpected.len() >= self.config.max_unexpected {
            if self.config.flow_control {
                return self.disable(h, events);
            }
            return MatchOutcome::Dropped(DropReason::UnexpectedListFull);
        }
        let offset = if local(&e) { e.offset } else { h.remote_offset };
        let mlength = if offset >= e.length {
            0
        } else {
            h.rlength.min(e.length - offset)
        };
        let address = e.start.wrapping_add(offset);
        let new_offset = offset.saturating_add(mlength);
        if local(&e) {
            match list {
                ListKind::Priority => self.priority[pos].1.offset = new_offset,
                ListKind::Overflow => self.overflow[pos].1.offset = new_offset,
            }
        }
        let kind = if h.op == Op::Put {
            EventKind::Put
        } else {
            EventKind::Get
        };
        let mut ev = self.ev_hdr(kind, list, e.cookie, h);
        ev.start = address;
        ev.mlength = mlength;
        events.push_event(ev);
        if list == ListKind::Overflow {
            self.unexpected.push(Stored {
                header: *h,
                start: address,
                mlength,
                overflow_id: id,
                overflow_cookie: e.cookie,
            });
        }
        let use_once = e.options.contains(Options::USE_ONCE);
        let low_space =
            local(&e) && e.min_free > 0 && e.length.saturating_sub(new_offset) < e.min_free;
        let unlinked = use_once || low_space;
        if unlinked {
            match list {
                ListKind::Priority => {
                    self.priority.remove(pos);
                }
                ListKind::Overflow => {
                    self.overflow.remove(pos);
                }
            }
            if !e.options.contains(Options::EVENT_UNLINK_DISABLE) {
                events.push_event(self.ev(EventKind::AutoUnlink, list, e.cookie));
            }
            if list == ListKind::Overflow {
                if self.unexpected.iter().any(|s| s.overflow_id == id) {
                    self.awaiting_free.push((id, e.cookie));
                } else {
                    events.push_event(self.ev(EventKind::AutoFree, ListKind::Overflow, e.cookie));
                }
            }
        }
        MatchOutcome::Delivered(Delivery {
            list,
            cookie: e.cookie,
            address,
            offset,
            mlength,
            unlinked,
        })
    }

    fn plain(&self, mut e: MatchEntry) -> MatchEntry {
        if !self.config.matching {
            e.ignore_bits = u64::MAX;
            e.source = MatchId::ANY;
        }
        e
    }

    fn list_full(&mut self, events: &mut impl EventSink) -> LpeError {
        if !self.software {
            self.software = true;
            let mut e = self.ev(EventKind::SoftwareMode, ListKind::Priority, 0);
            e.fail = NiFail::ListFull;
            events.push_event(e);
        }
        LpeError::ListFull(self.index)
    }

    pub fn append(
        &mut self,
        list: ListKind,
        entry: MatchEntry,
        events: &mut impl EventSink,
    ) -> Result<RefAppended, LpeError> {
        let e = self.plain(entry);
        let id = self.next_id;
        self.next_id += 1;
        if list == ListKind::Overflow {
            if self.overflow.len() >= self.config.max_overflow {
                return Err(LpeError::ListFull(self.index));
            }
            self.overflow.push((id, e));
            if !e.options.contains(Options::EVENT_LINK_DISABLE) {
                events.push_event(self.ev(EventKind::Link, ListKind::Overflow, e.cookie));
            }
            return Ok(RefAppended::Linked {
                id,
                unexpected_matched: 0,
            });
        }
        let use_once = e.options.contains(Options::USE_ONCE);
        if !use_once && self.priority.len() >= self.config.max_priority {
            return Err(self.list_full(events));
        }
        let mut matched = 0;
        let mut i = 0;
        while i < self.unexpected.len() {
            if !takes(&e, &self.unexpected[i].header) {
                i += 1;
                continue;
            }
            let s = self.unexpected[i];
            events.push_event(self.ev_overflow(e.cookie, &s));
            self.take_unexpected(i, events);
            matched += 1;
            if use_once {
                if !e.options.contains(Options::EVENT_UNLINK_DISABLE) {
                    events.push_event(self.ev(EventKind::AutoUnlink, ListKind::Priority, e.cookie));
                }
                return Ok(RefAppended::ConsumedUnexpected);
            }
        }
        if self.priority.len() >= self.config.max_priority {
            return Err(self.list_full(events));
        }
        self.priority.push((id, e));
        if !e.options.contains(Options::EVENT_LINK_DISABLE) {
            events.push_event(self.ev(EventKind::Link, ListKind::Priority, e.cookie));
        }
        Ok(RefAppended::Linked {
            id,
            unexpected_matched: matched,
        })
    }

    pub fn unlink(&mut self, id: u64) -> Result<MatchEntry, LpeError> {
        if let Some(pos) = self.priority.iter().position(|&(i, _)| i == id) {
            return Ok(self.priority.remove(pos).1);
        }
        if let Some(pos) = self.overflow.iter().position(|&(i, _)| i == id) {
            return Ok(self.overflow.remove(pos).1);
        }
        Err(LpeError::StaleHandle(self.index))
    }

    pub fn search(
        &mut self,
        probe: MatchEntry,
        mode: SearchMode,
        events: &mut impl EventSink,
    ) -> u32 {
        let p = self.plain(probe);
        let use_once = p.options.contains(Options::USE_ONCE);
        let mut found = 0;
        let mut i = 0;
        while i < self.unexpected.len() {
            if !takes(&p, &self.unexpected[i].header) {
                i += 1;
                continue;
            }
            found += 1;
            match mode {
                SearchMode::SearchOnly => {
                    let mut e = self.ev_overflow(p.cookie, &self.unexpected[i]);
                    e.kind = EventKind::Search;
                    events.push_event(e);
                    i += 1;
                }
                SearchMode::SearchDelete => {
                    let s = self.unexpected[i];
                    events.push_event(self.ev_overflow(p.cookie, &s));
                    self.take_unexpected(i, events);
                }
            }
            if use_once {
                break;
            }
        }
        if found == 0 {
            let mut e = self.ev(EventKind::Search, ListKind::Overflow, p.cookie);
            e.fail = NiFail::NoMatch;
            events.push_event(e);
        }
        found
    }

    pub fn enable(&mut self) {
        self.enabled = true;
    }

    pub fn disable_by_host(&mut self) {
        self.enabled = false;
    }

    pub fn enter_software_mode(&mut self, events: &mut impl EventSink) {
        if !self.software {
            self.software = true;
            events.push_event(self.ev(EventKind::SoftwareMode, ListKind::Priority, 0));
        }
    }

    pub fn resume_matching(&mut self) -> Result<(), LpeError> {
        if !self.software_requests.is_empty() {
            return Err(LpeError::SoftwareRequestsPending(
                self.index,
                self.software_requests.len(),
            ));
        }
        self.software = false;
        Ok(())
    }

    pub fn pop_software_request(&mut self) -> Option<IncomingHeader> {
        self.software_requests.pop_front()
    }

    /// Unexpected headers in arrival order with the cookie of the overflow
    /// entry holding their data.
    pub fn unexpected_headers(&self) -> Vec<(IncomingHeader, u64)> {
        self.unexpected
            .iter()
            .map(|s| (s.header, s.overflow_cookie))
            .collect()
    }
}
