//! Instructions per operation of the pure RoCEv2 engine, for callgrind: wall-clock figures on a
//! shared 2-vCPU VM swing by a third between runs, an instruction count does not.
//!
//! `roce_count <case> <n>` runs `n` operations of one case after a warm-up and exits; run it
//! twice under `valgrind --tool=callgrind` with two values of `n` and divide the difference of
//! the totals by the difference of the counts (`bench/roce_instructions.sh` does this). Cases:
//! `write64`, `write4096` (one WRITE at a time, as `node/write` in the criterion benchmark),
//! `write65536` (one WRITE of 16 packets at a time: FIRST, 14 MIDDLE, LAST),
//! `write64x32` (batches of 32, per WRITE), `read64` (one 64 B READ at a time), `emit64`
//! and `parse64` (one 64 B WRITE frame built from the queue pair's template and the packet's
//! fields, as a queue pair builds it, or checked and parsed), `emit64r` (the same frame from a
//! whole `RoceRepr`, the template's checked entry point for other callers). And the
//! list-processing engine's per-packet call (`MatchShard::match_incoming`, an endpoint with
//! the default sizes, as the tag port makes it): `lpe_match8` and `lpe_match1000` (a
//! persistent receive matched among 8 or 1 000 posted, one in ten ANY_SOURCE),
//! `lpe_repost1000` (a use-once receive matched and the next one posted, as MPI does). And
//! tagged messaging through both engines, as `portico bench tagged`'s eager part runs it at
//! depth 1 000: `tagged8` (one 8 B tagged send at a time into one of 1 000 posted use-once
//! receives, the target's host taking the put event and posting the receive again) and
//! `tagged8x32` (batches of 32 sends to distinct receives, per message).

use std::hint::black_box;

use portico::wire::{self, template::HeaderTemplate};

mod common;
use common::pair;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (case, n) = match args.as_slice() {
        [case, n] => (case.as_str(), n.parse::<usize>().expect("a count")),
        _ => {
            eprintln!(
                "usage: roce_count write64|write4096|write65536|write64x32|read64|emit64|emit64r|parse64|lpe_match8|lpe_match1000|lpe_repost1000|tagged8|tagged8x32 N"
            );
            std::process::exit(2);
        }
    };
    let mut p = pair();
    match case {
        "write64" | "write4096" | "write65536" => {
            let size = case["write".len()..].parse().expect("a size");
            let wrs = p.requests(size);
            for _ in 0..100 {
                p.writes(&wrs[..1]);
            }
            for _ in 0..n {
                p.writes(black_box(&wrs[..1]));
            }
        }
        "read64" => {
            let wrs = p.read_requests(64);
            for _ in 0..100 {
                p.writes(&wrs[..1]);
            }
            for _ in 0..n {
                p.writes(black_box(&wrs[..1]));
            }
        }
        "write64x32" => {
            let wrs = p.requests(64);
            for _ in 0..10 {
                p.writes(&wrs);
            }
            for _ in 0..n / 32 {
                p.writes(black_box(&wrs));
            }
        }
        "emit64" | "emit64r" | "parse64" => {
            let frame = p.write_frame(64);
            let (repr, payload) = wire::parse_frame(&frame).expect("a valid frame");
            let template = HeaderTemplate::new(&repr).expect("a template");
            let mut out = vec![0u8; frame.len()];
            let fields = wire::PacketFields::of(&repr);
            for _ in 0..n {
                if case == "emit64" {
                    let r = template.emit_fields(
                        black_box(&fields),
                        payload.len(),
                        &mut out,
                        |tail, ext, reg| {
                            tail[ext..].copy_from_slice(payload);
                            wire::icrc::fold_tables(reg, tail)
                        },
                    );
                    black_box(r.is_ok());
                } else if case == "emit64r" {
                    let r = template.emit(black_box(&repr), payload.len(), &mut out, |d| {
                        d.copy_from_slice(payload)
                    });
                    black_box(r.is_ok());
                } else {
                    black_box(wire::parse_frame(black_box(&frame)).is_ok());
                }
            }
        }
        "lpe_match8" | "lpe_match1000" | "lpe_repost1000" => lpe(case, n),
        "tagged8" | "tagged8x32" => tagged(case == "tagged8x32", n),
        _ => {
            eprintln!("unknown case {case}");
            std::process::exit(2);
        }
    }
}

/// The list-processing cases: `depth` receives posted, then `n` arrivals (after a warm-up).
fn lpe(case: &str, n: usize) {
    use portico::lpe::{
        EndpointConfig, EndpointIndex, EngineConfig, EngineId, EventRing, IncomingHeader, ListKind,
        MatchEntry, MatchId, MatchShard, Options, ProcessId,
    };
    const EP: EndpointIndex = EndpointIndex(0);
    let (depth, once) = match case {
        "lpe_match8" => (8u64, false),
        "lpe_match1000" => (1000, false),
        _ => (1000, true),
    };
    let options = if once {
        Options::OP_PUT | Options::USE_ONCE
    } else {
        Options::OP_PUT
    };
    let bits = |k: u64| (5 << 48) | ((k % 64) << 24) | k;
    let receive = |k: u64| {
        let e = MatchEntry::new(bits(k), k << 16, 4096, k).with_options(options);
        if k % 10 == 3 {
            e.with_ignore(0xff_ffff << 24).with_source(MatchId::ANY)
        } else {
            e.with_source(MatchId::rank((k % 64) as u32))
        }
    };
    let config = EngineConfig {
        cache_entries: 0,
        ..EngineConfig::default()
    };
    let mut e: MatchShard = MatchShard::new(EngineId(0), config);
    e.add_endpoint(EP, EndpointConfig::default())
        .expect("endpoint");
    let mut ring = EventRing::new(256);
    for k in 0..depth {
        e.append(EP, ListKind::Priority, receive(k), &mut ring)
            .expect("room");
    }
    ring.clear();
    let header = |i: u64| {
        let k = portico::rng::splitmix64(i) % depth;
        IncomingHeader::put(ProcessId::rank((k % 64) as u32), bits(k), 64)
    };
    let headers: Vec<IncomingHeader> = (0..1024).map(header).collect();
    for i in 0..(n + 1000) {
        let h = &headers[i & 1023];
        black_box(e.match_incoming(EP, black_box(h), &mut ring));
        if once {
            let k = h.match_bits & 0xff_ffff;
            let _ = black_box(e.append(EP, ListKind::Priority, receive(k), &mut ring));
        }
        if ring.len() >= 250 {
            ring.clear();
        }
    }
}

/// The tagged cases: 1 000 use-once receives posted on B (quiet: one put event each, as MPI
/// configures it), A's tagged sends of 8 B aimed at them in a fixed random order, each receive
/// posted again when its put event reaches B's host; `batched` sends 32 at a time.
fn tagged(batched: bool, n: usize) {
    let mut t = common::tagged_pair(1000);
    let batch = if batched { 32 } else { 1 };
    let rounds = |n: usize| n / batch;
    for _ in 0..rounds(3200) {
        t.round(batch);
    }
    for _ in 0..rounds(n) {
        black_box(t.round(black_box(batch)));
    }
}
