//! An application using Portico's RDMA API end to end: start EAL, bring up two RoCEv2 engines
//! joined by a `net_ring` link, register memory on both, RDMA WRITE a message into the peer,
//! READ it back, SEND a message into a posted receive, and check every byte.
//!
//!     cargo run --release --example rdma_loopback

use std::time::Duration;

use portico::dataplane::Eal;
use portico::rdma::loopback::{self, LoopbackOpts, QPN_A, QPN_B};
use portico::transport::{Access, QpConfig, RecvRequest, WcStatus, WorkRequest, WrKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let eal: Vec<String> = [
        "--no-huge",
        "-m",
        "512",
        "--no-shconf",
        "--no-pci",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .map(String::from)
    .to_vec();
    // Both engines on the last core; this thread (EAL's main lcore, core 0) drives them.
    let cores = portico::app::available_cores();
    let last = *cores.last().expect("at least one core");
    Eal::init(&eal)?;
    let mut pair = loopback::start(&LoopbackOpts {
        qp: QpConfig::new(0, 0),
        faults: None,
        cores: [last, last],
        burst: 32,
        pcap: None,
    })?;

    // A: a buffer holding the message, and one for the READ to land in. B: the target region.
    let a_buf = pair.a.register(0x1000, 4096, Access::ALL)?;
    let a_back = pair.a.register(0x9000, 4096, Access::LOCAL_WRITE)?;
    let b_mem = pair.b.register(0x10_0000, 4096, Access::ALL)?;
    let message = b"Hello from engine A, by RDMA WRITE over RoCEv2.";
    pair.a.write(a_buf.lkey, 0, message)?;

    let len = message.len() as u32;
    let write = WorkRequest {
        wr_id: 1,
        kind: WrKind::Write {
            remote_addr: 0x10_0000,
            rkey: b_mem.rkey,
            imm: None,
        },
        lkey: a_buf.lkey,
        local_addr: 0x1000,
        len,
    };
    pair.a.post_send(QPN_A, write)?;
    let read = WorkRequest {
        wr_id: 2,
        kind: WrKind::Read {
            remote_addr: 0x10_0000,
            rkey: b_mem.rkey,
        },
        lkey: a_back.lkey,
        local_addr: 0x9000,
        len,
    };
    pair.a.post_send(QPN_A, read)?;
    pair.b.post_recv(
        QPN_B,
        RecvRequest {
            wr_id: 3,
            lkey: b_mem.lkey,
            addr: 0x10_0800,
            len: 1024,
        },
    )?;
    // The receive is posted before the SEND can arrive: a read is a round trip to B's worker.
    pair.b.read(b_mem.lkey, 0, 1)?;
    let send = WorkRequest {
        wr_id: 4,
        kind: WrKind::Send { imm: Some(42) },
        lkey: a_buf.lkey,
        local_addr: 0x1000,
        len,
    };
    pair.a.post_send(QPN_A, send)?;

    for _ in 0..3 {
        let wc = pair
            .a
            .wait(Duration::from_secs(5))?
            .ok_or("no completion on A")?;
        println!(
            "A completed wr {} ({:?}): {:?}, {} bytes",
            wc.wr_id, wc.opcode, wc.status, wc.byte_len
        );
        assert_eq!(wc.status, WcStatus::Success);
    }
    let wc = pair
        .b
        .wait(Duration::from_secs(5))?
        .ok_or("no completion on B")?;
    println!(
        "B received wr {} ({:?}): {} bytes, immediate {:?}",
        wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data
    );

    let written = pair.b.read(b_mem.lkey, 0, message.len())?;
    let read_back = pair.a.read(a_back.lkey, 0, message.len())?;
    let received = pair.b.read(b_mem.lkey, 0x800, message.len())?;
    println!(
        "B's memory after the WRITE: {:?}",
        String::from_utf8_lossy(&written)
    );
    assert_eq!(written, message);
    assert_eq!(read_back, message);
    assert_eq!(received, message);
    println!("READ back and SEND contents match, byte for byte");
    pair.runtime.join()?;
    Ok(())
}
