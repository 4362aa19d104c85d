//! Tagged messaging (MPI-style tag matching done by the engine), end to end in one process:
//! two software RoCEv2 engines joined by a `net_ring` link, rank 0 (engine A) sending to
//! rank 1 (engine B).
//!
//! If you know MPI, the pieces map like this:
//!
//! | MPI                                  | Portico                                              |
//! |--------------------------------------|------------------------------------------------------|
//! | `MPI_Isend(buf, dest, tag)`          | `WorkRequest::tagged_send(wr_id, sgl, endpoint, tag, hdr_data)` on the queue pair to `dest` |
//! | send request done (`MPI_Wait`)       | a `TaggedSend` completion on the sender's completion queue |
//! | `MPI_Irecv(buf, source, tag)`        | `TagPort::append(endpoint, Priority, TagEntry::recv(tag, buf, cookie).from_rank(source))` |
//! | `MPI_ANY_SOURCE`                     | no `.from_rank(..)`                                  |
//! | `MPI_ANY_TAG` (or part of the tag)   | `.with_ignore(bits)`: those bits of the tag match anything |
//! | receive done (`MPI_Wait`)            | a `Put` event (or `UnexpectedConsumed`, see below) with the entry's `cookie` |
//! | unexpected-message queue             | the overflow list: buffers the engine puts messages in when no receive is posted |
//! | `MPI_Status` (source, tag, count)    | the event's `initiator`, `match_bits`, `mlength` (`rlength`: what was sent) |
//! | `MPI_ERR_TRUNCATE`                   | `truncated` in the event: what did not fit was discarded |
//!
//! The matching runs on the engine's worker, not in the application: a message is matched as
//! its first packet arrives and its data goes straight into the receive buffer it matched.
//! Small messages travel *eagerly* (envelope and data together, up to
//! `QpConfig::rndv_threshold`, 16 KiB by default). Larger ones use *rendezvous*: the first
//! packet carries the envelope, and the target's worker READs the rest straight from the
//! sender's buffer once it knows where it goes; the send completes when the target says it is
//! done. So a rendezvous buffer must be one piece, registered with remote READ allowed.
//!
//! Here B posts three receives (one exact, one for a range of tags, one for any tag), A sends
//! three messages that match them (the last one by rendezvous), then A sends a message that
//! nothing matches yet: it waits in B's overflow buffer until B posts a receive for it.
//!
//!     cargo run --release --example tagged

use std::sync::Arc;
use std::time::Duration;

use pmem::Mapping;
use portico::dataplane::Eal;
use portico::lpe::{ListKind, Options};
use portico::rdma::loopback::{self, LoopbackOpts};
use portico::rdma::{Cq, TagConfig, TagEntry, TagEvent, TagEventKind, TagPort};
use portico::transport::{Access, QpConfig, WcOpcode, WcStatus, WorkRequest};

/// Every message goes to endpoint 0 (think of it as the communicator).
const EP: u16 = 0;
const KIB: usize = 1024;

/// Waits for the event of `kind` about the list entry `cookie`, printing every event on the way.
fn wait_for(port: &mut TagPort, kind: TagEventKind, cookie: u64) -> Result<TagEvent, String> {
    loop {
        let e = port
            .wait_one(Duration::from_secs(5))
            .ok_or(format!("no {kind:?} event for entry {cookie}"))?;
        match e.kind {
            TagEventKind::Put | TagEventKind::PutOverflow | TagEventKind::UnexpectedConsumed => {
                println!(
                    "  B event: {:<18} entry {:<3} tag {:#x} from rank {}: {} of {} bytes{}{}",
                    format!("{:?}", e.kind),
                    e.cookie,
                    e.match_bits,
                    e.initiator,
                    e.mlength,
                    e.rlength,
                    if e.rendezvous { ", by rendezvous" } else { "" },
                    if e.truncated { ", truncated" } else { "" },
                )
            }
            // Link (the entry is on its list) and AutoUnlink (a use-once entry left it).
            _ => println!(
                "  B event: {:<18} entry {}",
                format!("{:?}", e.kind),
                e.cookie
            ),
        }
        if e.kind == kind && e.cookie == cookie {
            return Ok(e);
        }
    }
}

/// Waits for A's send `wr_id` to complete successfully.
fn sent(cq: &mut Cq, wr_id: u64) -> Result<(), String> {
    let wc = cq
        .wait_one(Duration::from_secs(5))
        .ok_or(format!("send {wr_id} did not complete"))?;
    if (wc.wr_id, wc.opcode, wc.status) != (wr_id, WcOpcode::TaggedSend, WcStatus::Success) {
        return Err(format!("expected send {wr_id} to succeed, got {wc:?}"));
    }
    println!("  A: send {wr_id} done ({} bytes)", wc.byte_len);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. EAL without hugepages (no NIC needed), both engines on one worker on the last core.
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
    let last = *portico::app::available_cores()
        .last()
        .expect("at least one core");
    Eal::init(&eal)?;

    // Tagged queue pairs (every SEND carries a tag header) and a tag-matching shard on each
    // engine. A is rank 0, B is rank 1.
    let mut qp = QpConfig::new(0, 0);
    qp.tagged = true;
    let mut opts = LoopbackOpts::new(qp, [last, last]);
    opts.tags = Some(TagConfig::default());
    let mut pair = loopback::start(&opts)?;
    let mut port = pair.b.tags.take().expect("B's tag port");
    let (a, b) = (&mut pair.a, &mut pair.b);

    // 2. Memory. A's holds the messages; it allows remote READ so B can pull a rendezvous
    // message. B's holds the receive buffers (64 KiB each, 1 MiB for the large one) and an
    // overflow buffer for unexpected messages.
    let a_mem = Arc::new(Mapping::anonymous(2 * 1024 * KIB)?);
    let b_mem = Arc::new(Mapping::anonymous(4 * 1024 * KIB)?);
    let a_mr = a.engine.register_all(&a_mem, Access::ALL)?;
    let b_mr = b.engine.register_all(&b_mem, Access::LOCAL_WRITE)?;
    let recv_buf = |i: usize, len: usize| b_mr.sge(i * 64 * KIB, len as u32);
    const BIG_AT: usize = 1024 * KIB;
    const OVERFLOW_AT: usize = 3 * 1024 * KIB;

    // 3. B posts its receives, in order (a message takes the first posted receive it matches):
    //    entry 1: tag 1 from rank 0 only         (MPI_Irecv(source 0, tag 1))
    //    entry 2: any tag 0x100..=0x1ff           (the low byte of the tag is ignored)
    //    entry 3: any tag, any rank, 1 MiB        (MPI_ANY_SOURCE, MPI_ANY_TAG)
    // and gives the engine an overflow buffer for messages nothing matches (the unexpected
    // queue): MANAGE_LOCAL fills it from the start, one message after the other.
    println!("B posts three receives and an overflow buffer");
    port.append(
        EP,
        ListKind::Priority,
        TagEntry::recv(1, recv_buf(0, 64 * KIB), 1).from_rank(0),
    )?;
    port.append(
        EP,
        ListKind::Priority,
        TagEntry::recv(0x100, recv_buf(1, 64 * KIB), 2).with_ignore(0xff),
    )?;
    port.append(
        EP,
        ListKind::Priority,
        TagEntry::recv(0, b_mr.sge(BIG_AT, 1024 * KIB as u32), 3).with_ignore(u64::MAX),
    )?;
    let overflow = TagEntry::recv(0, b_mr.sge(OVERFLOW_AT, 1024 * KIB as u32), 100)
        .with_ignore(u64::MAX)
        .with_options(Options::MANAGE_LOCAL);
    port.append(EP, ListKind::Overflow, overflow)?;
    for cookie in [1, 2, 3, 100] {
        wait_for(&mut port, TagEventKind::Link, cookie)?;
    }

    // 4. A sends three messages: 100 bytes with tag 1 and 10 000 bytes with tag 0x1ab (eager,
    // the second in several packets), and 1 MiB with tag 7 (rendezvous). `hdr_data` travels
    // with the envelope.
    let messages: [(u64, usize, u64); 3] = [(1, 100, 1), (2, 10_000, 0x1ab), (3, 1024 * KIB, 7)];
    let mut wrs = Vec::new();
    let mut at = 0;
    let mut offsets = Vec::new();
    for &(wr_id, len, tag) in &messages {
        let data: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + wr_id) as u8).collect();
        a_mem.write(at, &data)?;
        wrs.push(WorkRequest::tagged_send(
            wr_id,
            a_mr.sgl(at, len as u32),
            EP,
            tag,
            wr_id * 1000,
        ));
        offsets.push(at);
        at += len;
    }
    println!("A sends tags 1 (100 B), 0x1ab (10 000 B) and 7 (1 MiB, rendezvous)");
    a.qp.post_send(&wrs)?;
    // Each lands in the receive it matched: entry 1, entry 2 (0x1ab is in 0x100..=0x1ff),
    // entry 3 (7 matches only the any-tag receive).
    for (&(wr_id, len, _), (&at, dest)) in
        messages
            .iter()
            .zip(offsets.iter().zip([0, 64 * KIB, BIG_AT]))
    {
        let put = wait_for(&mut port, TagEventKind::Put, wr_id)?;
        assert_eq!(put.mlength, len as u64);
        let (mut got, mut want) = (vec![0u8; len], vec![0u8; len]);
        b_mem.read(dest, &mut got)?;
        a_mem.read(at, &mut want)?;
        assert!(got == want, "message {wr_id} differs");
        sent(&mut a.cq, wr_id)?;
    }
    println!("the three messages are in their receive buffers, byte for byte");

    // 5. An unexpected message: A sends tag 99 before B has a receive for it. It lands in the
    // overflow buffer (PutOverflow) and A's send completes (eager: the data is at B). When B
    // posts a receive for tag 99, the engine finds the message on the unexpected list and
    // copies it into the new buffer (UnexpectedConsumed) instead of linking the receive.
    let unexpected: Vec<u8> = b"an unexpected message, claimed later".to_vec();
    a_mem.write(at, &unexpected)?;
    println!("A sends tag 99 before B posts a receive for it");
    a.qp.post_send(&[WorkRequest::tagged_send(
        4,
        a_mr.sgl(at, unexpected.len() as u32),
        EP,
        99,
        0,
    )])?;
    wait_for(&mut port, TagEventKind::PutOverflow, 100)?;
    sent(&mut a.cq, 4)?;
    println!("B posts a receive for tag 99");
    port.append(
        EP,
        ListKind::Priority,
        TagEntry::recv(99, recv_buf(2, 64 * KIB), 4),
    )?;
    let claimed = wait_for(&mut port, TagEventKind::UnexpectedConsumed, 4)?;
    let mut got = vec![0u8; claimed.mlength as usize];
    b_mem.read(2 * 64 * KIB, &mut got)?;
    assert_eq!(got, unexpected, "the claimed message");
    println!("B's new receive holds {:?}", String::from_utf8_lossy(&got));

    pair.runtime.join()?;
    println!("all messages matched and verified");
    Ok(())
}
