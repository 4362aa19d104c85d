//! TOML scenarios: which ports to open, which worker runs what on which core, how long.
//!
//! Parsing is strict (unknown keys are errors) and every error names the field it is about,
//! e.g. `workers[1].core: core 7 does not exist (cores available: 0-1)`, so that a bad config
//! ends with one line and exit status 2 before EAL starts.
//!
//! The scenarios of `portico run` are here; the configs of `portico target` and
//! `portico initiator` (one RoCEv2 engine per process) are in [`peer`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;

use crate::runtime::{FaultConfig, Polling};
use crate::traffic::FwdMode;
use crate::traffic::frame::{MAX_FRAME, MIN_FRAME};

pub mod limits;
pub mod peer;
pub mod shaper;

pub use limits::MemoryLimit;
pub use peer::{PeerConfig, RdmaSection, load_peer, parse_mac, parse_mtu, parse_peer};
pub use shaper::ShaperSection;

/// Queues per port at most: DPDK's `RTE_MAX_QUEUES_PER_PORT` in the default build.
pub const MAX_QUEUES: u16 = 1024;

/// Descriptors per queue: the range `rx_desc`, `tx_desc`, `--rxd` and `--txd` accept.
pub const DESC_RANGE: std::ops::RangeInclusive<u16> = 32..=16384;

/// A config problem, located by its field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HugepageMode {
    /// Hugepages when some are free and mounted, `--no-huge` otherwise.
    #[default]
    Auto,
    /// Require hugepages.
    On,
    /// Always `--no-huge`.
    Off,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EalSection {
    /// Extra EAL arguments, as on a DPDK command line.
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub hugepages: HugepageMode,
    /// Memory for `--no-huge` runs, in MiB.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u32,
}

impl Default for EalSection {
    fn default() -> Self {
        EalSection {
            args: Vec::new(),
            hugepages: HugepageMode::Auto,
            memory_mb: default_memory_mb(),
        }
    }
}

fn default_memory_mb() -> u32 {
    512
}

impl EalSection {
    /// `memory_mb` is at least 64 MiB and, when `limit` is known, no more than this process
    /// can map.
    pub fn check(&self, limit: Option<&MemoryLimit>) -> Result<(), ConfigError> {
        limits::check_memory_mb("eal.memory_mb", self.memory_mb, limit)
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Seconds to run; 0 runs until every finite job is done or Ctrl-C.
    #[serde(default = "default_duration")]
    pub duration_s: f64,
    /// Seconds between live stats lines; 0 disables them.
    #[serde(default = "default_period")]
    pub stats_period_s: f64,
    /// Packets per RX burst.
    #[serde(default = "default_burst")]
    pub burst: usize,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            duration_s: default_duration(),
            stats_period_s: default_period(),
            burst: default_burst(),
        }
    }
}

fn default_duration() -> f64 {
    5.0
}
fn default_period() -> f64 {
    1.0
}
fn default_burst() -> usize {
    32
}
fn one() -> u16 {
    1
}
fn default_desc() -> u16 {
    1024
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    pub name: String,
    /// A virtual device, as for EAL's `--vdev` (`net_null0,size=64`).
    pub vdev: Option<String>,
    /// A PCI address (`0000:3b:00.0`), allowed with EAL's `-a`.
    pub pci: Option<String>,
    /// Joins this port back to back with the one other port that names the same link,
    /// through a pair of `net_ring` rings in this process.
    pub ring: Option<String>,
    #[serde(default = "one")]
    pub rx_queues: u16,
    #[serde(default = "one")]
    pub tx_queues: u16,
    #[serde(default = "default_desc")]
    pub rx_desc: u16,
    #[serde(default = "default_desc")]
    pub tx_desc: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    Generate,
    Check,
    Forward,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    pub name: Option<String>,
    /// The CPU core the worker is pinned to.
    pub core: usize,
    pub task: TaskKind,
    /// generate/check: the port (name) and queue the worker transmits on / receives from.
    pub port: Option<String>,
    #[serde(default)]
    pub queue: u16,
    /// generate: Ethernet frame size with FCS (64..=1518).
    pub frame_size: Option<usize>,
    /// generate: frames per second (absent: as fast as the queue takes them).
    pub rate_pps: Option<u64>,
    /// generate: frames in all (absent: until the run ends).
    pub count: Option<u64>,
    /// check: frames to expect (absent: the sum of the counts of the generators on the
    /// other end of this port's ring link, when they all have one).
    pub expect: Option<u64>,
    /// forward: io or macswap.
    pub mode: Option<FwdMode>,
    /// forward: [rx, tx] pairs of `port` or `port:queue`.
    pub paths: Option<Vec<[String; 2]>>,
    /// any task: faults injected into what the worker receives, e.g.
    /// `{ seed = 1, drop = 0.01, duplicate = 0.01, reorder = 0.01, corrupt = 0.01 }`.
    pub faults: Option<FaultConfig>,
}

/// `[runtime]`: how the workers wait when idle (`docs/dataplane.md`, "Polling").
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// `busy` (the default: poll without pause, for dedicated cores) or `adaptive` (back
    /// off and sleep when idle, for shared cores).
    #[serde(default)]
    pub polling: Option<String>,
    /// `adaptive`'s longest sleep, in µs (default 100, at most 10 000).
    #[serde(default)]
    pub max_sleep_us: Option<u64>,
}

impl RuntimeSection {
    /// The policy this section names.
    pub fn polling(&self) -> Result<Polling, ConfigError> {
        let name = self.polling.as_deref().unwrap_or("busy");
        Polling::parse(name, self.max_sleep_us).map_err(|e| {
            let field = if e.max_sleep {
                "runtime.max_sleep_us"
            } else {
                "runtime.polling"
            };
            err(field, e.message)
        })
    }
}

/// A whole scenario file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub eal: EalSection,
    #[serde(default)]
    pub run: RunSection,
    #[serde(default)]
    pub runtime: RuntimeSection,
    #[serde(default)]
    pub ports: Vec<PortSection>,
    #[serde(default)]
    pub workers: Vec<WorkerSection>,
}

/// Where a port comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSource {
    Vdev(String),
    Pci(String),
    Ring { link: String },
}

/// A queue of a port, by index into `Config::ports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueRef {
    pub port: usize,
    pub queue: u16,
}

/// A worker with its references resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    Generate {
        tx: QueueRef,
        frame_size: usize,
        rate_pps: Option<u64>,
        count: Option<u64>,
    },
    Check {
        rx: QueueRef,
        expect: Option<u64>,
    },
    Forward {
        mode: FwdMode,
        paths: Vec<(QueueRef, QueueRef)>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Worker {
    pub name: String,
    pub core: usize,
    pub task: Task,
    pub faults: Option<FaultConfig>,
}

/// A checked scenario, ready to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub eal: EalSection,
    pub run: RunSection,
    pub polling: Polling,
    pub ports: Vec<PortSection>,
    pub sources: Vec<PortSource>,
    pub workers: Vec<Worker>,
}

impl Scenario {
    /// Reads and checks a scenario file. `cores` are the cores this process may use and
    /// `drivers` the PMD names installed (empty: not checked).
    pub fn load(path: &Path, cores: &[usize], drivers: &[String]) -> Result<Scenario, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(path.display().to_string(), format!("cannot read: {e}")))?;
        let scenario = Self::parse(&text, cores, drivers)?;
        scenario.eal.check(MemoryLimit::read().as_ref())?;
        Ok(scenario)
    }

    pub fn parse(text: &str, cores: &[usize], drivers: &[String]) -> Result<Scenario, ConfigError> {
        from_toml::<Config>(text)?.check(cores, drivers)
    }
}

/// Parses TOML into `T`; a syntax error names its line, a type error its field path.
pub fn from_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    let value: toml::Table = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            .unwrap_or(0);
        err(format!("line {line}"), e.message().trim().to_string())
    })?;
    serde_path_to_error::deserialize(toml::Value::Table(value)).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().message().trim().to_string();
        if path == "." {
            err("config", message)
        } else {
            err(path, message)
        }
    })
}

/// Splits a vdev string into its device name and driver: `net_null0,size=64` → `net_null`.
pub fn vdev_driver(vdev: &str) -> (&str, &str) {
    let name = vdev.split(',').next().unwrap_or("").trim();
    let driver = name.trim_end_matches(|c: char| c.is_ascii_digit());
    (name, driver)
}

/// Virtual-device drivers by the PMD library that provides them (`librte_net_<lib>.so`).
const VDEV_DRIVERS: &[(&str, &str)] = &[
    ("af_packet", "net_af_packet"),
    ("af_xdp", "net_af_xdp"),
    ("bond", "net_bonding"),
    ("failsafe", "net_failsafe"),
    ("memif", "net_memif"),
    ("null", "net_null"),
    ("pcap", "net_pcap"),
    ("ring", "net_ring"),
    ("softnic", "net_softnic"),
    ("tap", "net_tap"),
    ("tap", "net_tun"),
    ("vdev_netvsc", "net_vdev_netvsc"),
    ("vhost", "net_vhost"),
    ("virtio", "net_virtio_user"),
];

/// The virtual-device drivers whose PMD is installed in DPDK's driver directory.
pub fn installed_vdev_drivers(pmd_dir: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(pmd_dir) else {
        return Vec::new();
    };
    let libs: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let f = e.file_name().to_string_lossy().into_owned();
            Some(
                f.strip_prefix("librte_net_")?
                    .strip_suffix(".so")?
                    .to_string(),
            )
        })
        .collect();
    let mut names: Vec<String> = VDEV_DRIVERS
        .iter()
        .filter(|(lib, _)| libs.iter().any(|l| l == lib))
        .map(|(_, name)| name.to_string())
        .collect();
    names.sort();
    names
}

fn cores_text(cores: &[usize]) -> String {
    match (cores.first(), cores.last()) {
        (Some(a), Some(b)) if b - a + 1 == cores.len() && cores.len() > 1 => format!("{a}-{b}"),
        _ => cores
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl Config {
    fn check(self, cores: &[usize], drivers: &[String]) -> Result<Scenario, ConfigError> {
        limits::seconds("run.duration_s", self.run.duration_s)?;
        limits::seconds("run.stats_period_s", self.run.stats_period_s)?;
        if self.run.burst == 0 || self.run.burst > crate::dataplane::MAX_BURST {
            return Err(err(
                "run.burst",
                format!("must be 1..={}", crate::dataplane::MAX_BURST),
            ));
        }
        self.eal.check(None)?;
        let polling = self.runtime.polling()?;
        if self.ports.is_empty() {
            return Err(err("ports", "at least one [[ports]] entry is needed"));
        }
        if self.workers.is_empty() {
            return Err(err("workers", "at least one [[workers]] entry is needed"));
        }

        let mut by_name: HashMap<&str, usize> = HashMap::new();
        let mut sources = Vec::new();
        let mut links: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut devices: HashMap<&str, usize> = HashMap::new();
        for (i, p) in self.ports.iter().enumerate() {
            let f = |k: &str| format!("ports[{i}].{k}");
            if p.name.is_empty() || p.name.contains([',', ':', ' ']) {
                return Err(err(
                    f("name"),
                    "must be non-empty without ',', ':' or spaces",
                ));
            }
            if let Some(prev) = by_name.insert(&p.name, i) {
                return Err(err(
                    f("name"),
                    format!("{:?} is already the name of ports[{prev}]", p.name),
                ));
            }
            let source = match (&p.vdev, &p.pci, &p.ring) {
                (Some(v), None, None) => {
                    let (dev, driver) = vdev_driver(v);
                    if dev.is_empty() {
                        return Err(err(f("vdev"), "is empty"));
                    }
                    if !drivers.is_empty()
                        && !drivers
                            .iter()
                            .any(|d| d == driver || d.replace("net_", "eth_") == driver)
                    {
                        return Err(err(
                            f("vdev"),
                            format!(
                                "unknown driver {driver:?} in {v:?} (installed: {})",
                                drivers.join(", ")
                            ),
                        ));
                    }
                    if let Some(prev) = devices.insert(dev, i) {
                        return Err(err(
                            f("vdev"),
                            format!("device {dev} is already ports[{prev}]"),
                        ));
                    }
                    PortSource::Vdev(v.clone())
                }
                (None, Some(addr), None) => {
                    if let Some(prev) = devices.insert(addr, i) {
                        return Err(err(
                            f("pci"),
                            format!("device {addr} is already ports[{prev}]"),
                        ));
                    }
                    PortSource::Pci(addr.clone())
                }
                (None, None, Some(link)) => {
                    links.entry(link).or_default().push(i);
                    PortSource::Ring { link: link.clone() }
                }
                _ => {
                    return Err(err(
                        format!("ports[{i}]"),
                        "needs exactly one of vdev, pci or ring",
                    ));
                }
            };
            if p.rx_queues == 0 && p.tx_queues == 0 {
                return Err(err(
                    f("rx_queues"),
                    "a port needs at least one RX or TX queue",
                ));
            }
            for (k, v) in [("rx_queues", p.rx_queues), ("tx_queues", p.tx_queues)] {
                if v > MAX_QUEUES {
                    return Err(err(f(k), format!("must be 0..={MAX_QUEUES} queues")));
                }
            }
            for (k, v) in [("rx_desc", p.rx_desc), ("tx_desc", p.tx_desc)] {
                if !DESC_RANGE.contains(&v) {
                    return Err(err(
                        f(k),
                        format!(
                            "must be {}..={} descriptors",
                            DESC_RANGE.start(),
                            DESC_RANGE.end()
                        ),
                    ));
                }
            }
            sources.push(source);
        }
        for (link, members) in &links {
            if members.len() != 2 {
                let i = *members.last().expect("non-empty");
                return Err(err(
                    format!("ports[{i}].ring"),
                    format!(
                        "link {link:?} joins {} port(s); a ring link joins exactly two",
                        members.len()
                    ),
                ));
            }
        }
        let ring_peer = |port: usize| -> Option<usize> {
            match &sources[port] {
                PortSource::Ring { link } => {
                    links[link.as_str()].iter().copied().find(|&p| p != port)
                }
                _ => None,
            }
        };

        let queue_ref =
            |field: &str, spec: &str, default_queue: u16| -> Result<QueueRef, ConfigError> {
                let (name, queue) = match spec.split_once(':') {
                    Some((n, q)) => (
                        n,
                        q.parse::<u16>()
                            .map_err(|_| err(field, format!("bad queue in {spec:?}")))?,
                    ),
                    None => (spec, default_queue),
                };
                let port = *by_name
                    .get(name)
                    .ok_or_else(|| err(field, format!("no port named {name:?}")))?;
                Ok(QueueRef { port, queue })
            };

        let mut used_cores: HashMap<usize, usize> = HashMap::new();
        let mut rx_owner: HashMap<QueueRef, usize> = HashMap::new();
        let mut tx_owner: HashMap<QueueRef, usize> = HashMap::new();
        let mut workers = Vec::new();
        for (i, w) in self.workers.iter().enumerate() {
            let f = |k: &str| format!("workers[{i}].{k}");
            if !cores.contains(&w.core) {
                return Err(err(
                    f("core"),
                    format!(
                        "core {} does not exist (cores available: {})",
                        w.core,
                        cores_text(cores)
                    ),
                ));
            }
            if let Some(prev) = used_cores.insert(w.core, i) {
                return Err(err(
                    f("core"),
                    format!("core {} is already used by workers[{prev}]", w.core),
                ));
            }
            let mut claim =
                |q: QueueRef, rx: bool, field: String| -> Result<QueueRef, ConfigError> {
                    let p = &self.ports[q.port];
                    let (limit, owners, dir) = if rx {
                        (p.rx_queues, &mut rx_owner, "RX")
                    } else {
                        (p.tx_queues, &mut tx_owner, "TX")
                    };
                    if q.queue >= limit {
                        return Err(err(
                            field,
                            format!(
                                "port {} has {limit} {dir} queue(s); queue {} does not exist",
                                p.name, q.queue
                            ),
                        ));
                    }
                    if let Some(prev) = owners.insert(q, i) {
                        return Err(err(
                            field,
                            format!(
                                "{dir} queue {}:{} is already used by workers[{prev}]",
                                p.name, q.queue
                            ),
                        ));
                    }
                    Ok(q)
                };
            let unexpected = |keys: &[(&str, bool)]| -> Result<(), ConfigError> {
                match keys.iter().find(|(_, set)| *set) {
                    Some((k, _)) => Err(err(f(k), format!("does not apply to task {:?}", w.task))),
                    None => Ok(()),
                }
            };
            let task = match w.task {
                TaskKind::Generate => {
                    unexpected(&[
                        ("expect", w.expect.is_some()),
                        ("mode", w.mode.is_some()),
                        ("paths", w.paths.is_some()),
                    ])?;
                    let port = w
                        .port
                        .as_deref()
                        .ok_or_else(|| err(f("port"), "missing (the port to send on)"))?;
                    let tx = claim(queue_ref(&f("port"), port, w.queue)?, false, f("port"))?;
                    let frame_size = w.frame_size.unwrap_or(MIN_FRAME);
                    if !(MIN_FRAME..=MAX_FRAME).contains(&frame_size) {
                        return Err(err(
                            f("frame_size"),
                            format!("must be {MIN_FRAME}..={MAX_FRAME} bytes (with FCS)"),
                        ));
                    }
                    if w.rate_pps == Some(0) {
                        return Err(err(
                            f("rate_pps"),
                            "must be > 0 (leave it out for full speed)",
                        ));
                    }
                    if w.count == Some(0) {
                        return Err(err(
                            f("count"),
                            "must be > 0 (leave it out to run until the end)",
                        ));
                    }
                    Task::Generate {
                        tx,
                        frame_size,
                        rate_pps: w.rate_pps,
                        count: w.count,
                    }
                }
                TaskKind::Check => {
                    unexpected(&[
                        ("frame_size", w.frame_size.is_some()),
                        ("rate_pps", w.rate_pps.is_some()),
                        ("count", w.count.is_some()),
                        ("mode", w.mode.is_some()),
                        ("paths", w.paths.is_some()),
                    ])?;
                    let port = w
                        .port
                        .as_deref()
                        .ok_or_else(|| err(f("port"), "missing (the port to receive from)"))?;
                    let rx = claim(queue_ref(&f("port"), port, w.queue)?, true, f("port"))?;
                    Task::Check {
                        rx,
                        expect: w.expect,
                    }
                }
                TaskKind::Forward => {
                    unexpected(&[
                        ("port", w.port.is_some()),
                        ("frame_size", w.frame_size.is_some()),
                        ("rate_pps", w.rate_pps.is_some()),
                        ("count", w.count.is_some()),
                        ("expect", w.expect.is_some()),
                    ])?;
                    let specs = w
                        .paths
                        .as_ref()
                        .ok_or_else(|| err(f("paths"), "missing ([[rx, tx], ...])"))?;
                    if specs.is_empty() {
                        return Err(err(f("paths"), "needs at least one [rx, tx] pair"));
                    }
                    let mut paths = Vec::new();
                    for (j, [rx, tx]) in specs.iter().enumerate() {
                        let field = format!("workers[{i}].paths[{j}]");
                        let rxq = claim(queue_ref(&field, rx, 0)?, true, field.clone())?;
                        // Several inputs may share one TX queue of this worker.
                        let txq = queue_ref(&field, tx, 0)?;
                        if !paths.iter().any(|(_, t)| *t == txq) {
                            claim(txq, false, field.clone())?;
                        }
                        paths.push((rxq, txq));
                    }
                    Task::Forward {
                        mode: w.mode.unwrap_or(FwdMode::Io),
                        paths,
                    }
                }
            };
            if let Some(faults) = &w.faults {
                faults
                    .check()
                    .map_err(|(k, m)| err(format!("workers[{i}].faults.{k}"), m))?;
            }
            workers.push(Worker {
                name: w.name.clone().unwrap_or_else(|| format!("w{i}")),
                core: w.core,
                task,
                faults: w.faults,
            });
        }

        // A checker without `expect` expects what the generators at the other end of its
        // ring link will send, when they all send a fixed count.
        let generators: Vec<(usize, Option<u64>)> = workers
            .iter()
            .filter_map(|w| match w.task {
                Task::Generate { tx, count, .. } => Some((tx.port, count)),
                _ => None,
            })
            .collect();
        for w in &mut workers {
            if let Task::Check {
                rx,
                expect: expect @ None,
            } = &mut w.task
                && let Some(peer) = ring_peer(rx.port)
            {
                let counts: Vec<Option<u64>> = generators
                    .iter()
                    .filter(|(p, _)| *p == peer)
                    .map(|(_, c)| *c)
                    .collect();
                if !counts.is_empty() && counts.iter().all(Option::is_some) {
                    *expect = Some(counts.iter().flatten().sum());
                }
            }
        }

        Ok(Scenario {
            eal: self.eal,
            run: self.run,
            polling,
            ports: self.ports,
            sources,
            workers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CORES: &[usize] = &[0, 1];

    fn drivers() -> Vec<String> {
        vec!["net_null".into(), "net_ring".into(), "net_tap".into()]
    }

    const LOOPBACK: &str = r#"
        [run]
        duration_s = 2
        [[ports]]
        name = "a"
        ring = "wire"
        [[ports]]
        name = "b"
        ring = "wire"
        [[workers]]
        core = 0
        task = "generate"
        port = "a"
        frame_size = 128
        count = 1000
        [[workers]]
        core = 1
        task = "check"
        port = "b"
    "#;

    fn parse(text: &str) -> Result<Scenario, ConfigError> {
        Scenario::parse(text, CORES, &drivers())
    }

    #[test]
    fn runtime_polling_is_read_and_checked() {
        let base = "[[ports]]\nname = \"a\"\nvdev = \"net_null0\"\n[[workers]]\nname = \"f\"\ncore = 0\ntask = \"forward\"\npaths = [[\"a\", \"a\"]]\n";
        let s = Scenario::parse(base, &[0, 1], &[]).unwrap();
        assert_eq!(s.polling, Polling::Busy);
        let s = Scenario::parse(
            &format!("{base}[runtime]\npolling = \"adaptive\"\nmax_sleep_us = 20\n"),
            &[0, 1],
            &[],
        )
        .unwrap();
        assert_eq!(
            s.polling,
            Polling::Adaptive {
                max_sleep_ns: 20_000
            }
        );
        let e = Scenario::parse(
            &format!("{base}[runtime]\npolling = \"lazy\"\n"),
            &[0, 1],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "runtime.polling: \"lazy\" is not a policy (busy or adaptive)"
        );
        let e = Scenario::parse(
            &format!("{base}[runtime]\npolling = \"adaptive\"\nmax_sleep_us = 99999\n"),
            &[0, 1],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("runtime.max_sleep_us: "), "{e}");
    }

    #[test]
    fn loopback_resolves_and_infers_expect() {
        let s = parse(LOOPBACK).unwrap();
        assert_eq!(
            s.sources[0],
            PortSource::Ring {
                link: "wire".into()
            }
        );
        assert_eq!(
            s.workers[0].task,
            Task::Generate {
                tx: QueueRef { port: 0, queue: 0 },
                frame_size: 128,
                rate_pps: None,
                count: Some(1000)
            }
        );
        assert_eq!(
            s.workers[1].task,
            Task::Check {
                rx: QueueRef { port: 1, queue: 0 },
                expect: Some(1000)
            }
        );
        assert_eq!(s.run.duration_s, 2.0);
        assert_eq!(s.eal.hugepages, HugepageMode::Auto);
    }

    fn error_of(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn unknown_core_is_named() {
        let e = error_of(&LOOPBACK.replace("core = 1", "core = 7"));
        assert_eq!(
            e,
            "workers[1].core: core 7 does not exist (cores available: 0-1)"
        );
    }

    #[test]
    fn missing_field_is_named_with_its_path() {
        let e = error_of(&LOOPBACK.replace("core = 1\n", ""));
        assert_eq!(e, "workers[1]: missing field `core`");
    }

    #[test]
    fn unknown_key_is_named() {
        let e = error_of(&LOOPBACK.replace("count = 1000", "cuont = 1000"));
        assert!(
            e.starts_with("workers[0].cuont: unknown field `cuont`"),
            "{e}"
        );
    }

    #[test]
    fn unknown_vdev_driver_is_named() {
        let text = r#"
            [[ports]]
            name = "x"
            vdev = "net_bogus0,foo=1"
            [[workers]]
            core = 0
            task = "check"
            port = "x"
        "#;
        let e = error_of(text);
        assert!(
            e.starts_with("ports[0].vdev: unknown driver \"net_bogus\""),
            "{e}"
        );
    }

    #[test]
    fn syntax_error_names_the_line() {
        let e = error_of("[run]\nduration_s = = 3\n");
        assert!(e.starts_with("line 2:"), "{e}");
    }

    #[test]
    fn wrong_type_is_named() {
        let e = error_of(&LOOPBACK.replace("frame_size = 128", "frame_size = \"big\""));
        assert!(e.starts_with("workers[0].frame_size: invalid type"), "{e}");
    }

    #[test]
    fn range_and_reference_errors() {
        assert_eq!(
            error_of(&LOOPBACK.replace("frame_size = 128", "frame_size = 20")),
            "workers[0].frame_size: must be 64..=1518 bytes (with FCS)"
        );
        assert_eq!(
            error_of(&LOOPBACK.replace("port = \"b\"", "port = \"zz\"")),
            "workers[1].port: no port named \"zz\""
        );
        assert_eq!(
            error_of(&LOOPBACK.replace("core = 1", "core = 0")),
            "workers[1].core: core 0 is already used by workers[0]"
        );
        assert_eq!(
            error_of(&LOOPBACK.replace("port = \"b\"", "port = \"a\"\nqueue = 3")),
            "workers[1].port: port a has 1 RX queue(s); queue 3 does not exist"
        );
        assert_eq!(
            error_of(&LOOPBACK.replacen("ring = \"wire\"", "ring = \"solo\"", 1)),
            "ports[0].ring: link \"solo\" joins 1 port(s); a ring link joins exactly two"
        );
        assert_eq!(
            error_of(&LOOPBACK.replace("task = \"check\"", "task = \"check\"\nrate_pps = 5")),
            "workers[1].rate_pps: does not apply to task Check"
        );
    }

    #[test]
    fn sizes_and_durations_are_bounded() {
        let port_b = "name = \"b\"";
        assert_eq!(
            error_of(&LOOPBACK.replace(port_b, &format!("{port_b}\nrx_queues = 1025"))),
            "ports[1].rx_queues: must be 0..=1024 queues"
        );
        assert_eq!(
            error_of(&LOOPBACK.replace(port_b, &format!("{port_b}\ntx_desc = 16"))),
            "ports[1].tx_desc: must be 32..=16384 descriptors"
        );
        for d in ["-1", "1e300", "nan", "inf"] {
            assert_eq!(
                error_of(&LOOPBACK.replace("duration_s = 2", &format!("duration_s = {d}"))),
                "run.duration_s: must be a number of seconds, 0..=1e9",
                "{d}"
            );
        }
        assert_eq!(
            error_of(&LOOPBACK.replace("duration_s = 2", "duration_s = 0\nstats_period_s = -1")),
            "run.stats_period_s: must be a number of seconds, 0..=1e9"
        );
        assert_eq!(
            error_of(&format!("[eal]\nmemory_mb = 32\n{LOOPBACK}")),
            "eal.memory_mb: must be at least 64"
        );
        let s = parse(&LOOPBACK.replace("duration_s = 2", "duration_s = 0")).unwrap();
        assert_eq!(s.run.duration_s, 0.0, "0: until done or stopped");
    }

    #[test]
    fn forward_paths_share_tx_but_not_rx() {
        let text = r#"
            [[ports]]
            name = "n0"
            vdev = "net_null0"
            [[ports]]
            name = "n1"
            vdev = "net_null1"
            [[workers]]
            core = 1
            task = "forward"
            mode = "macswap"
            paths = [["n0", "n1"], ["n1", "n0"]]
        "#;
        let s = parse(text).unwrap();
        let Task::Forward { mode, paths } = &s.workers[0].task else {
            panic!()
        };
        assert_eq!(*mode, FwdMode::Macswap);
        assert_eq!(paths.len(), 2);
        let dup = text.replace("[\"n1\", \"n0\"]", "[\"n0\", \"n0\"]");
        assert_eq!(
            error_of(&dup),
            "workers[0].paths[1]: RX queue n0:0 is already used by workers[0]"
        );
    }

    #[test]
    fn vdev_names_split_into_driver() {
        assert_eq!(vdev_driver("net_null0,size=64"), ("net_null0", "net_null"));
        assert_eq!(vdev_driver("net_tap12"), ("net_tap12", "net_tap"));
    }

    #[test]
    fn vdev_drivers_come_from_installed_pmds() {
        let dir = std::env::temp_dir().join(format!("portico-pmds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "librte_net_null.so",
            "librte_net_tap.so",
            "librte_net_ixgbe.so",
            "librte_net_bond.so.23",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let names = installed_vdev_drivers(dir.to_str().unwrap());
        assert_eq!(
            names,
            ["net_null", "net_tap", "net_tun"],
            "PCI-only PMDs and versioned names are not vdevs"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(installed_vdev_drivers("/nonexistent").is_empty());
    }

    #[test]
    fn shipped_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let text = std::fs::read_to_string(&p).unwrap();
                // Configs of `portico target`/`initiator` have an [rdma] table instead.
                if text.contains("\n[rdma]") {
                    from_toml::<crate::config::peer::PeerConfig>(&text)
                        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                } else {
                    Scenario::load(&p, CORES, &drivers())
                        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                }
                seen += 1;
            }
        }
        assert!(seen >= 2, "configs/ should hold the shipped scenarios");
    }
}
