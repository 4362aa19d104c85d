//! The node's offloads as parts: each one a type that implements [`Offload`] (hooks with
//! no-op defaults), held by value in [`Parts`] and called in one place, in the order they
//! are listed in the `parts!` invocation below. A new offload is a new part and one line
//! there, not a field of `RdmaNode` and hooks scattered through `node.rs`.
//!
//! Dispatch is static: `Parts` is a struct of concrete parts and each of its methods calls
//! the same hook on every part, inlined; a part that leaves a hook at its default costs
//! nothing. No box, no vtable, no allocation on any hook.
//!
//! A part that calls into a queue pair (a failed persist fails the queue pairs waiting for
//! it) says so with [`Ctx::settle`]; once its hook returns, every part's `settle` hook sees
//! what the call left (the tag shard hears of the tagged messages it cut off), in the order
//! the calls were made.

use std::sync::Arc;

use super::flusher::Flusher;
use super::node::{AddQpError, NodeCounters, QpTable, ReadyList, wake_up};
use super::rings::MAX_QPS;
use super::tagged::TagShard;
use crate::wake::Wake;
use proto::shaper::{Packet, Shaper};
use proto::transport::{
    Budget, MemoryTable, Next, OutPacket, PersistJob, QpConfig, QueuePair, StagedCompletions,
};

/// What a part may touch of its node when a hook runs: the queue pairs (by slot), the ready
/// list, memory, the completions staged this iteration, the counters.
pub(crate) struct Ctx<'a> {
    pub qps: &'a mut QpTable,
    pub ready: &'a mut ReadyList,
    pub mem: &'a mut MemoryTable,
    pub staged: &'a mut StagedCompletions,
    pub counters: &'a mut NodeCounters,
    /// Queue pairs a hook called into, for the parts' `settle` hooks once it returns.
    pub unsettled: &'a mut Vec<u32>,
}

impl Ctx<'_> {
    /// The queue pair in `slot`.
    #[inline]
    pub fn qp(&mut self, slot: u32) -> &mut QueuePair {
        &mut self.qps.entries[slot as usize].qp
    }

    /// Puts the queue pair in `slot` on the ready list (once).
    #[inline]
    pub fn make_ready(&mut self, slot: u32) {
        wake_up(self.qps, self.ready, slot);
    }

    /// A part called into the queue pair in `slot`: once the hook returns, every part's
    /// `settle` hook sees what that left.
    #[inline]
    pub fn settle(&mut self, slot: u32) {
        self.unsettled.push(slot);
    }
}

/// An offload's hooks into its node. Every one has a no-op default; a part overrides the
/// ones it needs. Hooks run in the node's order (see each one), parts in `parts!` order.
pub(crate) trait Offload {
    /// `add_qp`, before the queue pair is made: refuse a configuration this part cannot serve,
    /// or fill in what this part decides for it.
    #[inline]
    fn admit_qp(&self, _cfg: &mut QpConfig) -> Result<(), AddQpError> {
        Ok(())
    }

    /// `add_qp`: the queue pair now in `slot`.
    #[inline]
    fn qp_added(&mut self, _slot: u32, _qp: &QueuePair) {}

    /// `destroy_qp`: the queue pair in `slot` is gone (the slot may be reused by a later
    /// `add_qp`).
    #[inline]
    fn qp_removed(&mut self, _slot: u32) {}

    /// `receive`: a packet the queue pair admitted, before the transport takes it.
    #[inline]
    fn before_packet(&mut self, _now: u64, _qp: &mut QueuePair, _repr: &wire::RoceRepr) {}

    /// `receive`: hands the packet to the queue pair itself, with this part in the transport's
    /// path (the tag shard matches tagged messages). False when it does not: the first part
    /// that does takes it, else the transport alone.
    #[inline]
    fn deliver(
        &mut self,
        _now: u64,
        _qp: &mut QueuePair,
        _packet: (&wire::RoceRepr, &[u8]),
        _mem: &mut MemoryTable,
        _staged: &mut StagedCompletions,
    ) -> bool {
        false
    }

    /// After every call into the queue pair in `slot` (a packet, posted work, a timer, or a
    /// part's [`Ctx::settle`]): what the call left for this part.
    #[inline]
    fn settle(&mut self, _slot: u32, _qps: &mut QpTable, _mem: &MemoryTable) {}

    /// `service`: after the doorbells and the backlog, before the timers: the host's
    /// commands to this part.
    #[inline]
    fn poll_host(&mut self, _cx: &mut Ctx) {}

    /// `receive`: after the transport took the packet and the queue pair in `slot` was made
    /// ready and its timer armed.
    #[inline]
    fn after_packet(&mut self, _slot: u32, _cx: &mut Ctx) {}

    /// `service`: after the host's work, the timers and the deregistrations.
    #[inline]
    fn service(&mut self, _now: u64, _cx: &mut Ctx) {}

    /// Whether [`Offload::poll_host`], [`Offload::service`] or [`Offload::transmit`] may have
    /// anything to do now: the node builds the context they are given only when some part
    /// says so (six pointers stored at every iteration otherwise; callgrind: 28 instructions
    /// a lone WRITE). No default: every part says, so that one that overrides any of the
    /// three is not left uncalled.
    fn iteration_work(&self, mem: &MemoryTable) -> bool;

    /// Whether [`Offload::before_packet`], [`Offload::deliver`] or [`Offload::settle`] may act
    /// now. The node asks it when a part or a queue pair changes, and skips the three hooks
    /// while no part may act (callgrind: 24 instructions a lone WRITE). No default, as
    /// `iteration_work`: a part that overrides any of the three says when it acts.
    fn acts_on_packets(&self) -> bool;

    /// `outlook`: holds work it could not finish (the worker must not sleep).
    #[inline]
    fn busy(&self, _mem: &MemoryTable) -> bool {
        false
    }

    /// `outlook`: when (worker time) it next needs a poll, if nothing arrives.
    #[inline]
    fn due_at(&self, _now: u64) -> Option<u64> {
        None
    }

    /// Adaptive polling: the host posted work for this part that it has not taken yet.
    #[inline]
    fn host_work_pending(&self) -> bool {
        false
    }

    /// Adaptive polling: the host → worker paths of this part whose posts wake the worker.
    #[inline]
    fn wakes(&self, _out: &mut Vec<Arc<Wake>>) {}

    /// After a worker's iteration: tell the host what it did (wake a waiting host).
    #[inline]
    fn publish(&mut self) {}

    /// A deregistration retired the memory region in `slot` (no new use of it).
    #[inline]
    fn region_retired(&mut self, _slot: u32) {}

    /// The memory region in `slot` is still in use here (its deregistration waits).
    #[inline]
    fn uses_region(&self, _slot: u32) -> bool {
        false
    }

    /// `poll_transmit`: this part sends the queue pairs' READ responses (they are not sent in
    /// turn; their ACKs, NAKs and CNPs still are).
    #[inline]
    fn holds_read_responses(&self) -> bool {
        false
    }

    /// `poll_transmit`: the queue pair in `slot`, at the head of the ready list, has no
    /// response to send. True when this part sends its requests (they are not sent in turn).
    #[inline]
    fn holds_requests(&mut self, _slot: u32, _qp: &QueuePair) -> bool {
        false
    }

    /// `poll_transmit`, once the ready list is done: a request this part lets go now, and
    /// its queue pair's slot.
    #[inline]
    fn transmit(&mut self, _now: u64, _cx: &mut Ctx) -> Option<(u32, OutPacket)> {
        None
    }
}

/// Declares [`Parts`]: one field per part, and each hook called on every part in this order.
macro_rules! parts {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {
        /// The node's offloads, each a concrete part (static dispatch).
        #[derive(Default)]
        pub(crate) struct Parts {
            $($(#[$doc])* pub $name: $ty,)*
        }

        impl Parts {
            #[inline]
            pub fn admit_qp(&self, cfg: &mut QpConfig) -> Result<(), AddQpError> {
                $(self.$name.admit_qp(cfg)?;)*
                Ok(())
            }

            #[inline]
            pub fn qp_added(&mut self, slot: u32, qp: &QueuePair) {
                $(self.$name.qp_added(slot, qp);)*
            }

            pub fn qp_removed(&mut self, slot: u32) {
                $(self.$name.qp_removed(slot);)*
            }

            #[inline(always)]
            pub fn before_packet(&mut self, now: u64, qp: &mut QueuePair, repr: &wire::RoceRepr) {
                $(self.$name.before_packet(now, qp, repr);)*
            }

            #[inline(always)]
            pub fn deliver(
                &mut self,
                now: u64,
                qp: &mut QueuePair,
                packet: (&wire::RoceRepr, &[u8]),
                mem: &mut MemoryTable,
                staged: &mut StagedCompletions,
            ) -> bool {
                $(if self.$name.deliver(now, qp, packet, mem, staged) {
                    return true;
                })*
                false
            }

            #[inline(always)]
            pub fn settle(&mut self, slot: u32, qps: &mut QpTable, mem: &MemoryTable) {
                $(self.$name.settle(slot, qps, mem);)*
            }

            #[inline]
            pub fn poll_host(&mut self, cx: &mut Ctx) {
                $(self.$name.poll_host(cx);)*
            }

            #[inline]
            pub fn host_work_pending(&self) -> bool {
                $(if self.$name.host_work_pending() {
                    return true;
                })*
                false
            }

            pub fn wakes(&self, out: &mut Vec<Arc<Wake>>) {
                $(self.$name.wakes(out);)*
            }

            #[inline]
            pub fn publish(&mut self) {
                $(self.$name.publish();)*
            }

            pub fn region_retired(&mut self, slot: u32) {
                $(self.$name.region_retired(slot);)*
            }

            pub fn uses_region(&self, slot: u32) -> bool {
                $(if self.$name.uses_region(slot) {
                    return true;
                })*
                false
            }

            #[inline(always)]
            pub fn after_packet(&mut self, slot: u32, cx: &mut Ctx) {
                $(self.$name.after_packet(slot, cx);)*
            }

            #[inline]
            pub fn service(&mut self, now: u64, cx: &mut Ctx) {
                $(self.$name.service(now, cx);)*
            }

            /// [`Offload::acts_on_packets`] of any part.
            pub fn act_on_packets(&self) -> bool {
                $(self.$name.acts_on_packets())||*
            }

            #[inline(always)]
            pub fn iteration_work(&self, mem: &MemoryTable) -> bool {
                $(if self.$name.iteration_work(mem) {
                    return true;
                })*
                false
            }

            #[inline]
            pub fn busy(&self, mem: &MemoryTable) -> bool {
                $(if self.$name.busy(mem) {
                    return true;
                })*
                false
            }

            #[inline]
            pub fn due_at(&self, now: u64) -> Option<u64> {
                let mut due: Option<u64> = None;
                $(if let Some(t) = self.$name.due_at(now) {
                    due = Some(due.map_or(t, |d| d.min(t)));
                })*
                due
            }

            #[inline(always)]
            pub fn holds_read_responses(&self) -> bool {
                $(if self.$name.holds_read_responses() {
                    return true;
                })*
                false
            }

            #[inline(always)]
            pub fn holds_requests(&mut self, slot: u32, qp: &QueuePair) -> bool {
                let mut held = false;
                $(held |= self.$name.holds_requests(slot, qp);)*
                held
            }

            #[inline]
            pub fn transmit(&mut self, now: u64, cx: &mut Ctx) -> Option<(u32, OutPacket)> {
                $(if let Some(t) = self.$name.transmit(now, cx) {
                    return Some(t);
                })*
                None
            }
        }
    };
}

parts! {
    /// The depth of a bottleneck in front of the receive path (benchmarks).
    ingress: IngressQueue,
    /// Tagged messaging: the list-processing shard (seed 001).
    tags: Tags,
    /// Durable writes: the flusher and the queue pairs waiting for it (seed 004).
    persistence: Persistence,
    /// The port-wide ECN window of `cc = ack` (seed 002).
    port_ecn: PortEcn,
    /// The traffic shaper (seed 000).
    shaper: ShaperPart,
}

/// The depth of a bottleneck in front of this engine's receive path, when one tells it (the
/// CETH of `cc = ack` reports it).
#[derive(Default)]
pub(crate) struct IngressQueue {
    pub bytes: Option<u32>,
    /// Its queuing delay (ns), when the bottleneck knows its rate.
    pub delay_ns: Option<u32>,
}

impl Offload for IngressQueue {
    /// Only per packet.
    #[inline(always)]
    fn iteration_work(&self, _mem: &MemoryTable) -> bool {
        false
    }

    /// While a depth is told (`before_packet`).
    fn acts_on_packets(&self) -> bool {
        self.bytes.is_some()
    }

    #[inline(always)]
    fn before_packet(&mut self, _now: u64, qp: &mut QueuePair, _repr: &wire::RoceRepr) {
        if self.bytes.is_some() {
            qp.note_ingress_queue(self.bytes);
            qp.note_ingress_delay(self.delay_ns);
        }
    }
}

/// Tagged messaging (seed 001): this engine's list-processing shard, when it has one. Tagged
/// queue pairs match their messages against it as they take them.
#[derive(Default)]
pub(crate) struct Tags {
    pub shard: Option<TagShard>,
}

impl Offload for Tags {
    #[inline(always)]
    fn deliver(
        &mut self,
        now: u64,
        qp: &mut QueuePair,
        (repr, payload): (&wire::RoceRepr, &[u8]),
        mem: &mut MemoryTable,
        staged: &mut StagedCompletions,
    ) -> bool {
        match &mut self.shard {
            Some(tags) => {
                qp.on_packet_with(now, repr, payload, mem, staged, tags);
                true
            }
            None => false,
        }
    }

    /// Tells the shard what a queue pair's last call left for it: pulls that ended, messages
    /// cut off by the error state.
    #[inline(always)]
    fn settle(&mut self, slot: u32, qps: &mut QpTable, mem: &MemoryTable) {
        let Some(tags) = &mut self.shard else {
            return;
        };
        let qp = &mut qps.entries[slot as usize].qp;
        while let Some((token, ok)) = qp.take_tag_outcome() {
            if ok {
                // The done message; a queue pair that failed meanwhile cannot send it, and
                // its sender's probes fail the send.
                qp.tag_next(tags.pulled(token, mem));
            } else {
                tags.undeliverable(token, mem);
            }
        }
    }

    /// Host commands to the shard, and what they ask of queue pairs (the pulls and done
    /// messages of the unexpected messages they claimed).
    ///
    /// Called every iteration: without a shard it returns inline, not after a call.
    #[inline(always)]
    fn poll_host(&mut self, cx: &mut Ctx) {
        if let Some(tags) = &mut self.shard {
            tags_poll_host(tags, cx);
        }
    }

    #[inline(always)]
    fn iteration_work(&self, _mem: &MemoryTable) -> bool {
        self.shard.is_some()
    }

    /// With a shard (`deliver`, `settle`).
    fn acts_on_packets(&self) -> bool {
        self.shard.is_some()
    }

    fn busy(&self, _mem: &MemoryTable) -> bool {
        self.shard.as_ref().is_some_and(|t| t.has_actions())
    }

    fn host_work_pending(&self) -> bool {
        self.shard.as_ref().is_some_and(|t| t.commands_pending())
    }

    fn wakes(&self, out: &mut Vec<Arc<Wake>>) {
        if let Some(t) = &self.shard {
            out.push(t.command_wake().clone());
        }
    }

    fn publish(&mut self) {
        if let Some(t) = &mut self.shard {
            t.publish_events();
        }
    }

    fn region_retired(&mut self, slot: u32) {
        if let Some(t) = &mut self.shard {
            t.region_retired(slot);
        }
    }

    fn uses_region(&self, slot: u32) -> bool {
        self.shard.as_ref().is_some_and(|t| t.uses_region(slot))
    }
}

/// The port-wide ECN window of `cc = ack` queue pairs that use one (made with the first
/// request packet), and those queue pairs' slots: a change of the port's level is told to all
/// of them at once, each in an ACK of its own.
#[derive(Default)]
pub(crate) struct PortEcn {
    monitor: Option<proto::cc::EcnMonitor>,
    qps: Vec<u32>,
    /// The packet just taken changed the port's level (set by `before_packet`, cleared by
    /// `after_packet`, which always follows it).
    changed: bool,
}

impl Offload for PortEcn {
    /// Only per packet.
    #[inline(always)]
    fn iteration_work(&self, _mem: &MemoryTable) -> bool {
        false
    }

    /// While a queue pair follows the port's level (`before_packet`).
    fn acts_on_packets(&self) -> bool {
        !self.qps.is_empty()
    }

    fn qp_added(&mut self, slot: u32, qp: &QueuePair) {
        if qp.port_scoped_ecn() {
            self.qps.push(slot);
        }
    }

    fn qp_removed(&mut self, slot: u32) {
        self.qps.retain(|&s| s != slot);
    }

    #[inline(always)]
    fn before_packet(&mut self, now: u64, qp: &mut QueuePair, repr: &wire::RoceRepr) {
        // Requests and READ responses: both arrive through this node's ingress.
        // The queue pair's setting first: one load, where the opcode's class is a set.
        let op = repr.bth.opcode;
        if qp.port_scoped_ecn() && (op.is_request() || op.is_read_response()) {
            let cfg = &qp.config().cc.ack;
            let m = self
                .monitor
                .get_or_insert_with(|| proto::cc::EcnMonitor::new(cfg));
            self.changed = m.on_packet(now, repr.ip.ecn == wire::Ecn::Ce);
            qp.set_shared_level(m.shared(self.changed));
        }
    }

    /// The port's ECN level changed with a packet of queue pair `from`: every other queue
    /// pair that follows the port's window says so now, in an ACK of its own (a repeat of its
    /// last one if nothing new arrived), instead of at its next packet, which may be queued
    /// behind the congestion itself.
    #[inline(always)]
    fn after_packet(&mut self, from: u32, cx: &mut Ctx) {
        if !self.changed {
            return;
        }
        self.changed = false;
        let Some(m) = &self.monitor else {
            return;
        };
        let shared = m.shared(true);
        for &slot in &self.qps {
            if slot == from {
                continue;
            }
            if cx.qp(slot).announce_level(shared) {
                cx.make_ready(slot);
            }
        }
    }
}

/// Durable writes (seed 004): persist jobs go to the flusher thread (or run inline), and
/// queue pairs waiting for the persisted watermark see it move.
#[derive(Default)]
pub(crate) struct Persistence {
    /// Queue pairs waiting for the persisted watermark to pass one of their tickets.
    waiters: Vec<u32>,
    /// By slot: on `waiters`.
    waiting: Vec<bool>,
    /// The flusher thread, started with the first persist job.
    flusher: Option<Flusher>,
    /// A job the flusher had no room for, offered again next iteration.
    unsent_job: Option<PersistJob>,
    /// Persist on the worker's own thread instead (tests and fuzzing).
    pub inline: bool,
}

impl Offload for Persistence {
    fn qp_added(&mut self, slot: u32, _qp: &QueuePair) {
        // A new slot, or one a destroyed queue pair left.
        match self.waiting.get_mut(slot as usize) {
            Some(w) => *w = false,
            None => {
                debug_assert_eq!(self.waiting.len(), slot as usize);
                self.waiting.push(false);
            }
        }
    }

    #[inline(always)]
    fn after_packet(&mut self, slot: u32, cx: &mut Ctx) {
        if cx.qp(slot).awaits_persistence() && !self.waiting[slot as usize] {
            self.waiting[slot as usize] = true;
            self.waiters.push(slot);
        }
    }

    fn service(&mut self, _now: u64, cx: &mut Ctx) {
        if self.iteration_work(cx.mem) {
            self.persistence(cx);
        }
    }

    #[inline(always)]
    fn iteration_work(&self, mem: &MemoryTable) -> bool {
        !self.waiters.is_empty() || mem.has_persist_jobs()
    }

    /// Never: its queue pairs' persists are served per iteration.
    fn acts_on_packets(&self) -> bool {
        false
    }

    fn busy(&self, mem: &MemoryTable) -> bool {
        !self.waiters.is_empty() || self.unsent_job.is_some() || mem.has_persist_jobs()
    }
}

impl Persistence {
    /// Hands new persist jobs to the flusher (or runs them here, inline), and lets the queue
    /// pairs waiting for persistence see the watermark move.
    fn persistence(&mut self, cx: &mut Ctx) {
        if self.inline {
            while let Some(job) = cx.mem.take_persist_job() {
                cx.counters.persist_jobs += 1;
                if job.run().is_err() {
                    cx.counters.persist_failures += 1;
                    self.fail_waiters(cx);
                    return;
                }
                cx.mem.mark_persisted(job.ticket);
            }
        } else {
            if self.flusher.is_none() && (self.unsent_job.is_some() || cx.mem.has_persist_jobs()) {
                match Flusher::spawn() {
                    Ok(f) => self.flusher = Some(f),
                    Err(e) => {
                        eprintln!(
                            "portico: cannot start the flusher thread ({e}); persisting on the worker"
                        );
                        self.inline = true;
                        return self.persistence(cx);
                    }
                }
            }
            if let Some(f) = &self.flusher {
                while let Some(job) = self.unsent_job.take().or_else(|| cx.mem.take_persist_job()) {
                    if let Err(job) = f.offer(job) {
                        self.unsent_job = Some(job);
                        break;
                    }
                    cx.counters.persist_jobs += 1;
                }
                if f.failed().is_some() {
                    cx.counters.persist_failures += 1;
                    self.fail_waiters(cx);
                    return;
                }
                cx.mem.mark_persisted(f.done());
            }
        }
        let persisted = cx.mem.persisted();
        let mut k = 0;
        while k < self.waiters.len() {
            let slot = self.waiters[k];
            let qp = cx.qp(slot);
            let moved = qp.on_persisted(persisted);
            if qp.awaits_persistence() {
                k += 1;
            } else {
                self.waiting[slot as usize] = false;
                self.waiters.swap_remove(k);
            }
            if moved {
                cx.make_ready(slot);
            }
        }
    }

    /// A persist failed: nothing after it can be vouched for. Every queue pair waiting for
    /// persistence NAKs (remote operational error) and goes to the error state.
    fn fail_waiters(&mut self, cx: &mut Ctx) {
        for slot in std::mem::take(&mut self.waiters) {
            self.waiting[slot as usize] = false;
            cx.qps.entries[slot as usize].qp.persist_failed(cx.staged);
            cx.settle(slot);
            cx.make_ready(slot);
        }
    }
}

/// The traffic shaper (seed 000), when the engine has one. Each queue pair has two streams
/// the shaper's MCUs take and pick packets from: its send queue (flow queue = its slot) and
/// its READ responses (flow queue = [`MAX_QPS`] + its slot), both in the queue pair's class,
/// so PUT data and GET responses share one outbound policy as in the seed. ACKs, NAKs and
/// CNPs never wait for it.
#[derive(Default)]
pub(crate) struct ShaperPart {
    /// Boxed: the worker's loop asks whether there is one several times a packet, and a
    /// pointer is one compare where the inline value's niche was a 16-byte one (callgrind:
    /// 9 instructions fewer a batched WRITE, 36 fewer a lone one).
    pub shaper: Option<Box<Shaper>>,
}

impl Offload for ShaperPart {
    fn admit_qp(&self, cfg: &mut QpConfig) -> Result<(), AddQpError> {
        if let Some(sh) = &self.shaper {
            if cfg.traffic_class as usize >= sh.classes() {
                return Err(AddQpError::NoSuchClass(cfg.traffic_class, sh.classes()));
            }
            if cfg.read_split_packets == 0 {
                cfg.read_split_packets = sh.read_split_packets();
            }
        }
        Ok(())
    }

    fn due_at(&self, now: u64) -> Option<u64> {
        self.shaper.as_ref().and_then(|sh| sh.next_ready_at(now))
    }

    /// A port's rates held across its workers: this worker's share, once per interval.
    #[inline]
    fn service(&mut self, now: u64, _cx: &mut Ctx) {
        if let Some(sh) = &mut self.shaper {
            sh.rebalance(now);
        }
    }

    #[inline(always)]
    fn holds_read_responses(&self) -> bool {
        self.shaper
            .as_ref()
            .is_some_and(|sh| sh.shapes_read_responses())
    }

    #[inline(always)]
    fn iteration_work(&self, _mem: &MemoryTable) -> bool {
        self.shaper.is_some()
    }

    /// Never: it shapes what is sent.
    fn acts_on_packets(&self) -> bool {
        false
    }

    /// Its requests and READ responses go when the shaper picks them: keep its streams in
    /// step.
    #[inline(always)]
    fn holds_requests(&mut self, slot: u32, qp: &QueuePair) -> bool {
        match &mut self.shaper {
            Some(sh) => {
                sync_streams(sh, slot as usize, qp);
                true
            }
            None => false,
        }
    }

    /// The request or READ response the shaper picks next, if any may go now.
    ///
    /// Called every time the ready queue pairs have nothing more: without a shaper it returns
    /// inline, not after a call.
    #[inline(always)]
    fn transmit(&mut self, now: u64, cx: &mut Ctx) -> Option<(u32, OutPacket)> {
        shaper_transmit(self.shaper.as_mut()?, now, cx)
    }
}

/// [`ShaperPart`]'s `transmit` with a shaper.
fn shaper_transmit(sh: &mut Shaper, now: u64, cx: &mut Ctx) -> Option<(u32, OutPacket)> {
    let entries = &mut cx.qps.entries;
    // A miss spends the pick's tokens, so misses cannot go on for ever; a few per call at
    // most all the same, should a peek and a send ever keep disagreeing.
    for _ in 0..4 {
        let pick = sh.next_with(now, |q| match q.checked_sub(MAX_QPS) {
            None => {
                let (out, back) = entries[q].qp.peek_request(now)?;
                Some(Packet { out, back })
            }
            Some(slot) => {
                let out = entries[slot].qp.peek_read_response(now)?;
                Some(Packet { out, back: 0 })
            }
        })?;
        let (slot, response) = match pick.queue.checked_sub(MAX_QPS) {
            None => (pick.queue, false),
            Some(slot) => (slot, true),
        };
        let e = &mut entries[slot];
        let packet = if response {
            e.qp.poll_read_response(now)
        } else {
            e.qp.poll_request(now, &mut Budget::packets(1))
        };
        sync_streams(sh, slot, &e.qp);
        match packet {
            Some(packet) if response => {
                cx.counters.shaper_read_responses += 1;
                return Some((slot as u32, packet));
            }
            Some(packet) => {
                cx.counters.shaper_picks += 1;
                return Some((slot as u32, packet));
            }
            None => cx.counters.shaper_misses += 1,
        }
    }
    None
}

/// [`Tags`]' `poll_host` with a shard.
fn tags_poll_host(tags: &mut TagShard, cx: &mut Ctx) {
    tags.serve_commands(cx.mem);
    while let Some((qpn, next)) = tags.take_action() {
        let carried = match cx.qps.lookup(qpn) {
            Some(i) => {
                let ok = cx.qp(i as u32).tag_next(next);
                if ok {
                    cx.make_ready(i as u32);
                }
                ok
            }
            None => false,
        };
        // The queue pair failed (or is gone): the claimed message cannot be pulled.
        if !carried && let Next::Pull(p) = next {
            tags.undeliverable(p.token, cx.mem);
        }
    }
}

/// Tells the shaper whether queue pair `slot` has requests to send, and how many of its PSNs
/// are out unacknowledged (the MCU's outstanding count, the seed's OrdPktActive: for a READ,
/// the response packets it awaits); and whether it has READ responses that may go.
fn sync_streams(sh: &mut Shaper, slot: usize, qp: &QueuePair) {
    let class = qp.config().traffic_class;
    if qp.has_requests() {
        sh.activate(slot, class)
            .expect("the class was checked when the queue pair was added");
    } else {
        sh.deactivate(slot);
    }
    if let Some(m) = sh.mcu_of(slot) {
        // Not `in_flight`: after a go-back-N rewind the packets to resend are not out,
        // and an MCU held at its cap by them could never resend them.
        sh.set_outstanding(m, qp.requester().outstanding());
    }
    let responses = MAX_QPS + slot;
    if sh.shapes_read_responses() && qp.has_read_response() {
        sh.activate(responses, class)
            .expect("the class was checked when the queue pair was added");
        if let Some(m) = sh.mcu_of(responses) {
            // Responses answer requests: nothing of theirs is outstanding.
            sh.set_outstanding(m, 0);
        }
    } else {
        sh.deactivate(responses);
    }
}
