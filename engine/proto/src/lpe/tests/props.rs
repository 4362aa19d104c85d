//! Property tests: random sequences of appends, arrivals, searches, unlinks
//! and mode switches, with wildcards, use-once and persistent entries,
//! several shard layouts and cache sizes; every implementation must produce
//! the reference model's outcomes, buffer placement and events.

use proptest::prelude::*;

use super::harness::{Op, Systems};
use crate::lpe::{
    DeepList, EndpointConfig, EndpointIndex, ID_ANY, IncomingHeader, LinearList, ListKind,
    MatchEntry, MatchId, MatchList, Options, ProcessId, SearchMode,
};

/// Match bits for a small tag space, spread over low and high bits so the
/// hashed bins see realistic keys (context in the top bits, tag below).
fn bits(tag: u64) -> u64 {
    (tag << 48) | tag
}

fn source(choice: u8) -> MatchId {
    match choice {
        0..=2 => MatchId::rank(u32::from(choice)),
        3 => MatchId::ANY,
        _ => MatchId {
            nid: ID_ANY,
            pid: 0,
        },
    }
}

fn ignore(choice: u8) -> u64 {
    match choice {
        0 => 0,
        1 => 1,
        2 => 1 << 48,
        3 => u64::MAX,
        4 => 0xffff,
        5 => 3,
        _ => (1 << 48) | 1,
    }
}

fn entry_strategy() -> impl Strategy<Value = MatchEntry> {
    (
        0u64..3,
        prop_oneof![8 => Just(0u8), 2 => 1u8..4, 1 => 4u8..7],
        prop_oneof![3 => 0u8..3, 1 => 3u8..5],
        0u64..48,
        any::<[bool; 5]>(),
        0u64..16,
        prop_oneof![6 => Just(3u32), 1 => Just(1u32), 1 => Just(2u32)],
    )
        .prop_map(|(tag, ign, src, length, flags, min_free, perm)| {
            let [use_once, manage_local, no_truncate, no_link, no_unlink] = flags;
            let mut options = Options::from_bits(perm);
            if use_once {
                options |= Options::USE_ONCE;
            }
            if manage_local {
                options |= Options::MANAGE_LOCAL;
            }
            if no_truncate {
                options |= Options::NO_TRUNCATE;
            }
            if no_link {
                options |= Options::EVENT_LINK_DISABLE;
            }
            if no_unlink {
                options |= Options::EVENT_UNLINK_DISABLE;
            }
            MatchEntry::new(bits(tag), 0, length, 0)
                .with_ignore(ignore(ign))
                .with_source(source(src))
                .with_options(options)
                .with_min_free(min_free)
        })
}

fn header_strategy() -> impl Strategy<Value = IncomingHeader> {
    (
        0u32..3,
        0u64..3,
        0u64..40,
        0u64..8,
        prop::bool::weighted(0.15),
        any::<u16>(),
    )
        .prop_map(|(rank, tag, rlength, off, get, data)| {
            let p = ProcessId::rank(rank);
            let h = if get {
                IncomingHeader::get(p, bits(tag), rlength)
            } else {
                IncomingHeader::put(p, bits(tag), rlength)
            };
            h.with_remote_offset(off).with_hdr_data(u64::from(data))
        })
}

fn append_strategy() -> impl Strategy<Value = Op> {
    (
        0usize..3,
        prop::bool::weighted(0.7),
        prop::bool::weighted(0.6),
        entry_strategy(),
    )
        .prop_map(|(ep, prio, catch_all, mut entry)| {
            let list = if prio {
                ListKind::Priority
            } else {
                ListKind::Overflow
            };
            if list == ListKind::Overflow && catch_all {
                // MPI posts catch-all overflow buffers.
                entry.ignore_bits = u64::MAX;
                entry.source = MatchId::ANY;
            }
            Op::Append { ep, list, entry }
        })
}

/// Some posted entries first, then a random mix of everything.
fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    (
        prop::collection::vec(append_strategy(), 0..16),
        prop::collection::vec(op_strategy(), 1..80),
    )
        .prop_map(|(mut setup, rest)| {
            setup.extend(rest);
            setup
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let ep = 0usize..3;
    prop_oneof![
        6 => append_strategy(),
        12 => (ep.clone(), header_strategy()).prop_map(|(ep, hdr)| Op::Arrive { ep, hdr }),
        2 => (ep.clone(), entry_strategy(), any::<bool>()).prop_map(|(ep, probe, del)| Op::Search {
            ep,
            probe,
            mode: if del { SearchMode::SearchDelete } else { SearchMode::SearchOnly },
        }),
        3 => any::<usize>().prop_map(|pick| Op::Unlink { pick }),
        1 => ep.clone().prop_map(|ep| Op::EnterSoftware { ep }),
        2 => ep.clone().prop_map(|ep| Op::Resume { ep }),
        3 => ep.clone().prop_map(|ep| Op::PopSoftware { ep }),
        2 => ep.prop_map(|ep| Op::Enable { ep }),
    ]
}

fn endpoints() -> Vec<(EndpointIndex, EndpointConfig)> {
    let small = EndpointConfig {
        matching: true,
        flow_control: false,
        max_priority: 8,
        max_overflow: 3,
        max_unexpected: 4,
        max_software_requests: 3,
        start_disabled: false,
    };
    vec![
        (EndpointIndex(0), small),
        (
            EndpointIndex(3),
            EndpointConfig {
                flow_control: true,
                ..small
            },
        ),
        (
            EndpointIndex(7),
            EndpointConfig {
                matching: false,
                ..small
            },
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn engines_agree_with_reference(
        ops in ops_strategy(),
        engines in 1usize..4,
        layout in prop::collection::vec(0usize..3, 3),
        cache in prop_oneof![Just(0usize), Just(1), Just(2), Just(256)],
    ) {
        let mut systems = Systems::new(&endpoints(), engines, &layout, cache);
        for (n, mut op) in ops.into_iter().enumerate() {
            // Cookies and buffers are unique per step so events name their entry.
            if let Op::Append { entry, .. } | Op::Search { probe: entry, .. } = &mut op {
                entry.cookie = n as u64 + 1;
                entry.start = (n as u64 + 1) << 20;
            }
            if let Err(msg) = systems.step(&op) {
                return Err(TestCaseError::fail(format!("step {n}: {msg}")));
            }
        }
    }

    /// At larger depth, the deep structure's first match (and whether a
    /// no-truncate entry was skipped before it) is the linear walk's.
    #[test]
    fn deep_find_equals_linear_find(
        entries in prop::collection::vec(entry_strategy(), 1..300),
        removals in prop::collection::vec(any::<usize>(), 0..60),
        headers in prop::collection::vec(header_strategy(), 1..60),
    ) {
        let mut deep = DeepList::with_capacity(entries.len());
        let mut linear = LinearList::with_capacity(entries.len());
        let mut ids = Vec::new();
        for (i, mut e) in entries.into_iter().enumerate() {
            e.cookie = i as u64;
            ids.push((deep.push(&e).expect("room"), linear.push(&e).expect("room")));
        }
        for r in removals {
            let (d, l) = ids[r % ids.len()];
            prop_assert_eq!(deep.remove(d), linear.remove(l));
        }
        prop_assert_eq!(deep.len(), linear.len());
        for h in &headers {
            let d = deep.find(h);
            let l = linear.find(h);
            prop_assert_eq!(d.hit.map(|id| deep.get(id).expect("live").cookie),
                            l.hit.map(|id| linear.get(id).expect("live").cookie));
            prop_assert_eq!(d.length_skip_before_hit, l.length_skip_before_hit);
        }
    }
}
