//! `portico bench <scenario>`: one argument struct per scenario, built from the flag groups
//! that scenario honours (flattened), so that clap refuses a flag a scenario would ignore and
//! each scenario's `--help` lists only its own flags. Ranges, conflicts and requirements are
//! clap's; what clap cannot say (bounds that depend on other flags or on the machine) the
//! benchmarks check before EAL starts.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Subcommand};

use super::congestion::{CongestionArgs, DcqcnPreset};
use super::persist::PersistMode;
use super::shaper::{PhaseKind, ShaperArgs};
use super::tagged::TaggedPart;
use super::{BenchOp, BenchOpts};
use portico::app::AppError;
use portico::cc::CcMode;
use portico::config::{HugepageMode, MemoryLimit, limits};
use portico::transport::Mtu;

/// The help heading of the flags `bench persist` and `bench tagged` take across two
/// processes only.
pub const REMOTE_ONLY: &str = "With --server or --client only";

/// The benchmarks: `portico bench <scenario> [flags] [-- EAL args]`.
#[derive(Subcommand)]
pub enum BenchScenario {
    /// RDMA WRITEs (one process, or --server/--client across two).
    Write(LoopArgs),
    /// RDMA READs (one process, or --server/--client across two).
    Read(LoopArgs),
    /// SENDs into posted receives (one process, or --server/--client across two).
    Send(LoopArgs),
    /// SEND, WRITE and READ in turn (one process, or --server/--client across two).
    Mixed(LoopArgs),
    /// Durable writes into a file region on the target, made durable as --mode says.
    Persist(PersistArgs),
    /// Tagged messaging: eager, unexpected, rendezvous, against software matching and READ.
    Tagged(TaggedArgs),
    /// Header + data to a buffer list: one coalesced WRITE against two WRITEs and naive
    /// coalescing, headers 64 B to 1 KiB, data 1 KiB to 1 MiB.
    Placement(PlacementArgs),
    /// N flows into one target through an ECN-marking bottleneck, under each congestion
    /// control scheme.
    Congestion(CongestionCli),
    /// READs paced by the size of their responses into a host with a limited absorb rate,
    /// beside WRITE classes, with pacing on and off.
    Shaper(ShaperCli),
    /// Connection set-up through the IBTA CM (REQ to established on both engines) in a
    /// closed loop, beside the TCP exchange's set-up; leaks checked afterwards.
    Connect(ConnectArgs),
}

impl BenchScenario {
    /// The scenario's operation (as the summaries name it).
    pub fn op(&self) -> BenchOp {
        match self {
            Self::Write(_) => BenchOp::Write,
            Self::Read(_) => BenchOp::Read,
            Self::Send(_) => BenchOp::Send,
            Self::Mixed(_) => BenchOp::Mixed,
            Self::Persist(_) => BenchOp::Persist,
            Self::Tagged(_) => BenchOp::Tagged,
            Self::Placement(_) => BenchOp::Placement,
            Self::Congestion(_) => BenchOp::Congestion,
            Self::Shaper(_) => BenchOp::Shaper,
            Self::Connect(_) => BenchOp::Connect,
        }
    }
}

/// The engines, their memory and the output: every scenario's.
#[derive(Args)]
#[command(next_help_heading = "Engines")]
pub struct EngineArgs {
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value = "1024", value_parser = parse_mtu)]
    pub mtu: Mtu,
    /// One JSON object on stdout, human text on stderr.
    #[arg(long)]
    pub json: bool,
    /// auto: hugepages when reserved, --no-huge otherwise.
    #[arg(long, value_enum, default_value_t = HugepageMode::Auto)]
    pub hugepages: HugepageMode,
    /// MiB of memory under --no-huge.
    #[arg(long, default_value_t = 1024)]
    pub memory_mb: u32,
    /// Extra EAL arguments.
    #[arg(last = true)]
    pub eal: Vec<String>,
}

/// A sweep of points and its CSV (write, read, send, mixed; persist and tagged across two
/// processes).
#[derive(Args)]
#[command(next_help_heading = "Sweep")]
pub struct SweepArgs {
    /// Sweep these message sizes, comma-separated, with K and M for KiB and MiB
    /// (`--sizes 64,512,4K,64K`), each for --duration (default 1 s per point in a sweep).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, conflicts_with = "size")]
    pub sizes: Vec<u32>,
    /// Sweep every size from 2 B to 8 MiB by powers of two (as perftest's -a).
    #[arg(long, conflicts_with_all = ["sizes", "size"])]
    pub all_sizes: bool,
    /// Write every point's results as CSV (one row per point and operation type).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
}

/// Latency over time: interval logs and plots (the scenarios of the main loop).
#[derive(Args)]
#[command(next_help_heading = "Latency output")]
pub struct SeriesArgs {
    /// Write HdrHistogram interval logs (.hlog, one histogram per operation type per
    /// interval, latency in ns), as HistogramLogProcessor reads.
    #[arg(long, value_name = "FILE")]
    pub hlog: Option<PathBuf>,
    /// The .hlog interval in seconds (default 1).
    #[arg(long, allow_negative_numbers = true)]
    pub hlog_interval: Option<f64>,
    /// Write latency.svg (latency by percentile, HdrHistogram's log-percentile axis) and
    /// timeline.svg (ops/s and p99 over the run) into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

/// The latency distribution and the packets (scenarios with one latency histogram).
#[derive(Args)]
#[command(next_help_heading = "Latency output")]
pub struct TraceArgs {
    /// Write the latency distribution (µs) in HdrHistogram's .hgrm format.
    #[arg(long, value_name = "FILE")]
    pub hgrm: Option<PathBuf>,
    /// Capture both engines' ports into this pcapng file (Wireshark).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

/// Workers and queue pairs (write, read, send, mixed).
#[derive(Args)]
#[command(next_help_heading = "Workers")]
pub struct LayoutArgs {
    /// Workers the two engines run on. 1: both engines on one worker; N: N workers on N
    /// queues of each port, worker i holding the queue pairs homed on it (on a 2-core
    /// machine N = 2 shares a core with the host).
    #[arg(long, default_value_t = 1,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=portico::dataplane::RING_MAX_QUEUES as u64))]
    pub cores: usize,
    /// Queue pairs between the engines (default: --cores; at least --cores), homed round
    /// robin on the workers.
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub connections: Option<usize>,
    /// Host threads that post and poll (default: one per worker, as far as the cores the
    /// workers leave go, at least 1). Thread t drives connections t, t + T, ... and their
    /// completion queues, on core t of the process's (the workers take the last ones); one
    /// process only, not with --server/--client.
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub host_threads: Option<usize>,
    /// Run the application's loop inside each worker's own loop, for the connections homed on
    /// it (eRPC's model: no host thread, no ring between cores); one process only.
    #[arg(long)]
    pub inline: bool,
}

/// Which side of a two-host run this process is.
#[derive(Args)]
#[group(id = "side", multiple = false)]
pub struct SideArgs {
    /// Be the server of a two-host run (its own DPDK port, --dev and --ip): wait for a
    /// `--client`, exchange queue pairs, addresses and keys over TCP, serve its run, report
    /// this side, exit.
    #[arg(long, requires_all = ["dev", "ip"], conflicts_with = "client")]
    pub server: bool,
    /// Run against the server at ADDR or ADDR:PORT (default port 18515) over this side's own DPDK
    /// port (--dev and --ip).
    #[arg(long, value_name = "ADDR:PORT", requires_all = ["dev", "ip"])]
    pub client: Option<String>,
}

/// A run across two processes (each with its own DPDK port).
#[derive(Args)]
#[command(next_help_heading = "Two processes")]
pub struct RemoteArgs {
    #[command(flatten)]
    pub side: SideArgs,
    /// The server's TCP address for the exchange (default 0.0.0.0:18515).
    #[arg(long, value_name = "ADDR:PORT", requires = "server")]
    pub listen: Option<String>,
    /// --server, --client: this side's DPDK port, a vdev
    /// (`net_memif0,role=server,socket=/tmp/x.sock`) or a PCI address.
    #[arg(long, value_name = "DEVARGS", requires = "side")]
    pub dev: Option<String>,
    /// --server, --client: this side's IPv4 address on its DPDK port.
    #[arg(long, requires = "side")]
    pub ip: Option<Ipv4Addr>,
    /// --server, --client: this side's MAC address (default: the port's own).
    #[arg(long, value_parser = parse_mac, requires = "side")]
    pub mac: Option<String>,
    /// --server, --client: the queue pairs' congestion control, negotiated in the exchange.
    #[arg(long = "cc", value_enum, requires = "side")]
    pub cc: Option<CcMode>,
    /// --server, --client: connect the queue pair through the IBTA CM on QP1 (REQ, REP,
    /// RTU; the server listens on its exchange port's number as an rdma_cm port) instead of
    /// the QPNs and PSNs of the TCP exchange, which still carries the run's parameters and
    /// reports. Both sides say it; one queue pair (--cores 1).
    #[arg(long, requires = "side")]
    pub cm: bool,
}

/// `bench write`, `read`, `send`, `mixed`: the main loop.
#[derive(Args)]
pub struct LoopArgs {
    /// Message size in bytes (default 64).
    #[arg(long)]
    pub size: Option<u32>,
    /// Operations outstanding at once (in all: spread over the queue pairs); a
    /// comma-separated list sweeps them (`--qd 1,8,64`).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    pub qd: Vec<usize>,
    /// Operations per second (default: closed loop, as fast as completions return).
    #[arg(long, allow_negative_numbers = true)]
    pub rate: Option<f64>,
    /// Seconds to run (default 5, 1 per point of a sweep; 0: until Ctrl-C or SIGTERM).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Fill every source buffer with a per-operation pattern and check every byte that
    /// lands (WRITE target, READ destination, SEND receive buffer); exit 1 on a mismatch.
    #[arg(long)]
    pub verify: bool,
    #[command(flatten)]
    pub sweep: SweepArgs,
    #[command(flatten)]
    pub layout: LayoutArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub series: SeriesArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `bench persist --pmem`: what the target's region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PmemArg {
    /// A file mapping as the file system gives it.
    File,
    /// The file treated as persistent memory (emulated, not durable).
    Emulated,
}

/// `bench persist`.
#[derive(Args)]
#[command(
    mut_arg("sizes", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("all_sizes", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("csv", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("hlog", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("hlog_interval", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("plot", |a| a.requires("side").help_heading(REMOTE_ONLY)),
)]
pub struct PersistArgs {
    /// durable (one durable WRITE), durable-region (one WRITE into a region registered
    /// durable: receipt ACK, then durable ACK), write-read (WRITE + 8-byte READ), write-flush (WRITE +
    /// IBTA FLUSH), write-send (WRITE + SEND to a server thread on the target that persists
    /// the range and answers). Across two processes: durable.
    #[arg(long, value_enum)]
    pub mode: PersistMode,
    /// Map the target's region on this file (created or truncated). Default: a file in a
    /// fresh directory under /var/tmp, removed afterwards.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// The target's region: `file` (a file mapping; persist = msync, or line write-back on
    /// DAX) or `emulated` (the file treated as persistent memory, as PMDK's
    /// PMEM_IS_PMEM_FORCE: persist = cache-line write-back and a fence; not durable).
    #[arg(long, value_enum, default_value = "file")]
    pub pmem: PmemArg,
    /// Record size in bytes (default 64).
    #[arg(long)]
    pub size: Option<u32>,
    /// Durable writes outstanding at once (1..=120: two work requests each).
    #[arg(long, default_value = "64", value_parser = parse_qd::<120>)]
    pub qd: usize,
    /// Operations per second (with --server/--client; in one process a closed loop).
    #[arg(long, allow_negative_numbers = true, requires = "side", help_heading = REMOTE_ONLY)]
    pub rate: Option<f64>,
    /// Seconds to run (default 5; 0: until Ctrl-C or SIGTERM).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub sweep: SweepArgs,
    #[command(flatten)]
    pub series: SeriesArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `bench tagged`.
#[derive(Args)]
#[command(
    mut_arg("sizes", |a| a.help(
        "Sizes, comma-separated, with K and M for KiB and MiB: with --server/--client a \
         sweep (each for --duration, default 1 s a point); in one process, only the points \
         of these sizes (of eager, unexpected and baseline: 8, 64, 512, 4K, 8K; of rndv: \
         64K, 256K, 1M, 4M)",
    )),
    mut_arg("all_sizes", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("csv", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("hlog", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("hlog_interval", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("plot", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("hgrm", |a| a.requires("side").help_heading(REMOTE_ONLY)),
    mut_arg("pcap", |a| a.requires("side").help_heading(REMOTE_ONLY)),
)]
pub struct TaggedArgs {
    /// The parts to run in one process, comma-separated (default all): eager, unexpected,
    /// rndv, baseline. Each runs its own sizes.
    #[arg(long, value_enum, value_delimiter = ',', conflicts_with = "side")]
    pub part: Vec<TaggedPart>,
    /// Tagged-send size in bytes (with --server/--client; in one process each part runs its
    /// own sizes).
    #[arg(long, requires = "side", help_heading = REMOTE_ONLY)]
    pub size: Option<u32>,
    /// In one process: only the eager and baseline points at these depths (receives posted),
    /// comma-separated, of 1, 100 and 1000 (default all).
    #[arg(long, value_delimiter = ',', conflicts_with = "side")]
    pub depths: Vec<usize>,
    /// In one process: only the eager and baseline points whose receives are `exact` (each
    /// names its tag and source) or `wild` (every tenth takes any source and ignores part of
    /// the tag), comma-separated (default both).
    #[arg(long, value_enum, value_delimiter = ',', conflicts_with = "side")]
    pub matching: Vec<super::tagged::Matching>,
    /// Operations outstanding at once (1..=120).
    #[arg(long, default_value = "64", value_parser = parse_qd::<120>)]
    pub qd: usize,
    /// Operations per second (with --server/--client; in one process closed loops).
    #[arg(long, allow_negative_numbers = true, requires = "side", help_heading = REMOTE_ONLY)]
    pub rate: Option<f64>,
    /// Workers on each side (with --server/--client; both sides say it): worker i's
    /// list-processing shard holds endpoint i, and connection i sends to it.
    #[arg(long, default_value_t = 1, requires = "side", help_heading = REMOTE_ONLY,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=portico::dataplane::RING_MAX_QUEUES as u64))]
    pub cores: usize,
    /// Seconds measured per point (default 0.4); with --server/--client, seconds to run
    /// (default 5, 1 per point of a sweep).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub sweep: SweepArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub series: SeriesArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `bench placement`.
#[derive(Args)]
pub struct PlacementArgs {
    /// Run only this data size in bytes (default: 1 KiB to 1 MiB).
    #[arg(long)]
    pub size: Option<u32>,
    /// Messages outstanding at once (1..=120: two WRITEs each).
    #[arg(long, default_value = "64", value_parser = parse_qd::<120>)]
    pub qd: usize,
    /// Seconds measured per point (default 0.3).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `bench connect`.
#[derive(Args)]
pub struct ConnectArgs {
    /// Connections made and ended, one after the other.
    #[arg(long, default_value_t = 1000, value_parser = RangedU64ValueParser::<u64>::new().range(1..=1_000_000))]
    pub connections: u64,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl ConnectArgs {
    pub fn into_opts(self) -> Result<(BenchOpts, u64), AppError> {
        Ok((self.engine.opts(BenchOp::Connect)?, self.connections))
    }
}

/// The bottleneck a congestion or shaper run sends through, and where its series go.
#[derive(Args)]
#[command(next_help_heading = "Bottleneck")]
pub struct BottleneckArgs {
    /// The round trip the bottleneck's delay line sets, µs (default 20).
    #[arg(long, allow_negative_numbers = true)]
    pub rtt_us: Option<f64>,
    /// The bottleneck's buffer in KB; beyond it, drop-tail (congestion: default 4 x Kmax;
    /// shaper: its default).
    #[arg(long, allow_negative_numbers = true)]
    pub buffer_kb: Option<f64>,
    /// The directory for the CSV and SVG (default ./congestion, ./shaper).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `bench congestion`.
#[derive(Args)]
pub struct CongestionCli {
    /// Packets outstanding per flow (at least 1).
    #[arg(long, default_value = "64", value_parser = parse_qd::<{ usize::MAX }>)]
    pub qd: usize,
    /// The schemes to run, one after the other (default none,dcqcn,ack).
    #[arg(long = "cc", value_enum, value_delimiter = ',')]
    pub cc: Vec<CcMode>,
    /// Flows (queue pairs) into the target (default 4).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub flows: Option<usize>,
    /// The bottleneck's service rate in Gbit/s (default 10).
    #[arg(long, allow_negative_numbers = true)]
    pub bottleneck_gbps: Option<f64>,
    /// The senders' line rate, their rate while uncongested (default: the bottleneck's).
    #[arg(long, allow_negative_numbers = true)]
    pub line_gbps: Option<f64>,
    /// ECN marking starts above this queue (default 4 KB per Gbit/s).
    #[arg(long, allow_negative_numbers = true)]
    pub kmin_kb: Option<f64>,
    /// Every packet is marked above this queue (default 16 KB per Gbit/s).
    #[arg(long, allow_negative_numbers = true)]
    pub kmax_kb: Option<f64>,
    /// The marking probability at Kmax (default 0.2).
    #[arg(long, allow_negative_numbers = true)]
    pub pmax: Option<f64>,
    /// Each flow's start-end in µs, comma-separated (default: flow 0 0-20000, the others
    /// 1000-5000).
    #[arg(long)]
    pub schedule: Option<String>,
    /// DCQCN's parameters, vendor (ConnectX-like, the default) or paper.
    #[arg(long, value_enum)]
    pub dcqcn: Option<DcqcnPreset>,
    /// The moving-average window of the rates, µs (default RTT / 2).
    #[arg(long, allow_negative_numbers = true)]
    pub rate_window_us: Option<f64>,
    /// The flows READ from the far side (the data crossing the bottleneck is READ responses,
    /// paced by the responder on what the requester tells it) instead of WRITE to it.
    #[arg(long)]
    pub reads: bool,
    /// `ack`: the CETH carries the bottleneck's queuing delay, and a sender told a delay
    /// without a queue depth sizes its window from it.
    #[arg(long)]
    pub ack_delay: bool,
    /// `ack`: keep the congested rate this many µs after the path clears before the line
    /// rate (default 0: at once).
    #[arg(long, allow_negative_numbers = true)]
    pub keep_rate_us: Option<f64>,
    #[command(flatten)]
    pub bottleneck: BottleneckArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `bench shaper`.
#[derive(Args)]
pub struct ShaperCli {
    /// READs outstanding per READ queue pair (at least 1).
    #[arg(long, default_value = "64", value_parser = parse_qd::<{ usize::MAX }>)]
    pub qd: usize,
    /// Seconds per phase (default 1).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// The phases to run, one after the other (default alone,paced,unpaced).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub phases: Vec<PhaseKind>,
    /// Queue pairs issuing READs (default 8), each keeping --qd outstanding.
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub reads: Option<usize>,
    /// Bytes per READ (default 65536).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub read_size: Option<u32>,
    /// WRITE queue pairs per WRITE class (default 1).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub writes: Option<usize>,
    /// Bytes per WRITE (default 65536).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub write_size: Option<u32>,
    /// One WRITE class per share, each assured that share of the link (default 0.75,0.25).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub write_shares: Vec<f64>,
    /// The rate the initiator's host absorbs inbound data at, Gbit/s (default 2).
    #[arg(long, allow_negative_numbers = true)]
    pub absorb_gbps: Option<f64>,
    /// The absorb bucket's depth in KB (default: two READs' response frames).
    #[arg(long, allow_negative_numbers = true)]
    pub absorb_burst_kb: Option<f64>,
    /// The link the shaper shares among its classes, Gbit/s (default 3).
    #[arg(long, allow_negative_numbers = true)]
    pub link_gbps: Option<f64>,
    /// Message-chopping units (default 16).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub mcus: Option<usize>,
    /// Packets an MCU may have in flight (default 64).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub outstanding_cap: Option<u32>,
    /// The deficit-round-robin quantum in bytes (default 4096).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub quantum: Option<u32>,
    #[command(flatten)]
    pub bottleneck: BottleneckArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Which side of a two-process run, with this side's port.
pub enum Side {
    Local,
    Server {
        spec: super::remote::PortSpec,
        listen: String,
    },
    Client {
        spec: super::remote::PortSpec,
        addr: String,
    },
}

fn usage(msg: String) -> AppError {
    AppError::Usage(msg)
}

fn seconds(field: &str, v: f64) -> Result<Option<std::time::Duration>, AppError> {
    limits::seconds(field, v).map_err(|e| usage(e.to_string()))
}

impl RemoteArgs {
    /// This side, with its port (clap requires --dev and --ip with --server and --client,
    /// and --server or --client with --dev, --ip, --mac and --cc).
    fn side(self) -> (Side, Option<CcMode>) {
        let RemoteArgs {
            side,
            listen,
            dev,
            ip,
            mac,
            cc,
            cm,
        } = self;
        let spec = dev.map(|dev| super::remote::PortSpec {
            dev,
            ip: ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
            mac,
            cm,
        });
        let side = match (side.server, side.client, spec) {
            (true, _, Some(spec)) => Side::Server {
                spec,
                listen: listen
                    .unwrap_or_else(|| format!("0.0.0.0:{}", super::remote::DEFAULT_PORT)),
            },
            (false, Some(addr), Some(spec)) => Side::Client { spec, addr },
            _ => Side::Local,
        };
        (side, cc)
    }
}

impl EngineArgs {
    /// The options every scenario shares, `--memory-mb` checked against this machine;
    /// the rest at their defaults.
    fn opts(self, op: BenchOp) -> Result<BenchOpts, AppError> {
        limits::check_memory_mb("--memory-mb", self.memory_mb, MemoryLimit::read().as_ref())
            .map_err(|e| usage(e.to_string()))?;
        Ok(BenchOpts {
            op,
            size: 64,
            size_given: false,
            qd: 64,
            qds: Vec::new(),
            sizes: Vec::new(),
            csv: None,
            cc: None,
            rate: None,
            duration: None,
            mtu: self.mtu,
            verify: false,
            hgrm: None,
            hlog: None,
            hlog_interval: std::time::Duration::from_secs(1),
            plot: None,
            pcap: None,
            json: self.json,
            hugepages: self.hugepages,
            memory_mb: self.memory_mb,
            eal: self.eal,
            mode: None,
            file: None,
            emulate_pmem: false,
            part: Vec::new(),
            points: Default::default(),
            cores: 1,
            connections: None,
            host_threads: None,
            inline: false,
        })
    }
}

impl BenchOpts {
    fn set_size(&mut self, size: Option<u32>) {
        self.size = size.unwrap_or(64);
        self.size_given = size.is_some();
    }

    fn set_duration(&mut self, given: Option<f64>, default: f64) -> Result<(), AppError> {
        self.duration = seconds("--duration", given.unwrap_or(default))?;
        Ok(())
    }

    /// A sweep's sizes (a `--qd` list is the caller's); says whether this is a sweep.
    fn set_sweep(&mut self, s: SweepArgs) -> bool {
        self.sizes = if s.all_sizes {
            super::all_sizes()
        } else {
            s.sizes
        };
        self.csv = s.csv;
        !self.sizes.is_empty() || !self.qds.is_empty()
    }

    fn set_series(&mut self, s: SeriesArgs) -> Result<(), AppError> {
        self.hlog = s.hlog;
        self.plot = s.plot;
        self.hlog_interval = seconds("--hlog-interval", s.hlog_interval.unwrap_or(1.0))?
            .filter(|d| !d.is_zero())
            .ok_or_else(|| usage("--hlog-interval: must be more than 0".into()))?;
        Ok(())
    }

    fn set_trace(&mut self, t: TraceArgs) {
        self.hgrm = t.hgrm;
        self.pcap = t.pcap;
    }
}

/// `5` seconds for a run, `1` for each point of a sweep.
fn run_seconds(sweep: bool) -> f64 {
    if sweep { 1.0 } else { 5.0 }
}

impl LoopArgs {
    pub fn into_opts(self, op: BenchOp) -> Result<(BenchOpts, Side), AppError> {
        let mut o = self.engine.opts(op)?;
        o.set_size(self.size);
        o.qd = self.qd[0];
        if self.qd.len() > 1 {
            o.qds = self.qd;
        }
        o.rate = self.rate;
        o.verify = self.verify;
        let sweep = o.set_sweep(self.sweep);
        o.set_duration(self.duration, run_seconds(sweep))?;
        o.cores = self.layout.cores;
        o.connections = self.layout.connections;
        o.host_threads = self.layout.host_threads;
        o.inline = self.layout.inline;
        o.set_trace(self.trace);
        o.set_series(self.series)?;
        let (side, cc) = self.remote.side();
        o.cc = cc;
        Ok((o, side))
    }
}

impl PersistArgs {
    pub fn into_opts(self) -> Result<(BenchOpts, Side), AppError> {
        let mut o = self.engine.opts(BenchOp::Persist)?;
        o.mode = Some(self.mode);
        o.file = self.file;
        o.emulate_pmem = self.pmem == PmemArg::Emulated;
        o.set_size(self.size);
        o.qd = self.qd;
        o.rate = self.rate;
        let sweep = o.set_sweep(self.sweep);
        o.set_duration(self.duration, run_seconds(sweep))?;
        o.set_trace(self.trace);
        o.set_series(self.series)?;
        let (side, cc) = self.remote.side();
        o.cc = cc;
        Ok((o, side))
    }
}

impl TaggedArgs {
    pub fn into_opts(self) -> Result<(BenchOpts, Side), AppError> {
        let mut o = self.engine.opts(BenchOp::Tagged)?;
        o.part = self.part;
        o.set_size(self.size);
        o.qd = self.qd;
        o.rate = self.rate;
        o.cores = self.cores;
        let sweep = o.set_sweep(self.sweep);
        let (side, cc) = self.remote.side();
        if matches!(side, Side::Local) {
            // In one process the sizes choose among the parts' points, not a sweep.
            o.points = super::tagged::PointFilter {
                sizes: std::mem::take(&mut o.sizes),
                depths: self.depths,
                matching: self.matching,
            };
        }
        o.set_trace(self.trace);
        o.set_series(self.series)?;
        o.cc = cc;
        let default = match side {
            Side::Local => super::tagged::DEFAULT_POINT_SECONDS,
            _ => run_seconds(sweep),
        };
        o.set_duration(self.duration, default)?;
        Ok((o, side))
    }
}

impl PlacementArgs {
    pub fn into_opts(self) -> Result<BenchOpts, AppError> {
        let mut o = self.engine.opts(BenchOp::Placement)?;
        o.set_size(self.size);
        o.qd = self.qd;
        o.set_duration(self.duration, super::placement::DEFAULT_POINT_SECONDS)?;
        Ok(o)
    }
}

impl CongestionCli {
    pub fn into_opts(self) -> Result<(BenchOpts, CongestionArgs), AppError> {
        let mut o = self.engine.opts(BenchOp::Congestion)?;
        o.qd = self.qd;
        o.set_duration(None, 5.0)?;
        let d = CongestionArgs::default();
        let b = self.bottleneck;
        let args = CongestionArgs {
            schemes: if self.cc.is_empty() {
                d.schemes
            } else {
                self.cc
            },
            flows: self.flows.unwrap_or(d.flows),
            bottleneck_gbps: self.bottleneck_gbps.unwrap_or(d.bottleneck_gbps),
            line_gbps: self.line_gbps,
            rtt_us: b.rtt_us.unwrap_or(d.rtt_us),
            kmin_kb: self.kmin_kb,
            kmax_kb: self.kmax_kb,
            pmax: self.pmax.unwrap_or(d.pmax),
            buffer_kb: b.buffer_kb,
            schedule: self.schedule,
            dcqcn: self.dcqcn.unwrap_or(d.dcqcn),
            out: b.out,
            rate_window_us: self.rate_window_us,
            seed: d.seed,
            reads: self.reads,
            ack_delay: self.ack_delay,
            keep_rate_us: self.keep_rate_us.unwrap_or(d.keep_rate_us),
        };
        Ok((o, args))
    }
}

impl ShaperCli {
    pub fn into_opts(self) -> Result<(BenchOpts, ShaperArgs), AppError> {
        let mut o = self.engine.opts(BenchOp::Shaper)?;
        o.qd = self.qd;
        o.set_duration(self.duration, 1.0)?;
        let d = ShaperArgs::default();
        let b = self.bottleneck;
        let args = ShaperArgs {
            phases: if self.phases.is_empty() {
                d.phases
            } else {
                self.phases
            },
            reads: self.reads.unwrap_or(d.reads),
            read_size: self.read_size.unwrap_or(d.read_size),
            writes: self.writes.unwrap_or(d.writes),
            write_size: self.write_size.unwrap_or(d.write_size),
            write_shares: if self.write_shares.is_empty() {
                d.write_shares
            } else {
                self.write_shares
            },
            absorb_gbps: self.absorb_gbps.unwrap_or(d.absorb_gbps),
            link_gbps: self.link_gbps.unwrap_or(d.link_gbps),
            buffer_kb: b.buffer_kb.unwrap_or(d.buffer_kb),
            rtt_us: b.rtt_us.unwrap_or(d.rtt_us),
            mcus: self.mcus.unwrap_or(d.mcus),
            outstanding_cap: self.outstanding_cap.unwrap_or(d.outstanding_cap),
            quantum_bytes: self.quantum.unwrap_or(d.quantum_bytes),
            absorb_burst_kb: self.absorb_burst_kb,
            out: b.out,
        };
        Ok((o, args))
    }
}

fn parse_mtu(s: &str) -> Result<Mtu, String> {
    let bytes: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s} is not 256, 512, 1024, 2048 or 4096"))?;
    Mtu::try_from(bytes).map_err(|e| e.to_string())
}

/// One queue depth, 1..=`MAX` (a list sweeps in write, read, send and mixed only).
fn parse_qd<const MAX: usize>(s: &str) -> Result<usize, String> {
    if s.contains(',') {
        return Err(
            "one queue depth: a list (a sweep) is for bench write, read, send and mixed".into(),
        );
    }
    let qd: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if qd == 0 || qd > MAX {
        return Err(if MAX == usize::MAX {
            "at least 1".into()
        } else {
            format!("must be 1..={MAX}")
        });
    }
    Ok(qd)
}

fn parse_mac(s: &str) -> Result<String, String> {
    portico::config::peer::parse_mac("--mac", s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// A message size: bytes, or KiB and MiB with K and M (`4K`, `1M`).
pub fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or with K or M: 4K, 1M)"))?;
    u32::try_from(n * unit)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{s:?}: must be 1 B to 4095 MiB"))
}
