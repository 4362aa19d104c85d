//! The `portico` command: run a scenario, forward raw traffic, list ports.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};

use portico::app::{self, AppError, FwdOpts, RunOpts};
use portico::config::{HugepageMode, MemoryLimit, Scenario, installed_vdev_drivers, limits};
use portico::dataplane::PMD_DIR;
use portico::report;
use portico::runtime::{Polling, polling};
use portico::traffic::FwdMode;
use portico::transport::Mtu;

#[derive(Parser)]
#[command(
    name = "portico",
    version,
    about = "A DPDK packet engine: pinned run-to-completion workers over DPDK poll-mode drivers",
    long_about = "A DPDK packet engine: pinned run-to-completion workers over DPDK poll-mode drivers.\n\n\
        EAL arguments go after `--`, as with every DPDK application, e.g.\n  \
        portico fwd --cores 1 -- --vdev net_null0 --vdev net_null1\n\
        Portico adds defaults (-l, --in-memory or --no-shconf, --no-pci, and --no-huge when no\n\
        hugepages are reserved); arguments you pass replace them.\n\n\
        Exit status: 0 success; 1 run-time failure (EAL or a port did not start, a worker\n\
        failed or panicked, an operation timed out, a check failed); 2 bad config or arguments."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How the workers wait when idle: `busy` polls without pause (dedicated cores; the
    /// default), `adaptive` backs off and sleeps, and wakes on the host's posts (shared
    /// cores, CI runners). Overrides a config's [runtime] polling.
    #[arg(long, global = true, value_name = "POLICY")]
    polling: Option<String>,
    /// `adaptive` polling's longest sleep in µs (default 100, at most 10000); alone, it
    /// implies --polling adaptive.
    #[arg(long, global = true, value_name = "US")]
    max_sleep_us: Option<u64>,
}

#[derive(Subcommand)]
// Parsed once per process; boxing the bench's many options would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run a scenario from a TOML config (ports, workers, generator/checker/forwarding).
    Run {
        /// The scenario file (see configs/).
        #[arg(long, short)]
        config: PathBuf,
        /// Seconds to run; overrides run.duration_s (0: until done or Ctrl-C).
        #[arg(long, allow_negative_numbers = true)]
        duration: Option<f64>,
        /// Seconds between live stats lines; overrides run.stats_period_s (0: none).
        #[arg(long, allow_negative_numbers = true)]
        stats_period: Option<f64>,
        /// Machine-readable output: JSON lines on stdout, human text on stderr.
        #[arg(long)]
        json: bool,
        /// Capture every packet the ports send and receive into this pcapng file (Wireshark).
        #[arg(long, value_name = "FILE")]
        pcap: Option<PathBuf>,
        /// Extra EAL arguments, appended to the config's [eal] args.
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// Raw forwarding between all probed ports, paired 0↔1, 2↔3 (testpmd io/macswap).
    Fwd {
        /// io: unchanged; macswap: swap source and destination MAC.
        #[arg(long, value_enum, default_value_t = FwdMode::Io)]
        mode: FwdMode,
        /// Cores to forward on (comma-separated); streams are dealt round-robin.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        cores: Vec<usize>,
        /// Packets per RX burst.
        #[arg(long, default_value_t = 32)]
        burst: usize,
        /// RX queues per port.
        #[arg(long, default_value_t = 1)]
        queues: u16,
        /// RX descriptors per queue.
        #[arg(long, default_value_t = 1024)]
        rxd: u16,
        /// TX descriptors per queue.
        #[arg(long, default_value_t = 1024)]
        txd: u16,
        /// Seconds to run (0: until Ctrl-C).
        #[arg(long, allow_negative_numbers = true, default_value_t = 10.0)]
        duration: f64,
        /// Seconds between live stats lines (0: none).
        #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
        stats_period: f64,
        /// auto: hugepages when reserved, --no-huge otherwise.
        #[arg(long, value_enum, default_value_t = HugepageMode::Auto)]
        hugepages: HugepageMode,
        /// MiB of memory under --no-huge.
        #[arg(long, default_value_t = 512)]
        memory_mb: u32,
        /// Machine-readable output: JSON lines on stdout, human text on stderr.
        #[arg(long)]
        json: bool,
        /// Capture every packet the ports send and receive into this pcapng file (Wireshark).
        #[arg(long, value_name = "FILE")]
        pcap: Option<PathBuf>,
        /// EAL arguments: the devices, e.g. `--vdev net_null0 --vdev net_null1`.
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// RDMA benchmark: two RoCEv2 engines on a net_ring link in this process; ops/s, Gbit/s and
    /// latency percentiles (HdrHistogram; measured from the intended send time with --rate).
    Bench {
        /// write, read, send, mixed (SEND, WRITE and READ in turn), persist (durable writes
        /// into a file region on the target, made durable as --mode says), or tagged (tagged
        /// messaging: eager, unexpected, rendezvous, against software matching and READ), or
        /// placement (header + data to a buffer list: one coalesced WRITE against two WRITEs
        /// and naive coalescing, headers 64 B to 1 KiB, data 1 KiB to 1 MiB).
        #[arg(value_enum)]
        op: portico::bench::BenchOp,
        /// tagged only: the parts to run, comma-separated (default all): eager, unexpected,
        /// rndv, baseline. tagged runs its own sizes (--size does not apply).
        #[arg(long, value_enum, value_delimiter = ',')]
        part: Vec<portico::bench::tagged::TaggedPart>,
        /// persist only: durable (one durable WRITE), write-read (WRITE + 8-byte READ),
        /// write-flush (WRITE + IBTA FLUSH), write-send (WRITE + SEND to a server thread on the
        /// target that persists the range and answers).
        #[arg(long, value_enum)]
        mode: Option<portico::bench::persist::PersistMode>,
        /// persist only: map the target's region on this file (created or truncated).
        /// Default: a file in a fresh directory under /var/tmp, removed afterwards.
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Message size in bytes (default 64). placement: run only this data size (default:
        /// 1 KiB to 1 MiB).
        #[arg(long)]
        size: Option<u32>,
        /// Operations outstanding at once (in all: spread over the queue pairs). write, read,
        /// send, mixed: a comma-separated list sweeps them (`--qd 1,8,64`).
        #[arg(long, value_delimiter = ',', default_value = "64")]
        qd: Vec<usize>,
        /// write, read, send, mixed: sweep these message sizes, comma-separated, with K and M
        /// for KiB and MiB (`--sizes 64,512,4K,64K`), each for --duration (default 1 s per
        /// point in a sweep).
        #[arg(long, value_delimiter = ',', value_parser = parse_size)]
        sizes: Vec<u32>,
        /// write, read, send, mixed: sweep every size from 2 B to 8 MiB by powers of two (as
        /// perftest's -a).
        #[arg(long, conflicts_with_all = ["sizes", "size"])]
        all_sizes: bool,
        /// write, read, send, mixed: write every point's results as CSV (one row per point
        /// and operation type).
        #[arg(long, value_name = "FILE")]
        csv: Option<PathBuf>,
        /// write, read, send, mixed: be the server of a two-host run (its own DPDK port,
        /// --dev and --ip): wait for a `--client`, exchange queue pairs, addresses and keys
        /// over TCP, serve its run, report this side, exit.
        #[arg(long, requires_all = ["dev", "ip"], conflicts_with = "client")]
        server: bool,
        /// The server's TCP address for the exchange (default 0.0.0.0:18515).
        #[arg(long, value_name = "ADDR:PORT", requires = "server")]
        listen: Option<String>,
        /// write, read, send, mixed: run against the server at ADDR[:PORT] (default port
        /// 18515) over this side's own DPDK port (--dev and --ip).
        #[arg(long, value_name = "ADDR:PORT", requires_all = ["dev", "ip"])]
        client: Option<String>,
        /// --server, --client: this side's DPDK port, a vdev
        /// (`net_memif0,role=server,socket=/tmp/x.sock`) or a PCI address.
        #[arg(long, value_name = "DEVARGS")]
        dev: Option<String>,
        /// --server, --client: this side's IPv4 address on its DPDK port.
        #[arg(long)]
        ip: Option<std::net::Ipv4Addr>,
        /// --server, --client: this side's MAC address (default: the port's own).
        #[arg(long)]
        mac: Option<String>,
        /// write, read, send, mixed: workers the two engines run on. 1: both engines on one
        /// worker; N: N workers on N queues of each port, worker i holding the queue pairs
        /// homed on it (on this 2-core machine N = 2 shares a core with the host).
        #[arg(long, default_value_t = 1)]
        cores: usize,
        /// write, read, send, mixed: queue pairs between the engines (default: --cores; at
        /// least --cores), homed round robin on the workers.
        #[arg(long)]
        connections: Option<usize>,
        /// Operations per second (default: closed loop, as fast as completions return).
        #[arg(long, allow_negative_numbers = true)]
        rate: Option<f64>,
        /// Seconds to run (default 5; 0: until Ctrl-C or SIGTERM). tagged, placement: seconds
        /// measured per point (default 0.4, 0.3).
        #[arg(long, allow_negative_numbers = true)]
        duration: Option<f64>,
        /// Path MTU: 256, 512, 1024, 2048 or 4096.
        #[arg(long, default_value_t = 1024)]
        mtu: u32,
        /// Fill every source buffer with a per-operation pattern and check every byte that
        /// lands (WRITE target, READ destination, SEND receive buffer); exit 1 on a mismatch.
        #[arg(long)]
        verify: bool,
        /// Write the latency distribution (µs) in HdrHistogram's .hgrm format.
        #[arg(long, value_name = "FILE")]
        hgrm: Option<PathBuf>,
        /// write, read, send, mixed: write HdrHistogram interval logs (.hlog, one histogram
        /// per operation type per interval, latency in ns), as HistogramLogProcessor reads.
        #[arg(long, value_name = "FILE")]
        hlog: Option<PathBuf>,
        /// The .hlog interval in seconds (default 1).
        #[arg(long, allow_negative_numbers = true)]
        hlog_interval: Option<f64>,
        /// write, read, send, mixed: write latency.svg (latency by percentile, HdrHistogram's
        /// log-percentile axis) and timeline.svg (ops/s and p99 over the run) into DIR.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
        /// Capture both engines' ports into this pcapng file (Wireshark).
        #[arg(long, value_name = "FILE")]
        pcap: Option<PathBuf>,
        /// One JSON object on stdout, human text on stderr.
        #[arg(long)]
        json: bool,
        /// auto: hugepages when reserved, --no-huge otherwise.
        #[arg(long, value_enum, default_value_t = HugepageMode::Auto)]
        hugepages: HugepageMode,
        /// MiB of memory under --no-huge.
        #[arg(long, default_value_t = 1024)]
        memory_mb: u32,
        /// congestion: the schemes to run, one after the other (default none,dcqcn,ack).
        #[arg(long = "cc", value_enum, value_delimiter = ',')]
        cc: Vec<portico::cc::CcMode>,
        /// congestion: flows (queue pairs) into the target (default 4).
        #[arg(long)]
        flows: Option<usize>,
        /// congestion: the bottleneck's service rate (default 10).
        #[arg(long, allow_negative_numbers = true)]
        bottleneck_gbps: Option<f64>,
        /// congestion: the senders' line rate, their rate while uncongested (default: the
        /// bottleneck's).
        #[arg(long, allow_negative_numbers = true)]
        line_gbps: Option<f64>,
        /// congestion: the round trip the bottleneck's delay line sets (default 20).
        #[arg(long, allow_negative_numbers = true)]
        rtt_us: Option<f64>,
        /// congestion: ECN marking starts above this queue (default 4 KB per Gbit/s).
        #[arg(long, allow_negative_numbers = true)]
        kmin_kb: Option<f64>,
        /// congestion: every packet is marked above this queue (default 16 KB per Gbit/s).
        #[arg(long, allow_negative_numbers = true)]
        kmax_kb: Option<f64>,
        /// congestion: the marking probability at Kmax (default 0.2).
        #[arg(long, allow_negative_numbers = true)]
        pmax: Option<f64>,
        /// congestion: the bottleneck's buffer; beyond it, drop-tail (default 4 x Kmax).
        #[arg(long, allow_negative_numbers = true)]
        buffer_kb: Option<f64>,
        /// congestion: each flow's start-end in µs, comma-separated (default: flow 0
        /// 0-20000, the others 1000-5000).
        #[arg(long)]
        schedule: Option<String>,
        /// congestion: DCQCN's parameters, vendor (ConnectX-like, the default) or paper.
        #[arg(long, value_enum)]
        dcqcn: Option<portico::bench::congestion::DcqcnPreset>,
        /// congestion: the moving-average window of the rates, µs (default RTT / 2).
        #[arg(long, allow_negative_numbers = true)]
        rate_window_us: Option<f64>,
        /// congestion: the directory for congestion.csv and congestion.svg (default
        /// ./congestion). shaper: for shaper.csv and shaper.svg (default ./shaper).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// shaper: the phases to run, one after the other (default alone,paced,unpaced).
        #[arg(long, value_enum, value_delimiter = ',')]
        phases: Vec<portico::bench::shaper::PhaseKind>,
        /// shaper: queue pairs issuing READs (default 8), each keeping --qd outstanding (at
        /// most 16).
        #[arg(long)]
        reads: Option<usize>,
        /// shaper: bytes per READ (default 65536).
        #[arg(long)]
        read_size: Option<u32>,
        /// shaper: WRITE queue pairs per WRITE class (default 1).
        #[arg(long)]
        writes: Option<usize>,
        /// shaper: bytes per WRITE (default 65536).
        #[arg(long)]
        write_size: Option<u32>,
        /// shaper: one WRITE class per share, each assured that share of the link (default
        /// 0.75,0.25).
        #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
        write_shares: Vec<f64>,
        /// shaper: the rate the initiator's host absorbs inbound data at (default 2).
        #[arg(long, allow_negative_numbers = true)]
        absorb_gbps: Option<f64>,
        /// shaper: the absorb bucket's depth (default: two READs' response frames).
        #[arg(long, allow_negative_numbers = true)]
        absorb_burst_kb: Option<f64>,
        /// shaper: the link the shaper shares among its classes (default 3).
        #[arg(long, allow_negative_numbers = true)]
        link_gbps: Option<f64>,
        /// shaper: message-chopping units (default 16).
        #[arg(long)]
        mcus: Option<usize>,
        /// shaper: packets an MCU may have in flight (default 64).
        #[arg(long)]
        outstanding_cap: Option<u32>,
        /// shaper: the deficit-round-robin quantum in bytes (default 4096).
        #[arg(long)]
        quantum: Option<u32>,
        /// Extra EAL arguments.
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// Serve one RoCEv2 engine on a port (memif, tap, NIC) from a TOML config; prints a JSON
    /// `ready` line with the region's address, length and rkey, then serves until stopped.
    Target {
        #[arg(long, short)]
        config: PathBuf,
        /// Map this file as the region (created at rdma.region_len bytes when missing);
        /// overrides rdma.region_file. Default: anonymous memory.
        #[arg(long, value_name = "PATH")]
        region_file: Option<PathBuf>,
        /// Map the region file under pmem's power-loss simulator (as rdma.simulate_power_loss):
        /// the file holds exactly the persisted cache lines, so a SIGKILL leaves what was made
        /// durable. Needs a region file.
        #[arg(long)]
        simulate_power_loss: bool,
        /// Seconds to serve (0: until Ctrl-C or SIGTERM).
        #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
        duration: f64,
        /// Workers (over rdma.cores): rdma.core and the cores after it, one RX/TX queue of
        /// the port and one queue pair each (QPN rdma.qpn + i on worker i).
        #[arg(long)]
        cores: Option<usize>,
        /// Capture the port into this pcapng file (Wireshark).
        #[arg(long, value_name = "FILE")]
        pcap: Option<PathBuf>,
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// Drive a target: WRITE `--ops` messages into its region, READ each back, compare; or,
    /// with --durable, stream `--ops` durable WRITEs and print a line as each is durable.
    Initiator {
        #[arg(long, short)]
        config: PathBuf,
        /// Map this file as this side's region; overrides rdma.region_file. Default:
        /// anonymous memory.
        #[arg(long, value_name = "PATH")]
        region_file: Option<PathBuf>,
        /// The target's rkey (from its `ready` line).
        #[arg(long, value_parser = parse_u32)]
        rkey: u32,
        /// The target region's address (from its `ready` line).
        #[arg(long, value_parser = parse_u64)]
        remote_addr: u64,
        /// Messages to WRITE and READ back, or durable WRITEs to stream (at least 1).
        #[arg(long, default_value_t = 1000)]
        ops: u64,
        /// Message size in bytes: 1 up to half of rdma.region_len (the other half receives
        /// what is read back); default 4096. With --durable: the record's size, a multiple of
        /// 8 from 16; default 64.
        #[arg(long)]
        size: Option<usize>,
        /// Stream durable WRITEs (needs rdma.durable_writes on both sides): write k carries a
        /// record of its sequence number to slot k mod slots of the target's region, and a
        /// line {"type":"durable","seq":k,"offset":..} is printed once the target has made it
        /// durable.
        #[arg(long)]
        durable: bool,
        /// With --durable: durable WRITEs outstanding at once (1..=128, at most the slots).
        #[arg(long, requires = "durable")]
        qd: Option<usize>,
        /// Capture the port into this pcapng file (Wireshark).
        #[arg(long, value_name = "FILE")]
        pcap: Option<PathBuf>,
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// List the ports EAL probes: driver, MAC, socket, queues, link.
    Ports {
        #[arg(long)]
        json: bool,
        /// Also print every extended statistic (xstats) of each port.
        #[arg(long)]
        xstats: bool,
        /// EAL arguments, e.g. `--vdev net_tap0` or `-a 0000:3b:00.0`.
        #[arg(last = true)]
        eal: Vec<String>,
    },
}

fn parse_number(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number (decimal or 0x-hex)"))
}

fn parse_u64(s: &str) -> Result<u64, String> {
    parse_number(s)
}

fn parse_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_number(s)?).map_err(|_| format!("{s} does not fit in 32 bits"))
}

/// A duration or period in seconds, 0 meaning "until stopped" (`None`); an error names
/// `field`.
/// Prints a `bench write|read|send|mixed` summary (also `--client`'s) and says whether the
/// run failed: bytes that differ under `--verify`, or operations that did not complete.
fn bench_verdict(
    summary: &portico::bench::BenchSummary,
    json: bool,
    hgrm: Option<&PathBuf>,
) -> Result<(), AppError> {
    portico::bench::print(summary, json, hgrm);
    match summary.verify {
        Some(v) if v.mismatches > 0 => Err(AppError::CheckFailed(format!(
            "{} of {} operations landed bytes that differ from what was sent",
            v.mismatches, v.checked_ops
        ))),
        _ if summary.errors > 0 => Err(AppError::CheckFailed(format!(
            "{} operations did not complete successfully",
            summary.errors
        ))),
        _ => Ok(()),
    }
}

/// A message size: bytes, or KiB and MiB with K and M (`4K`, `1M`).
fn parse_size(s: &str) -> Result<u32, String> {
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

fn seconds(field: &str, v: f64) -> Result<Option<Duration>, AppError> {
    limits::seconds(field, v).map_err(|e| AppError::Usage(e.to_string()))
}

/// A CLI value of seconds when given, else the config's (named by its own field).
fn seconds_or(
    (cli_field, cli): (&str, Option<f64>),
    (config_field, config): (&str, f64),
) -> Result<Option<Duration>, AppError> {
    match cli {
        Some(v) => seconds(cli_field, v),
        None => seconds(config_field, config),
    }
}

/// A check that counted `n` failures: `why(n)` says what failed, and the run exits 1.
fn check_none(n: u64, why: impl FnOnce(u64) -> String) -> Result<(), AppError> {
    if n > 0 {
        return Err(AppError::CheckFailed(why(n)));
    }
    Ok(())
}

fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    // First Ctrl-C/SIGTERM: stop cleanly with a summary. Second: leave at once.
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
    });
    flag
}

fn run(cli: Cli) -> Result<(), AppError> {
    if cli.polling.is_some() || cli.max_sleep_us.is_some() {
        let name = cli.polling.as_deref().unwrap_or("adaptive");
        let p = Polling::parse(name, cli.max_sleep_us).map_err(|e| {
            let flag = if e.max_sleep {
                "--max-sleep-us"
            } else {
                "--polling"
            };
            AppError::Usage(format!("{flag}: {e}"))
        })?;
        polling::set_command_line(p);
    }
    match cli.command {
        Command::Run {
            config,
            duration,
            stats_period,
            json,
            pcap,
            eal,
        } => {
            let scenario = Scenario::load(
                &config,
                &app::available_cores(),
                &installed_vdev_drivers(PMD_DIR),
            )
            .map_err(|source| AppError::Config {
                path: config.display().to_string(),
                source,
            })?;
            let opts = RunOpts {
                duration: seconds_or(
                    ("--duration", duration),
                    ("run.duration_s", scenario.run.duration_s),
                )?,
                stats_period: seconds_or(
                    ("--stats-period", stats_period),
                    ("run.stats_period_s", scenario.run.stats_period_s),
                )?,
                json,
                pcap,
            };
            let summary = app::run_scenario(&scenario, &eal, &opts, interrupt_flag())?;
            report::summary(&summary, json);
            Ok(())
        }
        Command::Fwd {
            mode,
            cores,
            burst,
            queues,
            rxd,
            txd,
            duration,
            stats_period,
            hugepages,
            memory_mb,
            json,
            pcap,
            eal,
        } => {
            let opts = FwdOpts {
                mode,
                cores,
                burst,
                queues,
                rxd,
                txd,
                hugepages,
                memory_mb,
                eal,
                run: RunOpts {
                    duration: seconds("--duration", duration)?,
                    stats_period: seconds("--stats-period", stats_period)?,
                    json,
                    pcap,
                },
            };
            let summary = app::run_fwd(&opts, interrupt_flag())?;
            report::summary(&summary, json);
            Ok(())
        }
        Command::Bench {
            op,
            part,
            mode,
            file,
            size,
            qd,
            sizes,
            all_sizes,
            csv,
            server,
            listen,
            client,
            dev,
            ip,
            mac,
            cores,
            connections,
            rate,
            duration,
            mtu,
            verify,
            hgrm,
            hlog,
            hlog_interval,
            plot,
            pcap,
            json,
            hugepages,
            memory_mb,
            eal,
            cc,
            flows,
            bottleneck_gbps,
            line_gbps,
            rtt_us,
            kmin_kb,
            kmax_kb,
            pmax,
            buffer_kb,
            schedule,
            dcqcn,
            rate_window_us,
            out,
            phases,
            reads,
            read_size,
            writes,
            write_size,
            write_shares,
            absorb_gbps,
            absorb_burst_kb,
            link_gbps,
            mcus,
            outstanding_cap,
            quantum,
        } => {
            let congestion = op == portico::bench::BenchOp::Congestion;
            let shaper = op == portico::bench::BenchOp::Shaper;
            let remote = server || client.is_some();
            let given = (!cc.is_empty() && !remote)
                || flows.is_some()
                || bottleneck_gbps.is_some()
                || line_gbps.is_some()
                || kmin_kb.is_some()
                || kmax_kb.is_some()
                || pmax.is_some()
                || schedule.is_some()
                || dcqcn.is_some()
                || rate_window_us.is_some();
            if given && !congestion {
                return Err(AppError::Usage(
                    "--cc, --flows, --bottleneck-gbps, --line-gbps, --kmin-kb, --kmax-kb, --pmax, --schedule, --dcqcn, --rate-window-us: only bench congestion takes them".into(),
                ));
            }
            if (rtt_us.is_some() || buffer_kb.is_some() || out.is_some()) && !congestion && !shaper
            {
                return Err(AppError::Usage(
                    "--rtt-us, --buffer-kb, --out: only bench congestion and bench shaper take them"
                        .into(),
                ));
            }
            let shaper_given = !phases.is_empty()
                || reads.is_some()
                || read_size.is_some()
                || writes.is_some()
                || write_size.is_some()
                || !write_shares.is_empty()
                || absorb_gbps.is_some()
                || absorb_burst_kb.is_some()
                || link_gbps.is_some()
                || mcus.is_some()
                || outstanding_cap.is_some()
                || quantum.is_some();
            if shaper_given && !shaper {
                return Err(AppError::Usage(
                    "--phases, --reads, --read-size, --writes, --write-size, --write-shares, --absorb-gbps, --absorb-burst-kb, --link-gbps, --mcus, --outstanding-cap, --quantum: only bench shaper takes them".into(),
                ));
            }
            let mtu = match mtu {
                256 => Mtu::M256,
                512 => Mtu::M512,
                1024 => Mtu::M1024,
                2048 => Mtu::M2048,
                4096 => Mtu::M4096,
                other => {
                    return Err(AppError::Usage(format!(
                        "--mtu: {other} is not 256, 512, 1024, 2048 or 4096"
                    )));
                }
            };
            limits::check_memory_mb("--memory-mb", memory_mb, MemoryLimit::read().as_ref())
                .map_err(|e| AppError::Usage(e.to_string()))?;
            let tagged = op == portico::bench::BenchOp::Tagged;
            let placement = op == portico::bench::BenchOp::Placement;
            // The benches of the main loop (the others run their own), and bench persist and
            // bench tagged across two processes, which run their durable WRITEs and tagged
            // sends in it.
            let main_loop = matches!(
                op,
                portico::bench::BenchOp::Write
                    | portico::bench::BenchOp::Read
                    | portico::bench::BenchOp::Send
                    | portico::bench::BenchOp::Mixed
            ) || (matches!(
                op,
                portico::bench::BenchOp::Persist | portico::bench::BenchOp::Tagged
            ) && remote);
            let sizes = if all_sizes {
                portico::bench::all_sizes()
            } else {
                sizes
            };
            let sweep = !sizes.is_empty() || qd.len() > 1;
            if !main_loop {
                let flag = if all_sizes {
                    Some("--all-sizes")
                } else if !sizes.is_empty() {
                    Some("--sizes")
                } else if qd.len() > 1 {
                    Some("--qd")
                } else if csv.is_some() {
                    Some("--csv")
                } else {
                    None
                };
                if let Some(flag) = flag {
                    return Err(AppError::Usage(format!(
                        "{flag}: only bench write, read, send and mixed sweep or write CSV (a --qd list, --sizes, --all-sizes, --csv)"
                    )));
                }
            }
            if !sizes.is_empty() && size.is_some() {
                return Err(AppError::Usage(
                    "--sizes: give one message size (--size) or a list (--sizes), not both".into(),
                ));
            }
            let duration = duration.unwrap_or(if sweep {
                1.0
            } else if tagged && !remote {
                portico::bench::tagged::DEFAULT_POINT_SECONDS
            } else if placement {
                portico::bench::placement::DEFAULT_POINT_SECONDS
            } else if shaper {
                1.0
            } else {
                5.0
            });
            let opts = portico::bench::BenchOpts {
                op,
                size: size.unwrap_or(64),
                size_given: size.is_some(),
                qd: qd[0],
                qds: if qd.len() > 1 { qd.clone() } else { Vec::new() },
                cc: match cc.as_slice() {
                    [] => None,
                    [one] if remote => Some(*one),
                    _ if remote => {
                        return Err(AppError::Usage(
                            "--cc: one scheme with --server and --client (the queue pairs' own)"
                                .into(),
                        ));
                    }
                    _ => None,
                },
                sizes,
                csv,
                rate,
                duration: seconds("--duration", duration)?,
                mtu,
                verify,
                hgrm,
                hlog: hlog.clone(),
                plot: plot.clone(),
                hlog_interval: seconds("--hlog-interval", hlog_interval.unwrap_or(1.0))?
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        AppError::Usage("--hlog-interval: must be more than 0".into())
                    })?,
                pcap,
                json,
                hugepages,
                memory_mb,
                eal,
                mode,
                file,
                part,
                cores,
                connections,
            };
            if (hlog.is_some() || hlog_interval.is_some() || plot.is_some()) && !main_loop {
                return Err(AppError::Usage(
                    "--hlog, --hlog-interval, --plot: only bench write, read, send and mixed take them (so far)"
                        .into(),
                ));
            }
            if (cores != 1 || connections.is_some()) && !main_loop {
                return Err(AppError::Usage(
                    "--cores, --connections: only bench write, read, send and mixed take them"
                        .into(),
                ));
            }
            if (dev.is_some() || ip.is_some() || mac.is_some()) && !server && client.is_none() {
                return Err(AppError::Usage(
                    "--dev: --dev, --ip and --mac are for --server and --client".into(),
                ));
            }
            if (server || client.is_some()) && !main_loop {
                return Err(AppError::Usage(format!(
                    "--{}: bench write, read, send, mixed, tagged and persist --mode durable run across two processes; bench {} runs in one",
                    if server { "server" } else { "client" },
                    format!("{op:?}").to_lowercase()
                )));
            }
            if let Some(m) = &mac {
                portico::config::peer::parse_mac("--mac", m)
                    .map_err(|e| AppError::Usage(e.to_string()))?;
            }
            let spec = dev.map(|dev| portico::bench::remote::PortSpec {
                dev,
                ip: ip.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                mac,
            });
            if server {
                let spec = spec.expect("clap requires --dev with --server");
                let listen = listen
                    .unwrap_or_else(|| format!("0.0.0.0:{}", portico::bench::remote::DEFAULT_PORT));
                let report =
                    portico::bench::remote::run_server(&opts, &spec, &listen, interrupt_flag())?;
                portico::bench::remote::print_server(&report, json);
                return check_none(report.receive_errors, |n| {
                    format!("{n} receives completed in error")
                });
            }
            if let (Some(addr), Some(spec)) = (&client, spec) {
                let summary =
                    portico::bench::remote::run_client(&opts, &spec, addr, interrupt_flag())?;
                return bench_verdict(&summary, json, opts.hgrm.as_ref());
            }
            if congestion {
                let d = portico::bench::congestion::CongestionArgs::default();
                let args = portico::bench::congestion::CongestionArgs {
                    schemes: if cc.is_empty() { d.schemes } else { cc },
                    flows: flows.unwrap_or(d.flows),
                    bottleneck_gbps: bottleneck_gbps.unwrap_or(d.bottleneck_gbps),
                    line_gbps,
                    rtt_us: rtt_us.unwrap_or(d.rtt_us),
                    kmin_kb,
                    kmax_kb,
                    pmax: pmax.unwrap_or(d.pmax),
                    buffer_kb,
                    schedule,
                    dcqcn: dcqcn.unwrap_or(d.dcqcn),
                    out,
                    rate_window_us,
                    seed: d.seed,
                };
                let summary = portico::bench::congestion::run(&opts, &args, interrupt_flag())?;
                portico::bench::congestion::print(&summary, json);
                return check_none(summary.errors, |n| {
                    format!("{n} congestion-bench messages did not complete successfully")
                });
            }
            if shaper {
                let d = portico::bench::shaper::ShaperArgs::default();
                let args = portico::bench::shaper::ShaperArgs {
                    phases: if phases.is_empty() { d.phases } else { phases },
                    reads: reads.unwrap_or(d.reads),
                    read_size: read_size.unwrap_or(d.read_size),
                    writes: writes.unwrap_or(d.writes),
                    write_size: write_size.unwrap_or(d.write_size),
                    write_shares: if write_shares.is_empty() {
                        d.write_shares
                    } else {
                        write_shares
                    },
                    absorb_gbps: absorb_gbps.unwrap_or(d.absorb_gbps),
                    link_gbps: link_gbps.unwrap_or(d.link_gbps),
                    buffer_kb: buffer_kb.unwrap_or(d.buffer_kb),
                    rtt_us: rtt_us.unwrap_or(d.rtt_us),
                    mcus: mcus.unwrap_or(d.mcus),
                    outstanding_cap: outstanding_cap.unwrap_or(d.outstanding_cap),
                    quantum_bytes: quantum.unwrap_or(d.quantum_bytes),
                    absorb_burst_kb,
                    out,
                };
                let summary = portico::bench::shaper::run(&opts, &args, interrupt_flag())?;
                portico::bench::shaper::print(&summary, json);
                // Without pacing, READs that exhaust their retries are what the phase measures
                // (counted in its `errors` and `failed_qps`); elsewhere a failure is a failure.
                let failed = summary.shaper.failures_with_pacing();
                return check_none(failed, |n| {
                    format!(
                        "{n} shaper-bench operations did not complete successfully with pacing on or without READs"
                    )
                });
            }
            if placement {
                let summary = portico::bench::placement::run(&opts, interrupt_flag())?;
                portico::bench::placement::print(&summary, json);
                return check_none(summary.errors, |_| {
                    format!("placement bench: {}", summary.failures.join("; "))
                });
            }
            if tagged {
                let summary = portico::bench::tagged::run(&opts, interrupt_flag())?;
                portico::bench::tagged::print(&summary, json);
                return check_none(summary.errors, |n| {
                    format!("{n} tagged-bench operations failed or went unmatched")
                });
            }
            let summary = portico::bench::run(&opts, interrupt_flag())?;
            bench_verdict(&summary, json, opts.hgrm.as_ref())
        }
        Command::Target {
            config,
            region_file,
            simulate_power_loss,
            duration,
            cores,
            pcap,
            eal,
        } => portico::peer::run_target(
            &config,
            region_file,
            simulate_power_loss,
            seconds("--duration", duration)?,
            cores,
            &eal,
            interrupt_flag(),
            pcap.as_deref(),
        ),
        Command::Initiator {
            config,
            region_file,
            rkey,
            remote_addr,
            ops,
            size,
            durable,
            qd,
            pcap,
            eal,
        } => {
            let mode = if durable {
                portico::peer::InitiatorMode::Durable {
                    qd: qd.unwrap_or(portico::peer::DURABLE_QD),
                }
            } else {
                portico::peer::InitiatorMode::WriteRead
            };
            let opts = portico::peer::InitiatorOpts {
                rkey,
                remote_addr,
                ops,
                size,
                mode,
            };
            portico::peer::run_initiator(&config, region_file, &opts, &eal, pcap.as_deref())
        }
        Command::Ports { json, xstats, eal } => {
            let list = app::list_ports(&eal, json)?;
            let xstats = if xstats {
                list.iter()
                    .map(|p| portico::dataplane::port_xstats(p.id).map_err(AppError::from))
                    .collect::<Result<Vec<_>, _>>()?
            } else {
                Vec::new()
            };
            report::ports(&list, &xstats, json);
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portico: error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
