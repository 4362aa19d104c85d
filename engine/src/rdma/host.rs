//! The application's control path to an RDMA engine: registering and deregistering memory.
//!
//! Registration is what `ibv_reg_mr` is: the application maps memory itself (a
//! [`pmem::Mapping`]), registers a range of it, and gets a [`MemoryRegion`] whose lkey and
//! rkey name the range by its real address. Registration and deregistration go to the
//! worker that owns the engine's region table over one channel pair made with the handle
//! (a control path, not per operation). Deregistration waits until no work request, message
//! in progress or READ being answered still uses the region. The per-operation path is in
//! [`super::rings`]: posting and polling never come here.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use pmem::Mapping;

use crate::transport::{Access, MrKeys, RegisterError, SgList, Sge};

/// A request on the control path.
pub enum Control {
    Register {
        map: Arc<Mapping>,
        offset: usize,
        len: usize,
        access: Access,
        /// Name the range by this address instead of its real one (`ibv_reg_mr_iova`).
        iova: Option<u64>,
    },
    Deregister {
        lkey: u32,
    },
}

/// The worker's answer to a [`Control`] request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlReply {
    Registered(Result<MrKeys, RegisterError>),
    /// Whether the key named a registered region (it is gone now).
    Deregistered(bool),
}

/// The worker's end of the control path. Requests and replies carry the request's number,
/// so that a reply that comes after its caller gave up is never taken for a later one's.
pub struct ControlPort {
    pub(crate) requests: Receiver<(u64, Control)>,
    pub(crate) replies: Sender<(u64, ControlReply)>,
}

/// Why a host call failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    #[error("the worker that owns this RDMA engine is gone")]
    WorkerGone,
    #[error("no answer from the worker within {0:?}")]
    Timeout(Duration),
    #[error("registration refused: {0}")]
    Register(#[from] RegisterError),
    #[error("key {0:#x} names no registered region")]
    NotRegistered(u32),
}

/// Host answers wait at most this long: a worker serves its control path every iteration, and
/// a deregistration waits for the operations still using the region.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// An application's control handle on one RDMA engine.
pub struct RdmaHandle {
    path: Mutex<ControlPath>,
    timeout: Duration,
}

/// The application's end of the control path, and the number of the last request.
struct ControlPath {
    requests: Sender<(u64, Control)>,
    replies: Receiver<(u64, ControlReply)>,
    last: u64,
}

impl RdmaHandle {
    /// A handle and the worker's end of its control path.
    pub fn new() -> (RdmaHandle, ControlPort) {
        let (req_tx, req_rx) = channel::bounded(64);
        let (rep_tx, rep_rx) = channel::bounded(64);
        (
            RdmaHandle {
                path: Mutex::new(ControlPath {
                    requests: req_tx,
                    replies: rep_rx,
                    last: 0,
                }),
                timeout: ANSWER_TIMEOUT,
            },
            ControlPort {
                requests: req_rx,
                replies: rep_tx,
            },
        )
    }

    fn ask(&self, request: Control) -> Result<ControlReply, HostError> {
        let mut path = self.path.lock().map_err(|_| HostError::WorkerGone)?;
        path.last += 1;
        let id = path.last;
        path.requests
            .send((id, request))
            .map_err(|_| HostError::WorkerGone)?;
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match path.replies.recv_timeout(left) {
                Ok((n, reply)) if n == id => return Ok(reply),
                // The late answer to a request whose caller timed out: not ours.
                Ok(_) => continue,
                Err(channel::RecvTimeoutError::Timeout) => {
                    return Err(HostError::Timeout(self.timeout));
                }
                Err(channel::RecvTimeoutError::Disconnected) => return Err(HostError::WorkerGone),
            }
        }
    }

    /// Registers `len` bytes of `map` from `offset` with `access`. The keys name the bytes by
    /// their real address.
    pub fn register(
        &self,
        map: &Arc<Mapping>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, HostError> {
        self.register_with(map, offset, len, access, None)
    }

    /// Registers the whole mapping.
    pub fn register_all(
        &self,
        map: &Arc<Mapping>,
        access: Access,
    ) -> Result<MemoryRegion, HostError> {
        self.register_with(map, 0, map.len(), access, None)
    }

    /// Registers a range named by `iova` instead of its real address.
    pub fn register_iova(
        &self,
        map: &Arc<Mapping>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion, HostError> {
        self.register_with(map, offset, len, access, Some(iova))
    }

    fn register_with(
        &self,
        map: &Arc<Mapping>,
        offset: usize,
        len: usize,
        access: Access,
        iova: Option<u64>,
    ) -> Result<MemoryRegion, HostError> {
        let reply = self.ask(Control::Register {
            map: map.clone(),
            offset,
            len,
            access,
            iova,
        })?;
        match reply {
            ControlReply::Registered(Ok(keys)) => Ok(MemoryRegion {
                keys,
                map: map.clone(),
                offset,
            }),
            ControlReply::Registered(Err(e)) => Err(e.into()),
            ControlReply::Deregistered(_) => Err(HostError::WorkerGone),
        }
    }

    /// Deregisters `mr`, once no operation uses it any more. Its keys stop working at once.
    pub fn deregister(&self, mr: MemoryRegion) -> Result<(), HostError> {
        let lkey = mr.keys.lkey;
        match self.ask(Control::Deregister { lkey })? {
            ControlReply::Deregistered(true) => Ok(()),
            ControlReply::Deregistered(false) => Err(HostError::NotRegistered(lkey)),
            ControlReply::Registered(_) => Err(HostError::WorkerGone),
        }
    }
}

/// A registered range of the application's memory.
#[derive(Debug, Clone)]
pub struct MemoryRegion {
    keys: MrKeys,
    map: Arc<Mapping>,
    /// Where the region starts in the mapping.
    offset: usize,
}

impl MemoryRegion {
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }

    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }

    /// The address of the region's first byte, as work requests and peers name it.
    pub fn addr(&self) -> u64 {
        self.keys.addr
    }

    pub fn len(&self) -> usize {
        self.keys.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.keys.len == 0
    }

    pub fn keys(&self) -> MrKeys {
        self.keys
    }

    /// The mapping the region lies in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    /// A scatter/gather entry for `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge::new(self.keys.lkey, self.keys.addr + offset as u64, len)
    }

    /// A one-entry list for `len` bytes at `offset` into the region.
    pub fn sgl(&self, offset: usize, len: u32) -> SgList {
        SgList::one(self.keys.lkey, self.keys.addr + offset as u64, len)
    }

    /// Copies `src` into the region at `offset` (the application's own store; no operation
    /// may be using those bytes).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), pmem::Error> {
        self.check(offset, src.len())?;
        self.map.write(self.offset + offset, src)
    }

    /// Copies bytes of the region at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), pmem::Error> {
        self.check(offset, dst.len())?;
        self.map.read(self.offset + offset, dst)
    }

    /// `len` bytes at `offset`, copied out.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, pmem::Error> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), pmem::Error> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(pmem::Error::OutOfBounds {
                offset,
                len,
                size: self.len(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_reply_is_not_taken_for_the_next_request() {
        let (mut handle, port) = RdmaHandle::new();
        handle.timeout = Duration::from_millis(50);
        let map = Arc::new(Mapping::anonymous(4096).unwrap());
        let worker = std::thread::spawn(move || {
            // The first request is answered after its caller has given up.
            let (first, _) = port.requests.recv().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            port.replies
                .send((first, ControlReply::Deregistered(true)))
                .unwrap();
            let (second, _) = port.requests.recv().unwrap();
            let keys = MrKeys {
                lkey: 7,
                rkey: 8,
                addr: 0x1000,
                len: 4096,
            };
            port.replies
                .send((second, ControlReply::Registered(Ok(keys))))
                .unwrap();
        });
        assert_eq!(
            handle.register(&map, 0, 4096, Access::ALL).unwrap_err(),
            HostError::Timeout(Duration::from_millis(50))
        );
        // The late answer is queued now, ahead of the next one.
        std::thread::sleep(Duration::from_millis(100));
        let mr = handle
            .register(&map, 0, 4096, Access::ALL)
            .expect("the second request gets its own answer");
        assert_eq!((mr.lkey(), mr.rkey()), (7, 8));
        worker.join().unwrap();
    }
}
