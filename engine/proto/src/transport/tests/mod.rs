//! Tests of the RC transport through a simulated wire: scenario tests for
//! each protocol behaviour, a bounded soak with random faults, and a
//! property test over random work-request sequences.

mod congestion;
mod harness;
mod persistence;
mod prop;
mod rto;
mod scenarios;
mod shaping;
mod soak;

use super::{Access, MrKeys, QpConfig, SgList, WorkRequest};
use harness::{Faults, Sim};

/// Virtual address of the test region on endpoint A and on endpoint B.
const A_BASE: u64 = 0x1000_0000;
const B_BASE: u64 = 0x2000_0000;

/// A bench with one `len`-byte region (all access) on each side.
fn pair(cfg: QpConfig, faults: Faults, seed: u64, len: usize) -> (Sim, MrKeys, MrKeys) {
    let mut sim = Sim::new(cfg, faults, seed);
    let a = sim.a.register(A_BASE, len, Access::ALL);
    let b = sim.b.register(B_BASE, len, Access::ALL);
    (sim, a, b)
}

fn send(wr_id: u64, lkey: u32, addr: u64, len: u32, imm: Option<u32>) -> WorkRequest {
    WorkRequest::send(wr_id, SgList::one(lkey, addr, len), imm)
}

fn write(
    wr_id: u64,
    lkey: u32,
    addr: u64,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    imm: Option<u32>,
) -> WorkRequest {
    WorkRequest::write(wr_id, SgList::one(lkey, addr, len), remote_addr, rkey, imm)
}

fn read(wr_id: u64, lkey: u32, addr: u64, len: u32, remote_addr: u64, rkey: u32) -> WorkRequest {
    WorkRequest::read(wr_id, SgList::one(lkey, addr, len), remote_addr, rkey)
}

/// Deterministic test bytes for operation `id`.
fn pattern(id: u64, len: usize) -> Vec<u8> {
    let mut rng = harness::Rng::new(id.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5555);
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

#[test]
fn an_mtu_is_one_of_the_five_ibta_sizes_and_nothing_else() {
    use super::{BadMtu, Mtu};
    for mtu in [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096] {
        assert_eq!(Mtu::try_from(mtu.bytes()), Ok(mtu));
    }
    for bytes in [0, 1, 255, 257, 1500, 8192, u32::MAX] {
        assert_eq!(Mtu::try_from(bytes), Err(BadMtu(bytes)));
    }
    assert_eq!(
        BadMtu(1500).to_string(),
        "1500 is not 256, 512, 1024, 2048 or 4096"
    );
}

/// The IBTA's MTU codes (the CM's `path_mtu`): 1..=5 for 256..=4096 bytes, nothing else.
#[test]
fn mtu_codes_are_the_ibta_s() {
    use super::Mtu;
    let all = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096];
    for (code, m) in (1u8..).zip(all) {
        assert_eq!(m.code(), code);
        assert_eq!(Mtu::from_code(code), Some(m));
    }
    for code in [0u8, 6, 7, 15, 255] {
        assert_eq!(Mtu::from_code(code), None, "{code}");
    }
}

/// A packet's fields in its template's flow are the headers the config gives that packet
/// (`QueuePair::packet_repr`, and what the template writes).
#[test]
fn a_packet_in_its_template_s_flow_has_the_config_s_header_for_every_opcode() {
    use wire::{EthernetAddress, Opcode};
    let mut cfg = QpConfig::new(0x12, 0x345);
    cfg.local_mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
    cfg.remote_mac = EthernetAddress([2, 0, 0, 0, 0, 2]);
    cfg.local_ip = core::net::Ipv4Addr::new(10, 1, 2, 3);
    cfg.remote_ip = core::net::Ipv4Addr::new(10, 1, 2, 4);
    cfg.dscp = 26;
    cfg.ttl = 17;
    cfg.udp_src_port = 0xc0de;
    cfg.pkey = 0x8123;
    // The flow a queue pair's packets are written in: its template's.
    let template =
        wire::template::HeaderTemplate::new(&cfg.header(Opcode::SendOnly, 0, false)).unwrap();
    let flow = template.flow();
    for opcode in Opcode::ALL {
        for psn in [0, 1, 0x7f_ffff, 0xff_ffff] {
            for ack_req in [false, true] {
                assert_eq!(
                    wire::PacketFields::new(opcode, psn, ack_req).with_flow(flow),
                    cfg.header(opcode, psn, ack_req),
                    "{opcode:?} {psn:#x} {ack_req}"
                );
            }
        }
    }
}
