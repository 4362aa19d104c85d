//! Cross-core hand-off: a producer thread feeds two worker threads through
//! the dispatcher; per endpoint, results equal the reference model's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use crate::lpe::reference::ReferenceEndpoint;
use crate::lpe::{
    CompletionKind, DeepList, EndpointConfig, EndpointIndex, EndpointTable, EngineConfig, Event,
    IncomingHeader, ListKind, MatchEntry, MatchId, Options, ProcessId, Request, TrafficClass,
    Worker, build_shards,
};

#[test]
fn two_workers_keep_per_endpoint_order() {
    let eps: Vec<_> = (0..4u16)
        .map(|i| (EndpointIndex(i), EndpointConfig::default()))
        .collect();
    let (dispatcher, mut engines) = build_shards::<DeepList>(
        &EngineConfig::default(),
        EndpointTable::round_robin(64, 2),
        &eps,
    )
    .unwrap();
    let mut models: Vec<_> = eps
        .iter()
        .map(|&(ep, c)| ReferenceEndpoint::new(ep, c))
        .collect();

    // Post receives directly on the owning engines (before workers start),
    // mixing exact, wildcard and persistent entries, plus an overflow buffer.
    let mut want: Vec<Vec<Event>> = vec![Vec::new(); eps.len()];
    for (i, &(ep, _)) in eps.iter().enumerate() {
        let engine = &mut engines[i % 2];
        let mut posts = Vec::new();
        for k in 0..40u64 {
            let mut e = MatchEntry::new(k % 10, k << 12, 4096, k)
                .with_options(Options::OP_PUT | Options::USE_ONCE);
            if k % 7 == 0 {
                e = e.with_ignore(0xf);
            }
            if k % 5 == 0 {
                e = e.with_source(MatchId::rank((k % 3) as u32));
            }
            posts.push((ListKind::Priority, e));
        }
        let buffer = MatchEntry::new(0, 1 << 40, 1 << 30, 999)
            .with_ignore(u64::MAX)
            .with_options(Options::OP_PUT | Options::MANAGE_LOCAL);
        posts.push((ListKind::Overflow, buffer));
        let mut sink = Vec::new();
        for (list, e) in posts {
            engine.append(ep, list, e, &mut sink).unwrap();
            models[i].append(list, e, &mut sink).unwrap();
        }
    }

    let headers: Vec<(usize, IncomingHeader)> = (0..400u64)
        .map(|n| {
            let ep = (n % 4) as usize;
            let h = IncomingHeader::put(ProcessId::rank((n % 3) as u32), (n * 7) % 12, 64)
                .with_hdr_data(n);
            (ep, h)
        })
        .collect();
    for (i, h) in &headers {
        models[*i].match_incoming(h, &mut want[*i]);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for engine in engines {
        let stop = Arc::clone(&stop);
        workers.push(thread::spawn(move || {
            let mut worker = Worker::<DeepList>::new(vec![engine]);
            let mut events = Vec::new();
            let mut done = Vec::new();
            loop {
                let finished = stop.load(Ordering::Acquire);
                worker.poll(32, &mut events, &mut done);
                if finished && worker.is_idle() {
                    break;
                }
                thread::yield_now();
            }
            (events, done)
        }));
    }
    let producer = {
        let dispatcher = dispatcher.clone();
        let headers = headers.clone();
        thread::spawn(move || {
            for (n, (i, h)) in headers.into_iter().enumerate() {
                let mut req = Request::network(
                    EndpointIndex(i as u16),
                    TrafficClass((i % 2) as u8),
                    n as u64,
                    h,
                );
                while let Err(back) = dispatcher.submit(req) {
                    req = back;
                    thread::yield_now();
                }
            }
        })
    };
    producer.join().unwrap();
    stop.store(true, Ordering::Release);
    let mut got: Vec<Vec<Event>> = vec![Vec::new(); eps.len()];
    let mut completions = 0;
    for w in workers {
        let (events, done) = w.join().unwrap();
        for e in events {
            got[usize::from(e.ep.0)].push(e);
        }
        completions += done
            .iter()
            .filter(|c| matches!(c.kind, CompletionKind::Matched(_)))
            .count();
    }
    assert_eq!(completions, headers.len());
    assert_eq!(got, want);
}
