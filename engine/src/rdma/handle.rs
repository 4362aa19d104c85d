//! The application's side of an RDMA engine: memory registration, posting work, polling
//! completions. Every call is a message to the worker that owns the engine.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};

use super::{Command, Event};
use crate::transport::{Access, MrKeys, RecvRequest, WorkCompletion, WorkRequest};

/// Why a host call failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    #[error("the worker that owns this RDMA engine is gone")]
    WorkerGone,
    #[error("no answer from the worker within {0:?}")]
    Timeout(Duration),
    #[error("key {lkey:#x}, offset {offset}, length {len} is not inside a registered region")]
    OutOfRange {
        lkey: u32,
        offset: usize,
        len: usize,
    },
    #[error("the worker refused post {wr_id} on QP {qpn:#x} (queue full or bad local key)")]
    PostRefused { qpn: u32, wr_id: u64 },
}

/// An application's handle on one RDMA engine.
pub struct RdmaHandle {
    commands: Sender<Command>,
    events: Receiver<Event>,
    pending: VecDeque<WorkCompletion>,
    timeout: Duration,
}

/// Host answers wait at most this long: a worker polls its commands every loop iteration.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

impl RdmaHandle {
    /// A handle and the two channel ends the worker's stage takes.
    pub fn new() -> (RdmaHandle, Receiver<Command>, Sender<Event>) {
        let (ctx, crx) = channel::bounded(4096);
        let (etx, erx) = channel::unbounded();
        (
            RdmaHandle {
                commands: ctx,
                events: erx,
                pending: VecDeque::new(),
                timeout: ANSWER_TIMEOUT,
            },
            crx,
            etx,
        )
    }

    fn ask<T>(&self, make: impl FnOnce(Sender<T>) -> Command) -> Result<T, HostError> {
        let (tx, rx) = channel::bounded(1);
        self.commands
            .send(make(tx))
            .map_err(|_| HostError::WorkerGone)?;
        rx.recv_timeout(self.timeout).map_err(|e| match e {
            channel::RecvTimeoutError::Timeout => HostError::Timeout(self.timeout),
            channel::RecvTimeoutError::Disconnected => HostError::WorkerGone,
        })
    }

    /// Registers `len` zeroed bytes at virtual address `addr` with `access`.
    pub fn register(&self, addr: u64, len: usize, access: Access) -> Result<MrKeys, HostError> {
        self.ask(|reply| Command::Register {
            addr,
            len,
            access,
            reply,
        })
    }

    /// Copies `data` into a region at `offset`.
    pub fn write(&self, lkey: u32, offset: usize, data: &[u8]) -> Result<(), HostError> {
        let len = data.len();
        let ok = self.ask(|reply| Command::Write {
            lkey,
            offset,
            data: data.to_vec(),
            reply,
        })?;
        ok.then_some(())
            .ok_or(HostError::OutOfRange { lkey, offset, len })
    }

    /// Reads `len` bytes of a region at `offset`.
    pub fn read(&self, lkey: u32, offset: usize, len: usize) -> Result<Vec<u8>, HostError> {
        self.ask(|reply| Command::Read {
            lkey,
            offset,
            len,
            reply,
        })?
        .ok_or(HostError::OutOfRange { lkey, offset, len })
    }

    /// Posts a SEND, RDMA WRITE or RDMA READ on queue pair `qpn`.
    pub fn post_send(&self, qpn: u32, wr: WorkRequest) -> Result<(), HostError> {
        self.commands
            .send(Command::PostSend { qpn, wr })
            .map_err(|_| HostError::WorkerGone)
    }

    /// Posts a receive buffer on queue pair `qpn`.
    pub fn post_recv(&self, qpn: u32, wr: RecvRequest) -> Result<(), HostError> {
        self.commands
            .send(Command::PostRecv { qpn, wr })
            .map_err(|_| HostError::WorkerGone)
    }

    fn take_event(&mut self, e: Event) -> Result<(), HostError> {
        match e {
            Event::Completion(wc) => {
                self.pending.push_back(wc);
                Ok(())
            }
            Event::PostRefused { qpn, wr_id } => Err(HostError::PostRefused { qpn, wr_id }),
        }
    }

    /// The next completion, if one has arrived.
    pub fn poll(&mut self) -> Result<Option<WorkCompletion>, HostError> {
        while let Ok(e) = self.events.try_recv() {
            self.take_event(e)?;
        }
        Ok(self.pending.pop_front())
    }

    /// Waits up to `timeout` for the next completion.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<WorkCompletion>, HostError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.poll()? {
                return Ok(Some(wc));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            match self.events.recv_timeout(left) {
                Ok(e) => self.take_event(e)?,
                Err(channel::RecvTimeoutError::Timeout) => return Ok(None),
                Err(channel::RecvTimeoutError::Disconnected) => return Err(HostError::WorkerGone),
            }
        }
    }
}
