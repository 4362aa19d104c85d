//! ns per arbitration step of the traffic shaper (`Shaper::next`), the per-packet call, with
//! every MCU backlogged: 16 MCUs of PUTs in two classes (30/70 % assured of a 100 Gbit/s link);
//! 8 MCUs of 64 KiB READs paced by an absorb rate beside 8 MCUs of PUTs on another class; and
//! 16 streams in the two 30/70 classes (`Shaper::next_with`, the mode the engine uses), whose
//! owner always has a 4 KiB packet. Time advances by one 4 KiB packet at 100 Gbit/s per step;
//! each packet is completed at once (the outstanding cap never binds), and a command that ends
//! is replaced on the same flow.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use portico::shaper::{ClassConfig, Command, Kind, Packet, Pick, Shaper, ShaperConfig};

const LINK: u64 = 100_000_000_000;
/// One 4 KiB packet at 100 Gbit/s, in ns (rounded up).
const STEP_NS: u64 = 328;

fn class(assured_pct: u64) -> ClassConfig {
    ClassConfig {
        assured_bps: LINK * assured_pct / 100,
        ceiling_bps: LINK,
        burst_bytes: 64 * 1024,
        strict: false,
        pfc_priority: None,
    }
}

fn put(flow: u64, class: u8) -> Command {
    Command {
        flow,
        class,
        kind: Kind::Put { bytes: 1 << 20 },
        mtu: 4096,
    }
}

fn get(flow: u64, class: u8) -> Command {
    Command {
        flow,
        class,
        kind: Kind::Get {
            request_bytes: 64,
            response_bytes: 64 * 1024,
        },
        mtu: 4096,
    }
}

/// A shaper with `cmds` enqueued, and the command each flow gets again when one ends.
fn loaded(cfg: ShaperConfig, cmds: Vec<Command>) -> (Shaper, Vec<Command>) {
    let mut s = Shaper::new(cfg).expect("valid configuration");
    for &c in &cmds {
        s.enqueue(c).expect("room");
    }
    (s, cmds)
}

fn run(c: &mut Criterion, name: &str, (mut s, cmds): (Shaper, Vec<Command>)) {
    let mut now = 0u64;
    let mut k = 0usize;
    c.bench_function(name, |b| {
        b.iter(|| {
            now += STEP_NS;
            if let Some(p) = s.next(black_box(now)) {
                s.completed(p.mcu, 1);
                if p.last_of_command {
                    // Keep every MCU backlogged: a new command on one of the flows, in turn.
                    k = (k + 1) % cmds.len();
                    let _ = s.enqueue(cmds[k]);
                }
                black_box(p);
            }
        })
    });
}

/// One `next_with` whose owner always has a 4 KiB packet; not inlined, so that a profiler
/// (callgrind) counts the instructions of a step per call, as it does for `Shaper::next`.
#[inline(never)]
fn stream_step(s: &mut Shaper, now: u64) -> Option<Pick> {
    s.next_with(now, |q| {
        black_box(q);
        Some(Packet { out: 4096, back: 0 })
    })
}

fn arbitration(c: &mut Criterion) {
    let cfg = ShaperConfig::new(vec![class(30), class(70)]);
    let cmds = (0..16u64).map(|f| put(f, (f % 2) as u8)).collect();
    run(c, "shaper_next/puts_2_classes_16_mcus", loaded(cfg, cmds));

    let mut cfg = ShaperConfig::new(vec![class(50), class(50)]);
    cfg.absorb_bps = Some(LINK / 4);
    let cmds = (0..16u64)
        .map(|f| if f < 8 { get(f, 0) } else { put(f, 1) })
        .collect();
    run(
        c,
        "shaper_next/reads_absorb_paced_beside_puts",
        loaded(cfg, cmds),
    );

    // Streams: the owner cuts the packets (always a 4 KiB one here) and counts its own packets
    // in flight, so it sets the MCU's outstanding count after each pick.
    let cfg = ShaperConfig::new(vec![class(30), class(70)]);
    let mut s = Shaper::new(cfg).expect("valid configuration");
    for q in 0..16usize {
        s.activate(q, (q % 2) as u8).expect("a class and a queue");
    }
    let mut now = 0u64;
    c.bench_function("shaper_next/streams_2_classes_16_mcus", |b| {
        b.iter(|| {
            now += STEP_NS;
            if let Some(p) = stream_step(&mut s, black_box(now)) {
                s.set_outstanding(p.mcu, 0);
                black_box(p);
            }
        })
    });
}

criterion_group!(benches, arbitration);
criterion_main!(benches);
