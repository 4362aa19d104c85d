//! The application's control path to an RDMA engine: registering and deregistering memory.
//!
//! Registration is what `ibv_reg_mr` is: the application maps memory itself (a
//! [`pmem::Mapping`]), registers a range of it, and gets a [`MemoryRegion`] whose lkey and
//! rkey name the range by its real address. Registration and deregistration go to the
//! worker that owns the engine's region table over one channel pair made with the handle
//! (a control path, not per operation). Deregistration waits until no work request, message
//! in progress or READ being answered still uses the region. The per-operation path is in
//! [`super::rings`]: posting and polling never come here.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use pmem::Mapping;

use super::live::{LiveQps, LiveReader};
use crate::wake::Wake;
use proto::transport::{Access, MrKeys, RegisterError, SgList, Sge};

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
    /// A call to the connection manager ([`crate::cm`]), on the worker that has it.
    Cm(crate::cm::CmControl),
    /// Give this worker's replica of the engine's region table a region another replica
    /// registered, under the same keys (an engine on several workers, see
    /// [`RdmaHandle::sharded`]).
    Install {
        map: Arc<Mapping>,
        offset: usize,
        access: Access,
        keys: MrKeys,
    },
}

/// The worker's answer to a [`Control`] request.
#[derive(Debug)]
pub enum ControlReply {
    Registered(Result<MrKeys, RegisterError>),
    Cm(Result<crate::cm::CmReply, crate::cm::CmCallError>),
    /// Whether the key named a registered region (it is gone now).
    Deregistered(bool),
}

/// Registrations compare by their outcome; a CM answer (which may hold a queue pair) equals
/// nothing.
impl PartialEq for ControlReply {
    fn eq(&self, other: &ControlReply) -> bool {
        match (self, other) {
            (ControlReply::Registered(a), ControlReply::Registered(b)) => a == b,
            (ControlReply::Deregistered(a), ControlReply::Deregistered(b)) => a == b,
            _ => false,
        }
    }
}

/// The worker's end of the control path. Requests and replies carry the request's number,
/// so that a reply that comes after its caller gave up is never taken for a later one's.
pub struct ControlPort {
    pub requests: Receiver<(u64, Control)>,
    pub replies: Sender<(u64, ControlReply)>,
    /// Where the worker publishes its queue pairs' live state (telemetry).
    pub live: Arc<LiveQps>,
    /// Rung by the host after each request, for a worker asleep (adaptive polling).
    pub wake: Arc<Wake>,
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
    #[error("connection manager: {0}")]
    Cm(#[from] crate::cm::CmCallError),
}

/// Host answers wait at most this long: a worker serves its control path every iteration, and
/// a deregistration waits for the operations still using the region.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// An application's control handle on one RDMA engine.
///
/// An engine that runs on several workers has one control path per worker, each to that
/// worker's shard ([`RdmaHandle::sharded`]). Every shard keeps its own replica of the region
/// table, so that a queue pair on any worker resolves keys without a lock or a shared
/// structure on the per-packet path. Registration is therefore broadcast: shard 0 registers
/// and draws the keys, every other shard installs the region under the same keys, and the
/// call returns once all have it. Deregistration goes to every shard and returns once each has
/// let go of the region (a replica answers when no work of its own uses it any more).
pub struct RdmaHandle {
    paths: Mutex<Vec<ControlPath>>,
    timeout: Duration,
    /// Per worker (shard): its queue pairs' live state, as it last published it.
    live: Vec<Arc<LiveQps>>,
}

/// The application's end of one worker's control path, and the number of its last request.
struct ControlPath {
    requests: Sender<(u64, Control)>,
    replies: Receiver<(u64, ControlReply)>,
    last: u64,
    wake: Arc<Wake>,
}

impl ControlPath {
    /// Sends `request`; returns its number.
    fn send(&mut self, request: Control) -> Result<u64, HostError> {
        self.last += 1;
        self.requests
            .send((self.last, request))
            .map_err(|_| HostError::WorkerGone)?;
        self.wake.notify();
        Ok(self.last)
    }

    /// The answer to request `id`, skipping late answers to requests whose callers gave up.
    fn answer(&self, id: u64, timeout: Duration) -> Result<ControlReply, HostError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.replies.recv_timeout(left) {
                Ok((n, reply)) if n == id => return Ok(reply),
                // The late answer to a request whose caller timed out: not ours.
                Ok(_) => continue,
                Err(channel::RecvTimeoutError::Timeout) => return Err(HostError::Timeout(timeout)),
                Err(channel::RecvTimeoutError::Disconnected) => return Err(HostError::WorkerGone),
            }
        }
    }
}

impl RdmaHandle {
    /// A handle and the worker's end of its control path.
    pub fn new() -> (RdmaHandle, ControlPort) {
        let (handle, mut ports) = RdmaHandle::sharded(1);
        (handle, ports.pop().expect("one port"))
    }

    /// A handle on an engine that runs on `shards` workers (at least one), and each worker's
    /// end of its control path, in shard order.
    pub fn sharded(shards: usize) -> (RdmaHandle, Vec<ControlPort>) {
        let live: Vec<Arc<LiveQps>> = (0..shards.max(1)).map(|_| Arc::default()).collect();
        let (paths, ports) = live
            .iter()
            .map(|live| {
                let (req_tx, req_rx) = channel::bounded(64);
                let (rep_tx, rep_rx) = channel::bounded(64);
                let wake = Arc::new(Wake::new());
                (
                    ControlPath {
                        requests: req_tx,
                        replies: rep_rx,
                        last: 0,
                        wake: wake.clone(),
                    },
                    ControlPort {
                        requests: req_rx,
                        replies: rep_tx,
                        live: live.clone(),
                        wake,
                    },
                )
            })
            .unzip();
        (
            RdmaHandle {
                paths: Mutex::new(paths),
                timeout: ANSWER_TIMEOUT,
                live,
            },
            ports,
        )
    }

    /// A reader of every worker's (shard's) published queue pairs, for another thread.
    pub fn live_qps(&self) -> LiveReader {
        LiveReader::new(self.live.clone())
    }

    /// The workers (shards) the engine runs on.
    pub fn shards(&self) -> usize {
        self.paths.lock().map(|p| p.len()).unwrap_or(0)
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
        let mut paths = self.paths.lock().map_err(|_| HostError::WorkerGone)?;
        let first = paths.first_mut().ok_or(HostError::WorkerGone)?;
        let id = first.send(Control::Register {
            map: map.clone(),
            offset,
            len,
            access,
            iova,
        })?;
        let keys = match first.answer(id, self.timeout)? {
            ControlReply::Registered(Ok(keys)) => keys,
            ControlReply::Registered(Err(e)) => return Err(e.into()),
            ControlReply::Deregistered(_) | ControlReply::Cm(_) => {
                return Err(HostError::WorkerGone);
            }
        };
        // Every other shard installs it under the same keys: sent to all, then answered.
        let mut asked = Vec::with_capacity(paths.len());
        for p in paths.iter_mut().skip(1) {
            asked.push(p.send(Control::Install {
                map: map.clone(),
                offset,
                access,
                keys,
            }));
        }
        let mut failure = None;
        let mut installed = vec![true];
        for (p, id) in paths.iter().skip(1).zip(asked) {
            let outcome = id.and_then(|id| p.answer(id, self.timeout));
            installed.push(matches!(outcome, Ok(ControlReply::Registered(Ok(_)))));
            if failure.is_none() {
                failure = match outcome {
                    Ok(ControlReply::Registered(Ok(_))) => None,
                    Ok(ControlReply::Registered(Err(e))) => Some(e.into()),
                    Ok(ControlReply::Deregistered(_) | ControlReply::Cm(_)) => {
                        Some(HostError::WorkerGone)
                    }
                    Err(e) => Some(e),
                };
            }
        }
        if let Some(e) = failure {
            // Not every shard has it: take it back out of those that do.
            let _ = Self::deregister_on(&mut paths, keys.lkey, &installed, self.timeout);
            return Err(e);
        }
        Ok(MemoryRegion {
            keys,
            map: map.clone(),
            offset,
        })
    }

    /// Deregisters `lkey` on the shards marked in `on`; true when every one of them had it.
    fn deregister_on(
        paths: &mut [ControlPath],
        lkey: u32,
        on: &[bool],
        timeout: Duration,
    ) -> Result<bool, HostError> {
        let mut asked = Vec::with_capacity(paths.len());
        for (p, &ask) in paths.iter_mut().zip(on) {
            asked.push(if ask {
                Some(p.send(Control::Deregister { lkey }))
            } else {
                None
            });
        }
        let mut all = true;
        let mut error = None;
        for (p, id) in paths.iter().zip(asked) {
            let Some(id) = id else { continue };
            match id.and_then(|id| p.answer(id, timeout)) {
                Ok(ControlReply::Deregistered(had)) => all &= had,
                Ok(ControlReply::Registered(_) | ControlReply::Cm(_)) => {
                    error = error.or(Some(HostError::WorkerGone))
                }
                Err(e) => error = error.or(Some(e)),
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(all),
        }
    }

    /// A call to the engine's connection manager (on its first worker): listen, connect,
    /// accept, reject, disconnect. Its events come on the [`crate::cm::CmEvents`] the engine's
    /// stage got from [`crate::RdmaNode::enable_cm`].
    pub fn cm(&self, call: crate::cm::CmControl) -> Result<crate::cm::CmReply, HostError> {
        let mut paths = self.paths.lock().map_err(|_| HostError::WorkerGone)?;
        let first = paths.first_mut().ok_or(HostError::WorkerGone)?;
        let id = first.send(Control::Cm(call))?;
        match first.answer(id, self.timeout)? {
            ControlReply::Cm(r) => Ok(r?),
            _ => Err(HostError::WorkerGone),
        }
    }

    /// Listens on rdma_cm (RDMA_PS_TCP) port `port`: its requests come as
    /// [`crate::cm::ConnEvent::Request`].
    pub fn listen(&self, port: u16) -> Result<(), HostError> {
        self.cm(crate::cm::CmControl::Listen(port)).map(|_| ())
    }

    /// Connects to `ip:port` with `private_data` after rdma_cm's header; returns the
    /// connection's ID. Its queue pair comes with [`crate::cm::ConnEvent::Established`].
    pub fn connect(&self, ip: Ipv4Addr, port: u16, private_data: &[u8]) -> Result<u32, HostError> {
        self.connect_with(ip, port, private_data, crate::cm::QpTweak::default())
    }

    /// As [`RdmaHandle::connect`], the queue pair as the CM's template with `tweak`.
    pub fn connect_with(
        &self,
        ip: Ipv4Addr,
        port: u16,
        private_data: &[u8],
        tweak: crate::cm::QpTweak,
    ) -> Result<u32, HostError> {
        let call = crate::cm::CmControl::Connect {
            ip,
            port,
            private_data: private_data.to_vec(),
            cqs: None,
            tweak,
        };
        match self.cm(call)? {
            crate::cm::CmReply::Connecting(id) => Ok(id),
            _ => Err(HostError::WorkerGone),
        }
    }

    /// Accepts connection request `id` with `private_data` in the REP; returns its queue pair
    /// (on the CM's completion queue).
    pub fn accept(&self, id: u32, private_data: &[u8]) -> Result<crate::Qp, HostError> {
        self.accept_with(id, private_data, crate::cm::QpTweak::default())
    }

    /// As [`RdmaHandle::accept`], the queue pair as the CM's template with `tweak`.
    pub fn accept_with(
        &self,
        id: u32,
        private_data: &[u8],
        tweak: crate::cm::QpTweak,
    ) -> Result<crate::Qp, HostError> {
        let call = crate::cm::CmControl::Accept {
            id,
            private_data: private_data.to_vec(),
            cqs: None,
            tweak,
        };
        match self.cm(call)? {
            crate::cm::CmReply::Accepted(qp) => Ok(qp),
            _ => Err(HostError::WorkerGone),
        }
    }

    /// Rejects connection request `id` (REJ "consumer defined") with `private_data`.
    pub fn reject(&self, id: u32, private_data: &[u8]) -> Result<(), HostError> {
        let call = crate::cm::CmControl::Reject {
            id,
            private_data: private_data.to_vec(),
        };
        self.cm(call).map(|_| ())
    }

    /// Ends connection `id` (DREQ); [`crate::cm::ConnEvent::Disconnected`] follows.
    pub fn disconnect(&self, id: u32) -> Result<(), HostError> {
        self.cm(crate::cm::CmControl::Disconnect { id }).map(|_| ())
    }

    /// Deregisters `mr`, once no operation uses it any more (on any of the engine's workers).
    /// Its keys stop working at once.
    pub fn deregister(&self, mr: MemoryRegion) -> Result<(), HostError> {
        let lkey = mr.keys.lkey;
        let mut paths = self.paths.lock().map_err(|_| HostError::WorkerGone)?;
        let every = vec![true; paths.len()];
        match Self::deregister_on(&mut paths, lkey, &every, self.timeout)? {
            true => Ok(()),
            false => Err(HostError::NotRegistered(lkey)),
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
    use crate::RdmaNode;
    use wire::EthernetAddress;

    /// Serves `port` with `node`'s control path until the handle goes away; returns the node.
    fn serve(mut node: RdmaNode, port: ControlPort) -> std::thread::JoinHandle<RdmaNode> {
        std::thread::spawn(move || {
            while let Ok((id, request)) = port.requests.recv() {
                if let Some(reply) = node.control(id, request) {
                    port.replies.send(reply).unwrap();
                }
                node.take_replies(|r| port.replies.send(r).unwrap());
            }
            node
        })
    }

    fn node() -> RdmaNode {
        RdmaNode::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            std::net::Ipv4Addr::LOCALHOST,
        )
    }

    #[test]
    fn a_sharded_engine_registers_on_every_shard_or_on_none() {
        let (handle, ports) = RdmaHandle::sharded(3);
        assert_eq!(handle.shards(), 3);
        let map = Arc::new(Mapping::anonymous(8192).unwrap());
        // Shard 2's slot 1 is taken behind the handle's back: its table is out of step.
        let mut odd = node();
        let k0 = odd.register(map.clone(), 0, 64, Access::ALL).unwrap();
        odd.register(map.clone(), 0, 64, Access::ALL).unwrap();
        assert!(
            odd.mem.deregister(k0.lkey),
            "slot 0 free again, slot 1 taken"
        );
        let workers: Vec<_> = [node(), node(), odd]
            .into_iter()
            .zip(ports)
            .map(|(n, p)| serve(n, p))
            .collect();
        let first = handle.register(&map, 0, 4096, Access::ALL).unwrap();
        let refused = handle.register(&map, 4096, 4096, Access::ALL).unwrap_err();
        assert_eq!(refused, HostError::Register(RegisterError::SlotTaken(1)));
        drop(handle);
        let nodes: Vec<RdmaNode> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        for (i, n) in nodes.iter().enumerate() {
            // The first region resolves alike everywhere; the refused one nowhere.
            assert!(
                n.mem
                    .check_remote(first.rkey(), first.addr(), 4096, Access::REMOTE_WRITE)
                    .is_ok(),
                "shard {i}"
            );
        }
        let slot1 = proto::transport::Location {
            region: 1,
            offset: 0,
        };
        for n in &nodes[..2] {
            assert_eq!(
                n.mem.remote_name(slot1, Access::NONE),
                None,
                "shards 0 and 1 let go of the half-installed region"
            );
        }
        assert!(
            nodes[2].mem.remote_name(slot1, Access::NONE).is_some(),
            "shard 2's own"
        );
    }

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
