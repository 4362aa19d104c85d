//! Tagged messaging between two pure nodes (no EAL): eager and rendezvous, from the priority
//! list and from the unexpected list, truncation, wildcards and order; every byte read back from
//! the application's own mapping.

use std::sync::Arc;

use pmem::Mapping;

use crate::testing::{End, pair_with, pump};
use crate::{TagConfig, TagEntry, TagEvent, TagEventKind, TagPort};
use proto::lpe::{ListKind, Options, SearchMode};
use proto::transport::{Access, MrKeys, SgList, Sge, WcOpcode, WcStatus, WorkRequest};

const MIB: usize = 1 << 20;

struct Side {
    end: End,
    map: Arc<Mapping>,
    keys: MrKeys,
}

fn tagged_pair() -> (Side, Side, TagPort) {
    let (mut a, mut b) = pair_with(256, |c| {
        c.tagged = true;
        c.rndv_threshold = 8192;
    });
    let _ = a.node.enable_tags(&TagConfig::default()).unwrap();
    let port = b.node.enable_tags(&TagConfig::default()).unwrap();
    (side(a), side(b), port)
}

/// `e` with 4 MiB of memory registered for every access.
fn side(mut e: End) -> Side {
    let map = Arc::new(Mapping::anonymous(4 * MIB).unwrap());
    let keys = e
        .node
        .register(map.clone(), 0, 4 * MIB, Access::ALL)
        .unwrap();
    Side { end: e, map, keys }
}

/// A catch-all overflow buffer (cookie 500) of 1 MiB at `offset` of `b`'s memory, as MPI keeps
/// one linked for unexpected messages.
fn link_overflow(port: &mut TagPort, b: &Side, offset: usize) {
    let ovf = TagEntry::recv(0, sge(b, offset, MIB), 500)
        .with_ignore(u64::MAX)
        .with_options(Options::MANAGE_LOCAL);
    port.append(0, ListKind::Overflow, ovf).unwrap();
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn sge(s: &Side, offset: usize, len: usize) -> Sge {
    Sge {
        addr: s.keys.addr + offset as u64,
        len: len as u32,
        lkey: s.keys.lkey,
    }
}

fn send(a: &mut Side, wr_id: u64, offset: usize, data: &[u8], tag: u64) {
    a.map.write(offset, data).unwrap();
    let s = sge(a, offset, data.len());
    let sgl = SgList::one(s.lkey, s.addr, s.len);
    a.end
        .qp
        .post_send(&[WorkRequest::tagged_send(wr_id, sgl, 0, tag, wr_id * 10)])
        .unwrap();
}

fn events(port: &mut TagPort) -> Vec<TagEvent> {
    let mut out = [TagEvent::EMPTY; 64];
    let n = port.poll(&mut out);
    out[..n].to_vec()
}

/// The kind and cookie of each event waiting on `port`, in order.
fn kinds_and_cookies(port: &mut TagPort) -> Vec<(TagEventKind, u64)> {
    events(port).iter().map(|e| (e.kind, e.cookie)).collect()
}

fn bytes(s: &Side, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    s.map.read(offset, &mut v).unwrap();
    v
}

fn run(a: &mut Side, b: &mut Side) {
    pump(&mut a.end.node, &mut b.end.node, 0);
}

fn completions(a: &mut Side) -> Vec<(u64, WcOpcode, WcStatus, u32)> {
    std::iter::from_fn(|| a.end.cq.poll_one())
        .map(|w| (w.wr_id, w.opcode, w.status, w.byte_len))
        .collect()
}

#[test]
fn eager_message_lands_in_the_posted_receive() {
    let (mut a, mut b, mut port) = tagged_pair();
    let recv = TagEntry::recv(5, sge(&b, 0, 4096), 77);
    port.append(0, ListKind::Priority, recv).unwrap();
    run(&mut a, &mut b);
    let data = pattern(1, 3000);
    send(&mut a, 1, 0, &data, 5);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 0, 3000), data);
    let ev = events(&mut port);
    let put: Vec<_> = ev.iter().filter(|e| e.kind == TagEventKind::Put).collect();
    assert_eq!(put.len(), 1, "{ev:?}");
    let p = put[0];
    assert_eq!(
        (
            p.cookie,
            p.addr,
            p.rlength,
            p.mlength,
            p.initiator,
            p.hdr_data
        ),
        (77, b.keys.addr, 3000, 3000, 0, 10)
    );
    assert!(!p.truncated && !p.rendezvous);
    assert!(ev.iter().any(|e| e.kind == TagEventKind::AutoUnlink));
    assert_eq!(
        completions(&mut a),
        vec![(1, WcOpcode::TaggedSend, WcStatus::Success, 3000)]
    );
}

/// Each tagged message the target receives counts once in its queue pair's
/// `tagged_received`: one of one packet (matched, placed and reported in one call) as one of
/// several (arrival, then landing).
#[test]
fn every_tagged_message_counts_once_whatever_its_packets() {
    let (mut a, mut b, mut port) = tagged_pair();
    for (tag, offset) in [(5, 0), (6, 8192)] {
        let recv = TagEntry::recv(tag, sge(&b, offset, 4096), tag);
        port.append(0, ListKind::Priority, recv).unwrap();
    }
    run(&mut a, &mut b);
    let qpn = b.end.qp.qpn();
    let received = |b: &Side| b.end.node.qp(qpn).unwrap().stats().tagged_received;
    assert_eq!(received(&b), 0);
    // One packet (MTU 256).
    let small = pattern(2, 64);
    send(&mut a, 1, 0, &small, 5);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 0, 64), small);
    assert_eq!(received(&b), 1);
    // Twelve packets.
    let large = pattern(3, 3000);
    send(&mut a, 2, 4096, &large, 6);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 8192, 3000), large);
    assert_eq!(received(&b), 2);
    let puts = events(&mut port)
        .iter()
        .filter(|e| e.kind == TagEventKind::Put)
        .count();
    assert_eq!(puts, 2);
}

#[test]
fn truncation_keeps_what_fits_and_reports_the_rest() {
    let (mut a, mut b, mut port) = tagged_pair();
    b.map.write(0, &[0xee; 200]).unwrap();
    port.append(0, ListKind::Priority, TagEntry::recv(9, sge(&b, 0, 50), 1))
        .unwrap();
    run(&mut a, &mut b);
    let data = pattern(2, 100);
    send(&mut a, 1, 0, &data, 9);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 0, 50), data[..50]);
    assert_eq!(
        bytes(&b, 50, 150),
        vec![0xee; 150],
        "nothing past the buffer"
    );
    let put = events(&mut port)
        .into_iter()
        .find(|e| e.kind == TagEventKind::Put)
        .unwrap();
    assert_eq!((put.rlength, put.mlength, put.truncated), (100, 50, true));
    assert_eq!(completions(&mut a)[0].2, WcStatus::Success);
}

#[test]
fn unexpected_eager_then_append_copies_from_the_overflow_buffer() {
    let (mut a, mut b, mut port) = tagged_pair();
    link_overflow(&mut port, &b, MIB);
    run(&mut a, &mut b);
    let data = pattern(3, 2500);
    send(&mut a, 1, 0, &data, 42);
    run(&mut a, &mut b);
    let ev = events(&mut port);
    assert!(
        ev.iter()
            .any(|e| e.kind == TagEventKind::PutOverflow && e.cookie == 500),
        "{ev:?}"
    );
    assert_eq!(bytes(&b, MIB, 2500), data, "landed in the overflow buffer");
    port.append(
        0,
        ListKind::Priority,
        TagEntry::recv(42, sge(&b, 0, 4096), 9),
    )
    .unwrap();
    run(&mut a, &mut b);
    let ev = events(&mut port);
    let c = ev
        .iter()
        .find(|e| e.kind == TagEventKind::UnexpectedConsumed)
        .unwrap_or_else(|| panic!("{ev:?}"));
    assert_eq!(
        (c.cookie, c.addr, c.mlength, c.match_bits),
        (9, b.keys.addr, 2500, 42)
    );
    assert_eq!(bytes(&b, 0, 2500), data);
}

#[test]
fn rendezvous_into_a_posted_receive_is_pulled_by_the_target() {
    let (mut a, mut b, mut port) = tagged_pair();
    port.append(0, ListKind::Priority, TagEntry::recv(3, sge(&b, 0, MIB), 4))
        .unwrap();
    run(&mut a, &mut b);
    let data = pattern(4, 300_000);
    send(&mut a, 1, 0, &data, 3);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 0, data.len()), data);
    let put = events(&mut port)
        .into_iter()
        .find(|e| e.kind == TagEventKind::Put)
        .unwrap();
    assert_eq!(
        (put.mlength, put.rendezvous, put.truncated),
        (300_000, true, false)
    );
    assert_eq!(
        completions(&mut a),
        vec![(1, WcOpcode::TaggedSend, WcStatus::Success, 300_000)]
    );
    let tags = b.end.node.tags().unwrap();
    assert_eq!(tags.counters.rendezvous_pulls, 1);
    assert_eq!(tags.recorded(), 0);
}

#[test]
fn rendezvous_from_the_unexpected_list_starts_its_pull_on_append() {
    let (mut a, mut b, mut port) = tagged_pair();
    link_overflow(&mut port, &b, 2 * MIB);
    run(&mut a, &mut b);
    let data = pattern(5, 200_000);
    send(&mut a, 1, 0, &data, 8);
    run(&mut a, &mut b);
    assert!(
        completions(&mut a).is_empty(),
        "not done before the target takes it"
    );
    assert_eq!(b.end.node.tags().unwrap().recorded(), 1);
    port.append(0, ListKind::Priority, TagEntry::recv(8, sge(&b, 0, MIB), 6))
        .unwrap();
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 0, data.len()), data);
    let c = events(&mut port)
        .into_iter()
        .find(|e| e.kind == TagEventKind::UnexpectedConsumed)
        .unwrap();
    assert_eq!((c.mlength, c.rendezvous), (200_000, true));
    assert_eq!(
        completions(&mut a),
        vec![(1, WcOpcode::TaggedSend, WcStatus::Success, 200_000)]
    );
    assert_eq!(b.end.node.tags().unwrap().recorded(), 0);
}

#[test]
fn wildcards_and_order_of_two_matching_messages() {
    let (mut a, mut b, mut port) = tagged_pair();
    // Two receives that both match tag 0x100..0x1ff from rank 0.
    for (k, off) in [(1u64, 0usize), (2, 8192)] {
        let r = TagEntry::recv(0x100, sge(&b, off, 4096), k)
            .with_ignore(0xff)
            .from_rank(0);
        port.append(0, ListKind::Priority, r).unwrap();
    }
    run(&mut a, &mut b);
    let (m1, m2) = (pattern(6, 500), pattern(7, 600));
    send(&mut a, 1, 0, &m1, 0x1ab);
    send(&mut a, 2, 4096, &m2, 0x1cd);
    run(&mut a, &mut b);
    let puts: Vec<_> = events(&mut port)
        .into_iter()
        .filter(|e| e.kind == TagEventKind::Put)
        .map(|e| (e.cookie, e.match_bits, e.mlength))
        .collect();
    assert_eq!(puts, vec![(1, 0x1ab, 500), (2, 0x1cd, 600)]);
    assert_eq!(bytes(&b, 0, 500), m1);
    assert_eq!(bytes(&b, 8192, 600), m2);
}

#[test]
fn search_and_delete_hands_over_an_unexpected_message() {
    let (mut a, mut b, mut port) = tagged_pair();
    link_overflow(&mut port, &b, MIB);
    run(&mut a, &mut b);
    send(&mut a, 1, 0, &pattern(8, 64), 11);
    run(&mut a, &mut b);
    let _ = events(&mut port);
    let probe = TagEntry::recv(11, sge(&b, 0, 0), 3);
    port.search(0, probe, SearchMode::SearchOnly).unwrap();
    run(&mut a, &mut b);
    let ev = events(&mut port);
    assert!(ev.iter().any(|e| e.kind == TagEventKind::Search), "{ev:?}");
    port.search(0, probe, SearchMode::SearchDelete).unwrap();
    run(&mut a, &mut b);
    let c = events(&mut port)
        .into_iter()
        .find(|e| e.kind == TagEventKind::UnexpectedConsumed)
        .unwrap();
    assert_eq!((c.addr, c.mlength), (b.keys.addr + MIB as u64, 64));
    assert_eq!(b.end.node.tags().unwrap().recorded(), 0);
}

#[test]
fn a_plain_send_on_a_tagged_queue_pair_is_refused_locally() {
    let (mut a, mut b, _port) = tagged_pair();
    let s = sge(&a, 0, 8);
    let sgl = SgList::one(s.lkey, s.addr, s.len);
    a.end
        .qp
        .post_send(&[WorkRequest::send(1, sgl, None)])
        .unwrap();
    run(&mut a, &mut b);
    assert_eq!(completions(&mut a)[0].2, WcStatus::LocalQpOperationError);
}

#[test]
fn endpoints_are_homed_by_the_table_and_foreign_ones_refused() {
    use proto::lpe::{EndpointConfig, EndpointIndex, EndpointTable, EngineId};
    let eps: Vec<_> = (0..4)
        .map(|i| (EndpointIndex(i), EndpointConfig::default()))
        .collect();
    let table = EndpointTable::round_robin(4, 2);
    let all = TagConfig {
        endpoints: eps,
        ..TagConfig::default()
    };
    let (mut a, mut b) = pair_with(256, |c| c.tagged = true);
    let _ = a.node.enable_tags(&all.homed(&table, EngineId(0)));
    // B is engine 1: endpoints 1 and 3 live there, 0 and 2 on engine 0.
    let mut port = b.node.enable_tags(&all.homed(&table, EngineId(1))).unwrap();
    let map = Arc::new(Mapping::anonymous(MIB).unwrap());
    let kb = b.node.register(map.clone(), 0, MIB, Access::ALL).unwrap();
    let ka = a.node.register(map, 0, MIB, Access::ALL).unwrap();
    let buf = Sge {
        addr: kb.addr,
        len: 64,
        lkey: kb.lkey,
    };
    port.append(1, ListKind::Priority, TagEntry::recv(1, buf, 1))
        .unwrap();
    port.append(2, ListKind::Priority, TagEntry::recv(1, buf, 2))
        .unwrap();
    pump(&mut a.node, &mut b.node, 0);
    let ev = events(&mut port);
    assert!(ev.iter().any(|e| e.kind == TagEventKind::CommandFailed
        && e.cookie == 2
        && e.error == Some(crate::TagCommandError::NoSuchEndpoint)));
    let sgl = SgList::one(ka.lkey, ka.addr, 8);
    a.qp.post_send(&[WorkRequest::tagged_send(1, sgl, 1, 1, 0)])
        .unwrap();
    pump(&mut a.node, &mut b.node, 0);
    assert!(
        events(&mut port)
            .iter()
            .any(|e| e.kind == TagEventKind::Put)
    );
    a.qp.post_send(&[WorkRequest::tagged_send(2, sgl, 2, 1, 0)])
        .unwrap();
    pump(&mut a.node, &mut b.node, 0);
    assert_eq!(b.node.tags().unwrap().counters.wrong_engine, 1);
    let wcs: Vec<_> = std::iter::from_fn(|| a.cq.poll_one())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        wcs,
        vec![(1, WcStatus::Success), (2, WcStatus::RemoteInvalidRequest)]
    );
}

#[test]
fn deregistering_a_region_unlinks_its_entries_and_nothing_lands_there_after() {
    use crate::{Control, ControlReply};
    let (mut a, mut b, mut port) = tagged_pair();
    let other = Arc::new(Mapping::anonymous(64 * 1024).unwrap());
    let keys = b
        .end
        .node
        .register(other.clone(), 0, 64 * 1024, Access::ALL)
        .unwrap();
    let buf = Sge {
        addr: keys.addr,
        len: 4096,
        lkey: keys.lkey,
    };
    // A persistent entry in the region that is about to go.
    let persistent = TagEntry::recv(21, buf, 5).with_options(Options::NONE);
    port.append(0, ListKind::Priority, persistent).unwrap();
    run(&mut a, &mut b);
    let _ = events(&mut port);
    let reply = b
        .end
        .node
        .control(1, Control::Deregister { lkey: keys.lkey });
    let mut replies = Vec::new();
    b.end.node.take_replies(|r| replies.push(r));
    // The iteration's end, as the worker's: the events are shown.
    b.end.node.publish_tag_events();
    assert!(
        reply == Some((1, ControlReply::Deregistered(true)))
            || replies.contains(&(1, ControlReply::Deregistered(true))),
        "{reply:?} {replies:?}"
    );
    let ev = events(&mut port);
    assert!(
        ev.iter()
            .any(|e| e.kind == TagEventKind::AutoUnlink && e.cookie == 5),
        "{ev:?}"
    );
    // A message for that tag now matches nothing: consumed, dropped, no byte lands anywhere.
    send(&mut a, 1, 0, &pattern(9, 100), 21);
    run(&mut a, &mut b);
    assert_eq!(completions(&mut a)[0].2, WcStatus::Success);
    assert_eq!(b.end.node.tags().unwrap().counters.dropped, 1);
    let mut v = vec![0u8; 4096];
    other.read(0, &mut v).unwrap();
    assert!(v.iter().all(|&x| x == 0));
}

#[test]
fn a_receive_posted_before_the_message_arrives_is_matched_even_if_not_yet_served() {
    let (mut a, mut b, mut port) = tagged_pair();
    // The append is still in the command ring when the message's packet reaches B (pump
    // serves A, carries its packets to B, and only then serves B).
    port.append(0, ListKind::Priority, TagEntry::recv(13, sge(&b, 0, 64), 1))
        .unwrap();
    let data = pattern(10, 40);
    send(&mut a, 1, 0, &data, 13);
    run(&mut a, &mut b);
    assert!(
        events(&mut port)
            .iter()
            .any(|e| e.kind == TagEventKind::Put && e.cookie == 1)
    );
    assert_eq!(bytes(&b, 0, 40), data);
    assert_eq!(b.end.node.tags().unwrap().counters.dropped, 0);
}

/// A's frames for what it has to send now, as B would take them off the wire.
fn frames_from(a: &mut Side) -> Vec<Vec<u8>> {
    let node = &mut a.end.node;
    node.service(0);
    let mut out = Vec::new();
    while let Some(tx) = node.poll_transmit(0) {
        let mut frame = vec![0u8; node.frame_len(&tx)];
        node.emit(&tx, &mut frame).unwrap();
        out.push(frame);
    }
    out
}

#[test]
fn a_burst_serves_the_commands_older_than_it_once_at_its_first_message() {
    let (mut a, mut b, mut port) = tagged_pair();
    link_overflow(&mut port, &b, MIB);
    run(&mut a, &mut b);
    let _ = events(&mut port);
    let (first, second) = (pattern(20, 40), pattern(21, 40));
    send(&mut a, 1, 0, &first, 31);
    send(&mut a, 2, 4096, &second, 32);
    let frames = frames_from(&mut a);
    assert_eq!(frames.len(), 2, "one packet a message");
    // Posted before the burst was taken off the wire (not yet served): the burst's first
    // message is matched against it.
    port.append(0, ListKind::Priority, TagEntry::recv(31, sge(&b, 0, 64), 1))
        .unwrap();
    let later = TagEntry::recv(32, sge(&b, 8192, 64), 2);
    let node = &mut b.end.node;
    node.begin_rx_burst(2);
    node.receive(0, &frames[0]);
    // Posted while the burst is being received, after its frames were taken: its second
    // message does not look for it, and goes to the overflow buffer.
    port.append(0, ListKind::Priority, later).unwrap();
    node.receive(0, &frames[1]);
    node.end_rx_burst();
    run(&mut a, &mut b);
    let kinds = kinds_and_cookies(&mut port);
    assert!(kinds.contains(&(TagEventKind::Put, 1)), "{kinds:?}");
    assert!(
        kinds.contains(&(TagEventKind::PutOverflow, 500)),
        "{kinds:?}"
    );
    // The receive posted later claims it from the unexpected list: the data is whole.
    assert!(
        kinds.contains(&(TagEventKind::UnexpectedConsumed, 2)),
        "{kinds:?}"
    );
    assert_eq!(bytes(&b, 0, 40), first);
    assert_eq!(bytes(&b, 8192, 40), second);
    // Out of a burst, every message looks: a receive posted after the previous frame is
    // matched directly.
    send(&mut a, 3, 0, &first, 33);
    let frames = frames_from(&mut a);
    port.append(
        0,
        ListKind::Priority,
        TagEntry::recv(33, sge(&b, 16384, 64), 3),
    )
    .unwrap();
    b.end.node.receive(0, &frames[0]);
    run(&mut a, &mut b);
    let kinds = kinds_and_cookies(&mut port);
    assert!(kinds.contains(&(TagEventKind::Put, 3)), "{kinds:?}");
    assert_eq!(bytes(&b, 16384, 40), first);
}

#[test]
fn quiet_receives_cost_one_event_and_persistent_entries_unlink_by_handle() {
    let (mut a, mut b) = pair_with(256, |c| c.tagged = true);
    let _ = a.node.enable_tags(&TagConfig::default()).unwrap();
    let mut port = b
        .node
        .enable_tags(&TagConfig {
            quiet: true,
            ..TagConfig::default()
        })
        .unwrap();
    let map = Arc::new(Mapping::anonymous(MIB).unwrap());
    let kb = b.node.register(map.clone(), 0, MIB, Access::ALL).unwrap();
    let ka = a.node.register(map, 0, MIB, Access::ALL).unwrap();
    let buf = |off: u64| Sge {
        addr: kb.addr + off,
        len: 64,
        lkey: kb.lkey,
    };
    port.append(0, ListKind::Priority, TagEntry::recv(1, buf(0), 1))
        .unwrap();
    let persistent = TagEntry::recv(2, buf(4096), 2).with_options(Options::NONE);
    port.append(0, ListKind::Priority, persistent).unwrap();
    pump(&mut a.node, &mut b.node, 0);
    let ev = events(&mut port);
    // The use-once receive links silently; the persistent one reports its handle.
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].kind, ev[0].cookie), (TagEventKind::Link, 2));
    let handle = ev[0].handle.expect("a Link event carries the handle");
    let sgl = SgList::one(ka.lkey, ka.addr, 8);
    for (id, tag) in [(1, 1), (2, 2)] {
        a.qp.post_send(&[WorkRequest::tagged_send(id, sgl, 0, tag, 0)])
            .unwrap();
    }
    pump(&mut a.node, &mut b.node, 0);
    let kinds = kinds_and_cookies(&mut port);
    assert_eq!(kinds, vec![(TagEventKind::Put, 1), (TagEventKind::Put, 2)]);
    port.unlink(handle).unwrap();
    pump(&mut a.node, &mut b.node, 0);
    assert!(events(&mut port).is_empty(), "unlink writes no event");
    a.qp.post_send(&[WorkRequest::tagged_send(3, sgl, 0, 2, 0)])
        .unwrap();
    pump(&mut a.node, &mut b.node, 0);
    assert!(
        events(&mut port).is_empty(),
        "the unlinked entry takes nothing"
    );
    assert_eq!(b.node.tags().unwrap().counters.dropped, 1);
    port.unlink(handle).unwrap();
    pump(&mut a.node, &mut b.node, 0);
    let ev = events(&mut port);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].error, Some(crate::TagCommandError::StaleHandle));
}

#[test]
fn a_message_cut_off_by_the_error_state_is_reported_undeliverable() {
    use proto::lpe::NiFail;
    let (mut a, mut b, mut port) = tagged_pair();
    port.append(
        0,
        ListKind::Priority,
        TagEntry::recv(6, sge(&b, 0, 4096), 8),
    )
    .unwrap();
    run(&mut a, &mut b);
    let _ = events(&mut port);
    // A 3-packet eager message; only its first packet reaches B.
    send(&mut a, 1, 0, &pattern(11, 3000), 6);
    a.end.node.service(0);
    let tx = a.end.node.poll_transmit(0).expect("the first packet");
    let mut frame = vec![0u8; 9000];
    let len = a.end.node.emit(&tx, &mut frame).unwrap();
    b.end.node.receive(0, &frame[..len]);
    assert_eq!(b.end.node.tags().unwrap().recorded(), 1);
    // B's queue pair fails (a send with a bad key), with the message half received.
    let bad = SgList::one(0xdead_beef, 0, 8);
    b.end
        .qp
        .post_send(&[WorkRequest::tagged_send(9, bad, 0, 1, 0)])
        .unwrap();
    b.end.node.service(0);
    b.end.node.flush_completions();
    b.end.node.publish_tag_events();
    let put = events(&mut port)
        .into_iter()
        .find(|e| e.kind == TagEventKind::Put)
        .expect("the message is reported");
    assert_eq!(
        (put.fail, put.cookie, put.mlength),
        (NiFail::Undeliverable, 8, 0)
    );
    assert_eq!(
        b.end.node.tags().unwrap().recorded(),
        0,
        "its record is freed"
    );
    assert_eq!(b.end.node.tags().unwrap().counters.undeliverable, 1);
}

#[test]
fn a_cancelled_receive_is_unlinked_by_its_cookie_and_takes_nothing_after() {
    let (mut a, mut b, mut port) = tagged_pair();
    port.append(0, ListKind::Priority, TagEntry::recv(5, sge(&b, 0, 64), 41))
        .unwrap();
    port.append(
        0,
        ListKind::Priority,
        TagEntry::recv(5, sge(&b, 4096, 64), 42),
    )
    .unwrap();
    run(&mut a, &mut b);
    let _ = events(&mut port);
    // The first receive is cancelled: an AutoUnlink with its cookie, and the message that
    // would have matched it lands in the second.
    port.cancel(0, 41).unwrap();
    run(&mut a, &mut b);
    assert_eq!(
        kinds_and_cookies(&mut port),
        vec![(TagEventKind::AutoUnlink, 41)]
    );
    send(&mut a, 1, 0, &pattern(3, 64), 5);
    run(&mut a, &mut b);
    let ev = events(&mut port);
    assert_eq!(
        (ev[0].kind, ev[0].cookie),
        (TagEventKind::Put, 42),
        "{ev:?}"
    );
    assert_eq!(
        bytes(&b, 0, 64),
        vec![0; 64],
        "the cancelled buffer is untouched"
    );
    assert_eq!(bytes(&b, 4096, 64), pattern(3, 64));
    // Cancelling what is gone (matched, or never there) fails with StaleHandle.
    port.cancel(0, 42).unwrap();
    run(&mut a, &mut b);
    let ev = events(&mut port);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (ev[0].kind, ev[0].cookie, ev[0].error),
        (
            TagEventKind::CommandFailed,
            42,
            Some(crate::TagCommandError::StaleHandle)
        )
    );
}

/// Seed 001's endpoint states through the tag port: an endpoint created disabled drops (and
/// counts) what arrives until `enable`; in software mode the headers of arriving messages wait
/// on the software request list (their data is not kept) for the host to take them; matching
/// resumes only once that list is empty.
#[test]
fn a_disabled_endpoint_drops_until_enabled_and_software_mode_hands_headers_to_the_host() {
    let (mut a, mut b) = pair_with(256, |c| c.tagged = true);
    let _ = a.node.enable_tags(&TagConfig::default()).unwrap();
    let mut cfg = TagConfig::default();
    cfg.endpoints[0].1.start_disabled = true;
    let mut port = b.node.enable_tags(&cfg).unwrap();
    let (mut a, mut b) = (side(a), side(b));
    let dropped = |b: &Side| b.end.node.tags().unwrap().counters.dropped;
    // Created disabled: the receive links, the message is dropped and counted, the buffer
    // untouched; the sender completes (the target took the message).
    port.append(
        0,
        ListKind::Priority,
        TagEntry::recv(5, sge(&b, 0, 4096), 1),
    )
    .unwrap();
    run(&mut a, &mut b);
    send(&mut a, 1, 0, &pattern(1, 1000), 5);
    run(&mut a, &mut b);
    assert_eq!(dropped(&b), 1);
    assert_eq!(bytes(&b, 0, 1000), vec![0; 1000]);
    assert!(
        events(&mut port)
            .iter()
            .all(|e| e.kind != TagEventKind::Put)
    );
    // Enabled: the next one lands in the receive that waited.
    port.enable(0).unwrap();
    let data = pattern(2, 1000);
    send(&mut a, 2, 0, &data, 5);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 0, 1000), data);
    assert!(
        events(&mut port)
            .iter()
            .any(|e| e.kind == TagEventKind::Put && e.cookie == 1)
    );
    // Software mode: two messages' headers wait for the host; resuming is refused until it
    // has taken them.
    port.software_mode(0).unwrap();
    run(&mut a, &mut b);
    assert!(
        events(&mut port)
            .iter()
            .any(|e| e.kind == TagEventKind::SoftwareMode)
    );
    port.append(
        0,
        ListKind::Priority,
        TagEntry::recv(9, sge(&b, 8192, 4096), 2),
    )
    .unwrap();
    send(&mut a, 3, 0, &pattern(3, 700), 9);
    send(&mut a, 4, 4096, &pattern(4, 300), 10);
    run(&mut a, &mut b);
    assert_eq!(
        bytes(&b, 8192, 700),
        vec![0; 700],
        "software mode matches nothing"
    );
    port.resume_matching(0).unwrap();
    run(&mut a, &mut b);
    let ev = events(&mut port);
    let failed: Vec<_> = ev
        .iter()
        .filter(|e| e.kind == TagEventKind::CommandFailed)
        .collect();
    assert_eq!(failed.len(), 1, "{ev:?}");
    port.take_software_requests(0, 8).unwrap();
    run(&mut a, &mut b);
    let reqs: Vec<_> = events(&mut port)
        .into_iter()
        .filter(|e| e.kind == TagEventKind::SoftwareRequest)
        .map(|e| (e.endpoint, e.match_bits, e.rlength, e.initiator, e.hdr_data))
        .collect();
    assert_eq!(reqs, [(0, 9, 700, 0, 30), (0, 10, 300, 0, 40)]);
    // Listed empty: matching resumes, and the receive that waited takes the next message.
    port.resume_matching(0).unwrap();
    let data = pattern(5, 700);
    send(&mut a, 5, 0, &data, 9);
    run(&mut a, &mut b);
    assert_eq!(bytes(&b, 8192, 700), data);
    let ev = events(&mut port);
    assert!(
        ev.iter()
            .any(|e| e.kind == TagEventKind::Put && e.cookie == 2),
        "{ev:?}"
    );
    assert!(
        ev.iter().all(|e| e.kind != TagEventKind::CommandFailed),
        "{ev:?}"
    );
    // An endpoint not homed here is named in the failure.
    port.enable(7).unwrap();
    run(&mut a, &mut b);
    let ev = events(&mut port);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].kind, ev[0].endpoint, ev[0].error),
        (
            TagEventKind::CommandFailed,
            7,
            Some(crate::TagCommandError::NoSuchEndpoint)
        )
    );
    assert!(completions(&mut a).iter().all(|c| c.2 == WcStatus::Success));
}

/// The host sees the events of a burst of frames when the burst has been received
/// (`end_rx_burst`), and those made outside a burst (here a host command's `Link`) when the
/// iteration ends (`publish_tag_events`); not at each event, whose ring index is a line the
/// host's polls would take back from the worker's core every time.
#[test]
fn a_burst_s_events_are_seen_when_it_is_received_and_a_command_s_when_the_iteration_ends() {
    let (mut a, mut b, mut port) = tagged_pair();
    for (cookie, tag) in [(10, 1), (11, 2)] {
        let recv = TagEntry::recv(tag, sge(&b, cookie as usize * 4096, 4096), cookie);
        port.append(0, ListKind::Priority, recv).unwrap();
    }
    run(&mut a, &mut b);
    let _ = events(&mut port);
    send(&mut a, 1, 0, &pattern(3, 100), 1);
    send(&mut a, 2, 4096, &pattern(4, 100), 2);
    a.end.node.service(0);
    let mut frames = Vec::new();
    while let Some(tx) = a.end.node.poll_transmit(0) {
        let mut frame = vec![0u8; 9000];
        let len = a.end.node.emit(&tx, &mut frame).unwrap();
        frames.push(frame[..len].to_vec());
    }
    assert_eq!(frames.len(), 2);
    let node = &mut b.end.node;
    node.begin_rx_burst(frames.len());
    for f in &frames {
        node.receive(0, f);
    }
    assert_eq!(
        events(&mut port),
        vec![],
        "not yet: the burst is being received"
    );
    assert!(!port.has_events());
    node.end_rx_burst();
    assert!(port.has_events());
    let puts = kinds_and_cookies(&mut port);
    assert_eq!(
        puts,
        vec![
            (TagEventKind::Put, 10),
            (TagEventKind::AutoUnlink, 10),
            (TagEventKind::Put, 11),
            (TagEventKind::AutoUnlink, 11)
        ],
        "both, as soon as the burst is received"
    );
    assert_eq!(bytes(&b, 10 * 4096, 100), pattern(3, 100));
    assert_eq!(bytes(&b, 11 * 4096, 100), pattern(4, 100));
    // A persistent receive reports its link: served by the node's host work, outside a burst.
    let persistent = TagEntry::recv(9, sge(&b, 12 * 4096, 64), 12).with_options(Options::NONE);
    port.append(0, ListKind::Priority, persistent).unwrap();
    b.end.node.service(0);
    assert_eq!(b.end.node.tags().unwrap().counters.commands, 3, "served");
    assert_eq!(events(&mut port), vec![], "not before the iteration ends");
    b.end.node.publish_tag_events();
    assert_eq!(kinds_and_cookies(&mut port), vec![(TagEventKind::Link, 12)]);
}

/// `frame`, a tagged SEND ONLY, with its tag header's message length set to `length` (the
/// ICRC made valid again): what a broken or hostile sender puts on the wire.
fn misstating(frame: &[u8], length: u32) -> Vec<u8> {
    let (repr, payload) = wire::parse_frame(frame).unwrap();
    let mut p = payload.to_vec();
    p[24..28].copy_from_slice(&length.to_be_bytes());
    let mut out = vec![0u8; repr.buffer_len(p.len())];
    let n = repr.emit(&mut out, &p).unwrap();
    out.truncate(n);
    out
}

/// A one-packet message whose tag header says another length than the packet carries: the
/// target places what came, as far as the receive (and the header) let it, writes nothing
/// past that, and its put says how many bytes landed, not what the match allowed.
#[test]
fn a_tag_header_that_misstates_its_length_lands_what_came_and_says_so() {
    let (mut a, mut b, mut port) = tagged_pair();
    b.map.write(0, &[0xee; 8192]).unwrap();
    for (tag, offset) in [(41, 0), (42, 4096)] {
        let recv = TagEntry::recv(tag, sge(&b, offset, 64), tag);
        port.append(0, ListKind::Priority, recv).unwrap();
    }
    run(&mut a, &mut b);
    let _ = events(&mut port);
    let data = pattern(7, 40);
    send(&mut a, 1, 0, &data, 41);
    send(&mut a, 2, 512, &data, 42);
    let frames = frames_from(&mut a);
    assert_eq!(frames.len(), 2, "one packet a message");
    // The first says 100 bytes, more than came (the match allows the receive's 64); the
    // second 10, fewer.
    b.end.node.receive(0, &misstating(&frames[0], 100));
    b.end.node.receive(0, &misstating(&frames[1], 10));
    run(&mut a, &mut b);
    let puts: Vec<_> = events(&mut port)
        .into_iter()
        .filter(|e| e.kind == TagEventKind::Put)
        .map(|e| (e.cookie, e.rlength, e.mlength, e.truncated))
        .collect();
    assert_eq!(puts, [(41, 100, 40, true), (42, 10, 10, false)]);
    assert_eq!(bytes(&b, 0, 40), data);
    assert_eq!(
        bytes(&b, 40, 4096 - 40),
        vec![0xee; 4096 - 40],
        "nothing past 40"
    );
    assert_eq!(bytes(&b, 4096, 10), data[..10]);
    assert_eq!(bytes(&b, 4106, 54), vec![0xee; 54], "nothing past 10");
    assert_eq!(b.end.node.tags().unwrap().counters.dropped, 0);
}
