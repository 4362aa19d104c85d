//! TX ownership on real EAL: a burst larger than the TX ring sends a prefix and keeps the
//! unsent tail, owned and intact; what the PMD took arrives on the peer port; and when every
//! handle is gone the mempool has all its buffers back (nothing leaked, nothing freed twice).

use std::sync::Arc;

use portico::dataplane::{Burst, Eal, Mempool, Port, PortConfig, ring_pair};
use portico::traffic::frame::{self, FrameSpec};

#[test]
fn unsent_tail_stays_owned_and_nothing_leaks() {
    let args: Vec<String> = [
        "--no-huge",
        "-m",
        "128",
        "--no-shconf",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .map(String::from)
    .to_vec();
    Eal::init(&args).expect("EAL starts");
    assert!(Eal::init(&args).is_err(), "EAL starts once per process");

    let pool = Arc::new(Mempool::new("own_pool", 1023, 0, 2176, -1).unwrap());
    // A ring of 64 slots holds 63 packets: a burst of 100 cannot all be taken.
    let (a, b) = ring_pair("own_a", "own_b", 64).unwrap();
    let cfg = PortConfig {
        rx_desc: 64,
        tx_desc: 64,
        ..PortConfig::default()
    };
    let pa = Port::start(a, &cfg, pool.clone()).unwrap();
    let pb = Port::start(b, &cfg, pool.clone()).unwrap();
    let mut txq = pa.tx_queue(0).unwrap();
    let mut rxq = pb.rx_queue(0).unwrap();
    assert!(pa.tx_queue(0).is_none(), "a queue is handed out once");
    // `append` on one segment (inline in Rust) keeps data_len, pkt_len and the tailroom
    // consistent and refuses to pass the end of the buffer, changing nothing then.
    {
        let mut m = pool.alloc().unwrap();
        let room = m.tailroom();
        assert_eq!(room, 2176 - 128, "data room minus the default headroom");
        m.append(100).unwrap().fill(7);
        assert_eq!((m.len(), m.pkt_len(), m.tailroom()), (100, 100, room - 100));
        assert!(m.append((room - 99) as u16).is_none());
        assert_eq!((m.len(), m.pkt_len(), m.tailroom()), (100, 100, room - 100));
        m.append((room - 100) as u16).unwrap().fill(9);
        assert_eq!((m.len(), m.pkt_len(), m.tailroom()), (room, room as u32, 0));
        assert!(m.append(1).is_none());
        assert!(m.data()[..100].iter().all(|&b| b == 7));
        assert!(m.data()[100..].iter().all(|&b| b == 9));
    }
    let base_in_use = pool.in_use();

    let spec = FrameSpec {
        frame_size: 100,
        ..FrameSpec::default()
    };
    let mut out = Burst::new();
    assert!(out.alloc(&pool, 100));
    for (seq, m) in out.as_mut_slice().iter_mut().enumerate() {
        let data = m.append(spec.buffer_len() as u16).unwrap();
        frame::write_template(&spec, data);
        frame::stamp(data, seq as u64);
    }
    assert_eq!(out.bytes(), 100 * 96);
    assert_eq!(pool.in_use() - base_in_use, 100);

    let (sent, bytes) = out.tx(&mut txq);
    assert_eq!(sent, 63, "the ring takes 63 of 100");
    assert_eq!(bytes, 63 * 96);
    assert_eq!(out.len(), 37, "the unsent tail is still ours");
    // The tail moved to the front in order: its first packet is sequence 63.
    assert_eq!(frame::verify(out.as_slice()[0].data()).unwrap().seq, 63);
    assert_eq!(
        pool.in_use() - base_in_use,
        100,
        "nothing freed: 63 in the ring, 37 here"
    );

    let mut got = Burst::new();
    let n = got.rx(&mut rxq, 256);
    assert_eq!(n, 63);
    assert_eq!(got.bytes(), 63 * 96);
    for (i, m) in got.as_slice().iter().enumerate() {
        assert_eq!(frame::verify(m.data()).unwrap().seq, i as u64);
    }
    // Send the rest now that the ring has room.
    let (sent, _) = out.tx(&mut txq);
    assert_eq!((sent, out.len()), (37, 0));
    let mut rest = Burst::new();
    assert_eq!(rest.rx(&mut rxq, 256), 37);
    assert_eq!(frame::verify(rest.as_slice()[36].data()).unwrap().seq, 99);

    // Moving between bursts keeps every buffer owned once.
    assert_eq!(got.take_from(&mut rest), 37);
    assert_eq!((got.len(), rest.len()), (100, 0));
    assert_eq!(
        got.pop().map(|m| frame::verify(m.data()).unwrap().seq),
        Some(99)
    );
    drop(got);
    drop(rest);
    drop(out);
    assert_eq!(
        pool.in_use(),
        base_in_use,
        "every mbuf went back exactly once"
    );
}
