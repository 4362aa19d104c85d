//! Seed inputs for the fuzz targets, from a Portico capture (pcapng, as `--pcap` writes it)
//! and from conversations with a second engine.
//!
//! ```sh
//! # From a capture: OUT_DIR/rdma_node/NAME-NN and OUT_DIR/parse_roce/NAME-NN.
//! cargo run --release --example seed_corpus -- capture CAPTURE.pcapng OUT_DIR NAME [INPUTS] [FRAMES]
//! # Conversations: OUT_DIR/rdma_node/conversation-SCENARIO.
//! cargo run --release --example seed_corpus -- conversations OUT_DIR
//! # FLUSH at DMA length 0: OUT_DIR/rdma_node/flush-zero-length-NN, OUT_DIR/parse_roce/...
//! cargo run --release --example seed_corpus -- flush OUT_DIR
//! ```
//!
//! **From a capture.** For `rdma_node`: INPUTS (24) windows of FRAMES (12) consecutive frames,
//! spread over the capture, each starting at the first packet of a request. Every RoCEv2 frame
//! is rewritten so that it reaches the harness's queue pair and regions (`src/rdma_node.rs`):
//! destination MAC and IP the node's, source the peer's, destination QPN the node's first
//! queue pair, PSNs counted from 0 in each direction of the window, and a RETH's rkey and
//! virtual address naming R1. The headers are emitted again (`RoceRepr::emit`), so lengths,
//! checksums and the ICRC are right. ARP frames are kept, addressed to the node. The time
//! between frames comes from the capture's timestamps. For `parse_roce`: the captured frames
//! as they are, the first of each kind (opcode and direction). Only the capture's first
//! interface is read: a frame between two engines appears on both of their ports.
//!
//! **Conversations.** The harness's node talks to a second `RdmaNode` (the peer, with the
//! region and keys the node's requests name) in a few scenarios: application actions on the
//! node, and a link that may lose every n-th frame the node sends. What the peer sends is
//! recorded as the input, so the requester side of the node sees real ACKs, NAKs and READ
//! responses to its own requests from the first execution on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use pmem::Mapping;
use portico::capture;
use portico::rdma::{Cq, RdmaNode};
use portico::transport::{Access, MemoryTable, QpConfig, RecvRequest, SgList};
use portico::wire::{self, EtherType, EthernetAddress, Opcode, RoceRepr, ethernet};
use portico_fuzz::rdma_node::{
    Harness, NODE_IP, NODE_MAC, PEER_ADDR, PEER_IP, PEER_KEY_SEED, PEER_MAC, QPS, R1_IOVA,
    REGION_LEN, Record, dt_code, peer_rkey, run,
};

const USAGE: &str = "usage: seed_corpus capture CAPTURE.pcapng OUT_DIR NAME [INPUTS] [FRAMES]\n       seed_corpus conversations OUT_DIR\n       seed_corpus flush OUT_DIR\n       seed_corpus cm OUT_DIR";

/// Inputs larger than this are not written whole (scripts/fuzz.sh runs with -max_len=8192).
const MAX_INPUT: usize = 8000;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("capture") if (4..=6).contains(&args.len()) => {
            let number = |i: usize, default: usize| -> Result<usize, String> {
                args.get(i).map_or(Ok(default), |s| {
                    s.parse()
                        .map_err(|_| format!("argument {}: not a number: {s}", i + 1))
                })
            };
            number(4, 24).and_then(|inputs| {
                number(5, 12).and_then(|frames| {
                    from_capture(
                        Path::new(&args[1]),
                        Path::new(&args[2]),
                        &args[3],
                        inputs,
                        frames,
                    )
                })
            })
        }
        Some("conversations") if args.len() == 2 => conversations(Path::new(&args[1])),
        Some("flush") if args.len() == 2 => flush(Path::new(&args[1])),
        Some("cm") if args.len() == 2 => cm(Path::new(&args[1])),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seed_corpus: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A frame of the capture, sorted into what the harness makes of it.
struct Frame {
    ts_ns: u64,
    kind: Kind,
}

enum Kind {
    /// A RoCEv2 packet, parsed.
    Roce { repr: RoceRepr, payload: Vec<u8> },
    /// An ARP frame (or anything else), kept as it is apart from its addresses.
    Other(Vec<u8>),
}

fn from_capture(
    capture: &Path,
    out: &Path,
    name: &str,
    inputs: usize,
    frames: usize,
) -> Result<(), String> {
    let bytes = std::fs::read(capture).map_err(|e| format!("{}: {e}", capture.display()))?;
    let (_, records) = capture::read(&bytes).map_err(|e| format!("{}: {e}", capture.display()))?;
    let records: Vec<_> = records
        .into_iter()
        .filter(|r| r.interface == 0 && r.data.len() == r.original_len as usize)
        .collect();

    let mut kinds = BTreeMap::new();
    for r in &records {
        let kind = match wire::parse_frame(&r.data) {
            Ok((repr, _)) => format!("{:?}-{:?}", repr.bth.opcode, r.direction),
            Err(_) => format!("other-{:?}", r.direction),
        };
        kinds.entry(kind).or_insert_with(|| r.data.clone());
    }
    let raw: Vec<Vec<u8>> = kinds.into_values().collect();
    write_all(&out.join("parse_roce"), name, &raw)?;

    let parsed: Vec<Frame> = records
        .iter()
        .map(|r| Frame {
            ts_ns: r.ts_ns,
            kind: match wire::parse_frame(&r.data) {
                Ok((repr, payload)) => Kind::Roce {
                    repr,
                    payload: payload.to_vec(),
                },
                Err(_) => Kind::Other(r.data.clone()),
            },
        })
        .collect();
    let starts: Vec<usize> = (0..parsed.len())
        .filter(|&i| {
            matches!(&parsed[i].kind, Kind::Roce { repr, .. } if starts_message(repr.bth.opcode))
        })
        .collect();
    if starts.is_empty() {
        return Err(format!(
            "{}: no request among the first interface's {} frames",
            capture.display(),
            parsed.len()
        ));
    }
    let rkey = Harness::new().r1.rkey;
    let windows: Vec<Vec<u8>> = spread(&starts, inputs)
        .iter()
        .map(|&s| window(&parsed[s..parsed.len().min(s + frames)], rkey))
        .collect::<Result<_, _>>()?;
    for w in &windows {
        run(w);
    }
    write_all(&out.join("rdma_node"), name, &windows)?;
    eprintln!(
        "seed_corpus: {} frames read; {} parse_roce and {} rdma_node inputs written under {}",
        records.len(),
        raw.len(),
        windows.len(),
        out.display()
    );
    Ok(())
}

/// Whether a packet of `opcode` begins a request message (where a window may start).
fn starts_message(opcode: Opcode) -> bool {
    use Opcode::*;
    matches!(
        opcode,
        SendFirst
            | SendOnly
            | SendOnlyWithImmediate
            | RdmaWriteFirst
            | RdmaWriteOnly
            | RdmaWriteOnlyWithImmediate
            | RdmaReadRequest
    )
}

/// `n` of `items`, evenly spread (all of them when there are fewer).
fn spread(items: &[usize], n: usize) -> Vec<usize> {
    if items.len() <= n {
        return items.to_vec();
    }
    (0..n).map(|k| items[k * items.len() / n]).collect()
}

/// One rdma_node input: the frames of `frames`, rewritten, with the time between them.
fn window(frames: &[Frame], rkey: u32) -> Result<Vec<u8>, String> {
    let mut input = Vec::new();
    // The first PSN of each direction, so that each counts from 0 as the harness's do.
    let mut first_request = None;
    let mut first_response = None;
    let mut buf = vec![0u8; 16384];
    for (k, f) in frames.iter().enumerate() {
        let next_ts = frames.get(k + 1).map_or(f.ts_ns, |n| n.ts_ns);
        let dt = dt_code(next_ts.saturating_sub(f.ts_ns));
        let frame = match &f.kind {
            Kind::Roce { repr, payload } => {
                let mut repr = *repr;
                let first = if repr.bth.opcode.is_request() {
                    &mut first_request
                } else {
                    &mut first_response
                };
                let base = *first.get_or_insert(repr.bth.psn);
                repr.bth.psn = repr.bth.psn.wrapping_sub(base) & wire::bth::PSN_MASK;
                repr.bth.dest_qp = QPS[0].0;
                repr.src_mac = PEER_MAC;
                repr.dst_mac = NODE_MAC;
                repr.ip.src_addr = PEER_IP;
                repr.ip.dst_addr = NODE_IP;
                if let Some(reth) = &mut repr.reth {
                    let room = REGION_LEN as u64 - u64::from(reth.dma_len).min(REGION_LEN as u64);
                    reth.rkey = rkey;
                    reth.virtual_addr = R1_IOVA + (reth.virtual_addr % (room + 1)) / 64 * 64;
                }
                let len = repr.emit(&mut buf, payload).map_err(|e| {
                    format!("a captured {:?} does not emit again: {e}", repr.bth.opcode)
                })?;
                buf[..len].to_vec()
            }
            Kind::Other(data) => readdressed(data),
        };
        Record::Frame { dt, frame: &frame }.encode(&mut input);
    }
    Ok(input)
}

/// A non-RoCE frame addressed to the node: Ethernet destination (unless broadcast) and
/// source, and for ARP the sender's addresses and the target IP.
fn readdressed(data: &[u8]) -> Vec<u8> {
    let mut data = data.to_vec();
    let Ok(mut eth) = ethernet::Packet::new_checked(&mut data[..]) else {
        return data;
    };
    if eth.dst_addr() != EthernetAddress([0xff; 6]) {
        eth.set_dst_addr(NODE_MAC);
    }
    eth.set_src_addr(PEER_MAC);
    if eth.ethertype() == EtherType::Arp {
        // ARP over Ethernet/IPv4: sender MAC at 8, sender IP at 14, target IP at 24.
        let arp = eth.payload_mut();
        if arp.len() >= 28 {
            arp[8..14].copy_from_slice(&PEER_MAC.0);
            arp[14..18].copy_from_slice(&PEER_IP.octets());
            arp[24..28].copy_from_slice(&NODE_IP.octets());
        }
    }
    data
}

/// A conversation: application actions (`cmd`, `a`, `b` as in the input format) and how
/// often the link loses a frame the node sends (every n-th; 0: never).
struct Scenario {
    name: &'static str,
    actions: &'static [(u8, u8, u8)],
    lose_every: usize,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "first-requests",
        actions: &[],
        lose_every: 0,
    },
    Scenario {
        name: "first-requests-lossy",
        actions: &[],
        lose_every: 3,
    },
    Scenario {
        // A READ of 2040 bytes on the first queue pair: eight responses at MTU 256.
        name: "read-2k",
        actions: &[(0xc3, 255, 0)],
        lose_every: 0,
    },
    Scenario {
        name: "read-2k-lossy",
        actions: &[(0xc3, 255, 0)],
        lose_every: 4,
    },
    Scenario {
        // SEND with immediate on the second queue pair, WRITE with immediate and a gathered
        // WRITE on the first.
        name: "immediates-and-gather",
        actions: &[(0xc9, 100, 1), (0xc2, 20, 3), (0xc7, 16, 2)],
        lose_every: 0,
    },
    Scenario {
        // More WRITEs than the send queue holds: the host ring fills and drains.
        name: "write-window",
        actions: &[
            (0xc2, 40, 0),
            (0xc2, 40, 2),
            (0xc2, 40, 4),
            (0xc2, 40, 6),
            (0xc2, 40, 8),
            (0xc2, 40, 10),
            (0xc4, 0, 0),
            (0xc2, 40, 12),
        ],
        lose_every: 0,
    },
    Scenario {
        // A READ into R1, then R1 deregistered while it may still be in use.
        name: "read-then-deregister",
        actions: &[(0xc3, 64, 0), (0xc5, 0, 0), (0xc8, 16, 0)],
        lose_every: 0,
    },
    Scenario {
        name: "second-qp-read-lossy",
        actions: &[(0xcb, 200, 8), (0xca, 150, 1)],
        lose_every: 2,
    },
];

/// The peer of a conversation: a second engine with the node's queue pairs mirrored, a
/// region at `PEER_ADDR` under the rkey the node's requests carry, and receives posted.
struct Peer {
    node: RdmaNode,
    cq: Cq,
    tx: Vec<u8>,
}

impl Peer {
    fn new() -> Result<Peer, String> {
        let mut node = RdmaNode::new(PEER_MAC, PEER_IP);
        node.mem = MemoryTable::seeded(PEER_KEY_SEED);
        let cq = node.create_cq(1024);
        let map = Arc::new(Mapping::anonymous(4 * REGION_LEN).map_err(|e| e.to_string())?);
        let keys = node
            .mem
            .register_iova(map, 0, 4 * REGION_LEN, PEER_ADDR, Access::ALL)
            .map_err(|e| e.to_string())?;
        if keys.rkey != peer_rkey() {
            return Err("the peer's rkey is not the one the harness names".into());
        }
        for &(local, remote, pmtu) in &QPS {
            let mut cfg = QpConfig::new(remote, local);
            cfg.remote_mac = NODE_MAC;
            cfg.remote_ip = NODE_IP;
            cfg.send_psn = 0;
            cfg.recv_psn = 0;
            cfg.pmtu = pmtu;
            let mut qp = node
                .add_qp(cfg, &cq, &cq)
                .map_err(|e| format!("the peer's queue pair: {e}"))?;
            let recvs: Vec<RecvRequest> = (0..16u64)
                .map(|k| {
                    let at = PEER_ADDR + 2 * REGION_LEN as u64 + (k % 2) * 2048;
                    RecvRequest::new(k, SgList::one(keys.lkey, at, 2048))
                })
                .collect();
            qp.post_recv(&recvs)
                .map_err(|e| format!("the peer's receives: {e}"))?;
        }
        // Takes the receives off their rings before the first frame arrives.
        node.service(0);
        Ok(Peer {
            node,
            cq,
            tx: vec![0; 8192],
        })
    }

    /// Takes the node's frames (minus the lost ones) and returns what the peer sends back.
    fn exchange(
        &mut self,
        now: u64,
        frames: &[Vec<u8>],
        keep: &mut impl FnMut() -> bool,
    ) -> Vec<Vec<u8>> {
        for f in frames {
            if keep() {
                self.node.receive(now, f);
            }
        }
        self.node.service(now);
        let mut out = Vec::new();
        while let Some(tx) = self.node.poll_transmit(now) {
            if let Ok(len) = self.node.emit(&tx, &mut self.tx) {
                out.push(self.tx[..len].to_vec());
            }
        }
        self.node.flush_completions();
        while self.cq.poll_one().is_some() {}
        out
    }
}

fn conversations(out: &Path) -> Result<(), String> {
    let dir = out.join("rdma_node");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for s in SCENARIOS {
        let input = conversation(s)?;
        run(&input);
        let path = dir.join(format!("conversation-{}", s.name));
        std::fs::write(&path, &input).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("seed_corpus: {} ({} bytes)", path.display(), input.len());
    }
    Ok(())
}

/// Runs one scenario and returns the input that replays it.
fn conversation(s: &Scenario) -> Result<Vec<u8>, String> {
    let mut h = Harness::new();
    h.sent = Some(Vec::new());
    let mut peer = Peer::new()?;
    let mut input = Vec::new();
    let mut sent = 0usize;
    let mut keep = || {
        sent += 1;
        s.lose_every == 0 || !sent.is_multiple_of(s.lose_every)
    };
    // A poll first: its worker iteration sends the node's first requests.
    let actions = std::iter::once(&(0xc4, 0, 0)).chain(s.actions);
    for &(cmd, a, b) in actions {
        let act = Record::Act { cmd, a, b };
        act.encode(&mut input);
        h.apply(&act);
        // Frames both ways until both sides are quiet, waiting out the node's timers when
        // the link lost something.
        for _ in 0..1000 {
            let from_node = h.sent.replace(Vec::new()).unwrap_or_default();
            let replies = peer.exchange(h.now(), &from_node, &mut keep);
            if from_node.is_empty() && replies.is_empty() {
                let next = h.node.qps().filter_map(|qp| qp.next_deadline()).min();
                let Some(deadline) = next else { break };
                let wait = deadline
                    .saturating_sub(h.now())
                    .div_ceil(100_000)
                    .clamp(1, 256);
                let act = Record::Act {
                    cmd: 0xc6,
                    a: (wait - 1) as u8,
                    b: 0,
                };
                act.encode(&mut input);
                h.apply(&act);
                continue;
            }
            for frame in &replies {
                let record = Record::Frame { dt: 1, frame };
                record.encode(&mut input);
                h.apply(&record);
            }
            if input.len() > MAX_INPUT {
                return Err(format!(
                    "conversation {} grew past {MAX_INPUT} bytes",
                    s.name
                ));
            }
        }
    }
    Ok(input)
}

fn write_all(dir: &Path, name: &str, inputs: &[Vec<u8>]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (k, input) in inputs.iter().enumerate() {
        let path: PathBuf = dir.join(format!("{name}-{k:02}"));
        std::fs::write(&path, input).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// FLUSH requests of DMA length 0 (issue 28: one with a bogus rkey was answered as a success):
/// a bogus rkey and address with range selectivity (the independent peer's frame), the same
/// with region selectivity, a zero-length range at R1's end (legitimate), and one just past it.
/// Each input is one frame at the PSN the node expects, then a legitimate WRITE behind it, so
/// that what follows the refusal (the queue pair in error) is exercised too.
fn flush(out: &Path) -> Result<(), String> {
    use wire::{BthRepr, Ecn, FethRepr, Placement, RethRepr, RoceIpv4, Selectivity};
    let r1 = Harness::new().r1.rkey;
    let (qpn, _, _) = QPS[0];
    let frame =
        |psn: u32, opcode: Opcode, reth: RethRepr, feth: Option<FethRepr>, payload: &[u8]| {
            let repr = RoceRepr {
                src_mac: PEER_MAC,
                dst_mac: NODE_MAC,
                ip: RoceIpv4 {
                    src_addr: PEER_IP,
                    dst_addr: NODE_IP,
                    dscp: 0,
                    ecn: Ecn::NotEct,
                    ident: psn as u16,
                    dont_frag: true,
                    ttl: 64,
                },
                src_port: 0xc000,
                bth: BthRepr {
                    opcode,
                    solicited: false,
                    migreq: false,
                    pad_count: 0,
                    pkey: 0xffff,
                    fecn: false,
                    becn: false,
                    dest_qp: qpn,
                    ack_req: true,
                    psn,
                },
                feth,
                reth: Some(reth),
                aeth: None,
                immdt: None,
                ceth: None,
            };
            let mut buf = vec![0u8; repr.buffer_len(payload.len())];
            let n = repr
                .emit(&mut buf, payload)
                .map_err(|e| format!("emit: {e:?}"))?;
            buf.truncate(n);
            Ok::<Vec<u8>, String>(buf)
        };
    let range = |global, persistence| FethRepr {
        selectivity: Selectivity::MemoryRange,
        placement: Placement {
            global_visibility: global,
            persistence,
        },
    };
    let region = FethRepr {
        selectivity: Selectivity::MemoryRegion,
        placement: Placement {
            global_visibility: false,
            persistence: true,
        },
    };
    let flushes = [
        (0xdead_0000, 0x1234_5678, range(false, true)),
        (0, 0x1234_5678, region),
        (R1_IOVA + REGION_LEN as u64, r1, range(true, true)),
        (R1_IOVA + REGION_LEN as u64 + 1, r1, range(true, false)),
    ];
    let write = RethRepr {
        virtual_addr: R1_IOVA,
        rkey: r1,
        dma_len: 16,
    };
    let mut rdma = Vec::new();
    let mut parse = Vec::new();
    for (addr, rkey, feth) in flushes {
        let reth = RethRepr {
            virtual_addr: addr,
            rkey,
            dma_len: 0,
        };
        let f = frame(0, Opcode::Flush, reth, Some(feth), &[])?;
        let w = frame(1, Opcode::RdmaWriteOnly, write, None, &[0x5a; 16])?;
        let mut input = Vec::new();
        Record::Frame { dt: 1, frame: &f }.encode(&mut input);
        Record::Frame { dt: 1, frame: &w }.encode(&mut input);
        run(&input);
        rdma.push(input);
        parse.push(f);
    }
    write_all(&out.join("rdma_node"), "flush-zero-length", &rdma)?;
    write_all(&out.join("parse_roce"), "flush-zero-length", &parse)?;
    println!("seed_corpus: {} FLUSH inputs of DMA length 0", rdma.len());
    Ok(())
}

/// A CM MAD from the peer to the node, in a QP1 frame.
fn qp1_frame(mad: &[u8]) -> Vec<u8> {
    use portico::wire::deth::{DethRepr, GSI_QKEY};
    use portico::wire::gsi::{self, GsiRepr};
    let repr = GsiRepr {
        src_mac: PEER_MAC,
        dst_mac: NODE_MAC,
        ip: wire::RoceIpv4 {
            src_addr: PEER_IP,
            dst_addr: NODE_IP,
            dscp: 0,
            ecn: wire::Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        },
        src_port: 0xc001,
        pkey: 0xffff,
        dest_qp: gsi::QPN,
        psn: 1,
        solicited: false,
        deth: DethRepr {
            qkey: GSI_QKEY,
            src_qp: gsi::QPN,
        },
        immediate: None,
    };
    let mut buf = vec![0u8; repr.buffer_len(mad.len())];
    let n = repr.emit(mad, &mut buf).expect("a QP1 frame");
    buf.truncate(n);
    buf
}

/// Connections to the node's CM, made by a CM of the peer's: a REQ alone, a REQ repeated, a
/// REQ to a port nobody listens on, and a whole connection (REQ, the node's REP answered with
/// RTU, then DREQ), each checked against the harness; their frames and a PFC frame for
/// `parse_roce`.
fn cm(out: &Path) -> Result<(), String> {
    use portico_fuzz::rdma_node::CM_PORT;
    use proto::cm::{Cm, CmConfig, Connect, Peer};
    let peer = |seed| {
        Cm::new(CmConfig {
            seed,
            ..CmConfig::new(PEER_IP, PEER_MAC)
        })
    };
    let connect = |port| Connect {
        peer: Peer {
            ip: NODE_IP,
            mac: NODE_MAC,
        },
        port,
        local_qpn: QPS[0].1,
        send_psn: 7,
        path_mtu: 3,
        initiator_depth: 4,
        responder_resources: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        traffic_class: 0,
        hop_limit: 64,
        private_data: b"fuzz".to_vec(),
        ext: None,
    };
    let req = |port, seed| -> Vec<u8> {
        let mut p = peer(seed);
        p.connect(0, &connect(port)).expect("a REQ");
        qp1_frame(&p.poll_send().expect("the REQ").mad)
    };
    let encode = |frames: &[Vec<u8>]| {
        let mut input = Vec::new();
        for f in frames {
            Record::Frame { dt: 1, frame: f }.encode(&mut input);
        }
        input
    };
    let mut inputs = vec![
        encode(&[req(CM_PORT, 1)]),
        encode(&[req(CM_PORT, 2), req(CM_PORT, 2)]),
        encode(&[req(CM_PORT + 1, 3)]),
    ];
    // A whole connection: run the harness on the REQ to get its REP, answer it.
    let mut p = peer(4);
    p.connect(0, &connect(CM_PORT)).expect("a REQ");
    let req = qp1_frame(&p.poll_send().expect("the REQ").mad);
    let mut h = Harness::new();
    h.sent = Some(Vec::new());
    h.apply(&Record::Frame { dt: 1, frame: &req });
    let sent = h.sent.take().unwrap_or_default();
    let rep = sent
        .iter()
        .find_map(|f| wire::gsi::GsiRepr::parse(f).ok().map(|(_, m)| m.to_vec()))
        .ok_or("the node sent no REP")?;
    let from = Peer {
        ip: NODE_IP,
        mac: NODE_MAC,
    };
    p.on_mad(1, from, &rep)
        .map_err(|e| format!("the REP: {e:?}"))?;
    let rtu = qp1_frame(&p.poll_send().ok_or("no RTU")?.mad);
    let id = match p.poll_event() {
        Some(proto::cm::CmEvent::Connected { id, .. }) => id,
        other => return Err(format!("after the REP: {other:?}")),
    };
    p.disconnect(2, id).map_err(|e| e.to_string())?;
    let dreq = qp1_frame(&p.poll_send().ok_or("no DREQ")?.mad);
    inputs.push(encode(&[req, rtu, dreq]));
    for input in &inputs {
        run(input);
    }
    write_all(&out.join("rdma_node"), "cm", &inputs)?;
    let frames: Vec<Vec<u8>> = inputs
        .iter()
        .flat_map(|i| {
            portico_fuzz::rdma_node::records(i)
                .filter_map(|r| match r {
                    Record::Frame { frame, .. } => Some(frame.to_vec()),
                    Record::Act { .. } => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    write_all(&out.join("parse_roce"), "cm", &frames)?;
    // And a PFC frame for parse_roce: priority 3 paused, priority 5 resumed.
    let mut quanta = [0u16; 8];
    quanta[3] = 0xffff;
    let pfc = wire::pfc::PfcRepr {
        src_mac: PEER_MAC,
        enabled: 0x28,
        quanta,
    };
    let mut frame = vec![0u8; wire::pfc::FRAME_LEN];
    pfc.emit(&mut frame).map_err(|e| e.to_string())?;
    write_all(&out.join("parse_roce"), "pfc", &[frame])?;
    println!("seed_corpus: {} CM inputs and a PFC frame", inputs.len());
    Ok(())
}
