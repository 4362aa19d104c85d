//! `[shaper]`: the traffic shaper of an engine's requests (seed 000, `docs/shaper.md`), in the
//! TOML of `portico target` / `portico initiator` and in the file `portico bench shaper
//! --shaper FILE` reads.
//!
//! ```toml
//! [shaper]
//! absorb_gbps = 4.0          # READ responses pulled in at most this fast (absent: unlimited)
//! absorb_burst_bytes = 131072
//! link_gbps = 10.0           # the port rate the classes share (absent: the port's speed)
//! mcus = 16                  # message-chopping units per worker
//! outstanding_cap = 64       # packets an MCU may have in flight
//! quantum_bytes = 4096       # deficit round robin among a class's MCUs
//! read_split_packets = 4     # READs go as sub-requests of this many response packets (0: whole)
//!
//! [[shaper.classes]]         # class 0, then 1, ... (a queue pair's rdma.traffic_class)
//! name = "reads"
//! assured_gbps = 0.5
//! ceiling_gbps = 10.0
//! burst_bytes = 65536
//! strict = false
//! pfc_priority = 3           # PFC pausing priority 3 stops this class (absent: never)
//! ```
//!
//! Rates are the port's: with several workers (`--cores`) each has a shaper, and they divide
//! each class's rates (and the link's) among the workers with work in it, rebalancing every
//! 50 µs (`proto::shaper::PortShares`). An error names its field, e.g.
//! `shaper.classes[1].assured_gbps: 12 is above ceiling_gbps (10)`.

use serde::Deserialize;

use super::{ConfigError, err};
use crate::shaper::{ClassConfig, ShaperConfig};

/// `[shaper]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShaperSection {
    /// The rate the host absorbs READ response data at, in Gbit/s of frames; absent:
    /// unlimited (READs are not paced).
    #[serde(default)]
    pub absorb_gbps: Option<f64>,
    /// The depth of the absorb bucket in bytes: how much response data may be asked for at
    /// once after a quiet spell.
    #[serde(default = "default_absorb_burst")]
    pub absorb_burst_bytes: u64,
    /// The port rate the classes share, in Gbit/s: every request is charged to one link
    /// bucket, so the classes get their assured rates out of it and borrow the rest up to
    /// their ceilings; absent: the port's own speed is the only limit.
    #[serde(default)]
    pub link_gbps: Option<f64>,
    /// The link bucket's depth in bytes (what may go at once after a quiet spell).
    #[serde(default = "default_link_burst")]
    pub link_burst_bytes: u64,
    #[serde(default = "default_mcus")]
    pub mcus: usize,
    #[serde(default = "default_cap")]
    pub outstanding_cap: u32,
    #[serde(default = "default_quantum")]
    pub quantum_bytes: u32,
    /// A READ goes as sub-requests of at most this many packets of response, each charged
    /// to the absorb bucket and paced on its own (seed 000's GET split); 0: one request for
    /// the whole READ.
    #[serde(default = "default_read_split")]
    pub read_split_packets: u32,
    pub classes: Vec<ClassSection>,
}

/// `[[shaper.classes]]`: one traffic class.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSection {
    /// A label for reports; absent: `class<i>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Served at this rate before any class that is only borrowing (Gbit/s; may be 0).
    #[serde(default)]
    pub assured_gbps: f64,
    /// Never served above this rate (Gbit/s).
    pub ceiling_gbps: f64,
    #[serde(default = "default_class_burst")]
    pub burst_bytes: u64,
    /// Served before every non-strict class, up to its ceiling (a low-latency class).
    #[serde(default)]
    pub strict: bool,
    /// The 802.1Qbb priority (0-7) the class's packets travel at: a PFC frame from the link
    /// partner that pauses it stops the class for the pause (seed 000). Absent: PFC does not
    /// stop it.
    #[serde(default)]
    pub pfc_priority: Option<u8>,
}

fn default_absorb_burst() -> u64 {
    128 * 1024
}

fn default_link_burst() -> u64 {
    64 * 1024
}

fn default_mcus() -> usize {
    16
}

fn default_cap() -> u32 {
    64
}

fn default_quantum() -> u32 {
    4096
}

fn default_read_split() -> u32 {
    crate::shaper::DEFAULT_READ_SPLIT_PACKETS
}

fn default_class_burst() -> u64 {
    64 * 1024
}

/// The most a rate may be: 1.6 Tbit/s, beyond any port.
const MAX_GBPS: f64 = 1600.0;

/// `gbps` in bit/s; `field` names it in an error. `zero_ok`: 0 is allowed.
pub fn gbps_to_bps(field: &str, gbps: f64, zero_ok: bool) -> Result<u64, ConfigError> {
    if !gbps.is_finite() || !(0.0..=MAX_GBPS).contains(&gbps) || (!zero_ok && gbps == 0.0) {
        let range = if zero_ok { "0" } else { "more than 0" };
        return Err(err(
            field,
            format!("{gbps} Gbit/s: must be {range} up to {MAX_GBPS}"),
        ));
    }
    Ok((gbps * 1e9).round() as u64)
}

/// A file that holds only a `[shaper]` section (and its classes).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShaperFile {
    shaper: ShaperSection,
}

impl ShaperSection {
    /// The `[shaper]` of a file that holds nothing else (the libfabric provider's
    /// `FI_PORTICO_SHAPER`), checked as in a config file: the error names the field.
    pub fn parse_file(text: &str) -> Result<ShaperSection, ConfigError> {
        let f: ShaperFile = super::from_toml(text)?;
        f.shaper.to_config("shaper")?;
        Ok(f.shaper)
    }

    /// A class's label.
    pub fn class_name(&self, i: usize) -> String {
        self.classes
            .get(i)
            .and_then(|c| c.name.clone())
            .unwrap_or_else(|| format!("class{i}"))
    }

    /// The shaper's configuration, every field checked and named in its error (`prefix` is
    /// where the section is: `shaper` in a file, `--shaper` on a command line).
    pub fn to_config(&self, prefix: &str) -> Result<ShaperConfig, ConfigError> {
        if self.classes.is_empty() {
            return Err(err(
                format!("{prefix}.classes"),
                "at least one [[shaper.classes]]",
            ));
        }
        if self.classes.len() > 256 {
            return Err(err(
                format!("{prefix}.classes"),
                format!("{} classes: at most 256", self.classes.len()),
            ));
        }
        let mut classes = Vec::with_capacity(self.classes.len());
        for (i, c) in self.classes.iter().enumerate() {
            let f = |name: &str| format!("{prefix}.classes[{i}].{name}");
            let assured = gbps_to_bps(&f("assured_gbps"), c.assured_gbps, true)?;
            let ceiling = gbps_to_bps(&f("ceiling_gbps"), c.ceiling_gbps, false)?;
            if assured > ceiling {
                return Err(err(
                    f("assured_gbps"),
                    format!(
                        "{} is above ceiling_gbps ({})",
                        c.assured_gbps, c.ceiling_gbps
                    ),
                ));
            }
            if c.burst_bytes == 0 {
                return Err(err(f("burst_bytes"), "must be more than 0"));
            }
            if let Some(p) = c.pfc_priority
                && p > 7
            {
                return Err(err(f("pfc_priority"), format!("{p}: a priority is 0 to 7")));
            }
            classes.push(ClassConfig {
                assured_bps: assured,
                ceiling_bps: ceiling,
                burst_bytes: c.burst_bytes,
                strict: c.strict,
                pfc_priority: c.pfc_priority,
            });
        }
        let mut cfg = ShaperConfig::new(classes);
        cfg.absorb_bps = match self.absorb_gbps {
            Some(g) => Some(gbps_to_bps(&format!("{prefix}.absorb_gbps"), g, false)?),
            None => None,
        };
        cfg.absorb_burst_bytes = self.absorb_burst_bytes;
        cfg.link_bps = match self.link_gbps {
            Some(g) => Some(gbps_to_bps(&format!("{prefix}.link_gbps"), g, false)?),
            None => None,
        };
        cfg.link_burst_bytes = self.link_burst_bytes;
        cfg.mcus = self.mcus;
        cfg.outstanding_cap = self.outstanding_cap;
        cfg.quantum_bytes = self.quantum_bytes;
        cfg.read_split_packets = self.read_split_packets;
        // The core names the rest (mcus, caps, quantum, the absorb burst).
        cfg.validate()
            .map_err(|e| err(format!("{prefix}.{}", e.field), e.reason))?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ShaperConfig, ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            shaper: ShaperSection,
        }
        let f: File = super::super::from_toml(text)?;
        f.shaper.to_config("shaper")
    }

    #[test]
    fn a_full_section_becomes_the_shaper_config() {
        let cfg = parse(
            r#"
            [shaper]
            absorb_gbps = 4.5
            absorb_burst_bytes = 200000
            link_gbps = 25
            link_burst_bytes = 100000
            mcus = 8
            outstanding_cap = 32
            quantum_bytes = 9000
            read_split_packets = 8
            [[shaper.classes]]
            name = "reads"
            ceiling_gbps = 10
            [[shaper.classes]]
            assured_gbps = 2.5
            ceiling_gbps = 2.5
            burst_bytes = 16384
            strict = true
            "#,
        )
        .unwrap();
        assert_eq!(cfg.absorb_bps, Some(4_500_000_000));
        assert_eq!(cfg.absorb_burst_bytes, 200_000);
        assert_eq!(
            (cfg.link_bps, cfg.link_burst_bytes),
            (Some(25_000_000_000), 100_000)
        );
        assert_eq!(
            (cfg.mcus, cfg.outstanding_cap, cfg.quantum_bytes),
            (8, 32, 9000)
        );
        assert_eq!(cfg.read_split_packets, 8);
        assert_eq!(
            cfg.classes,
            [
                ClassConfig {
                    assured_bps: 0,
                    ceiling_bps: 10_000_000_000,
                    burst_bytes: 65_536,
                    strict: false,
                    pfc_priority: None
                },
                ClassConfig {
                    assured_bps: 2_500_000_000,
                    ceiling_bps: 2_500_000_000,
                    burst_bytes: 16_384,
                    strict: true,
                    pfc_priority: None
                }
            ]
        );
    }

    #[test]
    fn every_bad_field_is_named() {
        let class = "[[shaper.classes]]\nceiling_gbps = 10\n";
        for (text, field) in [
            ("[shaper]\nclasses = []\n", "shaper.classes"),
            (
                "[[shaper.classes]]\nassured_gbps = 12\nceiling_gbps = 10\n",
                "shaper.classes[0].assured_gbps",
            ),
            (
                "[[shaper.classes]]\nceiling_gbps = 0\n",
                "shaper.classes[0].ceiling_gbps",
            ),
            (
                "[[shaper.classes]]\nceiling_gbps = -1\n",
                "shaper.classes[0].ceiling_gbps",
            ),
            (
                "[[shaper.classes]]\nceiling_gbps = 1\nburst_bytes = 0\n",
                "shaper.classes[0].burst_bytes",
            ),
            (
                &format!("[shaper]\nabsorb_gbps = 0\n{class}"),
                "shaper.absorb_gbps",
            ),
            (&format!("[shaper]\nmcus = 0\n{class}"), "shaper.mcus"),
            (
                &format!("[shaper]\nlink_gbps = 0\n{class}"),
                "shaper.link_gbps",
            ),
            (
                &format!("[shaper]\nlink_gbps = 1\nlink_burst_bytes = 0\n{class}"),
                "shaper.link_burst_bytes",
            ),
            (
                &format!("[shaper]\noutstanding_cap = 0\n{class}"),
                "shaper.outstanding_cap",
            ),
            (
                &format!("[shaper]\nquantum_bytes = 0\n{class}"),
                "shaper.quantum_bytes",
            ),
            (
                &format!("[shaper]\nabsorb_gbps = 1\nabsorb_burst_bytes = 0\n{class}"),
                "shaper.absorb_burst_bytes",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {e}");
        }
        let e = parse("[shaper]\nmcu = 3\n[[shaper.classes]]\nceiling_gbps = 1\n").unwrap_err();
        assert!(e.to_string().contains("mcu"), "{e}");
    }
}

#[cfg(test)]
mod pfc_tests {
    use super::*;

    #[test]
    fn a_class_names_its_pfc_priority_and_a_bad_one_is_refused_by_field() {
        let s = ShaperSection::parse_file(
            "[shaper]\n[[shaper.classes]]\nceiling_gbps = 10\npfc_priority = 3\n\
             [[shaper.classes]]\nceiling_gbps = 10\n",
        )
        .unwrap();
        let cfg = s.to_config("shaper").unwrap();
        assert_eq!(
            (cfg.classes[0].pfc_priority, cfg.classes[1].pfc_priority),
            (Some(3), None)
        );
        let e = ShaperSection::parse_file(
            "[shaper]\n[[shaper.classes]]\nceiling_gbps = 10\npfc_priority = 8\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "shaper.classes[0].pfc_priority: 8: a priority is 0 to 7"
        );
    }
}
