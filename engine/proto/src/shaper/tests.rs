//! The shaper in simulated time: a link of 8 Gbit/s (one byte per ns) asks for a packet
//! whenever it is free, and waits for `next_ready_at` when nothing may go.

use super::*;

/// 8 Gbit/s: one byte per ns, so packet times are exact.
const LINK: u64 = 8_000_000_000;
const HUGE: u64 = 1 << 40;

fn class(assured_bps: u64, ceiling_bps: u64, burst_bytes: u64, strict: bool) -> ClassConfig {
    ClassConfig {
        assured_bps,
        ceiling_bps,
        burst_bytes,
        strict,
        pfc_priority: None,
    }
}

fn put(flow: u64, class: u8, bytes: u64, mtu: u32) -> Command {
    Command {
        flow,
        class,
        kind: Kind::Put { bytes },
        mtu,
    }
}

fn get(flow: u64, class: u8, response_bytes: u64, mtu: u32) -> Command {
    Command {
        flow,
        class,
        kind: Kind::Get {
            request_bytes: 64,
            response_bytes,
        },
        mtu,
    }
}

/// Runs the link until `until` ns; `on_pick` sees each pick and the time it went. Returns the
/// time the run stopped.
fn drive(s: &mut Shaper, until: u64, mut on_pick: impl FnMut(&mut Shaper, u64, Pick)) -> u64 {
    let mut now = 0;
    while now < until {
        match s.next(now) {
            Some(p) => {
                on_pick(s, now, p);
                now += (p.packet_bytes as u64).max(1);
            }
            None => match s.next_ready_at(now) {
                Some(t) if t > now => now = t,
                _ => break,
            },
        }
    }
    now
}

/// Distinct flow keys that hash to distinct flow queues (keys 1, 2, ... skipping collisions).
fn distinct_flows(s: &Shaper, n: usize) -> Vec<u64> {
    let mut seen = Vec::new();
    let mut flows = Vec::new();
    let mut f = 1;
    while flows.len() < n {
        let q = s.flow_queue_of(f);
        if !seen.contains(&q) {
            seen.push(q);
            flows.push(f);
        }
        f += 1;
    }
    flows
}

#[test]
fn assured_shares_30_70_under_saturation() {
    let cfg = ShaperConfig {
        mcus: 4,
        ..ShaperConfig::new(vec![
            class(LINK * 3 / 10, LINK, 8000, false),
            class(LINK * 7 / 10, LINK, 8000, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 4);
    for (i, &f) in flows.iter().enumerate() {
        s.enqueue(put(f, (i / 2) as u8, HUGE, 1000)).unwrap();
    }
    let end = drive(&mut s, 10_000_000, |s, _, p| s.completed(p.mcu, 1));
    assert_eq!(end, 10_000_000);
    let (a, b) = (s.class_counters(0).bytes, s.class_counters(1).bytes);
    assert_eq!(a + b, 10_000_000, "the link is never idle");
    let share_a = a as f64 / (a + b) as f64;
    assert!((share_a - 0.3).abs() < 0.01, "class 0 share {share_a}");
    // Within a class the two MCUs split evenly (to one quantum).
    let m: Vec<u64> = (0..4).map(|m| s.mcu_counters(m).bytes).collect();
    assert_eq!(m, vec![1_505_000, 1_503_000, 3_497_000, 3_495_000]);
}

#[test]
fn a_ceiling_is_never_exceeded() {
    // Class 0 may borrow up to 10 % of the link however idle the rest is.
    let ceiling = LINK / 10;
    let burst = 4000;
    let cfg = ShaperConfig {
        mcus: 2,
        ..ShaperConfig::new(vec![class(0, ceiling, burst, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 2);
    for &f in &flows {
        s.enqueue(put(f, 0, HUGE, 1000)).unwrap();
    }
    let mut sent = 0u64;
    let mut worst_slack = i64::MAX;
    drive(&mut s, 1_000_000, |s, now, p| {
        s.completed(p.mcu, 1);
        sent += p.packet_bytes as u64;
        // Bucket bound: burst + rate * t, plus the one packet of debt a pacer allows.
        let bound = burst + ceiling * now / 8_000_000_000 + 1000;
        worst_slack = worst_slack.min(bound as i64 - sent as i64);
    });
    assert!(worst_slack >= 0);
    // 4000 B of burst then 100 B/us: packets at 0, 1000, 2000, 3000, 4000 (the one in debt),
    // then one every 10 us from 10 000 on, the last at 990 000: 5 + 99 packets.
    assert_eq!(s.class_counters(0).bytes, 104_000);
    assert!(s.class_counters(0).waited_out > 0);
}

#[test]
fn a_strict_class_always_goes_first() {
    let cfg = ShaperConfig {
        mcus: 2,
        ..ShaperConfig::new(vec![
            class(LINK, LINK, 1 << 20, false),
            class(0, LINK, 1 << 20, true),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 2);
    s.enqueue(put(flows[0], 0, HUGE, 1000)).unwrap();
    let mut order = Vec::new();
    let mut now = 0;
    for i in 0..30 {
        if i == 5 {
            // The low-latency command arrives mid-stream and jumps the bulk one.
            s.enqueue(put(flows[1], 1, 10_000, 1000)).unwrap();
        }
        let p = s.next(now).unwrap();
        s.completed(p.mcu, 1);
        order.push(p.class);
        now += 1000;
    }
    let expect: Vec<u8> = [0; 5].into_iter().chain([1; 10]).chain([0; 15]).collect();
    assert_eq!(order, expect);
}

#[test]
fn drr_alternates_mcus_with_equal_packets() {
    let cfg = ShaperConfig {
        mcus: 3,
        quantum_bytes: 1000,
        ..ShaperConfig::new(vec![class(LINK, LINK, 8000, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    for &f in &distinct_flows(&s, 3) {
        s.enqueue(put(f, 0, HUGE, 1000)).unwrap();
    }
    let mut order = Vec::new();
    drive(&mut s, 9000, |s, _, p| {
        s.completed(p.mcu, 1);
        order.push(p.mcu);
    });
    assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0, 1, 2]);
}

#[test]
fn drr_splits_bytes_by_quantum_with_unequal_packets() {
    let cfg = ShaperConfig {
        mcus: 2,
        quantum_bytes: 2000,
        ..ShaperConfig::new(vec![class(LINK, LINK, HUGE, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 2);
    s.enqueue(put(flows[0], 0, HUGE, 500)).unwrap();
    s.enqueue(put(flows[1], 0, HUGE, 2000)).unwrap();
    let mut order = Vec::new();
    for _ in 0..500 {
        let p = s.next(0).unwrap();
        s.completed(p.mcu, 1);
        order.push(p.mcu);
    }
    // A round: MCU 0 sends four 500 B packets, MCU 1 one 2000 B packet.
    assert_eq!(order[..10], [0, 0, 0, 0, 1, 0, 0, 0, 0, 1]);
    assert_eq!(s.mcu_counters(0).bytes, 200_000);
    assert_eq!(s.mcu_counters(1).bytes, 200_000);
    assert_eq!(s.mcu_counters(0).packets, 400);
    assert_eq!(s.mcu_counters(1).packets, 100);
}

#[test]
fn an_mcu_at_its_cap_is_skipped_and_resumes_after_completed() {
    let cfg = ShaperConfig {
        mcus: 2,
        outstanding_cap: 2,
        quantum_bytes: 1000,
        ..ShaperConfig::new(vec![class(LINK, LINK, 1 << 20, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 2);
    s.enqueue(put(flows[0], 0, HUGE, 1000)).unwrap();
    s.enqueue(put(flows[1], 0, HUGE, 1000)).unwrap();
    let mut order = Vec::new();
    for _ in 0..8 {
        let p = s.next(0).unwrap();
        // Only MCU 1's responses come back.
        if p.mcu == 1 {
            s.completed(1, 1);
        }
        order.push(p.mcu);
    }
    assert_eq!(order, vec![0, 1, 0, 1, 1, 1, 1, 1]);
    assert_eq!(s.outstanding(0), 2);
    // Skipped in the step MCU 1 went after MCU 0 reached the cap, and in the four after.
    assert_eq!(s.mcu_counters(0).waited_cap, 5);
    assert_eq!(s.mcu_counters(1).waited_cap, 0);
    s.completed(0, 1);
    assert_eq!(s.next(0).unwrap().mcu, 0);
    // MCU 1 goes until it is at the cap too; then nothing goes, and tokens would not help.
    assert_eq!(s.next(0).unwrap().mcu, 1);
    assert_eq!(s.next(0).unwrap().mcu, 1);
    assert_eq!(s.outstanding(0) + s.outstanding(1), 4);
    assert_eq!(s.next(0), None);
    assert_eq!(s.next_ready_at(0), None);
}

#[test]
fn reads_are_paced_to_the_absorb_rate_while_puts_keep_their_share() {
    // 10 Gbit/s of absorb (1.25 B/ns) behind an 8 Gbit/s link: small READ requests could pull
    // back far more than that; the absorb bucket holds them to it.
    let absorb_bps = 10_000_000_000;
    let burst = 64 * 1024;
    let cfg = ShaperConfig {
        mcus: 9,
        absorb_bps: Some(absorb_bps),
        absorb_burst_bytes: burst,
        ..ShaperConfig::new(vec![
            class(LINK / 2, LINK, 16_384, false),
            class(LINK / 2, LINK, 16_384, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 9);
    for &f in &flows[..8] {
        s.enqueue(get(f, 0, 64 * 1024, 4096)).unwrap();
    }
    s.enqueue(put(flows[8], 1, HUGE, 4096)).unwrap();
    let ms = 1_000_000u64;
    let mut inbound_per_ms = [0u64; 10];
    drive(&mut s, 10 * ms, |s, now, p| {
        s.completed(p.mcu, 1);
        inbound_per_ms[(now / ms) as usize] += p.response_bytes as u64;
        if p.last_of_command && p.class == 0 {
            // Keep the READ side saturated: the flow asks again. MCU i took flow i first, and
            // each finished READ frees its MCU, which is the one the next enqueue takes.
            assert!(p.mcu < 8);
            s.enqueue(get(flows[p.mcu], 0, 64 * 1024, 4096)).unwrap();
            assert_eq!(
                s.mcus[p.mcu].flow_queue,
                Some(s.flow_queue_of(flows[p.mcu]))
            );
        }
    });
    let per_ms_bound = absorb_bps * ms / 8_000_000_000 + burst;
    for (i, &b) in inbound_per_ms.iter().enumerate() {
        assert!(b <= per_ms_bound, "ms {i}: {b} > {per_ms_bound}");
    }
    let inbound: u64 = inbound_per_ms.iter().sum();
    // Over the whole run: at most 10 ms at 1.25 B/ns plus the burst, and the absorb rate is
    // used (what the bucket held when the run stopped is the difference).
    assert!(inbound <= 12_500_000 + burst && inbound >= 12_500_000);
    assert_eq!(inbound, 12_546_048);
    let reads = s.class_counters(0);
    assert_eq!(reads.response_bytes, inbound);
    assert!(reads.waited_in > 0);
    // The PUT class keeps (more than) its assured half of the link.
    let puts = s.class_counters(1);
    assert!(puts.bytes >= 5_000_000, "{}", puts.bytes);
    assert_eq!(puts.response_bytes, 0);
    assert_eq!(puts.waited_in, 0);
}

#[test]
fn flows_hash_to_flow_queues_deterministically_and_keep_order() {
    let s = Shaper::new(ShaperConfig::new(vec![class(0, LINK, 1000, false)])).unwrap();
    let t = Shaper::new(ShaperConfig::new(vec![class(0, LINK, 1000, false)])).unwrap();
    let qs: Vec<usize> = (0..8).map(|f| s.flow_queue_of(f)).collect();
    assert_eq!(qs, (0..8).map(|f| t.flow_queue_of(f)).collect::<Vec<_>>());
    assert_eq!(qs, GOLDEN_QUEUES);

    // One MCU, one flow: its commands go in the order given.
    let cfg = ShaperConfig {
        mcus: 1,
        ..ShaperConfig::new(vec![class(LINK, LINK, 1 << 20, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    for bytes in [1000, 2000, 3000] {
        s.enqueue(put(7, 0, bytes, 1000)).unwrap();
    }
    let mut lasts = Vec::new();
    drive(&mut s, 1_000_000, |s, now, p| {
        s.completed(p.mcu, 1);
        if p.last_of_command {
            lasts.push(now);
        }
    });
    assert_eq!(lasts, vec![0, 2000, 5000]);
}

const GOLDEN_QUEUES: [usize; 8] = [175, 193, 206, 237, 202, 90, 0, 215];

#[test]
fn a_waiting_flow_queue_gets_the_next_free_mcu() {
    let cfg = ShaperConfig {
        mcus: 1,
        ..ShaperConfig::new(vec![class(LINK, LINK, 1 << 20, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let flows = distinct_flows(&s, 2);
    s.enqueue(put(flows[0], 0, 2000, 1000)).unwrap();
    s.enqueue(put(flows[1], 0, 1000, 1000)).unwrap();
    let picks: Vec<(u32, bool)> = (0..3)
        .map(|_| {
            let p = s.next(0).unwrap();
            (p.packet_bytes, p.last_of_command)
        })
        .collect();
    assert_eq!(picks, vec![(1000, false), (1000, true), (1000, true)]);
    assert_eq!(s.next(0), None);
    assert_eq!(s.next_ready_at(0), None, "idle");
}

#[test]
fn a_full_flow_queue_refuses_and_returns_the_command() {
    let cfg = ShaperConfig {
        mcus: 1,
        flow_queue_depth: 2,
        ..ShaperConfig::new(vec![class(LINK, LINK, 1 << 20, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    // The first goes straight to the MCU, two wait in the flow queue.
    for bytes in [1000, 1000, 1000] {
        s.enqueue(put(9, 0, bytes, 1000)).unwrap();
    }
    let extra = put(9, 0, 4242, 1000);
    assert_eq!(s.enqueue(extra), Err(Refused::Full(extra)));
    s.next(0).unwrap();
    assert_eq!(s.enqueue(extra), Ok(()));
    let sent: Vec<u32> = (0..7).map(|_| s.next(0).unwrap().packet_bytes).collect();
    assert_eq!(sent, vec![1000, 1000, 1000, 1000, 1000, 1000, 242]);
    assert_eq!(s.next(0), None);
}

#[test]
fn commands_that_could_never_go_are_refused() {
    let cfg = ShaperConfig {
        absorb_bps: Some(LINK),
        absorb_burst_bytes: 2048,
        quantum_bytes: 4096,
        ..ShaperConfig::new(vec![class(LINK, LINK, 1000, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let reason = |r: Result<(), Refused>| match r {
        Err(Refused::Invalid { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(reason(s.enqueue(put(1, 1, 10, 1000))), "no such class");
    assert_eq!(reason(s.enqueue(put(1, 0, 10, 0))), "mtu must be > 0");
    assert_eq!(
        reason(s.enqueue(put(1, 0, 10, 8192))),
        "mtu above quantum_bytes"
    );
    assert!(reason(s.enqueue(get(1, 0, 10, 4096))).starts_with("GET mtu above"));
    let big_request = Command {
        kind: Kind::Get {
            request_bytes: 5000,
            response_bytes: 10,
        },
        ..get(1, 0, 10, 2048)
    };
    assert_eq!(
        reason(s.enqueue(big_request)),
        "request_bytes above quantum_bytes"
    );
    assert_eq!(s.enqueue(get(1, 0, 10, 2048)), Ok(()));
}

#[test]
fn validation_names_the_bad_field() {
    let good = ShaperConfig::new(vec![class(1, 2, 3, false), class(1, 2, 3, true)]);
    assert_eq!(good.validate(), Ok(()));
    let field = |f: &dyn Fn(&mut ShaperConfig)| {
        let mut c = good.clone();
        f(&mut c);
        Shaper::new(c).unwrap_err().field
    };
    assert_eq!(field(&|c| c.classes.clear()), "classes");
    assert_eq!(
        field(&|c| c.classes = vec![class(0, 1, 1, false); 257]),
        "classes"
    );
    assert_eq!(
        field(&|c| c.classes[1].ceiling_bps = 0),
        "classes[1].ceiling_bps"
    );
    assert_eq!(
        field(&|c| c.classes[0].assured_bps = 3),
        "classes[0].assured_bps"
    );
    assert_eq!(
        field(&|c| c.classes[1].burst_bytes = 0),
        "classes[1].burst_bytes"
    );
    assert_eq!(field(&|c| c.absorb_bps = Some(0)), "absorb_bps");
    assert_eq!(
        field(&|c| {
            c.absorb_bps = Some(1);
            c.absorb_burst_bytes = 0
        }),
        "absorb_burst_bytes"
    );
    assert_eq!(field(&|c| c.mcus = 0), "mcus");
    assert_eq!(field(&|c| c.outstanding_cap = 0), "outstanding_cap");
    assert_eq!(field(&|c| c.quantum_bytes = 0), "quantum_bytes");
    assert_eq!(field(&|c| c.flow_queues = 0), "flow_queues");
    assert_eq!(field(&|c| c.flow_queue_depth = 0), "flow_queue_depth");
    let e = field(&|c| c.mcus = 0);
    assert_eq!(e, "mcus");
}

#[test]
fn arbitration_keeps_its_preallocated_capacities() {
    // A manual no-allocation check (a counting allocator would replace the allocator of the
    // whole lib test binary): every growable buffer keeps the capacity it was built with
    // through a busy run with waiting flow queues, MCUs freed and re-assigned, caps and
    // absorb stalls.
    let cfg = ShaperConfig {
        mcus: 2,
        flow_queues: 8,
        flow_queue_depth: 4,
        outstanding_cap: 3,
        absorb_bps: Some(LINK / 4),
        absorb_burst_bytes: 4096,
        ..ShaperConfig::new(vec![
            class(LINK / 2, LINK, 8000, false),
            class(0, LINK / 4, 8000, true),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let caps = |s: &Shaper| {
        let mut v = vec![s.waiting.capacity(), s.free.capacity()];
        v.extend(s.flows.iter().map(|f| f.cmds.capacity()));
        v
    };
    let before = caps(&s);
    let mut n = 0u64;
    let refill = |s: &mut Shaper, n: u64| {
        let _ = s.enqueue(if n.is_multiple_of(3) {
            get(n % 13, 0, 1 + n % 9000, 4096)
        } else {
            put(n % 13, (n % 2) as u8, 1 + n % 3000, 1500)
        });
    };
    for f in 0..8 {
        refill(&mut s, f);
    }
    let mut now = 0;
    while now < 1_000_000 {
        match s.next(now) {
            Some(p) => {
                n += 1;
                // Responses come back for every other packet only, so the caps are reached.
                if n.is_multiple_of(2) {
                    s.completed(p.mcu, 1);
                }
                refill(&mut s, n);
                now += p.packet_bytes as u64 + 1;
            }
            None => {
                now = match s.next_ready_at(now) {
                    Some(t) => t,
                    None => {
                        // Every MCU at its cap: the late responses arrive.
                        for m in 0..2 {
                            s.completed(m, 3);
                        }
                        now + 1000
                    }
                }
            }
        }
    }
    assert_eq!(caps(&s), before);
    let (a, b) = (s.class_counters(0), s.class_counters(1));
    assert!(a.packets > 0 && b.packets > 0);
    // The run went through absorb and cap stalls (the seeded counts, as a golden).
    assert_eq!((a.packets, a.waited_in, a.waited_cap), (822, 366, 296));
    assert_eq!((b.packets, b.waited_cap), (411, 193));
}

/// xorshift64*: the tests' seeded generator.
fn rand(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The packets a command is cut into: (bytes out, bytes back, last).
fn chop(cmd: &Command) -> Vec<(u32, u32, bool)> {
    let (mut left, req) = match cmd.kind {
        Kind::Put { bytes } => (bytes, None),
        Kind::Get {
            request_bytes,
            response_bytes,
        } => (response_bytes, Some(request_bytes)),
        Kind::Stream => unreachable!("streams are not enqueued"),
    };
    let mut v = Vec::new();
    loop {
        let chunk = left.min(cmd.mtu as u64) as u32;
        left -= chunk as u64;
        v.push(match req {
            None => (chunk, 0, left == 0),
            Some(r) => (r, chunk, left == 0),
        });
        if left == 0 {
            return v;
        }
    }
}

#[test]
fn random_commands_all_go_in_flow_order_within_the_caps() {
    let cap = 8;
    let cfg = ShaperConfig {
        mcus: 4,
        outstanding_cap: cap,
        flow_queues: 16,
        flow_queue_depth: 4,
        absorb_bps: Some(LINK),
        absorb_burst_bytes: 16_384,
        ..ShaperConfig::new(vec![
            class(0, LINK / 4, 8192, true),
            class(LINK / 4, LINK, 8192, false),
            class(LINK / 2, LINK / 2, 8192, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let mut rng = 0x5eed_0014_u64;
    let mut pending: VecDeque<Command> = (0..2000)
        .map(|_| {
            let flow = rand(&mut rng) % 40;
            let class = (rand(&mut rng) % 3) as u8;
            let mtu = [256, 1024, 4096][(rand(&mut rng) % 3) as usize];
            let size = rand(&mut rng) % 20_000;
            if rand(&mut rng).is_multiple_of(2) {
                put(flow, class, size, mtu)
            } else {
                get(flow, class, size, mtu)
            }
        })
        .collect();
    let mut expected = vec![Vec::new(); 16];
    for c in &pending {
        expected[s.flow_queue_of(c.flow)].extend(chop(c));
    }
    let mut seen = vec![Vec::new(); 16];
    let mut now = 0;
    let mut outstanding = [0u32; 4];
    while !pending.is_empty() || s.mcus.iter().any(|m| m.cmd.is_some()) {
        // Commands go in in order; a refused one waits (and those behind it).
        while let Some(&c) = pending.front() {
            match s.enqueue(c) {
                Ok(()) => {
                    pending.pop_front();
                }
                Err(Refused::Full(back)) => {
                    assert_eq!(back, c);
                    break;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        let owner: Vec<Option<usize>> = s.mcus.iter().map(|m| m.flow_queue).collect();
        match s.next(now) {
            Some(p) => {
                let q = owner[p.mcu].expect("a served MCU holds a flow queue");
                seen[q].push((p.packet_bytes, p.response_bytes, p.last_of_command));
                outstanding[p.mcu] += 1;
                assert!(outstanding[p.mcu] <= cap);
                assert_eq!(s.outstanding(p.mcu), outstanding[p.mcu]);
                now += (p.packet_bytes as u64).max(1);
            }
            None => match s.next_ready_at(now) {
                Some(t) => {
                    assert!(t > now);
                    now = t;
                }
                None => now += 1000,
            },
        }
        // Responses come back in random batches.
        let m = (rand(&mut rng) % 4) as usize;
        let k = (rand(&mut rng) % 3) as u32;
        let k = k.min(outstanding[m]);
        s.completed(m, k);
        outstanding[m] -= k;
    }
    assert_eq!(seen, expected);
    let total: u64 = (0..3).map(|c| s.class_counters(c).packets).sum();
    assert_eq!(total, expected.iter().map(|v| v.len() as u64).sum::<u64>());
    assert_eq!(now, GOLDEN_RANDOM_END_NS);
}

/// When the seeded run above finished (a golden: any change to the arbitration moves it).
const GOLDEN_RANDOM_END_NS: u64 = 17_919_191;

#[test]
fn next_ready_at_is_when_the_ceiling_bucket_is_out_of_debt() {
    // 1 Gbit/s ceiling: 1 byte per 8 ns.
    let cfg = ShaperConfig {
        mcus: 1,
        ..ShaperConfig::new(vec![class(0, LINK / 8, 1500, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    assert_eq!(s.next_ready_at(0), None, "nothing to send");
    s.enqueue(put(1, 0, HUGE, 1000)).unwrap();
    assert_eq!(s.next_ready_at(0), Some(0));
    // 1500 B of burst: two packets, the second leaves 500 B of debt (4000 ns to pay).
    assert_eq!(s.next(0).unwrap().packet_bytes, 1000);
    assert_eq!(s.next(1000).unwrap().packet_bytes, 1000);
    // At 2000 ns the debt is 500 - 2000/8 = 250 B: 2000 ns more.
    assert_eq!(s.next(2000), None);
    assert_eq!(s.next_ready_at(2000), Some(4000));
    assert_eq!(s.next(3999), None);
    assert!(s.next(4000).is_some());
    let c = s.class_counters(0);
    assert_eq!((c.packets, c.waited_out), (3, 2));
    assert_eq!(s.mcu_counters(0).waited_out, 2);
}

#[test]
fn a_strict_class_is_held_to_its_ceiling_and_the_rest_is_shared() {
    // Strict at a quarter of the link; two borrowing-only classes split the rest evenly.
    let cfg = ShaperConfig {
        mcus: 3,
        ..ShaperConfig::new(vec![
            class(0, LINK / 4, 4000, true),
            class(0, LINK, 4000, false),
            class(0, LINK, 4000, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    for (i, &f) in distinct_flows(&s, 3).iter().enumerate() {
        s.enqueue(put(f, i as u8, HUGE, 1000)).unwrap();
    }
    let end = drive(&mut s, 10_000_000, |s, _, p| s.completed(p.mcu, 1));
    assert_eq!(end, 10_000_000);
    let b: Vec<u64> = (0..3).map(|c| s.class_counters(c).bytes).collect();
    // The strict class gets what its ceiling bucket allows, to the byte: the 4000 B burst plus
    // 10 ms at 1 B per 4 ns (and not a packet more).
    assert_eq!(b[0], 2_500_000 + 4000);
    assert_eq!(b[0] + b[1] + b[2], 10_000_000);
    assert!(b[1].abs_diff(b[2]) <= 1000, "{b:?}");
}

/// Runs the link with streams whose owners the test plays: `peek` gives a stream's next packet.
fn drive_streams(
    s: &mut Shaper,
    until: u64,
    mut peek: impl FnMut(usize, u64) -> Option<Packet>,
    mut on_pick: impl FnMut(&mut Shaper, u64, Pick),
) -> u64 {
    let mut now = 0;
    while now < until {
        match s.next_with(now, |q| peek(q, now)) {
            Some(p) => {
                on_pick(s, now, p);
                now += (p.packet_bytes as u64).max(1);
            }
            None => match s.next_ready_at(now) {
                Some(t) if t > now => now = t,
                // Owners that hold their packets back: try again a little later.
                _ => now += 100,
            },
        }
    }
    now
}

#[test]
fn streams_are_chopped_by_their_owners_and_share_by_class() {
    // Two queue pairs' send queues as streams in 30/70 classes; each always has a 4 KiB packet.
    let cfg = ShaperConfig::new(vec![
        class(LINK * 3 / 10, LINK, 16_384, false),
        class(LINK * 7 / 10, LINK, 16_384, false),
    ]);
    let mut s = Shaper::new(cfg).unwrap();
    s.activate(7, 0).unwrap();
    s.activate(9, 1).unwrap();
    // Activating again changes nothing.
    s.activate(7, 0).unwrap();
    assert!(s.is_active(7) && s.is_active(9) && !s.is_active(8));
    let mut bytes = [0u64; 2];
    drive_streams(
        &mut s,
        10_000_000,
        |_, _| Some(Packet { out: 4096, back: 0 }),
        |s, _, p| {
            assert_eq!(p.queue, if p.class == 0 { 7 } else { 9 });
            assert!(!p.last_of_command);
            assert_eq!(s.mcu_of(p.queue), Some(p.mcu));
            s.set_outstanding(p.mcu, 0);
            bytes[p.class as usize] += p.packet_bytes as u64;
        },
    );
    let share = bytes[0] as f64 / (bytes[0] + bytes[1]) as f64;
    assert!((share - 0.3).abs() < 0.01, "class 0 got {share}");
}

#[test]
fn a_stream_with_nothing_to_send_is_passed_over_and_counted() {
    let cfg = ShaperConfig::new(vec![class(0, LINK, 16_384, false)]);
    let mut s = Shaper::new(cfg).unwrap();
    s.activate(1, 0).unwrap();
    s.activate(2, 0).unwrap();
    let mut picks = [0u64; 3];
    drive_streams(
        &mut s,
        1_000_000,
        // Queue 1's owner is held by its own window the whole time.
        |q, _| (q == 2).then_some(Packet { out: 1000, back: 0 }),
        |s, _, p| {
            s.set_outstanding(p.mcu, 0);
            picks[p.queue] += 1
        },
    );
    assert_eq!(picks[1], 0);
    assert_eq!(picks[2], 1000);
    let m1 = s.mcu_of(1).unwrap();
    // Looked at about once per round (4 packets of queue 2 fit its quantum), skipped each time.
    assert!(
        s.mcu_counters(m1).waited_flow > 200,
        "{:?}",
        s.mcu_counters(m1)
    );
    assert_eq!(s.mcu_counters(s.mcu_of(2).unwrap()).waited_flow, 0);
    assert_eq!(
        s.class_counters(0).waited_flow,
        s.mcu_counters(m1).waited_flow
    );
}

#[test]
fn deactivating_a_stream_frees_its_mcu_for_the_next_waiting_queue() {
    let cfg = ShaperConfig {
        mcus: 1,
        ..ShaperConfig::new(vec![class(0, LINK, 16_384, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    s.activate(3, 0).unwrap();
    s.activate(4, 0).unwrap();
    s.activate(5, 0).unwrap();
    assert_eq!(s.mcu_of(3), Some(0));
    assert_eq!(s.mcu_of(4), None, "waits for the one MCU");
    // A waiting stream can be withdrawn before it ever gets the MCU.
    s.deactivate(4);
    assert!(!s.is_active(4));
    let one = |_| Some(Packet { out: 100, back: 0 });
    assert_eq!(s.next_with(0, one).unwrap().queue, 3);
    s.deactivate(3);
    assert_eq!(s.mcu_of(3), None);
    assert_eq!(
        s.mcu_of(5),
        Some(0),
        "the next waiting queue, not the withdrawn one"
    );
    assert_eq!(s.next_with(1000, one).unwrap().queue, 5);
    s.deactivate(5);
    assert!(s.next_with(2000, one).is_none());
    // And the freed MCU serves ordinary commands again.
    let f = distinct_flows(&s, 1)[0];
    s.enqueue(put(f, 0, 100, 100)).unwrap();
    let p = s.next(3000).unwrap();
    assert!(p.last_of_command);
    assert!(
        s.enqueue(Command {
            kind: Kind::Stream,
            ..put(f, 0, 1, 1)
        })
        .is_err()
    );
    assert_eq!(s.activate(0, 9), Err("no such class"));
    assert_eq!(s.activate(1 << 20, 0), Err("queue beyond flow_queues"));
}

#[test]
fn a_stream_read_larger_than_the_absorb_burst_goes_alone_and_the_rate_holds() {
    // Whole 64 KiB READs (one request each, as a RoCE requester sends them) against a 16 KiB
    // absorb burst at 2 Gbit/s (0.25 B/ns): each goes when the bucket is full, and the debt
    // it leaves holds the next one back, so the average stays at the absorb rate.
    let absorb_bps = 2_000_000_000;
    let cfg = ShaperConfig {
        absorb_bps: Some(absorb_bps),
        absorb_burst_bytes: 16_384,
        ..ShaperConfig::new(vec![class(0, LINK, 16_384, false)])
    };
    let mut s = Shaper::new(cfg).unwrap();
    for q in 0..4 {
        s.activate(q, 0).unwrap();
    }
    let mut back = 0u64;
    let mut times = Vec::new();
    let end = drive_streams(
        &mut s,
        10_000_000,
        |_, _| {
            Some(Packet {
                out: 64,
                back: 65_536,
            })
        },
        |s, now, p| {
            s.set_outstanding(p.mcu, 0);
            back += p.response_bytes as u64;
            times.push(now);
        },
    );
    // 10 ms at 0.25 B/ns is 2.5 MB: 38 READs, plus the first (the bucket starts full).
    assert_eq!(back / 65_536, 39, "{back} in {end} ns");
    // Spaced by a READ's worth of tokens (65 536 B / 0.25 B/ns = 262 144 ns) after the first.
    for w in times.windows(2).skip(1) {
        assert_eq!(w[1] - w[0], 262_144);
    }
}

#[test]
fn a_link_bucket_holds_all_classes_to_the_port_rate_and_shares_it_by_assured_rates() {
    // The shaper's own link at 2 Gbit/s (0.25 B/ns), called far more often than that: the
    // classes get their assured 75/25 % of the link, not their ceilings.
    let link = 2_000_000_000;
    let cfg = ShaperConfig {
        link_bps: Some(link),
        link_burst_bytes: 4096,
        ..ShaperConfig::new(vec![
            class(link * 3 / 4, LINK, 16_384, false),
            class(link / 4, LINK, 16_384, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let f = distinct_flows(&s, 2);
    s.enqueue(put(f[0], 0, HUGE, 4096)).unwrap();
    s.enqueue(put(f[1], 1, HUGE, 4096)).unwrap();
    let mut bytes = [0u64; 2];
    // Asked every 100 ns for 10 ms: 100 000 calls.
    for step in 0..100_000u64 {
        if let Some(p) = s.next(step * 100) {
            s.completed(p.mcu, 1);
            bytes[p.class as usize] += p.packet_bytes as u64;
        }
    }
    let total = bytes[0] + bytes[1];
    // 10 ms at 0.25 B/ns is 2.5 MB, plus the burst and one packet of debt.
    assert!(
        (2_500_000..=2_500_000 + 2 * 4096).contains(&total),
        "{total}"
    );
    let share = bytes[0] as f64 / total as f64;
    assert!((share - 0.75).abs() < 0.01, "class 0 got {share}");
    assert_eq!(
        s.next_ready_at(10_000_000).map(|t| t >= 10_000_000),
        Some(true)
    );
    let bad = ShaperConfig {
        link_bps: Some(0),
        ..ShaperConfig::new(vec![class(0, LINK, 1, false)])
    };
    assert_eq!(bad.validate().unwrap_err().field, "link_bps");
}

#[test]
fn many_mcus_in_several_classes_arbitrate_as_before() {
    // More MCUs than one 64-bit word, three classes (one strict), streams beside commands,
    // caps and absorb stalls: a digest of every pick and every counter, recorded from the
    // arbitration before it visited a class's MCUs by bitset (any change moves it).
    let cfg = ShaperConfig {
        mcus: 70,
        outstanding_cap: 4,
        flow_queues: 200,
        flow_queue_depth: 4,
        quantum_bytes: 4096,
        absorb_bps: Some(LINK / 2),
        absorb_burst_bytes: 16_384,
        ..ShaperConfig::new(vec![
            class(0, LINK / 8, 8192, true),
            class(LINK / 4, LINK, 8192, false),
            class(LINK / 2, LINK / 2, 8192, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    let mut rng = 0x0014_70aa_u64;
    for q in 190..200 {
        s.activate(q, (q % 3) as u8).unwrap();
    }
    let mut digest = 0u64;
    let eat = |d: &mut u64, x: u64| *d = (*d ^ x).wrapping_mul(0x0100_0000_01b3);
    let mut now = 0u64;
    for step in 0..40_000u64 {
        for _ in 0..2 {
            let flow = rand(&mut rng) % 150;
            let class = (rand(&mut rng) % 3) as u8;
            let mtu = [256, 1024, 4096][(rand(&mut rng) % 3) as usize];
            let size = rand(&mut rng) % 20_000;
            let _ = s.enqueue(if rand(&mut rng).is_multiple_of(2) {
                put(flow, class, size, mtu)
            } else {
                get(flow, class, size, mtu)
            });
        }
        let salt = rand(&mut rng);
        let peek = |q: usize| {
            let h = mix(q as u64 ^ salt);
            (!h.is_multiple_of(4)).then_some(Packet {
                out: (h % 4096) as u32 + 1,
                back: if h & 16 == 0 { 0 } else { (h % 8192) as u32 },
            })
        };
        match s.next_with(now, peek) {
            Some(p) => {
                for x in [
                    p.mcu as u64,
                    p.queue as u64,
                    p.class as u64,
                    p.packet_bytes as u64,
                    p.response_bytes as u64,
                    p.last_of_command as u64,
                ] {
                    eat(&mut digest, x);
                }
                now += p.packet_bytes as u64;
            }
            None => now = s.next_ready_at(now).unwrap_or(now + 500).max(now + 1),
        }
        let m = (rand(&mut rng) % 70) as usize;
        s.completed(m, (rand(&mut rng) % 3) as u32);
        if step % 5000 == 4999 {
            let q = 190 + (step / 5000) as usize % 10;
            s.deactivate(q);
            s.activate(q, (step % 3) as u8).unwrap();
        }
    }
    let mut counters: Vec<Counters> = (0..3).map(|c| s.class_counters(c)).collect();
    // The run went through every kind of wait, in every class.
    for k in &counters {
        assert!(
            k.packets > 0 && k.waited_cap > 0 && k.waited_flow > 0,
            "{k:?}"
        );
    }
    assert!(counters.iter().all(|k| k.waited_in > 0) && counters[0].waited_out > 0);
    counters.extend((0..70).map(|m| s.mcu_counters(m)));
    for k in counters {
        for x in [
            k.packets,
            k.bytes,
            k.response_bytes,
            k.waited_out,
            k.waited_in,
            k.waited_cap,
            k.waited_flow,
        ] {
            eat(&mut digest, x);
        }
    }
    eat(&mut digest, now);
    assert_eq!(digest, GOLDEN_MANY_MCUS_DIGEST, "{digest:#x}");
}

const GOLDEN_MANY_MCUS_DIGEST: u64 = 0xfde5_64d0_87f5_7342;

#[test]
fn read_mcus_waiting_for_absorb_tokens_share_them_equally() {
    // Four READ streams (MCUs 0-3) and a PUT stream in another class (MCU 4), twelve idle
    // MCUs after them. The READs wait for absorb tokens nearly all the time; when tokens come,
    // the next READ MCU in turn gets them, not the one after the idle gap.
    let cfg = ShaperConfig {
        absorb_bps: Some(2_000_000_000),
        absorb_burst_bytes: 2 * 65_536,
        ..ShaperConfig::new(vec![
            class(0, LINK, 16_384, false),
            class(0, LINK, 16_384, false),
        ])
    };
    let mut s = Shaper::new(cfg).unwrap();
    for q in 0..4 {
        s.activate(q, 0).unwrap();
    }
    s.activate(4, 1).unwrap();
    assert_eq!(s.mcu_of(4), Some(4));
    let mut reads = [0u64; 4];
    let mut order = Vec::new();
    let mut now = 0;
    // Asked every 250 ns, as a busy worker would, for 20 ms.
    while now < 20_000_000 {
        let pick = s.next_with(now, |q| {
            Some(if q < 4 {
                Packet {
                    out: 74,
                    back: 65_536,
                }
            } else {
                Packet { out: 4096, back: 0 }
            })
        });
        if let Some(p) = pick {
            s.set_outstanding(p.mcu, 0);
            if p.queue < 4 {
                reads[p.queue] += 1;
                order.push(p.queue);
            }
        }
        now += 250;
    }
    // 20 ms at 0.25 B/ns is 5 MB: 76 READs, plus the bucket's two.
    assert_eq!(reads.iter().sum::<u64>(), 78, "{reads:?}");
    let (lo, hi) = (reads.iter().min().unwrap(), reads.iter().max().unwrap());
    assert!(hi - lo <= 1, "{reads:?}");
    // And in turn, not merely equal on average: any four READs in a row are one of each (an
    // MCU served in runs makes its queue pair's READs wait many turns, others none).
    for w in order.windows(4) {
        let mut q = w.to_vec();
        q.sort_unstable();
        assert_eq!(q, [0, 1, 2, 3], "{order:?}");
    }
}

/// A PFC frame from the link partner naming priority 3 with `quanta` (0: resume).
fn pfc3(quanta: u16) -> wire::pfc::PfcRepr {
    let mut q = [0u16; 8];
    q[3] = quanta;
    wire::pfc::PfcRepr {
        src_mac: wire::EthernetAddress([2, 0, 0, 0, 0, 10]),
        enabled: 1 << 3,
        quanta: q,
    }
}

#[test]
fn a_pfc_pause_stops_only_the_class_of_its_priority_until_it_ends_or_is_resumed() {
    let mut classes = vec![
        class(LINK / 2, LINK, 8000, false),
        class(LINK / 2, LINK, 8000, false),
    ];
    classes[0].pfc_priority = Some(3);
    classes[1].pfc_priority = Some(5);
    let mut s = Shaper::new(ShaperConfig {
        mcus: 2,
        ..ShaperConfig::new(classes)
    })
    .unwrap();
    let flows = distinct_flows(&s, 2);
    for (i, &f) in flows.iter().enumerate() {
        s.enqueue(put(f, i as u8, HUGE, 1000)).unwrap();
    }
    // 1 000 quanta of 512 bit times at the default 10 Gbit/s: 51 200 ns.
    assert_eq!(s.pfc(0, &pfc3(1000)), 1, "one class has priority 3");
    let mut now = 0;
    let mut picks: Vec<(u64, u8)> = Vec::new();
    let step = |s: &mut Shaper, now: &mut u64, until: u64, picks: &mut Vec<(u64, u8)>| {
        while *now < until {
            match s.next(*now) {
                Some(p) => {
                    s.completed(p.mcu, 1);
                    picks.push((*now, p.class));
                    *now += u64::from(p.packet_bytes).max(1);
                }
                None => match s.next_ready_at(*now) {
                    Some(t) if t > *now => *now = t.min(until),
                    _ => break,
                },
            }
        }
    };
    step(&mut s, &mut now, 51_200, &mut picks);
    assert!(!picks.is_empty());
    assert!(
        picks.iter().all(|&(_, c)| c == 1),
        "only the other class goes during the pause"
    );
    assert!(s.class_counters(0).waited_pfc > 0);
    assert_eq!(s.class_counters(0).pfc_pauses, 1);
    picks.clear();
    step(&mut s, &mut now, 150_000, &mut picks);
    let first0 = picks
        .iter()
        .find(|&&(_, c)| c == 0)
        .expect("class 0 resumes");
    assert!(first0.0 >= 51_200, "{first0:?}");
    // Both share the link again: within a few packets of half each.
    let n0 = picks.iter().filter(|&&(_, c)| c == 0).count() as i64;
    let n1 = picks.len() as i64 - n0;
    assert!((n0 - n1).abs() <= 2, "{n0} against {n1}");
    // The longest pause (3.36 ms), ended early by a resume (quanta 0).
    assert_eq!(s.pfc(now, &pfc3(0xffff)), 1);
    picks.clear();
    step(&mut s, &mut now, 200_000, &mut picks);
    assert!(picks.iter().all(|&(_, c)| c == 1));
    assert_eq!(s.pfc(now, &pfc3(0)), 0, "a resume pauses nothing");
    picks.clear();
    step(&mut s, &mut now, 210_000, &mut picks);
    assert!(picks.iter().any(|&(_, c)| c == 0), "resumed at once");
    assert_eq!(s.class_counters(0).pfc_pauses, 2);
    assert_eq!(s.class_counters(1).pfc_pauses, 0);
}

#[test]
fn a_paused_class_alone_waits_for_the_end_of_its_pause() {
    let mut classes = vec![class(0, LINK, 8000, true)];
    classes[0].pfc_priority = Some(3);
    let mut s = Shaper::new(ShaperConfig {
        mcus: 1,
        ..ShaperConfig::new(classes)
    })
    .unwrap();
    s.enqueue(put(1, 0, 4000, 1000)).unwrap();
    s.pfc(1_000, &pfc3(100));
    // Strict classes are held too; the timer is set for the end of the pause.
    assert!(s.next(1_000).is_none());
    assert_eq!(s.next_ready_at(1_000), Some(1_000 + 5_120));
    assert!(s.next(1_000 + 5_120).is_some());
}

/// Rates configured for a port are held across its workers ([`PortShares`]): two workers'
/// shapers, one class capped at 1 Gbit/s for the port, rebalancing every 10 µs. For 5 ms only
/// worker 0 has work and gets the whole 1 Gbit/s; then both have, and each gets half, the port
/// still 1 Gbit/s. Without the shares the two would send 2 Gbit/s between them.
#[test]
fn a_port_s_rates_are_held_across_its_workers() {
    let shares = PortShares::new(2, 1);
    let worker = |me| {
        let cfg = ShaperConfig::new(vec![class(0, 1_000_000_000, 16_384, false)]);
        let mut sh = Shaper::new(cfg).unwrap();
        sh.share_port(shares.clone(), me, 10_000);
        sh
    };
    let mut w = [worker(0), worker(1)];
    w[0].enqueue(put(1, 0, HUGE, 1000)).unwrap();
    const HALF: u64 = 5_000_000;
    // Bytes sent in each half of the run, per worker.
    let mut sent = [[0u64; 2]; 2];
    for t in (0..2 * HALF).step_by(1000) {
        if t == HALF {
            w[1].enqueue(put(2, 0, HUGE, 1000)).unwrap();
        }
        let half = if t >= HALF { 1 } else { 0 };
        for (k, sh) in w.iter_mut().enumerate() {
            sh.rebalance(t);
            while let Some(p) = sh.next(t) {
                sent[half][k] += u64::from(p.packet_bytes);
                sh.completed(p.mcu, 1);
            }
        }
    }
    // 1 Gbit/s for 5 ms: 625 000 bytes (plus the 16 KiB burst at the start).
    let port = 625_000f64;
    let within = |got: u64, want: f64, tol: f64| (got as f64 - want).abs() <= want * tol;
    assert!(within(sent[0][0], port, 0.05), "alone: {:?}", sent[0]);
    assert_eq!(sent[0][1], 0);
    let both = sent[1][0] + sent[1][1];
    assert!(within(both, port, 0.05), "together: {:?}", sent[1]);
    for k in 0..2 {
        assert!(
            within(sent[1][k], port / 2.0, 0.1),
            "worker {k}: {:?}",
            sent[1]
        );
    }
}
