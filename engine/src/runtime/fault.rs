//! Fault injection on a worker's receive path: with seeded probabilities, each received packet
//! is dropped, duplicated, swapped with the packet after it, or corrupted, before the stage
//! sees it. This is how the transport's recovery (retransmission, go-back-N, duplicate
//! detection, ICRC checks) is exercised on real DPDK queues, reproducibly: the same seed and the
//! same packet sequence give the same faults.
//!
//! At most one fault hits a packet, so the counters add up exactly: a receiver sees
//! `received - dropped - corrupted + duplicated` intact packets and `corrupted` bad ones.
//! Corruption flips one bit at offset 54 or later (past Ethernet, IPv4, UDP and the BTH), where
//! every byte is covered by RoCEv2's ICRC and by the test frames' payload check; shorter
//! packets are not corrupted.

use crate::rng::SplitMix64;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::dataplane::{Burst, Mempool};

/// First byte a corruption may hit.
pub const CORRUPT_FROM: usize = 54;

/// Probabilities (0..=1, summing to at most 1) and the seed.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    pub seed: u64,
    #[serde(default)]
    pub drop: f64,
    #[serde(default)]
    pub duplicate: f64,
    #[serde(default)]
    pub reorder: f64,
    #[serde(default)]
    pub corrupt: f64,
}

impl FaultConfig {
    /// Checks the probabilities; the error names the offending one.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        for (name, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err((name, format!("{p} is not a probability (0..=1)")));
            }
        }
        let sum = self.drop + self.duplicate + self.reorder + self.corrupt;
        if sum > 1.0 {
            return Err((
                "drop",
                format!("the four probabilities add up to {sum} > 1"),
            ));
        }
        Ok(())
    }
}

/// What happens to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    Drop,
    Duplicate,
    Reorder,
    /// Flip bit `bit` (0..8) of the byte at `CORRUPT_FROM + offset % (len - CORRUPT_FROM)`.
    Corrupt {
        offset: u32,
        bit: u8,
    },
}

/// The seeded decision sequence (SplitMix64): pure, so it is tested without EAL.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    rng: SplitMix64,
    // Cumulative thresholds on a uniform u64.
    drop: u64,
    duplicate: u64,
    reorder: u64,
    corrupt: u64,
}

fn threshold(p: f64) -> u64 {
    // p in [0, 1]; 1.0 maps to u64::MAX (a u64 draw is then always below it but for one value).
    (p * u64::MAX as f64) as u64
}

impl FaultPlan {
    pub fn new(cfg: &FaultConfig) -> Self {
        let drop = threshold(cfg.drop);
        let duplicate = drop.saturating_add(threshold(cfg.duplicate));
        let reorder = duplicate.saturating_add(threshold(cfg.reorder));
        let corrupt = reorder.saturating_add(threshold(cfg.corrupt));
        FaultPlan {
            rng: SplitMix64::new(cfg.seed),
            drop,
            duplicate,
            reorder,
            corrupt,
        }
    }

    /// The fault for the next packet.
    pub fn decide(&mut self) -> Fault {
        let x = self.rng.next_u64();
        if x < self.drop {
            Fault::Drop
        } else if x < self.duplicate {
            Fault::Duplicate
        } else if x < self.reorder {
            Fault::Reorder
        } else if x < self.corrupt {
            let r = self.rng.next_u64();
            Fault::Corrupt {
                offset: (r >> 8) as u32,
                bit: (r & 7) as u8,
            }
        } else {
            Fault::None
        }
    }
}

crate::counter_set! {
    /// Faults injected so far.
    pub struct FaultCounts, slots FaultSlot {
        /// Received packets dropped before the stage saw them.
        dropped: Sum,
        /// Received packets handed to the stage twice.
        duplicated: Sum,
        /// Received packets swapped with the packet after them.
        reordered: Sum,
        /// Received packets with one bit flipped.
        corrupted: Sum,
    }
}

/// Applies a [`FaultPlan`] to bursts of mbufs.
pub struct FaultInjector {
    plan: FaultPlan,
    pool: Arc<Mempool>,
    out: Burst,
}

impl FaultInjector {
    /// Duplicates are copied into buffers from `pool`.
    pub fn new(cfg: &FaultConfig, pool: Arc<Mempool>) -> Self {
        FaultInjector {
            plan: FaultPlan::new(cfg),
            pool,
            out: Burst::new(),
        }
    }

    /// Rewrites `burst` in place with this burst's faults.
    pub fn apply(&mut self, burst: &mut Burst, counts: &mut FaultCounts) {
        let mut deferred = None;
        for mut m in burst.drain() {
            let fault = self.plan.decide();
            match fault {
                Fault::Drop => {
                    counts.dropped += 1;
                    continue;
                }
                Fault::Corrupt { offset, bit } if m.len() > CORRUPT_FROM => {
                    let data = m.data_mut();
                    let at = CORRUPT_FROM + offset as usize % (data.len() - CORRUPT_FROM);
                    data[at] ^= 1 << bit;
                    counts.corrupted += 1;
                }
                Fault::Reorder if deferred.is_none() => {
                    deferred = Some(m);
                    continue;
                }
                _ => {}
            }
            let copy = if fault == Fault::Duplicate {
                m.duplicate(&self.pool)
            } else {
                None
            };
            // Room for every packet plus its duplicate: with faults on, the worker receives at
            // most MAX_BURST / 2 packets per burst.
            let _ = self.out.push(m);
            if let Some(c) = copy {
                counts.duplicated += 1;
                let _ = self.out.push(c);
            }
            if let Some(d) = deferred.take() {
                counts.reordered += 1;
                let _ = self.out.push(d);
            }
        }
        // A packet held back for reordering with no packet after it in this burst goes last.
        if let Some(d) = deferred {
            let _ = self.out.push(d);
        }
        std::mem::swap(burst, &mut self.out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(drop: f64, duplicate: f64, reorder: f64, corrupt: f64) -> FaultConfig {
        FaultConfig {
            seed: 42,
            drop,
            duplicate,
            reorder,
            corrupt,
        }
    }

    #[test]
    fn rates_follow_the_probabilities() {
        let mut plan = FaultPlan::new(&cfg(0.01, 0.02, 0.03, 0.04));
        let mut n = [0u32; 5];
        for _ in 0..1_000_000 {
            let i = match plan.decide() {
                Fault::None => 0,
                Fault::Drop => 1,
                Fault::Duplicate => 2,
                Fault::Reorder => 3,
                Fault::Corrupt { .. } => 4,
            };
            n[i] += 1;
        }
        // Binomial with n = 1e6: a standard deviation of at most ~200; allow 5 of them.
        for (count, p) in n[1..].iter().zip([0.01, 0.02, 0.03, 0.04]) {
            let expect = p * 1e6;
            assert!(
                (*count as f64 - expect).abs() < 1000.0,
                "{count} vs {expect}"
            );
        }
    }

    #[test]
    fn same_seed_same_faults_other_seed_other_faults() {
        let c = cfg(0.1, 0.1, 0.1, 0.1);
        let a: Vec<Fault> = (0..1000)
            .map({
                let mut p = FaultPlan::new(&c);
                move |_| p.decide()
            })
            .collect();
        let b: Vec<Fault> = (0..1000)
            .map({
                let mut p = FaultPlan::new(&c);
                move |_| p.decide()
            })
            .collect();
        assert_eq!(a, b);
        let other = FaultConfig { seed: 43, ..c };
        let d: Vec<Fault> = (0..1000)
            .map({
                let mut p = FaultPlan::new(&other);
                move |_| p.decide()
            })
            .collect();
        assert_ne!(a, d);
    }

    #[test]
    fn zero_probabilities_never_fault_and_bad_ones_are_named() {
        let mut plan = FaultPlan::new(&cfg(0.0, 0.0, 0.0, 0.0));
        assert!((0..100_000).all(|_| plan.decide() == Fault::None));
        assert_eq!(cfg(1.5, 0.0, 0.0, 0.0).check().unwrap_err().0, "drop");
        assert_eq!(cfg(0.0, 0.0, -0.1, 0.0).check().unwrap_err().0, "reorder");
        assert!(cfg(0.5, 0.5, 0.1, 0.0).check().is_err());
        assert!(cfg(0.25, 0.25, 0.25, 0.25).check().is_ok());
    }
}
