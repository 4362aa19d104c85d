//! `portico target` and `portico initiator`: one RoCEv2 engine per process, on a real port
//! (`net_memif` between two processes, a `net_tap`, or a NIC), configured from TOML.
//!
//! The target registers one remote-accessible region and prints a `ready` JSON line with its
//! address, length and rkey; then it serves until its duration ends or it is signalled. The
//! initiator waits for its link and writes `ops` messages into the target's region. After each
//! WRITE completes it READs the message back and compares it byte for byte. It exits with status
//! 1 if any operation failed or any byte differs.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::app::{AppError, DeviceArg, available_cores, plan_eal_args};
use crate::config::{ConfigError, EalSection, from_toml, vdev_driver};
use crate::dataplane::{self, Eal, Mempool, Port, PortConfig};
use crate::hugepages::HugepageStatus;
use crate::latency::Latency;
use crate::rdma::{RdmaHandle, RdmaNode, RdmaStage};
use crate::report;
use crate::runtime::{CaptureSink, CaptureTap, Runtime, StageBox, TxPolicy, WorkerSpec};
use crate::transport::{Access, Mtu, QpConfig, WcStatus, WorkRequest, WrKind};
use crate::wire::EthernetAddress;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    #[serde(default)]
    pub eal: EalSection,
    pub rdma: RdmaSection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaSection {
    /// The port, as a vdev (`net_memif0,role=server,socket=/tmp/x.sock`) or a PCI address.
    pub port: String,
    pub core: usize,
    pub mac: String,
    pub ip: Ipv4Addr,
    pub qpn: u32,
    pub peer_mac: String,
    pub peer_ip: Ipv4Addr,
    pub peer_qpn: u32,
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// Where this side's region sits in its (virtual) address space, and its size.
    pub region_addr: u64,
    pub region_len: usize,
    /// Retransmission timeout in microseconds.
    #[serde(default = "default_timeout_us")]
    pub timeout_us: u64,
    /// target: receive buffers of 4 KiB to post in the upper half of the region, for SENDs.
    #[serde(default)]
    pub receives: u32,
}

fn default_mtu() -> u32 {
    1024
}
fn default_timeout_us() -> u64 {
    1000
}

fn mac(field: &str, s: &str) -> Result<EthernetAddress, ConfigError> {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| ConfigError {
            field: field.into(),
            message: format!("{s:?} is not a MAC address"),
        })?;
    EthernetAddress::from_bytes(&bytes)
        .filter(|_| bytes.len() == 6)
        .ok_or_else(|| ConfigError {
            field: field.into(),
            message: format!("{s:?} is not a MAC address"),
        })
}

fn mtu(m: u32) -> Result<Mtu, ConfigError> {
    Ok(match m {
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        4096 => Mtu::M4096,
        _ => {
            return Err(ConfigError {
                field: "rdma.mtu".into(),
                message: format!("{m} is not 256, 512, 1024, 2048 or 4096"),
            });
        }
    })
}

/// A running engine on one port.
struct Peer {
    runtime: Runtime,
    handle: RdmaHandle,
    port: Port,
    local_qpn: u32,
    capture: Option<Arc<CaptureSink>>,
}

/// Flushes the capture, if any: how many packets it holds.
fn finish_capture(
    c: &Option<Arc<CaptureSink>>,
    pcap: Option<&Path>,
) -> Result<Option<u64>, AppError> {
    match (c, pcap) {
        (Some(sink), Some(path)) => sink.finish().map(Some).map_err(|source| AppError::Capture {
            path: path.display().to_string(),
            source,
        }),
        _ => Ok(None),
    }
}

fn load(path: &Path) -> Result<PeerConfig, AppError> {
    let bad = |source| AppError::Config {
        path: path.display().to_string(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        bad(ConfigError {
            field: path.display().to_string(),
            message: format!("cannot read: {e}"),
        })
    })?;
    let cfg: PeerConfig = from_toml(&text).map_err(bad)?;
    let cores = available_cores();
    if !cores.contains(&cfg.rdma.core) {
        return Err(bad(ConfigError {
            field: "rdma.core".into(),
            message: format!(
                "core {} does not exist (cores available: {cores:?})",
                cfg.rdma.core
            ),
        }));
    }
    mac("rdma.mac", &cfg.rdma.mac).map_err(bad)?;
    mac("rdma.peer_mac", &cfg.rdma.peer_mac).map_err(bad)?;
    mtu(cfg.rdma.mtu).map_err(bad)?;
    Ok(cfg)
}

fn start(
    cfg: &PeerConfig,
    extra_eal: &[String],
    json: bool,
    pcap: Option<&Path>,
) -> Result<Peer, AppError> {
    let r = &cfg.rdma;
    let is_pci = r.port.contains(':') && !r.port.starts_with("net_");
    let device = if is_pci {
        DeviceArg::Pci(r.port.clone())
    } else {
        DeviceArg::Vdev(r.port.clone())
    };
    let cores = available_cores();
    let main = cores
        .iter()
        .copied()
        .find(|&c| c != r.core)
        .unwrap_or(r.core);
    let mut user = cfg.eal.args.clone();
    user.extend(extra_eal.iter().cloned());
    let (args, memory) = plan_eal_args(
        &user,
        cfg.eal.hugepages,
        cfg.eal.memory_mb,
        main,
        &[device],
        &HugepageStatus::read(),
    )?;
    let info = Eal::init(&args)?;
    report::banner(info, &memory, json);
    let name = if is_pci {
        r.port.as_str()
    } else {
        vdev_driver(&r.port).0
    };
    let id = dataplane::port_by_name(name)
        .ok_or_else(|| AppError::Usage(format!("rdma.port: EAL probed no port named {name}")))?;
    let pool = Arc::new(Mempool::new(
        "peer_pool",
        8191,
        256,
        crate::rdma::FRAME_DATA_ROOM,
        -1,
    )?);
    let port = Port::start(id, &PortConfig::default(), pool.clone())?;

    let mut qp = QpConfig::new(r.qpn, r.peer_qpn);
    qp.remote_mac = mac("rdma.peer_mac", &r.peer_mac).map_err(|source| AppError::Config {
        path: String::new(),
        source,
    })?;
    qp.remote_ip = r.peer_ip;
    qp.pmtu = mtu(r.mtu).map_err(|source| AppError::Config {
        path: String::new(),
        source,
    })?;
    qp.timeout_ns = r.timeout_us * 1000;
    let mut node = RdmaNode::new(
        mac("rdma.mac", &r.mac).map_err(|source| AppError::Config {
            path: String::new(),
            source,
        })?,
        r.ip,
        1 << 14,
    );
    node.add_qp(qp)
        .map_err(|e| AppError::Usage(format!("rdma: bad queue pair {}", e.field)))?;
    let capture = match pcap {
        Some(path) => Some(Arc::new(
            CaptureSink::create(path, &[(port.id(), "rdma".to_string())]).map_err(|source| {
                AppError::Capture {
                    path: path.display().to_string(),
                    source,
                }
            })?,
        )),
        None => None,
    };
    let (handle, commands, events) = RdmaHandle::new();
    let spec = WorkerSpec {
        name: "rdma".into(),
        core: Some(r.core),
        rx: vec![port.rx_queue(0).expect("fresh port")],
        tx: vec![(port.tx_queue(0).expect("fresh port"), TxPolicy::KeepUnsent)],
        burst: 32,
        stage: StageBox::new(RdmaStage::new(node, pool, commands, events, 0)),
        faults: None,
        capture: capture.as_ref().map(|s| CaptureTap::new(s.clone())),
    };
    let runtime = Runtime::start(vec![spec])?;
    Ok(Peer {
        capture,
        runtime,
        handle,
        port,
        local_qpn: r.qpn,
    })
}

fn host(e: crate::rdma::HostError) -> AppError {
    AppError::Usage(format!("host call: {e}"))
}

/// The counters both roles print at the end.
#[derive(Debug, Serialize)]
struct Counts {
    delivered: u64,
    icrc_errors: u64,
    malformed: u64,
    not_for_us: u64,
    arp_replies: u64,
}

fn counts(reports: &[crate::runtime::WorkerReport]) -> Counts {
    let c = |k: &str| reports.iter().filter_map(|r| r.counter(k)).sum();
    Counts {
        delivered: c("delivered"),
        icrc_errors: c("icrc_errors"),
        malformed: c("malformed"),
        not_for_us: c("not_for_us"),
        arp_replies: c("arp_replies"),
    }
}

/// `portico target`: serves its region until `duration` ends or `stop` is set.
pub fn run_target(
    path: &Path,
    duration: Option<Duration>,
    extra_eal: &[String],
    stop: Arc<AtomicBool>,
    pcap: Option<&Path>,
) -> Result<(), AppError> {
    let cfg = load(path)?;
    let peer = start(&cfg, extra_eal, true, pcap)?;
    let keys = peer
        .handle
        .register(cfg.rdma.region_addr, cfg.rdma.region_len, Access::ALL)
        .map_err(host)?;
    let half = cfg.rdma.region_len / 2;
    for i in 0..cfg.rdma.receives as usize {
        let at = half + i * 4096;
        if at + 4096 > cfg.rdma.region_len {
            return Err(AppError::Usage(
                "rdma.receives: more 4 KiB buffers than the upper half of the region holds".into(),
            ));
        }
        let wr = crate::transport::RecvRequest {
            wr_id: i as u64,
            lkey: keys.lkey,
            addr: cfg.rdma.region_addr + at as u64,
            len: 4096,
        };
        peer.handle.post_recv(peer.local_qpn, wr).map_err(host)?;
    }
    println!(
        "{}",
        json!({"type": "ready", "qpn": peer.local_qpn, "addr": cfg.rdma.region_addr, "len": cfg.rdma.region_len, "rkey": keys.rkey})
    );
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed)
        && duration.is_none_or(|d| t0.elapsed() < d)
        && !peer.runtime.has_failed()
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let link = peer.port.link();
    let mut handle = peer.handle;
    let mut completions = Vec::new();
    while let Some(wc) = handle.poll().map_err(host)? {
        completions.push(
            json!({"wr_id": wc.wr_id, "opcode": format!("{:?}", wc.opcode),
            "status": format!("{:?}", wc.status), "byte_len": wc.byte_len, "imm": wc.imm_data}),
        );
    }
    // The first bytes of the region and of the first receive buffer, for checks from outside.
    let head = handle.read(keys.lkey, 0, 64).map_err(host)?;
    let recv_head = handle.read(keys.lkey, half, 64).map_err(host)?;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let reports = peer.runtime.join()?;
    let captured = finish_capture(&peer.capture, pcap)?;
    println!(
        "{}",
        json!({"type": "target_summary", "seconds": t0.elapsed().as_secs_f64(), "link": link.to_string(),
               "counters": counts(&reports), "completions": completions,
               "region_head": hex(&head), "receive_head": hex(&recv_head), "captured": captured})
    );
    Ok(())
}

/// `portico initiator`: WRITE then READ back `ops` messages of `size` bytes.
pub fn run_initiator(
    path: &Path,
    rkey: u32,
    remote_addr: u64,
    ops: u64,
    size: usize,
    extra_eal: &[String],
    pcap: Option<&Path>,
) -> Result<(), AppError> {
    let cfg = load(path)?;
    if size == 0 || size > cfg.rdma.region_len / 2 {
        return Err(AppError::Usage(format!(
            "--size: must be 1..={} (half of rdma.region_len)",
            cfg.rdma.region_len / 2
        )));
    }
    let mut peer = start(&cfg, extra_eal, true, pcap)?;
    let t_link = Instant::now();
    while !peer.port.link().up {
        if t_link.elapsed() > Duration::from_secs(30) {
            return Err(AppError::Usage(format!(
                "rdma.port: link still down after 30 s (is the target running on {}?)",
                cfg.rdma.port
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let local_addr = cfg.rdma.region_addr;
    let half = cfg.rdma.region_len / 2;
    let keys = peer
        .handle
        .register(local_addr, cfg.rdma.region_len, Access::ALL)
        .map_err(host)?;
    let slots = (half / size).max(1) as u64;
    let mut latency = Latency::new();
    let (mut failed, mut mismatched) = (0u64, 0u64);
    let t0 = Instant::now();
    for i in 0..ops {
        let off = ((i % slots) as usize) * size;
        let data: Vec<u8> = (0..size).map(|k| (i as usize * 31 + k * 7) as u8).collect();
        peer.handle.write(keys.lkey, off, &data).map_err(host)?;
        let started = Instant::now();
        let write = WorkRequest {
            wr_id: 2 * i,
            kind: WrKind::Write {
                remote_addr: remote_addr + off as u64,
                rkey,
                imm: None,
            },
            lkey: keys.lkey,
            local_addr: local_addr + off as u64,
            len: size as u32,
        };
        peer.handle.post_send(peer.local_qpn, write).map_err(host)?;
        let read = WorkRequest {
            wr_id: 2 * i + 1,
            kind: WrKind::Read {
                remote_addr: remote_addr + off as u64,
                rkey,
            },
            lkey: keys.lkey,
            local_addr: local_addr + (half + off) as u64,
            len: size as u32,
        };
        peer.handle.post_send(peer.local_qpn, read).map_err(host)?;
        for _ in 0..2 {
            match peer.handle.wait(Duration::from_secs(10)).map_err(host)? {
                Some(wc) if wc.status == WcStatus::Success => {}
                _ => failed += 1,
            }
        }
        latency.record(started.elapsed().as_nanos() as u64);
        if peer
            .handle
            .read(keys.lkey, half + off, size)
            .map_err(host)?
            != data
        {
            mismatched += 1;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let reports = peer.runtime.join()?;
    let captured = finish_capture(&peer.capture, pcap)?;
    println!(
        "{}",
        json!({"type": "initiator_summary", "ops": ops, "size": size, "failed": failed, "mismatched": mismatched,
               "seconds": seconds, "write_read_latency_ns": latency.summary(), "counters": counts(&reports),
               "captured": captured})
    );
    if failed > 0 || mismatched > 0 {
        return Err(AppError::CheckFailed(format!(
            "{failed} operations failed, {mismatched} of {ops} read back differently"
        )));
    }
    Ok(())
}
