//! Portico's RDMA API end to end, in one process: two software RoCEv2 engines joined by a
//! `net_ring` link (two DPDK ports whose wires are rings), and an application that drives
//! them the way a verbs program drives an RDMA NIC.
//!
//! The steps are those of libibverbs:
//!
//! 1. **Start the engines.** EAL (DPDK's runtime) first, then the pair (`rdma::loopback`):
//!    each end is an engine's control handle, one queue pair (QP) and one completion queue
//!    (CQ). Both engines run on one pinned worker core; this thread is the application.
//! 2. **Register memory.** The application maps memory itself (`pmem::Mapping`) and registers
//!    it with its engine. The `MemoryRegion` it gets back has an lkey, which names the memory
//!    in the application's own work requests, and an rkey and an address (`mr.addr()`, the
//!    real address of the bytes), which a peer needs to reach it. The engine places incoming
//!    data straight into this memory and sends straight from it: no copies in between.
//! 3. **Post work and poll completions.** Work requests go on the QP (`post_send` for SEND,
//!    RDMA WRITE and RDMA READ; `post_recv` for buffers that incoming SENDs fill), each naming
//!    its local buffer with a scatter/gather list. Every request ends in exactly one
//!    completion on the CQ. Until then its buffer belongs to the engine; once it has been
//!    polled, the bytes are in place and the application may read them.
//!
//! Here A WRITEs a message into B's memory, READs it back into another part of its own, and
//! SENDs it with immediate data into a receive buffer that B posted. Each copy is then
//! compared in the memory where it landed.
//!
//!     cargo run --release --example rdma_loopback

use std::sync::Arc;
use std::time::Duration;

use pmem::Mapping;
use portico::dataplane::Eal;
use portico::rdma::Cq;
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::transport::{
    Access, QpConfig, RecvRequest, WcOpcode, WcStatus, WorkCompletion, WorkRequest,
};

/// Waits for the next completion on `cq` and checks it is the successful end of `wr_id`.
fn expect(cq: &mut Cq, wr_id: u64, opcode: WcOpcode) -> Result<WorkCompletion, String> {
    let wc = cq
        .wait_one(Duration::from_secs(5))
        .ok_or(format!("no completion for work request {wr_id}"))?;
    if (wc.wr_id, wc.opcode, wc.status) != (wr_id, opcode, WcStatus::Success) {
        return Err(format!(
            "expected {wr_id} ({opcode:?}) to succeed, got {wc:?}"
        ));
    }
    Ok(wc)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. EAL without hugepages, its main lcore on core 0; both engines on the last core.
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
    // Read before EAL starts: EAL pins this thread to its main lcore.
    let cores = portico::app::available_cores();
    let last = *cores.last().expect("at least one core");
    Eal::init(&eal)?;
    let mut pair = loopback::start(&LoopbackOpts::new(QpConfig::new(0, 0), [last, last]))?;
    let (a, b) = (&mut pair.a, &mut pair.b);

    // 2. Each side maps 8 KiB of its own memory and registers all of it. A's holds the
    // message at 0 and receives the READ at 4096; B's receives the WRITE at 0 and the SEND at
    // 4096. B opens its memory to remote WRITEs and READs; placing data (READ responses,
    // received SENDs) needs LOCAL_WRITE.
    let a_mem = Arc::new(Mapping::anonymous(8192)?);
    let b_mem = Arc::new(Mapping::anonymous(8192)?);
    let a_mr = a.engine.register_all(&a_mem, Access::LOCAL_WRITE)?;
    let b_mr = b.engine.register_all(&b_mem, Access::ALL)?;
    let message = b"Hello from engine A, by RDMA over RoCEv2.";
    let len = message.len() as u32;
    a_mem.write(0, message)?;
    // What A must know of B's memory. Two real programs would exchange this out of band.
    let (remote_addr, rkey) = (b_mr.addr(), b_mr.rkey());
    println!(
        "B's region: {} bytes at {remote_addr:#x}, rkey {rkey:#x}",
        b_mr.len()
    );

    // 3. B posts a receive buffer first, so it is there when the SEND arrives. Then A posts
    // three requests as one list (one doorbell); a queue pair executes them in order, so the
    // READ sees what the WRITE wrote.
    b.qp.post_recv(&[RecvRequest::new(10, b_mr.sgl(4096, 1024))])?;
    a.qp.post_send(&[
        WorkRequest::write(1, a_mr.sgl(0, len), remote_addr, rkey, None),
        WorkRequest::read(2, a_mr.sgl(4096, len), remote_addr, rkey),
        WorkRequest::send(3, a_mr.sgl(0, len), Some(42)),
    ])?;
    for (wr_id, opcode) in [
        (1, WcOpcode::RdmaWrite),
        (2, WcOpcode::RdmaRead),
        (3, WcOpcode::Send),
    ] {
        let wc = expect(&mut a.cq, wr_id, opcode)?;
        println!(
            "A: work request {wr_id} ({opcode:?}) done, {} bytes",
            wc.byte_len
        );
    }
    let wc = expect(&mut b.cq, 10, WcOpcode::Recv)?;
    println!(
        "B: receive {} filled with {} bytes, immediate data {:?}",
        wc.wr_id, wc.byte_len, wc.imm_data
    );
    assert_eq!((wc.byte_len, wc.imm_data), (len, Some(42)));

    // The completions handed the buffers back: the bytes are where the engines put them, in
    // each application's own memory.
    let mut written = vec![0u8; message.len()];
    let mut read_back = vec![0u8; message.len()];
    let mut received = vec![0u8; message.len()];
    b_mem.read(0, &mut written)?;
    a_mem.read(4096, &mut read_back)?;
    b_mem.read(4096, &mut received)?;
    println!(
        "B's memory after the WRITE: {:?}",
        String::from_utf8_lossy(&written)
    );
    assert_eq!(written, message, "the WRITE landed in B's memory");
    assert_eq!(
        read_back, message,
        "the READ brought it back into A's memory"
    );
    assert_eq!(received, message, "the SEND filled B's receive buffer");
    println!("WRITE, READ back and SEND all match, byte for byte");

    pair.runtime.join()?;
    Ok(())
}
