//! Fixtures for tests of the engine and of the crates above it: two nodes joined by a
//! simulated wire (frames carried in memory, time advanced by the test). Built for this
//! crate's tests and, with the `testing` feature, for other crates' (`portico` enables it
//! as a dev-dependency only).

use std::net::Ipv4Addr;

use proto::shaper::ShaperConfig;
use proto::transport::QpConfig;
use wire::EthernetAddress;

use crate::{Cq, Qp, RdmaNode};

/// One node with its queue pair to the other and their completion queue.
pub struct End {
    pub node: RdmaNode,
    pub qp: Qp,
    pub cq: Cq,
}

pub fn pair() -> (End, End) {
    pair_with_cq(256)
}

pub fn pair_with_cq(depth_a: usize) -> (End, End) {
    pair_with(depth_a, |_| {})
}

/// Node A (02:00:00:00:00:01, 10.9.0.1, QPN 0x11) and node B (…:02, 10.9.0.2, QPN 0x22),
/// one queue pair each, connected to each other; `tune` adjusts A's queue pair (B's
/// mirrors it). A's completion queue holds `depth_a` entries, B's 256.
pub fn pair_with(depth_a: usize, tune: impl FnOnce(&mut QpConfig)) -> (End, End) {
    pair_shaped(depth_a, None, tune)
}

/// [`pair_with`], with A's requests under a traffic shaper.
pub fn pair_shaped(
    depth_a: usize,
    shaper: Option<ShaperConfig>,
    tune: impl FnOnce(&mut QpConfig),
) -> (End, End) {
    let mut a = RdmaNode::new(
        EthernetAddress([2, 0, 0, 0, 0, 1]),
        Ipv4Addr::new(10, 9, 0, 1),
    );
    if let Some(cfg) = shaper {
        a.set_shaper(cfg).unwrap();
    }
    let mut b = RdmaNode::new(
        EthernetAddress([2, 0, 0, 0, 0, 2]),
        Ipv4Addr::new(10, 9, 0, 2),
    );
    let mut cfg = QpConfig::new(0x11, 0x22);
    cfg.remote_mac = b.mac;
    cfg.remote_ip = b.ip;
    tune(&mut cfg);
    let mut peer = cfg.mirrored();
    peer.remote_mac = a.mac;
    peer.remote_ip = a.ip;
    let cq_a = a.create_cq(depth_a);
    let cq_b = b.create_cq(256);
    let qp_a = a.add_qp(cfg, &cq_a, &cq_a).unwrap();
    let qp_b = b.add_qp(peer, &cq_b, &cq_b).unwrap();
    (
        End {
            node: a,
            qp: qp_a,
            cq: cq_a,
        },
        End {
            node: b,
            qp: qp_b,
            cq: cq_b,
        },
    )
}

/// Sends everything `src` has to `dst`, corrupting every `corrupt_every`-th frame.
pub fn carry(
    src: &mut RdmaNode,
    dst: &mut RdmaNode,
    now: u64,
    corrupt_every: usize,
    moved: &mut usize,
) -> bool {
    let mut frame = vec![0u8; 9000];
    let mut any = false;
    src.service(now);
    while let Some(tx) = src.poll_transmit(now) {
        let len = src.emit(&tx, &mut frame).unwrap();
        *moved += 1;
        if corrupt_every > 0 && (*moved).is_multiple_of(corrupt_every) {
            frame[len - 1] ^= 1;
        }
        dst.receive(now, &frame[..len]);
        any = true;
    }
    src.flush_completions();
    dst.flush_completions();
    // As a worker's iteration ends: the tag events made are shown to the host.
    src.publish_tag_events();
    dst.publish_tag_events();
    any
}

/// Moves frames both ways until both nodes are quiet; time advances 1 µs per round.
pub fn pump(a: &mut RdmaNode, b: &mut RdmaNode, corrupt_every: usize) -> usize {
    let mut moved = 0;
    for round in 0..100_000u64 {
        let now = round * 1000;
        let ab = carry(a, b, now, corrupt_every, &mut moved);
        let ba = carry(b, a, now, corrupt_every, &mut moved);
        let idle = a.qp(0x11).unwrap().requester().in_flight() == 0
            && b.qp(0x22).unwrap().requester().in_flight() == 0;
        if !ab && !ba && idle && round > 2 {
            break;
        }
    }
    moved
}
