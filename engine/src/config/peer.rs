//! TOML for `portico target` and `portico initiator`: one RoCEv2 engine on one port, its
//! addresses, its queue pair and the peer's, and its region.
//!
//! As for scenarios, parsing is strict and every error names its field
//! (`rdma.peer_mac: "aa:bb" is not a MAC address`), so a bad file ends with one line and exit
//! status 2 before EAL starts.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{
    ConfigError, EalSection, MemoryLimit, RuntimeSection, ShaperSection, cores_text, err, from_toml,
};
use crate::transport::{Mtu, QpConfig};
use crate::wire::EthernetAddress;
use crate::wire::bth::PSN_MASK;

/// A peer's config file: `[eal]` as in scenarios, and `[rdma]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    #[serde(default)]
    pub eal: EalSection,
    pub rdma: RdmaSection,
    /// The traffic shaper of this side's requests (`docs/shaper.md`); absent: requests go as
    /// the queue pairs' windows allow.
    #[serde(default)]
    pub shaper: Option<ShaperSection>,
    /// How the engine's workers wait when idle (`[runtime] polling`, `max_sleep_us`).
    #[serde(default)]
    pub runtime: RuntimeSection,
    /// The connection manager's times and bounds (`target --listen`, `initiator --connect`;
    /// `docs/cm.md`).
    #[serde(default)]
    pub cm: CmSection,
}

/// `[cm]`: the connection manager's times and bounds; every key optional, rdma_cm's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CmSection {
    /// The CM's response time as an IBTA time code, 4.096 µs · 2^n (0..=31): how long a peer
    /// waits for this CM's answer, and this CM for the peer's. 20 (4.3 s) by default.
    pub response_timeout: u8,
    /// Resends of a REQ, REP or DREQ before the connection times out (0..=15). 15 by default.
    pub max_retries: u8,
    /// Passive connections not yet established, at most; REQs beyond are rejected. 256.
    pub max_half_open: usize,
    /// Connections of every state, at most (1..=4096, the queue pairs an engine holds). 4096.
    pub max_connections: usize,
    /// How long an ended connection is remembered (repeated DREQs answered, stale REQs
    /// refused), in milliseconds. 1000.
    pub time_wait_ms: u64,
}

impl Default for CmSection {
    fn default() -> Self {
        let d = proto::cm::CmConfig::new(Ipv4Addr::UNSPECIFIED, EthernetAddress([0; 6]));
        CmSection {
            response_timeout: d.response_timeout,
            max_retries: d.max_retries,
            max_half_open: d.max_half_open,
            max_connections: d.max_connections,
            time_wait_ms: d.time_wait_ns / 1_000_000,
        }
    }
}

impl CmSection {
    /// Checks every key's range; the error names the key.
    pub fn check(&self) -> Result<(), ConfigError> {
        let max_qps = crate::rdma::rings::MAX_QPS;
        if self.response_timeout > 31 {
            return Err(err("cm.response_timeout", "a time code is 0..=31"));
        }
        if self.max_retries > 15 {
            return Err(err("cm.max_retries", "0..=15 (the REQ's 4 bits)"));
        }
        if !(1..=max_qps).contains(&self.max_connections) {
            return Err(err(
                "cm.max_connections",
                format!("1..={max_qps} (the queue pairs an engine holds)"),
            ));
        }
        if !(1..=self.max_connections).contains(&self.max_half_open) {
            return Err(err(
                "cm.max_half_open",
                format!("1..=max_connections ({})", self.max_connections),
            ));
        }
        if !(1..=3_600_000).contains(&self.time_wait_ms) {
            return Err(err("cm.time_wait_ms", "1..=3600000 milliseconds"));
        }
        Ok(())
    }

    /// Applies the section to a CM's configuration.
    pub fn apply(&self, cfg: &mut proto::cm::CmConfig) {
        cfg.response_timeout = self.response_timeout;
        cfg.max_retries = self.max_retries;
        cfg.max_half_open = self.max_half_open;
        cfg.max_connections = self.max_connections;
        cfg.time_wait_ns = self.time_wait_ms * 1_000_000;
    }
}

/// `[rdma]`: the engine's port, core and addresses, the peer's, and this side's region.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaSection {
    /// The port, as a vdev (`net_memif0,role=server,socket=/tmp/x.sock`) or a PCI address.
    pub port: String,
    /// The core the engine's worker runs on (the first worker's, with `cores`).
    pub core: usize,
    /// Run the engine on several workers, one RX/TX queue pair of the port each
    /// (`docs/rdma.md`, "N cores"): a count (`core` and the cores after it) or a list of
    /// cores. Absent: one worker on `core`. `portico target` only.
    #[serde(default)]
    pub cores: Option<CoresKey>,
    /// The peer's RX queues (its worker count): each queue pair's UDP source port is chosen
    /// so that the peer's RSS gives its packets to the peer end's home queue. 1 by default.
    #[serde(default = "one")]
    pub peer_queues: u16,
    /// The home queue, on the peer, of `peer_qpn` (the target's `ready` line gives it for each
    /// of its queue pairs); queue pair *i* of this side goes to `(peer_queue + i) %
    /// peer_queues`. 0 by default.
    #[serde(default)]
    pub peer_queue: u16,
    /// This side's MAC address, `aa:bb:cc:dd:ee:ff` (checked by [`parse_mac`]).
    pub mac: String,
    pub ip: Ipv4Addr,
    /// This side's queue pair number (24 bits).
    pub qpn: u32,
    pub peer_mac: String,
    pub peer_ip: Ipv4Addr,
    pub peer_qpn: u32,
    /// The first PSN this side sends (24 bits). Absent: drawn at random
    /// ([`crate::transport::random_psn`]), as verbs applications choose `sq_psn`.
    #[serde(default)]
    pub psn: Option<u32>,
    /// The first PSN the peer sends (24 bits): it must equal the peer's `psn`. A target only
    /// answers, and its answers carry the PSNs of the requests, so an initiator's `peer_psn`
    /// is never used; a target's must equal its initiator's `psn`.
    #[serde(default)]
    pub peer_psn: u32,
    /// Path MTU in bytes: 256, 512, 1024 (the default), 2048 or 4096 (see [`parse_mtu`]).
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// The address that names this side's region on the wire (`ibv_reg_mr_iova`). Absent:
    /// the real address of its bytes, as `ibv_reg_mr` gives.
    #[serde(default)]
    pub region_addr: Option<u64>,
    /// The region's size in bytes.
    pub region_len: usize,
    /// A file to map as this side's region: opened when it exists (it must hold `region_len`
    /// bytes), created at `region_len` bytes otherwise. A relative path is taken from the
    /// working directory. Absent: anonymous memory.
    #[serde(default)]
    pub region_file: Option<PathBuf>,
    /// The shortest retransmission timeout in microseconds (1..=[`MAX_TIMEOUT_US`]), and the
    /// one used until the first round trip has been measured ([`QpConfig::timeout_ns`]).
    #[serde(default = "default_timeout_us")]
    pub timeout_us: u64,
    /// The longest timeout the measured round trip may ask for, in microseconds (before
    /// backoff). Absent: [`DEFAULT_MAX_TIMEOUT_US`], or `timeout_us` if that is longer. Equal
    /// to `timeout_us`: a fixed timer. See [`RdmaSection::max_timeout_us`].
    #[serde(default, rename = "max_timeout_us")]
    pub max_timeout: Option<u64>,
    /// target: receive buffers of 4 KiB to post in the upper half of the region, for SENDs
    /// (at most [`max_receives`], the depth of the receive queue).
    #[serde(default)]
    pub receives: u32,
    /// Both sides: speak Portico's durable-write extension on the queue pair
    /// ([`QpConfig::durable_writes`]). The two processes must agree: a target without it
    /// refuses durable WRITEs as invalid requests.
    #[serde(default)]
    pub durable_writes: bool,
    /// target: register the region [`crate::transport::Access::DURABLE`] too, so that the ACK
    /// of a plain WRITE into it is withheld until the WRITE is durable.
    #[serde(default)]
    pub durable_region: bool,
    /// target: map the region file under pmem's power-loss simulator, so that the file holds
    /// exactly the persisted cache lines (what a `SIGKILL` leaves is what was made durable).
    /// Needs a region file (`region_file` or `--region-file`).
    #[serde(default)]
    pub simulate_power_loss: bool,
    /// The `[shaper]` class this side's queue pairs' requests go in (0 by default); needs a
    /// `[shaper]` with that many classes.
    #[serde(default)]
    pub traffic_class: u8,
    /// The DSCP of this side's packets (0..=63), what switches classify them by; 26 (AF31) by
    /// default, as RoCE deployments commonly use.
    #[serde(default = "default_dscp")]
    pub dscp: u8,
}

fn default_dscp() -> u8 {
    QpConfig::new(0, 0).dscp
}

/// `rdma.cores`: how many workers, or which cores.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CoresKey {
    Count(usize),
    List(Vec<usize>),
}

/// The most workers (and queues) an engine runs on: as many as a `net_ring` port has queues,
/// and far more than this machine has cores.
pub const MAX_WORKERS: usize = 16;

fn one() -> u16 {
    1
}

/// The workers' cores for `cores` (`field` names it in errors: `rdma.cores` or `--cores`),
/// `core` being the first worker's: a count takes `core` and the cores after it among
/// `available` (wrapping round), a list is taken as it is. Every core must be available, none
/// twice, 1..=[`MAX_WORKERS`] of them.
pub fn worker_cores(
    field: &str,
    core: usize,
    cores: Option<&CoresKey>,
    available: &[usize],
) -> Result<Vec<usize>, ConfigError> {
    let list = match cores {
        None => vec![core],
        Some(CoresKey::Count(n)) => {
            let n = *n;
            if n == 0 || n > MAX_WORKERS {
                return Err(err(
                    field,
                    format!("{n} workers: must be 1..={MAX_WORKERS}"),
                ));
            }
            if n > available.len() {
                return Err(err(
                    field,
                    format!(
                        "{n} workers need {n} cores; this process may use {} ({})",
                        available.len(),
                        cores_text(available)
                    ),
                ));
            }
            let at = available.iter().position(|&c| c == core).unwrap_or(0);
            (0..n)
                .map(|i| available[(at + i) % available.len()])
                .collect()
        }
        Some(CoresKey::List(list)) => {
            if list.is_empty() || list.len() > MAX_WORKERS {
                return Err(err(
                    field,
                    format!("a list of 1..={MAX_WORKERS} cores, one per worker"),
                ));
            }
            list.clone()
        }
    };
    for (i, c) in list.iter().enumerate() {
        if !available.contains(c) {
            return Err(err(
                field,
                format!(
                    "core {c} does not exist (cores available: {})",
                    cores_text(available)
                ),
            ));
        }
        if list[..i].contains(c) {
            return Err(err(field, format!("core {c} is listed twice")));
        }
    }
    Ok(list)
}

/// The smallest region: the target reads back 64 bytes at offset 0 and 64 at `region_len / 2`.
pub const MIN_REGION_LEN: usize = 128;

/// The size of each receive buffer a target posts (`rdma.receives`).
pub const RECEIVE_LEN: usize = 4096;

/// The longest retransmission timeout, in microseconds (one minute).
pub const MAX_TIMEOUT_US: u64 = 60_000_000;

/// The ceiling of the adaptive retransmission timeout unless the config names one (100 ms).
pub const DEFAULT_MAX_TIMEOUT_US: u64 = 100_000;

impl RdmaSection {
    /// The ceiling of the adaptive retransmission timeout, in microseconds
    /// ([`QpConfig::max_timeout_ns`]).
    pub fn max_timeout_us(&self) -> u64 {
        self.max_timeout
            .unwrap_or(DEFAULT_MAX_TIMEOUT_US.max(self.timeout_us))
    }
}

/// Receive buffers a target may post at once: the depth of its queue pair's receive queue.
pub fn max_receives() -> usize {
    QpConfig::new(0, 0).max_recv_wr
}

fn default_mtu() -> u32 {
    1024
}

fn default_timeout_us() -> u64 {
    1000
}

/// Reads and checks a peer config. `cores` are the cores this process may use; EAL's memory
/// must also fit what this process can map.
pub fn load_peer(path: &Path, cores: &[usize]) -> Result<PeerConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(path.display().to_string(), format!("cannot read: {e}")))?;
    let cfg = parse_peer(&text, cores)?;
    cfg.eal.check(MemoryLimit::read().as_ref())?;
    Ok(cfg)
}

/// Parses and checks a peer config: unknown keys are errors, the core must exist, both MAC
/// addresses and the MTU must be valid, and every number must be in its range (QPNs and PSNs
/// of 24 bits, a region large enough for what the target reads back and for its receive
/// buffers, a timeout that is neither 0 nor beyond a minute).
pub fn parse_peer(text: &str, cores: &[usize]) -> Result<PeerConfig, ConfigError> {
    let cfg: PeerConfig = from_toml(text)?;
    cfg.eal.check(None)?;
    cfg.runtime.polling()?;
    cfg.cm.check()?;
    let r = &cfg.rdma;
    for (field, v) in [
        ("rdma.qpn", Some(r.qpn)),
        ("rdma.peer_qpn", Some(r.peer_qpn)),
        ("rdma.psn", r.psn),
        ("rdma.peer_psn", Some(r.peer_psn)),
    ] {
        // QPNs and PSNs are 24-bit fields of the BTH.
        if let Some(v) = v.filter(|&v| v > PSN_MASK) {
            return Err(err(
                field,
                format!("{v:#x} does not fit in 24 bits (0..=0xffffff)"),
            ));
        }
    }
    if r.region_len < MIN_REGION_LEN {
        return Err(err(
            "rdma.region_len",
            format!(
                "{} bytes is too small: at least {MIN_REGION_LEN} (the target reads back 64 bytes at 0 and at region_len/2)",
                r.region_len
            ),
        ));
    }
    let half = r.region_len / 2;
    let receives = r.receives as usize;
    if receives > max_receives() {
        return Err(err(
            "rdma.receives",
            format!(
                "{receives} is more than the receive queue holds ({})",
                max_receives()
            ),
        ));
    }
    if receives * RECEIVE_LEN > half {
        return Err(err(
            "rdma.receives",
            format!(
                "{receives} buffers of 4 KiB do not fit the upper half of the region ({half} bytes)"
            ),
        ));
    }
    if !(1..=MAX_TIMEOUT_US).contains(&r.timeout_us) {
        return Err(err(
            "rdma.timeout_us",
            format!("must be 1..={MAX_TIMEOUT_US} microseconds"),
        ));
    }
    if !(r.timeout_us..=MAX_TIMEOUT_US).contains(&r.max_timeout_us()) {
        return Err(err(
            "rdma.max_timeout_us",
            format!(
                "must be timeout_us ({})..={MAX_TIMEOUT_US} microseconds",
                r.timeout_us
            ),
        ));
    }
    if !cores.contains(&r.core) {
        return Err(err(
            "rdma.core",
            format!(
                "core {} does not exist (cores available: {})",
                r.core,
                cores_text(cores)
            ),
        ));
    }
    let workers = worker_cores("rdma.cores", r.core, r.cores.as_ref(), cores)?;
    if u64::from(r.qpn) + workers.len() as u64 - 1 > u64::from(PSN_MASK)
        || u64::from(r.peer_qpn) + workers.len() as u64 - 1 > u64::from(PSN_MASK)
    {
        return Err(err(
            "rdma.qpn",
            format!(
                "{} queue pairs from {:#x} (peer {:#x}) run past 24 bits",
                workers.len(),
                r.qpn,
                r.peer_qpn
            ),
        ));
    }
    if r.peer_queues == 0 || r.peer_queues as usize > MAX_WORKERS {
        return Err(err(
            "rdma.peer_queues",
            format!("{} queues: must be 1..={MAX_WORKERS}", r.peer_queues),
        ));
    }
    if r.peer_queue >= r.peer_queues {
        return Err(err(
            "rdma.peer_queue",
            format!(
                "queue {} of a peer with {} (peer_queues)",
                r.peer_queue, r.peer_queues
            ),
        ));
    }
    parse_mac("rdma.mac", &r.mac)?;
    parse_mac("rdma.peer_mac", &r.peer_mac)?;
    parse_mtu(r.mtu)?;
    memif_port(&r.port, r.mtu).map_err(|why| err("rdma.port", why))?;
    if r.dscp > 63 {
        return Err(err(
            "rdma.dscp",
            format!("{}: a DSCP is 6 bits (0..=63)", r.dscp),
        ));
    }
    let classes = match &cfg.shaper {
        Some(s) => s.to_config("shaper")?.classes.len(),
        None => 1,
    };
    if r.traffic_class as usize >= classes {
        let why = match &cfg.shaper {
            Some(_) => format!("class {} of a [shaper] with {classes}", r.traffic_class),
            None => format!(
                "class {} needs a [shaper] with its classes",
                r.traffic_class
            ),
        };
        return Err(err("rdma.traffic_class", why));
    }
    Ok(cfg)
}

/// A MAC address written as six octets of one or two hex digits, separated by `:`; an error
/// names `field`.
pub fn parse_mac(field: &str, s: &str) -> Result<EthernetAddress, ConfigError> {
    let bad = || err(field, format!("{s:?} is not a MAC address"));
    let octets: Vec<u8> = s
        .split(':')
        .map(|h| {
            if (1..=2).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit()) {
                u8::from_str_radix(h, 16).map_err(|_| bad())
            } else {
                Err(bad())
            }
        })
        .collect::<Result<_, _>>()?;
    if octets.len() != 6 {
        return Err(bad());
    }
    EthernetAddress::from_bytes(&octets).ok_or_else(bad)
}

/// `rdma.port` as EAL is given it. A `net_memif` port must hold every frame in one of its
/// buffers: DPDK 22.11's memif splits a longer frame over several descriptors, and its
/// transmit path leaves a stale "next" flag on a descriptor that a later one-buffer frame
/// reuses, gluing that frame to the next one (`docs/dataplane.md`, "memif"). So a memif port
/// without `bsize` gets the power of two that holds the largest frame at `mtu` (2048, memif's
/// default, up to MTU 1024; 8192 at 4096), and one whose `bsize` is smaller is refused with
/// the reason. Other ports are returned as they are.
pub fn memif_port(port: &str, mtu: u32) -> Result<String, String> {
    let (_, driver) = super::vdev_driver(port);
    if driver != "net_memif" {
        return Ok(port.to_string());
    }
    let frame = mtu + crate::wire::roce::MAX_FRAME_OVERHEAD as u32;
    let given = port
        .split(',')
        .skip(1)
        .filter_map(|kv| kv.trim().strip_prefix("bsize="))
        .last();
    match given {
        None => Ok(format!("{port},bsize={}", frame.next_power_of_two())),
        Some(v) => match v.trim().parse::<u32>() {
            Ok(b) if b < frame => Err(format!(
                "net_memif bsize={b} is smaller than a frame at mtu {mtu} (up to {frame} bytes): \
                 DPDK 22.11's memif corrupts frames that span buffers; leave bsize out (Portico \
                 then sets {}) or give at least {frame}",
                frame.next_power_of_two()
            )),
            // A value memif cannot parse is memif's to refuse, in its own words.
            _ => Ok(port.to_string()),
        },
    }
}

/// The path MTU for `rdma.mtu`, in bytes.
pub fn parse_mtu(m: u32) -> Result<Mtu, ConfigError> {
    Mtu::try_from(m).map_err(|e| err("rdma.mtu", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CORES: &[usize] = &[0, 1];

    const TARGET: &str = r#"
        [eal]
        args = ["--no-huge", "-m", "256"]
        [rdma]
        port = "net_memif0,role=server,socket=/tmp/portico.sock"
        core = 1
        mac = "02:00:00:00:00:01"
        ip = "10.0.0.1"
        qpn = 17
        peer_mac = "02:00:00:00:00:02"
        peer_ip = "10.0.0.2"
        peer_qpn = 18
        region_addr = 0x10000
        region_len = 65536
    "#;

    #[test]
    fn a_shaper_section_and_the_queue_pairs_class_and_dscp() {
        let shaped = format!(
            "{TARGET}traffic_class = 1\ndscp = 46\n[shaper]\nabsorb_gbps = 2\n\
             [[shaper.classes]]\nceiling_gbps = 10\n[[shaper.classes]]\nceiling_gbps = 5\n"
        );
        let cfg = parse_peer(&shaped, CORES).unwrap();
        assert_eq!((cfg.rdma.traffic_class, cfg.rdma.dscp), (1, 46));
        let s = cfg.shaper.unwrap().to_config("shaper").unwrap();
        assert_eq!(s.absorb_bps, Some(2_000_000_000));
        assert_eq!(s.classes.len(), 2);
        // Defaults: class 0, DSCP 26, no shaper.
        let plain = parse_peer(TARGET, CORES).unwrap();
        assert_eq!((plain.rdma.traffic_class, plain.rdma.dscp), (0, 26));
        assert!(plain.shaper.is_none());
        for (text, field) in [
            (
                shaped.replace("traffic_class = 1", "traffic_class = 2"),
                "rdma.traffic_class",
            ),
            (format!("{TARGET}traffic_class = 1\n"), "rdma.traffic_class"),
            (shaped.replace("dscp = 46", "dscp = 64"), "rdma.dscp"),
            (
                shaped.replace("ceiling_gbps = 5", "ceiling_gbps = 0"),
                "shaper.classes[1].ceiling_gbps",
            ),
        ] {
            assert_eq!(parse_peer(&text, CORES).unwrap_err().field, field, "{text}");
        }
    }

    /// `parse_peer` on TARGET with `from` replaced by `to`: the field its error names.
    fn error_field(from: &str, to: &str) -> String {
        assert!(TARGET.contains(from), "{from}");
        parse_peer(&TARGET.replace(from, to), CORES)
            .unwrap_err()
            .field
    }

    #[test]
    fn the_cm_section_is_optional_and_each_key_is_checked() {
        let c = parse_peer(TARGET, CORES).unwrap();
        assert_eq!(
            (c.cm.response_timeout, c.cm.max_retries, c.cm.max_half_open),
            (20, 15, 256)
        );
        let with = |cm: &str| parse_peer(&format!("{TARGET}\n[cm]\n{cm}\n"), CORES);
        let c = with("response_timeout = 14\nmax_half_open = 8\ntime_wait_ms = 50").unwrap();
        let mut cfg = proto::cm::CmConfig::new(Ipv4Addr::UNSPECIFIED, EthernetAddress([0; 6]));
        c.cm.apply(&mut cfg);
        assert_eq!(
            (cfg.response_timeout, cfg.max_half_open, cfg.time_wait_ns),
            (14, 8, 50_000_000)
        );
        for (bad, field) in [
            ("response_timeout = 32", "cm.response_timeout"),
            ("max_retries = 16", "cm.max_retries"),
            ("max_connections = 0", "cm.max_connections"),
            ("max_connections = 5000", "cm.max_connections"),
            ("max_half_open = 0", "cm.max_half_open"),
            (
                "max_connections = 10\nmax_half_open = 11",
                "cm.max_half_open",
            ),
            ("time_wait_ms = 0", "cm.time_wait_ms"),
            ("listen = 7471", "cm.listen"),
        ] {
            let e = with(bad).unwrap_err();
            assert!(
                e.field.starts_with(field) || e.to_string().contains("listen"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn target_parses_with_defaults() {
        let c = parse_peer(TARGET, CORES).unwrap();
        assert_eq!(c.eal.args, ["--no-huge", "-m", "256"]);
        assert_eq!(c.rdma.core, 1);
        assert_eq!(c.rdma.ip, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!((c.rdma.qpn, c.rdma.peer_qpn), (17, 18));
        assert_eq!(
            (c.rdma.region_addr, c.rdma.region_len),
            (Some(0x10000), 65536)
        );
        assert_eq!(c.rdma.mtu, 1024);
        assert_eq!(c.rdma.timeout_us, 1000);
        assert_eq!(c.rdma.max_timeout_us(), 100_000);
        assert_eq!(c.rdma.receives, 0);
        assert_eq!(c.rdma.region_file, None, "anonymous memory by default");
        assert!(!c.rdma.durable_writes && !c.rdma.durable_region);
        assert!(!c.rdma.simulate_power_loss);
    }

    #[test]
    fn persistence_keys_are_read() {
        let text = TARGET.replace(
            "region_len = 65536",
            "region_len = 65536\ndurable_writes = true\ndurable_region = true\nsimulate_power_loss = true",
        );
        let c = parse_peer(&text, CORES).unwrap();
        assert!(c.rdma.durable_writes && c.rdma.durable_region && c.rdma.simulate_power_loss);
        assert_eq!(
            error_field("region_len = 65536", "durable_writes = 1"),
            "rdma.durable_writes"
        );
    }

    #[test]
    fn region_file_is_read() {
        let text = TARGET.replace(
            "region_len = 65536",
            "region_len = 65536\nregion_file = \"/dev/shm/portico-region\"",
        );
        let c = parse_peer(&text, CORES).unwrap();
        assert_eq!(
            c.rdma.region_file.as_deref(),
            Some(Path::new("/dev/shm/portico-region"))
        );
    }

    #[test]
    fn bad_mac_names_its_field() {
        assert_eq!(
            error_field("mac = \"02:00:00:00:00:01\"", "mac = \"02:00:00:00:00\""),
            "rdma.mac"
        );
        assert_eq!(
            error_field("\"02:00:00:00:00:02\"", "\"02:00:00:00:00:zz\""),
            "rdma.peer_mac"
        );
        let e = parse_peer(&TARGET.replace("02:00:00:00:00:02", "aa:bb"), CORES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma.peer_mac: \"aa:bb\" is not a MAC address"
        );
    }

    #[test]
    fn a_memif_port_holds_every_frame_in_one_buffer() {
        let m = "net_memif0,role=server,socket=/tmp/p.sock";
        assert_eq!(memif_port(m, 4096).unwrap(), format!("{m},bsize=8192"));
        assert_eq!(memif_port(m, 1024).unwrap(), format!("{m},bsize=2048"));
        assert_eq!(memif_port(m, 256).unwrap(), format!("{m},bsize=512"));
        let big = format!("{m},bsize=16384");
        assert_eq!(memif_port(&big, 4096).unwrap(), big);
        let e = memif_port(&format!("{m},bsize=2048"), 4096).unwrap_err();
        assert!(
            e.contains("bsize=2048 is smaller than a frame at mtu 4096 (up to 4352 bytes)"),
            "{e}"
        );
        // Other ports are left alone.
        for p in ["net_ring0", "0000:3b:00.0", "net_tap0,iface=x"] {
            assert_eq!(memif_port(p, 4096).unwrap(), p);
        }
        // From a config: the field is named (exit 2).
        let text = TARGET.replace(
            "port = \"net_memif0,role=server,socket=/tmp/portico.sock\"",
            "port = \"net_memif0,role=server,socket=/tmp/portico.sock,bsize=2048\"\nmtu = 4096",
        );
        let e = parse_peer(&text, CORES).unwrap_err().to_string();
        assert!(e.contains("rdma.port") && e.contains("bsize=2048"), "{e}");
    }

    #[test]
    fn bad_mtu_names_its_field() {
        let e = parse_peer(
            &TARGET.replace("region_addr", "mtu = 1500\nregion_addr"),
            CORES,
        )
        .unwrap_err();
        assert_eq!(e.field, "rdma.mtu");
        assert_eq!(e.message, "1500 is not 256, 512, 1024, 2048 or 4096");
    }

    #[test]
    fn missing_core_names_its_field() {
        let e = parse_peer(&TARGET.replace("core = 1", "core = 64"), CORES).unwrap_err();
        assert_eq!(e.field, "rdma.core");
        assert_eq!(e.message, "core 64 does not exist (cores available: 0-1)");
    }

    #[test]
    fn unknown_and_missing_keys_name_their_field() {
        assert_eq!(error_field("qpn = 17", "qpn = 17\nqpm = 3"), "rdma.qpm");
        assert_eq!(error_field("peer_qpn = 18\n", ""), "rdma");
        assert_eq!(
            error_field("ip = \"10.0.0.1\"", "ip = \"10.0.0\""),
            "rdma.ip"
        );
    }

    #[test]
    fn psns_are_read_and_default_to_random_and_zero() {
        let c = parse_peer(TARGET, CORES).unwrap();
        assert_eq!((c.rdma.psn, c.rdma.peer_psn), (None, 0));
        let text = TARGET.replace(
            "peer_qpn = 18",
            "peer_qpn = 18\npsn = 0x123456\npeer_psn = 7",
        );
        let c = parse_peer(&text, CORES).unwrap();
        assert_eq!((c.rdma.psn, c.rdma.peer_psn), (Some(0x12_3456), 7));
    }

    #[test]
    fn qpns_and_psns_are_24_bits() {
        let with = |line: &str| TARGET.replace("peer_qpn = 18", &format!("peer_qpn = 18\n{line}"));
        for (line, field) in [
            ("psn = 0x1000000", "rdma.psn"),
            ("peer_psn = 16777216", "rdma.peer_psn"),
        ] {
            let e = parse_peer(&with(line), CORES).unwrap_err();
            assert_eq!(e.field, field);
            assert_eq!(
                e.message,
                "0x1000000 does not fit in 24 bits (0..=0xffffff)"
            );
        }
        assert!(parse_peer(&with("psn = 0xffffff\npeer_psn = 0xffffff"), CORES).is_ok());
        assert_eq!(error_field("qpn = 17", "qpn = 0x1000000"), "rdma.qpn");
        assert_eq!(
            error_field("peer_qpn = 18", "peer_qpn = 0x1000000"),
            "rdma.peer_qpn"
        );
    }

    #[test]
    fn sizes_are_bounded() {
        let e = parse_peer(
            &TARGET.replace("region_len = 65536", "region_len = 64"),
            CORES,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma.region_len: 64 bytes is too small: at least 128 (the target reads back 64 bytes at 0 and at region_len/2)"
        );
        let receives = |n: u32| {
            TARGET.replace(
                "region_len = 65536",
                &format!("region_len = 65536\nreceives = {n}"),
            )
        };
        assert!(
            parse_peer(&receives(8), CORES).is_ok(),
            "8 of 4 KiB fill the upper 32 KiB"
        );
        let e = parse_peer(&receives(9), CORES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma.receives: 9 buffers of 4 KiB do not fit the upper half of the region (32768 bytes)"
        );
        let big = receives(129).replace("region_len = 65536", "region_len = 16777216");
        let e = parse_peer(&big, CORES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma.receives: 129 is more than the receive queue holds (128)"
        );
        for t in ["timeout_us = 0", "timeout_us = 60000001"] {
            let e = parse_peer(
                &TARGET.replace("region_addr", &format!("{t}\nregion_addr")),
                CORES,
            )
            .unwrap_err();
            assert_eq!(
                e.to_string(),
                "rdma.timeout_us: must be 1..=60000000 microseconds"
            );
        }
        let with = |t: &str| TARGET.replace("region_addr", &format!("{t}\nregion_addr"));
        for t in ["max_timeout_us = 999", "max_timeout_us = 60000001"] {
            let e = parse_peer(&with(t), CORES).unwrap_err();
            assert_eq!(
                e.to_string(),
                "rdma.max_timeout_us: must be timeout_us (1000)..=60000000 microseconds"
            );
        }
        // A fixed timer; and a timeout above the default ceiling raises the ceiling with it.
        let c = parse_peer(&with("max_timeout_us = 1000"), CORES).unwrap();
        assert_eq!(c.rdma.max_timeout_us(), 1000);
        let c = parse_peer(&with("timeout_us = 200000"), CORES).unwrap();
        assert_eq!(c.rdma.max_timeout_us(), 200_000);
        let e = parse_peer(&TARGET.replace("[rdma]", "memory_mb = 16\n[rdma]"), CORES).unwrap_err();
        assert_eq!(e.to_string(), "eal.memory_mb: must be at least 64");
    }

    #[test]
    fn cores_are_a_count_or_a_list() {
        let with = |line: &str| TARGET.replace("core = 1", &format!("core = 1\n{line}"));
        let four = [0, 1, 2, 3];
        let workers = |line: &str| {
            let c = parse_peer(&with(line), &four).unwrap();
            worker_cores("rdma.cores", c.rdma.core, c.rdma.cores.as_ref(), &four).unwrap()
        };
        assert_eq!(workers("cores = 3"), [1, 2, 3]);
        assert_eq!(workers("cores = 4"), [1, 2, 3, 0], "wrapping round");
        assert_eq!(workers("cores = [3, 0]"), [3, 0]);
        let c = parse_peer(TARGET, CORES).unwrap();
        assert_eq!(c.rdma.cores, None);
        assert_eq!((c.rdma.peer_queues, c.rdma.peer_queue), (1, 0));
        for (line, message) in [
            ("cores = 0", "0 workers: must be 1..=16"),
            (
                "cores = 3",
                "3 workers need 3 cores; this process may use 2 (0-1)",
            ),
            ("cores = [1, 1]", "core 1 is listed twice"),
            (
                "cores = [1, 7]",
                "core 7 does not exist (cores available: 0-1)",
            ),
            ("cores = []", "a list of 1..=16 cores, one per worker"),
        ] {
            let e = parse_peer(&with(line), CORES).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.message.as_str()),
                ("rdma.cores", message)
            );
        }
        assert_eq!(
            parse_peer(&with("cores = \"two\""), CORES)
                .unwrap_err()
                .field,
            "rdma.cores"
        );
        let e = parse_peer(&with("peer_queues = 2\npeer_queue = 2"), CORES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rdma.peer_queue: queue 2 of a peer with 2 (peer_queues)"
        );
        let e = parse_peer(&with("peer_queues = 0"), CORES).unwrap_err();
        assert_eq!(e.field, "rdma.peer_queues");
        let e = parse_peer(
            &with("cores = 2").replace("qpn = 17", "qpn = 0xffffff"),
            CORES,
        )
        .unwrap_err();
        assert_eq!(e.field, "rdma.qpn");
    }

    #[test]
    fn load_peer_names_an_unreadable_file() {
        let e = load_peer(Path::new("/nonexistent/peer.toml"), CORES).unwrap_err();
        assert_eq!(e.field, "/nonexistent/peer.toml");
        assert!(e.message.starts_with("cannot read:"), "{e}");
    }

    #[test]
    fn load_peer_reads_and_checks_a_file() {
        let path = std::env::temp_dir().join(format!("portico-peer-{}.toml", std::process::id()));
        std::fs::write(&path, TARGET.replace("core = 1", "core = 64")).unwrap();
        let e = load_peer(&path, CORES).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(e.field, "rdma.core");
    }

    #[test]
    fn mac_addresses() {
        assert_eq!(
            parse_mac("m", "02:0a:FF:0:1:10").unwrap(),
            EthernetAddress([0x02, 0x0a, 0xff, 0x00, 0x01, 0x10])
        );
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:00:00",
            "02:00:00:00:00:100",
            "02:00:00:00:00:+1",
            "02-00-00-00-00-01",
        ] {
            let e = parse_mac("rdma.mac", bad).unwrap_err();
            assert_eq!(e.field, "rdma.mac", "{bad}");
        }
    }

    #[test]
    fn mtus() {
        for (m, mtu) in [
            (256, Mtu::M256),
            (512, Mtu::M512),
            (1024, Mtu::M1024),
            (2048, Mtu::M2048),
            (4096, Mtu::M4096),
        ] {
            assert_eq!(parse_mtu(m).unwrap(), mtu);
        }
        assert_eq!(parse_mtu(0).unwrap_err().field, "rdma.mtu");
    }
}
