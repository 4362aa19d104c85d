//! Instructions per operation of the pure RoCEv2 engine, for callgrind: wall-clock figures on a
//! shared 2-vCPU VM swing by a third between runs, an instruction count does not.
//!
//! `roce_count <case> <n>` runs `n` operations of one case after a warm-up and exits; run it
//! twice under `valgrind --tool=callgrind` with two values of `n` and divide the difference of
//! the totals by the difference of the counts (`bench/roce_instructions.sh` does this). Cases:
//! `write64`, `write4096` (one WRITE at a time, as `node/write` in the criterion benchmark),
//! `write64x32` (batches of 32, per WRITE), `emit64` and `parse64` (one 64 B WRITE frame built
//! from the queue pair's template, or checked and parsed).

use std::hint::black_box;

use portico::wire::{self, template::HeaderTemplate};

mod common;
use common::pair;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (case, n) = match args.as_slice() {
        [case, n] => (case.as_str(), n.parse::<usize>().expect("a count")),
        _ => {
            eprintln!("usage: roce_count write64|write4096|write64x32|emit64|parse64 N");
            std::process::exit(2);
        }
    };
    let mut p = pair();
    match case {
        "write64" | "write4096" => {
            let size = if case == "write64" { 64 } else { 4096 };
            let wrs = p.requests(size);
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
        "emit64" | "parse64" => {
            let frame = p.write_frame(64);
            let (repr, payload) = wire::parse_frame(&frame).expect("a valid frame");
            let template = HeaderTemplate::new(&repr).expect("a template");
            let mut out = vec![0u8; frame.len()];
            for _ in 0..n {
                if case == "emit64" {
                    let r = template.emit(black_box(&repr), payload.len(), &mut out, |d| {
                        d.copy_from_slice(payload)
                    });
                    black_box(r.is_ok());
                } else {
                    black_box(wire::parse_frame(black_box(&frame)).is_ok());
                }
            }
        }
        _ => {
            eprintln!("unknown case {case}");
            std::process::exit(2);
        }
    }
}
