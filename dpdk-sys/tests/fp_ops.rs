//! On real EAL (no hugepages) and two `net_ring` ports joined back to back: the inline
//! `rx_burst`/`tx_burst` (through `rte_eth_fp_ops`) move exactly the packets that DPDK's own
//! `rte_eth_rx_burst`/`rte_eth_tx_burst` (the C shim) move, in the same order and with the
//! same lengths, including a partial send into a full ring, and with RX and TX callbacks
//! installed (which the inline path must run as the C functions do).

use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use dpdk_sys::*;

type BurstFn = unsafe fn(u16, u16, *mut *mut rte_mbuf, u16) -> u16;

unsafe fn shim_rx(p: u16, q: u16, pkts: *mut *mut rte_mbuf, n: u16) -> u16 {
    unsafe { portico_rx_burst(p, q, pkts, n) }
}
unsafe fn shim_tx(p: u16, q: u16, pkts: *mut *mut rte_mbuf, n: u16) -> u16 {
    unsafe { portico_tx_burst(p, q, pkts, n) }
}

/// Ring slots: a ring of 64 holds 63 packets, so a burst of 100 is taken only in part.
const RING: u32 = 64;
const PACKETS: usize = 100;

fn eal_init() {
    let args: Vec<CString> = [
        "fp_ops",
        "--no-huge",
        "-m",
        "128",
        "--no-shconf",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .iter()
    .map(|s| CString::new(*s).unwrap())
    .collect();
    let mut argv: Vec<*mut std::ffi::c_char> = args.iter().map(|a| a.as_ptr() as *mut _).collect();
    // SAFETY: argv points at NUL-terminated strings that outlive the call (EAL keeps pointers
    // into them only for the duration of init); called once per process.
    let rc = unsafe { rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    assert!(rc >= 0, "rte_eal_init failed: {rc}");
}

/// Two ring ports, `a` sends to `b` and back; both started with one queue each way.
fn ring_pair(tag: &str, pool: *mut rte_mempool) -> (u16, u16) {
    let ring = |name: String| {
        let c = CString::new(name).unwrap();
        // SAFETY: EAL runs; valid name; single producer and consumer.
        let r = unsafe {
            rte_ring_create(
                c.as_ptr(),
                RING,
                SOCKET_ID_ANY,
                RING_F_SP_ENQ | RING_F_SC_DEQ,
            )
        };
        assert!(!r.is_null());
        r
    };
    let ab = ring(format!("{tag}_ab"));
    let ba = ring(format!("{tag}_ba"));
    let port = |name: String, rx: *mut rte_ring, tx: *mut rte_ring| {
        let c = CString::new(name).unwrap();
        // SAFETY: one valid ring each way; DPDK copies the arrays.
        let id = unsafe { rte_eth_from_rings(c.as_ptr(), &rx, 1, &tx, 1, 0) };
        assert!(id >= 0);
        let id = id as u16;
        let conf = rte_eth_conf::default();
        // SAFETY: a probed port, default config, the pool outlives the port.
        unsafe {
            assert_eq!(rte_eth_dev_configure(id, 1, 1, &conf), 0);
            assert_eq!(
                rte_eth_rx_queue_setup(id, 0, RING as u16, 0, std::ptr::null(), pool),
                0
            );
            assert_eq!(
                rte_eth_tx_queue_setup(id, 0, RING as u16, 0, std::ptr::null()),
                0
            );
            assert_eq!(rte_eth_dev_start(id), 0);
        }
        id
    };
    (
        port(format!("{tag}_a"), ba, ab),
        port(format!("{tag}_b"), ab, ba),
    )
}

/// `n` packets whose first 4 bytes hold their number and whose lengths differ.
fn packets(pool: *mut rte_mempool, first: u32, n: usize) -> Vec<*mut rte_mbuf> {
    let mut v = vec![std::ptr::null_mut(); n];
    // SAFETY: room for n pointers; on success each is a fresh mbuf we own.
    assert_eq!(
        unsafe { portico_pktmbuf_alloc_bulk(pool, v.as_mut_ptr(), n as u32) },
        0
    );
    for (i, &m) in v.iter().enumerate() {
        let seq = first + i as u32;
        let len = 60 + (seq * 37) % 1400;
        // SAFETY: a fresh mbuf has 2048 bytes of tailroom; append returns len writable bytes.
        unsafe {
            let p = portico_pktmbuf_append(m, len as u16) as *mut u8;
            assert!(!p.is_null());
            std::ptr::write_bytes(p, 0xab, len as usize);
            std::ptr::copy_nonoverlapping(seq.to_le_bytes().as_ptr(), p, 4);
        }
    }
    v
}

/// (number, pkt_len) of a packet made by `packets`.
fn id(m: *mut rte_mbuf) -> (u32, u32) {
    // SAFETY: a valid single-segment mbuf with at least 4 bytes of data.
    unsafe {
        let m = &*m;
        let p = (m.buf_addr as *const u8).add(m.data_off as usize);
        (u32::from_le_bytes(*(p as *const [u8; 4])), m.pkt_len)
    }
}

fn free(v: &mut Vec<*mut rte_mbuf>) {
    // SAFETY: frees mbufs we own, once.
    unsafe { rte_pktmbuf_free_bulk(v.as_mut_ptr(), v.len() as u32) };
    v.clear();
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// What each TX call took.
    sent: Vec<u16>,
    /// What each RX call delivered: (number, length) per packet, in order.
    received: Vec<Vec<(u32, u32)>>,
    /// Port counters afterwards: (a opackets, b ipackets).
    stats: (u64, u64),
}

/// Sends 100 packets from `a` (63 fit), receives them on `b`, sends the 37 left, receives
/// those, then polls the empty queue once.
fn scenario(tx: BurstFn, rx: BurstFn, a: u16, b: u16, pool: *mut rte_mempool) -> Outcome {
    let mut out = Outcome {
        sent: vec![],
        received: vec![],
        stats: (0, 0),
    };
    let mut pending = packets(pool, 0, PACKETS);
    while !pending.is_empty() {
        // SAFETY: started ports, queue 0, owned mbufs; the PMD takes the first `sent`.
        let sent = unsafe { tx(a, 0, pending.as_mut_ptr(), pending.len() as u16) };
        out.sent.push(sent);
        pending.drain(..sent as usize);
        let mut got = vec![std::ptr::null_mut(); 256];
        // SAFETY: room for 256 pointers.
        let n = unsafe { rx(b, 0, got.as_mut_ptr(), 256) };
        got.truncate(n as usize);
        out.received.push(got.iter().map(|&m| id(m)).collect());
        free(&mut got);
        assert!(sent > 0 || n > 0, "no progress");
    }
    let mut got = vec![std::ptr::null_mut(); 32];
    // SAFETY: as above.
    let n = unsafe { rx(b, 0, got.as_mut_ptr(), 32) };
    assert_eq!(n, 0, "the ring is empty");
    let mut sa = rte_eth_stats::default();
    let mut sb = rte_eth_stats::default();
    // SAFETY: valid ports and out pointers.
    unsafe {
        assert_eq!(rte_eth_stats_get(a, &mut sa), 0);
        assert_eq!(rte_eth_stats_get(b, &mut sb), 0);
    }
    out.stats = (sa.opackets, sb.ipackets);
    out
}

/// RX callback: keeps the even-numbered packets, frees the others.
unsafe extern "C" fn keep_even(
    _port: u16,
    _queue: u16,
    pkts: *mut *mut rte_mbuf,
    nb: u16,
    _max: u16,
    calls: *mut c_void,
) -> u16 {
    // SAFETY: DPDK passes the burst's nb valid mbufs and the counter given at installation.
    unsafe {
        (*(calls as *const AtomicU64)).fetch_add(1, Ordering::Relaxed);
        let mut kept = 0;
        for i in 0..nb as usize {
            let m = *pkts.add(i);
            if id(m).0.is_multiple_of(2) {
                *pkts.add(kept) = m;
                kept += 1;
            } else {
                portico_pktmbuf_free(m);
            }
        }
        kept as u16
    }
}

/// TX callback: counts the bytes offered, passes everything on.
unsafe extern "C" fn count_bytes(
    _port: u16,
    _queue: u16,
    pkts: *mut *mut rte_mbuf,
    nb: u16,
    bytes: *mut c_void,
) -> u16 {
    // SAFETY: DPDK passes the burst's nb valid mbufs and the counter given at installation.
    unsafe {
        let sum: u64 = (0..nb as usize)
            .map(|i| (**pkts.add(i)).pkt_len as u64)
            .sum();
        (*(bytes as *const AtomicU64)).fetch_add(sum, Ordering::Relaxed);
    }
    nb
}

#[test]
fn inline_bursts_move_what_the_shim_moves() {
    if DPDK_VERSION.starts_with("22.11.") {
        // A constant here, but not on every machine: it fails where build.rs fell back to the
        // shim on the release the inline copy was written for.
        assert!(
            std::hint::black_box(FP_OPS_INLINE),
            "DPDK {DPDK_VERSION}: expected the inline path, got the shim: {FP_OPS_SHIM_REASON}"
        );
    }
    eal_init();
    let name = CString::new("fp_pool").unwrap();
    // SAFETY: EAL runs; the pool lives until the process ends.
    let pool = unsafe { rte_pktmbuf_pool_create(name.as_ptr(), 2047, 0, 0, 2176, -1) };
    assert!(!pool.is_null());
    // SAFETY: plain getter.
    let free_before = unsafe { rte_mempool_avail_count(pool) };

    // One fresh pair per path combination, so that each starts from zeroed counters.
    let combos: [(&str, BurstFn, BurstFn); 4] = [
        ("ss", shim_tx, shim_rx),
        ("ii", tx_burst, rx_burst),
        ("is", tx_burst, shim_rx),
        ("si", shim_tx, rx_burst),
    ];
    let mut outcomes = vec![];
    for (tag, tx, rx) in combos {
        let (a, b) = ring_pair(tag, pool);
        outcomes.push((tag, scenario(tx, rx, a, b, pool)));
    }
    let reference = &outcomes[0].1;
    assert_eq!(
        reference.sent,
        vec![63, 37],
        "a ring of 64 takes 63, then the rest"
    );
    let numbers: Vec<u32> = reference.received.iter().flatten().map(|p| p.0).collect();
    assert_eq!(
        numbers,
        (0..PACKETS as u32).collect::<Vec<_>>(),
        "all, in order"
    );
    assert_eq!(reference.stats, (PACKETS as u64, PACKETS as u64));
    let bytes: u64 = reference
        .received
        .iter()
        .flatten()
        .map(|p| p.1 as u64)
        .sum();
    let expect: u64 = (0..PACKETS as u32)
        .map(|s| 60 + (s * 37 % 1400) as u64)
        .sum();
    assert_eq!(bytes, expect);
    for (tag, o) in &outcomes[1..] {
        assert_eq!(o, reference, "path {tag} differs from the shim");
    }

    // With callbacks: the RX one drops the odd packets, the TX one counts bytes. The inline
    // path must run both, as rte_eth_rx_burst/rte_eth_tx_burst do.
    let mut with_callbacks = vec![];
    for (tag, tx, rx) in [
        ("cs", shim_tx as BurstFn, shim_rx as BurstFn),
        ("ci", tx_burst, rx_burst),
    ] {
        let (a, b) = ring_pair(tag, pool);
        let calls = Box::leak(Box::new(AtomicU64::new(0)));
        let bytes = Box::leak(Box::new(AtomicU64::new(0)));
        // SAFETY: started ports, queue 0; the user pointers live for the process.
        unsafe {
            assert!(
                !rte_eth_add_rx_callback(b, 0, Some(keep_even), calls as *const _ as *mut c_void)
                    .is_null()
            );
            assert!(
                !rte_eth_add_tx_callback(a, 0, Some(count_bytes), bytes as *const _ as *mut c_void)
                    .is_null()
            );
        }
        let o = scenario(tx, rx, a, b, pool);
        with_callbacks.push((
            tag,
            o,
            calls.load(Ordering::Relaxed),
            bytes.load(Ordering::Relaxed),
        ));
    }
    let (_, shim, shim_calls, shim_bytes) = &with_callbacks[0];
    let kept: Vec<u32> = shim.received.iter().flatten().map(|p| p.0).collect();
    assert_eq!(kept, (0..PACKETS as u32).step_by(2).collect::<Vec<_>>());
    assert_eq!(*shim_calls, 3, "the RX callback runs on every RX burst");
    // The TX callback sees all 100 offered first, then the 37 the ring refused.
    let tail: u64 = (63..PACKETS as u32)
        .map(|s| 60 + (s * 37 % 1400) as u64)
        .sum();
    assert_eq!(*shim_bytes, expect + tail);
    let (_, inline, inline_calls, inline_bytes) = &with_callbacks[1];
    assert_eq!(
        inline, shim,
        "with callbacks, the inline path differs from the shim"
    );
    assert_eq!((inline_calls, inline_bytes), (shim_calls, shim_bytes));

    // SAFETY: plain getter. Everything sent was received and freed, or freed by a callback.
    assert_eq!(
        unsafe { rte_mempool_avail_count(pool) },
        free_before,
        "no mbuf leaked"
    );
}
