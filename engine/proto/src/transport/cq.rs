//! Completion queues: where finished work requests are reported.
//!
//! Every posted send and receive work request ends in exactly one
//! [`WorkCompletion`], successful or not. The queue is a ring sized at
//! creation; pushing into a full queue does not grow it (that would allocate
//! on the packet path) but counts an overrun, as a verbs CQ overrun would.

use std::collections::VecDeque;

/// What kind of work finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    /// A durable WRITE whose durable ACK arrived: the data is in the target's persistence
    /// domain.
    DurableWrite,
    /// A durable WRITE that asked for two completions, at receipt: the data is placed, not
    /// yet known durable. The [`WcOpcode::DurableWrite`] completion follows.
    DurablePlaced,
    /// An IBTA FLUSH, answered.
    Flush,
    /// An IBTA ATOMIC WRITE, answered.
    AtomicWrite,
    /// A tagged send: eager, acknowledged; rendezvous, taken by the target.
    TaggedSend,
    /// A receive consumed by an incoming SEND.
    Recv,
    /// A receive consumed by an incoming RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// How it finished. Mirrors the verbs statuses the RC transport can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    /// An incoming SEND did not fit the posted receive buffer, or a work request's buffer is
    /// longer than a message may be.
    LocalLengthError,
    /// A scatter/gather entry named a bad lkey, lay outside its region, or lacked the access
    /// the operation needs (LOCAL_WRITE to place data).
    LocalProtectionError,
    /// The responder refused the rkey, the range or the permission (NAK 0x62).
    RemoteAccessError,
    /// The responder found the request malformed (NAK 0x61).
    RemoteInvalidRequest,
    /// The responder failed for its own reasons (NAK 0x63).
    RemoteOperationalError,
    /// The retransmission timer expired more often than the retry limit.
    RetryExceeded,
    /// The responder said RNR more often than the RNR retry limit.
    RnrRetryExceeded,
    /// The QP was in (or entered) the error state before this request ran.
    WrFlushError,
    /// The queue pair cannot carry this request (a durable WRITE on a queue pair that did not
    /// negotiate the extension); verbs' local QP operation error.
    LocalQpOperationError,
}

/// One finished work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// The local QP number that owned the work request.
    pub qpn: u32,
    pub opcode: WcOpcode,
    pub status: WcStatus,
    /// Bytes transferred (received bytes for receives, message length for sends).
    pub byte_len: u32,
    /// Immediate data of a SEND/WRITE with immediate, as a big-endian `u32`.
    pub imm_data: Option<u32>,
}

impl WorkCompletion {
    /// A placeholder for slices that `poll` of the host's completion ring (the node crate's `Cq::poll`) fills.
    pub const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        qpn: 0,
        opcode: WcOpcode::Send,
        status: WcStatus::Success,
        byte_len: 0,
        imm_data: None,
    };
}

/// [`WorkCompletion::EMPTY`]: what a ring's slots hold before a completion is copied in
/// (the node crate's completion rings fill a run of slots with one copy).
impl Default for WorkCompletion {
    fn default() -> Self {
        WorkCompletion::EMPTY
    }
}

/// A bounded FIFO of completions staged on the worker before they are published to the
/// application's completion ring (`rdma::Cq`, the only thing called a CQ).
#[derive(Debug)]
pub struct StagedCompletions {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    overruns: u64,
}

impl StagedCompletions {
    pub fn new(capacity: usize) -> StagedCompletions {
        StagedCompletions {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            overruns: 0,
        }
    }

    /// Append a completion; a full queue drops it and counts an overrun.
    pub fn push(&mut self, wc: WorkCompletion) {
        if self.entries.len() >= self.capacity {
            self.overruns += 1;
        } else {
            self.entries.push_back(wc);
        }
    }

    /// Take the oldest completion.
    pub fn poll(&mut self) -> Option<WorkCompletion> {
        self.entries.pop_front()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The staged completions, oldest first, in one slice; taken by reading them and then
    /// calling [`StagedCompletions::clear`] (after which the queue starts at its front again,
    /// so the slice is made without moving anything).
    #[inline]
    pub fn as_slice(&mut self) -> &[WorkCompletion] {
        if self.entries.as_slices().1.is_empty() {
            // The common case, without the call `make_contiguous` is.
            self.entries.as_slices().0
        } else {
            self.entries.make_contiguous()
        }
    }

    /// Drop every staged completion.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Completions lost because the queue was full.
    pub fn overruns(&self) -> u64 {
        self.overruns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            qpn: 1,
            opcode: WcOpcode::Send,
            status: WcStatus::Success,
            byte_len: 0,
            imm_data: None,
        }
    }

    #[test]
    fn one_slice_keeps_the_order_when_the_queue_has_wrapped() {
        let mut cq = StagedCompletions::new(4);
        let n = cq.entries.capacity();
        cq.capacity = n;
        for i in 0..n as u64 {
            cq.push(wc(i));
        }
        for _ in 0..n - 1 {
            cq.poll();
        }
        cq.push(wc(100));
        cq.push(wc(101));
        assert!(!cq.entries.as_slices().1.is_empty(), "the queue wraps");
        let ids: Vec<_> = cq.as_slice().iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [n as u64 - 1, 100, 101]);
        cq.clear();
        assert!(cq.is_empty());
    }

    #[test]
    fn fifo_and_overrun() {
        let mut cq = StagedCompletions::new(2);
        cq.push(wc(1));
        cq.push(wc(2));
        cq.push(wc(3));
        assert_eq!(cq.overruns(), 1);
        assert_eq!(cq.len(), 2);
        assert_eq!(cq.poll().unwrap().wr_id, 1);
        assert_eq!(cq.poll().unwrap().wr_id, 2);
        assert!(cq.poll().is_none());
        assert!(cq.is_empty());
    }
}
