//! The bottleneck emulator's per-packet calls (`offer`, `poll`) do not allocate once it is
//! built: 100 000 frames through a queue that fills past Kmax and drops at the tail, with the
//! trace on. (A counting global allocator from the `allocation-counter` crate; this test
//! binary only: it replaces the allocator of the whole binary it is linked into.)

use bench::bottleneck::{Bottleneck, BottleneckConfig, BottleneckCounters};

#[test]
fn offer_and_poll_do_not_allocate() {
    let cfg = BottleneckConfig {
        delay_ns: 2000,
        ..BottleneckConfig::for_rate(10_000_000_000)
    };
    let mut b = Bottleneck::new(cfg, 512)
        .unwrap()
        .with_trace(10_000, 100, 4);
    let mut delivered = 0u64;
    let info = allocation_counter::measure(|| {
        // 1500 B every 1000 ns at 10 Gbit/s (1219.2 ns of service): the queue builds past
        // Kmax to the 640 000 B buffer, then drops at the tail; flows beyond the trace and
        // times past its last bin too.
        for i in 0..100_000u64 {
            let now = 1000 * i;
            let _ = b.offer(now, i as u32, 1500, true, (i % 6) as usize);
            b.poll(now, |_, _| delivered += 1);
        }
        b.poll(u64::MAX, |_, _| delivered += 1);
    });
    assert_eq!(info.count_total, 0);
    // By the last offer at 99 999 000 ns the server, busy throughout, has finished
    // floor(99 999 000 / 1219.2) = 82 020 frames and holds 426 (639 000 B, the buffer less
    // one frame); the final poll hands those out too. The mark count is the seed-1 golden.
    assert_eq!(
        b.counters(),
        BottleneckCounters {
            arrived_packets: 100_000,
            arrived_bytes: 150_000_000,
            delivered_packets: 82_446,
            delivered_bytes: 123_669_000,
            marked: 81_906,
            dropped: 17_554,
            dropped_bytes: 26_331_000,
            max_queue_bytes: 639_000,
        }
    );
    assert_eq!(delivered, 82_446);
}
