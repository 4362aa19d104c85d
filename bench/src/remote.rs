//! `portico bench <op> --server` and `--client`: the benchmark across two processes or two
//! hosts, each with its own DPDK port, as perftest's `ib_write_bw` runs: the two exchange
//! what their queue pairs need over a TCP connection on the management network, then run the
//! workload over the DPDK ports.
//!
//! The exchange is JSON, one message per line:
//!
//! 1. client → server, `hello`: the protocol's name and version, the operation, every point
//!    of the run (sizes and queue depths), the queue pairs (one per worker), the MTU, the
//!    bytes its buffers need, and the client's port: MAC, IPv4, first QPN, first PSN, RX
//!    queues.
//! 2. server → client, `welcome` with the server's port (the same fields) and its buffer's
//!    address, length and rkey; or `refused` with the reason (another operation, another
//!    version, a size beyond what the server hosts, another number of queue pairs). Either
//!    side prints the one line that says why, and exits 1.
//! 3. The client runs every point over the DPDK ports; the server serves (and keeps receive
//!    buffers posted for SENDs).
//! 4. client → server, `done`, with the client's summary; server → client, `report`, with the
//!    server's side: its workers' counters, its port's, the receives it completed. The client
//!    prints both.
//!
//! The server runs one client, then exits: 0 when the run completed, 1 when the exchange was
//! refused or the client went away before its `done`.

use portico::rdma::cm::{CmEvents, ConnEvent, RegionAd};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pmem::Mapping;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::point::{self, BUF_CAP, Point};
use super::{BenchOp, BenchOpts, BenchSummary, Stopped, human, usage};
use portico::app::{AppError, MemoryChoice, available_cores, port_summary};
use portico::cc::CcMode;
use portico::config::peer::{PeerConfig, RdmaSection};
use portico::config::{EalSection, MemoryLimit, limits};
use portico::dataplane::{Eal, PortInfo};
use portico::peer::{self, Peer};
use portico::report;
use portico::transport::{Access, QpConfig, RecvRequest, WcStatus, WorkCompletion, random_psn};

/// The exchange's name, so that a stray connection is told apart from a client.
pub const PROTOCOL: &str = "portico-bench";
/// The exchange's version: both sides must speak the same.
pub const VERSION: u32 = 1;
/// The TCP port of the exchange when none is given (perftest's).
pub const DEFAULT_PORT: u16 = 18515;

/// The first QPN of each side (each engine has its own QPN space; distinct numbers make a
/// capture easier to read).
const SERVER_QPN: u32 = 0x22;
const CLIENT_QPN: u32 = 0x11;

/// Every byte of the client's source buffer.
pub const SOURCE_BYTE: u8 = 0x5a;

/// How long either side waits for the other's next message of the exchange.
const EXCHANGE_WAIT: Duration = Duration::from_secs(30);
/// How long a side waits for its port's link.
const LINK_WAIT: Duration = Duration::from_secs(30);

/// Where this side runs: `--dev`, `--ip`, `--mac`.
#[derive(Debug, Clone)]
pub struct PortSpec {
    /// The port: a vdev (`net_memif0,role=server,socket=/tmp/x.sock`) or a PCI address.
    pub dev: String,
    pub ip: Ipv4Addr,
    /// None: the port's own MAC address.
    pub mac: Option<String>,
    /// `--cm`: the queue pair connected through the IBTA CM.
    pub cm: bool,
}

/// `--server` or `--client`.
#[derive(Debug, Clone)]
pub enum Role {
    Server { listen: String },
    Client { server: String },
}

/// One side's port and queue pairs, as the exchange carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Side {
    pub mac: String,
    pub ip: Ipv4Addr,
    /// The first queue pair's number; queue pair *i* is `qpn + i`.
    pub qpn: u32,
    /// The first PSN each queue pair sends.
    pub psn: u32,
    /// RX queues (workers): queue pair *i* is homed on queue *i*.
    pub queues: u16,
}

/// The client's opening message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: String,
    pub version: u32,
    pub op: BenchOp,
    pub points: Vec<Point>,
    pub connections: usize,
    pub mtu: u32,
    /// Bytes of the buffer the server registers (WRITEs land in it, READs come from it).
    pub buf_len: usize,
    /// Bytes of each receive buffer the server posts (the largest SEND).
    pub recv_len: u32,
    /// The queue pairs' congestion control (both ends the same).
    #[serde(default)]
    pub cc: CcMode,
    /// The client connects its queue pair through the CM (`--cm`).
    #[serde(default)]
    pub cm: bool,
    pub side: Side,
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Answer {
    Welcome {
        side: Side,
        addr: u64,
        len: usize,
        rkey: u32,
    },
    Refused {
        reason: String,
    },
}

/// What the server hosts: its operation, its largest message, its queue pairs.
#[derive(Debug, Clone, Copy)]
pub struct Hosting {
    pub op: BenchOp,
    pub max_size: u32,
    pub connections: usize,
    /// The server's `--cc`, if it named one; otherwise it takes the client's.
    pub cc: Option<CcMode>,
    /// The server's `--cm`: the client must say the same.
    pub cm: bool,
}

/// Why the server refuses `hello` (raw JSON, so that another version's fields are not
/// mistaken for a malformed message), or the hello itself.
pub fn check_hello(hosting: &Hosting, raw: &serde_json::Value) -> Result<Hello, String> {
    if raw.get("protocol").and_then(|p| p.as_str()) != Some(PROTOCOL) {
        return Err(format!(
            "not a {PROTOCOL} client (its first line has no \"protocol\": \"{PROTOCOL}\")"
        ));
    }
    match raw.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        v => {
            return Err(format!(
                "version mismatch: the client speaks {PROTOCOL} version {}, this server {VERSION}",
                v.map_or("(none)".into(), |v| v.to_string())
            ));
        }
    }
    let hello: Hello =
        serde_json::from_value(raw.clone()).map_err(|e| format!("a malformed hello: {e}"))?;
    if hello.cm != hosting.cm {
        let say = |cm: bool| if cm { "with --cm" } else { "without --cm" };
        return Err(format!(
            "the server runs {}, the client {}: both sides connect through the CM or neither",
            say(hosting.cm),
            say(hello.cm)
        ));
    }
    if hello.op != hosting.op {
        return Err(format!(
            "wrong op: the server runs bench {}, the client asked for bench {}",
            op_name(hosting.op),
            op_name(hello.op)
        ));
    }
    if let Some(p) = hello.points.iter().find(|p| p.size > hosting.max_size) {
        return Err(format!(
            "size {} B: the server hosts messages of at most {} B (its --size or --sizes)",
            p.size, hosting.max_size
        ));
    }
    if hello.points.is_empty() {
        return Err("no points to run".into());
    }
    if hello.connections != hosting.connections {
        return Err(format!(
            "{} queue pairs asked for: the server runs {} worker{} with one queue pair each (give both sides the same --cores)",
            hello.connections,
            hosting.connections,
            if hosting.connections == 1 { "" } else { "s" }
        ));
    }
    if let Some(cc) = hosting.cc.filter(|&c| c != hello.cc) {
        return Err(format!(
            "congestion control: the server runs --cc {}, the client asked for --cc {}",
            cc.name(),
            hello.cc.name()
        ));
    }
    let max_buf = point::buffer_len(&hello.points);
    if hello.buf_len > max_buf.max(BUF_CAP) || hello.recv_len as usize > BUF_CAP {
        return Err(format!(
            "a buffer of {} B and receives of {} B: more than the run's points need",
            hello.buf_len, hello.recv_len
        ));
    }
    Ok(hello)
}

fn op_name(op: BenchOp) -> String {
    format!("{op:?}").to_lowercase()
}

/// A line-oriented JSON connection with a deadline per message.
struct Channel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    peer: SocketAddr,
}

impl Channel {
    fn new(stream: TcpStream) -> Result<Channel, AppError> {
        let peer = stream
            .peer_addr()
            .map_err(|e| AppError::Failed(format!("the exchange's connection: {e}")))?;
        stream.set_nodelay(true).ok();
        let writer = stream
            .try_clone()
            .map_err(|e| AppError::Failed(format!("the exchange's connection: {e}")))?;
        Ok(Channel {
            reader: BufReader::new(stream),
            writer,
            peer,
        })
    }

    fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), AppError> {
        let mut line = serde_json::to_string(msg).expect("exchange messages serialise");
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| AppError::Failed(format!("the exchange with {}: sending: {e}", self.peer)))
    }

    /// The next message, within `wait`; `None` when the other side closed the connection.
    fn recv(&mut self, wait: Duration) -> Result<Option<serde_json::Value>, AppError> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(wait))
            .map_err(|e| AppError::Failed(format!("the exchange: {e}")))?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => serde_json::from_str(&line).map(Some).map_err(|e| {
                AppError::Failed(format!(
                    "the exchange with {}: not a message ({e}): {:?}",
                    self.peer,
                    line.trim_end()
                ))
            }),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(AppError::Failed(format!(
                    "the exchange with {}: nothing heard for {} s",
                    self.peer,
                    wait.as_secs()
                )))
            }
            Err(e) => Err(AppError::Failed(format!(
                "the exchange with {}: {e}",
                self.peer
            ))),
        }
    }
}

/// `r`, and when it is an error, the client told why (`refused`) before the server gives up:
/// a server that fails to set up after the hello names the failure on both sides.
fn refusing<T>(ch: &mut Channel, r: Result<T, AppError>) -> Result<T, AppError> {
    r.inspect_err(|e| {
        let _ = ch.send(&Answer::Refused {
            reason: format!("the server could not set up: {e}"),
        });
    })
}

/// `ADDR:PORT`, or `ADDR` with [`DEFAULT_PORT`].
fn socket_addr(flag: &str, s: &str) -> Result<SocketAddr, AppError> {
    let with_port = if s
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_PORT}")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| usage(format!("{flag}: {s:?} is not an address (HOST:PORT)")))
}

/// This side's engine config: the port, its addresses, its queue pairs and the peer's.
fn peer_config(
    opts: &BenchOpts,
    spec: &PortSpec,
    mac: &str,
    me: (u32, u32),
    other: Option<(&Side, u32)>,
    workers: &[usize],
) -> PeerConfig {
    let (qpn, psn) = me;
    let mtu = other.map_or(opts.mtu.bytes(), |(_, mtu)| mtu);
    let other = other.map(|(o, _)| o);
    PeerConfig {
        eal: EalSection {
            args: opts.eal.clone(),
            hugepages: opts.hugepages,
            memory_mb: opts.memory_mb,
        },
        rdma: RdmaSection {
            port: spec.dev.clone(),
            core: workers[0],
            cores: None,
            peer_queues: other.map_or(1, |o| o.queues.max(1)),
            peer_queue: 0,
            mac: mac.to_string(),
            ip: spec.ip,
            qpn,
            peer_mac: other.map_or_else(|| "02:00:00:00:00:00".into(), |o| o.mac.clone()),
            peer_ip: other.map_or(Ipv4Addr::UNSPECIFIED, |o| o.ip),
            peer_qpn: other.map_or(0, |o| o.qpn),
            psn: Some(psn),
            peer_psn: other.map_or(0, |o| o.psn),
            mtu,
            region_addr: None,
            region_len: 1 << 20,
            region_file: None,
            timeout_us: 250,
            max_timeout: None,
            receives: 0,
            durable_writes: opts.op == BenchOp::Persist,
            durable_region: false,
            simulate_power_loss: false,
            traffic_class: 0,
            dscp: portico::transport::QpConfig::new(0, 0).dscp,
        },
        shaper: None,
        runtime: Default::default(),
        cm: Default::default(),
    }
}

/// This side after EAL started: its port's MAC (or `--mac`), the memory EAL got, and the
/// workers' cores (chosen before EAL pins this thread to its main lcore).
struct Started {
    mac: String,
    memory: MemoryChoice,
    workers: Vec<usize>,
}

/// Starts EAL for `spec`'s port with `cores` workers: the last `cores` cores, the host on
/// the first (as `bench` in one process).
fn start_eal(opts: &BenchOpts, spec: &PortSpec, cores: usize) -> Result<Started, AppError> {
    let workers = super::worker_cores(&available_cores(), cores);
    let cfg = peer_config(opts, spec, "02:00:00:00:00:01", (0, 0), None, &workers);
    let (args, memory) = peer::plan(&cfg, &workers, &[])?;
    let info = Eal::init(&args)?;
    report::banner(info, &memory, Some(peer::polling_of(&cfg)), opts.json);
    let id = peer::port_id(&cfg)
        .map_err(|_| AppError::Failed(format!("--dev: EAL probed no port for {:?}", spec.dev)))?;
    let mac = match &spec.mac {
        Some(m) => m.clone(),
        None => PortInfo::read(id)
            .map(|p| p.mac)
            .map_err(|e| AppError::Failed(format!("--dev: reading the port's MAC: {e}")))?,
    };
    Ok(Started {
        mac,
        memory,
        workers,
    })
}

/// Starts this side's engine against `other`.
fn start_side(
    opts: &BenchOpts,
    spec: &PortSpec,
    me: &Side,
    other: (&Side, u32),
    workers: &[usize],
    cc: CcMode,
) -> Result<Peer, AppError> {
    let cfg = peer_config(opts, spec, &me.mac, (me.qpn, me.psn), Some(other), workers);
    let tagged = opts.op == BenchOp::Tagged;
    let tweak = move |qp: &mut QpConfig| {
        qp.cc.mode = cc;
        qp.tagged = tagged;
    };
    let extras = peer::Extras {
        qp: Some(&tweak),
        // One endpoint per worker (endpoint i on worker i): connection i sends to endpoint i.
        tags: tagged.then(|| portico::rdma::TagConfig {
            endpoints: (0..workers.len().max(1) as u16)
                .map(|i| {
                    (
                        portico::lpe::EndpointIndex(i),
                        portico::lpe::EndpointConfig::default(),
                    )
                })
                .collect(),
            quiet: true,
            ..portico::rdma::TagConfig::default()
        }),
        cm: spec.cm,
    };
    peer::start_engine(
        Path::new("--dev"),
        &cfg,
        workers,
        opts.pcap.as_deref(),
        &extras,
    )
}

/// Waits for the port's link (a `net_memif` link comes up once both sides have started).
fn wait_link(port: &portico::dataplane::Port, spec: &PortSpec) -> Result<(), AppError> {
    let t = Instant::now();
    while !port.link().up {
        if t.elapsed() > LINK_WAIT {
            return Err(AppError::Failed(format!(
                "--dev: the link of {} is still down after {} s",
                spec.dev,
                LINK_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// What the server reports of its side when the run is over.
#[derive(Debug, Clone, Serialize)]
pub struct ServerReport {
    pub op: BenchOp,
    pub cc: CcMode,
    /// `bench persist`: the file the durable WRITEs landed in, and what its mapping is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<serde_json::Value>,
    pub client: String,
    pub seconds: f64,
    /// SENDs received into the posted buffers (tagged sends matched and landed, for `bench
    /// tagged`), and receive completions (events) in error.
    pub receives: u64,
    pub receive_errors: u64,
    pub workers: Vec<portico::runtime::WorkerReport>,
    pub ports: Vec<portico::app::PortSummary>,
}

/// The server: listens, takes one client, serves its run, reports its side.
pub fn run_server(
    opts: &BenchOpts,
    spec: &PortSpec,
    listen: &str,
    stop: Arc<AtomicBool>,
) -> Result<ServerReport, AppError> {
    let points = super::points(opts);
    let hosting = Hosting {
        op: opts.op,
        max_size: if opts.size_given || !opts.sizes.is_empty() {
            points.iter().map(|p| p.size).max().unwrap_or(opts.size)
        } else {
            (BUF_CAP / 4) as u32
        },
        connections: opts.cores,
        cc: opts.cc,
        cm: spec.cm,
    };
    check_remote_op(opts)?;
    check_cm(opts, spec)?;
    let addr = socket_addr("--listen", listen)?;
    let listener =
        TcpListener::bind(addr).map_err(|e| AppError::Failed(format!("--listen {addr}: {e}")))?;
    // The port the system chose for `:0`.
    let addr = listener.local_addr().unwrap_or(addr);
    let started = start_eal(opts, spec, opts.cores)?;
    let mac = started.mac.clone();
    human(
        opts.json,
        &format!(
            "bench {} server: listening on {addr} (port {}, MAC {mac}, IP {}, {} queue pair{})",
            op_name(opts.op),
            spec.dev,
            spec.ip,
            opts.cores,
            if opts.cores == 1 { "" } else { "s" }
        ),
    );
    listener
        .set_nonblocking(true)
        .map_err(|e| AppError::Failed(format!("--listen {addr}: {e}")))?;
    let stream = loop {
        if stop.load(Ordering::Relaxed) {
            return Err(AppError::Failed("stopped before a client came".into()));
        }
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(AppError::Failed(format!("--listen {addr}: {e}"))),
        }
    };
    stream
        .set_nonblocking(false)
        .map_err(|e| AppError::Failed(format!("the exchange: {e}")))?;
    let mut ch = Channel::new(stream)?;
    let client = ch.peer.to_string();
    let raw = ch.recv(EXCHANGE_WAIT)?.ok_or_else(|| {
        AppError::Failed(format!(
            "the client {client} closed the connection before its hello"
        ))
    })?;
    let hello = match check_hello(&hosting, &raw) {
        Ok(h) => h,
        Err(reason) => {
            let _ = ch.send(&Answer::Refused {
                reason: reason.clone(),
            });
            return Err(AppError::Failed(format!(
                "refused the client {client}: {reason}"
            )));
        }
    };
    limits::check_memory(
        "the client's sizes",
        "the server's buffer and receive buffers",
        2 * hello.buf_len as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| {
        let reason = e.to_string();
        let _ = ch.send(&Answer::Refused {
            reason: reason.clone(),
        });
        AppError::Failed(format!("refused the client {client}: {reason}"))
    })?;
    let me = Side {
        mac,
        ip: spec.ip,
        qpn: SERVER_QPN,
        psn: random_psn(),
        queues: opts.cores as u16,
    };
    let mut peer = refusing(
        &mut ch,
        start_side(
            opts,
            spec,
            &me,
            (&hello.side, hello.mtu),
            &started.workers,
            hello.cc,
        ),
    )?;
    let telemetry = peer::serve_telemetry(
        &peer,
        "bench-server",
        portico::telemetry::LatencySource::None(
            "a bench server answers; its client measures latency",
        ),
    );
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    let map = |len: usize| {
        Mapping::anonymous_prefer_huge(len.max(1))
            .map(Arc::new)
            .map_err(|e| AppError::Failed(format!("mapping {len} bytes of buffer memory: {e}")))
    };
    // Durable WRITEs land in a file the server maps (`--file`, or one in a fresh directory
    // under /var/tmp, removed afterwards), every block allocated and clean before the run.
    let mut temp = None;
    let (buf, access, region) = if hello.op == BenchOp::Persist {
        let path = match &opts.file {
            Some(p) => p.clone(),
            None => temp
                .insert(refusing(&mut ch, super::persist::fresh_dir())?)
                .0
                .join("region"),
        };
        let m = Mapping::create_file(&path, hello.buf_len)
            .and_then(|m| {
                m.fill(0, hello.buf_len, 0)?;
                m.persist(0, hello.buf_len)?;
                Ok(m)
            })
            .map_err(|e| {
                AppError::Failed(format!("mapping {} as the region: {e}", path.display()))
            });
        let m = refusing(&mut ch, m)?;
        let region = json!({"file": path.display().to_string(), "mapping": m.kind().to_string(),
                            "dax": m.is_dax(), "temporary": temp.is_some()});
        (
            Arc::new(m),
            Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT,
            Some(region),
        )
    } else {
        (refusing(&mut ch, map(hello.buf_len))?, Access::ALL, None)
    };
    let mr = peer
        .handle
        .register(&buf, 0, buf.len(), access)
        .map_err(host)?;
    // Receive buffers for SENDs: up to the receive queue's depth per queue pair, reused in
    // turn (their bytes are not looked at).
    let uses_send = matches!(hello.op, BenchOp::Send | BenchOp::Mixed);
    let recv_len = hello.recv_len.max(1) as usize;
    let n = hello.connections;
    let depth = (BUF_CAP / (recv_len * n)).clamp(1, portico::config::peer::max_receives());
    let recv_map = map(if uses_send { depth * n * recv_len } else { 1 })?;
    let recv_mr = peer
        .handle
        .register(&recv_map, 0, recv_map.len(), Access::LOCAL_WRITE)
        .map_err(host)?;
    let mut qps: Vec<(portico::rdma::Qp, portico::rdma::Cq)> = Vec::with_capacity(n);
    qps.push((peer.qp, peer.cq));
    qps.append(&mut peer.more);
    let post = |qp: &mut portico::rdma::Qp, i: usize, slot: u64| {
        let off = (i * depth + slot as usize) * recv_len;
        qp.post_recv(&[RecvRequest::new(slot, recv_mr.sgl(off, recv_len as u32))])
            .map_err(|e| AppError::Failed(format!("posting a receive buffer: {e}")))
    };
    if uses_send && !spec.cm {
        for (i, (qp, _)) in qps.iter_mut().enumerate() {
            for slot in 0..depth as u64 {
                post(qp, i, slot)?;
            }
        }
    }
    if spec.cm {
        // The client connects through the CM to the exchange's port number.
        refusing(&mut ch, peer.handle.listen(addr.port()).map_err(host))?;
    }
    // Tagged sends: on each worker's endpoint (endpoint i on worker i, where connection i's
    // messages arrive) one persistent receive that matches every tag, each message landing
    // at the start of its own buffer (an MPI_ANY_TAG receive posted once, as a benchmark's
    // sink).
    let mut tag_ports: Vec<&mut portico::rdma::TagPort> = peer
        .tags
        .iter_mut()
        .chain(peer.more_tags.iter_mut())
        .collect();
    let tagged_mr = if tag_ports.is_empty() {
        None
    } else {
        let m = map(recv_len * tag_ports.len())?;
        let mr = peer
            .handle
            .register(&m, 0, m.len(), Access::LOCAL_WRITE)
            .map_err(host)?;
        for (i, port) in tag_ports.iter_mut().enumerate() {
            let sge = mr.sge(i * recv_len, recv_len as u32);
            let entry = portico::rdma::TagEntry::recv(0, sge, 1)
                .with_ignore(u64::MAX)
                .with_options(portico::lpe::Options::NONE);
            port.append(i as u16, portico::lpe::ListKind::Priority, entry)
                .map_err(|e| AppError::Failed(format!("posting the tagged receive: {e}")))?;
        }
        Some((m, mr))
    };
    let mut events = [portico::rdma::TagEvent::EMPTY; 64];
    ch.send(&Answer::Welcome {
        side: me,
        addr: mr.addr(),
        len: mr.len(),
        rkey: mr.rkey(),
    })?;
    // The client starts its port once it has the welcome.
    wait_link(&peer.port, spec)?;
    // Kept to the end: the CM's later events (established, disconnected) go to it.
    let mut _cm_events = None;
    if let Some((events, cq)) = peer.cm.take() {
        // Its queue pair comes through the CM: accepted (the region in the REP too), and
        // put in the place of the exchange's.
        let ad = RegionAd {
            flags: 0,
            rkey: mr.rkey(),
            addr: mr.addr(),
            len: mr.len() as u64,
        };
        let qp = accept_cm(&peer.handle, &events, ad)?;
        qps[0] = (qp, cq);
        _cm_events = Some(events);
        if uses_send {
            for slot in 0..depth as u64 {
                post(&mut qps[0].0, 0, slot)?;
            }
        }
    }
    human(
        opts.json,
        &format!(
            "bench {} server: serving {client}: {} point{}, {} queue pair{}",
            op_name(hello.op),
            hello.points.len(),
            if hello.points.len() == 1 { "" } else { "s" },
            n,
            if n == 1 { "" } else { "s" }
        ),
    );
    let t0 = Instant::now();
    let (mut receives, mut receive_errors) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::EMPTY; point::WCS_LEN];
    // The client's `done` arrives on the exchange; read it on its own thread, so that the
    // serving loop only polls.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let _ = tx.send(ch.recv(Duration::from_secs(24 * 3600)));
        ch
    });
    let done = loop {
        if stop.load(Ordering::Relaxed) {
            break Err(AppError::Failed(
                "stopped before the client was done".into(),
            ));
        }
        if peer.runtime.has_failed() {
            break Err(AppError::Failed("a worker failed".into()));
        }
        for (i, (qp, cq)) in qps.iter_mut().enumerate() {
            let got = cq.poll(&mut wcs);
            for wc in &wcs[..got] {
                if spec.cm && wc.status == WcStatus::WrFlushError {
                    // The client ended the connection (DREQ) before its done: the queue
                    // pair is gone, its receives flushed.
                    continue;
                }
                if wc.status == WcStatus::Success {
                    receives += 1;
                } else {
                    receive_errors += 1;
                }
                post(qp, i, wc.wr_id)?;
            }
        }
        match rx.try_recv() {
            Ok(Ok(Some(m))) => break Ok(m),
            Ok(Ok(None)) => {
                break Err(AppError::Failed(format!(
                    "the client {client} went away before it was done"
                )));
            }
            Ok(Err(e)) => break Err(e),
            Err(std::sync::mpsc::TryRecvError::Empty) => {}
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                break Err(AppError::Failed("the exchange's reader ended".into()));
            }
        }
        if !tag_ports.is_empty() {
            for port in tag_ports.iter_mut() {
                let got = port.poll(&mut events);
                for e in &events[..got] {
                    match (e.kind, e.fail) {
                        (portico::rdma::TagEventKind::Put, portico::lpe::NiFail::Ok) => {
                            receives += 1
                        }
                        (_, portico::lpe::NiFail::Ok) => {}
                        _ => receive_errors += 1,
                    }
                }
            }
        } else if !uses_send {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let seconds = t0.elapsed().as_secs_f64();
    let ports = vec![port_summary(peer.port.id(), "server")?];
    let workers = peer.runtime.join()?;
    drop(telemetry);
    drop((temp, tagged_mr));
    let report = ServerReport {
        op: hello.op,
        cc: hello.cc,
        region,
        client,
        seconds,
        receives,
        receive_errors,
        workers,
        ports,
    };
    peer::finish_capture(&peer.capture, opts.pcap.as_deref())?;
    let msg = done?;
    if msg.get("msg").and_then(|m| m.as_str()) != Some("done") {
        return Err(AppError::Failed(format!(
            "the client {} sent {msg} where its done was due",
            report.client
        )));
    }
    // The reader thread has ended with the message; answer on its connection.
    let mut ch = reader
        .join()
        .map_err(|_| AppError::Failed("the exchange's reader panicked".into()))?;
    ch.send(&json!({"msg": "report", "server": report}))?;
    Ok(report)
}

/// `--cm` connects one queue pair: the CM's queue pairs live on worker 0.
fn check_cm(opts: &BenchOpts, spec: &PortSpec) -> Result<(), AppError> {
    if spec.cm && opts.cores != 1 {
        return Err(usage(
            "--cm: one queue pair, --cores 1 (the CM's queue pairs live on the engine's first worker)".into(),
        ));
    }
    Ok(())
}

/// Waits for the client's connection request and accepts it with `ad` in the REP; returns
/// the queue pair.
fn accept_cm(
    handle: &portico::rdma::RdmaHandle,
    events: &CmEvents,
    ad: RegionAd,
) -> Result<portico::rdma::Qp, AppError> {
    let t0 = Instant::now();
    loop {
        let Some(ev) = events.wait(EXCHANGE_WAIT.saturating_sub(t0.elapsed())) else {
            return Err(AppError::Failed(format!(
                "--cm: no connection request from the client in {} s",
                EXCHANGE_WAIT.as_secs()
            )));
        };
        if let ConnEvent::Request(r) = ev {
            return handle
                .accept(r.id, &ad.to_bytes())
                .map_err(|e| AppError::Failed(format!("--cm: accept: {e}")));
        }
    }
}

/// What runs across two processes: `write`, `read`, `send`, `mixed`, `persist --mode
/// durable` (durable WRITEs into a file the server maps) and `tagged` (tagged sends into a
/// wildcard receive of the server's on each worker: connection i to endpoint i).
fn check_remote_op(opts: &BenchOpts) -> Result<point::Ops, AppError> {
    if opts.host_threads.is_some() {
        return Err(usage(
            "--host-threads: one process only; across two processes one host thread posts".into(),
        ));
    }
    if opts.inline {
        return Err(usage(
            "--inline: one process only; across two processes one host thread posts".into(),
        ));
    }
    if opts.op == BenchOp::Tagged {
        if !opts.part.is_empty() {
            return Err(usage(
                "--part: across two processes bench tagged runs tagged sends into one wildcard receive of the server's (eager, or rendezvous above the engine's threshold); its parts run in one".into(),
            ));
        }
        super::check_rate(opts)?;
        return Ok(point::Ops::Tagged);
    }
    if opts.op != BenchOp::Persist {
        return super::check_main_loop(opts);
    }
    if opts.mode != Some(super::persist::PersistMode::Durable) {
        return Err(usage(
            "--mode: across two processes bench persist runs --mode durable (durable WRITEs); write-read, write-flush and write-send run in one".into(),
        ));
    }
    super::check_rate(opts)?;
    Ok(point::Ops::Durable)
}

/// Prints the server's side: its counters, or one JSON object.
pub fn print_server(r: &ServerReport, json: bool) {
    if json {
        return super::print_json(&json!({"role": "server", "server": r}));
    }
    println!();
    println!(
        "bench {} server: served {} for {:.2} s; {} messages received (SENDs, tagged sends), {} receive errors",
        op_name(r.op),
        r.client,
        r.seconds,
        r.receives,
        r.receive_errors
    );
    if let Some(region) = &r.region {
        println!("  region: {region}");
    }
    super::print_workers(&r.workers);
    report::port_table(&r.ports);
}

/// The client: checks its points, connects, exchanges, runs every point against the server,
/// and returns its summary with the server's report in it.
pub fn run_client(
    opts: &BenchOpts,
    spec: &PortSpec,
    server: &str,
    stop: Arc<AtomicBool>,
) -> Result<BenchSummary, AppError> {
    let ops = check_remote_op(opts)?;
    check_cm(opts, spec)?;
    if opts.verify {
        return Err(usage(
            "--verify: not with --client (the bytes land in the server's memory; run bench in one process to verify them)".into(),
        ));
    }
    if opts.connections.is_some_and(|c| c != opts.cores) {
        return Err(usage(
            "--connections: --client runs one queue pair per worker (--cores)".into(),
        ));
    }
    let points = super::points(opts);
    let connections = opts.cores;
    let buf_len = point::buffer_len(&points);
    for p in &points {
        point::check_point(*p, connections, false, buf_len)?;
    }
    let recv_len = points.iter().map(|p| p.size).max().unwrap_or(1);
    limits::check_memory(
        "--size",
        &format!("two buffers of {buf_len} bytes"),
        2 * buf_len as u64,
        MemoryLimit::read().as_ref(),
    )
    .map_err(|e| usage(e.to_string()))?;
    let addr = socket_addr("--client", server)?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| {
        AppError::Failed(format!(
            "--client {addr}: {e} (is `portico bench {} --server` running there?)",
            op_name(opts.op)
        ))
    })?;
    let mut ch = Channel::new(stream)?;
    let Started {
        mac,
        memory,
        workers,
    } = start_eal(opts, spec, connections)?;
    let me = Side {
        mac,
        ip: spec.ip,
        qpn: CLIENT_QPN,
        psn: random_psn(),
        queues: connections as u16,
    };
    ch.send(&Hello {
        protocol: PROTOCOL.into(),
        version: VERSION,
        op: opts.op,
        points: points.clone(),
        connections,
        mtu: opts.mtu.bytes(),
        buf_len,
        recv_len,
        cc: opts.cc.unwrap_or_default(),
        cm: spec.cm,
        side: me.clone(),
    })?;
    let answer = ch.recv(EXCHANGE_WAIT)?.ok_or_else(|| {
        AppError::Failed(format!(
            "the server {addr} closed the connection before it answered"
        ))
    })?;
    let answer: Answer = serde_json::from_value(answer.clone())
        .map_err(|e| AppError::Failed(format!("the server {addr} answered {answer} ({e})")))?;
    let (server_side, remote) = match answer {
        Answer::Refused { reason } => {
            return Err(AppError::Failed(format!(
                "the server {addr} refused: {reason}"
            )));
        }
        Answer::Welcome {
            side,
            addr: raddr,
            len,
            rkey,
        } => {
            if len < buf_len {
                return Err(AppError::Failed(format!(
                    "the server {addr} registered {len} B, fewer than the {buf_len} B asked for"
                )));
            }
            (side, point::RemoteBuf { addr: raddr, rkey })
        }
    };
    let mtu = opts.mtu.bytes();
    let mut peer = start_side(
        opts,
        spec,
        &me,
        (&server_side, mtu),
        &workers,
        opts.cc.unwrap_or_default(),
    )?;
    wait_link(&peer.port, spec)?;
    let connected = if spec.cm {
        let c = peer::connect_cm(&mut peer, server_side.ip, addr.port(), EXCHANGE_WAIT)?;
        if (c.ad.rkey, c.ad.addr) != (remote.rkey, remote.addr) {
            return Err(AppError::Failed(format!(
                "the server {addr}'s REP names another region than its welcome: {:?}",
                c.ad
            )));
        }
        Some(c)
    } else {
        None
    };
    let slot = portico::telemetry::LatencySlot::new();
    let telemetry = peer::serve_telemetry(
        &peer,
        "bench-client",
        portico::telemetry::LatencySource::Slot(slot.clone()),
    );
    let host = |e: portico::rdma::HostError| AppError::Failed(format!("host call: {e}"));
    let map = |len: usize| {
        Mapping::anonymous_prefer_huge(len)
            .map(Arc::new)
            .map_err(|e| AppError::Failed(format!("mapping {len} bytes of buffer memory: {e}")))
    };
    let (src, dst) = (map(buf_len)?, map(buf_len)?);
    // What the WRITEs carry: a byte the server's memory (or file) can be checked for.
    src.fill(0, buf_len, SOURCE_BYTE)
        .map_err(|e| AppError::Failed(format!("filling the source buffer: {e}")))?;
    let buffers = src.kind().to_string();
    let regions = point::Buffers {
        src: peer
            .handle
            .register(&src, 0, src.len(), Access::ALL)
            .map_err(host)?,
        dst: peer
            .handle
            .register(&dst, 0, dst.len(), Access::ALL)
            .map_err(host)?,
        remote,
        peer: None,
        len: buf_len,
        recv_len,
    };
    let mut conns = vec![point::Conn {
        qp: peer.qp,
        cq: peer.cq,
        peer: None,
    }];
    conns.extend(
        peer.more
            .drain(..)
            .map(|(qp, cq)| point::Conn { qp, cq, peer: None }),
    );
    human(
        opts.json,
        &format!(
            "{}; against the server {addr} (MAC {}, IP {}); workers on cores {:?}; buffers: {buffers}",
            super::run_line(opts, &points, connections),
            server_side.mac,
            server_side.ip,
            peer.workers
        ),
    );
    let runner = point::Runner::new(conns, regions, ops, opts.rate, false).with_latency_slot(slot);
    let measured = super::run_points(opts, runner, &points, &stop)?;
    if let (Some(c), Some((events, _))) = (&connected, &peer.cm) {
        peer::disconnect_cm(&peer.handle, events, c.id, EXCHANGE_WAIT)?;
    }
    let ports = vec![port_summary(peer.port.id(), "client")?];
    let cores = portico::app::CoresReport::sample();
    let workers = peer.runtime.join()?;
    drop(telemetry);
    let captured = peer::finish_capture(&peer.capture, opts.pcap.as_deref())?;
    let stopped = Stopped {
        workers,
        cores,
        ports,
        capture: match (captured, &opts.pcap) {
            (Some(packets), Some(p)) => Some(portico::app::CaptureSummary {
                path: p.display().to_string(),
                packets,
            }),
            _ => None,
        },
    };
    let mut summary = super::summarise(opts, &measured, memory, buffers, connections, stopped)?;
    ch.send(&json!({"msg": "done", "summary": summary}))?;
    let report = ch.recv(EXCHANGE_WAIT)?.ok_or_else(|| {
        AppError::Failed(format!(
            "the server {addr} closed the connection before its report"
        ))
    })?;
    summary.server = Some(report.get("server").cloned().unwrap_or(report));
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            protocol: PROTOCOL.into(),
            version: VERSION,
            op: BenchOp::Write,
            points: vec![Point { size: 4096, qd: 8 }],
            connections: 1,
            mtu: 1024,
            buf_len: 4 << 20,
            recv_len: 4096,
            cc: CcMode::None,
            cm: false,
            side: Side {
                mac: "02:00:00:00:00:0a".into(),
                ip: Ipv4Addr::new(10, 0, 0, 1),
                qpn: 0x11,
                psn: 0x1234,
                queues: 1,
            },
        }
    }

    const HOSTING: Hosting = Hosting {
        op: BenchOp::Write,
        max_size: 65536,
        connections: 1,
        cc: None,
        cm: false,
    };

    fn raw(h: &Hello) -> serde_json::Value {
        serde_json::to_value(h).unwrap()
    }

    #[test]
    fn a_hello_round_trips_and_is_taken() {
        let h = hello();
        let line = serde_json::to_string(&h).unwrap();
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(check_hello(&HOSTING, &back).unwrap(), h);
        let w = Answer::Welcome {
            side: h.side.clone(),
            addr: 0x7f00_0000_0000,
            len: 4 << 20,
            rkey: 0xabcd,
        };
        let line = serde_json::to_string(&w).unwrap();
        assert!(line.starts_with(r#"{"msg":"welcome","#), "{line}");
        assert_eq!(serde_json::from_str::<Answer>(&line).unwrap(), w);
    }

    #[test]
    fn each_refusal_says_why() {
        let mut h = hello();
        h.op = BenchOp::Read;
        let e = check_hello(&HOSTING, &raw(&h)).unwrap_err();
        assert_eq!(
            e,
            "wrong op: the server runs bench write, the client asked for bench read"
        );
        let mut v = raw(&hello());
        v["version"] = json!(2);
        let e = check_hello(&HOSTING, &v).unwrap_err();
        assert!(
            e.starts_with(
                "version mismatch: the client speaks portico-bench version 2, this server 1"
            ),
            "{e}"
        );
        // Another version's fields are not mistaken for a malformed message.
        let v = json!({"protocol": PROTOCOL, "version": 7, "something": "else"});
        assert!(
            check_hello(&HOSTING, &v)
                .unwrap_err()
                .starts_with("version mismatch")
        );
        let e = check_hello(&HOSTING, &json!({"GET": "/"})).unwrap_err();
        assert!(e.starts_with("not a portico-bench client"), "{e}");
        let mut h = hello();
        h.points.push(Point {
            size: 131072,
            qd: 8,
        });
        let e = check_hello(&HOSTING, &raw(&h)).unwrap_err();
        assert!(
            e.starts_with("size 131072 B: the server hosts messages of at most 65536 B"),
            "{e}"
        );
        let mut h = hello();
        h.connections = 2;
        let e = check_hello(&HOSTING, &raw(&h)).unwrap_err();
        assert!(
            e.starts_with("2 queue pairs asked for: the server runs 1 worker"),
            "{e}"
        );
        let mut h = hello();
        h.cc = CcMode::Ack;
        let dcqcn = Hosting {
            cc: Some(CcMode::Dcqcn),
            ..HOSTING
        };
        let e = check_hello(&dcqcn, &raw(&h)).unwrap_err();
        assert_eq!(
            e,
            "congestion control: the server runs --cc dcqcn, the client asked for --cc ack"
        );
        // A server that names none takes the client's.
        assert_eq!(check_hello(&HOSTING, &raw(&h)).unwrap().cc, CcMode::Ack);
        let mut v = raw(&hello());
        v["points"] = json!("many");
        assert!(
            check_hello(&HOSTING, &v)
                .unwrap_err()
                .starts_with("a malformed hello")
        );
    }

    #[test]
    fn addresses_take_the_default_port() {
        assert_eq!(
            socket_addr("--client", "127.0.0.1").unwrap(),
            "127.0.0.1:18515".parse().unwrap()
        );
        assert_eq!(
            socket_addr("--client", "127.0.0.1:4000").unwrap(),
            "127.0.0.1:4000".parse().unwrap()
        );
        let e = socket_addr("--client", "no such host name.invalid").unwrap_err();
        assert!(e.to_string().contains("--client: "), "{e}");
    }
}
