//! The per-packet call of the list-processing engine does not allocate: 30 000 arrivals
//! against 1 000 posted receives (10 % wildcards) hitting persistent entries, the
//! persistent-entry cache, the overflow list and a full unexpected list, plus use-once
//! receives matched and re-posted, make zero heap allocations once the engine is built.
//! (A counting global allocator from the `allocation-counter` crate; this test binary only.)

use portico::lpe::{
    DeepList, DropReason, EndpointConfig, EndpointIndex, EngineConfig, EngineId, EventRing,
    IncomingHeader, ListKind, MatchEntry, MatchId, MatchOutcome, MatchShard, Options, ProcessId,
};

const EP: EndpointIndex = EndpointIndex(0);
const SOURCE_FIELD: u64 = 0xff_ffff << 24;

fn bits(source: u32, tag: u64) -> u64 {
    (5 << 48) | (u64::from(source) << 24) | tag
}

fn receive(k: u64, options: Options) -> MatchEntry {
    let source = (k % 64) as u32;
    let e = MatchEntry::new(bits(source, k), k << 16, 4096, k).with_options(options);
    if k.is_multiple_of(10) {
        e.with_ignore(SOURCE_FIELD).with_source(MatchId::ANY)
    } else {
        e.with_source(MatchId::rank(source))
    }
}

#[test]
fn matching_a_packet_makes_no_allocation() {
    let mut engine = MatchShard::<DeepList>::new(EngineId(0), EngineConfig::default());
    engine
        .add_endpoint(
            EP,
            EndpointConfig {
                max_priority: 2048,
                max_unexpected: 1024,
                ..EndpointConfig::default()
            },
        )
        .unwrap();
    let mut events = EventRing::new(256);
    let persistent = Options::OP_PUT;
    let once = Options::OP_PUT | Options::USE_ONCE;
    for k in 0..1000u64 {
        let options = if k < 500 { persistent } else { once };
        engine
            .append(EP, ListKind::Priority, receive(k, options), &mut events)
            .unwrap();
    }
    // A catch-all overflow entry, as MPI on Portals posts: what matches nothing lands there
    // and its header goes to the unexpected list (until that list is full).
    let catch_all = MatchEntry::new(0, 1 << 40, 1 << 30, 9999)
        .with_ignore(u64::MAX)
        .with_source(MatchId::ANY)
        .with_options(persistent);
    engine
        .append(EP, ListKind::Overflow, catch_all, &mut events)
        .unwrap();
    events.clear();

    let (mut priority, mut overflow, mut full, mut other) = (0u64, 0u64, 0u64, 0u64);
    let info = allocation_counter::measure(|| {
        for i in 0..30_000u64 {
            let k = (i * 7919) % 1200; // 1000..1200 match no receive: overflow
            let source = (k % 64) as u32;
            let hdr = IncomingHeader::put(ProcessId::rank(source), bits(source, k), 64);
            let out = engine.match_incoming(EP, &hdr, &mut events);
            match out {
                MatchOutcome::Delivered(d) if d.list == ListKind::Priority => {
                    // Entry k's buffer starts at k << 16 and the offset comes from the message.
                    assert_eq!((d.cookie, d.address, d.mlength), (k, k << 16, 64));
                    priority += 1;
                }
                MatchOutcome::Delivered(d) if d.list == ListKind::Overflow => overflow += 1,
                MatchOutcome::Dropped(DropReason::UnexpectedListFull) => full += 1,
                _ => other += 1,
            }
            // A consumed use-once receive is re-posted, as an MPI library would.
            if (500..1000).contains(&k) {
                let _ = engine.append(EP, ListKind::Priority, receive(k, once), &mut events);
            }
            if events.len() > 200 {
                events.clear();
            }
        }
    });
    assert_eq!(
        info.count_total, 0,
        "allocations on the match path: {info:?}"
    );
    // 30 000 arrivals over k = 0..1200: 25 000 match a receive; 5 000 match none and land
    // in the overflow buffer while the unexpected list (1 024 headers) has room.
    assert_eq!(priority, 25_000);
    assert_eq!(overflow, 1_024);
    assert_eq!(full, 5_000 - 1_024);
    assert_eq!(other, 0);
}
