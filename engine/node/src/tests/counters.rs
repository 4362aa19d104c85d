//! The node's declared counter sets ([`NodeCounters`], [`CcCounters`], [`TagCounters`]): their
//! names, JSON keys and docs follow the declarations, and the names are the ones reports and
//! users have read so far.

use crate::{CcCounters, NodeCounters, TagCounters};
use portico_counters::{Combine, CounterDecl};

/// Checks one set: every counter documented and summed; the JSON of a value whose counter `i`
/// is `i + 1` has one key per declared counter, in declaration order, with its own value; and
/// the names are `want`.
fn check_set<T: serde::Serialize>(
    decls: &[CounterDecl],
    numbered: T,
    values: &[u64],
    want: &[&str],
) {
    let names: Vec<&str> = decls.iter().map(|d| d.name).collect();
    assert_eq!(names, want, "the names and their order are kept");
    for d in decls {
        assert!(!d.doc().is_empty(), "{}: no doc", d.name);
        assert_eq!(d.combine, Combine::Sum, "{}: counted events add up", d.name);
    }
    assert_eq!(
        values,
        (1..=decls.len() as u64).collect::<Vec<_>>(),
        "each counter in its own slot"
    );
    let json = serde_json::to_string(&numbered).unwrap();
    let fields: Vec<String> = (names.iter().enumerate())
        .map(|(i, n)| format!("\"{n}\":{}", i + 1))
        .collect();
    assert_eq!(json, format!("{{{}}}", fields.join(",")));
}

fn numbered(len: usize) -> Vec<u64> {
    (1..=len as u64).collect()
}

#[test]
fn node_counters_follow_their_declaration() {
    let c = NodeCounters::load(&numbered(NodeCounters::LEN));
    check_set(
        &NodeCounters::DECLS,
        c,
        &c.values(),
        &[
            "rx_frames",
            "delivered",
            "icrc_errors",
            "malformed",
            "not_for_us",
            "wrong_mac",
            "vlan_tagged",
            "ip_options",
            "ip_fragments",
            "wrong_transport",
            "unknown_qp",
            "bad_pkey",
            "wrong_source",
            "wrong_core",
            "arp_replies",
            "cm_frames",
            "tx_packets",
            "posted",
            "completions",
            "cq_full",
            "cq_overruns",
            "persist_jobs",
            "persist_failures",
            "shaper_picks",
            "shaper_misses",
            "pfc_frames",
            "mac_control_ignored",
            "shaper_read_responses",
        ],
    );
    assert_eq!(c.rx_frames, 1);
    assert_eq!(c.shaper_read_responses, NodeCounters::LEN as u64);
}

#[test]
fn cc_counters_follow_their_declaration() {
    let c = CcCounters::load(&numbered(CcCounters::LEN));
    check_set(
        &CcCounters::DECLS,
        c,
        &c.values(),
        &[
            "ce_received",
            "becn_acks_sent",
            "cnps_sent",
            "cnps_received",
            "read_cnps_sent",
            "read_cnps_received",
        ],
    );
    let mut all = c;
    all.combine(&c);
    assert_eq!(
        all.values(),
        [2, 4, 6, 8, 10, 12],
        "summed over queue pairs"
    );
}

#[test]
fn tag_counters_follow_their_declaration() {
    let c = TagCounters::load(&numbered(TagCounters::LEN));
    check_set(
        &TagCounters::DECLS,
        c,
        &c.values(),
        &[
            "matched_priority",
            "matched_overflow",
            "dropped",
            "truncated",
            "rendezvous_pulls",
            "unexpected_claimed",
            "commands",
            "commands_failed",
            "not_ready",
            "wrong_engine",
            "events_lost",
            "undeliverable",
        ],
    );
    assert_eq!(c.undeliverable, TagCounters::LEN as u64);
}
