//! `FI_EP_MSG`: connection-oriented endpoints over the IBTA CM, as verbs' RC endpoints are. A
//! passive endpoint listens on an rdma_cm port; a connection request becomes an `FI_CONNREQ`
//! event on its event queue, whose `info->handle` the application opens an endpoint with and
//! accepts (or rejects); `fi_connect` on the other side sends the REQ. Once the exchange is
//! done, both endpoints get `FI_CONNECTED`; a disconnect gives `FI_SHUTDOWN`; a refused or
//! unanswered request gives an error entry. The connection's queue pair carries plain RoCEv2
//! SENDs (not tagged: the CM is told so per connection), its receives are the endpoint's own
//! (`fi_recv` posts a receive on the queue pair, as `ibv_post_recv` does), and its RMA goes
//! on it too.

use std::collections::VecDeque;

use portico::rdma::cm::ConnEvent;
use portico::rdma::cm::QpTweak;
use portico::transport::{RecvRequest, SgList};

use crate::addr::EpAddr;
use crate::engine::{Engine, EpState, Op, err, put, slot, slot_mut};
use crate::flags;

/// The CM's private data has a fixed size on the wire (the REQ's 56 bytes after rdma_cm's
/// header), so the application's bytes travel after one byte that says how many there are
/// (as libfabric's verbs provider does): `fi_connect` and `fi_accept` take at most this many.
pub const CM_DATA_MAX: usize = 55;

/// The application's connection data as it travels: its length, then the bytes.
pub fn wrap(data: &[u8]) -> Result<Vec<u8>, i32> {
    if data.len() > CM_DATA_MAX {
        return Err(err::EINVAL);
    }
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    Ok(v)
}

/// The application's bytes out of what came (nothing, for a peer that sent none).
pub fn unwrap(raw: &[u8]) -> Vec<u8> {
    match raw.split_first() {
        Some((&n, rest)) => rest[..(n as usize).min(rest.len())].to_vec(),
        None => Vec::new(),
    }
}

/// `FI_CONNREQ`, `FI_CONNECTED`, `FI_SHUTDOWN` (fi_eq.h).
pub const CONNREQ: u32 = 1;
pub const CONNECTED: u32 = 2;
pub const SHUTDOWN: u32 = 3;

/// A connection request waiting for the application's accept or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnReq {
    pub id: u32,
    /// The passive endpoint's port and the requester's address.
    pub local: EpAddr,
    pub peer: EpAddr,
}

/// One event queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqEntry {
    pub event: u32,
    /// The `fid` the event is about (the passive endpoint for a request, else the endpoint).
    pub fid: u64,
    pub connreq: Option<ConnReq>,
    /// The peer's private data (REQ, REP, or REJ).
    pub data: Vec<u8>,
    /// An error entry: the error (positive `FI_E*`).
    pub error: Option<i32>,
}

#[derive(Debug, Default)]
pub struct EqState {
    pub entries: VecDeque<EqEntry>,
}

#[derive(Debug, Clone)]
pub struct PepState {
    pub port: u16,
    pub eq: Option<usize>,
    pub listening: bool,
    pub fid: u64,
}

impl Engine {
    pub fn eq_open(&self) -> usize {
        put(&mut self.lock().eqs, EqState::default())
    }

    pub fn eq_close(&self, id: usize) {
        if let Some(e) = self.lock().eqs.get_mut(id) {
            *e = None;
        }
    }

    /// The event at the head of `eq` (kept with `peek`); `Err(EAVAIL)` when it is an error
    /// entry, `Err(EAGAIN)` when there is none.
    pub fn eq_read(&self, eq: usize, peek: bool) -> Result<EqEntry, i32> {
        let mut st = self.lock();
        let q = slot_mut(&mut st.eqs, eq)?;
        match q.entries.front() {
            None => Err(err::EAGAIN),
            Some(e) if e.error.is_some() => Err(err::EAVAIL),
            Some(e) if peek => Ok(e.clone()),
            Some(_) => Ok(q.entries.pop_front().expect("front")),
        }
    }

    /// The error entry at the head of `eq`.
    pub fn eq_readerr(&self, eq: usize) -> Option<EqEntry> {
        let mut st = self.lock();
        let q = st.eqs.get_mut(eq)?.as_mut()?;
        match q.entries.front() {
            Some(e) if e.error.is_some() => q.entries.pop_front(),
            _ => None,
        }
    }

    fn push_event(&self, eq: Option<usize>, entry: EqEntry) {
        let mut st = self.lock();
        match eq.and_then(|e| st.eqs.get_mut(e)).and_then(|q| q.as_mut()) {
            Some(q) => q.entries.push_back(entry),
            None => crate::engine::log_warn(&format!(
                "a connection event ({}) for an object with no event queue bound",
                entry.event
            )),
        }
    }

    /// A passive endpoint on `port`, else on the first port after the RDM endpoints' that
    /// no other passive endpoint has.
    pub fn pep_open(&self, port: Option<u16>, fid: u64) -> usize {
        let mut st = self.lock();
        let port = port.unwrap_or_else(|| {
            let used: Vec<u16> = st.peps.iter().flatten().map(|p| p.port).collect();
            let first = self.settings.port + self.settings.endpoints;
            (first..=u16::MAX)
                .find(|p| !used.contains(p))
                .unwrap_or(first)
        });
        put(
            &mut st.peps,
            PepState {
                port,
                eq: None,
                listening: false,
                fid,
            },
        )
    }

    pub fn pep_port(&self, pep: usize) -> Option<u16> {
        self.lock().peps.get(pep)?.as_ref().map(|p| p.port)
    }

    pub fn pep_bind_eq(&self, pep: usize, eq: usize) -> Result<(), i32> {
        let mut st = self.lock();
        slot(&st.eqs, eq)?;
        let p = slot_mut(&mut st.peps, pep)?;
        p.eq = Some(eq);
        Ok(())
    }

    pub fn pep_listen(&self, pep: usize) -> Result<(), String> {
        let port = {
            let st = self.lock();
            let p = st
                .peps
                .get(pep)
                .and_then(|p| p.as_ref())
                .ok_or("no such endpoint")?;
            if p.eq.is_none() {
                return Err("no event queue bound (fi_pep_bind with an EQ first)".into());
            }
            p.port
        };
        self.handle
            .listen(port)
            .map_err(|e| format!("listening on rdma_cm port {port}: {e}"))?;
        if let Some(Some(p)) = self.lock().peps.get_mut(pep) {
            p.listening = true;
        }
        Ok(())
    }

    pub fn pep_close(&self, pep: usize) {
        let port = {
            let mut st = self.lock();
            let Some(slot) = st.peps.get_mut(pep) else {
                return;
            };
            let port = slot.as_ref().filter(|p| p.listening).map(|p| p.port);
            *slot = None;
            port
        };
        if let Some(port) = port {
            let _ = self.handle.cm(portico::rdma::cm::CmControl::Unlisten(port));
        }
    }

    pub fn reject(&self, id: u32, data: &[u8]) -> Result<(), i32> {
        self.handle
            .reject(id, &wrap(data)?)
            .map_err(|_| err::EINVAL)
    }

    /// A message endpoint (for `connreq`, the request it will accept).
    pub fn msg_ep_open(&self, tx_op_flags: u64, rx_op_flags: u64, connreq: Option<u32>) -> usize {
        put(
            &mut self.lock().eps,
            EpState {
                index: u16::MAX,
                tx_op_flags,
                rx_op_flags,
                msg: true,
                connreq,
                ..EpState::default()
            },
        )
    }

    pub fn ep_set_fid(&self, ep: usize, fid: u64) {
        if let Some(Some(e)) = self.lock().eps.get_mut(ep) {
            e.fid = fid;
        }
    }

    pub fn ep_bind_eq(&self, ep: usize, eq: usize) -> Result<(), i32> {
        let mut st = self.lock();
        slot(&st.eqs, eq)?;
        let e = slot_mut(&mut st.eps, ep)?;
        e.eq = Some(eq);
        Ok(())
    }

    /// `fi_connect`: a REQ to `dest` with `data`.
    pub fn ep_connect(&self, ep: usize, dest: EpAddr, data: &[u8]) -> Result<(), i32> {
        let data = wrap(data)?;
        // The state stays locked across the CM call: the CM thread's event for this
        // connection must find it in `msg_conns`.
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?;
        if !e.msg {
            return Err(err::EINVAL);
        }
        if e.conn.is_some() {
            return Err(err::EISCONN);
        }
        let id = self
            .handle
            .connect_with(dest.ip, dest.port, &data, QpTweak::tagged(false))
            .map_err(|e| {
                crate::engine::log_warn(&format!("fi_connect to {}: {e}", dest.to_text()));
                err::EINVAL
            })?;
        if let Some(Some(e)) = st.eps.get_mut(ep) {
            e.conn = Some(id);
        }
        st.msg_conns.insert(id, ep);
        Ok(())
    }

    /// `fi_accept`: the REP for the request the endpoint was opened for.
    pub fn ep_accept(&self, ep: usize, data: &[u8]) -> Result<(), i32> {
        let data = wrap(data)?;
        // Locked across the CM call, the connection known first: the RTU (and so the CM
        // thread's Established event) may come before the call returns.
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?;
        if e.conn.is_some() {
            return Err(err::EISCONN);
        }
        let id = e.connreq.ok_or(err::EINVAL)?;
        st.msg_conns.insert(id, ep);
        let qp = match self.handle.accept_with(id, &data, QpTweak::tagged(false)) {
            Ok(qp) => qp,
            Err(e) => {
                st.msg_conns.remove(&id);
                crate::engine::log_warn(&format!("fi_accept of request {id}: {e}"));
                return Err(err::EINVAL);
            }
        };
        if let Some(Some(e)) = st.eps.get_mut(ep) {
            e.conn = Some(id);
        }
        Self::attach_qp(&mut st, ep, qp);
        Ok(())
    }

    /// `fi_shutdown`: a DREQ; `FI_SHUTDOWN` follows when the peer answers.
    pub fn ep_shutdown(&self, ep: usize) -> Result<(), i32> {
        let id = {
            let st = self.lock();
            st.eps
                .get(ep)
                .and_then(|e| e.as_ref())
                .and_then(|e| e.conn)
                .ok_or(err::ENOTCONN)?
        };
        self.handle.disconnect(id).map_err(|_| err::ENOTCONN)
    }

    /// A message endpoint closes: its connection ends (the peer gets `FI_SHUTDOWN`).
    pub(crate) fn msg_ep_closed(&self, ep: usize, conn: Option<u32>) {
        let mut st = self.lock();
        st.msg_qps.remove(&ep);
        st.pending_recvs.remove(&ep);
        if let Some(id) = conn {
            st.msg_conns.remove(&id);
            drop(st);
            let _ = self.handle.disconnect(id);
        }
    }

    fn attach_qp(st: &mut crate::engine::State, ep: usize, mut qp: portico::rdma::Qp) {
        if let Some(pending) = st.pending_recvs.remove(&ep) {
            // Receives posted before the connection was up go on its queue pair now, in order.
            let _ = qp.post_recv(&pending);
        }
        st.msg_qps.insert(ep, qp);
    }

    /// `fi_recv` on a message endpoint: a receive on its queue pair (held until the
    /// connection is up).
    pub(crate) fn msg_recv(
        &self,
        ep: usize,
        buf: u64,
        len: usize,
        lkey: Option<u32>,
        context: u64,
        op_flags: u64,
    ) -> Result<(), i32> {
        let mut st = self.lock();
        let e = slot(&st.eps, ep)?.clone();
        let wants = !e.rx_selective
            || op_flags & flags::COMPLETION != 0
            || e.rx_op_flags & flags::COMPLETION != 0;
        let id = Self::new_op(
            &mut st,
            Op {
                context,
                cq: if wants { e.rx_cq } else { None },
                flags: flags::RECV | flags::MSG,
                buf,
                len: len as u64,
                inject: None,
                temp: None,
                bounce: None,
                peek: crate::engine::Peek::No,
                lpe: None,
            },
        );
        let (k, a) = self.local(lkey, buf, len);
        let r = RecvRequest::new(id as u64, SgList::one(k, a, len as u32));
        match st.msg_qps.get_mut(&ep) {
            Some(qp) => {
                if qp.post_recv(&[r]).is_err() {
                    Self::take_op(&mut st, id);
                    return Err(err::EAGAIN);
                }
            }
            None => st.pending_recvs.entry(ep).or_default().push(r),
        }
        Ok(())
    }

    /// Takes the CM events of message endpoints and passive endpoints; gives back the others.
    pub(crate) fn msg_cm_event(&self, ev: ConnEvent) -> Option<ConnEvent> {
        match ev {
            ConnEvent::Request(req) => {
                let pep = {
                    let st = self.lock();
                    st.peps
                        .iter()
                        .flatten()
                        .find(|p| p.listening && p.port == req.port)
                        .map(|p| (p.eq, p.fid))
                };
                let Some((eq, fid)) = pep else {
                    return Some(ConnEvent::Request(req));
                };
                let connreq = ConnReq {
                    id: req.id,
                    local: EpAddr {
                        ip: self.settings.ip,
                        port: req.port,
                        index: 0,
                    },
                    peer: EpAddr {
                        ip: req.peer.ip,
                        port: req.peer_port,
                        index: 0,
                    },
                };
                self.push_event(
                    eq,
                    EqEntry {
                        event: CONNREQ,
                        fid,
                        connreq: Some(connreq),
                        data: unwrap(&req.private_data),
                        error: None,
                    },
                );
                None
            }
            ConnEvent::Established {
                id,
                qp,
                private_data,
            } => {
                let (ep, eq, fid) = {
                    let mut st = self.lock();
                    let Some(&ep) = st.msg_conns.get(&id) else {
                        drop(st);
                        return Some(ConnEvent::Established {
                            id,
                            qp,
                            private_data,
                        });
                    };
                    if let Some(qp) = qp {
                        Self::attach_qp(&mut st, ep, qp);
                    }
                    let e = st.eps.get(ep).and_then(|e| e.as_ref());
                    (ep, e.and_then(|e| e.eq), e.map_or(0, |e| e.fid))
                };
                let _ = ep;
                self.push_event(
                    eq,
                    EqEntry {
                        event: CONNECTED,
                        fid,
                        connreq: None,
                        data: unwrap(&private_data),
                        error: None,
                    },
                );
                None
            }
            ConnEvent::Rejected {
                id, private_data, ..
            } => self.msg_failed(
                id,
                err::ECONNREFUSED,
                unwrap(&private_data),
                ConnEvent::Rejected {
                    id,
                    reason: 0,
                    private_data: Vec::new(),
                },
            ),
            ConnEvent::TimedOut { id } => {
                self.msg_failed(id, err::ETIMEDOUT, Vec::new(), ConnEvent::TimedOut { id })
            }
            ConnEvent::Unreachable { id } => self.msg_failed(
                id,
                err::EHOSTUNREACH,
                Vec::new(),
                ConnEvent::Unreachable { id },
            ),
            ConnEvent::Disconnected { id } => {
                let found = {
                    let mut st = self.lock();
                    match st.msg_conns.remove(&id) {
                        Some(ep) => {
                            st.msg_qps.remove(&ep);
                            let e = st.eps.get_mut(ep).and_then(|e| e.as_mut());
                            Some(e.map_or((None, 0), |e| {
                                e.conn = None;
                                (e.eq, e.fid)
                            }))
                        }
                        None => None,
                    }
                };
                let Some((eq, fid)) = found else {
                    return Some(ConnEvent::Disconnected { id });
                };
                self.push_event(
                    eq,
                    EqEntry {
                        event: SHUTDOWN,
                        fid,
                        connreq: None,
                        data: Vec::new(),
                        error: None,
                    },
                );
                None
            }
        }
    }

    /// A message endpoint's connection failed: an error entry on its event queue. `other`
    /// is the event handed back when the connection is not a message endpoint's.
    fn msg_failed(&self, id: u32, e: i32, data: Vec<u8>, other: ConnEvent) -> Option<ConnEvent> {
        let found = {
            let mut st = self.lock();
            st.msg_conns.remove(&id).map(|ep| {
                let e = st.eps.get_mut(ep).and_then(|e| e.as_mut());
                e.map_or((None, 0), |e| {
                    e.conn = None;
                    (e.eq, e.fid)
                })
            })
        };
        let Some((eq, fid)) = found else {
            return Some(other);
        };
        self.push_event(
            eq,
            EqEntry {
                event: CONNECTED,
                fid,
                connreq: None,
                data,
                error: Some(e),
            },
        );
        None
    }

    /// This engine's address as a message endpoint's name (`fi_getname`): its IP and no port.
    pub fn msg_name(&self) -> EpAddr {
        EpAddr {
            ip: self.settings.ip,
            port: 0,
            index: 0,
        }
    }

    /// The address of passive endpoint `pep`.
    pub fn pep_name(&self, pep: usize) -> Option<EpAddr> {
        Some(EpAddr {
            ip: self.settings.ip,
            port: self.pep_port(pep)?,
            index: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_data_keeps_its_length_across_the_fixed_size_field() {
        let w = wrap(b"rxm").unwrap();
        assert_eq!(w, [3, b'r', b'x', b'm']);
        // The REQ's field is zero-padded to 56 bytes on the wire.
        let mut padded = w.clone();
        padded.resize(56, 0);
        assert_eq!(unwrap(&padded), b"rxm");
        assert_eq!(unwrap(&[0; 56]), b"", "a peer that sent nothing");
        assert_eq!(unwrap(&[]), b"");
        assert_eq!(unwrap(&[9, 1, 2]), [1, 2], "a length past the field is cut");
        assert!(wrap(&[0; CM_DATA_MAX]).is_ok());
        assert_eq!(wrap(&[0; CM_DATA_MAX + 1]), Err(err::EINVAL));
    }
}
