//! What a worker's engine tells the polling policy (`portico::runtime::polling`) on an
//! iteration that did nothing: when it next needs a poll, and whether it awaits packets.

/// What a stage expects, asked on an iteration that did nothing (see the runtime's `Stage::outlook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlook {
    /// How long until the stage needs a poll if nothing arrives: `Some(0)` while it holds work
    /// it could not do yet (never back off), `Some(ns)` for its next timer, `None` when only
    /// a packet or a host's post can give it work.
    pub due_in_ns: Option<u64>,
    /// It awaits packets: replies to its own requests in flight, or packets it exists to
    /// receive (a forwarder). Sleeps then start short.
    pub awaits_packets: bool,
}

impl Outlook {
    /// Work not done yet: poll on.
    pub const BUSY: Outlook = Outlook {
        due_in_ns: Some(0),
        awaits_packets: true,
    };

    /// Only packets give it work (a forwarder, a checker).
    pub const PACKETS: Outlook = Outlook {
        due_in_ns: None,
        awaits_packets: true,
    };

    /// A timer due in `ns`, nothing awaited.
    pub fn due_in(ns: Option<u64>) -> Outlook {
        Outlook {
            due_in_ns: ns,
            awaits_packets: false,
        }
    }

    /// Two parts of one worker together: the sooner timer, and packets awaited by either.
    pub fn and(self, other: Outlook) -> Outlook {
        Outlook {
            due_in_ns: match (self.due_in_ns, other.due_in_ns) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            awaits_packets: self.awaits_packets || other.awaits_packets,
        }
    }
}
