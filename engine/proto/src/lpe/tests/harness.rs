//! Runs one operation sequence on every implementation at once and compares
//! what each returns and which events it writes.

use crate::lpe::reference::{RefAppended, ReferenceEndpoint};
use crate::lpe::{
    Appended, Command, Completion, CompletionKind, DeepList, Dispatcher, EndpointConfig,
    EndpointIndex, EndpointTable, EngineConfig, EngineId, EntryHandle, Event, IncomingHeader,
    LinearList, ListKind, LpeError, MatchEntry, MatchList, MatchOutcome, MatchShard, Request,
    SearchMode, TrafficClass, build_shards,
};

pub const MAX_ENDPOINTS: usize = 8;

/// One step of a test run.
#[derive(Clone, Debug)]
pub enum Op {
    Append {
        ep: usize,
        list: ListKind,
        entry: MatchEntry,
    },
    Arrive {
        ep: usize,
        hdr: IncomingHeader,
    },
    Search {
        ep: usize,
        probe: MatchEntry,
        mode: SearchMode,
    },
    /// Unlink the n-th linked entry so far (modulo); may be stale.
    Unlink {
        pick: usize,
    },
    EnterSoftware {
        ep: usize,
    },
    Resume {
        ep: usize,
    },
    PopSoftware {
        ep: usize,
    },
    Enable {
        ep: usize,
    },
}

/// Result of one step, with handles abstracted away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Res {
    Outcome(MatchOutcome),
    Append(Result<Option<u32>, LpeError>),
    Unlink(Result<MatchEntry, LpeError>),
    Search(u32),
    Unit(Result<(), LpeError>),
    Popped(Option<IncomingHeader>),
}

fn view(a: Result<Appended, LpeError>) -> Res {
    Res::Append(a.map(|a| match a {
        Appended::Linked {
            unexpected_matched, ..
        } => Some(unexpected_matched),
        Appended::ConsumedUnexpected => None,
    }))
}

fn view_ref(a: Result<RefAppended, LpeError>) -> Res {
    Res::Append(a.map(|a| match a {
        RefAppended::Linked {
            unexpected_matched, ..
        } => Some(unexpected_matched),
        RefAppended::ConsumedUnexpected => None,
    }))
}

/// Engines for one list structure, driven through the direct API.
pub struct Direct<L: MatchList> {
    table: EndpointTable,
    engines: Vec<MatchShard<L>>,
    handles: Vec<Option<EntryHandle>>,
}

impl<L: MatchList> Direct<L> {
    fn new(
        config: &EngineConfig,
        table: &EndpointTable,
        eps: &[(EndpointIndex, EndpointConfig)],
    ) -> Self {
        let (_d, engines) = build_shards::<L>(config, table.clone(), eps).expect("layout");
        Self {
            table: table.clone(),
            engines,
            handles: Vec::new(),
        }
    }

    /// Each engine's pool count is what its endpoints hold, entry for entry.
    fn check_pool(&self) -> Result<(), String> {
        for e in &self.engines {
            let held: usize = (0..MAX_ENDPOINTS as u16)
                .filter_map(|i| e.endpoint(EndpointIndex(i)))
                .map(|ep| ep.entries())
                .sum();
            if e.pool().0 != held {
                return Err(format!("pool counts {:?}, endpoints hold {held}", e.pool()));
            }
        }
        Ok(())
    }

    fn engine(&mut self, ep: EndpointIndex) -> &mut MatchShard<L> {
        let e = self.table.engine_of(ep).expect("mapped");
        &mut self.engines[usize::from(e.0)]
    }

    fn run(&mut self, ep: EndpointIndex, op: &Op, events: &mut Vec<Event>) -> Res {
        match *op {
            Op::Append { list, entry, .. } => {
                let r = self.engine(ep).append(ep, list, entry, events);
                if let Ok(Appended::Linked { handle, .. }) = r {
                    self.handles.push(Some(handle));
                }
                view(r)
            }
            Op::Arrive { hdr, .. } => {
                Res::Outcome(self.engine(ep).match_incoming(ep, &hdr, events))
            }
            Op::Search { probe, mode, .. } => {
                Res::Search(self.engine(ep).search(ep, probe, mode, events).expect("ep"))
            }
            Op::Unlink { pick } => {
                let Some(h) = pick_handle(&self.handles, pick) else {
                    return Res::Unit(Ok(()));
                };
                Res::Unlink(self.engine(h.ep).unlink(h))
            }
            Op::EnterSoftware { .. } => Res::Unit(self.engine(ep).enter_software_mode(ep, events)),
            Op::Resume { .. } => Res::Unit(self.engine(ep).resume_matching(ep)),
            Op::PopSoftware { .. } => {
                Res::Popped(self.engine(ep).pop_software_request(ep).expect("ep"))
            }
            Op::Enable { .. } => Res::Unit(self.engine(ep).enable(ep)),
        }
    }
}

fn pick_handle<T: Copy>(handles: &[Option<T>], pick: usize) -> Option<T> {
    if handles.is_empty() {
        None
    } else {
        handles[pick % handles.len()]
    }
}

/// Deep engines driven through the dispatcher and inbound queues, drained
/// after every step.
pub struct Queued {
    dispatcher: Dispatcher,
    engines: Vec<MatchShard<DeepList>>,
    handles: Vec<Option<EntryHandle>>,
    tag: u64,
}

impl Queued {
    fn new(
        config: &EngineConfig,
        table: &EndpointTable,
        eps: &[(EndpointIndex, EndpointConfig)],
    ) -> Self {
        let (dispatcher, engines) =
            build_shards::<DeepList>(config, table.clone(), eps).expect("layout");
        Self {
            dispatcher,
            engines,
            handles: Vec::new(),
            tag: 0,
        }
    }

    fn drain(&mut self, events: &mut Vec<Event>) -> Vec<Completion> {
        let mut done = Vec::new();
        for e in &mut self.engines {
            e.run_until_idle(events, &mut done);
        }
        done
    }

    fn run(&mut self, ep: EndpointIndex, op: &Op, events: &mut Vec<Event>) -> Res {
        self.tag += 1;
        let class = TrafficClass((self.tag % 3) as u8);
        let tag = self.tag;
        let cmd = |c| Request::command(ep, class, tag, c);
        let req = match *op {
            Op::Append { list, entry, .. } => cmd(Command::Append { list, entry }),
            Op::Arrive { hdr, .. } => Request::network(ep, class, self.tag, hdr),
            Op::Search { probe, mode, .. } => cmd(Command::Search { probe, mode }),
            Op::Unlink { pick } => {
                let Some(h) = pick_handle(&self.handles, pick) else {
                    return Res::Unit(Ok(()));
                };
                Request::command(h.ep, class, self.tag, Command::Unlink { handle: h })
            }
            Op::EnterSoftware { .. } => cmd(Command::EnterSoftwareMode),
            Op::Resume { .. } => cmd(Command::ResumeMatching),
            Op::PopSoftware { .. } => cmd(Command::TakeSoftwareRequests { max: 1 }),
            Op::Enable { .. } => cmd(Command::Enable),
        };
        self.dispatcher.submit(req).expect("queue has room");
        let done = self.drain(events);
        let mut popped = None;
        for c in &done {
            assert_eq!(c.tag, self.tag);
            match c.kind {
                CompletionKind::SoftwareRequest(h) => popped = Some(h),
                CompletionKind::Matched(o) => return Res::Outcome(o),
                CompletionKind::Appended(a) => {
                    if let Ok(Appended::Linked { handle, .. }) = a {
                        self.handles.push(Some(handle));
                    }
                    return view(a);
                }
                CompletionKind::Unlinked(u) => return Res::Unlink(u),
                CompletionKind::Searched(n) => return Res::Search(n),
                CompletionKind::StateChanged(s) => {
                    if matches!(op, Op::PopSoftware { .. }) {
                        return Res::Popped(popped);
                    }
                    return Res::Unit(s);
                }
                CompletionKind::Rejected(e) => return Res::Unit(Err(e)),
            }
        }
        panic!("no completion for {op:?}: {done:?}");
    }
}

/// The reference model, one per endpoint.
pub struct Model {
    eps: Vec<ReferenceEndpoint>,
    handles: Vec<Option<(usize, u64)>>,
}

impl Model {
    fn run(&mut self, i: usize, op: &Op, events: &mut Vec<Event>) -> Res {
        let ep = &mut self.eps[i];
        match *op {
            Op::Append { list, entry, .. } => {
                let r = ep.append(list, entry, events);
                if let Ok(RefAppended::Linked { id, .. }) = r {
                    self.handles.push(Some((i, id)));
                }
                view_ref(r)
            }
            Op::Arrive { hdr, .. } => Res::Outcome(ep.match_incoming(&hdr, events)),
            Op::Search { probe, mode, .. } => Res::Search(ep.search(probe, mode, events)),
            Op::Unlink { pick } => {
                let Some((owner, id)) = pick_handle(&self.handles, pick) else {
                    return Res::Unit(Ok(()));
                };
                Res::Unlink(self.eps[owner].unlink(id))
            }
            Op::EnterSoftware { .. } => {
                ep.enter_software_mode(events);
                Res::Unit(Ok(()))
            }
            Op::Resume { .. } => Res::Unit(ep.resume_matching()),
            Op::PopSoftware { .. } => Res::Popped(ep.pop_software_request()),
            Op::Enable { .. } => {
                ep.enable();
                Res::Unit(Ok(()))
            }
        }
    }
}

/// Everything under test plus the model.
pub struct Systems {
    pub indices: Vec<EndpointIndex>,
    model: Model,
    deep: Direct<DeepList>,
    linear: Direct<LinearList>,
    queued: Queued,
}

impl Systems {
    /// `layout[i]` is the engine of endpoint `i`; `engines` engines in all.
    pub fn new(
        eps: &[(EndpointIndex, EndpointConfig)],
        engines: usize,
        layout: &[usize],
        cache_entries: usize,
    ) -> Self {
        let mut table = EndpointTable::new(MAX_ENDPOINTS, engines);
        for (i, (ep, _)) in eps.iter().enumerate() {
            table.assign(*ep, EngineId((layout[i] % engines) as u16));
        }
        let config = EngineConfig {
            cache_entries,
            max_endpoints: MAX_ENDPOINTS,
            queue_depth: 4,
            inbound_depth: 16,
            class_weights: vec![2, 1, 1],
            // The reference model has no shared pool: only the endpoints' own bounds.
            pool_entries: usize::MAX,
        };
        Self {
            indices: eps.iter().map(|(ep, _)| *ep).collect(),
            model: Model {
                eps: eps
                    .iter()
                    .map(|&(ep, c)| ReferenceEndpoint::new(ep, c))
                    .collect(),
                handles: Vec::new(),
            },
            deep: Direct::new(&config, &table, eps),
            linear: Direct::new(&config, &table, eps),
            queued: Queued::new(&config, &table, eps),
        }
    }

    fn ep_of(op: &Op) -> usize {
        match *op {
            Op::Append { ep, .. }
            | Op::Arrive { ep, .. }
            | Op::Search { ep, .. }
            | Op::EnterSoftware { ep }
            | Op::Resume { ep }
            | Op::PopSoftware { ep }
            | Op::Enable { ep } => ep,
            Op::Unlink { .. } => 0,
        }
    }

    /// Runs `op` everywhere; returns the model's result and events after
    /// checking that every implementation agrees.
    pub fn step(&mut self, op: &Op) -> Result<(Res, Vec<Event>), String> {
        let i = Self::ep_of(op) % self.indices.len();
        let ep = self.indices[i];
        let mut want_ev = Vec::new();
        let want = self.model.run(i, op, &mut want_ev);
        let mut got_ev = Vec::new();
        let got = self.deep.run(ep, op, &mut got_ev);
        if (&got, &got_ev) != (&want, &want_ev) {
            return Err(format!(
                "deep differs on {op:?}\n got {got:?} {got_ev:#?}\nwant {want:?} {want_ev:#?}"
            ));
        }
        self.deep.check_pool()?;
        got_ev.clear();
        let got = self.linear.run(ep, op, &mut got_ev);
        if (&got, &got_ev) != (&want, &want_ev) {
            return Err(format!(
                "linear differs on {op:?}\n got {got:?} {got_ev:#?}\nwant {want:?} {want_ev:#?}"
            ));
        }
        got_ev.clear();
        let got = self.queued.run(ep, op, &mut got_ev);
        if (&got, &got_ev) != (&want, &want_ev) {
            return Err(format!(
                "queued differs on {op:?}\n got {got:?} {got_ev:#?}\nwant {want:?} {want_ev:#?}"
            ));
        }
        Ok((want, want_ev))
    }
}
