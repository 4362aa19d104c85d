//! One test per rule: each sets up the lists, sends messages and checks
//! outcomes, buffer placement and events.

use crate::lpe::{
    Appended, Command, CompletionKind, DeepList, Delivery, DropReason, EndpointConfig,
    EndpointIndex, EndpointTable, EngineConfig, EngineId, EntryHandle, Event, EventKind, EventRing,
    IncomingHeader, LinearList, ListKind, LpeError, MatchEntry, MatchId, MatchList, MatchOutcome,
    MatchShard, NiFail, Options, ProcessId, Request, SearchMode, TrafficClass, Worker,
    build_shards,
};

const EP: EndpointIndex = EndpointIndex(1);

fn engine_with(config: EndpointConfig, cache_entries: usize) -> MatchShard {
    let mut e = MatchShard::new(
        EngineId(0),
        EngineConfig {
            cache_entries,
            ..EngineConfig::default()
        },
    );
    e.add_endpoint(EP, config).expect("new endpoint");
    e
}

fn engine() -> MatchShard {
    engine_with(EndpointConfig::default(), 256)
}

fn rank(r: u32) -> ProcessId {
    ProcessId::rank(r)
}

fn put(r: u32, bits: u64, len: u64) -> IncomingHeader {
    IncomingHeader::put(rank(r), bits, len)
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

fn delivered(o: MatchOutcome) -> Delivery {
    match o {
        MatchOutcome::Delivered(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

fn link(e: &mut MatchShard, list: ListKind, entry: MatchEntry) {
    let mut ev = Vec::new();
    e.append(EP, list, entry, &mut ev).expect("append");
}

/// Appends `entry` to `ep`'s priority list, which must link it: its handle.
fn linked(
    e: &mut MatchShard,
    ep: EndpointIndex,
    entry: MatchEntry,
    ev: &mut Vec<Event>,
) -> EntryHandle {
    match e.append(ep, ListKind::Priority, entry, ev).unwrap() {
        Appended::Linked { handle, .. } => handle,
        other => panic!("{other:?}"),
    }
}

/// A catch-all overflow buffer like the one MPI-on-Portals always posts.
fn catch_all(cookie: u64, start: u64, length: u64) -> MatchEntry {
    MatchEntry::new(0, start, length, cookie)
        .with_ignore(u64::MAX)
        .with_options(Options::OP_PUT | Options::OP_GET | Options::MANAGE_LOCAL)
}

#[test]
fn priority_hit_places_data_and_reports_fields() {
    let mut e = engine();
    link(
        &mut e,
        ListKind::Priority,
        MatchEntry::new(7, 0x1000, 64, 11),
    );
    let mut ev = Vec::new();
    let hdr = put(2, 7, 16).with_remote_offset(8).with_hdr_data(99);
    let d = delivered(e.match_incoming(EP, &hdr, &mut ev));
    assert_eq!(
        (d.cookie, d.address, d.offset, d.mlength),
        (11, 0x1008, 8, 16)
    );
    assert_eq!(kinds(&ev), [EventKind::Put]);
    let p = ev[0];
    assert_eq!(
        (p.match_bits, p.rlength, p.mlength, p.remote_offset),
        (7, 16, 16, 8)
    );
    assert_eq!(
        (p.initiator, p.hdr_data, p.start, p.list),
        (rank(2), 99, 0x1008, ListKind::Priority)
    );
}

#[test]
fn append_after_unexpected_claims_header_atomically() {
    let mut e = engine();
    link(&mut e, ListKind::Overflow, catch_all(100, 0x10_0000, 4096));
    let mut ev = Vec::new();
    let d = delivered(e.match_incoming(EP, &put(1, 5, 10), &mut ev));
    assert_eq!((d.list, d.address), (ListKind::Overflow, 0x10_0000));
    assert_eq!(kinds(&ev), [EventKind::Put]);
    assert_eq!(ev[0].list, ListKind::Overflow);
    assert_eq!(e.endpoint(EP).unwrap().unexpected().len(), 1);

    // The use-once receive finds the header, is never linked.
    ev.clear();
    let recv = MatchEntry::new(5, 0x2000, 64, 1).with_options(Options::OP_PUT | Options::USE_ONCE);
    let r = e.append(EP, ListKind::Priority, recv, &mut ev).unwrap();
    assert_eq!(r, Appended::ConsumedUnexpected);
    assert_eq!(kinds(&ev), [EventKind::PutOverflow, EventKind::AutoUnlink]);
    assert_eq!(
        (ev[0].cookie, ev[0].start, ev[0].mlength, ev[0].rlength),
        (1, 0x10_0000, 10, 10)
    );
    assert_eq!(e.endpoint(EP).unwrap().list(ListKind::Priority).len(), 0);
    assert!(e.endpoint(EP).unwrap().unexpected().is_empty());

    // With nothing unexpected, the same receive links.
    ev.clear();
    let r = e.append(EP, ListKind::Priority, recv, &mut ev).unwrap();
    assert!(matches!(
        r,
        Appended::Linked {
            unexpected_matched: 0,
            ..
        }
    ));
    assert_eq!(kinds(&ev), [EventKind::Link]);
}

#[test]
fn persistent_append_claims_every_matching_header_then_links() {
    let mut e = engine();
    link(&mut e, ListKind::Overflow, catch_all(100, 0, 4096));
    let mut ev = Vec::new();
    for (src, bits) in [(1, 5), (2, 6), (3, 5)] {
        e.match_incoming(EP, &put(src, bits, 4), &mut ev);
    }
    ev.clear();
    let r = e
        .append(
            EP,
            ListKind::Priority,
            MatchEntry::new(5, 0x9000, 64, 2),
            &mut ev,
        )
        .unwrap();
    assert!(matches!(
        r,
        Appended::Linked {
            unexpected_matched: 2,
            ..
        }
    ));
    assert_eq!(
        kinds(&ev),
        [
            EventKind::PutOverflow,
            EventKind::PutOverflow,
            EventKind::Link
        ]
    );
    assert_eq!((ev[0].initiator, ev[1].initiator), (rank(1), rank(3)));
    assert_eq!(e.endpoint(EP).unwrap().unexpected().len(), 1);
}

#[test]
fn use_once_unlinks_and_persistent_stays() {
    let mut e = engine();
    let once = MatchEntry::new(1, 0, 8, 1).with_options(Options::OP_PUT | Options::USE_ONCE);
    link(&mut e, ListKind::Priority, once);
    link(&mut e, ListKind::Priority, MatchEntry::new(1, 0x100, 8, 2));
    let mut ev = Vec::new();
    let first = delivered(e.match_incoming(EP, &put(0, 1, 4), &mut ev));
    assert!(first.unlinked && first.cookie == 1);
    assert_eq!(kinds(&ev), [EventKind::Put, EventKind::AutoUnlink]);
    for _ in 0..3 {
        ev.clear();
        let d = delivered(e.match_incoming(EP, &put(0, 1, 4), &mut ev));
        assert!(!d.unlinked && d.cookie == 2);
        assert_eq!(kinds(&ev), [EventKind::Put]);
    }
}

#[test]
fn event_disables_leave_out_the_link_and_auto_unlink_events_only() {
    let mut e = engine();
    let once = Options::OP_PUT | Options::USE_ONCE;
    let (no_link, no_unlink) = (Options::EVENT_LINK_DISABLE, Options::EVENT_UNLINK_DISABLE);
    let mut ev = Vec::new();
    // Each option alone, then both: which of Link and AutoUnlink each entry reports.
    for (k, options, on_append, on_match) in [
        (
            1,
            once,
            &[EventKind::Link][..],
            &[EventKind::Put, EventKind::AutoUnlink][..],
        ),
        (
            2,
            once | no_link,
            &[],
            &[EventKind::Put, EventKind::AutoUnlink],
        ),
        (3, once | no_unlink, &[EventKind::Link], &[EventKind::Put]),
        (4, once | no_link | no_unlink, &[], &[EventKind::Put]),
    ] {
        ev.clear();
        let entry = MatchEntry::new(k, 0x100 * k, 8, k).with_options(options);
        e.append(EP, ListKind::Priority, entry, &mut ev).unwrap();
        assert_eq!(kinds(&ev), on_append, "entry {k} appended");
        ev.clear();
        let d = delivered(e.match_incoming(EP, &put(0, k, 4), &mut ev));
        assert!(d.unlinked && d.cookie == k);
        assert_eq!(kinds(&ev), on_match, "entry {k} matched");
    }
    // A use-once receive that consumes an unexpected header: its claim, no AutoUnlink.
    link(&mut e, ListKind::Overflow, catch_all(100, 0x10_0000, 4096));
    ev.clear();
    e.match_incoming(EP, &put(0, 9, 4), &mut ev);
    ev.clear();
    let quiet = MatchEntry::new(9, 0x900, 8, 9).with_options(once | no_link | no_unlink);
    let r = e.append(EP, ListKind::Priority, quiet, &mut ev).unwrap();
    assert!(matches!(r, Appended::ConsumedUnexpected), "{r:?}");
    assert_eq!(kinds(&ev), [EventKind::PutOverflow]);
    // The overflow list's Link too.
    ev.clear();
    let overflow = catch_all(101, 0x20_0000, 4096).with_options(Options::OP_PUT | no_link);
    e.append(EP, ListKind::Overflow, overflow, &mut ev).unwrap();
    assert!(ev.is_empty(), "{ev:?}");
}

#[test]
fn manage_local_advances_and_min_free_unlinks_then_auto_free() {
    let mut e = engine();
    let ovf = catch_all(50, 0x4000, 100).with_min_free(30);
    link(&mut e, ListKind::Overflow, ovf);
    let mut ev = Vec::new();
    let a = delivered(e.match_incoming(EP, &put(0, 1, 40), &mut ev));
    assert_eq!((a.offset, a.address, a.unlinked), (0, 0x4000, false));
    let b = delivered(e.match_incoming(EP, &put(0, 2, 40), &mut ev));
    // 100 - 80 = 20 < 30: the buffer unlinks itself with this message.
    assert_eq!((b.offset, b.address, b.unlinked), (40, 0x4028, true));
    assert_eq!(
        kinds(&ev),
        [EventKind::Put, EventKind::Put, EventKind::AutoUnlink]
    );

    // AUTO_FREE comes once the last header stored in it is claimed.
    ev.clear();
    let r1 = MatchEntry::new(1, 0, 64, 1).with_options(Options::OP_PUT | Options::USE_ONCE);
    e.append(EP, ListKind::Priority, r1, &mut ev).unwrap();
    assert_eq!(kinds(&ev), [EventKind::PutOverflow, EventKind::AutoUnlink]);
    ev.clear();
    assert_eq!(
        e.search(
            EP,
            MatchEntry::new(2, 0, 64, 9),
            SearchMode::SearchDelete,
            &mut ev
        ),
        Ok(1)
    );
    assert_eq!(kinds(&ev), [EventKind::PutOverflow, EventKind::AutoFree]);
    assert_eq!(ev[1].cookie, 50);
}

#[test]
fn truncation_cuts_mlength_to_room_left() {
    let mut e = engine();
    link(&mut e, ListKind::Priority, MatchEntry::new(3, 0x100, 32, 1));
    let mut ev = Vec::new();
    let d = delivered(e.match_incoming(EP, &put(0, 3, 100).with_remote_offset(20), &mut ev));
    assert_eq!((d.mlength, d.address), (12, 0x114));
    assert_eq!((ev[0].rlength, ev[0].mlength), (100, 12));
    let d = delivered(e.match_incoming(EP, &put(0, 3, 100).with_remote_offset(40), &mut ev));
    assert_eq!(d.mlength, 0);
}

#[test]
fn no_truncate_entry_too_small_is_skipped() {
    let mut e = engine();
    let small =
        MatchEntry::new(3, 0x100, 8, 1).with_options(Options::OP_PUT | Options::NO_TRUNCATE);
    link(&mut e, ListKind::Priority, small);
    link(&mut e, ListKind::Priority, MatchEntry::new(3, 0x900, 64, 2));
    let mut ev = Vec::new();
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 3, 16), &mut ev)).cookie,
        2
    );
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 3, 8), &mut ev)).cookie,
        1
    );
}

#[test]
fn permission_failure_drops_without_falling_through() {
    let mut e = engine();
    link(&mut e, ListKind::Priority, MatchEntry::new(4, 0, 64, 1));
    let both = MatchEntry::new(4, 0, 64, 2).with_options(Options::OP_PUT | Options::OP_GET);
    link(&mut e, ListKind::Priority, both);
    let mut ev = Vec::new();
    let out = e.match_incoming(EP, &IncomingHeader::get(rank(0), 4, 8), &mut ev);
    assert_eq!(out, MatchOutcome::Dropped(DropReason::PermissionViolation));
    assert!(ev.is_empty());
    assert_eq!(e.endpoint(EP).unwrap().counters().permission_violations, 1);
}

#[test]
fn no_match_drops_without_flow_control() {
    let mut e = engine();
    let mut ev = Vec::new();
    assert_eq!(
        e.match_incoming(EP, &put(0, 4, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::NoMatch)
    );
    assert!(ev.is_empty());
    assert!(e.endpoint(EP).unwrap().is_enabled());
}

#[test]
fn flow_control_disables_on_no_match_until_enabled() {
    let mut e = engine_with(
        EndpointConfig {
            flow_control: true,
            ..EndpointConfig::default()
        },
        256,
    );
    link(&mut e, ListKind::Priority, MatchEntry::new(1, 0, 64, 1));
    let mut ev = Vec::new();
    assert_eq!(
        e.match_incoming(EP, &put(0, 2, 8), &mut ev),
        MatchOutcome::Disabled
    );
    assert_eq!(kinds(&ev), [EventKind::PtDisabled]);
    assert_eq!((ev[0].fail, ev[0].match_bits), (NiFail::PtDisabled, 2));
    ev.clear();
    // Even a message that would match is dropped while disabled.
    assert_eq!(
        e.match_incoming(EP, &put(0, 1, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::EndpointDisabled)
    );
    assert!(ev.is_empty());
    e.enable(EP).unwrap();
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ev)).cookie,
        1
    );
}

#[test]
fn unexpected_list_full_drops_or_disables() {
    let cfg = EndpointConfig {
        max_unexpected: 1,
        ..EndpointConfig::default()
    };
    let mut e = engine_with(cfg, 256);
    link(&mut e, ListKind::Overflow, catch_all(1, 0, 1 << 20));
    let mut ev = Vec::new();
    delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ev));
    assert_eq!(
        e.match_incoming(EP, &put(0, 2, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::UnexpectedListFull)
    );
    let mut e = engine_with(
        EndpointConfig {
            flow_control: true,
            ..cfg
        },
        256,
    );
    link(&mut e, ListKind::Overflow, catch_all(1, 0, 1 << 20));
    delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ev));
    assert_eq!(
        e.match_incoming(EP, &put(0, 2, 8), &mut ev),
        MatchOutcome::Disabled
    );
}

#[test]
fn search_only_and_search_delete() {
    let mut e = engine();
    link(&mut e, ListKind::Overflow, catch_all(1, 0, 4096));
    let mut ev = Vec::new();
    for src in 0..3 {
        e.match_incoming(EP, &put(src, 0x10 + u64::from(src), 4), &mut ev);
    }
    // Probe with a wildcard on the low nibble: all three match.
    ev.clear();
    let probe = MatchEntry::new(0x10, 0, 64, 7).with_ignore(0xf);
    assert_eq!(e.search(EP, probe, SearchMode::SearchOnly, &mut ev), Ok(3));
    assert_eq!(kinds(&ev), [EventKind::Search; 3]);
    assert_eq!(e.endpoint(EP).unwrap().unexpected().len(), 3);
    ev.clear();
    let once = probe.with_options(Options::OP_PUT | Options::USE_ONCE);
    assert_eq!(e.search(EP, once, SearchMode::SearchOnly, &mut ev), Ok(1));
    assert_eq!(ev[0].initiator, rank(0));
    ev.clear();
    let exact = MatchEntry::new(0x11, 0, 64, 8).with_source(MatchId::rank(1));
    assert_eq!(
        e.search(EP, exact, SearchMode::SearchDelete, &mut ev),
        Ok(1)
    );
    assert_eq!(kinds(&ev), [EventKind::PutOverflow]);
    ev.clear();
    assert_eq!(
        e.search(EP, exact, SearchMode::SearchDelete, &mut ev),
        Ok(0)
    );
    assert_eq!(
        (ev[0].kind, ev[0].fail),
        (EventKind::Search, NiFail::NoMatch)
    );
    assert_eq!(e.endpoint(EP).unwrap().unexpected().len(), 2);
}

#[test]
fn software_mode_hand_over_and_switch_back_lose_nothing() {
    let mut e = engine();
    link(&mut e, ListKind::Priority, MatchEntry::new(1, 0, 64, 1));
    let mut ev = Vec::new();
    e.enter_software_mode(EP, &mut ev).unwrap();
    assert_eq!(kinds(&ev), [EventKind::SoftwareMode]);
    let sent: Vec<_> = (0..5).map(|i| put(i, 1, 8)).collect();
    for h in &sent {
        assert_eq!(
            e.match_incoming(EP, h, &mut ev),
            MatchOutcome::QueuedToSoftware
        );
    }
    assert_eq!(
        e.resume_matching(EP),
        Err(LpeError::SoftwareRequestsPending(EP, 5))
    );
    let mut got = Vec::new();
    while let Some(h) = e.pop_software_request(EP).unwrap() {
        got.push(h);
    }
    assert_eq!(got, sent, "every header reaches the host, in arrival order");
    e.resume_matching(EP).unwrap();
    // Lists were left intact: matching carries on where it stopped.
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ev)).cookie,
        1
    );
}

#[test]
fn running_out_of_priority_entries_switches_to_software() {
    let mut e = engine_with(
        EndpointConfig {
            max_priority: 2,
            ..EndpointConfig::default()
        },
        256,
    );
    let mut ev = Vec::new();
    for i in 0..2 {
        e.append(EP, ListKind::Priority, MatchEntry::new(i, 0, 8, i), &mut ev)
            .unwrap();
    }
    ev.clear();
    let err = e.append(EP, ListKind::Priority, MatchEntry::new(9, 0, 8, 9), &mut ev);
    assert_eq!(err, Err(LpeError::ListFull(EP)));
    assert_eq!(
        (ev[0].kind, ev[0].fail),
        (EventKind::SoftwareMode, NiFail::ListFull)
    );
    assert!(e.endpoint(EP).unwrap().is_software_mode());
    assert_eq!(
        e.match_incoming(EP, &put(0, 9, 8), &mut ev),
        MatchOutcome::QueuedToSoftware
    );
    assert_eq!(e.pop_software_request(EP).unwrap(), Some(put(0, 9, 8)));
}

#[test]
fn software_request_list_full_drops() {
    let mut e = engine_with(
        EndpointConfig {
            max_software_requests: 1,
            ..EndpointConfig::default()
        },
        256,
    );
    let mut ev = Vec::new();
    e.enter_software_mode(EP, &mut ev).unwrap();
    assert_eq!(
        e.match_incoming(EP, &put(0, 1, 8), &mut ev),
        MatchOutcome::QueuedToSoftware
    );
    assert_eq!(
        e.match_incoming(EP, &put(0, 1, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::SoftwareListFull)
    );
}

#[test]
fn non_matching_endpoint_first_usable_entry_takes_message() {
    let mut e = engine_with(
        EndpointConfig {
            matching: false,
            ..EndpointConfig::default()
        },
        256,
    );
    let tiny =
        MatchEntry::new(123, 0x100, 4, 1).with_options(Options::OP_PUT | Options::NO_TRUNCATE);
    link(&mut e, ListKind::Priority, tiny);
    let once = MatchEntry::new(456, 0x200, 64, 2).with_options(Options::OP_PUT | Options::USE_ONCE);
    link(&mut e, ListKind::Priority, once);
    link(&mut e, ListKind::Priority, MatchEntry::new(0, 0x300, 64, 3));
    let mut ev = Vec::new();
    // Match bits and source are irrelevant; the too-small no-truncate entry is skipped.
    assert_eq!(
        delivered(e.match_incoming(EP, &put(5, 999, 16), &mut ev)).cookie,
        2
    );
    assert_eq!(
        delivered(e.match_incoming(EP, &put(6, 1, 16), &mut ev)).cookie,
        3
    );
    assert_eq!(
        delivered(e.match_incoming(EP, &put(6, 1, 2), &mut ev)).cookie,
        1
    );
}

fn mpi_order_on<L: MatchList>() {
    let mut e = MatchShard::<L>::new(EngineId(0), EngineConfig::default());
    e.add_endpoint(EP, EndpointConfig::default()).unwrap();
    let mut ev = Vec::new();
    let once = Options::OP_PUT | Options::USE_ONCE;
    // Receives posted in this order: exact, ANY_SOURCE, ANY_TAG, exact.
    let posts = [
        MatchEntry::new(7, 0x1000, 64, 1).with_source(MatchId::rank(1)),
        MatchEntry::new(7, 0x2000, 64, 2),
        MatchEntry::new(0, 0x3000, 64, 3)
            .with_ignore(0xff)
            .with_source(MatchId::rank(1)),
        MatchEntry::new(7, 0x4000, 64, 4).with_source(MatchId::rank(1)),
    ];
    for p in posts {
        e.append(EP, ListKind::Priority, p.with_options(once), &mut ev)
            .unwrap();
    }
    // Four messages from rank 1 with tag 7 take the receives in posting order.
    let order: Vec<u64> = (0..4)
        .map(|_| delivered(e.match_incoming(EP, &put(1, 7, 8), &mut ev)).cookie)
        .collect();
    assert_eq!(order, [1, 2, 3, 4]);

    // Messages from one source that match one persistent buffer land in arrival order.
    let buf = MatchEntry::new(0, 0x8000, 64, 9)
        .with_ignore(u64::MAX)
        .with_options(Options::OP_PUT | Options::MANAGE_LOCAL);
    e.append(EP, ListKind::Priority, buf, &mut ev).unwrap();
    let offsets: Vec<u64> = (0..4)
        .map(|i| delivered(e.match_incoming(EP, &put(1, i, 8).with_hdr_data(i), &mut ev)).offset)
        .collect();
    assert_eq!(offsets, [0, 8, 16, 24]);
}

#[test]
fn mpi_ordering_deep() {
    mpi_order_on::<DeepList>();
}

#[test]
fn mpi_ordering_linear() {
    mpi_order_on::<LinearList>();
}

#[test]
fn cache_hit_goes_past_block_bit_and_miss_waits_behind_commands() {
    let (dispatcher, mut engines) = build_shards::<DeepList>(
        &EngineConfig::default(),
        EndpointTable::round_robin(8, 1),
        &[(EP, EndpointConfig::default())],
    )
    .unwrap();
    let engine = &mut engines[0];
    let persistent = MatchEntry::new(1, 0x1000, 1 << 20, 10)
        .with_options(Options::OP_PUT | Options::MANAGE_LOCAL);
    let mut ev = Vec::new();
    engine
        .append(EP, ListKind::Priority, persistent, &mut ev)
        .unwrap();
    // First match fills the persistent-entry cache.
    delivered(engine.match_incoming(EP, &put(0, 1, 8), &mut ev));
    assert_eq!(engine.cache().len(), 1);

    let tc = TrafficClass(0);
    let later = MatchEntry::new(2, 0x9000, 64, 20);
    dispatcher
        .submit(Request::command(
            EP,
            tc,
            1,
            Command::Append {
                list: ListKind::Priority,
                entry: later,
            },
        ))
        .unwrap();
    dispatcher
        .submit(Request::network(EP, tc, 2, put(0, 2, 8)))
        .unwrap(); // miss: needs the append
    dispatcher
        .submit(Request::network(EP, tc, 3, put(0, 1, 8)))
        .unwrap(); // hit
    let mut done = Vec::new();
    engine.run_until_idle(&mut ev, &mut done);
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    // Network requests stay in arrival order among themselves, and the miss
    // (tag 2) runs only after the older append, so it finds the new entry.
    let pos = |t| tags.iter().position(|&x| x == t).unwrap();
    assert!(pos(1) < pos(2) && pos(2) < pos(3), "{tags:?}");
    match done[pos(2)].kind {
        CompletionKind::Matched(MatchOutcome::Delivered(d)) => assert_eq!(d.cookie, 20),
        ref k => panic!("{k:?}"),
    }

    // With the block bit set, a hit at the head of the network queue runs
    // before the older command.
    dispatcher
        .submit(Request::command(
            EP,
            tc,
            4,
            Command::Search {
                probe: MatchEntry::new(5, 0, 8, 0),
                mode: SearchMode::SearchOnly,
            },
        ))
        .unwrap();
    dispatcher
        .submit(Request::network(EP, tc, 5, put(0, 1, 8)))
        .unwrap();
    // Pull both, then let the arbiter choose: the network queue gets its turn first.
    let mut done = Vec::new();
    engine.poll(1, &mut ev, &mut done);
    engine.run_until_idle(&mut ev, &mut done);
    assert_eq!(done.len(), 2);
    assert!(engine.stats().hits_past_block >= 1 || done[0].tag == 4);
}

#[test]
fn block_bit_holds_misses_and_releases_hits() {
    let mut e = engine();
    let mut ev = Vec::new();
    let persistent = MatchEntry::new(1, 0, 1 << 20, 10);
    e.append(EP, ListKind::Priority, persistent, &mut ev)
        .unwrap();
    delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ev));
    let tc = TrafficClass(0);
    // Two commands queued first, then a hit: the hit completes before both.
    for t in 0..2 {
        e.submit(Request::command(
            EP,
            tc,
            t,
            Command::Search {
                probe: MatchEntry::new(99, 0, 8, 0),
                mode: SearchMode::SearchOnly,
            },
        ))
        .unwrap();
    }
    e.submit(Request::network(EP, tc, 10, put(0, 1, 8)))
        .unwrap();
    e.submit(Request::network(EP, tc, 11, put(0, 3, 8)))
        .unwrap(); // miss
    let mut done = Vec::new();
    e.run_until_idle(&mut ev, &mut done);
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags, [0, 10, 1, 11]);
    assert_eq!(e.stats().hits_past_block, 1);
    assert!(e.stats().blocked >= 1);
}

#[test]
fn cache_fills_on_persistent_match_frees_on_unlink_and_evicts_round_robin() {
    let mut e = engine_with(EndpointConfig::default(), 2);
    let mut ev = Vec::new();
    let handles: Vec<EntryHandle> = (0..3)
        .map(|tag| linked(&mut e, EP, MatchEntry::new(tag, 0, 64, tag), &mut ev))
        .collect();
    let once = MatchEntry::new(50, 0, 64, 50).with_options(Options::OP_PUT | Options::USE_ONCE);
    e.append(EP, ListKind::Priority, once, &mut ev).unwrap();
    delivered(e.match_incoming(EP, &put(0, 50, 8), &mut ev));
    assert_eq!(e.cache().len(), 0, "use-once entries are not cached");
    for tag in 0..3 {
        delivered(e.match_incoming(EP, &put(0, tag, 8), &mut ev));
    }
    let s = e.cache().stats();
    assert_eq!((e.cache().len(), s.inserts, s.evictions), (2, 3, 1));
    e.unlink(handles[2]).unwrap();
    assert_eq!(e.cache().len(), 1);
    assert_eq!(e.cache().stats().frees, 1);
    // Hits keep answering correctly.
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ev)).cookie,
        1
    );
    assert_eq!(
        e.match_incoming(EP, &put(0, 2, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::NoMatch)
    );
}

#[test]
fn a_non_matching_endpoint_s_cache_slot_is_the_endpoint_s_and_answers_every_initiator() {
    // The seed keys its cache by endpoint: on a non-matching endpoint every entry takes any
    // message, so one slot answers every initiator and every match-bits value.
    let mut e = engine_with(
        EndpointConfig {
            matching: false,
            ..EndpointConfig::default()
        },
        256,
    );
    let mut ev = Vec::new();
    e.append(
        EP,
        ListKind::Priority,
        MatchEntry::new(0, 0, 4096, 7),
        &mut ev,
    )
    .unwrap();
    for r in 0..300 {
        let d = delivered(e.match_incoming(EP, &put(r, u64::from(r) << 8, 8), &mut ev));
        assert_eq!(d.cookie, 7);
    }
    let s = e.cache().stats();
    assert_eq!(
        (e.cache().len(), s.inserts, s.hits, s.evictions),
        (1, 1, 299, 0)
    );
    // A message too long for a no-truncate entry misses the slot and is searched for.
    let mut e = engine_with(
        EndpointConfig {
            matching: false,
            ..EndpointConfig::default()
        },
        256,
    );
    let small = MatchEntry::new(0, 0, 16, 1).with_options(Options::OP_PUT | Options::NO_TRUNCATE);
    e.append(EP, ListKind::Priority, small, &mut ev).unwrap();
    e.append(
        EP,
        ListKind::Priority,
        MatchEntry::new(0, 0, 4096, 2),
        &mut ev,
    )
    .unwrap();
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 0, 8), &mut ev)).cookie,
        1
    );
    assert_eq!(
        delivered(e.match_incoming(EP, &put(1, 0, 64), &mut ev)).cookie,
        2
    );
    assert_eq!(
        delivered(e.match_incoming(EP, &put(2, 0, 8), &mut ev)).cookie,
        1
    );
    assert_eq!(e.cache().stats().hits, 1);
}

#[test]
fn the_engine_s_endpoints_share_one_pool_of_entries_and_headers() {
    // The seed's list-entry memory is one pool per processing engine: priority and overflow
    // entries and unexpected headers of all its endpoints together. Four here.
    const EP2: EndpointIndex = EndpointIndex(2);
    let mut e = MatchShard::new(
        EngineId(0),
        EngineConfig {
            pool_entries: 4,
            ..EngineConfig::default()
        },
    );
    e.add_endpoint(EP, EndpointConfig::default()).unwrap();
    e.add_endpoint(EP2, EndpointConfig::default()).unwrap();
    let mut ev = Vec::new();
    link(
        &mut e,
        ListKind::Overflow,
        catch_all(100, 0x10_0000, 1 << 20),
    );
    let handles: Vec<EntryHandle> = (0..2)
        .map(|tag| linked(&mut e, EP2, MatchEntry::new(tag, 0, 64, tag), &mut ev))
        .collect();
    // The first unexpected message takes the last entry of the pool...
    let d = delivered(e.match_incoming(EP, &put(0, 5, 8), &mut ev));
    assert_eq!(d.list, ListKind::Overflow);
    assert_eq!(e.pool(), (4, 4));
    // ... so the next finds no room for its header, though EP's own lists have plenty.
    assert_eq!(
        e.match_incoming(EP, &put(0, 6, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::UnexpectedListFull)
    );
    assert_eq!(
        e.endpoint(EP).unwrap().counters().dropped_unexpected_full,
        1
    );
    // And EP2 cannot link another receive: its matching goes to the host, as with a full list.
    ev.clear();
    assert_eq!(
        e.append(
            EP2,
            ListKind::Priority,
            MatchEntry::new(9, 0, 64, 9),
            &mut ev
        ),
        Err(LpeError::ListFull(EP2))
    );
    assert_eq!(
        (ev[0].kind, ev[0].fail),
        (EventKind::SoftwareMode, NiFail::ListFull)
    );
    // An entry unlinked on EP2 gives EP's next header its room.
    e.unlink(handles[0]).unwrap();
    assert_eq!(e.pool(), (3, 4));
    let d = delivered(e.match_incoming(EP, &put(0, 7, 8), &mut ev));
    assert_eq!(d.list, ListKind::Overflow);
    assert_eq!(e.pool(), (4, 4));
    // A matching receive claims a header and gives its entry back.
    match e
        .append(
            EP,
            ListKind::Priority,
            MatchEntry::new(5, 0, 64, 50),
            &mut ev,
        )
        .unwrap()
    {
        Appended::Linked {
            unexpected_matched, ..
        } => assert_eq!(unexpected_matched, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.pool(), (4, 4), "one header gone, one entry linked");
}

#[test]
fn cache_never_remembers_length_dependent_answers() {
    let mut e = engine();
    let mut ev = Vec::new();
    let small =
        MatchEntry::new(1, 0x100, 8, 1).with_options(Options::OP_PUT | Options::NO_TRUNCATE);
    e.append(EP, ListKind::Priority, small, &mut ev).unwrap();
    e.append(
        EP,
        ListKind::Priority,
        MatchEntry::new(1, 0x200, 64, 2),
        &mut ev,
    )
    .unwrap();
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 1, 32), &mut ev)).cookie,
        2
    );
    assert_eq!(e.cache().len(), 0);
    assert_eq!(
        delivered(e.match_incoming(EP, &put(0, 1, 4), &mut ev)).cookie,
        1
    );
}

#[test]
fn event_ring_is_fixed_and_counts_losses() {
    let mut e = engine();
    let mut ring = EventRing::new(2);
    e.append(
        EP,
        ListKind::Priority,
        MatchEntry::new(1, 0, 64, 1),
        &mut ring,
    )
    .unwrap();
    for _ in 0..3 {
        delivered(e.match_incoming(EP, &put(0, 1, 8), &mut ring));
    }
    assert_eq!((ring.len(), ring.lost(), ring.capacity()), (2, 2, 2));
    assert_eq!(ring.pop().map(|ev| ev.kind), Some(EventKind::Link));
}

#[test]
fn weighted_round_robin_across_traffic_classes() {
    let config = EngineConfig {
        class_weights: vec![3, 1],
        ..EngineConfig::default()
    };
    let (d, mut engines) = build_shards::<DeepList>(
        &config,
        EndpointTable::round_robin(64, 1),
        &[(EP, EndpointConfig::default())],
    )
    .unwrap();
    let probe = MatchEntry::new(0, 0, 0, 0);
    let cmd = Command::Search {
        probe,
        mode: SearchMode::SearchOnly,
    };
    for i in 0..8 {
        d.submit(Request::command(EP, TrafficClass(0), i, cmd))
            .unwrap();
        d.submit(Request::command(EP, TrafficClass(1), 100 + i, cmd))
            .unwrap();
    }
    // Commands of one endpoint run in the order they were pulled, which is
    // the weighted round robin order: three from class 0, then one from class 1.
    let mut done = Vec::new();
    engines[0].run_until_idle(&mut Vec::new(), &mut done);
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(
        tags,
        [
            0, 1, 2, 100, 3, 4, 5, 101, 6, 7, 102, 103, 104, 105, 106, 107
        ]
    );
}

#[test]
fn worker_serves_engines_round_robin_and_endpoints_do_not_block_each_other() {
    let eps: Vec<_> = (0..4)
        .map(|i| (EndpointIndex(i), EndpointConfig::default()))
        .collect();
    let (d, engines) = build_shards::<DeepList>(
        &EngineConfig::default(),
        EndpointTable::round_robin(64, 2),
        &eps,
    )
    .unwrap();
    let mut worker = Worker::new(engines);
    let tc = TrafficClass(0);
    // Endpoint 0 has a long command backlog; endpoint 2 (same engine) one message.
    for t in 0..20 {
        let cmd = Command::Append {
            list: ListKind::Priority,
            entry: MatchEntry::new(t, 0, 8, t),
        };
        d.submit(Request::command(EndpointIndex(0), tc, t, cmd))
            .unwrap();
    }
    d.submit(Request::network(EndpointIndex(2), tc, 100, put(0, 1, 8)))
        .unwrap();
    d.submit(Request::network(EndpointIndex(1), tc, 200, put(0, 1, 8)))
        .unwrap();
    let mut done = Vec::new();
    let mut ev = Vec::new();
    // The other engine is served on the first call.
    worker.poll(4, &mut ev, &mut done);
    assert!(done.iter().any(|c| c.tag == 200));
    while !worker.is_idle() {
        worker.poll(4, &mut ev, &mut done);
    }
    assert_eq!(done.len(), 22);
    let pos = |t| done.iter().position(|c| c.tag == t).unwrap();
    assert!(
        pos(100) < pos(19),
        "endpoint 2 waited for endpoint 0's backlog"
    );
}

#[test]
fn stale_handles_and_unknown_endpoints_are_errors() {
    let mut e = engine();
    let mut ev = Vec::new();
    let Appended::Linked { handle, .. } = e
        .append(EP, ListKind::Priority, MatchEntry::new(1, 0, 8, 1), &mut ev)
        .unwrap()
    else {
        panic!()
    };
    e.unlink(handle).unwrap();
    assert_eq!(e.unlink(handle), Err(LpeError::StaleHandle(EP)));
    let other = EndpointIndex(5);
    assert_eq!(
        e.match_incoming(other, &put(0, 1, 8), &mut ev),
        MatchOutcome::Dropped(DropReason::NoSuchEndpoint)
    );
    assert_eq!(
        e.append(
            other,
            ListKind::Priority,
            MatchEntry::new(1, 0, 8, 1),
            &mut ev
        ),
        Err(LpeError::NoSuchEndpoint(other))
    );
}
