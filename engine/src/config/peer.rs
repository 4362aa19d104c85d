//! TOML for `portico target` and `portico initiator`: one RoCEv2 engine on one port, its
//! addresses, its queue pair and the peer's, and its region.
//!
//! As for scenarios, parsing is strict and every error names its field
//! (`rdma.peer_mac: "aa:bb" is not a MAC address`), so a bad file ends with one line and exit
//! status 2 before EAL starts.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, EalSection, cores_text, err, from_toml};
use crate::transport::Mtu;
use crate::wire::EthernetAddress;

/// A peer's config file: `[eal]` as in scenarios, and `[rdma]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    #[serde(default)]
    pub eal: EalSection,
    pub rdma: RdmaSection,
}

/// `[rdma]`: the engine's port, core and addresses, the peer's, and this side's region.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaSection {
    /// The port, as a vdev (`net_memif0,role=server,socket=/tmp/x.sock`) or a PCI address.
    pub port: String,
    /// The core the engine's worker runs on.
    pub core: usize,
    /// This side's MAC address, `aa:bb:cc:dd:ee:ff` (checked by [`parse_mac`]).
    pub mac: String,
    pub ip: Ipv4Addr,
    /// This side's queue pair number.
    pub qpn: u32,
    pub peer_mac: String,
    pub peer_ip: Ipv4Addr,
    pub peer_qpn: u32,
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

/// Reads and checks a peer config. `cores` are the cores this process may use.
pub fn load_peer(path: &Path, cores: &[usize]) -> Result<PeerConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(path.display().to_string(), format!("cannot read: {e}")))?;
    parse_peer(&text, cores)
}

/// Parses and checks a peer config: unknown keys are errors, the core must exist, both MAC
/// addresses and the MTU must be valid.
pub fn parse_peer(text: &str, cores: &[usize]) -> Result<PeerConfig, ConfigError> {
    let cfg: PeerConfig = from_toml(text)?;
    let r = &cfg.rdma;
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
    parse_mac("rdma.mac", &r.mac)?;
    parse_mac("rdma.peer_mac", &r.peer_mac)?;
    parse_mtu(r.mtu)?;
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

/// The path MTU for `rdma.mtu`, in bytes.
pub fn parse_mtu(m: u32) -> Result<Mtu, ConfigError> {
    Ok(match m {
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        4096 => Mtu::M4096,
        _ => {
            return Err(err(
                "rdma.mtu",
                format!("{m} is not 256, 512, 1024, 2048 or 4096"),
            ));
        }
    })
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

    /// `parse_peer` on TARGET with `from` replaced by `to`: the field its error names.
    fn error_field(from: &str, to: &str) -> String {
        assert!(TARGET.contains(from), "{from}");
        parse_peer(&TARGET.replace(from, to), CORES)
            .unwrap_err()
            .field
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
        assert_eq!(c.rdma.receives, 0);
        assert_eq!(c.rdma.region_file, None, "anonymous memory by default");
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
