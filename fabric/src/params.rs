//! The provider's parameters, the libfabric way: each is declared with `fi_param_define` (so
//! `fi_info -e` lists it) and read as the environment variable `FI_PORTICO_<NAME>`. Parsing is
//! pure: [`Settings::parse`] takes a lookup function, so the rules are unit-tested without
//! libfabric, and a bad value is an [`ParamError`] naming the variable.

use std::net::Ipv4Addr;

/// One parameter: its name as `fi_param_define` takes it (the variable is
/// `FI_PORTICO_<NAME>` in capitals) and its help line.
pub struct Param {
    pub name: &'static str,
    pub help: &'static str,
}

/// Every parameter, in the order `fi_info -e` shows them.
pub const PARAMS: &[Param] = &[
    Param {
        name: "dev",
        help: "The port: DPDK devargs of a vdev (net_memif0,role=server,..., net_tap0,iface=...) or a PCI address (0000:3b:00.0). Required.",
    },
    Param {
        name: "ip",
        help: "This process's IPv4 address on the port (RoCEv2 and the CM). Required.",
    },
    Param {
        name: "mac",
        help: "This process's MAC address (default 02:50 and the four bytes of FI_PORTICO_IP).",
    },
    Param {
        name: "cores",
        help: "The core the engine's worker runs on (default: the last core this process may use, less the local rank).",
    },
    Param {
        name: "eal",
        help: "Extra EAL arguments, separated by spaces (e.g. --no-huge -m 512).",
    },
    Param {
        name: "polling",
        help: "adaptive (the default: the worker sleeps when idle, so ranks can share cores) or busy.",
    },
    Param {
        name: "max_sleep_us",
        help: "With adaptive polling, the longest an idle worker sleeps, in µs (default 20, at most 10000): the latency a packet waits for a sleeping worker.",
    },
    Param {
        name: "port",
        help: "The rdma_cm port of endpoint 0; endpoint n listens on port + n (default 7471).",
    },
    Param {
        name: "mtu",
        help: "Path MTU in bytes: 256, 512, 1024 (the default: RoCEv2 frames fit a 1500-byte Ethernet MTU), 2048 or 4096 (needs a link MTU above 4 200 bytes).",
    },
    Param {
        name: "layering",
        help: "1: offer message endpoints to libfabric's utility providers, so that portico;ofi_rxm works (default 0: an application asking for an RDM endpoint gets Portico's own, whose tag matching is the list-processing engine's).",
    },
    Param {
        name: "endpoints",
        help: "Endpoints one process may open (default 4, at most 64).",
    },
    Param {
        name: "shaper",
        help: "A TOML file with a [shaper] section (as portico target takes): the engine's traffic shaper (seed 000). An endpoint's tclass puts its requests in the class named for it (best_effort, low_latency, dedicated_access, bulk_data, scavenger, network_ctrl, or dscpN for FI_TC_DSCP), else in class 0.",
    },
    Param {
        name: "overflow_kib",
        help: "Bytes (KiB) of overflow buffers per endpoint for unexpected messages (default 4096).",
    },
];

/// A parameter with a bad value: which variable, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("FI_PORTICO_{}: {why}", .name.to_ascii_uppercase())]
pub struct ParamError {
    pub name: &'static str,
    pub why: String,
}

fn bad(name: &'static str, why: impl Into<String>) -> ParamError {
    ParamError {
        name,
        why: why.into(),
    }
}

/// Where the worker runs when `FI_PORTICO_CORES` does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Core {
    /// The last core this process may use, less the local rank (wrapping), so that the ranks
    /// on one host spread from the top.
    Auto,
    Fixed(usize),
}

/// `FI_PORTICO_SHAPER`: the shaper's file, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaper {
    pub path: String,
    /// The file's text (a `[shaper]` section), for the engine's configuration.
    pub text: String,
    /// Its classes' names, in order (what traffic classes are matched against).
    pub classes: Vec<String>,
}

/// The provider's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub dev: String,
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    pub core: Core,
    pub eal: Vec<String>,
    pub adaptive: bool,
    pub max_sleep_us: u64,
    pub port: u16,
    pub mtu: u32,
    pub endpoints: u16,
    pub overflow_bytes: usize,
    /// Message endpoints offered to utility providers (ofi_rxm).
    pub layering: bool,
    pub shaper: Option<Shaper>,
}

/// The most endpoints a process may open (each takes two list-processing endpoints).
pub const MAX_ENDPOINTS: u16 = 64;

impl Settings {
    /// Reads every parameter through `get` (a parameter's value, or `None` when unset).
    /// `Ok(None)`: the provider is not configured (no `FI_PORTICO_DEV`), which is not an
    /// error: `fi_getinfo` then offers nothing.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>, ParamError> {
        let Some(dev) = get("dev").filter(|d| !d.trim().is_empty()) else {
            return Ok(None);
        };
        let dev = dev.trim().to_string();
        let ip_text = get("ip").ok_or_else(|| bad("ip", "not set (the engine's IPv4 address)"))?;
        let ip: Ipv4Addr = ip_text
            .trim()
            .parse()
            .map_err(|_| bad("ip", format!("{ip_text:?} is not an IPv4 address")))?;
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(bad("ip", format!("{ip} cannot be a host's address")));
        }
        let o = ip.octets();
        let mac = match get("mac") {
            None => [0x02, 0x50, o[0], o[1], o[2], o[3]],
            // The engine's own parser, as `rdma.mac` in a config file.
            Some(m) => portico::config::peer::parse_mac("mac", m.trim())
                .map(|a| a.0)
                .map_err(|_| {
                    bad(
                        "mac",
                        format!("{m:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"),
                    )
                })?,
        };
        if mac[0] & 1 != 0 {
            return Err(bad("mac", "a multicast address cannot be a port's"));
        }
        let core = match get("cores") {
            None => Core::Auto,
            Some(c) => Core::Fixed(c.trim().parse().map_err(|_| {
                bad(
                    "cores",
                    format!("{c:?} is not a core number (one worker per process)"),
                )
            })?),
        };
        let eal = get("eal")
            .map(|e| e.split_whitespace().map(String::from).collect())
            .unwrap_or_default();
        let adaptive = match get("polling").as_deref().map(str::trim) {
            None | Some("adaptive") => true,
            Some("busy") => false,
            Some(other) => {
                return Err(bad(
                    "polling",
                    format!("{other:?}: expected adaptive or busy"),
                ));
            }
        };
        let max_sleep_us = number(&get, "max_sleep_us", 20, 1, 10_000)?;
        let port = number(&get, "port", 7471, 1, u64::from(u16::MAX))? as u16;
        let mtu = number(&get, "mtu", 1024, 256, 4096)? as u32;
        if !mtu.is_power_of_two() {
            return Err(bad(
                "mtu",
                format!("{mtu}: expected 256, 512, 1024, 2048 or 4096"),
            ));
        }
        let endpoints = number(&get, "endpoints", 4, 1, u64::from(MAX_ENDPOINTS))? as u16;
        if u32::from(port) + u32::from(endpoints) > u32::from(u16::MAX) + 1 {
            return Err(bad(
                "port",
                format!("{port} + {endpoints} endpoints passes port 65535"),
            ));
        }
        let overflow_kib = number(&get, "overflow_kib", 4096, 64, 1 << 20)?;
        let layering = number(&get, "layering", 0, 0, 1)? == 1;
        let shaper = match get("shaper").filter(|p| !p.trim().is_empty()) {
            None => None,
            Some(path) => {
                let path = path.trim().to_string();
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| bad("shaper", format!("reading {path}: {e}")))?;
                let section = portico::config::ShaperSection::parse_file(&text)
                    .map_err(|e| bad("shaper", format!("{path}: {e}")))?;
                let classes = (0..section.classes.len())
                    .map(|i| section.class_name(i))
                    .collect();
                Some(Shaper {
                    path,
                    text,
                    classes,
                })
            }
        };
        Ok(Some(Settings {
            dev,
            ip,
            mac,
            core,
            eal,
            adaptive,
            max_sleep_us,
            port,
            mtu,
            endpoints,
            overflow_bytes: overflow_kib as usize * 1024,
            layering,
            shaper,
        }))
    }

    /// The MAC address as `aa:bb:cc:dd:ee:ff`.
    pub fn mac_text(&self) -> String {
        let m = self.mac;
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

fn number(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ParamError> {
    let Some(text) = get(name) else {
        return Ok(default);
    };
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| bad(name, format!("{text:?} is not a number")))?;
    if !(min..=max).contains(&n) {
        return Err(bad(name, format!("{n} is outside {min}..={max}")));
    }
    Ok(n)
}

/// The core `Core::Auto` picks: the last of `cores`, less `local_rank` (wrapping).
pub fn auto_core(cores: &[usize], local_rank: usize) -> Option<usize> {
    if cores.is_empty() {
        return None;
    }
    let i = cores.len() - 1 - local_rank % cores.len();
    Some(cores[i])
}

/// The process's rank on its host, as MPI launchers and PMI tell it (0 when none does).
pub fn local_rank(get_env: impl Fn(&str) -> Option<String>) -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "MPI_LOCAL_RANK",
        "SLURM_LOCALID",
        "PMI_LOCAL_RANK",
    ]
    .iter()
    .find_map(|v| get_env(v).and_then(|s| s.trim().parse().ok()))
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<Settings>, ParamError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::parse(|k| m.get(k).cloned())
    }

    #[test]
    fn unset_dev_means_not_configured() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[("ip", "10.0.0.1"), ("dev", "  ")]), Ok(None));
    }

    #[test]
    fn defaults_follow_the_address() {
        let s = parse(&[("dev", "net_tap0"), ("ip", "10.1.2.3")])
            .unwrap()
            .unwrap();
        assert_eq!(s.mac, [0x02, 0x50, 10, 1, 2, 3]);
        assert_eq!(s.mac_text(), "02:50:0a:01:02:03");
        assert_eq!(
            (s.core, s.adaptive, s.port, s.mtu, s.endpoints),
            (Core::Auto, true, 7471, 1024, 4)
        );
        assert_eq!(s.overflow_bytes, 4 << 20);
    }

    #[test]
    fn every_bad_value_names_its_variable() {
        let base = [("dev", "net_tap0"), ("ip", "10.0.0.1")];
        let cases: &[(&str, &str, &str)] = &[
            (
                "ip",
                "10.0.0",
                "FI_PORTICO_IP: \"10.0.0\" is not an IPv4 address",
            ),
            (
                "ip",
                "0.0.0.0",
                "FI_PORTICO_IP: 0.0.0.0 cannot be a host's address",
            ),
            (
                "mac",
                "02:00:00:00:00",
                "FI_PORTICO_MAC: \"02:00:00:00:00\" is not a MAC address (aa:bb:cc:dd:ee:ff)",
            ),
            (
                "mac",
                "01:00:5e:00:00:01",
                "FI_PORTICO_MAC: a multicast address cannot be a port's",
            ),
            (
                "cores",
                "1,2",
                "FI_PORTICO_CORES: \"1,2\" is not a core number (one worker per process)",
            ),
            (
                "polling",
                "lazy",
                "FI_PORTICO_POLLING: \"lazy\": expected adaptive or busy",
            ),
            ("port", "0", "FI_PORTICO_PORT: 0 is outside 1..=65535"),
            (
                "port",
                "65535",
                "FI_PORTICO_PORT: 65535 + 4 endpoints passes port 65535",
            ),
            (
                "mtu",
                "1500",
                "FI_PORTICO_MTU: 1500: expected 256, 512, 1024, 2048 or 4096",
            ),
            ("mtu", "9000", "FI_PORTICO_MTU: 9000 is outside 256..=4096"),
            (
                "endpoints",
                "x",
                "FI_PORTICO_ENDPOINTS: \"x\" is not a number",
            ),
            (
                "overflow_kib",
                "1",
                "FI_PORTICO_OVERFLOW_KIB: 1 is outside 64..=1048576",
            ),
        ];
        for (name, value, want) in cases {
            let mut pairs = base.to_vec();
            pairs.retain(|(k, _)| k != name);
            pairs.push((name, value));
            assert_eq!(
                parse(&pairs).unwrap_err().to_string(),
                *want,
                "{name}={value}"
            );
        }
        assert_eq!(
            parse(&[("dev", "net_tap0")]).unwrap_err().to_string(),
            "FI_PORTICO_IP: not set (the engine's IPv4 address)"
        );
    }

    #[test]
    fn a_shaper_file_is_read_and_checked_by_the_engine_s_rules() {
        let dir = std::env::temp_dir().join(format!("portico-fi-shaper-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(
            &good,
            "[shaper]\nlink_gbps = 10.0\n\n[[shaper.classes]]\nname = \"bulk_data\"\n\
             assured_gbps = 2.0\nceiling_gbps = 10.0\n\n[[shaper.classes]]\n\
             name = \"low_latency\"\nceiling_gbps = 1.0\nstrict = true\n",
        )
        .unwrap();
        let g = good.to_str().unwrap();
        let s = parse(&[("dev", "net_tap0"), ("ip", "10.0.0.1"), ("shaper", g)])
            .unwrap()
            .unwrap();
        let sh = s.shaper.unwrap();
        assert_eq!(sh.classes, ["bulk_data", "low_latency"]);
        assert!(sh.text.contains("[[shaper.classes]]"));
        let bad_file = dir.join("bad.toml");
        std::fs::write(
            &bad_file,
            "[shaper]\n[[shaper.classes]]\nassured_gbps = 12.0\nceiling_gbps = 10.0\n",
        )
        .unwrap();
        let b = bad_file.to_str().unwrap();
        let e = parse(&[("dev", "net_tap0"), ("ip", "10.0.0.1"), ("shaper", b)]).unwrap_err();
        assert_eq!(e.name, "shaper");
        assert!(
            e.to_string().starts_with(&format!(
                "FI_PORTICO_SHAPER: {b}: shaper.classes[0].assured_gbps"
            )),
            "{e}"
        );
        let e = parse(&[
            ("dev", "net_tap0"),
            ("ip", "10.0.0.1"),
            ("shaper", "/nonexistent"),
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("FI_PORTICO_SHAPER: reading /nonexistent: "),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ranks_spread_from_the_last_core() {
        let cores = [0, 1, 2, 3];
        assert_eq!(auto_core(&cores, 0), Some(3));
        assert_eq!(auto_core(&cores, 1), Some(2));
        assert_eq!(auto_core(&cores, 5), Some(2));
        assert_eq!(auto_core(&[], 0), None);
        let env = |k: &str| (k == "OMPI_COMM_WORLD_LOCAL_RANK").then(|| "3".to_string());
        assert_eq!(local_rank(env), 3);
        assert_eq!(local_rank(|_| None), 0);
    }
}
