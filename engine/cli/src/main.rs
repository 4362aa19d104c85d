//! The `portico` command: run a scenario, forward raw traffic, list ports.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use bench::{
    self,
    args::{BenchScenario, Side},
};
use portico::app::{self, AppError, FwdOpts, RunOpts};
use portico::config::{HugepageMode, Scenario, installed_vdev_drivers, limits};
use portico::dataplane::PMD_DIR;
use portico::report;
use portico::runtime::{Polling, polling};
use portico::traffic::FwdMode;

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
    #[arg(long, global = true, value_name = "POLICY", display_order = 900)]
    polling: Option<String>,
    /// `adaptive` polling's longest sleep in µs (default 100, at most 10000); alone, it
    /// implies --polling adaptive.
    #[arg(long, global = true, value_name = "US", display_order = 901)]
    max_sleep_us: Option<u64>,
}

#[derive(Subcommand)]
// Parsed once per process; boxing the bench's many options would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run a scenario from a TOML config (ports, workers, generator/checker/forwarding).
    Run(RunArgs),
    /// Raw forwarding between all probed ports, paired 0↔1, 2↔3 (testpmd io/macswap).
    Fwd(FwdArgs),
    /// RDMA benchmarks: two RoCEv2 engines on a net_ring link in this process (or one on each
    /// side of a --server/--client pair); ops/s, Gbit/s and latency percentiles (HdrHistogram;
    /// measured from the intended send time with --rate). `portico bench <scenario> --help`
    /// lists each scenario's own flags.
    Bench {
        #[command(subcommand)]
        scenario: BenchScenario,
    },
    /// Serve one RoCEv2 engine on a port (memif, tap, NIC) from a TOML config; prints a JSON
    /// `ready` line with the region's address, length and rkey, then serves until stopped.
    Target(TargetArgs),
    /// Drive a target: WRITE `--ops` messages into its region, READ each back, compare; or,
    /// with --durable, stream `--ops` durable WRITEs and print a line as each is durable.
    Initiator(InitiatorArgs),
    /// List the ports EAL probes: driver, MAC, socket, queues, link.
    Ports(PortsArgs),
}

#[derive(Args)]
struct RunArgs {
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
}

#[derive(Args)]
struct FwdArgs {
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
}

#[derive(Args)]
struct TargetArgs {
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
    /// Accept connections through the IBTA CM on QP1 at this rdma_cm (RDMA_PS_TCP) port:
    /// any number of initiators, each on its own queue pair, with this region's address,
    /// length and rkey in the REP's private data (`docs/cm.md`).
    #[arg(long, value_name = "PORT")]
    listen: Option<u16>,
    #[arg(last = true)]
    eal: Vec<String>,
}

#[derive(Args)]
struct InitiatorArgs {
    #[arg(long, short)]
    config: PathBuf,
    /// Map this file as this side's region; overrides rdma.region_file. Default:
    /// anonymous memory.
    #[arg(long, value_name = "PATH")]
    region_file: Option<PathBuf>,
    /// The target's rkey (from its `ready` line); not with --connect.
    #[arg(long, value_parser = parse_u32, required_unless_present = "connect", conflicts_with = "connect")]
    rkey: Option<u32>,
    /// The target region's address (from its `ready` line); not with --connect.
    #[arg(long, value_parser = parse_u64, required_unless_present = "connect", conflicts_with = "connect")]
    remote_addr: Option<u64>,
    /// Connect through the IBTA CM to a `portico target --listen PORT` at IP:PORT: the
    /// queue pair and the target's region come from the exchange, no key is copied.
    #[arg(long, value_name = "IP:PORT", value_parser = parse_ip_port)]
    connect: Option<(std::net::Ipv4Addr, u16)>,
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
    /// Workers (over rdma.cores): rdma.core and the cores after it, one RX/TX queue of
    /// the port and one queue pair each (QPN rdma.qpn + i on worker i, to the target's
    /// rdma.peer_qpn + i), each driven by its own host thread; WRITE+READ pairs only.
    #[arg(long)]
    cores: Option<usize>,
    /// Capture the port into this pcapng file (Wireshark).
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    #[arg(last = true)]
    eal: Vec<String>,
}

#[derive(Args)]
struct PortsArgs {
    #[arg(long)]
    json: bool,
    /// Also print every extended statistic (xstats) of each port.
    #[arg(long)]
    xstats: bool,
    /// EAL arguments, e.g. `--vdev net_tap0` or `-a 0000:3b:00.0`.
    #[arg(last = true)]
    eal: Vec<String>,
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
    summary: &bench::BenchSummary,
    json: bool,
    hgrm: Option<&PathBuf>,
) -> Result<(), AppError> {
    bench::print(summary, json, hgrm);
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
    set_polling(cli.polling.as_deref(), cli.max_sleep_us)?;
    match cli.command {
        Command::Run(a) => run_config(a),
        Command::Fwd(a) => fwd(a),
        Command::Bench { scenario } => bench(scenario),
        Command::Target(a) => target(a),
        Command::Initiator(a) => initiator(a),
        Command::Ports(a) => ports(a),
    }
}

/// `--polling` and `--max-sleep-us` (global): the workers' idle policy for this process.
fn set_polling(name: Option<&str>, max_sleep_us: Option<u64>) -> Result<(), AppError> {
    if name.is_none() && max_sleep_us.is_none() {
        return Ok(());
    }
    let p = Polling::parse(name.unwrap_or("adaptive"), max_sleep_us).map_err(|e| {
        let flag = if e.max_sleep {
            "--max-sleep-us"
        } else {
            "--polling"
        };
        AppError::Usage(format!("{flag}: {e}"))
    })?;
    polling::set_command_line(p);
    Ok(())
}

/// `portico run`.
fn run_config(a: RunArgs) -> Result<(), AppError> {
    let scenario = Scenario::load(
        &a.config,
        &app::available_cores(),
        &installed_vdev_drivers(PMD_DIR),
    )
    .map_err(|source| AppError::Config {
        path: a.config.display().to_string(),
        source,
    })?;
    let opts = RunOpts {
        duration: seconds_or(
            ("--duration", a.duration),
            ("run.duration_s", scenario.run.duration_s),
        )?,
        stats_period: seconds_or(
            ("--stats-period", a.stats_period),
            ("run.stats_period_s", scenario.run.stats_period_s),
        )?,
        json: a.json,
        pcap: a.pcap,
    };
    let summary = app::run_scenario(&scenario, &a.eal, &opts, interrupt_flag())?;
    report::summary(&summary, a.json);
    Ok(())
}

/// `portico fwd`.
fn fwd(a: FwdArgs) -> Result<(), AppError> {
    let opts = FwdOpts {
        mode: a.mode,
        cores: a.cores,
        burst: a.burst,
        queues: a.queues,
        rxd: a.rxd,
        txd: a.txd,
        hugepages: a.hugepages,
        memory_mb: a.memory_mb,
        eal: a.eal,
        run: RunOpts {
            duration: seconds("--duration", a.duration)?,
            stats_period: seconds("--stats-period", a.stats_period)?,
            json: a.json,
            pcap: a.pcap,
        },
    };
    let summary = app::run_fwd(&opts, interrupt_flag())?;
    report::summary(&summary, a.json);
    Ok(())
}

/// `portico bench <scenario>`: each scenario's flags, already checked by clap, become the
/// benchmark's options; then the scenario's run.
fn bench(scenario: BenchScenario) -> Result<(), AppError> {
    let op = scenario.op();
    match scenario {
        BenchScenario::Write(a)
        | BenchScenario::Read(a)
        | BenchScenario::Send(a)
        | BenchScenario::Mixed(a) => {
            let (opts, side) = a.into_opts(op)?;
            bench_main_loop(&opts, side)
        }
        BenchScenario::Persist(a) => {
            let (opts, side) = a.into_opts()?;
            bench_main_loop(&opts, side)
        }
        BenchScenario::Tagged(a) => match a.into_opts()? {
            (opts, Side::Local) => bench_tagged(&opts),
            (opts, side) => bench_main_loop(&opts, side),
        },
        BenchScenario::Placement(a) => bench_placement(&a.into_opts()?),
        BenchScenario::Connect(a) => {
            let (opts, connections) = a.into_opts()?;
            let summary = bench::connect::run(&opts, connections, interrupt_flag())?;
            bench::connect::print(&summary, opts.json);
            check_none(summary.errors, |n| {
                format!("bench connect: {n} connections failed")
            })
        }
        BenchScenario::Congestion(a) => {
            let (opts, args) = a.into_opts()?;
            bench_congestion(&opts, &args)
        }
        BenchScenario::Shaper(a) => {
            let (opts, args) = a.into_opts()?;
            bench_shaper(&opts, &args)
        }
    }
}

/// The benches of the main loop (write, read, send, mixed; persist in one process), and
/// every bench across two processes (`--server`, `--client`).
fn bench_main_loop(opts: &bench::BenchOpts, side: Side) -> Result<(), AppError> {
    match side {
        Side::Server { spec, listen } => {
            let report = bench::remote::run_server(opts, &spec, &listen, interrupt_flag())?;
            bench::remote::print_server(&report, opts.json);
            check_none(report.receive_errors, |n| {
                format!("{n} receives completed in error")
            })
        }
        Side::Client { spec, addr } => {
            let summary = bench::remote::run_client(opts, &spec, &addr, interrupt_flag())?;
            bench_verdict(&summary, opts.json, opts.hgrm.as_ref())
        }
        Side::Local => {
            let summary = bench::run(opts, interrupt_flag())?;
            bench_verdict(&summary, opts.json, opts.hgrm.as_ref())
        }
    }
}

/// `portico bench tagged` in one process.
fn bench_tagged(opts: &bench::BenchOpts) -> Result<(), AppError> {
    let summary = bench::tagged::run(opts, interrupt_flag())?;
    bench::tagged::print(&summary, opts.json);
    check_none(summary.errors, |n| {
        format!("{n} tagged-bench operations failed or went unmatched")
    })
}

/// `portico bench placement`.
fn bench_placement(opts: &bench::BenchOpts) -> Result<(), AppError> {
    let summary = bench::placement::run(opts, interrupt_flag())?;
    bench::placement::print(&summary, opts.json);
    check_none(summary.errors, |_| {
        format!("placement bench: {}", summary.failures.join("; "))
    })
}

/// `portico bench congestion`.
fn bench_congestion(
    opts: &bench::BenchOpts,
    args: &bench::congestion::CongestionArgs,
) -> Result<(), AppError> {
    let summary = bench::congestion::run(opts, args, interrupt_flag())?;
    bench::congestion::print(&summary, opts.json);
    check_none(summary.errors, |n| {
        format!("{n} congestion-bench messages did not complete successfully")
    })
}

/// `portico bench shaper`.
fn bench_shaper(opts: &bench::BenchOpts, args: &bench::shaper::ShaperArgs) -> Result<(), AppError> {
    let summary = bench::shaper::run(opts, args, interrupt_flag())?;
    bench::shaper::print(&summary, opts.json);
    // Without pacing, READs that exhaust their retries are what the phase measures (counted
    // in its `errors` and `failed_qps`); elsewhere a failure is a failure.
    check_none(summary.shaper.failures_with_pacing(), |n| {
        format!(
            "{n} shaper-bench operations did not complete successfully with pacing on or without READs"
        )
    })
}

/// `portico target`.
fn target(a: TargetArgs) -> Result<(), AppError> {
    portico::peer::run_target(
        &a.config,
        a.region_file,
        a.simulate_power_loss,
        seconds("--duration", a.duration)?,
        a.cores,
        &a.eal,
        interrupt_flag(),
        a.pcap.as_deref(),
        a.listen,
    )
}

/// `IP:PORT`, an IPv4 address and a port.
fn parse_ip_port(s: &str) -> Result<(std::net::Ipv4Addr, u16), String> {
    let a: std::net::SocketAddrV4 = s
        .parse()
        .map_err(|_| format!("{s:?} is not IPv4-address:port (e.g. 10.0.0.2:7471)"))?;
    Ok((*a.ip(), a.port()))
}

/// `portico initiator`.
fn initiator(a: InitiatorArgs) -> Result<(), AppError> {
    let mode = if a.durable {
        portico::peer::InitiatorMode::Durable {
            qd: a.qd.unwrap_or(portico::peer::DURABLE_QD),
        }
    } else {
        portico::peer::InitiatorMode::WriteRead
    };
    let opts = portico::peer::InitiatorOpts {
        rkey: a.rkey.unwrap_or(0),
        remote_addr: a.remote_addr.unwrap_or(0),
        connect: a.connect,
        ops: a.ops,
        size: a.size,
        mode,
        cores: a.cores,
    };
    portico::peer::run_initiator(&a.config, a.region_file, &opts, &a.eal, a.pcap.as_deref())
}

/// `portico ports`.
fn ports(a: PortsArgs) -> Result<(), AppError> {
    let list = app::list_ports(&a.eal, a.json)?;
    let xstats = if a.xstats {
        list.iter()
            .map(|p| portico::dataplane::port_xstats(p.id).map_err(AppError::from))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    report::ports(&list, &xstats, a.json);
    Ok(())
}

/// A clap error as one line, `portico: error: --flag: what is wrong`, as the run's own
/// usage errors read (help and version are printed as clap prints them).
fn clap_error_line(err: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let strings = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    };
    let args = strings(ContextKind::InvalidArg);
    // `--cores <CORES>` -> `--cores`; a group (`<--server|--client>`) stays as it is.
    let flag = args
        .first()
        .map(|a| a.split([' ', '=']).next().unwrap_or(a).to_string());
    let text = err.render().to_string();
    let mut lines = text.lines().map(str::trim);
    let first = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ");
    let mut msg = match err.kind() {
        ErrorKind::UnknownArgument => {
            if let Some(hint) = flag.as_deref().and_then(unknown_flag_hint) {
                return hint;
            }
            first.to_string()
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = args
                .iter()
                .map(|a| flag_names(a))
                .collect::<Vec<_>>()
                .join(", ");
            return match required_by() {
                Some((by, group)) if group.len() > 1 => format!(
                    "{by}: needs {missing}; {}: {}",
                    group.join(", "),
                    bench::args::REMOTE_ONLY.to_lowercase()
                ),
                Some((by, _)) => format!("{by}: needs {missing}"),
                None => format!("{}: required", flag.unwrap_or(missing)),
            };
        }
        ErrorKind::ArgumentConflict => {
            format!(
                "cannot be used with {}",
                strings(ContextKind::PriorArg)
                    .iter()
                    .map(|a| flag_names(a))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        _ => match &args[..] {
            [one] => first.replace(&format!(" for '{one}'"), ""),
            _ => first.to_string(),
        },
    };
    // What clap says after the first line, on one line: possible values, a similar name.
    for l in lines {
        if l.starts_with("Usage:") {
            break;
        }
        if l.starts_with("[possible values") || l.starts_with("tip: a similar") {
            msg = format!("{msg} ({})", l.trim_matches(['[', ']']));
        }
    }
    match flag {
        Some(f) if f.starts_with('-') && !msg.starts_with(&format!("{f}:")) => {
            format!("{f}: {msg}")
        }
        _ => msg,
    }
}

/// An argument as clap's usage writes it, as flags: `--dev <DEVARGS>` -> `--dev`,
/// `<--server|--client <ADDR:PORT>>` -> `--server or --client`.
fn flag_names(usage: &str) -> String {
    let inner = usage
        .strip_prefix('<')
        .and_then(|u| u.strip_suffix('>'))
        .filter(|u| u.starts_with('-'))
        .unwrap_or(usage);
    inner
        .split('|')
        .map(|a| a.split([' ', '=']).next().unwrap_or(a))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// The flag on the command line that needs an argument that is missing: the first whose
/// removal (with its value) leaves no argument missing. Clap names what is missing, not what
/// asked for it. With it, when it is a flag that `bench persist` or `bench tagged` takes
/// across two processes only, the flags of its group that are too (`--hlog, --hlog-interval,
/// --plot`).
fn required_by() -> Option<(String, Vec<String>)> {
    use clap::CommandFactory;
    let argv: Vec<String> = std::env::args().collect();
    let cli = Cli::command();
    // The subcommands named on the command line, for the flags' definitions.
    let mut cmds = vec![&cli];
    for a in &argv[1..] {
        if let Some(c) = cmds.last().and_then(|c| c.find_subcommand(a)) {
            cmds.push(c);
        }
    }
    let end = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    (1..end).find_map(|i| {
        let (name, inline) = match argv[i].split_once('=') {
            Some((n, _)) => (n, true),
            None => (argv[i].as_str(), false),
        };
        let long = name.strip_prefix("--")?;
        let arg = cmds
            .iter()
            .rev()
            .find_map(|c| c.get_arguments().find(|a| a.get_long() == Some(long)))?;
        let valued = arg.get_action().takes_values() && !inline;
        let mut rest = argv.clone();
        rest.drain(i..(i + 1 + usize::from(valued)).min(end));
        let still = Cli::try_parse_from(&rest)
            .err()
            .is_some_and(|e| e.kind() == clap::error::ErrorKind::MissingRequiredArgument);
        if still {
            return None;
        }
        let cmd = cmds.last()?;
        let remote_only = |a: &clap::Arg| a.get_help_heading() == Some(bench::args::REMOTE_ONLY);
        let group: Vec<String> = if remote_only(arg) {
            cmd.get_groups()
                .filter(|g| g.get_args().any(|id| id == arg.get_id()))
                .min_by_key(|g| g.get_args().count())
                .into_iter()
                .flat_map(|g| g.get_args())
                .filter_map(|id| cmd.get_arguments().find(|a| a.get_id() == id))
                .filter(|a| remote_only(a))
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                .collect()
        } else {
            Vec::new()
        };
        Some((name.to_string(), group))
    })
}

/// A flag the scenario on the command line does not take: which scenarios take it and its
/// group of flags (`bench write --flows`: `--flows, --bottleneck-gbps, ...: only bench
/// congestion takes them`), or where the flags of `bench` go.
fn unknown_flag_hint(flag: &str) -> Option<String> {
    let long = flag.strip_prefix("--")?;
    let cli = <Cli as clap::CommandFactory>::command();
    let bench = cli.find_subcommand("bench")?;
    let argv: Vec<String> = std::env::args().collect();
    let at = argv.iter().position(|a| a == "bench")?;
    let rest = &argv[at + 1..];
    let named = |a: &String| bench.find_subcommand(a).is_some();
    let scenario = rest.iter().position(named);
    let given_at = rest
        .iter()
        .position(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let owners = |long: &str| -> Vec<&clap::Command> {
        bench
            .get_subcommands()
            .filter(|c| c.get_arguments().any(|a| a.get_long() == Some(long)))
            .collect()
    };
    let taking = owners(long);
    let names = |cs: &[&clap::Command]| -> String {
        let n: Vec<&str> = cs.iter().map(|c| c.get_name()).collect();
        match n.split_last() {
            Some((last, [])) => format!("bench {last}"),
            Some((last, init)) => format!("bench {} and {last}", init.join(", ")),
            None => String::new(),
        }
    };
    let (Some(s), Some(g)) = (scenario, given_at) else {
        return None;
    };
    if g < s || taking.is_empty() {
        return (g < s).then(|| {
            format!(
                "{flag}: a bench flag goes after the scenario: portico bench {} {flag} ...",
                rest[s]
            )
        });
    }
    let here = bench.find_subcommand(&rest[s])?;
    let first = taking[0];
    let id = first
        .get_arguments()
        .find(|a| a.get_long() == Some(long))?
        .get_id();
    // The smallest group holding the flag (a flattened struct's; else all of the scenario's
    // flags): those this scenario lacks and the same scenarios take.
    let group: Vec<&clap::Arg> = match first
        .get_groups()
        .filter(|g| g.get_args().any(|a| a == id))
        .min_by_key(|g| g.get_args().count())
    {
        Some(g) => g
            .get_args()
            .filter_map(|a| first.get_arguments().find(|x| x.get_id() == a))
            .collect(),
        None => first.get_arguments().collect(),
    };
    let same: Vec<String> = group
        .into_iter()
        .filter_map(|a| a.get_long())
        .filter(|l| !here.get_arguments().any(|a| a.get_long() == Some(l)))
        .filter(|l| {
            owners(l).iter().map(|c| c.get_name()).collect::<Vec<_>>()
                == taking.iter().map(|c| c.get_name()).collect::<Vec<_>>()
        })
        .map(|l| format!("--{l}"))
        .collect();
    let (list, verb) = if same.len() > 1 {
        (
            same.join(", "),
            if taking.len() > 1 {
                "take them"
            } else {
                "takes them"
            },
        )
    } else {
        (
            flag.to_string(),
            if taking.len() > 1 {
                "take it"
            } else {
                "takes it"
            },
        )
    };
    Some(format!(
        "{flag}: not a flag of bench {}; {list}: only {} {verb} (portico bench {} --help)",
        here.get_name(),
        names(&taking),
        first.get_name()
    ))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            eprintln!("portico: error: {}", clap_error_line(&e));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portico: error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
