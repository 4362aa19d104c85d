//! One RDMA engine's state, driven with frames: pure, so it runs the same on mbufs and on
//! plain buffers.

use std::net::Ipv4Addr;

use serde::Serialize;

use super::{Command, Event};
use crate::transport::{CompletionQueue, MemoryTable, OutPacket, QpConfig, QueuePair};
use crate::wire::{self, EthernetAddress};

/// What one received frame did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// A RoCEv2 packet for one of our QPs, handed to it.
    Delivered,
    /// An ARP request for our address; the reply is `len` bytes of `arp_reply()`.
    ArpReply(usize),
    /// Dropped (and counted).
    Dropped,
}

/// What a node counts, besides its QPs' own statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NodeCounters {
    pub rx_frames: u64,
    pub delivered: u64,
    pub icrc_errors: u64,
    /// RoCEv2 frames that failed another check (length, checksum, opcode, ...).
    pub malformed: u64,
    /// Frames that are not RoCEv2 or ARP for us (other protocols, other addresses).
    pub not_for_us: u64,
    pub unknown_qp: u64,
    pub arp_replies: u64,
    pub tx_packets: u64,
}

/// An RDMA engine: address, memory, queue pairs, completions.
pub struct RdmaNode {
    pub mac: EthernetAddress,
    pub ip: Ipv4Addr,
    pub mem: MemoryTable,
    qps: Vec<QueuePair>,
    pub cq: CompletionQueue,
    pub counters: NodeCounters,
    arp: [u8; 64],
    next_qp: usize,
}

impl RdmaNode {
    pub fn new(mac: EthernetAddress, ip: Ipv4Addr, cq_depth: usize) -> Self {
        RdmaNode {
            mac,
            ip,
            mem: MemoryTable::new(),
            qps: Vec::new(),
            cq: CompletionQueue::new(cq_depth),
            counters: NodeCounters::default(),
            arp: [0; 64],
            next_qp: 0,
        }
    }

    /// Adds a queue pair; its local MAC and IP are this node's.
    pub fn add_qp(&mut self, mut cfg: QpConfig) -> Result<u32, crate::transport::ConfigError> {
        cfg.local_mac = self.mac;
        cfg.local_ip = self.ip;
        let qpn = cfg.local_qpn;
        self.qps.push(QueuePair::new(cfg)?);
        Ok(qpn)
    }

    pub fn qp(&self, qpn: u32) -> Option<&QueuePair> {
        self.qps.iter().find(|q| q.config().local_qpn == qpn)
    }

    fn qp_index(&self, qpn: u32) -> Option<usize> {
        self.qps.iter().position(|q| q.config().local_qpn == qpn)
    }

    pub fn qps(&self) -> &[QueuePair] {
        &self.qps
    }

    /// The ARP reply written by the last [`RxOutcome::ArpReply`].
    pub fn arp_reply(&self, len: usize) -> &[u8] {
        &self.arp[..len]
    }

    /// Handles one received frame.
    pub fn receive(&mut self, now: u64, frame: &[u8]) -> RxOutcome {
        self.counters.rx_frames += 1;
        if let Some(len) = wire::arp::answer(frame, self.mac, self.ip, &mut self.arp) {
            self.counters.arp_replies += 1;
            return RxOutcome::ArpReply(len);
        }
        match wire::parse_frame(frame) {
            Ok((repr, payload)) => {
                if repr.ip.dst_addr != self.ip {
                    self.counters.not_for_us += 1;
                    return RxOutcome::Dropped;
                }
                let Some(i) = self.qp_index(repr.bth.dest_qp) else {
                    self.counters.unknown_qp += 1;
                    return RxOutcome::Dropped;
                };
                self.qps[i].on_packet(now, &repr, payload, &mut self.mem, &mut self.cq);
                self.counters.delivered += 1;
                RxOutcome::Delivered
            }
            Err(wire::Error::BadIcrc { .. }) => {
                self.counters.icrc_errors += 1;
                RxOutcome::Dropped
            }
            Err(wire::Error::NotRoce { .. }) => {
                self.counters.not_for_us += 1;
                RxOutcome::Dropped
            }
            Err(_) => {
                self.counters.malformed += 1;
                RxOutcome::Dropped
            }
        }
    }

    /// Runs expired timers of every QP.
    pub fn run_timers(&mut self, now: u64) {
        for qp in &mut self.qps {
            if qp.next_deadline().is_some_and(|d| d <= now) {
                qp.on_timer(now, &mut self.cq);
            }
        }
    }

    /// The next packet any QP wants to send, QPs served round robin.
    pub fn poll_transmit(&mut self, now: u64) -> Option<OutPacket> {
        let n = self.qps.len();
        for k in 0..n {
            let i = (self.next_qp + k) % n;
            if let Some(p) = self.qps[i].poll_transmit(now) {
                self.next_qp = (i + 1) % n;
                self.counters.tx_packets += 1;
                return Some(p);
            }
        }
        None
    }

    /// Carries out a host command; refused posts are reported through `events`.
    pub fn apply(&mut self, cmd: Command, events: &mut impl FnMut(Event)) {
        match cmd {
            Command::Register {
                addr,
                len,
                access,
                reply,
            } => {
                let _ = reply.send(self.mem.register(addr, len, access));
            }
            Command::Write {
                lkey,
                offset,
                data,
                reply,
            } => {
                let ok = match self.mem.region_mut(lkey) {
                    Some(r)
                        if offset
                            .checked_add(data.len())
                            .is_some_and(|end| end <= r.len()) =>
                    {
                        r[offset..offset + data.len()].copy_from_slice(&data);
                        true
                    }
                    _ => false,
                };
                let _ = reply.send(ok);
            }
            Command::Read {
                lkey,
                offset,
                len,
                reply,
            } => {
                let data = self
                    .mem
                    .region(lkey)
                    .and_then(|r| r.get(offset..offset.checked_add(len)?))
                    .map(<[u8]>::to_vec);
                let _ = reply.send(data);
            }
            Command::PostSend { qpn, wr } => {
                let ok = match self.qp_index(qpn) {
                    Some(i) => self.qps[i].post_send(wr, &self.mem, &mut self.cq).is_ok(),
                    None => false,
                };
                if !ok {
                    events(Event::PostRefused {
                        qpn,
                        wr_id: wr.wr_id,
                    });
                }
            }
            Command::PostRecv { qpn, wr } => {
                let ok = match self.qp_index(qpn) {
                    Some(i) => self.qps[i].post_recv(wr, &self.mem, &mut self.cq).is_ok(),
                    None => false,
                };
                if !ok {
                    events(Event::PostRefused {
                        qpn,
                        wr_id: wr.wr_id,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Access, RecvRequest, WcOpcode, WcStatus, WorkRequest, WrKind};

    fn pair() -> (RdmaNode, RdmaNode) {
        let mut a = RdmaNode::new(
            EthernetAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Addr::new(10, 9, 0, 1),
            256,
        );
        let mut b = RdmaNode::new(
            EthernetAddress([2, 0, 0, 0, 0, 2]),
            Ipv4Addr::new(10, 9, 0, 2),
            256,
        );
        let mut cfg = QpConfig::new(0x11, 0x22);
        cfg.remote_mac = b.mac;
        cfg.remote_ip = b.ip;
        let mut peer = cfg.mirrored();
        peer.remote_mac = a.mac;
        peer.remote_ip = a.ip;
        a.add_qp(cfg).unwrap();
        b.add_qp(peer).unwrap();
        (a, b)
    }

    /// Sends everything `src` has to `dst`, corrupting every `corrupt_every`-th frame.
    fn carry(
        src: &mut RdmaNode,
        dst: &mut RdmaNode,
        now: u64,
        corrupt_every: usize,
        moved: &mut usize,
    ) -> bool {
        let mut frame = vec![0u8; 9000];
        let mut any = false;
        while let Some(p) = src.poll_transmit(now) {
            let len = p.emit(&src.mem, &mut frame).unwrap();
            *moved += 1;
            if corrupt_every > 0 && (*moved).is_multiple_of(corrupt_every) {
                frame[len - 1] ^= 1;
            }
            dst.receive(now, &frame[..len]);
            any = true;
        }
        any
    }

    /// Moves frames both ways until both nodes are quiet; time advances 1 µs per round.
    fn pump(a: &mut RdmaNode, b: &mut RdmaNode, corrupt_every: usize) -> usize {
        let mut moved = 0;
        for round in 0..100_000u64 {
            let now = round * 1000;
            let ab = carry(a, b, now, corrupt_every, &mut moved);
            let ba = carry(b, a, now, corrupt_every, &mut moved);
            a.run_timers(now);
            b.run_timers(now);
            let idle =
                a.qps()[0].requester().in_flight() == 0 && b.qps()[0].requester().in_flight() == 0;
            if !ab && !ba && idle {
                break;
            }
        }
        moved
    }

    #[test]
    fn write_and_send_between_two_nodes_land_byte_for_byte() {
        let (mut a, mut b) = pair();
        let src = a.mem.register(0x1000, 10_000, Access::ALL);
        let dst = b.mem.register(0x8000, 10_000, Access::ALL);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 256) as u8).collect();
        a.mem.region_mut(src.lkey).unwrap().copy_from_slice(&data);
        let mut refused = Vec::new();
        a.apply(
            Command::PostSend {
                qpn: 0x11,
                wr: WorkRequest {
                    wr_id: 1,
                    kind: WrKind::Write {
                        remote_addr: 0x8000,
                        rkey: dst.rkey,
                        imm: None,
                    },
                    lkey: src.lkey,
                    local_addr: 0x1000,
                    len: 10_000,
                },
            },
            &mut |e| refused.push(e),
        );
        b.apply(
            Command::PostRecv {
                qpn: 0x22,
                wr: RecvRequest {
                    wr_id: 9,
                    lkey: dst.lkey,
                    addr: 0x8000,
                    len: 100,
                },
            },
            &mut |e| refused.push(e),
        );
        a.apply(
            Command::PostSend {
                qpn: 0x11,
                wr: WorkRequest {
                    wr_id: 2,
                    kind: WrKind::Send { imm: Some(5) },
                    lkey: src.lkey,
                    local_addr: 0x1000,
                    len: 100,
                },
            },
            &mut |e| refused.push(e),
        );
        assert!(refused.is_empty());
        let moved = pump(&mut a, &mut b, 5);
        assert!(moved > 11, "{moved} frames");
        assert_eq!(
            b.mem.region(dst.lkey).unwrap()[..10_000],
            data[..],
            "WRITE landed, then SEND overwrote the first 100 bytes with the same data"
        );
        let wcs: Vec<_> = std::iter::from_fn(|| a.cq.poll()).collect();
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success), (2, WcStatus::Success)]
        );
        let recv = b.cq.poll().unwrap();
        assert_eq!(
            (recv.wr_id, recv.opcode, recv.byte_len, recv.imm_data),
            (9, WcOpcode::Recv, 100, Some(5))
        );
        assert!(
            a.counters.icrc_errors + b.counters.icrc_errors > 0,
            "every 5th frame was corrupted, and recovered from"
        );
    }

    #[test]
    fn multi_packet_reads_need_no_retransmission_on_a_clean_wire() {
        let (mut a, mut b) = pair();
        let dst = a.mem.register(0x1000, 1 << 20, Access::ALL);
        let src = b.mem.register(0x8000_0000, 1 << 20, Access::ALL);
        let mut refused = Vec::new();
        for i in 0..16u64 {
            a.apply(
                Command::PostSend {
                    qpn: 0x11,
                    wr: WorkRequest {
                        wr_id: i,
                        kind: WrKind::Read {
                            remote_addr: 0x8000_0000 + i * 16384,
                            rkey: src.rkey,
                        },
                        lkey: dst.lkey,
                        local_addr: 0x1000 + i * 16384,
                        len: 16384,
                    },
                },
                &mut |e| refused.push(e),
            );
        }
        pump(&mut a, &mut b, 0);
        let wcs: Vec<_> = std::iter::from_fn(|| a.cq.poll()).collect();
        assert_eq!(wcs.len(), 16);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(
            a.qps()[0].stats().retransmissions,
            0,
            "{:?}",
            a.qps()[0].stats()
        );
    }

    #[test]
    fn arp_and_strangers_are_handled_and_counted() {
        let (mut a, _) = pair();
        #[rustfmt::skip]
        let request: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 9, 0x08, 0x06,
            0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 9, 0, 9,
            0, 0, 0, 0, 0, 0, 10, 9, 0, 1,
        ];
        let RxOutcome::ArpReply(n) = a.receive(0, &request) else {
            panic!("no ARP reply")
        };
        assert_eq!(&a.arp_reply(n)[..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(a.receive(0, &[0u8; 3]), RxOutcome::Dropped);
        assert_eq!(a.receive(0, &request[..30]), RxOutcome::Dropped);
        assert_eq!(a.counters.arp_replies, 1);
        assert_eq!(a.counters.rx_frames, 3);
        assert_eq!(a.counters.malformed + a.counters.not_for_us, 2);
    }
}
