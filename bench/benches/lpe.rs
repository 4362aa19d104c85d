//! ns per match of the list-processing engine at posted depth 1 … 10 000 with
//! 0 %, 10 % and 100 % wildcard (ANY_SOURCE) receives, for the deep structure
//! and the linear baseline, through the same per-packet call the transport
//! uses (`MatchShard::match_incoming`, event written into a fixed ring).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use portico::lpe::{
    DeepList, EndpointConfig, EndpointIndex, EngineConfig, EngineId, EventRing, IncomingHeader,
    LinearList, ListKind, MatchEntry, MatchId, MatchList, MatchShard, Options, ProcessId,
};

const EP: EndpointIndex = EndpointIndex(0);
const DEPTHS: [usize; 5] = [1, 8, 100, 1_000, 10_000];
const WILDCARD_PCT: [u64; 3] = [0, 10, 100];
const SOURCE_FIELD: u64 = 0xff_ffff << 24;
/// Event ring the size of a burst's worth of events, drained as a worker would.
const RING: usize = 256;

/// MPI-like match bits: context | source | tag.
fn bits(source: u32, tag: u64) -> u64 {
    (5 << 48) | (u64::from(source) << 24) | tag
}

use portico::rng::splitmix64 as mix;

/// Entry `k` receives tag `k` from rank `k % 64`; a `pct` share of them are
/// ANY_SOURCE receives (source field ignored, any initiator).
fn posted(k: u64, pct: u64, options: Options) -> MatchEntry {
    let source = (k % 64) as u32;
    let e = MatchEntry::new(bits(source, k), k << 16, 4096, k).with_options(options);
    if mix(k) % 100 < pct {
        e.with_ignore(SOURCE_FIELD).with_source(MatchId::ANY)
    } else {
        e.with_source(MatchId::rank(source))
    }
}

fn header(k: u64) -> IncomingHeader {
    let source = (k % 64) as u32;
    IncomingHeader::put(ProcessId::rank(source), bits(source, k), 64)
}

fn engine<L: MatchList>(depth: usize, cache_entries: usize) -> MatchShard<L> {
    let mut e = MatchShard::<L>::new(
        EngineId(0),
        EngineConfig {
            cache_entries,
            ..EngineConfig::default()
        },
    );
    let config = EndpointConfig {
        max_priority: depth + 16,
        ..EndpointConfig::default()
    };
    e.add_endpoint(EP, config).expect("endpoint");
    e
}

/// Random targets among the posted entries, fixed so both structures see the same stream.
fn targets(depth: usize) -> Vec<IncomingHeader> {
    (0..1024u64)
        .map(|i| header(mix(i ^ 0x55) % depth as u64))
        .collect()
}

fn persistent<L: MatchList>(c: &mut Criterion, name: &str) {
    let mut group = c.benchmark_group(format!("match/{name}"));
    for depth in DEPTHS {
        for pct in WILDCARD_PCT {
            let mut e = engine::<L>(depth, 0);
            let mut ring = EventRing::new(RING);
            for k in 0..depth as u64 {
                e.append(
                    EP,
                    ListKind::Priority,
                    posted(k, pct, Options::OP_PUT),
                    &mut ring,
                )
                .expect("room");
            }
            ring.clear();
            let headers = targets(depth);
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(format!("wild{pct}"), depth), |b| {
                b.iter(|| {
                    let h = &headers[i & 1023];
                    i = i.wrapping_add(1);
                    let out = e.match_incoming(EP, h, &mut ring);
                    if ring.len() == RING {
                        ring.clear();
                    }
                    black_box(out)
                })
            });
        }
    }
    group.finish();
}

/// MPI's usual case: a use-once receive is consumed and the next one posted.
fn use_once_repost(c: &mut Criterion) {
    let mut group = c.benchmark_group("use_once_repost/deep");
    for depth in [8usize, 1_000] {
        let mut e = engine::<DeepList>(depth, 0);
        let mut ring = EventRing::new(RING);
        let once = Options::OP_PUT | Options::USE_ONCE;
        for k in 0..depth as u64 {
            e.append(EP, ListKind::Priority, posted(k, 0, once), &mut ring)
                .expect("room");
        }
        ring.clear();
        let headers = targets(depth);
        let mut i = 0usize;
        group.bench_function(BenchmarkId::from_parameter(depth), |b| {
            b.iter(|| {
                let h = headers[i & 1023];
                i = i.wrapping_add(1);
                let out = e.match_incoming(EP, &h, &mut ring);
                let k = h.match_bits & 0xff_ffff;
                let again = e.append(EP, ListKind::Priority, posted(k, 0, once), &mut ring);
                if ring.len() >= RING - 4 {
                    ring.clear();
                }
                black_box((out, again))
            })
        });
    }
    group.finish();
}

/// Persistent entries served from the persistent-entry cache.
fn cache_hits(c: &mut Criterion) {
    let mut group = c.benchmark_group("cache_hit/deep");
    let depth = 1_000;
    let mut e = engine::<DeepList>(depth, 256);
    let mut ring = EventRing::new(RING);
    for k in 0..depth as u64 {
        e.append(
            EP,
            ListKind::Priority,
            posted(k, 10, Options::OP_PUT),
            &mut ring,
        )
        .expect("room");
    }
    ring.clear();
    let headers: Vec<_> = (0..1024u64).map(|i| header(mix(i) % 128)).collect();
    let mut i = 0usize;
    group.bench_function(BenchmarkId::new("wild10", depth), |b| {
        b.iter(|| {
            let h = &headers[i & 1023];
            i = i.wrapping_add(1);
            let out = e.match_incoming(EP, h, &mut ring);
            if ring.len() == RING {
                ring.clear();
            }
            black_box(out)
        })
    });
    group.finish();
}

fn deep(c: &mut Criterion) {
    persistent::<DeepList>(c, "deep");
}

fn linear(c: &mut Criterion) {
    persistent::<LinearList>(c, "linear");
}

criterion_group!(benches, deep, linear, use_once_repost, cache_hits);
criterion_main!(benches);
