//! Completion queues: where finished work requests are reported.
//!
//! Every posted send and receive work request ends in exactly one
//! [`WorkCompletion`], successful or not. The queue is a ring sized at
//! creation; pushing into a full queue does not grow it (that would allocate
//! on the packet path) but counts an overrun, as a verbs CQ overrun would.

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
///
/// A vector read from `head`, not a ring: the engine empties it at every iteration
/// ([`StagedCompletions::clear`]), so a push needs no wrap, and the completions are always
/// one slice (callgrind, against a `VecDeque`: a batched 64 B WRITE 1 701.4 -> 1 696.0
/// instructions, a lone one 3 630 -> 3 622). What was polled is given back when the queue
/// empties, or moved out when a push finds it full.
#[derive(Debug)]
pub struct StagedCompletions {
    entries: Vec<WorkCompletion>,
    /// The oldest completion not yet polled.
    head: usize,
    capacity: usize,
    overruns: u64,
}

impl StagedCompletions {
    pub fn new(capacity: usize) -> StagedCompletions {
        StagedCompletions {
            entries: Vec::with_capacity(capacity),
            head: 0,
            capacity,
            overruns: 0,
        }
    }

    /// Append a completion; a full queue drops it and counts an overrun.
    #[inline]
    pub fn push(&mut self, wc: WorkCompletion) {
        if self.entries.len() >= self.capacity && !self.make_room() {
            self.overruns += 1;
            return;
        }
        self.entries.push(wc);
    }

    /// Moves out what was polled; false when nothing was (the queue is full).
    #[cold]
    fn make_room(&mut self) -> bool {
        if self.head == 0 {
            return false;
        }
        self.entries.drain(..self.head);
        self.head = 0;
        true
    }

    /// Take the oldest completion.
    pub fn poll(&mut self) -> Option<WorkCompletion> {
        let wc = *self.entries.get(self.head)?;
        self.head += 1;
        if self.head == self.entries.len() {
            self.clear();
        }
        Some(wc)
    }

    pub fn len(&self) -> usize {
        self.entries.len() - self.head
    }

    /// The staged completions, oldest first, in one slice; taken by reading them and then
    /// calling [`StagedCompletions::clear`].
    #[inline]
    pub fn as_slice(&mut self) -> &[WorkCompletion] {
        &self.entries[self.head..]
    }

    /// Drop every staged completion.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.head = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// Pushes and polls interleaved past the capacity: what was polled makes room, the order
    /// holds, and the slice is the completions not polled yet.
    #[test]
    fn polled_completions_make_room_and_the_order_holds() {
        let mut cq = StagedCompletions::new(4);
        for i in 0..4 {
            cq.push(wc(i));
        }
        for i in 0..3 {
            assert_eq!(cq.poll().map(|w| w.wr_id), Some(i));
        }
        // Full, but three were polled: they make room for two more.
        cq.push(wc(100));
        cq.push(wc(101));
        assert_eq!(cq.overruns(), 0);
        assert_eq!(cq.len(), 3);
        let ids: Vec<_> = cq.as_slice().iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [3, 100, 101]);
        cq.push(wc(102));
        cq.push(wc(103));
        assert_eq!(cq.overruns(), 1, "four waiting: the fifth is refused");
        let ids: Vec<_> = std::iter::from_fn(|| cq.poll()).map(|w| w.wr_id).collect();
        assert_eq!(ids, [3, 100, 101, 102]);
        assert!(cq.is_empty());
        // A long run of one push and one poll never fills it.
        for i in 0..100 {
            cq.push(wc(i));
            assert_eq!(cq.poll().map(|w| w.wr_id), Some(i));
        }
        assert_eq!(cq.overruns(), 1);
        // One always waiting while others come and go: the polled ones are moved out when
        // the vector fills.
        cq.push(wc(0));
        for i in 1..100 {
            cq.push(wc(i));
            assert_eq!(cq.poll().map(|w| w.wr_id), Some(i - 1));
        }
        assert_eq!(cq.overruns(), 1);
        assert_eq!(cq.len(), 1);
        cq.push(wc(7));
        cq.clear();
        assert!(cq.is_empty() && cq.as_slice().is_empty());
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
